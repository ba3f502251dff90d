"""Quaternion helpers (wxyz, the project's convention)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["matrix_to_quaternion", "quaternion_multiply", "quaternion_to_matrix"]


def quaternion_multiply(a: Tensor, b: Tensor) -> Tensor:
    """Hamilton product ``a * b`` of ``[..., 4]`` wxyz quaternions (rotation ``b`` then ``a``)."""
    aw, ax, ay, az = a.unbind(-1)
    bw, bx, by, bz = b.unbind(-1)
    return torch.stack(
        [
            aw * bw - ax * bx - ay * by - az * bz,
            aw * bx + ax * bw + ay * bz - az * by,
            aw * by - ax * bz + ay * bw + az * bx,
            aw * bz + ax * by - ay * bx + az * bw,
        ],
        dim=-1,
    )


def matrix_to_quaternion(matrix: Tensor) -> Tensor:
    """Unit wxyz quaternion ``[..., 4]`` (w >= 0) of rotation matrices ``[..., 3, 3]``.

    Of the four standard formulas it uses, per matrix, the one with the largest denominator
    (numerically stable for every rotation).
    """
    m = matrix
    m00, m11, m22 = m[..., 0, 0], m[..., 1, 1], m[..., 2, 2]
    # 4 q_i^2 for i in w, x, y, z
    squares = torch.stack(
        [1 + m00 + m11 + m22, 1 + m00 - m11 - m22, 1 - m00 + m11 - m22, 1 - m00 - m11 + m22],
        dim=-1,
    )
    roots = squares.clamp_min(1e-12).sqrt()  # 2 |q_i|
    m21_12 = m[..., 2, 1] - m[..., 1, 2]
    m02_20 = m[..., 0, 2] - m[..., 2, 0]
    m10_01 = m[..., 1, 0] - m[..., 0, 1]
    m10p01 = m[..., 1, 0] + m[..., 0, 1]
    m02p20 = m[..., 0, 2] + m[..., 2, 0]
    m21p12 = m[..., 2, 1] + m[..., 1, 2]
    candidates = torch.stack(
        [
            torch.stack([roots[..., 0] ** 2, m21_12, m02_20, m10_01], -1) / (2 * roots[..., 0:1]),
            torch.stack([m21_12, roots[..., 1] ** 2, m10p01, m02p20], -1) / (2 * roots[..., 1:2]),
            torch.stack([m02_20, m10p01, roots[..., 2] ** 2, m21p12], -1) / (2 * roots[..., 2:3]),
            torch.stack([m10_01, m02p20, m21p12, roots[..., 3] ** 2], -1) / (2 * roots[..., 3:4]),
        ],
        dim=-2,
    )  # [..., 4, 4]
    best = squares.argmax(dim=-1, keepdim=True)[..., None].expand(*squares.shape[:-1], 1, 4)
    q = candidates.gather(-2, best)[..., 0, :]
    q = torch.where(q[..., :1] < 0, -q, q)
    return F.normalize(q, dim=-1)


def quaternion_to_matrix(quaternions: Tensor) -> Tensor:
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
