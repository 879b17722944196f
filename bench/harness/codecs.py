"""The input codecs the naive baselines send: one table of Pillow formats, and the encoder.

:mod:`bench.micro.input_codecs` measures their bytes, times and accuracy on the test split; the
grid's ``input-*`` baselines (:mod:`bench.e2e.baselines`) send them.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import numpy.typing as npt
from PIL import Image

# name -> (Pillow format, save options)
CODECS: dict[str, tuple[str, dict[str, Any]]] = {
    "png": ("PNG", {"optimize": True}),
    **{f"webp@{q}": ("WEBP", {"quality": q, "method": 6}) for q in (50, 75, 90, 95)},
    **{f"jpeg@{q}": ("JPEG", {"quality": q}) for q in (50, 75, 90, 95)},
}


def encode(pixels: npt.NDArray[np.uint8], codec: str) -> bytes:
    """One grayscale image ``[H, W]`` uint8 in ``codec``."""
    fmt, options = CODECS[codec]
    buf = io.BytesIO()
    Image.fromarray(pixels, "L").save(buf, fmt, **options)
    return buf.getvalue()
