"""The direct noise tables, measured a chunk of samples at a time when every cut's activations
for all of them would not fit the budget."""

from __future__ import annotations

import numpy as np
import pytest

from qpart.models.registry import get_model
from qpart.offline.noise import ACTIVATIONS_BUDGET, BITS, direct_tables
from qpart.offline.runner import ModelRunner
from qpart.offline.settings import CalibrationSettings


@pytest.fixture(scope="module")
def runner_and_images():
    spec = get_model("fmnist-cnn")
    runner = ModelRunner(spec.load(), spec.input_shape, batch_size=50)
    images = np.random.default_rng(3).random((120, *spec.input_shape), dtype=np.float32)
    return runner, images


def test_chunks_give_the_tables_of_one_pass(runner_and_images):
    runner, images = runner_and_images
    steps = (len(runner.tensors) + len(runner.cuts) - 1) * len(BITS)
    seen: list[int] = []
    whole = direct_tables(runner, images)
    per_sample = 4 * sum(c.numel for c in runner.cuts[:-1])
    chunked = direct_tables(runner, images, seen.append, budget=per_sample * 50)  # chunks of 50, 50, 20
    for ours, theirs in zip(chunked, whole, strict=True):
        assert ours.keys() == theirs.keys()
        for name in ours:
            assert ours[name] == pytest.approx(theirs[name], rel=1e-5, abs=1e-9), name
    assert seen == sorted(seen) and seen[-1] == steps and len(seen) == 3 * steps


def test_the_reference_models_fit_one_chunk_at_the_default_settings():
    """So their tables are what one pass gives, bit for bit (as before chunks existed)."""
    for model in ("fmnist-cnn", "fmnist-resnet"):
        spec = get_model(model)
        runner = ModelRunner(spec.load(), spec.input_shape)
        per_sample = 4 * sum(c.numel for c in runner.cuts[:-1])
        assert per_sample * CalibrationSettings().noise_samples <= ACTIVATIONS_BUDGET, model
