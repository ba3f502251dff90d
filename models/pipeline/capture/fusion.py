"""Windows of a capture fused into one Gaussian set in the capture's frame.

Frames. The **capture frame** is the frame every whole-capture output is written in: the
capture's own poses (SfM, COLMAP or ``cameras.json``) moved by :func:`capture_frame`, the same
similarity ``models.pipeline.inference`` and ``SfmResult.export`` apply to the views of one output (first
view the identity, largest camera distance 1), so ``gaussians.ply``, ``cameras.json`` and
``sparse/`` agree. Each window is reconstructed in its own normalised frame
(``models.pipeline.inference.reconstruct``, DESIGN "Scene frame"); :func:`window_to_capture` is the one
place that maps a window's frame to the capture frame: a similarity fitted to the window's
cameras (as reconstruct placed them: the given ones renormalised, or those a pose-free model
predicted or refined) and the same photos' capture cameras: rotation from the cameras'
orientations, scale from the spread of their centres (a window whose centres coincide: the
``scale`` passed, e.g. from a recipe's scale rule, else the ratio of depths), translation from
the centroids. Without capture poses (pose-free photos), the first window's frame is the capture
frame and each next one is chained through the photos it shares with earlier ones.

Depth agreement. The windows of a feed-forward model disagree on depth where they overlap, and
the floater check below then removes whichever surface is nearer, even where it is what a
window's own photos see. :func:`agree_depths` first renders every window's depth (expected depth
over alpha, where alpha > 0.5) at every window's camera; where ``min_windows`` or more windows
have a surface at a pixel, their per-pixel median is the agreed depth there. Each Gaussian moves
along the ray of its own window's nearest camera to the agreed depth at its pixel, its scales
with it, so that camera still sees it at the same pixel and size, and the windows that describe
one surface put it in one place. The count does not change. It suits models whose Gaussians lie
on their views' rays (pixel-aligned) better than those that place them freely, so
:func:`fuse_windows`, given the windows' own photos, fuses both ways and keeps the set that
renders those photos better (:func:`input_psnr`; the held-out photos are never looked at).

Merging. Where windows overlap, a surface is predicted once per window (and within a window
once per view that sees it). :func:`merge_surfaces` merges what they say about one **surface
element**: each Gaussian is looked up in the input camera (of every window) that sees it
nearest, and its element is the cell of ``cell`` pixels (at the windows' image size) it falls in
there times a band of relative depth ``depth_tolerance`` along that camera's ray. Footprint: a
Gaussian whose own window sees it from farther (its own pixel size ``depth / focal`` is ``2**L``
times the nearest camera's, ``L`` rounded, at most 3) falls in cells ``2**L`` times as wide, so
coarse and fine descriptions do not mix. The Gaussians of one element become one: the weighted
mean of position, colour (every SH coefficient) and opacity, and the moment-matched covariance
(the mixture's second moment about the merged mean) as scales and orientation; the weight is
opacity x (nearest pixel size / own pixel size) ** ``sharpness``, so the windows that see an
element closest dominate it. An element of one Gaussian keeps it unchanged. The fused count then
follows the capture's content at the windows' pixel size, not the number of windows.
``fusion_max_gaussians`` then keeps the most opaque.

Floaters. Before the merge, after the depth agreement, :func:`remove_floaters` drops the
Gaussians that other windows see through: each window's own Gaussians give a depth map per camera (``render``'s expected depth
over its alpha, where alpha > 0.5); a Gaussian of another window that projects into such a
camera nearer than ``(1 - margin)`` of that depth lies in space the camera sees empty. A
Gaussian is removed when most of the other windows' cameras that see its pixel say so. Without
it, a wrongly placed Gaussian of one window occludes the views of all the others.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import torch
from torch import Tensor
from tqdm.auto import tqdm

from models.core import budget
from models.core.gaussians import Gaussians
from models.geometry.cameras import (
    camera_centers,
    normalize_scene,
    project,
    transform_points,
    world_to_camera,
)
from models.geometry.rotations import matrix_to_quaternion, quaternion_to_matrix
from models.geometry.similarity import Similarity, nearest_rotation
from models.pipeline.metrics import psnr_per_image
from models.render.core import render

__all__ = [
    "agree_depths",
    "capture_frame",
    "depth_ratio",
    "fuse_windows",
    "input_psnr",
    "merge_surfaces",
    "pixel_footprint",
    "remove_floaters",
    "window_to_capture",
]


def depth_ratio(
    gaussians: Gaussians,
    extrinsics: Tensor,
    intrinsics: Tensor,
    shape: tuple[int, int],
    points: Tensor,
    backend: str = "auto",
    min_points: int = 20,
) -> tuple[float, int] | None:
    """How far a window's Gaussians are from the structure-from-motion surface in depth: the
    median, over the sparse ``points [P, 3]`` that project into its views, of the points' z-depth
    over the depth its Gaussians render there (expected depth over alpha, where alpha > 0.5).
    All in one frame. Returns ``(ratio, points used)``, or ``None`` under ``min_points``."""
    e = extrinsics.to(gaussians.means)  # [V, 4, 4]
    k = intrinsics.to(gaussians.means)  # [V, 3, 3]
    with torch.inference_mode():
        out = render(gaussians, e[None], k[None], shape, backend=backend)
    height, width = shape
    xy, z = project(points.to(gaussians.means)[None].expand(len(e), -1, -1), e, k)  # [V, P, *]
    inside = (z > 1e-8) & (xy >= 0).all(-1) & (xy < 1).all(-1)  # [V, P]
    view, index = torch.nonzero(inside, as_tuple=True)
    col = (xy[view, index, 0] * width).long().clamp(0, width - 1)
    row = (xy[view, index, 1] * height).long().clamp(0, height - 1)
    alpha = out.alpha[0][view, row, col].float()
    rendered = out.depth[0][view, row, col].float() / alpha.clamp_min(1e-6)
    good = (alpha > 0.5) & (rendered > 0)
    if int(good.sum()) < min_points:
        return None
    ratio = z[view, index][good].double() / rendered[good].double()
    return float(ratio.median()), int(good.sum())


def capture_frame(extrinsics: Tensor) -> tuple[Tensor, Similarity]:
    """The capture frame of views with capture poses ``extrinsics`` ``[V, 4, 4]``: returns their
    poses in it and the similarity from the capture's own frame into it (``normalize_scene``:
    view 0 the identity, largest camera distance 1)."""
    e = extrinsics.double()
    moved, _, scale = normalize_scene(e[None])
    reference = torch.linalg.inv(e[0])
    s = 1.0 / float(scale[0])
    return moved[0], Similarity(s, reference[:3, :3], reference[:3, 3] * s)


def window_to_capture(
    window_extrinsics: Tensor, capture_extrinsics: Tensor, scale: float | None = None
) -> Similarity:
    """The similarity from a window's frame to the capture frame (module doc).

    Args:
        window_extrinsics: ``[V, 4, 4]`` the window's cameras in its own frame.
        capture_extrinsics: ``[V, 4, 4]`` the same photos' cameras in the capture frame.
        scale: used when the window's camera centres coincide (no spread to measure); ``None``
            then means 1.
    """
    w, c = window_extrinsics.double().cpu(), capture_extrinsics.double().cpu()
    rotation = nearest_rotation((c[:, :3, :3] @ w[:, :3, :3].transpose(-1, -2)).mean(dim=0))
    cw, cc = camera_centers(w), camera_centers(c)  # [V, 3]
    spread_w = (cw - cw.mean(0)).norm(dim=-1).sum()
    spread_c = (cc - cc.mean(0)).norm(dim=-1).sum()
    if float(spread_w) > 1e-8 and float(spread_c) > 1e-8:
        s = float(spread_c / spread_w)
    else:
        s = 1.0 if scale is None else float(scale)
    translation = cc.mean(0) - s * rotation @ cw.mean(0)
    return Similarity(s, rotation, translation)


def pixel_footprint(
    means: Tensor, extrinsics: Tensor, intrinsics: Tensor, shape: tuple[int, int]
) -> tuple[Tensor, Tensor]:
    """Per point ``[N, 3]``: the z-depth in the nearest camera (of ``extrinsics [V, 4, 4]``) that
    has it in front and in view, and the size of a pixel there (``depth / fx_px``); points no
    camera sees get ``inf``."""
    view = world_to_camera(extrinsics.to(means))  # [V, 4, 4]
    local = transform_points(view, means[None])  # [V, N, 3]
    z = local[..., 2]
    k = intrinsics.to(means)
    u = k[:, None, 0, 0] * local[..., 0] / z.clamp_min(1e-8) + k[:, None, 0, 2]
    v = k[:, None, 1, 1] * local[..., 1] / z.clamp_min(1e-8) + k[:, None, 1, 2]
    inside = (z > 1e-6) & (u >= 0) & (u <= 1) & (v >= 0) & (v <= 1)
    depth = torch.where(inside, z, torch.full_like(z, float("inf")))  # [V, N]
    best, index = depth.min(dim=0)  # [N]
    fx = k[:, 0, 0] * shape[1]  # [V] pixels
    return best, best / fx[index]


def _nearest_views(
    means: Tensor, extrinsics: Tensor, intrinsics: Tensor, centre_weight: float = 0.0
) -> tuple[Tensor, ...]:
    """Per point ``[N, 3]``, the camera (of ``[C, 4, 4]``) nearest in z-depth among those that
    have it in front and in view: its index ``[N]`` (-1: none), ``u``, ``v`` (normalised image
    coordinates there) and ``z`` (``inf`` when none). ``centre_weight`` ranks the cameras by
    ``z * (1 + centre_weight * r**2)`` instead, ``r`` the distance from the image centre (1 at
    the border): an element is best seen near the middle of a view, where a feed-forward model
    has context on all sides."""
    best_score = torch.full((len(means),), float("inf"), dtype=means.dtype, device=means.device)
    best_z = torch.full((len(means),), float("inf"), dtype=means.dtype, device=means.device)
    best = torch.full((len(means),), -1, dtype=torch.long, device=means.device)
    best_u, best_v = torch.zeros_like(best_z), torch.zeros_like(best_z)
    view = world_to_camera(extrinsics.to(means))  # [C, 4, 4]
    k = intrinsics.to(means)
    for c in range(len(view)):  # one camera at a time: [N] tensors only
        local = transform_points(view[c], means)  # [N, 3]
        z = local[:, 2]
        u = k[c, 0, 0] * local[:, 0] / z.clamp_min(1e-8) + k[c, 0, 2]
        v = k[c, 1, 1] * local[:, 1] / z.clamp_min(1e-8) + k[c, 1, 2]
        r = 2 * torch.maximum((u - 0.5).abs(), (v - 0.5).abs())
        score = z * (1 + centre_weight * r**2)
        nearer = (z > 1e-6) & (r < 1) & (score < best_score)
        best_score = torch.where(nearer, score, best_score)
        best_z = torch.where(nearer, z, best_z)
        best = torch.where(nearer, torch.full_like(best, c), best)
        best_u, best_v = torch.where(nearer, u, best_u), torch.where(nearer, v, best_v)
    return best, best_u, best_v, best_z


def _surface_keys(
    means: Tensor,
    own_footprint: Tensor,
    extrinsics: Tensor,
    intrinsics: Tensor,
    shape: tuple[int, int],
    cell: float,
    depth_tolerance: float,
    centre_weight: float = 0.0,
) -> tuple[Tensor, Tensor, Tensor]:
    """The surface element of every Gaussian (module doc, "Merging"): a key ``[N]`` (equal keys
    describe the same element), its level ``[N]`` and its nearest camera's pixel size ``[N]``."""
    camera, u, v, z = _nearest_views(means, extrinsics, intrinsics, centre_weight)
    seen = camera >= 0
    fx = intrinsics.to(means)[:, 0, 0] * shape[1]  # [C] pixels
    finest = z / fx[camera.clamp_min(0)]  # [N] the nearest camera's pixel size there
    ratio = (own_footprint / finest).clamp(1.0, 8.0)
    level = torch.where(seen & torch.isfinite(ratio), ratio.log2().round(), torch.zeros_like(z))
    side = cell * 2.0**level  # cell side in the nearest camera's pixels
    col = torch.floor(u * shape[1] / side)
    row = torch.floor(v * shape[0] / side)
    band = torch.floor(z.clamp_min(1e-12).log() / math.log1p(depth_tolerance))
    fields = torch.stack([level, camera.to(z.dtype), col, row, band], -1)  # [N, 5]
    fields[~seen] = 0.0
    _, key = torch.unique(fields.long(), dim=0, return_inverse=True)
    unseen = torch.nonzero(~seen)[:, 0]  # never merged: a key of their own each
    key[unseen] = int(key.max()) + 1 + torch.arange(len(unseen), device=key.device)
    return key, level.long(), finest


