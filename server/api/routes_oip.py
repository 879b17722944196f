"""Open Inference Protocol v2 routes: health, metadata, and infer for full and tail models (the
``m`` / ``m-tail`` pair of :mod:`server.api.inference`, which holds the infer handler)."""

from __future__ import annotations

import json
from functools import partial
from typing import Any

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse

from qpart.server.api import paths
from qpart.server.api.deps import EngineDep, models_visible, read_body, require_model_token, require_token
from qpart.server.api.inference import infer_response, resolve_model
from qpart.server.api.oip_codec import HEADER
from qpart.server.engine import Engine
from qpart.server.oip_schemas import ModelMetadata, Parameter, ServerMetadata, TensorMetadata
from qpart.server.planning.image_plans import promised_rungs
from qpart.server.schemas import ErrorBody
from qpart.server.store.catalog import LoadedModel
from qpart.server.store.segment_index import runtime_table

router = APIRouter()
SERVER_VERSION = "0.1.0"
_ERRORS: dict[int | str, dict[str, Any]] = {s: {"model": ErrorBody} for s in (400, 401, 404, 413, 503, 504)}


@router.get(paths.V2_LIVE.template, summary="Liveness")
async def live() -> dict[str, bool]:
    """200 while the process serves HTTP."""
    return {"live": True}


@router.get(paths.V2_READY.template, responses={503: {"model": ErrorBody}}, summary="Readiness")
async def ready(engine: EngineDep, request: Request) -> Response:
    """200 when models are loaded and the server is not draining, else 503."""
    reason = engine.not_ready_reason(name_models=models_visible(request))
    if reason is None:
        return JSONResponse({"ready": True})
    return JSONResponse({"error": f"not ready: {reason}"}, status_code=503)


@router.get(paths.V2_SERVER.template, response_model=ServerMetadata, summary="Server metadata")
async def server_metadata() -> ServerMetadata:
    """Name, version and supported protocol extensions."""
    return ServerMetadata(name="qpart", version=SERVER_VERSION,
                          extensions=["binary_tensor_data", "classification"])


def _metadata(engine: Engine, name: str, version: str | None) -> ModelMetadata:
    base, tail = resolve_model(engine, name)
    entries = engine.model_versions(base)
    if version is not None:
        engine.model_entry(base, version)
    model = engine.model(base, version)
    classes = model.cuts[-1].shape
    if tail:
        inputs = [TensorMetadata(name="activation_packet", datatype="UINT8", shape=[-1])]
    else:
        inputs = [TensorMetadata(name="input", datatype="FP32", shape=[-1, *model.artifact.input_shape])]
    return ModelMetadata(name=name, versions=[e.version for e in entries], platform="pytorch_qpart",
                         inputs=inputs, outputs=[TensorMetadata(name="logits", datatype="FP32",
                                                                shape=[-1, *classes])],
                         parameters=card_parameters(model, images=not tail) or None)


def card_parameters(model: LoadedModel, images: bool = True) -> dict[str, Parameter]:
    """What the levels bound (``metric``, the artifact's, e.g. ``"top1-drop"``) and what the model
    card declares, as metadata parameters: ``preprocess`` (the spec's JSON
    object), ``labels`` (the JSON list of class names in logit order) and ``image_qualities`` (the
    lossy input-image plan's promised WebP qualities, each with its tightest level and the encoder
    the promise is for, ADR 0015; not
    with ``images`` false: a tail takes packets), and ``runtimes`` (per device runtime, the cuts it
    can run and why not the others, :func:`server.store.segment_index.runtime_table`; not for a tail)
    and ``calibrated_cuts`` (the cuts plans are made at, ADR 0025; not for a tail),
    each a JSON string, since a protocol parameter is a string, number or boolean; absent when the
    card or calibration has none."""
    parameters: dict[str, Parameter] = {"metric": json.dumps(model.artifact.metric)}
    if model.preprocess is not None:
        parameters["preprocess"] = model.preprocess.model_dump_json()
    if model.labels is not None:
        parameters["labels"] = json.dumps(list(model.labels), separators=(",", ":"))
    rungs = promised_rungs(model) if images else []
    ladder = model.artifact.image_ladder
    if rungs and ladder is not None and model.preprocess is not None:
        parameters["image_qualities"] = json.dumps(
            [{"codec": r.codec, "quality": r.quality, "level": r.level, "encoder": ladder.encoder}
             for r in rungs], separators=(",", ":"))
    if images:
        parameters["runtimes"] = json.dumps(runtime_table(model), separators=(",", ":"))
        parameters["calibrated_cuts"] = json.dumps(model.artifact.calibrated_cuts, separators=(",", ":"))
    return parameters


