"""Metrics: promtool lints a live scrape after traffic; a real Prometheus scrapes the server."""

from __future__ import annotations

import shutil
import subprocess

import httpx
import pytest

from tests.conftest import LivePrometheus, LiveServer, tail_request

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server_with_traffic(cnn_only):
    server = LiveServer(cnn_only)
    server.wait_ready()
    infer_url, packet = tail_request(server.url, batch=4)
    with httpx.Client(base_url=server.url) as c:
        assert c.post(infer_url, content=packet).status_code == 200
        info = c.get("/v1/models/fmnist-cnn").json()
        seg = next(p["segment"] for p in info["patterns"] if p["segment"])
        assert c.get(seg["url"]).status_code == 200
        assert c.get("/v2/models/nope").status_code == 404
    yield server
    server.stop()


def test_promtool_accepts_a_live_scrape(server_with_traffic):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool not installed (Debian package 'prometheus'); .ci/run installs it")
    text = httpx.get(f"{server_with_traffic.url}/metrics").text
    for name in ("qpart_requests_total", "qpart_tail_queue_duration_seconds_bucket",
                 "qpart_segment_cache_hits_total", "qpart_build_info", "qpart_plans_total"):
        assert name in text
    result = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                            text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_real_prometheus_scrapes_qpart_series(server_with_traffic, tmp_path):
    prometheus = LivePrometheus(tmp_path, server_with_traffic.port)
    try:
        series = prometheus.wait_for('{__name__=~"qpart_.+"}')
        names = {s["metric"]["__name__"] for s in series}
        assert "qpart_build_info" in names and "qpart_requests_total" in names, names
    finally:
        prometheus.stop()
