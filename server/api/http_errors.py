"""The one place where exceptions become HTTP responses: always ``{"error": "..."}``."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from qpart.server.api.deps import models_visible
from qpart.server.errors import NotFoundError, OverloadedError, ServerError, UnauthorizedError

log = logging.getLogger(__name__)


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    """The error body every route and middleware uses."""
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        loc = ".".join(str(x) for x in err.get("loc", ()) if x != "body")
        parts.append(f"{loc or 'body'}: {err.get('msg', 'invalid')}")
    return "invalid request: " + "; ".join(parts)


def server_error_response(exc: ServerError, method: str, path: str, *,
                          names_visible: bool = True) -> JSONResponse:
    """The answer to an error of the server's own tree; with ``names_visible`` false (a caller
    without the token while ``QPART_PROTECT_MODELS`` is on), a 404 names no other model or
    version than the one asked for."""
    message = exc.bare if isinstance(exc, NotFoundError) and not names_visible else str(exc)
    headers = dict(exc.headers or {})
    if isinstance(exc, OverloadedError):
        headers["Retry-After"] = str(max(1, round(exc.retry_after_s)))
    if isinstance(exc, UnauthorizedError):
        headers["WWW-Authenticate"] = "Bearer"
    if exc.status >= 500:
        log.warning("%s %s -> %d: %s", method, path, exc.status, exc)
    return error_response(exc.status, message, headers)


def http_exception_response(exc: StarletteHTTPException, method: str, path: str) -> JSONResponse:
    """The answer to a Starlette HTTPException (no route, 408 / 413 from the limits middleware)."""
    message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
    if exc.status_code == 404 and message == "Not Found":
        message = f"no route {method} {path}; see /openapi.json for the API"
    return error_response(exc.status_code, message, dict(exc.headers or {}))


def disconnect_response() -> JSONResponse:
    """The client hung up before its body arrived. Nobody reads this answer (uvicorn drops it);
    its status is what the metrics record: nginx's 499, a client error. Left to the catch-all
    handler, every abandoned upload logged two tracebacks and counted as a server error."""
    return error_response(499, "the client closed the connection before its request body arrived")


def unexpected_response(exc: Exception, method: str, path: str) -> JSONResponse:
    """The answer to an exception nothing expected: a 500 that says so, and the traceback logged."""
    log.exception("unhandled error on %s %s", method, path, exc_info=exc)
    return error_response(500, f"internal error ({type(exc).__name__}); this is a server bug")


def install_error_handlers(app: FastAPI) -> None:
    """Register the handlers that translate every error to ``{"error": ...}``."""

    @app.exception_handler(ServerError)
    async def _server_error(request: Request, exc: ServerError) -> JSONResponse:
        return server_error_response(exc, request.method, request.url.path,
                                     names_visible=models_visible(request))

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(422, _validation_message(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return http_exception_response(exc, request.method, request.url.path)

    @app.exception_handler(ClientDisconnect)
    async def _gone(request: Request, exc: ClientDisconnect) -> JSONResponse:
        return disconnect_response()

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        return unexpected_response(exc, request.method, request.url.path)
