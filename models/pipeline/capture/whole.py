"""A whole capture, or a chosen part of it, reconstructed and scored.

    images, notes = load_inputs("photos/", 64, model)                # every photo and its pose
    plan = plan_capture(images, model, views="all", holdout=8)       # windows + held-out photos
    print(capture_estimate(model, plan, device).line())              # windows, time, memory
    capture = reconstruct_capture(model, plan)                       # windows fused, scored
    write_capture(capture, "out/")                                   # infer.py's output folder

:func:`plan_capture` decides which photos go into which forward pass: ``views=N`` one window of
``N`` overlapping views around ``center_view`` (:func:`models.pipeline.capture.views.select_views`),
``views="all"`` overlapping windows of the model's view count covering every photo
(:func:`~models.pipeline.capture.views.cover_windows`), ``views=None`` every photo in one window. Held-out
photos (:mod:`models.pipeline.capture.holdout`) never enter a window. Photos the structure-from-motion points
do not connect to the largest group are left out with a warning (or, when that group holds under
half the photos, refused).
:func:`reconstruct_capture` runs ``models.pipeline.inference.reconstruct`` per window (a progress bar),
moves every window into the capture frame and fuses them (:mod:`models.pipeline.capture.fusion`), then
scores the held-out photos. :func:`write_capture` writes it with
``models.pipeline.inference.write_reconstruction`` (atomic) plus ``renders/holdout/`` and
``holdout_sheet.png``.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from datamodules.errors import InputError
from models.core import budget
from models.core.gaussians import Gaussians, transform_gaussians
from models.geometry.cameras import transform_points, world_to_camera
from models.geometry.similarity import Similarity
from models.pipeline.capture import fusion
from models.pipeline.capture import holdout as holdout_lib
from models.pipeline.capture import views as view_lib
from models.pipeline.inference import (
    Reconstruction,
    SceneFrame,
    progress,
    reconstruct,
    write_reconstruction,
)
from models.weights.registry import get_pretrained_cfg

__all__ = [
    "CaptureError",
    "CaptureFrame",
    "CapturePlan",
    "CaptureResult",
    "PlacedWindows",
    "align_depth",
    "capture_estimate",
    "capture_frame_of",
    "fused_reconstruction",
    "held_out_views",
    "place_window",
    "plan_capture",
    "reconstruct_capture",
    "reconstruct_windows",
    "scene_summary",
    "subset",
    "window_size",
    "window_step",
    "write_capture",
]


class CaptureError(InputError):
    """A capture or setting that cannot be reconstructed as asked (one line)."""


def subset(images: Any, indices: list[int]) -> Any:
    """The ``ImageSet`` of ``indices`` only (poses, sizes, names, the views at a second size;
    the SfM result rides along)."""
    pick = lambda t: None if t is None else t[indices]  # noqa: E731
    fit = getattr(images, "fit", None)
    return dataclasses.replace(
        images,
        images=images.images[indices],
        names=[images.names[i] for i in indices],
        original_sizes=[images.original_sizes[i] for i in indices],
        extrinsics=pick(images.extrinsics),
        intrinsics=pick(images.intrinsics),
        fit=None if fit is None else subset(fit, indices),
    )


def window_size(model: nn.Module, name: str) -> int:
    """Views per window for ``views=all``: the release's recipe (``recipe.views``), else its
    pretrained config's ``views``, else 2; at least the model's ``min_views``."""

    cfg = get_pretrained_cfg(name)
    recipe = getattr(cfg, "recipe", None) if cfg is not None else None
    size = getattr(recipe, "views", None) or getattr(cfg, "views", None) or 2
    return max(int(size), int(getattr(model, "min_views", 1)))


@dataclass
class CapturePlan:
    """Which photos go where.

    Attributes:
        images: every loaded photo (an ``ImageSet``).
        graph: their overlap (:class:`~models.pipeline.capture.views.ViewGraph`).
        used: indices of the photos reconstructed (in some window), capture order.
        held: indices of the held-out photos.
        windows: indices per window.
        center: the centre view's index.
        mode: ``"all"``, ``"views"`` (``views=N``) or ``"every"`` (all photos in one window).
        size: views per window.
        name: the model's name.
        notes: warnings (one line each).
    """

    images: Any
    graph: view_lib.ViewGraph
    used: list[int]
    held: list[int]
    windows: list[list[int]]
    center: int
    mode: str
    size: int
    name: str
    notes: list[str] = field(default_factory=list)

    def names(self, indices: list[int]) -> list[str]:
        return [self.images.names[i] for i in indices]


def _shown(names: list[str], count: int = 8) -> str:
    more = f" and {len(names) - count} more" if len(names) > count else ""
    return ", ".join(names[:count]) + more


def plan_capture(
    images: Any,
    model: nn.Module,
    *,
    views: int | str | None = None,
    center_view: str | None = None,
    holdout: Any = None,
    name: str | None = None,
) -> CapturePlan:
    """Windows and held-out photos for ``images`` (module doc).

    Raises:
        CaptureError / HoldoutError / ViewError: one line (the largest connected group is under
        half the photos; ``holdout`` leaves fewer photos than one window needs; an unknown
        ``center_view``; ``views`` not a count nor ``all``).
    """
    name = name or str(getattr(model, "registry_name", None) or type(model).__name__)
    pose_free = bool(getattr(model, "pose_free", False))
    names = list(images.names)
    notes: list[str] = []
    mode = "every" if views is None else "all" if str(views) == "all" else "views"
    if mode == "views" and not str(views).isdigit():
        raise CaptureError(f"views={views}: must be a whole number >= 1 or all")
    held = holdout_lib.holdout_indices(holdout, names)
    graph = view_lib.view_graph(images, pose_free)
    candidates = [i for i in range(len(names)) if i not in held]
    sfm = getattr(images, "sfm", None)
    total = len(names) + (len(sfm.missing) if sfm is not None else 0)
    groups = view_lib.components(graph, candidates)
    largest = groups[0] if groups else []
    if (sfm is not None and len(names) * 2 < total) or len(largest) * 2 < len(candidates):
        kept = len(largest) if len(largest) * 2 < len(candidates) else len(names)
        raise CaptureError(
            f"{images.source}: structure-from-motion connects only {kept} of {total} photos "
            f"into one group (under half); take more overlapping photos or check the others"
        )
    if len(groups) > 1:
        rest = sorted(i for g in groups[1:] for i in g)
        notes.append(
            f"{images.source}: {len(rest)} photo(s) share no structure-from-motion points with "
            f"the largest group of {len(largest)} and are left out: {_shown([names[i] for i in rest])}"
        )
    used_pool = largest
    size = window_size(model, name)
    minimum = size if mode == "all" else max(1, int(getattr(model, "min_views", 1)))
    if len(used_pool) < minimum:
        what = f"holdout={holdout} leaves" if held else "the capture has"
        raise holdout_lib.HoldoutError(
            f"{what} {len(used_pool)} photo(s) to reconstruct from; {name} needs {minimum} "
            f"per window"
        )
    center = view_lib.center_index(names, center_view, used_pool)
    if mode == "all":
        windows = view_lib.cover_windows(graph, size, center, used_pool)
    elif mode == "views":
        count = int(views)
        if count > len(used_pool):
            notes.append(
                f"views={count}: the capture has {len(used_pool)} usable photos; using all"
            )
        windows = [view_lib.select_views(graph, count, center, used_pool)]
    else:
        windows = [sorted(used_pool)]
    used = sorted({i for w in windows for i in w})
    return CapturePlan(images, graph, used, held, windows, center, mode, size, name, notes)


# --------------------------------------------------------------------------- estimate


def capture_estimate(model: nn.Module, plan: CapturePlan, device: torch.device | str) -> Any:
    """``models.core.budget``'s estimate of ``plan``: one window's forward pass
    (:func:`models.core.budget.forward_estimate`, its peak memory) times the number of windows (the
    time). ``budget.check`` refuses it naming ``image_size``."""

    shape = tuple(plan.images.images.shape[-2:])
    one = budget.forward_estimate(
        model,
        plan.size if plan.mode == "all" else len(plan.windows[0]),
        shape,
        setting="image_size",
        device=str(device),
        name=plan.name,
    )
    windows = len(plan.windows)
    return dataclasses.replace(
        one * windows, what=f"{windows} window(s) of {one.what.split(', ', 1)[-1]} ({plan.name})"
    )


# --------------------------------------------------------------------------- reconstruct


@dataclass
class CaptureResult:
    """What :func:`reconstruct_capture` returns: the fused ``reconstruction``
    (``models.pipeline.inference.Reconstruction`` in the capture frame), the plan, the held-out views and
    their scores (or ``None``), the fusion's counts and the ``summary.json`` entries."""

    reconstruction: Any
    plan: CapturePlan
    holdout_views: holdout_lib.HoldoutViews | None
    holdout_scores: holdout_lib.HoldoutScores | None
    counts: dict
    summary: dict
    notes: list[str] = field(default_factory=list)


