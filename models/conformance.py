"""The conformance set: small definitions of the architecture families users bring, written as
people write them (``chunk``, ``x.shape`` unpacking, ``permute``, ``unbind``, a BatchNorm after an
add), so that every legal cut of each can be checked on every device runtime.

Each factory takes no argument and returns a module for ``[N, 3, 32, 32]`` inputs and 10 logits;
random weights are enough for the equivalence checks they serve. No torchvision: its wheels here
fail beside the CPU torch, and these nets must stay small enough to test on two cores.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from qpart.models.mobilenet import MobileNetV2

INPUT_SHAPE = (3, 32, 32)
NUM_CLASSES = 10


def _conv_bn(cin: int, cout: int, k: int = 3, stride: int = 1, groups: int = 1,
             act: type[nn.Module] | None = nn.ReLU) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False),
                               nn.BatchNorm2d(cout)]
    if act is not None:
        layers.append(act())
    return nn.Sequential(*layers)


class SqueezeExcite(nn.Module):
    """Squeeze-excitation: pooled channels → 1×1 convs → a gate that multiplies the activations."""

    def __init__(self, channels: int, squeezed: int, gate: type[nn.Module], act: type[nn.Module]) -> None:
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.reduce = nn.Conv2d(channels, squeezed, 1)
        self.act = act()
        self.expand = nn.Conv2d(squeezed, channels, 1)
        self.gate = gate()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = x * self.gate(self.expand(self.act(self.reduce(self.pool(x)))))
        return out


class MBConv(nn.Module):
    """An inverted residual with squeeze-excitation (MobileNetV3's and EfficientNet's block)."""

    def __init__(self, cin: int, cout: int, expand: int, k: int, stride: int, act: type[nn.Module],
                 gate: type[nn.Module]) -> None:
        super().__init__()
        mid = cin * expand
        self.expand = _conv_bn(cin, mid, 1, act=act) if expand != 1 else nn.Identity()
        self.depthwise = _conv_bn(mid, mid, k, stride, groups=mid, act=act)
        self.se = SqueezeExcite(mid, max(4, cin // 4), gate, act)
        self.project = _conv_bn(mid, cout, 1, act=None)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.project(self.se(self.depthwise(self.expand(x))))
        return x + out if self.residual else out


class _Stack(nn.Module):
    """stem → blocks → 1×1 head conv → pool → dropout → linear."""

    def __init__(self, stem: nn.Module, blocks: list[nn.Module], cin: int, width: int,
                 act: type[nn.Module]) -> None:
        super().__init__()
        self.stem, self.blocks = stem, nn.Sequential(*blocks)
        self.head = _conv_bn(cin, width, 1, act=act)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.dropout = nn.Dropout(0.2)
        self.fc = nn.Linear(width, NUM_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.head(self.blocks(self.stem(x))))
        out: torch.Tensor = self.fc(self.dropout(torch.flatten(x, 1)))
        return out


def mobilenet_v2() -> nn.Module:
    """MobileNetV2 (ReLU6, inverted residuals) at width 0.25."""
    return MobileNetV2(num_classes=NUM_CLASSES, width_mult=0.25)


def mobilenet_v3() -> nn.Module:
    """A MobileNetV3-small-like net: Hardswish, squeeze-excitation gated by Hardsigmoid."""
    blocks: list[nn.Module] = [MBConv(8, 8, 1, 3, 2, nn.ReLU, nn.Hardsigmoid),
                               MBConv(8, 16, 4, 3, 2, nn.ReLU, nn.Hardsigmoid),
                               MBConv(16, 16, 3, 5, 1, nn.Hardswish, nn.Hardsigmoid),
                               MBConv(16, 24, 3, 5, 2, nn.Hardswish, nn.Hardsigmoid)]
    return _Stack(_conv_bn(3, 8, 3, 2, act=nn.Hardswish), blocks, 24, 64, nn.Hardswish)


def efficientnet_b0() -> nn.Module:
    """An EfficientNet-B0-like net: SiLU, MBConv with sigmoid-gated squeeze-excitation."""
    blocks: list[nn.Module] = [MBConv(8, 8, 1, 3, 1, nn.SiLU, nn.Sigmoid),
                               MBConv(8, 12, 6, 3, 2, nn.SiLU, nn.Sigmoid),
                               MBConv(12, 12, 6, 3, 1, nn.SiLU, nn.Sigmoid),
                               MBConv(12, 20, 6, 5, 2, nn.SiLU, nn.Sigmoid)]
    return _Stack(_conv_bn(3, 8, 3, 2, act=nn.SiLU), blocks, 20, 64, nn.SiLU)


class PreActBlock(nn.Module):
    """Pre-activation residual block: BN → ReLU → conv, twice; the next block's BN takes the sum."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.bn1, self.conv1 = nn.BatchNorm2d(cin), nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn2, self.conv2 = nn.BatchNorm2d(cout), nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.shortcut: nn.Module = nn.Identity() if stride == 1 and cin == cout else \
            nn.Conv2d(cin, cout, 1, stride, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = torch.relu(self.bn1(x))
        shortcut = self.shortcut(out) if not isinstance(self.shortcut, nn.Identity) else x
        out = self.conv2(torch.relu(self.bn2(self.conv1(out))))
        return out + shortcut


