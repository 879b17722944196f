"""A tail batch's answer: softmax and class order for the whole batch at once, JSON per request.

The batch function of a tail (:meth:`server.tails.tail_pool.TailPool.runner`) turns its logits into
:class:`TailRows` in the worker thread, vectorized over the batch, so the event loop does no
per-request softmax or pydantic serialization; each request takes its slice
(:class:`server.tails.batching.Batcher` slices any ``Rows``) and :func:`tail_json` writes the
:class:`server.schemas.TailResponse` document byte for byte as ``model_dump_json`` would (a test
compares them), except that a class's ``name`` is left out, not null, when the card names no
labels. ``bench/README.md`` has the measured saving (``python -m bench.micro.answers``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from pydantic_core import to_json


@dataclass(frozen=True, slots=True, eq=False)
class TailRows:
    """A tail batch's outputs, one row per sample."""

    logits: np.ndarray  # [B, C] float32, as the model produced them
    finite: np.ndarray  # [B] bool: the row holds no NaN or infinity
    order: np.ndarray  # [B, C] int64: class indices by falling probability (ties: lower index first)
    probability: np.ndarray  # [B, C] float64: softmax probabilities in that order

    def __getitem__(self, rows: slice) -> TailRows:
        return TailRows(self.logits[rows], self.finite[rows], self.order[rows], self.probability[rows])

    def __len__(self) -> int:
        return int(self.logits.shape[0])


def tail_rows(logits: np.ndarray) -> TailRows:
    """Softmax (in float64) and class order of every row of ``[B, C]`` logits.

    Rows with NaN or infinity are marked not finite; their order and probabilities are
    meaningless and must not be served.
    """
    finite = np.isfinite(logits).all(axis=1)
    wide = logits.astype(np.float64)
    if not finite.all():
        wide[~finite] = 0.0  # never served; keeps inf - inf out of the arithmetic below
    shifted = np.exp(wide - wide.max(axis=1, keepdims=True))
    # Summed left to right, as Python's sum() did (numpy's sum is pairwise past 8 terms).
    total = np.add.accumulate(shifted, axis=1)[:, -1:]
    # Ranked by the logits themselves: exp rounds logits less than an ulp apart to one value
    # (the replaced code then ranked such near-ties by index, against the larger logit).
    order = np.argsort(-wide, axis=1, kind="stable")
    probability = shifted[np.arange(len(order))[:, None], order] / total
    return TailRows(logits=logits, finite=finite, order=order, probability=probability)


def tail_json(*, plan_id: str, model: str, version: str, rows: TailRows, top_k: int, queue_s: float,
              compute_s: float, names: Sequence[str] | None = None) -> bytes:
    """The :class:`server.schemas.TailResponse` document of ``rows`` (all finite), top ``top_k``
    classes per sample (clamped to 1..C); with ``names`` (the card's labels, in logit order)
    each class also carries its ``name``."""
    k = max(1, min(top_k, int(rows.logits.shape[1])))
    labels: list[list[int]] = rows.order[:, :k].tolist()
    chances: list[list[float]] = rows.probability[:, :k].tolist()
    top: list[list[dict[str, int | float | str]]]
    if names is None:
        top = [[{"label": i, "probability": p} for i, p in zip(ids, ps, strict=True)]
               for ids, ps in zip(labels, chances, strict=True)]
    else:
        top = [[{"label": i, "probability": p, "name": names[i]} for i, p in zip(ids, ps, strict=True)]
               for ids, ps in zip(labels, chances, strict=True)]
    results = [{"logits": values, "top_k": classes}
               for values, classes in zip(rows.logits.tolist(), top, strict=True)]
    document = {"plan_id": plan_id, "model": model, "version": version, "results": results,
                "queue_s": queue_s, "compute_s": compute_s}
    # pydantic_core's serializer (the one behind model_dump_json) takes plain lists and dicts: 3 us
    # here against 20 us for json.dumps, which formats floats slowly.
    return to_json(document, inf_nan_mode="null")


@dataclass(frozen=True, slots=True, eq=False)
class TailAnswer:
    """A tail request's answer: its rows of the batch and what the response reports beside them."""

    plan_id: str
    model: str
    version: str
    rows: TailRows
    top_k: int
    queue_s: float
    compute_s: float
    names: tuple[str, ...] | None = None  # the card's labels: each top class's name
    decode_s: float = 0.0  # the share of compute_s that decoding the upload took (Server-Timing)
    audit_sample: int | None = None  # the sample the request's audit checks (Qpart-Audit-Sample)

    def json(self) -> bytes:
        """The :class:`server.schemas.TailResponse` document."""
        return tail_json(plan_id=self.plan_id, model=self.model, version=self.version, rows=self.rows,
                         top_k=self.top_k, queue_s=self.queue_s, compute_s=self.compute_s,
                         names=self.names)
