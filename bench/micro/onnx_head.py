"""ONNX heads against torch heads, one thread: per cut of each model (its 1% pattern), the head's
latency at batch 1 in ONNX Runtime and in PyTorch (timed in interleaved rounds), the session
creation time of the ONNX segment (in-graph dequantization folded in), and its bytes against the
safetensors segment's.

    python -m bench.micro.onnx_head --repeats 200 --out bench/results/onnx_head.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")  # as the product's devices do (client.onnx_runtime)

import numpy as np
import onnxruntime as ort
import torch

from bench import REPO, provenance
from qpart.client.plans import HeadSpec
from qpart.client.runtime import load_head
from qpart.models.data import Split, load_split
from qpart.models.timing import interleaved_medians
from qpart.server.store.catalog import Catalog, LoadedModel
from qpart.server.store.segments import build_onnx_segment, build_segment


def _torch_runner(head: torch.nn.Module, x: torch.Tensor) -> Any:
    def run() -> None:
        with torch.inference_mode():
            head(x)

    return run


def _session(data: bytes) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    return ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])


def measure_model(model: LoadedModel, x: np.ndarray, repeats: int, level: float) -> list[dict[str, Any]]:
    """One row per cut with weights: sizes, session creation and both heads' latencies."""
    rows = []
    for p in sorted((p for p in model.artifact.patterns if p.level == level), key=lambda p: p.cut):
        head = model.parts[p.cut][0]
        if not list(head.parameters()):
            continue
        st = build_segment(head, model.name, model.version, p)
        onnx_bytes = build_onnx_segment(head, tuple(model.artifact.input_shape), model.name, model.version, p)
        created = []
        for _ in range(5):
            t0 = time.perf_counter()
            session = _session(onnx_bytes)
            created.append(time.perf_counter() - t0)
        spec = HeadSpec(model=model.name, version=model.version, cut=p.cut, cut_node=model.cuts[p.cut].node,
                        cuts=len(model.cuts))
        run_torch = _torch_runner(load_head(spec, st), torch.from_numpy(x))
        # Side by side: rounds that run both heads in a random order, so both see the same moments.
        def run_onnx(s: ort.InferenceSession = session) -> None:
            s.run(None, {"input": x})

        onnx_s, torch_s = interleaved_medians([run_onnx, run_torch], warmup=3, repeats=repeats)

        rows.append({
            "model": model.name, "cut": p.cut, "pattern_id": p.pattern_id, "weight_bits": p.weight_bits,
            "safetensors_bytes": len(st), "onnx_bytes": len(onnx_bytes),
            "bytes_ratio": round(len(onnx_bytes) / len(st), 4),
            "session_create_s": statistics.median(created),
            "onnx_head_s": onnx_s, "torch_head_s": torch_s,
        })
    return rows


def main() -> None:
    """Measure both reference models and write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--level", type=float, default=0.01)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "onnx_head.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    x = load_split(Split.TEST, limit=1).images
    rows = []
    for entry in Catalog.load(REPO / "artifacts").entries:
        if entry.model is not None:
            rows += measure_model(entry.model, x, args.repeats, args.level)
    doc = {"provenance": provenance(), "threads": 1, "batch": 1, "repeats": args.repeats, "level": args.level,
           "onnxruntime": ort.__version__, "torch": torch.__version__, "rows": rows}
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    for r in rows:
        print(f"{r['model']:14} cut {r['cut']}: bytes {r['onnx_bytes']:>8} / {r['safetensors_bytes']:>8} "
              f"= {r['bytes_ratio']:.3f}  session {r['session_create_s'] * 1e3:6.2f} ms  head onnx "
              f"{r['onnx_head_s'] * 1e6:8.1f} us  torch {r['torch_head_s'] * 1e6:8.1f} us")


if __name__ == "__main__":
    main()
