"""EWA projection of 3D Gaussians to the image plane (gsplat's numerics)."""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.utils.checkpoint
from torch import Tensor

from models.gaussians import Gaussians
from models.geometry.cameras import intrinsics_to_pixels, world_to_camera
from models.geometry.rotations import quaternion_to_matrix

__all__ = [
    "ALPHA_THRESHOLD",
    "BOX_EXTEND",
    "EPS2D",
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
    image_size: tuple[int, int],
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
        image_size: ``(H, W)``.
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
    height, width = image_size
    rotation_w2c = view_matrices[..., :3, :3]  # [B, V, 3, 3]
    translation = view_matrices[..., :3, 3]  # [B, V, 3]
    means_cam = torch.einsum("bvij,bnj->bvni", rotation_w2c, means) + translation[:, :, None]
    x, y, z = means_cam.unbind(-1)  # [B, V, N] each
    depth_ok = (z >= _per_view(near, z)) & (z <= _per_view(far, z))  # [B, V, N]
    z = torch.where(depth_ok, z, torch.ones_like(z))  # keeps culled entries finite

    rotation = quaternion_to_matrix(rotations)  # [B, N, 3, 3]
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