def _depth_ratio(fused: list, camera: Tensor, window_g, window_camera: Tensor) -> float | None:
    """Median depth of the fused Gaussians over that of a window's, seen from one shared photo
    (each in its own frame): the scale of a chained window whose cameras have no spread."""

    def median_depth(g, e) -> float | None:
        z = transform_points(world_to_camera(e.to(g.means)), g.means[0][g.valid_mask()[0]])[:, 2]
        z = z[z > 0]
        return float(z.median()) if z.numel() else None

    ours = [d for d in (median_depth(g, camera) for g in fused) if d is not None]
    theirs = median_depth(window_g, window_camera)
    if not ours or theirs is None or theirs <= 0:
        return None
    return float(torch.tensor(ours).median()) / theirs


def _capture_scene_frame(move: Similarity | None, first: Any) -> Any:
    """The fused scene's :class:`~models.pipeline.inference.SceneFrame`: the capture frame (``move`` of
    the capture's own poses) mapped back to the capture's own frame and scale; without capture
    poses, the first window's frame (chained windows share it)."""

    if move is None:
        return first
    return SceneFrame(
        to_capture=move.inverse().to(torch.float64),
        rule="whole capture: fused with the first used photo the identity and the largest "
        f"camera distance 1; each window by its own rule ({first.rule})",
        near=first.near,
        far=first.far,
    )