def _merge_groups(g: Gaussians, group: Tensor, weight: Tensor) -> Gaussians:
    """One Gaussian per ``group`` id ``[N]`` (ids ``0..M-1``) of the set ``g`` (a batch of one,
    no mask): weighted means of position, colour and opacity, and the moment-matched covariance
    (the mixture's second moment about the merged mean) as scales and orientation."""
    m = int(group.max()) + 1
    w = weight.double()  # [N]
    total = torch.zeros(m, dtype=torch.float64).index_add_(0, group, w).clamp_min(1e-30)  # [M]

    def average(values: Tensor) -> Tensor:  # [N, ...] -> [M, ...]
        flat = values.double().reshape(len(values), -1) * w[:, None]
        out = torch.zeros(m, flat.shape[1], dtype=torch.float64).index_add_(0, group, flat)
        return (out / total[:, None]).reshape(m, *values.shape[1:])

    means = g.means[0].double()  # [N, 3]
    mean = average(means)  # [M, 3]
    r = quaternion_to_matrix(g.rotations[0].double())  # [N, 3, 3]
    cov = r @ torch.diag_embed(g.scales[0].double() ** 2) @ r.transpose(-1, -2)  # [N, 3, 3]
    d = means - mean[group]
    second = average(cov + d[:, :, None] * d[:, None, :])  # [M, 3, 3]
    values, vectors = torch.linalg.eigh(0.5 * (second + second.transpose(-1, -2)))
    flip = torch.linalg.det(vectors) < 0
    vectors[flip, :, 0] = -vectors[flip, :, 0]
    dtype = g.means.dtype
    return Gaussians(
        means=mean[None].to(dtype),
        scales=values.clamp_min(1e-20).sqrt()[None].to(dtype),
        rotations=matrix_to_quaternion(vectors)[None].to(dtype),
        opacities=average(g.opacities[0])[None].to(dtype).clamp(1e-6, 1 - 1e-6),
        harmonics=average(g.harmonics[0])[None].to(dtype),
    )


