"""``/device/``: the browser device's static files, their types and policy, and the clear answer
when ``make web`` has not put onnxruntime-web beside them."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from qpart.server.api.device_page import VENDOR_FILES, WEB_DIR, content_security_policy, device_router
from qpart.server.api.http_errors import install_error_handlers
from qpart.server.settings import ServerSettings


def page_client(web_dir: Path, tmp_path: Path) -> TestClient:
    """Only the page's routes and the error handlers (no models to load)."""
    app = FastAPI()
    app.state.settings = ServerSettings(artifacts=tmp_path)
    install_error_handlers(app)
    app.include_router(device_router(web_dir))
    return TestClient(app)


@pytest.fixture
def built(tmp_path) -> Path:
    """A copy of the page's own files with stand-in runtime files."""
    web = tmp_path / "web"
    shutil.copytree(WEB_DIR, web, ignore=shutil.ignore_patterns("vendor"))
    (web / "vendor").mkdir()
    for name in VENDOR_FILES:
        (web / "vendor" / name).write_bytes(b"\0asm" if name.endswith(".wasm") else b"export {};")
    return web


def test_the_page_and_its_files_are_served_with_their_types(built, tmp_path):
    client = page_client(built, tmp_path)
    page = client.get("/device/")
    assert page.status_code == 200 and "QPART browser device" in page.text
    assert page.headers["content-type"].startswith("text/html")
    assert "script-src 'self' 'wasm-unsafe-eval'" in page.headers["content-security-policy"]
    types = {name: client.get(f"/device/{name}").headers["content-type"]
             for name in ("device.js", "packet.js", "device.css", "samples/t10k-00000.png",
                          "vendor/ort.wasm.min.mjs", "vendor/ort-wasm-simd-threaded.wasm")}
    assert types["vendor/ort-wasm-simd-threaded.wasm"] == "application/wasm"
    assert types["vendor/ort.wasm.min.mjs"].startswith("text/javascript")
    assert types["samples/t10k-00000.png"] == "image/png"
    assert client.head("/device/packet.js").status_code == 200


def test_device_without_a_slash_redirects_to_the_page(built, tmp_path):
    answer = page_client(built, tmp_path).get("/device", follow_redirects=False)
    assert answer.status_code == 308 and answer.headers["location"] == "/device/"


def test_without_make_web_the_page_says_to_run_it(built, tmp_path):
    shutil.rmtree(built / "vendor")
    client = page_client(built, tmp_path)
    page = client.get("/device/")
    assert page.status_code == 503 and "make web" in page.text
    runtime = client.get("/device/vendor/ort.wasm.min.mjs")
    assert runtime.status_code == 503 and "make web" in runtime.json()["error"]


@pytest.mark.parametrize("path", ["/device/nothing.js", "/device/../app.py", "/device/%2e%2e/app.py",
                                  "/device/vendor/../../app.py", "/device/.built"])
def test_only_the_pages_own_files_are_served(built, tmp_path, path):
    answer = page_client(built, tmp_path).get(path)
    assert answer.status_code == 404 and "error" in answer.json()


def test_connect_src_names_the_public_url_origin_only():
    assert "connect-src 'self';" in content_security_policy("")
    policy = content_security_policy("https://edge.example.org/qpart/")
    assert "connect-src 'self' https://edge.example.org;" in policy


def test_the_served_app_mounts_the_page(client):
    answer = client.get("/device/packet.js")
    assert answer.status_code == 200 and "encodePacket" in answer.text
    assert "/device/" not in client.get("/openapi.json").json()["paths"]
