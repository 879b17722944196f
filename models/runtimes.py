"""Which device runtimes can run a cut's head, decided once, at calibration (ADR 0019).

Each head is built in each runtime's form with its float tensors and checked as a device would:

- **torch**: the safetensors segment's tensors, 0-d buffers included, come back with the head's
  shapes (the device loads them by name into the head it builds from the model code);
- **onnx** (ONNX Runtime, and the browser page, which runs the same segment with onnxruntime-web):
  ``torch.onnx.export`` translates the head (:mod:`models.onnx_export`), the device's own check
  passes (:func:`kernels.onnx_segment.check_onnx_segment`: operator allow-list, static shapes and
  caps), and the segment's output at two batch sizes equals the torch head's (``onnxruntime`` is in
  the ``[offline]`` extra; where it is missing, that run is skipped with one warning).

A runtime that fails is recorded with its reason in the artifact
(:attr:`profiles.artifacts.CutProfile.runtimes_refused`); the planner never offers it that cut.
Cut 0 (no head) runs everywhere.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import importlib.util
import os
import re
import warnings

import numpy as np
import torch
from torch import fx

from qpart.kernels import KernelError
from qpart.kernels.onnx_segment import INPUT_NAME, OUTPUT_NAME, HeadRuntime, check_onnx_segment
from qpart.kernels.segment_format import SegmentHeader, decode_segment, encode_segment
from qpart.models.errors import PartitionError
from qpart.models.onnx_export import head_to_onnx
from qpart.models.partition import cuts_of, prepare, split

_BATCHES = (1, 3)
_NODE_PLACE = re.compile(r"node \d+ \((\w+) -> '[^']*'\)")  # how kernels.onnx_shapes names a node


def runtime_refusals(head: fx.GraphModule, input_shape: tuple[int, ...]) -> dict[str, str]:
    """Why each runtime cannot run ``head`` (a cut's head), by :class:`HeadRuntime` value; empty
    when every runtime can."""
    head = copy.deepcopy(head).cpu().eval()
    floats = {name: t.detach().numpy().astype(np.float32)
              for name, t in [*head.named_parameters(), *head.named_buffers()]}
    refused: dict[str, str] = {}
    torch_reason = _torch_refusal(head, floats)
    if torch_reason:
        refused[HeadRuntime.TORCH.value] = torch_reason
    onnx_reason = _onnx_refusal(head, input_shape, floats)
    if onnx_reason:
        refused[HeadRuntime.ONNX.value] = onnx_reason
    return refused


def refusals_by_cut(model: torch.nn.Module, input_shape: tuple[int, ...]) -> dict[str, dict[int, str]]:
    """Per runtime, the cuts of ``model`` it cannot run, each with why (what registration warns of;
    calibration records the same per cut)."""
    gm = prepare(model, input_shape)
    table: dict[str, dict[int, str]] = {runtime.value: {} for runtime in HeadRuntime}
    for cut in cuts_of(gm)[1:]:
        for runtime, reason in runtime_refusals(split(gm, cut)[0], input_shape).items():
            table[runtime][cut.index] = reason
    return table


def distinct_refusals(refused: dict[int, str], limit: int = 5) -> tuple[list[tuple[str, list[int]]], int]:
    """A runtime's refusals (cut -> why) grouped by reason, the node's place in the graph left out
    (one operator refused at many cuts is one reason): at most ``limit`` reasons, each with its
    cuts, in the order of their first cut; and how many more reasons there are."""
    cuts_by_reason: dict[str, list[int]] = {}
    for cut in sorted(refused):
        reason = _NODE_PLACE.sub(r"\1", refused[cut])
        cuts_by_reason.setdefault(reason, []).append(cut)
    reasons = list(cuts_by_reason.items())
    return reasons[:limit], max(0, len(reasons) - limit)


def _torch_refusal(head: fx.GraphModule, floats: dict[str, np.ndarray]) -> str | None:
    if not floats:
        return None
    try:
        segment = decode_segment(encode_segment(SegmentHeader("check", "check", 0, "check"), {}, floats))
    except KernelError as exc:
        return f"the head's tensors do not pack: {exc}"
    for name, array in floats.items():
        if segment.floats[name].shape != array.shape:
            return f"tensor '{name}' comes back as {segment.floats[name].shape}, not {array.shape}"
    return None


def _onnx_refusal(head: fx.GraphModule, input_shape: tuple[int, ...],
                  floats: dict[str, np.ndarray]) -> str | None:
    if not floats:
        return "a head without tensors has no segment for an ONNX device"
    try:
        data = head_to_onnx(head, input_shape, {}, floats, {}).SerializeToString(deterministic=True)
        check_onnx_segment(data, hashlib.sha256(data).hexdigest())
    except (PartitionError, KernelError) as exc:
        return " ".join(str(exc).split())[:300]
    if not onnxruntime_installed():
        return None
    return _run_refusal(head, input_shape, data)


@functools.cache
def onnxruntime_installed() -> bool:
    """Whether ``onnxruntime`` can be imported; where not, says once (a :class:`UserWarning`) that
    ONNX heads are checked without being run."""
    if importlib.util.find_spec("onnxruntime") is not None:
        return True
    warnings.warn("onnxruntime is not installed: each cut's ONNX head is exported and checked as a "
                  "device would, but not run against the torch head (install qpart-serving[offline], "
                  "which includes it)", UserWarning, stacklevel=3)
    return False


def _run_refusal(head: fx.GraphModule, input_shape: tuple[int, ...], data: bytes) -> str | None:
    """Run the segment with ONNX Runtime and compare it with the torch head."""
    # ONNX Runtime 1.29 and later upload usage events to Microsoft on Linux too, and write a session
    # file into $TMPDIR; this product sends nothing anywhere unasked (docs/guide/devices.md).
    os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
    import onnxruntime as ort  # noqa: PLC0415 (optional: an offline install without it checks less)

    options = ort.SessionOptions()
    options.log_severity_level = 3
    try:
        session = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # ONNX Runtime's errors derive from Exception only
        return f"ONNX Runtime does not load the segment: {str(exc).splitlines()[0][:200]}"
    generator = torch.Generator().manual_seed(0)
    for batch in _BATCHES:
        x = torch.randn((batch, *input_shape), generator=generator)
        with torch.no_grad():
            want = head(x).numpy()
        try:
            got = session.run([OUTPUT_NAME], {INPUT_NAME: x.numpy()})[0]
        except Exception as exc:  # as above
            return f"ONNX Runtime cannot run the segment: {str(exc).splitlines()[0][:200]}"
        scale = float(np.abs(want).max()) if want.size else 0.0
        if got.shape != want.shape or not np.allclose(got, want, rtol=1e-3, atol=1e-4 * max(1.0, scale)):
            return f"the ONNX head's output differs from the torch head's at batch {batch}"
    return None
