"""Errors of estimated camera poses against reference ones (structure-from-motion's accuracy)."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from models.geometry.similarity import umeyama

__all__ = ["pose_errors"]


def _angle(rotation: np.ndarray) -> float:
    """Rotation angle of ``[3, 3]`` in degrees."""
    return float(np.degrees(np.arccos(np.clip((np.trace(rotation) - 1) / 2, -1.0, 1.0))))


def pose_errors(estimated: dict[str, Tensor], reference: dict[str, Tensor]) -> dict[str, float]:
    """Errors of estimated camera-to-world poses against reference ones (shared names).

    The estimate is aligned to the reference by the least-squares similarity (``models.geometry.similarity.umeyama``) that
    maps its camera centres, and a point one scene extent (the largest camera distance) ahead of
    each camera on its optical axis, onto the reference's: centres alone leave the rotation about
    a short, nearly straight camera path ill-determined, which would show up as rotation error.
    Rotation errors are the angles between aligned and reference orientations, centre errors
    distances divided by the reference's largest camera distance (the scene frame's unit).
    ``relative_rotation_*`` compares every pair's relative rotation and needs no alignment.

    Args:
        estimated: name → ``[4, 4]`` camera-to-world.
        reference: name → ``[4, 4]`` camera-to-world.

    Returns:
        ``views``, ``rotation_median_deg``, ``rotation_max_deg``, ``center_median``,
        ``center_max``, ``relative_rotation_median_deg``, ``relative_rotation_max_deg``, ``scale``.
    """
    names = [n for n in reference if n in estimated]
    if len(names) < 3:
        raise ValueError(f"need at least 3 shared views to align, got {len(names)}")
    est = np.stack([np.asarray(estimated[n], np.float64) for n in names])  # [V, 4, 4]
    ref = np.stack([np.asarray(reference[n], np.float64) for n in names])

    def extent_of(poses: np.ndarray) -> float:
        return float(np.linalg.norm(poses[:, None, :3, 3] - poses[None, :, :3, 3], axis=-1).max())

    extent, extent_est = extent_of(ref), extent_of(est)
    ahead = [
        np.concatenate([p[:, :3, 3], p[:, :3, 3] + d * p[:, :3, 2]])
        for p, d in ((est, extent_est), (ref, extent))
    ]  # [2V, 3] each
    fit = umeyama(torch.from_numpy(ahead[0]), torch.from_numpy(ahead[1]))
    scale, rotation = float(fit.scale), fit.rotation.numpy()
    aligned = fit.points(torch.from_numpy(est[:, :3, 3])).numpy()  # [V, 3]
    centers = np.linalg.norm(aligned - ref[:, :3, 3], axis=-1) / extent
    rotations = np.array([_angle((rotation @ e[:3, :3]).T @ r[:3, :3]) for e, r in zip(est, ref)])
    relative = np.array(
        [
            _angle((est[i, :3, :3].T @ est[j, :3, :3]).T @ (ref[i, :3, :3].T @ ref[j, :3, :3]))
            for i in range(len(names))
            for j in range(i + 1, len(names))
        ]
    )
    return {
        "views": len(names),
        "rotation_median_deg": float(np.median(rotations)),
        "rotation_max_deg": float(rotations.max()),
        "center_median": float(np.median(centers)),
        "center_max": float(centers.max()),
        "relative_rotation_median_deg": float(np.median(relative)),
        "relative_rotation_max_deg": float(relative.max()),
        "scale": scale,
    }
