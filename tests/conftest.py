"""Shared fixtures: the committed calibration artifacts, app instances, a live uvicorn server and
tail-inference load against it."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest

# ONNX Runtime's telemetry off in the tests as in the product (client.onnx_runtime, models.runtimes),
# before any test module imports it, and in every process the tests start
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")

REPO = Path(__file__).resolve().parent.parent
ARTIFACTS = Path(os.environ.get("QPART_TEST_ARTIFACTS", REPO / "artifacts"))


@pytest.fixture(scope="session")
def artifacts_dir() -> Path:
    if not (ARTIFACTS / "fmnist-cnn" / "artifact.json").is_file():
        pytest.fail(f"no committed artifacts under {ARTIFACTS}; run `make artifacts`")
    return ARTIFACTS


EVERY_CUT = REPO / "tests" / "fixtures" / "every-cut"
"""fmnist-cnn as calibrated at every legal cut (schema 5, committed as the demo's artifact before
calibration pruned cuts, ADR 0025): for tests that name a cut a plan would never choose."""


def first_middle_cut(info: dict) -> int:
    """The first calibrated cut between the input and the output in a ``GET /v1/models/{model}``
    answer: a plan there downloads a head and uploads an activation."""
    return min(p["cut"] for p in info["patterns"] if 0 < p["cut"] < info["cuts"] - 1)


@pytest.fixture(scope="session")
def every_cut(tmp_path_factory) -> Path:
    """An artifacts folder holding :data:`EVERY_CUT`'s fmnist-cnn: patterns at every cut and level."""
    root = tmp_path_factory.mktemp("every-cut")
    shutil.copytree(EVERY_CUT / "fmnist-cnn", root / "fmnist-cnn")
    return root


@pytest.fixture(scope="session")
def cnn_only(tmp_path_factory, artifacts_dir) -> Path:
    """An artifacts folder holding only fmnist-cnn (quicker to load)."""
    root = tmp_path_factory.mktemp("artifacts")
    shutil.copytree(artifacts_dir / "fmnist-cnn", root / "fmnist-cnn")
    return root