@router.get(paths.V2_MODEL.template, response_model=ModelMetadata, responses=_ERRORS,
            dependencies=[Depends(require_model_token)], summary="Model metadata")
async def model_metadata(model: str, engine: EngineDep) -> ModelMetadata:
    """Inputs, outputs and versions of a model (``m`` or ``m-tail``); ``parameters`` carries the
    card's ``preprocess`` and ``labels`` as JSON strings."""
    return _metadata(engine, model, None)


@router.get(paths.V2_MODEL_VERSION.template, response_model=ModelMetadata, responses=_ERRORS,
            dependencies=[Depends(require_model_token)], summary="Model version metadata")
async def model_version_metadata(model: str, version: str, engine: EngineDep) -> ModelMetadata:
    """Inputs, outputs and versions of one version."""
    return _metadata(engine, model, version)


def _ready(engine: Engine, model: str, version: str | None) -> Response:
    base, _ = resolve_model(engine, model)
    entry = engine.model_entry(base, version)
    reason = entry.reason
    if reason is None and engine.draining:
        reason = "draining"
    if reason is None and base in engine.stalled_models():
        reason = "its tail inference is restarting"
    if reason is None:
        return JSONResponse({"name": model, "ready": True})
    return JSONResponse({"error": f"model '{model}' is not ready: {reason}"}, status_code=503)


@router.get(paths.V2_MODEL_READY.template, responses=_ERRORS, summary="Model readiness")
async def model_ready(model: str, engine: EngineDep) -> Response:
    """200 if the model can serve, 503 with the reason otherwise."""
    return _ready(engine, model, None)


@router.get(paths.V2_MODEL_VERSION_READY.template, responses=_ERRORS, summary="Version readiness")
async def model_version_ready(model: str, version: str, engine: EngineDep) -> Response:
    """200 if the version can serve, 503 with the reason otherwise."""
    return _ready(engine, model, version)


# The body is read raw (tritonclient sends no Content-Type, and binary tensors follow the JSON);
# the document describes the JSON form. create_app registers the referenced component schemas.
_INFER_DOC: dict[str, Any] = {"requestBody": {"required": True, "content": {
    "application/json": {"schema": {"$ref": "#/components/schemas/InferRequest"}}}}}


@router.post(paths.V2_INFER.template, responses=_ERRORS, openapi_extra=_INFER_DOC,
             dependencies=[Depends(require_token)], summary="Inference (JSON or binary tensors)")
async def infer(model: str, request: Request, engine: EngineDep) -> Response:
    """Open Inference Protocol infer; binary tensor data via Inference-Header-Content-Length."""
    return await infer_response(engine, model, None, partial(read_body, request), request.headers.get(HEADER),
                                request.headers.getlist("content-encoding"))


@router.post(paths.V2_INFER_VERSION.template, responses=_ERRORS, openapi_extra=_INFER_DOC,
             dependencies=[Depends(require_token)], summary="Inference on one version")
async def infer_version(model: str, version: str, request: Request, engine: EngineDep) -> Response:
    """Open Inference Protocol infer on a given version."""
    return await infer_response(engine, model, version, partial(read_body, request),
                                request.headers.get(HEADER), request.headers.getlist("content-encoding"))
