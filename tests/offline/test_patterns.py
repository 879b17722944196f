"""The validation stage's worker processes: how many, and what happens when one cannot start."""

from __future__ import annotations

from dataclasses import replace

import pytest

from qpart.models.registry import get_model
from qpart.offline.errors import CheckpointMismatchError, WorkerError
from qpart.offline.patterns import Plan, all_patterns, check_record, pattern_id, resolve_workers
from qpart.offline.settings import CalibrationSettings
from qpart.offline.state import State


def test_workers_follow_the_settings_not_the_machine():
    assert resolve_workers(CalibrationSettings(threads=2), cuts=9) == 2
    assert resolve_workers(CalibrationSettings(threads=4), cuts=3) == 3
    assert resolve_workers(CalibrationSettings(threads=2, workers=1), cuts=9) == 1
    assert resolve_workers(CalibrationSettings(threads=1, workers=8), cuts=2) == 2


def test_a_worker_that_cannot_start_ends_the_job_with_its_reason(tmp_path):
    """Its initializer's error is raised by its first task: no pool restarting workers forever."""
    spec = replace(get_model("fmnist-cnn"), weights=tmp_path / "missing.safetensors")
    st = State(runner=None, data=None, settings=CalibrationSettings(threads=2))  # type: ignore[arg-type]
    with pytest.raises(WorkerError, match=r"could not start: ModelLoadError: .*missing\.safetensors"):
        all_patterns(spec, st, [0, 1], Plan({}, []), 2, lambda done: None, {}, lambda cut, record: None)


def _pattern(cut: int, weights: dict[str, int], act: int, **changes: object) -> dict[str, object]:
    bits = {**weights, "@activation": act} if act < 32 else dict(weights)
    return {"pattern_id": pattern_id(cut, bits), "cut": cut, "level": 0.01, "weight_bits": weights,
            "activation_bits": act, "group_size": 8, "predicted_noise": 0.0, "predicted_drop": 0.0,
            "calib_drop": 0.0, "calib_drop_ub": 0.01, "test_drop": None, "weight_bytes": 1,
            "fp32_weight_bytes": 4, "activation_bytes": 1, **changes}


def test_a_record_whose_bits_do_not_make_its_ids_is_refused_in_one_line():
    """Issue 52, review finding 9: a resealed checkpoint with edited bits keeps the old id."""
    record = {"lossless": _pattern(1, {"w": 32}, 32),
              "levels": [{"pattern": _pattern(1, {"w": 4}, 8), "baseline": _pattern(1, {"w": 8}, 8),
                          "anchor": None}]}
    check_record(1, record)
    edits = [("pattern", {"activation_bits": 1}), ("pattern", {"weight_bits": {"w": 2}}),
             ("baseline", {"weight_bits": {"w": 2}}), ("pattern", {"cut": 2})]
    for where, change in edits:
        level = record["levels"][0]
        edited = {**record, "levels": [{**level, where: {**level[where], **change}}]}
        with pytest.raises(CheckpointMismatchError, match=r"cut-1\.json.*--fresh") as refused:
            check_record(1, edited)
        assert "\n" not in str(refused.value)
    with pytest.raises(CheckpointMismatchError, match="not a record this job wrote"):
        check_record(1, {"lossless": {"cut": 1}, "levels": []})
    with pytest.raises(CheckpointMismatchError):  # the lossless one edited to a 1-bit activation
        check_record(1, {**record, "lossless": {**record["lossless"], "activation_bits": 1}})
