"""PyTriton serving a QPART reference model: run with ``.venv-triton``'s Python by
:mod:`bench.micro.peers.servers`::

    .venv-triton/bin/python -m bench.micro.peers.pytriton_serve --name fmnist-cnn --port 18330

PyTriton starts Triton (the ``tritonserver`` binary in its wheel) and binds one Python function
(``@batch``: a dynamic batch as one array) with ``max_batch_size`` 32 and a dynamic batcher, the
same limits as the other servers; the function runs :class:`bench.micro.peers.graph.ServedGraph`.
HTTP only on 127.0.0.1 (gRPC and metrics on the next two ports, which PyTriton needs). Serves
until SIGTERM.

Not type-checked with the project: pytriton is installed only in ``.venv-triton``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from pytriton.decorators import batch  # type: ignore[import-not-found]
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor  # type: ignore[import-not-found]
from pytriton.triton import Triton, TritonConfig  # type: ignore[import-not-found]

from bench.micro.peers.graph import ServedGraph, model_parser

MAX_BATCH = 32


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point."""
    args = model_parser("python -m bench.micro.peers.pytriton_serve", __doc__, 18330).parse_args(argv)
    graph = ServedGraph.load(args.name, args.weights)

    @batch  # type: ignore[misc]
    def infer(input: np.ndarray) -> dict[str, Any]:
        return {"logits": graph.logits(input)}

    config = TritonConfig(http_address="127.0.0.1", http_port=args.port, grpc_address="127.0.0.1",
                          grpc_port=args.port + 1, metrics_port=args.port + 2, allow_gpu_metrics=False)
    with Triton(config=config) as triton:
        triton.bind(model_name=args.name, infer_func=infer,
                    inputs=[Tensor(name="input", dtype=np.float32, shape=graph.input_shape)],
                    outputs=[Tensor(name="logits", dtype=np.float32, shape=(-1,))],
                    config=ModelConfig(max_batch_size=MAX_BATCH, batcher=DynamicBatcher()), strict=True)
        triton.serve()


if __name__ == "__main__":
    main()
