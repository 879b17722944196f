"""QPART routes (``/v1``): plan, segment download, tail inference, cache budget. Thin over the engine;
the tail route's work is in :mod:`server.api.inference`, which the fast path shares."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from qpart.kernels.coding import Coding
from qpart.kernels.onnx_segment import HeadRuntime
from qpart.server.api import paths
from qpart.server.api.deps import (
    EngineDep,
    LinksDep,
    read_body,
    require_admin,
    require_model_token,
    require_token,
)
from qpart.server.api.inference import audit_upload_response, tail_infer_response
from qpart.server.api.limits import MODEL_STATE_KEY
from qpart.server.api.responses import model_info_response, plan_response
from qpart.server.errors import RangeNotSatisfiableError
from qpart.server.schemas import (
    AUDIT_HEADER,
    AUDIT_ID,
    SHA256_HEX,
    AuditReceipt,
    ErrorBody,
    JsonInt,
    ModelInfo,
    PlanRequest,
    PlanResponse,
    TailResponse,
)

router = APIRouter()
_ERRORS: dict[int | str, dict[str, object]] = {
    s: {"model": ErrorBody} for s in (400, 401, 404, 413, 422, 503, 504)}
_CHUNK = 64 * 1024
_RANGE = re.compile(r"[ \t]*bytes[ \t]*=[ \t]*(\d*)-(\d*)[ \t]*", re.IGNORECASE)
TOP_K_DEFAULT = 5
TOP_K_MAX = 1000


@router.post(paths.PLAN.template, response_model=PlanResponse, responses=_ERRORS,
             dependencies=[Depends(require_token)], summary="Plan a request: cut, bits, costs")
async def plan(body: PlanRequest, engine: EngineDep, links: LinksDep, request: Request) -> PlanResponse:
    """Choose the cut and bit pattern that minimise the weighted time/energy/cost for this device."""
    setattr(request.state, MODEL_STATE_KEY, body.model)  # the requests metric's model label
    # Plain CPU work of about a millisecond that holds the GIL: a worker thread would not let the
    # event loop run meanwhile, only add a thread handover per request. Same for the routes below.
    return plan_response(engine.plan(body), links)


@router.get(paths.MODEL_INFO.template, response_model=ModelInfo, responses=_ERRORS,
            dependencies=[Depends(require_model_token)], summary="A model's patterns and their segments")
async def model_info(model: str, engine: EngineDep, links: LinksDep,
                     version: Annotated[str | None, Query(max_length=64)] = None,
                     runtime: Annotated[HeadRuntime, Query(description="The segments' form: 'torch' "
                                                           "(default) or 'onnx' (ADR 0012).")]
                     = HeadRuntime.TORCH) -> ModelInfo:
    """Every precomputed (cut, level) pattern of the newest (or given) version, with segment links
    in ``runtime``'s form (what a prefetching device of that runtime downloads)."""
    return model_info_response(engine.model_info(model, version, runtime), links)


def _position(digits: str, size: int) -> int:
    """A Range position, capped at ``size`` (every position past the end means the same).

    int() refuses strings of more than 4300 digits (CVE-2020-10735) with a ValueError, which
    was a 500 for a Range like ``bytes=999…9-``: numbers longer than ``size`` are capped unread.
    """
    digits = digits.lstrip("0") or "0"
    return size if len(digits) > len(str(size)) else min(int(digits), size)


def _less(a: str, b: str) -> bool:
    """Whether the decimal ``a`` is below ``b``, however long either is."""
    a, b = a.lstrip("0") or "0", b.lstrip("0") or "0"
    return (len(a), a) < (len(b), b)


