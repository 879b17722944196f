"""What the calibration job holds while it works: the runner, the three sample sets with the float
model's answers, the allocation items, and the measured patterns (cached by bits)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from qpart.models.data import Dataset, Split
from qpart.offline.allocation import Item
from qpart.offline.data import Sources, SpilledArray, Tick, decode_work, read_samples
from qpart.offline.errors import CalibrationConfigError
from qpart.offline.runner import ModelRunner
from qpart.offline.settings import CalibrationSettings
from qpart.offline.validation import PairedDrop, paired_drop
from qpart.profiles.artifacts import FLOAT_BITS

_COPY_ROWS = 500


@dataclass
class Data:
    """Fit, check and test samples, with the float model's fit logits and check/test correctness."""

    fit: Dataset
    check: Dataset
    test: Dataset
    fit_logits: torch.Tensor
    fit_correct: np.ndarray
    check_correct: np.ndarray
    test_correct: np.ndarray


@dataclass
class State:
    """The job's working state; the caches map :func:`key` to a pattern's counts."""

    runner: ModelRunner
    data: Data
    settings: CalibrationSettings
    items: dict[int, list[Item]] = field(default_factory=dict)
    fit_cache: dict[str, PairedDrop] = field(default_factory=dict)
    check_cache: dict[str, PairedDrop] = field(default_factory=dict)
    test_cache: dict[str, PairedDrop] = field(default_factory=dict)


def _slice(ds: Dataset, start: int, stop: int) -> Dataset:
    return Dataset(ds.images[start:stop], ds.labels[start:stop], ds.split, ds.indices_sha256)


def _copy(ds: Dataset, start: int, stop: int, path: Path) -> Dataset:
    """Rows ``start:stop`` of ``ds`` in a file of their own, copied a block at a time."""
    images = SpilledArray.create(path, (stop - start, *ds.images.shape[1:]))
    for i in range(start, stop, _COPY_ROWS):
        images[i - start : min(i + _COPY_ROWS, stop) - start] = ds.images[i : min(i + _COPY_ROWS, stop)]
    return Dataset(images, ds.labels[start:stop].copy(), ds.split, ds.indices_sha256)


def sample_bytes(s: CalibrationSettings, sources: Sources) -> int:
    """Bytes of the fit, check and test tensors the job holds: ``(fit + check + test) × C × H × W × 4``."""
    test = len(sources.test) if s.test_samples is None else min(s.test_samples, len(sources.test))
    return (s.fit_count + s.check_count + test) * 4 * int(np.prod(sources.calibration.sample_shape))


def in_memory(data: Data) -> Data:
    """``data`` with every sample set in memory (for a process on another machine)."""
    def held(ds: Dataset) -> Dataset:
        return Dataset(SpilledArray.in_memory(ds.images), ds.labels, ds.split, ds.indices_sha256)

    return replace(data, fit=held(data.fit), check=held(data.check), test=held(data.test))


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
    else:  # a file each, so that each pickles as its file (offline.data.SpilledArray), not a copy
        fit, check = (_copy(cal, 0, s.fit_count, spill / "fit.npy"),
                      _copy(cal, s.fit_count, needed, spill / "check.npy"))
        (spill / "calibration.npy").unlink()
    test = read_samples(sources.test, s.test_samples, sources.order, Split.TEST,
                        None if spill is None else spill / "test.npy", tick)
    full = len(runner.cuts) - 1

    def correct(ds: Dataset) -> np.ndarray:
        logits = runner.run_pattern(ds.images, full, {}, FLOAT_BITS, tick)
        return np.asarray(logits.argmax(1).numpy() == ds.labels)

    fit_logits = runner.run_pattern(fit.images, full, {}, FLOAT_BITS, tick)
    fit_correct = np.asarray(fit_logits.argmax(1).numpy() == fit.labels)
    return Data(fit, check, test, fit_logits, fit_correct, correct(check), correct(test))


def key(cut: int, bits: dict[str, int]) -> str:
    """A pattern's identity: its cut and bits."""
    return f"{cut}:" + ",".join(f"{k}={v}" for k, v in sorted(bits.items()))


def split_bits(bits: dict[str, int]) -> tuple[dict[str, int], int]:
    """(weight bits, activation bits) of an allocation."""
    weights = {k: v for k, v in bits.items() if k != "@activation"}
    return weights, bits.get("@activation", FLOAT_BITS)


def is_lossless(bits: dict[str, int]) -> bool:
    """Every tensor and the activation left in float32."""
    return all(b >= FLOAT_BITS for b in bits.values())


def correct_on(st: State, cut: int, bits: dict[str, int], images: np.ndarray,
               labels: np.ndarray) -> np.ndarray:
    """Which of ``images`` the split model gets right with the pattern applied."""
    weights, act = split_bits(bits)
    logits = st.runner.run_pattern(images, cut, weights, act)
    return np.asarray(logits.argmax(1).numpy() == labels)


def evaluate(st: State, cut: int, bits: dict[str, int], ds: Dataset, ref: np.ndarray,
             cache: dict[str, PairedDrop]) -> PairedDrop:
    """Paired counts of a pattern on every sample of ``ds`` (cached). A lossless pattern is the
    float model split at the cut, which computes the float model's logits bit for bit
    (``tests/offline/test_runner.py``): its counts against the float answers ``ref`` are 0 and 0,
    without running it (10,000 test samples per cut)."""
    if is_lossless(bits):
        return PairedDrop(int(ref.size), 0, 0)
    k = key(cut, bits)
    if k not in cache:
        cache[k] = paired_drop(ref, correct_on(st, cut, bits, ds.images, ds.labels))
    return cache[k]
