"""The project's own tiled, differentiable PyTorch rasteriser (any device)."""

from __future__ import annotations

import math

import torch
import torch.utils.checkpoint
from torch import Tensor

from models.core.gaussians import Gaussians
from models.core.sh import eval_sh
from models.render.output import (
    RenderOutput,
)
from models.render.projection import (
    ALPHA_THRESHOLD,
    EPS2D,
    project_views,
)

__all__ = ["MAX_ALPHA", "TRANSMITTANCE_MIN"]

MAX_ALPHA = 0.999
TRANSMITTANCE_MIN = 1e-4
_MAX_CHUNK = 1024  # largest number of Gaussians per tile per round
_NEG_SIGMA_FLOOR = -20.0  # exp(-20) * opacity < 1/255: such alphas are skipped anyway


# ---------------------------------------------------------------------------------- torch backend
def _min_sigma_over_boxes(delta_lo: Tensor, delta_hi: Tensor, conics: Tensor) -> Tensor:
    """Minimum of ``sigma(d) = a dx^2 / 2 + b dx dy + c dy^2 / 2`` over boxes of offsets ``d``.

    Args:
        delta_lo: ``[M, 2]`` lower corner of the box of ``pixel - mean`` offsets.
        delta_hi: ``[M, 2]`` upper corner.
        conics: ``[M, 3]`` ``(a, b, c)`` of positive-definite conics.

    Returns:
        ``[M]`` the minimum (0 when the box holds the mean). The quadratic is convex, so when the
        mean is outside the box the minimum lies on one of its four edges.
    """
    a, b, c = conics.unbind(-1)

    def sigma(dx: Tensor, dy: Tensor) -> Tensor:
        return 0.5 * (a * dx * dx + c * dy * dy) + b * dx * dy

    best = torch.full_like(a, float("inf"))
    for x_edge in (delta_lo[:, 0], delta_hi[:, 0]):
        dy = torch.minimum(torch.maximum(-b * x_edge / c, delta_lo[:, 1]), delta_hi[:, 1])
        best = torch.minimum(best, sigma(x_edge, dy))
    for y_edge in (delta_lo[:, 1], delta_hi[:, 1]):
        dx = torch.minimum(torch.maximum(-b * y_edge / a, delta_lo[:, 0]), delta_hi[:, 0])
        best = torch.minimum(best, sigma(dx, y_edge))
    inside = ((delta_lo <= 0) & (delta_hi >= 0)).all(dim=-1)
    return torch.where(inside, torch.zeros_like(best), best)


