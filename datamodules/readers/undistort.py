"""Undistorting images of COLMAP camera models (OPENCV, RADIAL, ...), shared by the converter and
the structure-from-motion poses."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from models.geometry.cameras import (
    camera_directions,
    pixel_grid,
)

__all__ = ["distort_points", "undistort_image"]


def distort_points(x: torch.Tensor, y: torch.Tensor, coeffs: Sequence[float]):
    """Apply OpenCV/COLMAP distortion to camera-plane coordinates (z = 1).

    Args:
        x: undistorted ``x / z``.
        y: undistorted ``y / z``.
        coeffs: ``[k1, k2, p1, p2, k3, k4, k5, k6]``.

    Returns:
        Distorted ``(x, y)``.
    """
    k1, k2, p1, p2, k3, k4, k5, k6 = (float(c) for c in coeffs)
    r2 = x * x + y * y
    radial = (1 + r2 * (k1 + r2 * (k2 + r2 * k3))) / (1 + r2 * (k4 + r2 * (k5 + r2 * k6)))
    xd = x * radial + 2 * p1 * x * y + p2 * (r2 + 2 * x * x)
    yd = y * radial + p1 * (r2 + 2 * y * y) + 2 * p2 * x * y
    return xd, yd


def undistort_image(image: torch.Tensor, intrinsics: torch.Tensor, coeffs: Sequence[float]):
    """Resample a distorted image into the pinhole camera with the same intrinsics.

    Args:
        image: ``[C, H, W]`` float image taken by the distorted camera.
        intrinsics: ``[3, 3]`` normalised intrinsics (shared by input and output).
        coeffs: ``[k1, k2, p1, p2, k3, k4, k5, k6]``.

    Returns:
        ``[C, H, W]`` undistorted image (zeros where the source has no pixel).
    """
    _, height, width = image.shape
    k = intrinsics.to(torch.float64)
    coords = pixel_grid((height, width), dtype=torch.float64).reshape(-1, 2)
    directions = camera_directions(coords, k)
    xd, yd = distort_points(directions[:, 0], directions[:, 1], coeffs)
    u = k[0, 0] * xd + k[0, 1] * yd + k[0, 2]
    v = k[1, 1] * yd + k[1, 2]
    grid = torch.stack([2 * u - 1, 2 * v - 1], dim=-1).reshape(1, height, width, 2)
    out = F.grid_sample(
        image[None].float(),
        grid.float(),
        mode="bilinear",
        padding_mode="zeros",
        align_corners=False,
    )
    return out[0]