def merge_surfaces(
    sets: Sequence[Gaussians],
    cameras: Sequence[tuple[Tensor, Tensor]],
    shape: tuple[int, int],
    cell: float = 2.0,
    depth_tolerance: float = 0.3,
    sharpness: float = 2.0,
    centre_weight: float = 0.0,
) -> tuple[Gaussians, dict]:
    """One set from per-window ``sets`` (each a batch of one, in the capture frame), merging the
    Gaussians that describe the same surface element (module doc, "Merging").

    Args:
        sets: per window.
        cameras: per window ``(extrinsics [V, 4, 4], intrinsics [V, 3, 3])`` in the capture frame.
        shape: ``(H, W)`` of the windows' images (pixel sizes).
        cell: side of a surface element in pixels of its nearest camera (at level 0).
        depth_tolerance: relative depth band of one element along that camera's ray.
        sharpness: the merge weight is opacity x (the nearest camera's pixel size over the
            Gaussian's own) ** sharpness: the windows that see an element closest dominate it.
        centre_weight: ranks the cameras an element is looked up in by depth x (1 +
            centre_weight x its squared distance from the image centre); 0: the nearest.

    Returns:
        The fused set and counts (``before``, ``after``, ``merged``, ``per_window_before``,
        ``per_window``: each fused Gaussian counted for the window of most weight in it).
    """
    sets = [g.compact() if g.mask is not None else g for g in sets]
    flat = Gaussians.cat(list(sets))
    count = int(flat.means.shape[1])
    window = torch.cat(
        [torch.full((int(g.means.shape[1]),), i, dtype=torch.long) for i, g in enumerate(sets)]
    )
    means = flat.means[0].detach().double().cpu()  # [N, 3]
    own = torch.cat(
        [
            pixel_footprint(g.means[0].detach().double().cpu(), e.double(), k.double(), shape)[1]
            for g, (e, k) in zip(sets, cameras)
        ]
    )  # [N] the pixel size in the Gaussian's own nearest camera
    all_e = torch.cat([e.double().cpu() for e, _ in cameras])  # [C, 4, 4]
    all_k = torch.cat([k.double().cpu() for _, k in cameras])
    key, level, finest = _surface_keys(
        means, own, all_e, all_k, shape, cell, depth_tolerance, centre_weight
    )
    finer = torch.where(torch.isfinite(own), (finest / own).clamp(0, 1), torch.ones_like(own))
    weight = flat.opacities[0].detach().double().cpu() * finer**sharpness  # opacity x sharpness
    fused = _merge_groups(flat.detach().to("cpu"), key, weight).to(flat.means.device)
    # each fused Gaussian's window: the one of most weight in it
    groups = int(key.max()) + 1
    per = torch.zeros(groups, len(sets), dtype=torch.float64)
    per.index_put_((key, window), weight.clamp_min(1e-30), accumulate=True)
    owner = per.argmax(dim=1)  # [M]
    counts = {
        "before": count,
        "after": groups,
        "merged": count - groups,
        "cell": float(cell),
        "depth_tolerance": float(depth_tolerance),
        "levels": [int((level == i).sum()) for i in range(int(level.max()) + 1)],
        "per_window_before": [int(g.means.shape[1]) for g in sets],
        "per_window": [int((owner == i).sum()) for i in range(len(sets))],
    }
    return fused, counts


