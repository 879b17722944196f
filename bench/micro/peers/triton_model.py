"""Triton's Python backend serving a QPART reference model: the ``model.py`` of the model repository
that :mod:`bench.micro.peers.servers` writes (``config.pbtxt``: ``max_batch_size`` 32, dynamic
batching, one CPU instance), run by Triton's Python backend stub with ``.venv-triton``'s Python.

``initialize`` reads the repository root, the model name and the weights from the config's
``parameters`` and builds :class:`bench.micro.peers.graph.ServedGraph`; ``execute`` runs one
dynamic batch as one tensor and answers each request with its rows. This is the ``model.py`` a
Triton user writes for a torch model without a C++ backend.

Not type-checked with the project: ``triton_python_backend_utils`` exists only inside the stub.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils  # type: ignore[import-not-found]


class TritonPythonModel:
    """The model's whole graph (cut 0's tail), one dynamic batch at a time."""

    def initialize(self, args: dict[str, str]) -> None:
        """Build the served graph from the config's ``repo``, ``model`` and ``weights`` parameters."""
        params = {k: v["string_value"] for k, v in json.loads(args["model_config"])["parameters"].items()}
        if params["repo"] not in sys.path:
            sys.path.insert(0, params["repo"])
        from bench.micro.peers.graph import ServedGraph  # the repository is on the path now

        self.graph = ServedGraph.load(params["model"], Path(params["weights"]))

    def execute(self, requests: list[Any]) -> list[Any]:
        """One response per request, from one run over the whole batch."""
        arrays = [pb_utils.get_input_tensor_by_name(r, "input").as_numpy() for r in requests]
        logits = self.graph.logits(np.concatenate(arrays, axis=0))
        responses, start = [], 0
        for a in arrays:
            rows = np.ascontiguousarray(logits[start : start + a.shape[0]])
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("logits", rows)]))
            start += a.shape[0]
        return responses
