"""The runtime table (issue 48): per device runtime, the cuts calibration found it can run and why
not the others, from the artifact's ``cuts[i].runtimes_refused``; shown in ``/v2/models/{m}``'s
``runtimes`` parameter and in ``/v1/models/{m}`` beside the levels kept lossless; and the cuts a
calibration kept (issue 51), the only ones planned."""

from __future__ import annotations

import json
import shutil

from qpart.server.api.inference import TAIL_INPUT
from qpart.server.api.routes_oip import card_parameters
from qpart.server.store.catalog import Catalog
from qpart.server.store.segment_index import runtime_table
from tests.server.conftest import make_client


def _refusing(cnn_only, tmp_path, **fields):
    """The fmnist-cnn artifact with cut 5 refused to onnx (and ``fields`` set on the artifact)."""
    root = tmp_path / "artifacts"
    shutil.copytree(cnn_only, root)
    path = root / "fmnist-cnn" / "artifact.json"
    doc = json.loads(path.read_text())
    doc["cuts"][5]["runtimes_refused"] = {"onnx": "operator 'Resize' is not in the allow-list"}
    path.write_text(json.dumps({**doc, **fields}))
    return root


def test_a_cut_refused_to_a_runtime_is_left_out_of_its_cuts_with_the_reason(cnn_only, tmp_path):
    model = Catalog.load(_refusing(cnn_only, tmp_path)).get("fmnist-cnn")
    table = runtime_table(model)
    assert table["torch"] == {"cuts": list(range(9)), "refused": {}}
    assert table["onnx"] == {"cuts": [0, 1, 2, 3, 4, 6, 7, 8],
                             "refused": {"5": "operator 'Resize' is not in the allow-list"}}
    assert json.loads(card_parameters(model)["runtimes"]) == table
    assert "runtimes" not in card_parameters(model, images=False)  # a tail has no device runtimes


def test_the_model_answer_shows_the_runtime_table_and_the_lossless_levels(cnn_only, tmp_path):
    root = _refusing(cnn_only, tmp_path)
    table = runtime_table(Catalog.load(root).get("fmnist-cnn"))
    with make_client(root) as client:
        info = client.get("/v1/models/fmnist-cnn").json()
    assert info["runtimes"] == table and info["lossless_levels"] == []
    assert info["runtimes"]["onnx"]["refused"] == {"5": "operator 'Resize' is not in the allow-list"}


def test_a_pruned_calibration_shows_its_calibrated_cuts_and_plans_only_there(every_cut, tmp_path):
    # a calibration that kept cuts 0, 1 and 8 (ADR 0025): the others have no patterns
    root = tmp_path / "artifacts"
    shutil.copytree(every_cut, root)
    path = root / "fmnist-cnn" / "artifact.json"
    doc = json.loads(path.read_text())
    doc["patterns"] = [p for p in doc["patterns"] if p["cut"] in (0, 1, 8)]
    path.write_text(json.dumps(doc))
    model = Catalog.load(root).get("fmnist-cnn")
    assert json.loads(card_parameters(model)["calibrated_cuts"]) == [0, 1, 8]
    assert "calibrated_cuts" not in card_parameters(model, images=False)
    with make_client(root) as client:
        info = client.get("/v1/models/fmnist-cnn").json()
        assert info["cuts"] == 9 and info["calibrated_cuts"] == [0, 1, 8]
        assert {p["cut"] for p in info["patterns"]} == {0, 1, 8}
        meta = client.get("/v2/models/fmnist-cnn").json()
        assert json.loads(meta["parameters"]["calibrated_cuts"]) == [0, 1, 8]
        for rate in (1e5, 1e7, 1e9):
            plan = client.post("/v1/plan", json={"model": "fmnist-cnn", "accuracy_demand": 0.01,
                                                 "rate_bps": rate, "device": "phone-soc"})
            assert plan.status_code == 200, plan.text
            assert plan.json()["cut"] in (0, 1, 8)
        # a pattern at a pruned cut (cut 4's of the every-cut calibration) is not served
        every = json.loads((every_cut / "fmnist-cnn" / "artifact.json").read_text())["patterns"]
        missing = next(p["pattern_id"] for p in every if p["cut"] == 4)
        body = {"inputs": [{"name": TAIL_INPUT, "datatype": "UINT8", "shape": [1], "data": [0]}],
                "parameters": {"pattern_id": missing}}
        answer = client.post(f"/v2/models/fmnist-cnn-tail/versions/{info['version']}/infer", json=body)
        assert answer.status_code == 404 and "has no pattern" in answer.json()["error"]
