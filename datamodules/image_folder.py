"""Image folder and video input for inference.

``load_images(path, ...)`` accepts:

- a folder of images (jpg, jpeg, png, webp, bmp; any size; EXIF orientation applied; RGBA and
  palette transparency composited on white or black; grayscale and 16-bit images converted to RGB).
  Files that are not decodable images are skipped with a warning. A COLMAP scene folder with an
  ``images/`` subfolder works too;
- a video file (mp4, mov, avi, mkv, webm, m4v), sampled to ``num_views`` evenly spaced frames;
- a single image file.

Images are resized to cover ``image_shape`` and centre-cropped (intrinsics adjusted). When more
images than ``num_views`` are found, ``num_views`` evenly spaced ones (in natural name order) are
used.

Optional poses, converted to splatzoo's conventions (camera-to-world, OpenCV axes, normalised
intrinsics), come from ``cameras.json`` in the folder or a COLMAP text/binary model (``sparse/0``,
``sparse`` or the folder itself). ``cameras.json`` is this project's format::

    {"frames": [
        {"file": "frame_00.jpg",                 # path relative to the folder
         "camera_to_world": [[r00, r01, r02, tx],  # 4x4, OpenCV axes (+x right, +y down,
                             [r10, r11, r12, ty],  #  +z forward), row-major
                             [r20, r21, r22, tz],
                             [0, 0, 0, 1]],
         "fx": 595.0, "fy": 595.0, "cx": 424.0, "cy": 240.0,   # pixels of the full image
         "width": 848, "height": 480},            # optional: the size those pixels refer to
        ...]}

Pixel coordinates follow COLMAP: the top-left pixel's centre is at (0.5, 0.5). ``write_cameras_json``
writes the same format.
"""

from __future__ import annotations

import json
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageOps
from torch import Tensor

from models.cameras import intrinsics_to_normalized, normalize_scene

from .errors import DataError
from .transforms import resize_crop_image

__all__ = [
    "IMAGE_EXTENSIONS",
    "VIDEO_EXTENSIONS",
    "ImageSet",
    "load_images",
    "load_image_folder",
    "load_video",
    "open_image",
    "read_cameras_json",
    "write_cameras_json",
]

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".bmp")
VIDEO_EXTENSIONS = (".mp4", ".mov", ".avi", ".mkv", ".webm", ".m4v")
_SIDECARS = {"cameras.json", "cameras.txt", "images.txt", "points3d.txt", "frames.txt", "rigs.txt"}


@dataclass
class ImageSet:
    """Loaded input views.

    Attributes:
        images: ``[V, 3, H, W]`` float in [0, 1].
        names: file names (or ``video_frameNNNNN``) per view.
        source: the input path.
        original_sizes: ``(H, W)`` of each view before resizing (after EXIF orientation).
        extrinsics: ``[V, 4, 4]`` camera-to-world in the poses' world frame, or None.
        intrinsics: ``[V, 3, 3]`` normalised, for the resized/cropped images, or None.
        pose_source: ``"cameras.json"``, ``"colmap"`` or None.
    """

    images: Tensor
    names: list[str]
    source: Path
    original_sizes: list[tuple[int, int]]
    extrinsics: Tensor | None = None
    intrinsics: Tensor | None = None
    pose_source: str | None = None
    sfm: Any = None  # the datamodules.sfm.SfmResult when the poses came from structure-from-motion

    def __len__(self) -> int:
        return len(self.names)

    def context(
        self,
        near: float = 1.0,
        far: float = 100.0,
        default_fov: float = 60.0,
        normalize: bool = True,
    ) -> dict[str, Tensor]:
        """A batch of one context example for a model.

        Args:
            near: near plane per view.
            far: far plane per view.
            default_fov: horizontal field of view (degrees) assumed when intrinsics are unknown.
            normalize: express poses in the scene frame (first view = identity, unit baseline).

        Returns:
            ``image [1, V, 3, H, W]``, ``intrinsics [1, V, 3, 3]``, ``near``/``far [1, V]`` and,
            when poses are known, ``extrinsics [1, V, 4, 4]``.
        """
        views, _, height, width = self.images.shape
        if self.intrinsics is not None:
            intrinsics = self.intrinsics
        else:
            focal_x = 0.5 / np.tan(np.deg2rad(default_fov) / 2)
            k = torch.tensor(
                [[focal_x, 0.0, 0.5], [0.0, focal_x * width / height, 0.5], [0.0, 0.0, 1.0]]
            )
            intrinsics = k.expand(views, 3, 3).clone()
        out = {
            "image": self.images[None],
            "intrinsics": intrinsics[None],
            "near": torch.full((1, views), float(near)),
            "far": torch.full((1, views), float(far)),
        }
        if self.extrinsics is not None:
            extrinsics = self.extrinsics[None]
            if normalize:
                extrinsics, _, _ = normalize_scene(extrinsics)
            out["extrinsics"] = extrinsics
        return out


