"""The device without PyTorch (ADR 0012): heads are ONNX segments run by ONNX Runtime.

Needs onnxruntime, numpy, httpx and pydantic (Pillow for image files): no torch, no safetensors, no
model code. A segment is checked (:func:`kernels.onnx_segment.check_onnx_segment`: digest, caps,
allow-list, and a work budget from the plan's declared head FLOPs, :func:`work_budget`) before the
cache keeps it and again before a session is created for it; its metadata must name the plan's
model, version, cut and pattern. Each run has a deadline from the segment's estimated work, past
which it is stopped and the segment evicted (ADR 0020). The activation is quantized with the numpy
kernels, so the packet is the one the torch device sends.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import replace

# ONNX Runtime 1.29 and later upload usage events to Microsoft on Linux too, and write a session file
# into $TMPDIR, unless this is set before it loads; a device sends nothing anywhere unasked
# (docs/guide/devices.md). Set it to 0 to let it.
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")

import numpy as np
import numpy.typing as npt
import onnxruntime as ort

from qpart.client.device import DeviceClient, HeadFunction
from qpart.client.errors import CACHE_HEALED, HeadDeadlineError, SegmentError, SegmentRefusedError
from qpart.client.plans import PlanResponse
from qpart.client.settings import DeviceSettings
from qpart.client.transport import Transport
from qpart.kernels import KernelError, WorkBudgetError
from qpart.kernels.onnx_segment import (
    INPUT_NAME,
    OUTPUT_NAME,
    HeadRuntime,
    OnnxSegmentInfo,
    OnnxSegmentLimits,
    check_onnx_segment,
)
from qpart.profiles.devices import DeviceProfile


def work_budget(plan: PlanResponse, settings: DeviceSettings) -> tuple[int, str]:
    """The most operations per sample an ONNX head of ``plan`` may ask for, and whence: the plan's
    declared head FLOPs times ``head_flops_margin``, never over ``head_max_flops`` (which is all a
    plan that declares none gets)."""
    cap = settings.head_max_flops
    capped = f"QPART_DEVICE_HEAD_MAX_FLOPS {cap:.3g}"
    if plan.head_flops is None:
        return cap, f"{capped}: the plan declares no head FLOPs"
    margin = settings.head_flops_margin
    declared = (f"the plan's declared head FLOPs {plan.head_flops:.3g} x QPART_DEVICE_HEAD_FLOPS_MARGIN "
                f"{margin:g}")
    budget = math.ceil(plan.head_flops * margin)
    return (budget, declared) if budget < cap else (cap, f"{capped}, under {declared}")


def check_segment(plan: PlanResponse, data: bytes, limits: OnnxSegmentLimits | None = None,
                  settings: DeviceSettings | None = None) -> OnnxSegmentInfo:
    """Check an ONNX segment's bytes against the plan before anything runs them; with ``settings``,
    its estimated work against :func:`work_budget` too (else the work cap of ``limits``).

    Raises:
        SegmentRefusedError: with the check's one-line reason.
    """
    seg = plan.segment
    if seg is None:
        raise SegmentRefusedError("the plan has no segment to check")
    limits, whence = limits or OnnxSegmentLimits(), "OnnxSegmentLimits.max_flops"
    if settings is not None:
        budget, whence = work_budget(plan, settings)
        limits = replace(limits, max_flops=min(limits.max_flops, budget))
    try:
        info = check_onnx_segment(data, seg.id, size_bytes=seg.size_bytes, limits=limits)
    except WorkBudgetError as exc:
        raise SegmentRefusedError(f"segment {seg.id[:12]} refused: {exc} ({whence})") from exc
    except KernelError as exc:
        raise SegmentRefusedError(f"segment {seg.id[:12]} refused: {exc}") from exc
    # The plan id is "model@version/pattern id" (server.api.responses); the exporter writes the
    # pattern id into the metadata (server.store.segments.build_onnx_segment).
    want = {"model": plan.model, "version": plan.version, "cut": str(plan.cut),
            "pattern_id": plan.plan_id.rsplit("/", 1)[-1]}
    got = {k: info.metadata.get(k, "") for k in want}
    if got != want:
        raise SegmentRefusedError(f"segment {seg.id[:12]} refused: it is for {got}, the plan for {want}")
    if info.inputs != (INPUT_NAME,) or info.outputs != (OUTPUT_NAME,):
        raise SegmentRefusedError(f"segment {seg.id[:12]} refused: its graph maps {info.inputs} to "
                                  f"{info.outputs}, not ('{INPUT_NAME}',) to ('{OUTPUT_NAME}',)")
    return info


def create_session(data: bytes, threads: int = 0) -> ort.InferenceSession:
    """An ONNX Runtime session for checked segment bytes, on the CPU (``threads`` 0: its default)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 4  # fatal only: a refusal is the one-line SegmentError, not a log
    # Bytes 4..7 b"ORTM" would make ONNX Runtime load them as an ORT-format (flatbuffer) model, not
    # the protobuf the check read; the check refuses them, and ONNX Runtime is told the format too.
    options.add_session_config_entry("session.load_model_format", "ONNX")
    try:
        return ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # Fail, InvalidGraph, InvalidProtobuf, NotImplemented, ...
        # ONNX Runtime's errors (onnxruntime_pybind11_state) derive from Exception itself, not from
        # RuntimeError or ValueError; only this call is inside the try.
        lines = str(exc).strip().splitlines() or [type(exc).__name__]
        raise SegmentError(f"ONNX Runtime cannot load the segment: {lines[0][:300]}") from exc


