"""Inference as a library: images in, a :class:`Reconstruction` out, and its output folder.

    from models import create_model
    from models.inference import reconstruct, write_reconstruction
    from datamodules.readers.image_folder import load_images

    model = create_model("zipsplat_tiny", pretrained=True).eval()
    images = load_images("photos/", image_size=(64, 64))    # or a [V, 3, H, W] tensor
    result = reconstruct(model, images, compression=0.5)     # knobs: models.knobs declarations
    write_reconstruction(result, "out/")                     # gaussians.ply, cameras.json, ...

:func:`reconstruct` runs the model once and places every input view: the given cameras
(``cameras=`` or the image set's own, e.g. from ``cameras.json``, COLMAP or structure-from-motion),
the cameras a pose-free model predicts, or test-time pose fit against each view's image.
:func:`write_reconstruction` writes ``gaussians.ply``, ``cameras.json``, ``renders/``, ``path/``,
``path.mp4``, ``sparse/`` (structure-from-motion poses), ``cardinality/`` (MoE-cardinality models)
and ``summary.json`` atomically through :class:`models.output_folder.OutputFolder`, the helper the
exporter uses too. Reading images, videos and poses stays in ``datamodules`` (an ``ImageSet`` is
taken by duck typing); this module imports no Lightning, Hydra or wandb, and no ``datamodules``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from datamodules.errors import InputError
from models.factory import create_model
from models.gaussians import Gaussians, transform_gaussians
from models.geometry.camera_paths import interpolate_cameras, orbit_cameras
from models.geometry.cameras import (
    camera_centers,
    intrinsics_to_pixels,
    project,
)
from models.geometry.similarity import Similarity
from models.input_recipe import (
    BASELINE_DEPTH_RATIO,
    MAX_UPSAMPLE,
    InputRecipe,
    fallback_recipe,
    parse_image_size,
)
from models.knobs import Knob, inference_knobs
from models.metrics import psnr
from models.output_folder import OutputFolder
from models.pixels import image_to_uint8
from models.pose_fit import fit_target_poses
from models.refine import holdout_evaluator, refine_gaussians
from models.registry import get_pretrained_cfg, is_model, list_models
from models.render.core import render
from models.render.cpu import cpu_rasterizer_error
from models.splat_formats import parse_formats, suffix_of
from models.weights.hub import weights_location

__all__ = [
    "PLACEMENTS",
    "InferenceError",
    "KnobError",
    "LoadedModel",
    "Reconstruction",
    "SceneFrame",
    "camera_path",
    "check_backend",
    "check_input",
    "check_knobs",
    "choose_device",
    "input_size",
    "load_for_inference",
    "model_recipe",
    "output_folder",
    "prepare_context",
    "progress",
    "recipe_warnings",
    "reconstruct",
    "refine_reconstruction",
    "render_views",
    "scene_scale",
    "write_reconstruction",
]

PROGRAM = "infer.py"  # the program name in the output marker (earlier outputs stay replaceable)
REPO_ROOT = Path(__file__).resolve().parents[1]
# How a view was placed: given cameras (cameras=, cameras.json, COLMAP), structure-from-motion,
# view 0 of a pose-free model (the identity), predicted by the model, test-time pose fit,
# or not at all (pose-free, no prediction, no refinement).
PLACEMENTS = ("given", "sfm", "identity", "predicted", "refined", "unknown")
CARDINALITY_COLOURS = ((0, 0, 255), (0, 255, 0), (255, 255, 0), (255, 0, 0))  # 0, 1, 2, 3+


class InferenceError(InputError):
    """Unusable input or settings for inference; one line naming ``path``."""


class KnobError(InferenceError):
    """A knob the model does not declare, or a value of the wrong type or out of range."""


# --------------------------------------------------------------------------- result


@dataclass
class SceneFrame:
    """How the model's scene frame sits in the capture's own frame (DESIGN, "Scene frame").

    Attributes:
        to_capture: scene frame -> capture: ``p = R0 @ (scale * q) + t0`` with ``[R0 | t0]`` the
            first context camera's camera-to-world in the capture (identity without poses); the
            model saw the capture divided by ``scale`` (its recipe's training scale).
        rule: how the scale was chosen (one line).
        near: the near plane the model got (scene units).
        far: the far plane the model got (scene units).
    """

    to_capture: Similarity = field(default_factory=Similarity.identity)
    rule: str = "no poses: the scene frame is view 0's camera frame at the model's scale"
    near: float = 1.0
    far: float = 100.0

    @property
    def scale(self) -> float:
        """Capture units per scene unit (``summary.json`` ``recipe.scene_scale``)."""
        return float(self.to_capture.scale)

    def to_dict(self) -> dict[str, Any]:
        return {"scene_scale": self.scale, "scene_scale_rule": self.rule}


@dataclass
class Reconstruction:
    """What :func:`reconstruct` returns.

    Attributes:
        gaussians: the Gaussians of the scene (a batch of one), in the scene frame (view 0 is the
            identity, at the recipe's training scale; ``frame`` maps it to the capture).
        extrinsics: ``[V, 4, 4]`` camera-to-world of every input view in that frame (the identity
            where ``placement`` is ``"unknown"``).
        intrinsics: ``[V, 3, 3]`` normalised, for ``images``.
        placement: per view, how it was placed (one of :data:`PLACEMENTS`).
        poses: one line saying how the views were placed (``summary.json``'s ``poses``).
        images: ``[V, 3, H, W]`` the model's input views in [0, 1] (CPU).
        names: a name per view (file names for an image set).
        model: the model's registry name.
        family: the model's family.
        pose_free: whether the model ignores input cameras.
        knobs: the inference knobs it ran with (checked, converted).
        timings: seconds per stage (``inference``, ``pose_fit``; callers add their own).
        maps: per-family per-view maps, e.g. ``"cardinality"`` ``[V, H, W]`` int64 (Gaussians per
            pixel of a MoE-cardinality model).
        source: the ``ImageSet`` the images came from (original sizes, SfM result), or ``None``.
        frame: where the scene frame sits in the capture (:class:`SceneFrame`): what is
            written goes back to the capture's frame and scale through it.
        recipe: the input recipe applied (``summary.json`` ``recipe``).
        warnings: where the input or settings left the recipe (one line each).
    """

    gaussians: Gaussians
    extrinsics: Tensor
    intrinsics: Tensor
    placement: list[str]
    poses: str
    images: Tensor
    names: list[str]
    model: str
    family: str | None = None
    pose_free: bool = False
    knobs: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    maps: dict[str, Tensor] = field(default_factory=dict)
    source: Any = None
    frame: SceneFrame = field(default_factory=SceneFrame)
    recipe: InputRecipe | None = None
    warnings: list[str] = field(default_factory=list)

    def recipe_record(self) -> dict[str, Any]:
        """``summary.json``'s ``recipe``: what was applied, and the tag's recipe."""
        record: dict[str, Any] = {
            "input_size": list(self.image_size),
            "near": float(self.frame.near),
            "far": float(self.frame.far),
            **self.frame.to_dict(),
        }
        if self.recipe is not None:
            record["pose_scale"] = self.recipe.pose_scale
            record["trained"] = self.recipe.to_dict()
        return record

    @property
    def known(self) -> list[int]:
        """Indices of the views with a known camera."""
        return [i for i, kind in enumerate(self.placement) if kind != "unknown"]

    @property
    def image_size(self) -> tuple[int, int]:
        """``(H, W)`` of the model's input (and of the renders)."""
        return int(self.images.shape[-2]), int(self.images.shape[-1])

    @property
    def count(self) -> int:
        """Gaussians in the scene."""
        return int(self.gaussians.count()[0])


# --------------------------------------------------------------------------- helpers


class _Timer:
    """Wall time per stage, in seconds, into ``stages``."""

    def __init__(self, stages: dict[str, float]) -> None:
        self.stages = stages

    @contextlib.contextmanager
    def __call__(self, name: str, device: torch.device | None = None) -> Iterator[None]:
        start = time.perf_counter()
        yield
        if device is not None and device.type == "cuda":
            torch.cuda.synchronize(device)
        self.stages[name] = round(time.perf_counter() - start, 4)


def progress(iterable=None, **kwargs):
    """tqdm on an interactive stderr only (pipes and logs stay clean)."""
    from tqdm.auto import tqdm

    return tqdm(iterable, disable=None, leave=False, dynamic_ncols=True, **kwargs)


def _name(model: nn.Module) -> str:
    return str(getattr(model, "registry_name", None) or type(model).__name__)


def choose_device(spec: str | None) -> torch.device:
    """``auto`` → CUDA when available, else CPU; anything else is parsed by ``torch.device``."""
    if spec in (None, "", "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(str(spec))
    except (RuntimeError, ValueError) as error:
        raise InferenceError(f"device={spec}", "not a device (auto, cpu, cuda, cuda:N)") from error
    if device.type == "cuda" and not torch.cuda.is_available():
        raise InferenceError(
            f"device={spec}", "CUDA is not available on this machine (use device=cpu)"
        )
    return device


def check_backend(backend: str, device: torch.device) -> None:
    """The renderer ``backend`` works on ``device`` (one-line :class:`InferenceError` if not)."""
    if backend not in ("auto", "torch", "gsplat", "cpu"):
        raise InferenceError(f"backend={backend}", "must be auto, torch, gsplat or cpu")
    if backend == "gsplat" and device.type != "cuda":
        raise InferenceError("backend=gsplat", f"needs a CUDA device (device is {device})")
    if backend == "cpu" and device.type != "cpu":
        raise InferenceError("backend=cpu", f"needs device=cpu (device is {device})")
    if backend == "cpu":
        if (error := cpu_rasterizer_error()) is not None:
            raise InferenceError(
                "backend=cpu", f"the compiled CPU rasteriser is not available: {error}"
            )


def _range(knob: Knob, model: nn.Module | None) -> str:
    low, high = knob.bounds(model)
    left = "(" if knob.low_open else "["
    right = f"{high:g}]" if high is not None else "inf)"
    return f"{left}{low:g}, {right}"


def check_knobs(
    model: nn.Module | str, knobs: Mapping[str, Any], name: str | None = None
) -> dict[str, float | int]:
    """``knobs`` checked against what the model's family declares (``models.knobs``).

    ``None`` values are dropped (the model's default). Works on a built model or a registry
    name (then ranges that depend on the model, e.g. SplatWeaver's experts, are not bounded).

    Returns:
        The knobs converted to their declared types.

    Raises:
        KnobError: one line naming the knob: not a knob of this model (listing its knobs), or
            ``"<knob>=<value>: must be a number in [low, high]"`` (``an integer`` for ints).
    """
    declared = {knob.name: knob for knob in inference_knobs(model)}
    built = model if isinstance(model, nn.Module) else None
    shown = name or (model if isinstance(model, str) else _name(model))
    checked: dict[str, float | int] = {}
    for key, value in knobs.items():
        if value is None:
            continue
        knob = declared.get(key)
        if knob is None:
            names = ", ".join(sorted(declared)) or "none"
            raise KnobError(
                f"{key}={value}", f"model {shown} has no {key!r} setting (its knobs: {names})"
            )
        try:
            checked[key] = knob.check(value, built)
        except ValueError:
            kind = "an integer" if knob.kind == "int" else "a number"
            raise KnobError(f"{key}={value}", f"must be {kind} in {_range(knob, built)}") from None
    return checked


# --------------------------------------------------------------------------- loading


@dataclass
class LoadedModel:
    """A model loaded for inference: the module, a description of its weights, and the
    project's loader warnings (one line each, e.g. constructor arguments that differ)."""

    model: nn.Module
    weights: str
    notes: list[str]


def load_for_inference(
    name: str, weights: str | os.PathLike | None = None, device: torch.device | str = "cpu"
) -> LoadedModel:
    """``create_model(name, pretrained=weights or True)`` on ``device`` in eval mode.

    Raises:
        InferenceError: unknown model name, weights path not found.
        PretrainedError: weights that do not load (one line naming the file).
    """

    if not is_model(name):
        raise InferenceError(
            f"model={name}", f"unknown model; valid names: {', '.join(list_models())}"
        )
    pretrained: bool | str = True if weights in (None, "", True) else os.fspath(weights)
    if isinstance(pretrained, str) and not pretrained.startswith(("hf-hub:", "local-dir:")):
        if not Path(pretrained).expanduser().exists():
            raise InferenceError(
                pretrained,
                "weights not found (a folder, .safetensors, .ckpt, "
                "local-dir:/path or hf-hub:org/repo)",
            )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = create_model(name, pretrained=pretrained)
    notes = [  # this project's warnings (not third-party libraries' notices)
        " ".join(str(w.message).split())
        for w in caught
        if issubclass(w.category, UserWarning)
        and Path(w.filename).resolve().is_relative_to(REPO_ROOT)
    ]
    if pretrained is True:
        described = weights_location(name)
    else:
        described = str(pretrained)
    return LoadedModel(model.to(device).eval(), described, notes)


def _recorded_size(model: nn.Module) -> tuple[int, int] | None:
    """``(H, W)`` the model's constructor recorded as ``image_size``, or None."""
    config = getattr(model, "_hub_mixin_config", None) or {}
    value = config.get("image_size", getattr(model, "image_size", None))
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return int(value), int(value)
    try:
        height, width = (int(v) for v in value)
    except (TypeError, ValueError):
        return None
    return height, width


def model_recipe(model: nn.Module | str) -> InputRecipe:
    """The input recipe of ``model``: its weights' tag (``pretrained_cfg.recipe``), else its
    architecture's default tag, else :func:`~models.input_recipe.fallback_recipe` (the size it
    records and its own near/far)."""

    if isinstance(model, str):
        cfg = get_pretrained_cfg(model)
        if cfg is None or cfg.recipe is None:
            raise InferenceError(f"model={model}", "has no pretrained tag with an input recipe")
        return cfg.recipe
    cfg = getattr(model, "pretrained_cfg", None)
    if cfg is not None and getattr(cfg, "recipe", None) is not None:
        return cfg.recipe
    name = getattr(model, "registry_name", None)
    cfg = get_pretrained_cfg(str(name)) if name else None
    if cfg is not None and cfg.recipe is not None:
        return cfg.recipe
    size = _recorded_size(model) or (64, 64)
    return fallback_recipe(size, getattr(model, "near", None), getattr(model, "far", None))


def input_size(
    model: nn.Module, requested: Any = None, recipe: InputRecipe | None = None
) -> tuple[int, int]:
    """``(H, W)`` of the model input: ``requested`` (one side, ``"H,W"``, ``[H, W]``), else the
    recipe's shape (a release's trained shape; the model's recorded size when it has no tag).
    One side keeps the recipe's aspect ratio (``InputRecipe.shape_for``).

    Raises:
        InferenceError: not a size, or a side under 8 pixels.
    """
    try:
        parsed = parse_image_size(requested)
    except ValueError as error:
        raise InferenceError(f"image_size={requested}", str(error)) from None
    recipe = recipe or model_recipe(model)
    if parsed is None:
        return tuple(recipe.image_size)  # type: ignore[return-value]
    if isinstance(parsed, int):
        return recipe.shape_for(parsed)
    return parsed


def recipe_warnings(
    recipe: InputRecipe,
    name: str,
    shape: tuple[int, int] | None = None,
    near: float | None = None,
    far: float | None = None,
    views: int | None = None,
) -> list[str]:
    """One line per setting outside the range ``recipe`` was trained with, naming it."""
    out = []
    if shape is not None and tuple(shape) != tuple(recipe.image_size):
        h, w = recipe.image_size
        if not all(0.5 <= got / trained <= 2 for got, trained in zip(shape, (h, w))):
            out.append(
                f"image_size={shape[0]},{shape[1]}: {name} was trained at {h}x{w} (H x W); "
                "far from it, expect worse results"
            )
        elif abs(np.log((shape[1] / shape[0]) / (w / h))) > 0.2:
            out.append(
                f"image_size={shape[0]},{shape[1]}: aspect ratio {shape[1] / shape[0]:.3g}, "
                f"{name} was trained at {h}x{w} ({w / h:.3g})"
            )
        if recipe.multiple > 1 and (shape[0] % recipe.multiple or shape[1] % recipe.multiple):
            out.append(
                f"image_size={shape[0]},{shape[1]}: {name} needs sides that are multiples of "
                f"{recipe.multiple}"
            )
    if near is not None and (near < 0.5 * recipe.near or near > 2 * recipe.near):
        out.append(f"near={near:g}: {name} was trained with near {recipe.near:g}")
    if far is not None and (far < 0.5 * recipe.far or far > 2 * recipe.far):
        out.append(f"far={far:g}: {name} was trained with far {recipe.far:g}")
    fewest, most = recipe.view_range
    if views is not None and not fewest <= views <= max(most, fewest):
        trained = f"{fewest}" if fewest == most else f"{fewest}-{most}"
        out.append(f"views={views}: {name} was trained with {trained} context views")
    return out


def check_input(
    images: Any,
    recipe: InputRecipe,
    name: str,
    shape: tuple[int, int],
    max_upsample: float = MAX_UPSAMPLE,
) -> None:
    """Bad input for a release's recipe: photos that the resize to ``shape`` would upsample more
    than ``max_upsample`` times (:data:`~models.input_recipe.MAX_UPSAMPLE`). This project's own
    demo models (``pose_scale="max_baseline_1"``) take any size, with a warning below half of it.

    Raises:
        InferenceError: one line naming the photos and what the model needs.
    """
    sizes = getattr(images, "original_sizes", None)
    if not sizes or recipe.pose_scale == "max_baseline_1":
        return
    height, width = shape
    small = [
        (n, h, w)
        for n, (h, w) in zip(images.names, sizes)
        if max(height / h, width / w) > max_upsample
    ]
    if not small:
        return
    shown = ", ".join(f"{n} ({w}x{h})" for n, h, w in small[:3])
    more = f" and {len(small) - 3} more" if len(small) > 3 else ""
    need_h, need_w = int(np.ceil(height / max_upsample)), int(np.ceil(width / max_upsample))
    raise InferenceError(
        getattr(images, "source", "images"),
        f"{shown}{more}: too small for {name}, which runs at {width}x{height} (W x H, recipe "
        f"{recipe.image_size[1]}x{recipe.image_size[0]}); photos need at least "
        f"{need_w}x{need_h} pixels (at most {max_upsample:g}x upsampling)",
    )


# --------------------------------------------------------------------------- reconstruct


def _default_intrinsics(views: int, height: int, width: int, fov: float) -> Tensor:
    focal_x = 0.5 / np.tan(np.deg2rad(fov) / 2)
    k = torch.tensor([[focal_x, 0.0, 0.5], [0.0, focal_x * width / height, 0.5], [0, 0, 1.0]])
    return k.expand(views, 3, 3).clone()


def _median_point_depth(
    points: Tensor, extrinsics: Tensor, intrinsics: Tensor
) -> tuple[float, int] | None:
    """Median z-depth of the ``points [P, 3]`` that project inside the context views (in front
    of the camera, within the image), over all views, and how many there were; None if none."""
    xy, depth = project(points.double()[None], extrinsics.double(), intrinsics.double())
    # xy [V, P, 2] normalised image coordinates, depth [V, P]
    inside = (depth > 1e-6) & (xy >= 0).all(-1) & (xy <= 1).all(-1)
    seen = depth[inside]
    if seen.numel() < 10:
        return None
    return float(seen.median()), int(inside.any(0).sum())


def scene_scale(
    recipe: InputRecipe,
    extrinsics: Tensor,
    intrinsics: Tensor,
    points: Tensor | None = None,
    override: float | None = None,
) -> tuple[float, str]:
    """The scale that maps a capture to ``recipe``'s training scale (capture units per scene
    unit) and how it was chosen. The rule (docs/recipes.md):

    - ``scene_scale=`` given: that;
    - ``pose_scale="max_baseline_1"`` (this project's models) or ``"pose_free"``: the largest
      distance between context camera centres (1 for a single view);
    - ``pose_scale="dataset"`` (releases trained on their dataset's own scale): the median depth
      of the sparse points seen in the context views divided by the recipe's
      ``reference_depth``; without points, the largest context-camera distance times
      :data:`~models.input_recipe.BASELINE_DEPTH_RATIO` taken as that median depth.

    Args:
        recipe: the input recipe.
        extrinsics: ``[V, 4, 4]`` context camera-to-world in the capture.
        intrinsics: ``[V, 3, 3]`` normalised.
        points: ``[P, 3]`` sparse points in the capture (SfM / COLMAP), or None.
        override: the user's ``scene_scale``.
    """
    if override is not None:
        return float(override), f"scene_scale={override:g} (given)"
    centres = camera_centers(extrinsics.double())  # [V, 3]
    baseline = float(torch.cdist(centres, centres).max()) if len(centres) > 1 else 0.0
    if recipe.pose_scale != "dataset" or recipe.reference_depth is None:
        if baseline <= 1e-8:
            return 1.0, "one camera position: scale 1"
        return baseline, "largest context-camera distance = 1 (the model's training scale)"
    reference = float(recipe.reference_depth)
    if points is not None and len(points):
        found = _median_point_depth(points, extrinsics, intrinsics)
        if found is not None:
            median, count = found
            return median / reference, (
                f"median depth of the {count} sparse points seen in the context views "
                f"({median:.4g} capture units) = {reference:g}, the recipe's reference depth"
            )
    if baseline <= 1e-8:
        return 1.0, "no sparse points and one camera position: the capture's own scale"
    return baseline * BASELINE_DEPTH_RATIO / reference, (
        f"no sparse points: {BASELINE_DEPTH_RATIO:g} x the largest context-camera distance "
        f"({baseline:.4g} capture units) taken as the median depth = {reference:g}, the "
        "recipe's reference depth"
    )


@dataclass
class PreparedContext:
    """What :func:`prepare_context` returns: the model's context batch (scene frame), the view
    names, where the poses came from and the :class:`SceneFrame`."""

    context: dict[str, Tensor]
    names: list[str]
    origin: str
    label: str
    frame: SceneFrame
    recipe: InputRecipe


def prepare_context(
    model: nn.Module,
    images: Any,
    cameras: Mapping[str, Tensor] | None = None,
    *,
    fov: float = 60.0,
    near: float | None = None,
    far: float | None = None,
    scene_scale_override: float | None = None,
    recipe: InputRecipe | None = None,
) -> PreparedContext:
    """The model's context batch for ``images`` under its input recipe: near/far of the recipe
    (or given), poses moved into the scene frame (view 0 the identity) at the recipe's training
    scale (:func:`scene_scale`). ``images`` is an ``ImageSet`` (its poses, ``points`` and SfM
    result are used) or ``[V, 3, H, W]``; ``cameras`` replace its poses (capture frame)."""
    recipe = recipe or model_recipe(model)
    points = None
    if isinstance(images, Tensor):
        if images.ndim != 4 or images.shape[1] != 3:
            raise InferenceError("images", f"must be [V, 3, H, W], got {list(images.shape)}")
        pixels, names, origin, label = images.float(), None, "given", "given"
        extrinsics = intrinsics = None
    else:  # an ImageSet (datamodules.readers.image_folder): its own poses unless cameras= is given
        pixels, names = images.images, list(images.names)
        extrinsics, intrinsics = images.extrinsics, images.intrinsics
        points = getattr(images, "points", None)
        sfm = getattr(images, "sfm", None) is not None
        origin = "sfm" if sfm else "given"
        label = images.pose_source or ("structure-from-motion" if sfm else "given")
    views, _, height, width = pixels.shape
    if cameras is not None:
        extrinsics = cameras.get("extrinsics", extrinsics)
        intrinsics = cameras.get("intrinsics", intrinsics)
        points = cameras.get("points", None if "extrinsics" in cameras else points)
        origin, label = "given", "given"
    for key, value in (("extrinsics", extrinsics), ("intrinsics", intrinsics)):
        size = 4 if key == "extrinsics" else 3
        if value is not None and tuple(value.shape) != (views, size, size):
            raise InferenceError(
                f"cameras[{key!r}]", f"must be [{views}, {size}, {size}] for {views} views"
            )
    if intrinsics is None:
        intrinsics = _default_intrinsics(views, height, width, fov)
    near = float(recipe.near if near is None else near)
    far = float(recipe.far if far is None else far)
    if not 0 < near < far:
        raise InferenceError(f"near={near:g}, far={far:g}", "need 0 < near < far")
    context = {
        "image": pixels[None].float(),
        "intrinsics": intrinsics[None].float(),
        "near": torch.full((1, views), near),
        "far": torch.full((1, views), far),
    }
    frame = SceneFrame(near=near, far=far)
    if scene_scale_override is not None:
        frame.to_capture = Similarity.scaling(
            float(scene_scale_override), torch.zeros(3, dtype=torch.float64)
        )
        frame.rule = f"scene_scale={scene_scale_override:g} (given)"
    if extrinsics is not None:
        capture = extrinsics.double().cpu()
        scale, rule = scene_scale(
            recipe, capture, intrinsics.double().cpu(), points, scene_scale_override
        )
        to_capture = Similarity.from_pose(capture[0].clone(), scale)
        frame = SceneFrame(to_capture=to_capture, rule=rule, near=near, far=far)
        context["extrinsics"] = to_capture.inverse().cameras(capture)[None].float()
    names = names or [f"view_{i:02d}" for i in range(views)]
    return PreparedContext(context, names, origin, label, frame, recipe)


def reconstruct(
    model: nn.Module,
    images: Any,
    cameras: Mapping[str, Tensor] | None = None,
    *,
    pose_fit_steps: int = 50,
    pose_fit_size: int = 128,
    backend: str = "auto",
    fov: float = 60.0,
    name: str | None = None,
    near: float | None = None,
    far: float | None = None,
    scene_scale: float | None = None,
    recipe: InputRecipe | None = None,
    **knobs: Any,
) -> Reconstruction:
    """Reconstruct the Gaussians of ``images`` with ``model`` and place every view.

    Args:
        model: a zoo model (eval mode, on the device to run on).
        images: an ``ImageSet`` (``datamodules.readers.image_folder.load_images``; its poses are used
            when it has them) or ``[V, 3, H, W]`` in [0, 1].
        cameras: ``{"extrinsics": [V, 4, 4] camera-to-world, "intrinsics": [V, 3, 3]
            normalised}`` (either may be left out; ``"points" [P, 3]`` sparse points too),
            replacing the image set's poses, in the capture's frame. Posed models need
            extrinsics; pose-free ones do not see them, but their views are placed by them when
            the model predicts no cameras.
        pose_fit_steps: for pose-free models that predict no cameras and have no given cameras:
            test-time pose fitting steps placing views 1.. (0: their poses stay unknown).
        pose_fit_size: the pose fit compares images downsampled to at most this many pixels.
        backend: renderer for the pose fit (``auto``, ``torch``, ``gsplat``, ``cpu``).
        fov: horizontal field of view in degrees assumed when there are no intrinsics.
        name: the model's name in messages (default: its registry name).
        near: near plane (default: the recipe's, :func:`model_recipe`).
        far: far plane (default: the recipe's).
        scene_scale: capture units per scene unit (default: the recipe's rule,
            :func:`scene_scale`).
        recipe: the input recipe (default: the model's).
        **knobs: the family's inference knobs (``models.knobs``), e.g. ``compression=0.5``,
            ``iterations=4``, ``gaussians_per_pixel=1.0``, ``max_gaussians=20000``.

    Returns:
        The :class:`Reconstruction`.

    Raises:
        KnobError: a knob the model does not declare, or a value out of its range.
        InferenceError: a posed model without extrinsics, images of the wrong shape, a model
            refusing the input (e.g. its image size), or no Gaussians at all.
    """
    name = name or _name(model)
    forward = check_knobs(model, knobs, name)
    pose_free = bool(getattr(model, "pose_free", False))
    prepared = prepare_context(
        model,
        images,
        cameras,
        fov=fov,
        near=near,
        far=far,
        scene_scale_override=scene_scale,
        recipe=recipe,
    )
    context, names, origin, label = (
        prepared.context,
        prepared.names,
        prepared.origin,
        prepared.label,
    )
    recipe = prepared.recipe
    notes = recipe_warnings(recipe, name, tuple(context["image"].shape[-2:]), near, far)
    for note in notes:
        warnings.warn(note, stacklevel=2)
    if not pose_free and "extrinsics" not in context:
        raise InferenceError(f"model={name}", "needs camera poses (cameras={'extrinsics': ...})")
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    context = {k: v.to(device) for k, v in context.items()}
    given = context.pop("extrinsics", None) if pose_free else context.get("extrinsics")
    timings: dict[str, float] = {}
    timer = _Timer(timings)
    with timer("inference", device), torch.inference_mode():
        for _ in progress(range(1), desc="inference", unit="forward"):
            try:
                pred = model(context, **forward)
            except ValueError as error:  # the model refuses this input (e.g. its image size)
                raise InferenceError(f"model={name}", str(error)) from error
    gaussians = pred.gaussians.detach()
    if int(gaussians.count()[0]) == 0:
        source = getattr(images, "source", "images")
        raise InferenceError(source, f"model {name} produced no Gaussians for this input")

    views = context["image"].shape[1]
    intrinsics = context["intrinsics"][0].float()  # [V, 3, 3]
    predicted_e = pred.extrinsics  # [1, V, 4, 4] cameras a pose-free model predicts, or None
    if not pose_free:
        extrinsics, placement = given[0].float(), [origin] * views
        poses = f"input ({label})"
    elif isinstance(predicted_e, Tensor):
        extrinsics = predicted_e[0].float()
        predicted_k = pred.intrinsics
        if isinstance(predicted_k, Tensor):
            intrinsics = predicted_k[0].float()
        placement = ["identity"] + ["predicted"] * (views - 1)
        poses = f"predicted by {name}"
    elif given is not None:
        # The model saw no poses; its scene frame is the same normalised frame (view 0 =
        # identity, unit baseline), so the given cameras render it.
        extrinsics, placement = given[0].float(), [origin] * views
        poses = f"input ({label}); pose-free {name} does not predict cameras"
    else:
        extrinsics = torch.eye(4, device=device).expand(views, 4, 4).clone()
        steps = int(pose_fit_steps)
        if views > 1 and steps > 0:
            # Views 1.. by test-time pose fit (as eval does for pose-free models), each
            # from view 0's pose, against its own image with the Gaussians frozen.
            targets = context["image"][:, 1:].float()  # [1, V-1, 3, H, W]
            if max(targets.shape[-2:]) > pose_fit_size:  # intrinsics are normalised
                factor = pose_fit_size / max(targets.shape[-2:])
                small = [max(8, round(n * factor)) for n in targets.shape[-2:]]
                targets = F.interpolate(targets[0], size=small, mode="area")[None]
            with timer("pose_fit", device):
                extrinsics[1:] = fit_target_poses(
                    gaussians,
                    targets,
                    extrinsics[None, 1:],
                    intrinsics[None, 1:],
                    steps=steps,
                    backend=backend,
                    announce=True,
                )[0]
            placement = ["identity"] + ["refined"] * (views - 1)
            poses = (
                f"refined: pose-free {name} predicts no cameras; views 1.. placed by "
                f"test-time pose fit ({steps} steps from view 0's pose, at "
                f"{targets.shape[-1]}x{targets.shape[-2]} px)"
            )
        else:
            placement = ["identity"] + ["unknown"] * (views - 1)
            poses = f"unknown (pose-free {name} does not predict cameras)"

    maps = {}
    routing = pred.diagnostics.get("routing_map")  # [1, V, H, W] MoE-cardinality: per pixel
    if isinstance(routing, Tensor):
        maps["cardinality"] = routing[0].detach().to(torch.int64).cpu()  # [V, H, W]
    return Reconstruction(
        gaussians=gaussians,
        extrinsics=extrinsics.detach(),
        intrinsics=intrinsics.detach(),
        placement=placement,
        poses=poses,
        images=context["image"][0].detach().float().cpu(),
        names=names,
        model=name,
        family=getattr(model, "family", None),
        pose_free=pose_free,
        knobs=dict(forward),
        timings=timings,
        maps=maps,
        source=None if isinstance(images, Tensor) else images,
        frame=prepared.frame,
        recipe=recipe,
        warnings=notes,
    )


# --------------------------------------------------------------------------- rendering


def render_views(
    gaussians: Gaussians,
    extrinsics: Tensor,
    intrinsics: Tensor,
    shape: tuple[int, int],
    backend: str = "auto",
    desc: str = "render",
    views_per_call: int = 8,
) -> Tensor:
    """Render every camera, ``views_per_call`` at a time (batched views are several times cheaper
    per view on the torch backend); returns ``[N, 3, H, W]`` on CPU."""

    out = []
    with progress(total=extrinsics.shape[0], desc=desc, unit="view") as bar:
        for start in range(0, extrinsics.shape[0], views_per_call):
            stop = min(start + views_per_call, extrinsics.shape[0])
            color = render(
                gaussians,
                extrinsics[None, start:stop],
                intrinsics[None, start:stop],
                shape,
                backend=backend,
            ).color  # [1, n, 3, H, W]
            out.append(color[0].float().cpu())
            bar.update(stop - start)
    return torch.cat(out)


def camera_path(result: Reconstruction, frames: int = 30) -> tuple[Tensor, Tensor, str]:
    """The path ``write_reconstruction`` renders: interpolated through the known cameras, or (one
    known camera) a small orbit around view 0 looking at the Gaussians' median depth.

    Returns:
        ``[frames, 4, 4]``, ``[frames, 3, 3]`` (CPU) and a description.
    """
    known = result.known
    if len(known) >= 2:
        path_e, path_k = interpolate_cameras(
            result.extrinsics[known].cpu(), result.intrinsics[known].cpu(), frames
        )
        return path_e, path_k, "interpolated between the input cameras"
    gaussians = result.gaussians
    depth = gaussians.means[0, :, 2][gaussians.valid_mask()[0]].float().cpu()
    depth = depth[depth > 0]
    look_at = float(depth.median()) if depth.numel() else 1.0
    path_e, path_k = orbit_cameras(
        result.extrinsics[0].cpu(), look_at, result.intrinsics[0].cpu(), frames, 0.1 * look_at
    )
    return path_e, path_k, "orbit around the first view"


# --------------------------------------------------------------------------- writing


def output_folder(
    output: str | os.PathLike, inputs: Iterable[str | os.PathLike] = (), overwrite: bool = False
) -> OutputFolder:
    """The atomic output folder of a reconstruction, checked now: it replaces nothing but an
    earlier reconstruction output (with ``overwrite``), and is, holds or lies in no input.

    Raises:
        OutputFolderError: one line naming the folder.
    """
    return OutputFolder(output, PROGRAM, inputs=inputs, overwrite=overwrite)


def _save_pngs(images: Tensor, paths: Iterable[Path]) -> None:
    from PIL import Image

    for array, path in zip(image_to_uint8(images), paths):
        Image.fromarray(array).save(path)


def _write_video(frames: np.ndarray, path: Path, fps: int) -> None:
    """``[N, H, W, 3]`` uint8 → H.264 MP4 (imageio-ffmpeg)."""
    import imageio.v2 as imageio

    with imageio.get_writer(
        path, fps=fps, codec="libx264", quality=8, macro_block_size=2, ffmpeg_log_level="error"
    ) as writer:
        for frame in frames:
            writer.append_data(frame)


def _save_cardinality(counts: Tensor, folder: Path, names: list[str]) -> dict[str, float]:
    """Gaussians-per-pixel maps ``[V, H, W]`` as PNGs (blue 0, green 1, yellow 2, red 3 or
    more) and ``cardinality.npy``; returns the mean count per pixel and the empty share."""
    from PIL import Image

    folder.mkdir()
    np.save(folder / "cardinality.npy", counts.numpy().astype(np.uint8))
    palette = torch.tensor(CARDINALITY_COLOURS, dtype=torch.uint8)
    for name, view in zip(names, counts):
        Image.fromarray(palette[view.clamp(0, 3)].numpy()).save(folder / name)
    return {
        "gaussians_per_pixel": round(float(counts.float().mean()), 4),
        "empty_pixel_share": round(float((counts == 0).float().mean()), 4),
    }


def _camera_entry(pose: Tensor, k_pixels: Tensor, size: tuple[int, int]) -> dict[str, Any]:
    return {
        "camera_to_world": [[float(x) for x in row] for row in pose.double().cpu()],
        "fx": float(k_pixels[0, 0]),
        "fy": float(k_pixels[1, 1]),
        "cx": float(k_pixels[0, 2]),
        "cy": float(k_pixels[1, 2]),
        "width": int(size[1]),
        "height": int(size[0]),
    }


def _input_cameras(result: Reconstruction, render_names: list[str]) -> list[dict[str, Any]]:
    """``cameras.json`` frames of the known views, in the input images' pixels when the image
    set says how it resized them (``ImageSet.original_intrinsics``), else the model's."""
    shape = result.image_size
    intrinsics = result.intrinsics.cpu()
    source = result.source
    if source is not None and hasattr(source, "original_intrinsics"):
        pixels, sizes = source.original_intrinsics(intrinsics), list(source.original_sizes)
    else:
        pixels, sizes = intrinsics_to_pixels(intrinsics.double(), shape), [shape] * len(intrinsics)
    capture = result.frame.to_capture.cameras(result.extrinsics.double().cpu())  # [V, 4, 4]
    kinds = {"given": "input", "sfm": "input"}  # cameras.json's names since its first release
    return [
        {
            "file": result.names[i],
            "render": f"renders/{render_names[i]}",
            "pose": kinds.get(result.placement[i], result.placement[i]),
            **_camera_entry(capture[i], pixels[i], sizes[i]),
        }
        for i in result.known
    ]


def refine_reconstruction(
    result: Reconstruction,
    photos: Tensor,
    settings: Any,
    *,
    intrinsics: Tensor | None = None,
    holdout: Any = None,
    start: Gaussians | None = None,
    optimize_cameras: bool | None = None,
    checkpoint_path: str | os.PathLike | None = None,
    progress: bool = True,
) -> tuple[Reconstruction, Any]:
    """Per-scene refinement after the feed-forward pass (``models.refine``, docs/refine.md).

    The Gaussians are optimised against the input photos at their cameras (posed: the given /
    structure-from-motion ones; pose-free: the predicted or placed ones, refined jointly), in
    the reconstruction's frame.

    Args:
        result: what :func:`reconstruct` (or ``models.capture.whole``) returned.
        photos: ``[V, 3, H, W]`` the photos of ``result.names``, in that order, at any size
            (fitted at ``settings.size`` on the long side); never a held-out photo.
        settings: a ``models.refine.RefineSettings``.
        intrinsics: ``[V, 3, 3]`` normalised for ``photos`` (``None``: ``result.intrinsics``,
            which hold only for photos cropped as the model's input).
        holdout: held-out views (``models.capture.holdout.HoldoutViews``: ``images``,
            ``extrinsics``, ``intrinsics`` in the result's frame) scored along the fit for the
            curve (``RefineResult.evaluations``), at their own size.
        start: the Gaussians to start from in the result's frame (``None``: the feed-forward
            ones; e.g. ``models.refine.gaussians_from_points`` of the SfM points).
        optimize_cameras: refine the cameras jointly (``None``: for a pose-free model).
        checkpoint_path: the fit's state file (saved every ``settings.checkpoint_every`` steps;
            a rerun resumes from it).
        progress: show the fit's progress bar.

    Returns:
        ``(refined, refine_result)``: the reconstruction with the refined Gaussians (and
        cameras) and the ``models.refine.RefineResult`` (``summary()`` is ``summary.json``'s
        ``refine``; ``stopped == "interrupted"`` after Ctrl-C).

    Raises:
        InferenceError: a view without a camera (one line).
        models.refine.RefineSettingsError: one line naming the argument.
    """

    unknown = [n for n, kind in zip(result.names, result.placement) if kind == "unknown"]
    if unknown:
        shown = ", ".join(unknown[:4]) + (
            f" and {len(unknown) - 4} more" if len(unknown) > 4 else ""
        )
        raise InferenceError(
            "refine",
            f"model {result.model} predicts no cameras and {shown} have none: refinement fits "
            "the photos at their cameras (give cameras=, or pose_fit_steps= > 0)",
        )
    if len(photos) != len(result.names):
        raise ValueError(f"photos: {len(photos)} for {len(result.names)} views")
    gaussians = result.gaussians if start is None else start
    device = result.gaussians.means.device
    camera_k = result.intrinsics if intrinsics is None else intrinsics
    evaluate = None
    if holdout is not None and len(holdout.images):
        evaluate, _ = holdout_evaluator(
            holdout.images.to(device),
            holdout.extrinsics,
            holdout.intrinsics,
            tuple(holdout.images.shape[-2:]),
            settings.backend,
        )
    joint = bool(result.pose_free) if optimize_cameras is None else bool(optimize_cameras)
    fitted = refine_gaussians(
        gaussians.to(device),
        photos.to(device),
        result.extrinsics.to(device),
        camera_k.to(device),
        settings,
        optimize_cameras=joint,
        evaluate=evaluate,
        checkpoint_path=checkpoint_path,
        progress=progress,
    )
    placement = list(result.placement)
    if joint:  # view 0 stays where it was; the others moved with the fit
        placement = placement[:1] + ["refined"] * (len(placement) - 1)
    refined = dataclasses.replace(
        result,
        gaussians=fitted.gaussians,
        extrinsics=fitted.extrinsics.detach().float().cpu(),
        placement=placement,
        timings={**result.timings, "refine": round(fitted.seconds, 4)},
    )
    return refined, fitted


def _save_formats(gaussians, staging: Path, formats: Iterable[str], timer) -> dict[str, dict]:
    """Write ``gaussians.<suffix>`` for each format; ``{name: {"file", "bytes"}}`` (ply too)."""
    written = {
        "ply": {"file": "gaussians.ply", "bytes": (staging / "gaussians.ply").stat().st_size}
    }
    for name in parse_formats(list(formats)):
        file = "gaussians" + suffix_of(name)
        with timer(f"save_{name}"):
            gaussians.save(staging / file)
        written[name] = {"file": file, "bytes": (staging / file).stat().st_size}
    return written


def write_reconstruction(
    result: Reconstruction,
    output: str | os.PathLike | OutputFolder,
    *,
    frames: int = 30,
    fps: int = 15,
    backend: str = "auto",
    overwrite: bool = False,
    inputs: Iterable[str | os.PathLike] = (),
    summary: Mapping[str, Any] | None = None,
    started: float | None = None,
    extra: Callable[[Path], None] | None = None,
    formats: Iterable[str] = (),
) -> Path:
    """Write ``result``'s output folder atomically (nothing half-written, ever).

    Writes ``gaussians.ply``, ``renders/NN_<name>.png`` (the known input views rendered),
    ``path/frame_0000.png``, ..., and ``path.mp4`` (:func:`camera_path`), ``cameras.json`` (input
    cameras in the input images' pixels, and the path's), ``sparse/`` (structure-from-motion
    poses), ``cardinality/`` (MoE-cardinality maps) and ``summary.json``.

    Args:
        result: what :func:`reconstruct` returned.
        output: the folder, or an :func:`output_folder` made (and so checked) earlier.
        frames: cameras on the rendered path.
        fps: frame rate of ``path.mp4``.
        backend: renderer backend.
        overwrite: replace an earlier reconstruction output (see :func:`output_folder`).
        inputs: paths the output may neither be, hold nor lie inside.
        summary: more ``summary.json`` entries (e.g. ``weights``, ``input``, ``warnings``).
        started: ``time.perf_counter()`` when the caller's run began (``timings_s.total``;
            default: the sum of the stages).
        extra: called with the staging folder before ``summary.json`` is written, to add
            files of the caller's (e.g. ``models.capture``'s held-out renders).
        formats: more files of the Gaussians, ``gaussians.<suffix>`` (``models.splat_formats``
            names: spz, sog, glb, splat, compressed.ply); ``summary.json`` lists every
            ``gaussians.*`` file with its size under ``formats``.

    Returns:
        The output folder.

    Raises:
        OutputFolderError: the output may not be written or replaced (one line).
    """
    folder = (
        output if isinstance(output, OutputFolder) else output_folder(output, inputs, overwrite)
    )
    timings = dict(result.timings)
    timer = _Timer(timings)
    gaussians = result.gaussians
    device = gaussians.means.device
    shape, known = result.image_size, result.known
    render_names = [f"{i:02d}_{Path(name).stem}.png" for i, name in enumerate(result.names)]
    with folder as staging:
        frame = result.frame
        with timer("save_ply"):  # in the capture's own frame and scale
            moved = transform_gaussians(gaussians, frame.to_capture)
            moved.save_ply(staging / "gaussians.ply")
        written = _save_formats(moved, staging, formats, timer)
        with timer("render_inputs", device), torch.inference_mode():
            rendered = render_views(
                gaussians,
                result.extrinsics[known].to(device),
                result.intrinsics[known].to(device),
                shape,
                backend,
                "input views",
            )
        (staging / "renders").mkdir()
        _save_pngs(rendered, [staging / "renders" / render_names[i] for i in known])

        input_psnr = [psnr(r, result.images[i]) for i, r in zip(known, rendered)]
        cardinality = None
        if "cardinality" in result.maps:
            cardinality = _save_cardinality(
                result.maps["cardinality"], staging / "cardinality", render_names
            )

        path_e, path_k, path_kind = camera_path(result, frames)
        with timer("render_path", device), torch.inference_mode():
            path = render_views(
                gaussians, path_e.to(device), path_k.to(device), shape, backend, "camera path"
            )
        (staging / "path").mkdir()
        _save_pngs(path, [staging / "path" / f"frame_{i:04d}.png" for i in range(len(path))])
        with timer("write_video"):
            _write_video(image_to_uint8(path), staging / "path.mp4", int(fps))

        path_capture = frame.to_capture.cameras(path_e.double().cpu())  # [frames, 4, 4]
        cameras: dict[str, Any] = {
            "frame": "the capture's own frame and scale, as gaussians.ply (OpenCV axes, "
            "camera-to-world); the model ran in view 0's frame divided by "
            f"scene_scale={frame.scale:.6g} ({frame.rule})",
            "scene_scale": float(frame.scale),
            "poses": result.poses,
            "frames": _input_cameras(result, render_names),
            "path": [
                {
                    "render": f"path/frame_{j:04d}.png",
                    **_camera_entry(e, intrinsics_to_pixels(k, shape), shape),
                }
                for j, (e, k) in enumerate(zip(path_capture, path_k))
            ],
        }
        unknown = [n for n, kind in zip(result.names, result.placement) if kind == "unknown"]
        if unknown:
            cameras["unknown_poses"] = unknown
        (staging / "cameras.json").write_text(json.dumps(cameras, indent=2), encoding="utf-8")
        sfm = getattr(result.source, "sfm", None)
        if sfm is not None:  # the COLMAP model, in the capture's frame (as gaussians.ply)
            sfm.export(staging / "sparse", result.names, scene_frame=False)

        if extra is not None:
            extra(staging)
        total = time.perf_counter() - started if started is not None else sum(timings.values())
        timings["total"] = round(total, 4)
        source = getattr(result.source, "source", None)
        record = {
            "model": result.model,
            "family": result.family,
            "pose_free": result.pose_free,
            "input": str(source) if source is not None else None,
            "views": len(result.names),
            "view_names": result.names,
            "image_size": list(shape),
            "recipe": result.recipe_record(),
            "forward_kwargs": dict(result.knobs),
            "gaussians": result.count,
            "poses": result.poses,
            "placement": result.placement,
            "camera_path": f"{frames} frames, {path_kind}",
            "input_view_psnr": [round(p, 3) for p in input_psnr],
            "device": str(device),
            "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "render_backend": backend,
            "timings_s": timings,
            "sfm": sfm.summary() if sfm is not None else None,
            **dict(summary or {}),
        }
        if cardinality is not None:
            record["cardinality"] = cardinality
        record["formats"] = written
        (staging / "summary.json").write_text(json.dumps(record, indent=2), encoding="utf-8")
    result.timings.update(timings)
    return folder.output
