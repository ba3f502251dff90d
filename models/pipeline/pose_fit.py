"""Test-time pose fit for pose-free models (NoPoSplat/ZipSplat evaluation).

A pose-free model predicts Gaussians in the frame of its first context view, up to errors in the
scale and pose of that frame, so the ground-truth target cameras do not quite line up with the
prediction. Before scoring, each target camera's pose is optimised with the Gaussians frozen: a
6-DoF delta (axis-angle rotation and translation, both in the camera's own frame) on the
camera-to-world matrix, fitted with Adam to the target image by a photometric loss. The pose with
the lowest loss seen is returned per camera, so the fit never makes the poses worse.

The ground-truth target poses are in this project's scene frame (context view 0 = identity, unit
context baseline), but a pose-free model's frame need not be: a released model (ZipSplat's, for
one) normalises its scene by its own rule (median depth), so its frame differs from the scene frame
by a similarity. Fitting the target poses from their scene-frame values then starts at the wrong
translation scale and gets stuck. ``place_targets`` first places the *context* views in the
model's frame (a coarse search over the scale, then the same fit against their own images),
fits the similarity between those placed poses and the known context poses
(``models.geometry.similarity.fit_cameras``), maps the target poses' initial values through it
into the model's frame and fits them there. Nothing in it depends on a family: it needs only the predicted Gaussians, the
context images and their known poses.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
from torch import Tensor

from models.core import budget
from models.core.gaussians import Gaussians
from models.geometry.similarity import CAMERA_FITS, Similarity, fit_cameras
from models.render.core import render

__all__ = [
    "ContextPlacement",
    "TargetPlacement",
    "fit_target_poses",
    "place_context_views",
    "place_targets",
    "pose_error",
    "se3_delta",
]


def _skew(vector: Tensor) -> Tensor:
    """``[..., 3]`` to skew-symmetric ``[..., 3, 3]`` matrices."""
    x, y, z = vector.unbind(-1)
    zero = torch.zeros_like(x)
    return torch.stack(
        [
            torch.stack([zero, -z, y], dim=-1),
            torch.stack([z, zero, -x], dim=-1),
            torch.stack([-y, x, zero], dim=-1),
        ],
        dim=-2,
    )


def se3_delta(rotation: Tensor, translation: Tensor) -> Tensor:
    """4x4 rigid transforms ``[..., 4, 4]`` from axis-angle ``[..., 3]`` and translation ``[..., 3]``.

    The rotation is ``exp([rotation]_x)`` (exact and differentiable at zero).
    """
    delta = torch.zeros(*rotation.shape[:-1], 4, 4, dtype=rotation.dtype, device=rotation.device)
    delta[..., :3, :3] = torch.linalg.matrix_exp(_skew(rotation))
    delta[..., :3, 3] = translation
    delta[..., 3, 3] = 1.0
    return delta


def pose_error(estimate: Tensor, reference: Tensor) -> tuple[Tensor, Tensor]:
    """Rotation (degrees) and translation (world units) error between camera-to-world matrices.

    Args:
        estimate: ``[..., 4, 4]``.
        reference: ``[..., 4, 4]``.

    Returns:
        ``[...]`` rotation angle of ``R_ref^T R_est`` in degrees and ``[...]`` centre distance.
    """
    relative = reference[..., :3, :3].transpose(-1, -2) @ estimate[..., :3, :3]
    trace = relative.diagonal(dim1=-2, dim2=-1).sum(-1)
    angle = torch.acos(((trace - 1.0) / 2.0).clamp(-1.0, 1.0)) * (180.0 / math.pi)
    distance = (estimate[..., :3, 3] - reference[..., :3, 3]).norm(dim=-1)
    return angle, distance


def _photometric(rendered: Tensor, target: Tensor, loss: str) -> Tensor:
    """Per-camera loss ``[B, V]`` of images ``[B, V, 3, H, W]``."""
    if loss == "mse":
        return (rendered - target).pow(2).mean(dim=(-3, -2, -1))
    if loss == "l1":
        return (rendered - target).abs().mean(dim=(-3, -2, -1))
    raise ValueError(f"loss must be 'mse' or 'l1', got {loss!r}")


def _check_shapes(image: Tensor, extrinsics: Tensor, intrinsics: Tensor) -> torch.Size:
    """``image``'s shape ``[B, V, 3, H, W]``, with cameras of the same ``B, V``."""
    if image.ndim != 5 or image.shape[2] != 3:
        raise ValueError(f"image must be [B, V, 3, H, W], got {tuple(image.shape)}")
    b, v = image.shape[:2]
    if tuple(extrinsics.shape) != (b, v, 4, 4) or tuple(intrinsics.shape) != (b, v, 3, 3):
        raise ValueError(
            f"extrinsics [B, V, 4, 4] and intrinsics [B, V, 3, 3] must match image {(b, v)}, got "
            f"{tuple(extrinsics.shape)} and {tuple(intrinsics.shape)}"
        )
    return image.shape


