"""The one depth head: per-pixel logits over inverse-depth candidates, softmax, expectation.

MVSplat's parameterisation, used by every family that predicts per-pixel depth: a small
convolutional head gives ``D`` logits per depth (``G`` depths per pixel), the softmax over them
weights candidates evenly spaced in *normalised* inverse depth ``t`` in [0, 1] (0 at ``far``,
1 at ``near``), and ``inverse_depth_to_depth`` maps ``t`` to z-depth with each view's range.
DepthSplat's cost-volume regressors use the same head with their own (per-pixel) candidates
through ``probabilities``. ``DepthRefinement`` is the optional residual correction of ``t``.

The modules are ``nn.Sequential`` subclasses, so their state-dict keys are those of the plain
``Sequential`` they replace (``0.weight``, ``2.weight``, ...); the candidates are a
non-persistent buffer.
"""

from __future__ import annotations

import torch
from einops import rearrange
from torch import Tensor, nn

__all__ = ["ConvHead", "DepthSoftmaxHead", "DepthRefinement", "inverse_depth_to_depth"]

_ACTIVATIONS = {"relu": lambda: nn.ReLU(inplace=True), "gelu": nn.GELU}


class ConvHead(nn.Sequential):
    """``conv kxk -> activation -> conv`` (children ``0``, ``1``, ``2``).

    Args:
        in_dim: input channels.
        out_dim: output channels.
        hidden_dim: channels between the convolutions (``None``: ``in_dim``).
        activation: ``"relu"`` or ``"gelu"``.
        out_kernel: kernel size of the output convolution (the first is 3x3).
        padding_mode: padding of both convolutions (``"zeros"``, ``"replicate"``, ...).
        zero_init: start the output at zero (weights and bias of the last convolution).
    """

    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        *,
        hidden_dim: int | None = None,
        activation: str = "relu",
        out_kernel: int = 1,
        padding_mode: str = "zeros",
        zero_init: bool = False,
    ) -> None:
        if activation not in _ACTIVATIONS:
            raise ValueError(
                f"activation must be one of {sorted(_ACTIVATIONS)}, got {activation!r}"
            )
        hidden = in_dim if hidden_dim is None else hidden_dim
        super().__init__(
            nn.Conv2d(in_dim, hidden, 3, padding=1, padding_mode=padding_mode),
            _ACTIVATIONS[activation](),
            nn.Conv2d(
                hidden, out_dim, out_kernel, padding=out_kernel // 2, padding_mode=padding_mode
            ),
        )
        if zero_init:
            nn.init.zeros_(self[-1].weight)
            nn.init.zeros_(self[-1].bias)


class DepthSoftmaxHead(ConvHead):
    """Softmax over ``num_depth_candidates`` inverse-depth candidates, ``depths`` depths per pixel.

    Args:
        in_dim: feature channels.
        num_depth_candidates: candidates ``D`` (>= 2).
        depths: depths ``G`` per pixel (the logits are ``G`` groups of ``D``).
        hidden_dim, activation, out_kernel, padding_mode: see ``ConvHead``.
    """

    def __init__(
        self,
        in_dim: int,
        num_depth_candidates: int,
        *,
        depths: int = 1,
        hidden_dim: int | None = None,
        activation: str = "relu",
        out_kernel: int = 1,
        padding_mode: str = "zeros",
    ) -> None:
        if num_depth_candidates < 2:
            raise ValueError(f"num_depth_candidates must be >= 2, got {num_depth_candidates}")
        super().__init__(
            in_dim,
            num_depth_candidates * depths,
            hidden_dim=hidden_dim,
            activation=activation,
            out_kernel=out_kernel,
            padding_mode=padding_mode,
        )
        self.num_depth_candidates = num_depth_candidates
        self.depths = depths
        candidates = torch.linspace(0.0, 1.0, num_depth_candidates)  # normalised inverse depth
        self.register_buffer("candidates", candidates, persistent=False)

    def probabilities(self, features: Tensor) -> Tensor:
        """``features [N, C, H, W]`` -> candidate probabilities ``[N, G, D, H, W]``."""
        logits = super().forward(features)
        logits = rearrange(logits, "n (g d) h w -> n g d h w", g=self.depths)
        return logits.softmax(dim=2)

    def forward(self, features: Tensor) -> Tensor:
        """Expected normalised inverse depth ``t [N, G, H, W]`` in [0, 1]."""
        return torch.einsum("ngdhw,d->nghw", self.probabilities(features), self.candidates)


class DepthRefinement(nn.Sequential):
    """Residual correction of the normalised inverse depth in logit space (zero-initialised, so
    it starts as the identity): ``t' = sigmoid(logit(t) + conv([features, t]))``.

    Args:
        feature_dim: feature channels.
        hidden_dim: hidden channels.
        depths: depths ``G`` per pixel.
    """

    def __init__(self, feature_dim: int, hidden_dim: int, depths: int = 1) -> None:
        super().__init__(
            nn.Conv2d(feature_dim + depths, hidden_dim, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.Conv2d(hidden_dim, depths, 3, padding=1),
        )
        nn.init.zeros_(self[-1].weight)
        nn.init.zeros_(self[-1].bias)

    def forward(self, features: Tensor, t: Tensor) -> Tensor:
        """``features [N, C, H, W]``, ``t [N, G, H, W]`` -> refined ``t`` (same shape)."""
        delta = super().forward(torch.cat([features, t], dim=1))
        return torch.sigmoid(torch.logit(t.clamp(1e-4, 1 - 1e-4)) + delta)


def inverse_depth_to_depth(t: Tensor, near: Tensor, far: Tensor) -> Tensor:
    """Z-depth ``[B, V, G, H, W]`` of normalised inverse depth ``t [B*V, G, H, W]`` (0: ``far``,
    1: ``near``) with per-view ``near``, ``far`` ``[B, V]``."""
    b, v = near.shape
    inv_near = rearrange(1.0 / near, "b v -> (b v) 1 1 1")
    inv_far = rearrange(1.0 / far, "b v -> (b v) 1 1 1")
    depth = 1.0 / (inv_far + t * (inv_near - inv_far))
    return rearrange(depth, "(b v) g h w -> b v g h w", b=b, v=v)
