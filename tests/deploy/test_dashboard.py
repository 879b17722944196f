"""The Grafana dashboard imports into an existing Grafana (datasource chosen at import), and every
panel's and every alert rule's PromQL is evaluated against a real Prometheus scraping a live server."""

from __future__ import annotations

import json
import math
import re
import time

import httpx
import pytest
import yaml

from tests.conftest import LivePrometheus, LiveServer, tail_request
from tests.deploy.conftest import REPO

DASHBOARD = REPO / "docker/grafana/dashboards/qpart.json"
RULES = REPO / "docker/alerts.yml"
# Dashboard variables as Grafana substitutes them for one choice; $version is read from the server.
VARIABLES = {"$__rate_interval": "1m", "$model": "fmnist-cnn", "$job": "qpart"}


def _dashboard() -> dict:
    loaded: dict = json.loads(DASHBOARD.read_text())
    return loaded


def _datasources(node: object) -> list[object]:
    if isinstance(node, dict):
        found = [node["datasource"]] if "datasource" in node else []
        return found + [d for v in node.values() for d in _datasources(v)]
    if isinstance(node, list):
        return [d for v in node for d in _datasources(v)]
    return []


def test_dashboard_takes_its_datasource_at_import():
    board = _dashboard()
    (ds_input,) = board["__inputs"]
    assert ds_input["type"] == "datasource" and ds_input["pluginId"] == "prometheus"
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["current"]["value"] == "${" + ds_input["name"] + "}"
    assert {"model", "version"} <= variables.keys()
    queries = [v for n, v in variables.items() if n != "datasource"]
    uses = _datasources(board["panels"]) + _datasources(queries)
    assert uses and all(d == {"type": "prometheus", "uid": "${datasource}"} for d in uses), uses
    exprs = [t["expr"] for p in board["panels"] for t in p["targets"]]
    assert not [e for e in exprs if re.search(r"\[\d+[smh]\]", e)], "use $__rate_interval"
    assert all("$__rate_interval" in e for e in exprs if "rate(" in e)


def _substitute(expr: str, variables: dict[str, str]) -> str:
    for name in sorted(variables, key=len, reverse=True):
        expr = expr.replace(name, variables[name])
    assert "$" not in expr, f"unsubstituted variable in {expr}"
    return expr


def _drive_traffic(url: str, seconds: float) -> None:
    """A bounded loop of the requests the panels watch: plans, tail inference, segments, 404s."""
    infer_url, packet = tail_request(url, batch=4)
    deadline = time.monotonic() + seconds
    with httpx.Client(base_url=url, timeout=30) as c:
        seg = next(p["segment"] for p in c.get("/v1/models/fmnist-cnn").json()["patterns"] if p["segment"])
        for _ in range(200):
            if time.monotonic() > deadline:
                break
            assert c.post(infer_url, content=packet).status_code == 200
            assert c.post("/v1/plan", json={"model": "fmnist-cnn", "accuracy_demand": 0.01,
                                            "rate_bps": 1e6}).status_code == 200
            assert c.get(seg["url"]).status_code == 200
            assert c.get("/v2/models/nope").status_code == 404  # model="unknown"
            assert c.get("/v2/models/fmnist-cnn/versions/nope").status_code == 404  # an error of the model
            time.sleep(0.1)


def _finite(result: list[dict]) -> bool:
    return any(math.isfinite(float(s["value"][1])) for s in result)


@pytest.mark.integration
def test_every_panel_and_rule_evaluates_against_a_live_prometheus(cnn_only, tmp_path):
    server = LiveServer(cnn_only)
    prometheus = None
    try:
        server.wait_ready()
        prometheus = LivePrometheus(tmp_path, server.port)
        prometheus.wait_for('up{job="qpart"} == 1')
        _drive_traffic(server.url, seconds=4)
        time.sleep(3)  # three more scrapes: every counter has moved within the last minute
        ready = prometheus.wait_for('qpart_model_ready{model="fmnist-cnn"}')
        variables = {**VARIABLES, "$version": ready[0]["metric"]["version"]}

        board = _dashboard()
        empty_panels: dict[str, list[str]] = {}
        targets = 0
        for panel in board["panels"]:
            for target in panel["targets"]:
                targets += 1
                answer = prometheus.query(_substitute(target["expr"], variables))
                assert answer["status"] == "success", (panel["title"], target["expr"], answer)
                if not _finite(answer["data"]["result"]):
                    empty_panels.setdefault(panel["title"], []).append(target["expr"])
        assert not empty_panels, f"panels that returned no (finite) data: {empty_panels}"

        # Metric families the target declared (# TYPE), with or without samples yet (a counter
        # nothing has incremented, such as shed requests, has no series but has metadata).
        known = set(httpx.get(f"{prometheus.url}/api/v1/metadata", timeout=5).json()["data"])
        rules = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
        for rule in rules:
            answer = prometheus.query(rule["expr"])
            assert answer["status"] == "success", (rule["alert"], answer)
            assert answer["data"]["result"] == [], f"{rule['alert']} fires on a quiet server: {answer}"
            names = set(re.findall(r"\b(?:qpart|process|python)_[a-z_]+", rule["expr"]))
            families = {re.sub(r"_(bucket|sum|count)$", "", n) for n in names}
            unseen = families - known
            assert not unseen, f"{rule['alert']} watches what the target never exported: {unseen}"
        print(f"evaluated {len(board['panels'])} panels ({targets} queries) and {len(rules)} rules")
    finally:
        if prometheus is not None:
            prometheus.stop()
        server.stop()
