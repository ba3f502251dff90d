"""One-level 2D discrete wavelet transform (Haar, db2) in pure, differentiable PyTorch.

SplatWeaver's high-frequency prior: the detail sub-bands of the luminance say where an image has
edges and texture, i.e. where a pixel needs more than one Gaussian.

Sub-band names (the convention of most image-coding texts; PyWavelets' ``cH, cV, cD``):

- ``LL``: low-pass along x and y (the approximation, ``2 x`` the 2x2 mean for Haar);
- ``LH``: low-pass along x, high-pass along y -> responds to *horizontal* edges (``cH``);
- ``HL``: high-pass along x, low-pass along y -> responds to *vertical* edges (``cV``);
- ``HH``: high-pass along both -> diagonal detail / checkerboards (``cD``).

The filters are orthonormal, so a constant image has exactly zero detail and, with
``mode="periodic"`` on even sizes, the four bands hold the input's energy (Parseval).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "WAVELETS",
    "rgb_to_luminance",
    "dwt2",
    "luminance_dwt",
    "detail_bands",
    "detail_energy",
    "high_frequency_energy",
]

_S = 1.0 / math.sqrt(2.0)
_DB2_LO = (
    0.48296291314469025,
    0.836516303737469,
    0.22414386804185735,
    -0.12940952255092145,
)
# Analysis filters applied by cross-correlation (``conv2d``): low-pass and its quadrature mirror.
WAVELETS: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    "haar": ((_S, _S), (_S, -_S)),
    "db2": (_DB2_LO, (_DB2_LO[3], -_DB2_LO[2], _DB2_LO[1], -_DB2_LO[0])),
}
_MODES = ("symmetric", "periodic")


def rgb_to_luminance(image: Tensor) -> Tensor:
    """ITU-R BT.601 luma of ``image [..., 3, H, W]`` -> ``[..., 1, H, W]``."""
    if image.shape[-3] != 3:
        raise ValueError(f"rgb_to_luminance needs [..., 3, H, W], got {tuple(image.shape)}")
    weights = image.new_tensor([0.299, 0.587, 0.114]).view(3, 1, 1)
    return (image * weights).sum(dim=-3, keepdim=True)


def _filter_bank(wavelet: str, like: Tensor) -> Tensor:
    """``[4, 1, k, k]`` kernels LL, LH, HL, HH (outer products ``f_y ⊗ f_x``)."""
    if wavelet not in WAVELETS:
        raise ValueError(f"wavelet must be one of {sorted(WAVELETS)}, got {wavelet!r}")
    lo, hi = (torch.tensor(f, dtype=like.dtype, device=like.device) for f in WAVELETS[wavelet])
    pairs = ((lo, lo), (hi, lo), (lo, hi), (hi, hi))  # (f_y, f_x) for LL, LH, HL, HH
    return torch.stack([torch.outer(fy, fx) for fy, fx in pairs])[:, None]


def dwt2(
    x: Tensor, wavelet: str = "haar", mode: str = "symmetric"
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """One-level 2D DWT of every channel.

    Args:
        x: ``[..., C, H, W]`` (at least 3 dims).
        wavelet: ``"haar"`` (2 taps) or ``"db2"`` (Daubechies-2, 4 taps).
        mode: border handling. ``"symmetric"``: edge samples are repeated (a constant image
            stays constant, so its detail is exactly zero; odd sizes are padded at the end);
            ``"periodic"``: the image wraps around (orthonormal, needs even ``H`` and ``W``).

    Returns:
        ``(LL, LH, HL, HH)``, each ``[..., C, ceil(H / 2), ceil(W / 2)]``.
    """
    if x.ndim < 3:
        raise ValueError(f"dwt2 needs [..., C, H, W], got {tuple(x.shape)}")
    if mode not in _MODES:
        raise ValueError(f"mode must be one of {_MODES}, got {mode!r}")
    *lead, c, h, w = x.shape
    if mode == "periodic" and (h % 2 or w % 2):
        raise ValueError(f"mode='periodic' needs even H and W, got {h}x{w}")
    kernel = _filter_bank(wavelet, x)  # [4, 1, k, k]
    taps = kernel.shape[-1]
    flat = x.reshape(-1, 1, h, w)  # [N * C, 1, H, W]
    # Pad so that output n covers input samples 2n - (taps/2 - 1) ... 2n + taps/2.
    before = taps // 2 - 1
    after_h = taps // 2 - 1 + h % 2
    after_w = taps // 2 - 1 + w % 2
    if before or after_h or after_w:
        pad_mode = "circular" if mode == "periodic" else "replicate"
        flat = F.pad(flat, (before, after_w, before, after_h), mode=pad_mode)
    bands = F.conv2d(flat, kernel, stride=2)  # [N * C, 4, h', w']
    bands = bands.reshape(*lead, c, 4, *bands.shape[-2:])
    ll, lh, hl, hh = bands.unbind(dim=-3)
    return ll, lh, hl, hh


def luminance_dwt(
    image: Tensor, wavelet: str = "haar", mode: str = "symmetric"
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``dwt2`` of the luminance of ``image [..., 3, H, W]``; bands ``[..., 1, H/2, W/2]``."""
    return dwt2(rgb_to_luminance(image), wavelet, mode)


def detail_bands(image: Tensor, wavelet: str = "haar", mode: str = "symmetric") -> Tensor:
    """The luminance detail sub-bands stacked as channels: ``[..., 3, H/2, W/2]`` (LH, HL, HH)."""
    _, lh, hl, hh = luminance_dwt(image, wavelet, mode)
    return torch.cat([lh, hl, hh], dim=-3)


def detail_energy(detail: Tensor, size: tuple[int, int] | None = None) -> Tensor:
    """``sqrt(LH² + HL² + HH²)`` of stacked detail bands ``[..., 3, h, w]`` -> ``[..., h, w]``.

    Args:
        detail: the output of ``detail_bands``.
        size: ``(H, W)`` of the image the bands came from: repeat each coefficient over its 2x2
            pixels and crop, giving one value per input pixel. ``None``: half resolution.
    """
    # vector_norm's gradient is zero (not NaN) at exactly flat regions.
    energy = torch.linalg.vector_norm(detail, dim=-3)  # [..., h, w]
    if size is not None:
        h, w = size
        energy = energy.repeat_interleave(2, dim=-2).repeat_interleave(2, dim=-1)
        energy = energy[..., :h, :w]
    return energy


def high_frequency_energy(
    image: Tensor,
    wavelet: str = "haar",
    mode: str = "symmetric",
    full_resolution: bool = False,
) -> Tensor:
    """Local high-frequency energy ``sqrt(LH² + HL² + HH²)`` of the luminance.

    Args:
        image: ``[..., 3, H, W]`` in [0, 1].
        wavelet: ``"haar"`` or ``"db2"``.
        mode: see ``dwt2``.
        full_resolution: repeat each coefficient over its 2x2 pixels and crop to ``H x W``
            (one value per input pixel) instead of returning the half-resolution map.

    Returns:
        ``[..., H/2, W/2]`` (or ``[..., H, W]``), zero on constant regions; a one-pixel black and
        white checkerboard gives 1 with Haar (the largest possible value for images in [0, 1]).
    """
    size = tuple(image.shape[-2:]) if full_resolution else None
    return detail_energy(detail_bands(image, wavelet, mode), size)
