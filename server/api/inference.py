"""The inference handlers, shared by the routes and the fast path: the Open Inference Protocol
infer (full and tail models) and the QPART tail route, each from a parsed request to a response.

Each served model ``m`` appears twice under /v2: ``m`` (the float model, input ``input`` FP32
``[-1, *input_shape]``, output ``logits``) and ``m-tail`` (input ``activation_packet`` UINT8, the
packet of kernels/wire.py; request parameter ``pattern_id`` names the plan's pattern). An input
of another name is refused; ``logits`` requested with ``classification: N`` is answered as the
top N ``score:index:label`` strings (:mod:`server.tails.classification`).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

import numpy as np
from starlette.responses import Response

from qpart.models.image_codecs import parse_rung_id
from qpart.server.api.oip_codec import decode_request, encode_fp32_response, encode_response
from qpart.server.engine import Engine
from qpart.server.errors import BadRequestError, NotFoundError, UnsupportedMediaTypeError
from qpart.server.oip_schemas import InferOutputTensor, InferRequest, InferRequestedOutput, InferResponse
from qpart.server.planning.images import CONTENT_TYPE, INPUT_PNG
from qpart.server.planning.webp import CONTENT_TYPE as WEBP_TYPE
from qpart.server.schemas import AUDIT_SAMPLE_HEADER, AuditReceipt
from qpart.server.store.catalog import LoadedModel
from qpart.server.tails.answers import TailAnswer
from qpart.server.tails.classification import class_count, classify
from qpart.server.tails.content import IDENTITY, content_coding, decode_content, identity_only

TAIL_SUFFIX = "-tail"
FULL_INPUT = "input"
TAIL_INPUT = "activation_packet"
OUTPUT = "logits"


def resolve_model(engine: Engine, name: str) -> tuple[str, bool]:
    """The served model behind a /v2 model name, and whether the name is its ``-tail`` twin."""
    if name.endswith(TAIL_SUFFIX) and name[: -len(TAIL_SUFFIX)] in engine.model_names():
        return name[: -len(TAIL_SUFFIX)], True
    return name, False


async def infer_response(engine: Engine, model: str, version: str | None,
                         read: Callable[[], Awaitable[bytes]], header_length: str | None,
                         content_encoding: list[str] | None = None) -> Response:
    """/v2 infer: ``read`` gives the body, ``header_length`` is the binary split header,
    ``content_encoding`` the Content-Encoding values (identity only here)."""
    base, tail = resolve_model(engine, model)
    engine.model(base, version)  # unknown model or version: 404 before the body is parsed
    identity_only(content_encoding or [])
    body = await read()
    decoded = decode_request(body, header_length, max_elements=engine.max_body_bytes)
    _check_inputs(model, TAIL_INPUT if tail else FULL_INPUT, decoded.request)
    count = _classification(decoded.request)  # a wrong output is refused before inference runs
    if tail:
        logits, loaded = await _infer_tail(engine, base, version, decoded.request, decoded.arrays)
    else:
        x = decoded.arrays[FULL_INPUT]
        if x.dtype != np.float32:
            raise BadRequestError(f"input must be FP32, got {x.dtype}")
        logits, loaded = await engine.infer_full(base, version, x)
    if count is None:  # the tensor, written directly (encode_response's bytes)
        content, headers = encode_fp32_response(model, loaded.version, decoded.request.id, OUTPUT, logits,
                                                decoded.binary_output)
        return Response(content, headers=headers)
    values = classify(logits, count, loaded.labels)
    output = InferOutputTensor(name=OUTPUT, shape=list(values.shape), datatype="BYTES")
    response = InferResponse(model_name=model, model_version=loaded.version, id=decoded.request.id,
                             outputs=[output])
    content, headers = encode_response(response, {OUTPUT: values}, decoded.binary_output)
    return Response(content, headers=headers)


def _check_inputs(model: str, expected: str, request: InferRequest) -> None:
    """Every input must be the model's one input (decode_request refused duplicate names)."""
    for tensor in request.inputs:
        if tensor.name != expected:
            raise BadRequestError(f"model '{model}' has no input '{tensor.name[:64]}'; it takes one input "
                                  f"'{expected}' (see GET /v2/models/{model})")


def _classification(request: InferRequest) -> int | None:
    """The classification count of the requested output (None, or no output named: the tensor)."""
    requested = request.outputs or [InferRequestedOutput(name=OUTPUT)]
    names = [o.name for o in requested]
    if any(name != OUTPUT for name in names):
        raise BadRequestError(f"unknown output(s) {names}; this model has '{OUTPUT}'")
    if len(names) > 1:
        raise BadRequestError(f"output '{OUTPUT}' is requested {len(names)} times; request it once")
    return class_count(requested[0])


