"""The device's side of a request, whatever runs the head: plan → segment → head → quantize the
activation (kernels) → upload → result. Imports neither torch nor model code: :mod:`client.runtime`
runs heads with PyTorch (ADR 0003), :mod:`client.onnx_runtime` with ONNX Runtime (ADR 0012).
"""

from __future__ import annotations

import functools
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self, TypeVar

import numpy as np
import numpy.typing as npt

from qpart.client.errors import CACHE_HEALED, SegmentError, ServerRejectedError
from qpart.client.image_offers import IMAGE_PNG, IMAGE_WEBP, ImageOffers  # the image plans' uploads
from qpart.client.inputs import read_image_files
from qpart.client.plans import (
    AUDIT_HEADER,
    AUDIT_SAMPLE_HEADER,
    ModelMetadata,
    PlanResponse,
    TailResponse,
    TailResult,
    parse_answer,
)
from qpart.client.segment_cache import SegmentCache
from qpart.client.settings import DeviceSettings
from qpart.client.transport import Transport
from qpart.client.uploads import audit_sample, encode_for_plan, upload_audit, upload_body
from qpart.kernels.coding import Coding
from qpart.kernels.onnx_segment import HeadRuntime
from qpart.profiles.devices import DeviceProfile

_T = TypeVar("_T")
NOT_MARKED = ("not marked: the server audits none (QPART_AUDIT_RATE 0) or did not draw this plan; an "
              "all-device or input-image plan is never audited")
"""What a consenting run reports when its plan carries no audit."""
DEFAULT_RATE_BPS = 10e6
MAX_UPLOAD_BATCH = 64

_HEAD_FAILURES = (RuntimeError, ValueError, IndexError, TypeError)
"""What torch raises when a head's tensors do not fit its code: a segment's own failure (ONNX Runtime's
errors are made :class:`SegmentError` where they happen, :mod:`client.onnx_runtime`)."""

HeadFunction = Callable[[npt.NDArray[np.float32]], npt.NDArray[np.float32]]
"""A head: float32 ``[N, *input_shape]`` → float32 ``[N, *activation_shape]``."""


@dataclass
class InferenceRun:
    """What one ``infer`` call did and how long each phase took."""

    plan: PlanResponse
    predictions: list[int] = field(default_factory=list)
    results: list[TailResult] = field(default_factory=list)
    timings_s: dict[str, float] = field(default_factory=dict)
    downloaded_bytes: int = 0
    uploaded_bytes: int = 0
    audit: str | None = None  # a live audit's upload (ADR 0024): queued, dropped, or failed: <why>


