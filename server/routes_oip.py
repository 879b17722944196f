"""Open Inference Protocol v2 routes: health, metadata, and infer for full and tail models.

Each served model ``m`` appears twice: ``m`` (the float model, input ``input`` FP32
``[-1, *input_shape]``, output ``logits``) and ``m-tail`` (input ``activation_packet`` UINT8, the
packet of kernels/wire.py; request parameter ``pattern_id`` names the plan's pattern).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import numpy as np
from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse

from server.content import identity_only
from server.deps import EngineDep, read_body, require_model_token, require_token
from server.engine import Engine
from server.errors import BadRequestError, NotFoundError
from server.oip_codec import HEADER, decode_request, encode_response
from server.schemas import (
    ErrorBody,
    InferOutputTensor,
    InferRequest,
    InferResponse,
    ModelMetadata,
    ServerMetadata,
    TensorMetadata,
)

router = APIRouter(prefix="/v2")
TAIL_SUFFIX = "-tail"
SERVER_VERSION = "0.1.0"
_ERRORS: dict[int | str, dict[str, Any]] = {s: {"model": ErrorBody} for s in (400, 401, 404, 413, 503, 504)}


@router.get("/health/live", summary="Liveness")
async def live() -> dict[str, bool]:
    """200 while the process serves HTTP."""
    return {"live": True}


@router.get("/health/ready", responses={503: {"model": ErrorBody}}, summary="Readiness")
async def ready(engine: EngineDep) -> Response:
    """200 when models are loaded and the server is not draining, else 503."""
    reason = engine.not_ready_reason()
    if reason is None:
        return JSONResponse({"ready": True})
    return JSONResponse({"error": f"not ready: {reason}"}, status_code=503)


@router.get("", response_model=ServerMetadata, summary="Server metadata")
async def server_metadata() -> ServerMetadata:
    """Name, version and supported protocol extensions."""
    return ServerMetadata(name="qpart", version=SERVER_VERSION, extensions=["binary_tensor_data"])


def _resolve(engine: Engine, name: str) -> tuple[str, bool]:
    if name.endswith(TAIL_SUFFIX) and name[: -len(TAIL_SUFFIX)] in engine.catalog.names():
        return name[: -len(TAIL_SUFFIX)], True
    return name, False


def _metadata(engine: Engine, name: str, version: str | None) -> ModelMetadata:
    base, tail = _resolve(engine, name)
    entries = engine.catalog.versions(base)
    if version is not None:
        engine.catalog.entry(base, version)
    model = engine.catalog.get(base, version)
    classes = model.cuts[-1].shape
    if tail:
        inputs = [TensorMetadata(name="activation_packet", datatype="UINT8", shape=[-1])]
    else:
        inputs = [TensorMetadata(name="input", datatype="FP32", shape=[-1, *model.artifact.input_shape])]
    return ModelMetadata(name=name, versions=[e.version for e in entries], platform="pytorch_qpart",
                         inputs=inputs, outputs=[TensorMetadata(name="logits", datatype="FP32",
                                                                shape=[-1, *classes])])


@router.get("/models/{model}", response_model=ModelMetadata, responses=_ERRORS,
            dependencies=[Depends(require_model_token)], summary="Model metadata")
async def model_metadata(model: str, engine: EngineDep) -> ModelMetadata:
    """Inputs, outputs and versions of a model (``m`` or ``m-tail``)."""
    return _metadata(engine, model, None)


@router.get("/models/{model}/versions/{version}", response_model=ModelMetadata, responses=_ERRORS,
            dependencies=[Depends(require_model_token)], summary="Model version metadata")
async def model_version_metadata(model: str, version: str, engine: EngineDep) -> ModelMetadata:
    """Inputs, outputs and versions of one version."""
    return _metadata(engine, model, version)


def _ready(engine: Engine, model: str, version: str | None) -> Response:
    base, _ = _resolve(engine, model)
    entry = engine.catalog.entry(base, version)
    reason = entry.reason
    if reason is None and engine.draining:
        reason = "draining"
    if reason is None and base in engine.stalled_models():
        reason = "its tail inference is restarting"
    if reason is None:
        return JSONResponse({"name": model, "ready": True})
    return JSONResponse({"error": f"model '{model}' is not ready: {reason}"}, status_code=503)


@router.get("/models/{model}/ready", responses=_ERRORS, summary="Model readiness")
async def model_ready(model: str, engine: EngineDep) -> Response:
    """200 if the model can serve, 503 with the reason otherwise."""
    return _ready(engine, model, None)


@router.get("/models/{model}/versions/{version}/ready", responses=_ERRORS, summary="Version readiness")
async def model_version_ready(model: str, version: str, engine: EngineDep) -> Response:
    """200 if the version can serve, 503 with the reason otherwise."""
    return _ready(engine, model, version)


# The body is read raw (tritonclient sends no Content-Type, and binary tensors follow the JSON);
# the document describes the JSON form. create_app registers the referenced component schemas.
_INFER_DOC: dict[str, Any] = {"requestBody": {"required": True, "content": {
    "application/json": {"schema": {"$ref": "#/components/schemas/InferRequest"}}}}}


async def infer_response(engine: Engine, model: str, version: str | None,
                         read: Callable[[], Awaitable[bytes]], header_length: str | None,
                         content_encoding: list[str] | None = None) -> Response:
    """The infer routes' work: ``read`` gives the body, ``header_length`` is the binary split header,
    ``content_encoding`` the Content-Encoding values (identity only here). :mod:`server.fastpath`
    calls it too."""
    base, tail = _resolve(engine, model)
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
    pattern = model.patterns.get(pattern_id)
    if pattern is None:
        raise NotFoundError(f"model '{base}' has no pattern '{pattern_id}'")
    answer = await engine.infer_tail(base, model.version, pattern_id, packet.tobytes(), top_k=1)
    return np.asarray(answer.rows.logits, dtype=np.float32), model.version  # the answer declares FP32


@router.post("/models/{model}/infer", responses=_ERRORS, openapi_extra=_INFER_DOC,
             dependencies=[Depends(require_token)], summary="Inference (JSON or binary tensors)")
async def infer(model: str, request: Request, engine: EngineDep) -> Response:
    """Open Inference Protocol infer; binary tensor data via Inference-Header-Content-Length."""
    return await infer_response(engine, model, None, partial(read_body, request), request.headers.get(HEADER),
                                request.headers.getlist("content-encoding"))


@router.post("/models/{model}/versions/{version}/infer", responses=_ERRORS, openapi_extra=_INFER_DOC,
             dependencies=[Depends(require_token)], summary="Inference on one version")
async def infer_version(model: str, version: str, request: Request, engine: EngineDep) -> Response:
    """Open Inference Protocol infer on a given version."""
    return await infer_response(engine, model, version, partial(read_body, request),
                                request.headers.get(HEADER), request.headers.getlist("content-encoding"))
