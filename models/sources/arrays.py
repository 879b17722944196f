"""Already preprocessed tensors and their labels: ``x`` float32 ``[N, C, H, W]`` and ``y`` integer
``[N]`` in an ``.npz`` file (``np.savez``) or a safetensors file. Without ``y`` the samples have no
labels (:data:`~qpart.models.sources.base.UNLABELLED`), which only a label-free metric can judge.

Nothing is unpickled: an ``.npz`` member is read through its ``.npy`` header (object dtypes are
refused) and streamed a batch at a time from the zip; a safetensors file is memory-mapped. Class
names come from the caller, else from the file (an ``.npz`` string array ``classes``, a safetensors
metadata entry ``classes`` holding a JSON list), else are the label numbers ``"0"``, ``"1"``, ...
"""

from __future__ import annotations

import contextlib
import json
import zipfile
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Protocol, cast

import numpy as np
import numpy.typing as npt
from safetensors import SafetensorError, safe_open

from qpart.models.errors import ArrayFileError
from qpart.models.sources.base import (
    UNLABELLED,
    Batch,
    DataSource,
    Images,
    Indices,
    Labels,
    SplitRecord,
    check_batch_size,
    check_selection,
    labels_within,
    tensor_digests,
)

MAX_SAMPLES = 10_000_000
MAX_SIDE = 8192
MAX_CHANNELS = 16
MAX_SAMPLE_BYTES = 1 << 28
MAX_CLASSES = 100_000
_MAX_NPY_HEADER = 10_000
_SAFETENSORS_LABELS = {"I8", "I16", "I32", "I64", "U8", "U16", "U32"}
_HEADER_READERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
# What zipfile and zlib raise on damaged data: BadZipFile, zlib.error, EOFError (a stream ending
# early), OSError, ValueError (a bad seek), NotImplementedError and RuntimeError (an unsupported
# compression method, an encrypted member).
_ZIP_ERRORS = (OSError, EOFError, ValueError, zipfile.BadZipFile, zlib.error, NotImplementedError,
               RuntimeError)
_HOW_TO_SAVE = "save with np.savez(path, x=float32 [N, C, H, W], y=int [N])"


class _RowReader(Protocol):
    path: Path
    shape: tuple[int, int, int, int]
    labels: npt.NDArray[np.generic] | None
    classes: tuple[str, ...] | None

    def read(self, start: int, stop: int) -> Images: ...

    def close(self) -> None: ...


def check_x_shape(path: Path, shape: Sequence[int]) -> tuple[int, int, int, int]:
    """``shape`` as ``(N, C, H, W)`` if it is a 4-D shape within this module's bounds."""
    if len(shape) != 4:
        raise ArrayFileError(f"{path}: x has shape {tuple(shape)}, expected 4-D [N, C, H, W]")
    n, c, h, w = (int(d) for d in shape)
    if not (1 <= n <= MAX_SAMPLES and 1 <= c <= MAX_CHANNELS and 1 <= h <= MAX_SIDE and 1 <= w <= MAX_SIDE) \
            or c * h * w * 4 > MAX_SAMPLE_BYTES:
        raise ArrayFileError(
            f"{path}: x shape {(n, c, h, w)} is out of range (1..{MAX_SAMPLES} samples, 1..{MAX_CHANNELS} "
            f"channels, sides 1..{MAX_SIDE}, at most {MAX_SAMPLE_BYTES} bytes a sample)")
    return n, c, h, w


