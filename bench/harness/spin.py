"""Idle spinners: keep this virtual machine's CPUs awake while a benchmark times wake-ups on them.

On this KVM guest an idle vCPU halts, and the hypervisor takes from a fraction of a millisecond to
a few milliseconds to run it again when work arrives for it: a loopback HTTP exchange between two
pinned processes then waits once or twice for a halted vCPU. A real device and a real server do
not halt between a request and its answer like that. :class:`IdleSpinners` runs one busy loop per
core at ``SCHED_IDLE`` (the scheduler runs it only when nothing else wants the core, and preempts
it at once when something does), so the cores never halt and a wake-up is a context switch.
What that does to a loopback exchange: :mod:`bench.e2e.analyses.wakeup`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from types import TracebackType

# A spinner's whole program (``python -S -c``, stdlib only, so it is SCHED_IDLE within a few ms of
# starting, not after importing this package): it dies with its parent (PR_SET_PDEATHSIG, and a
# parent already gone when that was set), so a benchmark killed with SIGKILL leaves no busy loop.
# The death signal follows the thread that started the spinner: enter IdleSpinners from the main
# thread (a worker thread's exit would stop the spinners early).
SPINNER = """
import ctypes, os, signal, sys
core, parent = int(sys.argv[1]), int(sys.argv[2])
os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
os.sched_setaffinity(0, {core})
try:
    ctypes.CDLL(None).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
except (OSError, AttributeError):
    pass
if os.getppid() != parent:
    sys.exit(0)
while True:
    pass
"""


class IdleSpinners:
    """One ``SCHED_IDLE`` busy loop per core while the ``with`` block runs (none where the system
    has no SCHED_IDLE or ``enabled`` is false)."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled and hasattr(os, "SCHED_IDLE") and hasattr(os, "sched_setaffinity")
        self._procs: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> IdleSpinners:
        if self.enabled:
            for core in sorted(os.sched_getaffinity(0)):
                self._procs.append(subprocess.Popen(
                    [sys.executable, "-S", "-c", SPINNER, str(core), str(os.getpid())]))
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        for p in self._procs:
            p.kill()
        for p in self._procs:
            p.wait()
        self._procs.clear()
