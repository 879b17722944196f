"""Rate-limited warnings: a flood of malformed requests writes a few log lines and a count, not a
line each; the server's own errors always pass."""

from __future__ import annotations

import logging
import socket

import httpx
import pytest

from qpart.server.api.log_throttle import WarningThrottle, throttle_warnings
from tests.conftest import LiveServer

INVALID = "Invalid HTTP request received."


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _record(msg: str, level: int = logging.WARNING, args: tuple[object, ...] = ()) -> logging.LogRecord:
    return logging.LogRecord("uvicorn.error", level, __file__, 1, msg, args, None)


def test_a_flood_passes_a_few_then_says_how_many_were_suppressed():
    clock = Clock()
    throttle = WarningThrottle(per_interval=3, interval_s=60, clock=clock)
    records = [_record(INVALID) for _ in range(10)]
    passed = [r for r in records if throttle.filter(r)]
    assert len(passed) == 3
    assert "more are counted, not logged" in passed[-1].getMessage()
    clock.now = 61
    after = _record(INVALID)
    assert throttle.filter(after)
    assert after.getMessage().startswith(INVALID) and "7 more like it suppressed" in after.getMessage()
    clock.now = 62
    assert throttle.filter(_record(INVALID))  # a fresh window: its own budget, nothing to report


def test_each_warning_has_its_own_budget_and_errors_always_pass():
    throttle = WarningThrottle(per_interval=1, interval_s=60, clock=Clock())
    assert throttle.filter(_record(INVALID))
    assert not throttle.filter(_record(INVALID))
    assert throttle.filter(_record("Unsupported upgrade request."))
    assert all(throttle.filter(_record("%s %s -> %d: %s", logging.ERROR, ("GET", "/", 500, "x")))
               for _ in range(5))


def test_a_throttled_record_keeps_its_formatted_arguments():
    throttle = WarningThrottle(per_interval=1, interval_s=60, clock=Clock())
    record = _record("%s %s -> %d", args=("GET", "/v1/plan", 503))
    assert throttle.filter(record) and record.getMessage().startswith("GET /v1/plan -> 503 (")


def test_the_throttle_is_put_on_a_logger_once():
    logger = logging.getLogger("tests.log_throttle.once")
    first = throttle_warnings(logger)
    assert throttle_warnings(logger) is first and logger.filters.count(first) == 1
    logger.removeFilter(first)


@pytest.mark.integration
def test_a_live_server_logs_a_few_lines_for_a_flood_of_malformed_requests(cnn_only):
    live = LiveServer(cnn_only)
    try:
        live.wait_ready()
        for _ in range(40):
            with socket.create_connection(("127.0.0.1", live.port), timeout=5) as sock:
                sock.sendall(b"NOT HTTP AT ALL\r\n\r\n")
                assert sock.recv(65536).startswith(b"HTTP/1.1 400")
        assert httpx.get(f"{live.url}/v2/health/ready", timeout=5).status_code == 200
    finally:
        out = live.stop()
    lines = [line for line in out.splitlines() if INVALID in line]
    assert 1 <= len(lines) <= 10, out[-3000:]
    assert "more are counted, not logged" in lines[-1]
