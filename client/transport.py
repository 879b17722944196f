"""HTTP to the server: retries with exponential backoff and jitter, Retry-After, and rate estimates.

Credentials go to the server's own origin only, and a URL on another origin is refused unless it
is a segment on a trusted segment host, fetched without them (ADR 0020). Every answer is read raw
in small pieces and decoded here (gzip, deflate or none; any other coding is refused), at most
64 KiB per step, and capped after decoding. One deadline holds a request, its retries and the waits
between them, down to every socket read of the status line and headers (:mod:`.deadline`).

Every transfer also feeds a moving average of the channel rate (bits per second), which the
runtime sends with its next plan request unless the user fixed the rate.
"""

from __future__ import annotations

import json
import random
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from qpart.client.deadline import deadline_client, transfer_deadline
from qpart.client.errors import (
    AnswerTooLargeError,
    ForeignOriginError,
    ServerAnswerError,
    ServerRejectedError,
    ServerUnavailableError,
    TransferDeadlineError,
)
from qpart.client.settings import DeviceSettings, origin_of

RETRY_STATUS = {429, 502, 503, 504}
MIN_RATE_SAMPLE_BYTES = 16 * 1024
RAW_PIECE_BYTES = 4096
"""Raw bytes read from the connection at a time."""
DECODED_PIECE_BYTES = 64 * 1024
"""The most one decoding step may produce: the cap is checked before a compression bomb fills memory."""
ACCEPT_ENCODING = "gzip, deflate"
"""The only codings this device decodes (bounded, by :class:`_Decoder`); any other is refused."""


class _Decoder:
    """Bounded decoding of one ``Content-Encoding`` (none, gzip or deflate): no step yields more
    than :data:`DECODED_PIECE_BYTES`. Brotli, zstd, stacked and unknown codings are refused."""

    def __init__(self, coding: str, what: str) -> None:
        self.coding = coding.strip().lower()
        self.what = what
        self._z: Any = None
        self._head = b""
        if self.coding in ("gzip", "x-gzip"):
            self._z = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif self.coding not in ("", "identity", "deflate"):
            shown = coding.encode("ascii", "backslashreplace").decode()[:80]
            raise ServerAnswerError(f"{what}: the answer's Content-Encoding {shown!r} is not gzip, "
                                    "deflate or none; refused")

    def feed(self, data: bytes) -> Iterator[bytes]:
        if self.coding in ("", "identity"):
            yield data
            return
        if self._z is None:  # deflate: zlib-wrapped or raw, told by its first two bytes
            self._head += data
            if len(self._head) < 2:
                return
            data, first = self._head, self._head
            wrapped = first[0] & 0x0F == 8 and ((first[0] << 8) | first[1]) % 31 == 0
            self._z = zlib.decompressobj(zlib.MAX_WBITS if wrapped else -zlib.MAX_WBITS)
        yield from self._steps(data)

    def _steps(self, data: bytes) -> Iterator[bytes]:
        try:
            while True:
                out = self._z.decompress(data, DECODED_PIECE_BYTES)
                if out:
                    yield out
                data = self._z.unconsumed_tail
                if not data and len(out) < DECODED_PIECE_BYTES:
                    return
        except zlib.error as exc:
            raise ServerAnswerError(f"{self.what}: the answer's {self.coding} body cannot be "
                                    f"decoded ({exc}); refused") from None

    def finish(self) -> Iterator[bytes]:
        if self._z is None and self._head:  # a one-byte deflate body
            self._z = zlib.decompressobj(-zlib.MAX_WBITS)
            yield from self._steps(self._head)
        if self._z is not None:
            yield from self._steps(b"")


def iter_decoded(response: httpx.Response, deadline: float, what: str) -> Iterator[bytes]:
    """The decoded body of a streamed ``response``, a small piece at a time, until ``deadline``
    (a :func:`time.monotonic` instant); past it, :class:`TransferDeadlineError`. The body is read
    raw and decoded here, bounded (:class:`_Decoder`): a coding other than gzip, deflate or none
    is refused with :class:`ServerAnswerError`."""
    if response.is_stream_consumed:  # held whole already (an in-memory answer): only cut in pieces
        body = response.content
        for start in range(0, len(body), DECODED_PIECE_BYTES):
            yield body[start:start + DECODED_PIECE_BYTES]
        return
    codings = [c for c in response.headers.get_list("content-encoding", split_commas=True) if c.strip()]
    if len(codings) > 1:
        shown = ", ".join(codings).encode("ascii", "backslashreplace").decode()[:80]
        raise ServerAnswerError(f"{what}: the answer's Content-Encoding {shown!r} stacks codings; refused")
    decoder = _Decoder(codings[0] if codings else "", what)

    def pieces() -> Iterator[bytes]:
        try:
            for chunk in response.iter_raw():  # as it arrives (a chunk_size would wait to fill it)
                for start in range(0, len(chunk), RAW_PIECE_BYTES):
                    _check(deadline, what)  # also where a piece decodes to nothing (a drip of padding)
                    yield from decoder.feed(chunk[start:start + RAW_PIECE_BYTES])
        except httpx.DecodingError as exc:
            raise ServerAnswerError(f"{what}: the answer cannot be decoded ({exc}); refused") from None
        yield from decoder.finish()

    for chunk in pieces():
        _check(deadline, what)
        yield chunk


