"""bench.micro.compute: per-sample compute by batch size, on the trained model the server runs."""

from __future__ import annotations

import torch

from bench.micro.compute import _runner, run


def test_per_sample_times_are_measured_for_each_batch_with_batch_1_as_the_baseline(artifacts_dir):
    doc = run(["fmnist-cnn"], [1, 4], rounds=1, seconds=0.05, artifacts=artifacts_dir)
    rows = doc["models"]["fmnist-cnn"]["batches"]
    assert [r["batch"] for r in rows] == [1, 4]
    assert rows[0]["speedup_over_batch_1"] == 1.0
    flops = doc["models"]["fmnist-cnn"]["flops_per_sample"]
    assert 30e6 < flops < 45e6  # 37.5 MFLOP: four 3x3 convolutions and two linear layers
    for r in rows:
        assert r["calls"] >= 5 and r["seconds_per_sample"] > 0
        assert abs(r["flops_per_s"] * r["seconds_per_sample"] - flops) < 1e-6 * flops


def test_times_are_per_sample_and_the_runner_is_channels_last_like_the_servers(artifacts_dir):
    doc = run(["fmnist-cnn"], [1, 8], rounds=1, seconds=0.2, artifacts=artifacts_dir)
    eight = doc["models"]["fmnist-cnn"]["batches"][1]
    # a batch of 8 costs far less than 8 lone samples per sample; a per-call time would read ~1/8
    assert eight["speedup_over_batch_1"] > 0.5
    tail, _ = _runner("fmnist-cnn", artifacts_dir)
    convs = [p for p in tail.parameters() if p.dim() == 4]
    assert convs and all(p.is_contiguous(memory_format=torch.channels_last) for p in convs)
