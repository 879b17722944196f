"""Alert rules operators can act on: a severity, a runbook that exists, rules promtool accepts."""

from __future__ import annotations

import re
import subprocess

import yaml

from tests.deploy.conftest import REPO, tool

RULES = REPO / "docker" / "alerts.yml"


def _alerts() -> list[dict]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "alert" in r]


def test_every_alert_has_a_severity_and_a_runbook_that_exists():
    alerts = _alerts()
    assert len(alerts) >= 5
    for rule in alerts:
        assert rule["labels"]["severity"] in {"critical", "warning"}, rule["alert"]
        url = rule["annotations"]["runbook_url"]
        assert url.startswith("docs/runbooks/") and url.endswith(".md"), url
        page = (REPO / url).read_text()
        assert rule["alert"] in page, f"{url} does not name {rule['alert']}"
        for part in ("**Means:**", "**Confirm:**", "**Do:**", "**Tunable:**"):
            assert part in page, f"{url} lacks {part}"


def test_promtool_checks_the_rules_and_the_config():
    promtool = tool("promtool", "Debian package prometheus; .ci/run installs it")
    for args in (["check", "rules", str(RULES)], ["check", "config", str(RULES.parent / "prometheus.yml")]):
        done = subprocess.run([promtool, *args], capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stdout + done.stderr


def test_promtool_unit_tests_of_the_rules_pass():
    """docker/alerts.test.yml: each live-audit alert fires once its bound crosses, never before."""
    promtool = tool("promtool", "Debian package prometheus; .ci/run installs it")
    tests = RULES.parent / "alerts.test.yml"
    done = subprocess.run([promtool, "test", "rules", str(tests)], capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    tested = set(re.findall(r"alertname: (\w+)", tests.read_text()))
    assert {"QpartPromiseBrokenLive", "QpartLiveDisagreementAboveTest"} <= tested, tested
