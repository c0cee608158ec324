"""Image classifiers as chains of blocks: ResNet-18/50, MobileNetV2, EfficientNet-B0, VGG-16.

Architectures follow the original papers (and torchvision's layouts, so parameter counts
match the published ones at full size: ResNet-18 11,689,512; ResNet-50 25,557,032;
MobileNetV2 3,504,872; EfficientNet-B0 5,288,548; VGG-16 138,357,544). Dropout and
stochastic depth are left out so that a forward pass is a deterministic function of
weights and input. ReLUs are out of place, so autograd saves exactly what the math needs.

Blocks: the stem is one block, each residual unit / inverted-residual block / MBConv
block is one block, the last 1x1 convolution (MobileNetV2, EfficientNet) is one block,
and the pooling + classifier is the ``head`` block. VGG-16 has one block per weight
layer (13 convolutions, each with the max-pool that follows it, and 3 fully connected).

Sizes: ``width`` multiplies every channel count (rounded to a multiple of 8 as in
MobileNet), ``depth`` multiplies the number of units per stage (rounded up, at least 1);
the input resolution is free because the head pools adaptively.
"""

from __future__ import annotations

import math
from functools import partial

import torch
import torch.nn.functional as F
from edgepipe.executor.profiling.models.blocks import BlockSpec
from torch import nn


def make_divisible(value: float, divisor: int = 8) -> int:
    """Round ``value`` to the nearest multiple of ``divisor`` (at least ``divisor``), never
    below 90% of ``value``: the MobileNet channel rule."""
    rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
    if rounded < 0.9 * value:
        rounded += divisor
    return rounded


def scaled_repeats(n: int, depth: float) -> int:
    """Units in a stage of ``n`` units under depth multiplier ``depth``: ceil(n * depth) >= 1."""
    return max(1, math.ceil(n * depth))


class ConvBNAct(nn.Sequential):
    """Convolution without bias, batch norm, then ``act`` (none when ``act`` is None)."""

    def __init__(
        self,
        cin: int,
        cout: int,
        kernel: int,
        stride: int = 1,
        groups: int = 1,
        act: type[nn.Module] | None = nn.ReLU,
    ) -> None:
        layers: list[nn.Module] = [
            nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=False),
            nn.BatchNorm2d(cout),
        ]
        if act is not None:
            layers.append(act())
        super().__init__(*layers)


