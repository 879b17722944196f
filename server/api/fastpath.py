"""The inference routes' common case served straight from ASGI, past FastAPI's router.

Under load FastAPI's routing, dependency solving and exit stacks were a large share of the event
loop's CPU per tail request. For a POST to a tail or v2 infer route that is
well-formed on its face (authorised, no query but a valid ``top_k``), this middleware calls the
same handler the route calls, and maps errors through :mod:`server.api.http_errors` as the route
would. Anything else falls through to FastAPI, which answers it (401, 422, ...) as documented.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from functools import partial

from starlette.datastructures import State
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import Response

from qpart.server.api import paths
from qpart.server.api.deps import bearer_ok
from qpart.server.api.http_errors import (
    disconnect_response,
    http_exception_response,
    server_error_response,
    unexpected_response,
)
from qpart.server.api.inference import audit_upload_response, infer_response, tail_infer_response
from qpart.server.api.limits import ASGIApp, Receive, Scope, Send
from qpart.server.api.oip_codec import HEADER
from qpart.server.api.routes_api import TOP_K_DEFAULT, TOP_K_MAX
from qpart.server.engine import Engine
from qpart.server.errors import ServerError
from qpart.server.schemas import AUDIT_HEADER, AUDIT_ID

_TOP_K = re.compile(rb"top_k=([1-9][0-9]{0,3})")
_HEADER = HEADER.lower().encode()
_AUDIT = AUDIT_HEADER.lower().encode()
_AUDIT_ID = re.compile(AUDIT_ID)

Handler = Callable[[Receive], Awaitable[Response]]


async def _read_body(scope: Scope, receive: Receive) -> bytes:
    """The body as ``Request.body()`` reads it (a disconnect first is ClientDisconnect), without
    building a Request and its stream generator for the usual one-message body."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _first(headers: list[tuple[bytes, bytes]], name: bytes) -> str | None:
    """The first value of a header, as Starlette's ``Headers.get`` gives it."""
    for key, value in headers:
        if key == name:
            return value.decode("latin-1")
    return None


def _all(headers: list[tuple[bytes, bytes]], name: bytes) -> list[str]:
    """Every value of a header, as Starlette's ``Headers.getlist`` gives them."""
    return [value.decode("latin-1") for key, value in headers if key == name]


def _top_k(query: bytes) -> int | None:
    if not query:
        return TOP_K_DEFAULT
    match = _TOP_K.fullmatch(query)
    k = int(match.group(1)) if match else 0
    return k if 1 <= k <= TOP_K_MAX else None


class InferFastPath:
    """Serves well-formed tail and v2 infer POSTs itself; passes everything else to ``app``."""

    def __init__(self, app: ASGIApp, *, state: State) -> None:
        self.app = app
        self.state = state

    def _handler(self, scope: Scope) -> Handler | None:
        engine: Engine | None = getattr(self.state, "engine", None)
        path: str = scope["path"]
        audit = paths.AUDIT.match(path)
        if engine is None or scope.get("root_path") or not (path.endswith("/infer") or audit):
            return None
        headers = scope["headers"]
        if not bearer_ok(engine.auth_token, _first(headers, b"authorization") or ""):
            return None
        read = partial(_read_body, scope)
        if audit is not None:  # an audit's input upload (ADR 0024): FastAPI answers a malformed id
            audit_id, codings = audit["audit_id"], _all(headers, b"content-encoding")
            if scope["query_string"] or not _AUDIT_ID.fullmatch(audit_id):
                return None

            async def upload(receive: Receive) -> Response:
                return audit_upload_response(engine, audit_id, await read(receive), codings)

            return upload
        if (params := paths.TAIL_INFER.match(path)) is not None:
            top_k = _top_k(scope["query_string"])
            if top_k is None:
                return None
            model, version, pattern_id = params["model"], params["version"], params["pattern_id"]

            encoding = _all(headers, b"content-encoding")
            content_type = _first(headers, b"content-type")
            audit_header = _first(headers, _AUDIT)

            async def tail(receive: Receive) -> Response:
                body = await read(receive)
                return await tail_infer_response(engine, model, version, pattern_id, body, top_k, encoding,
                                                 content_type, audit_header)

            return tail
        if (params := paths.V2_INFER.match(path) or paths.V2_INFER_VERSION.match(path)) is not None:
            split = _first(headers, _HEADER)
            v2_model, v2_version = params["model"], params.get("version")
            codings = _all(headers, b"content-encoding")
            return lambda receive: infer_response(engine, v2_model, v2_version, partial(read, receive), split,
                                                  codings)
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        handler = self._handler(scope) if scope["type"] == "http" and scope["method"] == "POST" else None
        if handler is None:
            await self.app(scope, receive, send)
            return
        try:
            response = await handler(receive)
        except ServerError as exc:
            response = server_error_response(exc, "POST", scope["path"])
        except HTTPException as exc:  # 408 / 413 from the limits middleware's body guard
            response = http_exception_response(exc, "POST", scope["path"])
        except ClientDisconnect:
            response = disconnect_response()
        except Exception as exc:  # a bug: the JSON 500 FastAPI's handler would give (this sits outside it)
            response = unexpected_response(exc, "POST", scope["path"])
        await response(scope, receive, send)