@torch.no_grad()
def _pivot_point(frozen, start, intrinsics, size, background, backend) -> Tensor:
    """``[B, V, 3]``: a point on each camera's axis at the median rendered depth of its start
    pose (1 where nothing renders), the pivot the pose fit rotates about."""
    first = render(frozen, start, intrinsics, size, background=background, backend=backend)
    depth = first.depth / first.alpha.clamp_min(1e-6)  # [B, V, H, W]
    masked = torch.where(first.alpha > 0.5, depth, torch.full_like(depth, float("nan")))
    median = masked.flatten(2).nanmedian(dim=-1).values  # [B, V]
    median = torch.where(torch.isfinite(median), median, torch.ones_like(median))
    point = torch.zeros(*median.shape, 3, device=start.device, dtype=start.dtype)
    point[..., 2] = median
    return point


def fit_target_poses(
    gaussians: Gaussians,
    image: Tensor,
    extrinsics: Tensor,
    intrinsics: Tensor,
    steps: int = 100,
    lr: float = 1e-2,
    backend: str = "auto",
    *,
    translation_lr: float | None = None,
    loss: str = "mse",
    background: Tensor | None = None,
    min_lr_fraction: float = 0.1,
    pivot: bool = True,
    announce: bool | str = False,
) -> Tensor:
    """Optimise each target camera's pose against its image with the Gaussians frozen.

    Args:
        gaussians: the prediction (``B`` scenes); it is detached, never modified.
        image: ``[B, V, 3, H, W]`` target images in [0, 1].
        extrinsics: ``[B, V, 4, 4]`` initial camera-to-world poses (scene frame).
        intrinsics: ``[B, V, 3, 3]`` normalised (kept fixed).
        steps: Adam steps (0 returns the input poses).
        lr: learning rate of the axis-angle rotation delta (radians).
        backend: renderer backend (``"auto"``, ``"torch"``, ``"gsplat"``).
        translation_lr: learning rate of the translation delta (scene units); defaults to ``lr``.
        loss: ``"mse"`` or ``"l1"``.
        background: ``[B, 3]`` or ``[3]`` background colour for the renderer (black when None).
        min_lr_fraction: the learning rate decays with a cosine to this fraction of its start.
        pivot: rotate each camera about a point on its optical axis at the median rendered depth
            (measured at the initial pose) instead of about its centre. This decouples rotation
            from translation (a rotation about the scene no longer looks like a sideways shift),
            which converges several times faster than rotating about the centre.
        announce: say on stderr (a string: the fit's name in the line, else ``pose fit``), after
            three steps, how long the rest will take from the steps' measured times, and again
            when that turns out off by more than 2x (:class:`models.core.budget.Countdown`; from
            ``models.core.budget.BIG_SECONDS`` on: one step's time swung 3-10x on the loaded
            shared machine).

    Returns:
        ``[B, V, 4, 4]`` refined camera-to-world poses (detached): per camera the pose with the
        lowest photometric loss among the initial pose and every step's pose.
    """
    b, v, _, h, w = _check_shapes(image, extrinsics, intrinsics)
    if steps <= 0:
        return extrinsics.detach().clone()

    # Evaluation runs under inference_mode; clones made outside it are ordinary tensors.
    with torch.inference_mode(False), torch.enable_grad():
        dtype = torch.promote_types(gaussians.dtype, torch.float32)  # never optimise in half
        frozen = gaussians.map(lambda t: t.detach().clone()).to(dtype)
        target = image.detach().clone().to(frozen.dtype)
        start = extrinsics.detach().clone().to(frozen.dtype)
        intrinsics = intrinsics.detach().clone().to(frozen.dtype)
        if background is not None:
            background = background.detach().clone()

        rotation = torch.zeros(b, v, 3, device=start.device, dtype=start.dtype, requires_grad=True)
        translation = torch.zeros_like(rotation, requires_grad=True)
        optimizer = torch.optim.Adam(
            [
                {"params": [rotation], "lr": lr},
                {"params": [translation], "lr": lr if translation_lr is None else translation_lr},
            ]
        )
        base_lrs = [group["lr"] for group in optimizer.param_groups]

        pivot_point = None
        if pivot:
            pivot_point = _pivot_point(frozen, start, intrinsics, (h, w), background, backend)
        best_loss = torch.full((b, v), float("inf"), device=start.device, dtype=start.dtype)
        best_pose = start.clone()
        label = announce if isinstance(announce, str) else "pose fit"
        what = f"{label}: {steps} steps of {v} cameras at {w}x{h} px"
        countdown = budget.Countdown(what, steps, "step") if announce else None
        started = time.perf_counter()
        for step in range(steps + 1):
            pose = _moved_pose(start, rotation, translation, pivot_point)  # [B, V, 4, 4]
            out = render(frozen, pose, intrinsics, (h, w), background=background, backend=backend)
            per_camera = _photometric(out.color, target, loss)  # [B, V]
            with torch.no_grad():
                better = per_camera < best_loss
                best_loss = torch.where(better, per_camera, best_loss)
                best_pose = torch.where(better[..., None, None], pose, best_pose)
            if step == steps:
                break  # the last evaluation only scores the final pose
            optimizer.zero_grad(set_to_none=True)
            # Sum over cameras: each pose's gradient is its own camera's loss gradient.
            per_camera.sum().backward()
            optimizer.step()
            if countdown is not None:
                countdown.done(time.perf_counter() - started)
                started = time.perf_counter()
            _cosine_decay(optimizer, base_lrs, step + 1, steps, min_lr_fraction)
    return best_pose.detach().to(extrinsics.dtype)


