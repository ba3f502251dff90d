"""The one stage that starts a per-scene fit, for every command (``infer.py`` and ``view.py``
through ``models.pipeline.inference.refine_reconstruction``, ``python -m models.refine`` directly): the
inputs moved to the Gaussians' device, the held-out photos' scorer for the fit's curve, the
checkpoint beside the output (:func:`refine_checkpoint_path`, the one rule for its name), then
:func:`~models.pipeline.refine.fit.refine_gaussians`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from torch import Tensor

from models.core.gaussians import Gaussians
from models.pipeline.refine.fit import RefineResult, refine_gaussians
from models.pipeline.refine.report import holdout_evaluator
from models.pipeline.refine.settings import RefineSettings

__all__ = ["refine_checkpoint_path", "start_refinement"]


def refine_checkpoint_path(output: str | os.PathLike) -> Path:
    """``.<output name>.refine-checkpoint.pt`` beside the output folder, never inside it: a
    rerun with the same output (``overwrite=true``) resumes from it; a finished fit removes
    it."""
    out = Path(output).expanduser().resolve()
    return out.with_name(f".{out.name}.refine-checkpoint.pt")


def start_refinement(
    gaussians: Gaussians,
    photos: Tensor,
    extrinsics: Tensor,
    intrinsics: Tensor,
    settings: RefineSettings,
    *,
    holdout: Any = None,
    optimize_cameras: bool = False,
    checkpoint_path: str | os.PathLike | None = None,
    progress: bool = True,
    keep: int = 0,
) -> RefineResult:
    """Fit ``gaussians`` (on the device to fit on) to ``photos`` ``[V, 3, H, W]`` at their
    cameras (``[V, 4, 4]`` camera-to-world, normalised ``[V, 3, 3]``, the Gaussians' frame).

    Args:
        holdout: held-out views (``images``, ``extrinsics``, ``intrinsics``, e.g.
            ``models.pipeline.capture.holdout.HoldoutViews``) scored along the fit at their own size
            (``RefineResult.evaluations``); never fitted.
        optimize_cameras: refine the cameras jointly (view 0 fixed).
        checkpoint_path: the fit's state file (:func:`refine_checkpoint_path`).
        progress: show the fit's progress bar.
        keep: the time budget never prunes below this many Gaussians (the SfM points of a
            ``refine_init=sfm`` or ``auto`` start).
    """
    device = gaussians.means.device
    evaluate = None
    if holdout is not None and len(holdout.images):
        evaluate, _ = holdout_evaluator(
            holdout.images.to(device),
            holdout.extrinsics.to(device),
            holdout.intrinsics.to(device),
            tuple(holdout.images.shape[-2:]),
            settings.backend,
        )
    return refine_gaussians(
        gaussians,
        photos.to(device),
        extrinsics.to(device),
        intrinsics.to(device),
        settings,
        optimize_cameras=optimize_cameras,
        evaluate=evaluate,
        checkpoint_path=checkpoint_path,
        progress=progress,
        keep=keep,
    )
