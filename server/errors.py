"""Exception tree of the ``server`` package; ``server.api.http_errors`` maps it to HTTP responses.

::

    ServerError
    ├── ClientError                  the request is wrong; the message says how to fix it
    │   ├── BadRequestError          400: malformed body or parameters
    │   ├── UnauthorizedError        401: missing or wrong bearer token
    │   ├── ForbiddenError           403: a route disabled by configuration (admin)
    │   ├── NotFoundError            404: unknown model, version, pattern, segment or audit
    │   ├── ConflictError            409: e.g. a second upload for one audit
    │   ├── GoneError                410: e.g. an audit past its QPART_AUDIT_TTL_S
    │   ├── PayloadTooLargeError     413: body above the configured limit
    │   ├── RequestTimeoutError      408: the body did not arrive in time
    │   ├── UnsupportedMediaTypeError 415: a Content-Encoding the route does not take
    │   ├── RangeNotSatisfiableError 416: a Range outside the segment
    │   └── UnprocessableError       422: well-formed but unsatisfiable (e.g. a deadline)
    ├── TailFailedError              500: a tail batch raised; its requests fail, the model serves on
    └── ServiceError                 the server cannot serve it now
        ├── OverloadedError          503 + Retry-After: the tail queue is full
        ├── NotReadyError            503: the model is not loaded (the reason is given)
        └── DeadlineExceededError    504: the request took longer than its timeout
"""

from __future__ import annotations


class ServerError(Exception):
    """Base class of every error raised by :mod:`server`."""

    status = 500
    headers: dict[str, str] | None = None


class ClientError(ServerError):
    """The request is at fault."""

    status = 400


class BadRequestError(ClientError):
    """Malformed body or parameters."""

    status = 400


class UnauthorizedError(ClientError):
    """Missing or invalid bearer token."""

    status = 401


class ForbiddenError(ClientError):
    """The route is disabled by configuration."""

    status = 403


class NotFoundError(ClientError):
    """Unknown model, version, pattern, segment or route.

    ``listing`` names what there is instead (the served models, a model's versions): it follows
    the message for a caller who may see model names, and is left out for one who may not
    (``QPART_PROTECT_MODELS`` without the token, ADR 0009); ``bare`` is the message without it.
    """

    status = 404

    def __init__(self, message: str, *, listing: str = "") -> None:
        super().__init__(f"{message}; {listing}" if listing else message)
        self.bare = message
        self.listing = listing


class ConflictError(ClientError):
    """The request conflicts with what the server already did (409), e.g. a second audit upload."""

    status = 409


class GoneError(ClientError):
    """What the request names existed but is gone for good (410), e.g. an expired audit."""

    status = 410


class RequestTimeoutError(ClientError):
    """The request body did not arrive within the configured time."""

    status = 408


class PayloadTooLargeError(ClientError):
    """The request body exceeds the configured limit."""

    status = 413


class UnsupportedMediaTypeError(ClientError):
    """A request body in a Content-Encoding the route does not take (415)."""

    status = 415


class RangeNotSatisfiableError(ClientError):
    """A Range header outside the resource."""

    status = 416


class UnprocessableError(ClientError):
    """A well-formed request that cannot be satisfied (a deadline below the fastest plan)."""

    status = 422


class TailFailedError(ServerError):
    """Running a tail batch raised: a server bug, confined to that batch's requests (500)."""

    status = 500


class ServiceError(ServerError):
    """The server cannot serve the request now."""

    status = 503


class OverloadedError(ServiceError):
    """The bounded tail queue is full; retry after ``retry_after_s``."""

    status = 503

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class NotReadyError(ServiceError):
    """The model is not loaded, or the server is draining."""

    status = 503


class DeadlineExceededError(ServiceError):
    """The request exceeded the per-request timeout."""

    status = 504
