"""Benchmarks and baselines: they report numbers and never gate CI on time."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent


def provenance() -> dict[str, Any]:
    """The commit the benchmark ran at, whether tracked files differed from it, and when: a result
    file then says which code produced it (``commit`` is None outside a git checkout)."""
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10,
                                  check=True)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip()

    commit = git("rev-parse", "HEAD")
    changed = git("status", "--porcelain", "--untracked-files=no") if commit else None
    return {"commit": commit, "tracked_files_changed": bool(changed) if changed is not None else None,
            "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


AT_START = provenance()
"""The provenance when this package was first imported: when the benchmark's process started. A
run whose tracked files changed while it ran (a commit, an edit) records both, and they differ."""

PROC_STAT = Path("/proc/stat")
STEAL_FIELD = 7  # /proc/stat "cpu" line: user nice system idle iowait irq softirq steal ...


def cpu_ticks(stat: Path = PROC_STAT) -> tuple[int, int] | None:
    """(steal, total) ticks of all CPUs since boot; None without a readable ``/proc/stat``.

    Steal is time a virtual machine's CPUs were ready to run but the hypervisor ran something else:
    on a shared host it is the part of the noise the benchmarks can see (a grid at 6ff9c20 ran at
    12-14% steal, read by hand with ``vmstat``, against 0-1% with the machine idle). The counts
    cover every CPU, so a benchmark's reading includes its load generator's core; a container
    whose ``/proc/stat`` is virtualised may read 0 rather than unknown."""
    try:
        first = stat.read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    if not first or first[0] != "cpu" or len(first) <= STEAL_FIELD + 1:
        return None
    ticks = [int(f) for f in first[1:]]
    return ticks[STEAL_FIELD], sum(ticks[:STEAL_FIELD + 1])  # guest time is already in user


def steal_fraction(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """The share of CPU time stolen between two :func:`cpu_ticks` readings (None: unknown)."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1])


def write_json(path: Path, doc: dict[str, Any], indent: int = 1) -> None:
    """Write a benchmark's JSON document (creating its folder), with its :func:`provenance` now and
    as it was when the run started (:data:`AT_START`, under ``at_start``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    now = {**provenance(), "at_start": AT_START}
    path.write_text(json.dumps({**doc, "provenance": now}, indent=indent) + "\n")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(port: int, artifacts: Path = REPO / "artifacts", ready_s: float = 180,
                 command: tuple[str, ...] = ("qpart", "serve"),
                 env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """``qpart serve`` (or ``python -m`` another ``command`` taking ``--artifacts``) of ``artifacts``
    on 127.0.0.1:``port``, with ``env`` added, once ``/v2/health/ready`` answers 200 (killed, and
    RuntimeError, if it does not within ``ready_s``)."""
    env = {**os.environ, "QPART_PORT": str(port), "QPART_HOST": "127.0.0.1", **(env or {})}
    proc = subprocess.Popen([sys.executable, "-m", *command, "--artifacts", str(artifacts)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + ready_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v2/health/ready", timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"{' '.join(command)} did not become ready")
