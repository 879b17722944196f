"""The inference fast path answers exactly as the FastAPI routes do, and falls through when unsure."""

from __future__ import annotations

import json

import numpy as np
import pytest
from starlette.routing import compile_path

from qpart.client.plans import PacketFormat
from qpart.client.runtime import encode_for_plan
from qpart.kernels.coding import deflate
from qpart.server.api import fastpath
from qpart.server.api import paths as route_paths
from tests.server.conftest import make_client

TIMING = ("queue_s", "compute_s")


def _plan(client, cut, headers=None):
    info = client.get("/v1/models/fmnist-cnn", headers=headers).json()
    p = next(p for p in info["patterns"] if p["cut"] == cut and p["level"] == 0.01)
    return {**p, "model": info["model"], "version": info["version"], "cuts": info["cuts"]}


def _requests(client):
    """(method path, body, headers) covering answers and errors of both infer routes."""
    plan = _plan(client, 0)
    url = plan["infer_url"]
    image = np.random.default_rng(0).random((2, 1, 28, 28), dtype=np.float32)
    packet = encode_for_plan(image, PacketFormat.model_validate(plan))
    v2 = "/v2/models/fmnist-cnn/infer"
    tensor = {"name": "input", "shape": [2, 1, 28, 28], "datatype": "FP32"}
    as_json = json.dumps({"inputs": [{**tensor, "data": image.reshape(-1).tolist()}]}).encode()
    raw = image.astype("<f4").tobytes()
    head = json.dumps({"inputs": [{**tensor, "parameters": {"binary_data_size": len(raw)}}],
                       "parameters": {"binary_data_output": True}}).encode()
    binary = {"inference-header-content-length": str(len(head))}
    version = plan["version"]
    return [
        (url, packet, {}),
        (url + "?top_k=3", packet, {}),
        (url + "?top_k=0", packet, {}),  # FastAPI's 422
        (url + "?top_k=x&y=1", packet, {}),
        (url, b"garbage", {}),
        (url, deflate(packet), {"content-encoding": "deflate"}),
        (url, deflate(packet), {"content-encoding": " Deflate "}),
        (url, packet, {"content-encoding": "br"}),  # 415
        (url, b"garbage", {"content-encoding": "deflate"}),
        (url, deflate(packet)[:-2], {"content-encoding": "deflate"}),
        (url.replace(plan["pattern_id"], "nope"), packet, {"content-encoding": "gzip"}),  # 404 first
        (url.replace(plan["pattern_id"], "nope"), b"junk", {"content-encoding": "deflate"}),
        (v2, as_json, {"content-encoding": "deflate"}),  # 415: identity only here
        ("/v2/models/nope/infer", as_json, {"content-encoding": "gzip"}),  # 404 first
        (url, packet[:-3], {}),
        (url.replace(plan["pattern_id"], "nope"), packet, {}),
        ("/v1/models/nope/versions/1/patterns/p/infer", packet, {}),
        (v2, as_json, {}),
        (f"/v2/models/fmnist-cnn/versions/{version}/infer", as_json, {}),
        ("/v2/models/fmnist-cnn/versions/0/infer", as_json, {}),
        (v2, head + raw, binary),
        (v2, head + raw[:-4], binary),
        (v2, head + raw, {"inference-header-content-length": "99999"}),
        (v2, b"{not json", {}),
        ("/v2/models/nope/infer", as_json, {}),
        ("/v2/models/fmnist-cnn-tail/infer", as_json, {}),
    ]


def _answer(response):
    kept = {k: v for k, v in response.headers.items()
            if k in ("content-type", "inference-header-content-length", "retry-after", "www-authenticate")}
    split = response.headers.get("inference-header-content-length")
    if split is not None:
        return response.status_code, json.loads(response.content[: int(split)]), kept
    body = response.json()
    for key in TIMING:
        body.pop(key, None)
    return response.status_code, body, kept


def test_the_fast_path_answers_as_the_routes_do(cnn_only):
    with make_client(cnn_only) as fast, make_client(cnn_only, inference_fast_path=False) as routed:
        requests = _requests(fast)
        statuses = set()
        for path, body, headers in requests:
            a = _answer(fast.post(path, content=body, headers=headers))
            b = _answer(routed.post(path, content=body, headers=headers))
            assert a == b, path
            statuses.add(a[0])
        assert {200, 400, 404, 415, 422} <= statuses