class _NpzMember:
    """One ``.npy`` member of an ``.npz``: its header checked, its payload read on demand."""

    def __init__(self, archive: zipfile.ZipFile, path: Path, name: str) -> None:
        self.path, self.name = path, name
        try:
            self.info = archive.getinfo(f"{name}.npy")
        except KeyError:
            held = sorted(n.removesuffix(".npy") for n in archive.namelist())
            raise ArrayFileError(f"{path} has no array '{name}' (it holds {held}); {_HOW_TO_SAVE}") from None
        try:
            self.handle = cast(zipfile.ZipExtFile, archive.open(self.info))
        except _ZIP_ERRORS as exc:  # a damaged local header, an encrypted or unknown-method member
            raise ArrayFileError(f"{path}: '{name}' cannot be opened ({exc}); {_HOW_TO_SAVE}") from exc
        try:
            self._read_header()
        except BaseException:
            self.handle.close()
            raise

    def _read_header(self) -> None:
        path, name = self.path, self.name
        try:
            version = np.lib.format.read_magic(self.handle)
            if version not in _HEADER_READERS:
                raise ArrayFileError(f"{path}: '{name}' is .npy version {version}; {_HOW_TO_SAVE}")
            shape, fortran, dtype = _HEADER_READERS[version](self.handle, max_header_size=_MAX_NPY_HEADER)
        except _ZIP_ERRORS as exc:
            raise ArrayFileError(f"{path}: '{name}' is not a readable .npy array ({exc})") from exc
        if dtype.hasobject or fortran:
            what = "Fortran-ordered" if fortran else "an object array"
            raise ArrayFileError(f"{path}: '{name}' is {what}; store plain C-ordered numbers")
        self.shape: tuple[int, ...] = tuple(int(d) for d in shape)
        self.dtype: np.dtype[np.generic] = dtype
        self.offset = self.handle.tell()
        declared = int(np.prod(self.shape, dtype=np.int64)) * dtype.itemsize
        if self.info.file_size != self.offset + declared:
            raise ArrayFileError(
                f"{path}: '{name}' declares {self.shape} {dtype} ({declared} bytes) but holds "
                f"{self.info.file_size - self.offset}; the file is truncated or damaged")

    def read_bytes(self, start_byte: int, count: int) -> bytearray:
        buf = bytearray(count)
        try:
            self.handle.seek(self.offset + start_byte)
            got = self.handle.readinto(buf)
        except _ZIP_ERRORS as exc:
            raise ArrayFileError(
                f"{self.path}: '{self.name}' cannot be read ({exc}); the file is damaged") from exc
        if got != count:
            raise ArrayFileError(f"{self.path}: '{self.name}' ends early; the file is truncated")
        return buf

    def read_all(self) -> npt.NDArray[np.generic]:
        count = int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize
        return np.frombuffer(self.read_bytes(0, count), dtype=self.dtype).reshape(self.shape)

    def close(self) -> None:
        self.handle.close()


class _NpzReader:
    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            archive = zipfile.ZipFile(path)
        except _ZIP_ERRORS as exc:
            raise ArrayFileError(f"{path} is not a readable .npz (zip) file ({exc}); {_HOW_TO_SAVE}") from exc
        # A zip file stays open while any member handle is: close members, then the archive.
        self._open = contextlib.ExitStack()
        self._open.callback(archive.close)
        try:
            self.x = self._open.enter_context(contextlib.closing(_NpzMember(archive, path, "x")))
            self.shape = check_x_shape(path, self.x.shape)
            _check_x_dtype(path, self.x.dtype)
            self.labels: npt.NDArray[np.generic] | None = None
            if "y.npy" in archive.namelist():
                with contextlib.closing(_NpzMember(archive, path, "y")) as y:
                    _check_y(path, y.dtype, y.shape, self.shape[0])
                    self.labels = y.read_all()
            self.classes = _npz_classes(archive, path)
        except BaseException:
            self._open.close()
            raise
        self._row_bytes = int(np.prod(self.shape[1:])) * 4

    def read(self, start: int, stop: int) -> Images:
        buf = self.x.read_bytes(start * self._row_bytes, (stop - start) * self._row_bytes)
        rows = np.frombuffer(buf, dtype=self.x.dtype).reshape((stop - start, *self.shape[1:]))
        return rows.astype(np.float32, copy=False)

    def close(self) -> None:
        self._open.close()


def _npz_classes(archive: zipfile.ZipFile, path: Path) -> tuple[str, ...] | None:
    if "classes.npy" not in archive.namelist():
        return None
    with contextlib.closing(_NpzMember(archive, path, "classes")) as member:
        if member.dtype.kind != "U" or len(member.shape) != 1 or not 1 <= member.shape[0] <= MAX_CLASSES \
                or member.dtype.itemsize > 4 * 256:
            raise ArrayFileError(f"{path}: 'classes' must be a 1-D string array (np.array(names)) of at most "
                                 f"{MAX_CLASSES} names")
        return tuple(str(v) for v in member.read_all().tolist())


