"""The serving engine: plans requests and runs inference over the catalog, the segment index and the
tail pool; it knows no HTTP (the HTTP layer makes links and responses from its results)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from pydantic import SecretStr

from qpart.kernels.coding import Coding
from qpart.kernels.onnx_segment import HeadRuntime
from qpart.profiles.artifacts import Pattern
from qpart.profiles.costs import HTTP_EXCHANGE_BYTES, PlanInputs
from qpart.profiles.devices import DeviceProfile, get_device
from qpart.profiles.errors import ProfileError
from qpart.server.audit import Audits, Ticket
from qpart.server.errors import BadRequestError, NotFoundError, UnprocessableError
from qpart.server.metrics import Metrics
from qpart.server.planning.choice import SegmentOffer, ServerPrices, plan_request
from qpart.server.planning.image_plans import ImagePlans
from qpart.server.planning.images import INPUT_PNG, ImageTimes
from qpart.server.planning.planner import Candidate
from qpart.server.schemas import PRESETS, PlanRequest, WeightPreset
from qpart.server.settings import ServerSettings
from qpart.server.store.catalog import Catalog, LoadedModel, ModelEntry
from qpart.server.store.segment_index import SegmentEntry, SegmentIndex
from qpart.server.store.segments import CacheStats, SegmentStore
from qpart.server.tails.answers import TailAnswer
from qpart.server.tails.content import IDENTITY
from qpart.server.tails.decode_times import DecodeTimes
from qpart.server.tails.packets import decode_activation, packet_limit, upload_batch
from qpart.server.tails.tail_pool import TailPool

# Activation packets up to this size are decoded on the event loop: a few microseconds of work,
# where a hop to a worker thread costs a GIL handover (up to the 5 ms switch interval) each way.
_INLINE_DECODE_BYTES = 64 << 10


@dataclass(frozen=True)
class PlanChoice:
    """The plan chosen for a request, beside the all-server and all-device plans."""

    model: LoadedModel
    chosen: Candidate
    segment: SegmentEntry | None
    all_server: Candidate
    all_device: Candidate | None
    held: frozenset[str]
    image: Candidate | None = None  # the cheapest input-image plan the request's offer got
    upload_batch: int = 1  # the most samples one upload of the chosen pattern carries (body limit)
    lossless: bool = False  # every plan at the demand sends float32 (planner.only_lossless)
    audit: Ticket | None = None  # the plan is marked for a live audit (ADR 0024)


@dataclass(frozen=True)
class ModelView:
    """A model version's patterns with their segments, and its tail times on this server."""

    model: LoadedModel
    patterns: list[tuple[Pattern, SegmentEntry | None]]
    server_tail_s: list[float]
    answer_bytes: int
    server_decode_s: dict[str, list[float]]  # per upload coding, per cut: a sample's decoding
    upload_batch: dict[str, int] = field(default_factory=dict)  # per pattern id (body limit)