def _parse_range(header: str, size: int) -> tuple[int, int] | None:
    """The one byte range a ``Range`` field asks for, or None to ignore the field (RFC 9110
    14.2): another unit, several ranges (no multipart answers here), or invalid syntax, which a
    server may ignore, sending the whole segment. The unit's name is case-insensitive.

    Raises:
        RangeNotSatisfiableError: one well-formed range that does not overlap the segment (416).
    """
    match = _RANGE.fullmatch(header)
    if not match or match.groups() == ("", ""):
        return None
    start_s, end_s = match.groups()
    if start_s == "":  # the last N bytes
        suffix = _position(end_s, size)
        if suffix == 0:
            raise RangeNotSatisfiableError("a suffix Range of 0 bytes selects nothing")
        return size - suffix, size - 1
    if end_s and _less(end_s, start_s):  # last < first: invalid, so ignored
        return None
    start = _position(start_s, size)
    if start >= size:
        raise RangeNotSatisfiableError(f"the Range starts past the segment's {size} bytes")
    return start, (min(_position(end_s, size), size - 1) if end_s else size - 1)


def _chunks(data: bytes, start: int, end: int, sent: Callable[[int], None],
            done: Callable[[], None]) -> Iterator[bytes]:
    """The range in chunks; bytes are counted as they go and the stream time at the end."""
    view = memoryview(data)
    for pos in range(start, end + 1, _CHUNK):
        chunk = bytes(view[pos : min(pos + _CHUNK, end + 1)])
        yield chunk
        sent(len(chunk))
    done()


_SEGMENT_RESPONSES: dict[int | str, dict[str, Any]] = {**_ERRORS, 206: {}, 304: {}, 416: {"model": ErrorBody}}


