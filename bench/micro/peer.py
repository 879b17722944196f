"""The whole float model served by KServe's Python model server and by ``qpart serve``, side by side.

``python -m bench.micro.peer --json PATH [--seconds S] [--rounds R] [--model fmnist-cnn]`` (as root)

The peer is KServe (PyPI ``kserve``, pinned below) in its own virtualenv ``.venv-kserve``, created
on first use with torch pinned first (the CPU build on local disk; an unpinned torch resolves to
CUDA). kserve is never a dependency of the project. It serves ``bench/micro/kserve_model.py``: the same
weights, the same batch-norm-folded graph, channels-last, one torch thread as qpart's
``/v2/models/{m}/infer``; before any timing, both servers must give the same top-1 on real test
images, as JSON and as binary tensors.

Everything runs in a private network namespace: the command re-executes itself under
``unshare -n``, brings ``lo`` up, and starts both servers (pinned to core 0; qpart with its default
settings and one torch thread) and the load generator (wrk, pinned to core 1; each client is its
own keep-alive connection) inside, all on 127.0.0.1. For each payload and client count (1, 8, 32)
the two servers are measured back to back, ``S`` seconds each, with a batch-1 Open Inference
Protocol v2 infer request of one test image:

- ``json``: the tensor as a JSON list of 784 floats, JSON logits back;
- ``binary``: the binary tensor extension, a JSON header then the raw little-endian bytes
  (``Inference-Header-Content-Length``), with ``binary_data_output`` asking for binary logits.

Reported per run: throughput, p50/p99 latency, errors (non-2xx and socket errors), the server's
CPU share of one core and its CPU seconds per request, the share of the server's core busy with
anything else (kernel loopback work, other processes, steal: a disturbed run shows here) and wrk's
own CPU share; and the qpart/kserve throughput ratio at 32 clients for each payload.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Literal, TypeAlias

import httpx
import numpy as np
import numpy.typing as npt
import torch

from bench import REPO, write_json
from bench.harness.loadgen import (
    PRIVATE_NETWORK_FLAG,
    SERVER_CORE,
    Server,
    core_busy_seconds,
    enter_private_network,
    require_wrk,
    start_server,
    wrk,
)
from qpart.models import METRICS, hits_of

KSERVE_VENV = REPO / ".venv-kserve"
KSERVE_PYTHON = KSERVE_VENV / "bin" / "python"
TORCH_PIN = "torch==2.13.0"
KSERVE_PIN = "kserve==0.21.0"
KSERVE_EXTRA = ("safetensors>=0.4",)  # what models.registry needs besides torch and numpy

Payload: TypeAlias = Literal["json", "binary"]
ServerName: TypeAlias = Literal["qpart", "kserve"]
Body: TypeAlias = tuple[bytes, str, dict[str, str]]  # body, content type, extra headers

CLIENTS = (1, 8, 32)
PAYLOADS: tuple[Payload, ...] = ("json", "binary")
SERVERS: tuple[ServerName, ...] = ("qpart", "kserve")
PORTS: dict[ServerName, int] = {"qpart": 18310, "kserve": 18311}
VERIFY_IMAGES = 16
BINARY = "application/octet-stream"
HEADER = "Inference-Header-Content-Length"


def _pip(*args: str) -> None:
    subprocess.run([str(KSERVE_VENV / "bin" / "pip"), "install", "-q", *args], check=True)


def _installed(package: str) -> str | None:
    """The version of ``package`` in the KServe venv, or None."""
    out = subprocess.run([str(KSERVE_PYTHON), "-c", f"from importlib.metadata import version; "
                          f"print(version('{package}'))"], capture_output=True, text=True, check=False)
    return out.stdout.strip() if out.returncode == 0 else None


def ensure_kserve_venv() -> str:
    """Create or complete ``.venv-kserve`` (torch first, then kserve); the kserve version."""
    if not KSERVE_PYTHON.exists():
        print(f"creating {KSERVE_VENV}", file=sys.stderr)
        subprocess.run(["python3", "-m", "venv", str(KSERVE_VENV)], check=True)
    if _installed("torch") is None:
        _pip(TORCH_PIN)
    if _installed("kserve") != KSERVE_PIN.split("==")[1]:
        # The torch already installed satisfies kserve's requirement, so pip leaves it alone.
        _pip(KSERVE_PIN, *KSERVE_EXTRA)
    torch_version = _installed("torch") or ""
    if not torch_version.startswith(TORCH_PIN.split("==")[1]):
        raise SystemExit(f"{KSERVE_VENV} holds torch {torch_version}, not {TORCH_PIN}: remove the folder")
    return _installed("kserve") or "unknown"


def infer_bodies(image: npt.NDArray[np.float32]) -> dict[Payload, Body]:
    """A batch-1 v2 infer request of ``image`` ``[1, C, H, W]``, as JSON and as binary tensors."""
    tensor = {"name": "input", "shape": list(image.shape), "datatype": "FP32"}
    as_json = json.dumps({"inputs": [{**tensor, "data": image.reshape(-1).tolist()}]}).encode()
    raw = np.ascontiguousarray(image, dtype="<f4").tobytes()
    head = json.dumps({"inputs": [{**tensor, "parameters": {"binary_data_size": len(raw)}}],
                       "parameters": {"binary_data_output": True}}).encode()
    return {"json": (as_json, "application/json", {}),
            "binary": (head + raw, BINARY, {HEADER: str(len(head))})}


def decode_logits(response: httpx.Response) -> npt.NDArray[np.float32]:
    """The ``logits`` of a v2 infer response, JSON or binary."""
    response.raise_for_status()
    split = response.headers.get(HEADER)
    body = response.content
    doc = json.loads(body[: int(split)] if split is not None else body)
    out = next(o for o in doc["outputs"] if o["name"] == "logits")
    if split is None:
        return np.asarray(out["data"], dtype=np.float32).reshape(out["shape"])
    return np.frombuffer(body[int(split):], dtype="<f4").reshape(out["shape"])


def verify_same_model(urls: dict[ServerName, str], n: int = VERIFY_IMAGES) -> dict[str, Any]:
    """Both servers, both payloads, ``n`` test images: the same top-1 everywhere, or SystemExit."""
    from qpart.models.data import Split, load_split

    data = load_split(Split.TEST, limit=n)
    diff = 0.0
    correct = 0
    with httpx.Client(timeout=30) as client:
        for image, label in zip(data.images, data.labels, strict=True):
            logits: dict[tuple[ServerName, Payload], npt.NDArray[np.float32]] = {}
            for payload, (body, content_type, headers) in infer_bodies(image[None]).items():
                for server in SERVERS:
                    r = client.post(urls[server], content=body,
                                    headers={"content-type": content_type, **headers})
                    logits[(server, payload)] = decode_logits(r)
            top1 = {k: int(v.argmax()) for k, v in logits.items()}
            if len(set(top1.values())) != 1:
                raise SystemExit(f"the servers disagree on a test image (label {label}): {top1}")
            ours = torch.from_numpy(logits[("qpart", "json")]).reshape(1, -1)
            correct += int(hits_of(METRICS["top1-drop"], ours, np.array([label]))[0])
            diff = max(diff, *(float(np.abs(logits[("qpart", p)] - logits[("kserve", p)]).max())
                               for p in PAYLOADS))
    return {"test_images": n, "top1_agree": True, "top1_correct": correct, "max_abs_logit_diff": diff}


def _start(name: ServerName, model: str, logs: Path) -> Server:
    port = PORTS[name]
    weights = REPO / "artifacts" / model / "weights.safetensors"
    if name == "qpart":
        # Only this model's artifact folder: the server loads nothing else.
        cmd = [sys.executable, "-m", "qpart", "serve", "--artifacts", str(weights.parent)]
        env = {"QPART_HOST": "127.0.0.1", "QPART_PORT": str(port), "QPART_TORCH_THREADS": "1"}
    else:
        cmd = [str(KSERVE_PYTHON), "-m", "bench.micro.kserve_model", "--name", model, "--port", str(port),
               "--weights", str(weights)]
        env = {"PYTHONPATH": str(REPO)}
    log = logs / f"{name}.log"
    try:
        return start_server(cmd, f"http://127.0.0.1:{port}", f"/v2/models/{model}/ready", env, log=log)
    except RuntimeError as exc:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
        raise SystemExit(f"{exc}\n--- {log} ---\n{tail}") from exc


def _measured(server: Server, url: str, body: Body, clients: int, seconds: int) -> dict[str, Any]:
    content, content_type, headers = body
    cpu0, core0, t0 = server.cpu_seconds(), core_busy_seconds(SERVER_CORE), time.perf_counter()
    result = wrk(url, content, content_type, clients, seconds, headers=headers)
    wall = time.perf_counter() - t0
    cpu = server.cpu_seconds() - cpu0
    result["server_cpu_share"] = cpu / wall
    result["server_cpu_s_per_request"] = cpu / max(1, result["requests"])
    # Busy time of the server's core that is not the server: loopback kernel work, other processes,
    # steal. Large values mean the run was disturbed (the machine is shared).
    result["server_core_other_share"] = (core_busy_seconds(SERVER_CORE) - core0) / wall - cpu / wall
    return result


def run(model: str, seconds: int, kserve_version: str, rounds: int = 3) -> dict[str, Any]:
    """Start both servers, verify them, measure every payload and client count; the JSON document."""
    from qpart.models.data import Split, load_split

    require_wrk()
    bodies = infer_bodies(load_split(Split.TEST, limit=1).images)
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="qpart-peer-") as tmp:
        servers: dict[ServerName, Server] = {}
        try:
            for name in SERVERS:
                servers[name] = _start(name, model, Path(tmp))
            urls = {name: f"{s.url}/v2/models/{model}/infer" for name, s in servers.items()}
            verification = verify_same_model(urls)
            for name in SERVERS:  # warm-up: allocator, first batches, lazy imports
                for content, content_type, headers in bodies.values():
                    wrk(urls[name], content, content_type, 4, 1, headers=headers)
            for rnd in range(rounds):
                for payload in PAYLOADS:
                    for clients in CLIENTS:
                        for name in SERVERS:  # back to back, so the shared machine's drift hits both
                            r = _measured(servers[name], urls[name], bodies[payload], clients, seconds)
                            runs.append({"server": name, "payload": payload, "round": rnd, **r})
                            print(_row(runs[-1]), file=sys.stderr)
        finally:
            for s in servers.values():
                s.stop()
    per_round = {p: [_pick(runs, "qpart", p, 32, r)["throughput_rps"]
                     / _pick(runs, "kserve", p, 32, r)["throughput_rps"] for r in range(rounds)]
                 for p in PAYLOADS}
    ratio = {p: statistics.median(v) for p, v in per_round.items()}
    return {"kserve_version": kserve_version, "model": model, "runs": runs, "ratio_at_32": ratio,
            "ratio_at_32_per_round": per_round, "rounds": rounds,
            "verification": verification, "seconds_per_run": seconds, "batch": 1,
            "setup": "private network namespace (unshare -n), all on 127.0.0.1; both servers pinned to core "
                     "0 with 1 torch thread, one uvicorn worker each, wrk pinned to core 1; qpart with its "
                     "default settings (dynamic batching up to 32, access log off); KServe REST only (gRPC "
                     "off), per-request log lines off; each pair measured back to back"}


def _pick(runs: list[dict[str, Any]], server: ServerName, payload: Payload, clients: int,
          rnd: int) -> dict[str, Any]:
    return next(r for r in runs
                if (r["server"], r["payload"], r["clients"], r["round"]) == (server, payload, clients, rnd))


def _row(r: dict[str, Any]) -> str:
    return (f"{r['server']:<7} {r['payload']:<7} {r['clients']:>7} {r['throughput_rps']:8.1f} "
            f"{r['p50_s'] * 1e3:8.2f} {r['p99_s'] * 1e3:8.2f} {r['server_cpu_share']:8.0%} "
            f"{r['server_cpu_s_per_request'] * 1e3:11.2f} {r['server_core_other_share']:10.0%} "
            f"{r['generator_cpu_share']:8.0%} {r['errors']:>6}")


def print_table(doc: dict[str, Any]) -> None:
    """The runs as a table, then the ratios."""
    print(f"{doc['model']}, kserve {doc['kserve_version']}, {doc['seconds_per_run']} s per run; "
          f"verification: {doc['verification']}")
    print(f"{'server':<7} {'payload':<7} {'clients':>7} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} "
          f"{'srv CPU':>8} {'srv ms/req':>11} {'core other':>10} {'wrk CPU':>8} {'errors':>6}")
    for r in doc["runs"]:
        print(_row(r))
    for payload, ratio in doc["ratio_at_32"].items():
        rounds = ", ".join(f"{r:.2f}" for r in doc["ratio_at_32_per_round"][payload])
        print(f"qpart/kserve throughput at 32 clients, {payload}: {ratio:.2f}x (rounds: {rounds})")
    errors = sum(r["errors"] for r in doc["runs"])
    if errors:
        print(f"WARNING: {errors} failed requests (see 'errors' per run)")


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point."""
    args_in = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m bench.micro.peer", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, required=True, help="write the results here")
    parser.add_argument("--seconds", type=int, default=5, help="duration of each load run (default 5)")
    parser.add_argument("--rounds", type=int, default=3, help="repetitions of the grid; the ratio is "
                        "the median of the per-round ratios (default 3)")
    parser.add_argument("--model", default="fmnist-cnn", choices=("fmnist-cnn", "fmnist-resnet"),
                        help="model to serve on both (default fmnist-cnn)")
    args = parser.parse_args(args_in)
    if os.environ.get(PRIVATE_NETWORK_FLAG) != "1":
        ensure_kserve_venv()  # needs the package index: before the namespace cuts the network
    enter_private_network("bench.micro.peer", args_in)
    kserve_version = _installed("kserve")
    if kserve_version is None:
        raise SystemExit(f"kserve is not installed in {KSERVE_VENV}: run bench.micro.peer outside a "
                         f"namespace once to create it")
    doc = run(args.model, args.seconds, kserve_version, args.rounds)
    print_table(doc)
    write_json(args.json, doc, indent=2)


if __name__ == "__main__":
    main()
