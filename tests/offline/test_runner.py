"""The runner's device: cpu by default; cuda refused in one line where torch sees no GPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from qpart.models.registry import get_model
from qpart.offline.errors import CalibrationConfigError
from qpart.offline.runner import ModelRunner


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_cuda_without_a_gpu_says_what_to_install():
    spec = get_model("fmnist-cnn")
    with pytest.raises(CalibrationConfigError, match=r"sees no CUDA GPU; install a CUDA build of torch"):
        ModelRunner(spec.load(), spec.input_shape, device="cuda")


def test_the_default_device_is_the_cpu_and_outputs_come_back_there():
    spec = get_model("fmnist-cnn")
    runner = ModelRunner(spec.load(), spec.input_shape, batch_size=4)
    images = torch.zeros((5, *spec.input_shape)).numpy()
    logits = runner.run_pattern(images, 3, {runner.tensors[0].name: 4}, 4)
    assert runner.device == torch.device("cpu") and logits.device == torch.device("cpu")
    assert logits.shape == (5, 10)


@pytest.mark.parametrize("model", ["fmnist-cnn", "fmnist-resnet"])
def test_a_pattern_runs_batch_by_batch_with_the_logits_of_head_then_tail(model):
    """run_pattern takes each batch through head, quantizer and tail; the logits are those of every
    activation at the cut first, then the tail, bit for bit, at every cut."""
    spec = get_model(model)
    runner = ModelRunner(spec.load(), spec.input_shape, batch_size=40)
    images = np.random.default_rng(0).standard_normal((100, *spec.input_shape)).astype(np.float32)
    for cut in range(len(runner.cuts)):
        bits = {t.name: 2 + i % 5 for i, t in enumerate(runner.head_tensors(cut))}
        with runner.quantized_weights(bits):
            whole = runner.tail_outputs(runner.head_outputs(images, cut), cut, 3)
        assert torch.equal(runner.run_pattern(images, cut, bits, 3), whole), cut


@pytest.mark.parametrize("model", ["fmnist-cnn", "fmnist-resnet", "fmnist-mobilenet"])
def test_the_batch_size_does_not_change_the_logits(model):
    """Each sample's logits are the same in a batch of 500 as in one of 50, 100 or 250 at one torch
    thread (a batch of 1 takes another path and differs in the last bit). With two threads on a
    Xeon with AMX, MKL's product in the classifier rounds the last bit by batch size (3.8e-6 in
    fmnist-mobilenet's logits, no top-1 changed): docs/data-sources.md says so, and the batch size
    is among the inputs a checkpoint must match."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _same_logits_in_batches_of(model)
    finally:
        torch.set_num_threads(threads)


def _same_logits_in_batches_of(model: str) -> None:
    spec = get_model(model)
    images = np.random.default_rng(1).standard_normal((500, *spec.input_shape)).astype(np.float32)
    runner = ModelRunner(spec.load(), spec.input_shape, batch_size=500)
    cut = len(runner.cuts) // 2
    bits = {t.name: 4 for t in runner.head_tensors(cut)}
    reference = runner.run_pattern(images, cut, bits, 4)
    for batch in (50, 100, 250):
        runner.batch_size = batch
        assert torch.equal(runner.run_pattern(images, cut, bits, 4), reference), batch


@pytest.mark.parametrize("model", ["fmnist-cnn", "fmnist-resnet", "fmnist-mobilenet"])
def test_the_float_model_split_at_any_cut_gives_the_float_logits(model):
    """Why a lossless pattern is not evaluated (offline.state.evaluate): head then tail in float at
    any cut computes the whole float model's logits, bit for bit."""
    spec = get_model(model)
    runner = ModelRunner(spec.load(), spec.input_shape, batch_size=100)
    images = np.random.default_rng(2).standard_normal((200, *spec.input_shape)).astype(np.float32)
    whole = runner.run_pattern(images, len(runner.cuts) - 1, {}, 32)
    for cut in range(len(runner.cuts)):
        assert torch.equal(runner.run_pattern(images, cut, {}, 32), whole), cut
