"""Live audits from the Python devices (issue 50, acceptance 3): the torch and the ONNX Runtime device,
opted in, complete an audit against a live server over real HTTP; a device that did not opt in never
uploads its input, even when a server sends it an audit unasked."""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from qpart.client.device import DeviceClient
from qpart.client.inputs import read_idx_images
from qpart.client.onnx_runtime import OnnxDeviceRuntime
from qpart.client.plans import PlanResponse
from qpart.client.runtime import DeviceRuntime
from qpart.client.settings import DeviceSettings
from qpart.profiles.devices import DeviceProfile
from tests.client.samples import PLAN
from tests.conftest import LiveServer

pytestmark = [pytest.mark.integration]
IMAGES = Path("/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz")
# A device fast enough, on a fast enough link, that it runs a head (the plan's cut is past 0).
FAST = DeviceProfile.model_validate({"schema_version": 2, "name": "fast-board", "flops_per_s": 5e11,
                                     "power_compute_w": 2.0, "power_tx_w": 1.0, "rtt_s": 0.02})
SLOW_LINK = 1e5  # bit/s: on it fmnist-mobilenet's plans run a head on the device


@pytest.fixture(scope="module")
def server(tmp_path_factory, artifacts_dir):
    """Every plan audited, over fmnist-cnn and fmnist-mobilenet (whose plans on a slow link run a
    head on the device: cut 6 at 3 bits)."""
    root = tmp_path_factory.mktemp("audited")
    for name in ("fmnist-cnn", "fmnist-mobilenet"):
        shutil.copytree(artifacts_dir / name, root / name)
    live = LiveServer(root, env={"QPART_AUDIT_RATE": "1"})
    live.wait_ready()
    yield live
    live.stop()


def _series(url: str, name: str, route: str | None = None) -> float:
    """The sum of a metric's samples on the server's /metrics (0 when absent)."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    total = 0.0
    for labels, value in re.findall(rf"^{name}\{{([^}}]*)\}} (\S+)$", text, re.M):
        if route is None or f'route="{route}"' in labels:
            total += float(value)
    return total


def _wait_for(url: str, name: str, value: float, timeout: float = 30) -> float:
    deadline = time.monotonic() + timeout
    while (seen := _series(url, name)) < value and time.monotonic() < deadline:
        time.sleep(0.1)
    return seen


def _device(kind: str, server: LiveServer, cache: Path, **settings: object) -> DeviceClient:
    config = DeviceSettings(server=server.url, cache_dir=cache, **settings)
    if kind == "onnx":
        return OnnxDeviceRuntime(config, device_profile=FAST, threads=1)
    return DeviceRuntime(config, device_profile=FAST)


@pytest.mark.parametrize("kind", ["torch", "onnx"])
def test_a_consenting_device_completes_an_audit(server, tmp_path, kind):
    images = np.random.default_rng(5).random((5, 3, 64, 64), dtype=np.float32)
    before = _series(server.url, "qpart_audit_samples_total")
    with _device(kind, server, tmp_path, audit=True) as device:
        run = device.infer(images, "fmnist-mobilenet", 0.02, rate_bps=SLOW_LINK)
    assert run.plan.audit is not None and run.plan.cut > 0, run.plan  # a head ran on the device
    assert run.audit == "queued"
    assert len(run.predictions) == 5
    # one sample per audit, the one the tail answer named
    assert _wait_for(server.url, "qpart_audit_samples_total", before + 1) == before + 1


@pytest.mark.parametrize("kind", ["torch", "onnx"])
def test_a_device_that_did_not_consent_never_uploads(server, tmp_path, kind):
    images = read_idx_images(IMAGES, limit=3)
    uploads = _series(server.url, "qpart_requests_total", route="audit")
    issued = _series(server.url, "qpart_audits_issued_total")
    with _device(kind, server, tmp_path) as device:
        run = device.infer(images, "fmnist-cnn", 0.02)
    assert run.plan.audit is None and run.audit is None
    assert len(run.predictions) == 3
    assert _series(server.url, "qpart_requests_total", route="audit") == uploads
    assert _series(server.url, "qpart_audits_issued_total") == issued


def test_an_audit_the_device_never_asked_for_is_dropped(tmp_path):
    """A server that marks a plan unasked gets no input: the device drops the audit on reading."""
    hostile = {**PLAN, "audit": {"id": "x", "url": "/v1/audits/x", "input_shape": [1, 28, 28],
                                 "expires_s": 300}}
    plan = PlanResponse.model_validate(hostile)
    assert plan.audit is not None
    with DeviceRuntime(DeviceSettings(server="http://qpart.test", cache_dir=tmp_path)) as device:
        assert device._trusted(plan).audit is None
    with DeviceRuntime(DeviceSettings(server="http://qpart.test", cache_dir=tmp_path, audit=True)) as device:
        assert device._trusted(plan).audit is not None


def test_an_audit_on_another_origin_is_refused(tmp_path):
    """The raw input goes to the server's own origin only (ADR 0020)."""
    from qpart.client.errors import ForeignOriginError

    hostile = {**PLAN, "audit": {"id": "x", "url": "http://elsewhere.test/v1/audits/x",
                                 "input_shape": [1, 28, 28], "expires_s": 300}}
    with (DeviceRuntime(DeviceSettings(server="http://qpart.test", cache_dir=tmp_path, audit=True)) as device,
          pytest.raises(ForeignOriginError)):
        device._trusted(PlanResponse.model_validate(hostile))


