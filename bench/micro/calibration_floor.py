"""What measuring a calibrated artifact's lossy patterns on the test split costs with today's
runner: the artifact's own evidence of "0 violations on test" (``measure_test`` and ``baseline``
at their defaults), which every calibration at those settings pays besides its search.

``python -m bench.micro.calibration_floor [--model fmnist-cnn] [--sample 8] [--json PATH]``

It counts the distinct lossy patterns (the chosen ones and QPART's as published) of the committed
artifact, times ``--sample`` of them (evenly spread over the list) on the whole test split with one
torch thread, in process CPU seconds, and extrapolates to all of them. Not a floor under every
possible job: each pattern runs from the input, and reusing unchanged prefix activations (the same
logits, about 1.67x fewer FLOPs over fmnist-cnn's 79 patterns by the review of issue 26's count) or
a fused activation quantizer would lower it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from bench import REPO, write_json
from qpart.models.data import Split
from qpart.models.registry import get_model
from qpart.models.sources import FashionMnistSource
from qpart.offline.memory import keep_freed_memory
from qpart.offline.runner import ModelRunner
from qpart.offline.samples import read_samples
from qpart.profiles.artifacts import FLOAT_BITS


def lossy_patterns(doc: dict[str, Any]) -> list[tuple[int, dict[str, int], int]]:
    """(cut, weight bits, activation bits) of each distinct lossy pattern measured on the test split."""
    found: dict[str, tuple[int, dict[str, int], int]] = {}
    for p in doc["patterns"] + doc.get("baseline_qpart_paper", []):
        bits, act = p["weight_bits"], p["activation_bits"]
        if p.get("test_drop") is None or (act >= FLOAT_BITS and all(b >= FLOAT_BITS for b in bits.values())):
            continue
        found[json.dumps([p["cut"], sorted(bits.items()), act])] = (p["cut"], bits, act)
    return list(found.values())


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="fmnist-cnn")
    p.add_argument("--sample", type=int, default=8, help="patterns timed (evenly spread)")
    p.add_argument("--json", type=Path, default=None,
                   help="default: bench/results/calibration_floor-MODEL.json")
    a = p.parse_args(argv)
    keep_freed_memory()
    torch.set_num_threads(1)
    doc = json.loads((REPO / "artifacts" / a.model / "artifact.json").read_text())
    patterns = lossy_patterns(doc)
    spec = get_model(a.model)
    runner = ModelRunner(spec.load(), spec.input_shape, batch_size=int(doc["settings"]["batch_size"]))
    source = FashionMnistSource(Split.TEST, spec=spec.preprocess)  # as the job reads it
    images = read_samples(source, None, "source", Split.TEST).images
    step = max(1, len(patterns) // a.sample)
    timed = []
    for cut, bits, act in patterns[::step][: a.sample]:
        start = time.process_time()
        runner.run_pattern(images, cut, bits, act)
        timed.append(time.process_time() - start)
        print(f"cut {cut}: {timed[-1]:.2f} CPU-s for {len(images)} test samples", flush=True)
    per = statistics.mean(timed)
    cores = os.cpu_count() or 1
    report = {
        "model": a.model, "artifact_settings": {k: doc["settings"][k] for k in ("threads", "batch_size")},
        "distinct_lossy_patterns_on_test": len(patterns), "test_samples": len(images),
        "timed_patterns": len(timed), "cpu_s_per_pattern": [round(t, 3) for t in timed],
        "cpu_s_per_pattern_mean": round(per, 3),
        "test_split_cpu_s_all_patterns": round(per * len(patterns), 1),
        "host_cpus": cores, "wall_s_on_all_cores": round(per * len(patterns) / cores, 1),
    }
    write_json(a.json or REPO / f"bench/results/calibration_floor-{a.model}.json", report)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
