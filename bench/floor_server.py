"""The HTTP floor of the serving benchmarks: uvicorn, as ``qpart serve`` runs it, around an app
that does nothing but read each request's body and answer a fixed JSON body.

``python -m bench.floor_server --port P [--answer-bytes N]``

Whatever a server costs per request above this one (on the same core, under the same load
generator) is its own: routing, middleware, decoding, batching, the model, the answer. The app
is a bare ASGI callable: no framework, no middleware, no lifespan work. uvicorn's settings are
``server.main.serve``'s (its event loop and HTTP parser picked the same way, no access log).
"""

from __future__ import annotations

import argparse
import sys

import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send


def floor_app(answer_bytes: int) -> ASGIApp:
    """An ASGI app answering every HTTP request 200 with ``answer_bytes`` of JSON, after reading
    its whole body."""
    body = b'{"pad":"' + b"x" * max(0, answer_bytes - 10) + b'"}'
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan: nothing to start or stop
            return
        more = True
        while more:
            message = await receive()
            more = message.get("more_body", False) and message["type"] == "http.request"
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return app


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--answer-bytes", type=int, default=640, help="size of the JSON answer")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    uvicorn.run(floor_app(args.answer_bytes), host="127.0.0.1", port=args.port, log_level="warning",
                access_log=False, lifespan="off")


if __name__ == "__main__":
    main()
