"""The device's input-image offers (ADR 0014, 0015): the first image of a size is encoded up front
and offered as it came out; later ones are offered from those figures and encoded only when a plan
uploads them."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from qpart.client import image_offers
from qpart.client.image_offers import IMAGE_PNG, IMAGE_WEBP, ImageOffers
from qpart.models.data import Split, load_split_pixels
from qpart.models.image_codecs import encode_webp
from qpart.models.preprocess import FASHION_MNIST_SPEC, preprocess_image


@pytest.fixture
def files(tmp_path):
    out = []
    for i, pixels in enumerate(load_split_pixels(Split.TEST, 3)[0]):
        path = tmp_path / f"{i}.png"
        Image.fromarray(pixels).save(path)
        out.append(path)
    return out


@pytest.fixture
def counted(monkeypatch):
    calls = {"png": 0, "webp": 0}
    real_png, real_webp = image_offers.png_of_file, image_offers.webp_of_file

    def png(*args):
        calls["png"] += 1
        return real_png(*args)

    def webp(*args):
        calls["webp"] += 1
        return real_webp(*args)

    monkeypatch.setattr(image_offers, "png_of_file", png)
    monkeypatch.setattr(image_offers, "webp_of_file", webp)
    return calls


def _input(path) -> np.ndarray:
    return preprocess_image(Image.open(path), FASHION_MNIST_SPEC)


def test_the_first_image_of_a_size_is_encoded_and_later_ones_only_for_an_image_plan(files, counted):
    offers = ImageOffers()
    first = offers.offer(files[0], "m", FASHION_MNIST_SPEC, _input(files[0]), 60)
    assert first is not None and counted == {"png": 1, "webp": 1}
    body0 = encode_webp(Image.open(files[0]), 60)
    assert first.doc["webp"][0]["bytes"] == len(body0)
    assert first.doc["png_bytes"] == len(first.bodies[IMAGE_PNG][0])
    assert offers.body(first, IMAGE_WEBP, files[0], "m", FASHION_MNIST_SPEC, _input(files[0]))[0] == body0
    second = offers.offer(files[1], "m", FASHION_MNIST_SPEC, _input(files[1]), 60)
    assert second is not None and counted == {"png": 1, "webp": 1}  # offered from the first's figures
    assert second.doc["webp"][0]["bytes"] == len(body0) and second.bodies == {}
    got = offers.body(second, IMAGE_WEBP, files[1], "m", FASHION_MNIST_SPEC, _input(files[1]))
    assert got is not None and got[0] == encode_webp(Image.open(files[1]), 60) and counted["webp"] == 2
    third = offers.offer(files[2], "m", FASHION_MNIST_SPEC, _input(files[2]), 60)
    assert third is not None  # the mean of the two WebPs it has seen of this size
    assert third.doc["webp"][0]["bytes"] == round((len(body0) + len(got[0])) / 2)
    assert offers.offer(files[2], "m", FASHION_MNIST_SPEC, _input(files[2]), 75) is not None
    assert counted == {"png": 2, "webp": 3}  # another quality is another kind: encoded up front


def test_a_file_no_png_carries_exactly_is_not_offered_and_not_remembered(files, monkeypatch):
    tried = []
    monkeypatch.setattr(image_offers, "png_of_file", lambda *args: tried.append(args) or None)
    offers = ImageOffers()
    x = _input(files[0])
    assert offers.offer(files[0], "m", FASHION_MNIST_SPEC, x, 60) is None
    assert offers.offer(files[0], "m", FASHION_MNIST_SPEC, x, 60) is None and len(tried) == 2  # tried again


def test_the_figures_are_measured_afresh_every_so_often(files, counted):
    from qpart.client.image_offers import REFRESH

    offers = ImageOffers()
    for _ in range(REFRESH + 1):
        offers.offer(files[0], "m", FASHION_MNIST_SPEC, _input(files[0]), 60)
    assert counted == {"png": 2, "webp": 2}  # the first offer, and the REFRESH-th after it


def _offers_settled(offers: ImageOffers, files, n: int, image_objective: float | None) -> None:
    """``n`` offers of one image, each followed by its plan: J 1.0, the image plan's ``image_objective``."""
    x = _input(files[0])
    for _ in range(n):
        offer = offers.offer(files[0], "m", FASHION_MNIST_SPEC, x, 60)
        assert offer is not None
        offers.settle(offer, 1.0, image_objective)


@pytest.mark.parametrize(("image_objective", "every"), [
    (1.0 + image_offers.FAR, image_offers.REFRESH_FAR),  # the image plan far dearer: rarely
    (1.0 + image_offers.FAR - 1e-9, image_offers.REFRESH),  # just short of far: as often as before
    (None, image_offers.REFRESH),  # a server that does not say
])
def test_the_refresh_is_rarer_while_the_image_plans_price_far_above_the_plan(files, counted, image_objective,
                                                                            every):
    offers = ImageOffers()
    _offers_settled(offers, files, every, image_objective)
    assert counted == {"png": 1, "webp": 1}  # only the first offer so far
    _offers_settled(offers, files, 1, image_objective)
    assert counted == {"png": 2, "webp": 2}  # the every-th offer after the first encodes again


def test_a_plan_near_the_image_brings_the_refresh_back_at_once(files, counted):
    offers = ImageOffers()
    _offers_settled(offers, files, image_offers.REFRESH + 10, 2.0)  # far: none after REFRESH
    assert counted == {"png": 1, "webp": 1}
    _offers_settled(offers, files, 1, 1.0)  # the image plan chosen
    _offers_settled(offers, files, 1, 1.0)  # past REFRESH since the last encoding: measured afresh now
    assert counted == {"png": 2, "webp": 2}


def test_the_count_starts_again_at_every_encoding_up_front(files, counted):
    offers = ImageOffers()
    _offers_settled(offers, files, 2 * image_offers.REFRESH + 1, None)
    assert counted == {"png": 3, "webp": 3}  # the first offer, then every REFRESH-th: not every one after
    _offers_settled(offers, files, 10, None)
    x = _input(files[0])
    offers.offer(files[0], "m", FASHION_MNIST_SPEC, x, 75)  # a quality not offered yet: encoded up front
    assert counted == {"png": 4, "webp": 4}
    _offers_settled(offers, files, image_offers.REFRESH - 1, None)  # the count began again at it
    assert counted == {"png": 4, "webp": 4}
    _offers_settled(offers, files, 1, None)
    assert counted == {"png": 5, "webp": 5}
