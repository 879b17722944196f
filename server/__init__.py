"""The HTTP service: plans, head segments and tail inference over the committed artifacts
(docs/guide/serving.md).

The public API, each name loaded on first use (``qpart.lazy_face``): import from here, not from
the modules beside it.
"""

from typing import TYPE_CHECKING

from qpart.lazy_face import attach

if TYPE_CHECKING:
    from qpart.server.api.app import create_app
    from qpart.server.api.main import serve
    from qpart.server.errors import (
        BadRequestError,
        ClientError,
        ConflictError,
        DeadlineExceededError,
        ForbiddenError,
        GoneError,
        NotFoundError,
        NotReadyError,
        OverloadedError,
        PayloadTooLargeError,
        RangeNotSatisfiableError,
        RequestTimeoutError,
        ServerError,
        ServiceError,
        TailFailedError,
        UnauthorizedError,
        UnprocessableError,
        UnsupportedMediaTypeError,
    )
    from qpart.server.settings import ServerSettings

__all__ = [
    "BadRequestError",
    "ClientError",
    "ConflictError",
    "DeadlineExceededError",
    "ForbiddenError",
    "GoneError",
    "NotFoundError",
    "NotReadyError",
    "OverloadedError",
    "PayloadTooLargeError",
    "RangeNotSatisfiableError",
    "RequestTimeoutError",
    "ServerError",
    "ServerSettings",
    "ServiceError",
    "TailFailedError",
    "UnauthorizedError",
    "UnprocessableError",
    "UnsupportedMediaTypeError",
    "create_app",
    "serve",
]

if not TYPE_CHECKING:  # mypy reads the imports above; a typed __getattr__ would hide misspellings
    __getattr__, __dir__ = attach(__name__, __file__)
