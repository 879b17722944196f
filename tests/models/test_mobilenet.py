"""The MobileNetV2-style reference network: torchvision's layout (parameter names and count), the
paper's blocks, a width multiplier, and its cuts under torch.fx (issue 24, edge-class network)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from qpart.models.mobilenet import ConvNormActivation, InvertedResidual, MobileNetV2, fmnist_mobilenet
from qpart.models.partition import cuts_of, prepare
from qpart.models.registry import get_model

TORCHVISION_MOBILENET_V2_PARAMS = 3_504_872
"""``torchvision.models.mobilenet_v2()`` (1000 classes, width 1.0), from torchvision's model table."""


def test_the_layout_is_torchvisions_so_its_weights_would_load():
    model = MobileNetV2(num_classes=1000)
    assert sum(p.numel() for p in model.parameters()) == TORCHVISION_MOBILENET_V2_PARAMS
    keys = list(model.state_dict())
    assert keys[:3] == ["features.0.0.weight", "features.0.1.weight", "features.0.1.bias"]
    assert "features.1.conv.0.0.weight" in keys and "features.1.conv.1.weight" in keys  # t = 1: no expansion
    assert {"features.2.conv.0.0.weight", "features.2.conv.1.0.weight", "features.2.conv.2.weight",
            "features.2.conv.3.weight"} <= set(keys)  # t = 6: expand, depthwise, project, its norm
    assert keys[-4:-2] == ["features.18.1.running_var", "features.18.1.num_batches_tracked"]
    assert keys[-2:] == ["classifier.1.weight", "classifier.1.bias"]
    assert isinstance(model.classifier[0], nn.Dropout) and len(model.features) == 19


def test_blocks_expand_depthwise_and_project_linearly():
    block = InvertedResidual(24, 24, 1, 6)
    expand, depthwise, project, norm = block.conv
    assert isinstance(expand, ConvNormActivation) and isinstance(expand[2], nn.ReLU6)
    assert depthwise[0].groups == depthwise[0].in_channels == 144 and depthwise[0].kernel_size == (3, 3)
    assert isinstance(project, nn.Conv2d) and isinstance(norm, nn.BatchNorm2d)  # no activation: linear
    assert block.use_res_connect
    assert not InvertedResidual(24, 32, 1, 6).use_res_connect
    assert not InvertedResidual(24, 24, 2, 6).use_res_connect
    x = torch.randn(2, 24, 8, 8)
    block.eval()
    with torch.no_grad():
        assert torch.allclose(block(x), x + block.conv(x))


@pytest.mark.parametrize(("width", "params"), [(0.5, 700_490), (1.0, 2_236_682)])
def test_the_width_multiplier_scales_the_channels(width, params):
    model = MobileNetV2(num_classes=10, width_mult=width)
    assert sum(p.numel() for p in model.parameters()) == params
    assert model.features[0][0].out_channels == (16 if width == 0.5 else 32)
    assert model.last_channel == 1280


def test_fmnist_mobilenet_traces_and_cuts_between_blocks():
    gm = prepare(fmnist_mobilenet(), (3, 64, 64))
    cuts = cuts_of(gm)
    assert len(cuts) == 35
    assert cuts[0].shape == (3, 64, 64) and cuts[-1].shape == (10,)
    # every residual sum is a cut, and no cut falls inside a residual block
    assert sum(c.node.startswith("add") for c in cuts) == 10
    assert not any(isinstance(m, nn.BatchNorm2d) for m in gm.modules())  # folded into the convs
    with torch.no_grad():
        x = torch.randn(2, 3, 64, 64)
        model = fmnist_mobilenet().eval()
        assert torch.allclose(prepare(model, (3, 64, 64))(x), model(x), atol=1e-4)


def test_fmnist_mobilenet_is_registered_with_its_camera_style_card():
    spec = get_model("fmnist-mobilenet")
    assert spec.input_shape == (3, 64, 64) and spec.preprocess is not None
    assert spec.preprocess.output_shape == (3, 64, 64) and spec.preprocess.color == "RGB"
    assert len(spec.preprocess.mean) == 3 and spec.labels is not None and len(spec.labels) == 10
    assert spec.card["params"] == sum(p.numel() for p in spec.build().parameters())