class PoolLinear(nn.Module):
    """Classifier head: global average pool, flatten, one linear layer."""

    def __init__(self, cin: int, num_classes: int) -> None:
        super().__init__()
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class BasicBlock(nn.Module):
    """ResNet basic unit: two 3x3 convolutions and an identity (or 1x1 projection) shortcut."""

    expansion = 1

    def __init__(self, cin: int, planes: int, stride: int) -> None:
        super().__init__()
        cout = planes * self.expansion
        self.conv1 = nn.Conv2d(cin, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = (
            ConvBNAct(cin, cout, 1, stride, act=None) if stride != 1 or cin != cout else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + identity)


class Bottleneck(nn.Module):
    """ResNet bottleneck unit (v1.5: the stride sits on the 3x3 convolution)."""

    expansion = 4

    def __init__(self, cin: int, planes: int, stride: int) -> None:
        super().__init__()
        cout = planes * self.expansion
        self.conv1 = nn.Conv2d(cin, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.downsample = (
            ConvBNAct(cin, cout, 1, stride, act=None) if stride != 1 or cin != cout else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return F.relu(out + identity)


def _resnet_stem(cout: int) -> nn.Module:
    return nn.Sequential(ConvBNAct(3, cout, 7, 2), nn.MaxPool2d(3, 2, 1))


def resnet(
    units: tuple[int, int, int, int],
    unit: type[BasicBlock] | type[Bottleneck],
    *,
    width: float,
    depth: float,
    num_classes: int,
) -> list[BlockSpec]:
    """ResNet with ``units`` residual units in its four stages (ResNet-18: 2,2,2,2 basic;
    ResNet-50: 3,4,6,3 bottleneck). Blocks: stem, one per unit, head."""
    stem = make_divisible(64 * width)
    specs: list[BlockSpec] = [("stem", partial(_resnet_stem, stem))]
    cin = stem
    for s, (n, base) in enumerate(zip(units, (64, 128, 256, 512), strict=True)):
        planes = make_divisible(base * width)
        for u in range(scaled_repeats(n, depth)):
            stride = 2 if s > 0 and u == 0 else 1
            specs.append((f"layer{s + 1}_{u}", partial(unit, cin, planes, stride)))
            cin = planes * unit.expansion
    specs.append(("head", partial(PoolLinear, cin, num_classes)))
    return specs


class InvertedResidual(nn.Module):
    """MobileNetV2 block: 1x1 expansion (skipped when ``expand`` is 1), 3x3 depthwise,
    linear 1x1 projection; identity shortcut when shapes allow."""

    def __init__(self, cin: int, cout: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = round(cin * expand)
        layers: list[nn.Module] = []
        if expand != 1:
            layers.append(ConvBNAct(cin, hidden, 1, act=nn.ReLU6))
        layers += [
            ConvBNAct(hidden, hidden, 3, stride, groups=hidden, act=nn.ReLU6),
            ConvBNAct(hidden, cout, 1, act=None),
        ]
        self.conv = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv(x)
        return x + out if self.residual else out


#: MobileNetV2 stages: expansion t, output channels c, units n, first stride s
MOBILENETV2_STAGES = (
    (1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
    (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1),
)


def mobilenetv2(*, width: float, depth: float, num_classes: int) -> list[BlockSpec]:
    """MobileNetV2. Blocks: stem, 17 inverted-residual blocks (at depth 1), last_conv, head."""
    cin = make_divisible(32 * width)
    specs: list[BlockSpec] = [("stem", partial(ConvBNAct, 3, cin, 3, 2, act=nn.ReLU6))]
    k = 0
    for t, c, n, s in MOBILENETV2_STAGES:
        cout = make_divisible(c * width)
        for u in range(scaled_repeats(n, depth)):
            specs.append((f"block{k}", partial(InvertedResidual, cin, cout, s if u == 0 else 1, t)))
            cin = cout
            k += 1
    last = make_divisible(1280 * max(1.0, width))
    specs.append(("last_conv", partial(ConvBNAct, cin, last, 1, act=nn.ReLU6)))
    specs.append(("head", partial(PoolLinear, last, num_classes)))
    return specs


class SqueezeExcite(nn.Module):
    """Squeeze-and-excitation: scale channels by sigmoid(fc2(silu(fc1(mean over space))))."""

    def __init__(self, channels: int, squeeze: int) -> None:
        super().__init__()
        self.fc1 = nn.Conv2d(channels, squeeze, 1)
        self.fc2 = nn.Conv2d(squeeze, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = self.fc2(F.silu(self.fc1(F.adaptive_avg_pool2d(x, 1))))
        return x * torch.sigmoid(scale)


class MBConv(nn.Module):
    """EfficientNet block: 1x1 expansion (skipped when ``expand`` is 1), kxk depthwise,
    squeeze-excite (squeeze = input channels / 4), linear 1x1 projection, identity
    shortcut when shapes allow. SiLU activations."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = make_divisible(cin * expand)
        layers: list[nn.Module] = []
        if hidden != cin:
            layers.append(ConvBNAct(cin, hidden, 1, act=nn.SiLU))
        layers += [
            ConvBNAct(hidden, hidden, kernel, stride, groups=hidden, act=nn.SiLU),
            SqueezeExcite(hidden, max(1, cin // 4)),
            ConvBNAct(hidden, cout, 1, act=None),
        ]
        self.block = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.block(x)
        return x + out if self.residual else out


#: EfficientNet-B0 stages: expansion, kernel, first stride, output channels, units
EFFICIENTNET_B0_STAGES = (
    (1, 3, 1, 16, 1), (6, 3, 2, 24, 2), (6, 5, 2, 40, 2), (6, 3, 2, 80, 3),
    (6, 5, 1, 112, 3), (6, 5, 2, 192, 4), (6, 3, 1, 320, 1),
)


def efficientnet_b0(*, width: float, depth: float, num_classes: int) -> list[BlockSpec]:
    """EfficientNet-B0. Blocks: stem, 16 MBConv blocks (at depth 1), last_conv, head."""
    cin = make_divisible(32 * width)
    specs: list[BlockSpec] = [("stem", partial(ConvBNAct, 3, cin, 3, 2, act=nn.SiLU))]
    k = 0
    for t, kernel, s, c, n in EFFICIENTNET_B0_STAGES:
        cout = make_divisible(c * width)
        for u in range(scaled_repeats(n, depth)):
            stride = s if u == 0 else 1
            specs.append((f"block{k}", partial(MBConv, cin, cout, kernel, stride, t)))
            cin = cout
            k += 1
    last = make_divisible(4 * cin)
    specs.append(("last_conv", partial(ConvBNAct, cin, last, 1, act=nn.SiLU)))
    specs.append(("head", partial(PoolLinear, last, num_classes)))
    return specs


class ConvReLU(nn.Module):
    """VGG layer: 3x3 convolution with bias, ReLU, and a 2x2 max-pool when ``pool``."""

    def __init__(self, cin: int, cout: int, pool: bool) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, 1, 1)
        self.pool = pool

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.conv(x))
        return F.max_pool2d(out, 2) if self.pool else out


class VGGClassifierIn(nn.Module):
    """VGG's first fully connected layer: adaptive 7x7 average pool, flatten, linear, ReLU.

    The 7x7 pool keeps the 25088-input layer (and VGG-16's parameter count) at any input
    resolution, as torchvision does."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.fc = nn.Linear(cin * 49, cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 7), 1)))


class LinearReLU(nn.Sequential):
    """A fully connected layer followed by ReLU."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__(nn.Linear(cin, cout), nn.ReLU())


#: VGG-16 stages: output channels, convolutions
VGG16_STAGES = ((64, 2), (128, 2), (256, 3), (512, 3), (512, 3))


def vgg16(*, width: float, depth: float, num_classes: int) -> list[BlockSpec]:
    """VGG-16 (configuration D, no batch norm). Blocks: conv<stage>_<i> per convolution
    (the last of a stage also pools), fc6, fc7, fc8."""
    specs: list[BlockSpec] = []
    cin = 3
    for s, (c, n) in enumerate(VGG16_STAGES):
        cout = make_divisible(c * width)
        reps = scaled_repeats(n, depth)
        for i in range(reps):
            specs.append((f"conv{s + 1}_{i + 1}", partial(ConvReLU, cin, cout, i == reps - 1)))
            cin = cout
    hidden = make_divisible(4096 * width)
    specs += [
        ("fc6", partial(VGGClassifierIn, cin, hidden)),
        ("fc7", partial(LinearReLU, hidden, hidden)),
        ("fc8", partial(nn.Linear, hidden, num_classes)),
    ]
    return specs
