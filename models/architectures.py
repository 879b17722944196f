"""Reference architectures: a plain CNN, a small residual network, and a ResNet-18-style network.

Every factory takes no required argument and returns a module in eval-ready form, so that a
registered model can be rebuilt from ``package.module:function`` plus a safetensors file.
"""

from __future__ import annotations

import torch
from torch import nn


def fmnist_cnn() -> nn.Module:
    """Plain CNN for 1x28x28 inputs: 4 conv (3x3, batch norm, ReLU), two max-pools, 2 linear."""

    def conv(cin: int, cout: int) -> list[nn.Module]:
        return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]

    return nn.Sequential(
        *conv(1, 32),
        *conv(32, 32),
        nn.MaxPool2d(2),
        *conv(32, 64),
        *conv(64, 64),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(64 * 7 * 7, 128),
        nn.ReLU(),
        nn.Dropout(0.3),
        nn.Linear(128, 10),
    )


class BasicBlock(nn.Module):
    """ResNet basic block: two 3x3 conv + batch norm, identity or 1x1-conv shortcut."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    """A ResNet of :class:`BasicBlock` stages, global average pooling and a linear classifier."""

    def __init__(
        self,
        in_channels: int,
        widths: tuple[int, ...],
        blocks: tuple[int, ...],
        num_classes: int,
        stem_stride: int = 1,
    ) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, widths[0], 3, stride=stem_stride, padding=1, bias=False),
            nn.BatchNorm2d(widths[0]),
            nn.ReLU(),
        )
        stages: list[nn.Module] = []
        cin = widths[0]
        for i, (width, count) in enumerate(zip(widths, blocks, strict=True)):
            for j in range(count):
                stride = 2 if (i > 0 and j == 0) else 1
                stages.append(BasicBlock(cin, width, stride))
                cin = width
        self.stages = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten()
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.fc(self.flatten(self.pool(self.stages(self.stem(x)))))
        return out


def fmnist_resnet() -> nn.Module:
    """Small residual network for 1x28x28 inputs: widths 16/32/64, two basic blocks per stage."""
    return ResNet(1, widths=(16, 32, 64), blocks=(2, 2, 2), num_classes=10)


def resnet18_style(num_classes: int = 10) -> nn.Module:
    """ResNet-18 layout (widths 64-512, 2 blocks per stage) for 3-channel inputs, no torchvision."""
    return ResNet(3, widths=(64, 128, 256, 512), blocks=(2, 2, 2, 2), num_classes=num_classes,
                  stem_stride=2)
