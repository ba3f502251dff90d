"""Where a refinement starts: structure-from-motion points initialised as 3DGS does (Kerbl et al.
2023), the feed-forward set, or both merged (:func:`merged_start`, ``refine_init=auto``)."""

from __future__ import annotations

import torch
from torch import Tensor

from models.core.gaussians import Gaussians, rgb_to_sh
from models.geometry.cameras import project
from models.layers.knn import knn
from models.pipeline.refine.plan import importance, screen_radii

__all__ = ["START_RULES", "depth_agreement", "gaussians_from_points", "merged_start"]

#: The starts a fit can take: ``auto`` (:func:`merged_start`), ``feed_forward``, ``sfm``.
START_RULES = ("auto", "feed_forward", "sfm")
#: A feed-forward Gaussian fills a gap of the SfM cloud when its nearest SfM point is farther
#: than this many times that point's own spacing (its scale: the RMS distance to 3 neighbours).
GAP_FACTOR = 2.0
#: Depth agreement: the SfM points' depth in a training view is the nearest point's depth in each
#: cell of this many pixels (at the fit's size) ...
DEPTH_CELL = 8
#: ... and a gap-filling Gaussian agrees with it when its own depth there is within this factor
#: (between 1 / DEPTH_RATIO and DEPTH_RATIO times the points' depth).
DEPTH_RATIO = 1.25


def gaussians_from_points(
    xyz: Tensor, rgb: Tensor, sh_degree: int = 3, opacity: float = 0.1, scale_factor: float = 1.0
) -> Gaussians:
    """3DGS's initialisation: one isotropic Gaussian per point.

    Args:
        xyz: ``[N, 3]`` positions (``N >= 2``).
        rgb: ``[N, 3]`` colours in [0, 1] (uint8 is divided by 255).
        sh_degree: SH degree of the result (higher bands zero).
        opacity: every Gaussian's opacity.
        scale_factor: multiplies the scale.

    Returns:
        A batch of one scene: scale = the root mean square distance to the 3 nearest other
        points (``models.layers.knn``), rotation identity, DC colour = ``rgb``.
    """
    xyz = torch.as_tensor(xyz).float()
    rgb = torch.as_tensor(rgb)
    rgb = rgb.float() / 255.0 if rgb.dtype == torch.uint8 else rgb.float()
    if xyz.ndim != 2 or xyz.shape[-1] != 3 or xyz.shape[0] < 2 or rgb.shape != xyz.shape:
        raise ValueError(
            f"points need xyz and rgb [N, 3] with N >= 2, got {tuple(xyz.shape)}, {tuple(rgb.shape)}"
        )
    k = min(4, xyz.shape[0])
    index = knn(xyz, k)[:, 1:]  # [N, k-1] (the point itself first)
    distance = (xyz[index] - xyz[:, None]).square().sum(-1).mean(-1).sqrt()  # [N]
    positive = distance[distance > 0]
    floor = float(positive.min()) if positive.numel() else 1e-3
    scale = distance.clamp_min(floor) * scale_factor
    count = xyz.shape[0]
    harmonics = torch.zeros(count, 3, (sh_degree + 1) ** 2)
    harmonics[:, :, 0] = rgb_to_sh(rgb.clamp(0, 1))
    rotations = torch.zeros(count, 4)
    rotations[:, 0] = 1.0
    return Gaussians(
        means=xyz[None],
        scales=scale[:, None].expand(count, 3).contiguous()[None],
        rotations=rotations[None],
        opacities=torch.full((1, count), float(opacity)),
        harmonics=harmonics[None],
    )


def _nearest(queries: Tensor, points: Tensor, block: int = 4096) -> Tensor:
    """``[Q]`` index of the nearest of ``points`` ``[P, 3]`` to each of ``queries`` ``[Q, 3]``."""
    out = [
        torch.cdist(queries[i : i + block], points).argmin(-1)
        for i in range(0, len(queries), block)
    ]
    return torch.cat(out) if out else queries.new_zeros(0, dtype=torch.long)


