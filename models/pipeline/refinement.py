"""The per-scene fit's settings for every command, checked together before any work: the
``RefineSettings`` a command's settings make (:func:`refine_settings`) and the memory the fit
needs at that size and count (:func:`check_fit_memory`), refused in one line naming the setting
and the largest value that fits.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from PIL import Image

from datamodules.readers.image_folder import IMAGE_EXTENSIONS, VIDEO_EXTENSIONS
from models.core.budget import fit_estimate
from models.core.command_line import SettingError
from models.pipeline.capture.holdout import HoldoutScores, HoldoutViews, holdout_summary
from models.pipeline.refine.plan import plan_fit
from models.pipeline.refine.settings import (
    RefineSettings,
    RefineSettingsError,
    config_key,
    settings_from_config,
)

__all__ = ["check_fit_memory", "fit_memory", "holdout_table", "photo_shape", "refine_settings"]

# RefineSettingsError names RefineSettings' fields (steps, time, size, max_gaussians, or a
# refinement field); the commands' keys for them
COMMAND_KEYS = {
    "steps": "refine",
    "time": "refine_time",
    "size": "refine_size",
    "max_gaussians": "refine_max_gaussians",
    "checkpoint_every": "refine_checkpoint_every",
}


def command_key(field: str) -> str:
    """The command-line key of a ``RefineSettings`` field named in a library error."""
    if field in COMMAND_KEYS.values() or field.startswith("refinement."):
        return field  # already a command's key
    return COMMAND_KEYS.get(field, f"refinement.{field}")


def refine_settings(values: Mapping[str, Any], backend: str, seed: int) -> RefineSettings | None:
    """:class:`RefineSettings` from a command's ``refine``, ``refine_time``, ``refine_size``,
    ``refine_max_gaussians``, ``refine_checkpoint_every`` and ``refinement`` (a mapping), or
    ``None`` when neither budget is set (no refinement).

    Raises:
        SettingError: a value out of range, one line naming the command's key.
    """
    steps, seconds = values.get("refine"), values.get("refine_time")
    if not steps and seconds in (None, 0):
        init = values.get("refine_init")
        if init not in (None, "auto"):  # set, but nothing would use it
            raise SettingError(
                f"refine_init={init}", "starts a refinement: add refine=N or refine_time=S"
            )
        return None
    try:
        settings = settings_from_config(
            refine=steps,
            refine_time=seconds,
            refine_size=values.get("refine_size"),
            refine_max_gaussians=values.get("refine_max_gaussians"),
            refinement=dict(values.get("refinement") or {}),
            backend=backend,
            seed=seed,
        )
    except RefineSettingsError as error:
        key = str(error.path) if error.path is not None else "refinement"
        raise SettingError(command_key(key.rstrip("=")), error.message) from None
    every = values.get("refine_checkpoint_every")
    if every is not None:
        settings.checkpoint_every = int(every)
    return settings


def fit_memory(count: int, views: int, shape: tuple[int, int], sh_degree: int, backend: str) -> int:
    """Bytes the fit needs at its peak with ``count`` Gaussians and ``views`` photos of
    ``shape`` ``(H, W)`` (the budget module's estimate, ``models.core.budget.fit_estimate``)."""
    return fit_estimate(count, views, shape, sh_degree, backend).peak_bytes


def photo_shape(source: Path) -> tuple[tuple[int, int], int]:
    """``((H, W), photos)`` of an input as read from its first image's header (no decoding);
    a video or an unreadable header: a square and 8 frames (the check is then an upper bound)."""
    source = Path(source).expanduser()
    files = []
    if source.is_dir():
        files = sorted(p for p in source.rglob("*") if p.suffix.lower() in IMAGE_EXTENSIONS)
    elif source.suffix.lower() not in VIDEO_EXTENSIONS:
        files = [source]
    for path in files[:1]:
        try:
            with Image.open(path) as image:
                return (image.height, image.width), len(files)
        except (OSError, ValueError):
            break
    return (1, 1), max(len(files), 8)


def check_fit_memory(
    settings: RefineSettings,
    shape: tuple[int, int],
    views: int,
    device: str,
    count: int = 0,
    sh_degree: int = 3,
) -> None:
    """Refuse a fit that cannot run here (``models.pipeline.refine.plan.plan_fit``: memory at
    ``settings.size`` on the long side of ``shape`` with up to ``settings.max_gaussians`` or
    ``count`` Gaussians, a time budget too short for its steps), naming the command's key and
    the largest value that fits.

    Raises:
        SettingError: e.g. ``refine_size=N: the fit needs about X GiB ...: at most
            refine_size=M fits`` (or ``refine_max_gaussians=``, ``refine_time=``).
    """
    try:
        plan_fit(settings, views, shape, start_count=max(int(count), 1), sh_degree=sh_degree,
                 device=device)  # fmt: skip
    except RefineSettingsError as error:
        key = config_key(error.argument)
        value = getattr(settings, error.argument, None)
        what = re.split(r": (?:lower|at most|give)", error.message, maxsplit=1)[0]
        if error.largest is None:
            raise SettingError(f"{key}={value}", error.message) from None
        limit = "at least" if error.argument == "time" else "at most"
        largest = f"{error.largest:g}" if isinstance(error.largest, float) else error.largest
        raise SettingError(f"{key}={value}", f"{what}: {limit} {key}={largest} fits") from None


def holdout_table(views: HoldoutViews, before: HoldoutScores, after: HoldoutScores) -> dict:
    """``summary.json``'s ``holdout`` of a refinement: the held-out photos scored before
    (``psnr_before_refine``, ``ssim_before_refine``) and after it, with the nearest-view
    baseline, all at one size (``image_size``)."""
    table = holdout_summary(views, after, before=before)
    for name, entry in table["metrics"].items():
        entry["ssim_before_refine"] = before.metrics[name]["ssim"]
    table["mean"]["ssim_before_refine"] = before.mean["ssim"]
    return table
