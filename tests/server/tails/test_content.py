"""Content-Encoding of request bodies: one coding (identity, deflate or zstd) or a 415 that says why."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from qpart.kernels.coding import deflate, zstd_compress
from qpart.server.errors import BadRequestError, PayloadTooLargeError, UnsupportedMediaTypeError
from qpart.server.tails.content import content_coding, decode_content, identity_only


@pytest.mark.parametrize(("values", "coding"), [
    ([], "identity"), ([""], "identity"), (["identity"], "identity"), (["IDENTITY, identity"], "identity"),
    (["deflate"], "deflate"), ([" Deflate "], "deflate"), (["deflate, identity"], "deflate"),
    (["identity", "deflate"], "deflate"), (["zstd"], "zstd"), (["identity, ZSTD"], "zstd"),
])
def test_one_coding_is_named(values, coding):
    assert content_coding(values) == coding


@pytest.mark.parametrize("values", [["gzip"], ["br"], ["deflate, gzip"], ["deflate", "deflate"],
                                    ["deflate", "gzip"], ["x-deflate"], ["zstd, deflate"],
                                    ["zstd", "zstd"]])
def test_anything_else_is_a_415_naming_it(values):
    with pytest.raises(UnsupportedMediaTypeError, match="not supported"):
        content_coding(values)


@given(st.lists(st.text(max_size=30), max_size=4))
def test_any_header_values_give_a_coding_or_a_415(values):
    with contextlib.suppress(UnsupportedMediaTypeError):
        assert content_coding(values) in ("identity", "deflate", "zstd")


def test_decoding_is_bounded_and_refuses_bad_streams():
    assert decode_content(b"raw", "identity", 1) == b"raw"
    assert decode_content(deflate(b"x" * 100), "deflate", 100) == b"x" * 100
    with pytest.raises(PayloadTooLargeError, match="the 100 bytes"):
        decode_content(deflate(b"x" * 101), "deflate", 100)
    with pytest.raises(BadRequestError, match="invalid deflate"):
        decode_content(b"nope", "deflate", 100)
    assert decode_content(zstd_compress(b"x" * 100), "zstd", 100) == b"x" * 100
    with pytest.raises(PayloadTooLargeError, match="the 100 bytes"):
        decode_content(zstd_compress(b"x" * 101), "zstd", 100)
    with pytest.raises(BadRequestError, match="invalid zstd"):
        decode_content(b"nope", "zstd", 100)


def test_identity_only_routes_refuse_codings():
    identity_only([])
    identity_only(["identity"])
    with pytest.raises(UnsupportedMediaTypeError, match="tail route only"):
        identity_only(["deflate"])
    with pytest.raises(UnsupportedMediaTypeError, match="tail route only"):
        identity_only(["zstd"])
