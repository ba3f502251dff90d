"""The input views of a reconstruction: images with their poses from wherever they are known.

:func:`load_inputs` reads a folder of images, a video or one image (``image_folder.load_images``)
and finds poses for a posed model: a ``cameras.json`` or COLMAP model given with ``cameras=`` or
found in the input folder, else (folders and videos, or ``cameras="auto"``) structure-from-motion
(``datamodules.tools.sfm``, pycolmap; the result rides along as ``ImageSet.sfm``). Pose-free models get
the images (and any poses found, which place their views when they predict none).

Structure-from-motion takes minutes, so what can be checked without its output is checked first:
:func:`sfm_preflight` validates the ``sfm.*`` settings, the cache's writability (its warning comes
at once) and lists the photos SfM will pose, for the caller's estimate of the forward pass.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from datamodules.errors import InputError
from datamodules.readers.colmap import ColmapError, find_model_dir, read_colmap_points
from datamodules.readers.image_folder import VIDEO_EXTENSIONS, load_images
from datamodules.tools import sfm as sfm_tool  # its attributes at call time (tests stand in)
from models.weights.registry import pose_free_models

__all__ = [
    "SfmPreflight",
    "load_inputs",
    "needs_sfm",
    "pose_free_hint",
    "sfm_preflight",
    "without_poses",
]


def without_poses(source: Path) -> bool:
    """A folder without ``cameras.json`` or a COLMAP model, or a video: poses come from
    structure-from-motion (a single image stays an error: it cannot be posed)."""
    if source.is_file():
        return source.suffix.lower() in VIDEO_EXTENSIONS
    jsons = (source / "cameras.json", source / "images" / "cameras.json")
    return not any(p.is_file() for p in jsons) and find_model_dir(source) is None


def needs_sfm(source: Path, model: Any, cameras: str | os.PathLike | None) -> bool:
    """Whether :func:`load_inputs` poses ``source`` by structure-from-motion: ``cameras="auto"``,
    or a posed model given no cameras and an input without poses (:func:`without_poses`)."""
    pose_free = bool(getattr(model, "pose_free", False))
    return str(cameras) == "auto" or (not cameras and not pose_free and without_poses(source))


@dataclass
class SfmPreflight:
    """What is known before structure-from-motion runs.

    Attributes:
        names: the photos it will pose (a folder's image files; a video's frames are not
            extracted yet: empty).
        count: how many photos (a video: the frames it samples).
        notes: warnings already due (an unwritable cache), one line each.
    """

    names: list[str]
    count: int
    notes: list[str] = field(default_factory=list)


def _sfm_settings(sfm: Mapping[str, Any]) -> tuple[Any, Any]:
    """``(SfmSettings, cache)`` of the ``sfm.*`` settings (``InputError`` naming ``sfm``)."""
    options = dict(sfm)
    cache = options.pop("cache", True)
    try:
        settings = sfm_tool.SfmSettings(**options)
        settings.check()
    except (TypeError, ValueError) as error:
        raise InputError("sfm", " ".join(str(error).split())) from error
    return settings, cache


def sfm_preflight(
    source: str | os.PathLike, views: int | None, sfm: Mapping | None
) -> SfmPreflight:
    """Check what structure-from-motion's run does not decide, before it starts: the ``sfm.*``
    settings, the cache folder (unwritable: a warning now, the run goes on without it) and the
    photos it will pose.

    Raises:
        InputError: an invalid ``sfm.*`` setting (one line naming ``sfm``).
    """
    source = Path(source).expanduser()
    _, cache = _sfm_settings(sfm or {})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sfm_tool.cache_root(cache)
    if source.is_file():
        video = source.suffix.lower() in VIDEO_EXTENSIONS
        names, count = [], int(views or 8) if video else 1
    else:
        names = [p.name for p in sfm_tool.image_files(source)]
        count = len(names)
    return SfmPreflight(names, count, _notes(caught, exact=True))


def _needs_poses(source: Path, name: str, reason: str) -> InputError:
    return InputError(
        source,
        f"model {name} needs camera poses ({reason}); add cameras.json or a COLMAP model, "
        f"pass cameras=PATH, or use a pose-free model: model={pose_free_hint()}",
    )


def pose_free_hint() -> str:
    """The first pose-free model that loads by name (shipped weights first), for error messages."""
    try:
        names = [name.split(" ")[0] for name in pose_free_models()]
    except Exception:  # the hint must never turn into a different error
        names = []
    return names[0] if names else "zipsplat_tiny"


def _notes(caught: list[warnings.WarningMessage], exact: bool = False) -> list[str]:
    return [
        " ".join(str(w.message).split())
        for w in caught
        if (w.category is UserWarning if exact else issubclass(w.category, UserWarning))
    ]


def load_inputs(
    source: str | os.PathLike,
    image_size: int | tuple[int, int],
    model: Any,
    *,
    name: str | None = None,
    views: int | None = None,
    cameras: str | os.PathLike | None = None,
    sfm: Mapping[str, Any] | None = None,
    fit_shape_of: Callable[[Any], tuple[int, int]] | None = None,
) -> tuple[Any, list[str]]:
    """The input views for ``model``; returns the ``ImageSet`` and warnings (one line each).

    Args:
        source: a folder of images, a video or one image.
        image_size: side (or ``(H, W)``) of the model's input.
        model: the model; its ``pose_free`` (else poses are found or estimated) and
            ``min_views`` (fewer usable views is an error) are read.
        name: the model's name in messages (default: its registry name).
        views: frames sampled from a video / at most this many images of a folder.
        cameras: a ``cameras.json`` file, a COLMAP model folder, ``"auto"`` (structure-from-
            motion) or ``None`` (found in the input folder; posed models without: SfM).
        sfm: ``SfmSettings`` fields plus ``cache`` (structure-from-motion settings).
        fit_shape_of: ``(H, W)`` of a second size of the same views given the loaded set
            (``ImageSet.fit``, e.g. a per-scene fit's photos): read once, resized twice.

    Raises:
        InputError: one line naming the input (poses a posed model lacks, a cameras path not
        found, too few views: then with the skipped files).
    """
    pose_free = bool(getattr(model, "pose_free", False))
    min_views = int(getattr(model, "min_views", 1))
    name = name or str(getattr(model, "registry_name", None) or type(model).__name__)
    source = Path(source).expanduser()
    shape = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
    if needs_sfm(source, model, cameras):
        return _sfm_inputs(source, shape, min_views, views, sfm or {}, fit_shape_of)
    poses = "auto"
    if cameras:
        path = Path(os.fspath(cameras)).expanduser()
        if not path.exists():
            raise InputError(path, "cameras file or COLMAP folder not found")
        poses = str(path)
    if not pose_free and source.is_file():
        kind = "a video" if source.suffix.lower() in VIDEO_EXTENSIONS else "a single image"
        raise _needs_poses(source, name, f"{kind} has no camera poses")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            images = load_images(
                source, shape, views, min_views, poses=poses, fit_shape_of=fit_shape_of
            )
        except InputError as error:
            skipped = [m for m in _notes(caught) if "(skipped)" in m]
            if skipped:
                names = ", ".join(Path(m.split(":", 1)[0]).name for m in skipped[:5])
                more = f" and {len(skipped) - 5} more" if len(skipped) > 5 else ""
                raise InputError(f"{error} (skipped unreadable: {names}{more})") from error
            raise
    if not pose_free and images.extrinsics is None:
        raise _needs_poses(source, name, "no cameras.json or COLMAP sparse/ model found")
    return images, _notes(caught)


def _sfm_inputs(
    source: Path,
    shape: tuple[int, int],
    min_views: int,
    views: int | None,
    sfm: Mapping,
    fit_shape_of: Callable[[Any], tuple[int, int]] | None = None,
) -> tuple[Any, list[str]]:
    """Poses by structure-from-motion, then the images loaded with them."""
    settings, cache = _sfm_settings(sfm)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            result, folder, cameras_json = sfm_tool.poses_for_input(
                source, views, settings, cache=cache
            )
        except sfm_tool.SfmError as error:
            raise error.with_pose_free_model(pose_free_hint()) from None
        images = load_images(
            folder, shape, views, min_views, poses=str(cameras_json), fit_shape_of=fit_shape_of
        )
    images.pose_source, images.sfm = "structure-from-motion", result
    if images.points is None:  # the sparse points set a release's scale (models.pipeline.inference)
        with contextlib.suppress(ColmapError):
            images.points = read_colmap_points(result.model_dir, min_points=1)[0]
    return images, _notes(caught, exact=True)