def _check(deadline: float, what: str) -> None:
    if time.monotonic() > deadline:
        raise TransferDeadlineError(f"{what} outlived its deadline (QPART_DEVICE_TRANSFER_DEADLINE_S); "
                                    "the server sends too slowly")


def read_capped(response: httpx.Response, max_bytes: int, deadline: float, what: str) -> bytes:
    """The decoded body of a streamed ``response``, refused past ``max_bytes`` or ``deadline``."""
    body = bytearray()
    for chunk in iter_decoded(response, deadline, what):
        body += chunk
        if len(body) > max_bytes:
            raise AnswerTooLargeError(f"{what}: the answer is over {max_bytes} bytes once decoded "
                                      "(QPART_DEVICE_ANSWER_MAX_BYTES); refused")
    return bytes(body)


class RateEstimator:
    """Exponential moving average of measured transfer rates (bit/s), kept across runs in a file."""

    def __init__(self, smoothing: float, path: Path | None = None) -> None:
        self.smoothing = smoothing
        self.rate_bps: float | None = None
        self.path = path
        if path is not None and path.is_file():
            try:
                value = float(json.loads(path.read_text())["rate_bps"])
                self.rate_bps = value if 0 < value < float("inf") else None
            except (ValueError, KeyError, TypeError):
                self.rate_bps = None  # a damaged file only loses the history

    def save(self) -> None:
        """Persist the average (atomically) so the next run plans with it."""
        if self.path is None or self.rate_bps is None:
            return
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"rate_bps": self.rate_bps}))
        tmp.replace(self.path)

    def add(self, nbytes: int, seconds: float) -> None:
        """Record a transfer; tiny ones are dominated by latency and skipped."""
        if nbytes < MIN_RATE_SAMPLE_BYTES or seconds <= 0:
            return
        sample = nbytes * 8 / seconds
        self.rate_bps = sample if self.rate_bps is None else (
            self.smoothing * sample + (1 - self.smoothing) * self.rate_bps)


def _message(response: httpx.Response) -> str:
    try:
        body = response.json()
        return (str(body.get("error", body)) if isinstance(body, dict) else str(body))[:300]
    except ValueError:
        return response.text[:300] or response.reason_phrase


def one_line(text: str) -> str:
    """``text`` on one line (an error's own text may have line breaks)."""
    return " ".join(text.split())


def _attempts(n: int) -> str:
    return "1 attempt" if n == 1 else f"{n} attempts"


