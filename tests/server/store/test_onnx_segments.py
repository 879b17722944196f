"""Plans for ONNX devices: the plan's segment is the ONNX form, content-addressed like the other."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest

from qpart.client.onnx_runtime import check_segment
from qpart.client.plans import PlanResponse
from qpart.client.settings import DeviceSettings
from qpart.kernels.onnx_segment import check_onnx_segment
from qpart.profiles.artifacts import load_artifact

# A device fast enough, on a fast enough link, that head segments are worth downloading.
FAST = {"schema_version": 2, "name": "fast-board", "flops_per_s": 5e11, "power_compute_w": 2.0,
        "power_tx_w": 1.0, "rtt_s": 0.02}


def _plan(client, runtime=None, demand=0.01):
    body = {"model": "fmnist-cnn", "accuracy_demand": demand, "rate_bps": 1e10, "device": FAST}
    if runtime is not None:
        body["runtime"] = runtime
    answer = client.post("/v1/plan", json=body)
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_a_plan_without_a_runtime_links_the_safetensors_segment(client):
    plan = _plan(client)
    assert plan["segment"]["runtime"] == "torch"
    data = client.get(plan["segment"]["url"]).content
    assert data[8:9] == b"{"  # a safetensors header


def test_an_onnx_plan_links_a_checked_content_addressed_onnx_segment(client):
    torch_plan, onnx_plan = _plan(client, "torch"), _plan(client, "onnx")
    seg = onnx_plan["segment"]
    assert seg["runtime"] == "onnx" and seg["id"] != torch_plan["segment"]["id"]
    response = client.get(seg["url"])
    assert response.status_code == 200 and response.headers["etag"] == f'"{seg["id"]}"'
    data = response.content
    assert hashlib.sha256(data).hexdigest() == seg["id"] == seg["sha256"] and len(data) == seg["size_bytes"]
    info = check_onnx_segment(data, seg["id"], size_bytes=seg["size_bytes"])
    assert info.metadata["model"] == "fmnist-cnn" and info.metadata["cut"] == str(onnx_plan["cut"])
    assert info.metadata["pattern_id"] == onnx_plan["plan_id"].rsplit("/", 1)[1]
    if onnx_plan["cut"] == torch_plan["cut"]:
        assert seg["size_bytes"] <= 1.05 * torch_plan["segment"]["size_bytes"]


def test_a_plan_declares_its_heads_flops_and_its_segment_fits_the_work_budget_they_give(client, cnn_only):
    """Issue 52, finding 2: the device budgets an ONNX head's work from the card's FLOPs (ADR 0020)."""
    plan = _plan(client, "onnx")
    assert plan["head_flops"] == load_artifact(cnn_only / "fmnist-cnn").cuts[plan["cut"]].head_flops > 0
    data = client.get(plan["segment"]["url"]).content
    settings = DeviceSettings()
    info = check_segment(PlanResponse.model_validate(plan), data, settings=settings)
    assert plan["head_flops"] <= info.flops <= settings.head_flops_margin * plan["head_flops"]


def test_an_onnx_plan_priced_with_a_held_onnx_segment_counts_no_download(client):
    first = _plan(client, "onnx")
    body = {"model": "fmnist-cnn", "accuracy_demand": 0.01, "rate_bps": 1e10, "device": FAST,
            "runtime": "onnx", "held_segments": [first["segment"]["id"]]}
    again = client.post("/v1/plan", json=body).json()
    assert again["segment"]["id"] == first["segment"]["id"] and again["segment"]["held"] is True


@pytest.mark.parametrize("runtime", ["tflite", "", 1])
def test_an_unknown_runtime_is_a_422(client, runtime):
    body = {"model": "fmnist-cnn", "accuracy_demand": 0.01, "rate_bps": 1e6, "runtime": runtime}
    answer = client.post("/v1/plan", content=json.dumps(body), headers={"content-type": "application/json"})
    assert answer.status_code == 422 and "runtime" in answer.text


@pytest.mark.slow
def test_onnx_segments_are_no_bigger_than_1_05x_for_every_pattern_of_the_reference_models(artifacts_dir):
    """Acceptance 4 of issue 25, over the committed artifacts of the three reference models."""
    from qpart.server.store.catalog import Catalog
    from qpart.server.store.segments import build_onnx_segment, build_segment

    ratios = {}
    for entry in Catalog.load(artifacts_dir).entries:
        model = entry.model
        assert model is not None, entry.reason
        for p in model.artifact.patterns:
            head = model.parts[p.cut][0]
            if not list(head.parameters()):
                continue
            shape = tuple(model.artifact.input_shape)
            onnx_bytes = build_onnx_segment(head, shape, model.name, model.version, p)
            check_onnx_segment(onnx_bytes, hashlib.sha256(onnx_bytes).hexdigest())
            ratios[model.name, p.pattern_id] = len(onnx_bytes) / len(build_segment(head, model.name,
                                                                                  model.version, p))
    assert {name for name, _ in ratios} == {"fmnist-cnn", "fmnist-resnet", "fmnist-mobilenet"}
    assert max(ratios.values()) <= 1.05, max(ratios.items(), key=lambda kv: kv[1])


def test_the_model_listing_links_each_patterns_segment_in_the_runtime_asked_for(client):
    torch_info = client.get("/v1/models/fmnist-cnn").json()
    onnx_info = client.get("/v1/models/fmnist-cnn", params={"runtime": "onnx"}).json()
    pairs = list(zip(torch_info["patterns"], onnx_info["patterns"], strict=True))
    with_segments = [(t, o) for t, o in pairs if t["segment"]]
    assert with_segments and all(t["pattern_id"] == o["pattern_id"] for t, o in pairs)
    for t, o in with_segments:
        assert (t["segment"]["runtime"], o["segment"]["runtime"]) == ("torch", "onnx")
        assert o["segment"]["id"] != t["segment"]["id"]
    plan = _plan(client, "onnx")  # the plan links the listing's segment for its pattern
    chosen = next(o for _, o in pairs if plan["plan_id"].endswith("/" + o["pattern_id"]))
    assert chosen["segment"] == plan["segment"]
    assert client.get("/v1/models/fmnist-cnn", params={"runtime": "tflite"}).status_code == 422


def test_cuts_the_calibration_found_an_onnx_device_cannot_run_are_never_offered_to_it(tmp_path, cnn_only):
    """ADR 0019: the artifact's per-cut runtime refusals keep those cuts out of ONNX plans (cut 0,
    no head, always stays) and out of the ONNX listing, and torch plans are as before."""
    from tests.server.conftest import make_client

    root = tmp_path / "artifacts"
    shutil.copytree(cnn_only, root)
    path = root / "fmnist-cnn" / "artifact.json"
    doc = json.loads(path.read_text())
    for cut in doc["cuts"][1:]:
        cut["runtimes_refused"] = {"onnx": "refused for the test"}
    path.write_text(json.dumps(doc))
    with make_client(root) as client:
        torch_plan, onnx_plan = _plan(client, "torch"), _plan(client, "onnx")
        assert torch_plan["cut"] > 0
        assert onnx_plan["cut"] == 0 and onnx_plan["segment"] is None
