"""Request bodies in a Content-Encoding: ``identity`` (as is) or ``deflate`` (zlib, RFC 9110 8.4.1.2).

Devices may deflate activation packets (``kernels.coding``; the plan's ``upload_encoding`` says
when it pays). The inflated body obeys the same byte limit as a plain one.
"""

from __future__ import annotations

from kernels import KernelError, OversizeError
from kernels.coding import inflate
from server.errors import BadRequestError, PayloadTooLargeError, UnsupportedMediaTypeError


def decode_content(body: bytes, encoding: str | None, limit: int) -> bytes:
    """``body`` with its Content-Encoding undone; at most ``limit`` bytes.

    Raises:
        UnsupportedMediaTypeError: an encoding other than identity or deflate (415).
        PayloadTooLargeError: the body inflates past ``limit`` (413).
        BadRequestError: not a complete, valid zlib stream (400).
    """
    coding = (encoding or "identity").strip().lower()
    if coding == "identity":
        return body
    if coding != "deflate":
        raise UnsupportedMediaTypeError(f"Content-Encoding '{encoding}' is not supported; send the body "
                                        "as is or with 'Content-Encoding: deflate' (zlib)")
    try:
        return inflate(body, max_bytes=limit)
    except OversizeError as exc:
        raise PayloadTooLargeError(f"the deflated body inflates past the limit of {limit} bytes") from exc
    except KernelError as exc:
        raise BadRequestError(f"invalid deflate body: {exc}") from exc
