"""Bounded decoding and one-line refusals in the transport (issue 52, findings 1 and 5): only gzip,
deflate or no coding is decoded, a step at a time, and brotli, zstd, stacked or unknown codings,
undecodable bodies and invalid URLs are refused with one-line errors."""

from __future__ import annotations

import gzip
import json
import tracemalloc
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from qpart.client.errors import AnswerTooLargeError, ServerAnswerError
from qpart.client.settings import DeviceSettings
from qpart.client.transport import DECODED_PIECE_BYTES, Transport, iter_decoded
from tests.client.test_hostile_server import Hostile, _answers, _serve

BODY = json.dumps({"ok": True}).encode()


@pytest.fixture
def server() -> Iterator[Hostile]:
    yield from _serve(Hostile())


@pytest.fixture
def transport(server: Hostile, tmp_path: Path) -> Iterator[Transport]:
    settings = DeviceSettings(server=server.url, cache_dir=tmp_path, retries=0,  # type: ignore[call-arg]
                              timeout_s=2.0, answer_max_bytes=1 << 20)
    done = Transport(settings)
    yield done
    done.close()


def _one_line(exc: pytest.ExceptionInfo[BaseException]) -> str:
    text = str(exc.value)
    assert "\n" not in text and "\r" not in text
    return text


@pytest.mark.parametrize("coding", ["br", "zstd", "compress", "gzip, gzip", "gzip, br"])
def test_a_coding_other_than_gzip_deflate_or_none_is_refused(server, transport, coding):
    body = gzip.compress(gzip.compress(BODY)) if coding == "gzip, gzip" else b"\x1b\xff" * 1000
    server.routes["/v1/x"] = _answers(body, {"Content-Encoding": coding})
    with pytest.raises(ServerAnswerError) as exc:
        transport.request("GET", "/v1/x")
    assert coding.split(",")[0] in _one_line(exc)


def test_the_device_asks_only_for_codings_it_decodes_bounded(server, transport):
    server.routes["/v1/x"] = _answers(BODY)
    transport.request("GET", "/v1/x")
    assert server.seen[-1][1].get("Accept-Encoding") == "gzip, deflate"


@pytest.mark.parametrize("coding", ["gzip", "deflate", "identity"])
def test_gzip_deflate_and_none_are_decoded(server, transport, coding):
    body = {"gzip": gzip.compress, "deflate": zlib.compress}.get(coding, bytes)(BODY)
    server.routes["/v1/x"] = _answers(body, {"Content-Encoding": coding})
    assert transport.request("GET", "/v1/x").json() == {"ok": True}


def test_raw_deflate_is_decoded(server, transport):
    packer = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    server.routes["/v1/x"] = _answers(packer.compress(BODY) + packer.flush(), {"Content-Encoding": "deflate"})
    assert transport.request("GET", "/v1/x").json() == {"ok": True}


def test_a_corrupt_gzip_body_is_one_line(server, transport):
    server.routes["/v1/x"] = _answers(b"\x1f\x8b" + b"\x00" * 50, {"Content-Encoding": "gzip"})
    with pytest.raises(ServerAnswerError) as exc:
        transport.request("GET", "/v1/x")
    _one_line(exc)


def test_a_gzip_bomb_is_decoded_in_small_steps_with_bounded_memory(server, transport):
    bomb = gzip.compress(b"\x00" * (256 << 20), compresslevel=9)  # 256 MiB decoded
    server.routes["/v1/x"] = _answers(bomb, {"Content-Encoding": "gzip"})
    tracemalloc.start()
    try:
        with transport.stream(f"{server.url}/v1/x", {}) as response:
            largest = 0
            for chunk in iter_decoded(response, float("inf"), "a bomb"):
                largest = max(largest, len(chunk))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert largest <= DECODED_PIECE_BYTES
    assert peak < 8 << 20


def test_a_gzip_bomb_answer_stops_at_the_cap(server, transport):
    bomb = gzip.compress(b" " * (64 << 20), compresslevel=9)
    server.routes["/v1/x"] = _answers(bomb, {"Content-Encoding": "gzip"})
    with pytest.raises(AnswerTooLargeError) as exc:
        transport.request("GET", "/v1/x")
    _one_line(exc)


@pytest.mark.parametrize("url", ["http://[::1/v1/x", "http://host:99999/v1/x"])
def test_an_invalid_url_is_one_line(transport, url):
    with pytest.raises(ServerAnswerError) as exc:
        transport.check_url(url)
    _one_line(exc)
    with pytest.raises(ServerAnswerError):
        transport.request("POST", url, content=b"x")


def _bomb(coding: str) -> bytes:
    if coding == "br":
        brotli = pytest.importorskip("brotli")
        return bytes(brotli.compress(b"\x00" * (512 << 20), quality=5))
    zstandard = pytest.importorskip("zstandard")
    return bytes(zstandard.ZstdCompressor(level=3).compress(b"\x00" * (512 << 20)))


@pytest.mark.parametrize("coding", ["br", "zstd"])
def test_a_brotli_or_zstd_bomb_is_refused_before_it_is_decoded(server, transport, coding):
    server.routes["/v1/x"] = _answers(_bomb(coding), {"Content-Encoding": coding})
    tracemalloc.start()
    try:
        with pytest.raises(ServerAnswerError) as exc:
            transport.request("GET", "/v1/x")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert coding in _one_line(exc)
    assert peak < 8 << 20


@pytest.mark.parametrize("coding", ["br", "gzip, gzip"])
def test_a_segment_in_a_refused_coding_is_refused(server, transport, coding):
    body = gzip.compress(gzip.compress(BODY)) if coding == "gzip, gzip" else _bomb("br")
    server.routes["/seg"] = _answers(body, {"Content-Encoding": coding})
    with transport.stream(f"{server.url}/seg", {}) as response, pytest.raises(ServerAnswerError) as exc:
        b"".join(iter_decoded(response, float("inf"), "a segment"))
    _one_line(exc)
