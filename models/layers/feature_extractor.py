"""A frozen multi-scale CNN feature extractor (timm), used to compare renders with images.

ReSplat measures its rendering error in the feature space of a frozen CNN. Three weight sources,
chosen by the ``weights`` constructor argument:

- ``"seeded"`` (default, offline-safe): the timm architecture with random weights drawn from a
  fixed seed, so every machine builds exactly the same extractor without downloading anything;
- ``"pretrained"``: timm's pretrained weights (ImageNet) from the Hugging Face hub, or from a local
  file given as ``weights_file`` (passed to timm as ``pretrained_cfg_overlay=dict(file=...)``).
  When they cannot be loaded (no network, missing file) the extractor logs a warning and falls back
  to ``"seeded"``; ``loaded_weights`` records what was actually used;
- ``"filterbank"``: no CNN; a fixed bank of Gaussian-derivative filters (smoothing, x/y gradients,
  Laplacian) on each colour channel at several scales -- the cheapest option.

The extractor's weights are buffers/frozen parameters that stay in the owner's ``state_dict``, so a
trained checkpoint always carries the exact extractor it was trained with. It never trains: its
parameters do not require gradients and it stays in eval mode; gradients still flow to its input.
"""

from __future__ import annotations

import logging
import math

import timm
import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["FrozenFeatureExtractor", "WEIGHT_SOURCES"]

logger = logging.getLogger(__name__)

WEIGHT_SOURCES = ("seeded", "pretrained", "filterbank")


def _gaussian_derivative_bank(sigma: float) -> Tensor:
    """Four ``[4, 1, K, K]`` filters at scale ``sigma``: smoothing, d/dx, d/dy, Laplacian."""
    radius = max(1, math.ceil(2.5 * sigma))
    x = torch.arange(-radius, radius + 1, dtype=torch.float64)
    g = torch.exp(-0.5 * (x / sigma) ** 2)
    g = g / g.sum()
    dg = -x / sigma**2 * g
    ddg = (x**2 / sigma**4 - 1 / sigma**2) * g
    ddg = ddg - ddg.sum() * g  # zero response to a constant, as the continuous kernel has
    smooth = g[:, None] * g[None, :]
    dx = g[:, None] * dg[None, :]
    dy = dg[:, None] * g[None, :]
    laplacian = ddg[:, None] * g[None, :] + g[:, None] * ddg[None, :]
    # Scale-normalised derivatives (times sigma, sigma^2) so every scale has similar magnitude.
    bank = torch.stack([smooth, dx * sigma, dy * sigma, laplacian * sigma**2])
    return bank[:, None].float()


