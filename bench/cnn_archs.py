"""MobileNetV3-Small/Large and EfficientNet-B0 in plain torch, following torchvision's definitions.

torchvision is not installable here, so the three architectures are written out from
``torchvision.models.mobilenetv3`` and ``torchvision.models.efficientnet`` (same block configurations,
channel rounding, normalisation eps, activations and initialisation; random weights, no downloads):
inverted residual blocks (1x1 expansion, depthwise kxk, squeeze-excitation, 1x1 projection), hardswish /
hardsigmoid in MobileNetV3, SiLU / sigmoid in EfficientNet. Stochastic depth and dropout are identities in
eval mode, which is how the benchmark runs them.

With freshly initialised batch norms (running mean 0, variance 1) the activations of these deep networks
shrink layer after layer until the logits are ~1e-9 and every error looks small; so the constructors
calibrate the batch-norm statistics on random images (:func:`calibrate_batch_norm`), as training would,
which keeps the activations, and the comparison of outputs, at scale 1.

    >>> import torch
    >>> m = mobilenet_v3_small().eval()
    >>> sum(p.numel() for p in m.parameters())  # torchvision's mobilenet_v3_small has 2,542,856
    2542856
    >>> with torch.inference_mode():
    ...     m(torch.zeros(1, 3, 224, 224)).shape
    torch.Size([1, 1000])
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn


def make_divisible(v: float, divisor: int = 8, min_value: int | None = None) -> int:
    """torchvision's ``_make_divisible``: round channels to a multiple of ``divisor``, never down by over 10%.

    >>> make_divisible(72 // 4), make_divisible(240 * 1.0)
    (24, 240)
    """
    min_value = min_value or divisor
    new_v = max(min_value, int(v + divisor / 2) // divisor * divisor)
    if new_v < 0.9 * v:
        new_v += divisor
    return new_v


def init_weights(model: nn.Module, linear: Callable[[torch.Tensor], Any]) -> None:
    """torchvision's initialisation: Kaiming-normal convolutions, unit norms, zero biases; ``linear`` sets each
    Linear weight (the two architectures differ only there)."""
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out")
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.BatchNorm2d | nn.GroupNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Linear):
            linear(m.weight)
            nn.init.zeros_(m.bias)


class ConvNormAct(nn.Sequential):
    """torchvision.ops.Conv2dNormActivation: conv (no bias), batch norm, optional activation.

    >>> ConvNormAct(3, 8, 3, 2, act=nn.ReLU)(torch.zeros(1, 3, 8, 8)).shape
    torch.Size([1, 8, 4, 4])
    """

    def __init__(self, cin: int, cout: int, kernel: int = 3, stride: int = 1, groups: int = 1,
                 norm: Callable[[int], nn.Module] = nn.BatchNorm2d, act: Callable[..., nn.Module] | None = None,
                 dilation: int = 1) -> None:
        layers: list[nn.Module] = [nn.Conv2d(cin, cout, kernel, stride, (kernel - 1) // 2 * dilation,
                                             dilation=dilation, groups=groups, bias=False), norm(cout)]
        if act is not None:
            layers.append(act(inplace=True))
        super().__init__(*layers)


class SqueezeExcitation(nn.Module):
    """torchvision.ops.SqueezeExcitation: x * scale_act(fc2(act(fc1(mean over H, W of x)))).

    >>> SqueezeExcitation(8, 4)(torch.ones(1, 8, 3, 3)).shape
    torch.Size([1, 8, 3, 3])
    """

    def __init__(self, channels: int, squeeze: int, act: Callable[..., nn.Module] = nn.ReLU,
                 scale_act: Callable[..., nn.Module] = nn.Sigmoid) -> None:
        super().__init__()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(channels, squeeze, 1)
        self.fc2 = nn.Conv2d(squeeze, channels, 1)
        self.activation = act()
        self.scale_activation = scale_act()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = self.scale_activation(self.fc2(self.activation(self.fc1(self.avgpool(x)))))
        return scale * x


def calibrate_batch_norm(model: nn.Module, batches: int = 2, batch: int = 4, size: int = 224,
                         seed: int = 0) -> nn.Module:
    """Set every batch norm's running statistics to the average over ``batches`` random batches; eval mode.

    >>> m = calibrate_batch_norm(nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)), size=8)
    >>> bool(m[1].running_var.min() > 0), m.training
    (True, False)
    """
    gen = torch.Generator().manual_seed(seed)
    norms = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    saved = [m.momentum for m in norms]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # a cumulative average over the calibration batches
    model.train()
    with torch.no_grad():
        for _ in range(batches):
            model(torch.randn(batch, 3, size, size, generator=gen))
    for m, momentum in zip(norms, saved, strict=True):
        m.momentum = momentum
    return model.eval()


# ------------------------------------------------------------------------------------------------ MobileNetV3
# (input channels, kernel, expanded channels, output channels, squeeze-excitation, activation, stride)
MOBILENET_V3_LARGE = (
    (16, 3, 16, 16, False, "RE", 1), (16, 3, 64, 24, False, "RE", 2), (24, 3, 72, 24, False, "RE", 1),
    (24, 5, 72, 40, True, "RE", 2), (40, 5, 120, 40, True, "RE", 1), (40, 5, 120, 40, True, "RE", 1),
    (40, 3, 240, 80, False, "HS", 2), (80, 3, 200, 80, False, "HS", 1), (80, 3, 184, 80, False, "HS", 1),
    (80, 3, 184, 80, False, "HS", 1), (80, 3, 480, 112, True, "HS", 1), (112, 3, 672, 112, True, "HS", 1),
    (112, 5, 672, 160, True, "HS", 2), (160, 5, 960, 160, True, "HS", 1), (160, 5, 960, 160, True, "HS", 1),
)
MOBILENET_V3_SMALL = (
    (16, 3, 16, 16, True, "RE", 2), (16, 3, 72, 24, False, "RE", 2), (24, 3, 88, 24, False, "RE", 1),
    (24, 5, 96, 40, True, "HS", 2), (40, 5, 240, 40, True, "HS", 1), (40, 5, 240, 40, True, "HS", 1),
    (40, 5, 120, 48, True, "HS", 1), (48, 5, 144, 48, True, "HS", 1), (48, 5, 288, 96, True, "HS", 2),
    (96, 5, 576, 96, True, "HS", 1), (96, 5, 576, 96, True, "HS", 1),
)


def _mobilenet_norm(c: int) -> nn.Module:
    return nn.BatchNorm2d(c, eps=0.001, momentum=0.01)


class MobileNetV3Block(nn.Module):
    """torchvision's mobilenetv3.InvertedResidual."""

    def __init__(self, cin: int, kernel: int, expanded: int, cout: int, se: bool, act_name: str,
                 stride: int) -> None:
        super().__init__()
        cin, expanded, cout = (make_divisible(c) for c in (cin, expanded, cout))
        self.use_res_connect = stride == 1 and cin == cout
        act = nn.Hardswish if act_name == "HS" else nn.ReLU
        layers: list[nn.Module] = []
        if expanded != cin:
            layers.append(ConvNormAct(cin, expanded, 1, norm=_mobilenet_norm, act=act))
        layers.append(ConvNormAct(expanded, expanded, kernel, stride, groups=expanded, norm=_mobilenet_norm,
                                  act=act))
        if se:
            layers.append(SqueezeExcitation(expanded, make_divisible(expanded // 4), scale_act=nn.Hardsigmoid))
        layers.append(ConvNormAct(expanded, cout, 1, norm=_mobilenet_norm, act=None))
        self.block = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.block(x)
        return out + x if self.use_res_connect else out


class MobileNetV3(nn.Module):
    """torchvision.models.MobileNetV3 (width 1.0, 1000 classes) with its initialisation."""

    def __init__(self, config: tuple[tuple[Any, ...], ...], last_channel: int, num_classes: int = 1000) -> None:
        super().__init__()
        first = make_divisible(config[0][0])
        layers: list[nn.Module] = [ConvNormAct(3, first, 3, 2, norm=_mobilenet_norm, act=nn.Hardswish)]
        layers += [MobileNetV3Block(*cfg) for cfg in config]
        last_in = make_divisible(config[-1][3])
        layers.append(ConvNormAct(last_in, 6 * last_in, 1, norm=_mobilenet_norm, act=nn.Hardswish))
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Linear(6 * last_in, last_channel), nn.Hardswish(inplace=True),
                                        nn.Dropout(p=0.2, inplace=True), nn.Linear(last_channel, num_classes))
        init_weights(self, lambda w: nn.init.normal_(w, 0, 0.01))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


def mobilenet_v3_small() -> MobileNetV3:
    """torchvision.models.mobilenet_v3_small(): 2.5 M parameters, batch norms calibrated."""
    return calibrate_batch_norm(MobileNetV3(MOBILENET_V3_SMALL, 1024))  # type: ignore[return-value]


def mobilenet_v3_large() -> MobileNetV3:
    """torchvision.models.mobilenet_v3_large(): 5.5 M parameters, batch norms calibrated.

    >>> sum(p.numel() for p in mobilenet_v3_large().parameters())  # torchvision: 5,483,032
    5483032
    """
    return calibrate_batch_norm(MobileNetV3(MOBILENET_V3_LARGE, 1280))  # type: ignore[return-value]


# ------------------------------------------------------------------------------------------------ EfficientNet
# (expand ratio, kernel, stride, input channels, output channels, layers) of EfficientNet-B0
EFFICIENTNET_B0 = ((1, 3, 1, 32, 16, 1), (6, 3, 2, 16, 24, 2), (6, 5, 2, 24, 40, 2), (6, 3, 2, 40, 80, 3),
                   (6, 5, 1, 80, 112, 3), (6, 5, 2, 112, 192, 4), (6, 3, 1, 192, 320, 1))


class MBConv(nn.Module):
    """torchvision's efficientnet.MBConv (stochastic depth is the identity in eval mode)."""

    def __init__(self, expand_ratio: int, kernel: int, stride: int, cin: int, cout: int) -> None:
        super().__init__()
        self.use_res_connect = stride == 1 and cin == cout
        expanded = make_divisible(cin * expand_ratio)
        layers: list[nn.Module] = []
        if expanded != cin:
            layers.append(ConvNormAct(cin, expanded, 1, act=nn.SiLU))
        layers.append(ConvNormAct(expanded, expanded, kernel, stride, groups=expanded, act=nn.SiLU))
        layers.append(SqueezeExcitation(expanded, max(1, cin // 4), act=nn.SiLU))
        layers.append(ConvNormAct(expanded, cout, 1, act=None))
        self.block = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.block(x)
        return out + x if self.use_res_connect else out


class EfficientNet(nn.Module):
    """torchvision.models.EfficientNet for B0 (width and depth 1.0, 1000 classes) with its initialisation."""

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        layers: list[nn.Module] = [ConvNormAct(3, EFFICIENTNET_B0[0][3], 3, 2, act=nn.SiLU)]
        for expand, kernel, stride, cin, cout, n in EFFICIENTNET_B0:
            layers.append(nn.Sequential(*(MBConv(expand, kernel, stride if i == 0 else 1, cin if i == 0 else cout,
                                                 cout) for i in range(n))))
        last_in = EFFICIENTNET_B0[-1][4]
        layers.append(ConvNormAct(last_in, 4 * last_in, 1, act=nn.SiLU))
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Dropout(p=0.2, inplace=True), nn.Linear(4 * last_in, num_classes))
        init_weights(self, lambda w: nn.init.uniform_(w, -1.0 / w.shape[0]**0.5, 1.0 / w.shape[0]**0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


def efficientnet_b0() -> EfficientNet:
    """torchvision.models.efficientnet_b0(): 5.3 M parameters, batch norms calibrated.

    >>> sum(p.numel() for p in efficientnet_b0().parameters())  # torchvision: 5,288,548
    5288548
    """
    return calibrate_batch_norm(EfficientNet())  # type: ignore[return-value]
