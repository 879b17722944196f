"""What the calibration job holds while it works: the runner, the three sample sets with the float
model's answers (``offline.samples``), the allocation items, and the measured patterns (cached by
bits)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from qpart.models.data import Dataset
from qpart.models.metrics import get_metric
from qpart.offline.allocation import Item
from qpart.offline.runner import ModelRunner
from qpart.offline.samples import Data, Reference
from qpart.offline.settings import CalibrationSettings
from qpart.offline.validation import PairedDrop, paired_drop
from qpart.profiles.artifacts import FLOAT_BITS


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
    test_agreement_cache: dict[str, PairedDrop] = field(default_factory=dict)


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


def hits_on(st: State, cut: int, bits: dict[str, int], images: np.ndarray,
            anchor: np.ndarray) -> np.ndarray:
    """Which of ``images`` the split model hits with the pattern applied, under the job's metric."""
    weights, act = split_bits(bits)
    logits = st.runner.run_pattern(images, cut, weights, act)
    return get_metric(st.settings.metric).hits(logits, anchor)


def evaluate_test(st: State, cut: int, bits: dict[str, int]) -> tuple[PairedDrop, PairedDrop]:
    """A pattern's counts on the test samples under the job's metric and under top1-agreement,
    both from one run of it (cached; a lossless pattern's are 0 without running it)."""
    data, metric, agreement = st.data, get_metric(st.settings.metric), get_metric("top1-agreement")
    n = int(data.test_ref.hits.size)
    if is_lossless(bits):
        return PairedDrop(n, 0, 0, metric.paired), PairedDrop(n, 0, 0, agreement.paired)
    k = key(cut, bits)
    if k not in st.test_cache or k not in st.test_agreement_cache:
        weights, act = split_bits(bits)
        logits = st.runner.run_pattern(data.test.images, cut, weights, act)
        st.test_cache[k] = paired_drop(data.test_ref.hits, metric.hits(logits, data.test_ref.anchor),
                                       metric.paired)
        st.test_agreement_cache[k] = paired_drop(data.test_agreement.hits,
                                                 agreement.hits(logits, data.test_agreement.anchor),
                                                 agreement.paired)
    return st.test_cache[k], st.test_agreement_cache[k]


def evaluate(st: State, cut: int, bits: dict[str, int], ds: Dataset, ref: Reference,
             cache: dict[str, PairedDrop]) -> PairedDrop:
    """Paired counts of a pattern on every sample of ``ds`` (cached), against the float model's
    ``ref`` on it. A lossless pattern is the float model split at the cut, which computes the float
    model's logits bit for bit (``tests/offline/test_runner.py``): its counts are 0 and 0, without
    running it (10,000 test samples per cut)."""
    paired = get_metric(st.settings.metric).paired
    if is_lossless(bits):
        return PairedDrop(int(ref.hits.size), 0, 0, paired)
    k = key(cut, bits)
    if k not in cache:
        cache[k] = paired_drop(ref.hits, hits_on(st, cut, bits, ds.images, ref.anchor), paired)
    return cache[k]
