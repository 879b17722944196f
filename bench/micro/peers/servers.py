"""How ``bench.micro.peer`` starts each server, which payloads each speaks, and how it reads the
batch sizes each formed.

Every server gets the same graph (:mod:`bench.micro.peers.graph`), one torch thread, batches of at
most 32, and the server core (``bench.harness.loadgen.start_server`` pins it; the processes it
starts inherit the pinning). Ports are fixed, on 127.0.0.1 inside the benchmark's namespace.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeAlias

import httpx

from bench import REPO
from bench.harness.loadgen import Server, start_server
from bench.micro.peers.venvs import KSERVE, LITSERVE, TRITON
from qpart.models import get_model

Payload: TypeAlias = Literal["json", "binary"]
ServerName: TypeAlias = Literal["qpart", "kserve", "triton", "pytriton", "litserve"]

SERVERS: tuple[ServerName, ...] = ("qpart", "triton", "pytriton", "kserve", "litserve")
PORTS: dict[ServerName, int] = {"qpart": 18310, "kserve": 18311, "triton": 18320, "pytriton": 18330,
                                "litserve": 18340}
SPEAKS: dict[ServerName, tuple[Payload, ...]] = {
    "qpart": ("json", "binary"), "kserve": ("json", "binary"), "triton": ("json", "binary"),
    "pytriton": ("json", "binary"), "litserve": ("json",)}  # LitServe decodes JSON or form bodies
MAX_BATCH = 32


@dataclass(frozen=True)
class Started:
    """A running server and where its batches can be counted (None: it reports none)."""

    server: Server
    stats_url: str | None


def _triton_site() -> Path:
    found = sorted((TRITON.path / "lib").glob("python3*/site-packages/pytriton"))
    if not found:
        raise SystemExit(f"no pytriton in {TRITON.path}: run bench.micro.peer outside a namespace once")
    return found[0].parent


def triton_config(model: str, input_shape: tuple[int, ...], weights: Path) -> str:
    """``config.pbtxt`` of ``model`` for Triton's Python backend: batches of up to 32 formed by its
    dynamic batcher, one CPU instance, and the parameters ``triton_model.py`` builds the graph from."""
    params = {"repo": str(REPO), "model": model, "weights": str(weights)}
    parameters = "\n".join(f'parameters {{ key: "{k}" value {{ string_value: "{v}" }} }}'
                           for k, v in params.items())
    dims = ", ".join(map(str, input_shape))
    return (f'name: "{model}"\nbackend: "python"\nmax_batch_size: {MAX_BATCH}\n'
            f'input [ {{ name: "input" data_type: TYPE_FP32 dims: [ {dims} ] }} ]\n'
            'output [ { name: "logits" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
            'instance_group [ { kind: KIND_CPU count: 1 } ]\n'
            f"dynamic_batching {{ }}\n{parameters}\n")


def triton_repository(root: Path, model: str, weights: Path) -> tuple[Path, Path]:
    """A model repository for Triton's Python backend (``config.pbtxt`` and ``1/model.py``) and a
    backend folder with the backend, its utilities and the stub of the venv's Python, under ``root``;
    (repository, backends)."""
    site = _triton_site()
    triton = site / "pytriton" / "tritonserver"
    backends = root / "backends"
    python = backends / "python"
    python.mkdir(parents=True)
    for name in ("libtriton_python.so", "triton_python_backend_utils.py"):
        shutil.copy2(triton / "backends" / "python" / name, python / name)
    shutil.copy2(triton / "python_backend_stubs" / TRITON.minor() / "triton_python_backend_stub",
                 python / "triton_python_backend_stub")
    repo = root / "models"
    (repo / model / "1").mkdir(parents=True)
    shutil.copy2(REPO / "bench" / "micro" / "peers" / "triton_model.py", repo / model / "1" / "model.py")
    (repo / model / "config.pbtxt").write_text(triton_config(model, get_model(model).input_shape, weights))
    return repo, backends


def start(name: ServerName, model: str, logs: Path) -> Started:
    """Start ``name`` serving ``model``'s committed weights; SystemExit with its log when it fails."""
    port = PORTS[name]
    weights = REPO / "artifacts" / model / "weights.safetensors"
    stats: str | None = f"http://127.0.0.1:{port}/v2/models/{model}/stats"
    ready = f"/v2/models/{model}/ready"
    env: dict[str, str] = {"PYTHONPATH": str(REPO)}
    if name == "qpart":
        # Only this model's artifact folder: the server loads nothing else.
        cmd = [sys.executable, "-m", "qpart", "serve", "--artifacts", str(weights.parent)]
        env = {"QPART_HOST": "127.0.0.1", "QPART_PORT": str(port), "QPART_TORCH_THREADS": "1"}
        stats = f"http://127.0.0.1:{port}/metrics"
    elif name == "kserve":
        cmd = [str(KSERVE.python), "-m", "bench.micro.kserve_model", "--name", model, "--port", str(port),
               "--weights", str(weights)]
        stats = None
    elif name == "triton":
        repo, backends = triton_repository(logs / "triton", model, weights)
        site = _triton_site()
        cmd = [str(site / "pytriton" / "tritonserver" / "bin" / "tritonserver"), "--model-repository",
               str(repo), "--backend-directory", str(backends), "--http-address", "127.0.0.1",
               "--http-port", str(port), "--allow-grpc", "false", "--allow-metrics", "false",
               "--allow-gpu-metrics", "false", "--disable-auto-complete-config",
               "--pinned-memory-pool-byte-size", "0"]
        # the stub needs the venv's own libpython and the wheel's bundled libraries, and finds its
        # packages through the python first on PATH
        env["LD_LIBRARY_PATH"] = f"{TRITON.libdir()}:{site / 'nvidia_pytriton.libs'}"
        env["PATH"] = f"{TRITON.path / 'bin'}:{os.environ.get('PATH', '')}"
    elif name == "pytriton":
        cmd = [str(TRITON.python), "-m", "bench.micro.peers.pytriton_serve", "--name", model, "--port",
               str(port), "--weights", str(weights)]
        env["LD_LIBRARY_PATH"] = TRITON.libdir()  # PyTriton appends its own libraries to it
        stats = f"http://127.0.0.1:{port + 2}/metrics"  # PyTriton's HTTP port refuses the stats route
    else:
        cmd = [str(LITSERVE.python), "-m", "bench.micro.peers.litserve_model", "--name", model, "--port",
               str(port), "--weights", str(weights)]
        ready, stats = "/health", None
    log = logs / f"{name}.log"
    try:
        return Started(start_server(cmd, f"http://127.0.0.1:{port}", ready, env, log=log), stats)
    except RuntimeError as exc:
        lines = log.read_text(errors="replace").splitlines()
        errors = [line for line in lines if re.match(r"E\d{4} |Traceback|\w*Error", line)][:10]
        tail = "\n".join([*errors, "...", *lines[-15:]])
        raise SystemExit(f"{exc}\n--- {log} ---\n{tail}") from exc


