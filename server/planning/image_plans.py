"""The input-image plans (ADR 0014 lossless, ADR 0015 lossy): their prices, their timing and the
decoding of their uploads, for the engine.

A request that offers its input image may get ``input-png`` (the PNG, lossless, level 0) or
``input-webp@<q>`` (a WebP at a quality the model's artifact promises at a level no looser than the
demand: :attr:`~profiles.artifacts.CalibrationArtifact.image_ladder`). Both are cut 0 with no head
segment; the server decodes, preprocesses as the card declares and runs the whole model.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import numpy as np

from qpart.models.image_codecs import WEBP, parse_rung_id, rung_id
from qpart.models.preprocess import PreprocessSpec
from qpart.profiles.artifacts import ImageRung
from qpart.profiles.costs import PlanInputs
from qpart.server.errors import NotFoundError
from qpart.server.planning.images import (
    INPUT_PNG,
    ImageTimes,
    decode_seconds,
    finish_png,
    image_fits,
    open_png,
    png_size,
    probe_image,
)
from qpart.server.planning.planner import Candidate, image_pattern, price_image
from qpart.server.planning.webp import decode_webp_input, webp_decode_seconds, webp_size
from qpart.server.schemas import InputImage
from qpart.server.settings import ServerSettings
from qpart.server.store.catalog import LoadedModel

# Input images are opened and decoded on the event loop only when both their header's size and
# their body are this small: Pillow walks every PNG chunk before the pixels, and an 8 MiB body of
# 699k empty chunks held the loop for 2.0 s (review) though its header said 1x1.
_INLINE_IMAGE_PIXELS = 256 * 256
_INLINE_IMAGE_BYTES = 64 << 10
_IMAGE_DECODES = 2  # input images decoded off the loop at once; more wait for a turn
_PROBE_QUALITY = 75  # the WebP start-up probe's quality (decoding time hardly depends on it)


def promised_rungs(model: LoadedModel) -> list[ImageRung]:
    """The model's WebP qualities promised at some level (lowest quality first)."""
    ladder = model.artifact.image_ladder
    if ladder is None:
        return []
    return sorted((r for r in ladder.rungs if r.levels), key=lambda r: r.quality)


def promised_rung(model: LoadedModel, quality: int) -> ImageRung | None:
    """The promised rung at ``quality``, if the ladder has one."""
    return next((r for r in promised_rungs(model) if r.quality == quality), None)


class ImagePlans:
    """Per model version, what decoding an input image costs this server, and the plans' prices."""

    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        self.png_times = ImageTimes()
        self.webp_times = ImageTimes()
        self._decodes = asyncio.Semaphore(_IMAGE_DECODES)  # a large image costs 100s of ms

    def time_model(self, model: LoadedModel) -> None:
        """Time decoding and preprocessing an input image of the model's input size, as a PNG and,
        where its ladder promises a quality, as a WebP."""
        spec, shape = model.preprocess, tuple(model.artifact.input_shape)
        if spec is None or probe_image(spec, shape) is None:  # no image becomes the input unresized
            return
        key, pixels = (model.name, model.version), int(np.prod(shape[1:]))
        bound = self.settings.max_image_pixels
        self.png_times.set_probe(key, decode_seconds(spec, shape, bound), pixels)
        if promised_rungs(model):
            self.webp_times.set_probe(key, webp_decode_seconds(spec, shape, bound, _PROBE_QUALITY), pixels)

    def candidates(self, model: LoadedModel, image: InputImage | None, demand: float, batch: int,
                   inputs: PlanInputs, tail_s: float, answer_bytes: int) -> list[Candidate]:
        """The input-image plans a request's offer gets: the PNG, and each offered WebP whose
        quality the ladder promises at a level no looser than ``demand``."""
        if image is None or batch != 1 or model.preprocess is None or image_fits(
                image.width, image.height, model.preprocess, tuple(model.artifact.input_shape),
                self.settings.max_image_pixels) is not None:
            return []
        key, pixels = (model.name, model.version), image.width * image.height
        out = []
        png_s = self.png_times.predict(key, pixels)
        if png_s is not None and image.png_bytes <= self.settings.max_body_bytes:
            pattern = image_pattern(model.artifact, INPUT_PNG, image.png_bytes)
            costs = price_image(model.artifact, pattern, image.encode_s, inputs, tail_s + png_s, answer_bytes)
            out.append(Candidate(pattern, None, 0, costs))
        webp_s = self.webp_times.predict(key, pixels)
        for offer in image.webp:
            rung = promised_rung(model, offer.quality)
            if webp_s is None or rung is None or rung.level is None or rung.level > demand \
                    or offer.bytes > self.settings.max_body_bytes:
                continue
            pattern = image_pattern(model.artifact, rung_id(WEBP, rung.quality), offer.bytes,
                                    level=rung.level, test_drop=rung.test_drop)
            costs = price_image(model.artifact, pattern, offer.encode_s, inputs, tail_s + webp_s,
                                answer_bytes)
            out.append(Candidate(pattern, None, 0, costs))
        return out

    def check_plan(self, model: LoadedModel, pattern_id: str) -> PreprocessSpec:
        """The card's preprocessing, for an input-image plan the model has; refused before its body
        is looked at otherwise.

        Raises:
            NotFoundError: the card declares no preprocessing, or the ladder promises no such quality.
        """
        rung, spec = parse_rung_id(pattern_id), model.preprocess
        if spec is None or not self.png_times.takes_images((model.name, model.version)):
            raise NotFoundError(f"model '{model.name}' version '{model.version}' has no input-image plan: "
                                "its card declares no preprocessing that makes an image into its input")
        if rung is not None and promised_rung(model, rung[1]) is None:
            qualities = ", ".join(str(r.quality) for r in promised_rungs(model)) or "none"
            raise NotFoundError(f"model '{model.name}' version '{model.version}' has no input-image plan "
                                f"'{pattern_id}': its calibration promises WebP qualities {qualities}")
        return spec

    async def decode(self, model: LoadedModel, pattern_id: str,
                     body: bytes) -> tuple[np.ndarray, float, float]:
        """The model input an image plan's upload makes, the seconds decoding and preprocessing
        took, and the seconds it waited for a turn to decode (a large image decodes off the event
        loop, a few at a time).

        Raises:
            NotFoundError: the model has no such image plan.
            BadRequestError: the body is not the image the plan takes.
        """
        spec, shape = self.check_plan(model, pattern_id), tuple(model.artifact.input_shape)
        bound, key = self.settings.max_image_pixels, (model.name, model.version)
        rung = parse_rung_id(pattern_id)
        decode: Callable[[], tuple[int, np.ndarray]]
        if rung is None:
            def decode() -> tuple[int, np.ndarray]:
                image = open_png(body, spec, shape, bound)
                return image.width * image.height, finish_png(image, spec, shape)
            width, height = png_size(body) if body else (0, 0)  # open_png says why an empty body fails
            times = self.png_times
        else:
            width, height = webp_size(body)

            def decode() -> tuple[int, np.ndarray]:
                return width * height, decode_webp_input(body, spec, shape, bound)
            times = self.webp_times
        started, waited = time.perf_counter(), 0.0
        if len(body) <= _INLINE_IMAGE_BYTES and width * height <= _INLINE_IMAGE_PIXELS:
            pixels, x = decode()
        else:
            async with self._decodes:
                waited, started = time.perf_counter() - started, time.perf_counter()
                pixels, x = await asyncio.to_thread(decode)
        decode_s = time.perf_counter() - started
        times.observe(key, decode_s, pixels)
        return x, decode_s, waited
