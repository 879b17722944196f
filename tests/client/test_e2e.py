"""End to end over real HTTP: `qpart device infer` agrees with the offline evaluation of its pattern."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import httpx
import numpy as np
import pytest

from qpart.models.data import Split, load_split
from qpart.models.registry import get_model
from qpart.offline.runner import ModelRunner

pytestmark = [pytest.mark.integration, pytest.mark.slow]
IMAGES = "/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz"
LABELS = "/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz"
N = 1000
# A device fast enough, on a fast enough link, that head segments are worth downloading.
FAST = {"schema_version": 2, "name": "fast-board", "flops_per_s": 5e11, "power_compute_w": 2.0,
        "power_tx_w": 1.0, "rtt_s": 0.02}


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


def _compare(runner, doc, demand):
    plan = doc["plan"]
    assert plan["level"] <= demand
    test = load_split(Split.TEST, limit=N)
    offline = runner.run_pattern(test.images, plan["cut"], plan["weight_bits"], plan["activation_bits"])
    offline_pred = offline.argmax(1).numpy()
    device_pred = np.array([int(np.argmax(r["logits"])) for r in doc["results"]])
    assert np.mean(device_pred == offline_pred) >= 0.999
    labels = get_model("fmnist-cnn").labels  # the CLI names each class as the card does (/v2 metadata)
    assert labels is not None and [p["label"] for p in doc["predictions"]] == device_pred.tolist()
    assert [p["name"] for p in doc["predictions"]] == [labels[i] for i in device_pred]
    assert abs(doc["accuracy"] - float(np.mean(offline_pred == test.labels))) <= 0.002
    for phase in ("plan", "download", "head", "upload_and_tail", "total"):
        assert doc["timings_s"][phase] >= 0
    assert {"local", "transfer", "server", "total"} <= set(doc["predicted_s"])


@pytest.mark.parametrize("demand", [0.001, 0.0025, 0.005, 0.01, 0.02])
def test_head_segment_path_matches_offline_and_a_second_run_downloads_nothing(
        server, runner, tmp_path, demand):
    # A fast device on a very fast link: computing on the device beats waiting for the server,
    # so the plan ships a head segment.
    profile = tmp_path / "fast.json"
    profile.write_text(json.dumps(FAST))
    extra = ["--device-profile", str(profile), "--rate-mbps", "10000"]
    before = _segment_bytes(server.url)
    doc = _infer(server, tmp_path / "cache", demand, extra)
    assert doc["plan"]["segment"] is not None and doc["downloaded_bytes"] > 0
    _compare(runner, doc, demand)
    first_run_bytes = _segment_bytes(server.url) - before
    assert first_run_bytes == doc["downloaded_bytes"] == doc["plan"]["segment"]["size_bytes"]
    second = _infer(server, tmp_path / "cache", demand, extra)
    assert second["plan"]["segment"]["id"] == doc["plan"]["segment"]["id"]
    assert second["plan"]["segment"]["held"] is True
    assert second["downloaded_bytes"] == 0
    assert _segment_bytes(server.url) - before == first_run_bytes  # the server streamed nothing more


@pytest.mark.parametrize("demand", [0.001, 0.01, 0.02])
def test_activation_upload_path_matches_offline(server, runner, tmp_path, demand):
    # A Raspberry-Pi-class device on a 5 Mbit/s link: the server runs (most of) the model and
    # the device uploads a quantized activation.
    doc = _infer(server, tmp_path / "cache", demand, ["--device", "raspberry-pi-4", "--rate-mbps", "5"])
    assert doc["plan"]["infer_url"] is not None and doc["uploaded_bytes"] > 0
    _compare(runner, doc, demand)


@pytest.mark.parametrize(("times", "coding"), [
    pytest.param({"deflate": 1e-6}, "deflate", id="deflate"),
    pytest.param({"deflate": 1e-3, "zstd": 1e-4}, "zstd", id="zstd-faster"),
])
def test_a_profiled_device_on_a_slow_link_uploads_compressed_packets(server, runner, tmp_path, times, coding):
    """A profile with coding times for every cut and bits at 1 Mbit/s: the plan says the coding
    that prices cheapest (deflate when it is the only one; zstd when it takes a tenth of deflate's
    time), the client sends the packets so (fewer bytes than raw), the server decodes them and
    the answers match."""
    from qpart.kernels import packed_size
    from qpart.profiles.devices import get_device

    info = httpx.get(f"{server.url}/v1/models/fmnist-cnn").json()
    profile = get_device("raspberry-pi-4").model_dump(mode="json")
    slow_heads = [0.0] + [1.0] * (info["cuts"] - 1)  # a device that cannot run any head: cut 0
    coded = {k: [dict.fromkeys([*range(1, 9), 32], t)] * info["cuts"] for k, t in times.items()}
    profile["measured"] = {"fmnist-cnn": {"version": info["version"], "head_s": slow_heads, "coding_s": coded,
                                          "warmup": 0, "repeats": 1}}
    path = tmp_path / "pi.json"
    path.write_text(json.dumps(profile))
    doc = _infer(server, tmp_path / "cache", 0.01, ["--device-profile", str(path), "--rate-mbps", "1"])
    plan = doc["plan"]
    assert plan["infer_url"] is not None and plan["upload_encoding"] == coding
    numel, bits = int(np.prod(plan["activation_shape"])), plan["activation_bits"]
    groups = -(-numel // plan["group_size"])
    raw_per_sample = 4 * numel if bits == 32 else packed_size(numel, bits) + 8 * groups
    assert 0 < doc["uploaded_bytes"] < N * raw_per_sample
    _compare(runner, doc, 0.01)
