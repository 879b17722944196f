"""Graceful shutdown: readiness turns 503 first, in-flight and draining-window requests complete."""

from __future__ import annotations

import signal
import time

import httpx
import pytest

from tests.conftest import LiveServer, TailLoad, tail_request

pytestmark = pytest.mark.integration


def test_sigterm_flips_readiness_then_finishes_accepted_requests(cnn_only):
    server = LiveServer(cnn_only, env={"QPART_DRAIN_DELAY_S": "1.5", "QPART_GRACEFUL_TIMEOUT_S": "10"})
    server.wait_ready()
    load = TailLoad(server.url, *tail_request(server.url, batch=64), clients=4)
    time.sleep(1.0)
    accepted_before = len(load.statuses())
    server.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    ready = httpx.get(f"{server.url}/v2/health/ready", timeout=5)
    assert ready.status_code == 503 and "draining" in ready.json()["error"]
    assert httpx.get(f"{server.url}/v2/health/live", timeout=5).status_code == 200
    started = time.monotonic()
    server.proc.wait(20)
    load.stop()
    assert time.monotonic() - started < 15  # bounded
    assert accepted_before > 0
    # Every request the server accepted, before and during the drain window, was answered.
    statuses = load.statuses()
    assert statuses and set(statuses) == {200}
    assert len(statuses) >= accepted_before
    server.stop()
