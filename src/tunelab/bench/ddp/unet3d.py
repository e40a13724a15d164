"""The 3-D U-Net of MLPerf Training's image segmentation benchmark (KiTS19), for emulated and
real compute: what its gradients weigh and what its input pipeline feeds.

Architecture as the MLPerf reference describes it: filters 32, 64, 128, 256, 320; an input
block of two 3x3x3 convolutions; four down-sampling blocks (a stride-2 convolution, then a
convolution) and a stride-2 bottleneck at 320 filters; five up-sampling blocks (a 2x2x2
transposed convolution with bias, concatenation with the skip connection, two
convolutions); a 1x1x1 output convolution to 3 classes. Convolutions without bias are
followed by instance normalisation (affine) and LeakyReLU(0.01). Input: one channel,
patches of 128^3 voxels in training.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["FILTERS", "UNet3D"]

FILTERS = (32, 64, 128, 256, 320)


def _conv(cin: int, cout: int, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Conv3d(cin, cout, 3, stride=stride, padding=1, bias=False),
                         nn.InstanceNorm3d(cout, affine=True), nn.LeakyReLU(0.01))


class _Down(nn.Sequential):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__(_conv(cin, cout, stride=2), _conv(cout, cout))


class _Up(nn.Module):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.up = nn.ConvTranspose3d(cin, cout, 2, stride=2)
        self.convs = nn.Sequential(_conv(2 * cout, cout), _conv(cout, cout))

    def forward(self, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        return self.convs(torch.cat((self.up(x), skip), dim=1))


class UNet3D(nn.Module):
    """3-D U-Net: (N, 1, D, H, W) -> (N, 3, D, H, W) logits; D, H, W multiples of 32."""

    def __init__(self, in_channels: int = 1, classes: int = 3) -> None:
        super().__init__()
        f = FILTERS
        self.inp = nn.Sequential(_conv(in_channels, f[0]), _conv(f[0], f[0]))
        self.down = nn.ModuleList(_Down(a, b) for a, b in zip(f[:-1], f[1:], strict=True))
        self.bottleneck = _Down(f[-1], f[-1])
        ups = [_Up(f[-1], f[-1])] + [_Up(b, a) for a, b in zip(f[-2::-1], f[:0:-1],
                                                                  strict=True)]
        self.up = nn.ModuleList(ups)
        self.out = nn.Conv3d(f[0], classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits per voxel and class."""
        x = self.inp(x)
        skips = [x]
        for block in self.down:
            x = block(x)
            skips.append(x)
        x = self.bottleneck(x)
        for block, skip in zip(self.up, reversed(skips), strict=True):
            x = block(x, skip)
        return self.out(x)
