"""Heads shared by the families."""

from .gaussian_head import MEAN_MODES, GaussianHead, free_mean_activation, raw_gaussian_dim

__all__ = ["GaussianHead", "MEAN_MODES", "free_mean_activation", "raw_gaussian_dim"]
