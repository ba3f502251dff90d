"""Windows of a capture fused into one Gaussian set in the capture's frame.

Frames. The **capture frame** is the frame every whole-capture output is written in: the
capture's own poses (SfM, COLMAP or ``cameras.json``) moved by :func:`capture_frame`, the same
similarity ``models.inference`` and ``SfmResult.export`` apply to the views of one output (first
view the identity, largest camera distance 1), so ``gaussians.ply``, ``cameras.json`` and
``sparse/`` agree. Each window is reconstructed in its own normalised frame
(``models.inference.reconstruct``, DESIGN "Scene frame"); :func:`window_to_capture` is the one
place that maps a window's frame to the capture frame: a similarity fitted to the window's
cameras (as reconstruct placed them: the given ones renormalised, or those a pose-free model
predicted or refined) and the same photos' capture cameras: rotation from the cameras'
orientations, scale from the spread of their centres (a window whose centres coincide: the
``scale`` passed, e.g. from a recipe's scale rule, else the ratio of depths), translation from
the centroids. Without capture poses (pose-free photos), the first window's frame is the capture
frame and each next one is chained through the photos it shares with earlier ones.

Duplicates. Where windows overlap, a surface is predicted once per window. The rule
(:func:`remove_duplicates`): the scene is cut into voxels of side ``voxel`` (default: the
median pixel footprint, ``depth / focal`` in the nearest own camera, of all Gaussians); in every
voxel that holds Gaussians of several windows only those of the window that sees it best are
kept, "best" being the smallest mean depth of its Gaussians there in the nearest camera of their
own window (the closest, sharpest view). ``max_gaussians`` then keeps the most opaque.

Floaters. Before that, :func:`remove_floaters` drops the Gaussians that other windows see
through: each window's own Gaussians give a depth map per camera (``render``'s expected depth
over its alpha, where alpha > 0.5); a Gaussian of another window that projects into such a
camera nearer than ``(1 - margin)`` of that depth lies in space the camera sees empty. A
Gaussian is removed when most of the other windows' cameras that see its pixel say so. Without
it, a wrongly placed Gaussian of one window occludes the views of all the others.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from models.gaussians import Gaussians
from models.geometry.cameras import camera_centers, normalize_scene
from models.geometry.similarity import Similarity, nearest_rotation

__all__ = [
    "capture_frame",
    "depth_ratio",
    "fuse_windows",
    "pixel_footprint",
    "remove_duplicates",
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
    from models.geometry.cameras import project
    from models.render.core import render

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
    from models.geometry.cameras import transform_points, world_to_camera

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


def remove_duplicates(
    sets: Sequence[Gaussians],
    cameras: Sequence[tuple[Tensor, Tensor]],
    shape: tuple[int, int],
    voxel: float | None = None,
) -> tuple[Gaussians, dict]:
    """One set from per-window ``sets`` (each a batch of one, in the capture frame) without the
    duplicates of overlapping windows (module doc).

    Args:
        sets: per window.
        cameras: per window ``(extrinsics [V, 4, 4], intrinsics [V, 3, 3])`` in the capture frame.
        shape: ``(H, W)`` of the window's images (pixel footprint).
        voxel: voxel side in capture units (``None``: the median pixel footprint).

    Returns:
        The fused set and counts (``before``, ``after``, ``removed``, ``voxel``, ``per_window``).
    """
    valid = [g.valid_mask()[0] for g in sets]
    means = torch.cat([g.means[0][m] for g, m in zip(sets, valid)]).double()  # [N, 3]
    window = torch.cat(
        [torch.full((int(m.sum()),), i, dtype=torch.long) for i, m in enumerate(valid)]
    ).to(means.device)
    depth, footprint = [], []
    for g, m, (e, k) in zip(sets, valid, cameras):
        d, f = pixel_footprint(g.means[0][m].double(), e.double(), k.double(), shape)
        depth.append(d)
        footprint.append(f)
    depth, footprint = torch.cat(depth), torch.cat(footprint)
    if voxel is None:
        finite = footprint[torch.isfinite(footprint)]
        voxel = float(finite.median()) if finite.numel() else 1e-2
    voxel = max(float(voxel), 1e-9)
    cell = torch.floor((means - means.min(0).values) / voxel).long()  # [N, 3]
    _, voxel_id = torch.unique(cell, dim=0, return_inverse=True)  # [N]
    count = len(sets)
    group = voxel_id * count + window  # (voxel, window)
    groups, group_id = torch.unique(group, return_inverse=True)
    seen = torch.isfinite(depth)
    total = torch.zeros(len(groups), dtype=torch.float64, device=means.device)
    total.index_add_(0, group_id, torch.where(seen, depth, torch.zeros_like(depth)))
    size = torch.zeros(len(groups), dtype=torch.float64, device=means.device)
    size.index_add_(0, group_id, seen.double())
    # mean depth of a window's Gaussians in a voxel, over those its cameras see (none: inf)
    score = torch.where(size > 0, total / size.clamp_min(1), torch.full_like(total, float("inf")))
    group_voxel, group_window = groups // count, groups % count
    voxels = int(group_voxel.max()) + 1
    best = torch.full((voxels,), float("inf"), dtype=torch.float64, device=means.device)
    best = best.scatter_reduce(0, group_voxel, score, reduce="amin")
    keep_group = score <= best[group_voxel]
    # ties: the first window
    first = torch.full((voxels,), count, dtype=torch.long, device=means.device)
    first = first.scatter_reduce(
        0, group_voxel[keep_group], group_window[keep_group], reduce="amin"
    )
    keep_group &= group_window == first[group_voxel]
    keep = keep_group[group_id]  # [N]
    merged = Gaussians.cat([g.compact() if g.mask is not None else g for g in sets])
    if merged.mask is not None:
        merged = merged.compact()
    flat_keep = keep[None]
    fused = merged._gather(torch.nonzero(flat_keep[0])[:, 0][None])
    fused.mask = None
    counts = {
        "before": int(len(keep)),
        "after": int(keep.sum()),
        "removed": int((~keep).sum()),
        "voxel": round(voxel, 6),
        "per_window": [int(keep[window == i].sum()) for i in range(count)],
    }
    return fused, counts


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
    from models.geometry.cameras import transform_points, world_to_camera
    from models.render.core import render

    depth_maps = []
    for g, (e, k) in zip(sets, cameras):
        with torch.inference_mode():
            out = render(g, e[None].to(g.means), k[None].to(g.means), shape, backend=backend)
        alpha = out.alpha[0].float()  # [V, H, W]
        depth = out.depth[0].float() / alpha.clamp_min(1e-6)
        depth_maps.append(torch.where(alpha > 0.5, depth, torch.zeros_like(depth)).cpu())
    height, width = shape
    kept, removed = [], 0
    for v, g in enumerate(sets):
        means = g.means[0].detach().float().cpu()  # [N, 3]
        seen = torch.zeros(len(means))
        free = torch.zeros(len(means))
        for w, (e, k) in enumerate(cameras):
            if w == v:
                continue
            local = transform_points(world_to_camera(e.float().cpu()), means[None])  # [V, N, 3]
            z = local[..., 2]
            k = k.float().cpu()
            u = k[:, None, 0, 0] * local[..., 0] / z.clamp_min(1e-8) + k[:, None, 0, 2]
            y = k[:, None, 1, 1] * local[..., 1] / z.clamp_min(1e-8) + k[:, None, 1, 2]
            col = (u * width).floor().long()
            row = (y * height).floor().long()
            inside = (z > 1e-6) & (col >= 0) & (col < width) & (row >= 0) & (row < height)
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
    return kept, removed


def fuse_windows(
    sets: Sequence[Gaussians],
    cameras: Sequence[tuple[Tensor, Tensor]],
    shape: tuple[int, int],
    voxel: float | None = None,
    max_gaussians: int | None = None,
    backend: str = "auto",
) -> tuple[Gaussians, dict]:
    """:func:`remove_floaters`, :func:`remove_duplicates`, then ``max_gaussians`` (the most
    opaque); counts: ``predicted``, ``floaters_removed``, ``before`` / ``after`` duplicates,
    ``final``."""
    if len(sets) == 1:
        g = sets[0].compact() if sets[0].mask is not None else sets[0]
        n = int(g.count()[0])
        fused, counts = g, {"before": n, "after": n, "removed": 0, "voxel": None}
        counts["per_window"] = [n]
    else:
        before = sum(int(g.count()[0]) for g in sets)
        sets, floaters = remove_floaters(sets, cameras, shape, backend=backend)
        fused, counts = remove_duplicates(sets, cameras, shape, voxel)
        counts = {"predicted": before, "floaters_removed": floaters, **counts}
    if max_gaussians is not None and int(fused.count()[0]) > int(max_gaussians):
        fused = fused.prune(max_count=int(max_gaussians))
    counts["final"] = int(fused.count()[0])
    return fused, counts
