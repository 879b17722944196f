"""``qpart models`` shows the levels an artifact keeps lossless-only, the cuts each device runtime
takes (issue 48) and the cuts it calibrated (issue 51)."""

from __future__ import annotations

import json
import shutil

from tests.qpart.test_cli_errors import qpart


def test_models_lists_the_levels_an_artifact_keeps_lossless(every_cut, tmp_path):
    shutil.copytree(every_cut / "fmnist-cnn", tmp_path / "fmnist-cnn")
    doc = json.loads((tmp_path / "fmnist-cnn" / "artifact.json").read_text())
    doc.update(schema_version=6, lossless_levels=[0.001, 0.0025])
    doc["cuts"][5]["runtimes_refused"] = {"onnx": "operator 'Resize' is not in the allow-list"}
    (tmp_path / "fmnist-cnn" / "artifact.json").write_text(json.dumps(doc))
    listed = qpart("models", "--artifacts", str(tmp_path), cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    rows = {line.split()[0]: line for line in listed.stdout.splitlines()}
    assert rows["fmnist-cnn"].endswith("lossless-only=0.1%,0.25%  calibrated cuts: all  runtimes: torch 9/9, "
                                       "onnx 8/9")
    assert "lossless-only" not in rows["fmnist-resnet"]  # no artifact in that folder
    as_json = json.loads(qpart("models", "--json", "--artifacts", str(tmp_path), cwd=tmp_path).stdout)
    assert {r["name"]: r["lossless_only_levels"] for r in as_json}["fmnist-cnn"] == [0.001, 0.0025]
    runtimes = {r["name"]: r["runtimes"] for r in as_json}
    assert runtimes["fmnist-cnn"]["onnx"] == {
        "cuts": [0, 1, 2, 3, 4, 6, 7, 8], "refused": {"5": "operator 'Resize' is not in the allow-list"}}
    assert runtimes["fmnist-resnet"] is None
    accuracy = {r["name"]: r["calibration_test_accuracy"] for r in as_json}
    assert accuracy["fmnist-cnn"] == doc["fp32_test_accuracy"]


def test_models_lists_the_cuts_a_pruned_calibration_kept(artifacts_dir, tmp_path):
    shutil.copytree(artifacts_dir / "fmnist-cnn", tmp_path / "fmnist-cnn")
    doc = json.loads((tmp_path / "fmnist-cnn" / "artifact.json").read_text())
    doc["patterns"] = [p for p in doc["patterns"] if p["cut"] in (0, 1, 8)]
    (tmp_path / "fmnist-cnn" / "artifact.json").write_text(json.dumps(doc))
    listed = qpart("models", "--artifacts", str(tmp_path), cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    row = next(line for line in listed.stdout.splitlines() if line.startswith("fmnist-cnn"))
    assert "  cuts=9  " in row and "  calibrated cuts: 0,1,8  " in row
    as_json = json.loads(qpart("models", "--json", "--artifacts", str(tmp_path), cwd=tmp_path).stdout)
    assert {r["name"]: r["calibrated_cuts"] for r in as_json}["fmnist-cnn"] == [0, 1, 8]
