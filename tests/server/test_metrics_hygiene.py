"""/metrics hygiene: process and platform collectors, no `_created` unless asked, one spelling for
a request that names no served model."""

from __future__ import annotations

import re

import pytest

from tests.server.conftest import make_client


def _scrape(cnn_only, **overrides: object) -> str:
    with make_client(cnn_only, **overrides) as c:
        assert c.post("/v1/plan", json={"model": "nope", "accuracy_demand": 0.01,
                                        "rate_bps": 1e6}).status_code == 404
        assert c.get("/v2/health/ready").status_code == 200
        c.get("/metrics")  # a route naming no model, counted before the next scrape
        return c.get("/metrics").text


def test_process_platform_and_gc_collectors_are_on(cnn_only):
    text = _scrape(cnn_only)
    for name in ("process_resident_memory_bytes", "process_cpu_seconds_total", "python_info",
                 "python_gc_collections_total"):
        assert re.search(rf"^{name}[ {{]", text, re.M), name


@pytest.mark.parametrize("created", [False, True])
def test_created_series_follow_the_setting(cnn_only, created):
    text = _scrape(cnn_only, metrics_created=created)
    found = re.findall(r"^qpart_\w+_created\b", text, re.M)
    assert bool(found) is created, found[:3]


def test_no_served_model_has_one_spelling(cnn_only):
    values = set(re.findall(r'^qpart_requests_total\{[^}]*model="([^"]*)"', _scrape(cnn_only), re.M))
    assert values == {"unknown"}, values  # unknown name (plan) and model-less routes (health, metrics)
