"""bench.micro.peer's parts that run without the peers' venvs: the ratios, the batch counts read
from each server's statistics, Triton's model configuration, and the harness's process groups
(a server's CPU counts what it starts; stopping it stops them)."""

import subprocess
import sys
import time
from pathlib import Path

from bench.harness.loadgen import Server
from bench.micro.peer import ratios
from bench.micro.peers.graph import ServedGraph
from bench.micro.peers.servers import _metrics, triton_config


def _run(server, payload, clients, rnd, rps, cpu):
    return {"server": server, "payload": payload, "clients": clients, "round": rnd, "throughput_rps": rps,
            "server_cpu_s_per_request": cpu}


def test_ratios_are_ours_over_each_peers_per_round_with_median_and_lowest():
    runs = []
    for rnd, (ours, theirs) in enumerate([(100, 50), (90, 60), (120, 40)]):
        for clients in (1, 8, 32):
            runs += [_run("qpart", "json", clients, rnd, ours, 0.001),
                     _run("triton", "json", clients, rnd, theirs, 0.002)]
    got = ratios(runs, 3)
    assert set(got) == {"json/triton"}  # no binary runs, no other peer: nothing invented
    entry = got["json/triton"]["32"]
    assert entry["rounds"] == [2.0, 1.5, 3.0]
    assert entry["median"] == 2.0 and entry["lowest"] == 1.5
    assert got["json/triton"]["cpu_per_request_at_32"] == 0.5


QPART_METRICS = """# TYPE qpart_tail_batch_size histogram
qpart_tail_batch_size_bucket{le="1.0",model="fmnist-cnn"} 3.0
qpart_tail_batch_size_count{model="fmnist-cnn"} 7.0
qpart_tail_batch_size_sum{model="fmnist-cnn"} 41.0
qpart_tail_batch_size_count{model="fmnist-resnet"} 100.0
"""
TRITON_METRICS = """nv_inference_count{model="fmnist-cnn",version="1"} 64
nv_inference_exec_count{model="fmnist-cnn",version="1"} 4
nv_inference_count{model="other",version="1"} 9
"""


def test_batch_counts_are_read_for_the_model_only():
    assert _metrics(QPART_METRICS, r"qpart_tail_batch_size_(sum|count)", "fmnist-cnn") == {"count": 7.0,
                                                                                          "sum": 41.0}
    assert _metrics(TRITON_METRICS, r"nv_inference_(count|exec_count)", "fmnist-cnn") == {"count": 64.0,
                                                                                         "exec_count": 4.0}


def test_tritons_configuration_batches_like_the_others_and_names_the_graph(tmp_path):
    text = triton_config("fmnist-cnn", (1, 28, 28), tmp_path / "w.safetensors")
    assert 'backend: "python"' in text and "max_batch_size: 32" in text and "dynamic_batching { }" in text
    assert "dims: [ 1, 28, 28 ]" in text and "kind: KIND_CPU count: 1" in text
    assert f'string_value: "{tmp_path / "w.safetensors"}"' in text


def test_the_served_graph_is_the_float_model(artifacts_dir):
    import numpy as np
    import torch

    from qpart.models import get_model
    from qpart.models.data import Split, load_split

    graph = ServedGraph.load("fmnist-cnn", artifacts_dir / "fmnist-cnn" / "weights.safetensors")
    images = load_split(Split.TEST, limit=32).images
    with torch.inference_mode():
        plain = get_model("fmnist-cnn").load()(torch.from_numpy(images)).numpy()
    got = graph.logits(images)
    assert got.shape == (32, 10)
    assert (got.argmax(1) == plain.argmax(1)).all()
    assert np.abs(got - plain).max() < 1e-3  # batch norm folded, channels-last: float rounding only


def test_a_servers_cpu_counts_what_it_started_and_stopping_it_stops_them():
    code = ("import subprocess, sys, time; "
            "subprocess.Popen([sys.executable, '-c', 'while True: pass']); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    server = Server(proc, "http://unused")
    try:
        deadline = time.monotonic() + 20
        while server.cpu_seconds() <= 0.5 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert server.cpu_seconds() > 0.5  # the busy child's, not the sleeping leader's
        assert len(_running(proc.pid)) == 2
    finally:
        server.stop()
    time.sleep(0.3)
    assert _running(proc.pid) == []


def _running(group):
    """The processes of ``group`` still running (a killed child whose parent died first stays a
    zombie until PID 1 reaps it)."""
    found = subprocess.run(["pgrep", "-g", str(group)], check=False, capture_output=True, text=True)
    out = []
    for pid in found.stdout.split():
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            continue
        if state != "Z":
            out.append(pid)
    return out