def _moved_pose(
    start: Tensor, rotation: Tensor, translation: Tensor, pivot_point: Tensor | None
) -> Tensor:
    """``start`` ``[B, V, 4, 4]`` moved by the delta, which acts in the camera frame and rotates
    about ``pivot_point`` ``[B, V, 3]`` when given: c2w' = c2w @ delta."""
    delta = se3_delta(rotation, translation)  # [B, V, 4, 4]
    if pivot_point is not None:
        shift = pivot_point - torch.einsum("bvij,bvj->bvi", delta[..., :3, :3], pivot_point)
        delta = delta.clone()
        delta[..., :3, 3] = delta[..., :3, 3] + shift
    return start @ delta


def _cosine_decay(optimizer, base_lrs: list[float], step: int, steps: int, floor: float) -> None:
    """Each group's learning rate after ``step`` of ``steps``: a cosine from its base down to
    ``floor`` times it."""
    factor = floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * step / steps))
    for group, base in zip(optimizer.param_groups, base_lrs):
        group["lr"] = base * factor


# ---------------------------------------------------------------------- frame alignment
def _scaled(gaussians: Gaussians, factor: Tensor) -> Gaussians:
    """The Gaussians with every length multiplied by ``factor [B]`` (exact for any SH degree)."""
    f = factor.to(gaussians.means.dtype)[:, None, None]
    return gaussians.replace(means=gaussians.means * f, scales=gaussians.scales * f)


def _scale_translation(extrinsics: Tensor, factor: Tensor) -> Tensor:
    out = extrinsics.clone()
    out[..., :3, 3] = out[..., :3, 3] * factor[:, None, None].to(out.dtype)
    return out


