"""Dynamic batching of tail requests for the same (model, version, cut), off the event loop.

Requests queue per key; a collector task takes up to ``max_batch`` of them, waiting at most
``max_delay_s`` after the first, concatenates them along the batch dimension and runs the tail in
a worker thread (torch releases the GIL). The queue is bounded: past ``max_queue`` waiting
samples a request fails at once with :class:`OverloadedError` (503 + Retry-After).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Generic, Protocol, Self, TypeVar

import numpy as np

from server.errors import OverloadedError


class Rows(Protocol):
    """What a batch function returns: one row per input sample, sliced per request (a numpy
    array, or :class:`server.answers.TailRows`)."""

    def __getitem__(self, rows: slice, /) -> Self: ...


R = TypeVar("R", bound=Rows)
log = logging.getLogger(__name__)


@dataclass
class _Job(Generic[R]):
    inputs: np.ndarray
    future: asyncio.Future[tuple[R, float, float]]
    enqueued: float = field(default_factory=time.perf_counter)


@dataclass(frozen=True)
class BatchReport:
    """What one executed batch looked like (for metrics)."""

    key: str
    size: int
    queue_s: list[float]
    compute_s: float


def _fail(jobs: list[_Job[R]], exc: BaseException) -> None:
    for j in jobs:
        if not j.future.done():
            j.future.set_exception(exc)


class Batcher(Generic[R]):
    """One queue + collector task per key, sharing a thread pool; every key's batch function
    returns rows of type ``R``."""

    def __init__(self, pool: ThreadPoolExecutor, *, max_batch: int, max_delay_s: float,
                 max_queue: int, retry_after_s: float,
                 on_batch: Callable[[BatchReport], None] | None = None) -> None:
        self._pool = pool
        self._max_batch = max_batch
        self._max_delay = max_delay_s
        self._max_queue = max_queue
        self._retry_after = retry_after_s
        self._on_batch = on_batch
        self._queues: dict[str, deque[_Job[R]]] = {}
        self._arrived: dict[str, asyncio.Event] = {}
        self._runs: dict[str, Callable[[np.ndarray], R]] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._waiting: dict[str, int] = {}

    def depth(self) -> dict[str, int]:
        """Samples waiting per key."""
        return dict(self._waiting)

    async def submit(self, key: str, run: Callable[[np.ndarray], R],
                     inputs: np.ndarray) -> tuple[R, float, float]:
        """Queue ``inputs`` (``[B, ...]``) for ``run``; every call for one ``key`` must pass the same
        ``run`` (the first one is kept).

        Returns:
            (this request's rows of ``run``'s output, seconds queued, this request's share of the
            batch's compute seconds).
        """
        waiting = self._waiting.get(key, 0)
        if waiting + inputs.shape[0] > self._max_queue:
            raise OverloadedError(
                f"tail queue for {key} is full ({waiting} samples waiting); retry after "
                f"{self._retry_after:g} s", self._retry_after)
        if key not in self._queues:
            self._queues[key] = deque()
            self._arrived[key] = asyncio.Event()
            self._runs[key] = run
            self._tasks[key] = asyncio.create_task(self._collect(key), name=f"batcher:{key}")
        job: _Job[R] = _Job(inputs, asyncio.get_running_loop().create_future())
        self._waiting[key] = waiting + inputs.shape[0]
        self._queues[key].append(job)
        self._arrived[key].set()
        return await job.future

    async def _collect(self, key: str) -> None:
        # A deque and one Event per key: waiting for the next request costs no task or timer
        # per request (asyncio.Queue.get under wait_for creates both), which matters at
        # thousands of requests per second on one core.
        queue = self._queues[key]
        arrived = self._arrived[key]
        while True:
            while not queue:
                arrived.clear()
                await arrived.wait()
            jobs = [queue.popleft()]
            size = jobs[0].inputs.shape[0]
            deadline = time.perf_counter() + self._max_delay
            while size < self._max_batch:
                if queue:
                    job = queue.popleft()
                    jobs.append(job)
                    size += job.inputs.shape[0]
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
            await self._execute(key, jobs)

    async def _execute(self, key: str, jobs: list[_Job[R]]) -> None:
        self._waiting[key] -= sum(j.inputs.shape[0] for j in jobs)
        try:
            batch = np.concatenate([j.inputs for j in jobs]) if len(jobs) > 1 else jobs[0].inputs
            started = time.perf_counter()
            queue_s = [started - j.enqueued for j in jobs]
            out = await asyncio.get_running_loop().run_in_executor(self._pool, self._runs[key], batch)
            compute_s = time.perf_counter() - started
        except asyncio.CancelledError:  # closing: the batch in flight fails, it does not hang
            _fail(jobs, self._closing_error())
            raise
        except Exception as exc:  # a failing batch must fail its requests, not the collector
            _fail(jobs, exc)
            return
        offset = 0
        total = batch.shape[0]
        for j, q in zip(jobs, queue_s, strict=True):
            n = j.inputs.shape[0]
            if not j.future.done():  # the client may have gone away
                # Each request is charged its share of the batch's compute time.
                j.future.set_result((out[offset : offset + n], q, compute_s * n / total))
            offset += n
        if self._on_batch:
            try:
                self._on_batch(BatchReport(key, total, queue_s, compute_s))
            except Exception:  # metrics must not take the collector down
                log.exception("recording batch metrics failed")

    def _closing_error(self) -> OverloadedError:
        return OverloadedError("the server is shutting down; retry on another replica",
                               self._retry_after)

    async def close(self) -> None:
        """Stop the collectors; requests still queued or running fail with 503 + Retry-After."""
        for task in self._tasks.values():
            task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)
        for queue in self._queues.values():  # nobody will run these: fail them instead of hanging
            _fail(list(queue), self._closing_error())
        self._tasks.clear()
        self._queues.clear()
        self._arrived.clear()
