"""Request bodies in a Content-Encoding: ``identity`` (as is), ``deflate`` (zlib, RFC 9110 8.4.1.2)
or ``zstd`` (one Zstandard frame, RFC 8878).

Devices may compress activation packets on the tail route (``kernels.coding``; the plan's
``upload_encoding`` says when and how it pays). Other routes take identity only and answer 415 otherwise.
The inflated body is bounded by what the route can use.
"""

from __future__ import annotations

from qpart.kernels import KernelError, OversizeError
from qpart.kernels.coding import Coding, decode
from qpart.server.errors import BadRequestError, PayloadTooLargeError, UnsupportedMediaTypeError

IDENTITY = "identity"


def content_coding(values: list[str]) -> str:
    """The one coding the ``Content-Encoding`` field values name: identity when none (or only
    identity) is named, else the one named.

    Raises:
        UnsupportedMediaTypeError: a coding other than deflate or zstd, or more than one (415).
    """
    codings = [c.strip().lower() for value in values for c in value.split(",")]
    named = [c for c in codings if c and c != IDENTITY]
    if not named:
        return IDENTITY
    if len(named) > 1 or named[0] not in {c.value for c in Coding}:
        raise UnsupportedMediaTypeError(
            f"Content-Encoding {', '.join(named)!r} is not supported; send the body as is or with "
            "'Content-Encoding: deflate' (zlib) or 'zstd' (one Zstandard frame), one coding")
    return named[0]


def decode_content(body: bytes, coding: str, limit: int) -> bytes:
    """``body`` with ``coding`` (from :func:`content_coding`) undone; at most ``limit`` bytes.

    Raises:
        PayloadTooLargeError: the body decodes past ``limit`` (413).
        BadRequestError: not a complete, valid zlib stream or Zstandard frame (400).
    """
    if coding == IDENTITY:
        return body
    try:
        return decode(body, coding, max_bytes=limit)
    except OversizeError as exc:
        raise PayloadTooLargeError(f"the {coding} body decodes past the {limit} bytes this route "
                                   "can use") from exc
    except KernelError as exc:
        raise BadRequestError(f"invalid {coding} body: {exc}") from exc


def identity_only(values: list[str]) -> None:
    """Refuse (415) any coding but identity: the route takes plain bodies only."""
    codings = [c.strip().lower() for value in values for c in value.split(",")]
    if any(c and c != IDENTITY for c in codings):
        raise UnsupportedMediaTypeError("this route takes bodies as is (no Content-Encoding); "
                                        "deflate and zstd are taken on the tail route only")
