"""FastAPI dependencies: the engine and the link maker from app state, bearer-token auth, and raw
body reading."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Request
from pydantic import SecretStr

from qpart.server.api.responses import Links
from qpart.server.engine import Engine
from qpart.server.errors import ForbiddenError, UnauthorizedError


async def get_engine(request: Request) -> Engine:
    """The engine built in the lifespan hook."""
    engine: Engine = request.app.state.engine
    return engine


EngineDep = Annotated[Engine, Depends(get_engine)]


async def get_links(request: Request) -> Links:
    """The link maker built with the app (its base is QPART_PUBLIC_URL)."""
    links: Links = request.app.state.links
    return links


LinksDep = Annotated[Links, Depends(get_links)]


def bearer_ok(token: SecretStr | None, authorization: str) -> bool:
    """Whether an ``Authorization`` header value carries ``token`` (always, when no token is set;
    never with an empty credential, whatever the token)."""
    if token is None:
        return True
    scheme, _, value = authorization.strip().partition(" ")
    value = value.strip()
    expected = token.get_secret_value().encode()
    return scheme.lower() == "bearer" and bool(value) and hmac.compare_digest(value.encode(), expected)


async def require_token(request: Request) -> None:
    """Checks ``Authorization: Bearer <token>`` when the server has a token configured."""
    if not bearer_ok(request.app.state.settings.auth_token, request.headers.get("authorization", "")):
        raise UnauthorizedError("missing or invalid bearer token: send 'Authorization: Bearer <token>'")


def models_visible(request: Request) -> bool:
    """Whether the caller may see the served models' names and versions: always, unless
    ``QPART_PROTECT_MODELS`` is on and a token is set, and then with the token (ADR 0009)."""
    settings = request.app.state.settings
    authorization = request.headers.get("authorization", "")
    return not settings.protect_models or bearer_ok(settings.auth_token, authorization)


async def require_model_token(request: Request) -> None:
    """The inference token on segments, model listings and ``/metrics`` too, unless
    ``QPART_PROTECT_MODELS`` is false (a level-0 segment is the whole model's weights, and the
    metrics' labels name every model and version: ADR 0009)."""
    if not models_visible(request):
        raise UnauthorizedError("missing or invalid bearer token: send 'Authorization: Bearer <token>'")


async def require_admin(request: Request) -> None:
    """The admin API is off unless ``QPART_ADMIN_TOKEN`` is set, and then needs that token."""
    token = request.app.state.settings.admin_token
    if token is None:
        raise ForbiddenError("the admin API is disabled; set QPART_ADMIN_TOKEN to enable it")
    if not bearer_ok(token, request.headers.get("authorization", "")):
        raise UnauthorizedError("missing or invalid admin token: send 'Authorization: Bearer <token>'")


async def read_body(request: Request) -> bytes:
    """The raw body (size and arrival time are enforced by the limits middleware)."""
    return await request.body()
