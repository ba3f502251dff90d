"""Where a refinement starts when no feed-forward Gaussians are given: structure-from-motion points,
initialised as 3DGS does (Kerbl et al. 2023)."""

from __future__ import annotations

import torch
from torch import Tensor

from models.gaussians import Gaussians, rgb_to_sh

__all__ = ["gaussians_from_points"]


def gaussians_from_points(
    xyz: Tensor, rgb: Tensor, sh_degree: int = 3, opacity: float = 0.1, scale_factor: float = 1.0
) -> Gaussians:
    """3DGS's initialisation: one isotropic Gaussian per point.

    Args:
        xyz: ``[N, 3]`` positions (``N >= 2``).
        rgb: ``[N, 3]`` colours in [0, 1] (uint8 is divided by 255).
        sh_degree: SH degree of the result (higher bands zero).
        opacity: every Gaussian's opacity.
        scale_factor: multiplies the scale.

    Returns:
        A batch of one scene: scale = the root mean square distance to the 3 nearest other
        points (``models.layers.knn``), rotation identity, DC colour = ``rgb``.
    """
    from models.layers.knn import knn

    xyz = torch.as_tensor(xyz).float()
    rgb = torch.as_tensor(rgb)
    rgb = rgb.float() / 255.0 if rgb.dtype == torch.uint8 else rgb.float()
    if xyz.ndim != 2 or xyz.shape[-1] != 3 or xyz.shape[0] < 2 or rgb.shape != xyz.shape:
        raise ValueError(
            f"points need xyz and rgb [N, 3] with N >= 2, got {tuple(xyz.shape)}, {tuple(rgb.shape)}"
        )
    k = min(4, xyz.shape[0])
    index = knn(xyz, k)[:, 1:]  # [N, k-1] (the point itself first)
    distance = (xyz[index] - xyz[:, None]).square().sum(-1).mean(-1).sqrt()  # [N]
    positive = distance[distance > 0]
    floor = float(positive.min()) if positive.numel() else 1e-3
    scale = distance.clamp_min(floor) * scale_factor
    count = xyz.shape[0]
    harmonics = torch.zeros(count, 3, (sh_degree + 1) ** 2)
    harmonics[:, :, 0] = rgb_to_sh(rgb.clamp(0, 1))
    rotations = torch.zeros(count, 4)
    rotations[:, 0] = 1.0
    return Gaussians(
        means=xyz[None],
        scales=scale[:, None].expand(count, 3).contiguous()[None],
        rotations=rotations[None],
        opacities=torch.full((1, count), float(opacity)),
        harmonics=harmonics[None],
    )