@torch.no_grad()
def depth_agreement(
    means: Tensor, points: Tensor, extrinsics: Tensor, intrinsics: Tensor, shape: tuple[int, int]
) -> Tensor:
    """``[N]`` bool: whether each of ``means`` ``[N, 3]`` lies at the depth of the SfM ``points``
    ``[P, 3]`` in every training view where both fall in one cell of :data:`DEPTH_CELL` pixels
    (the nearest point's depth, within :data:`DEPTH_RATIO`), and in at least one such view.
    Where no point falls in its cell in any view nothing confirms it either: ``False`` (on the
    garden orbit of docs/refine.md those were the object's black surroundings, and keeping
    them ended 1.8 dB below the SfM start).

    A Gaussian in front of that depth floats in space the photos' matches saw through; one behind
    it is hidden where SfM sees a surface and shows through where it does not (the shipped toy
    models put most of their gap-fillers there, large and opaque: docs/refine.md). Views
    ``extrinsics`` ``[V, 4, 4]``, normalised ``intrinsics`` ``[V, 3, 3]``, at ``shape``."""
    height, width = shape
    rows, cols = -(-height // DEPTH_CELL), -(-width // DEPTH_CELL)
    seen = torch.zeros(len(means), dtype=torch.bool, device=means.device)
    disagree = torch.zeros_like(seen)
    for camera, k in zip(extrinsics, intrinsics):
        cell_p, depth_p = _cells(points, camera, k, shape, rows, cols)
        inside = cell_p >= 0
        nearest = torch.full((rows * cols,), float("inf"), device=means.device)
        nearest.scatter_reduce_(0, cell_p[inside], depth_p[inside], "amin")
        cell_m, depth_m = _cells(means, camera, k, shape, rows, cols)
        surface = nearest[cell_m.clamp_min(0)]
        judged = (cell_m >= 0) & torch.isfinite(surface)
        ratio = depth_m / surface.clamp_min(1e-9)
        seen |= judged
        disagree |= judged & ((ratio > DEPTH_RATIO) | (ratio < 1 / DEPTH_RATIO))
    return seen & ~disagree


def _cells(
    xyz: Tensor, camera: Tensor, k: Tensor, shape, rows: int, cols: int
) -> tuple[Tensor, Tensor]:
    """``[N]`` the cell index (``-1`` outside the view or behind it) and depth of ``xyz``
    ``[N, 3]`` in one view."""
    uv, depth = project(xyz.float(), camera.float(), k.float())  # [N, 2], [N]
    inside = (depth > 0) & (uv >= 0).all(-1) & (uv < 1).all(-1)
    row = (uv[:, 1] * shape[0] / DEPTH_CELL).long().clamp(0, rows - 1)
    col = (uv[:, 0] * shape[1] / DEPTH_CELL).long().clamp(0, cols - 1)
    return torch.where(inside, row * cols + col, -1), depth


@torch.no_grad()
def merged_start(
    feed_forward: Gaussians | None,
    points: Gaussians | None,
    extrinsics: Tensor,
    intrinsics: Tensor,
    shape: tuple[int, int],
) -> tuple[Gaussians, dict[str, int]]:
    """``refine_init=auto``: the SfM points where the capture has them, plus the feed-forward
    Gaussians that fill the gaps of that cloud; only the training cameras are used.

    Rule: with no SfM points, the feed-forward set; with no feed-forward set, the points. Else
    every SfM Gaussian (3DGS's start: the geometry the photos' matches agree on), and of the
    feed-forward Gaussians those farther from their nearest SfM point than :data:`GAP_FACTOR`
    times that point's spacing (between the points) that also agree with the points' depth in
    the training views (:func:`depth_agreement`), the most important first (opacity x footprint
    in the training views ``extrinsics`` ``[V, 4, 4]``, ``intrinsics`` ``[V, 3, 3]`` normalised,
    at ``shape``), at most as many as the points: the fit's budget then prunes the merged set by
    the same importance when it must.

    Returns:
        ``(start, counts)``: a batch of one (the points' SH degree) and ``{"sfm", "feed_forward"}``
        how many of each it holds (with both, ``"off_depth"`` too: the gap-fillers left out by
        :func:`depth_agreement`).
    """
    if points is None or feed_forward is None:
        start = points if feed_forward is None else feed_forward
        start = start.compact() if start.mask is not None else start
        kind = "sfm" if feed_forward is None else "feed_forward"
        return start, {"sfm": 0, "feed_forward": 0, kind: int(start.count()[0])}
    ff = feed_forward.compact() if feed_forward.mask is not None else feed_forward
    ff = ff.to(points.device)
    nearest = _nearest(ff.means[0].float(), points.means[0].float())
    gap = (ff.means[0] - points.means[0][nearest]).norm(dim=-1)
    fills = torch.nonzero(gap > GAP_FACTOR * points.scales[0, nearest, 0])[:, 0]
    agree = depth_agreement(ff.means[0][fills], points.means[0], extrinsics, intrinsics, shape)
    fills, left_out = fills[agree], int((~agree).sum())
    radii = screen_radii(ff.means[0][fills], ff.scales[0][fills], extrinsics, intrinsics, shape)
    score = importance(radii, ff.opacities[0][fills], shape)
    keep = fills[torch.argsort(score, descending=True)[: points.means.shape[1]]]
    chosen = ff.map(lambda t: t[:, keep])
    degree = (points.sh_degree + 1) ** 2
    harmonics = chosen.harmonics[..., :degree]
    if harmonics.shape[-1] < degree:
        harmonics = torch.nn.functional.pad(harmonics, (0, degree - harmonics.shape[-1]))
    start = Gaussians.cat([points, chosen.replace(harmonics=harmonics)])
    counts = {"sfm": int(points.means.shape[1]), "feed_forward": int(keep.numel())}
    return start, {**counts, "off_depth": left_out}
