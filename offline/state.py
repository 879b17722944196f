"""What the calibration job holds while it works: the runner, the three sample sets with the float
model's answers, the allocation items, and the measured patterns (cached by bits)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from qpart.models.data import Dataset, Split
from qpart.offline.allocation import Item
from qpart.offline.data import Sources, read_samples
from qpart.offline.errors import CalibrationConfigError
from qpart.offline.runner import ModelRunner
from qpart.offline.settings import CalibrationSettings
from qpart.offline.validation import PairedDrop, paired_drop
from qpart.profiles.artifacts import FLOAT_BITS


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


def load_data(runner: ModelRunner, s: CalibrationSettings, sources: Sources) -> Data:
    """The calibration source cut into fit and check samples (the first ``fit_samples`` and the
    next ``check_samples`` in the sample order), and the test source's first ``test_samples``.

    The tensors are decoded a batch at a time and held once: ``(fit + check + test) × C × H × W × 4``
    bytes (``docs/data-sources.md``).
    """
    needed = s.fit_samples + s.check_samples
    if needed > len(sources.calibration):
        raise CalibrationConfigError(
            f"fit_samples + check_samples = {needed} exceeds the {len(sources.calibration)} calibration "
            f"samples")
    cal = read_samples(sources.calibration, needed, sources.order, Split.CALIBRATION)
    fit = _slice(cal, 0, s.fit_samples)
    check = _slice(cal, s.fit_samples, needed)
    test = read_samples(sources.test, s.test_samples, sources.order, Split.TEST)
    full = len(runner.cuts) - 1

    def correct(ds: Dataset) -> np.ndarray:
        logits = runner.run_pattern(ds.images, full, {}, FLOAT_BITS)
        return np.asarray(logits.argmax(1).numpy() == ds.labels)

    fit_logits = runner.run_pattern(fit.images, full, {}, FLOAT_BITS)
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
    """Paired counts of a pattern on every sample of ``ds`` (cached)."""
    k = key(cut, bits)
    if k not in cache:
        cache[k] = paired_drop(ref, correct_on(st, cut, bits, ds.images, ds.labels))
    return cache[k]