def test_the_command_line_consents_with_a_flag_and_says_what_came_of_it(server, tmp_path):
    import json
    import subprocess
    import sys

    base = [sys.executable, "-m", "qpart", "device", "infer", "--idx", str(IMAGES), "--limit", "3",
            "--demand", "0.02", "--server", server.url, "--cache-dir", str(tmp_path)]
    said = subprocess.run([*base, "--audit"], capture_output=True, text=True, timeout=120, check=True).stdout
    assert "audit: queued" in said, said
    doc = json.loads(subprocess.run([*base, "--json"], capture_output=True, text=True, timeout=120,
                                    check=True).stdout)
    assert doc["audit"] is None and doc["plan"].get("audit") is None  # not consented: nothing sent


def test_a_consenting_run_says_when_its_plan_was_not_marked(cnn_only, tmp_path):
    off = LiveServer(cnn_only)  # QPART_AUDIT_RATE unset: nothing is audited
    try:
        off.wait_ready()
        with _device("torch", off, tmp_path, audit=True) as device:
            run = device.infer(read_idx_images(IMAGES, limit=2), "fmnist-cnn", 0.02)
    finally:
        off.stop()
    assert run.plan.audit is None and run.audit is not None and run.audit.startswith("not marked")


def test_the_uploaded_sample_is_the_one_the_answer_named(server, tmp_path, monkeypatch):
    from qpart.client import device as device_module

    named: list[tuple[np.ndarray, str | None, np.ndarray | None]] = []
    sent: list[np.ndarray] = []
    real_pick, real_upload = device_module.audit_sample, device_module.upload_audit

    def pick(batch, header):
        chosen = real_pick(batch, header)
        named.append((batch, header, chosen))
        return chosen

    def upload(transport, plan, inputs):
        sent.append(inputs)
        return real_upload(transport, plan, inputs)

    monkeypatch.setattr(device_module, "audit_sample", pick)
    monkeypatch.setattr(device_module, "upload_audit", upload)
    images = np.random.default_rng(9).random((6, 3, 64, 64), dtype=np.float32)
    with _device("torch", server, tmp_path, audit=True) as device:
        run = device.infer(images, "fmnist-mobilenet", 0.02, rate_bps=SLOW_LINK)
    ((batch, header, chosen),) = named
    assert run.audit == "queued" and header is not None and header.isdigit()
    assert len(batch) == 6 and np.array_equal(chosen, batch[int(header) : int(header) + 1])
    assert len(sent) == 1 and np.array_equal(sent[0], chosen)


def test_a_header_that_names_no_sample_uploads_nothing():
    from qpart.client.uploads import audit_sample

    batch = np.arange(12, dtype=np.float32).reshape(4, 3)
    assert audit_sample(batch, "2").tolist() == [[6.0, 7.0, 8.0]]
    for header in (None, "", "4", "-1", "1.5", "x", "٣", "9" * 7):
        assert audit_sample(batch, header) is None, header
