"""Per-module latency: warm-up runs, then the median of timed runs (ElasticTrainer's profiler)."""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Callable, Sequence

import torch
from torch import nn


def interleaved_medians(fns: Sequence[Callable[[], object]], *, warmup: int, repeats: int,
                        min_seconds: float = 0.0, seed: int = 0, settle: int = 0,
                        burst: int = 1) -> list[float]:
    """Median seconds of each of ``fns``, timed in rounds that run every one in turn, in a fresh
    random order each round.

    A shared machine's speed wanders over seconds. Timed one after another, each function would
    get its own moment of that wander and the ratios between them would be noise; in rounds,
    every function sees the same moments. Runs ``warmup`` untimed calls of each, then at least
    ``repeats`` rounds and, with ``min_seconds``, rounds until that long has passed (a longer
    window averages more of the wander). In each round a function runs ``settle`` untimed calls,
    then ``burst`` timed ones back to back; the round's sample is their median. A function run
    right after others is slower than one run again and again (seen here: a head profile of
    single calls in rounds read a median 13% above the same heads timed as 5 untimed then 9
    timed calls), so time it the way the time will be used."""
    if repeats < 1 or burst < 1 or settle < 0:
        raise ValueError("repeats and burst must be at least 1 and settle at least 0")
    if not math.isfinite(min_seconds) or min_seconds < 0:
        raise ValueError("min_seconds must be finite and not negative")
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
            fn = fns[i]
            for _ in range(settle):
                fn()
            timed = []
            for _ in range(burst):
                start = time.perf_counter()
                fn()
                timed.append(time.perf_counter() - start)
            samples[i].append(statistics.median(timed))
        rounds += 1
    return [statistics.median(s) for s in samples]


def median_seconds(fn: Callable[[], object], *, warmup: int, repeats: int) -> float:
    """Median seconds of ``fn()`` over ``repeats`` runs after ``warmup`` untimed ones."""
    return interleaved_medians([fn], warmup=warmup, repeats=1, burst=repeats)[0]


@torch.inference_mode()
def median_latency(module: nn.Module, x: torch.Tensor, *, warmup: int, repeats: int) -> float:
    """Median seconds of ``module(x)`` over ``repeats`` runs after ``warmup`` untimed ones."""
    return median_seconds(lambda: module(x), warmup=warmup, repeats=repeats)
