"""The audit worker: the float model on uploaded inputs, off the hot path (ADR 0024).

One thread, at the lowest CPU priority the OS gives a thread (nice 19 on Linux), takes audits from
a bounded queue, and starts each only once no tail has run or waited for QPART_AUDIT_QUIET_S (it is
woken when the tails go idle): audits fill the gaps between answers; under sustained load they wait
in the queue, and when it is full an audit is dropped and counted, never waited for. Once started an
audit runs to its end, one sample through the float model (the whole model, the tail of cut 0),
beside any answer that arrives meanwhile. Its top-1 is compared with the answer the plan gave, and
the input is discarded, unless QPART_AUDIT_KEEP_DIR keeps the disagreeing ones (size-capped, oldest
first, readable by the server's user only).
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from qpart.server.audit.book import Ticket
from qpart.server.audit.live import LiveDisagreement

log = logging.getLogger("qpart.server.audit")

POLL_S = 0.05
"""The longest a waiting worker sleeps before it looks again (it wakes when the tails go idle)."""

TopOne = Callable[[np.ndarray], np.ndarray]
"""The float model's top-1 class per sample of a ``[B, *input_shape]`` float32 batch."""


@dataclass(frozen=True)
class AuditJob:
    """An audit to check: its ticket (with the answer given), the sample's raw input, the float model."""

    ticket: Ticket
    inputs: np.ndarray
    top_one: TopOne


class KeptInputs:
    """Disagreeing inputs as ``.npy`` files in one folder, at most ``max_bytes`` of them (the
    oldest go first); files of others in the folder are never touched."""

    def __init__(self, folder: Path, max_bytes: int) -> None:
        self.folder = folder
        self.max_bytes = max_bytes
        folder.mkdir(parents=True, exist_ok=True)
        self._files = sorted(folder.glob("audit-*.npy"), key=lambda p: p.stat().st_mtime)
        self._bytes = sum(p.stat().st_size for p in self._files)

    def keep(self, ticket: Ticket, inputs: np.ndarray, float_top1: np.ndarray) -> None:
        """Save each disagreeing sample with its plan's name and both answers in the file name."""
        assert ticket.answers is not None
        for i in np.flatnonzero(float_top1 != ticket.answers):
            name = (f"audit-{time.time_ns()}-{ticket.id[:8]}-sample{ticket.sample}-{ticket.model}-"
                    f"{ticket.version}-"
                    f"level{ticket.level:g}-served{ticket.answers[i]}-float{float_top1[i]}.npy")
            path = self.folder / "".join(c if c.isalnum() or c in "-_.@" else "_" for c in name)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # the server's user only
            with os.fdopen(fd, "wb") as f:
                np.save(f, inputs[i], allow_pickle=False)
            self._files.append(path)
            self._bytes += path.stat().st_size
        while self._bytes > self.max_bytes and self._files:
            oldest = self._files.pop(0)
            with contextlib.suppress(OSError):
                self._bytes -= oldest.stat().st_size
                oldest.unlink()


class AuditWorker:
    """The queue and the thread that checks audits; started on the first audit."""

    def __init__(self, live: LiveDisagreement, max_queue: int, keep: KeptInputs | None = None,
                 idle_s: Callable[[], float] | None = None, quiet_s: float = 0.002,
                 went_idle: threading.Event | None = None) -> None:
        self.live = live
        self.keep = keep
        self._idle_s = idle_s  # seconds no answer has been computed or waited (None: always idle)
        self._quiet_s = quiet_s
        self._went_idle = went_idle or threading.Event()  # set by the tails when they go idle
        self._queue: queue.Queue[AuditJob | None] = queue.Queue(maxsize=max_queue)
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._stopping = threading.Event()
        self.dropped: Counter[tuple[str, str]] = Counter()  # (model, reason) -> audits dropped
        self.checked = 0  # audits the worker finished (tests wait on it)

    def submit(self, job: AuditJob) -> bool:
        """Queue an audit; False (dropped and counted) when the queue is full."""
        self._start()
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            self.dropped[(job.ticket.model, "queue_full")] += 1
            return False
        return True

    def depth(self) -> int:
        """Audits waiting."""
        return self._queue.qsize()

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the thread after the audit it is checking; queued ones are dropped unchecked and
        counted (reason ``shutdown``). Blocks up to ``timeout_s``: call it off the event loop."""
        thread = self._thread
        self._stopping.set()
        if thread is None:
            return
        while True:  # empty the queue (counted), then the stop sign goes in
            self._count_left()
            try:
                self._queue.put_nowait(None)
                break
            except queue.Full:  # an audit came meanwhile
                continue
        thread.join(timeout_s)
        self._count_left()

    def _count_left(self) -> None:
        """Count what is still queued as dropped at shutdown."""
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                return
            if job is not None:
                self.dropped[(job.ticket.model, "shutdown")] += 1

    def _start(self) -> None:
        if self._thread is not None:
            return
        with self._start_lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="audit", daemon=True)
                self._thread.start()

    def _loop(self) -> None:
        with contextlib.suppress(OSError, AttributeError):  # Linux: a thread's own nice value
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        while (job := self._queue.get()) is not None:
            if not self._wait_quiet():
                self.dropped[(job.ticket.model, "shutdown")] += 1
                break
            try:
                self.check(job)
            except Exception:  # a bug or the model failing: logged, counted, the worker goes on
                log.exception("audit of %s@%s failed", job.ticket.model, job.ticket.version)
                self.dropped[(job.ticket.model, "failed")] += 1
            self.checked += 1

    def _wait_quiet(self) -> bool:
        """Wait until no answer has been computed or waited for ``quiet_s`` (False: stopping
        meanwhile). Woken when the tails go idle, else every :data:`POLL_S`: an audit starts in the
        tails' gaps; once started it runs to its end (one sample's float model), beside any answer
        that arrives meanwhile."""
        while self._idle_s is not None and not self._stopping.is_set():
            self._went_idle.clear()  # before reading: a batch that ends after the read sets it again
            idle = self._idle_s()  # 0: a tail runs or waits now
            if idle > 0 and idle >= self._quiet_s:
                break
            if idle > 0:  # quiet already, not yet long enough
                time.sleep(self._quiet_s - idle)
            else:
                self._went_idle.wait(POLL_S)
        return not self._stopping.is_set()

    def check(self, job: AuditJob) -> None:
        """Run the float model on the audit's inputs and add the comparison to the live rates."""
        ticket = job.ticket
        assert ticket.answers is not None
        float_top1 = np.asarray(job.top_one(job.inputs))
        disagreed = float_top1 != ticket.answers
        self.live.add(ticket.model, ticket.version, ticket.level, disagreed, ticket.reference,
                      promised=ticket.promised)
        if self.keep is not None and disagreed.any():
            self.keep.keep(ticket, job.inputs, float_top1)
