"""Per-scene refinement: Gaussians (feed-forward output, any ``.ply`` or SfM points) optimised
against posed photos with the project's renderer, 3DGS-style (:func:`refine_gaussians`), with
gsplat-style densification strategies (:mod:`models.pipeline.refine.strategy`, surgery in
:mod:`models.pipeline.refine.ops`), a cost planned before the first step (:func:`plan_fit`), and the
command ``python -m models.refine GAUSSIANS.ply PHOTOS output=DIR`` (:mod:`models.refine.cli`)."""

from models.pipeline.refine.fit import RefineResult, refine_gaussians, scene_extent
from models.pipeline.refine.plan import FitBudget, FitPlan, budget_fit, fit_shape, plan_fit
from models.pipeline.refine.report import holdout_evaluator, plot_holdout_psnr
from models.pipeline.refine.settings import (
    DEFAULT_MAX_SIZE,
    ADCSettings,
    MCMCSettings,
    RefineSettings,
    RefineSettingsError,
    config_key,
    settings_from_config,
)
from models.pipeline.refine.start import gaussians_from_points
from models.pipeline.refine.strategy import ADCStrategy, MCMCStrategy, Strategy, make_strategy

__all__ = [
    "ADCSettings",
    "ADCStrategy",
    "DEFAULT_MAX_SIZE",
    "FitBudget",
    "FitPlan",
    "MCMCSettings",
    "MCMCStrategy",
    "RefineResult",
    "RefineSettings",
    "RefineSettingsError",
    "Strategy",
    "budget_fit",
    "config_key",
    "fit_shape",
    "gaussians_from_points",
    "holdout_evaluator",
    "make_strategy",
    "plan_fit",
    "plot_holdout_psnr",
    "refine_gaussians",
    "scene_extent",
    "settings_from_config",
]
