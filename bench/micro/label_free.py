"""Issue 49, acceptance 2: a calibration made without labels, checked against the labels it never
saw. Each quantized pattern of the artifact runs on the labelled Fashion-MNIST test split; the
benchmark counts the patterns over their level by the artifact's own metric (top1-agreement: the
share of test images whose top-1 differs from the float model's) and by the top-1 drop against the
labels, which the agreement bounds (a pattern can lose a correct answer only by changing it).

    python -m bench.micro.label_free --artifact DIR --json bench/results/label_free.json

The artifact must have been calibrated on data whose samples are not in the test split (its own
record says which: the flat export of the ``calibration`` split, for the acceptance run).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench import write_json
from qpart.models import Split, get_metric, get_model, load_split
from qpart.offline.runner import ModelRunner
from qpart.offline.validation import paired_drop
from qpart.profiles.artifacts import FLOAT_BITS, load_artifact


def check(artifact_dir: Path, limit: int | None = None) -> dict[str, Any]:
    """Every quantized pattern's agreement and top-1 drop on the labelled test split."""
    artifact = load_artifact(artifact_dir)
    spec = get_model(artifact.model)
    torch.set_num_threads(2)
    runner = ModelRunner(spec.load(), spec.input_shape)
    test = load_split(Split.TEST, limit)
    images, labels = np.asarray(test.images), np.asarray(test.labels)
    float_logits = runner.run_pattern(images, len(runner.cuts) - 1, {}, FLOAT_BITS)
    agree, drop = get_metric("top1-agreement"), get_metric("top1-drop")
    anchors = {"agree": agree.anchor(float_logits, None), "drop": drop.anchor(float_logits, labels)}
    ref = {"agree": agree.hits(float_logits, anchors["agree"]),
           "drop": drop.hits(float_logits, anchors["drop"])}
    rows: list[dict[str, Any]] = []
    for p in artifact.patterns:
        if p.level == 0 or all(b >= FLOAT_BITS for b in [*p.weight_bits.values(), p.activation_bits]):
            continue
        logits = runner.run_pattern(images, p.cut, p.weight_bits, p.activation_bits)
        flips = paired_drop(ref["agree"], agree.hits(logits, anchors["agree"]), agree.paired)
        lost = paired_drop(ref["drop"], drop.hits(logits, anchors["drop"]), drop.paired)
        rows.append({"pattern_id": p.pattern_id, "cut": p.cut, "level": p.level,
                     "disagreement": flips.drop, "top1_drop": lost.drop,
                     "artifact_test_drop": p.test_drop})
    return {
        "artifact": str(artifact_dir), "model": artifact.model, "version": artifact.version,
        "metric": artifact.metric, "statement": artifact.promise.statement if artifact.promise else None,
        "calibration_data": artifact.data.calibration.location if artifact.data else None,
        "calibration_classes": list(artifact.data.calibration.classes) if artifact.data else None,
        "test_images": len(labels), "quantized_patterns": len(rows),
        "over_level_by_agreement": sum(r["disagreement"] > r["level"] for r in rows),
        "over_level_by_top1_drop": sum(r["top1_drop"] > r["level"] for r in rows),
        "drop_above_disagreement": sum(r["top1_drop"] > r["disagreement"] + 1e-12 for r in rows),
        "patterns": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--artifact", type=Path, required=True, help="The calibrated artifact's folder.")
    parser.add_argument("--limit", type=int, default=None, help="Test images (default: all 10,000).")
    parser.add_argument("--json", type=Path, required=True, help="Where to write the summary.")
    args = parser.parse_args()
    doc = check(args.artifact, args.limit)
    write_json(args.json, doc)
    print(f"{doc['quantized_patterns']} quantized patterns on {doc['test_images']} labelled test images: "
          f"{doc['over_level_by_agreement']} over their level by agreement, "
          f"{doc['over_level_by_top1_drop']} by top-1 drop; drop above disagreement: "
          f"{doc['drop_above_disagreement']}")


if __name__ == "__main__":
    main()
