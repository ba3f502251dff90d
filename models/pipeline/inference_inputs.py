"""Everything a forward pass needs before it runs: the device and renderer backend, the knobs
checked against the family's declarations, the model and its weights, its input recipe (input
size, near/far, the scene-scale rule) and the context batch in the scene frame
(:func:`prepare_context`). ``models.pipeline.inference`` re-exports these names.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from models.geometry.cameras import camera_centers, project
from models.geometry.similarity import Similarity
from models.pipeline.reconstruction import InferenceError, KnobError, SceneFrame, model_name
from models.render.cpu import cpu_rasterizer_error
from models.weights.factory import create_model
from models.weights.hub import weights_location
from models.weights.input_recipe import (
    BASELINE_DEPTH_RATIO,
    MAX_UPSAMPLE,
    InputRecipe,
    fallback_recipe,
    parse_image_size,
)
from models.weights.knobs import Knob, inference_knobs
from models.weights.registry import get_pretrained_cfg, is_model, list_models

__all__ = [
    "LoadedModel",
    "PreparedContext",
    "check_backend",
    "check_input",
    "check_knobs",
    "choose_device",
    "input_size",
    "load_for_inference",
    "model_recipe",
    "prepare_context",
    "recipe_warnings",
    "scene_scale",
]

REPO_ROOT = Path(__file__).resolve().parents[2]


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
    """``knobs`` checked against what the model's family declares (``models.weights.knobs``).

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
    shown = name or (model if isinstance(model, str) else model_name(model))
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
    architecture's default tag, else :func:`~models.weights.input_recipe.fallback_recipe` (the size it
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
    than ``max_upsample`` times (:data:`~models.weights.input_recipe.MAX_UPSAMPLE`). This project's own
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
      :data:`~models.weights.input_recipe.BASELINE_DEPTH_RATIO` taken as that median depth.

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
