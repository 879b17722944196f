"""Tiny generated images and ImageFolders for the source tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from qpart.models.preprocess import PreprocessSpec

SPEC = PreprocessSpec(color="RGB", resize=(8, 8), mean=(0.5, 0.4, 0.3), std=(0.2, 0.25, 0.3))


def write_image(path: Path, seed: int, size: tuple[int, int] = (10, 12), fmt: str = "PNG") -> Path:
    """A random RGB image of ``size`` (w, h) written as ``fmt``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path, format=fmt)
    return path


@pytest.fixture
def folder(tmp_path) -> Path:
    """An ImageFolder with classes ``cat`` (3 images) and ``dog`` (2), mixed formats."""
    root = tmp_path / "images"
    write_image(root / "dog" / "b.png", 1)
    write_image(root / "dog" / "a.JPG", 2, fmt="JPEG")
    write_image(root / "cat" / "z.webp", 3, size=(16, 9), fmt="WEBP")
    write_image(root / "cat" / "m.jpeg", 4, fmt="JPEG")
    write_image(root / "cat" / "c.png", 5, size=(7, 30))
    return root
