"""The limits middleware's per-route body limit: a plan body is refused past
QPART_MAX_PLAN_BODY_BYTES before its JSON is parsed; other routes keep QPART_MAX_BODY_BYTES."""

from __future__ import annotations

import json

from tests.server.conftest import make_client

PLAN = {"model": "fmnist-cnn", "accuracy_demand": 0.01, "rate_bps": 1e6}


def _padded_plan(size_bytes: int) -> bytes:
    """A plan request of about ``size_bytes``, its bulk in an inline profile's source notes."""
    profile = {"name": "big", "flops_per_s": 1e9, "power_compute_w": 1.0, "power_tx_w": 1.0,
               "sources": ["x" * 400] * (size_bytes // 400)}
    return json.dumps({**PLAN, "device": profile}).encode()


def test_a_plan_body_over_its_limit_is_a_413_naming_the_setting(client):
    body = _padded_plan(2 << 20)  # far under QPART_MAX_BODY_BYTES (8 MiB)
    declared = client.post("/v1/plan", content=body, headers={"content-type": "application/json"})
    assert declared.status_code == 413, declared.text
    assert "QPART_MAX_PLAN_BODY_BYTES" in declared.json()["error"] and "1048576" in declared.json()["error"]
    streamed = client.post("/v1/plan", content=iter([body[:1 << 19], body[1 << 19:]]),
                           headers={"content-type": "application/json"})  # chunked: no length
    assert streamed.status_code == 413 and "QPART_MAX_PLAN_BODY_BYTES" in streamed.json()["error"]


def test_the_plan_limit_is_a_setting_and_other_routes_keep_the_body_limit(cnn_only):
    with make_client(cnn_only, max_plan_body_bytes=4 << 20) as c:
        answer = c.post("/v1/plan", content=_padded_plan(2 << 20),
                        headers={"content-type": "application/json"})
        assert answer.status_code == 422, answer.text  # past the limit; the profile's own caps refuse it
    with make_client(cnn_only) as c:
        v2 = c.post("/v2/models/fmnist-cnn/infer", content=b" " * (2 << 20),
                    headers={"content-type": "application/json"})
        assert v2.status_code != 413, v2.text


def test_the_body_limit_still_names_its_setting(cnn_only):
    with make_client(cnn_only, max_body_bytes=2048) as c:
        answer = c.post("/v2/models/fmnist-cnn/infer", content=b"x" * 5000)
        assert answer.status_code == 413 and "QPART_MAX_BODY_BYTES" in answer.json()["error"]
