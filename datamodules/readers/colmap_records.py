"""COLMAP sparse models' records: cameras, images and points, their errors and their checks.

``datamodules.readers.colmap`` reads them from text and binary files; ``check_camera`` and
``check_image`` are the validation both formats share (see there).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from datamodules.errors import InputError

__all__ = [
    "CAMERA_MODELS",
    "CAMERA_MODEL_IDS",
    "MAX_NAME_BYTES",
    "SUPPORTED_MODELS",
    "Camera",
    "ColmapError",
    "Image",
    "Point3D",
    "UnsupportedCameraError",
    "check_camera",
    "check_image",
    "unit_qvec",
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


class ColmapError(InputError):
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


# Sanity bounds for values read from files: image sides (COLMAP stores them as uint64) and image
# name lengths (Linux's PATH_MAX); anything beyond is a corrupt file.
_MAX_SIDE = 1 << 20
MAX_NAME_BYTES = 4096
# Models with one focal length f (the rest have fx, fy); the focal lengths come first in all.
_SINGLE_FOCAL = (
    "SIMPLE_PINHOLE",
    "SIMPLE_RADIAL",
    "RADIAL",
    "SIMPLE_RADIAL_FISHEYE",
    "RADIAL_FISHEYE",
)


def unit_qvec(qvec: np.ndarray) -> np.ndarray:
    """``qvec`` (wxyz) at unit length; ``ValueError`` for a zero or non-finite one."""
    norm = float(np.linalg.norm(qvec))
    if not np.isfinite(norm) or norm < 1e-8:
        raise ValueError(
            f"rotation quaternion ({', '.join(f'{q:g}' for q in qvec)}) is not a rotation "
            "(zero or non-finite norm)"
        )
    # Unit ones (to rounding) are kept bit for bit, so that text and binary copies agree.
    return qvec if abs(norm - 1.0) < 1e-12 else qvec / norm


def check_camera(camera: Camera) -> None:
    """``ValueError`` for a wrong parameter count, a non-positive size or focal length, or
    non-finite parameters; ``UnsupportedCameraError`` for an unknown model."""
    if camera.model not in CAMERA_MODELS:
        raise UnsupportedCameraError(f"camera {camera.id} has unknown model {camera.model!r}")
    expected = CAMERA_MODELS[camera.model][1]
    if len(camera.params) != expected:
        raise ValueError(
            f"camera {camera.id} ({camera.model}) has {len(camera.params)} parameters, "
            f"expected {expected}"
        )
    if not (0 < camera.width <= _MAX_SIDE and 0 < camera.height <= _MAX_SIDE):
        raise ValueError(
            f"camera {camera.id} has an invalid image size {camera.width}x{camera.height}"
        )
    if not np.isfinite(camera.params).all():
        raise ValueError(f"camera {camera.id} ({camera.model}) has non-finite parameters")
    focal = camera.params[: 1 if camera.model in _SINGLE_FOCAL else 2]
    if (focal <= 0).any():
        raise ValueError(
            f"camera {camera.id} ({camera.model}) has a non-positive focal length "
            f"({', '.join(f'{f:g}' for f in focal)})"
        )


def check_image(image: Image) -> Image:
    """The image with its quaternion normalised; ``ValueError`` for a zero quaternion, a
    non-finite translation or keypoint, an empty name or an invalid point id."""
    image.qvec = unit_qvec(image.qvec)
    if not np.isfinite(image.tvec).all():
        raise ValueError(f"image {image.id} ({image.name}) has a non-finite translation")
    if not image.name:
        raise ValueError(f"image {image.id} has an empty name")
    if not np.isfinite(image.xys).all():
        raise ValueError(f"image {image.id} ({image.name}) has non-finite 2D points")
    if len(image.point3d_ids) and image.point3d_ids.min() < -1:
        raise ValueError(f"image {image.id} ({image.name}) has a negative 3D point id")
    return image
