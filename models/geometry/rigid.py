"""Rigid fits between point sets (Kabsch)."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["rigid_fit"]


def rigid_fit(source: Tensor, target: Tensor, weights: Tensor | None = None) -> Tensor:
    """Least-squares rigid transform mapping ``source`` points onto ``target`` (Kabsch).

    Args:
        source: ``[..., P, 3]``.
        target: ``[..., P, 3]``.
        weights: ``[..., P]`` non-negative, or ``None`` for uniform.

    Returns:
        ``[..., 4, 4]`` with ``target ≈ R @ source + t``.
    """
    if weights is None:
        weights = torch.ones_like(source[..., 0])
    w = weights / weights.sum(dim=-1, keepdim=True).clamp_min(1e-12)  # [..., P]
    mu_s = (w[..., None] * source).sum(dim=-2)  # [..., 3]
    mu_t = (w[..., None] * target).sum(dim=-2)
    cov = torch.einsum(
        "...p,...pi,...pj->...ij", w, target - mu_t[..., None, :], source - mu_s[..., None, :]
    )
    u, _, vh = torch.linalg.svd(cov.double())
    d = torch.sign(torch.linalg.det(u @ vh))
    fix = torch.ones_like(u[..., 0])
    fix[..., -1] = d
    rotation = (u * fix[..., None, :]) @ vh
    rotation = rotation.to(source.dtype)
    transform = torch.zeros(*source.shape[:-2], 4, 4, dtype=source.dtype, device=source.device)
    transform[..., :3, :3] = rotation
    transform[..., :3, 3] = mu_t - torch.einsum("...ij,...j->...i", rotation, mu_s)
    transform[..., 3, 3] = 1.0
    return transform