def _identity(x: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    return x


class OnnxDeviceRuntime(DeviceClient):
    """One device talking to one server, running heads with ONNX Runtime."""

    runtime = HeadRuntime.ONNX
    segment_cap_name = "OnnxSegmentLimits(max_bytes=...)"

    def __init__(self, settings: DeviceSettings, *, device: str | None = None,
                 device_profile: DeviceProfile | None = None, transport: Transport | None = None,
                 limits: OnnxSegmentLimits | None = None, threads: int = 0) -> None:
        super().__init__(settings, device=device, device_profile=device_profile, transport=transport)
        self.limits = limits or OnnxSegmentLimits()
        self.threads = threads

    def segment_check(self, plan: PlanResponse) -> Callable[[bytes], None]:
        """The ONNX check, run on the download before the cache keeps it."""

        def check(data: bytes) -> None:
            check_segment(plan, data, self.limits, self.settings)

        return check

    def segment_max_bytes(self) -> int:
        """The byte cap of :attr:`limits`, so an oversize segment is refused before it downloads."""
        return self.limits.max_bytes

    def load_head(self, plan: PlanResponse, segment: bytes | None) -> HeadFunction:
        """A session for the plan's segment, checked once more (the cache may be shared)."""
        if segment is None:
            if plan.cut != 0:
                raise SegmentError(f"the plan for cut {plan.cut} has no segment")
            return _identity
        info = check_segment(plan, segment, self.limits, self.settings)
        seg_id = plan.segment.id if plan.segment else ""
        try:
            session = create_session(segment, self.threads)
        except SegmentError as exc:  # passed the check, refused by ONNX Runtime: never from the cache again
            self.cache.discard(seg_id)
            raise SegmentError(f"{exc}; {CACHE_HEALED}") from exc

        def run(x: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
            deadline_s = self.head_deadline_s(info.flops, len(x))
            # ONNX Runtime has no deadline of its own: the flag, set from a timer, stops the run
            # before its next node (the work budget bounds what any one node can take).
            options = ort.RunOptions()
            timer = threading.Timer(deadline_s, setattr, (options, "terminate", True))
            timer.daemon = True
            started = time.monotonic()
            timer.start()
            try:
                out = session.run([OUTPUT_NAME], {INPUT_NAME: x}, options)[0]
            except Exception as exc:  # ORT's own errors derive from Exception only
                self.cache.discard(seg_id)
                if options.terminate:
                    raise self._deadline_error(seg_id, deadline_s, info.flops, len(x), "was stopped") from exc
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                raise SegmentError(f"ONNX Runtime could not run segment {seg_id[:12]} on an input of shape "
                                   f"{list(x.shape)}: {first[:300]}; {CACHE_HEALED}") from exc
            finally:
                timer.cancel()
            if time.monotonic() - started > deadline_s:  # its last node ran past it: no node followed
                self.cache.discard(seg_id)
                raise self._deadline_error(seg_id, deadline_s, info.flops, len(x), "its output was refused")
            return np.asarray(out, dtype=np.float32)

        return run

    def head_deadline_s(self, flops: int, samples: int) -> float:
        """The deadline of one head run: ``head_deadline_s``, plus ``samples`` times the segment's
        estimated operations per sample (``flops``) at ``head_min_flops_per_s``."""
        return self.settings.head_deadline_s + samples * flops / self.settings.head_min_flops_per_s

    def _deadline_error(self, seg_id: str, deadline_s: float, flops: int, samples: int,
                        outcome: str) -> HeadDeadlineError:
        return HeadDeadlineError(
            f"the ONNX head of segment {seg_id[:12]} ran past its deadline of {deadline_s:.3g} s on "
            f"{samples} samples (QPART_DEVICE_HEAD_DEADLINE_S {self.settings.head_deadline_s:g} + "
            f"{samples} x {flops:.3g} operations at QPART_DEVICE_HEAD_MIN_FLOPS_PER_S "
            f"{self.settings.head_min_flops_per_s:.3g}) and {outcome}; {CACHE_HEALED}")
