"""The classification extension of the Open Inference Protocol, as Triton serves it.

A requested output with ``parameters: {"classification": N}`` (what tritonclient's
``InferRequestedOutput(name, class_count=N)`` sends) is answered, instead of the tensor, with a
BYTES tensor ``[batch, min(N, classes)]`` of the top N entries of each sample as
``"score:index:label"`` strings (``"score:index"`` when the model card names no labels). The
score is the output's value formatted as C++ ``std::to_string`` does (``%f``, six decimals),
entries by falling score, ties lower index first.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from qpart.server.errors import BadRequestError
from qpart.server.oip_schemas import InferRequestedOutput

PARAMETER = "classification"


def class_count(output: InferRequestedOutput) -> int | None:
    """The ``classification`` count an output asks for (None: the tensor itself)."""
    count = (output.parameters or {}).get(PARAMETER)
    if count is None:
        return None
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise BadRequestError(f"output '{output.name}': parameter 'classification' must be a positive "
                              f"integer (the number of top classes), got {count!r}")
    return count


def classify(values: np.ndarray, count: int, labels: Sequence[str] | None) -> np.ndarray:
    """The top ``count`` entries of each row of ``values`` ``[B, C]`` as ``score:index[:label]``
    byte strings: an object array ``[B, min(count, C)]``."""
    k = min(count, int(values.shape[1]))
    order = np.argsort(-values.astype(np.float64), axis=1, kind="stable")[:, :k]
    scores = np.take_along_axis(values, order, axis=1).tolist()
    out = np.empty(order.shape, dtype=object)
    for row, (indices, row_scores) in enumerate(zip(order.tolist(), scores, strict=True)):
        for col, (index, score) in enumerate(zip(indices, row_scores, strict=True)):
            entry = f"{score:f}:{index}" if labels is None else f"{score:f}:{index}:{labels[index]}"
            out[row, col] = entry.encode()
    return out