@dataclass(frozen=True)
class ContextPlacement:
    """What ``place_context_views`` found: the similarity from the scene frame into the model's
    frame and the context cameras placed in the model's frame.

    Attributes:
        to_model: batch ``[B]``: ``x_model = scale * rotation @ x_scene + translation`` (scale in
            model units per scene unit).
        context_extrinsics: ``[B, Vc, 4, 4]`` context cameras placed (fitted) in the model's frame.
        residual: ``[B]`` RMS distance between the placed context centres and the known ones
            mapped through the similarity, in scene units (how well one similarity explains them).
        mode: the ``CAMERA_FITS`` entry used.
    """

    to_model: Similarity
    context_extrinsics: Tensor
    residual: Tensor
    mode: str


@dataclass(frozen=True)
class TargetPlacement:
    """Result of ``place_targets``.

    Attributes:
        initial: ``[B, Vt, 4, 4]`` the targets' ground-truth poses mapped into the model's frame
            (the refinement's start).
        refined: ``[B, Vt, 4, 4]`` the refined target poses in the model's frame (render these).
        frame: the alignment between the scene frame and the model's frame.
    """

    initial: Tensor
    refined: Tensor
    frame: ContextPlacement


def _scale_candidates(dtype: torch.dtype, device: torch.device) -> Tensor:
    """Scales tried by the coarse search: 1/64 .. 64 in steps of sqrt(2) (25 values)."""
    return torch.pow(2.0, torch.arange(-12, 13, dtype=dtype, device=device) / 2)


def place_context_views(
    gaussians: Gaussians,
    image: Tensor,
    extrinsics: Tensor,
    intrinsics: Tensor,
    steps: int = 100,
    backend: str = "auto",
    *,
    alignment: str = "similarity",
    background: Tensor | None = None,
    scales: Tensor | None = None,
    **fit_kwargs,
) -> ContextPlacement:
    """Place the context views in a pose-free model's frame and fit the scene-to-model similarity.

    1. Coarse scale: the known context poses, scaled about the scene origin by each of ``scales``
       (default 1/64 .. 64), are rendered; per scene the scale with the lowest photometric loss
       over the context views is kept (``alignment="none"`` skips this: scale 1).
    2. The context poses at that scale are refined against their own images
       (``fit_target_poses``), with the Gaussians rescaled by the inverse scale so that the
       refinement's step sizes act in scene units.
    3. ``models.geometry.similarity.fit_cameras`` between the known context poses and the placed ones gives the alignment.

    Args:
        gaussians: the prediction for these ``B`` scenes, in the model's frame.
        image: ``[B, Vc, 3, H, W]`` the context images the model saw.
        extrinsics: ``[B, Vc, 4, 4]`` their known camera-to-world poses (scene frame).
        intrinsics: ``[B, Vc, 3, 3]`` normalised.
        steps: refinement steps of step 2 (0: the coarse scale only).
        backend: renderer backend.
        alignment: ``"similarity"`` (scale, rotation, translation), ``"scale"`` (scale only,
            origins kept) or ``"none"`` (the model's frame is taken to be the scene frame).
        background: renderer background (``[B, 3]`` or ``[3]``).
        scales: ``[S]`` candidate scales of step 1.
        **fit_kwargs: more keywords of ``fit_target_poses`` (``lr``, ``loss``, ...).

    Returns:
        The ``ContextPlacement``.
    """
    if alignment not in CAMERA_FITS:
        raise ValueError(f"alignment must be one of {', '.join(CAMERA_FITS)}, got {alignment!r}")
    b, v = image.shape[:2]
    with torch.inference_mode(False), torch.no_grad():
        dtype = torch.promote_types(gaussians.dtype, torch.float32)
        frozen = gaussians.map(lambda t: t.detach().clone()).to(dtype)
        known = extrinsics.detach().clone().to(dtype)
        intrinsics = intrinsics.detach().clone().to(dtype)
        target = image.detach().clone().to(dtype)
        if background is not None:
            background = background.detach().clone()
        ones = torch.ones(b, dtype=dtype, device=known.device)
        if alignment == "none":
            coarse = ones
        else:
            candidates = _scale_candidates(dtype, known.device) if scales is None else scales
            losses = []
            for s in candidates.to(dtype=dtype, device=known.device):
                out = render(
                    frozen,
                    _scale_translation(known, ones * s),
                    intrinsics,
                    tuple(image.shape[-2:]),
                    background=background,
                    backend=backend,
                )
                losses.append(_photometric(out.color, target, "mse").mean(dim=1))  # [B]
            best = torch.stack(losses, dim=1).argmin(dim=1)  # [B]
            coarse = candidates.to(dtype=dtype, device=known.device)[best]
        # Refine in units where the scene has (about) its scene-frame size.
        units = _scaled(frozen, 1.0 / coarse)
    placed = fit_target_poses(
        units,
        target,
        known,
        intrinsics,
        steps=steps if alignment != "none" else 0,
        backend=backend,
        background=background,
        **fit_kwargs,
    )
    with torch.inference_mode(False), torch.no_grad():
        fitted = fit_cameras(known, placed, alignment)
        mapped = fitted.cameras(known)
        residual = (mapped[..., :3, 3] - placed[..., :3, 3]).pow(2).sum(-1).mean(-1).sqrt()
        to_model = Similarity.scaling(coarse, torch.zeros_like(fitted.translation)) @ fitted
        return ContextPlacement(
            to_model=to_model,
            context_extrinsics=_scale_translation(placed, coarse),
            residual=residual / fitted.scale,
            mode=alignment,
        )