class PreActResNet(nn.Module):
    """A pre-activation ResNet (He et al. 2016): a BatchNorm after every residual add."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, 1, 1, bias=False)
        self.layers = nn.Sequential(PreActBlock(16, 16, 1), PreActBlock(16, 32, 2), PreActBlock(32, 32, 1),
                                    PreActBlock(32, 64, 2))
        self.bn = nn.BatchNorm2d(64)
        self.fc = nn.Linear(64, NUM_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn(self.layers(self.stem(x))))
        out: torch.Tensor = self.fc(nn.functional.adaptive_avg_pool2d(x, 1).flatten(1))
        return out


def preact_resnet() -> nn.Module:
    """A small pre-activation ResNet (BatchNorm after a residual add)."""
    return PreActResNet()


class ConvNeXtBlock(nn.Module):
    """Depthwise 7×7 → LayerNorm (channels last, through ``permute``) → MLP with GELU → layer
    scale → residual."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1, self.act, self.pwconv2 = nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(1e-1 * torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.dwconv(x).permute(0, 2, 3, 1)
        y = self.gamma * self.pwconv2(self.act(self.pwconv1(self.norm(y))))
        out: torch.Tensor = x + y.permute(0, 3, 1, 2)
        return out


class LayerNorm2d(nn.LayerNorm):
    """LayerNorm over the channels of an ``[N, C, H, W]`` tensor."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        return out


def convnext() -> nn.Module:
    """A ConvNeXt-like net: patchify stem, blocks, LayerNorm + 2×2 stride-2 downsampling."""
    return nn.Sequential(
        nn.Conv2d(3, 16, 4, 4), LayerNorm2d(16, eps=1e-6), ConvNeXtBlock(16),
        LayerNorm2d(16, eps=1e-6), nn.Conv2d(16, 32, 2, 2), ConvNeXtBlock(32),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.LayerNorm(32, eps=1e-6), nn.Linear(32, NUM_CLASSES))


def channel_shuffle(x: torch.Tensor, groups: int) -> torch.Tensor:
    """ShuffleNet's channel shuffle, written as torchvision writes it."""
    batch, channels, height, width = x.size()
    x = x.view(batch, groups, channels // groups, height, width)
    return torch.transpose(x, 1, 2).contiguous().view(batch, -1, height, width)


class ShuffleBlock(nn.Module):
    """ShuffleNetV2 unit: ``chunk`` into two halves (stride 1) or two branches (stride 2), ``cat``,
    channel shuffle."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.stride, half = stride, cout // 2
        self.branch1 = nn.Sequential(_conv_bn(cin, cin, 3, stride, groups=cin, act=None),
                                     _conv_bn(cin, half, 1)) if stride > 1 else nn.Identity()
        cin2 = cin if stride > 1 else half
        self.branch2 = nn.Sequential(_conv_bn(cin2, half, 1),
                                     _conv_bn(half, half, 3, stride, groups=half, act=None),
                                     _conv_bn(half, half, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stride == 1:
            x1, x2 = x.chunk(2, dim=1)
            out = torch.cat((x1, self.branch2(x2)), dim=1)
        else:
            out = torch.cat((self.branch1(x), self.branch2(x)), dim=1)
        return channel_shuffle(out, 2)


def shufflenet_v2() -> nn.Module:
    """A ShuffleNetV2-like net (channel split by ``chunk``, shuffle by ``view``/``transpose``)."""
    return nn.Sequential(_conv_bn(3, 16, 3, 2), ShuffleBlock(16, 32, 2), ShuffleBlock(32, 32, 1),
                         ShuffleBlock(32, 64, 2), ShuffleBlock(64, 64, 1), _conv_bn(64, 64, 1),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, NUM_CLASSES))


class DenseLayer(nn.Module):
    """BN → ReLU → 1×1 → BN → ReLU → 3×3, its output concatenated to its input."""

    def __init__(self, cin: int, growth: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.BatchNorm2d(cin), nn.ReLU(), nn.Conv2d(cin, 2 * growth, 1, bias=False),
                                  nn.BatchNorm2d(2 * growth), nn.ReLU(),
                                  nn.Conv2d(2 * growth, growth, 3, padding=1, bias=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = torch.cat([x, self.body(x)], 1)
        return out


def densenet() -> nn.Module:
    """A DenseNet-like net: dense blocks joined by ``cat``, BN-ReLU-conv-avgpool transitions."""
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, 1, 1, bias=False), DenseLayer(16, 8), DenseLayer(24, 8),
        nn.BatchNorm2d(32), nn.ReLU(), nn.Conv2d(32, 16, 1, bias=False), nn.AvgPool2d(2),
        DenseLayer(16, 8), DenseLayer(24, 8), nn.BatchNorm2d(32), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        nn.Flatten(), nn.Linear(32, NUM_CLASSES))


class Attention(nn.Module):
    """Multi-head self-attention written timm's way (``b, n, c = x.shape``, ``unbind``)."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads, self.scale = heads, (dim // heads) ** -0.5
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        attn = ((q @ k.transpose(-2, -1)) * self.scale).softmax(dim=-1)
        out: torch.Tensor = self.proj((attn @ v).transpose(1, 2).reshape(b, n, c))
        return out


class ViTBlock(nn.Module):
    """Pre-norm transformer block: attention and a GELU MLP, each in a residual."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(dim), Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        out: torch.Tensor = x + self.mlp(self.norm2(x))
        return out


class TinyViT(nn.Module):
    """A tiny vision transformer: 8×8 patches, a class token, position embeddings, two blocks."""

    def __init__(self, dim: int = 32, heads: int = 2, depth: int = 2) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, dim, 8, 8)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(0.02 * torch.randn(1, 17, dim))
        self.blocks = nn.Sequential(*[ViTBlock(dim, heads) for _ in range(depth)])
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, NUM_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1) + self.pos
        x = self.norm(self.blocks(x))
        out: torch.Tensor = self.head(x[:, 0])
        return out


def vit() -> nn.Module:
    """A tiny ViT (patch embedding, class token, attention, GELU, LayerNorm)."""
    return TinyViT()


FAMILIES: dict[str, Callable[[], nn.Module]] = {
    "mobilenet-v2": mobilenet_v2, "mobilenet-v3": mobilenet_v3, "efficientnet-b0": efficientnet_b0,
    "preact-resnet": preact_resnet, "convnext": convnext, "shufflenet-v2": shufflenet_v2,
    "densenet": densenet, "vit": vit,
}
"""The conformance set by name: each ``qpart.models.conformance:<factory>``."""
