"""Runs a small calibration, and kills its own process with SIGKILL at a chosen point, for
``test_checkpoint.py`` and ``test_ray_executor.py``: ``python resume_driver.py OUT WORKERS [KILL]``;
``QPART_TEST_RAY_ADDRESS`` in the environment runs the validation stage on that Ray cluster.
With a ``stop:`` point there, every cut's Ray task but cut 0's waits 120 s before it runs, so that
only cut 0 can come back before the test freezes the cluster.

KILL is ``STAGE@STEP`` (when the progress of the stage whose label starts with STAGE reaches
STEP; ``@start``: as it starts), ``stop:STAGE@STEP`` (the same point, but the process stops with
SIGSTOP and waits to be continued), or ``write@NAME`` (half-way through writing the file NAME: its
temporary file is left torn, as a power cut would leave it).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

from qpart.models.registry import get_model
from qpart.offline.job import calibrate
from qpart.offline.ray_executor import ray_executor
from qpart.offline.settings import CalibrationSettings


def settings(workers: int) -> CalibrationSettings:
    """The small configuration: two levels on a few hundred samples, the cuts chosen by the
    envelope (--cuts auto, ADR 0025: cuts 0 and 8 of fmnist-cnn's 9)."""
    return CalibrationSettings(
        levels=(0.02, 0.05), fit_samples=200, check_samples=200, noise_samples=200, mapping_points=4,
        refine_points=1, cuts="auto", test_samples=200, batch_size=100, confidence=0.9,
        threads=workers, workers=workers, measure_both=False, ladder=(-8, -4, 0, 2))


def die(sig: int = signal.SIGKILL) -> None:
    sys.stdout.flush()
    os.kill(os.getpid(), sig)


class KillingSink:
    """A progress sink that kills the process at ``stage@step``."""

    def __init__(self, stage: str, step: str, sig: int = signal.SIGKILL) -> None:
        self.stage, self.step, self.sig, self.done = stage, step, sig, False

    def start(self, label: str, total: int) -> Callable[[int], None]:
        mine = label.startswith(self.stage)
        if mine and self.step == "start":
            die(self.sig)

        def advance(done: int) -> None:
            if mine and done >= int(self.step) and not self.done:
                self.done = True  # (once: a stopped process that is continued goes on)
                die(self.sig)

        return advance


def torn_writes(name: str) -> None:
    """Make the write of the file ``name`` stop half-way as it is flushed, then die."""
    real = os.fsync

    def fsync(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").endswith(f"/{name}.tmp"):
            os.ftruncate(fd, os.fstat(fd).st_size // 2)
            die()
        real(fd)

    os.fsync = fsync


def hold_back_all_but_cut_0() -> None:
    """Every cut's Ray task but cut 0's sleeps 120 s first. The test stops the job once its first
    cut came back, then freezes and stops the cluster: the other tasks must not finish, and hand
    their results to the stopped job, in between. Without this they did on a loaded host (the
    continued job got every cut and wrote its artifact)."""
    from qpart.offline import ray_executor

    def held(job: str, context: dict[str, object], cut: int, record: object) -> object:
        from qpart.offline.ray_executor import _task  # the worker process's own, unpatched

        if cut != 0:
            time.sleep(120)
        return _task(job, context, cut, record)  # type: ignore[arg-type]

    ray_executor._task = held  # type: ignore[assignment]


def main(argv: list[str]) -> None:
    out, workers = Path(argv[0]), int(argv[1])
    sink = None
    if len(argv) > 2:
        kill = argv[2].removeprefix("stop:")
        what, _, where = kill.partition("@")
        if what == "write":
            torn_writes(where)
        else:
            sink = KillingSink(what, where, signal.SIGSTOP if kill != argv[2] else signal.SIGKILL)
    address = os.environ.get("QPART_TEST_RAY_ADDRESS")
    if address and len(argv) > 2 and argv[2].startswith("stop:"):
        hold_back_all_but_cut_0()
    executor = ray_executor(address) if address else None
    calibrate(get_model("fmnist-cnn"), settings(workers), out, sink, executor=executor)


if __name__ == "__main__":
    main(sys.argv[1:])
