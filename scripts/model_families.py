"""The hand-built networks of scripts/export_models.py beyond the first six (issue 20): the
layers users' convolutional, windowed-attention and recommender models are made of, small.

Each builder returns (module, example inputs, input names). Hugging Face families are built from
their configs in export_models.hf.
"""

from __future__ import annotations

import torch
from torch import nn


def bn_stats(m: nn.Module) -> nn.Module:
    """Non-trivial BatchNorm statistics (a fresh module's are 0 and 1)."""
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, nn.BatchNorm2d):
                mod.running_mean.uniform_(-0.5, 0.5)
                mod.running_var.uniform_(0.5, 1.5)
    return m.eval()


class SqueezeExcite(nn.Module):
    """GlobalAveragePool -> 1x1 Conv -> activation -> 1x1 Conv -> gate -> Mul."""

    def __init__(self, c, r, act=nn.SiLU, gate=nn.Sigmoid):
        super().__init__()
        self.fc1, self.act, self.fc2, self.gate = nn.Conv2d(c, r, 1), act(), nn.Conv2d(r, c, 1), gate()

    def forward(self, x):
        return x * self.gate(self.fc2(self.act(self.fc1(x.mean((2, 3), keepdim=True)))))


class InvertedResidual(nn.Module):
    """MobileNetV2/V3 and EfficientNet's block: 1x1 expansion, depthwise k x k, optional SE,
    1x1 projection, a residual where the shapes allow."""

    def __init__(self, cin, cout, expand, k, stride, act=nn.SiLU, gate=nn.Sigmoid, se=True):
        super().__init__()
        mid = cin * expand
        layers = [nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid), act()] if expand != 1 else []
        layers += [nn.Conv2d(mid, mid, k, stride, k // 2, groups=mid, bias=False), nn.BatchNorm2d(mid), act()]
        if se:
            layers.append(SqueezeExcite(mid, max(4, cin // 4), nn.ReLU if act is nn.Hardswish else act, gate))
        layers += [nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout)]
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        y = self.body(x)
        return x + y if self.residual else y


def _head(cin, cmid, classes, act):
    return nn.Sequential(nn.Conv2d(cin, cmid, 1, bias=False), nn.BatchNorm2d(cmid), act(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(cmid, classes))  # fmt: skip


def efficientnet():
    """SiLU, depthwise 3x3 and 5x5, squeeze-excitation with sigmoid gates."""
    m = nn.Sequential(
        nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.SiLU(),
        InvertedResidual(16, 16, 1, 3, 1), InvertedResidual(16, 24, 4, 3, 2), InvertedResidual(24, 24, 4, 5, 1),
        _head(24, 48, 10, nn.SiLU),
    )  # fmt: skip
    return bn_stats(m), (torch.randn(1, 3, 16, 16),), ["x"]


def mobilenetv3():
    """Hardswish, ReLU, hard-sigmoid SE gates, depthwise 3x3 and 5x5, strided blocks."""
    hs, hsig = nn.Hardswish, nn.Hardsigmoid
    m = nn.Sequential(
        nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), hs(),
        InvertedResidual(16, 16, 1, 3, 2, nn.ReLU, hsig), InvertedResidual(16, 24, 4, 3, 1, nn.ReLU, hsig, se=False),
        InvertedResidual(24, 24, 3, 3, 1, nn.ReLU, hsig, se=False), InvertedResidual(24, 32, 4, 5, 2, hs, hsig),
        _head(32, 64, 10, hs),
    )  # fmt: skip
    return bn_stats(m), (torch.randn(2, 3, 16, 16),), ["x"]


class ConvNeXtBlock(nn.Module):
    """Depthwise 7x7, LayerNorm over channels (channels last), 4x MLP with GELU, layer scale."""

    def __init__(self, c=16):
        super().__init__()
        self.dw = nn.Conv2d(c, c, 7, padding=3, groups=c)
        self.norm = nn.LayerNorm(c, eps=1e-6)
        self.fc1, self.fc2 = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)
        self.gamma = nn.Parameter(torch.rand(c) + 0.5)

    def forward(self, x):
        y = self.dw(x).permute(0, 2, 3, 1)
        y = self.gamma * self.fc2(nn.functional.gelu(self.fc1(self.norm(y))))
        return x + y.permute(0, 3, 1, 2)


def convnext():
    return ConvNeXtBlock(), (torch.randn(1, 16, 8, 8),), ["x"]


class SwinBlock(nn.Module):
    """Shifted-window attention: roll, window partition, attention per window with a learned
    relative-position bias and the shift mask, window reverse, roll back, then an MLP."""

    def __init__(self, c=16, heads=2, window=4, shift=2, hw=8):
        super().__init__()
        self.c, self.h, self.w, self.s, self.hw = c, heads, window, shift, hw
        self.norm1, self.norm2 = nn.LayerNorm(c), nn.LayerNorm(c)
        self.qkv, self.proj = nn.Linear(c, 3 * c), nn.Linear(c, c)
        self.mlp = nn.Sequential(nn.Linear(c, 2 * c), nn.GELU(), nn.Linear(2 * c, c))
        n = window * window
        self.bias = nn.Parameter(torch.randn(heads, n, n) * 0.1)
        img = torch.zeros(hw, hw)
        cuts = (slice(0, -window), slice(-window, -shift), slice(-shift, None))
        for k, (a, b) in enumerate((a, b) for a in cuts for b in cuts):
            img[a, b] = k
        win = img.view(hw // window, window, hw // window, window).permute(0, 2, 1, 3).reshape(-1, n)
        self.register_buffer("mask", (win[:, None, :] != win[:, :, None]).float() * -100.0)

    def forward(self, x):  # x: (B, H*W, C)
        b, L, c = x.shape
        hw, w, s, h = self.hw, self.w, self.s, self.h
        y = torch.roll(self.norm1(x).view(b, hw, hw, c), (-s, -s), (1, 2))
        y = y.view(b, hw // w, w, hw // w, w, c).permute(0, 1, 3, 2, 4, 5).reshape(-1, w * w, c)
        q, k, v = self.qkv(y).view(y.shape[0], w * w, 3, h, c // h).permute(2, 0, 3, 1, 4)
        a = (q @ k.transpose(-2, -1)) * (c // h) ** -0.5 + self.bias
        nw = (hw // w) ** 2
        a = a.view(b, nw, h, w * w, w * w) + self.mask[None, :, None]
        y = (a.view(-1, h, w * w, w * w).softmax(-1) @ v).transpose(1, 2).reshape(-1, w * w, c)
        y = self.proj(y).view(b, hw // w, hw // w, w, w, c).permute(0, 1, 3, 2, 4, 5).reshape(b, hw, hw, c)
        x = x + torch.roll(y, (s, s), (1, 2)).reshape(b, L, c)
        return x + self.mlp(self.norm2(x))


def swin():
    return SwinBlock(), (torch.randn(1, 64, 16),), ["x"]


def vgg():
    """Conv 3x3 + ReLU pairs, max pooling, a classifier."""
    c = [3, 8, 8, 16, 16]
    layers = []
    for k in range(4):
        layers += [nn.Conv2d(c[k], c[k + 1], 3, padding=1), nn.ReLU()]
        if k % 2:
            layers.append(nn.MaxPool2d(2))
    m = nn.Sequential(*layers, nn.Flatten(), nn.Linear(16 * 4 * 4, 32), nn.ReLU(), nn.Linear(32, 10))
    return m, (torch.randn(2, 3, 16, 16),), ["x"]


class WideDeep(nn.Module):
    """A wide linear part over dense features plus a deep MLP over summed and averaged embedding
    bags of categorical ids (fixed-length bags), a sigmoid score."""

    def __init__(self, dense=8, vocab=128, dim=8):
        super().__init__()
        self.wide = nn.Linear(dense, 1)
        self.bags = nn.ModuleList([nn.EmbeddingBag(vocab, dim, mode="sum"), nn.EmbeddingBag(vocab, dim, mode="mean")])
        self.deep = nn.Sequential(nn.Linear(2 * dim + dense, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, dense, ids):
        e = torch.cat([bag(ids[:, k]) for k, bag in enumerate(self.bags)] + [dense], dim=1)
        return torch.sigmoid(self.wide(dense) + self.deep(e))


def wide_deep():
    return WideDeep(), (torch.randn(4, 8), torch.randint(0, 128, (4, 2, 3))), ["dense", "ids"]


FAMILIES = {
    "efficientnet": efficientnet, "mobilenetv3": mobilenetv3, "convnext": convnext, "swin": swin, "vgg": vgg,
    "widedeep": wide_deep,
}  # fmt: skip