@torch.no_grad()
def _bin_tiles(
    means2d: Tensor,
    conics: Tensor,
    opacities: Tensor,
    radii: Tensor,
    image_ids: Tensor,
    num_images: int,
    image_size: tuple[int, int],
    tile_size: int,
) -> tuple[Tensor, Tensor, Tensor]:
    """Tile/Gaussian intersections sorted by tile, then by depth.

    A Gaussian goes to every tile its bounding box touches (gsplat's rule), except tiles where its
    alpha is below ``1/255`` at every pixel centre (an exact ellipse/tile test, so dropping them
    changes no pixel).

    Args:
        means2d: ``[P, 2]`` pixel centres of the visible (image, Gaussian) pairs, in depth order.
        conics: ``[P, 3]`` their conics.
        opacities: ``[P]`` their opacities.
        radii: ``[P, 2]`` bounding-box half-sizes.
        image_ids: ``[P]`` flat image index of each pair.
        num_images: number of images ``I``.
        image_size: ``(H, W)``.
        tile_size: tile side in pixels.

    Returns:
        ``pair_ids [M]`` (intersections sorted by tile, then depth), ``tile_start [T]`` and
        ``tile_end [T]`` offsets into them per flat tile id (``T = I * tiles_y * tiles_x``).
    """
    height, width = image_size
    tiles_y, tiles_x = math.ceil(height / tile_size), math.ceil(width / tile_size)
    num_pairs = means2d.shape[0]
    # gsplat's tile range of the bounding box (float32, like its kernel).
    centre = means2d.float() / tile_size  # [P, 2]
    extent = radii.float() / tile_size  # [P, 2]
    upper = torch.tensor([tiles_x, tiles_y], device=centre.device)
    low = torch.minimum(torch.floor(centre - extent).long().clamp_min(0), upper)
    high = torch.minimum(torch.ceil(centre + extent).long().clamp_min(0), upper)
    span = high - low  # [P, 2]
    counts = span[:, 0] * span[:, 1]  # [P]
    pair = torch.repeat_interleave(torch.arange(num_pairs, device=counts.device), counts)  # [M]
    local = torch.arange(pair.shape[0], device=counts.device) - (counts.cumsum(0) - counts)[pair]
    span_x = span[pair, 0]
    tile_x = low[pair, 0] + local % span_x  # [M]
    tile_y = low[pair, 1] + local // span_x

    # Exact culling: keep the pair when the minimum of sigma over the tile's pixel centres can
    # reach ln(255 o) (alpha >= 1/255); the margin absorbs rounding.
    corner = torch.stack([tile_x, tile_y], dim=-1) * tile_size  # [M, 2]
    limit = torch.tensor([width, height], device=corner.device)
    box_lo = corner.to(means2d.dtype) + 0.5
    box_hi = torch.minimum(corner + tile_size, limit).to(means2d.dtype) - 0.5
    mean = means2d[pair]
    min_sigma = _min_sigma_over_boxes(box_lo - mean, box_hi - mean, conics[pair])
    reach = torch.log(opacities[pair] / ALPHA_THRESHOLD)
    hit = min_sigma <= reach + 1e-3 * (1.0 + reach.abs())
    pair, tile_x, tile_y = pair[hit], tile_x[hit], tile_y[hit]

    tile = (image_ids[pair] * tiles_y + tile_y) * tiles_x + tile_x  # [M] flat tile id
    stride = max(num_pairs, 1)
    keys = torch.sort(tile * stride + pair).values  # pairs are in depth order already
    tile = keys // stride
    tile_end = torch.bincount(tile, minlength=num_images * tiles_y * tiles_x).cumsum(0)
    tile_start = torch.cat([tile_end.new_zeros(1), tile_end[:-1]])
    return keys % stride, tile_start, tile_end


