"""How much batching can speed up a model's compute: whole-model time per sample by batch size.

``python -m bench.micro.compute [--json PATH] [--model M ...] [--batches 1 2 4 8 16 32] [--rounds R]``

In process, one torch thread, the trained model prepared as the server's tail runner prepares it
(fx graph, 4-D weights and inputs in channels-last memory format; cut 0, so the tail is the whole
model), on real test images. Each (model, batch) is timed as the median of many calls after a
warm-up; batches are interleaved round by round, so a drift of this shared machine's speed
touches all of them alike. Reported: seconds per sample, FLOP/s, and the compute speed-up of
each batch size over batch 1, which bounds what batching can gain in ``bench.micro.serve`` beyond
sharing per-request overheads.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch

from bench import REPO, write_json
from qpart.models.data import Split, load_split
from qpart.models.partition import cuts_of, prepare, split
from qpart.models.registry import get_model
from qpart.profiles.artifacts import load_artifact

BATCHES = (1, 2, 4, 8, 16, 32)
MODELS = ("fmnist-cnn", "fmnist-resnet")


def _runner(name: str, artifacts: Path) -> tuple[torch.nn.Module, float]:
    """The whole model as the server runs a cut-0 tail, and its FLOPs per sample (calibration
    artifact: the last cut's head is the whole model)."""
    spec = get_model(name)
    gm = prepare(spec.load(), spec.input_shape)
    tail = split(gm, cuts_of(gm)[0])[1].eval()
    for param in tail.parameters():
        if param.dim() == 4:
            param.data = param.data.contiguous(memory_format=torch.channels_last)
    return tail, float(load_artifact(artifacts / name).cuts[-1].head_flops)


def _time(module: torch.nn.Module, x: torch.Tensor, seconds: float) -> list[float]:
    out: list[float] = []
    deadline = time.perf_counter() + seconds
    with torch.inference_mode():
        while time.perf_counter() < deadline or len(out) < 5:
            start = time.perf_counter()
            module(x)
            out.append(time.perf_counter() - start)
    return out


def run(models: list[str], batches: list[int], rounds: int, seconds: float,
        artifacts: Path) -> dict[str, Any]:
    """The JSON document."""
    torch.set_num_threads(1)
    images = torch.from_numpy(load_split(Split.TEST, limit=max(batches)).images)
    doc: dict[str, Any] = {"threads": 1, "rounds": rounds, "seconds_per_round": seconds, "models": {}}
    for name in models:
        tail, flops = _runner(name, artifacts)
        inputs = {b: images[:b].contiguous(memory_format=torch.channels_last) for b in batches}
        _time(tail, inputs[max(batches)], 1.0)  # warm-up
        samples: dict[int, list[float]] = {b: [] for b in batches}
        for _ in range(rounds):
            for b in batches:
                samples[b] += _time(tail, inputs[b], seconds)
        per_sample = {b: statistics.median(samples[b]) / b for b in batches}
        rows = [{"batch": b, "seconds_per_sample": per_sample[b], "flops_per_s": flops / per_sample[b],
                 "speedup_over_batch_1": per_sample[batches[0]] / per_sample[b], "calls": len(samples[b])}
                for b in batches]
        doc["models"][name] = {"flops_per_sample": flops, "batches": rows}
    return doc


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", action="append", choices=MODELS, help="model (repeatable; default both)")
    parser.add_argument("--batches", type=int, nargs="+", default=list(BATCHES),
                        help="batch sizes; the first is the baseline (default 1 2 4 8 16 32)")
    parser.add_argument("--artifacts", type=Path, default=REPO / "artifacts", help="calibration artifacts")
    parser.add_argument("--rounds", type=int, default=5, help="rounds over all batch sizes (default 5)")
    parser.add_argument("--seconds", type=float, default=1.0, help="seconds per batch size and round")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    doc = run(args.model or list(MODELS), args.batches, args.rounds, args.seconds, args.artifacts)
    for name, m in doc["models"].items():
        for row in m["batches"]:
            print(f"{name:<14} batch {row['batch']:>2}: {row['seconds_per_sample'] * 1e6:7.1f} us/sample, "
                  f"{row['flops_per_s'] / 1e9:5.1f} GFLOP/s, x{row['speedup_over_batch_1']:.2f} over batch 1")
    if args.json:
        write_json(args.json, doc)


if __name__ == "__main__":
    main()
