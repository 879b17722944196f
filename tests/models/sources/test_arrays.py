"""Preprocessed arrays in .npz and safetensors files: streaming, class names, digests, and refusals
of missing arrays, wrong dtypes, hostile headers and truncated files, without unpickling."""

from __future__ import annotations

import io
import json
import zipfile

import numpy as np
import pytest
from safetensors.numpy import save_file

from qpart.models.errors import ArrayFileError, DatasetError
from qpart.models.sources import ArraySource
from qpart.models.sources.base import tensor_digests


def samples(n=7, shape=(2, 3, 4), classes=3, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, *shape)).astype(np.float32), (np.arange(n) % classes).astype(np.int64)


def read_all(source, batch_size=3):
    batches = list(source.batches(batch_size))
    return np.concatenate([b.images for b in batches]), np.concatenate([b.labels for b in batches])


@pytest.fixture(params=["npz", "npz-compressed", "safetensors"])
def array_file(request, tmp_path):
    x, y = samples()
    if request.param == "safetensors":
        path = tmp_path / "data.safetensors"
        save_file({"x": x, "y": y}, str(path))
    else:
        path = tmp_path / "data.npz"
        (np.savez_compressed if request.param == "npz-compressed" else np.savez)(path, x=x, y=y)
    return path, x, y


def test_batches_give_the_arrays_in_order(array_file):
    path, x, y = array_file
    source = ArraySource(path)
    assert len(source) == 7 and source.sample_shape == (2, 3, 4)
    assert source.class_names == ("0", "1", "2")
    batches = list(source.batches(3))
    assert [b.images.shape[0] for b in batches] == [3, 3, 1]
    assert all(b.images.dtype == np.float32 and b.labels.dtype == np.int64 for b in batches)
    assert all(b.images.flags.writeable for b in batches)  # torch.from_numpy warns on read-only arrays
    images, labels = read_all(source)
    assert images.tobytes() == x.tobytes() and labels.tolist() == y.tolist()
    record = source.describe()
    assert record.kind == "arrays" and record.count == 7 and record.preprocess is None


def test_the_digest_is_the_same_for_the_same_tensors_in_either_format(tmp_path):
    x, y = samples()
    np.savez(tmp_path / "a.npz", x=x, y=y)
    np.savez_compressed(tmp_path / "b.npz", x=x, y=y)
    save_file({"x": x, "y": y}, str(tmp_path / "c.safetensors"))
    digests = {ArraySource(tmp_path / name).content_sha256() for name in ("a.npz", "b.npz", "c.safetensors")}
    assert len(digests) == 1
    assert ArraySource(tmp_path / "a.npz").sample_digests() == tuple(tensor_digests(x))
    y2 = y.copy()
    y2[0] = 2
    np.savez(tmp_path / "d.npz", x=x, y=y2)
    assert ArraySource(tmp_path / "d.npz").content_sha256() not in digests


def test_class_names_come_from_the_caller_then_the_file(tmp_path):
    x, y = samples()
    np.savez(tmp_path / "named.npz", x=x, y=y, classes=np.array(["ant", "bee", "cow"]))
    assert ArraySource(tmp_path / "named.npz").class_names == ("ant", "bee", "cow")
    explicit = ArraySource(tmp_path / "named.npz", class_names=["a", "b", "c", "d"])
    assert explicit.class_names == ("a", "b", "c", "d")
    save_file({"x": x, "y": y}, str(tmp_path / "named.safetensors"),
              metadata={"classes": json.dumps(["p", "q", "r"])})
    assert ArraySource(tmp_path / "named.safetensors").class_names == ("p", "q", "r")
    with pytest.raises(DatasetError, match=r"labels span 0\.\.2 but there are 2 classes"):
        ArraySource(tmp_path / "named.npz", class_names=["a", "b"])


@pytest.mark.parametrize("missing", ["x"])  # without y the samples are unlabelled (test_unlabelled.py)
def test_a_missing_x_is_named_with_how_to_save_it(tmp_path, missing):
    x, y = samples()
    arrays = {"x": x, "y": y, "labels": y}
    del arrays[missing]
    np.savez(tmp_path / "d.npz", **arrays)
    message = rf"has no array '{missing}' \(it holds .*\); save with np\.savez"
    with pytest.raises(ArrayFileError, match=message) as err:
        ArraySource(tmp_path / "d.npz")
    assert "\n" not in str(err.value)
    save_file(arrays, str(tmp_path / "d.safetensors"))
    with pytest.raises(ArrayFileError, match=rf"has no tensor '{missing}'"):
        ArraySource(tmp_path / "d.safetensors")


@pytest.mark.parametrize("x_dtype, y_dtype, message", [
    (np.float64, np.int64, "x is float64, expected float32"),
    (np.uint8, np.int64, "x is uint8, expected float32"),
    (np.float32, np.float32, "y is float32, expected integer labels"),
    (np.float32, np.uint64, "y is uint64, expected integer labels"),
    (np.float32, np.bool_, "y is bool, expected integer labels"),
])
def test_wrong_dtypes_are_refused(tmp_path, x_dtype, y_dtype, message):
    x, y = samples()
    np.savez(tmp_path / "d.npz", x=x.astype(x_dtype), y=y.astype(y_dtype))
    with pytest.raises(ArrayFileError, match=message):
        ArraySource(tmp_path / "d.npz")
    if y_dtype is not np.bool_:
        save_file({"x": x.astype(x_dtype), "y": y.astype(y_dtype)}, str(tmp_path / "d.safetensors"))
        with pytest.raises(ArrayFileError, match=r"expected F32|expected integer labels"):
            ArraySource(tmp_path / "d.safetensors")