def _composite_step(
    gathered: Tensor,
    in_list: Tensor,
    origin: Tensor,
    centres: Tensor,
    t_before: Tensor,
    was_done: Tensor,
) -> tuple[Tensor, Tensor, Tensor]:
    """Composite the next ``C`` Gaussians of ``n`` tiles over the tiles' pixels.

    Args:
        gathered: ``[n, C, 11]`` features of each tile's next Gaussians (see
            :func:`_composite_tiles`).
        in_list: ``[n, C]`` bool, false for padding past the end of a tile's list.
        origin: ``[n, 2]`` pixel coordinates (x, y) of each tile's top-left corner.
        centres: ``[t]`` pixel-centre offsets within a tile, ``0.5 .. t - 0.5``.
        t_before: ``[n, p]`` transmittance before these Gaussians.
        was_done: ``[n, p]`` bool, pixels that stopped earlier (or lie outside the image).

    Returns:
        ``contribution [n, p, 5]`` (r, g, b, depth, alpha), ``t_after [n, p]`` and
        ``now_done [n, p]``.
    """
    n, pixels = t_before.shape
    dtype = t_before.dtype
    # sigma = a dx^2 / 2 + c dy^2 / 2 + b dx dy with d = mean - pixel centre, separable over the
    # tile's rows and columns, evaluated in gsplat's order; the features hold -a/2, -b, -c/2, so
    # this is exactly -sigma. Layout [n, pixel, Gaussian].
    per_gaussian = gathered.transpose(1, 2)[:, :, None, :]  # [n, 11, 1, C]
    dx = per_gaussian[:, 0] - (origin[:, 0, None, None] + centres[:, None])  # [n, t, C]
    dy = per_gaussian[:, 1] - (origin[:, 1, None, None] + centres[:, None])
    quad_x = per_gaussian[:, 2] * dx * dx  # [n, t, C]
    quad_y = per_gaussian[:, 4] * dy * dy
    cross_x = per_gaussian[:, 3] * dx
    neg_sigma = torch.addcmul(
        quad_y[:, :, None] + quad_x[:, None],
        dy[:, :, None],
        cross_x[:, None],
    ).reshape(n, pixels, -1)  # [n, p, C], pixel = row * t + column
    opacity = torch.where(in_list, gathered[..., 5], 0.0)[:, None]  # [n, 1, C]
    # exp of a floored -sigma: alphas that small are skipped anyway, and the floor keeps exp away
    # from denormal results, which are an order of magnitude slower on CPUs.
    alpha = torch.exp(torch.clamp_min(neg_sigma, _NEG_SIGMA_FLOOR))
    alpha = torch.clamp_max(opacity * alpha, MAX_ALPHA)  # [n, p, C]
    with torch.no_grad():
        # Skip sigma < 0 and alpha < 1/255. Masks are built from sign() in float: exact, and far
        # faster than boolean tensors on CPUs.
        keep = torch.maximum(neg_sigma, ALPHA_THRESHOLD - alpha).sign_()
        keep = keep.neg_().add_(1.0).clamp_(0.0, 1.0)
    alpha = alpha * keep
    t_after = t_before[:, :, None] * torch.cumprod(1.0 - alpha, dim=2)  # [n, p, C]
    weights = alpha * torch.cat([t_before[:, :, None], t_after[:, :, :-1]], dim=2)
    with torch.no_grad():
        # gsplat: the Gaussian that would take T to <= 1e-4 is not composited and the pixel
        # stops. T only decreases, so the kept Gaussians are a prefix.
        stops = (t_after[:, :, -1] <= TRANSMITTANCE_MIN) & ~was_done  # [n, p]
        now_done = was_done | stops
        alive = (~was_done).to(dtype)[..., None]  # [n, p, 1]
    if bool(stops.any()):
        with torch.no_grad():
            before_stop = (t_after - TRANSMITTANCE_MIN).sign_().clamp_(0.0, 1.0)
        weights = weights * before_stop
    contribution = torch.bmm(weights, gathered[..., 6:]) * alive  # [n, p, 5]
    return contribution, t_after[:, :, -1].contiguous(), now_done


