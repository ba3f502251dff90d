"""Gaussian splatting renderer: gsplat's CUDA rasteriser and a tiled, differentiable PyTorch one.

Both backends follow gsplat's numerics (gsplat 1.5, ``rasterize_mode="classic"``):

- EWA projection: camera covariance ``W R S S^T R^T W^T``, Jacobian of the pinhole projection
  with ``x/z`` and ``y/z`` clamped to the image extent plus 30% of the half field of view, and
  ``0.3`` added to the diagonal of the 2D covariance (no opacity compensation).
- Culling: depth outside ``[near, far]``, a singular 2D covariance, opacity below ``1/255``, or a
  bounding box outside the image. The box is gsplat's opacity-aware one: half-sizes
  ``ceil(e * sqrt(cov2d_xx))`` and ``ceil(e * sqrt(cov2d_yy))`` with
  ``e = min(3.33, sqrt(2 ln(255 o)))``, which contains every pixel the Gaussian can reach with an
  alpha of at least ``1/255``.
- Compositing per 16x16 tile, front to back by depth: pixel centres at ``+0.5``,
  ``alpha = min(0.999, o exp(-sigma))``, alphas below ``1/255`` are skipped, and a pixel stops at
  the first Gaussian that would take its transmittance to ``1e-4`` or below (that Gaussian is not
  composited). The background is added with the remaining transmittance.
- Colour: ``max(SH(mean - camera centre) + 0.5, 0)``.

``rasterize_mode="antialiased"`` (gsplat's, from Mip-Splatting) multiplies each Gaussian's opacity
per camera by the compensation ``sqrt(max(0, det(S) / det(S + 0.3 I)))`` of the 0.3 dilation of its
2D covariance ``S`` before culling, the bounding box and compositing (see
:func:`opacity_compensation`).
"""

from __future__ import annotations

import functools
import math
import warnings
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import Tensor

from .cameras import intrinsics_to_pixels, world_to_camera
from .gaussians import Gaussians
from .sh import eval_sh, sh_degree_of

__all__ = [
    "ALPHA_THRESHOLD",
    "BACKENDS",
    "EPS2D",
    "MAX_ALPHA",
    "RASTERIZE_MODES",
    "TILE_SIZE",
    "TRANSMITTANCE_MIN",
    "Projection",
    "RenderOutput",
    "gsplat_available",
    "opacity_compensation",
    "project_gaussians",
    "render",
]

TILE_SIZE = 16
ALPHA_THRESHOLD = 1.0 / 255.0
MAX_ALPHA = 0.999
TRANSMITTANCE_MIN = 1e-4
EPS2D = 0.3
BOX_EXTEND = 3.33  # gsplat's bounding-box extent in standard deviations
BACKENDS = ("auto", "torch", "gsplat", "cpu")
RASTERIZE_MODES = ("classic", "antialiased")
MAX_NORMALISED_FOCAL = 50.0  # larger focal lengths are pixel intrinsics passed by mistake
_MAX_CHUNK = 1024  # largest number of Gaussians per tile per round
_NEG_SIGMA_FLOOR = -20.0  # exp(-20) * opacity < 1/255: such alphas are skipped anyway


@dataclass
class RenderOutput:
    """Rendered views.

    Attributes:
        color: ``[B, V, 3, H, W]`` colour, background included.
        depth: ``[B, V, H, W]`` expected z-depth ``sum_i w_i z_i`` with the compositing weights
            ``w_i``. It is *not* divided by ``alpha`` (divide by ``alpha.clamp_min(eps)`` for a
            normalised depth) and the background adds nothing to it.
        alpha: ``[B, V, H, W]`` accumulated opacity, ``1 - T``.
        radii: ``[B, V, N, 2]`` int32 half-sizes (x, y) in pixels of each Gaussian's bounding box,
            0 for culled Gaussians.
        means2d: ``[B, V, N, 2]`` projected centres in pixels (meaningless where ``radii`` is 0).
    """

    color: Tensor
    depth: Tensor
    alpha: Tensor
    radii: Tensor | None = None
    means2d: Tensor | None = None