def _check_x_dtype(path: Path, dtype: np.dtype[np.generic]) -> None:
    if dtype.kind != "f" or dtype.itemsize != 4:
        raise ArrayFileError(f"{path}: x is {dtype}, expected float32; convert it with x.astype(np.float32)")


def _check_y(path: Path, dtype: np.dtype[np.generic] | str, shape: Sequence[int], count: int) -> None:
    if isinstance(dtype, str):  # a safetensors dtype name
        integer = dtype in _SAFETENSORS_LABELS
    else:  # uint64 may not fit int64
        integer = dtype.kind == "i" or (dtype.kind == "u" and dtype.itemsize < 8)
    if not integer:
        raise ArrayFileError(
            f"{path}: y is {dtype}, expected integer labels; convert it with y.astype(np.int64)")
    if tuple(shape) != (count,):
        raise ArrayFileError(
            f"{path}: y has shape {tuple(shape)} but x holds {count} samples; expected ({count},)")


class _SafetensorsReader:
    # safetensors ships no type hints: its calls are untyped, hence the ignores.
    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self.handle = safe_open(str(path), framework="numpy")
        except (SafetensorError, OSError, ValueError) as exc:
            raise ArrayFileError(f"{path} is not a readable safetensors file ({exc})") from exc
        try:
            self._check(path)
        except BaseException:
            self.close()
            raise

    def _check(self, path: Path) -> None:
        keys = set(self.handle.keys())  # type: ignore[no-untyped-call]
        if "x" not in keys:
            raise ArrayFileError(f"{path} has no tensor 'x' (it holds {sorted(keys)}); save with "
                                 f"safetensors.numpy.save_file({{'x': images, 'y': labels}}, path)")
        self.x = self.handle.get_slice("x")  # type: ignore[no-untyped-call]
        self.shape = check_x_shape(path, self.x.get_shape())
        if self.x.get_dtype() != "F32":
            raise ArrayFileError(f"{path}: x is {self.x.get_dtype()}, expected F32; convert it with "
                                 f"x.astype(np.float32)")
        self.labels: npt.NDArray[np.generic] | None = None
        if "y" in keys:
            y = self.handle.get_slice("y")  # type: ignore[no-untyped-call]
            _check_y(path, y.get_dtype(), y.get_shape(), self.shape[0])
            self.labels = self.handle.get_tensor("y")  # type: ignore[no-untyped-call]
        self.classes = _metadata_classes(path, self.handle.metadata())  # type: ignore[no-untyped-call]

    def read(self, start: int, stop: int) -> Images:
        try:
            rows = self.x[start:stop]
        except SafetensorError as exc:
            raise ArrayFileError(f"{self.path}: x cannot be read ({exc})") from exc
        return np.asarray(rows, dtype=np.float32)

    def close(self) -> None:
        self.handle.__exit__(None, None, None)  # type: ignore[no-untyped-call]


def _metadata_classes(path: Path, metadata: dict[str, str] | None) -> tuple[str, ...] | None:
    if not metadata or "classes" not in metadata:
        return None
    try:
        names = json.loads(metadata["classes"])
    except ValueError as exc:
        raise ArrayFileError(
            f"{path}: metadata 'classes' is not JSON ({exc}); store json.dumps(names)") from exc
    if not isinstance(names, list) or not 1 <= len(names) <= MAX_CLASSES or \
            not all(isinstance(n, str) for n in names):
        raise ArrayFileError(f"{path}: metadata 'classes' must be a JSON list of 1..{MAX_CLASSES} strings")
    return tuple(names)


def _open_reader(path: Path) -> _RowReader:
    suffix = path.suffix.lower()
    if suffix == ".npz":
        return _NpzReader(path)
    if suffix == ".safetensors":
        return _SafetensorsReader(path)
    raise ArrayFileError(f"{path}: an array source must be an .npz or .safetensors file")


