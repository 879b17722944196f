"""End to end over real HTTP: `qpart device infer` agrees with the offline evaluation of its pattern."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import httpx
import numpy as np
import pytest

from models.data import Split, load_split
from models.registry import get_model
from offline.runner import ModelRunner
from tests.conftest import LiveServer

pytestmark = [pytest.mark.integration, pytest.mark.slow]
IMAGES = "/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz"
LABELS = "/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz"
N = 1000
# A device fast enough, on a fast enough link, that head segments are worth downloading.
FAST = {"schema_version": 1, "name": "fast-board", "flops_per_s": 5e11, "power_compute_w": 2.0,
        "power_tx_w": 1.0, "rtt_s": 0.02}


@pytest.fixture(scope="module")
def server(cnn_only):
    live = LiveServer(cnn_only)
    live.wait_ready()
    yield live
    live.stop()


@pytest.fixture(scope="module")
def runner():
    return ModelRunner(get_model("fmnist-cnn").load(), (1, 28, 28))


def _segment_bytes(url: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    match = re.search(r'^qpart_segment_bytes_total\{model="fmnist-cnn"\} ([0-9.e+]+)$', text, re.M)
    return float(match.group(1)) if match else 0.0


def _infer(server, cache, demand, extra):
    cmd = [sys.executable, "-m", "qpart", "device", "infer", "--idx", IMAGES, "--labels", LABELS,
           "--limit", str(N), "--demand", str(demand), "--server", server.url, "--cache-dir", str(cache),
           "--json", *extra]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=True).stdout
    return json.loads(out)


@pytest.mark.parametrize("demand", [0.001, 0.0025, 0.005, 0.01, 0.02])
def test_device_results_match_offline_evaluation(server, runner, tmp_path, demand):
    profile = tmp_path / "fast.json"
    profile.write_text(json.dumps(FAST))
    extra = ["--device-profile", str(profile), "--rate-mbps", "200"]
    before = _segment_bytes(server.url)
    doc = _infer(server, tmp_path / "cache", demand, extra)
    plan = doc["plan"]
    assert plan["level"] <= demand
    test = load_split(Split.TEST, limit=N)
    offline = runner.run_pattern(test.images, plan["cut"], plan["weight_bits"], plan["activation_bits"])
    offline_pred = offline.argmax(1).numpy()
    device_pred = np.array([int(np.argmax(r["logits"])) for r in doc["results"]])
    assert np.mean(device_pred == offline_pred) >= 0.999
    assert abs(doc["accuracy"] - float(np.mean(offline_pred == test.labels))) <= 0.002
    for phase in ("plan", "download", "head", "upload_and_tail", "total"):
        assert doc["timings_s"][phase] >= 0
    assert {"local", "transfer", "server", "total"} <= set(doc["predicted_s"])
    first_run_bytes = _segment_bytes(server.url) - before
    assert first_run_bytes == doc["downloaded_bytes"]
    second = _infer(server, tmp_path / "cache", demand, extra)
    assert second["plan"]["plan_id"] == plan["plan_id"] or second["plan"]["segment"] is None \
        or second["plan"]["segment"]["held"]
    assert second["downloaded_bytes"] == 0
    assert _segment_bytes(server.url) - before == first_run_bytes  # the server streamed nothing more
