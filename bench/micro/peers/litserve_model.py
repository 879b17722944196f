"""LitServe serving a QPART reference model behind the Open Inference Protocol's JSON infer body:
run with ``.venv-litserve``'s Python by :mod:`bench.micro.peers.servers`::

    .venv-litserve/bin/python -m bench.micro.peers.litserve_model --name fmnist-cnn --port 18340

LitServe speaks no v2 of its own; this LitAPI takes the same JSON body the other servers take at
``/v2/models/{m}/infer`` (one ``input`` tensor: ``shape`` and ``data``) and answers v2's JSON
(``outputs``: ``logits``). Batching as the others: up to 32 requests, LitServe's dynamic batcher
(``batch_timeout`` 1 ms), one inference worker on the CPU, one API server process; the graph is
:class:`bench.micro.peers.graph.ServedGraph`. Binary tensors are not offered (LitServe decodes JSON
or form bodies). Serves until SIGTERM.

Not type-checked with the project: litserve is installed only in ``.venv-litserve``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import litserve as ls  # type: ignore[import-not-found]
import numpy as np

from bench.micro.peers.graph import ServedGraph, model_parser

MAX_BATCH = 32
BATCH_TIMEOUT_S = 0.001


class V2Api(ls.LitAPI):  # type: ignore[misc]
    """One v2 JSON infer request in, its logits out, batched by LitServe."""

    def __init__(self, name: str, weights: Path | None) -> None:
        super().__init__(max_batch_size=MAX_BATCH, batch_timeout=BATCH_TIMEOUT_S,
                         api_path=f"/v2/models/{name}/infer")
        self.name, self.weights = name, weights

    def setup(self, device: str) -> None:
        """Build the served graph in the inference worker."""
        self.graph = ServedGraph.load(self.name, self.weights)

    def decode_request(self, request):  # type: ignore[no-untyped-def]
        """The ``input`` tensor's one sample (``request``: the JSON body as a dict; LitServe builds
        its route from this signature, and an annotation would make it a query parameter)."""
        tensor = request["inputs"][0]
        x = np.asarray(tensor["data"], dtype=np.float32).reshape(tensor["shape"])
        if x.shape != (1, *self.graph.input_shape):
            raise ValueError(f"input must be [1, {', '.join(map(str, self.graph.input_shape))}]")
        return x[0]

    def batch(self, inputs: list[np.ndarray]) -> np.ndarray:
        """The samples as one array."""
        return np.stack(inputs)

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Logits of the batch."""
        return self.graph.logits(x)

    def unbatch(self, output: np.ndarray) -> list[np.ndarray]:
        """One row per request."""
        return list(output)

    def encode_response(self, output: np.ndarray) -> dict[str, Any]:
        """v2's JSON answer."""
        return {"model_name": self.name,
                "outputs": [{"name": "logits", "shape": [1, int(output.size)], "datatype": "FP32",
                             "data": output.tolist()}]}


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point."""
    args = model_parser("python -m bench.micro.peers.litserve_model", __doc__, 18340).parse_args(argv)
    server = ls.LitServer(V2Api(args.name, args.weights), accelerator="cpu", devices=1, workers_per_device=1)
    server.run(host="127.0.0.1", port=args.port, num_api_servers=1, log_level="warning",
               generate_client_file=False)


if __name__ == "__main__":
    main()
