"""Per-scene refinement: Gaussians (feed-forward output, any ``.ply`` or SfM points) optimised
against posed photos with the project's renderer, 3DGS-style (:func:`refine_gaussians`), and the
command ``python -m models.refine GAUSSIANS.ply PHOTOS output=DIR`` (:mod:`models.refine.cli`)."""

from models.refine.fit import (
    RefineMemoryError,
    RefineResult,
    estimate_memory,
    fit_shape,
    refine_gaussians,
    scene_extent,
)
from models.refine.report import holdout_evaluator, plot_holdout_psnr
from models.refine.settings import (
    DEFAULT_MAX_SIZE,
    ADCSettings,
    MCMCSettings,
    RefineSettings,
    RefineSettingsError,
    settings_from_config,
)
from models.refine.start import gaussians_from_points

__all__ = [
    "ADCSettings",
    "DEFAULT_MAX_SIZE",
    "MCMCSettings",
    "RefineMemoryError",
    "RefineResult",
    "RefineSettings",
    "RefineSettingsError",
    "estimate_memory",
    "fit_shape",
    "gaussians_from_points",
    "holdout_evaluator",
    "plot_holdout_psnr",
    "refine_gaussians",
    "scene_extent",
    "settings_from_config",
]
