"""``create_app(settings)``: the FastAPI application; heavy state is built in the lifespan hook."""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, Request, Response
from fastapi.openapi.utils import get_openapi
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from qpart.server.api import paths
from qpart.server.api.deps import require_model_token
from qpart.server.api.device_page import device_router
from qpart.server.api.fastpath import InferFastPath
from qpart.server.api.http_errors import install_error_handlers
from qpart.server.api.limits import ASGIApp, LimitsMiddleware
from qpart.server.api.responses import Links
from qpart.server.api.routes_api import router as api_router
from qpart.server.api.routes_oip import SERVER_VERSION
from qpart.server.api.routes_oip import router as oip_router
from qpart.server.engine import Engine
from qpart.server.metrics import Metrics
from qpart.server.oip_schemas import InferRequest
from qpart.server.settings import ServerSettings
from qpart.server.store.catalog import Catalog
from qpart.server.store.segments import SegmentStore

log = logging.getLogger(__name__)


def freeze_long_lived() -> None:
    """Move everything loaded so far (torch modules, fx graphs, artifacts), which lives as long as
    the process, out of the collector's reach: else every full collection walks it, and those
    pauses were the whole p99 of tail inference under load."""
    gc.collect()
    gc.freeze()


def load_engine(settings: ServerSettings) -> Engine:
    """An engine outside the app (benchmarks, tools): its own segment store and metrics, every
    model loaded and warmed up, as the lifespan hook builds it."""
    store = SegmentStore(settings.segment_cache_bytes)
    engine = Engine(settings, Catalog.load(settings.artifacts), store,
                    Metrics(store, SERVER_VERSION, created=settings.metrics_created))
    engine.warm_up()
    return engine


def _log_start(catalog: Catalog, settings: ServerSettings) -> None:
    """One line per model version, and whether live audits are on (ADR 0024)."""
    for entry in catalog.entries:
        log.info("model %s version %s: %s", entry.name, entry.version,
                 "ready" if entry.ready else f"NOT READY ({entry.reason})")
    if settings.audit_rate > 0:
        log.info("live audits: %g of the plans whose device consents (QPART_AUDIT_RATE)", settings.audit_rate)


def create_app(settings: ServerSettings) -> FastAPI:
    """Build the app. Models load in the lifespan hook; readiness is 503 until they have."""
    store = SegmentStore(settings.segment_cache_bytes)
    metrics = Metrics(store, SERVER_VERSION, created=settings.metrics_created)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        catalog = await asyncio.to_thread(Catalog.load, settings.artifacts)
        engine = Engine(settings, catalog, store, metrics)
        await asyncio.to_thread(engine.warm_up)
        freeze_long_lived()
        app.state.engine = engine
        _log_start(catalog, settings)
        try:
            yield
        finally:
            await engine.close()

    app = FastAPI(
        title="QPART serving",
        version=SERVER_VERSION,
        summary="Plans, quantized head segments and tail inference for edge devices.",
        lifespan=lifespan,
        # Swagger UI and ReDoc load their scripts from a CDN into the browser: off unless asked for
        # (QPART_API_DOCS); /openapi.json is always served.
        docs_url="/docs" if settings.api_docs else None,
        redoc_url="/redoc" if settings.api_docs else None,
        # Starlette's slash redirect writes the request's Host header into Location; no route here
        # needs it (the device page redirects /device itself, to a path without a host).
        redirect_slashes=False,
        # Off by default (Prometheus at /metrics is the server's telemetry): FastAPI's check for
        # configured OpenTelemetry providers costs every request a few microseconds.
        telemetry={"tracing": settings.opentelemetry, "metrics": settings.opentelemetry,
                   "logs": settings.opentelemetry},
    )
    app.state.settings = settings
    app.state.metrics = metrics
    app.state.links = Links(settings.public_url)
    install_error_handlers(app)
    app.include_router(api_router)
    app.include_router(oip_router)
    app.include_router(device_router())

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = get_openapi(title=app.title, version=app.version, summary=app.summary, routes=app.routes)
            extra = InferRequest.model_json_schema(ref_template="#/components/schemas/{model}")
            components = doc.setdefault("components", {}).setdefault("schemas", {})
            components.update(extra.pop("$defs", {}))
            components["InferRequest"] = extra
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

    # Its labels name every model and version: the token, as for model listings (ADR 0009).
    @app.get(paths.METRICS.template, include_in_schema=False, dependencies=[Depends(require_model_token)])
    def prometheus_metrics(request: Request) -> Response:
        engine: Engine | None = getattr(request.app.state, "engine", None)
        if engine is not None:
            metrics.queue_depth.set(engine.tail_queue_depth())
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    def known_models() -> frozenset[str]:
        engine: Engine | None = getattr(app.state, "engine", None)
        return engine.known_model_names() if engine is not None else frozenset()

    build_stack = app.build_middleware_stack

    def outermost() -> ASGIApp:
        """Limits, then the fast path, then FastAPI's own stack (error pages, routing).

        Both sit outside FastAPI's middleware (``add_middleware`` would put them inside its
        ServerErrorMiddleware and two more layers), so the fast path skips three layers and their
        ``send`` wrappers, a measurable share of the event loop per tail request. The fast path
        answers its own errors, unexpected ones included, as the
        handlers of :func:`server.api.http_errors.install_error_handlers` do.
        """
        inner: ASGIApp = build_stack()
        if settings.inference_fast_path:  # inside the limits middleware: same limits and metrics
            inner = InferFastPath(inner, state=app.state)
        return LimitsMiddleware(inner, max_body_bytes=settings.max_body_bytes,
                                body_timeout_s=settings.body_timeout_s, metrics=metrics,
                                known_models=known_models,
                                route_body_bytes={"plan": (settings.max_plan_body_bytes,
                                                           "QPART_MAX_PLAN_BODY_BYTES")})

    app.build_middleware_stack = outermost  # type: ignore[method-assign]
    return app
