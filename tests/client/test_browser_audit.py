"""Live audits in the browser device (issue 50, ADR 0024): the page at ``/device/`` in Debian's
chromium, headless, against a live server that marks every consenting plan (QPART_AUDIT_RATE=1).
Opted in (``?audit=1`` or its box), the page's first tail request names the audit and, after every
answer is shown, its model input goes up as the kernels' float32 packet and is counted; not opted
in, nothing asks for an audit and nothing reaches ``/v1/audits/``, even when a plan names one."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from qpart.client.plans import PlanResponse
from qpart.kernels.wire import encode_float_activation
from tests.client.test_browser_device import (  # noqa: F401 (the browser and images fixtures)
    browser,
    images,
    profile_for_cut,
    run_page,
)
from tests.conftest import LiveServer

pytestmark = [pytest.mark.integration, pytest.mark.slow]
CUT = 5  # a robust plan the server answers (as test_browser_device's), on the every-cut artifact
AUDIT_ENV = {"QPART_AUDIT_RATE": "1"}


def _series(url: str, name: str) -> list[tuple[dict[str, str], float]]:
    """Every sample called ``name`` on the server's /metrics: (labels, value)."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return [(dict(s.labels), s.value) for family in text_string_to_metric_families(text)
            for s in family.samples if s.name == name]


def _audited_samples(url: str, want: float, timeout: float = 60) -> list[tuple[dict[str, str], float]]:
    """qpart_audit_samples_total once the worker (a thread off the hot path) has counted ``want``."""
    deadline = time.monotonic() + timeout
    while True:
        series = _series(url, "qpart_audit_samples_total")
        if sum(v for _, v in series) >= want or time.monotonic() > deadline:
            return series
        time.sleep(0.2)


def _audit_server(factory: type[LiveServer], artifacts: Path) -> tuple[LiveServer, str, int]:
    live = factory(artifacts, AUDIT_ENV)
    live.wait_ready()
    info = httpx.get(f"{live.url}/v1/models/fmnist-cnn", timeout=30).json()
    return live, info["version"], info["cuts"]


def _open(launched: Any, url: str, query: str = "") -> tuple[Any, list[str], list[Any]]:
    """The page (``query`` appended to its URL), its errors and every request it sends."""
    page = launched.new_page()
    errors: list[str] = []
    sent: list[Any] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))

    def keep(request: Any) -> None:  # a bound method is no Playwright handler
        sent.append(request)

    page.on("request", keep)
    page.goto(f"{url}/device/{query}")
    page.wait_for_selector('#status[data-state="ready"]', timeout=60_000)
    return page, errors, sent


def _audit_outcome(page: Any) -> str:
    page.wait_for_selector('#audit-status:is([data-state="queued"], [data-state="dropped"], '
                           '[data-state="failed"])', timeout=60_000)
    return str(page.inner_text("#audit-status"))


def _plan_bodies(sent: list[Any]) -> list[dict[str, Any]]:
    return [json.loads(r.post_data) for r in sent if r.method == "POST" and r.url.endswith("/v1/plan")]


