"""The load generator shared by the serving benchmarks: wrk, pinned to its own core.

wrk (Debian package ``wrk``) is a C event loop: ``-c N`` opens N independent keep-alive
connections (one per simulated client), each sending its next request when the previous answer
arrives. It costs a few microseconds of CPU per request where an asyncio Python client costs about
a millisecond, so on a 2-core machine it measures the server rather than itself; its own CPU
share is reported beside every run anyway (a generator near 100% would be measuring itself).

Servers under test run pinned to core 0 (:func:`start_server`), the generator to core 1.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

BENCH = Path(__file__).resolve().parent
WRK_SCRIPT = BENCH / "wrk_post.lua"
SERVER_CORE = "0"
GENERATOR_CORE = "1"


def two_cores() -> bool:
    """Whether the server and the generator can each have a core."""
    return hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) >= 2


def pinned(cmd: list[str], core: str) -> list[str]:
    """``cmd`` under ``taskset -c core`` when the machine has two cores."""
    return ["taskset", "-c", core, *cmd] if two_cores() and shutil.which("taskset") else cmd


def core_busy_seconds(core: str) -> float:
    """Seconds ``core`` has spent busy so far, whoever ran (Linux /proc/stat: all but idle, iowait).

    Beside a server's own CPU time it shows interference on its core: kernel work for the traffic,
    other processes, and the hypervisor's steal on a shared machine.
    """
    for line in Path("/proc/stat").read_text().splitlines():
        name, *ticks = line.split()
        if name == f"cpu{core}":
            values = [int(t) for t in ticks[:8]]  # user nice system idle iowait irq softirq steal
            return (sum(values) - values[3] - values[4]) / os.sysconf("SC_CLK_TCK")
    raise RuntimeError(f"no cpu{core} line in /proc/stat")


def _cpu_seconds(stat: Path, children: bool = False) -> float:
    """User + system seconds of a process (or a thread), with ``children`` those of the children
    it waited for too (a reaped child leaves /proc; its time stays counted in its parent's)."""
    fields = stat.read_text().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    ticks = int(fields[11]) + int(fields[12]) + (int(fields[13]) + int(fields[14]) if children else 0)
    return ticks / os.sysconf("SC_CLK_TCK")


@dataclass
class Server:
    """A server process under test and the URL it answers on."""

    proc: subprocess.Popen[bytes]
    url: str

    def cpu_seconds(self) -> float:
        """User + system CPU the server has used so far (Linux /proc): its own, its children's that
        it waited for, and, when it leads a process group (:func:`start_server` makes it one), every
        other live process of the group: what a server starts, such as Triton's Python backend
        stub, which runs the model."""
        total = _cpu_seconds(Path(f"/proc/{self.proc.pid}/stat"), children=True)
        for stat in Path("/proc").glob("[0-9]*/stat"):
            if stat.parent.name == str(self.proc.pid):
                continue
            try:
                if int(stat.read_text().rsplit(")", 1)[1].split()[2]) == self.proc.pid:  # its group
                    total += _cpu_seconds(stat, children=True)
            except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
                continue  # the process ended meanwhile
        return total

    def thread_cpu_seconds(self) -> dict[int, float]:
        """User + system CPU per thread so far (thread id -> seconds; the main thread's id is the
        process id). Threads that ended are gone from the table."""
        out = {}
        for task in Path(f"/proc/{self.proc.pid}/task").iterdir():
            try:
                out[int(task.name)] = _cpu_seconds(task / "stat")
            except FileNotFoundError:  # the thread ended meanwhile
                continue
        return out

    def stop(self) -> None:
        """SIGTERM to the server's process group (the server is its leader: what it started goes
        too, such as LitServe's workers or Triton's backend stubs), then SIGKILL after 30 s."""
        self._signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self._signal(signal.SIGKILL)
            self.proc.wait()
        self._signal(signal.SIGKILL)  # anything of the group still running after its leader exited

    def _signal(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):  # the group is gone
            os.killpg(self.proc.pid, sig)


def start_server(cmd: list[str], url: str, ready_path: str, env: dict[str, str] | None = None,
                 timeout_s: float = 120.0, log: Path | None = None) -> Server:
    """Start ``cmd`` pinned to the server core and wait until ``url + ready_path`` answers 200."""
    out = log.open("wb") if log else subprocess.DEVNULL
    proc = subprocess.Popen(pinned(cmd, SERVER_CORE), env={**os.environ, **(env or {})},
                            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            Server(proc, url).stop()  # what it started, if anything
            raise RuntimeError(f"server exited with {proc.returncode}: {' '.join(cmd)}")
        try:
            if httpx.get(url + ready_path, timeout=1).status_code == 200:
                return Server(proc, url)
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    Server(proc, url).stop()
    raise RuntimeError(f"server not ready after {timeout_s:g} s: {' '.join(cmd)}")


PRIVATE_NETWORK_FLAG = "QPART_BENCH_NETNS"


def enter_private_network(module: str, argv: list[str], tools: tuple[str, ...] = (),
                          mtu: int | None = None) -> None:
    """Re-run ``python -m module argv`` in a new network namespace whose only interface is
    loopback (brought up, with ``mtu`` if given); returns only once inside. Needs root."""
    if os.environ.get(PRIVATE_NETWORK_FLAG) == "1":
        subprocess.run(["ip", "link", "set", "lo", "up", *(["mtu", str(mtu)] if mtu else [])], check=True)
        return
    missing = [t for t in ("unshare", "ip", *tools) if shutil.which(t) is None]
    if os.geteuid() != 0 or missing:
        raise SystemExit(f"{module} runs its servers in a private network namespace (unshare -n): "
                         f"run it as root{'; missing: ' + ', '.join(missing) if missing else ''}")
    os.execvpe("unshare", ["unshare", "-n", "--", sys.executable, "-m", module, *argv],
               {**os.environ, PRIVATE_NETWORK_FLAG: "1"})


def require_wrk() -> str:
    """The wrk binary, or a clear error naming the package."""
    path = shutil.which("wrk")
    if path is None:
        raise SystemExit("the load generator wrk is missing: apt-get install wrk")
    return path


def wrk(url: str, body: bytes, content_type: str, clients: int, seconds: int,
        prefix: list[str] | None = None, headers: dict[str, str] | None = None) -> dict[str, Any]:
    """POST ``body`` to ``url`` from ``clients`` connections for ``seconds``; wrk's summary.

    ``prefix`` runs wrk inside something (``ip netns exec NAME``); ``headers`` are sent with every
    request besides ``Content-Type`` (e.g. ``Inference-Header-Content-Length``). Returns requests,
    throughput, p50/p99 latency, error counts and the generator's CPU share of one core.
    """
    extra = [f"{name}: {value}" for name, value in (headers or {}).items()]
    with tempfile.NamedTemporaryFile(prefix="qpart-body-", suffix=".bin") as f:
        f.write(body)
        f.flush()
        cmd = [*(prefix or []), *pinned([require_wrk(), "-t1", f"-c{clients}", f"-d{seconds}s",
                                          "--timeout", "30s", "-s", str(WRK_SCRIPT), url, "--",
                                          f.name, content_type, *extra], GENERATOR_CORE)]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=seconds + 120)
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    errors = sum(summary[k] for k in ("non_2xx", "connect_errors", "read_errors", "write_errors",
                                      "timeouts"))
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    ok = summary["requests"] - summary["non_2xx"]
    return {"clients": clients, "requests": summary["requests"], "errors": errors,
            "non_2xx": summary["non_2xx"], "throughput_rps": ok / summary["duration_s"],
            "p50_s": summary["p50_s"], "p99_s": summary["p99_s"], "max_s": summary["max_s"],
            "generator_cpu_share": cpu / wall}