def server_versions(started: dict[ServerName, Started]) -> dict[str, str]:
    """The Triton servers' own versions (``GET /v2``), beside the wheels' versions the caller has."""
    out = {}
    for name, running in started.items():
        if name not in ("triton", "pytriton"):
            continue
        meta = httpx.get(f"{running.server.url}/v2", timeout=10)
        out[f"{name}-server"] = str(meta.json().get("version")) if meta.status_code == 200 else "?"
    return out


def batch_counts(name: ServerName, url: str | None, model: str) -> tuple[float, float] | None:
    """(requests, batches) the server has run so far, from its statistics (Triton's
    ``/v2/models/{m}/stats``, qpart's ``qpart_tail_batch_size`` histogram); None where it reports none."""
    if url is None:
        return None
    response = httpx.get(url, timeout=10)
    response.raise_for_status()
    if name == "qpart":
        sums = _metrics(response.text, r"qpart_tail_batch_size_(sum|count)", model)
        return sums.get("sum", 0.0), sums.get("count", 0.0)
    if name == "pytriton":
        counts = _metrics(response.text, r"nv_inference_(count|exec_count)", model)
        return counts.get("count", 0.0), counts.get("exec_count", 0.0)
    entry = response.json()["model_stats"][0]
    return float(entry["inference_count"]), float(entry["execution_count"])


def _metrics(text: str, name: str, model: str) -> dict[str, float]:
    """Prometheus samples whose name matches ``name`` (one group: the key) for ``model``, summed."""
    out: dict[str, float] = {}
    pattern = rf'^{name}\{{[^}}]*model="{re.escape(model)}"[^}}]*\}} ([0-9.e+]+)$'
    for key, value in re.findall(pattern, text, re.MULTILINE):
        out[key] = out.get(key, 0.0) + float(value)
    return out