def _natural_key(name: str) -> list:
    return [int(part) if part.isdigit() else part.lower() for part in re.split(r"(\d+)", name)]


def _background(background: str | tuple[int, int, int]) -> tuple[int, int, int]:
    if isinstance(background, str):
        colors = {"white": (255, 255, 255), "black": (0, 0, 0)}
        if background not in colors:
            raise ValueError(
                f"background must be 'white', 'black' or an RGB tuple, got {background!r}"
            )
        return colors[background]
    return tuple(int(c) for c in background)  # type: ignore[return-value]


def open_image(
    path: str | Path,
    background: str | tuple[int, int, int] = "white",
    exif: bool = True,
) -> Image.Image:
    """Open an image file as RGB (EXIF orientation applied, transparency composited).

    Raises:
        ValueError: the file is not a decodable image.
    """
    try:
        image = Image.open(path)
        image.load()
        if exif:
            image = ImageOps.exif_transpose(image)
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as error:
        raise ValueError(f"not a readable image ({error})") from error
    if image.mode in ("I", "F") or image.mode.startswith("I;16"):
        array = np.asarray(image, dtype=np.float32)
        top = 65535.0 if array.max() > 255 else 255.0
        image = Image.fromarray(np.clip(array / top * 255 + 0.5, 0, 255).astype(np.uint8))
    has_alpha = image.mode in ("RGBA", "LA", "PA", "La", "RGBa") or (
        image.mode == "P" and "transparency" in image.info
    )
    if has_alpha:
        rgba = image.convert("RGBA")
        canvas = Image.new("RGBA", rgba.size, _background(background) + (255,))
        image = Image.alpha_composite(canvas, rgba)
    return image.convert("RGB")


