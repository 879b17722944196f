"""Server fixtures: an app on the committed fmnist-cnn artifact, driven in process."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from qpart.server.api.app import create_app
from qpart.server.settings import ServerSettings


def make_client(artifacts: Path, **overrides: object) -> TestClient:
    settings = ServerSettings(artifacts=artifacts, **overrides)  # type: ignore[arg-type]
    return TestClient(create_app(settings), raise_server_exceptions=False)


@pytest.fixture(scope="module")
def client(cnn_only: Path) -> Iterator[TestClient]:
    with make_client(cnn_only) as c:
        yield c


@pytest.fixture(scope="module")
def plan_body() -> dict[str, object]:
    return {"model": "fmnist-cnn", "accuracy_demand": 0.01, "rate_bps": 5e6, "device": "raspberry-pi-4"}


def slow_decoding(monkeypatch: pytest.MonkeyPatch, content_s: float, packet_s: float) -> None:
    """Make undoing a body's Content-Encoding take ``content_s`` longer and dequantizing a packet
    ``packet_s`` longer, on the tail route and the fast path alike."""
    import time

    from qpart.server import engine
    from qpart.server.api import inference
    def slowed(real: Callable[..., object], seconds: float) -> Callable[..., object]:
        def wrapped(*args: object, **kwargs: object) -> object:
            time.sleep(seconds)
            return real(*args, **kwargs)
        return wrapped

    monkeypatch.setattr(inference, "decode_content", slowed(inference.decode_content, content_s))
    monkeypatch.setattr(engine, "decode_activation", slowed(engine.decode_activation, packet_s))