def _segment_headers(segment_id: str, size: int, request: Request) -> tuple[int, int, int, dict[str, str]]:
    """Status, byte range and headers of a segment answer (GET and HEAD alike): 304 (no range) on
    a matching If-None-Match, 206 on a Range, :class:`RangeNotSatisfiableError` (416) on a bad one."""
    etag = f'"{segment_id}"'
    headers = {"ETag": etag, "Cache-Control": "public, max-age=31536000, immutable",
               "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}
    inm = request.headers.get("if-none-match")
    if inm is not None and (inm.strip() == "*" or etag in [t.strip().removeprefix("W/")
                                                             for t in inm.split(",")]):
        return 304, 0, -1, headers
    status, start, end = 200, 0, size - 1
    rng = request.headers.get("range")
    try:
        selected = None if rng is None else _parse_range(rng, size)
    except RangeNotSatisfiableError as exc:
        exc.headers = {"Content-Range": f"bytes */{size}"}
        raise
    if selected is not None:
        (start, end), status = selected, 206
        headers["Content-Range"] = f"bytes {start}-{end}/{size}"
    headers["Content-Length"] = str(end - start + 1)
    return status, start, end, headers


@router.get(paths.SEGMENT.template, responses=_SEGMENT_RESPONSES, response_class=Response,
            dependencies=[Depends(require_model_token)],
            operation_id="get_segment", summary="Download a head segment by content id")
def segment(
    segment_id: Annotated[str, Field(pattern=SHA256_HEX)], request: Request, engine: EngineDep
) -> Response:
    """Stream a packed head segment. Strong ETag (its sha256), 304 on If-None-Match, 206 on Range."""
    started = time.perf_counter()
    data, entry, hit = engine.segment(segment_id)
    status, start, end, headers = _segment_headers(segment_id, len(data), request)
    if status == 304:
        return Response(status_code=304, headers=headers)
    headers["X-Cache"] = "hit" if hit else "miss"
    chunks = _chunks(data, start, end, lambda n: engine.count_segment_bytes(entry.model, n),
                     lambda: engine.observe_segment_stream(time.perf_counter() - started))
    return StreamingResponse(chunks, status_code=status, headers=headers)


@router.head(paths.SEGMENT.template, responses=_SEGMENT_RESPONSES, response_class=Response,
             dependencies=[Depends(require_model_token)],
             operation_id="head_segment", summary="A head segment's size and ETag, without the body")
def segment_head(
    segment_id: Annotated[str, Field(pattern=SHA256_HEX)], request: Request, engine: EngineDep
) -> Response:
    """The GET's status and headers (size, ETag, Content-Range), from the segment index alone: a
    HEAD neither builds nor caches the segment, nor counts as a use of it."""
    status, _start, _end, headers = _segment_headers(segment_id, engine.segment_entry(segment_id).size,
                                                     request)
    return Response(status_code=status, headers=headers)


@router.post(paths.TAIL_INFER.template,
             response_model=TailResponse, responses={**_ERRORS, 415: {"model": ErrorBody}},
             dependencies=[Depends(require_token)],
             openapi_extra={"requestBody": {"required": True, "content": {
                 "application/octet-stream": {"schema": {"type": "string", "format": "binary",
                                                         "x-qpart-format": "activation-packet-v1"}},
                 "image/png": {"schema": {"type": "string", "format": "binary"}},
                 "image/webp": {"schema": {"type": "string", "format": "binary"}}}},
                 "parameters": [{"name": "Content-Encoding", "in": "header", "required": False,
                                 "description": "identity (default), deflate (zlib) or zstd",
                                 "schema": {"type": "string",
                                            "enum": ["identity", *(c.value for c in Coding)]}}]},
             summary="Run the tail on an uploaded activation packet")
async def infer_tail(
    model: str, version: str, pattern_id: str, request: Request, engine: EngineDep,
    top_k: Annotated[int, Query(ge=1, le=TOP_K_MAX)] = TOP_K_DEFAULT,
) -> Response:
    """Body: the activation packet (kernels/wire.py) quantized with the plan's bits and groups, as
    is or with ``Content-Encoding: deflate`` (zlib) or ``zstd`` (the plan's ``upload_encoding`` says
    which); for the input-image plans, the device's image: ``image/png`` for pattern ``input-png``,
    ``image/webp`` at the plan's quality for ``input-webp@<quality>``."""
    return await tail_infer_response(engine, model, version, pattern_id, await read_body(request), top_k,
                                     request.headers.getlist("content-encoding"),
                                     request.headers.get("content-type"), request.headers.get(AUDIT_HEADER))


@router.post(paths.AUDIT.template, status_code=202, response_model=AuditReceipt,
             responses={**_ERRORS, 409: {"model": ErrorBody}, 410: {"model": ErrorBody},
                        415: {"model": ErrorBody}},
             dependencies=[Depends(require_token)],
             openapi_extra={"requestBody": {"required": True, "content": {
                 "application/octet-stream": {"schema": {"type": "string", "format": "binary",
                                                         "x-qpart-format": "activation-packet-v1"}}}}},
             summary="Upload an audited plan's raw input, after its answer (ADR 0024)")
async def audit_upload(
    audit_id: Annotated[str, Field(max_length=64, pattern=AUDIT_ID)], request: Request, engine: EngineDep,
) -> Response:
    """Body: the raw input of the one sample of the audit's tail request that its answer named in
    ``Qpart-Audit-Sample``, as a float32 activation packet (kernels/wire.py) of shape
    ``[1, *input_shape]``. The server runs the float model on it off the hot path, compares its
    top-1 with the answer it gave, and discards it. 202 once taken (``queued: false``: dropped
    unchecked under load)."""
    return audit_upload_response(engine, audit_id, await read_body(request),
                                 request.headers.getlist("content-encoding"))


class CacheBudget(BaseModel):
    """New byte budget of the segment cache."""

    model_config = ConfigDict(extra="forbid", strict=True)

    budget_bytes: JsonInt = Field(ge=0, le=1 << 40)


@router.put(paths.ADMIN_SEGMENT_CACHE.template, responses={**_ERRORS, 403: {"model": ErrorBody}},
            dependencies=[Depends(require_admin)],
            summary="Change the segment cache's byte budget at run time")
def set_cache_budget(body: CacheBudget, engine: EngineDep) -> dict[str, int]:
    """Shrinking evicts at once, least important segments first."""
    stats = engine.set_cache_budget(body.budget_bytes)
    return {"budget_bytes": stats.budget_bytes, "resident_bytes": stats.resident_bytes}
