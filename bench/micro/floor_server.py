"""The HTTP floor of the serving benchmarks: uvicorn, as ``qpart serve`` runs it, around an app
that does nothing but read each request's body and answer a fixed JSON body; or, with
``--artifacts``, around the product's engine alone.

``python -m bench.micro.floor_server --port P [--answer-bytes N] [--artifacts DIR]``

Whatever a server costs per request above the floor (on the same core, under the same load
generator) is its own: routing, middleware, decoding, batching, the model, the answer. The app
is a bare ASGI callable: no framework, no middleware, no lifespan work. uvicorn picks its event
loop and HTTP parser as under ``server.api.main.serve`` and keeps no access log either; its own log
level is warning and the lifespan protocol is off (nothing per request).

With ``--artifacts`` every POST to a tail route goes straight to ``Engine.infer_tail`` (settings
from ``QPART_*`` as ``qpart serve``: batching, torch threads) and its answer's JSON: the server
without FastAPI, Starlette, its middleware and its error mapping. That bounds what trimming the
web layers could give (a malformed request here is a 500, nothing more; a path other than a tail
route or ``/`` a 404).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send

from qpart.server.api import paths
from qpart.server.api.app import freeze_long_lived, load_engine
from qpart.server.settings import ServerSettings


def floor_app(answer_bytes: int) -> ASGIApp:
    """An ASGI app answering every HTTP request 200 with ``answer_bytes`` of JSON, after reading
    its whole body."""
    body = b'{"pad":"' + b"x" * max(0, answer_bytes - 10) + b'"}'
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan: nothing to start or stop
            return
        await _body(receive)
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return app


async def _body(receive: Receive) -> bytes:
    chunks = []
    more = True
    while more:
        message = await receive()
        chunks.append(message.get("body", b""))
        more = message.get("more_body", False) and message["type"] == "http.request"
    return b"".join(chunks)


def engine_app(artifacts: Path) -> ASGIApp:
    """An ASGI app answering tail-route POSTs with ``Engine.infer_tail``'s JSON, nothing else."""
    engine = load_engine(ServerSettings(artifacts=artifacts))
    freeze_long_lived()  # as the product's lifespan does after warm-up
    ok = [(b"content-type", b"application/json")]

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        packet = await _body(receive)
        params = paths.TAIL_INFER.match(scope["path"])
        status = 200
        if params is not None:
            model, version, pattern_id = params["model"], params["version"], params["pattern_id"]
            answer = (await engine.infer_tail(model, version, pattern_id, packet)).json()
        elif scope["path"] == "/":  # the benchmark's readiness probe
            answer = b"{}"
        else:
            status, answer = 404, b'{"error": "only tail routes here"}'
        await send({"type": "http.response.start", "status": status,
                    "headers": [*ok, (b"content-length", str(len(answer)).encode())]})
        await send({"type": "http.response.body", "body": answer})

    return app


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--answer-bytes", type=int, default=640, help="size of the JSON answer")
    parser.add_argument("--artifacts", type=Path, help="serve tails with the engine over these artifacts")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    app = floor_app(args.answer_bytes) if args.artifacts is None else engine_app(args.artifacts)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False, lifespan="off")


if __name__ == "__main__":
    main()
