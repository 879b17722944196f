"""Files written before zstd uploads (ADR 0007) still load: an artifact without ``zstd_ratio``, a
device profile without ``zstd_s``; each then offers deflate only."""

from __future__ import annotations

import json
import shutil

import pytest

from profiles.artifacts import load_artifact
from profiles.devices import DeviceProfile, MeasuredHeads, get_device
from profiles.errors import UnknownCodingError


def test_an_artifact_without_zstd_ratios_loads_with_none(artifacts_dir, tmp_path):
    folder = tmp_path / "fmnist-cnn"
    shutil.copytree(artifacts_dir / "fmnist-cnn", folder)
    doc = json.loads((folder / "artifact.json").read_text())
    for cut in doc["cuts"]:
        del cut["zstd_ratio"]
    (folder / "artifact.json").write_text(json.dumps(doc))
    artifact = load_artifact(folder)
    assert all(c.zstd_ratio == {} and c.coding_ratio("zstd") == {} for c in artifact.cuts)
    committed = load_artifact(artifacts_dir / "fmnist-cnn")
    assert artifact.cuts[0].coding_ratio("deflate") == committed.cuts[0].deflate_ratio


def test_a_profile_without_zstd_times_loads_with_none():
    doc = get_device("raspberry-pi-4").model_dump(mode="json")
    doc["measured"] = {"fmnist-cnn": {"version": "v1", "head_s": [0.0, 1e-3], "encode_s": [0.0, 1e-5],
                                      "deflate_s": [{"4": 1e-5}, {"4": 2e-5}], "warmup": 2, "repeats": 5}}
    heads = DeviceProfile.model_validate_json(json.dumps(doc)).measured["fmnist-cnn"]
    assert heads.coding_s("zstd") == [] and heads.coding_s("deflate") == [{4: 1e-5}, {4: 2e-5}]


def test_a_coding_no_profile_knows_is_an_error_not_an_unmeasured_one(artifacts_dir):
    heads = MeasuredHeads(version="v1", head_s=[0.0], warmup=0, repeats=1)
    with pytest.raises(UnknownCodingError, match="'brotli': use one of deflate, zstd"):
        heads.coding_s("brotli")
    cut = load_artifact(artifacts_dir / "fmnist-cnn").cuts[0]
    with pytest.raises(UnknownCodingError, match="'gzip': use one of deflate, zstd"):
        cut.coding_ratio("gzip")
    with pytest.raises(UnknownCodingError, match="'brotli'"):
        cut.with_coding_ratios({"brotli": {4: 0.5}})
    assert cut.with_coding_ratios({"zstd": {4: 0.5}}).coding_ratio("zstd") == {4: 0.5}
