"""What a tail answer costs the server per request: the per-batch path against the code it replaced.

``python -m bench.micro.answers [--json PATH] [--classes C] [--top-k K] [--rounds R]``

In process, on random logits. The replaced code (:func:`legacy_answer_json`, kept here as the
baseline) built every request's answer on the event loop in plain Python: softmax, a sort, one
``model_construct`` per result and per top-k entry, then ``model_dump_json``. The current path
(:mod:`server.tails.answers`) computes softmax and class order once per batch with numpy in the tail
worker (:func:`server.tails.answers.tail_rows`) and writes each request's JSON with pydantic_core's
serializer (:func:`server.tails.answers.tail_json`). Reported, per request of one sample, for batches of
1 and 16: microseconds of each path (medians over rounds; the batch step shared out over the
batch) and their ratio, measured side by side.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench import write_json
from qpart.server.schemas import TailResponse, TailResult, TopK
from qpart.server.tails.answers import tail_json, tail_rows

BATCHES = (1, 16)


def legacy_answer_json(*, plan_id: str, model: str, version: str, logits: np.ndarray, top_k: int,
                       queue_s: float, compute_s: float) -> bytes:
    """The answer as the server wrote it before server.tails.answers (per request, plain Python)."""
    results = []
    for row in logits:
        values: list[float] = row.tolist()
        top = max(values)
        shifted = [math.exp(v - top) for v in values]
        total = sum(shifted)
        order = sorted(range(len(values)), key=lambda i: -shifted[i])[: max(1, min(top_k, len(values)))]
        entries = [TopK.model_construct(label=i, probability=shifted[i] / total) for i in order]
        results.append(TailResult.model_construct(logits=values, top_k=entries))
    return TailResponse.model_construct(plan_id=plan_id, model=model, version=version, results=results,
                                        queue_s=queue_s, compute_s=compute_s).model_dump_json(
        exclude_none=True).encode()  # no class names then: TopK.name (issue 24) is left out


def _per_request(logits: np.ndarray, ids: dict[str, Any]) -> tuple[Callable[[], None], Callable[[], None]]:
    """(legacy, current): one batch's answers, one request of one sample each."""
    def legacy() -> None:
        for i in range(len(logits)):
            legacy_answer_json(logits=logits[i : i + 1], **ids)

    def current() -> None:
        rows = tail_rows(logits)
        for i in range(len(logits)):
            tail_json(rows=rows[i : i + 1], **ids)

    return legacy, current


def run(classes: int, top_k: int, rounds: int, number: int = 2000) -> dict[str, Any]:
    """The JSON document."""
    rng = np.random.default_rng(0)
    ids = {"plan_id": "m@1/p", "model": "m", "version": "1", "top_k": top_k, "queue_s": 1e-3,
           "compute_s": 4e-4}
    rows_out = []
    for batch in BATCHES:
        legacy, current = _per_request(rng.standard_normal((batch, classes)).astype(np.float32), ids)
        old, new = [], []
        for _ in range(rounds):  # interleaved: a drift of the machine touches both alike
            old.append(timeit.timeit(legacy, number=number) / number / batch)
            new.append(timeit.timeit(current, number=number) / number / batch)
        ratio = statistics.median(o / n for o, n in zip(old, new, strict=True))
        rows_out.append({"batch": batch, "legacy_s_per_request": statistics.median(old),
                         "current_s_per_request": statistics.median(new), "legacy_over_current": ratio})
    return {"classes": classes, "top_k": top_k, "rounds": rounds, "calls_per_round": number,
            "batches": rows_out}


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--classes", type=int, default=10, help="logits per sample (default 10)")
    parser.add_argument("--top-k", type=int, default=5, help="classes in each answer's top k (default 5)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    doc = run(args.classes, args.top_k, args.rounds)
    for row in doc["batches"]:
        print(f"batch {row['batch']:>2}: legacy {row['legacy_s_per_request'] * 1e6:6.1f} us/request, "
              f"current {row['current_s_per_request'] * 1e6:6.1f} us/request, "
              f"x{row['legacy_over_current']:.2f}")
    if args.json:
        write_json(args.json, doc)


if __name__ == "__main__":
    main()
