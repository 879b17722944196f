"""The lossy input-image codec (ADR 0015): one encoder, deterministic, and the plan ids it names."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from qpart.models.image_codecs import decode_webp, encode_webp, parse_rung_id, rung_id, webp_encoder


def test_rung_ids_round_trip_and_nothing_else_parses():
    for q in (1, 50, 99, 100):
        assert parse_rung_id(rung_id("webp", q)) == ("webp", q)
    for other in ("input-png", "input-webp@0", "input-webp@101", "input-webp@075", "c0-abc", "input-jpeg@90",
                  "input-webp@75x", ""):
        assert parse_rung_id(other) is None


def test_the_encoder_is_deterministic_and_writes_the_simple_lossy_format():
    pixels = np.random.default_rng(1).integers(0, 256, (28, 28), dtype=np.uint8)
    gray = Image.fromarray(pixels, "L")
    body = encode_webp(gray, 75)
    assert body == encode_webp(gray, 75) == encode_webp(gray.convert("RGB"), 75)  # gray is written as RGB
    assert body[12:16] == b"VP8 "  # no VP8X: no alpha, no metadata
    rgba = gray.convert("RGBA")
    rgba.info["icc_profile"] = b"x" * 100
    assert encode_webp(rgba, 75) == body  # alpha and metadata are dropped
    assert len(encode_webp(gray, 30)) < len(body) < len(encode_webp(gray, 95))
    back = decode_webp(body)
    assert back.size == (28, 28) and back.mode == "RGB"
    assert "libwebp" in webp_encoder() and "method 6" in webp_encoder()


def test_a_quality_outside_1_to_100_or_a_side_webp_cannot_hold_is_refused():
    from qpart.models.errors import ImageCodecError

    with pytest.raises(ImageCodecError, match=r"outside 1\.\.100"):
        encode_webp(Image.new("L", (4, 4)), 0)
    with pytest.raises(ImageCodecError, match="16383 pixels a side"):
        encode_webp(Image.new("L", (16_384, 1)), 75)
    assert encode_webp(Image.new("L", (16_383, 1)), 75)[12:16] == b"VP8 "
