"""``cameras.json``, this project's pose format (read with the photos by
``datamodules.readers.image_folder``)::

    {"frames": [
        {"file": "frame_00.jpg",                 # path relative to the folder
         "camera_to_world": [[r00, r01, r02, tx],  # 4x4, OpenCV axes (+x right, +y down,
                             [r10, r11, r12, ty],  #  +z forward), row-major
                             [r20, r21, r22, tz],
                             [0, 0, 0, 1]],
         "fx": 595.0, "fy": 595.0, "cx": 424.0, "cy": 240.0,   # pixels of the full image
         "width": 848, "height": 480},            # optional: the size those pixels refer to
        ...]}

Pixel coordinates follow COLMAP: the top-left pixel's centre is at (0.5, 0.5). ``file`` is a file
name or a path relative to the folder. Poses must be rigid (rotation orthonormal within 1e-3,
determinant +1) and focal lengths positive; a frame that is not is an error naming it.
:func:`write_cameras_json` writes the same format.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from datamodules.errors import InputError
from datamodules.readers.chunks import read_json

__all__ = ["read_cameras_json", "write_cameras_json"]


# Tolerance of the rigidity check on camera_to_world: max |R^T R - I| (float32 poses written by
# other tools are orthonormal to ~1e-6).
_ROTATION_TOLERANCE = 1e-3


def _pose_problem(matrix: Tensor) -> str | None:
    """What is wrong with a finite 4x4 camera-to-world pose, or None for a rigid transform."""
    rotation = matrix[:3, :3]
    error = float((rotation.T @ rotation - torch.eye(3, dtype=rotation.dtype)).abs().max())
    if error > _ROTATION_TOLERANCE:
        return (
            f"the rotation part of camera_to_world is not orthonormal (max |R^T R - I| = "
            f"{error:.3g}, tolerance {_ROTATION_TOLERANCE:g}); it must be a rotation matrix"
        )
    if float(torch.linalg.det(rotation)) < 0:
        return (
            "the rotation part of camera_to_world has determinant -1 (a reflection, e.g. one "
            "axis flipped); it must be a rotation with determinant +1 in OpenCV axes"
        )
    if (
        float((matrix[3] - torch.tensor([0.0, 0.0, 0.0, 1.0], dtype=matrix.dtype)).abs().max())
        > 1e-4
    ):
        return f"the last row of camera_to_world is {matrix[3].tolist()}, not [0, 0, 0, 1]"
    return None


def _intrinsics_problem(entry: dict) -> str | None:
    """What is wrong with a frame's fx, fy, cx, cy, width, height, or None."""
    for key in ("fx", "fy"):
        if not (np.isfinite(entry[key]) and entry[key] > 0):
            return f"{key}={entry[key]:g} must be a positive focal length in pixels"
    for key in ("cx", "cy"):
        if not np.isfinite(entry[key]):
            return f"{key}={entry[key]:g} must be a finite principal point in pixels"
    for key in ("width", "height"):
        if key in entry and entry[key] <= 0:
            return f"{key}={entry[key]} must be positive"
    if ("width" in entry) != ("height" in entry):
        return "give both width and height, or neither"
    return None


def read_cameras_json(path: str | Path) -> dict[str, dict]:
    """Read ``cameras.json`` (format in the module docstring).

    Returns:
        Per file name: ``camera_to_world [4, 4]`` float64 tensor, ``fx, fy, cx, cy`` and optional
        ``width``, ``height``.

    Raises:
        InputError: malformed file, a pose that is not a rigid transform (rotation orthonormal to
            1e-3, determinant +1), a non-positive or non-finite focal length, a non-finite
            principal point, or a file listed twice (one line naming the file and the frame).
    """
    path = Path(path)
    data = read_json(path, "cameras.json", encoding="utf-8-sig")  # a BOM is allowed
    frames = data.get("frames") if isinstance(data, dict) else None
    if not isinstance(frames, list):
        raise InputError(f"{path}: cameras.json needs a 'frames' list")
    out: dict[str, dict] = {}
    for i, frame in enumerate(frames):
        try:
            matrix = torch.tensor(frame["camera_to_world"], dtype=torch.float64)
            entry = {
                "camera_to_world": matrix,
                **{k: float(frame[k]) for k in ("fx", "fy", "cx", "cy")},
            }
            for k in ("width", "height"):
                if k in frame:
                    entry[k] = int(frame[k])
            name = str(frame["file"])
        except (KeyError, TypeError, ValueError) as error:
            raise InputError(f"{path}: frame {i} is malformed ({error!r})") from error
        if matrix.shape != (4, 4) or not torch.isfinite(matrix).all():
            raise InputError(f"{path}: frame {i} ({name}) needs a finite 4x4 camera_to_world")
        problem = _pose_problem(matrix) or _intrinsics_problem(entry)
        if problem:
            raise InputError(f"{path}: frame {i} ({name}): {problem}")
        if name in out:
            raise InputError(f"{path}: frame {i} lists {name} a second time")
        out[name] = entry
    return out


def write_cameras_json(
    path: str | Path,
    names: list[str],
    extrinsics: Tensor,
    intrinsics: Tensor,
    sizes: list[tuple[int, int]] | tuple[int, int],
) -> None:
    """Write ``cameras.json``.

    Args:
        path: output file.
        names: file name per view.
        extrinsics: ``[V, 4, 4]`` camera-to-world (OpenCV axes).
        intrinsics: ``[V, 3, 3]`` normalised.
        sizes: ``(H, W)`` per view (or one for all) that the pixel intrinsics refer to.
    """
    if isinstance(sizes, tuple):
        sizes = [sizes] * len(names)
    frames = []
    for name, pose, k, (height, width) in zip(names, extrinsics, intrinsics, sizes):
        frames.append(
            {
                "file": name,
                "camera_to_world": pose.double().tolist(),
                "fx": float(k[0, 0]) * width,
                "fy": float(k[1, 1]) * height,
                "cx": float(k[0, 2]) * width,
                "cy": float(k[1, 2]) * height,
                "width": int(width),
                "height": int(height),
            }
        )
    Path(path).write_text(json.dumps({"frames": frames}, indent=2), encoding="utf-8")
