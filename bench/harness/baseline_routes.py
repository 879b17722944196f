"""The server side of ``bench.e2e``'s naive baselines (issue 27), around the product's app.

- ``POST /bench/input/{model}``: a compressed input image (PNG, WebP or JPEG, as the device holds it
  before any preprocessing): decoded with Pillow, preprocessed as the model card declares, and run
  through the whole float model on the product's own tail pool (the tail of cut 0, batched as any
  tail request): remote computation on compressed data, SC2's naive baseline.
- ``POST /bench/ae/{model}/{cut}``: an autoencoder's quantized bottleneck (an activation packet,
  :mod:`qpart.kernels.wire`): decoded, run through the decoder (:mod:`bench.harness.autoencoder`), then the
  float tail of ``cut`` on the tail pool: the QPART paper's own comparison.
- ``GET /bench/ae/{model}/{cut}/encoder``: the encoder's safetensors, which a device downloads
  once, as it downloads a head segment.

Answers are the product's tail answer (:class:`qpart.server.tails.answers.TailAnswer`) with
``compute_s`` holding the server's whole work (decoding and decoder included), so the benchmark
counts server time and answer bytes as it does for a plan; ``Server-Timing: decode;dur=<ms>``
gives the decoding's share, as the product's input-image route does. A body the route cannot read is a 400
naming why. These are baselines, not product routes: they run only inside the benchmark's server,
behind the product's own outer layer (body limits and timeout, request metrics), which every product
request passes (``bench.e2e.analyses.route_overhead`` measures what is left between the two routes).
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from bench.harness import autoencoder
from qpart.kernels.wire import decode_activation_array
from qpart.models.errors import PreprocessError
from qpart.models.preprocess import preprocess_image
from qpart.models.registry import get_model
from qpart.server.api.limits import LimitsMiddleware
from qpart.server.api.main import _app_of, _engine_of
from qpart.server.errors import ServerError
from qpart.server.tails.answers import TailAnswer

FORMATS = ("PNG", "WEBP", "JPEG")
MAX_PIXELS = 4096 * 4096  # an input image larger than this is refused before decoding
MAX_BODY = 1 << 20


def decode_image(body: bytes) -> Image.Image:
    """The image in ``body`` (PNG, WebP or JPEG only), fully decoded; ValueError naming why not."""
    try:
        image = Image.open(io.BytesIO(body), formats=FORMATS)
        if image.width * image.height > MAX_PIXELS:
            raise ValueError(f"{image.width}x{image.height} is over {MAX_PIXELS} pixels")
        image.load()
    except (OSError, SyntaxError, Image.DecompressionBombError) as exc:
        raise ValueError(f"not a PNG, WebP or JPEG image: {exc}") from exc
    return image


def input_tensor(model: str, body: bytes) -> np.ndarray:
    """``[1, C, H, W]``: the image in ``body`` through ``model``'s card's preprocessing; ValueError
    naming why not (not an allowed image, or one the preprocessing cannot take), LookupError for
    a card that declares none."""
    spec = get_model(model).preprocess
    if spec is None:
        raise LookupError(f"{model}'s card declares no preprocessing")
    try:
        return preprocess_image(decode_image(body), spec)[None]
    except PreprocessError as exc:
        raise ValueError(str(exc)) from exc


class BaselineRoutes:
    """ASGI layer: the baselines' routes; everything else goes to the product's app (``.app``)."""

    def __init__(self, app: ASGIApp, autoencoders: Path | None) -> None:
        self.app = app
        self.autoencoders = autoencoders
        self._decoders: dict[tuple[str, int], tuple[torch.nn.Module, bytes, tuple[int, ...]]] = {}
        self._limited: ASGIApp | None = None

    def _autoencoder(self, model: str, cut: int) -> tuple[torch.nn.Module, bytes, tuple[int, ...]]:
        """The decoder, the encoder's file and the bottleneck's shape of ``model`` at ``cut``."""
        key = (model, cut)
        if key not in self._decoders:
            folder = (self.autoencoders or Path("/nonexistent")) / f"{model}-c{cut}"
            if not (folder / "meta.json").is_file():
                raise LookupError(f"no autoencoder for {model} at cut {cut}")
            _, dec, meta = autoencoder.load(folder)
            self._decoders[key] = (dec, (folder / "encoder.safetensors").read_bytes(),
                                   (1, *meta.bottleneck_shape))
        return self._decoders[key]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if not path.startswith("/bench/"):
            await self.app(scope, receive, send)
            return
        if self._limited is None:
            self._limited = self._limits()
        await self._limited(scope, receive, send)

    def _limits(self) -> ASGIApp:
        """The baselines' routes inside the product's own outer layer (body limits and timeout,
        request metrics), with the served app's settings and metrics, as every product request
        passes it. Outside it, a baseline's request paid about 0.06 ms less than a product request
        beyond its reported server time on loopback; inside it, about 0.03 ms less, the product
        route's own handling (``bench.e2e.analyses.route_overhead``)."""
        app = _app_of(self.app)
        if app is None:
            raise RuntimeError("BaselineRoutes wraps no FastAPI app")
        settings = app.state.settings

        def known() -> frozenset[str]:
            engine = _engine_of(self.app)
            return engine.catalog.known_names if engine is not None else frozenset()

        return LimitsMiddleware(self._bench, max_body_bytes=settings.max_body_bytes,
                                body_timeout_s=settings.body_timeout_s, metrics=app.state.metrics,
                                known_models=known)

    async def _bench(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        parts = path.split("/")[2:]
        try:
            if scope["method"] == "GET" and len(parts) == 4 and parts[:1] == ["ae"] and parts[3] == "encoder":
                await _reply(send, 200, self._autoencoder(parts[1], int(parts[2]))[1],
                             "application/octet-stream")
                return
            body = await _body(receive)
            if scope["method"] == "POST" and len(parts) == 2 and parts[0] == "input":
                answer, decode_s = await self._input(parts[1], body)
            elif scope["method"] == "POST" and len(parts) == 3 and parts[0] == "ae":
                answer, decode_s = await self._ae(parts[1], int(parts[2]), body)
            else:
                await _reply(send, 404, _error(f"no baseline route {path}"))
                return
        except ServerError as exc:
            await _reply(send, exc.status, _error(str(exc)))
            return
        except HTTPException as exc:  # 408 / 413 from the limits' body guard
            await _reply(send, exc.status_code, _error(str(exc.detail)), extra=exc.headers)
            return
        except (LookupError, ValueError) as exc:
            await _reply(send, 400 if isinstance(exc, ValueError) else 404, _error(str(exc)))
            return
        await _reply(send, 200, answer.json(), timing=decode_s)

    async def _run(self, model: str, cut: int, prepare: Callable[[], np.ndarray]) -> tuple[TailAnswer, float]:
        engine = _engine_of(self.app)
        if engine is None:
            raise LookupError("the server is not ready")
        loaded = engine.catalog.get(model, None)
        start = time.perf_counter()
        x = prepare()
        prepare_s = time.perf_counter() - start
        if not np.isfinite(x).all():  # a packet with finite scales can still decode to infinity
            raise ValueError("the upload decodes to NaN or infinity")
        rows, queue_s, compute_s = await engine.tails.run(loaded, cut, x)
        if not rows.finite.all():
            raise ValueError("the model produced non-finite logits for this upload")
        return TailAnswer(plan_id=f"{model}@{loaded.version}/bench-c{cut}", model=model,
                          version=loaded.version, rows=rows, top_k=5, queue_s=queue_s,
                          compute_s=compute_s + prepare_s, names=loaded.labels), prepare_s

    async def _input(self, model: str, body: bytes) -> tuple[TailAnswer, float]:
        return await self._run(model, 0, lambda: input_tensor(model, body))

    async def _ae(self, model: str, cut: int, body: bytes) -> tuple[TailAnswer, float]:
        dec, _, shape = self._autoencoder(model, cut)

        def decoded() -> np.ndarray:
            z = decode_activation_array(body, max_elements=int(np.prod(shape)))[0]
            if tuple(z.shape) != shape:
                raise ValueError(f"the bottleneck packet holds shape {list(z.shape)}; this autoencoder's is "
                                 f"{list(shape)}")
            with torch.inference_mode():
                return dec(torch.from_numpy(np.ascontiguousarray(z, np.float32))).numpy()  # type: ignore[no-any-return]

        return await self._run(model, cut, decoded)


async def _body(receive: Receive) -> bytes:
    chunks, size = [], 0
    while True:
        message = await receive()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY:
            raise ValueError(f"body over {MAX_BODY} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _error(text: str) -> bytes:
    return json.dumps({"error": text}).encode()


async def _reply(send: Send, status: int, body: bytes, content_type: str = "application/json",
                 timing: float | None = None, extra: Mapping[str, str] | None = None) -> None:
    """The response; ``timing``: the decoding's seconds, as the product's image route reports them
    (``Server-Timing: decode;dur=<ms>``); ``extra``: more header fields (a 408's ``Connection: close``)."""
    headers: list[Any] = [(b"content-type", content_type.encode()),
                          (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in (extra or {}).items()]
    if timing is not None:
        headers.append((b"server-timing", f"decode;dur={timing * 1e3:.3f}".encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
