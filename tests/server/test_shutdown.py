"""Graceful shutdown: readiness turns 503 first, in-flight and draining-window requests complete."""

from __future__ import annotations

import signal
import threading
import time

import httpx
import numpy as np
import pytest

from client.runtime import encode_for_plan
from tests.conftest import LiveServer

pytestmark = pytest.mark.integration


def test_sigterm_flips_readiness_then_finishes_accepted_requests(cnn_only):
    server = LiveServer(cnn_only, env={"QPART_DRAIN_DELAY_S": "1.5", "QPART_GRACEFUL_TIMEOUT_S": "10"})
    server.wait_ready()
    with httpx.Client(base_url=server.url, timeout=30) as c:
        plan = c.post("/v1/plan", json={"model": "fmnist-cnn", "accuracy_demand": 0.01,
                                        "rate_bps": 1e6}).json()
    packet = encode_for_plan(np.random.rand(64, *plan["activation_shape"]).astype(np.float32), plan)
    statuses: list[int] = []
    stop = threading.Event()

    def load() -> None:
        with httpx.Client(base_url=server.url, timeout=30) as c:
            while not stop.is_set():
                try:
                    statuses.append(c.post(plan["infer_url"], content=packet).status_code)
                except httpx.TransportError:
                    return  # the listener closed after the drain window: no request was accepted

    workers = [threading.Thread(target=load) for _ in range(4)]
    for w in workers:
        w.start()
    time.sleep(1.0)
    accepted_before = len(statuses)
    server.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    ready = httpx.get(f"{server.url}/v2/health/ready", timeout=5)
    assert ready.status_code == 503 and "draining" in ready.json()["error"]
    assert httpx.get(f"{server.url}/v2/health/live", timeout=5).status_code == 200
    started = time.monotonic()
    server.proc.wait(20)
    stop.set()
    for w in workers:
        w.join(30)
    assert time.monotonic() - started < 15  # bounded
    assert accepted_before > 0
    # Every request the server accepted, before and during the drain window, was answered.
    assert statuses and set(statuses) == {200}
    assert len(statuses) >= accepted_before
    server.stop()