class DeviceClient:
    """One device talking to one server; a subclass says what runs the head (:attr:`runtime`)."""

    runtime = HeadRuntime.TORCH

    def __init__(self, settings: DeviceSettings, *, device: str | None = None,
                 device_profile: DeviceProfile | None = None, transport: Transport | None = None) -> None:
        self.settings = settings
        self.transport = transport or Transport(settings)
        self.cache = SegmentCache(settings.cache_dir, settings.cache_max_bytes, self.transport)
        self.device = device
        self.device_profile = device_profile
        self.image_offers = ImageOffers()  # what its input images cost to encode (ADR 0014, 0015)

    def close(self) -> None:
        """Release the HTTP connections."""
        self.transport.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        """Close on leaving a ``with`` block (the rate estimate is kept)."""
        self.close()

    def plan(self, model: str, demand: float, *, rate_bps: float | None = None, batch: int = 1,
             preset: str | None = None, deadline_s: float | None = None,
             input_image: dict[str, Any] | None = None) -> PlanResponse:
        """Ask for a plan; the rate is the fixed one, else the measured average, else 10 Mbit/s.
        ``input_image`` (``png_bytes``, ``width``, ``height``, ``encode_s``) offers the image itself
        (ADR 0014); a server from before that plan refuses the field (422), and is asked again
        without it."""
        body: dict[str, Any] = {
            "model": model, "accuracy_demand": demand, "batch": batch,
            "rate_bps": rate_bps or self.transport.rate.rate_bps or DEFAULT_RATE_BPS,
            "held_segments": [e.segment_id for e in self.cache.entries()][-256:],
        }
        if self.runtime is not HeadRuntime.TORCH:  # a server from before the field refuses it
            body["runtime"] = self.runtime.value
        offered = self._codings_measured(model)
        if offered == [Coding.DEFLATE]:  # understood by servers from before zstd (ADR 0005) too
            body["upload_deflate"] = True
        elif offered:  # only then: a server before compressed uploads refuses the field
            body["upload_codings"] = offered
        if self.device_profile is not None:
            body["device"] = self._inline_profile(self.device_profile)
        elif self.device is not None:
            body["device"] = self.device
        if preset is not None:
            body["weights"] = preset
        if deadline_s is not None:
            body["deadline_s"] = deadline_s
        if self.settings.audit:  # only then: the device consents to upload its input (ADR 0024)
            body["audit"] = True
        return self._ask(body, input_image)

    def _ask(self, body: dict[str, Any], input_image: dict[str, Any] | None) -> PlanResponse:
        """POST the plan request, offering ``input_image`` where given (again without it to a
        server that refuses the field)."""
        if input_image is not None:
            try:
                return self._asked({**body, "input_image": input_image})
            except ServerRejectedError as exc:
                if exc.status != 422 or "input_image" not in str(exc):
                    raise
        return self._asked(body)

    def _asked(self, body: dict[str, Any]) -> PlanResponse:
        try:
            return self._trusted(parse_answer(PlanResponse, self.transport.request(
                "POST", "/v1/plan", json=body).content))
        except ServerRejectedError as exc:
            if not body.get("audit") or exc.status != 422 or "audit" not in str(exc):
                raise
        # a server from before live audits (ADR 0024) refuses the field: asked again without it
        return self._asked({k: v for k, v in body.items() if k != "audit"})

    def _trusted(self, plan: PlanResponse) -> PlanResponse:
        """``plan``, once its URLs are on origins this device sends to (ADR 0020): the tail's on the
        server's own, the segment's there or on a trusted segment host.

        Raises:
            ForeignOriginError: before anything is downloaded, run or uploaded.
        """
        if plan.infer_url is not None:
            self.transport.check_url(plan.infer_url)
        if plan.segment is not None:
            self.transport.check_url(plan.segment.url, segment=True)
        if plan.audit is not None:
            if not self.settings.audit or plan.infer_url is None:  # never asked for: never sent
                return plan.model_copy(update={"audit": None})
            self.transport.check_url(plan.audit.url)  # the raw input goes to the server's own origin
        return plan

    def _inline_profile(self, profile: DeviceProfile) -> dict[str, Any]:
        """``profile`` as a plan request carries it: without the times of codings the settings do
        not offer, without defaults, and its coding times in schema 1's spelling
        (:meth:`~profiles.devices.MeasuredHeads.schema1_json`, ADR 0008), so a server from before a
        field (e.g. ``zstd_s``, ADR 0007) accepts it when the settings do not offer that coding."""
        offered = self.settings.upload_codings
        doc = profile.model_dump(mode="json", exclude_defaults=True)
        if profile.measured:
            doc["measured"] = {m: heads.offering_only(offered).schema1_json()
                               for m, heads in profile.measured.items()}
        return doc

    def _codings_measured(self, model: str) -> list[Coding]:
        """The upload codings the settings allow whose times the device profile carries for
        ``model`` (the planner prices no coding without them)."""
        measured = self.device_profile.measured.get(model) if self.device_profile else None
        if measured is None:
            return []
        return [c for c in self.settings.upload_codings if measured.coding_s.get(c)]

    def metadata(self, model: str) -> ModelMetadata:
        """The parameters of the server's ``/v2`` metadata for ``model``: the card's declarations."""
        url = f"/v2/models/{urllib.parse.quote(model, safe='')}"
        return parse_answer(ModelMetadata, self.transport.request("GET", url).content)

    def class_names(self, model: str) -> tuple[str, ...] | None:
        """The model card's class names in logit order, from the server's ``/v2`` metadata
        (None: the card names none)."""
        return self.metadata(model).labels

    def read_images(self, paths: list[Path], model: str) -> npt.NDArray[np.float32]:
        """Image files made into ``model``'s input batch by the preprocessing its card declares,
        as the server announces it in ``/v2`` metadata (a card without one: the reference models'
        28×28 grayscale in [0, 1]).

        Raises:
            DeviceInputError: a file is not a readable image, or the images come out in different
                shapes (a spec that resizes without a crop).
            ServerAnswerError: the announced preprocessing is not a valid spec.
        """
        return read_image_files(paths, self.metadata(model).input_spec)

    def infer_images(self, paths: list[Path], model: str, demand: float, *, rate_bps: float | None = None,
                     preset: str | None = None, deadline_s: float | None = None,
                     progress: Callable[[int, int], None] | None = None) -> InferenceRun:
        """:meth:`infer` on image files, preprocessed as ``model``'s card declares
        (:meth:`read_images`). One file, with ``offer_input_image`` set: the plan request offers
        the image itself as a PNG (ADR 0014), and where the planner prefers that, the PNG is
        uploaded and the server preprocesses it and runs the whole model."""
        images = self.read_images(paths, model)
        if len(paths) != 1 or not self.settings.offer_input_image:
            return self.infer(images, model, demand, rate_bps=rate_bps, preset=preset, deadline_s=deadline_s,
                              progress=progress)
        return self.infer_file(paths[0], images, model, demand, rate_bps=rate_bps, preset=preset,
                               deadline_s=deadline_s, progress=progress)

    def infer_file(self, path: Path, images: np.ndarray, model: str, demand: float, *,
                   rate_bps: float | None = None, preset: str | None = None, deadline_s: float | None = None,
                   progress: Callable[[int, int], None] | None = None) -> InferenceRun:
        """One image file (``images``: its model input, one row) with the image itself offered as
        a PNG (ADR 0014) and, where the server's calibration promises a WebP quality at a level no
        looser than ``demand``, as a WebP at the lowest such quality (ADR 0015): uploaded where the
        plan says so, else the plan is carried out on ``images``; a file no PNG can carry exactly
        (:func:`~qpart.client.inputs.png_of_file`) is not offered. After the first image of its
        size the offer is what those images came to, and the image is encoded only for an image
        plan (:class:`~qpart.client.image_offers.ImageOffers`)."""
        card = self.metadata(model)
        spec = card.input_spec
        quality = next((q for q, level in card.image_qualities if level <= demand), None)
        offer = self.image_offers.offer(path, model, spec, images[0], quality)
        if offer is None:  # no PNG of this file gives the server the same input: send the input
            return self.infer(images, model, demand, rate_bps=rate_bps, preset=preset, deadline_s=deadline_s,
                              progress=progress)
        t0 = time.perf_counter()
        plan = self.plan(model, demand, rate_bps=rate_bps, batch=1, preset=preset, deadline_s=deadline_s,
                         input_image=offer.doc)
        image_plan = plan.input_image_plan  # how far the image was from being sent: the next refresh
        self.image_offers.settle(offer, plan.predicted.objective,
                                 None if image_plan is None else image_plan.objective)
        if plan.upload_content_type not in (IMAGE_PNG, IMAGE_WEBP):
            return self._run(plan, images, t0, progress)
        planned = time.perf_counter()
        up_front = plan.upload_content_type in offer.bodies  # encoded before the plan request
        encoded = self.image_offers.body(offer, plan.upload_content_type, path, model, spec, images[0])
        if encoded is None:  # priced from earlier images of its size, but this file cannot go: its input
            return self.infer(images, model, demand, rate_bps=rate_bps, preset=preset, deadline_s=deadline_s,
                              progress=progress)
        body, encode_s = encoded
        run = InferenceRun(plan, audit=NOT_MARKED if self.settings.audit else None)
        t1 = time.perf_counter()  # after the encoding, where it came after the plan
        answer = self._post(plan, body, {"Content-Type": plan.upload_content_type})
        run.uploaded_bytes = len(body)
        run.results.extend(answer.results)
        run.predictions.extend(int(np.argmax(r.logits)) for r in answer.results)
        t2 = time.perf_counter()
        # the encoding is the device's work ("head"), counted once: before t0 when it came up front
        run.timings_s = {"plan": planned - t0, "download": 0.0, "head": encode_s, "upload_and_tail": t2 - t1,
                         "total": t2 - t0 + (encode_s if up_front else 0.0)}
        return run

    def fetch_segment(
        self, plan: PlanResponse, progress: Callable[[int, int], None] | None = None
    ) -> tuple[bytes | None, int]:
        """The plan's segment (cache or download) and the bytes downloaded for it.

        The download is held to the size the plan announces and to :meth:`segment_max_bytes`: a
        segment announced over the cap is refused before a byte is downloaded, and one that grows
        past either while it streams is stopped and refused (:class:`SegmentRefusedError`); neither
        leaves a file in the cache."""
        seg = plan.segment
        if seg is None:
            return None, 0
        fetched = self.cache.get(seg.id, seg.url, progress=progress, check=self.segment_check(plan),
                                 size_bytes=seg.size_bytes, max_bytes=self.segment_max_bytes(),
                                 raise_cap=self.segment_cap_name)
        return fetched.data, fetched.downloaded_bytes

    def segment_check(self, plan: PlanResponse) -> Callable[[bytes], None] | None:
        """What a downloaded segment must pass before the cache keeps it (None: the hash alone)."""
        return None

    segment_cap_name = "QPART_DEVICE_SEGMENT_MAX_BYTES"
    """What a refusal over :meth:`segment_max_bytes` tells the user to raise."""

    def segment_max_bytes(self) -> int | None:
        """The most bytes this device downloads for one segment (``segment_max_bytes``)."""
        return self.settings.segment_max_bytes

    def load_head(self, plan: PlanResponse, segment: bytes | None) -> HeadFunction:
        """The plan's head as a function of a float32 batch (subclasses run it somewhere)."""
        raise NotImplementedError

    def _healing(self, plan: PlanResponse, step: Callable[[], _T]) -> _T:
        """``step()`` (loading or running the plan's head); where the segment itself fails (it does
        not load, pass the check, fit the head, run, or make the plan's activation shape), it is
        deleted from the cache, so that it is never again announced as held nor loaded from there,
        and the error, of its own class, says so: one broken download does not break every later
        run. Any other failure (the model's code missing on this device, memory) leaves the cache
        as it is."""
        try:
            return step()
        except SegmentError as exc:
            if plan.segment is None or CACHE_HEALED in str(exc):
                raise
            self.cache.discard(plan.segment.id)
            raise type(exc)(f"{exc}; {CACHE_HEALED}") from exc
        except _HEAD_FAILURES as exc:
            if plan.segment is None:
                raise
            self.cache.discard(plan.segment.id)
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
            raise SegmentError(f"the head of segment {plan.segment.id[:12]} (cut {plan.cut}) failed: "
                               f"{first}; {CACHE_HEALED}") from exc

    @staticmethod
    def _run_head(plan: PlanResponse, head: HeadFunction,
                  batch: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """The head's activation of ``batch``, which must have the plan's activation shape."""
        out = head(batch)
        want = (len(batch), *plan.activation_shape)
        if tuple(out.shape) != want:
            segment = f"segment {plan.segment.id[:12]}" if plan.segment else "no segment"
            raise SegmentError(f"the head of cut {plan.cut} ({segment}) made an activation of shape "
                               f"{list(out.shape)}, not the plan's {list(want)}")
        return out

    def upload(self, plan: PlanResponse, packet: bytes) -> TailResponse:
        """POST the activation packet to the plan's tail (compressed if the plan says so) and return
        the server's result."""
        return self._post(plan, *upload_body(plan, packet))

    def _post(self, plan: PlanResponse, body: bytes, headers: dict[str, str]) -> TailResponse:
        return self._send(plan, body, headers)[0]

    def _send(self, plan: PlanResponse, body: bytes,
              headers: dict[str, str]) -> tuple[TailResponse, str | None]:
        """The tail's answer, and its ``Qpart-Audit-Sample`` header (which sample an audit checks)."""
        if plan.infer_url is None:
            raise ServerRejectedError(400, "all-device plan: nothing to upload")
        started = time.perf_counter()
        response = self.transport.request("POST", plan.infer_url, content=body, headers=headers)
        answer = parse_answer(TailResponse, response.content)
        # The channel's share of the round trip: the server reports its queue and compute time.
        server_s = answer.queue_s + answer.compute_s
        self.transport.rate.add(len(body), time.perf_counter() - started - server_s)
        return answer, response.headers.get(AUDIT_SAMPLE_HEADER)

    def infer(self, images: np.ndarray, model: str, demand: float, *, rate_bps: float | None = None,
              preset: str | None = None, deadline_s: float | None = None,
              progress: Callable[[int, int], None] | None = None) -> InferenceRun:
        """Classify ``images`` (float32 ``[N, *input_shape]``) with one plan and one segment."""
        t0 = time.perf_counter()
        plan = self.plan(model, demand, rate_bps=rate_bps, batch=len(images), preset=preset,
                         deadline_s=deadline_s)
        return self._run(plan, images, t0, progress)

    def _run(self, plan: PlanResponse, images: np.ndarray, t0: float,
             progress: Callable[[int, int], None] | None) -> InferenceRun:
        """A plan carried out on ``images``: segment, head, uploads (``t0``: when planning began)."""
        run = InferenceRun(plan)
        t1 = time.perf_counter()
        segment, run.downloaded_bytes = self.fetch_segment(plan, progress)
        t2 = time.perf_counter()
        head = self._healing(plan, lambda: self.load_head(plan, segment))
        head_s = time.perf_counter() - t2
        upload_s = 0.0
        audited: np.ndarray | None = None  # the sample the audit checks (its tail answer named it)
        asked = False  # the audit was named on a tail request
        step = min(MAX_UPLOAD_BATCH, plan.upload_batch or MAX_UPLOAD_BATCH)  # within the body limit
        for start in range(0, len(images), step):
            h0 = time.perf_counter()
            batch = np.ascontiguousarray(images[start : start + step], dtype=np.float32)
            act_np = self._healing(plan, functools.partial(self._run_head, plan, head, batch))
            h1 = time.perf_counter()
            head_s += h1 - h0
            if plan.infer_url is None:
                logits = act_np
                run.results.extend(TailResult(logits=row.tolist()) for row in logits)
            else:
                body, headers = upload_body(plan, encode_for_plan(act_np, plan))
                ticket = None if asked else plan.audit  # the plan's first tail request names it
                if ticket is not None:
                    headers[AUDIT_HEADER], asked = ticket.id, True
                run.uploaded_bytes += len(body)
                answer, sample = self._send(plan, body, headers)
                if ticket is not None:
                    audited = audit_sample(batch, sample)
                upload_s += time.perf_counter() - h1
                logits = np.array([r.logits for r in answer.results], dtype=np.float32)
                run.results.extend(answer.results)
            run.predictions.extend(int(i) for i in logits.argmax(1))
        run.timings_s = {"plan": t1 - t0, "download": t2 - t1, "head": head_s,
                         "upload_and_tail": upload_s, "total": time.perf_counter() - t0}
        if asked:  # after every answer: the audit never delays one
            run.audit = ("failed: the tail answer named no sample to audit" if audited is None
                         else upload_audit(self.transport, plan, audited))
        elif self.settings.audit:
            run.audit = NOT_MARKED
        return run
