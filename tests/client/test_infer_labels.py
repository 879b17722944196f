"""``qpart device infer --labels`` reads the labels users have: an IDX1 file (gzip or raw), a .npy
integer array, or a text file of one class index a line; anything else is one line naming the file."""

from __future__ import annotations

import gzip
import struct

import numpy as np
import pytest

from qpart.client.errors import DeviceInputError
from qpart.client.inputs import read_labels

LABELS = np.array([3, 0, 9, 1, 1, 7], np.int64)


def _idx1(labels: np.ndarray) -> bytes:
    return struct.pack(">BBBBI", 0, 0, 8, 1, len(labels)) + labels.astype(np.uint8).tobytes()


@pytest.mark.parametrize("kind", ["idx", "idx.gz", "npy", "npy-int32", "txt"])
def test_each_kind_of_labels_file_reads_as_the_same_class_indices(tmp_path, kind):
    path = tmp_path / f"labels.{kind}"
    if kind == "idx":
        path.write_bytes(_idx1(LABELS))
    elif kind == "idx.gz":
        path.write_bytes(gzip.compress(_idx1(LABELS)))
    elif kind.startswith("npy"):
        with path.open("wb") as handle:
            np.save(handle, LABELS.astype(np.int32 if kind == "npy-int32" else np.int64))
    else:
        path.write_text("# class of each image\n" + "\n".join(map(str, LABELS)) + "\n\n")
    got = read_labels(path)
    assert got.dtype == np.int64 and got.tolist() == LABELS.tolist()
    assert read_labels(path, limit=2).tolist() == LABELS[:2].tolist()


@pytest.mark.parametrize(("content", "words"), [
    ("3\ncat\n", "line 2: 'cat' is not a class index"),
    ("3\n-1\n", "line 2: '-1' is not a class index"),
    (b"\xff\xfe\x00garbage", "not IDX1, .npy or text labels"),
])
def test_a_labels_file_that_is_not_labels_is_one_line_naming_it(tmp_path, content, words):
    path = tmp_path / "labels"
    (path.write_bytes if isinstance(content, bytes) else path.write_text)(content)  # type: ignore[operator]
    with pytest.raises(DeviceInputError, match=words) as err:
        read_labels(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("array", [np.zeros((2, 3), np.int64), np.array([0.5, 1.0])])
def test_a_npy_that_is_not_one_row_of_integers_is_refused(tmp_path, array):
    path = tmp_path / "labels.npy"
    np.save(path, array)
    with pytest.raises(DeviceInputError, match="1-D integer array"):
        read_labels(path)


def test_a_pickled_npy_is_never_unpickled(tmp_path):
    path = tmp_path / "labels.npy"
    np.save(path, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(DeviceInputError, match=r"not a \.npy array of integers"):
        read_labels(path)
