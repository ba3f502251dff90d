"""EWA projection of 3D Gaussians to the image plane (Zwicker et al. 2001, as 3DGS uses it),
with gsplat's numerics: culling, the 0.3 px dilation, bounding boxes and the antialiasing
compensation."""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.utils.checkpoint
from torch import Tensor

from models.core.gaussians import Gaussians
from models.geometry.cameras import intrinsics_to_pixels, world_to_camera
from models.geometry.rotations import quaternion_to_matrix

__all__ = [
    "ALPHA_THRESHOLD",
    "BOX_EXTEND",
    "EPS2D",
    "FRUSTUM_MARGIN",
    "Projection",
    "opacity_compensation",
    "project_gaussians",
    "project_views",
]

ALPHA_THRESHOLD = 1.0 / 255.0
EPS2D = 0.3
BOX_EXTEND = 3.33  # gsplat's bounding-box extent in standard deviations


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
    """The antialiasing opacity factor ``sqrt(max(0, det(S) / det(S + eps2d I)))`` of gsplat's
    ``rasterize_mode="antialiased"``: the dilated footprint covers more pixels, so the opacity is
    scaled down by the ratio of the two footprints' areas.

    Numerics as gsplat's: both determinants take the off-diagonal product as ``S01 * S10`` (``S``
    may be unsymmetric by rounding), the dilated one is floored at ``1e-10``, and the backward
    pass of the square root is gsplat's (:class:`_SqrtWithEps`). The factor is at most 1 for a
    positive semi-definite ``S`` and tends to 1 as the Gaussian grows.

    Args:
        cov2d: ``[..., 2, 2]`` 2D covariance in pixels, *before* the dilation.
        eps2d: the dilation added to its diagonal.

    Returns:
        ``[...]`` the factor applied to the opacity.
    """
    off_diagonal = cov2d[..., 0, 1] * cov2d[..., 1, 0]
    area = cov2d[..., 0, 0] * cov2d[..., 1, 1] - off_diagonal
    dilated = (cov2d[..., 0, 0] + eps2d) * (cov2d[..., 1, 1] + eps2d) - off_diagonal
    return _SqrtWithEps.apply(area / dilated.clamp_min(1e-10))


#: How far outside the image a centre may sit, as a fraction of the image size, before the
#: Jacobian is taken at the border instead (3DGS's guard against the huge, unstable footprints of
#: Gaussians far outside the view; gsplat's 1.3 x the half field of view on each side).
FRUSTUM_MARGIN = 0.15


def _screen_jacobian(
    means_cam: Tensor, focal: Tensor, principal: Tensor, image_size: tuple[int, int]
) -> Tensor:
    """``[B, V, N, 2, 3]`` Jacobian of the pinhole projection ``u = f * (x, y) / z + c`` at each
    camera-frame centre ``[B, V, N, 3]`` (``focal``, ``principal``: ``[B, V, 1, 2]`` pixels).

    The slope ``(x, y) / z`` is first limited to the directions whose pixel lies within the image
    widened by :data:`FRUSTUM_MARGIN` of its size on each side; ``z`` (already positive) is not.
    """
    height, width = image_size
    size = torch.tensor([width, height], dtype=means_cam.dtype, device=means_cam.device)
    z = means_cam[..., 2:]  # [B, V, N, 1]
    lowest = (-FRUSTUM_MARGIN * size - principal) / focal  # [B, V, 1, 2]
    highest = ((1 + FRUSTUM_MARGIN) * size - principal) / focal
    slope = torch.minimum(torch.maximum(means_cam[..., :2] / z, lowest), highest)  # [B, V, N, 2]
    across = torch.diag_embed(focal / z)  # [B, V, N, 2, 2] d(u, v) / d(x, y)
    along = (-focal * slope / z)[..., None]  # [B, V, N, 2, 1] d(u, v) / dz
    return torch.cat([across, along], dim=-1)


def _conics(cov2d: Tensor, eps2d: float) -> tuple[Tensor, Tensor, Tensor]:
    """The dilated 2D covariance ``S + eps2d I`` (symmetrised) as its inverse's upper triangle
    ``[..., 3]``, its diagonal ``[..., 2]`` (the bounding box) and where it is invertible."""
    diagonal = cov2d.diagonal(dim1=-2, dim2=-1) + eps2d  # [..., 2]
    shared = 0.5 * (cov2d[..., 0, 1] + cov2d[..., 1, 0])
    det = diagonal.prod(dim=-1) - shared * shared
    invertible = det > 0
    det = torch.where(invertible, det, torch.ones_like(det))
    inverse = torch.stack([diagonal[..., 1], -shared, diagonal[..., 0]], dim=-1) / det[..., None]
    return inverse, diagonal, invertible


def _box_radii(diagonal: Tensor, opacity: Tensor | None, valid: Tensor) -> tuple[Tensor, Tensor]:
    """Bounding-box half sizes ``[..., 2]`` (pixels, rounded up) and the pairs still valid: 3.33
    standard deviations, or, given the opacity, only as far as the Gaussian's alpha reaches
    ``1/255`` (and none below it)."""
    if opacity is None:
        extend = torch.full_like(diagonal[..., 0], BOX_EXTEND)
    else:
        valid = valid & (opacity >= ALPHA_THRESHOLD)
        ratio = (opacity / ALPHA_THRESHOLD).clamp_min(1.0)
        extend = torch.sqrt(2.0 * torch.log(ratio)).clamp_max(BOX_EXTEND)
    radii = torch.ceil(extend[..., None] * torch.sqrt(diagonal.clamp_min(0)))  # [..., 2]
    return radii, valid & (radii > 0).any(dim=-1)


