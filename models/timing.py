"""Per-module latency: warm-up runs, then the median of timed runs (ElasticTrainer's profiler)."""

from __future__ import annotations

import statistics
import time

import torch
from torch import nn


@torch.inference_mode()
def median_latency(module: nn.Module, x: torch.Tensor, *, warmup: int, repeats: int) -> float:
    """Median seconds of ``module(x)`` over ``repeats`` runs after ``warmup`` untimed ones."""
    for _ in range(warmup):
        module(x)
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        module(x)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)
