"""The device without PyTorch (ADR 0012): heads are ONNX segments run by ONNX Runtime.

Needs onnxruntime, numpy, httpx and pydantic (Pillow for image files): no torch, no safetensors, no
model code. A segment is checked (:func:`kernels.onnx_segment.check_onnx_segment`: digest, caps,
allow-list) before the cache keeps it and again before a session is created for it; its metadata
must name the plan's model, version, cut and pattern. The activation is quantized with the numpy
kernels, so the packet is the one the torch device sends.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt
import onnxruntime as ort

from qpart.client.device import DeviceClient, HeadFunction
from qpart.client.errors import CACHE_HEALED, SegmentError, SegmentRefusedError
from qpart.client.plans import PlanResponse
from qpart.client.settings import DeviceSettings
from qpart.client.transport import Transport
from qpart.kernels import KernelError
from qpart.kernels.onnx_segment import (
    INPUT_NAME,
    OUTPUT_NAME,
    HeadRuntime,
    OnnxSegmentInfo,
    OnnxSegmentLimits,
    check_onnx_segment,
)
from qpart.profiles.devices import DeviceProfile


def check_segment(plan: PlanResponse, data: bytes,
                  limits: OnnxSegmentLimits | None = None) -> OnnxSegmentInfo:
    """Check an ONNX segment's bytes against the plan before anything runs them.

    Raises:
        SegmentRefusedError: with the check's one-line reason.
    """
    seg = plan.segment
    if seg is None:
        raise SegmentRefusedError("the plan has no segment to check")
    try:
        info = check_onnx_segment(data, seg.id, size_bytes=seg.size_bytes, limits=limits)
    except KernelError as exc:
        raise SegmentRefusedError(f"segment {seg.id[:12]} refused: {exc}") from exc
    # The plan id is "model@version/pattern id" (server.responses); the exporter writes the
    # pattern id into the metadata (server.segments.build_onnx_segment).
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
            check_segment(plan, data, self.limits)

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
        check_segment(plan, segment, self.limits)
        seg_id = plan.segment.id if plan.segment else ""
        try:
            session = create_session(segment, self.threads)
        except SegmentError as exc:  # passed the check, refused by ONNX Runtime: never from the cache again
            self.cache.discard(seg_id)
            raise SegmentError(f"{exc}; {CACHE_HEALED}") from exc

        def run(x: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
            try:
                out = session.run([OUTPUT_NAME], {INPUT_NAME: x})[0]
            except Exception as exc:  # ORT's own errors derive from Exception only
                self.cache.discard(seg_id)
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                raise SegmentError(f"ONNX Runtime could not run segment {seg_id[:12]} on an input of shape "
                                   f"{list(x.shape)}: {first[:300]}; {CACHE_HEALED}") from exc
            return np.asarray(out, dtype=np.float32)

        return run
