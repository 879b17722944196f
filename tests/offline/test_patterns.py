"""The validation stage's worker processes: how many, and what happens when one cannot start."""

from __future__ import annotations

from dataclasses import replace

import pytest

from qpart.models.registry import get_model
from qpart.offline.errors import WorkerError
from qpart.offline.patterns import Plan, all_patterns, resolve_workers
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
