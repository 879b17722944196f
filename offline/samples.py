"""The samples the calibration job holds: read from its sources in sample order, cut into fit,
check and test samples, held once in memory or in files, with the float model's answers on them.

Fit and check are the first ``fit_samples`` and the next ``check_samples`` of the calibration
source in *sample order*: ``source`` (the source's own order, Fashion-MNIST's default) or
``digest`` (sorted by the sha256 of each preprocessed float32 sample, the default for other
sources), which does not depend on how files are named or classes ordered, so an ImageFolder and
the IDX file holding the same images give the same fit and check samples. Test samples are the
first ``test_samples`` of the test source in the same order.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from qpart.models.data import Dataset, Split
from qpart.models.metrics import get_metric, hits_of
from qpart.models.sources import DataSource
from qpart.models.sources.base import UNLABELLED, tensor_digests
from qpart.offline.data import Sources
from qpart.offline.errors import CalibrationConfigError, CalibrationOutputError
from qpart.offline.runner import ModelRunner
from qpart.offline.settings import CalibrationSettings, SampleOrder
from qpart.profiles.artifacts import FLOAT_BITS

_DECODE_BATCH = 500
_COPY_ROWS = 500
Tick = Callable[[int], None]
"""Progress: told how many more samples were done."""


@dataclass(frozen=True)
class Reference:
    """The float model on one sample set, under the job's metric (:mod:`qpart.models.metrics`):
    each sample's anchor (its label, or the float model's own answer) and whether the float model
    hits it. A pattern is judged against it."""

    anchor: np.ndarray
    hits: np.ndarray


@dataclass
class Data:
    """Fit, check and test samples, with the float model's fit logits, its reference on each set,
    and its top-1 accuracy on the test samples' labels."""

    fit: Dataset
    check: Dataset
    test: Dataset
    fit_logits: torch.Tensor
    fit_ref: Reference
    check_ref: Reference
    test_ref: Reference
    test_accuracy: float | None
    """None: the test samples have no labels."""
    test_agreement: Reference
    """The float model on the test samples under top1-agreement, whatever the job's metric: each
    pattern's share of changed top-1 answers is measured beside its metric (``test_disagreement``)."""


def sample_bytes(s: CalibrationSettings, sources: Sources) -> int:
    """Bytes of the fit, check and test tensors the job holds: ``(fit + check + test) × C × H × W × 4``."""
    test = len(sources.test) if s.test_samples is None else min(s.test_samples, len(sources.test))
    return (s.fit_count + s.check_count + test) * 4 * int(np.prod(sources.calibration.sample_shape))