class Engine:
    """Owns the catalog, the segment index and the tail pool; every route calls one method."""

    def __init__(self, settings: ServerSettings, catalog: Catalog, store: SegmentStore,
                 metrics: Metrics) -> None:
        self.settings = settings
        self.catalog = catalog
        self.store = store
        self.metrics = metrics
        metrics.queue_limit.set(settings.max_queue)
        self.draining = False
        self.segments = SegmentIndex(catalog, store)
        self.tails = TailPool(settings, metrics)
        self.images = ImagePlans(settings)  # the input-image plans (ADR 0014, 0015)
        self.decodes = DecodeTimes()  # what decoding uploaded packets takes (server.tails.decode_times)
        # the promise watched on live traffic (ADR 0024): audits run in the tails' quiet gaps
        self.audits = Audits(settings, self.tails.idle_s, self.tails.went_idle)
        metrics.registry.register(self.audits.collector())

    # ---- lifecycle ------------------------------------------------------------------------

    def warm_up(self) -> None:
        """Index every pattern's segment (builds each once), time the tails, publish readiness.
        A pattern whose cut the torch runtime cannot run (``runtimes_refused``) has no segment to
        index: the planner never offers it, and the server starts."""
        for entry in self.catalog.entries:
            self.metrics.model_ready.labels(entry.name, entry.version).set(1 if entry.ready else 0)
            if entry.model is not None:
                for pattern in entry.model.artifact.patterns:
                    with contextlib.suppress(UnprocessableError):  # refused: the planner never offers it
                        self.segments.for_pattern(entry.model, pattern)
                self.tails.warm_up(entry.model)
                self._time_images(entry.model)

    def _time_images(self, model: LoadedModel) -> None:
        """Time decoding and preprocessing an input image of the model's input size (ADR 0014, 0015)."""
        self.images.time_model(model)

    @property
    def image_times(self) -> ImageTimes:
        """What decoding a PNG input image costs this server, per model version (ADR 0014)."""
        return self.images.png_times

    @property
    def ready(self) -> bool:
        """Ready when not draining, at least one model version can serve and no tail collector
        is down."""
        return self.not_ready_reason() is None

    def not_ready_reason(self, *, name_models: bool = True) -> str | None:
        """Why the server is not ready (None: it is); without ``name_models``, the reason counts
        the models it concerns instead of naming them (a caller who may not see model names)."""
        if self.draining:
            return "draining"
        stalled = self.tails.stalled_models()
        if stalled:
            which = ", ".join(sorted(stalled)) if name_models else f"{len(stalled)} model(s)"
            return f"tail inference of {which} is restarting"
        if not any(e.ready for e in self.catalog.entries):
            return "no model is ready"
        return None

    def stalled_models(self) -> set[str]:
        """Models one of whose tail collectors is down."""
        return self.tails.stalled_models()

    async def close(self) -> None:
        """Stop batch collectors and worker threads."""
        await self.tails.close()
        await asyncio.to_thread(self.audits.close)  # joins the worker: not on the event loop

    def tail_seconds(self, model: LoadedModel) -> list[float]:
        """Per cut, what a lone request's tail takes on this server now (:class:`TailPool`)."""
        return self.tails.tail_seconds(model)

    def decode_seconds(self, model: LoadedModel) -> dict[str, list[float]]:
        """Per upload coding (identity and each :class:`Coding`), per cut: what decoding one
        sample's packet takes on this server lately (:mod:`server.tails.decode_times`)."""
        return self.decodes.prices(model.name, model.version, len(model.cuts), list(Coding))

    # ---- models and planning --------------------------------------------------------------

    def model_info(self, name: str, version: str | None,
                   runtime: HeadRuntime = HeadRuntime.TORCH) -> ModelView:
        """Every pattern of a model version that ``runtime`` can run, with its segment in that
        runtime's form."""
        model = self.catalog.get(name, version)
        patterns = []
        for p in model.artifact.patterns:
            try:
                patterns.append((p, self.segments.for_pattern(model, p, runtime)))
            except UnprocessableError:
                continue  # not offered to that runtime (ADR 0019)
        return ModelView(model, patterns, self.tails.tail_seconds(model), self.tails.answer_bytes(model),
                         self.decode_seconds(model),
                         {p.pattern_id: upload_batch(self.settings, model, p) for p, _ in patterns})

    def _device(self, req: PlanRequest) -> DeviceProfile:
        if isinstance(req.device, DeviceProfile):
            return req.device
        try:
            return get_device(req.device)
        except ProfileError as exc:
            raise BadRequestError(str(exc)) from exc

    def plan(self, req: PlanRequest) -> PlanChoice:
        """Choose (cut, level) minimising the request's objective among admissible patterns."""
        started = time.perf_counter()
        model = self.catalog.get(req.model, req.version)
        device = self._device(req)
        weights = PRESETS[req.weights] if isinstance(req.weights, WeightPreset) else req.weights
        audit_bytes = self.audits.expected_bytes(model, HTTP_EXCHANGE_BYTES) if req.audit else 0.0
        inputs = PlanInputs(device, weights, req.rate_bps, device.rtt_s if req.rtt_s is None else req.rtt_s,
                            req.batch, self.settings.price_per_second, frozenset(req.held_segments),
                            upload_overlap_s=req.upload_overlap_s, upload_codings=req.offered_codings(),
                            upload_rate_bps=req.upload_rate_bps,
                            audit_bytes=audit_bytes)
        prices = ServerPrices(self.tails.tail_seconds(model), self.decode_seconds(model),
                              self.tails.answer_bytes(model))
        segments: dict[str, SegmentEntry | None] = {}

        def offer(pattern: Pattern) -> SegmentOffer | None:
            try:
                entry = segments[pattern.pattern_id] = self.segments.for_pattern(model, pattern, req.runtime)
            except UnprocessableError:
                return None  # the device's runtime cannot run this cut's head (ADR 0019)
            return (entry.segment_id, entry.size) if entry else (None, 0)

        images = self.images.candidates(model, req.input_image, req.accuracy_demand, req.batch, inputs,
                                        prices.tail_s[0], prices.answer_bytes)
        outcome = plan_request(model.artifact, req.accuracy_demand, req.deadline_s, inputs, prices, offer,
                               images)
        chosen = outcome.chosen
        pattern = chosen.pattern
        audited = (req.audit and pattern.pattern_id in model.patterns  # not an input-image plan
                   and pattern.cut < len(model.cuts) - 1)  # the server answers it (not all-device)
        choice = PlanChoice(model, chosen, segments.get(pattern.pattern_id), outcome.all_server,
                            outcome.all_device, inputs.held, outcome.image,
                            upload_batch(self.settings, model, pattern), outcome.lossless,
                            self.audits.issue(model, pattern) if audited else None)
        self.metrics.plan_duration.observe(time.perf_counter() - started)
        self.metrics.plans.labels(model.name, str(chosen.pattern.cut), str(chosen.pattern.level)).inc()
        self.metrics.plan_bytes.labels(model.name).observe(chosen.costs.transfer_bytes)
        return choice

    # ---- inference ------------------------------------------------------------------------

    def pattern_of(self, name: str, version: str, pattern_id: str) -> tuple[LoadedModel, Pattern]:
        """The model version and its pattern; NotFoundError naming what is missing."""
        model = self.catalog.get(name, version)
        pattern = model.patterns.get(pattern_id)
        if pattern is None:
            raise NotFoundError(f"model '{name}' version '{version}' has no pattern '{pattern_id}'")
        return model, pattern

    def packet_limit(self, model: LoadedModel, pattern: Pattern) -> int:
        """The largest activation packet a pattern's tail can take (what a coded body may inflate to)."""
        return packet_limit(self.settings, model, pattern)

    async def infer_tail(self, name: str, version: str, pattern_id: str, packet: bytes,
                         top_k: int = 5, decoded_s: float = 0.0, coding: str = IDENTITY,
                         audit: str | None = None) -> TailAnswer:
        """Run the tail of a plan's cut on an uploaded activation packet. The seconds decoding
        took, ``decoded_s`` (the body's Content-Encoding ``coding``, undone by the caller) plus the
        packet's dequantization, are the answer's ``decode_s`` and part of its ``compute_s``, as an
        input-image plan's decoding is (:meth:`infer_image`): server work, not transfer. Plans
        price it by what served packets took (:mod:`server.tails.decode_times`). ``audit``: the
        request's ``Qpart-Audit`` header: one of its samples is picked and its answer recorded for that
        audit (ADR 0024), and an id that names no open audit of this plan changes nothing."""
        model, pattern = self.pattern_of(name, version, pattern_id)
        started = time.perf_counter()
        if len(packet) <= _INLINE_DECODE_BYTES:  # microseconds: cheaper than a thread hop
            x = decode_activation(self.settings, model, pattern, packet)
        else:  # a large batch: keep the event loop free while it dequantizes
            x = await asyncio.to_thread(decode_activation, self.settings, model, pattern, packet)
        decode_s = decoded_s + time.perf_counter() - started
        self.decodes.observe(name, version, pattern.cut, coding, decode_s, int(x.shape[0]))
        rows, queue_s, compute_s = await self.tails.run(model, pattern.cut, x)
        if not rows.finite.all():
            raise UnprocessableError("the tail produced non-finite logits for this activation; "
                                     "its values are out of the range the model was calibrated on")
        sample = None if audit is None else self.audits.record(audit, name, version, pattern_id,
                                                                rows.order[:, 0])
        return TailAnswer(plan_id=f"{name}@{version}/{pattern_id}", model=name, version=version,
                          rows=rows, top_k=top_k, queue_s=queue_s, compute_s=compute_s + decode_s,
                          names=model.labels, decode_s=decode_s, audit_sample=sample)

    async def infer_image(self, name: str, version: str, body: bytes, top_k: int = 5,
                          pattern_id: str = INPUT_PNG) -> TailAnswer:
        """Run the whole model on an input image the device uploaded for an input-image plan (a PNG,
        ADR 0014, or a WebP, ADR 0015); the seconds decoding and preprocessing took are the answer's
        ``decode_s``, part of its ``compute_s``."""
        model = self.catalog.get(name, version)
        x, decode_s, waited = await self.images.decode(model, pattern_id, body)
        rows, queue_s, compute_s = await self.tails.run(model, 0, x)
        if not rows.finite.all():
            raise UnprocessableError("the model produced non-finite logits for this image")
        return TailAnswer(plan_id=f"{name}@{version}/{pattern_id}", model=name, version=version,
                          rows=rows, top_k=top_k, queue_s=queue_s + waited, compute_s=compute_s + decode_s,
                          names=model.labels, decode_s=decode_s)

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
        rows, _, _ = await self.tails.run(model, 0, np.ascontiguousarray(x, dtype=np.float32))
        logits = np.asarray(rows.logits, dtype=np.float32)  # the answer declares FP32
        if not rows.finite.all():
            raise UnprocessableError("the model produced non-finite logits for this input; "
                                     "inputs are expected in [0, 1]")
        return logits, model

    def audit_upload(self, audit_id: str, body: bytes) -> tuple[int, bool]:
        """An audit's raw input (the sample its answer named): checked against the answer it got and
        queued for the float model, off the hot path (ADR 0024). (samples, queued: False when dropped
        as the audit queue is full; counted)."""
        def top_one(model: LoadedModel) -> Callable[[np.ndarray], np.ndarray]:
            run = self.tails.runner(model, 0)  # the whole float model
            return lambda x: run(x).order[:, 0]

        return self.audits.upload(audit_id, body, self.catalog.get, top_one)

    # ---- what the routes read (they call these, never the engine's parts) ------------------

    @property
    def auth_token(self) -> SecretStr | None:
        """The bearer token the inference routes require (None: open)."""
        return self.settings.auth_token

    @property
    def max_body_bytes(self) -> int:
        """The largest request body a route accepts."""
        return self.settings.max_body_bytes

    def model_names(self) -> list[str]:
        """The served models' names."""
        return self.catalog.names()

    def known_model_names(self) -> frozenset[str]:
        """Every model name in the catalog, served or not (the metrics' model label)."""
        return self.catalog.known_names

    def model_versions(self, name: str) -> list[ModelEntry]:
        """The catalog's versions of model ``name`` (404 if it has none)."""
        return self.catalog.versions(name)

    def model_entry(self, name: str, version: str | None = None) -> ModelEntry:
        """A model version's catalog entry, served or not (404 if unknown)."""
        return self.catalog.entry(name, version)

    def model(self, name: str, version: str | None = None) -> LoadedModel:
        """A served model version (404 if unknown, 503 if it cannot serve)."""
        return self.catalog.get(name, version)

    def image_plan_model(self, name: str, version: str | None, pattern_id: str) -> LoadedModel:
        """The model behind an input-image plan, checked to offer ``pattern_id`` (404 if not)."""
        model = self.catalog.get(name, version)
        self.images.check_plan(model, pattern_id)
        return model

    def tail_queue_depth(self) -> int:
        """Tail samples waiting across every model and cut."""
        return sum(self.tails.batcher.depth().values())

    def segment(self, segment_id: str) -> tuple[bytes, SegmentEntry, bool]:
        """A head segment's bytes, its index entry and whether the cache held it."""
        return self.segments.segment(segment_id)

    def segment_entry(self, segment_id: str) -> SegmentEntry:
        """A head segment's index entry (its size), without building or caching it."""
        return self.segments.entry(segment_id)

    def count_segment_bytes(self, model: str, size_bytes: int) -> None:
        """Count ``size_bytes`` of model ``model``'s segment as sent."""
        self.metrics.segment_bytes.labels(model).inc(size_bytes)

    def observe_segment_stream(self, seconds: float) -> None:
        """Record how long one segment download streamed."""
        self.metrics.segment_stream.observe(seconds)

    def set_cache_budget(self, budget_bytes: int) -> CacheStats:
        """Change the segment cache's byte budget (shrinking evicts at once); its stats after."""
        self.store.set_budget(budget_bytes)
        return self.store.stats()