def read_cameras_json(path: str | Path) -> dict[str, dict]:
    """Read ``cameras.json`` (format in the module docstring).

    Returns:
        Per file name: ``camera_to_world [4, 4]`` float64 tensor, ``fx, fy, cx, cy`` and optional
        ``width``, ``height``.

    Raises:
        DataError: malformed file (one line naming it).
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise DataError(f"{path}: unreadable cameras.json ({error})") from error
    frames = data.get("frames") if isinstance(data, dict) else None
    if not isinstance(frames, list):
        raise DataError(f"{path}: cameras.json needs a 'frames' list")
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
            raise DataError(f"{path}: frame {i} is malformed ({error!r})") from error
        if matrix.shape != (4, 4) or not torch.isfinite(matrix).all():
            raise DataError(f"{path}: frame {i} ({name}) needs a finite 4x4 camera_to_world")
        if (
            not all(np.isfinite(entry[k]) for k in ("fx", "fy", "cx", "cy"))
            or min(entry["fx"], entry["fy"]) <= 0
        ):
            raise DataError(f"{path}: frame {i} ({name}) has invalid intrinsics")
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


def _colmap_poses(folder: Path) -> dict[str, dict] | None:
    """Poses of a COLMAP model below ``folder`` in the ``read_cameras_json`` layout, or None."""
    from . import colmap

    model = colmap.find_model_dir(folder)
    if model is None:
        return None
    try:
        cameras, images, _ = colmap.read_model(model, points=False)
    except colmap.ColmapError as error:
        raise DataError(f"{model}: {error}") from error
    out: dict[str, dict] = {}
    for image in images.values():
        camera = cameras.get(image.camera_id)
        if camera is None:
            raise DataError(f"{model}: image {image.name} uses unknown camera {image.camera_id}")
        try:
            fx, fy, cx, cy = colmap.camera_pinhole(camera)
            distortion = colmap.camera_distortion(camera)
        except colmap.UnsupportedCameraError as error:
            raise DataError(f"{model}: {error}") from error
        if np.abs(distortion).max() > 1e-6:
            warnings.warn(
                f"{model}: camera {camera.id} ({camera.model}) has lens distortion, which is "
                "ignored (undistort the images for exact poses)",
                stacklevel=3,
            )
        w2c = colmap.image_world_to_camera(image)
        out[image.name] = {
            "camera_to_world": torch.linalg.inv(w2c),
            "fx": fx,
            "fy": fy,
            "cx": cx,
            "cy": cy,
            "width": camera.width,
            "height": camera.height,
        }
    return out


def _spread(count: int, total: int) -> list[int]:
    return sorted(set(np.linspace(0, total - 1, count).round().astype(int).tolist()))


def _image_files(folder: Path) -> list[Path]:
    files = []
    for path in sorted(folder.iterdir(), key=lambda p: _natural_key(p.name)):
        if path.name.startswith(".") or path.is_dir():
            continue
        if path.suffix.lower() in IMAGE_EXTENSIONS:
            files.append(path)
        elif path.name.lower() not in _SIDECARS:
            warnings.warn(f"{path}: not an image (skipped)", stacklevel=3)
    return files


def load_image_folder(
    path: str | Path,
    image_shape: tuple[int, int] | None = None,
    num_views: int | None = None,
    min_views: int = 1,
    background: str | tuple[int, int, int] = "white",
    poses: str = "auto",
) -> ImageSet:
    """Load a folder of images (see the module docstring).

    Args:
        path: the folder (or a scene folder with an ``images/`` subfolder).
        image_shape: output ``(H, W)``; None keeps the size (all images must then agree).
        num_views: use at most this many evenly spaced images.
        min_views: fewer usable images than this is an error.
        background: colour behind transparent pixels: ``"white"``, ``"black"`` or ``(r, g, b)``.
        poses: ``"auto"`` (``cameras.json``, else a COLMAP model, else none), ``"none"``,
            ``"cameras.json"``, ``"colmap"`` or a path to a ``cameras.json`` file.

    Raises:
        DataError: no images, too few images, or bad pose files (one line naming the path).
    """
    root = Path(path)
    if not root.is_dir():
        raise DataError(f"{root}: not a folder")
    folder = root
    if (root / "images").is_dir() and not any(
        p.suffix.lower() in IMAGE_EXTENSIONS for p in root.iterdir() if p.is_file()
    ):
        folder = root / "images"

    pose_table, pose_source = None, None
    if poses not in ("auto", "none", "cameras.json", "colmap"):
        pose_table, pose_source = read_cameras_json(poses), "cameras.json"
    elif poses in ("auto", "cameras.json"):
        for candidate in (root / "cameras.json", folder / "cameras.json"):
            if candidate.is_file():
                pose_table, pose_source = read_cameras_json(candidate), "cameras.json"
                break
        if pose_table is None and poses == "cameras.json":
            raise DataError(f"{root}: no cameras.json found")
    if pose_table is None and poses in ("auto", "colmap"):
        pose_table = _colmap_poses(root)
        pose_source = "colmap" if pose_table is not None else None
        if pose_table is None and poses == "colmap":
            raise DataError(f"{root}: no COLMAP model (sparse/0, sparse or the folder) found")

    files = _image_files(folder)
    if pose_table is not None:
        unposed = [f for f in files if f.name not in pose_table]
        if unposed:
            warnings.warn(
                f"{root}: {len(unposed)} image(s) without a pose in {pose_source} skipped "
                f"(first: {unposed[0].name})",
                stacklevel=2,
            )
            files = [f for f in files if f.name in pose_table]
    if not files:
        raise DataError(f"{folder}: no images found ({', '.join(IMAGE_EXTENSIONS)})")

    loaded: list[tuple[Path, Image.Image]] = []
    for file in files:
        try:
            entry = pose_table.get(file.name) if pose_table is not None else None
            image = open_image(file, background)
            if entry is not None and "width" in entry:
                expected = (entry["width"], entry["height"])
                if image.size != expected:
                    raw = open_image(file, background, exif=False)
                    if raw.size != expected:
                        raise DataError(
                            f"{file}: image is {image.size[0]}x{image.size[1]}, "
                            f"{pose_source} says {expected[0]}x{expected[1]}"
                        )
                    image = raw  # the poses refer to the stored (not EXIF-rotated) pixels
            loaded.append((file, image))
        except ValueError as error:
            if isinstance(error, DataError):
                raise
            warnings.warn(f"{file}: {error} (skipped)", stacklevel=2)
    if len(loaded) < max(min_views, 1):
        what = "no readable images" if not loaded else f"only {len(loaded)} readable image(s)"
        raise DataError(f"{folder}: {what}, at least {max(min_views, 1)} needed")
    if num_views is not None and len(loaded) > num_views:
        loaded = [loaded[i] for i in _spread(num_views, len(loaded))]

    result = _assemble([(f.name, im) for f, im in loaded], image_shape, root)
    if pose_table is not None:
        extrinsics, intrinsics = [], []
        for (file, image), crop in zip(loaded, result.pop("crops")):
            entry = pose_table[file.name]
            k_px = torch.tensor(
                [[entry["fx"], 0.0, entry["cx"]], [0.0, entry["fy"], entry["cy"]], [0.0, 0.0, 1.0]],
                dtype=torch.float64,
            )
            k = intrinsics_to_normalized(k_px, (image.height, image.width)).float()
            intrinsics.append(crop @ k)
            extrinsics.append(entry["camera_to_world"].float())
        return ImageSet(
            extrinsics=torch.stack(extrinsics),
            intrinsics=torch.stack(intrinsics),
            pose_source=pose_source,
            **result,
        )
    result.pop("crops")
    return ImageSet(**result)


def _assemble(
    named: list[tuple[str, Image.Image]], image_shape: tuple[int, int] | None, source: Path
) -> dict:
    """Resize/crop images and stack them; returns ImageSet fields plus the crop transforms."""
    if image_shape is None and len({im.size for _, im in named}) > 1:
        raise DataError(f"{source}: images differ in size; set an image shape to resize them")
    images, crops = [], []
    for _, image in named:
        tensor, crop = resize_crop_image(image, tuple(image_shape) if image_shape else None)
        images.append(tensor)
        crops.append(crop)
    return {
        "images": torch.stack(images),  # [V, 3, H, W]
        "names": [name for name, _ in named],
        "source": source,
        "original_sizes": [(im.height, im.width) for _, im in named],
        "crops": crops,
    }


def load_video(
    path: str | Path,
    num_views: int = 8,
    image_shape: tuple[int, int] | None = None,
    min_views: int = 1,
) -> ImageSet:
    """Sample ``num_views`` evenly spaced frames (first and last included) from a video.

    Raises:
        DataError: unreadable video or fewer frames than ``min_views``.
    """
    import imageio_ffmpeg

    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: video not found")
    try:
        total, _ = imageio_ffmpeg.count_frames_and_secs(str(path))
    except (RuntimeError, OSError, ValueError, IndexError) as error:
        raise DataError(
            f"{path}: unreadable video ({str(error).strip().splitlines()[0]})"
        ) from error
    if total < max(min_views, 1):
        raise DataError(f"{path}: {total} frame(s), at least {max(min_views, 1)} needed")
    wanted = _spread(min(num_views, total), total)
    select = "+".join(f"eq(n\\,{i})" for i in wanted)
    try:
        reader = imageio_ffmpeg.read_frames(
            str(path), output_params=["-vf", f"select={select}", "-fps_mode", "passthrough"]
        )
        meta = next(reader)
        width, height = meta["size"]
        frames = [np.frombuffer(raw, np.uint8).reshape(height, width, 3) for raw in reader]
    except (RuntimeError, OSError, ValueError, StopIteration) as error:
        raise DataError(
            f"{path}: unreadable video ({str(error).strip().splitlines()[0]})"
        ) from error
    if len(frames) != len(wanted):
        raise DataError(f"{path}: decoded {len(frames)} of the {len(wanted)} requested frames")
    named = [(f"{path.stem}_frame{i:05d}", Image.fromarray(f)) for i, f in zip(wanted, frames)]
    result = _assemble(named, image_shape, path)
    result.pop("crops")
    return ImageSet(**result)


def load_images(
    path: str | Path,
    image_shape: tuple[int, int] | None = None,
    num_views: int | None = None,
    min_views: int = 1,
    background: str | tuple[int, int, int] = "white",
    poses: str = "auto",
) -> ImageSet:
    """Load a folder of images, a video or a single image (see the module docstring).

    Args:
        path: folder, video file or image file.
        image_shape: output ``(H, W)``.
        num_views: images to use (evenly spaced); for a video, frames to sample (default 8).
        min_views: fewer usable views is an error.
        background: colour behind transparent pixels.
        poses: pose source for folders (see ``load_image_folder``).
    """
    path = Path(path)
    if not path.exists():
        raise DataError(f"{path}: input not found")
    if path.is_dir():
        return load_image_folder(path, image_shape, num_views, min_views, background, poses)
    suffix = path.suffix.lower()
    if suffix in VIDEO_EXTENSIONS:
        return load_video(path, num_views or 8, image_shape, min_views)
    if suffix in IMAGE_EXTENSIONS:
        if min_views > 1:
            raise DataError(f"{path}: a single image, at least {min_views} needed")
        try:
            image = open_image(path, background)
        except ValueError as error:
            raise DataError(f"{path}: {error}") from error
        result = _assemble([(path.name, image)], image_shape, path)
        result.pop("crops")
        return ImageSet(**result)
    raise DataError(
        f"{path}: unsupported input (a folder, a video {', '.join(VIDEO_EXTENSIONS)} "
        f"or an image {', '.join(IMAGE_EXTENSIONS)})"
    )