def _gather(reader: _RowReader, positions: Indices) -> Images:
    """The rows at sorted ``positions``, reading at most ``len(positions)`` rows at a time."""
    count = len(positions)
    first, last = int(positions[0]), int(positions[-1])
    if last - first + 1 == count:  # contiguous: one read, no copy
        return reader.read(first, last + 1)
    out = np.empty((count, *reader.shape[1:]), dtype=np.float32)
    done = 0
    while done < count:
        start = int(positions[done])
        stop = min(start + count, last + 1)
        upto = int(np.searchsorted(positions, stop))
        out[done:upto] = reader.read(start, stop)[positions[done:upto] - start]
        done = upto
    return out


class ArraySource(DataSource):
    """Preprocessed tensors from an ``.npz`` or safetensors file, streamed a batch at a time.

    Args:
        path: an ``.npz`` (``np.savez(path, x=..., y=...)``) or ``.safetensors`` file.
        class_names: names of the classes in label order; default: the file's, else ``"0"``, ``"1"``...

    Raises:
        ArrayFileError: the file is unreadable, lacks ``x``, or has bad dtypes or shapes.
        DatasetError: a label outside the classes.
    """

    kind = "arrays"

    def __init__(self, path: Path, *, class_names: Sequence[str] | None = None) -> None:
        reader = _open_reader(path)
        try:
            raw, shape, file_classes = reader.labels, reader.shape, reader.classes
        finally:
            reader.close()
        if raw is None:  # no y: unlabelled
            if class_names is not None:
                raise ArrayFileError(f"{path} has no labels (no 'y') to name classes for; add y or give "
                                     "no class names")
            self._setup(path, (), np.full(shape[0], UNLABELLED, dtype=np.int64), shape,
                        np.arange(shape[0], dtype=np.int64), None, None)
            return
        names = tuple(class_names) if class_names is not None else file_classes
        if names is None:
            top = int(raw.max())
            if top >= MAX_CLASSES:
                raise ArrayFileError(f"{path}: label {top} implies more than {MAX_CLASSES} classes")
            names = tuple(str(i) for i in range(max(top, 0) + 1))
        self._setup(path, names, labels_within(raw, len(names), str(path)), shape,
                    np.arange(shape[0], dtype=np.int64), None, None)

    def _setup(self, path: Path, names: Sequence[str], labels: Labels, shape: tuple[int, int, int, int],
               positions: Indices, digests: tuple[str, ...] | None, split: SplitRecord | None) -> None:
        super().__init__(names, labels, split)
        self._path = path
        self._file_shape = shape
        self._positions = positions
        self._digests = digests

    @property
    def path(self) -> Path:
        """The array file."""
        return self._path

    @property
    def sample_shape(self) -> tuple[int, int, int]:
        return self._file_shape[1], self._file_shape[2], self._file_shape[3]

    def batches(self, batch_size: int) -> Iterator[Batch]:
        check_batch_size(batch_size)
        reader = _open_reader(self._path)
        try:
            if reader.shape != self._file_shape:
                raise ArrayFileError(f"{self._path} changed while in use: x is now {reader.shape}")
            for start in range(0, len(self), batch_size):
                stop = min(start + batch_size, len(self))
                images = _gather(reader, self._positions[start:stop])
                yield Batch(images, self._labels[start:stop].copy())
        finally:
            reader.close()

    def sample_digests(self) -> tuple[str, ...]:
        """sha256 of each sample's float32 little-endian bytes (computed once, on first use)."""
        if self._digests is None:
            self._digests = tuple(d for batch in self.batches(256) for d in tensor_digests(batch.images))
        return self._digests

    def select(self, indices: Indices, split: SplitRecord | None = None) -> ArraySource:
        idx = check_selection(indices, len(self))
        out = ArraySource.__new__(ArraySource)
        digests = None if self._digests is None else tuple(self._digests[i] for i in idx.tolist())
        out._setup(self._path, self._class_names, self._labels[idx], self._file_shape, self._positions[idx],
                   digests, split)
        return out

    def _location(self) -> str:
        return str(self._path)