def _depth_maps(sets, cameras, shape: tuple[int, int], backend: str) -> list[Tensor]:
    """Each window's depth ``[V, H, W]`` from its own cameras (0 where alpha <= 0.5); the time
    of all of them is said after the first."""
    depth_maps = []
    started = time.perf_counter()
    for number, (g, (e, k)) in enumerate(zip(sets, cameras)):
        if number == 1:  # each window's render costs about the same
            budget.announce_rest(
                f"fusion of {len(sets)} windows: their depth maps, then the floater check and "
                "the merge (said when they start)",
                time.perf_counter() - started, len(sets) - 1, "window",
            )  # fmt: skip
        depth_maps.append(_surface_depth(g, e, k, shape, backend, 0.0))
    return depth_maps


def _surface_depth(g: Gaussians, e: Tensor, k: Tensor, shape, backend: str, empty: float) -> Tensor:
    """``g``'s depth ``[V, H, W]`` (on the CPU) at cameras ``e [V, 4, 4]``, ``k [V, 3, 3]``: the
    expected depth over alpha where alpha > 0.5, ``empty`` elsewhere."""
    with torch.inference_mode():
        out = render(g, e[None].to(g.means), k[None].to(g.means), shape, backend=backend)
    alpha = out.alpha[0].float()  # [V, H, W]
    depth = out.depth[0].float() / alpha.clamp_min(1e-6)
    return torch.where(alpha > 0.5, depth, torch.full_like(depth, empty)).cpu()


