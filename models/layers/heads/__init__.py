"""Heads shared by the families."""

from models.layers.heads.gaussian_head import (
    MEAN_MODES,
    AnchorOffsetPlacement,
    FreeMeanPlacement,
    GaussianHead,
    MeanPlacement,
    RayDepthPlacement,
    free_mean_activation,
    placement_for_mode,
    raw_gaussian_dim,
)

__all__ = [
    "AnchorOffsetPlacement",
    "FreeMeanPlacement",
    "GaussianHead",
    "MEAN_MODES",
    "MeanPlacement",
    "RayDepthPlacement",
    "free_mean_activation",
    "placement_for_mode",
    "raw_gaussian_dim",
]