@dataclass
class CaptureFrame:
    """The frame every window is fused in (:func:`capture_frame_of`).

    Attributes:
        extrinsics: ``[U, 4, 4]`` the used photos' poses moved so that the first is the identity
            and the largest camera distance 1, or ``None`` (photos without poses: the windows are
            chained through the photos they share).
        move: the capture's own frame -> that frame, or ``None``.
        points: ``[P, 3]`` the sparse points in that frame, or ``None``.
        position: photo index -> its row in ``extrinsics``.
    """

    extrinsics: Tensor | None
    move: Similarity | None
    points: Tensor | None
    position: dict[int, int]

    def window(self, window: list[int]) -> Tensor:
        """``[W, 4, 4]`` the capture-frame poses of ``window``'s photos."""
        return self.extrinsics[[self.position[i] for i in window]]


def capture_frame_of(plan: CapturePlan) -> CaptureFrame:
    """The capture frame of ``plan``'s used photos (and its sparse points moved into it)."""
    images, used = plan.images, plan.used
    extrinsics = move = None
    if images.extrinsics is not None:
        extrinsics, move = fusion.capture_frame(images.extrinsics[used])  # [U, 4, 4]
    points = getattr(images, "points", None)  # [P, 3] sparse points, the capture's own frame
    if points is not None and move is not None and len(points):
        points = move.points(points.double()).float()  # into the capture frame
    else:
        points = None
    return CaptureFrame(extrinsics, move, points, {index: k for k, index in enumerate(used)})


