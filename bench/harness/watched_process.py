"""A command run under watch: its wall time, its own peak RSS, and a kill when it passes a time,
memory or disk limit, so that a process without bounds of its own is measured up to a limit rather
than left to fill the machine.

The peak is the largest ``VmHWM`` of ``/proc/<pid>/status`` read every :data:`SAMPLE_S`: the high-water
mark of the process's own memory since its ``exec``. ``getrusage``'s ``ru_maxrss`` of the child is
not used: Linux carries the parent's high-water mark across ``vfork`` and ``exec`` into it, so a
child of a 300 MB benchmark process reads 300 MB whatever it used.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

SAMPLE_S = 0.02
"""How often the watch reads the child's RSS and the watched folder's size."""


@dataclass(frozen=True)
class Limits:
    """When the watch kills the child (SIGKILL)."""

    wall_s: float
    rss_bytes: int
    disk_bytes: int
    """Bytes of all the files under the watched folder."""


@dataclass(frozen=True)
class Watched:
    """What one watched run did."""

    returncode: int
    wall_s: float
    peak_rss_bytes: int
    """The child's high-water resident set (``VmHWM``, last read before it exited or was killed)."""
    killed: str | None
    """Which limit killed it (``"wall"``, ``"rss"``, ``"disk"``), or None."""
    stdout: str
    stderr: str


def folder_bytes(folder: Path) -> int:
    """The bytes of every regular file under ``folder`` (0 when it does not exist)."""
    total = 0
    for path in folder.rglob("*"):
        try:
            if path.is_file():
                total += path.stat().st_size
        except OSError:  # renamed or deleted while we looked
            pass
    return total


def _memory_bytes(pid: int) -> tuple[int, int]:
    """(``VmRSS``, ``VmHWM``) of ``pid`` in bytes; zeros once it has exited."""
    found = {"VmRSS:": 0, "VmHWM:": 0}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            name = line.split(maxsplit=1)[0] if line else ""
            if name in found:
                found[name] = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return found["VmRSS:"], found["VmHWM:"]


def run_watched(command: list[str], env: dict[str, str], folder: Path, limits: Limits,
                out_dir: Path) -> Watched:
    """Run ``command`` with ``env`` until it exits or passes one of ``limits`` (``folder``: where
    its disk use is counted); it runs in ``out_dir`` (so ``python -m`` imports from its
    ``PYTHONPATH``, not from the benchmark's working directory), its output goes to files there (a
    pipe could block it)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    out, err = out_dir / "stdout", out_dir / "stderr"
    with out.open("wb") as o, err.open("wb") as e:
        started = time.monotonic()
        proc = subprocess.Popen(command, env=env, cwd=out_dir, stdout=o, stderr=e, stdin=subprocess.DEVNULL)
        pidfd = os.pidfd_open(proc.pid)  # a kill through it never reaches a reused pid
        killed: list[str] = []
        peak = [0]
        done = threading.Event()
        watch = threading.Thread(target=_watch, args=(proc.pid, pidfd, folder, limits, started, done,
                                                      killed, peak), daemon=True)
        watch.start()
        _, status = os.waitpid(proc.pid, 0)
        wall = time.monotonic() - started
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
        done.set()
        watch.join()
        os.close(pidfd)
    return Watched(proc.returncode, wall, peak[0], killed[0] if killed else None,
                   out.read_text(errors="replace"), err.read_text(errors="replace"))


def _watch(pid: int, pidfd: int, folder: Path, limits: Limits, started: float,
           done: threading.Event, killed: list[str], peak: list[int]) -> None:
    while not done.wait(SAMPLE_S):
        rss, high = _memory_bytes(pid)
        peak[0] = max(peak[0], high)
        if time.monotonic() - started > limits.wall_s:
            reason = "wall"
        elif rss > limits.rss_bytes:
            reason = "rss"
        elif folder_bytes(folder) > limits.disk_bytes:
            reason = "disk"
        else:
            continue
        killed.append(reason)
        with contextlib.suppress(ProcessLookupError):  # it exited meanwhile
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        return