class Transport:
    """A retrying httpx client bound to one server."""

    def __init__(self, settings: DeviceSettings, client: httpx.Client | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.settings = settings
        self._credentials: dict[str, str] = {}
        if settings.token is not None:  # per request, to the server's origin only (ADR 0020)
            self._credentials["Authorization"] = f"Bearer {settings.token.get_secret_value()}"
        try:
            self.origin: str | None = origin_of(settings.server)
        except ValueError:
            self.origin = None
        self.client = client or deadline_client(base_url=settings.server, timeout=settings.timeout_s)
        self.rate = RateEstimator(settings.rate_smoothing, settings.cache_dir / "rate.json")
        self._sleep = sleep
        self._rng = random.Random()

    def close(self) -> None:
        """Close the connection pool and keep the rate estimate for the next run."""
        self.client.close()
        if self.settings.cache_dir.is_dir():
            self.rate.save()

    def backoff(self, attempt: int, retry_after: str | None = None) -> float:
        """Seconds to wait before retry ``attempt``: exponential, jittered, at least Retry-After."""
        return self._backoff(attempt, retry_after)

    def _backoff(self, attempt: int, retry_after: str | None) -> float:
        base = float(min(self.settings.max_backoff_s, self.settings.backoff_s * 2**attempt))
        wait = base * (0.5 + self._rng.random() / 2)  # jitter: 50-100% of the step
        if retry_after is not None:
            try:
                seconds = float(retry_after)
            except ValueError:
                seconds = 0.0  # an HTTP-date or garbage: fall back to the backoff step
            if 0 < seconds < float("inf"):
                wait = max(wait, min(seconds, self.settings.max_backoff_s))
        return wait

    def deadline(self, size_bytes: int = 0) -> float:
        """The :func:`time.monotonic` instant a transfer starting now of ``size_bytes`` must end by."""
        return (time.monotonic() + self.settings.transfer_deadline_s
                + size_bytes * 8 / self.settings.transfer_min_rate_bps)

    def _build(self, method: str, url: str, *, segment: bool, headers: dict[str, str] | None = None,
               **kwargs: Any) -> httpx.Request:
        """The request, with credentials where it goes to the server's own origin.

        Raises:
            ForeignOriginError: another origin, unless ``segment`` and it is a trusted segment host.
            ServerAnswerError: not a valid URL.
        """
        try:
            request = self.client.build_request(method, url, headers=headers, **kwargs)
        except httpx.InvalidURL as exc:
            shown = str(url).encode("ascii", "backslashreplace").decode()[:200]
            raise ServerAnswerError(f"the URL {shown!r} is not a valid URL ({exc}); refused") from None
        request.headers["Accept-Encoding"] = ACCEPT_ENCODING  # only codings decoded bounded here
        target = request.url
        try:
            origin = origin_of(str(target))
        except ValueError:
            origin = None
        if origin is not None and origin == self.origin:
            request.headers.update(self._credentials)
        elif not (segment and origin in self.settings.trusted_segment_hosts):
            what = "a segment" if segment else "the tail upload" if method == "POST" else "a request"
            hint = (" (list a segment host in QPART_DEVICE_TRUSTED_SEGMENT_HOSTS to fetch segments from "
                    "it without credentials)" if segment else
                    "; a device sends its data and credentials to its server's origin only")
            raise ForeignOriginError(
                f"the server's plan sends {what} to {target.scheme}://{target.netloc.decode()}, not to "
                f"the server's origin {self.origin}; refused{hint}")
        return request

    def check_url(self, url: str, *, segment: bool = False) -> None:
        """Refuse (:class:`ForeignOriginError`) a URL this device would not send ``segment`` or an
        upload to, before anything is sent anywhere."""
        self._build("POST" if not segment else "GET", url, segment=segment)

    def request(self, method: str, url: str, *, segment: bool = False, **kwargs: Any) -> httpx.Response:
        """Send with retries; raises typed errors for 4xx and for exhausted retries. The answer's
        body is read whole, capped at ``answer_max_bytes`` once decoded; all attempts and the waits
        between them end by one deadline (:meth:`deadline`), past which :class:`TransferDeadlineError`."""
        last = "no attempt made"
        deadline = self.deadline()
        for attempt in range(self.settings.retries + 1):
            request = self._build(method, url, segment=segment, **kwargs)
            try:
                response = self._send_capped(request, deadline)
            except TransferDeadlineError:
                raise  # retrying a dripping server would only multiply the wait
            except httpx.TransportError as exc:
                last = f"{type(exc).__name__}: {exc}"
                retry_after = None
            else:
                if response.status_code not in RETRY_STATUS:
                    if response.status_code >= 400:
                        raise ServerRejectedError(response.status_code, _message(response))
                    return response
                last = f"{response.status_code}: {_message(response)}"
                retry_after = response.headers.get("retry-after")
            if attempt < self.settings.retries:
                wait = self._backoff(attempt, retry_after)
                if time.monotonic() + wait >= deadline:  # never wait past it for a retry cut short
                    raise TransferDeadlineError(
                        f"{method} {request.url.path}: the server asks for a wait of {wait:.1f} s "
                        "before trying again (Retry-After or backoff), past the transfer's deadline "
                        f"(QPART_DEVICE_TRANSFER_DEADLINE_S); gave up after {_attempts(attempt + 1)} "
                        f"(last: {one_line(last)[:300]})")
                self._sleep(wait)
        raise ServerUnavailableError(
            f"{method} {url} failed after {self.settings.retries + 1} attempts (last: {last}); "
            f"check that the server at {self.settings.server} is up")

    def _send_capped(self, request: httpx.Request, deadline: float) -> httpx.Response:
        """``request``'s answer with its decoded body read (capped, before ``deadline``)."""
        what = f"{request.method} {request.url.path}"
        with transfer_deadline(deadline):
            try:
                response = self.client.send(request, stream=True)
                try:
                    body = read_capped(response, self.settings.answer_max_bytes, deadline, what)
                finally:
                    response.close()
            except TransferDeadlineError:  # from a socket read (head or body) or between pieces
                raise TransferDeadlineError(f"{what} outlived its deadline "
                                            "(QPART_DEVICE_TRANSFER_DEADLINE_S); the server sends "
                                            "too slowly") from None
        headers = [(k, v) for k, v in response.headers.multi_items()
                   if k.lower() not in ("content-encoding", "content-length", "transfer-encoding")]
        return httpx.Response(response.status_code, headers=headers, content=body, request=request)

    @contextmanager
    def stream(self, url: str, headers: dict[str, str], deadline: float | None = None
               ) -> Iterator[httpx.Response]:
        """One streaming GET of a segment (the caller handles resume and retries): with credentials
        on the server's origin, without on a trusted segment host; every socket operation of it, in
        the block too, ends by ``deadline``."""
        request = self._build("GET", url, segment=True, headers=headers)
        with transfer_deadline(deadline):
            response = self.client.send(request, stream=True)
            try:
                yield response
            finally:
                response.close()
