"""``qpart device profile`` asks the server for the model's version through the device's Transport
(issue 52, review finding 6): the answer cap, the deadline, the token and the origin rules hold, and
a hostile answer ends the command with one line."""

from __future__ import annotations

import json
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.client.test_hostile_server import TOKEN, Hostile, _drip, _send, _serve


class _Asked(Exception):
    """Raised in place of profiling: the version the command settled on."""


@pytest.fixture
def server() -> Iterator[Hostile]:
    yield from _serve(Hostile())


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("QPART_DEVICE_TOKEN", TOKEN)
    monkeypatch.setenv("QPART_DEVICE_RETRIES", "0")
    monkeypatch.setenv("QPART_DEVICE_TIMEOUT_S", "2")
    monkeypatch.setenv("QPART_DEVICE_CACHE_DIR", str(tmp_path / "cache"))

    def profile_device(*args: object, **kwargs: object) -> None:
        raise _Asked(args[2])

    monkeypatch.setattr("qpart.client.profiler.profile_device", profile_device)


def _profile(server: Hostile, tmp_path: Path) -> tuple[int, str, BaseException | None]:
    from qpart.client.cli import device_app

    result = CliRunner().invoke(device_app, ["profile", "--model", "m", "--out", str(tmp_path / "p.json"),
                                             "--server", server.url])
    return result.exit_code, result.output, result.exception


def test_version_is_asked_with_the_token(server: Hostile, tmp_path: Path) -> None:
    def answer(handler: BaseHTTPRequestHandler) -> None:
        _send(handler, 200, json.dumps({"versions": ["1", "7"]}).encode(),
              {"Content-Type": "application/json"})

    server.routes["/v2/models/m"] = answer
    _, _, exc = _profile(server, tmp_path)
    assert isinstance(exc, _Asked) and exc.args == ("7",)
    (path, headers), = server.seen
    assert path == "/v2/models/m" and headers.get("Authorization") == f"Bearer {TOKEN}"


def test_oversized_answer_is_one_line_error(server: Hostile, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QPART_DEVICE_ANSWER_MAX_BYTES", str(64 * 1024))
    server.routes["/v2/models/m"] = _drip(b'{"versions": ["1"], "pad": "', 0, b"x" * 4096)
    code, output, exc = _profile(server, tmp_path)
    assert code == 2 and not isinstance(exc, _Asked)
    lines = output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: cannot ask") and "over" in lines[0]
    assert "--version" in lines[0]


@pytest.mark.parametrize("body", [b"not json", b'{"versions": []}', b'{"versions": [{"a": 1}]}',
                                  b'{"no": 1}'])
def test_malformed_answer_is_one_line_error(server: Hostile, tmp_path: Path, body: bytes) -> None:
    server.routes["/v2/models/m"] = lambda handler: _send(handler, 200, body)
    code, output, exc = _profile(server, tmp_path)
    assert code == 2 and not isinstance(exc, _Asked)
    assert len(output.strip().splitlines()) == 1


def test_rejection_is_one_line_error(server: Hostile, tmp_path: Path) -> None:
    code, output, _ = _profile(server, tmp_path)  # no route: 404
    assert code == 2 and len(output.strip().splitlines()) == 1 and "404" in output