@pytest.fixture(scope="session")
def agreement_only(tmp_path_factory) -> Path:
    """An artifacts folder holding fmnist-cnn calibrated by top1-agreement (ADR 0023) on flat,
    unlabelled Fashion-MNIST exports, with a small budget of samples (about 25 s): levels 0.02 and
    0.05 at cuts 0, 4 and 8, each pattern with its test-split disagreement (schema 7). Its levels
    bound the top-1 disagreement with the float model, which is what a live audit measures."""
    from qpart.models.data import Split
    from qpart.models.registry import get_model
    from qpart.models.sources import export_image_folder
    from qpart.offline.job import calibrate
    from qpart.offline.settings import CalibrationSettings

    data = tmp_path_factory.mktemp("agreement-data")
    export_image_folder(Split.CALIBRATION, data / "cal", limit=900, flat=True)
    export_image_folder(Split.TEST, data / "test", limit=1000, flat=True)
    settings = CalibrationSettings(
        metric="top1-agreement", data=str(data / "cal"), test_data=str(data / "test"), levels=(0.02, 0.05),
        fit_samples=300, check_samples=600, noise_samples=100, mapping_points=5, cuts=(0, 4, 8),
        batch_size=300, confidence=0.9, ladder=(-16, -8, -4, -2, 0, 2), image_qualities=())
    root = tmp_path_factory.mktemp("agreement-artifacts")
    calibrate(get_model("fmnist-cnn"), settings, root / "fmnist-cnn")
    return root


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LiveServer:
    """``qpart serve`` in a subprocess on a loopback port."""

    def __init__(self, artifacts: Path, env: dict[str, str] | None = None, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        full_env = {**os.environ, "QPART_PORT": str(self.port), "QPART_HOST": "127.0.0.1", **(env or {})}
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 (closed in stop); a file never blocks the server
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "qpart", "serve", "--artifacts", str(artifacts)],
            env=full_env, stdout=self.log, stderr=subprocess.STDOUT)

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited early: {self.output()[-2000:]}")
            try:
                if httpx.get(f"{self.url}/v2/health/ready", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        out = self.stop(signal.SIGKILL)  # never leave it running behind a failed fixture
        raise TimeoutError(f"server did not become ready in {timeout:.0f} s: {out[-2000:]}")

    def stop(self, sig: int | None = None, timeout: float = 30) -> str:
        if self.log.closed:  # stopped already (a failed wait_ready stops it)
            return ""
        if self.proc.poll() is None:
            if sig is None:
                self.proc.terminate()
            else:
                self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        out = self.output()
        self.log.close()
        return out


@pytest.fixture(scope="module")
def server(cnn_only: Path) -> Iterator[LiveServer]:
    """A live ``qpart serve`` on the fmnist-cnn artifact, shared by a test module."""
    live = LiveServer(cnn_only)
    live.wait_ready()
    yield live
    live.stop()


@pytest.fixture
def live_server_factory() -> Iterator[type[LiveServer]]:
    started: list[LiveServer] = []

    class Factory(LiveServer):
        def __init__(self, artifacts: Path, env: dict[str, str] | None = None) -> None:
            super().__init__(artifacts, env)
            started.append(self)

    yield Factory
    for server in started:
        server.stop()


def tail_request(url: str, batch: int = 1, model: str = "fmnist-cnn") -> tuple[str, bytes]:
    """A planned tail request against a live server: its infer URL and a random activation packet."""
    from qpart.client.plans import PlanResponse
    from qpart.client.runtime import encode_for_plan

    answer = httpx.post(f"{url}/v1/plan", json={"model": model, "accuracy_demand": 0.01, "rate_bps": 1e6},
                        timeout=30)
    assert answer.status_code == 200, answer.text
    plan = answer.json()
    assert plan["infer_url"], plan  # a plan with a tail to run
    activation = np.random.default_rng(batch).random((batch, *plan["activation_shape"]), np.float32)
    return plan["infer_url"], encode_for_plan(activation, PlanResponse.model_validate(plan))


@dataclass(frozen=True)
class Outcome:
    """One request of a :class:`TailLoad`: when it was sent and answered (monotonic seconds)."""

    sent_at: float
    done_at: float
    status: int | None  # None: no HTTP answer (the error says why)
    error: str = ""


class TailLoad:
    """Clients POSTing a tail request back to back until stopped; a client stops at its first
    transport error (after shutdown nothing listens any more)."""

    def __init__(self, url: str, infer_url: str, packet: bytes, clients: int) -> None:
        self.outcomes: list[Outcome] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._client, args=(url, infer_url, packet), daemon=True)
                         for _ in range(clients)]
        for thread in self._threads:
            thread.start()

    def _client(self, url: str, infer_url: str, packet: bytes) -> None:
        with httpx.Client(base_url=url, timeout=30) as client:
            while not self._stop.is_set():
                sent = time.monotonic()
                try:
                    status = client.post(infer_url, content=packet).status_code
                except httpx.TransportError as exc:
                    self.outcomes.append(Outcome(sent, time.monotonic(), None, repr(exc)))
                    return
                self.outcomes.append(Outcome(sent, time.monotonic(), status))

    def statuses(self) -> list[int]:
        """HTTP statuses received so far."""
        return [o.status for o in list(self.outcomes) if o.status is not None]

    def stop(self, timeout: float = 30) -> None:
        """Let every client finish its request in flight, then end."""
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout)


class LivePrometheus:
    """A real ``prometheus`` (Debian package) scraping one target every second, on loopback."""

    def __init__(self, folder: Path, target_port: int, job: str = "qpart", rules: Path | None = None) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            pytest.fail("prometheus not installed (Debian package 'prometheus'); .ci/run installs it")
        self.url = f"http://127.0.0.1:{free_port()}"
        config = folder / "prometheus.yml"
        rule_files = "" if rules is None else f"rule_files:\n  - {rules}\n"
        config.write_text(f"global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n{rule_files}"
                          f"scrape_configs:\n  - job_name: {job}\n    static_configs:\n"
                          f"      - targets: ['127.0.0.1:{target_port}']\n")
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={folder / 'data'}",
             f"--web.listen-address={self.url.removeprefix('http://')}"],
            stdout=self.log, stderr=subprocess.STDOUT)

    def query(self, expr: str) -> dict:
        """``/api/v1/query`` at now: the whole answer (status, data or error)."""
        answer: dict = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=5).json()
        return answer

    def wait_for(self, expr: str, timeout: float = 60) -> list[dict]:
        """Polls until ``expr`` returns a non-empty vector; its result."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            time.sleep(1)
            try:
                result: list[dict] = self.query(expr).get("data", {}).get("result", [])
            except httpx.TransportError:
                continue
            if result:
                return result
        self.log.seek(0)
        raise TimeoutError(f"{expr} stayed empty; prometheus said: {self.log.read()[-2000:]!r}")

    def alerts(self) -> list[dict]:
        """``/api/v1/alerts``: every pending or firing alert now."""
        found: list[dict] = httpx.get(f"{self.url}/api/v1/alerts", timeout=5).json()["data"]["alerts"]
        return found

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(20)
        self.log.close()
