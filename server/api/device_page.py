"""The browser device (issue 25) at ``/device/``: a static page that plans, runs the ONNX head with
onnxruntime-web and uploads the packet. Its files are package data in ``server/web/``; the runtime
(``web/vendor/``) is copied there by ``make web`` from the pinned npm package, never from a CDN."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from fastapi import APIRouter, Request, Response
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse

from qpart.server.errors import NotFoundError, NotReadyError

WEB_DIR = Path(__file__).resolve().parent.parent / "web"
PREFIX = "/device"
VENDOR = "vendor"
VENDOR_FILES = ("ort.wasm.min.mjs", "ort-wasm-simd-threaded.mjs", "ort-wasm-simd-threaded.wasm")
"""onnxruntime-web's WASM-only ES module, its Emscripten loader and the WASM binary: all the page
loads of the npm package (``make web`` copies these alone)."""

MEDIA_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".mjs": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".png": "image/png",
    ".wasm": "application/wasm",  # WebAssembly.instantiateStreaming insists on it
}
MISSING_RUNTIME = ("the browser device's runtime (onnxruntime-web) is not built into server/web/vendor/: "
                   "run `make web` (npm ci of the pinned package, then a copy of its WASM files)")


def content_security_policy(public_url: str) -> str:
    """The page runs only its own scripts and WebAssembly, and talks only to this server (and to
    ``QPART_PUBLIC_URL``'s origin, where segment and tail links point when it is set)."""
    connect = "'self'"
    parts = urlsplit(public_url)
    if parts.scheme and parts.netloc:
        connect += f" {parts.scheme}://{parts.netloc}"
    return ("default-src 'none'; script-src 'self' 'wasm-unsafe-eval'; style-src 'self'; "
            f"img-src 'self' blob: data:; connect-src {connect}; base-uri 'none'; form-action 'none'; "
            "frame-ancestors 'none'")


def _index(web_dir: Path) -> dict[str, Path]:
    """The servable files under ``web_dir`` by their path relative to it (a fixed table: nothing
    outside it is ever opened, whatever the request path says)."""
    if not web_dir.is_dir():
        return {}
    return {p.relative_to(web_dir).as_posix(): p for p in sorted(web_dir.rglob("*"))
            if p.is_file() and p.suffix in MEDIA_TYPES}


def missing_runtime_page() -> str:
    """What ``/device/`` answers (503) when ``make web`` has not run."""
    return ("<!doctype html><html lang=en><meta charset=utf-8><title>QPART device: not built</title>"
            f"<h1>The browser device is not built</h1><p>{MISSING_RUNTIME}.</p></html>")


def device_router(web_dir: Path = WEB_DIR) -> APIRouter:
    """The routes of the page: ``/device`` (redirect), ``/device/`` and the files beside it."""
    router = APIRouter(include_in_schema=False)
    files = _index(web_dir)
    built = all(f"{VENDOR}/{name}" in files for name in VENDOR_FILES)

    def headers(request: Request) -> dict[str, str]:
        # no-cache: the browser revalidates, so a rebuilt page or runtime is picked up at once.
        # Cross-origin isolation (COOP + COEP) gives the page 5 us timers instead of 100 us ones,
        # which its encode phase (tens of microseconds) needs; everything it loads is its own.
        return {"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff",
                "Cross-Origin-Opener-Policy": "same-origin", "Cross-Origin-Embedder-Policy": "require-corp",
                "Content-Security-Policy": content_security_policy(request.app.state.settings.public_url)}

    @router.api_route(PREFIX, methods=["GET", "HEAD"])
    def device_redirect() -> Response:
        return RedirectResponse(f"{PREFIX}/", status_code=308)

    @router.api_route(f"{PREFIX}/", methods=["GET", "HEAD"])
    def device_page(request: Request) -> Response:
        if not built or "index.html" not in files:
            return HTMLResponse(missing_runtime_page(), status_code=503, headers=headers(request))
        return FileResponse(files["index.html"], media_type=MEDIA_TYPES[".html"], headers=headers(request))

    @router.api_route(PREFIX + "/{name:path}", methods=["GET", "HEAD"])
    def device_file(name: str, request: Request) -> Response:
        path = files.get(name)
        if path is None:
            if name.startswith(f"{VENDOR}/") and not built:
                raise NotReadyError(MISSING_RUNTIME)
            raise NotFoundError(f"no file {name!r} in the device page; it starts at {PREFIX}/")
        return FileResponse(path, media_type=MEDIA_TYPES[path.suffix], headers=headers(request))

    return router
