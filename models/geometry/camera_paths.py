"""Camera paths for looking at a reconstruction: through the input cameras, or an orbit.

Camera-to-world OpenCV extrinsics and normalised intrinsics (``docs/design.md``).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from models.geometry.rotations import matrix_to_quaternion, quaternion_to_matrix

__all__ = ["interpolate_cameras", "orbit_cameras", "slerp"]


def slerp(q0: Tensor, q1: Tensor, t: float) -> Tensor:
    """Spherical interpolation between unit wxyz quaternions ``[4]`` (the shorter arc)."""
    if float(torch.dot(q0, q1)) < 0:
        q1 = -q1
    dot = float(torch.dot(q0, q1).clamp(-1.0, 1.0))
    if dot > 0.9995:  # nearly equal: linear, renormalised
        q = q0 + t * (q1 - q0)
        return q / q.norm()
    theta = math.acos(dot)
    return (math.sin((1 - t) * theta) * q0 + math.sin(t * theta) * q1) / math.sin(theta)


def interpolate_cameras(
    extrinsics: Tensor, intrinsics: Tensor, frames: int
) -> tuple[Tensor, Tensor]:
    """A camera path through the given cameras, in order.

    Rotations are slerped, camera centres and intrinsics linearly interpolated between neighbours.

    Args:
        extrinsics: ``[V, 4, 4]`` camera-to-world, ``V >= 2``.
        intrinsics: ``[V, 3, 3]`` normalised.
        frames: cameras on the path (the first and last are the first and last input cameras).

    Returns:
        ``[frames, 4, 4]`` and ``[frames, 3, 3]`` (on the CPU, in the input's dtype).
    """
    poses = extrinsics.detach().double().cpu()
    ks = intrinsics.detach().double().cpu()
    quats = matrix_to_quaternion(poses[:, :3, :3])  # [V, 4]
    out_e, out_k = [], []
    for s in torch.linspace(0.0, len(poses) - 1, frames, dtype=torch.float64).tolist():
        i = min(int(math.floor(s)), len(poses) - 2)
        t = s - i
        pose = torch.eye(4, dtype=torch.float64)
        pose[:3, :3] = quaternion_to_matrix(slerp(quats[i], quats[i + 1], t))
        pose[:3, 3] = (1 - t) * poses[i, :3, 3] + t * poses[i + 1, :3, 3]
        out_e.append(pose)
        out_k.append((1 - t) * ks[i] + t * ks[i + 1])
    dtype = extrinsics.dtype
    return torch.stack(out_e).to(dtype), torch.stack(out_k).to(dtype)


def orbit_cameras(
    center: Tensor, look_at_depth: float, intrinsics: Tensor, frames: int, radius: float
) -> tuple[Tensor, Tensor]:
    """A small circular orbit around a camera, looking at a point in front of it.

    Args:
        center: ``[4, 4]`` camera-to-world of the orbit's centre camera.
        look_at_depth: distance along its optical axis of the point every camera looks at.
        intrinsics: ``[3, 3]`` normalised (used for every frame).
        frames: cameras on the orbit.
        radius: orbit radius in scene units (in the camera's image plane).

    Returns:
        ``[frames, 4, 4]`` and ``[frames, 3, 3]`` (on the CPU, in the input's dtype).
    """
    base = center.detach().double().cpu()
    target = torch.tensor([0.0, 0.0, look_at_depth], dtype=torch.float64)
    up = torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64)
    poses = []
    for step in range(frames):
        angle = 2 * math.pi * step / frames
        position = torch.tensor(
            [radius * math.cos(angle), radius * math.sin(angle), 0.0], dtype=torch.float64
        )
        forward = target - position
        forward = forward / forward.norm()
        right = torch.linalg.cross(up, forward)
        right = right / right.norm()
        down = torch.linalg.cross(forward, right)
        local = torch.eye(4, dtype=torch.float64)
        local[:3, 0], local[:3, 1], local[:3, 2], local[:3, 3] = right, down, forward, position
        poses.append(base @ local)
    dtype = center.dtype
    return torch.stack(poses).to(dtype), intrinsics.detach().cpu().expand(frames, 3, 3).to(dtype)