@dataclass
class PlacedWindows:
    """Every window reconstructed and moved into the capture frame (:func:`place_window`).

    Attributes:
        sets: per window, its Gaussians in the capture frame.
        cameras: per window, ``([W, 4, 4], [W, 3, 3])`` its cameras in that frame.
        known: photo index -> ``[4, 4]`` its chained camera (photos without poses only).
        placement: photo index -> how it was placed (the first window that had it).
        intrinsics: photo index -> ``[3, 3]`` normalised (the first window that had it).
        seconds: per window, its wall time.
        angles: per window, the largest rotation between its cameras (degrees).
        moves: per window, its scene frame -> the capture frame.
        ratios: per window, the depth alignment's scale (``None``: not aligned).
        stages: the windows' stage timings summed (``inference``, ``pose_fit``).
        first: the first window's reconstruction.
    """

    sets: list[Gaussians] = field(default_factory=list)
    cameras: list[tuple[Tensor, Tensor]] = field(default_factory=list)
    known: dict[int, Tensor] = field(default_factory=dict)
    placement: dict[int, str] = field(default_factory=dict)
    intrinsics: dict[int, Tensor] = field(default_factory=dict)
    seconds: list[float] = field(default_factory=list)
    angles: list[float] = field(default_factory=list)
    moves: list[Similarity] = field(default_factory=list)
    ratios: list[float | None] = field(default_factory=list)
    stages: dict[str, float] = field(default_factory=dict)
    first: Reconstruction | None = None


def _chained_step(
    placed: PlacedWindows, result: Reconstruction, window: list[int], number: int
) -> Similarity:
    """A window of photos without poses onto the frame of the windows before it, through the
    photos they share (scaled by :func:`_depth_ratio` when they share one view only); its new
    photos' cameras join ``placed.known``."""
    shared = [k for k, i in enumerate(window) if i in placed.known]
    if not shared:
        step = Similarity.identity()
    else:
        k0 = shared[0]
        scale = _depth_ratio(
            placed.sets, placed.known[window[k0]], result.gaussians, result.extrinsics[k0]
        )
        step = fusion.window_to_capture(
            result.extrinsics[shared],
            torch.stack([placed.known[window[k]] for k in shared]),
            scale=scale,
        )
    for k, i in enumerate(window):
        if i not in placed.known:
            placed.known[i] = step.cameras(result.extrinsics[k].double().cpu()).float()
            placed.placement[i] = result.placement[k] if number == 0 else "chained"
    return step


def window_step(
    frame: CaptureFrame,
    placed: PlacedWindows,
    result: Reconstruction,
    window: list[int],
    number: int,
) -> Similarity:
    """Window ``number``'s scene frame -> the capture frame: a pose-free model's own cameras
    fitted onto the capture's, the recipe's scene frame moved back (posed photos), or chained
    through shared photos (no poses, :func:`_chained_step`)."""
    if frame.extrinsics is None:
        return _chained_step(placed, result, window, number)
    if "predicted" in result.placement or "refined" in result.placement:
        # a pose-free model's own cameras: the similarity onto the SfM cameras
        step = fusion.window_to_capture(result.extrinsics, frame.window(window))
    else:  # the recipe's scene frame, back in the capture's (the single-window rule)
        step = frame.move @ result.frame.to_capture
    for i in window:
        placed.placement.setdefault(i, result.placement[window.index(i)])
    return step


def align_depth(
    moved: Gaussians,
    step: Similarity,
    window_e: Tensor,
    result: Reconstruction,
    points: Tensor,
    backend: str,
) -> tuple[Gaussians, Similarity, float | None]:
    """A window's Gaussians (capture frame) scaled about its cameras' centre onto the sparse
    ``points`` (:func:`models.pipeline.capture.fusion.depth_ratio`); ``(moved, step, ratio or None)``."""
    shape = result.image_size
    found = fusion.depth_ratio(moved, window_e, result.intrinsics.cpu(), shape, points, backend)
    if found is None:
        return moved, step, None
    ratio = found[0]
    centre = window_e[:, :3, 3].double().mean(0)
    about = Similarity.scaling(ratio, centre)
    return transform_gaussians(moved, about), about @ step, ratio