class Projection(NamedTuple):
    """EWA projection of Gaussians into cameras (gsplat's ``fully_fused_projection``).

    Attributes:
        means2d: ``[B, V, N, 2]`` centres in pixels.
        conics: ``[B, V, N, 3]`` upper triangle ``(a, b, c)`` of the inverse 2D covariance.
        depths: ``[B, V, N]`` camera z.
        radii: ``[B, V, N, 2]`` int32 bounding-box half-sizes, 0 where culled.
        valid: ``[B, V, N]`` bool, not culled.
        compensations: ``[B, V, N]`` antialiasing opacity compensation (see
            :func:`opacity_compensation`), ``None`` unless asked for.
    """

    means2d: Tensor
    conics: Tensor
    depths: Tensor
    radii: Tensor
    valid: Tensor
    compensations: Tensor | None = None


# ---------------------------------------------------------------------------------- projection
def _quaternion_to_matrix(quaternions: Tensor) -> Tensor:
    """Rotation matrices ``[..., 3, 3]`` of wxyz quaternions ``[..., 4]`` (normalised here)."""
    w, x, y, z = F.normalize(quaternions, dim=-1).unbind(-1)
    matrix = torch.stack(
        [
            1 - 2 * (y * y + z * z),
            2 * (x * y - w * z),
            2 * (x * z + w * y),
            2 * (x * y + w * z),
            1 - 2 * (x * x + z * z),
            2 * (y * z - w * x),
            2 * (x * z - w * y),
            2 * (y * z + w * x),
            1 - 2 * (x * x + y * y),
        ],
        dim=-1,
    )
    return matrix.reshape(*quaternions.shape[:-1], 3, 3)


def _per_view(value: float | Tensor, like: Tensor) -> Tensor:
    """A float or ``[B, V]`` tensor as ``[B, V, 1]`` in ``like``'s dtype and device."""
    if isinstance(value, Tensor):
        return value.to(like).reshape(*like.shape[:2], 1)
    return torch.full((*like.shape[:2], 1), float(value), dtype=like.dtype, device=like.device)


class _SqrtWithEps(torch.autograd.Function):
    """``sqrt(max(0, x))`` with gsplat's backward ``0.5 / (sqrt(max(0, x)) + 1e-6)``.

    gsplat's CUDA vjp of the compensation (``add_blur_vjp``) divides by ``compensation + 1e-6``
    and ignores the clamp, so a degenerate (flat) Gaussian gets a large but finite gradient instead
    of autograd's infinite one.
    """

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        out = torch.sqrt(torch.clamp_min(x, 0.0))
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        (out,) = ctx.saved_tensors
        return grad * 0.5 / (out + 1e-6)


def opacity_compensation(cov2d: Tensor, eps2d: float = EPS2D) -> Tensor:
    """gsplat's antialiasing compensation ``sqrt(max(0, det(S) / det(S + eps2d I)))``.

    Transcribed from ``gsplat.cuda._torch_impl._fully_fused_projection`` (gsplat 1.5): both
    determinants use the unsymmetrised off-diagonal product ``S01 * S10``, the dilated one is
    clamped to at least ``1e-10``, the ratio to at least 0; the backward pass is gsplat's CUDA one
    (see :class:`_SqrtWithEps`). It is at most 1 for a positive semi-definite ``S`` and tends to 1
    as the Gaussian grows.

    Args:
        cov2d: ``[..., 2, 2]`` 2D covariance in pixels, *before* the dilation.
        eps2d: the dilation added to its diagonal.

    Returns:
        ``[...]`` the factor applied to the opacity.
    """
    s_xx, s_xy, s_yx, s_yy = cov2d[..., 0, 0], cov2d[..., 0, 1], cov2d[..., 1, 0], cov2d[..., 1, 1]
    det_orig = s_xx * s_yy - s_xy * s_yx
    det_blur = (s_xx + eps2d) * (s_yy + eps2d) - s_xy * s_yx
    return _SqrtWithEps.apply(det_orig / det_blur.clamp_min(1e-10))