class FrozenFeatureExtractor(nn.Module):
    """Frozen multi-scale features of images.

    Args:
        model_name: a timm model with ``features_only`` support (e.g. ``"resnet18"``,
            ``"vgg16"``); ignored by ``"filterbank"``.
        weights: ``"seeded"``, ``"pretrained"`` or ``"filterbank"`` (see the module docstring).
        weights_file: local weights for ``"pretrained"`` (a ``.pth``/``.safetensors`` state dict of
            the full timm model); ``None`` downloads from the hub.
        out_indices: feature levels returned by the timm model.
        seed: seed of the ``"seeded"`` weights.
        filter_scales: Gaussian sigmas (pixels) of the ``"filterbank"`` levels.

    Attributes:
        channels: channels of each returned level.
        reductions: stride of each level relative to the input.
        loaded_weights: the source actually used (``"pretrained"`` may fall back to ``"seeded"``).
    """

    def __init__(
        self,
        model_name: str = "resnet18",
        weights: str = "seeded",
        weights_file: str | None = None,
        out_indices: tuple[int, ...] | list[int] = (0, 1, 2),
        seed: int = 0,
        filter_scales: tuple[float, ...] | list[float] = (1.0, 2.0, 4.0),
    ) -> None:
        super().__init__()
        if weights not in WEIGHT_SOURCES:
            raise ValueError(f"weights must be one of {WEIGHT_SOURCES}, got {weights!r}")
        self.model_name = model_name
        self.loaded_weights = weights
        if weights == "filterbank":
            self.net = None
            for i, sigma in enumerate(filter_scales):
                self.register_buffer(f"bank{i}", _gaussian_derivative_bank(float(sigma)))
            self.filter_scales = tuple(float(s) for s in filter_scales)
            self.channels = [12] * len(self.filter_scales)
            self.reductions = [1] * len(self.filter_scales)
            mean, std = (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)
        else:
            self.net = self._build(model_name, weights, weights_file, tuple(out_indices), seed)
            self.channels = list(self.net.feature_info.channels())
            self.reductions = list(self.net.feature_info.reduction())
            cfg = self.net.pretrained_cfg
            mean, std = cfg.get("mean", (0.5, 0.5, 0.5)), cfg.get("std", (0.5, 0.5, 0.5))
        self.register_buffer("mean", torch.tensor(mean).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(std).view(1, 3, 1, 1), persistent=False)
        self.requires_grad_(False)
        self.eval()

    def _build(
        self,
        model_name: str,
        weights: str,
        weights_file: str | None,
        out_indices: tuple[int, ...],
        seed: int,
    ) -> nn.Module:
        if weights == "pretrained":
            kwargs = {}
            if weights_file is not None:
                kwargs["pretrained_cfg_overlay"] = {"file": str(weights_file)}
            try:
                return timm.create_model(
                    model_name,
                    pretrained=True,
                    features_only=True,
                    out_indices=out_indices,
                    **kwargs,
                )
            except Exception as error:  # no network, no weights on the hub, unreadable file, ...
                source = weights_file or "the Hugging Face hub"
                logger.warning(
                    "FrozenFeatureExtractor: pretrained %s weights could not be loaded from %s "
                    "(%s: %s); falling back to fixed seeded random weights (seed %d)",
                    model_name,
                    source,
                    type(error).__name__,
                    error,
                    seed,
                )
                self.loaded_weights = "seeded"
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return timm.create_model(
                model_name, pretrained=False, features_only=True, out_indices=out_indices
            )

    @property
    def out_channels(self) -> int:
        """Total channels of all levels (after ``forward(..., size=...)`` concatenation)."""
        return sum(self.channels)

    def train(self, mode: bool = True) -> FrozenFeatureExtractor:
        """Always stays in eval mode (batch-norm statistics are frozen)."""
        return super().train(False)

    def levels(self, images: Tensor) -> list[Tensor]:
        """Feature maps of every level.

        Args:
            images: ``[N, 3, H, W]`` in [0, 1].

        Returns:
            A list of ``[N, C_l, H / r_l, W / r_l]``.
        """
        x = (images - self.mean) / self.std
        if self.net is not None:
            return list(self.net(x))
        n, c, h, w = x.shape
        flat = x.reshape(n * c, 1, h, w)
        out = []
        for i in range(len(self.filter_scales)):
            bank = getattr(self, f"bank{i}")
            pad = bank.shape[-1] // 2
            padded = F.pad(flat, (pad, pad, pad, pad), mode="replicate")
            out.append(F.conv2d(padded, bank).reshape(n, c * bank.shape[0], h, w))
        return out

    def forward(self, images: Tensor, size: tuple[int, int]) -> Tensor:
        """Multi-scale features resized to one grid and concatenated.

        Args:
            images: ``[..., 3, H, W]`` in [0, 1] (any leading dimensions).
            size: the output grid ``(h, w)``.

        Returns:
            ``[..., out_channels, h, w]``: each level resized with area averaging when it is
            larger than the grid and bilinear interpolation when it is smaller.
        """
        lead = images.shape[:-3]
        flat = images.reshape(-1, *images.shape[-3:])
        resized = []
        for level in self.levels(flat):
            if level.shape[-2] >= size[0] and level.shape[-1] >= size[1]:
                level = F.adaptive_avg_pool2d(level, size)
            else:
                level = F.interpolate(level, size=size, mode="bilinear", align_corners=False)
            resized.append(level)
        out = torch.cat(resized, dim=1)
        return out.reshape(*lead, *out.shape[-3:])
