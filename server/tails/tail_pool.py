"""The tail-runner pool: worker threads, one dynamic batcher, a batch function per (model, version,
cut), and what each tail takes on this machine (measured at start-up, corrected by live batches)."""

from __future__ import annotations

import asyncio
import copy
import functools
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch
from torch import fx

from qpart.models.partition import split
from qpart.models.timing import interleaved_medians
from qpart.server.errors import DeadlineExceededError
from qpart.server.metrics import Metrics
from qpart.server.settings import ServerSettings
from qpart.server.store.catalog import LoadedModel
from qpart.server.tails.answers import TailRows, tail_json, tail_rows
from qpart.server.tails.batching import Batcher, BatchReport
from qpart.server.tails.tail_times import TailTimes

TAIL_PROFILE_SECONDS = 0.5
"""Least seconds of interleaved rounds in a model version's start-up tail profile."""


@dataclass(frozen=True)
class TailKey:
    """What tail requests batch by: one model version's tail from one cut."""

    model: str
    version: str
    cut: int

    def __str__(self) -> str:
        return f"{self.model}@{self.version}/c{self.cut}"


class TailPool:
    """Runs tails in batches on worker threads and knows what each takes."""

    def __init__(self, settings: ServerSettings, metrics: Metrics) -> None:
        self.settings = settings
        self.metrics = metrics
        torch.set_num_threads(settings.torch_threads)
        self._pool = ThreadPoolExecutor(settings.tail_workers, thread_name_prefix="tail")
        self.batcher: Batcher[TailKey, TailRows] = Batcher(
            self._pool, max_batch=settings.max_batch_size, max_delay_s=settings.max_queue_delay_s,
            max_queue=settings.max_queue, retry_after_s=settings.retry_after_s, on_batch=self._record_batch)
        self._runs: dict[TailKey, Callable[[np.ndarray], TailRows]] = {}
        self._run_models: dict[TailKey, LoadedModel] = {}  # batch key -> its model, for the batch metrics
        self._graphs: dict[tuple[str, str], fx.GraphModule] = {}
        self.tail_times = TailTimes()
        self._answer_bytes: dict[tuple[str, str], int] = {}

    def warm_up(self, model: LoadedModel) -> None:
        """Time every tail of ``model`` through the pool and measure its answer's size."""
        with torch.inference_mode():
            self.tail_times.set_profile(model.name, model.version, self._measure_tails(model))
        self._answer_bytes[(model.name, model.version)] = self._measure_answer(model)

    async def close(self) -> None:
        """Stop batch collectors and worker threads."""
        await self.batcher.close()
        self._pool.shutdown(wait=True)

    def runner(self, model: LoadedModel, cut: int) -> Callable[[np.ndarray], TailRows]:
        """The batch function of one (model, cut), built once per key.

        Tails run on a copy of the model (heads share its parameters, and segments are built from
        those) whose 4-D weights are in channels-last memory format, as are 4-D activations:
        oneDNN's convolutions run faster on it, and more so on batches. One copy per model
        version; every cut's tail is split from it.
        """
        key = TailKey(model.name, model.version, cut)
        run = self._runs.get(key)
        if run is not None:
            return run
        tail = split(self._serving_graph(model), model.cuts[cut])[1].eval()
        four_d = len(model.cuts[cut].shape) == 3

        def run_batch(batch: np.ndarray) -> TailRows:
            # A lone binary request arrives as a read-only view of the body: torch needs its own.
            x = torch.from_numpy(batch if batch.flags.writeable else batch.copy())
            if four_d:
                x = x.contiguous(memory_format=torch.channels_last)
            with torch.inference_mode():
                logits: np.ndarray = tail(x).numpy()
            return tail_rows(logits)  # softmax and order for the whole batch, off the event loop

        self._runs[key] = run_batch
        self._run_models[key] = model
        return run_batch

    def _serving_graph(self, model: LoadedModel) -> fx.GraphModule:
        key = (model.name, model.version)
        gm = self._graphs.get(key)
        if gm is None:
            gm = copy.deepcopy(model.gm).eval()
            for param in gm.parameters():  # Module.to(memory_format=...), which torch's stubs lack
                if param.dim() == 4:
                    param.data = param.data.contiguous(memory_format=torch.channels_last)
            self._graphs[key] = gm
        return gm

    async def run(self, model: LoadedModel, cut: int, x: np.ndarray) -> tuple[TailRows, float, float]:
        """The tail of ``cut`` on ``x`` (``[B, ...]``), batched with others: (rows, seconds queued,
        this request's share of the batch's compute seconds)."""
        # While draining, readiness is 503 so balancers stop routing here, but requests that still
        # arrive are served: nothing accepted is dropped.
        key = TailKey(model.name, model.version, cut)
        run = self.runner(model, cut)
        try:
            async with asyncio.timeout(self.settings.request_timeout_s):
                return await self.batcher.submit(key, run, x)
        except TimeoutError as exc:
            raise DeadlineExceededError(
                f"tail inference took longer than {self.settings.request_timeout_s} s") from exc

    def idle_s(self) -> float:
        """Seconds no tail has run or waited (0: busy now): when a background job may run."""
        return self.batcher.idle_s()

    @property
    def went_idle(self) -> threading.Event:
        """Set each time a tail batch ends with none running or waiting (cleared by who waits)."""
        return self.batcher.went_idle

    def stalled_models(self) -> set[str]:
        """Models one of whose tail collectors is down (restarted at once; readiness says so)."""
        return {key.model for key in self.batcher.stalled()}

    def tail_seconds(self, model: LoadedModel) -> list[float]:
        """Per cut, what a lone request's tail takes on this server now: the batch-1 times measured
        at start-up through the worker pool, plus what lone requests took beyond them lately
        (:mod:`server.tails.tail_times`). The artifact's figures (measured where the calibration ran)
        stand in before warm-up. Prices use compute only, not queueing."""
        live = self.tail_times.seconds(model.name, model.version)
        return live if live is not None else [c.server_tail_s for c in model.artifact.cuts]

    def answer_bytes(self, model: LoadedModel) -> int:
        """Size of a tail answer for one sample (JSON, top 5), measured at start-up (0 before)."""
        return self._answer_bytes.get((model.name, model.version), 0)

    def _measure_answer(self, model: LoadedModel) -> int:
        first = model.cuts[0]
        rows = self.runner(model, 0)(np.zeros((1, *first.shape), dtype=np.float32))
        pattern_id = next(iter(model.patterns))
        return len(tail_json(plan_id=f"{model.name}@{model.version}/{pattern_id}", model=model.name,
                             version=model.version, rows=rows, top_k=5, queue_s=0.000123456789,
                             compute_s=0.000123456789, names=model.labels))

    def _measure_tails(self, model: LoadedModel, warmup: int = 2, repeats: int = 9,
                       min_seconds: float = TAIL_PROFILE_SECONDS) -> list[float]:
        # ElasticTrainer's profiler recipe (warm-up runs, then the median of timed ones), through
        # the worker pool as requests run (the hand-over to the thread and back is part of what a
        # request waits), in rounds that run every cut's tail in turn (models.timing): timed one
        # cut after another, a slow spell of the host fell on a few cuts only, and one extra
        # (server.tails.tail_times) cannot correct cuts that are wrong by different amounts. Seen in the
        # end-to-end grid at c416ed2: fmnist-mobilenet's tails at cuts 4 and 10 profiled at 12.6-13.7
        # and 10.2-11.3 ms where they took 5.1-5.5 and 4.7-5.1 ms, cut 0 within 1.4 ms.
        # Only the cuts that have patterns (ADR 0025: a pruned cut is never planned, its tail never run).
        calibrated = set(model.artifact.calibrated_cuts)
        timed = [c for c in model.cuts[:-1] if c.index in calibrated]
        fns = []
        for cut in timed:
            run = self.runner(model, cut.index)
            x = np.zeros((1, *cut.shape), dtype=np.float32)
            fns.append(functools.partial(lambda r, v: self._pool.submit(r, v).result(), run, x))
        times = dict(zip((c.index for c in timed),
                         interleaved_medians(fns, warmup=warmup, repeats=repeats, min_seconds=min_seconds),
                         strict=True))
        # the last cut has no tail; a cut without patterns keeps the calibration's figure (never priced)
        last = len(model.cuts) - 1
        return [times.get(c.index, 0.0 if c.index == last else model.artifact.cuts[c.index].server_tail_s)
                for c in model.cuts]

    def _record_batch(self, report: BatchReport[TailKey]) -> None:
        model, version, cut = report.key.model, report.key.version, report.key.cut
        self.tail_times.observe(model, version, cut, report.size, report.compute_s, idle_s=report.idle_s)
        # What plans price these samples at (batch-1 time each) against what they took: every
        # sample the tail ran, including v2 full-model requests (which share cut 0's batches) and
        # requests that then failed (non-finite logits) or whose client had gone.
        predicted = self.tail_seconds(self._run_models[report.key])[cut] * report.size
        m = self.metrics
        m.server_time_predicted.labels(model).inc(predicted)
        m.server_time_measured.labels(model).inc(report.compute_s)
        m.tail_extra.labels(model, version).set(self.tail_times.extra(model, version))
        m.tail_batch.labels(model).observe(report.size)
        m.tail_compute.labels(model).observe(report.compute_s)
        queued = m.tail_queue.labels(model)
        for q in report.queue_s:
            queued.observe(q)
