"""An ONNX head run has a deadline (issue 52, finding 2; ADR 0020): a run past it is stopped
between nodes with a one-line :class:`HeadDeadlineError`, its segment is evicted from the cache,
and the next run downloads it again instead of hanging on the cached copy."""

from __future__ import annotations

import time

import numpy as np
import pytest

from qpart.client.errors import CACHE_HEALED, HeadDeadlineError
from qpart.client.onnx_runtime import work_budget
from qpart.client.plans import PlanResponse
from qpart.client.settings import DeviceSettings
from tests.client.onnx_server import MODEL, Server, conv_chain
from tests.client.samples import PLAN

CHAIN_FLOPS = 48 * 2 * 16**2 * 9 * 32**2
"""The declared work of :func:`conv_chain`'s default head: its convolutions'."""
IMAGES = np.random.default_rng(0).random((64, 16, 32, 32), dtype=np.float32)


@pytest.mark.parametrize(("head_flops", "margin", "cap", "budget"), [
    (10**6, 16.0, 1 << 34, 16 * 10**6), (10**6, 1.5, 1 << 34, 1_500_000), (10**6, 16.0, 10**7, 10**7),
    (None, 16.0, 10**7, 10**7), (0, 16.0, 10**7, 0),
])
def test_the_work_budget_is_the_declared_flops_times_the_margin_within_the_devices_cap(
        head_flops, margin, cap, budget):
    plan = PlanResponse.model_validate({**PLAN, "head_flops": head_flops})
    settings = DeviceSettings(head_flops_margin=margin, head_max_flops=cap)
    assert work_budget(plan, settings)[0] == budget


def test_a_head_past_its_deadline_is_stopped_evicted_and_the_next_run_downloads_it_again(tmp_path):
    server = Server(conv_chain(), CHAIN_FLOPS, [16])
    started = time.perf_counter()
    assert len(server.device(tmp_path / "a").infer(IMAGES, MODEL, 0.01).predictions) == 64
    whole_s = time.perf_counter() - started  # within the default deadline
    device = server.device(tmp_path / "b", head_deadline_s=1e-3, head_min_flops_per_s=1e15)
    started = time.perf_counter()
    with pytest.raises(HeadDeadlineError) as stopped:
        device.infer(IMAGES, MODEL, 0.01)
    stopped_s = time.perf_counter() - started
    message = str(stopped.value)
    assert "\n" not in message and message.endswith(f"and was stopped; {CACHE_HEALED}"), message
    assert message.startswith(f"the ONNX head of segment {server.digest[:12]} ran past its deadline of "
                              "0.00"), message
    assert "s on 64 samples (QPART_DEVICE_HEAD_DEADLINE_S 0.001 + 64 x 2.27e+08 operations at " \
           "QPART_DEVICE_HEAD_MIN_FLOPS_PER_S 1e+15)" in message, message
    assert stopped_s < whole_s / 2, (stopped_s, whole_s)  # stopped between nodes, not run to its end
    assert device.cache.entries() == []
    downloads = server.downloads
    again = server.device(tmp_path / "b")  # the same cache, the default deadline
    assert len(again.infer(IMAGES, MODEL, 0.01).predictions) == 64
    assert server.held[-1] == [] and server.downloads == downloads + 1


def test_a_run_that_returns_past_its_deadline_is_refused_too(tmp_path, monkeypatch):
    """ONNX Runtime reads the flag only between nodes: a last node that outlasts the deadline ends
    the run normally, and the device refuses what it made and evicts the segment all the same."""

    class Late:
        """A timer whose flag never comes in time."""

        def __init__(self, *args: object) -> None:
            self.daemon = False

        def start(self) -> None:
            self.daemon = True

        def cancel(self) -> None:
            self.daemon = False

    monkeypatch.setattr("qpart.client.onnx_runtime.threading.Timer", Late)
    device = Server(conv_chain(nodes=2), 2 * CHAIN_FLOPS // 48, [16]).device(
        tmp_path, head_deadline_s=1e-6, head_min_flops_per_s=1e15)
    refused = rf"on 64 samples .* and its output was refused; {CACHE_HEALED}$"
    with pytest.raises(HeadDeadlineError, match=refused):
        device.infer(IMAGES, MODEL, 0.01)
    assert device.cache.entries() == []