def place_window(
    frame: CaptureFrame,
    placed: PlacedWindows,
    result: Reconstruction,
    window: list[int],
    number: int,
    *,
    depth_align_points: bool = True,
    backend: str = "auto",
) -> None:
    """Window ``number``'s reconstruction moved into the capture frame (:func:`window_step`,
    then :func:`align_depth` onto the sparse points) and added to ``placed``."""
    placed.first = placed.first or result
    for key, value in result.timings.items():  # inference, pose_fit: summed
        placed.stages[key] = round(placed.stages.get(key, 0.0) + value, 4)
    step = window_step(frame, placed, result, window, number)
    for k, i in enumerate(window):
        placed.intrinsics.setdefault(i, result.intrinsics[k].cpu())
    window_e = step.cameras(result.extrinsics.double().cpu()).float()
    if frame.extrinsics is not None:
        window_e = frame.window(window).float()
    moved = transform_gaussians(result.gaussians, step)
    ratio = None
    if depth_align_points and frame.points is not None:
        moved, step, ratio = align_depth(moved, step, window_e, result, frame.points, backend)
    placed.ratios.append(None if ratio is None else round(ratio, 4))
    placed.sets.append(moved)
    placed.cameras.append((window_e, result.intrinsics.cpu()))
    placed.angles.append(round(view_lib.max_rotation_deg(window_e), 2))
    placed.moves.append(step)


def reconstruct_windows(
    model: nn.Module,
    plan: CapturePlan,
    frame: CaptureFrame,
    *,
    depth_align: bool = True,
    backend: str = "auto",
    **options: Any,
) -> PlacedWindows:
    """``models.pipeline.inference.reconstruct`` (the one forward path) on every window of ``plan``
    (``options``: its arguments and knobs), each placed in the capture frame
    (:func:`place_window`)."""
    placed = PlacedWindows()
    bar = progress(plan.windows, desc="windows", unit="window")
    what = f"whole capture ({plan.name}): {len(plan.windows)} windows (their fusion is said after)"
    countdown = budget.Countdown(what, len(plan.windows), "window")
    for number, window in enumerate(bar):
        start = time.perf_counter()
        result = reconstruct(
            model, subset(plan.images, window), backend=backend, name=plan.name, **options
        )
        placed.seconds.append(round(time.perf_counter() - start, 3))
        if frame.extrinsics is None and "unknown" in result.placement and len(plan.windows) > 1:
            raise CaptureError(
                f"model={plan.name}: views=all without camera poses needs the model's cameras "
                f"or pose fitting (pose_fit_steps > 0)"
            )
        place_window(
            frame, placed, result, window, number, depth_align_points=depth_align, backend=backend
        )
        # the rest said from the windows' measured times, their placement included (at 256 px
        # the depth alignment took half as long again as the forward pass)
        countdown.done(time.perf_counter() - start)
        bar.set_postfix(gaussians=result.count)
    bar.close()
    return placed


def _angle_notes(plan: CapturePlan, angles: list[float], angle: float) -> list[str]:
    """The view-angle warnings: per window (``views=all``), else of the one window's views."""
    name = plan.name
    if plan.mode == "all":
        far = [n for n, a in enumerate(angles) if view_lib.view_angle_note(a, name) is not None]
        if far:
            return [
                view_lib.view_angle_note(
                    max(angles[n] for n in far), name, f"the views of {len(far)} window(s)"
                )
            ]
        return []
    note = view_lib.view_angle_note(angle, name)
    return [] if note is None else [note]


