"""The runner's device: cpu by default; cuda refused in one line where torch sees no GPU."""

from __future__ import annotations

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
