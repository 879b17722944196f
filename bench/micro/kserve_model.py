"""A QPART reference model served by KServe's Python model server: the peer of ``bench.micro.peer``.

Runs with the KServe venv's python (``.venv-kserve``, made by ``bench.micro.peer``; kserve is never a
dependency of this project), from the repository root or with it on ``PYTHONPATH``::

    .venv-kserve/bin/python -m bench.micro.kserve_model --name fmnist-cnn --port 8080

It serves exactly the graph ``qpart serve`` runs for ``/v2/models/{m}/infer``
(:class:`bench.micro.peers.graph.ServedGraph`).

KServe 0.21 has no bind-address option (``RESTServer`` hard-codes ``0.0.0.0``) and starts a gRPC
server on 8081 unless told otherwise. :class:`LoopbackModelServer` starts only a
:class:`LoopbackRESTServer` (one uvicorn worker, bound to 127.0.0.1) and no gRPC server.
Per-request log lines (uvicorn's access log, KServe's latency and timing trace lines) are off by
default, as they are in ``qpart serve``; ``--request-logs`` keeps KServe's defaults.

This file is not type-checked with the project (``bench`` is outside mypy's packages, and kserve
ships no type information); ``mypy --strict --python-executable .venv-kserve/bin/python`` checks it.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import numpy as np
from kserve import InferOutput, InferRequest, InferResponse, Model, ModelServer  # type: ignore[import-untyped]
from kserve.constants.constants import FASTAPI_APP_IMPORT_STRING  # type: ignore[import-untyped]
from kserve.errors import InvalidInput  # type: ignore[import-untyped]
from kserve.protocol.rest.server import RESTServer  # type: ignore[import-untyped]
from kserve.utils.utils import generate_uuid  # type: ignore[import-untyped]

from bench.micro.peers.graph import ServedGraph, model_parser

LOOPBACK = "127.0.0.1"


class LoopbackRESTServer(RESTServer):  # type: ignore[misc]
    """KServe's REST server (uvicorn), bound to 127.0.0.1 instead of its hard-coded 0.0.0.0."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # The uvicorn.Server built in super().__init__ holds this same Config and reads the host
        # only when it binds, in serve().
        self.config.host = LOOPBACK


class LoopbackModelServer(ModelServer):  # type: ignore[misc]
    """ModelServer.start for one worker without gRPC, on :class:`LoopbackRESTServer`."""

    def start(self, models: list[Model]) -> None:
        """Register ``models`` and serve REST on 127.0.0.1 until a signal (blocks)."""
        self._register_and_check_atleast_one_model_is_ready(models)
        self._rest_server = LoopbackRESTServer(
            FASTAPI_APP_IMPORT_STRING, self.dataplane, self.model_repository_extension, self.http_port,
            access_log_format=self.access_log_format, workers=1, grace_period=self.grace_period,
            event_loop=self.event_loop, timeout_keep_alive=self.timeout_keep_alive)
        self.servers.append(self._rest_server.start())
        self.setup_event_loop()
        self.register_signal_handler()
        asyncio.run(self._serve())


class FullModel(Model):  # type: ignore[misc]
    """A registered QPART model, whole (cut 0): input ``input`` FP32 ``[-1, *shape]`` -> ``logits``."""

    def __init__(self, name: str, weights: Path | None = None) -> None:
        super().__init__(name)
        self._graph = ServedGraph.load(name, weights)
        self.ready = True

    def predict(self, payload: InferRequest, headers: dict[str, str] | None = None) -> InferResponse:
        """Logits for a batch; binary outputs when the request asks (``binary_data_output``)."""
        x = payload.inputs[0].as_numpy()
        shape = self._graph.input_shape
        if x.dtype != np.float32 or tuple(x.shape[1:]) != shape or not np.isfinite(x).all():
            want = ", ".join(map(str, shape))
            raise InvalidInput(f"input must be finite FP32 [batch, {want}], got {x.dtype} {list(x.shape)}")
        logits = self._graph.logits(x)
        output = InferOutput(name="logits", shape=list(logits.shape), datatype="FP32")
        output.set_data_from_numpy(logits, binary_data=payload.use_binary_outputs)
        return InferResponse(model_name=self.name, infer_outputs=[output],
                             response_id=payload.id or generate_uuid(),
                             use_binary_outputs=payload.use_binary_outputs,
                             requested_outputs=payload.request_outputs)


def _silence_request_logs() -> None:
    # uvicorn writes an access line whenever "uvicorn.access" has handlers; KServe's timing
    # middleware and latency lines go to "kserve.trace" at INFO.
    access = logging.getLogger("uvicorn.access")
    access.handlers.clear()
    access.propagate = False
    logging.getLogger("kserve.trace").setLevel(logging.WARNING)


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point."""
    # Option names must not be prefixes of KServe's own: kserve.model_server parses sys.argv with
    # parse_known_args (abbreviations allowed) when it is imported.
    parser = model_parser("python -m bench.micro.kserve_model", __doc__, 8080)
    parser.add_argument("--request-logs", action="store_true",
                        help="keep KServe's per-request access and latency log lines")
    args = parser.parse_args(argv)
    model = FullModel(args.name, args.weights)
    server = LoopbackModelServer(http_port=args.port, workers=1, enable_grpc=False,
                                 enable_latency_logging=args.request_logs)
    if not args.request_logs:
        _silence_request_logs()
    server.start([model])


if __name__ == "__main__":
    main()
