"""Per-module latency: warm-up runs, then the median of timed runs (ElasticTrainer's profiler)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
from torch import nn


def median_seconds(fn: Callable[[], object], *, warmup: int, repeats: int) -> float:
    """Median seconds of ``fn()`` over ``repeats`` runs after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


@torch.inference_mode()
def median_latency(module: nn.Module, x: torch.Tensor, *, warmup: int, repeats: int) -> float:
    """Median seconds of ``module(x)`` over ``repeats`` runs after ``warmup`` untimed ones."""
    return median_seconds(lambda: module(x), warmup=warmup, repeats=repeats)