def fused_reconstruction(
    model: nn.Module,
    plan: CapturePlan,
    frame: CaptureFrame,
    placed: PlacedWindows,
    gaussians: Gaussians,
    fuse_s: float,
) -> Reconstruction:
    """The fused scene as one ``Reconstruction`` of the used photos (capture frame)."""
    used, first, windows = plan.used, placed.first, len(plan.windows)
    if frame.extrinsics is not None:
        all_e = frame.extrinsics.float()
    else:
        all_e = torch.stack([placed.known[i] for i in used])
    chained = frame.extrinsics is None and windows > 1  # one window needs no chaining
    source_label = f"chained through shared views ({first.poses})" if chained else first.poses
    poses = (
        source_label
        if windows == 1
        else f"{source_label}; {windows} windows fused in the capture frame"
    )
    return Reconstruction(
        gaussians=gaussians,
        extrinsics=all_e,
        intrinsics=torch.stack([placed.intrinsics[i] for i in used]),
        placement=[placed.placement[i] for i in used],
        poses=poses,
        images=plan.images.images[used].float().cpu(),
        names=plan.names(used),
        model=plan.name,
        family=getattr(model, "family", None),
        pose_free=bool(getattr(model, "pose_free", False)),
        knobs=dict(first.knobs),
        timings={**placed.stages, "windows": round(sum(placed.seconds), 4), "fuse": fuse_s},
        maps=first.maps if windows == 1 else {},
        source=subset(plan.images, used),
        frame=_capture_scene_frame(frame.move, first.frame),
        recipe=first.recipe,
    )


def scene_summary(
    plan: CapturePlan,
    frame: CaptureFrame,
    placed: PlacedWindows,
    counts: dict,
    cap: int | None,
    angle: float,
) -> dict[str, Any]:
    """``summary.json``'s ``view_max_rotation_deg``, ``center_view`` and ``scene``."""
    return {
        "view_max_rotation_deg": round(angle, 2),
        "center_view": plan.images.names[plan.center],
        "scene": {
            "mode": plan.mode,
            "selection": plan.graph.kind,
            "window_views": plan.size,
            "windows": [plan.names(w) for w in plan.windows],
            "window_max_rotation_deg": placed.angles,
            "window_seconds": placed.seconds,
            "fusion": {**counts, "fusion_max_gaussians": cap},
            "frame": "written in the capture's own frame and scale; fused in its poses moved "
            "so that the first used photo is the identity and the largest camera distance is 1"
            if frame.extrinsics is not None
            else "the first window's frame; later windows chained through shared photos",
            "depth_ratio": placed.ratios,
            "from_capture_poses": frame.move.to_dict() if frame.move is not None else None,
            "window_to_frame": [m.to_dict() for m in placed.moves],
        },
    }


def held_out_views(
    plan: CapturePlan,
    frame: CaptureFrame,
    placed: PlacedWindows,
    recon: Reconstruction,
    backend: str = "auto",
) -> tuple[holdout_lib.HoldoutViews, Any]:
    """The held-out photos with their cameras in the capture frame: the capture's own poses
    moved, or (photos without poses) placed against their photos from the nearest used photo's
    camera (``models.pipeline.capture.holdout.fit_holdout_cameras``; its record is returned too)."""
    images, used, held = plan.images, plan.used, plan.held
    nearest = fitted = None
    if images.extrinsics is None:  # placed against their photos (holdout module doc)
        nearest = view_lib.nearest_photos(plan.graph, held, used)
        held_k = torch.stack([placed.intrinsics[i] for i in nearest]).float()
        held_e, fitted = holdout_lib.fit_holdout_cameras(
            recon.gaussians,
            images.images[held].float(),
            torch.stack([placed.known[i] for i in nearest]),
            held_k,
            backend=backend,
        )
    else:
        held_e = frame.move.cameras(images.extrinsics[held].double()).float()
        held_k = (
            images.intrinsics[held]
            if images.intrinsics is not None
            else recon.intrinsics[:1].expand(len(held), 3, 3)
        )
    every_e = torch.zeros(len(images.names), 4, 4)
    every_k = torch.zeros(len(images.names), 3, 3)
    every_e[used], every_k[used] = recon.extrinsics, recon.intrinsics
    every_e[held], every_k[held] = held_e, held_k.float()
    views = holdout_lib.holdout_views(
        images.names, images.images, every_e, every_k, held, used, nearest
    )
    return views, fitted