def _pixels(means: Tensor, e: Tensor, k: Tensor, shape) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Where points ``[N, 3]`` fall in cameras ``e [V, 4, 4]``, ``k [V, 3, 3]`` (float, CPU):
    their depth, pixel row and column (unclamped) and whether that pixel is in the image and in
    front of the camera, each ``[V, N]``."""
    height, width = shape
    local = transform_points(world_to_camera(e), means[None])  # [V, N, 3]
    z = local[..., 2]
    u = k[:, None, 0, 0] * local[..., 0] / z.clamp_min(1e-8) + k[:, None, 0, 2]
    v = k[:, None, 1, 1] * local[..., 1] / z.clamp_min(1e-8) + k[:, None, 1, 2]
    col, row = (u * width).floor().long(), (v * height).floor().long()
    inside = (z > 1e-6) & (col >= 0) & (col < width) & (row >= 0) & (row < height)
    return z, row, col, inside


def remove_floaters(
    sets: Sequence[Gaussians],
    cameras: Sequence[tuple[Tensor, Tensor]],
    shape: tuple[int, int],
    margin: float = 0.1,
    backend: str = "auto",
    vote: float = 0.5,
) -> tuple[list[Gaussians], int]:
    """Per-window ``sets`` without the Gaussians other windows see through (module doc);
    returns the sets and how many were removed."""
    depth_maps = _depth_maps(sets, cameras, shape, backend)
    height, width = shape
    kept, removed = [], 0
    bar = tqdm(sets, desc="fusion: floaters", unit="window", disable=None, leave=False)
    checks: list[float] = []
    for v, g in enumerate(bar):
        if v == min(TIMED_CHECKS, len(sets) - 1):  # each window is checked against the others
            _announce_fusion(sorted(checks)[len(checks) // 2], len(sets) - v, len(sets))
        started = time.perf_counter()
        means = g.means[0].detach().float().cpu()  # [N, 3]
        seen = torch.zeros(len(means))
        free = torch.zeros(len(means))
        for w, (e, k) in enumerate(cameras):
            if w == v:
                continue
            z, row, col, inside = _pixels(means, e.float().cpu(), k.float().cpu(), shape)
            views = torch.arange(len(e))[:, None].expand_as(col)
            surface = depth_maps[w][views, row.clamp(0, height - 1), col.clamp(0, width - 1)]
            looked = inside & (surface > 0)
            seen += looked.sum(0)
            free += (looked & (z < (1 - margin) * surface)).sum(0)
        keep = ~((seen > 0) & (free > vote * seen))  # [N]
        keep = keep.to(g.means.device) & g.valid_mask()[0]
        removed += int((g.valid_mask()[0] & ~keep).sum())
        index = torch.nonzero(keep)[:, 0][None]
        out = g._gather(index)
        out.mask = None
        kept.append(out)
        checks.append(time.perf_counter() - started)
    return kept, removed


def _agreed_depths(
    sets: Sequence[Gaussians],
    extrinsics: Tensor,
    intrinsics: Tensor,
    shape: tuple[int, int],
    backend: str,
    chunk: int = 8,
) -> tuple[Tensor, Tensor]:
    """At every camera of ``extrinsics [C, 4, 4]``: the per-pixel median, over the windows, of
    the depth each window's set renders there (expected depth over alpha, where alpha > 0.5)
    ``[C, H, W]`` (nan where no window has a surface) and how many windows have one there
    ``[C, H, W]``; ``chunk`` cameras at a time."""
    medians, votes = [], []
    for start in range(0, len(extrinsics), chunk):
        stack = []
        e, k = extrinsics[start : start + chunk], intrinsics[start : start + chunk]
        for g in sets:
            stack.append(_surface_depth(g, e, k, shape, backend, math.nan))
        depths = torch.stack(stack)  # [W, c, H, W]
        votes.append((~depths.isnan()).sum(0))
        medians.append(depths.nanmedian(dim=0).values)
    return torch.cat(medians), torch.cat(votes)


def _ray_ratios(
    means: Tensor,
    extrinsics: Tensor,
    intrinsics: Tensor,
    median: Tensor,
    votes: Tensor,
    min_windows: int,
) -> tuple[Tensor, Tensor]:
    """Per point ``[N, 3]``: the agreed depth over its own depth in the nearest of its window's
    cameras ``[V, 4, 4]`` (1 where under ``min_windows`` windows agree on a surface at its
    pixel, or no camera sees it) ``[N]``, and that camera's centre ``[N, 3]``."""
    height, width = median.shape[-2:]
    z, row, col, inside = _pixels(means, extrinsics, intrinsics, (height, width))
    nearest, view = torch.where(inside, z, torch.full_like(z, math.inf)).min(dim=0)  # [N]
    point = torch.arange(len(means))
    row = row[view, point].clamp(0, height - 1)
    col = col[view, point].clamp(0, width - 1)
    target, count = median[view, row, col], votes[view, row, col]
    agreed = torch.isfinite(nearest) & (count >= min_windows) & torch.isfinite(target)
    ratio = torch.where(agreed, target / nearest.clamp_min(1e-8), torch.ones_like(nearest))
    return ratio, camera_centers(extrinsics)[view]


