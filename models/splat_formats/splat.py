"""The ``.splat`` of the early web viewers (antimatter15/splat), written from its layout: no header,
32 bytes a Gaussian: position (3 x float32), linear scale (3 x float32), RGBA (4 x uint8: the DC
colour ``0.5 + SH_C0 * dc`` and the opacity, each times 255) and the wxyz rotation (4 x uint8,
``q * 128 + 128`` of the unit quaternion). No higher SH bands. Axes as the INRIA ``.ply``.
"""

from __future__ import annotations

import os

import numpy as np

from datamodules.errors import InputError

from .common import SH_C0, SplatArrays, read_bytes

__all__ = ["read_splat", "write_splat"]

RECORD = np.dtype(
    [("position", "<f4", 3), ("scale", "<f4", 3), ("rgba", "u1", 4), ("rot", "u1", 4)]
)


def write_splat(path: str | os.PathLike, splats: SplatArrays) -> bytes:
    """The bytes of ``splats`` as a ``.splat`` file (higher SH bands dropped)."""
    records = np.zeros(splats.count, dtype=RECORD)
    records["position"] = splats.means
    records["scale"] = splats.scales
    colour = np.concatenate(
        [splats.harmonics[:, :, 0] * SH_C0 + 0.5, splats.opacities[:, None]], axis=1
    )
    records["rgba"] = np.clip(np.round(colour * 255.0), 0, 255)
    q = splats.rotations / np.linalg.norm(splats.rotations, axis=1, keepdims=True)
    records["rot"] = np.clip(np.round(q * 128.0 + 128.0), 0, 255)
    return records.tobytes()


def read_splat(path: str | os.PathLike) -> SplatArrays:
    """Read a ``.splat`` file."""
    data = read_bytes(path)
    if not data:
        raise InputError(path, "empty file")
    if len(data) % RECORD.itemsize:
        raise InputError(
            path,
            f"truncated or not a .splat file ({len(data)} bytes is not a multiple of "
            f"{RECORD.itemsize})",
        )
    records = np.frombuffer(data, dtype=RECORD)
    rgba = records["rgba"].astype(np.float64) / 255.0
    rotations = (records["rot"].astype(np.float64) - 128.0) / 128.0
    return SplatArrays(
        means=records["position"].astype(np.float64),
        scales=records["scale"].astype(np.float64),
        rotations=rotations,
        opacities=rgba[:, 3],
        harmonics=((rgba[:, :3] - 0.5) / SH_C0)[:, :, None],
    )
