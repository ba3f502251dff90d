"""What a render returns."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

__all__ = ["RenderOutput"]


@dataclass
class RenderOutput:
    """Rendered views.

    Attributes:
        color: ``[B, V, 3, H, W]`` colour, background included.
        depth: ``[B, V, H, W]`` expected z-depth ``sum_i w_i z_i`` with the compositing weights
            ``w_i``. It is *not* divided by ``alpha`` (divide by ``alpha.clamp_min(eps)`` for a
            normalised depth) and the background adds nothing to it.
        alpha: ``[B, V, H, W]`` accumulated opacity, ``1 - T``.
        radii: ``[B, V, N, 2]`` int32 half-sizes (x, y) in pixels of each Gaussian's bounding box,
            0 for culled Gaussians.
        means2d: ``[B, V, N, 2]`` projected centres in pixels (meaningless where ``radii`` is 0).
    """

    color: Tensor
    depth: Tensor
    alpha: Tensor
    radii: Tensor | None = None
    means2d: Tensor | None = None
