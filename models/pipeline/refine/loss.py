"""The photometric loss of the fit: ``(1 - lambda) L1 + lambda (1 - SSIM)`` (3DGS's).

:func:`ssim` is the SSIM of :func:`models.pipeline.metrics.ssim_per_image` (torchmetrics': 11x11
Gaussian window, sigma 1.5, the images reflect-padded by 5 pixels and the map averaged over the
whole image, constants ``0.01^2`` and ``0.03^2``) with the window applied as two 1D
passes: the same values to float rounding, about 5x fewer operations than the 2D window, and
differentiable without clamping (the fit's renders may leave [0, 1]).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["photometric_loss", "ssim"]

_WINDOW = 11
_SIGMA = 1.5
_C1 = 0.01**2
_C2 = 0.03**2


@functools.cache
def _kernel(dtype: torch.dtype, device: torch.device) -> Tensor:
    x = torch.arange(_WINDOW, dtype=torch.float64) - (_WINDOW - 1) / 2
    g = torch.exp(-(x**2) / (2 * _SIGMA**2))
    return (g / g.sum()).to(dtype=dtype, device=device)


def _blur(x: Tensor) -> Tensor:
    """11-tap Gaussian filter along H then W of ``[N, C, H, W]`` (per channel, reflect-padded)."""
    g = _kernel(x.dtype, x.device)
    pad = (_WINDOW - 1) // 2
    x = F.pad(x, (pad, pad, pad, pad), mode="reflect")
    channels = x.shape[1]
    x = F.conv2d(x, g.reshape(1, 1, -1, 1).expand(channels, 1, -1, 1), groups=channels)
    return F.conv2d(x, g.reshape(1, 1, 1, -1).expand(channels, 1, 1, -1), groups=channels)


def ssim(prediction: Tensor, target: Tensor) -> Tensor:
    """Mean SSIM of each image pair ``[N, 3, H, W]`` → ``[N]`` (images at least 11 pixels)."""
    maps = _blur(
        torch.cat(
            [prediction, target, prediction * prediction, target * target, prediction * target],
            dim=1,
        )
    )
    mu_p, mu_t, pp, tt, pt = maps.split(prediction.shape[1], dim=1)
    var_p = pp - mu_p * mu_p
    var_t = tt - mu_t * mu_t
    cov = pt - mu_p * mu_t
    value = ((2 * mu_p * mu_t + _C1) * (2 * cov + _C2)) / (
        (mu_p * mu_p + mu_t * mu_t + _C1) * (var_p + var_t + _C2)
    )
    return value.flatten(1).mean(1)


def photometric_loss(prediction: Tensor, target: Tensor, ssim_weight: float) -> Tensor:
    """``(1 - w) L1 + w (1 - SSIM)`` averaged over the batch (images ``[N, 3, H, W]``)."""
    loss = (1.0 - ssim_weight) * (prediction - target).abs().mean()
    if ssim_weight > 0 and min(prediction.shape[-2:]) >= _WINDOW:
        loss = loss + ssim_weight * (1.0 - ssim(prediction, target).mean())
    return loss
