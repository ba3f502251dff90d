"""Inference as a library: images in, a :class:`Reconstruction` out, and its output folder.

    from models import create_model
    from models.pipeline.inference import reconstruct, write_reconstruction
    from datamodules.readers.image_folder import load_images

    model = create_model("zipsplat_tiny", pretrained=True).eval()
    images = load_images("photos/", image_size=(64, 64))    # or a [V, 3, H, W] tensor
    result = reconstruct(model, images, compression=0.5)     # knobs: models.weights.knobs declarations
    write_reconstruction(result, "out/")                     # gaussians.ply, cameras.json, ...

:func:`reconstruct` runs the model once on one window of views and places every view: the given
cameras (``cameras=`` or the image set's own, e.g. from ``cameras.json``, COLMAP or
structure-from-motion), the cameras a pose-free model predicts, or test-time pose fit against
each view's image. It is the one forward path: ``infer.py`` runs it on every photo or, through
``models.pipeline.capture.whole``, once per window; ``view.py`` runs its stages around its live knob runner
(:func:`window_input` → the forward → :func:`place_views` → :func:`window_reconstruction`).
:func:`refine_reconstruction` is the per-scene fit of a reconstruction (through
``models.pipeline.refine.stage.start_refinement``, the one stage that starts a fit).

This module is the public face of inference: the checks and the context batch live in
:mod:`models.pipeline.inference_inputs`, the result types in :mod:`models.pipeline.reconstruction`, the output
folder (``write_reconstruction``) in :mod:`models.pipeline.inference_outputs`; their names are importable
from here. Reading images, videos and poses stays in ``datamodules`` (an ``ImageSet`` is taken by
duck typing); this module imports no Lightning, Hydra or wandb, and no ``datamodules``.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.core.base import ModelOutput
from models.core.gaussians import Gaussians
from models.pipeline.inference_inputs import (
    LoadedModel,
    PreparedContext,
    check_backend,
    check_input,
    check_knobs,
    choose_device,
    input_size,
    load_for_inference,
    model_recipe,
    prepare_context,
    recipe_warnings,
    scene_scale,
)
from models.pipeline.inference_outputs import (
    camera_path,
    output_folder,
    render_views,
    write_reconstruction,
)
from models.pipeline.pose_fit import fit_target_poses
from models.pipeline.reconstruction import (
    CAPTURE_PLACEMENTS,
    PLACEMENTS,
    InferenceError,
    KnobError,
    Reconstruction,
    SceneFrame,
    StageTimer,
    model_name,
    progress,
)
from models.pipeline.refine.stage import start_refinement
from models.weights.input_recipe import InputRecipe

__all__ = [
    "PLACEMENTS",
    "InferenceError",
    "KnobError",
    "LoadedModel",
    "Placement",
    "PreparedContext",
    "Reconstruction",
    "SceneFrame",
    "WindowInput",
    "camera_path",
    "check_backend",
    "check_input",
    "check_knobs",
    "choose_device",
    "input_size",
    "load_for_inference",
    "model_recipe",
    "output_folder",
    "place_views",
    "prepare_context",
    "progress",
    "recipe_warnings",
    "reconstruct",
    "refine_reconstruction",
    "render_views",
    "run_forward",
    "scene_scale",
    "window_input",
    "window_reconstruction",
    "write_reconstruction",
]


# --------------------------------------------------------------------------- one window


@dataclass
class WindowInput:
    """One window's forward input (:func:`window_input`).

    Attributes:
        prepared: the context batch in the scene frame, its names, pose origin and frame.
        context: the batch on the model's device (a pose-free model's cameras left out).
        given: ``[1, V, 4, 4]`` the scene-frame cameras (shown to a posed model, set aside for a
            pose-free one), or ``None``.
        knobs: the inference knobs, checked and converted.
        name: the model's name in messages.
        pose_free: whether the model ignores input cameras.
        device: the model's device.
        images: the ``ImageSet`` (or ``None`` for a tensor of images).
        warnings: where the input or settings left the recipe (one line each).
    """

    prepared: PreparedContext
    context: dict[str, Tensor]
    given: Tensor | None
    knobs: dict[str, Any]
    name: str
    pose_free: bool
    device: torch.device
    images: Any = None
    warnings: list[str] = field(default_factory=list)

    @property
    def views(self) -> int:
        return int(self.context["image"].shape[1])


@dataclass
class Placement:
    """Where every view of a window sits (:func:`place_views`): ``[V, 4, 4]`` camera-to-world
    and ``[V, 3, 3]`` normalised intrinsics in the scene frame, per view how it was placed
    (:data:`PLACEMENTS`) and one line saying so (``summary.json``'s ``poses``)."""

    extrinsics: Tensor
    intrinsics: Tensor
    placement: list[str]
    poses: str


def window_input(
    model: nn.Module,
    images: Any,
    cameras: Mapping[str, Tensor] | None = None,
    *,
    fov: float = 60.0,
    name: str | None = None,
    near: float | None = None,
    far: float | None = None,
    scene_scale: float | None = None,
    recipe: InputRecipe | None = None,
    knobs: Mapping[str, Any] | None = None,
) -> WindowInput:
    """The knobs checked and the context batch of ``images`` prepared (:func:`prepare_context`)
    on the model's device: the first stage of :func:`reconstruct` (arguments as there).

    Raises:
        KnobError: a knob the model does not declare, or a value out of its range.
        InferenceError: a posed model without extrinsics, images of the wrong shape.
    """
    name = name or model_name(model)
    forward = check_knobs(model, dict(knobs or {}), name)
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
    context = prepared.context
    shape = tuple(context["image"].shape[-2:])
    notes = recipe_warnings(prepared.recipe, name, shape, near, far)
    if not pose_free and "extrinsics" not in context:
        raise InferenceError(f"model={name}", "needs camera poses (cameras={'extrinsics': ...})")
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    context = {k: v.to(device) for k, v in context.items()}
    given = context.pop("extrinsics", None) if pose_free else context.get("extrinsics")
    source = None if isinstance(images, Tensor) else images
    return WindowInput(prepared, context, given, forward, name, pose_free, device, source, notes)


def run_forward(
    model: nn.Module, window: WindowInput, timings: dict[str, float] | None = None
) -> ModelOutput:
    """The model's forward pass on ``window`` (``timings["inference"]``: its seconds).

    Raises:
        InferenceError: the model refuses the input (e.g. its image size), or no Gaussians.
    """
    timer = StageTimer(timings if timings is not None else {})
    with timer("inference", window.device), torch.inference_mode():
        for _ in progress(range(1), desc="inference", unit="forward"):
            try:
                pred = model(window.context, **window.knobs)
            except ValueError as error:  # the model refuses this input (e.g. its image size)
                raise InferenceError(f"model={window.name}", str(error)) from error
    if int(pred.gaussians.count()[0]) == 0:
        source = getattr(window.images, "source", "images")
        raise InferenceError(source, f"model {window.name} produced no Gaussians for this input")
    return pred


def place_views(
    window: WindowInput,
    pred: ModelOutput,
    *,
    pose_fit_steps: int = 0,
    pose_fit_size: int = 128,
    backend: str = "auto",
    timings: dict[str, float] | None = None,
) -> Placement:
    """Every view of ``window`` placed in the scene frame: the given cameras (a posed model),
    the cameras a pose-free model predicts, the given ones it did not see, else view 0 the
    identity and views 1.. by test-time pose fit (``pose_fit_steps`` > 0, :func:`_fit_poses`) or
    unknown."""
    views, name, given = window.views, window.name, window.given
    origin, label = window.prepared.origin, window.prepared.label
    intrinsics = window.context["intrinsics"][0].float()  # [V, 3, 3]
    predicted_e = pred.extrinsics  # [1, V, 4, 4] cameras a pose-free model predicts, or None
    if not window.pose_free:
        return Placement(given[0].float(), intrinsics, [origin] * views, f"input ({label})")
    if isinstance(predicted_e, Tensor):
        if isinstance(pred.intrinsics, Tensor):
            intrinsics = pred.intrinsics[0].float()
        placement = ["identity"] + ["predicted"] * (views - 1)
        return Placement(predicted_e[0].float(), intrinsics, placement, f"predicted by {name}")
    if given is not None:
        # The model saw no poses; its scene frame is the same normalised frame (view 0 =
        # identity, unit baseline), so the given cameras render it.
        poses = f"input ({label}); pose-free {name} does not predict cameras"
        return Placement(given[0].float(), intrinsics, [origin] * views, poses)
    if views > 1 and int(pose_fit_steps) > 0:
        return _fit_poses(
            window, pred.gaussians.detach(), intrinsics, int(pose_fit_steps), pose_fit_size,
            backend, timings,
        )  # fmt: skip
    extrinsics = torch.eye(4, device=window.device).expand(views, 4, 4).clone()
    placement = ["identity"] + ["unknown"] * (views - 1)
    return Placement(
        extrinsics, intrinsics, placement, f"unknown (pose-free {name} does not predict cameras)"
    )


def _fit_poses(
    window: WindowInput,
    gaussians: Gaussians,
    intrinsics: Tensor,
    steps: int,
    pose_fit_size: int,
    backend: str,
    timings: dict[str, float] | None,
) -> Placement:
    """Views 1.. by test-time pose fit (as eval does for pose-free models), each from view 0's
    pose, against its own image (at most ``pose_fit_size`` pixels) with the Gaussians frozen."""
    views = window.views
    extrinsics = torch.eye(4, device=window.device).expand(views, 4, 4).clone()
    targets = window.context["image"][:, 1:].float()  # [1, V-1, 3, H, W]
    if max(targets.shape[-2:]) > pose_fit_size:  # intrinsics are normalised
        factor = pose_fit_size / max(targets.shape[-2:])
        small = [max(8, round(n * factor)) for n in targets.shape[-2:]]
        targets = F.interpolate(targets[0], size=small, mode="area")[None]
    with StageTimer(timings if timings is not None else {})("pose_fit", window.device):
        extrinsics[1:] = fit_target_poses(
            gaussians,
            targets,
            extrinsics[None, 1:],
            intrinsics[None, 1:],
            steps=steps,
            backend=backend,
            announce=True,
        )[0]
    poses = (
        f"refined: pose-free {window.name} predicts no cameras; views 1.. placed by "
        f"test-time pose fit ({steps} steps from view 0's pose, at "
        f"{targets.shape[-1]}x{targets.shape[-2]} px)"
    )
    return Placement(extrinsics, intrinsics, ["identity"] + ["refined"] * (views - 1), poses)


def window_reconstruction(
    model: nn.Module,
    window: WindowInput,
    pred: ModelOutput,
    placed: Placement,
    timings: dict[str, float] | None = None,
) -> Reconstruction:
    """The :class:`Reconstruction` of one window's forward output and placement (the scene
    frame; per-family maps such as MoE-cardinality's Gaussians per pixel)."""
    maps = {}
    routing = pred.diagnostics.get("routing_map")  # [1, V, H, W] MoE-cardinality: per pixel
    if isinstance(routing, Tensor):
        maps["cardinality"] = routing[0].detach().to(torch.int64).cpu()  # [V, H, W]
    prepared = window.prepared
    return Reconstruction(
        gaussians=pred.gaussians.detach(),
        extrinsics=placed.extrinsics.detach(),
        intrinsics=placed.intrinsics.detach(),
        placement=placed.placement,
        poses=placed.poses,
        images=window.context["image"][0].detach().float().cpu(),
        names=prepared.names,
        model=window.name,
        family=getattr(model, "family", None),
        pose_free=window.pose_free,
        knobs=dict(window.knobs),
        timings=dict(timings or {}),
        maps=maps,
        source=window.images,
        frame=prepared.frame,
        recipe=prepared.recipe,
        warnings=list(window.warnings),
    )


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
    """Reconstruct the Gaussians of ``images`` (one window) with ``model`` and place every view.

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
        **knobs: the family's inference knobs (``models.weights.knobs``), e.g. ``compression=0.5``,
            ``iterations=4``, ``gaussians_per_pixel=1.0``, ``max_gaussians=20000``.

    Returns:
        The :class:`Reconstruction`.

    Raises:
        KnobError: a knob the model does not declare, or a value out of its range.
        InferenceError: a posed model without extrinsics, images of the wrong shape, a model
            refusing the input (e.g. its image size), or no Gaussians at all.
    """
    window = window_input(
        model, images, cameras, fov=fov, name=name, near=near, far=far,
        scene_scale=scene_scale, recipe=recipe, knobs=knobs,
    )  # fmt: skip
    for note in window.warnings:
        warnings.warn(note, stacklevel=2)
    timings: dict[str, float] = {}
    pred = run_forward(model, window, timings)
    placed = place_views(
        window, pred, pose_fit_steps=pose_fit_steps, pose_fit_size=pose_fit_size,
        backend=backend, timings=timings,
    )  # fmt: skip
    return window_reconstruction(model, window, pred, placed, timings)


# --------------------------------------------------------------------------- refinement


def _cameras_to_refine(result: Reconstruction) -> bool:
    """A fit refines the cameras of a pose-free model's views, not the capture's own: a pose-free
    model on posed photos keeps them (refined, they drifted away from the held-out photos'
    cameras: 6 dB lost on the drone capture with ``zipsplat_tiny``, docs/refine.md)."""
    return bool(result.pose_free) and any(k not in CAPTURE_PLACEMENTS for k in result.placement)


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
    keep: int = 0,
) -> tuple[Reconstruction, Any]:
    """Per-scene refinement after the feed-forward pass (``models.pipeline.refine``, docs/refine.md).

    The Gaussians are optimised against the input photos at their cameras (posed: the given /
    structure-from-motion ones; pose-free: the predicted or placed ones, refined jointly), in
    the reconstruction's frame.

    Args:
        result: what :func:`reconstruct` (or ``models.pipeline.capture.whole``) returned.
        photos: ``[V, 3, H, W]`` the photos of ``result.names``, in that order, at any size
            (fitted at ``settings.size`` on the long side); never a held-out photo.
        settings: a ``models.pipeline.refine.RefineSettings``.
        intrinsics: ``[V, 3, 3]`` normalised for ``photos`` (``None``: ``result.intrinsics``,
            which hold only for photos cropped as the model's input).
        holdout: held-out views (``models.pipeline.capture.holdout.HoldoutViews``: ``images``,
            ``extrinsics``, ``intrinsics`` in the result's frame) scored along the fit for the
            curve (``RefineResult.evaluations``), at their own size.
        start: the Gaussians to start from in the result's frame (``None``: the feed-forward
            ones; e.g. ``models.pipeline.refine.gaussians_from_points`` of the SfM points).
        optimize_cameras: refine the cameras jointly (``None``: when the views were placed by a
            pose-free model, predicted or fitted, not given with the photos or found by
            structure-from-motion: those cameras are the capture's, which the held-out photos'
            cameras share).
        checkpoint_path: the fit's state file (saved every ``settings.checkpoint_every`` steps;
            a rerun resumes from it).
        progress: show the fit's progress bar.
        keep: a time budget never prunes the start below this many Gaussians (the SfM points
            it holds).

    Returns:
        ``(refined, refine_result)``: the reconstruction with the refined Gaussians (and
        cameras) and the ``models.pipeline.refine.RefineResult`` (``summary()`` is ``summary.json``'s
        ``refine``; ``stopped == "interrupted"`` after Ctrl-C).

    Raises:
        InferenceError: a view without a camera (one line).
        models.pipeline.refine.RefineSettingsError: one line naming the argument.
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
    joint = _cameras_to_refine(result) if optimize_cameras is None else bool(optimize_cameras)
    fitted = start_refinement(
        gaussians.to(device),
        photos,
        result.extrinsics,
        camera_k,
        settings,
        holdout=holdout,
        optimize_cameras=joint,
        checkpoint_path=checkpoint_path,
        progress=progress,
        keep=keep,
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