def _composite_tiles(
    features: Tensor,
    pair_ids: Tensor,
    tile_start: Tensor,
    tile_end: Tensor,
    image_size: tuple[int, int],
    tile_size: int,
    chunk: int,
    max_elements: int,
    recompute: bool,
) -> Tensor:
    """Front-to-back compositing of each tile's depth-sorted Gaussians.

    All active tiles advance together through their lists, at least ``chunk`` Gaussians per round
    (lists are padded at their ends); a tile leaves the active set once its list is exhausted or
    all its pixels have stopped (early termination). Within a round the active tiles are split into
    steps of at most ``max_elements`` (tile, pixel, Gaussian) entries, so no all-pixels x
    all-Gaussians tensor is ever built; when few tiles remain, rounds take more Gaussians per tile
    to use that budget. The alpha-skip and transmittance-stop rules are applied as masks, so
    autograd differentiates exactly what the forward pass composited.

    Args:
        features: ``[P, 11]`` per pair: ``x, y`` (pixels), ``-a/2, -b, -c/2`` of the conic,
            opacity, ``r, g, b``, depth, 1.
        pair_ids: ``[M]`` intersections sorted by tile, then depth.
        tile_start: ``[T]`` first intersection of each flat tile.
        tile_end: ``[T]`` one past its last.
        image_size: ``(H, W)``.
        tile_size: tile side in pixels.
        chunk: Gaussians per tile per round (at least).
        max_elements: bound on the entries of one step, ``tiles * Gaussians * tile_size^2``.
        recompute: under autograd, keep only each step's inputs and recompute the step in the
            backward pass (activation checkpointing), so memory does not grow with the number of
            entries composited.

    Returns:
        ``[T, tile_size^2, 5]`` accumulated ``r, g, b, depth, alpha`` per tile pixel.
    """
    height, width = image_size
    tiles_y, tiles_x = math.ceil(height / tile_size), math.ceil(width / tile_size)
    device, dtype = features.device, features.dtype
    num_tiles = tile_start.shape[0]
    pixels = tile_size * tile_size
    offsets = torch.arange(pixels, device=device)
    centres = torch.arange(tile_size, device=device).to(dtype) + 0.5  # [t] pixel centres

    lengths = tile_end - tile_start  # [T]
    active = torch.nonzero(lengths > 0).squeeze(1)  # [A] flat tile ids
    tile_x0 = (active % tiles_x) * tile_size  # [A]
    tile_y0 = (active // tiles_x % tiles_y) * tile_size
    outside = (tile_x0[:, None] + offsets % tile_size >= width) | (
        tile_y0[:, None] + offsets // tile_size >= height
    )  # [A, p] pixels beyond the image edge never composite
    done = outside
    transmittance = torch.ones(active.shape[0], pixels, device=device, dtype=dtype)
    # Per active tile; the zero-times-features term keeps outputs attached to the inputs.
    accumulated = features.new_zeros(active.shape[0], pixels, 5) + 0.0 * features[:, 6:].sum()
    finished_ids, finished_values = [active[:0]], [accumulated[:0]]
    last = max(pair_ids.shape[0] - 1, 0)
    start = 0  # list position of this round's first Gaussian
    while active.numel() > 0:
        # Once few tiles remain active, take more of each list per round (fewer, larger steps),
        # but never more than the longest remaining list.
        size = max(chunk, min(max_elements // (active.shape[0] * pixels), _MAX_CHUNK))
        size = min(size, int((lengths[active] - start).max()))
        steps = torch.arange(size, device=device)
        per_step = max(1, max_elements // (size * pixels))
        next_t, next_done, next_acc = [], [], []
        for s in range(0, active.shape[0], per_step):
            tiles = active[s : s + per_step]  # [n]
            t_before = transmittance[s : s + per_step]  # [n, p]
            was_done = done[s : s + per_step]  # [n, p]
            position = tile_start[tiles, None] + start + steps  # [n, C]
            gathered = features[pair_ids[position.clamp_max(last)]]  # [n, C, 11]
            in_list = position < tile_end[tiles, None]  # [n, C]
            origin = torch.stack([tiles % tiles_x, tiles // tiles_x % tiles_y], 1) * tile_size
            args = (gathered, in_list, origin.to(dtype), centres, t_before, was_done)
            if recompute and torch.is_grad_enabled() and gathered.requires_grad:
                contribution, t_last, now_done = torch.utils.checkpoint.checkpoint(
                    _composite_step, *args, use_reentrant=False
                )
            else:
                contribution, t_last, now_done = _composite_step(*args)
            next_acc.append(accumulated[s : s + per_step] + contribution)
            next_t.append(t_last)
            next_done.append(now_done)
        start += size
        accumulated = torch.cat(next_acc)
        transmittance = torch.cat(next_t)
        done = torch.cat(next_done)
        remaining = (lengths[active] > start) & ~done.all(dim=1)
        finished_ids.append(active[~remaining])
        finished_values.append(accumulated[~remaining])
        active, accumulated = active[remaining], accumulated[remaining]
        transmittance, done = transmittance[remaining], done[remaining]
    result = features.new_zeros(num_tiles, pixels, 5)
    return result.index_copy(0, torch.cat(finished_ids), torch.cat(finished_values))


def _render_torch(
    gaussians: Gaussians,
    extrinsics: Tensor,
    intrinsics: Tensor,
    image_size: tuple[int, int],
    background: Tensor,
    near: float | Tensor,
    far: float | Tensor,
    tile_size: int,
    chunk: int,
    max_elements: int,
    recompute: bool,
    rasterize_mode: str = "classic",
    eps2d: float = EPS2D,
) -> RenderOutput:
    """The tiled PyTorch rasteriser (any device, differentiable through autograd)."""
    height, width = image_size
    batch, views = extrinsics.shape[:2]
    num = gaussians.num_slots
    projection, valid = project_views(
        gaussians, extrinsics, intrinsics, image_size, near, far, rasterize_mode, eps2d
    )  # valid: [B, V, N]
    radii = projection.radii * valid[..., None]

    # Visible (image, Gaussian) pairs in depth order (ties: image, then Gaussian index, as gsplat).
    image_ids, gauss_ids = torch.nonzero(valid.reshape(batch * views, num), as_tuple=True)
    depths = projection.depths.reshape(batch * views, num)[image_ids, gauss_ids]  # [P]
    order = torch.sort(depths.detach(), stable=True).indices
    image_ids, gauss_ids, depths = image_ids[order], gauss_ids[order], depths[order]
    scene_ids = image_ids // views
    means2d = projection.means2d.reshape(batch * views, num, 2)[image_ids, gauss_ids]  # [P, 2]
    conics = projection.conics.reshape(batch * views, num, 3)[image_ids, gauss_ids]  # [P, 3]
    opacities = gaussians.opacities[scene_ids, gauss_ids]  # [P]
    if projection.compensations is not None:
        compensations = projection.compensations.reshape(batch * views, num)
        opacities = opacities * compensations[image_ids, gauss_ids]  # [P]
    centres = extrinsics[..., :3, 3].reshape(batch * views, 3)[image_ids]  # [P, 3]
    directions = gaussians.means[scene_ids, gauss_ids] - centres  # [P, 3]
    colors = eval_sh(gaussians.harmonics[scene_ids, gauss_ids], directions) + 0.5
    features = torch.cat(
        [
            means2d,
            -0.5 * conics[:, :1],
            -conics[:, 1:2],
            -0.5 * conics[:, 2:],
            opacities[:, None],
            torch.clamp_min(colors, 0.0),
            depths[:, None],
            torch.ones_like(depths[:, None]),
        ],
        dim=1,
    )  # [P, 11]

    pair_radii = radii.reshape(batch * views, num, 2)[image_ids, gauss_ids]  # [P, 2]
    pair_ids, tile_start, tile_end = _bin_tiles(
        means2d.detach(),
        conics.detach(),
        opacities.detach(),
        pair_radii,
        image_ids,
        batch * views,
        image_size,
        tile_size,
    )
    tiles_y, tiles_x = math.ceil(height / tile_size), math.ceil(width / tile_size)
    accumulated = _composite_tiles(
        features,
        pair_ids,
        tile_start,
        tile_end,
        image_size,
        tile_size,
        chunk,
        max_elements,
        recompute,
    )  # [T, p, 5]
    image = accumulated.reshape(batch, views, tiles_y, tiles_x, tile_size, tile_size, 5)
    image = image.permute(0, 1, 6, 2, 4, 3, 5).reshape(
        batch, views, 5, tiles_y * tile_size, tiles_x * tile_size
    )[..., :height, :width]  # [B, V, 5, H, W]
    alpha = image[:, :, 4]
    color = image[:, :, :3] + background[..., None, None] * (1.0 - alpha[:, :, None])
    return RenderOutput(
        color=color, depth=image[:, :, 3], alpha=alpha, radii=radii, means2d=projection.means2d
    )
