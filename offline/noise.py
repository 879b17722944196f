"""Logit-noise tables ``E||Δz||²`` per weight tensor and per cut activation, for b = 1..8.

Two ways, measured on the calibration split's fit samples only:

* :func:`direct_tables` quantizes one tensor (or one cut's activation) at a time and measures
  the logit change (QPART / Zhou et al.). Activations at every cut are cached (for as many
  samples at a time as a budget holds), so a weight's measurement runs only the part of the model
  after the last cut before it.
* :func:`fast_tables` is first order: ``E||Δz||² ≈ Σ_i (Δ_i² / 12) · E||∂z/∂θ_i||²`` with
  ``Δ_i`` the quantization step of element ``i``'s channel (weights) or group (activations).
  The squared Jacobian norms of every tensor and every cut come from the same few backward
  passes: with an independent Gaussian probe ``v_x`` per sample, ``E[(Σ_x v_xᵀ J_x)_i²] =
  Σ_x ||J_{x,i}||²`` (the cross terms vanish in expectation).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch
from torch import fx

from qpart.offline.runner import ModelRunner

BITS = tuple(range(1, 9))
Tables = tuple[dict[str, list[float]], dict[str, list[float]]]
Progress = Callable[[int], None]


def _mean_sq(diff: torch.Tensor) -> float:
    return float(diff.pow(2).sum(dim=1).mean())


ACTIVATIONS_BUDGET = 1 << 30
"""Bytes of cached activations :func:`direct_tables` holds at once (every cut's, for a chunk of
samples): the noise samples are measured a chunk at a time when all of them would not fit."""


@torch.no_grad()
def direct_tables(runner: ModelRunner, images: np.ndarray, progress: Progress | None = None,
                  budget: int = ACTIVATIONS_BUDGET) -> Tables:
    """Measured noise tables: ``({tensor: [b=1..8]}, {cut index: [b=1..8]})``.

    Every cut's activation is cached for a chunk of the samples, as many as ``budget`` bytes hold
    (all 2,000 for fmnist-cnn and fmnist-resnet; fmnist-mobilenet takes two chunks); a larger model's
    samples are measured
    a chunk at a time, each quantized tensor once per chunk, and the chunks' sums added up."""
    interior = runner.cuts[:-1]
    per_sample = 4 * sum(c.numel for c in interior)
    chunk = max(1, min(len(images), budget // max(per_sample, 1)))
    starts = range(0, len(images), chunk)
    rows = len(runner.tensors) + len(interior)
    weight = {t.name: [0.0] * len(BITS) for t in runner.tensors}
    activation = {str(c.index): [0.0] * len(BITS) for c in interior}
    for k, first in enumerate(starts):
        part = images[first:first + chunk]
        share = len(part) / len(images)  # chunk means weighted by their size: the whole mean
        acts = {c.index: runner.head_outputs(part, c.index) for c in interior}
        ref = runner.tail_outputs(acts[0], 0)
        done = k * rows * len(BITS)
        for t in runner.tensors:
            start = runner.start_cut(t)
            for i, b in enumerate(BITS):
                with runner.quantized_weights({t.name: b}):
                    weight[t.name][i] += share * _mean_sq(runner.tail_outputs(acts[start], start) - ref)
                done += 1
                if progress:  # the bar counts (tensor, bits) and (cut, bits) steps over all chunks
                    progress(done // len(starts))
        for c in interior:
            for i, b in enumerate(BITS):
                noise = _mean_sq(runner.tail_outputs(acts[c.index], c.index, b) - ref)
                activation[str(c.index)][i] += share * noise
                done += 1
                if progress:
                    progress(done // len(starts))
        del acts, ref
    return weight, activation


def _probe_module(runner: ModelRunner) -> fx.GraphModule:
    """The model with every interior cut's activation as an extra output."""
    gm = runner.gm
    by_name = {n.name: n for n in gm.graph.nodes}
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for node in gm.graph.nodes:
        if node.op == "output":
            extra = [env[by_name[c.node]] for c in runner.cuts[1:-1]]
            graph.output((env[node.args[0]], *extra))
        else:
            env[node] = graph.node_copy(node, lambda n: env[n])
    return fx.GraphModule(gm, graph)


def _group_stats(act: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per sample, per group: squared (max - min) ``[B, G]``, and a mask of the elements that
    quantization perturbs ``[B, G, group]``: an element equal to its group's min is stored
    exactly (code 0), which matters after a ReLU, where most groups hold many zeros."""
    flat = act.detach().reshape(act.shape[0], -1, group)
    low = flat.amin(dim=2, keepdim=True)
    return (flat.amax(dim=2) - low.squeeze(2)).pow(2), flat != low


def fast_tables(runner: ModelRunner, images: np.ndarray, probes: int, seed: int,
                progress: Progress | None = None) -> Tables:
    """First-order noise tables from ``probes`` random-probe backward passes per batch."""
    module = _probe_module(runner)
    gen = torch.Generator().manual_seed(seed)
    params = [runner.gm.get_parameter(t.name) for t in runner.tensors]
    interior = runner.cuts[:-1]
    w_acc = [torch.zeros_like(p) for p in params]
    a_acc = [0.0 for _ in interior]
    flags = [p.requires_grad for p in params]
    for p in params:
        p.requires_grad_(True)
    n = len(images)
    batches = list(range(0, n, runner.batch_size))
    try:
        for k, start in enumerate(batches):
            batch = torch.from_numpy(images[start : start + runner.batch_size])
            x = batch.to(runner.device).requires_grad_(True)
            logits, *mids = module(x)
            acts = [x, *mids]
            stats = [_group_stats(a, runner.groups[c.index]) for a, c in zip(acts, interior, strict=True)]
            a_sq = [torch.zeros_like(a) for a in acts]
            for _ in range(probes):
                v = torch.randn(logits.shape, generator=gen).to(logits.device)  # the CPU's stream
                grads = torch.autograd.grad((logits * v).sum(), [*acts, *params], retain_graph=True)
                for i in range(len(acts)):
                    a_sq[i] += grads[i].pow(2)
                for i, g in enumerate(grads[len(acts) :]):
                    w_acc[i] += g.pow(2)
            for i, (sq, (rng, moved), c) in enumerate(zip(a_sq, stats, interior, strict=True)):
                grouped = sq.reshape(sq.shape[0], -1, runner.groups[c.index]) * moved
                a_acc[i] += float((grouped.sum(dim=2) * rng).sum()) / probes
            if progress:
                progress(k + 1)
    finally:
        for p, flag in zip(params, flags, strict=True):
            p.requires_grad_(flag)
    weight: dict[str, list[float]] = {}
    for t, p, acc in zip(runner.tensors, params, w_acc, strict=True):
        w = p.detach().reshape(p.shape[0], -1)
        range_sq = (w.amax(dim=1) - w.amin(dim=1)).pow(2)
        jac = acc.reshape(p.shape[0], -1).sum(dim=1) / (probes * n)
        base = float((range_sq * jac).sum()) / 12.0
        weight[t.name] = [base / float((1 << b) - 1) ** 2 for b in BITS]
    activation = {
        str(c.index): [a_acc[i] / n / 12.0 / float((1 << b) - 1) ** 2 for b in BITS]
        for i, c in enumerate(interior)
    }
    return weight, activation


def timed(fn: Callable[[], Tables]) -> tuple[Tables, float]:
    """Run ``fn`` and return its result with the wall time in seconds."""
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start