def project_gaussians(
    means: Tensor,
    scales: Tensor,
    rotations: Tensor,
    view_matrices: Tensor,
    intrinsics_px: Tensor,
    image_shape: tuple[int, int],
    opacities: Tensor | None = None,
    near: float | Tensor = 0.01,
    far: float | Tensor = 1e10,
    eps2d: float = EPS2D,
    calc_compensations: bool = False,
) -> Projection:
    """Project 3D Gaussians into pinhole cameras the way gsplat does.

    Args:
        means: ``[B, N, 3]`` world centres.
        scales: ``[B, N, 3]`` standard deviations.
        rotations: ``[B, N, 4]`` wxyz quaternions (normalised here).
        view_matrices: ``[B, V, 4, 4]`` world-to-camera.
        intrinsics_px: ``[B, V, 3, 3]`` intrinsics in pixels.
        image_shape: ``(H, W)``.
        opacities: ``[B, N]``; when given, the bounding box is gsplat's opacity-aware one and
            Gaussians below ``1/255`` are culled, otherwise the box extends 3.33 sigma (the
            behaviour of ``gsplat.cuda._torch_impl._fully_fused_projection``).
        near: near plane, a float or ``[B, V]``.
        far: far plane, a float or ``[B, V]``.
        eps2d: added to the diagonal of the 2D covariance.
        calc_compensations: compute the antialiasing compensations (``rasterize_mode=
            "antialiased"``); the culling and bounding box then use the compensated opacity, as
            gsplat's CUDA projection does.

    Returns:
        A :class:`Projection`.
    """
    height, width = image_shape
    rotation_w2c = view_matrices[..., :3, :3]  # [B, V, 3, 3]
    translation = view_matrices[..., :3, 3]  # [B, V, 3]
    means_cam = torch.einsum("bvij,bnj->bvni", rotation_w2c, means) + translation[:, :, None]
    x, y, z = means_cam.unbind(-1)  # [B, V, N] each
    depth_ok = (z >= _per_view(near, z)) & (z <= _per_view(far, z))  # [B, V, N]
    z = torch.where(depth_ok, z, torch.ones_like(z))  # keeps culled entries finite

    rotation = _quaternion_to_matrix(rotations)  # [B, N, 3, 3]
    scaled = rotation * scales[..., None, :]  # [B, N, 3, 3]
    covariance = scaled @ scaled.transpose(-1, -2)  # [B, N, 3, 3]
    covariance_cam = torch.einsum(
        "bvij,bnjk,bvlk->bvnil", rotation_w2c, covariance, rotation_w2c
    )  # [B, V, N, 3, 3]

    fx = intrinsics_px[..., 0, 0, None]  # [B, V, 1]
    fy = intrinsics_px[..., 1, 1, None]
    cx = intrinsics_px[..., 0, 2, None]
    cy = intrinsics_px[..., 1, 2, None]
    tan_fovx = 0.5 * width / fx
    tan_fovy = 0.5 * height / fy
    lim_x_pos = (width - cx) / fx + 0.3 * tan_fovx
    lim_x_neg = cx / fx + 0.3 * tan_fovx
    lim_y_pos = (height - cy) / fy + 0.3 * tan_fovy
    lim_y_neg = cy / fy + 0.3 * tan_fovy
    tx = z * torch.maximum(torch.minimum(x / z, lim_x_pos), -lim_x_neg)
    ty = z * torch.maximum(torch.minimum(y / z, lim_y_pos), -lim_y_neg)
    zero = torch.zeros_like(z)
    jacobian = torch.stack(
        [fx / z, zero, -fx * tx / (z * z), zero, fy / z, -fy * ty / (z * z)], dim=-1
    ).reshape(*z.shape, 2, 3)  # [B, V, N, 2, 3]
    cov2d = jacobian @ covariance_cam @ jacobian.transpose(-1, -2)  # [B, V, N, 2, 2]
    means2d = torch.stack([fx * x / z + cx, fy * y / z + cy], dim=-1)  # [B, V, N, 2]

    c_xx = cov2d[..., 0, 0] + eps2d
    c_yy = cov2d[..., 1, 1] + eps2d
    c_xy = 0.5 * (cov2d[..., 0, 1] + cov2d[..., 1, 0])
    det = c_xx * c_yy - c_xy * c_xy  # [B, V, N]
    det_ok = det > 0
    det = torch.where(det_ok, det, torch.ones_like(det))
    conics = torch.stack([c_yy / det, -c_xy / det, c_xx / det], dim=-1)  # [B, V, N, 3]
    compensations = opacity_compensation(cov2d, eps2d) if calc_compensations else None

    with torch.no_grad():
        valid = depth_ok & det_ok
        if opacities is None:
            extend = torch.full_like(z, BOX_EXTEND)
        else:
            opacity = opacities[:, None, :].expand_as(z)  # [B, V, N]
            if compensations is not None:
                opacity = opacity * compensations
            valid = valid & (opacity >= ALPHA_THRESHOLD)
            ratio = (opacity / ALPHA_THRESHOLD).clamp_min(1.0)
            extend = torch.sqrt(2.0 * torch.log(ratio)).clamp_max(BOX_EXTEND)
        radius_x = torch.ceil(extend * torch.sqrt(c_xx.clamp_min(0)))
        radius_y = torch.ceil(extend * torch.sqrt(c_yy.clamp_min(0)))
        valid = valid & ((radius_x > 0) | (radius_y > 0))
        u, v = means2d.detach().unbind(-1)
        inside = (u + radius_x > 0) & (u - radius_x < width)
        inside = inside & (v + radius_y > 0) & (v - radius_y < height)
        valid = valid & inside
        radii = torch.stack([radius_x, radius_y], dim=-1) * valid[..., None]
        radii = radii.to(torch.int32)  # [B, V, N, 2]
    return Projection(means2d, conics, means_cam[..., 2], radii, valid, compensations)


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
    image_shape: tuple[int, int],
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
        image_shape: ``(H, W)``.
        tile_size: tile side in pixels.

    Returns:
        ``pair_ids [M]`` (intersections sorted by tile, then depth), ``tile_start [T]`` and
        ``tile_end [T]`` offsets into them per flat tile id (``T = I * tiles_y * tiles_x``).
    """
    height, width = image_shape
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
    image_shape: tuple[int, int],
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
        image_shape: ``(H, W)``.
        tile_size: tile side in pixels.
        chunk: Gaussians per tile per round (at least).
        max_elements: bound on the entries of one step, ``tiles * Gaussians * tile_size^2``.
        recompute: under autograd, keep only each step's inputs and recompute the step in the
            backward pass (activation checkpointing), so memory does not grow with the number of
            entries composited.

    Returns:
        ``[T, tile_size^2, 5]`` accumulated ``r, g, b, depth, alpha`` per tile pixel.
    """
    height, width = image_shape
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
    image_shape: tuple[int, int],
    background: Tensor,
    near: float | Tensor,
    far: float | Tensor,
    tile_size: int,
    chunk: int,
    max_elements: int,
    recompute: bool,
    rasterize_mode: str = "classic",
) -> RenderOutput:
    """The tiled PyTorch rasteriser (any device, differentiable through autograd)."""
    height, width = image_shape
    batch, views = extrinsics.shape[:2]
    num = gaussians.num_slots
    projection = project_gaussians(
        gaussians.means,
        gaussians.scales,
        gaussians.rotations,
        world_to_camera(extrinsics),
        intrinsics_to_pixels(intrinsics, image_shape),
        image_shape,
        opacities=gaussians.opacities,
        near=near,
        far=far,
        calc_compensations=rasterize_mode == "antialiased",
    )
    valid = projection.valid & gaussians.valid_mask()[:, None, :]  # [B, V, N]
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
        image_shape,
        tile_size,
    )
    tiles_y, tiles_x = math.ceil(height / tile_size), math.ceil(width / tile_size)
    accumulated = _composite_tiles(
        features,
        pair_ids,
        tile_start,
        tile_end,
        image_shape,
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


# ---------------------------------------------------------------------------------- gsplat backend
def _render_gsplat(
    gaussians: Gaussians,
    extrinsics: Tensor,
    intrinsics: Tensor,
    image_shape: tuple[int, int],
    background: Tensor,
    near: float | Tensor,
    far: float | Tensor,
    rasterize_mode: str = "classic",
) -> RenderOutput:
    """``gsplat.rasterization`` (CUDA, float32), imported here and nowhere else."""
    from gsplat import rasterization

    height, width = image_shape
    near_value, far_value = _scalar_plane(near), _scalar_plane(far)
    if near_value is None or far_value is None:
        # Per-view planes: gsplat takes one plane per call, so render view by view.
        outputs = [
            _render_gsplat(
                gaussians,
                extrinsics[:, v : v + 1],
                intrinsics[:, v : v + 1],
                image_shape,
                background[:, v : v + 1],
                near[:, v : v + 1] if isinstance(near, Tensor) else near,
                far[:, v : v + 1] if isinstance(far, Tensor) else far,
                rasterize_mode,
            )
            for v in range(extrinsics.shape[1])
        ]
        return RenderOutput(
            *(
                torch.cat([getattr(o, k) for o in outputs], dim=1)
                for k in RenderOutput.__annotations__
            )
        )
    opacities = gaussians.opacities
    if gaussians.mask is not None:
        opacities = torch.where(gaussians.mask, opacities, torch.zeros_like(opacities))
    colors, alphas, meta = rasterization(
        means=gaussians.means,
        quats=gaussians.rotations,
        scales=gaussians.scales,
        opacities=opacities,
        colors=gaussians.harmonics.transpose(-1, -2).contiguous(),  # [B, N, K, 3]
        viewmats=world_to_camera(extrinsics),
        Ks=intrinsics_to_pixels(intrinsics, image_shape),
        width=width,
        height=height,
        near_plane=near_value,
        far_plane=far_value,
        eps2d=EPS2D,
        sh_degree=gaussians.sh_degree,
        packed=False,
        tile_size=TILE_SIZE,
        backgrounds=background.contiguous(),
        render_mode="RGB+D",  # accumulated depth sum_i w_i z_i (not divided by alpha)
        rasterize_mode=rasterize_mode,
    )  # [B, V, H, W, 4], [B, V, H, W, 1]
    return RenderOutput(
        color=colors[..., :3].permute(0, 1, 4, 2, 3),
        depth=colors[..., 3],
        alpha=alphas[..., 0],
        radii=meta["radii"],
        means2d=meta["means2d"],
    )


def _scalar_plane(value: float | Tensor) -> float | None:
    """A near/far plane as one float, or ``None`` when it differs between views."""
    if not isinstance(value, Tensor):
        return float(value)
    flat = value.flatten()
    if flat.numel() == 0 or bool((flat == flat[0]).all()):
        return float(flat[0]) if flat.numel() else 0.0
    return None


@functools.cache
def _gsplat_works(device: str) -> bool:
    """Whether gsplat imports and rasterises on ``device`` (cached per device)."""
    try:
        from gsplat import rasterization

        means = torch.tensor([[0.0, 0.0, 2.0]], device=device)
        colors, _, _ = rasterization(
            means=means,
            quats=torch.tensor([[1.0, 0.0, 0.0, 0.0]], device=device),
            scales=torch.full((1, 3), 0.1, device=device),
            opacities=torch.ones(1, device=device) * 0.5,
            colors=torch.ones(1, 3, device=device),
            viewmats=torch.eye(4, device=device)[None],
            Ks=torch.tensor([[[16.0, 0, 8], [0, 16.0, 8], [0, 0, 1]]], device=device),
            width=16,
            height=16,
            packed=False,
        )
        torch.cuda.synchronize(device)
        return bool(colors.sum() > 0)
    except Exception as error:  # import errors, JIT build failures, missing kernels
        warnings.warn(
            f"gsplat is not usable on {device} ({type(error).__name__}: {error}); "
            "falling back to the PyTorch renderer",
            RuntimeWarning,
            stacklevel=3,
        )
        return False


def gsplat_available(device: torch.device | str = "cuda") -> bool:
    """Whether ``backend="gsplat"`` works on ``device`` (a CUDA device; the answer is cached)."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return _gsplat_works(str(device))


def _cpu_backend_usable(dtype: torch.dtype) -> bool:
    """Whether ``auto`` takes the compiled CPU rasteriser for ``dtype`` (warns once per reason)."""
    from .render_cpu import cpu_rasterizer_error

    error = cpu_rasterizer_error(dtype)
    if error is not None and error not in _CPU_FALLBACK_WARNED:
        _CPU_FALLBACK_WARNED.add(error)
        warnings.warn(
            f"the compiled CPU rasteriser is not used ({error}); rendering with the PyTorch one",
            RuntimeWarning,
            stacklevel=3,
        )
    return error is None


_CPU_FALLBACK_WARNED: set[str] = set()


# ---------------------------------------------------------------------------------- entry point
def _check_camera(name: str, value: Tensor, batch: int, views: int | None, size: int) -> None:
    if not isinstance(value, Tensor):
        raise ValueError(f"{name} must be a tensor, got {type(value).__name__}")
    if value.ndim != 4 or value.shape[-2:] != (size, size):
        raise ValueError(f"{name} must be [B, V, {size}, {size}], got {tuple(value.shape)}")
    if value.shape[0] != batch:
        raise ValueError(f"{name} has batch size {value.shape[0]} but gaussians has {batch} scenes")
    if views is not None and value.shape[1] != views:
        raise ValueError(f"{name} has {value.shape[1]} views but extrinsics has {views}")
    if not torch.isfinite(value).all():
        raise ValueError(f"{name} has non-finite values")


def _check_plane(name: str, value: float | Tensor, batch: int, views: int) -> float | Tensor:
    if isinstance(value, Tensor):
        if value.numel() == 1:
            value = value.reshape(1, 1).expand(batch, views)
        if tuple(value.shape) != (batch, views):
            raise ValueError(
                f"{name} must be a float or [B, V] = [{batch}, {views}], got {tuple(value.shape)}"
            )
        if not torch.isfinite(value).all():
            raise ValueError(f"{name} has non-finite values")
        return value
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite float or a [B, V] tensor, got {value!r}")
    return float(value)


def _background(background: Tensor | None, batch: int, views: int, like: Tensor) -> Tensor:
    """``background`` as ``[B, V, 3]``."""
    if background is None:
        return torch.zeros(batch, views, 3, dtype=like.dtype, device=like.device)
    background = torch.as_tensor(background, dtype=like.dtype, device=like.device)
    if background.shape == (3,):
        background = background[None, None]
    elif background.shape == (batch, 3):
        background = background[:, None]
    elif background.shape != (batch, views, 3):
        raise ValueError(
            f"background must be [3], [B, 3] or [B, V, 3] with B={batch}, V={views}, "
            f"got {tuple(background.shape)}"
        )
    if not torch.isfinite(background).all():
        raise ValueError("background has non-finite values")
    return background.expand(batch, views, 3)


def _sanitise(gaussians: Gaussians) -> Gaussians:
    """Replace the values of masked-out entries by harmless ones (they may hold NaN)."""
    if gaussians.mask is None:
        return gaussians
    keep = gaussians.mask

    def fill(value: Tensor, default: Tensor) -> Tensor:
        shape = keep.shape + (1,) * (value.ndim - 2)
        return torch.where(keep.reshape(shape), value, default.to(value.dtype))

    return Gaussians(
        means=fill(gaussians.means, torch.zeros(())),
        scales=fill(gaussians.scales, torch.ones(())),
        rotations=fill(gaussians.rotations, torch.tensor([1.0, 0.0, 0.0, 0.0], device=keep.device)),
        opacities=fill(gaussians.opacities, torch.zeros(())),
        harmonics=fill(gaussians.harmonics, torch.zeros(())),
        mask=keep,
    )


def render(
    gaussians: Gaussians,
    extrinsics: Tensor,
    intrinsics: Tensor,
    image_shape: tuple[int, int],
    background: Tensor | None = None,
    backend: str = "auto",
    near: float | Tensor = 0.01,
    far: float | Tensor = 1e10,
    tile_size: int = TILE_SIZE,
    chunk: int = 32,
    max_elements: int = 1 << 20,
    recompute: bool = True,
    rasterize_mode: str = "classic",
) -> RenderOutput:
    """Render Gaussians into every view of every scene.

    Args:
        gaussians: a batch of ``B`` Gaussian sets (masked-out entries never render).
        extrinsics: ``[B, V, 4, 4]`` camera-to-world, OpenCV axes.
        intrinsics: ``[B, V, 3, 3]`` normalised (row 0 divided by the width, row 1 by the height).
        image_shape: ``(H, W)`` in pixels.
        background: ``[3]``, ``[B, 3]`` or ``[B, V, 3]``; black when ``None``.
        backend: ``"torch"`` (tiled PyTorch rasteriser, any device), ``"gsplat"`` (CUDA, float32),
            ``"cpu"`` (the compiled CPU rasteriser of :mod:`models.render_cpu`, float32/64) or
            ``"auto"`` (gsplat for CUDA float32 tensors when it works, the compiled one for CPU
            tensors when it builds, else torch with one warning saying why).
        near: near plane (camera z), a float or ``[B, V]``; closer Gaussians are culled.
        far: far plane, a float or ``[B, V]``.
        tile_size: torch backend: tile side in pixels (gsplat uses 16).
        chunk: torch backend: Gaussians per tile composited per round (at least).
        max_elements: torch backend: bound on the (tile, pixel, Gaussian) entries of one step,
            the memory knob: without autograd, the intermediates are a few times
            ``max_elements`` floats.
        recompute: torch backend under autograd: recompute each compositing step in the
            backward pass instead of keeping its intermediates (memory stays bounded by
            ``max_elements`` instead of growing with the work; about 20% slower).
        rasterize_mode: ``"classic"`` or ``"antialiased"`` (gsplat's: each opacity is multiplied
            per view by :func:`opacity_compensation` of the Gaussian's 2D covariance; every
            backend).

    Returns:
        A :class:`RenderOutput`; ``depth`` is the expected z ``sum_i w_i z_i``, *not* divided by
        ``alpha``.

    Raises:
        ValueError: naming the argument, for wrong shapes or batch sizes, non-finite values,
            intrinsics in pixels instead of normalised, or an unknown backend or rasterize_mode.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if not isinstance(rasterize_mode, str) or rasterize_mode not in RASTERIZE_MODES:
        raise ValueError(f"rasterize_mode must be one of {RASTERIZE_MODES}, got {rasterize_mode!r}")
    if not isinstance(gaussians, Gaussians):
        raise ValueError(f"gaussians must be a Gaussians, got {type(gaussians).__name__}")
    gaussians.validate("gaussians")
    batch = gaussians.batch_size
    _check_camera("extrinsics", extrinsics, batch, None, 4)
    views = extrinsics.shape[1]
    _check_camera("intrinsics", intrinsics, batch, views, 3)
    if (
        not isinstance(image_shape, (tuple, list))
        or len(image_shape) != 2
        or not all(isinstance(s, int) and s > 0 for s in image_shape)
    ):
        raise ValueError(f"image_shape must be (H, W) with positive ints, got {image_shape!r}")
    image_shape = (int(image_shape[0]), int(image_shape[1]))
    focal = intrinsics[..., [0, 1], [0, 1]]  # [B, V, 2]
    centre = intrinsics[..., [0, 1], [2, 2]]
    if (focal <= 0).any() or (focal > MAX_NORMALISED_FOCAL).any():
        raise ValueError(
            f"intrinsics must be normalised (focal / image size in (0, {MAX_NORMALISED_FOCAL}]), "
            f"got fx, fy up to {focal.abs().max().item():.4g}: pixel intrinsics passed by mistake?"
        )
    if (centre.abs() > MAX_NORMALISED_FOCAL).any():
        largest = centre.abs().max().item()
        raise ValueError(
            f"intrinsics must be normalised, got a principal point {largest:.4g} image sizes "
            "from the corner: pixel intrinsics passed by mistake?"
        )
    near = _check_plane("near", near, batch, views)
    far = _check_plane("far", far, batch, views)
    device = gaussians.device
    for name, value in (("extrinsics", extrinsics), ("intrinsics", intrinsics)):
        if value.device != device:
            raise ValueError(f"{name} is on {value.device} but gaussians is on {device}")
    for name, value in (("tile_size", tile_size), ("chunk", chunk), ("max_elements", max_elements)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    sh_degree_of(gaussians.harmonics.shape[-1])
    background = _background(background, batch, views, gaussians.means)

    if backend == "auto":
        use_gsplat = gaussians.dtype == torch.float32 and gsplat_available(device)
        backend = "gsplat" if use_gsplat else "torch"
        if device.type == "cpu" and _cpu_backend_usable(gaussians.dtype):
            backend = "cpu"
    gaussians = _sanitise(gaussians)
    extrinsics = extrinsics.to(gaussians.dtype)
    intrinsics = intrinsics.to(gaussians.dtype)
    if backend == "gsplat":
        if device.type != "cuda":
            raise ValueError(f"backend='gsplat' needs CUDA tensors, got gaussians on {device}")
        if gaussians.dtype != torch.float32:
            raise ValueError(f"backend='gsplat' needs float32 gaussians, got {gaussians.dtype}")
        if bool(gaussians.valid_mask().any()):  # gsplat is not meant for empty sets
            return _render_gsplat(
                gaussians,
                extrinsics,
                intrinsics,
                image_shape,
                background,
                near,
                far,
                rasterize_mode,
            )
    if backend == "cpu":
        from .render_cpu import cpu_rasterizer_error, render_cpu

        if device.type != "cpu":
            raise ValueError(f"backend='cpu' needs CPU tensors, got gaussians on {device}")
        error = cpu_rasterizer_error(gaussians.dtype)
        if error is not None:
            raise RuntimeError(f"backend='cpu' is not available: {error}")
        return render_cpu(
            gaussians,
            extrinsics,
            intrinsics,
            image_shape,
            background,
            near,
            far,
            tile_size,
            rasterize_mode,
        )
    return _render_torch(
        gaussians,
        extrinsics,
        intrinsics,
        image_shape,
        background,
        near,
        far,
        tile_size,
        chunk,
        max_elements,
        recompute,
        rasterize_mode,
    )