def test_an_opted_in_page_uploads_its_first_input_after_the_answers(
        browser, every_cut, live_server_factory, images):  # noqa: F811 (the imported fixtures)
    x, files = images
    live, version, cuts = _audit_server(live_server_factory, every_cut)
    page, errors, sent = _open(browser, live.url, "?audit=1")
    assert page.is_checked("#audit")  # ?audit=1 ticks the box; the box alone decides
    run = run_page(page, files[:2], device=profile_for_cut(version, CUT, cuts), rate_mbps=1e5)
    assert "error" not in run, run
    plan = PlanResponse.model_validate(run["plan"])
    assert plan.cut == CUT and plan.infer_url is not None and plan.audit is not None
    assert [b.get("audit") for b in _plan_bodies(sent)] == [True]
    assert len(run["results"]) == 2
    assert _audit_outcome(page) == "audit: queued"
    assert page.evaluate("window.qpartLastRun.audit") == "queued"
    # The first tail request (one image: one sample) names the audit, the second does not; the
    # input goes up after both answers, once, as the kernels' float32 packet of that image.
    tail_url, audit_url = (urljoin(f"{live.url}/device/", u) for u in (plan.infer_url, plan.audit.url))
    tails = [i for i, r in enumerate(sent) if r.method == "POST" and r.url == tail_url]
    audits = [i for i, r in enumerate(sent) if "/v1/audits/" in r.url]
    assert len(tails) == 2 and len(audits) == 1 and audits[0] > tails[-1]
    assert [sent[i].all_headers().get("qpart-audit") for i in tails] == [plan.audit.id, None]
    upload = sent[audits[0]]
    assert upload.method == "POST" and upload.url == audit_url
    assert upload.all_headers()["content-type"] == "application/octet-stream"
    assert upload.post_data_buffer == encode_float_activation(x[:1])
    # The server took it and its worker compared that one sample with the float model.
    series = _audited_samples(live.url, 1)
    assert [(labels["model"], value) for labels, value in series] == [("fmnist-cnn", 1.0)], series
    assert [v for labels, v in _series(live.url, "qpart_audits_issued_total")] == [1.0]

    # A failed audit upload changes no answer: the page still shows them, and says it failed.
    page.route("**/v1/audits/**", lambda route: route.abort())
    again = run_page(page, files[:2])
    assert "error" not in again, again
    assert [r["label"] for r in again["results"]] == [r["label"] for r in run["results"]]
    assert _audit_outcome(page).startswith("audit: failed: ")
    assert page.get_attribute("#status", "data-state") == "done"
    assert errors == []
    page.close()


def test_a_page_not_opted_in_never_uploads_its_input(
        browser, every_cut, live_server_factory, images):  # noqa: F811 (the imported fixtures)
    _, files = images
    live, version, cuts = _audit_server(live_server_factory, every_cut)
    page, errors, sent = _open(browser, live.url)
    assert not page.is_checked("#audit")  # off by default
    run = run_page(page, files[:2], device=profile_for_cut(version, CUT, cuts), rate_mbps=1e5)
    assert "error" not in run, run
    plan = PlanResponse.model_validate(run["plan"])
    assert plan.cut == CUT and plan.infer_url is not None and plan.audit is None
    assert len(run["results"]) == 2 and run["audit"] is None
    assert [b.get("audit", False) for b in _plan_bodies(sent)] == [False]
    assert page.get_attribute("#audit-status", "data-state") == "off" and page.is_hidden("#audit-status")

    # Even a plan that names an audit it was not asked for (a forged answer) gets no input.
    def forge(route: Any) -> None:
        answer = route.fetch()
        body = answer.json()
        body["audit"] = {"id": "forged", "url": "/v1/audits/forged", "input_shape": [1, 28, 28],
                         "expires_s": 300}
        route.fulfill(response=answer, json=body)

    page.route("**/v1/plan", forge)
    forged = run_page(page, files[:1])
    assert "error" not in forged and forged["plan"]["audit"] is None, forged
    page.wait_for_timeout(500)  # an upload would follow the answer
    assert not [r.url for r in sent if "/v1/audits/" in r.url]
    assert not [r.url for r in sent if r.all_headers().get("qpart-audit") is not None]
    tail_url = urljoin(f"{live.url}/device/", plan.infer_url)
    tails = [r for r in sent if r.method == "POST" and r.url == tail_url]
    assert len(tails) == 3
    # The server saw no consent, issued no audit, and took no upload.
    assert [v for _, v in _series(live.url, "qpart_audits_issued_total") if v] == []
    assert [labels for labels, _ in _series(live.url, "qpart_requests_total")
            if labels["route"] == "audit"] == []
    assert errors == []
    page.close()
