"""Two versions of one model served side by side: newest by default, each reachable by name."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from qpart.client.plans import PacketFormat
from qpart.client.runtime import encode_for_plan
from tests.server.conftest import make_client


@pytest.fixture(scope="module")
def two_versions(tmp_path_factory, artifacts_dir) -> tuple[Path, str, str]:
    """fmnist-cnn as committed, and a second version with one bias nudged (newer folder)."""
    root = tmp_path_factory.mktemp("versions")
    old = root / "fmnist-cnn"
    shutil.copytree(artifacts_dir / "fmnist-cnn", old)
    new = root / "fmnist-cnn-v2"
    shutil.copytree(old, new)
    weights = load_file(str(new / "weights.safetensors"))
    bias = next(k for k in sorted(weights) if k.endswith("bias"))
    weights[bias] = (weights[bias] * np.float32(1.001)).astype(np.float32)
    save_file(weights, str(new / "weights.safetensors"))
    digest = hashlib.sha256((new / "weights.safetensors").read_bytes()).hexdigest()
    doc = json.loads((new / "artifact.json").read_text())
    old_version = doc["version"]
    doc["weights_sha256"], doc["version"] = digest, digest[:12]
    (new / "artifact.json").write_text(json.dumps(doc))
    return root, old_version, digest[:12]


def test_both_versions_serve_and_the_newest_is_the_default(two_versions):
    root, old, new = two_versions
    with make_client(root) as c:
        meta = c.get("/v2/models/fmnist-cnn").json()
        assert set(meta["versions"]) == {old, new}
        assert c.get("/v1/models/fmnist-cnn").json()["version"] == new
        assert c.get("/v1/models/fmnist-cnn", params={"version": old}).json()["version"] == old
        body = {"model": "fmnist-cnn", "accuracy_demand": 0.01, "rate_bps": 1e6, "device": "raspberry-pi-4"}
        assert c.post("/v1/plan", json=body).json()["version"] == new
        plan = c.post("/v1/plan", json={**body, "version": old}).json()
        assert plan["version"] == old
        assert c.get(f"/v2/models/fmnist-cnn/versions/{old}/ready").status_code == 200


def test_each_version_runs_its_own_weights(two_versions):
    root, old, new = two_versions
    image = np.random.default_rng(2).random((1, 1, 28, 28), dtype=np.float32)
    tensor = {"name": "input", "shape": [1, 1, 28, 28], "datatype": "FP32",
              "data": image.reshape(-1).tolist()}
    with make_client(root) as c:
        logits = {}
        for version in (old, new):
            r = c.post(f"/v2/models/fmnist-cnn/versions/{version}/infer", json={"inputs": [tensor]})
            assert r.status_code == 200, r.text
            assert r.json()["model_version"] == version
            logits[version] = np.array(r.json()["outputs"][0]["data"])
        assert c.post("/v2/models/fmnist-cnn/infer", json={"inputs": [tensor]}).json()["model_version"] == new
        assert not np.array_equal(logits[old], logits[new])  # the nudged bias shows
        np.testing.assert_allclose(logits[old], logits[new], atol=0.05)
        # a tail plan of the old version runs on the old version
        info = c.get("/v1/models/fmnist-cnn", params={"version": old}).json()
        p = next(p for p in info["patterns"] if p["cut"] == 0)
        packet = encode_for_plan(image, PacketFormat.model_validate(p))
        answer = c.post(p["infer_url"], content=packet)
        assert answer.status_code == 200 and answer.json()["version"] == old


def test_an_unknown_version_is_a_404_naming_the_known_ones(two_versions):
    root, old, new = two_versions
    with make_client(root) as c:
        r = c.get("/v2/models/fmnist-cnn/versions/0000/ready")
        assert r.status_code == 404
        assert old in r.json()["error"] and new in r.json()["error"]
