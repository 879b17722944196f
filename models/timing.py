"""Per-module latency: warm-up runs, then the median of timed runs (ElasticTrainer's profiler)."""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Sequence

import torch
from torch import nn


def interleaved_medians(fns: Sequence[Callable[[], object]], *, warmup: int, repeats: int,
                        min_seconds: float = 0.0, seed: int = 0) -> list[float]:
    """Median seconds of each of ``fns``, timed in rounds that run every one once, in a fresh
    random order each round.

    A shared machine's speed wanders over seconds (seen here: 9-run medians of the same CNN from
    0.91 to 1.81 ms within a minute). Timed one after another, each function would get its own
    moment of that wander and the ratios between them would be noise; in rounds, every function
    sees the same moments. Runs ``warmup`` untimed calls of each, then at least ``repeats``
    rounds and, with ``min_seconds``, rounds until that long has passed (a longer window averages
    more of the wander)."""
    if repeats < 1:
        raise ValueError("repeats must be at least 1")
    for fn in fns:
        for _ in range(warmup):
            fn()
    samples: list[list[float]] = [[] for _ in fns]
    order = list(range(len(fns)))
    rng = random.Random(seed)
    started = time.perf_counter()
    rounds = 0
    while rounds < repeats or time.perf_counter() - started < min_seconds:
        rng.shuffle(order)
        for i in order:
            start = time.perf_counter()
            fns[i]()
            samples[i].append(time.perf_counter() - start)
        rounds += 1
    return [statistics.median(s) for s in samples]


def median_seconds(fn: Callable[[], object], *, warmup: int, repeats: int) -> float:
    """Median seconds of ``fn()`` over ``repeats`` runs after ``warmup`` untimed ones."""
    return interleaved_medians([fn], warmup=warmup, repeats=repeats)[0]


@torch.inference_mode()
def median_latency(module: nn.Module, x: torch.Tensor, *, warmup: int, repeats: int) -> float:
    """Median seconds of ``module(x)`` over ``repeats`` runs after ``warmup`` untimed ones."""
    return median_seconds(lambda: module(x), warmup=warmup, repeats=repeats)