def test_well_formed_requests_take_the_fast_path_and_others_fall_through(cnn_only, monkeypatch):
    reads = []
    original = fastpath._read_body

    async def counting(scope, receive):
        reads.append(1)
        return await original(scope, receive)

    monkeypatch.setattr(fastpath, "_read_body", counting)
    with make_client(cnn_only, auth_token="s3cret") as c:
        token = {"Authorization": "Bearer s3cret"}
        plan = _plan(c, 0, token)
        zeros = np.zeros((1, 1, 28, 28), dtype=np.float32)
        packet = encode_for_plan(zeros, PacketFormat.model_validate(plan))
        assert c.post(plan["infer_url"], content=packet, headers=token).status_code == 200
        assert len(reads) == 1
        denied = c.post(plan["infer_url"], content=packet)  # FastAPI's dependency answers
        assert denied.status_code == 401 and denied.headers["www-authenticate"] == "Bearer"
        assert c.post(plan["infer_url"] + "?top_k=1001", content=packet, headers=token).status_code == 422
        assert len(reads) == 1
        v2 = {"inputs": [{"name": "input", "shape": [1, 1, 28, 28], "datatype": "FP32", "data": [0.0] * 784}]}
        assert c.post("/v2/models/fmnist-cnn/infer", json=v2, headers=token).status_code == 200
        assert len(reads) == 2
        assert c.post("/v2/models/fmnist-cnn/infer", json=v2).status_code == 401
        assert len(reads) == 2


def test_an_oversize_body_on_the_fast_path_is_a_413_that_closes(cnn_only):
    with make_client(cnn_only, max_body_bytes=2048) as c:
        plan = _plan(c, 0)
        # No Content-Length: the body guard, not the declared-length check, must refuse it.
        response = c.post(plan["infer_url"], content=iter([b"x" * 1500, b"x" * 1500]))
        assert response.status_code == 413 and "limit" in response.json()["error"]
        assert response.headers["connection"] == "close"


@pytest.mark.parametrize("path", [
    "/v1/models/m/versions/1/patterns/p/infer", "/v2/models/m/infer", "/v2/models/m/versions/2/infer",
    "/v2/models/m/versions/infer", "/v1/models/m/infer", "/v2/models/a/b/infer", "/v2/models//infer",
])
def test_the_fast_path_patterns_match_what_the_router_matches(cnn_only, path):
    with make_client(cnn_only) as c:
        paths = c.app.openapi()["paths"]
        documented = [p for p, ops in paths.items() if "post" in ops and p.endswith("/infer")]
        assert len(documented) == 3
        routed = [p for p in documented if compile_path(p)[0].match(path)]
        fast = any(r.match(path) is not None for r in (route_paths.TAIL_INFER, route_paths.V2_INFER,
                                                       route_paths.V2_INFER_VERSION))
        assert fast == bool(routed), routed


def test_a_bug_behind_the_fast_path_is_the_same_json_500_as_behind_the_routes(cnn_only, monkeypatch, caplog):
    async def broken(*args, **kwargs):
        raise RuntimeError("boom")

    with make_client(cnn_only) as fast, make_client(cnn_only, inference_fast_path=False) as routed:
        plan = _plan(fast, 0)
        zeros = np.zeros((1, 1, 28, 28), dtype=np.float32)
        packet = encode_for_plan(zeros, PacketFormat.model_validate(plan))
        answers = []
        for c in (fast, routed):
            monkeypatch.setattr(c.app.state.engine, "infer_tail", broken)
            answers.append(_answer(c.post(plan["infer_url"], content=packet)))
        assert answers[0] == answers[1]
        assert answers[0][0] == 500 and "RuntimeError" in answers[0][1]["error"]
        counted = 'qpart_requests_total{model="fmnist-cnn",outcome="server_error",route="tail_infer"} 1.0'
        assert counted in fast.get("/metrics").text and counted in routed.get("/metrics").text
    assert "unhandled error on POST" in caplog.text


def test_a_bug_outside_the_handlers_is_still_a_counted_json_500(cnn_only, monkeypatch):
    """The limits middleware and the fast path sit outside FastAPI's error middleware: an
    exception there (here: choosing the handler) still answers JSON, as the app's handler would."""
    def broken(self, scope):
        raise KeyError("boom")

    monkeypatch.setattr(fastpath.InferFastPath, "_handler", broken)
    with make_client(cnn_only) as c:
        response = c.post("/v1/models/fmnist-cnn/versions/1/patterns/p/infer", content=b"x")
        assert response.status_code == 500 and "KeyError" in response.json()["error"]
        assert 'outcome="server_error",route="tail_infer"} 1.0' in c.get("/metrics").text
