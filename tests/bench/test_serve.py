"""bench.serve's CPU accounting and the HTTP floor app it compares against."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from bench.floor_server import floor_app
from bench.serve import cpu_at_32


def _run(model, batching, total, loop, clients=32):
    return {"model": model, "batching": batching, "clients": clients, "cpu_s_per_request": total,
            "loop_cpu_s_per_request": loop, "worker_cpu_s_per_request": total - loop}


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
