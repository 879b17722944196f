"""Dynamic batching of tail requests for the same key (model, version, cut), off the event loop.

Requests queue per key; a collector task takes up to ``max_batch`` of them, waiting at most
``max_delay_s`` after the first, concatenates them along the batch dimension and runs the tail in
a worker thread (torch releases the GIL). The queue is bounded: past ``max_queue`` waiting
samples a request fails at once with :class:`OverloadedError` (503 + Retry-After); a request that
alone is larger than the queue can never run and fails with :class:`PayloadTooLargeError` (413).

A failing batch fails its own requests (:class:`TailFailedError`, a logged 500) and nothing else.
A collector that dies anyway is restarted; until it is, :meth:`Batcher.stalled` names its key.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Generic, Protocol, Self, TypeVar

import numpy as np

from qpart.server.errors import BadRequestError, OverloadedError, PayloadTooLargeError, TailFailedError


class Rows(Protocol):
    """What a batch function returns: one row per input sample, sliced per request (a numpy
    array, or :class:`server.tails.answers.TailRows`)."""

    def __getitem__(self, rows: slice, /) -> Self: ...


K = TypeVar("K", bound=Hashable)
R = TypeVar("R", bound=Rows)
log = logging.getLogger(__name__)


@dataclass
class _Job(Generic[R]):
    inputs: np.ndarray
    future: asyncio.Future[tuple[R, float, float]]
    enqueued: float = field(default_factory=time.perf_counter)

    @property
    def size(self) -> int:
        return int(self.inputs.shape[0])


@dataclass(frozen=True)
class BatchReport(Generic[K]):
    """What one executed batch looked like (for metrics)."""

    key: K
    size: int
    queue_s: list[float]
    compute_s: float
    idle_s: float  # how long no batch of any key had run when this one began; 0 if one ran meanwhile


def _fail(jobs: list[_Job[R]], exc: BaseException) -> None:
    for j in jobs:
        if not j.future.done():
            j.future.set_exception(exc)


@dataclass
class _Lane(Generic[R]):
    """One key's queue, its wake-up event, its batch function and its collector task."""

    run: Callable[[np.ndarray], R]
    queue: deque[_Job[R]] = field(default_factory=deque)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    waiting: int = 0
    task: asyncio.Task[None] | None = None