@contextmanager
def sample_folder(settings: CalibrationSettings, sources: Sources, processes: int) -> Iterator[Path | None]:
    """A temporary folder for the samples when ``processes`` copies of them (the job's and each
    validation worker's, which gets its own copy of samples held in memory) are over
    ``spill_above_mb`` (None: they are held in memory); removed when the job ends, however it ends
    (a job killed by SIGKILL leaves its ``qpart-samples-*`` folder in the temporary folder)."""
    if processes * sample_bytes(settings, sources) <= settings.spill_above_mb * 1_000_000:
        yield None
        return
    folder = Path(tempfile.mkdtemp(prefix="qpart-samples-"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def held_samples(runner: ModelRunner, s: CalibrationSettings, sources: Sources, processes: int,
                 start: Callable[[str, int], Tick]) -> Iterator[Data]:
    """The job's samples (:func:`load_data`) for the ``with`` block: in memory, or in a
    :func:`sample_folder` for ``processes`` copies, removed when the block ends however it ends.
    Decoding them and the float model's answers on them is the progress stage that ``start(label,
    total)`` opens (returning its ``advance(done)``): the job's first half-minute, once silent.
    """
    with sample_folder(s, sources, processes) as spill:
        work = prepare_work(s, sources)
        advance = start("prepare: decode samples, float answers", work)
        done = 0

        def tick(n: int) -> None:
            nonlocal done
            done += n
            advance(done)

        data = load_data(runner, s, sources, spill, tick)
        advance(work)
        yield data


def prepare_work(s: CalibrationSettings, sources: Sources) -> int:
    """Samples :func:`load_data` decodes or runs through the float model (its ticks' sum)."""
    test = len(sources.test) if s.test_samples is None else min(s.test_samples, len(sources.test))
    decoded = (decode_work(sources.calibration, s.fit_count + s.check_count, sources.order)
               + decode_work(sources.test, s.test_samples, sources.order))
    return decoded + s.fit_count + s.check_count + test


def load_data(runner: ModelRunner, s: CalibrationSettings, sources: Sources,
              spill: Path | None = None, tick: Tick | None = None) -> Data:
    """The calibration source cut into fit and check samples (the first ``fit_samples`` and the
    next ``check_samples`` in the sample order), and the test source's first ``test_samples``.

    The tensors are decoded a batch at a time and held once (:func:`sample_bytes`): in memory, or
    in files in the folder ``spill`` when given (``docs/data-sources.md``).
    """
    needed = s.fit_count + s.check_count
    if needed > len(sources.calibration):
        have = len(sources.calibration)
        raise CalibrationConfigError(
            f"--fit-samples {s.fit_count} + --check-samples {s.check_count} = {needed} exceeds the "
            f"{have} calibration samples; give both so they add up to at most {have} (e.g. --fit-samples "
            f"{max(100, have * 2 // 5)} --check-samples {max(100, have - max(100, have * 2 // 5))}; the "
            "check samples bound each level's promise: with none over a level among n, the bound is "
            "near 3/n)")
    cal = read_samples(sources.calibration, needed, sources.order, Split.CALIBRATION,
                       None if spill is None else spill / "calibration.npy", tick)
    if spill is None:
        fit, check = _slice(cal, 0, s.fit_count), _slice(cal, s.fit_count, needed)
    else:  # a file each, so that each pickles as its file (SpilledArray), not a copy
        fit, check = (_copy(cal, 0, s.fit_count, spill / "fit.npy"),
                      _copy(cal, s.fit_count, needed, spill / "check.npy"))
        (spill / "calibration.npy").unlink()
    test = read_samples(sources.test, s.test_samples, sources.order, Split.TEST,
                        None if spill is None else spill / "test.npy", tick)
    full = len(runner.cuts) - 1
    metric = get_metric(s.metric)

    def reference(logits: torch.Tensor, ds: Dataset) -> Reference:
        anchor = metric.anchor(logits, labels_of(ds))
        return Reference(anchor, metric.hits(logits, anchor))

    fit_logits = runner.run_pattern(fit.images, full, {}, FLOAT_BITS, tick)
    check_logits = runner.run_pattern(check.images, full, {}, FLOAT_BITS, tick)
    test_logits = runner.run_pattern(test.images, full, {}, FLOAT_BITS, tick)
    test_labels = labels_of(test)
    accuracy = None if test_labels is None else float(hits_of(get_metric("top1-drop"), test_logits,
                                                              test_labels).mean())
    agreement = get_metric("top1-agreement")
    own_top1 = agreement.anchor(test_logits, None)
    return Data(fit, check, test, fit_logits, reference(fit_logits, fit), reference(check_logits, check),
                reference(test_logits, test), accuracy,
                Reference(own_top1, agreement.hits(test_logits, own_top1)))


def labels_of(ds: Dataset) -> np.ndarray | None:
    """``ds``'s labels, None when it has none (every one :data:`~qpart.models.sources.base.UNLABELLED`)."""
    return None if ds.labels.size and bool((ds.labels == UNLABELLED).all()) else ds.labels


def _slice(ds: Dataset, start: int, stop: int) -> Dataset:
    return Dataset(ds.images[start:stop], ds.labels[start:stop], ds.split, ds.indices_sha256)


def _copy(ds: Dataset, start: int, stop: int, path: Path) -> Dataset:
    """Rows ``start:stop`` of ``ds`` in a file of their own, copied a block at a time."""
    images = SpilledArray.create(path, (stop - start, *ds.images.shape[1:]))
    for i in range(start, stop, _COPY_ROWS):
        images[i - start : min(i + _COPY_ROWS, stop) - start] = ds.images[i : min(i + _COPY_ROWS, stop)]
    return Dataset(images, ds.labels[start:stop].copy(), ds.split, ds.indices_sha256)


def in_memory(data: Data) -> Data:
    """``data`` with every sample set in memory (for a process on another machine)."""
    def held(ds: Dataset) -> Dataset:
        return Dataset(SpilledArray.in_memory(ds.images), ds.labels, ds.split, ds.indices_sha256)

    return replace(data, fit=held(data.fit), check=held(data.check), test=held(data.test))


def read_samples(source: DataSource, count: int | None, order: SampleOrder,
                 split: Split, spill: Path | None = None, tick: Tick | None = None) -> Dataset:
    """The first ``count`` samples (all: None) of ``source`` in ``order``, decoded a batch at a
    time into one float32 ``[count, C, H, W]`` array (the only copy held): in memory, or in
    ``spill`` (a file, :class:`SpilledArray`) when given. ``tick`` is told each batch's size (in
    ``digest`` order the whole source is decoded once more first: :func:`decode_work`)."""
    tick = tick or (lambda n: None)
    total = len(source) if count is None else min(count, len(source))
    positions = sample_positions(source, total, order, tick)
    ascending = np.sort(positions)
    shape = (total, *source.sample_shape)
    images = np.empty(shape, dtype=np.float32) if spill is None else SpilledArray.create(spill, shape)
    labels = np.empty(total, dtype=np.int64)
    # Decoded in the source's order: the j-th decoded sample is the one at ascending[j], whose row
    # is where that position stands in ``positions``.
    slot = np.argsort(positions, kind="stable")
    done = 0
    for batch in source.select(ascending).batches(_DECODE_BATCH):
        rows = slot[done:done + len(batch.labels)]
        images[rows], labels[rows] = batch.images, batch.labels
        done += len(batch.labels)
        tick(len(batch.labels))
    digest = hashlib.sha256(positions.astype("<i8").tobytes()).hexdigest()
    return Dataset(images=images, labels=labels, split=split, indices_sha256=digest)


def sample_positions(source: DataSource, count: int, order: SampleOrder,
                     tick: Tick | None = None) -> np.ndarray:
    """int64 ``[count]``: the positions in ``source`` of its first ``count`` samples in ``order``
    (``digest``: the whole source is decoded once, each batch told to ``tick``)."""
    if order == "source":
        return np.arange(count, dtype=np.int64)
    digests = []
    for batch in source.batches(_DECODE_BATCH):
        digests += tensor_digests(batch.images)
        if tick is not None:
            tick(len(batch.labels))
    return np.argsort(np.asarray(digests), kind="stable")[:count].astype(np.int64)


def decode_work(source: DataSource, count: int | None, order: SampleOrder) -> int:
    """Samples :func:`read_samples` decodes for ``count`` samples of ``source`` (its ticks' sum)."""
    total = len(source) if count is None else min(count, len(source))
    return total + (len(source) if order == "digest" else 0)


class SpilledArray(np.memmap):
    """A float32 array in a ``.npy`` file mapped into memory: its pages are the page cache's, which
    the kernel writes back and evicts under memory pressure, so samples larger than memory stay
    usable and the job's own memory stays bounded. The whole array pickles (to a worker process) as
    its file's name and is mapped again there, not copied; a part of it (a slice) pickles as a copy."""

    whole: tuple[int, tuple[int, ...]] | None = None
    """(address, shape) of the whole file's array: what a view must match to pickle as the file."""

    @classmethod
    def create(cls, path: Path, shape: tuple[int, ...]) -> SpilledArray:
        """A new, zero-filled file of ``shape``, mapped, its blocks allocated at once (a sparse file
        that the disk cannot hold would end the job with SIGBUS on a write, not an error).

        Raises:
            CalibrationOutputError: the disk of ``path`` cannot hold it.
        """
        array = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=shape)
        size = path.stat().st_size
        try:
            with path.open("r+b") as f:
                _allocate(f.fileno(), size)
        except OSError as exc:
            del array
            path.unlink(missing_ok=True)
            raise CalibrationOutputError(
                f"cannot hold the samples in {path.parent}: {exc.strerror or exc} ({size:,} bytes for "
                f"{path.name}); set TMPDIR to a folder on a larger disk, or raise QPART_CALIB_SPILL_ABOVE_MB "
                "to keep them in memory") from exc
        return cls._mapped(array)

    @classmethod
    def _mapped(cls, array: np.memmap) -> SpilledArray:
        out = array.view(cls)
        out.whole = (int(out.ctypes.data), tuple(out.shape))
        return out

    def __reduce__(self) -> Any:
        if self.filename is not None and self.whole == (int(self.ctypes.data), tuple(self.shape)):
            return _reopen, (str(self.filename),)
        return np.array(self).__reduce__()

    def __reduce_ex__(self, protocol: Any) -> Any:  # ndarray's own (protocol 5) would copy it
        return self.__reduce__()

    @staticmethod
    def in_memory(images: np.ndarray) -> np.ndarray:
        """``images`` as an array in memory (for a process that cannot see this machine's files)."""
        return np.array(images) if isinstance(images, SpilledArray) else images


def _allocate(fd: int, size: int) -> None:
    """Reserve the file's blocks where the system can (glibc emulates it on file systems that cannot;
    macOS has no posix_fallocate, and musl may refuse: then the file stays sparse)."""
    if not hasattr(os, "posix_fallocate"):
        return
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
            raise


def _reopen(path: str) -> SpilledArray:
    # copy-on-write: a worker's accidental write stays its own, never another worker's samples
    return SpilledArray._mapped(np.lib.format.open_memmap(path, mode="c"))
