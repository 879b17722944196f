"""What a device offers the planner of its input image (ADR 0014 PNG, ADR 0015 WebP), without
encoding it up front every time.

The planner prices an image plan with the image's bytes and the device's time to encode it. The
first image of a size (per model and WebP quality) is encoded before the plan request, both ways,
and those figures are offered. After that, the device offers what its recent images of that size
came to (the mean bytes and the median encode time of the last :data:`WINDOW`) and encodes only if
the plan it gets uploads the image (and every :data:`REFRESH` offers up front again, so the
figures follow the images; every :data:`REFRESH_FAR` while the plans price its image far above
what they choose, ADR 0016): a device whose plans run heads does not pay for encoding its images
twice over on every request. This holds for a long-lived device (one ``DeviceRuntime`` classifying
many images); ``qpart device infer`` starts afresh for each call, so its single image is encoded up
front. An image that comes out unlike the estimate costs the plan some optimality, never accuracy
(a quality's promise does not depend on bytes).
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from PIL import Image

from qpart.client.errors import DeviceInputError
from qpart.client.inputs import png_of_file, webp_of_file
from qpart.models.preprocess import PreprocessSpec

WINDOW = 16
REFRESH = 256
"""Every this many offers of a kind, the image is encoded up front again, so that the figures follow
the images even while the plans that come back run heads. Rarely: charged for an offer encoded up
front on every request, the grid at 94a464c would have had a mean regret of +109% instead of
+2.1%, and for one on every 16th request +9.4% (recomputed from its per-repetition records).
Every 256th costs a 256th of the full charge."""
REFRESH_FAR = 4096
"""The refresh interval while the last plan priced the cheapest image plan at least :data:`FAR`
above the plan it chose (``input_image_plan`` against ``predicted``; ADR 0016). There one more
image in the window of :data:`WINDOW` would have to move the estimate by that much to change a plan,
so measuring afresh buys little; it still happens now and then, so that no estimate is kept for ever."""
FAR = 0.25
"""How far above the chosen plan's objective the cheapest image plan must price for the rarer
refresh (:data:`REFRESH_FAR`); a quarter, well above the cost model's errors (in issue 27's grids
the median time error of any strategy is at most 7.5%). A judgment, not a fit (ADR 0016)."""
IMAGE_PNG = "image/png"
IMAGE_WEBP = "image/webp"


@dataclass
class _Seen:
    """Recent encodings of one kind of image (one model, size, codec)."""

    sizes: deque[int] = field(default_factory=lambda: deque(maxlen=WINDOW))
    seconds: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW))
    offers: int = 0  # offers from these figures since the image was last encoded up front
    every: int = REFRESH  # the refresh interval the last plan called for

    def add(self, body: bytes, seconds: float) -> None:
        self.sizes.append(len(body))
        self.seconds.append(seconds)

    def estimate(self) -> tuple[int, float]:
        return round(statistics.fmean(self.sizes)), statistics.median(self.seconds)


@dataclass
class Offer:
    """One image's offer: the request's ``input_image`` field, and the bodies encoded for it so far."""

    doc: dict[str, Any]
    bodies: dict[str, tuple[bytes, float]]  # content type -> (body, seconds it took)
    quality: int | None
    key: tuple[str, int, int, str]  # the PNG's: its figures keep the refresh count


class ImageOffers:
    """A device's offers of its input images, and what its earlier images of each size cost."""

    def __init__(self) -> None:
        self._seen: dict[tuple[str, int, int, str], _Seen] = {}

    def offer(self, path: Path, model: str, spec: PreprocessSpec, model_input: npt.NDArray[np.float32],
              quality: int | None) -> Offer | None:
        """The offer of the image in ``path`` (``model_input``: what ``spec`` makes of it here), with
        a WebP at ``quality`` when given; None where no PNG of it gives the server ``model_input``
        (:func:`png_of_file`), as far as the first image of its size showed.

        Raises:
            DeviceInputError: the file is not a readable image.
        """
        width, height = _size(path)
        png_key, webp_key = (model, width, height, "png"), (model, width, height, f"webp@{quality}")
        known = png_key in self._seen and (quality is None or webp_key in self._seen)
        if known:
            seen = self._seen[png_key]
            seen.offers += 1
            known = seen.offers < seen.every  # now and then measured afresh
        bodies: dict[str, tuple[bytes, float]] = {}
        if not known:  # the first of its size (or a refresh): encode, and offer what it came to
            if not self._encode(IMAGE_PNG, path, spec, model_input, png_key, bodies):
                self._seen.pop(png_key, None)  # this file's PNG is not exact; the next one may be
                return None
            self._seen[png_key].offers = 0  # the count runs from the last encoding up front
            if quality is not None:
                self._encode(IMAGE_WEBP, path, spec, model_input, webp_key, bodies, quality)
        png_bytes, png_s = self._seen[png_key].estimate()
        doc: dict[str, Any] = {"png_bytes": png_bytes, "width": width, "height": height, "encode_s": png_s}
        webp = self._seen.get(webp_key)
        if quality is not None and webp is not None and webp.sizes:
            webp_bytes, webp_s = webp.estimate()
            doc["webp"] = [{"quality": quality, "bytes": webp_bytes, "encode_s": webp_s}]
        return Offer(doc, bodies, quality if "webp" in doc else None, png_key)

    def settle(self, offer: Offer, chosen_objective: float, image_objective: float | None) -> None:
        """After the plan for ``offer``: the next refresh comes after :data:`REFRESH_FAR` offers
        where the cheapest image plan (``image_objective``, the plan's ``input_image_plan``) priced
        at least :data:`FAR` above the plan chosen (``chosen_objective``), else after :data:`REFRESH`
        (also where the server did not say: it predates the field)."""
        seen = self._seen.get(offer.key)
        if seen is None:
            return
        far = image_objective is not None and image_objective >= (1.0 + FAR) * chosen_objective
        seen.every = REFRESH_FAR if far else REFRESH

    def body(self, offer: Offer, content_type: str, path: Path, model: str, spec: PreprocessSpec,
             model_input: npt.NDArray[np.float32]) -> tuple[bytes, float] | None:
        """The body a plan uploads (``content_type``: its ``upload_content_type``) and the seconds
        encoding it took: encoded now unless the offer encoded it already; None where it cannot be
        (this file's PNG does not carry its input exactly, or WebP cannot hold it)."""
        if content_type not in offer.bodies:
            width, height = offer.doc["width"], offer.doc["height"]
            kind = "png" if content_type == IMAGE_PNG else f"webp@{offer.quality}"
            self._encode(content_type, path, spec, model_input, (model, width, height, kind), offer.bodies,
                         offer.quality)
        return offer.bodies.get(content_type)

    def _encode(self, content_type: str, path: Path, spec: PreprocessSpec,
                model_input: npt.NDArray[np.float32], key: tuple[str, int, int, str],
                bodies: dict[str, tuple[bytes, float]], quality: int | None = None) -> bool:
        seen = self._seen.setdefault(key, _Seen())
        if content_type == IMAGE_PNG:
            png = png_of_file(path, spec, model_input)
            encoded = None if png is None else (png[0], png[3])
        else:
            encoded = None if quality is None else webp_of_file(path, quality)
        if encoded is None:
            return False
        bodies[content_type] = encoded
        seen.add(*encoded)
        return True


def _size(path: Path) -> tuple[int, int]:
    try:
        with Image.open(path) as img:
            return img.size
    except (OSError, SyntaxError, ValueError) as exc:
        raise DeviceInputError(f"{path} is not a readable image: {exc}") from exc