def place_targets(
    gaussians: Gaussians,
    context: dict[str, Tensor],
    target: dict[str, Tensor],
    steps: int = 100,
    backend: str = "auto",
    *,
    alignment: str = "similarity",
    context_steps: int | None = None,
    background: Tensor | None = None,
    **fit_kwargs,
) -> TargetPlacement:
    """Target poses for scoring a pose-free model: aligned into its frame, then refined.

    ``place_context_views`` finds the similarity between the scene frame and the model's frame
    from the context views; the targets' ground-truth poses are mapped through it and refined
    (``fit_target_poses``) in the model's frame, with the Gaussians rescaled by the inverse
    scale so that the step sizes act in scene units. With ``alignment="none"`` this is the plain
    refinement from the scene-frame poses.

    Args:
        gaussians: the prediction (``B`` scenes) in the model's frame.
        context: ``image [B, Vc, 3, H, W]``, ``extrinsics [B, Vc, 4, 4]`` (known, scene frame),
            ``intrinsics [B, Vc, 3, 3]``.
        target: the same keys for the ``Vt`` target views (extrinsics: ground truth, scene frame).
        steps: refinement steps of the targets.
        backend: renderer backend.
        alignment: see ``place_context_views``.
        context_steps: refinement steps of the context views (default ``steps``).
        background: renderer background.
        **fit_kwargs: more keywords of ``fit_target_poses``.

    Returns:
        ``TargetPlacement`` (poses in the model's frame, detached).
    """
    frame = place_context_views(
        gaussians,
        context["image"],
        context["extrinsics"],
        context["intrinsics"],
        steps=steps if context_steps is None else context_steps,
        backend=backend,
        alignment=alignment,
        background=background,
        **fit_kwargs,
    )
    with torch.inference_mode(False), torch.no_grad():
        scale = frame.to_model.scale  # [B]
        dtype = scale.dtype
        initial = frame.to_model.cameras(target["extrinsics"].detach().clone().to(dtype))
        units = _scaled(gaussians.map(lambda t: t.detach().clone()).to(dtype), 1.0 / scale)
        start = _scale_translation(initial, 1.0 / scale)
    refined = fit_target_poses(
        units,
        target["image"].detach().clone(),
        start,
        target["intrinsics"].detach().clone(),
        steps=steps,
        backend=backend,
        background=background,
        **fit_kwargs,
    )
    with torch.inference_mode(False), torch.no_grad():
        refined = _scale_translation(refined.to(dtype), scale)
    out_dtype = target["extrinsics"].dtype
    return TargetPlacement(
        initial=initial.to(out_dtype), refined=refined.to(out_dtype), frame=frame
    )