def reconstruct_capture(
    model: nn.Module,
    plan: CapturePlan,
    *,
    pose_fit_steps: int = 50,
    pose_fit_size: int = 128,
    backend: str = "auto",
    fov: float = 60.0,
    fusion_max_gaussians: int | None = None,
    lpips: bool = True,
    near: float | None = None,
    far: float | None = None,
    scene_scale: float | None = None,
    depth_align: bool = True,
    **knobs: Any,
) -> CaptureResult:
    """Reconstruct every window of ``plan``, fuse them in the capture frame and score the
    held-out photos (module doc). ``fusion_max_gaussians`` caps the fused set of several windows
    (``max_gaussians``, a knob, caps each window's forward pass); ``near``, ``far``,
    ``scene_scale`` override the recipe's for every window;
    ``depth_align`` scales each window's Gaussians onto the sparse points (module doc)."""
    frame = capture_frame_of(plan)
    placed = reconstruct_windows(
        model, plan, frame, depth_align=depth_align, backend=backend,
        pose_fit_steps=pose_fit_steps, pose_fit_size=pose_fit_size, fov=fov, near=near, far=far,
        scene_scale=scene_scale, **knobs,
    )  # fmt: skip
    start = time.perf_counter()
    cap = fusion_max_gaussians if len(plan.windows) > 1 else None
    shape = tuple(plan.images.images.shape[-2:])
    images = [plan.images.images[window].float() for window in plan.windows]
    gaussians, counts = fusion.fuse_windows(
        placed.sets, placed.cameras, shape, fusion_max_gaussians=cap, backend=backend,
        images=images,
    )  # fmt: skip
    fuse_s = round(time.perf_counter() - start, 3)
    recon = fused_reconstruction(model, plan, frame, placed, gaussians, fuse_s)
    angle = view_lib.max_rotation_deg(recon.extrinsics)
    notes = list(plan.notes) + _angle_notes(plan, placed.angles, angle)
    summary = scene_summary(plan, frame, placed, counts, cap, angle)
    held_views = scores = None
    if plan.held:
        held_views, fitted = held_out_views(plan, frame, placed, recon, backend)
        start = time.perf_counter()
        scores = holdout_lib.score_holdout(gaussians, held_views, backend=backend, lpips=lpips)
        recon.timings["holdout"] = round(time.perf_counter() - start, 4)
        notes.extend(scores.notes)
        summary["holdout"] = holdout_lib.holdout_summary(held_views, scores)
        if fitted is not None:
            summary["holdout"]["cameras"] = fitted
    return CaptureResult(recon, plan, held_views, scores, counts, summary, notes)


def write_capture(
    capture: CaptureResult,
    output: str | os.PathLike | Any,
    *,
    frames: int = 30,
    fps: int = 15,
    backend: str = "auto",
    summary: dict | None = None,
    started: float | None = None,
    extra: Any = None,
    formats: tuple[str, ...] = (),
) -> Path:
    """``models.pipeline.inference.write_reconstruction`` of the fused scene, plus
    ``renders/holdout/<stem>.png`` and ``holdout_sheet.png`` when photos were held out (and
    ``extra(staging)``'s files, e.g. the refinement's plot)."""

    more = extra

    def extra(staging: Path) -> None:
        if more is not None:
            more(staging)
        if capture.holdout_views is not None:
            holdout_lib.save_holdout(
                capture.holdout_views,
                capture.holdout_scores,
                staging / "renders" / "holdout",
                staging / "holdout_sheet.png",
            )

    return write_reconstruction(
        capture.reconstruction,
        output,
        frames=frames,
        fps=fps,
        backend=backend,
        summary={**capture.summary, **dict(summary or {})},
        started=started,
        extra=extra,
        formats=formats,
    )


def print_holdout(capture: CaptureResult, file=None) -> None:
    """The held-out table on ``file`` (default stdout; nothing without held-out photos)."""
    if "holdout" in capture.summary:
        print(holdout_lib.holdout_table(capture.summary["holdout"]), file=file or sys.stdout)
