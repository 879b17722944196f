"""Every metric that the Grafana dashboard and the alert rules query is one the server exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from tests.server.conftest import make_client

REPO = Path(__file__).resolve().parents[2]
_SUFFIXES = ("_bucket", "_sum", "_count")


def _queried() -> set[str]:
    exprs = []
    dashboard = json.loads((REPO / "docker/grafana/dashboards/qpart.json").read_text())
    exprs += [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    rules = yaml.safe_load((REPO / "docker/alerts.yml").read_text())
    exprs += [r["expr"] for g in rules["groups"] for r in g["rules"]]
    hpa = yaml.safe_load((REPO / "deploy/k8s/overlays/production/hpa.yaml").read_text())
    exprs += [m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"]]
    return set(re.findall(r"\bqpart_[a-z_]+", " ".join(exprs)))


def _exported(cnn_only: Path) -> set[str]:
    with make_client(cnn_only) as client:
        client.post("/v1/plan", json={"model": "fmnist-cnn", "accuracy_demand": 0.01, "rate_bps": 1e6})
        text = client.get("/metrics").text
    names = set()
    for line in text.splitlines():
        match = re.match(r"# TYPE (\S+) (\w+)", line)
        if match:
            name, kind = match.groups()
            names.add(name)
            if kind == "counter":
                names.add(f"{name}_total")
            if kind == "histogram":
                names |= {name + s for s in _SUFFIXES}
    return names


def test_dashboard_rules_and_hpa_query_only_exported_metrics(cnn_only):
    queried = _queried()
    assert len(queried) >= 10
    missing = queried - _exported(cnn_only)
    assert not missing, f"queried but never exported: {sorted(missing)}"
