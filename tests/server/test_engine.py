"""The engine's tail runners: same numbers as the split model, the artifact's modules untouched."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from qpart.kernels.onnx_segment import HeadRuntime
from qpart.server.engine import Engine
from qpart.server.errors import UnprocessableError
from qpart.server.metrics import Metrics
from qpart.server.settings import ServerSettings
from qpart.server.store.catalog import Catalog
from qpart.server.store.segments import SegmentStore
from qpart.server.tails.batching import BatchReport
from qpart.server.tails.tail_pool import TailKey


@pytest.fixture(scope="module")
def engine(cnn_only: Path) -> Engine:
    settings = ServerSettings(artifacts=cnn_only)
    store = SegmentStore(settings.segment_cache_bytes)
    return Engine(settings, Catalog.load(cnn_only), store, Metrics(store, "test"))


@pytest.mark.parametrize("cut", [0, 2, 5])
def test_channels_last_runner_matches_the_split_tail(engine, cut):
    model = engine.catalog.get("fmnist-cnn")
    tail = model.parts[cut][1]
    x = np.random.default_rng(cut).random((16, *model.cuts[cut].shape), dtype=np.float32)
    with torch.inference_mode():
        want = tail(torch.from_numpy(x)).numpy()
    got = engine.tails.runner(model, cut)(x).logits
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert engine.tails.runner(model, cut) is engine.tails.runner(model, cut)  # built once per (model, cut)
    # The artifact's modules (whose parameters heads and segments share) keep their layout.
    assert all(p.is_contiguous() for p in tail.parameters())


def test_warm_up_measures_every_tail_on_this_machine(engine):
    model = engine.catalog.get("fmnist-cnn")
    assert engine.tail_seconds(model) == [c.server_tail_s for c in model.artifact.cuts]  # not yet
    engine.warm_up()
    measured = engine.tail_seconds(model)
    assert len(measured) == len(model.cuts) and measured[-1] == 0.0
    assert all(0 < t < 1 for t in measured[:-1])
    # the whole model's tail takes longer than the tail after the last conv
    assert measured[0] > measured[-2]
    assert engine.model_info("fmnist-cnn", None).server_tail_s == measured


def test_lone_requests_reprice_the_tails(engine):
    model = engine.catalog.get("fmnist-cnn")
    engine.warm_up()
    profile = engine.tail_seconds(model)
    key = TailKey(model.name, model.version, 0)
    for _ in range(80):  # an idle server: every lone request takes 0.8 ms more than profiled
        engine.tails._record_batch(BatchReport(key, 1, [0.0], profile[0] + 0.0008, idle_s=0.05))
    repriced = engine.tail_seconds(model)
    assert repriced == pytest.approx([t + 0.0008 if t else 0.0 for t in profile], rel=1e-3)
    assert engine.model_info("fmnist-cnn", None).server_tail_s == repriced
    for _ in range(80):  # a burst: each begins 1 ms after the one before it ended, and runs warm
        engine.tails._record_batch(BatchReport(key, 1, [0.0], profile[0], idle_s=0.001))
    assert engine.tail_seconds(model) == repriced


def _sample_count(metric, model: str) -> float:
    return sum(s.value for family in metric.collect() for s in family.samples
               if s.labels.get("model") == model and s.name.endswith("_total"))


def test_requests_sharing_a_batch_each_get_their_own_rows_and_errors(engine):
    """Requests of 1, 2 and 3 samples and one whose logits overflow, submitted together: one
    batch of 7; each answer holds its own rows (as run alone), only the overflowing one fails."""
    from qpart.client.plans import PacketFormat
    from qpart.client.runtime import encode_for_plan
    from qpart.server.errors import UnprocessableError

    model = engine.catalog.get("fmnist-cnn")
    engine.warm_up()
    pattern = next(p for p in model.patterns.values() if p.cut == 0 and p.activation_bits == 32)
    plan = PacketFormat(activation_bits=32, group_size=pattern.group_size)
    rng = np.random.default_rng(7)
    inputs = [rng.random((n, 1, 28, 28), dtype=np.float32) for n in (1, 2, 3)]
    huge = np.full((1, 1, 28, 28), 3e38, dtype=np.float32)  # finite, but the logits are not
    packets = [encode_for_plan(x, plan) for x in [*inputs, huge]]
    name, version = model.name, model.version
    predicted0 = _sample_count(engine.metrics.server_time_predicted, name)

    async def run():
        together = await asyncio.gather(*(engine.infer_tail(name, version, pattern.pattern_id, p, top_k=3)
                                          for p in packets), return_exceptions=True)
        counted = _sample_count(engine.metrics.server_time_predicted, name) - predicted0
        counted /= engine.tail_seconds(model)[0]  # samples, at the batch-1 price each
        alone = [await engine.infer_tail(name, version, pattern.pattern_id, p, top_k=3) for p in packets[:3]]
        return together, counted, alone

    batches0 = engine.metrics.tail_batch.labels(name)._sum.get()
    (*answers, failed), counted, singles = asyncio.run(run())
    assert isinstance(failed, UnprocessableError)
    # one batch of 7 samples first (then the three lone ones), priced at the batch-1 time each
    assert engine.metrics.tail_batch.labels(name)._sum.get() - batches0 == 7 + 6
    assert counted == pytest.approx(7, rel=1e-9)
    for x, answer, single in zip(inputs, answers, singles, strict=True):
        assert answer.rows.logits.shape == (len(x), 10)
        np.testing.assert_allclose(answer.rows.logits, single.rows.logits, rtol=1e-4, atol=1e-4)
        assert answer.rows.order[:, :1].tolist() == single.rows.order[:, :1].tolist()


def test_warm_up_skips_a_cut_the_torch_runtime_cannot_run_and_the_server_starts(every_cut, tmp_path):
    root = tmp_path / "artifacts"
    shutil.copytree(every_cut, root)
    path = root / "fmnist-cnn" / "artifact.json"
    doc = json.loads(path.read_text())
    doc["cuts"][3]["runtimes_refused"] = {"torch": "tensor 'x' comes back as (1,), not ()"}
    path.write_text(json.dumps(doc))
    settings = ServerSettings(artifacts=root)
    store = SegmentStore(settings.segment_cache_bytes)
    engine = Engine(settings, Catalog.load(root), store, Metrics(store, "test"))
    engine.warm_up()  # raised the refusal before
    model = engine.catalog.get("fmnist-cnn")
    at = {p.cut: p for p in model.artifact.patterns}
    assert engine.segments.for_pattern(model, at[4], HeadRuntime.TORCH) is not None
    with pytest.raises(UnprocessableError, match=r"no torch head at cut 3 \(tensor 'x' comes back"):
        engine.segments.for_pattern(model, at[3], HeadRuntime.TORCH)