def agree_depths(
    sets: Sequence[Gaussians],
    cameras: Sequence[tuple[Tensor, Tensor]],
    shape: tuple[int, int],
    min_windows: int = 3,
    backend: str = "auto",
) -> tuple[list[Gaussians], int]:
    """Per-window ``sets`` (batches of one, no mask) moved onto the depth the windows agree on
    (module doc, "Depth agreement"); returns them and how many Gaussians moved."""
    all_e = torch.cat([e.float().cpu() for e, _ in cameras])  # [C, 4, 4]
    all_k = torch.cat([k.float().cpu() for _, k in cameras])
    median, votes = _agreed_depths(sets, all_e, all_k, shape, backend)
    moved_sets, moved, first = [], 0, 0
    for g, (e, _) in zip(sets, cameras):
        own = slice(first, first + len(e))
        first += len(e)
        means = g.means[0].detach().float().cpu()  # [N, 3]
        ratio, centre = _ray_ratios(
            means, all_e[own], all_k[own], median[own], votes[own], min_windows
        )
        moved += int((ratio != 1).sum())
        new = centre + (means - centre) * ratio[:, None]  # along the camera's ray
        moved_sets.append(
            g.replace(
                means=new[None].to(g.means),
                scales=g.scales * ratio[None, :, None].to(g.scales),  # same footprint there
            )
        )
    return moved_sets, moved


