"""Files of an older schema still load (ADR 0008, 0011): a schema 3 artifact without data
records, a schema 2 artifact with ``tightenings``
and no promise, a schema 1 one with a ``<coding>_ratio`` field per coding, one from before zstd
uploads (ADR 0007) without ``zstd_ratio``, and device profiles with ``deflate_s``/``zstd_s``; a
coding no build knows is refused by name."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from pydantic import ValidationError

from qpart.kernels.coding import Coding
from qpart.profiles.artifacts import (
    ARTIFACT_SCHEMA_VERSION,
    CalibrationArtifact,
    CutProfile,
    load_artifact,
    save_artifact,
)
from qpart.profiles.devices import DEVICES_DIR, MeasuredHeads, get_device, load_device_profile
from qpart.profiles.errors import ProfileFormatError, SchemaVersionError

_LADDER = ("rungs", "passed")  # schema 3's per-pattern fields
SCHEMA4_CNN = Path(__file__).parent / "fixtures" / "fmnist-cnn-schema4.json"


def _schema2(doc: dict) -> dict:
    """``doc`` (schema 3 or 4) as schema 2 wrote it: no promise, ``tightenings`` in place of the ladder."""
    def pattern(p: dict) -> dict:
        return {**{k: v for k, v in p.items() if k not in _LADDER}, "tightenings": 1}

    out = {k: v for k, v in doc.items() if k not in ("promise", "data", "image_ladder")}
    for name in ("patterns", "baseline_qpart_paper"):
        out[name] = [pattern(p) for p in doc[name]]
    return {**out, "schema_version": 2}


def _schema1(doc: dict, codings: tuple[str, ...] = ("deflate", "zstd")) -> dict:
    """``doc`` (schema 3) as schema 1 wrote it: schema 2's, with a ``<coding>_ratio`` field per
    coding, empty when not measured."""
    old = _schema2(doc)
    cuts = [{**{k: v for k, v in cut.items() if k != "coding_ratio"},
             **{f"{c}_ratio": cut["coding_ratio"].get(c, {}) for c in codings}} for cut in doc["cuts"]]
    return {**old, "schema_version": 1, "cuts": cuts}


def _without_promise(a: CalibrationArtifact) -> CalibrationArtifact:
    """What an upgraded older artifact holds: no promise, no ladder per pattern, no data records."""
    def plain(ps: list) -> list:
        return [p.model_copy(update=dict.fromkeys(_LADDER)) for p in ps]

    return a.model_copy(update={"promise": None, "data": None, "image_ladder": None,
                                "patterns": plain(a.patterns),
                                "baseline_qpart_paper": plain(a.baseline_qpart_paper)})


@pytest.fixture
def cnn(artifacts_dir, tmp_path):
    folder = tmp_path / "fmnist-cnn"
    shutil.copytree(artifacts_dir / "fmnist-cnn", folder)
    return folder


@pytest.fixture
def cnn5(every_cut, tmp_path):
    """fmnist-cnn as a schema 5 calibration wrote it, at every cut (tests/fixtures/every-cut)."""
    folder = tmp_path / "fmnist-cnn"
    shutil.copytree(every_cut / "fmnist-cnn", folder)
    return folder


@pytest.mark.parametrize("older", [_schema1, _schema2])
def test_an_older_artifact_loads_as_the_committed_one_without_a_promise(cnn, older):
    committed = load_artifact(cnn)
    assert committed.schema_version == ARTIFACT_SCHEMA_VERSION == 8
    doc = json.loads(committed.model_dump_json())
    old = older(doc)
    assert "promise" not in old and all("tightenings" in p for p in old["patterns"])
    (cnn / "artifact.json").write_text(json.dumps(old))
    upgraded = load_artifact(cnn)
    assert upgraded == _without_promise(committed)
    assert upgraded.cuts[-1].coding_ratio == {}  # the last cut uploads nothing: no coding measured
    save_artifact(upgraded, cnn)  # and it is written back as schema 8: its measurements beside it
    assert load_artifact(cnn) == upgraded
    written = json.loads((cnn / "artifact.json").read_text())
    assert written["schema_version"] == 8 and "timing_s" not in written
    assert all("server_tail_s" not in c for c in written["cuts"])
    timing = json.loads((cnn / "timing.json").read_text())
    assert timing["timing_s"] == committed.timing_s
    assert [c["server_tail_s"] for c in timing["cuts"]] == [c.server_tail_s for c in committed.cuts]


def test_a_schema_4_artifact_keeps_its_inline_measurements(cnn):
    # fmnist-cnn's artifact as a schema 4 calibration wrote it (committed before a486acb, kept as
    # a fixture): its measurements inline, no timing.json
    shutil.copy(SCHEMA4_CNN, cnn / "artifact.json")
    (cnn / "timing.json").unlink()
    doc = json.loads((cnn / "artifact.json").read_text())
    assert doc["schema_version"] == 4 and "image_ladder" not in doc
    artifact = load_artifact(cnn)
    assert artifact.timing_s == doc["timing_s"] and artifact.timing_s
    assert [c.server_tail_s for c in artifact.cuts] == [c["server_tail_s"] for c in doc["cuts"]]


def test_a_timing_file_that_is_not_one_is_refused(cnn):
    (cnn / "timing.json").write_text('{"timing_s": {}}')
    with pytest.raises(ProfileFormatError, match=r"timing\.json is not a valid timing record"):
        load_artifact(cnn)


def test_a_schema_3_artifact_loads_without_data_records(cnn):
    committed = load_artifact(cnn)
    newer = ("data", "image_ladder")  # schema 4's data records, this schema's ladder
    doc = {k: v for k, v in json.loads(committed.model_dump_json()).items() if k not in newer}
    (cnn / "artifact.json").write_text(json.dumps({**doc, "schema_version": 3}))
    artifact = load_artifact(cnn)
    assert committed.data is not None  # the committed artifact records its sources (schema 4)
    assert artifact == committed.model_copy(update=dict.fromkeys(newer)) and artifact.schema_version == 8
    assert artifact.splits["calibration"]["count"] == 10_000  # the Fashion-MNIST splits it recorded


def test_a_schema_5_artifact_loads_with_no_lossless_levels_and_a_schema_6_one_keeps_them(cnn5):
    cnn = cnn5
    doc = json.loads((cnn / "artifact.json").read_text())
    assert doc["schema_version"] == 5 and "lossless_levels" not in doc  # the artifacts before ADR 0025
    assert load_artifact(cnn).lossless_levels == []
    (cnn / "artifact.json").write_text(json.dumps({**doc, "schema_version": 6, "lossless_levels": [0.001]}))
    assert load_artifact(cnn).lossless_levels == [0.001]


def test_an_artifact_from_before_zstd_loads_with_deflate_alone(cnn):
    committed = load_artifact(cnn)
    doc = _schema1(json.loads(committed.model_dump_json()), codings=("deflate",))
    (cnn / "artifact.json").write_text(json.dumps(doc))
    artifact = load_artifact(cnn)
    assert all(Coding.ZSTD not in c.coding_ratio for c in artifact.cuts)
    assert artifact.cuts[0].coding_ratio == {Coding.DEFLATE: committed.cuts[0].coding_ratio[Coding.DEFLATE]}


def test_a_newer_schema_is_refused_naming_the_ones_this_build_reads(cnn):
    doc = json.loads((cnn / "artifact.json").read_text())
    (cnn / "artifact.json").write_text(json.dumps({**doc, "schema_version": 9}))
    with pytest.raises(SchemaVersionError, match="schema_version 1 to 8"):
        load_artifact(cnn)


def test_a_schema_1_device_profile_loads_with_its_coding_times(tmp_path):
    doc = get_device("raspberry-pi-4").model_dump(mode="json")
    doc["schema_version"] = 1
    doc["measured"] = {"fmnist-cnn": {"version": "v1", "head_s": [0.0, 1e-3], "encode_s": [0.0, 1e-5],
                                      "deflate_s": [{"4": 1e-5}, {"4": 2e-5}], "zstd_s": [],
                                      "warmup": 2, "repeats": 5}}
    (tmp_path / "pi.json").write_text(json.dumps(doc))
    profile = load_device_profile(tmp_path / "pi.json")
    assert profile.schema_version == 2
    # an empty list meant "not measured", as an absent coding does now
    assert profile.measured["fmnist-cnn"].coding_s == {Coding.DEFLATE: [{4: 1e-5}, {4: 2e-5}]}


def test_the_shipped_presets_are_written_in_schema_2():
    files = sorted(DEVICES_DIR.glob("*.json"))
    assert files and {json.loads(f.read_text())["schema_version"] for f in files} == {2}


def test_a_coding_no_build_knows_is_refused_by_name():
    with pytest.raises(ValidationError, match=r"brotli(.|\n)*'deflate' or 'zstd'"):
        MeasuredHeads.model_validate({"version": "v1", "head_s": [0.0], "warmup": 0, "repeats": 1,
                                      "coding_s": {"brotli": [{"4": 1e-5}]}})
    cut = {"index": 0, "node": "x", "activation_shape": [1], "activation_numel": 1, "head_tensors": [],
           "head_float_params": 0, "head_flops": 0, "tail_flops": 0, "server_head_s": 0, "server_tail_s": 0,
           "coding_ratio": {"gzip": {"4": 0.5}}}
    with pytest.raises(ValidationError, match="gzip"):
        CutProfile.model_validate(cut)


def test_times_of_one_coding_in_both_spellings_are_refused():
    with pytest.raises(ValidationError, match="deflate times given twice"):
        MeasuredHeads.model_validate({"version": "v1", "head_s": [0.0], "warmup": 0, "repeats": 1,
                                      "deflate_s": [{"4": 1e-5}], "coding_s": {"deflate": [{"4": 2e-5}]}})


def test_a_schema_6_artifact_promises_top1_drop_and_records_no_disagreement(cnn5):
    cnn = cnn5
    doc = json.loads((cnn / "artifact.json").read_text())
    assert "metric" not in (doc.get("promise") or {})  # a schema 5 artifact predates the metric
    (cnn / "artifact.json").write_text(json.dumps({**doc, "schema_version": 6}))
    artifact = load_artifact(cnn)
    assert artifact.schema_version == 8 and artifact.metric == "top1-drop"
    assert artifact.promise is not None and artifact.promise.metric == "top1-drop"
    assert all(p.test_disagreement is None for p in artifact.patterns)


def test_a_schema_7_artifact_loads_with_no_cut_choice_and_every_patterned_cut_calibrated(cnn5):
    cnn = cnn5
    doc = json.loads((cnn / "artifact.json").read_text())
    (cnn / "artifact.json").write_text(json.dumps({**doc, "schema_version": 7}))
    artifact = load_artifact(cnn)
    assert artifact.schema_version == 8 and artifact.cut_choice is None
    assert artifact.calibrated_cuts == list(range(len(artifact.cuts)))  # patterns at every cut
    fewer = artifact.model_copy(update={"patterns": [p for p in artifact.patterns if p.cut in (0, 8)]})
    assert fewer.calibrated_cuts == [0, 8]


def test_an_artifact_without_cut_0_or_whose_cut_choice_names_cuts_without_patterns_is_refused(cnn):
    doc = json.loads((cnn / "artifact.json").read_text())
    no_cut_0 = {**doc, "patterns": [p for p in doc["patterns"] if p["cut"] != 0]}
    (cnn / "artifact.json").write_text(json.dumps(no_cut_0))
    with pytest.raises(ProfileFormatError, match="no pattern at cut 0, the all-server plan"):
        load_artifact(cnn)  # it loaded before, and every plan request then failed on the server
    kept = {**doc, "patterns": [p for p in doc["patterns"] if p["cut"] in (0, 8)],
            "cut_choice": {"mode": "envelope", "calibrated": [0, 4, 8]}}
    (cnn / "artifact.json").write_text(json.dumps(kept))
    with pytest.raises(ProfileFormatError, match=r"cut_choice names \[0, 4, 8\]; patterns: \[0, 8\]"):
        load_artifact(cnn)
