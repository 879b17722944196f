"""The serving engine: planning, segments and tail inference, with no knowledge of HTTP."""

from __future__ import annotations

import asyncio
import copy
import hashlib
import math
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch
from torch import fx

from kernels import KernelError
from kernels.wire import decode_activation_array, float_packet_bytes
from models.partition import split
from profiles.artifacts import Pattern
from profiles.devices import DeviceProfile, get_device
from profiles.errors import ProfileError
from server.answers import TailAnswer, TailRows, tail_json, tail_rows
from server.batching import Batcher, BatchReport
from server.catalog import Catalog, LoadedModel
from server.errors import (
    BadRequestError,
    DeadlineExceededError,
    NotFoundError,
    UnprocessableError,
)
from server.metrics import Metrics
from server.planner import (
    Candidate,
    PlanInputs,
    allowed_patterns,
    best_at_cut,
    choose,
    price_options,
)
from server.schemas import (
    PRESETS,
    ModelInfo,
    PatternInfo,
    PlanRequest,
    PlanResponse,
    SegmentRef,
    WeightPreset,
)
from server.segments import SegmentStore, build_segment
from server.settings import ServerSettings
from server.tail_times import TailTimes

# Activation packets up to this size are decoded on the event loop: a few microseconds of work,
# where a hop to a worker thread costs a GIL handover (up to the 5 ms switch interval) each way.
_INLINE_DECODE_BYTES = 64 << 10


@dataclass(frozen=True)
class TailKey:
    """What tail requests batch by: one model version's tail from one cut."""

    model: str
    version: str
    cut: int

    def __str__(self) -> str:
        return f"{self.model}@{self.version}/c{self.cut}"


@dataclass(frozen=True)
class SegmentIndex:
    """Where a pattern's segment is: its content id and size."""

    segment_id: str
    size: int
    model: str
    version: str
    pattern_id: str


def _require_finite(candidates: list[Candidate]) -> None:
    """Every predicted number must be finite (JSON has no infinity: it would be sent as null)."""
    for c in candidates:
        t, e = c.costs.time_s, c.costs.energy_j
        numbers = (t.local, t.transfer, t.server, t.total, e.local, e.transfer, e.total,
                   c.costs.server_cost, c.costs.objective)
        if not all(math.isfinite(x) for x in numbers):
            raise BadRequestError(
                f"the plan for cut {c.pattern.cut} prices to a non-finite number: the request's "
                "rate_bps, weights or device profile figures are too large")


