"""The naive baseline of split computing (issue 27): the device sends its input image compressed.

``python -m bench.micro.input_codecs [--limit N] --json bench/results/input_codecs.json``

For each model and each codec (PNG, lossless; WebP and JPEG at a few qualities) every test image,
as the device holds it (the 28x28 grayscale pixels of the IDX file), is encoded with Pillow,
decoded again, put through the model card's preprocessing (as the server would) and classified by
the float model. Per codec: encoded bytes (mean, median, 95th percentile), the top-1 drop against
the float model on the same images (correct answers lost over the count, the promise's measure), and
encode and decode times (one thread, median over a sample). Beside them, what the planner's own
cut-0 pattern at each level uploads: its packet bytes times the cheaper calibrated coding ratio.

SC2 (Matsubara et al., TMLR 2023) found split computing often loses to this baseline; these figures
say by how many bytes it would here, and whether the codec keeps a demand.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from PIL import Image

from bench import REPO, write_json
from bench.harness.baseline_routes import decode_image
from bench.harness.codecs import CODECS, encode
from qpart.models import METRICS, hits_of
from qpart.models.data import Split, load_split_pixels
from qpart.models.preprocess import preprocess_image
from qpart.models.registry import get_model
from qpart.profiles.artifacts import load_artifact

MODELS = ("fmnist-cnn", "fmnist-resnet", "fmnist-mobilenet")
TIMED = 200  # images timed per codec for encode and decode
BATCH = 250


def correct(model: torch.nn.Module, images: list[Image.Image], labels: npt.NDArray[np.int64],
            name: str) -> int:
    """How many of ``images`` the model classifies right after the card's preprocessing."""
    spec = get_model(name).preprocess
    if spec is None:
        raise ValueError(f"{name}'s card declares no preprocessing")
    hits = 0
    with torch.inference_mode():
        for i in range(0, len(images), BATCH):
            x = np.stack([preprocess_image(im, spec) for im in images[i : i + BATCH]])
            logits = model(torch.from_numpy(x))
            hits += int(hits_of(METRICS["top1-drop"], logits, labels[i : i + BATCH]).sum())
    return hits


def _median_us(fn: Any, items: list[Any]) -> float:
    times = []
    for item in items:
        start = time.perf_counter()
        fn(item)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def planner_cut0_bytes(name: str, artifacts: Path) -> dict[str, float]:
    """Per level, the planner's cut-0 packet bytes times its cheaper calibrated coding ratio."""
    artifact = load_artifact(artifacts / name)
    ratios = artifact.cuts[0].coding_ratio
    out = {}
    for p in artifact.patterns:
        if p.cut == 0:
            best = min([1.0, *(r[p.activation_bits] for r in ratios.values() if p.activation_bits in r)])
            out[str(p.level)] = p.activation_bytes * best
    return out


def measure_model(name: str, limit: int | None, artifacts: Path) -> dict[str, Any]:
    """Every codec's bytes, drop and times on ``name``'s test split."""
    pixels, labels, _ = load_split_pixels(Split.TEST, limit)
    model = get_model(name).load().eval()
    raw = [Image.fromarray(p, "L") for p in pixels]
    base = correct(model, raw, labels, name)
    codecs = {}
    for codec in CODECS:
        data = [encode(p, codec) for p in pixels]
        hits = correct(model, [decode_image(d) for d in data], labels, name)
        sizes = [len(d) for d in data]
        codecs[codec] = {"bytes_mean": float(np.mean(sizes)), "bytes_median": float(np.median(sizes)),
                         "bytes_p95": float(np.percentile(sizes, 95)), "correct": hits,
                         "test_drop": (base - hits) / len(labels),
                         "encode_us": _median_us(lambda p, c=codec: encode(p, c), list(pixels[:TIMED])),
                         "decode_us": _median_us(decode_image, data[:TIMED])}
        print(f"{name:<17} {codec:<8} {codecs[codec]['bytes_mean']:7.1f} B  drop "
              f"{codecs[codec]['test_drop']:+.4f}", file=sys.stderr)
    return {"images": len(labels), "float_correct": base, "codecs": codecs,
            "planner_cut0_upload_bytes": planner_cut0_bytes(name, artifacts)}


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, required=True, help="write results here")
    parser.add_argument("--limit", type=int, default=None, help="first N test images (default: all 10,000)")
    parser.add_argument("--model", action="append", choices=MODELS, help="model(s) (default: all three)")
    parser.add_argument("--artifacts", type=Path, default=REPO / "artifacts")
    args = parser.parse_args(argv)
    if args.limit is not None and args.limit < 1:
        parser.error(f"--limit counts images: 1 or more, not {args.limit}")
    torch.set_num_threads(1)
    doc = {"models": {m: measure_model(m, args.limit, args.artifacts) for m in args.model or MODELS},
           "threads": 1}
    write_json(args.json, doc)


if __name__ == "__main__":
    main()
