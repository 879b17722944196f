"""An ONNX head's work is bounded before it runs (issue 52, finding 2; ADR 0020): a segment whose
estimated operations per sample are over the budget of its plan (the declared head FLOPs times a
margin, within the device's cap) is refused before ONNX Runtime sees it; every real head passes."""

from __future__ import annotations

import hashlib
import re

import numpy as np
import pytest

from qpart.client.errors import SegmentRefusedError
from tests.client.onnx_server import METADATA, MODEL, Server
from tests.kernels.onnx_models import window_bomb

CNN_HEAD_FLOPS = 37_471_744
"""What fmnist-cnn's card declares for its whole head (artifacts/fmnist-cnn, cut 8)."""


@pytest.fixture
def sessions(monkeypatch) -> list[bytes]:
    """Every ONNX Runtime session the device asks for; none is made (the bomb would run for hours
    per sample): each call is recorded and fails the run."""
    made: list[bytes] = []

    def refuse(data: bytes, *args: object, **kwargs: object) -> None:
        made.append(data)
        raise AssertionError("an ONNX Runtime session was created for a segment the check should refuse")

    monkeypatch.setattr("qpart.client.onnx_runtime.ort.InferenceSession", refuse)
    return made


MARGIN = "QPART_DEVICE_HEAD_FLOPS_MARGIN 16"
CAP = r"QPART_DEVICE_HEAD_MAX_FLOPS 1.72e\+10"


@pytest.mark.parametrize(("head_flops", "budget", "whence"), [
    (CNN_HEAD_FLOPS, r"6e\+08", rf"the plan's declared head FLOPs 3.75e\+07 x {MARGIN}"),
    (10**15, r"1.72e\+10", rf"{CAP}, under the plan's declared head FLOPs 1e\+15 x {MARGIN}"),
    (None, r"1.72e\+10", rf"{CAP}: the plan declares no head FLOPs"),
])
def test_the_window_bomb_is_refused_before_any_session_naming_its_cost_and_budget(
        tmp_path, sessions, head_flops, budget, whence):
    """A server that tells the truth about the head, one that lies (the device's cap holds), and
    one from before the field."""
    server = Server(window_bomb(METADATA), head_flops, [1, 2049, 2049])
    assert len(server.data) < 1400
    device = server.device(tmp_path)
    with pytest.raises(SegmentRefusedError) as refused:
        device.infer(np.ones((2, 1, 1, 1), np.float32), MODEL, 0.01)
    message = str(refused.value)
    assert re.fullmatch(
        rf"segment {server.digest[:12]} refused: ONNX segment node 24 \(AveragePool -> 'activation'\) costs "
        rf"about 1.76e\+13 operations per sample, bringing the graph to 1.76e\+13, over the work budget of "
        rf"{budget} \({whence}\)", message), message
    assert sessions == [] and device.cache.entries() == [] and server.downloads == 1


def test_the_work_budget_holds_for_a_cached_copy_too(tmp_path, sessions):
    """A cache another, laxer process filled: the check before the session refuses the bomb again,
    and evicts it."""
    from qpart.client.errors import CACHE_HEALED

    server = Server(window_bomb(METADATA), CNN_HEAD_FLOPS, [1, 2049, 2049])
    device = server.device(tmp_path)
    device.segment_check = lambda plan: None  # type: ignore[method-assign]
    with pytest.raises(SegmentRefusedError, match=rf"over the work budget of 6e\+08 .*; {CACHE_HEALED}$"):
        device.infer(np.ones((2, 1, 1, 1), np.float32), MODEL, 0.01)
    assert sessions == [] and device.cache.entries() == []


@pytest.mark.slow
def test_every_reference_head_passes_the_budget_its_plan_declares(artifacts_dir):
    """Every pattern's ONNX segment of the three reference models, checked as the device checks it
    (default settings) under a plan declaring the artifact's head FLOPs: the largest estimate stays
    under half the margin times the declared FLOPs."""
    from qpart.client.onnx_runtime import check_segment
    from qpart.client.plans import PlanResponse
    from qpart.client.settings import DeviceSettings
    from qpart.server.store.catalog import Catalog
    from qpart.server.store.segments import build_onnx_segment
    from tests.client.samples import PLAN

    settings = DeviceSettings()
    ratios = {}
    for entry in Catalog.load(artifacts_dir).entries:
        model = entry.model
        assert model is not None, entry.reason
        for p in model.artifact.patterns:
            if not list(model.parts[p.cut][0].parameters()):
                continue
            data = build_onnx_segment(model.parts[p.cut][0], tuple(model.artifact.input_shape), model.name,
                                      model.version, p)
            digest = hashlib.sha256(data).hexdigest()
            declared = model.artifact.cuts[p.cut].head_flops
            plan = PlanResponse.model_validate({
                **PLAN, "model": model.name, "version": model.version, "cut": p.cut,
                "plan_id": f"{model.name}@{model.version}/{p.pattern_id}", "head_flops": declared,
                "segment": {"id": digest, "url": "/s", "size_bytes": len(data), "sha256": digest,
                            "held": False, "runtime": "onnx"}})
            ratios[model.name, p.pattern_id] = check_segment(plan, data, settings=settings).flops / declared
    assert {name for name, _ in ratios} == {"fmnist-cnn", "fmnist-resnet", "fmnist-mobilenet"}
    worst = max(ratios.items(), key=lambda kv: kv[1])
    print(f"{len(ratios)} segments; largest estimate / declared FLOPs: {worst[1]:.3f} ({worst[0]})")
    assert worst[1] < settings.head_flops_margin / 2, worst
