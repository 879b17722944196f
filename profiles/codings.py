"""The upload codings profiles hold figures for: each has a ``<coding>_ratio`` field in
:class:`profiles.artifacts.CutProfile` and a ``<coding>_s`` field in
:class:`profiles.devices.MeasuredHeads` (ADR 0007). ``kernels.coding.Coding`` names the same
codings; ``tests/server/test_schemas.py`` checks that every layer agrees."""

from __future__ import annotations

from typing import Literal, get_args

from profiles.errors import UnknownCodingError

UploadCoding = Literal["deflate", "zstd"]
UPLOAD_CODINGS: tuple[str, ...] = get_args(UploadCoding)


def coding_field(coding: str, figure: Literal["ratio", "s"]) -> str:
    """The name of the field holding ``coding``'s ``figure``.

    Raises:
        UnknownCodingError: no profile field holds figures of ``coding``.
    """
    if coding not in UPLOAD_CODINGS:
        raise UnknownCodingError(f"unknown upload coding {coding!r}: use one of {', '.join(UPLOAD_CODINGS)}")
    return f"{coding}_{figure}"