class Engine:
    """Owns the catalog, the segment store and the batcher; every route calls one method."""

    def __init__(self, settings: ServerSettings, catalog: Catalog, store: SegmentStore,
                 metrics: Metrics) -> None:
        self.settings = settings
        self.catalog = catalog
        self.store = store
        self.metrics = metrics
        self.draining = False
        torch.set_num_threads(settings.torch_threads)
        self._pool = ThreadPoolExecutor(settings.tail_workers, thread_name_prefix="tail")
        self.batcher: Batcher[TailKey, TailRows] = Batcher(
            self._pool, max_batch=settings.max_batch_size, max_delay_s=settings.max_queue_delay_s,
            max_queue=settings.max_queue, retry_after_s=settings.retry_after_s, on_batch=self._record_batch)
        self._by_pattern: dict[tuple[str, str, str], SegmentIndex | None] = {}
        self._by_segment: dict[str, SegmentIndex] = {}
        self._runs: dict[TailKey, Callable[[np.ndarray], TailRows]] = {}
        self._run_models: dict[TailKey, LoadedModel] = {}  # batch key -> its model, for the batch metrics
        self._graphs: dict[tuple[str, str], fx.GraphModule] = {}
        self.tail_times = TailTimes()
        self._answer_bytes: dict[tuple[str, str], int] = {}

    # ---- lifecycle ------------------------------------------------------------------------

    def warm_up(self) -> None:
        """Index every pattern's segment (builds each once) and publish readiness metrics."""
        for entry in self.catalog.entries:
            self.metrics.model_ready.labels(entry.name, entry.version).set(1 if entry.ready else 0)
            if entry.model is not None:
                for pattern in entry.model.artifact.patterns:
                    self._segment_for(entry.model, pattern)
                with torch.inference_mode():
                    self.tail_times.set_profile(entry.name, entry.version, self._measure_tails(entry.model))
                self._answer_bytes[(entry.name, entry.version)] = self._measure_answer(entry.model)

    @property
    def ready(self) -> bool:
        """Ready when not draining, at least one model version can serve and no tail collector
        is down."""
        return self.not_ready_reason() is None

    def not_ready_reason(self) -> str | None:
        """Why the server is not ready (None: it is)."""
        if self.draining:
            return "draining"
        stalled = self.stalled_models()
        if stalled:
            return f"tail inference of {', '.join(sorted(stalled))} is restarting"
        if not any(e.ready for e in self.catalog.entries):
            return "no model is ready"
        return None

    def stalled_models(self) -> set[str]:
        """Models one of whose tail collectors is down (restarted at once; readiness says so)."""
        return {key.model for key in self.batcher.stalled()}

    async def close(self) -> None:
        """Stop batch collectors and worker threads."""
        await self.batcher.close()
        self._pool.shutdown(wait=True)

    # ---- segments -------------------------------------------------------------------------

    def _segment_for(self, model: LoadedModel, pattern: Pattern) -> SegmentIndex | None:
        key = (model.name, model.version, pattern.pattern_id)
        if key not in self._by_pattern:
            head = model.parts[pattern.cut][0]
            if not list(head.parameters()) and not list(head.buffers()):
                self._by_pattern[key] = None
            else:
                data = build_segment(head, model.name, model.version, pattern)
                digest = hashlib.sha256(data).hexdigest()
                index = SegmentIndex(digest, len(data), model.name, model.version, pattern.pattern_id)
                self._by_pattern[key] = index
                self._by_segment[digest] = index
                self.store.put(digest, data)
        return self._by_pattern[key]

    def segment_index(self, segment_id: str) -> SegmentIndex:
        """Where a segment comes from and its size, without building or caching it."""
        index = self._by_segment.get(segment_id)
        if index is None:
            raise NotFoundError(f"no segment with id '{segment_id}'; ask for a plan to get a segment id")
        return index

    def segment(self, segment_id: str) -> tuple[bytes, SegmentIndex, bool]:
        """The bytes of a segment by content id (from the cache or rebuilt and verified), its
        index entry, and whether the cache held it."""
        index = self.segment_index(segment_id)
        model = self.catalog.get(index.model, index.version)
        pattern = model.patterns[index.pattern_id]
        head = model.parts[pattern.cut][0]
        data, hit = self.store.lookup(
            segment_id, lambda: build_segment(head, model.name, model.version, pattern))
        return data, index, hit

    def model_info(self, name: str, version: str | None) -> ModelInfo:
        """Every pattern of a model version with its segment reference."""
        model = self.catalog.get(name, version)
        base = self.settings.public_url.rstrip("/")
        patterns = []
        for p in model.artifact.patterns:
            index = self._segment_for(model, p)
            ref = None if index is None else SegmentRef(
                id=index.segment_id, url=f"{base}/v1/segments/{index.segment_id}", size_bytes=index.size,
                sha256=index.segment_id, held=False)
            patterns.append(PatternInfo(
                pattern_id=p.pattern_id, cut=p.cut, cut_node=model.cuts[p.cut].node, level=p.level,
                weight_bits=p.weight_bits, activation_bits=p.activation_bits, group_size=p.group_size,
                test_drop=p.test_drop, segment=ref, infer_url=self._infer_url(model, p)))
        levels = sorted({p.level for p in model.artifact.patterns})
        return ModelInfo(model=model.name, version=model.version, cuts=len(model.cuts), levels=levels,
                         server_tail_s=self.tail_seconds(model), answer_bytes=self.answer_bytes(model),
                         patterns=patterns)

    # ---- planning -------------------------------------------------------------------------

    def _device(self, req: PlanRequest) -> DeviceProfile:
        if isinstance(req.device, DeviceProfile):
            return req.device
        try:
            return get_device(req.device)
        except ProfileError as exc:
            raise BadRequestError(str(exc)) from exc

    def plan(self, req: PlanRequest) -> PlanResponse:
        """Choose (cut, level) minimising the request's objective among admissible patterns."""
        started = time.perf_counter()
        model = self.catalog.get(req.model, req.version)
        device = self._device(req)
        weights = PRESETS[req.weights] if isinstance(req.weights, WeightPreset) else req.weights
        inputs = PlanInputs(device, weights, req.rate_bps, device.rtt_s if req.rtt_s is None else req.rtt_s,
                            req.batch, self.settings.price_per_second, frozenset(req.held_segments),
                            upload_overlap_s=req.upload_overlap_s, upload_codings=req.offered_codings(),
                            upload_rate_bps=req.upload_rate_bps)
        candidates = []
        tail_s = self.tail_seconds(model)
        answer = self.answer_bytes(model)
        for pattern in allowed_patterns(model.artifact, req.accuracy_demand):
            index = self._segment_for(model, pattern)
            seg_id, size = (index.segment_id, index.size) if index else (None, 0)
            # Raw and compressed uploads are separate candidates: the cheaper one may miss a
            # deadline the other meets (compressing can save energy and cost time).
            tail = tail_s[pattern.cut]
            options = price_options(model.artifact, pattern, seg_id, size, inputs, tail, answer)
            candidates += [Candidate(pattern, seg_id, size, costs) for costs in options]
        _require_finite(candidates)
        chosen = choose(candidates, req.deadline_s)
        last = len(model.cuts) - 1
        response = self._plan_response(model, chosen, best_at_cut(candidates, 0),
                                       best_at_cut(candidates, last), inputs)
        self.metrics.plan_duration.observe(time.perf_counter() - started)
        self.metrics.plans.labels(model.name, str(chosen.pattern.cut), str(chosen.pattern.level)).inc()
        self.metrics.plan_bytes.labels(model.name).observe(chosen.costs.transfer_bytes)
        return response

    def _infer_url(self, model: LoadedModel, pattern: Pattern) -> str | None:
        if pattern.cut == len(model.cuts) - 1:
            return None
        base = self.settings.public_url.rstrip("/")
        return f"{base}/v1/models/{model.name}/versions/{model.version}/patterns/{pattern.pattern_id}/infer"

    def _plan_response(self, model: LoadedModel, chosen: Candidate, server: Candidate,
                       device: Candidate, inputs: PlanInputs) -> PlanResponse:
        p = chosen.pattern
        base = self.settings.public_url.rstrip("/")
        segment = None
        if chosen.segment_id is not None:
            segment = SegmentRef(id=chosen.segment_id, url=f"{base}/v1/segments/{chosen.segment_id}",
                                 size_bytes=chosen.segment_bytes, sha256=chosen.segment_id,
                                 held=chosen.segment_id in inputs.held)
        infer = self._infer_url(model, p)
        return PlanResponse(
            plan_id=f"{model.name}@{model.version}/{p.pattern_id}", model=model.name,
            version=model.version, cut=p.cut, cut_node=model.cuts[p.cut].node, cuts=len(model.cuts),
            level=p.level, weight_bits=p.weight_bits, activation_bits=p.activation_bits,
            group_size=p.group_size, activation_shape=list(model.cuts[p.cut].shape),
            predicted=chosen.costs, all_server=server.costs, all_device=device.costs,
            segment=segment, infer_url=infer,
            upload_encoding=chosen.costs.upload_encoding,
        )

    # ---- inference ------------------------------------------------------------------------

    def _runner(self, model: LoadedModel, cut: int) -> Callable[[np.ndarray], TailRows]:
        """The batch function of one (model, cut), built once per key.

        Tails run on a copy of the model (heads share its parameters, and segments are built from
        those) whose 4-D weights are in channels-last memory format, as are 4-D activations:
        oneDNN's convolutions run faster on it, and more so on batches (measured on the CNN, one
        thread: 837 -> 661 us at batch 1, 696 -> 392 us per sample at batch 32; the ResNet
        unchanged). One copy per model version; every cut's tail is split from it.
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

    def tail_seconds(self, model: LoadedModel) -> list[float]:
        """Per cut, what a lone request's tail takes on this server now: the batch-1 times measured
        at start-up (warm_up) through the worker pool, plus what lone requests took beyond them
        lately (:mod:`server.tail_times`).

        The artifact's ``server_tail_s`` was measured where the calibration ran, with the plain
        float tail; planning uses what this machine and this runner take. Falls back to the
        artifact's figures for a model not warmed up. Prices use compute only, not queueing.
        """
        live = self.tail_times.seconds(model.name, model.version)
        return live if live is not None else [c.server_tail_s for c in model.artifact.cuts]

    def answer_bytes(self, model: LoadedModel) -> int:
        """Size of a tail answer for one sample (JSON, top 5), measured at start-up (0 before)."""
        return self._answer_bytes.get((model.name, model.version), 0)

    def _measure_answer(self, model: LoadedModel) -> int:
        first = model.cuts[0]
        rows = self._runner(model, 0)(np.zeros((1, *first.shape), dtype=np.float32))
        pattern_id = next(iter(model.patterns))
        return len(tail_json(plan_id=f"{model.name}@{model.version}/{pattern_id}", model=model.name,
                             version=model.version, rows=rows, top_k=5, queue_s=0.000123456789,
                             compute_s=0.000123456789))

    def _measure_tails(self, model: LoadedModel, warmup: int = 2, repeats: int = 7) -> list[float]:
        # ElasticTrainer's profiler recipe: a few warm-up runs, then the median of timed ones.
        # Timed through the tail worker pool, as requests run: the hand-over to the worker thread
        # and back is part of what a request waits (measured here: a 0.66 ms tail reported as
        # 1.3 ms of compute under requests).
        times = []
        for cut in model.cuts[:-1]:
            run = self._runner(model, cut.index)
            x = np.zeros((1, *cut.shape), dtype=np.float32)
            for _ in range(warmup):
                self._pool.submit(run, x).result()
            samples = []
            for _ in range(repeats):
                start = time.perf_counter()
                self._pool.submit(run, x).result()
                samples.append(time.perf_counter() - start)
            times.append(float(np.median(samples)))
        return [*times, 0.0]  # the last cut has no tail

    async def _run_tail(self, model: LoadedModel, cut: int, x: np.ndarray) -> tuple[TailRows, float, float]:
        # While draining, readiness is 503 so balancers stop routing here, but requests that still
        # arrive are served: nothing accepted is dropped.
        key = TailKey(model.name, model.version, cut)
        run = self._runner(model, cut)
        try:
            async with asyncio.timeout(self.settings.request_timeout_s):
                return await self.batcher.submit(key, run, x)
        except TimeoutError as exc:
            raise DeadlineExceededError(
                f"tail inference took longer than {self.settings.request_timeout_s} s") from exc

    async def infer_tail(self, name: str, version: str, pattern_id: str, packet: bytes,
                         top_k: int = 5) -> TailAnswer:
        """Run the tail of a plan's cut on an uploaded activation packet."""
        model, pattern = self.pattern_of(name, version, pattern_id)
        if len(packet) <= _INLINE_DECODE_BYTES:  # microseconds: cheaper than a thread hop
            x = self.decode_for(model, pattern, packet)
        else:  # a large batch: keep the event loop free while it dequantizes
            x = await asyncio.to_thread(self.decode_for, model, pattern, packet)
        rows, queue_s, compute_s = await self._run_tail(model, pattern.cut, x)
        if not rows.finite.all():
            raise UnprocessableError("the tail produced non-finite logits for this activation; "
                                     "its values are out of the range the model was calibrated on")
        return TailAnswer(plan_id=f"{name}@{version}/{pattern_id}", model=name, version=version,
                          rows=rows, top_k=top_k, queue_s=queue_s, compute_s=compute_s)

    def pattern_of(self, name: str, version: str, pattern_id: str) -> tuple[LoadedModel, Pattern]:
        """The model version and its pattern; NotFoundError naming what is missing."""
        model = self.catalog.get(name, version)
        pattern = model.patterns.get(pattern_id)
        if pattern is None:
            raise NotFoundError(f"model '{name}' version '{version}' has no pattern '{pattern_id}'")
        return model, pattern

    def packet_limit(self, model: LoadedModel, pattern: Pattern) -> int:
        """The largest activation packet ``decode_for`` can take for this pattern (float32 at the
        queue's sample limit), within the body limit: what a coded (deflate or zstd) body may inflate to."""
        largest = float_packet_bytes((self.settings.max_queue, *model.cuts[pattern.cut].shape))
        return min(largest, self.settings.max_body_bytes)

    def decode_for(self, model: LoadedModel, pattern: Pattern, packet: bytes) -> np.ndarray:
        """Decode an activation packet and check it matches the pattern's cut, bits and groups."""
        if pattern.cut == len(model.cuts) - 1:
            raise BadRequestError("this plan is all-device (last cut): there is no tail to run")
        want = tuple(model.cuts[pattern.cut].shape)
        # Bound the decoded size by what the plan can ever need, before anything is allocated.
        limit = self.settings.max_queue * max(1, model.cuts[pattern.cut].numel)
        try:
            x, bits, group = decode_activation_array(packet, max_elements=limit)
        except KernelError as exc:
            raise BadRequestError(f"invalid activation packet: {exc}") from exc
        if not np.isfinite(x).all():
            raise BadRequestError("the activation dequantizes to values beyond float32 (check scales)")
        if tuple(x.shape[1:]) != want or not 1 <= x.shape[0] <= self.settings.max_queue:
            dims = ", ".join(map(str, want))
            raise BadRequestError(f"activation shape {list(x.shape)} does not fit cut {pattern.cut}: "
                                  f"expected [batch, {dims}] with 1 <= batch <= "
                                  f"{self.settings.max_queue} (QPART_MAX_QUEUE)")
        if bits != pattern.activation_bits or (bits != 32 and group != pattern.group_size):
            raise BadRequestError(f"activation quantized with {bits} bits / group {group}; the plan "
                                  f"requires {pattern.activation_bits} bits / group {pattern.group_size}")
        return x

    async def infer_full(
        self, name: str, version: str | None, x: np.ndarray
    ) -> tuple[np.ndarray, LoadedModel]:
        """Run the whole float model (the tail of cut 0) on a batch of inputs."""
        model = self.catalog.get(name, version)
        want = tuple(model.artifact.input_shape)
        if x.ndim != len(want) + 1 or tuple(x.shape[1:]) != want:
            raise BadRequestError(f"input shape {list(x.shape)} does not fit model '{name}': "
                                  f"expected [batch, {', '.join(map(str, want))}]")
        if x.shape[0] == 0:
            raise BadRequestError(f"input shape {list(x.shape)} has batch 0: send at least one sample")
        if not np.isfinite(x).all():
            raise BadRequestError("input holds NaN or infinity")
        rows, _, _ = await self._run_tail(model, 0, np.ascontiguousarray(x, dtype=np.float32))
        logits = np.asarray(rows.logits, dtype=np.float32)  # the answer declares FP32
        if not rows.finite.all():
            raise UnprocessableError("the model produced non-finite logits for this input; "
                                     "inputs are expected in [0, 1]")
        return logits, model

    def _record_batch(self, report: BatchReport[TailKey]) -> None:
        model, version, cut = report.key.model, report.key.version, report.key.cut
        self.tail_times.observe(model, version, cut, report.size, report.compute_s)
        # What plans price these samples at (batch-1 time each) against what they took: every
        # sample the tail ran, including v2 full-model requests (which share cut 0's batches) and
        # requests that then failed (non-finite logits) or whose client had gone.
        predicted = self.tail_seconds(self._run_models[report.key])[cut] * report.size
        self.metrics.server_time_predicted.labels(model).inc(predicted)
        self.metrics.server_time_measured.labels(model).inc(report.compute_s)
        self.metrics.tail_extra.labels(model, version).set(self.tail_times.extra(model, version))
        self.metrics.tail_batch.labels(model).observe(report.size)
        self.metrics.tail_compute.labels(model).observe(report.compute_s)
        queued = self.metrics.tail_queue.labels(model)
        for q in report.queue_s:
            queued.observe(q)

