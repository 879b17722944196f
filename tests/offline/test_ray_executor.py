"""The validation stage as Ray tasks: on a real local Ray cluster (``ray start``, a head and a
worker node) it writes the artifact the local executor writes, byte for byte; a cluster that goes
away mid-job ends it with one clear error, and the job resumes from its checkpoints."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from qpart.models.registry import get_model
from qpart.offline.checkpoint import CHECKPOINT_DIR
from qpart.offline.errors import ExecutorError
from qpart.offline.job import calibrate
from qpart.offline.ray_executor import ray_executor
from tests.conftest import free_port
from tests.offline.resume_driver import settings
from tests.offline.test_checkpoint import run_driver

pytestmark = [pytest.mark.slow, pytest.mark.integration]

RAY = Path(sys.executable).with_name("ray")


class Cluster:
    """``ray start``: a head node and one worker node on this machine, one CPU each."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_TMPDIR": str(root)}
        self.start("--head", f"--port={self.port}", "--include-dashboard=false", f"--temp-dir={root}")
        self.start(f"--address={self.address}")

    def start(self, *args: str) -> None:
        done = subprocess.run([str(RAY), "start", "--num-cpus=1", *args], env=self.env, capture_output=True,
                              text=True, timeout=180, check=False)
        assert done.returncode == 0, done.stdout + done.stderr

    def stop(self) -> None:
        subprocess.run([str(RAY), "stop", "--force"], env=self.env, capture_output=True, timeout=120,
                       check=False)

    def freeze(self) -> None:
        """SIGSTOP every process of the cluster at once: its daemons (their command lines name its
        folder) and their descendants (the workers, which rename themselves), so that no task can
        finish and hand its result to a driver."""
        parents: dict[int, int] = {}
        ours: set[int] = set()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                fields = _stat(entry)
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            pid = int(entry.name)
            parents[pid] = int(fields[1])
            if str(self.root).encode() in cmdline:
                ours.add(pid)
        grown = True
        while grown:
            more = {pid for pid, parent in parents.items() if parent in ours} - ours
            ours |= more
            grown = bool(more)
        for pid in ours:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)


@pytest.fixture(scope="module", autouse=True)
def own_home(tmp_path_factory):
    """A HOME of the module's own: Ray keeps an auth token in ~/.ray, and a node started beside
    another session's token refuses to join its head."""
    saved = os.environ.get("HOME")
    os.environ["HOME"] = str(tmp_path_factory.mktemp("home"))
    yield
    if saved is None:
        os.environ.pop("HOME", None)
    else:
        os.environ["HOME"] = saved


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    pytest.importorskip("ray")
    found = Cluster(Path(tempfile_root()))
    yield found
    found.stop()


def tempfile_root(name: str = "") -> str:
    """A short folder for Ray's sockets (their paths must stay under 107 bytes)."""
    root = Path("/tmp") / f"qr{os.getpid()}{name}"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir()
    return str(root)


@pytest.fixture(scope="module")
def local_artifact(tmp_path_factory) -> bytes:
    out = tmp_path_factory.mktemp("local")
    done = run_driver(out, 2)
    assert done.returncode == 0, done.stderr
    return (out / "artifact.json").read_bytes()


def test_the_ray_executor_writes_the_local_executors_artifact(cluster, local_artifact, tmp_path, monkeypatch):
    monkeypatch.setenv("QPART_TEST_RAY_ADDRESS", cluster.address)
    done = run_driver(tmp_path / "out", 2)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out" / "artifact.json").read_bytes() == local_artifact


def test_a_cluster_that_goes_away_mid_job_is_one_error_and_the_job_resumes(
        local_artifact, tmp_path, monkeypatch):
    pytest.importorskip("ray")
    doomed = Cluster(Path(tempfile_root("d")))
    out = tmp_path / "out"
    env = {**os.environ, "QPART_TEST_RAY_ADDRESS": doomed.address,
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2]), os.environ.get("PYTHONPATH", "")])}
    # The job stops itself (SIGSTOP) once the first cut came back from the cluster; the cluster is
    # frozen, then killed, and only then is the job continued. Stopping the cluster while the job
    # ran was a race: on a fast host the other cuts finished, and reached the job, before
    # `ray stop` did (the job then wrote its artifact).
    job = subprocess.Popen([sys.executable, str(Path(__file__).with_name("resume_driver.py")), str(out), "2",
                            "stop:validate@1"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    try:
        deadline = time.monotonic() + 300
        while not _stopped(job.pid) and job.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _stopped(job.pid), "the job did not reach its first validated cut"
        doomed.freeze()
        doomed.stop()
        os.kill(job.pid, signal.SIGCONT)
        _, stderr = job.communicate(timeout=300)
    finally:
        job.kill()
        doomed.stop()
    assert job.returncode == 1, stderr[-3000:]
    assert "ExecutorError: the Ray cluster at" in stderr and "run the same command again to resume" in stderr
    assert not (out / "artifact.json").exists()
    assert list((out / CHECKPOINT_DIR).glob("cut-*.json"))
    monkeypatch.delenv("QPART_TEST_RAY_ADDRESS", raising=False)
    done = run_driver(out, 2)  # resumed on the local executor: the executor is not an input
    assert done.returncode == 0, done.stderr
    assert (out / "artifact.json").read_bytes() == local_artifact


def _stat(proc: Path) -> list[str]:
    """The fields of ``/proc/<pid>/stat`` after the command name: state, parent pid, ..."""
    return (proc / "stat").read_text().rpartition(")")[2].split()


def _stopped(pid: int) -> bool:
    """Whether the process is stopped (state T in /proc)."""
    try:
        return _stat(Path(f"/proc/{pid}"))[0] == "T"
    except OSError:
        return False


def test_without_ray_installed_the_executor_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    with pytest.raises(ExecutorError, match=r"pip install 'qpart-serving\[ray\]'"):
        calibrate(get_model("fmnist-cnn"), settings(2), tmp_path / "out", executor=ray_executor(None))


def test_without_ray_the_executor_is_refused_before_the_job_starts(monkeypatch):
    """Not at the validation stage, minutes of tables and mapping later (review of issue 26)."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "ray" else real(name, *a))
    with pytest.raises(ExecutorError, match=r"--executor ray needs Ray: pip install 'qpart-serving\[ray\]'"):
        ray_executor(None)


def test_the_gcs_check_tells_a_gone_cluster_from_a_slow_one(monkeypatch):
    """Refused: gone at once. Listening (even if it never answers): there. Timing out: gone only
    after the grace period."""
    import socket

    from qpart.offline import ray_executor as rx

    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        host, port = listening.getsockname()
        assert rx._check_gcs(f"{host}:{port}", None) is None  # a stopped GCS still accepts
    with pytest.raises(ConnectionError, match="nothing listens"):
        rx._check_gcs(f"{host}:{port}", None)  # closed: refused

    def times_out(*args, **kwargs):
        raise TimeoutError("timed out")

    monkeypatch.setattr(rx.socket, "create_connection", times_out)
    since = rx._check_gcs("10.0.0.1:6379", None)
    assert since is not None and rx._check_gcs("10.0.0.1:6379", since) == since
    with pytest.raises(ConnectionError, match="unreachable"):
        rx._check_gcs("10.0.0.1:6379", since - rx._UNREACHABLE_S - 1)