# Windows whose floater check is timed before the rest is said (their median: the first one
# took 3x the mean on the drone capture).
TIMED_CHECKS = 3
# The surface merge is timed on every MERGE_SAMPLE-th Gaussian of each window before it runs, when
# the floater check took BIG_SECONDS or more (it looks every Gaussian up in every camera at once:
# no loop to time; its cost is no fixed share of the check's: 0.7x the check at 64 px, 3.5x at
# 256 px on the drone windows).
MERGE_SAMPLE = 16


def _announce_fusion(check_seconds: float, remaining: int, windows: int) -> None:
    """One line on stderr: the rest of the floater check, from the median time of the first
    windows' checks (each window's costs about the same)."""
    budget.announce_rest(
        f"fusion of {windows} windows: floater check (the merge is said when it starts)",
        check_seconds,
        remaining,
        "window",
    )


def _announce_merge(
    sets: Sequence[Gaussians],
    cameras: Sequence[tuple[Tensor, Tensor]],
    shape: tuple[int, int],
    cell: float,
    depth_tolerance: float,
) -> None:
    """Merge a sample (every :data:`MERGE_SAMPLE`-th Gaussian of each window), time it and say
    the whole merge's time (the sample's time x :data:`MERGE_SAMPLE`)."""
    sample = [
        g._gather(torch.arange(0, int(g.means.shape[1]), MERGE_SAMPLE, device=g.means.device)[None])
        for g in (g.compact() if g.mask is not None else g for g in sets)
    ]
    started = time.perf_counter()
    merge_surfaces(sample, cameras, shape, cell, depth_tolerance)
    count = sum(int(g.means.shape[1]) for g in sets)
    budget.announce_rest(
        f"fusion of {len(sets)} windows: surface merge of {count} Gaussians",
        time.perf_counter() - started,
        MERGE_SAMPLE,
        f"1/{MERGE_SAMPLE} share",
    )


def _fuse_several(
    sets: Sequence[Gaussians],
    cameras: Sequence[tuple[Tensor, Tensor]],
    shape: tuple[int, int],
    cell: float,
    depth_tolerance: float,
    backend: str,
    agree: bool,
) -> tuple[Gaussians, dict]:
    """Several windows' sets fused: :func:`agree_depths` (when ``agree``),
    :func:`remove_floaters`, :func:`merge_surfaces`; counts with ``depth_agreed``,
    ``floaters_removed`` and ``seconds``."""
    sets = [g.compact() if g.mask is not None else g for g in sets]
    seconds, agreed = {}, 0
    if agree:
        started = time.perf_counter()
        sets, agreed = agree_depths(sets, cameras, shape, backend=backend)
        seconds["depth_agreement"] = round(time.perf_counter() - started, 3)
    started = time.perf_counter()
    sets, floaters = remove_floaters(sets, cameras, shape, backend=backend)
    seconds["floaters"] = round(time.perf_counter() - started, 3)
    if seconds["floaters"] >= budget.BIG_SECONDS:  # a big fusion: its merge timed and said
        _announce_merge(sets, cameras, shape, cell, depth_tolerance)
    started = time.perf_counter()
    fused, counts = merge_surfaces(sets, cameras, shape, cell, depth_tolerance)
    seconds["merge"] = round(time.perf_counter() - started, 3)
    return fused, {
        "depth_agreed": agreed,
        "floaters_removed": floaters,
        **counts,
        "seconds": seconds,
    }


