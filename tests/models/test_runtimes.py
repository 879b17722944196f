"""Each cut's runtimes at calibration (models.runtimes, ADR 0019): where onnxruntime is missing, the
ONNX head is still exported and checked, and the job says once that it was not run."""

from __future__ import annotations

import importlib.util
import tomllib
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

from qpart.kernels.onnx_segment import HeadRuntime
from qpart.models import runtimes
from qpart.models.partition import cuts_of, prepare, split

INPUT_SHAPE = (3, 8, 8)


def _head() -> torch.fx.GraphModule:
    gm = prepare(nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(144, 5)).eval(),
                 INPUT_SHAPE)
    return split(gm, cuts_of(gm)[-1])[0]


@pytest.fixture
def without_onnxruntime(monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "onnxruntime" else find_spec(name, *a))
    runtimes.onnxruntime_installed.cache_clear()
    yield
    runtimes.onnxruntime_installed.cache_clear()


def test_without_onnxruntime_the_onnx_run_is_skipped_with_one_warning(without_onnxruntime):
    head = _head()
    with pytest.warns(UserWarning, match=r"onnxruntime is not installed: .* not run against the torch "
                                         r"head \(install qpart-serving\[offline\]") as caught:
        assert HeadRuntime.ONNX.value not in runtimes.runtime_refusals(head, INPUT_SHAPE)
        assert HeadRuntime.ONNX.value not in runtimes.runtime_refusals(head, INPUT_SHAPE)
    assert len([w for w in caught if "onnxruntime" in str(w.message)]) == 1


def test_with_onnxruntime_nothing_is_said():
    runtimes.onnxruntime_installed.cache_clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert runtimes.runtime_refusals(_head(), INPUT_SHAPE) == {}


def test_the_offline_extra_installs_onnxruntime():
    project = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    offline = project["project"]["optional-dependencies"]["offline"]
    assert any(dep.split(">")[0].split("=")[0] == "onnxruntime" for dep in offline)


def test_refusals_are_grouped_by_reason_without_the_nodes_place_and_bounded():
    refused = {
        2: "ONNX segment uses operator 'Resize', which is not in the allow-list",
        3: "ONNX segment node 4 (Pad -> 'd'): ...",
        5: "ONNX segment uses operator 'Resize', which is not in the allow-list",
        6: "ONNX segment node 9 (Pad -> 'k'): ...",
        **{7 + i: f"reason {i}" for i in range(5)},
    }
    reasons, more = runtimes.distinct_refusals(refused)
    assert reasons[:2] == [("ONNX segment uses operator 'Resize', which is not in the allow-list", [2, 5]),
                           ("ONNX segment Pad: ...", [3, 6])]
    assert [r for r, _ in reasons[2:]] == ["reason 0", "reason 1", "reason 2"]
    assert more == 2
