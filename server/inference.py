"""The inference handlers, shared by the routes and the fast path: the Open Inference Protocol
infer (full and tail models) and the QPART tail route, each from a parsed request to a response.

Each served model ``m`` appears twice under /v2: ``m`` (the float model, input ``input`` FP32
``[-1, *input_shape]``, output ``logits``) and ``m-tail`` (input ``activation_packet`` UINT8, the
packet of kernels/wire.py; request parameter ``pattern_id`` names the plan's pattern).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import numpy as np
from starlette.responses import Response

from qpart.server.content import content_coding, decode_content, identity_only
from qpart.server.engine import Engine
from qpart.server.errors import BadRequestError, NotFoundError
from qpart.server.oip_codec import decode_request, encode_response
from qpart.server.schemas import InferOutputTensor, InferRequest, InferResponse

TAIL_SUFFIX = "-tail"


def resolve_model(engine: Engine, name: str) -> tuple[str, bool]:
    """The served model behind a /v2 model name, and whether the name is its ``-tail`` twin."""
    if name.endswith(TAIL_SUFFIX) and name[: -len(TAIL_SUFFIX)] in engine.catalog.names():
        return name[: -len(TAIL_SUFFIX)], True
    return name, False


async def infer_response(engine: Engine, model: str, version: str | None,
                         read: Callable[[], Awaitable[bytes]], header_length: str | None,
                         content_encoding: list[str] | None = None) -> Response:
    """/v2 infer: ``read`` gives the body, ``header_length`` is the binary split header,
    ``content_encoding`` the Content-Encoding values (identity only here)."""
    base, tail = resolve_model(engine, model)
    engine.catalog.get(base, version)  # unknown model or version: 404 before the body is parsed
    identity_only(content_encoding or [])
    body = await read()
    decoded = decode_request(body, header_length, max_elements=engine.settings.max_body_bytes)
    if tail:
        logits, used = await _infer_tail(engine, base, version, decoded.request, decoded.arrays)
    else:
        x = decoded.arrays.get("input", next(iter(decoded.arrays.values())))
        if x.dtype != np.float32:
            raise BadRequestError(f"input must be FP32, got {x.dtype}")
        logits, loaded = await engine.infer_full(base, version, x)
        used = loaded.version
    requested = [o.name for o in decoded.request.outputs or []]
    if any(name != "logits" for name in requested):
        raise BadRequestError(f"unknown output(s) {requested}; this model has 'logits'")
    output = InferOutputTensor(name="logits", shape=list(logits.shape), datatype="FP32")
    response = InferResponse(model_name=model, model_version=used, id=decoded.request.id, outputs=[output])
    content, headers = encode_response(response, {"logits": logits}, decoded.binary_output)
    return Response(content, headers=headers)


async def _infer_tail(engine: Engine, base: str, version: str | None, request: InferRequest,
                      arrays: dict[str, np.ndarray]) -> tuple[np.ndarray, str]:
    pattern_id = (request.parameters or {}).get("pattern_id")
    packet = arrays.get("activation_packet")
    if not isinstance(pattern_id, str) or packet is None or packet.dtype != np.uint8:
        raise BadRequestError("a tail infer needs the request parameter 'pattern_id' and a UINT8 input "
                              "'activation_packet'")
    model = engine.catalog.get(base, version)
    if pattern_id not in model.patterns:
        raise NotFoundError(f"model '{base}' has no pattern '{pattern_id}'")
    answer = await engine.infer_tail(base, model.version, pattern_id, packet.tobytes(), top_k=1)
    return np.asarray(answer.rows.logits, dtype=np.float32), model.version  # the answer declares FP32


async def tail_infer_response(engine: Engine, model: str, version: str, pattern_id: str, body: bytes,
                              top_k: int, content_encoding: list[str] | None = None) -> Response:
    """The QPART tail route after parsing; ``content_encoding``: the request's Content-Encoding
    field values."""
    if content_encoding:  # unknown model or pattern: 404 before the coding is looked at
        loaded, pattern = engine.pattern_of(model, version, pattern_id)
        body = decode_content(body, content_coding(content_encoding), engine.packet_limit(loaded, pattern))
    answer = await engine.infer_tail(model, version, pattern_id, body, top_k)
    return Response(answer.json(), media_type="application/json")
