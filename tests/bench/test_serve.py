"""bench.micro.serve's CPU accounting and the HTTP floor app it compares against."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from bench.micro.floor_server import floor_app
from bench.micro.serve import cpu_at_32


def _run(model, batching, total, loop, clients=32):
    return {"model": model, "batching": batching, "clients": clients, "cpu_s_per_request": total,
            "loop_cpu_s_per_request": loop, "worker_cpu_s_per_request": total - loop,
            "server_cpu_share": 0.99}


def test_cpu_at_32_sets_the_saving_2x_needs_beside_the_loop_above_the_floor():
    runs = [_run("m", True, 800e-6, 300e-6), _run("m", True, 900e-6, 330e-6), _run("m", True, 850e-6, 320e-6),
            _run("m", False, 1400e-6, 500e-6), _run("m", False, 1500e-6, 520e-6),
            _run("m", False, 1450e-6, 510e-6), _run("m", True, 1.0, 1.0, clients=8)]
    floors = [{"cpu_s_per_request": 40e-6}, {"cpu_s_per_request": 50e-6}, {"cpu_s_per_request": 45e-6}]
    got = cpu_at_32(runs, floors, ["m"])
    assert got["http_floor_cpu_s_per_request"] == pytest.approx(45e-6)
    m = got["m"]
    assert m["on"]["cpu_s_per_request"] == pytest.approx(850e-6)
    assert m["off"]["loop_cpu_s_per_request"] == pytest.approx(510e-6)
    assert m["cpu_ratio"] == pytest.approx(1450 / 850)
    # (off - d) / (on - d) = 2 at d = 2 on - off
    d = m["shared_saving_for_2x_s"]
    assert (1450e-6 - d) / (850e-6 - d) == pytest.approx(2.0)
    assert m["on_loop_above_floor_s"] == pytest.approx(320e-6 - 45e-6)


def test_the_floor_app_reads_the_body_and_answers_the_size_asked():
    async def go():
        transport = httpx.ASGITransport(app=floor_app(640))
        async with httpx.AsyncClient(transport=transport, base_url="http://floor") as client:
            return await client.post("/anything/infer", content=b"\x00" * 100_000)

    r = asyncio.run(go())
    assert r.status_code == 200
    assert len(r.content) == 640 and r.json()["pad"] == "x" * 630


def test_the_engine_only_app_answers_a_tail_request_as_the_server_does(cnn_only):
    from fastapi.testclient import TestClient

    from bench.micro.floor_server import engine_app
    from qpart.client.plans import PlanResponse
    from qpart.client.runtime import encode_for_plan
    from qpart.models.data import Split, load_split
    from qpart.server.api.app import create_app
    from qpart.server.settings import ServerSettings

    with TestClient(create_app(ServerSettings(artifacts=cnn_only))) as real:
        plan = real.post("/v1/plan", json={"model": "fmnist-cnn", "accuracy_demand": 0.01, "rate_bps": 1e9,
                                           "device": "raspberry-pi-4"}).json()
        packet = encode_for_plan(load_split(Split.TEST, limit=1).images, PlanResponse.model_validate(plan))
        expected = real.post(plan["infer_url"], content=packet).json()

    async def go():
        transport = httpx.ASGITransport(app=engine_app(cnn_only))
        async with httpx.AsyncClient(transport=transport, base_url="http://bare") as client:
            return await client.post(plan["infer_url"], content=packet)

    got = asyncio.run(go()).json()
    assert got["results"] == expected["results"] and got["plan_id"] == expected["plan_id"]

    async def elsewhere():
        transport = httpx.ASGITransport(app=engine_app(cnn_only))
        async with httpx.AsyncClient(transport=transport, base_url="http://bare") as client:
            return await client.post("/v2/models/fmnist-cnn/infer", content=packet)

    assert asyncio.run(elsewhere()).status_code == 404  # a wrong path is never a cheap success


def test_thread_cpu_seconds_lists_the_main_thread_under_the_process_id():
    import subprocess
    import sys

    from bench.harness.loadgen import Server

    code = "import threading, time; threading.Thread(target=time.sleep, args=(5,)).start(); sum(range(10**7))"
    proc = subprocess.Popen([sys.executable, "-c", code + "; time.sleep(5)"])
    try:
        server = Server(proc, "http://unused")
        import time as _time
        _time.sleep(1.0)
        threads = server.thread_cpu_seconds()
        assert proc.pid in threads and len(threads) == 2
        assert threads[proc.pid] > 0.05  # the main thread did the summing
        assert server.cpu_seconds() >= sum(threads.values()) - 0.02
    finally:
        proc.kill()
        proc.wait()
