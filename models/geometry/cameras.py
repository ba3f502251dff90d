"""Camera helpers shared by the whole zoo.

Conventions (``docs/design.md``): extrinsics are camera-to-world 4x4 matrices with OpenCV axes
(+x right, +y down, +z forward); intrinsics are normalised 3x3 matrices (row 0 divided by the image
width, row 1 by the height); depth is z-depth in the camera frame. Pixel centres sit at +0.5.

Every function works on arbitrary leading batch dimensions (``...``).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = [
    "intrinsics_to_pixels",
    "intrinsics_to_normalized",
    "pixel_grid",
    "camera_directions",
    "get_rays",
    "unproject",
    "project",
    "plucker_embedding",
    "invert_extrinsics",
    "world_to_camera",
    "camera_to_world",
    "transform_points",
    "camera_centers",
    "normalize_scene",
    "focal_to_fov",
]


def _scale_matrix(shape: tuple[int, int], like: Tensor, inverse: bool) -> Tensor:
    height, width = shape
    s = torch.tensor([width, height, 1.0], dtype=like.dtype, device=like.device)
    if inverse:
        s = 1.0 / s
    return s[:, None]


def intrinsics_to_pixels(intrinsics: Tensor, shape: tuple[int, int]) -> Tensor:
    """Normalised intrinsics ``[..., 3, 3]`` to pixel units for an image of ``shape = (H, W)``."""
    return intrinsics * _scale_matrix(shape, intrinsics, inverse=False)


def intrinsics_to_normalized(intrinsics: Tensor, shape: tuple[int, int]) -> Tensor:
    """Pixel intrinsics ``[..., 3, 3]`` to normalised ones for an image of ``shape = (H, W)``."""
    return intrinsics * _scale_matrix(shape, intrinsics, inverse=True)


def focal_to_fov(intrinsics: Tensor) -> Tensor:
    """Horizontal and vertical field of view in radians ``[..., 2]`` of normalised intrinsics."""
    fx = intrinsics[..., 0, 0]
    fy = intrinsics[..., 1, 1]
    return torch.stack([2 * torch.atan(0.5 / fx), 2 * torch.atan(0.5 / fy)], dim=-1)


def pixel_grid(
    shape: tuple[int, int], device: torch.device | str | None = None, dtype=torch.float32
) -> Tensor:
    """Normalised coordinates of pixel centres, ``[H, W, 2]`` as (x, y) in (0, 1)."""
    height, width = shape
    ys = (torch.arange(height, device=device, dtype=dtype) + 0.5) / height
    xs = (torch.arange(width, device=device, dtype=dtype) + 0.5) / width
    grid_y, grid_x = torch.meshgrid(ys, xs, indexing="ij")
    return torch.stack([grid_x, grid_y], dim=-1)


def camera_directions(coords: Tensor, intrinsics: Tensor) -> Tensor:
    """Camera-frame directions with z = 1 for normalised pixel coordinates.

    Args:
        coords: ``[..., P, 2]`` normalised (x, y).
        intrinsics: ``[..., 3, 3]`` normalised, broadcastable against ``coords``' batch dims.

    Returns:
        ``[..., P, 3]`` directions whose z component is 1 (so ``dir * depth`` is at z-depth).
    """
    fx = intrinsics[..., 0, 0, None]
    fy = intrinsics[..., 1, 1, None]
    cx = intrinsics[..., 0, 2, None]
    cy = intrinsics[..., 1, 2, None]
    skew = intrinsics[..., 0, 1, None]
    y = (coords[..., 1] - cy) / fy
    x = (coords[..., 0] - cx - skew * y) / fx
    return torch.stack([x, y, torch.ones_like(x)], dim=-1)


def get_rays(
    extrinsics: Tensor, intrinsics: Tensor, shape: tuple[int, int]
) -> tuple[Tensor, Tensor]:
    """World-space rays through every pixel centre.

    Args:
        extrinsics: ``[..., 4, 4]`` camera-to-world.
        intrinsics: ``[..., 3, 3]`` normalised.
        shape: ``(H, W)``.

    Returns:
        origins ``[..., H*W, 3]`` and directions ``[..., H*W, 3]``. Directions are *not* unit
        length: their camera-frame z component is 1, so ``origin + depth * direction`` is the point
        at z-depth ``depth``.
    """
    coords = pixel_grid(shape, extrinsics.device, extrinsics.dtype).reshape(-1, 2)  # [P, 2]
    dirs_cam = camera_directions(coords, intrinsics)  # [..., P, 3]
    rotation = extrinsics[..., :3, :3]
    dirs_world = torch.einsum("...ij,...pj->...pi", rotation, dirs_cam)
    origins = extrinsics[..., None, :3, 3].expand_as(dirs_world)
    return origins, dirs_world


def unproject(coords: Tensor, depth: Tensor, intrinsics: Tensor, extrinsics: Tensor) -> Tensor:
    """World points of normalised pixel coordinates at z-depth.

    Args:
        coords: ``[..., P, 2]`` normalised pixel coordinates.
        depth: ``[..., P]`` z-depth.
        intrinsics: ``[..., 3, 3]`` normalised.
        extrinsics: ``[..., 4, 4]`` camera-to-world.

    Returns:
        ``[..., P, 3]`` world points.
    """
    points_cam = camera_directions(coords, intrinsics) * depth[..., None]
    return transform_points(extrinsics, points_cam)


def project(points: Tensor, extrinsics: Tensor, intrinsics: Tensor) -> tuple[Tensor, Tensor]:
    """Project world points into a camera.

    Args:
        points: ``[..., P, 3]`` world points.
        extrinsics: ``[..., 4, 4]`` camera-to-world.
        intrinsics: ``[..., 3, 3]`` normalised.

    Returns:
        Normalised pixel coordinates ``[..., P, 2]`` and z-depth ``[..., P]`` (points behind the
        camera get negative depth; their coordinates are meaningless).
    """
    points_cam = transform_points(invert_extrinsics(extrinsics), points)
    z = points_cam[..., 2]
    safe_z = torch.where(z.abs() < 1e-8, torch.full_like(z, 1e-8), z)
    xy = points_cam[..., :2] / safe_z[..., None]
    homogeneous = torch.cat([xy, torch.ones_like(xy[..., :1])], dim=-1)
    uv = torch.einsum("...ij,...pj->...pi", intrinsics, homogeneous)[..., :2]
    return uv, z


def transform_points(transform: Tensor, points: Tensor) -> Tensor:
    """Apply a ``[..., 4, 4]`` rigid transform to points ``[..., P, 3]``."""
    return (
        torch.einsum("...ij,...pj->...pi", transform[..., :3, :3], points)
        + transform[..., None, :3, 3]
    )


def invert_extrinsics(extrinsics: Tensor) -> Tensor:
    """Inverse of rigid (rotation + translation) 4x4 transforms, ``[..., 4, 4]``."""
    rotation = extrinsics[..., :3, :3]
    translation = extrinsics[..., :3, 3]
    rotation_t = rotation.transpose(-1, -2)
    inverse = torch.zeros_like(extrinsics)
    inverse[..., :3, :3] = rotation_t
    inverse[..., :3, 3] = -torch.einsum("...ij,...j->...i", rotation_t, translation)
    inverse[..., 3, 3] = 1.0
    return inverse


def world_to_camera(extrinsics: Tensor) -> Tensor:
    """Camera-to-world ``[..., 4, 4]`` to world-to-camera (view matrices, as gsplat wants)."""
    return invert_extrinsics(extrinsics)


def camera_to_world(view_matrices: Tensor) -> Tensor:
    """World-to-camera ``[..., 4, 4]`` to camera-to-world."""
    return invert_extrinsics(view_matrices)


def camera_centers(extrinsics: Tensor) -> Tensor:
    """Camera centres ``[..., 3]`` of camera-to-world matrices."""
    return extrinsics[..., :3, 3]


def plucker_embedding(extrinsics: Tensor, intrinsics: Tensor, shape: tuple[int, int]) -> Tensor:
    """Plücker ray embedding (unit direction, moment = origin x direction) per pixel.

    Args:
        extrinsics: ``[..., 4, 4]`` camera-to-world.
        intrinsics: ``[..., 3, 3]`` normalised.
        shape: ``(H, W)``.

    Returns:
        ``[..., 6, H, W]``.
    """
    height, width = shape
    origins, directions = get_rays(extrinsics, intrinsics, shape)
    directions = torch.nn.functional.normalize(directions, dim=-1)
    moments = torch.cross(origins, directions, dim=-1)
    embedding = torch.cat([directions, moments], dim=-1)  # [..., P, 6]
    embedding = embedding.transpose(-1, -2)  # [..., 6, P]
    return embedding.reshape(*embedding.shape[:-1], height, width)


def normalize_scene(
    context_extrinsics: Tensor, *other_extrinsics: Tensor
) -> tuple[Tensor, tuple[Tensor, ...], Tensor]:
    """Express poses in the scene frame of the first context camera.

    The first context camera becomes the identity and poses are scaled so that the largest distance
    between context camera centres is 1 (a single context view, or coincident centres: scale 1).

    Args:
        context_extrinsics: ``[..., V, 4, 4]`` camera-to-world.
        *other_extrinsics: more ``[..., V', 4, 4]`` poses (e.g. targets) to move the same way.

    Returns:
        The normalised context poses, a tuple with the normalised other poses, and the scale
        ``[...]`` that world distances were divided by (divide depths, near and far by it too).
    """
    reference = invert_extrinsics(context_extrinsics[..., :1, :, :])  # [..., 1, 4, 4]
    centers = camera_centers(context_extrinsics)  # [..., V, 3]
    if centers.shape[-2] > 1:
        distances = torch.cdist(centers, centers)
        scale = distances.flatten(-2).amax(dim=-1)
    else:
        scale = torch.ones(centers.shape[:-2], dtype=centers.dtype, device=centers.device)
    scale = torch.where(scale > 1e-8, scale, torch.ones_like(scale))

    def apply(poses: Tensor) -> Tensor:
        moved = reference @ poses
        moved = moved.clone()
        moved[..., :3, 3] = moved[..., :3, 3] / scale[..., None, None]
        return moved

    return apply(context_extrinsics), tuple(apply(p) for p in other_extrinsics), scale