class Batcher(Generic[K, R]):
    """One queue + collector task per key, sharing a thread pool; every key's batch function
    returns rows of type ``R``."""

    def __init__(self, pool: ThreadPoolExecutor, *, max_batch: int, max_delay_s: float,
                 max_queue: int, retry_after_s: float,
                 on_batch: Callable[[BatchReport[K]], None] | None = None) -> None:
        self._pool = pool
        self._max_batch = max_batch
        self._max_delay = max_delay_s
        self._max_queue = max_queue
        self._retry_after = retry_after_s
        self._on_batch = on_batch
        self._lanes: dict[K, _Lane[R]] = {}
        self._closing = False
        self._running = 0  # batches of any key handed to the pool and not yet back
        self._starts = 0  # batches begun so far
        self._last_end = -math.inf  # time.perf_counter() when the last batch to finish finished
        self.went_idle = threading.Event()  # set when a batch ends with none running or waiting

    def depth(self) -> dict[K, int]:
        """Samples waiting per key."""
        return {key: lane.waiting for key, lane in self._lanes.items()}

    def idle_s(self) -> float:
        """Seconds since the last batch ended, with none running or waiting now (0: busy; the
        start-up's infinity before any batch). Read from other threads too: a snapshot."""
        if not self._quiet():
            return 0.0
        return time.perf_counter() - self._last_end

    def _quiet(self) -> bool:
        """No batch runs and no sample waits, now."""
        return not self._running and not any(lane.waiting for lane in list(self._lanes.values()))

    def stalled(self) -> list[K]:
        """Keys whose collector is not running (it died and is not restarted yet)."""
        if self._closing:
            return []
        return [key for key, lane in self._lanes.items() if lane.task is None or lane.task.done()]

    async def submit(self, key: K, run: Callable[[np.ndarray], R],
                     inputs: np.ndarray) -> tuple[R, float, float]:
        """Queue ``inputs`` (``[B, ...]``, ``B >= 1``) for ``run``; every call for one ``key`` must
        pass the same ``run`` (the first one is kept).

        Returns:
            (this request's rows of ``run``'s output, seconds queued, this request's share of the
            batch's compute seconds).

        Raises:
            BadRequestError: an empty batch (``B == 0``).
            PayloadTooLargeError: ``B`` exceeds the queue's capacity, so it could never run.
            OverloadedError: the queue holds too many samples now; retry later.
        """
        samples = int(inputs.shape[0]) if inputs.ndim else 0
        if samples < 1:
            raise BadRequestError("the batch dimension is 0: send at least one sample")
        if samples > self._max_queue:
            raise PayloadTooLargeError(
                f"a batch of {samples} samples exceeds the tail queue's capacity of {self._max_queue} "
                "(QPART_MAX_QUEUE); split it into smaller requests")
        lane = self._lanes.get(key)
        if lane is None:
            lane = self._lanes[key] = _Lane(run)
        if lane.waiting + samples > self._max_queue:
            raise OverloadedError(
                f"tail queue for {key} is full ({lane.waiting} samples waiting); retry after "
                f"{self._retry_after:g} s", self._retry_after)
        if lane.task is None or lane.task.done():
            self._start(key, lane)
        job: _Job[R] = _Job(inputs, asyncio.get_running_loop().create_future())
        lane.waiting += samples
        lane.queue.append(job)
        lane.arrived.set()
        return await job.future

    def _start(self, key: K, lane: _Lane[R]) -> None:
        if lane.task is not None:  # it died: say so once, then replace it
            log.error("tail collector for %s had stopped; restarting it", key)
        lane.task = asyncio.create_task(self._collect(key, lane), name=f"batcher:{key}")
        lane.task.add_done_callback(lambda task: self._on_collector_done(key, lane, task))

    def _on_collector_done(self, key: K, lane: _Lane[R], task: asyncio.Task[None]) -> None:
        if self._closing or task.cancelled() or lane.task is not task:
            return
        log.error("tail collector for %s died", key, exc_info=task.exception())
        self._start(key, lane)  # at once: waiting requests, and readiness, depend on it

    async def _take(self, lane: _Lane[R]) -> list[_Job[R]]:
        """The next batch: the first job waiting, then whatever joins within ``max_delay_s``."""
        queue, arrived = lane.queue, lane.arrived
        while not queue:
            arrived.clear()
            await arrived.wait()
        jobs = [queue.popleft()]
        size = jobs[0].size
        deadline = time.perf_counter() + self._max_delay
        while size < self._max_batch:
            if queue:
                job = queue.popleft()
                jobs.append(job)
                size += job.size
                continue
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                break
            arrived.clear()
            try:
                async with asyncio.timeout(remaining):
                    await arrived.wait()
            except TimeoutError:
                break
            except asyncio.CancelledError:  # closing while jobs wait for company: fail them
                _fail(jobs, self._closing_error())
                raise
        return jobs

    async def _collect(self, key: K, lane: _Lane[R]) -> None:
        # A deque and one Event per key: waiting for the next request costs no task or timer
        # per request (asyncio.Queue.get under wait_for creates both), which matters at
        # thousands of requests per second on one core.
        while True:
            jobs = await self._take(lane)
            lane.waiting -= sum(j.size for j in jobs)
            try:
                await self._execute(key, lane.run, jobs)
            except asyncio.CancelledError:  # closing: the batch in flight fails, it does not hang
                _fail(jobs, self._closing_error())
                raise
            except Exception as exc:  # a failing batch fails its requests, never the collector
                log.exception("tail batch for %s failed (%d requests)", key, len(jobs))
                _fail(jobs, TailFailedError(f"the tail failed on this batch ({type(exc).__name__}); "
                                            "this is a server bug, other requests are unaffected"))

    async def _execute(self, key: K, run: Callable[[np.ndarray], R], jobs: list[_Job[R]]) -> None:
        batch = np.concatenate([j.inputs for j in jobs]) if len(jobs) > 1 else jobs[0].inputs
        started = time.perf_counter()
        queue_s = [started - j.enqueued for j in jobs]
        # Whether the batch found the pool idle, and for how long: a batch that began while another
        # ran, or during which another began, shared the workers (server.tails.tail_times prices lone
        # tails from batches that found the server idle).
        idle_s = 0.0 if self._running else max(0.0, started - self._last_end)
        self._running += 1
        self._starts += 1
        starts = self._starts
        try:
            out = await asyncio.get_running_loop().run_in_executor(self._pool, run, batch)
        finally:
            ended = time.perf_counter()
            self._running -= 1
            self._last_end = max(self._last_end, ended)
            if self._quiet():
                self.went_idle.set()  # a background job waiting for quiet may look now
        compute_s = ended - started
        if self._starts != starts:
            idle_s = 0.0
        offset = 0
        total = max(1, batch.shape[0])
        for j, q in zip(jobs, queue_s, strict=True):
            if not j.future.done():  # the client may have gone away
                # Each request is charged its share of the batch's compute time.
                j.future.set_result((out[offset : offset + j.size], q, compute_s * j.size / total))
            offset += j.size
        if self._on_batch:
            try:
                self._on_batch(BatchReport(key, total, queue_s, compute_s, idle_s))
            except Exception:  # metrics must not take the collector down
                log.exception("recording batch metrics failed")

    def _closing_error(self) -> OverloadedError:
        return OverloadedError("the server is shutting down; retry on another replica",
                               self._retry_after)

    async def close(self) -> None:
        """Stop the collectors; requests still queued or running fail with 503 + Retry-After."""
        self._closing = True
        tasks = [lane.task for lane in self._lanes.values() if lane.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for lane in self._lanes.values():  # nobody will run these: fail them instead of hanging
            _fail(list(lane.queue), self._closing_error())
        self._lanes.clear()
