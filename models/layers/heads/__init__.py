"""Heads shared by the families."""

from models.layers.heads.gaussian_head import (
    AnchorOffsetPlacement,
    FreeMeanPlacement,
    GaussianHead,
    MeanPlacement,
    RayDepthPlacement,
    free_mean_activation,
    raw_gaussian_dim,
)

__all__ = [
    "AnchorOffsetPlacement",
    "FreeMeanPlacement",
    "GaussianHead",
    "MeanPlacement",
    "RayDepthPlacement",
    "free_mean_activation",
    "raw_gaussian_dim",
]
