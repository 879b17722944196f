"""Damaged files fail only with the package's own one-line errors: random mutations of valid
.npz, safetensors and image files either read or raise a DatasetError, never anything else."""

from __future__ import annotations

import io
import tempfile
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image
from safetensors.numpy import save

from qpart.models.errors import DatasetError
from qpart.models.sources import ArraySource
from qpart.models.sources.decoding import decode_pixels
from tests.models.sources.conftest import SPEC

X = np.random.default_rng(0).standard_normal((6, 1, 3, 3)).astype(np.float32)
Y = np.arange(6, dtype=np.int64) % 2


def npz_bytes(compressed: bool) -> bytes:
    buf = io.BytesIO()
    (np.savez_compressed if compressed else np.savez)(buf, x=X, y=Y)
    return buf.getvalue()


def png_bytes() -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(1).integers(0, 256, (9, 9, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


VALID = {".npz": npz_bytes(False), ".zip.npz": npz_bytes(True),
         ".safetensors": save({"x": X, "y": Y}), ".png": png_bytes()}

mutations = st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, 255)),
                     min_size=1, max_size=6)


def mutate(raw: bytes, edits: list[tuple[float, int]], cut: float | None) -> bytes:
    out = bytearray(raw)
    for where, value in edits:
        out[int(where * len(out))] = value
    return bytes(out[: int(cut * len(out))] if cut is not None else out)


def load(path: Path) -> None:
    if path.suffix == ".png":
        decode_pixels(str(path), SPEC)
        return
    for _ in ArraySource(path).batches(4):
        pass


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(sorted(VALID)), edits=mutations,
       cut=st.one_of(st.none(), st.floats(0, 1, exclude_max=True)))
def test_a_damaged_file_reads_or_raises_a_dataset_error(kind, edits, cut):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"sample{kind}"
        path.write_bytes(mutate(VALID[kind], edits, cut))
        try:
            load(path)
        except DatasetError as exc:
            assert "\n" not in str(exc)


@settings(max_examples=60, deadline=None)
@given(raw=st.binary(max_size=600), kind=st.sampled_from([".npz", ".safetensors", ".png"]))
def test_arbitrary_bytes_read_or_raise_a_dataset_error(raw, kind):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"sample{kind}"
        path.write_bytes(raw)
        try:
            load(path)
        except DatasetError as exc:
            assert "\n" not in str(exc)