@pytest.mark.parametrize("x, y, message", [
    (np.zeros((4, 8, 8), np.float32), np.zeros(4, np.int64), r"x has shape \(4, 8, 8\), expected 4-D"),
    (np.zeros((4, 1, 2, 2), np.float32), np.zeros(3, np.int64), r"y has shape \(3,\) but x holds 4 samples"),
    (np.zeros((4, 1, 2, 2), np.float32), np.zeros((4, 1), np.int64), r"y has shape \(4, 1\)"),
    (np.zeros((0, 1, 2, 2), np.float32), np.zeros(0, np.int64), "out of range"),
    (np.zeros((1, 17, 2, 2), np.float32), np.zeros(1, np.int64), "out of range"),
    (np.zeros((2, 1, 2, 2), np.float32), np.array([0, -1]), "labels span -1..0"),
])
def test_bad_shapes_and_labels_are_refused(tmp_path, x, y, message):
    np.savez(tmp_path / "d.npz", x=x, y=y)
    with pytest.raises(DatasetError, match=message):
        ArraySource(tmp_path / "d.npz")


def npz_with_header(path, shape, payload: bytes, dtype="<f4"):
    """An .npz whose x.npy header declares ``shape`` over ``payload``; y is a valid 1-sample array."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": dtype, "fortran_order": False, "shape": shape})
    y = io.BytesIO()
    np.save(y, np.zeros(1, np.int64))
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("x.npy", header.getvalue() + payload)  # the header includes the magic
        archive.writestr("y.npy", y.getvalue())


def test_a_header_declaring_a_huge_shape_is_refused_before_reading(tmp_path):
    npz_with_header(tmp_path / "big.npz", (10**12, 1, 28, 28), b"\0" * 64)
    with pytest.raises(ArrayFileError, match=r"declares \(1000000000000, 1, 28, 28\) .* but holds 64"):
        ArraySource(tmp_path / "big.npz")
    npz_with_header(tmp_path / "lie.npz", (1, 1, 28, 28), b"\0" * 64)
    message = r"declares \(1, 1, 28, 28\) float32 \(3136 bytes\) but holds 64"
    with pytest.raises(ArrayFileError, match=message):
        ArraySource(tmp_path / "lie.npz")


def test_object_arrays_are_refused_without_unpickling(tmp_path):
    x = np.empty(2, dtype=object)
    np.savez(tmp_path / "pickled.npz", x=x, y=np.zeros(2, np.int64))
    with pytest.raises(ArrayFileError, match="'x' is an object array"):
        ArraySource(tmp_path / "pickled.npz")


def test_fortran_ordered_arrays_are_refused(tmp_path):
    x, y = samples()
    np.savez(tmp_path / "f.npz", x=np.asfortranarray(x), y=y)
    with pytest.raises(ArrayFileError, match="Fortran-ordered"):
        ArraySource(tmp_path / "f.npz")


@pytest.mark.parametrize("suffix", [".npz", ".safetensors"])
def test_truncated_files_are_refused(tmp_path, suffix):
    x, y = samples(n=50)
    path = tmp_path / f"d{suffix}"
    if suffix == ".npz":
        np.savez(path, x=x, y=y)
    else:
        save_file({"x": x, "y": y}, str(path))
    raw = path.read_bytes()
    for cut in (len(raw) // 2, len(raw) - 10, 7, 0):
        path.write_bytes(raw[:cut])
        with pytest.raises(ArrayFileError):
            read_all(ArraySource(path))


def test_damaged_compressed_data_is_refused(tmp_path):
    x, y = samples(n=40)
    path = tmp_path / "d.npz"
    np.savez_compressed(path, x=x, y=y)
    raw = bytearray(path.read_bytes())
    middle = len(raw) // 3  # inside x.npy's deflated data, which fills most of the file
    raw[middle:middle + 40] = b"\x00" * 40
    path.write_bytes(bytes(raw))
    with pytest.raises(ArrayFileError):
        read_all(ArraySource(path))


def test_other_files_are_refused(tmp_path):
    (tmp_path / "d.npy").write_bytes(b"")
    with pytest.raises(ArrayFileError, match=r"must be an \.npz or \.safetensors file"):
        ArraySource(tmp_path / "d.npy")
    (tmp_path / "d.npz").write_bytes(b"PK not really")
    with pytest.raises(ArrayFileError, match=r"is not a readable .npz \(zip\) file"):
        ArraySource(tmp_path / "d.npz")
    with pytest.raises(ArrayFileError, match=r"is not a readable \.npz"):
        ArraySource(tmp_path / "absent.npz")


def test_bad_class_names_in_the_file_are_refused(tmp_path):
    x, y = samples()
    np.savez(tmp_path / "d.npz", x=x, y=y, classes=np.array([1, 2, 3]))
    with pytest.raises(ArrayFileError, match="'classes' must be a 1-D string array"):
        ArraySource(tmp_path / "d.npz")
    save_file({"x": x, "y": y}, str(tmp_path / "d.safetensors"), metadata={"classes": "[1, 2"})
    with pytest.raises(ArrayFileError, match="metadata 'classes' is not JSON"):
        ArraySource(tmp_path / "d.safetensors")


def test_a_sparse_selection_streams_in_bounded_reads(array_file):
    path, x, y = array_file
    source = ArraySource(path)
    picks = np.array([0, 2, 3, 6])
    part = source.select(picks)
    images, labels = read_all(part, 2)
    assert images.tobytes() == x[picks].tobytes() and labels.tolist() == y[picks].tolist()
    assert part.sample_digests() == tuple(tensor_digests(x[picks]))
    wide = source.select(np.array([0, 6]))
    assert read_all(wide, 2)[0].tobytes() == x[[0, 6]].tobytes()  # the span is read two rows at a time