def project_gaussians(
    means: Tensor,
    scales: Tensor,
    rotations: Tensor,
    view_matrices: Tensor,
    intrinsics_px: Tensor,
    image_size: tuple[int, int],
    opacities: Tensor | None = None,
    near: float | Tensor = 0.01,
    far: float | Tensor = 1e10,
    eps2d: float = EPS2D,
    calc_compensations: bool = False,
) -> Projection:
    """EWA projection (Zwicker et al. 2001) of 3D Gaussians into pinhole cameras, with gsplat's
    culling, dilation and bounding boxes.

    Args:
        means: ``[B, N, 3]`` world centres.
        scales: ``[B, N, 3]`` standard deviations.
        rotations: ``[B, N, 4]`` wxyz quaternions (normalised here).
        view_matrices: ``[B, V, 4, 4]`` world-to-camera.
        intrinsics_px: ``[B, V, 3, 3]`` intrinsics in pixels.
        image_size: ``(H, W)``.
        opacities: ``[B, N]``; when given, the bounding box is gsplat's opacity-aware one and
            Gaussians below ``1/255`` are culled, otherwise the box extends 3.33 sigma (the
            behaviour of gsplat's PyTorch reference projection).
        near: near plane, a float or ``[B, V]``.
        far: far plane, a float or ``[B, V]``.
        eps2d: added to the diagonal of the 2D covariance.
        calc_compensations: compute the antialiasing compensations (``rasterize_mode=
            "antialiased"``); the culling and bounding box then use the compensated opacity, as
            gsplat's CUDA projection does.

    Returns:
        A :class:`Projection`.
    """
    height, width = image_size
    to_camera = view_matrices[..., :3, :3]  # [B, V, 3, 3]
    means_cam = torch.einsum("bvij,bnj->bvni", to_camera, means) + view_matrices[..., None, :3, 3]
    depth = means_cam[..., 2]  # [B, V, N]
    in_range = (depth >= _per_view(near, depth)) & (depth <= _per_view(far, depth))
    # culled entries get z = 1 so that nothing below divides by zero
    safe = torch.cat([means_cam[..., :2], torch.where(in_range, depth, 1.0)[..., None]], dim=-1)

    axes = quaternion_to_matrix(rotations) * scales[..., None, :]  # [B, N, 3, 3] R diag(s)
    focal = intrinsics_px[..., None, [0, 1], [0, 1]]  # [B, V, 1, 2]
    principal = intrinsics_px[..., None, :2, 2]  # [B, V, 1, 2]
    jacobian = _screen_jacobian(safe, focal, principal, image_size)  # [B, V, N, 2, 3]
    # J W R S, squared: the 2D covariance J W (R S S R^T) W^T J^T without the 3D ones (2.5x
    # faster forward and backward on a CPU than the 3x3 products, the same sums)
    footprint = (jacobian @ to_camera[:, :, None]) @ axes[:, None]  # [B, V, N, 2, 3]
    cov2d = footprint @ footprint.transpose(-1, -2)  # [B, V, N, 2, 2]
    means2d = focal * safe[..., :2] / safe[..., 2:] + principal  # [B, V, N, 2]
    conics, diagonal, invertible = _conics(cov2d, eps2d)
    compensations = opacity_compensation(cov2d, eps2d) if calc_compensations else None

    with torch.no_grad():
        opacity = None
        if opacities is not None:
            opacity = opacities[:, None, :].expand_as(depth)  # [B, V, N]
            if compensations is not None:
                opacity = opacity * compensations
        radii, valid = _box_radii(diagonal, opacity, in_range & invertible)
        centre = means2d.detach()
        limit = torch.tensor([width, height], dtype=centre.dtype, device=centre.device)
        valid = valid & ((centre + radii > 0) & (centre - radii < limit)).all(dim=-1)
        radii = (radii * valid[..., None]).to(torch.int32)  # [B, V, N, 2]
    return Projection(means2d, conics, depth, radii, valid, compensations)


def project_views(
    gaussians: Gaussians,
    extrinsics: Tensor,
    intrinsics: Tensor,
    image_size: tuple[int, int],
    near: float | Tensor,
    far: float | Tensor,
    rasterize_mode: str = "classic",
    eps2d: float = EPS2D,
) -> tuple[Projection, Tensor]:
    """What every rasterising backend starts from: the projection of each scene's Gaussians into
    each of its views (camera-to-world ``[B, V, 4, 4]``, normalised intrinsics), with
    compensations in ``"antialiased"`` mode, and the visible pairs ``[B, V, N]`` (projected and
    not masked out)."""
    projection = project_gaussians(
        gaussians.means,
        gaussians.scales,
        gaussians.rotations,
        world_to_camera(extrinsics),
        intrinsics_to_pixels(intrinsics, image_size),
        image_size,
        opacities=gaussians.opacities,
        near=near,
        far=far,
        eps2d=eps2d,
        calc_compensations=rasterize_mode == "antialiased",
    )
    return projection, projection.valid & gaussians.valid_mask()[:, None, :]