def input_psnr(
    gaussians: Gaussians,
    cameras: Sequence[tuple[Tensor, Tensor]],
    images: Sequence[Tensor],
    backend: str = "auto",
) -> float:
    """Mean PSNR of ``gaussians`` rendered at every window's cameras against the window's own
    photos ``images`` (per window ``[V, 3, H, W]``): how well a fused set keeps its inputs."""
    values = []
    for (e, k), photos in zip(cameras, images):
        shape = (int(photos.shape[-2]), int(photos.shape[-1]))
        with torch.inference_mode():
            out = render(gaussians, e[None].to(gaussians.means), k[None].to(gaussians.means),
                         shape, backend=backend)  # fmt: skip
        color = out.color[0].float().clamp(0, 1).cpu()  # [V, 3, H, W]
        values.append(psnr_per_image(color, photos.float().cpu()))
    return float(torch.cat(values).mean())


def fuse_windows(
    sets: Sequence[Gaussians],
    cameras: Sequence[tuple[Tensor, Tensor]],
    shape: tuple[int, int],
    cell: float = 2.0,
    fusion_max_gaussians: int | None = None,
    backend: str = "auto",
    depth_tolerance: float = 0.3,
    images: Sequence[Tensor] | None = None,
) -> tuple[Gaussians, dict]:
    """Several windows fused (:func:`agree_depths`, :func:`remove_floaters`,
    :func:`merge_surfaces`; one window's set is kept as the model made it), then
    ``fusion_max_gaussians`` (the most opaque). With the windows' own photos ``images`` (per
    window ``[V, 3, H, W]``), the fusion is also made without the depth agreement and the one
    that renders those photos better (:func:`input_psnr`) is kept; held-out photos are never
    looked at. Counts: ``predicted``, ``depth_agreed`` (Gaussians moved), ``depth_agreement``
    (used, and both input PSNRs), ``floaters_removed``, :func:`merge_surfaces`' counts,
    ``fusion_max_gaussians`` and ``final``."""
    predicted = [int(g.count()[0]) for g in sets]
    if len(sets) > 1:  # one window: the model's own set (what the viewer re-runs live)
        fused, counts = _fuse_several(sets, cameras, shape, cell, depth_tolerance, backend, True)
        choice = {"used": True}
        if images is not None:
            plain, plain_counts = _fuse_several(
                sets, cameras, shape, cell, depth_tolerance, backend, False
            )
            choice["input_psnr"] = {
                "agreed": round(input_psnr(fused, cameras, images, backend), 3),
                "as_placed": round(input_psnr(plain, cameras, images, backend), 3),
            }
            if choice["input_psnr"]["as_placed"] > choice["input_psnr"]["agreed"]:
                fused, counts, choice["used"] = plain, plain_counts, False
        counts["depth_agreement"] = choice
    else:
        fused = sets[0]
        counts = {"depth_agreed": 0, "floaters_removed": 0, "before": predicted[0]}
        counts.update(after=predicted[0], merged=0, seconds={})
        counts.update(per_window_before=predicted, per_window=predicted)
    counts = {
        "predicted": sum(predicted),
        "per_window_predicted": predicted,
        **counts,
        "fusion_max_gaussians": fusion_max_gaussians,
    }
    if fusion_max_gaussians is not None and int(fused.count()[0]) > int(fusion_max_gaussians):
        fused = fused.prune(max_count=int(fusion_max_gaussians))
    counts["final"] = int(fused.count()[0])
    return fused, counts
