"""Readers for COLMAP sparse models (text and binary), COLMAP 3.x and 4.x.

COLMAP 4 adds ``rigs`` and ``frames`` files next to the usual ``cameras``, ``images`` and
``points3D``; its ``images`` files keep the classic layout and hold each registered image's
composed ``cam_from_world`` pose, so the camera/image readers here are all a converter needs.
``read_rigs_text``/``read_frames_text`` are provided for completeness.

Conventions: ``Image.qvec`` is the world-to-camera rotation as a wxyz quaternion and
``Image.tvec`` the world-to-camera translation (COLMAP's ``cam_from_world``); 2D observations are
in pixels with the top-left image corner at (0, 0), so the centre of the first pixel is
(0.5, 0.5) -- the same convention as splatzoo's normalised coordinates times (W, H).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch
from torch import Tensor

from models.cameras import intrinsics_to_normalized

__all__ = [
    "CAMERA_MODELS",
    "CAMERA_MODEL_IDS",
    "SUPPORTED_MODELS",
    "Camera",
    "Image",
    "Point3D",
    "ColmapError",
    "UnsupportedCameraError",
    "read_cameras_text",
    "read_images_text",
    "read_points3d_text",
    "read_rigs_text",
    "read_frames_text",
    "read_cameras_binary",
    "read_images_binary",
    "read_points3d_binary",
    "read_model",
    "find_model_dir",
    "qvec_to_rotmat",
    "rotmat_to_qvec",
    "camera_pinhole",
    "camera_distortion",
    "camera_intrinsics",
    "camera_intrinsics_pixels",
    "image_world_to_camera",
]

# name -> (model id, number of parameters); ids and counts follow COLMAP's camera_models.h.
CAMERA_MODELS: dict[str, tuple[int, int]] = {
    "SIMPLE_PINHOLE": (0, 3),
    "PINHOLE": (1, 4),
    "SIMPLE_RADIAL": (2, 4),
    "RADIAL": (3, 5),
    "OPENCV": (4, 8),
    "OPENCV_FISHEYE": (5, 8),
    "FULL_OPENCV": (6, 12),
    "FOV": (7, 5),
    "SIMPLE_RADIAL_FISHEYE": (8, 4),
    "RADIAL_FISHEYE": (9, 5),
    "THIN_PRISM_FISHEYE": (10, 12),
    "RAD_TAN_THIN_PRISM_FISHEYE": (11, 16),
}
CAMERA_MODEL_IDS: dict[int, str] = {model_id: name for name, (model_id, _) in CAMERA_MODELS.items()}

# Models whose projection is a pinhole plus (optionally) Brown-Conrady polynomial distortion;
# everything else (fisheye, FOV, thin prism) cannot be expressed by the chunk format's pinhole rows.
SUPPORTED_MODELS = ("SIMPLE_PINHOLE", "PINHOLE", "SIMPLE_RADIAL", "RADIAL", "OPENCV", "FULL_OPENCV")


class ColmapError(ValueError):
    """A COLMAP model is missing, malformed or inconsistent."""


class UnsupportedCameraError(ColmapError):
    """A camera model that cannot be converted to a pinhole camera."""


@dataclass
class Camera:
    """One COLMAP camera (intrinsics shared by images).

    Attributes:
        id: COLMAP camera id.
        model: model name, e.g. ``"PINHOLE"``.
        width: image width in pixels.
        height: image height in pixels.
        params: model parameters in COLMAP's order (pixels for focal lengths and principal point).
    """

    id: int
    model: str
    width: int
    height: int
    params: np.ndarray


@dataclass
class Image:
    """One registered COLMAP image.

    Attributes:
        id: COLMAP image id.
        qvec: world-to-camera rotation as a unit quaternion, wxyz.
        tvec: world-to-camera translation.
        camera_id: id of the image's ``Camera``.
        name: image file name relative to the image folder.
        xys: ``[P, 2]`` float64 2D keypoints in pixels.
        point3d_ids: ``[P]`` int64 id of the triangulated point of each keypoint, -1 for none.
    """

    id: int
    qvec: np.ndarray
    tvec: np.ndarray
    camera_id: int
    name: str
    xys: np.ndarray = field(default_factory=lambda: np.zeros((0, 2)))
    point3d_ids: np.ndarray = field(default_factory=lambda: np.zeros((0,), dtype=np.int64))


@dataclass
class Point3D:
    """One triangulated COLMAP point.

    Attributes:
        id: COLMAP point id.
        xyz: world position.
        rgb: uint8 colour.
        error: mean reprojection error in pixels.
        image_ids: ids of the images observing the point.
        point2d_idxs: index of the observing keypoint in each of those images.
    """

    id: int
    xyz: np.ndarray
    rgb: np.ndarray
    error: float
    image_ids: np.ndarray
    point2d_idxs: np.ndarray


def _data_lines(path: Path) -> Iterator[str]:
    """Stripped lines of a COLMAP text file that are neither empty nor comments."""
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            line = line.strip()
            if line and not line.startswith("#"):
                yield line


def _check_params(camera_id: int, model: str, params: np.ndarray, path: Path) -> None:
    if model not in CAMERA_MODELS:
        raise UnsupportedCameraError(f"{path}: camera {camera_id} has unknown model {model!r}")
    expected = CAMERA_MODELS[model][1]
    if len(params) != expected:
        raise ColmapError(
            f"{path}: camera {camera_id} ({model}) has {len(params)} parameters, expected {expected}"
        )


def read_cameras_text(path: str | Path) -> dict[int, Camera]:
    """Read ``cameras.txt``.

    Args:
        path: the file.

    Returns:
        Cameras by id.
    """
    path = Path(path)
    cameras: dict[int, Camera] = {}
    for line in _data_lines(path):
        elems = line.split()
        try:
            camera_id, model = int(elems[0]), elems[1]
            width, height = int(elems[2]), int(elems[3])
            params = np.array([float(x) for x in elems[4:]], dtype=np.float64)
        except (IndexError, ValueError) as error:
            raise ColmapError(f"{path}: malformed camera line {line[:80]!r}") from error
        _check_params(camera_id, model, params, path)
        cameras[camera_id] = Camera(camera_id, model, width, height, params)
    return cameras


def read_images_text(path: str | Path) -> dict[int, Image]:
    """Read ``images.txt`` (two lines per image: pose line, then 2D points, possibly empty).

    Args:
        path: the file.

    Returns:
        Registered images by id.
    """
    path = Path(path)
    images: dict[int, Image] = {}
    with open(path, encoding="utf-8") as handle:
        while True:
            line = handle.readline()
            if not line:
                break
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            elems = line.split(maxsplit=9)
            try:
                image_id = int(elems[0])
                qvec = np.array([float(x) for x in elems[1:5]], dtype=np.float64)
                tvec = np.array([float(x) for x in elems[5:8]], dtype=np.float64)
                camera_id = int(elems[8])
                name = elems[9]
            except (IndexError, ValueError) as error:
                raise ColmapError(f"{path}: malformed image line {line[:80]!r}") from error
            points_line = handle.readline().split()
            if len(points_line) % 3 != 0:
                raise ColmapError(f"{path}: image {image_id} has a malformed POINTS2D line")
            points = np.array(points_line, dtype=np.float64).reshape(-1, 3)
            images[image_id] = Image(
                image_id,
                qvec,
                tvec,
                camera_id,
                name,
                points[:, :2].copy(),
                points[:, 2].astype(np.int64),
            )
    return images


def read_points3d_text(path: str | Path) -> dict[int, Point3D]:
    """Read ``points3D.txt``.

    Args:
        path: the file.

    Returns:
        Points by id.
    """
    path = Path(path)
    points: dict[int, Point3D] = {}
    for line in _data_lines(path):
        elems = line.split()
        try:
            point_id = int(elems[0])
            xyz = np.array([float(x) for x in elems[1:4]], dtype=np.float64)
            rgb = np.array([int(x) for x in elems[4:7]], dtype=np.uint8)
            error = float(elems[7])
            track = np.array([int(x) for x in elems[8:]], dtype=np.int64).reshape(-1, 2)
        except (IndexError, ValueError) as error_:
            raise ColmapError(f"{path}: malformed point line {line[:80]!r}") from error_
        points[point_id] = Point3D(point_id, xyz, rgb, error, track[:, 0], track[:, 1])
    return points


def read_rigs_text(path: str | Path) -> dict[int, dict]:
    """Read a COLMAP 4 ``rigs.txt``.

    Args:
        path: the file.

    Returns:
        Rigs by id: ``{"ref_sensor": (type, id), "sensors": [{"sensor": (type, id),
        "sensor_from_rig": (qvec wxyz, tvec) | None}, ...]}``.
    """
    path = Path(path)
    rigs: dict[int, dict] = {}
    for line in _data_lines(path):
        elems = line.split()
        rig_id, num_sensors = int(elems[0]), int(elems[1])
        rig: dict = {"ref_sensor": None, "sensors": []}
        pos = 2
        if num_sensors > 0:
            rig["ref_sensor"] = (elems[2], int(elems[3]))
            pos = 4
        for _ in range(max(num_sensors - 1, 0)):
            sensor = (elems[pos], int(elems[pos + 1]))
            has_pose = elems[pos + 2] == "1"
            pos += 3
            pose = None
            if has_pose:
                values = np.array([float(x) for x in elems[pos : pos + 7]], dtype=np.float64)
                pose = (values[:4], values[4:])
                pos += 7
            rig["sensors"].append({"sensor": sensor, "sensor_from_rig": pose})
        rigs[rig_id] = rig
    return rigs


def read_frames_text(path: str | Path) -> dict[int, dict]:
    """Read a COLMAP 4 ``frames.txt``.

    Args:
        path: the file.

    Returns:
        Frames by id: ``{"rig_id": int, "qvec": rig_from_world wxyz, "tvec": rig_from_world
        translation, "data_ids": [(sensor_type, sensor_id, data_id), ...]}``.
    """
    path = Path(path)
    frames: dict[int, dict] = {}
    for line in _data_lines(path):
        elems = line.split()
        values = np.array([float(x) for x in elems[2:9]], dtype=np.float64)
        count = int(elems[9])
        data = [
            (elems[10 + 3 * i], int(elems[11 + 3 * i]), int(elems[12 + 3 * i]))
            for i in range(count)
        ]
        frames[int(elems[0])] = {
            "rig_id": int(elems[1]),
            "qvec": values[:4],
            "tvec": values[4:],
            "data_ids": data,
        }
    return frames


def _read(handle: BinaryIO, fmt: str, path: Path) -> tuple:
    size = struct.calcsize("<" + fmt)
    data = handle.read(size)
    if len(data) != size:
        raise ColmapError(f"{path}: file is truncated")
    return struct.unpack("<" + fmt, data)


def read_cameras_binary(path: str | Path) -> dict[int, Camera]:
    """Read ``cameras.bin``.

    Args:
        path: the file.

    Returns:
        Cameras by id.
    """
    path = Path(path)
    cameras: dict[int, Camera] = {}
    with open(path, "rb") as handle:
        (count,) = _read(handle, "Q", path)
        for _ in range(count):
            camera_id, model_id, width, height = _read(handle, "IiQQ", path)
            if model_id not in CAMERA_MODEL_IDS:
                raise UnsupportedCameraError(
                    f"{path}: camera {camera_id} has unknown model id {model_id}"
                )
            model = CAMERA_MODEL_IDS[model_id]
            num_params = CAMERA_MODELS[model][1]
            params = np.array(_read(handle, "d" * num_params, path), dtype=np.float64)
            cameras[camera_id] = Camera(camera_id, model, width, height, params)
    return cameras


def read_images_binary(path: str | Path) -> dict[int, Image]:
    """Read ``images.bin``.

    Args:
        path: the file.

    Returns:
        Registered images by id.
    """
    path = Path(path)
    images: dict[int, Image] = {}
    point_dtype = np.dtype([("x", "<f8"), ("y", "<f8"), ("id", "<i8")])
    with open(path, "rb") as handle:
        (count,) = _read(handle, "Q", path)
        for _ in range(count):
            values = _read(handle, "I7dI", path)
            image_id, camera_id = values[0], values[8]
            name = bytearray()
            while True:
                char = handle.read(1)
                if not char:
                    raise ColmapError(f"{path}: file is truncated")
                if char == b"\x00":
                    break
                name += char
            (num_points,) = _read(handle, "Q", path)
            raw = handle.read(num_points * point_dtype.itemsize)
            if len(raw) != num_points * point_dtype.itemsize:
                raise ColmapError(f"{path}: file is truncated")
            points = np.frombuffer(raw, dtype=point_dtype)
            xys = np.stack([points["x"], points["y"]], axis=-1).astype(np.float64)
            images[image_id] = Image(
                image_id,
                np.array(values[1:5], dtype=np.float64),
                np.array(values[5:8], dtype=np.float64),
                camera_id,
                name.decode("utf-8"),
                xys.reshape(-1, 2),
                points["id"].astype(np.int64),
            )
    return images


def read_points3d_binary(path: str | Path) -> dict[int, Point3D]:
    """Read ``points3D.bin``.

    Args:
        path: the file.

    Returns:
        Points by id.
    """
    path = Path(path)
    points: dict[int, Point3D] = {}
    with open(path, "rb") as handle:
        (count,) = _read(handle, "Q", path)
        for _ in range(count):
            values = _read(handle, "Q3d3BdQ", path)
            point_id, track_length = values[0], values[8]
            track = np.array(_read(handle, "II" * track_length, path), dtype=np.int64)
            track = track.reshape(-1, 2)
            points[point_id] = Point3D(
                point_id,
                np.array(values[1:4], dtype=np.float64),
                np.array(values[4:7], dtype=np.uint8),
                float(values[7]),
                track[:, 0],
                track[:, 1],
            )
    return points


def find_model_dir(path: str | Path) -> Path | None:
    """Locate the sparse model folder of a COLMAP scene.

    Looks at ``path`` itself, then ``sparse/0``, ``sparse``, ``colmap/sparse/0`` and
    ``colmap/sparse`` below it.

    Args:
        path: a model folder or a scene folder.

    Returns:
        The folder holding ``cameras`` and ``images`` (``.txt`` or ``.bin``), or None.
    """
    path = Path(path)
    for candidate in (
        path,
        path / "sparse" / "0",
        path / "sparse",
        path / "colmap" / "sparse" / "0",
        path / "colmap" / "sparse",
    ):
        for ext in (".bin", ".txt"):
            if (candidate / f"cameras{ext}").is_file() and (candidate / f"images{ext}").is_file():
                return candidate
    return None


def read_model(
    path: str | Path, ext: str | None = None, points: bool = True
) -> tuple[dict[int, Camera], dict[int, Image], dict[int, Point3D]]:
    """Read a COLMAP model folder, auto-detecting text or binary.

    Args:
        path: the folder with ``cameras``, ``images`` and optionally ``points3D`` files (or a
            scene folder where ``find_model_dir`` finds one).
        ext: ``".txt"`` or ``".bin"`` to force a format; by default binary when both exist.
        points: read ``points3D`` too (an empty dict when False or when the file is absent).

    Returns:
        ``(cameras, images, points3d)``.

    Raises:
        ColmapError: no model found, or a malformed file.
    """
    folder = find_model_dir(path)
    if folder is None:
        raise ColmapError(f"{path}: no COLMAP model (cameras + images .txt/.bin) found")
    if ext is None:
        ext = ".bin" if (folder / "cameras.bin").is_file() else ".txt"
    if ext not in (".bin", ".txt"):
        raise ValueError(f"ext must be '.txt' or '.bin', got {ext!r}")
    readers = {
        ".txt": (read_cameras_text, read_images_text, read_points3d_text),
        ".bin": (read_cameras_binary, read_images_binary, read_points3d_binary),
    }[ext]
    cameras = readers[0](folder / f"cameras{ext}")
    images = readers[1](folder / f"images{ext}")
    points3d: dict[int, Point3D] = {}
    if points and (folder / f"points3D{ext}").is_file():
        points3d = readers[2](folder / f"points3D{ext}")
    return cameras, images, points3d


def qvec_to_rotmat(qvec: np.ndarray) -> np.ndarray:
    """Rotation matrix ``[3, 3]`` of a wxyz quaternion (normalised first)."""
    w, x, y, z = np.asarray(qvec, dtype=np.float64) / np.linalg.norm(qvec)
    return np.array(
        [
            [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
            [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
            [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
        ]
    )


def rotmat_to_qvec(rotation: np.ndarray) -> np.ndarray:
    """Unit wxyz quaternion (w >= 0) of a rotation matrix ``[3, 3]``."""
    r = np.asarray(rotation, dtype=np.float64)
    # Symmetric 4x4 matrix whose dominant eigenvector is the quaternion (Bar-Itzhack).
    k = (
        np.array(
            [
                [r[0, 0] - r[1, 1] - r[2, 2], 0, 0, 0],
                [r[1, 0] + r[0, 1], r[1, 1] - r[0, 0] - r[2, 2], 0, 0],
                [r[2, 0] + r[0, 2], r[2, 1] + r[1, 2], r[2, 2] - r[0, 0] - r[1, 1], 0],
                [r[2, 1] - r[1, 2], r[0, 2] - r[2, 0], r[1, 0] - r[0, 1], r.trace()],
            ]
        )
        / 3.0
    )
    eigenvalues, eigenvectors = np.linalg.eigh(k)
    x, y, z, w = eigenvectors[:, np.argmax(eigenvalues)]
    qvec = np.array([w, x, y, z])
    return -qvec if qvec[0] < 0 else qvec


def camera_pinhole(camera: Camera) -> tuple[float, float, float, float]:
    """Pinhole part ``(fx, fy, cx, cy)`` in pixels of a supported camera.

    Raises:
        UnsupportedCameraError: fisheye, FOV or thin-prism models (named in the message).
    """
    p = camera.params
    if camera.model in ("SIMPLE_PINHOLE", "SIMPLE_RADIAL", "RADIAL"):
        return float(p[0]), float(p[0]), float(p[1]), float(p[2])
    if camera.model in ("PINHOLE", "OPENCV", "FULL_OPENCV"):
        return float(p[0]), float(p[1]), float(p[2]), float(p[3])
    raise UnsupportedCameraError(
        f"camera {camera.id}: unsupported camera model {camera.model} "
        f"(supported: {', '.join(SUPPORTED_MODELS)}; undistort it with `colmap image_undistorter`)"
    )


def camera_distortion(camera: Camera) -> np.ndarray:
    """Distortion coefficients ``[k1, k2, p1, p2, k3, k4, k5, k6]`` (OpenCV order).

    Radial factor ``(1 + k1 r^2 + k2 r^4 + k3 r^6) / (1 + k4 r^2 + k5 r^4 + k6 r^6)`` plus the
    tangential terms ``p1, p2``; all zeros for pinhole models.

    Raises:
        UnsupportedCameraError: fisheye, FOV or thin-prism models.
    """
    camera_pinhole(camera)  # raises for unsupported models
    p = camera.params
    coeffs = np.zeros(8, dtype=np.float64)
    if camera.model == "SIMPLE_RADIAL":
        coeffs[0] = p[3]
    elif camera.model == "RADIAL":
        coeffs[0:2] = p[3:5]
    elif camera.model == "OPENCV":
        coeffs[0:4] = p[4:8]
    elif camera.model == "FULL_OPENCV":
        coeffs[:] = p[4:12]
    return coeffs


def camera_intrinsics_pixels(camera: Camera) -> Tensor:
    """Pixel intrinsics ``[3, 3]`` (float64) of the camera's pinhole part."""
    fx, fy, cx, cy = camera_pinhole(camera)
    return torch.tensor([[fx, 0.0, cx], [0.0, fy, cy], [0.0, 0.0, 1.0]], dtype=torch.float64)


def camera_intrinsics(camera: Camera) -> Tensor:
    """Normalised intrinsics ``[3, 3]`` (float64) of the camera's pinhole part.

    Row 0 is divided by the width and row 1 by the height (splatzoo's convention).
    """
    return intrinsics_to_normalized(camera_intrinsics_pixels(camera), (camera.height, camera.width))


def image_world_to_camera(image: Image) -> Tensor:
    """World-to-camera 4x4 (float64, OpenCV axes, as COLMAP) of an image's qvec/tvec."""
    matrix = torch.eye(4, dtype=torch.float64)
    matrix[:3, :3] = torch.from_numpy(qvec_to_rotmat(image.qvec))
    matrix[:3, 3] = torch.from_numpy(np.asarray(image.tvec, dtype=np.float64))
    return matrix