async def _infer_tail(engine: Engine, base: str, version: str | None, request: InferRequest,
                      arrays: dict[str, np.ndarray]) -> tuple[np.ndarray, LoadedModel]:
    pattern_id = (request.parameters or {}).get("pattern_id")
    packet = arrays.get(TAIL_INPUT)
    if not isinstance(pattern_id, str) or packet is None or packet.dtype != np.uint8:
        raise BadRequestError("a tail infer needs the request parameter 'pattern_id' and a UINT8 input "
                              f"'{TAIL_INPUT}'")
    model = engine.model(base, version)
    if pattern_id not in model.patterns:
        raise NotFoundError(f"model '{base}' has no pattern '{pattern_id}'")
    answer = await engine.infer_tail(base, model.version, pattern_id, packet.tobytes(), top_k=1)
    return np.asarray(answer.rows.logits, dtype=np.float32), model  # the answer declares FP32


async def tail_infer_response(engine: Engine, model: str, version: str, pattern_id: str, body: bytes,
                              top_k: int, content_encoding: list[str] | None = None,
                              content_type: str | None = None, audit: str | None = None) -> Response:
    """The QPART tail route after parsing; ``content_encoding``: the request's Content-Encoding
    field values; ``content_type``: its Content-Type (``image/png`` and ``image/webp`` for the
    input-image plans only, ADR 0014 and 0015); ``audit``: its ``Qpart-Audit`` header (ADR 0024)."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    rung = parse_rung_id(pattern_id)
    if pattern_id == INPUT_PNG or rung is not None:
        # unknown model, version or plan: 404 before the type is looked at
        engine.image_plan_model(model, version, pattern_id)
        want = CONTENT_TYPE if rung is None else WEBP_TYPE
        if media != want:
            raise UnsupportedMediaTypeError(f"the input-image plan '{pattern_id}' takes the image as "
                                            f"'{want}', not '{media or 'no Content-Type'}'")
        codings = [c.strip().lower() for v in content_encoding or [] for c in v.split(",")]
        if any(c not in ("", "identity") for c in codings):
            kind = "PNG" if rung is None else "WebP"
            raise UnsupportedMediaTypeError(f"the input-image plan takes the {kind} as is (no "
                                            f"Content-Encoding: a {kind} is compressed already)")
        return _timed(await engine.infer_image(model, version, body, top_k, pattern_id))
    if media in (CONTENT_TYPE, WEBP_TYPE):
        engine.pattern_of(model, version, pattern_id)  # unknown model or pattern: 404 first
        raise UnsupportedMediaTypeError(f"pattern '{pattern_id[:64]}' takes an activation packet "
                                        "(application/octet-stream); an image goes to an input-image "
                                        f"plan's URL (pattern '{INPUT_PNG}' or 'input-webp@<quality>')")
    started, coding = time.perf_counter(), IDENTITY
    if content_encoding:  # unknown model or pattern: 404 before the coding is looked at
        loaded, pattern = engine.pattern_of(model, version, pattern_id)
        coding = content_coding(content_encoding)
        body = decode_content(body, coding, engine.packet_limit(loaded, pattern))
    answer = await engine.infer_tail(model, version, pattern_id, body, top_k,
                                     decoded_s=time.perf_counter() - started, coding=coding, audit=audit)
    return _timed(answer)


def audit_upload_response(engine: Engine, audit_id: str, body: bytes,
                          content_encoding: list[str]) -> Response:
    """An audit's input upload after parsing (ADR 0024): 202 with the receipt."""
    identity_only(content_encoding)
    samples, queued = engine.audit_upload(audit_id, body)
    receipt = AuditReceipt(audit=audit_id, samples=samples, queued=queued)
    return Response(receipt.model_dump_json(), status_code=202, media_type="application/json")


def _timed(answer: TailAnswer) -> Response:
    """The answer with ``Server-Timing`` (W3C): the decoding's share of its ``compute_s`` (the image,
    or the packet's Content-Encoding and dequantization), for browsers' tools and benchmarks."""
    headers = {"Server-Timing": f"decode;dur={answer.decode_s * 1e3:.3f}"}
    if answer.audit_sample is not None:  # the request's audit checks this sample (ADR 0024)
        headers[AUDIT_SAMPLE_HEADER] = str(answer.audit_sample)
    return Response(answer.json(), media_type="application/json", headers=headers)
