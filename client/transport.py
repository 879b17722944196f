"""HTTP to the server: retries with exponential backoff and jitter, Retry-After, and rate estimates.

Every transfer also feeds a moving average of the channel rate (bits per second), which the
runtime sends with its next plan request unless the user fixed the rate.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from qpart.client.errors import ServerRejectedError, ServerUnavailableError
from qpart.client.settings import DeviceSettings

RETRY_STATUS = {429, 502, 503, 504}
MIN_RATE_SAMPLE_BYTES = 16 * 1024


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
        return str(body.get("error", body)) if isinstance(body, dict) else str(body)
    except ValueError:
        return response.text[:300] or response.reason_phrase


class Transport:
    """A retrying httpx client bound to one server."""

    def __init__(self, settings: DeviceSettings, client: httpx.Client | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.settings = settings
        headers = {}
        if settings.token is not None:
            headers["Authorization"] = f"Bearer {settings.token.get_secret_value()}"
        self.client = client or httpx.Client(base_url=settings.server, timeout=settings.timeout_s,
                                             headers=headers)
        if client is not None:
            self.client.headers.update(headers)
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

    def request(self, method: str, url: str, **kwargs: object) -> httpx.Response:
        """Send with retries; raises typed errors for 4xx and for exhausted retries."""
        last = "no attempt made"
        for attempt in range(self.settings.retries + 1):
            try:
                response = self.client.request(method, url, **kwargs)  # type: ignore[arg-type]
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
                self._sleep(self._backoff(attempt, retry_after))
        raise ServerUnavailableError(
            f"{method} {url} failed after {self.settings.retries + 1} attempts (last: {last}); "
            f"check that the server at {self.settings.server} is up")

    @contextmanager
    def stream(self, url: str, headers: dict[str, str]) -> Iterator[httpx.Response]:
        """One streaming GET (the caller handles resume and retries)."""
        with self.client.stream("GET", url, headers=headers) as response:
            yield response
