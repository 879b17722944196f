"""Transport: retries with backoff honour Retry-After; 4xx surface as typed errors at once."""

from __future__ import annotations

import httpx
import pytest

from qpart.client.errors import ServerRejectedError, ServerUnavailableError
from qpart.client.settings import DeviceSettings
from qpart.client.transport import RateEstimator, Transport


def _transport(handler, sleeps, retries=3):
    settings = DeviceSettings(server="http://qpart.test", retries=retries, backoff_s=0.01)
    client = httpx.Client(base_url=settings.server, transport=httpx.MockTransport(handler))
    return Transport(settings, client=client, sleep=sleeps.append)


def test_a_503_with_retry_after_is_retried_and_succeeds():
    calls = []

    def handler(request):
        calls.append(request)
        if len(calls) == 1:
            return httpx.Response(503, headers={"Retry-After": "2"}, json={"error": "tail queue full"})
        return httpx.Response(200, json={"ok": True})

    sleeps: list[float] = []
    response = _transport(handler, sleeps).request("POST", "/v1/plan", json={})
    assert response.json() == {"ok": True} and len(calls) == 2
    assert sleeps and sleeps[0] >= 2.0  # honoured the server's Retry-After


def test_connection_errors_back_off_with_growing_jittered_waits():
    def handler(request):
        raise httpx.ConnectError("refused")

    sleeps: list[float] = []
    with pytest.raises(ServerUnavailableError, match="4 attempts"):
        _transport(handler, sleeps).request("GET", "/v2/health/ready")
    assert len(sleeps) == 3 and sleeps[0] < sleeps[2]


def test_a_4xx_is_not_retried_and_carries_the_servers_message():
    calls = []

    def handler(request):
        calls.append(request)
        return httpx.Response(422, json={"error": "no plan meets the deadline"})

    with pytest.raises(ServerRejectedError, match="no plan meets the deadline") as info:
        _transport(handler, []).request("POST", "/v1/plan", json={})
    assert info.value.status == 422 and len(calls) == 1


def test_rate_estimate_is_a_moving_average_of_real_transfers():
    rate = RateEstimator(0.5)
    rate.add(100, 1.0)  # too small to measure a channel
    assert rate.rate_bps is None
    rate.add(1_000_000, 1.0)
    rate.add(1_000_000, 0.5)
    assert rate.rate_bps == pytest.approx(0.5 * 16e6 + 0.5 * 8e6)
