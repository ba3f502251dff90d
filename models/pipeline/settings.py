"""Every setting of the photos-to-Gaussians commands, declared once: its type (the annotation),
its range (the field's metadata) and its default (``configs/infer.yaml``, which a test keeps equal
to the defaults here).

They are read by the commands' one parser (:mod:`models.core.command_line`): ``infer.py`` registers
:class:`InferConfig` with Hydra as a structured config and checks its command line with
``check_arguments``; ``python -m models.refine`` parses its ``key=value`` arguments with
``parse_key_values`` over :class:`RefineCommandConfig`, and ``view.py`` its refinement settings
with :func:`refine_values`: all share the refinement's fields (:class:`RefineFields`), so a
refinement setting is checked the same way in every command; ``refinement.KEY`` settings are
:func:`refinement_fields`.

Pure Python and PyYAML: no Hydra import (``infer.py`` composes the config).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from models.core.command_line import MISSING, Declared, declared, parse_key_values, setting
from models.pipeline.refine.settings import RefineSettings

__all__ = [
    "InferConfig",
    "RefineCommandConfig",
    "RefineFields",
    "SfmConfig",
    "ViewConfig",
    "refine_values",
    "refinement_fields",
]

# RefineSettings fields that the commands set from their own settings, not refinement.KEY
REFINE_TOP_LEVEL = frozenset(
    {
        "steps",
        "time",
        "size",
        "max_gaussians",
        "backend",
        "seed",
        "memory_limit",
        "checkpoint_every",
    }
)


# ---------------------------------------------------------------------------------- declarations


@dataclass
class SfmConfig:
    """Structure-from-motion (``cameras=auto``; ``models.pipeline.capture.inputs``)."""

    matching: str = setting("auto", choices=("auto", "exhaustive", "sequential"))
    camera_model: str = "SIMPLE_PINHOLE"
    fov: float | None = setting(None, angle=True)
    refine_focal: bool = True
    num_threads: int = setting(2, minimum=1)
    cache: bool = True


@dataclass
class RefineFields:
    """The per-scene fit's settings, the same in ``infer.py``, ``view.py`` and
    ``python -m models.refine`` (``models.pipeline.refine.RefineSettings`` takes them)."""

    refine: int = setting(0, minimum=0)
    refine_time: float | None = setting(None, above=0.0, finite=True)
    refine_size: int | None = setting(None, minimum=8)
    refine_init: str = setting("auto", choices=("auto", "feed_forward", "sfm"))
    refine_max_gaussians: int | None = setting(None, minimum=1)
    refine_checkpoint_every: int | None = setting(None, minimum=1)
    # models.pipeline.refine.RefineSettings' other fields, as refinement.KEY (ranges checked there)
    refinement: Any = setting({}, fields=lambda: refinement_fields())


@dataclass
class InferConfig(RefineFields):
    """``configs/infer.yaml``: ``python infer.py key=value ...`` (the comments there say what
    each setting does)."""

    input: str = setting(MISSING, path=True)
    output: str = setting(MISSING, path=True)
    model: str = "zipsplat_tiny"
    weights: str | None = setting(None, path=True)
    views: Any = setting(None, count=True, minimum=1, words=("all",))
    center_view: str | None = None
    holdout: Any = None
    compression: Any = None  # the families' knobs: checked against the model's declarations
    iterations: Any = setting(None, count=True, minimum=0)
    gaussians_per_pixel: Any = None
    voxel_size: Any = None
    max_gaussians: Any = setting(None, count=True, minimum=1)
    fusion_max_gaussians: int | None = setting(None, minimum=1)
    formats: Any = setting([])  # extra splat files beside gaussians.ply (models.splat_formats)
    image_size: Any = None
    near: float | None = setting(None, above=0.0, finite=True)
    far: float | None = setting(None, above=0.0, finite=True)
    scene_scale: float | None = setting(None, above=0.0, finite=True)
    cameras: str | None = setting(None, path=True)
    sfm: SfmConfig = field(default_factory=SfmConfig)
    fov: float = setting(60.0, angle=True)
    orbit_frames: int = setting(30, minimum=1)
    fps: int = setting(15, minimum=1)
    pose_fit_steps: int = setting(50, minimum=0)
    pose_fit_size: int = setting(128, minimum=8)
    overwrite: bool = False
    view: bool = False
    device: str = "auto"
    backend: str = setting("auto", choices=("auto", "torch", "gsplat", "cpu"))
    seed: int = 0


@dataclass
class RefineCommandConfig(RefineFields):
    """``python -m models.refine [GAUSSIANS.ply] PHOTOS key=value ...``."""

    output: str = setting(MISSING, path=True)
    holdout: Any = None
    optimize_cameras: bool = False
    overwrite: bool = False
    device: str = "auto"
    backend: str = setting("auto", choices=("auto", "torch", "gsplat", "cpu"))
    seed: int = 0


@dataclass
class ViewConfig(RefineFields):
    """``python view.py PATH key=value ...`` (and the model's inference knobs, declared by the
    families: ``models.weights.knobs``)."""

    model: str | None = None
    weights: str | None = setting(None, path=True)
    host: str = "127.0.0.1"
    port: int = setting(0, minimum=0, maximum=65535)
    save: str = setting("gaussians_view.ply", path=True)
    device: str = "auto"
    live: str = setting("auto", choices=("auto", "true", "false"))
    views: Any = setting(None, count=True, minimum=1)
    image_size: Any = None  # H,W or one side (view.py checks it)
    near: float | None = setting(None, above=0.0, finite=True)
    far: float | None = setting(None, above=0.0, finite=True)
    scene_scale: float | None = setting(None, above=0.0, finite=True)
    cameras: str | None = setting(None, path=True)
    fov: float = setting(60.0, angle=True)
    backend: str = setting("auto", choices=("auto", "torch", "gsplat", "cpu"))


# ---------------------------------------------------------------------------------- the refinement


def refinement_fields() -> dict[str, Declared]:
    """``refinement.KEY`` settings: the fields of ``models.pipeline.refine.RefineSettings`` that the
    commands' own settings (``refine``, ``refine_time``, ...) do not set."""
    return {
        name: item
        for name, item in declared(RefineSettings, "refinement.").items()
        if name.split(".")[1] not in REFINE_TOP_LEVEL
    }


def refine_values(argv: list[str], program: str) -> dict[str, Any]:
    """The refinement's settings (:class:`RefineFields`) among ``key=value`` arguments, typed
    and checked as every command checks them (other arguments are left to the caller)."""
    names = {f.name for f in dataclasses.fields(RefineFields)}
    mine = [a for a in argv if a.partition("=")[0].lstrip("+").split(".")[0] in names]
    return parse_key_values(mine, RefineFields, program)[1]
