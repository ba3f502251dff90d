"""Scene sources of ``datamodules.tools.convert``: COLMAP models, transforms.json scenes (NeRF,
instant-ngp, nerfstudio, DL3DV) and RealEstate10K camera files, found under a folder (``discover``)
and read into views with camera-to-world poses and normalised intrinsics."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image as PILImage

from datamodules.errors import InputError
from datamodules.readers.colmap import (
    camera_distortion,
    camera_intrinsics,
    find_model_dir,
    image_world_to_camera,
    read_model,
)
from datamodules.readers.colmap_records import ColmapError
from datamodules.readers.image_folder import IMAGE_EXTENSIONS, natural_key
from models.geometry.cameras import (
    intrinsics_to_normalized,
    invert_extrinsics,
)

__all__ = [
    "SceneError",
    "View",
    "SceneSource",
    "Resolution",
    "discover",
    "colmap_scene",
    "transforms_scene",
    "re10k_scene",
    "check_view",
]

_MAX_DEPTH = 3
_OPENGL_TO_OPENCV = np.diag([1.0, -1.0, -1.0, 1.0])


class SceneError(InputError):
    """One scene cannot be converted; the message is the reason in the report."""


@dataclass
class View:
    """One source frame before image processing.

    Attributes:
        image: image file.
        intrinsics: ``[3, 3]`` normalised intrinsics (pinhole part).
        world_to_camera: ``[4, 4]`` OpenCV world-to-camera.
        timestamp: integer timestamp stored in the chunk.
        size: ``(H, W)`` the intrinsics were declared for, or None to use the image's size.
        distortion: OpenCV coefficients ``[k1, k2, p1, p2, k3, k4, k5, k6]`` or None.
        camera_model: the source's camera model name (for messages).
        label: how the report names this view.
    """

    image: Path
    intrinsics: np.ndarray
    world_to_camera: np.ndarray
    timestamp: int
    size: tuple[int, int] | None = None
    distortion: np.ndarray | None = None
    camera_model: str = "PINHOLE"
    label: str = ""


@dataclass
class SceneSource:
    """A discovered scene; ``load`` parses its metadata (raising ``SceneError``).

    Attributes:
        key: scene key in the chunk index.
        kind: ``"colmap"``, ``"transforms"`` or ``"re10k"``.
        origin: the file or folder it came from.
        load: returns ``(url, views)``.
    """

    key: str
    kind: str
    origin: Path
    load: Callable[[], tuple[str, list[View]]]


@dataclass
class Resolution:
    """Output size: at most ``max_side`` on the longer side, or exactly ``shape = (H, W)``."""

    max_side: int | None = None
    shape: tuple[int, int] | None = None

    def __str__(self) -> str:
        if self.shape is not None:
            return f"{self.shape[0]}x{self.shape[1]}"
        return f"max side {self.max_side}" if self.max_side else "original"


def check_view(view: View) -> None:
    """Raise ``SceneError`` for non-finite or non-rigid poses and invalid intrinsics."""
    label = view.label or view.image.name
    if not (np.isfinite(view.world_to_camera).all() and np.isfinite(view.intrinsics).all()):
        raise SceneError(f"non-finite pose or intrinsics for {label}")
    rotation = view.world_to_camera[:3, :3]
    if (
        np.abs(rotation @ rotation.T - np.eye(3)).max() > 1e-3
        or np.linalg.det(rotation) <= 0
        or np.abs(view.world_to_camera[3] - [0, 0, 0, 1]).max() > 1e-6
    ):
        raise SceneError(f"pose of {label} is not a rigid transform (rotation not orthonormal)")
    if view.intrinsics[0, 0] <= 0 or view.intrinsics[1, 1] <= 0:
        raise SceneError(f"non-positive focal length for {label}")


# --------------------------------------------------------------------------------------------
# Sources


def _colmap_root(model_dir: Path) -> Path:
    root = model_dir
    while root.parent != root and (
        root.name in ("sparse", "colmap") or (root.name.isdigit() and root.parent.name == "sparse")
    ):
        root = root.parent
    return root


def colmap_scene(model_dir: Path, images_dir: Path, key: str) -> SceneSource:
    """A COLMAP scene: registered images ordered by name, their cameras and poses.

    Args:
        model_dir: folder with ``cameras``/``images`` ``.txt`` or ``.bin``.
        images_dir: folder the image names are relative to.
        key: scene key.
    """

    def load() -> tuple[str, list[View]]:
        try:
            cameras, images, _ = read_model(model_dir, points=False)
        except ColmapError as error:
            raise SceneError(str(error)) from error
        if not images:
            raise SceneError(f"{model_dir}: the model has no registered images")
        if not images_dir.is_dir():
            raise SceneError(f"image folder not found: {images_dir} (pass images=DIR)")
        views = []
        for index, image in enumerate(sorted(images.values(), key=lambda i: natural_key(i.name))):
            if image.camera_id not in cameras:
                raise SceneError(f"image {image.name} refers to missing camera {image.camera_id}")
            camera = cameras[image.camera_id]
            try:
                distortion = camera_distortion(camera)
                intrinsics = camera_intrinsics(camera).numpy()
            except ColmapError as error:
                raise SceneError(str(error)) from error
            views.append(
                View(
                    image=images_dir / image.name,
                    intrinsics=intrinsics,
                    world_to_camera=image_world_to_camera(image).numpy(),
                    timestamp=index,
                    size=(camera.height, camera.width),
                    distortion=distortion if np.any(distortion != 0) else None,
                    camera_model=camera.model,
                    label=image.name,
                )
            )
        return "", views

    return SceneSource(key, "colmap", model_dir, load)


def _resolve_frame_path(base: Path, file_path: str) -> Path:
    relative = Path(file_path)
    path = relative if relative.is_absolute() else base / relative
    candidates = [path]
    if path.suffix.lower() not in IMAGE_EXTENSIONS:
        candidates += [path.with_name(path.name + ext) for ext in (".png", ".jpg", ".jpeg")]
    parts = [part for part in relative.parts if part != "."]
    if not relative.is_absolute() and parts and parts[0] == "images":
        for folder in ("images_2", "images_4", "images_8"):
            candidates.append(base.joinpath(folder, *parts[1:]))
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    return path


def _image_size(path: Path) -> tuple[int, int]:
    try:
        with PILImage.open(path) as image:
            width, height = image.size
    except FileNotFoundError as error:
        raise SceneError(f"missing image {path}") from error
    except OSError as error:
        raise SceneError(f"unreadable image {path}: {error}") from error
    return height, width


_FISHEYE_MODELS = ("OPENCV_FISHEYE", "FISHEYE", "EQUIRECTANGULAR", "SPHERICAL")


def transforms_scene(json_path: Path, key: str) -> SceneSource:
    """A NeRF/instant-ngp/nerfstudio ``transforms.json`` scene (OpenGL axes -> OpenCV).

    Args:
        json_path: the ``transforms*.json`` file; ``file_path`` entries are relative to its folder.
        key: scene key.
    """

    def load() -> tuple[str, list[View]]:
        try:
            with open(json_path, encoding="utf-8") as handle:
                meta = json.load(handle)
        except (OSError, ValueError) as error:
            raise SceneError(f"{json_path}: cannot read JSON ({error})") from error
        frames = meta.get("frames") if isinstance(meta, dict) else None
        if not frames:
            raise SceneError(f"{json_path}: no 'frames'")
        base = json_path.parent
        entries = []
        for number, frame in enumerate(frames):
            if "file_path" not in frame or "transform_matrix" not in frame:
                raise SceneError(f"{json_path}: frame {number} lacks file_path or transform_matrix")
            entries.append(frame)
        entries.sort(key=lambda f: natural_key(str(f["file_path"])))
        views = []
        for index, frame in enumerate(entries):
            merged = {**meta, **frame}
            label = str(frame["file_path"])
            model = str(merged.get("camera_model", "OPENCV")).upper()
            if model in _FISHEYE_MODELS:
                raise SceneError(
                    f"unsupported camera model {model} (supported: PINHOLE, OPENCV, SIMPLE_PINHOLE)"
                )
            path = _resolve_frame_path(base, label)
            if "w" in merged and "h" in merged:
                height, width = int(merged["h"]), int(merged["w"])
            else:
                height, width = _image_size(path)
            if "fl_x" in merged:
                fx = float(merged["fl_x"])
            elif "camera_angle_x" in merged:
                fx = 0.5 * width / math.tan(0.5 * float(merged["camera_angle_x"]))
            else:
                raise SceneError(f"{json_path}: frame {label} has no fl_x or camera_angle_x")
            if "fl_y" in merged:
                fy = float(merged["fl_y"])
            elif "camera_angle_y" in merged:
                fy = 0.5 * height / math.tan(0.5 * float(merged["camera_angle_y"]))
            else:
                fy = fx
            cx = float(merged.get("cx", width / 2))
            cy = float(merged.get("cy", height / 2))
            k_pixels = torch.tensor([[fx, 0, cx], [0, fy, cy], [0, 0, 1]], dtype=torch.float64)
            intrinsics = intrinsics_to_normalized(k_pixels, (height, width)).numpy()
            coeffs = np.array(
                [float(merged.get(name, 0.0)) for name in ("k1", "k2", "p1", "p2", "k3")]
                + [0.0, 0.0, 0.0]
            )
            try:
                c2w = np.asarray(frame["transform_matrix"], dtype=np.float64)
            except (TypeError, ValueError) as error:
                raise SceneError(f"{json_path}: frame {label} has a malformed matrix") from error
            if c2w.shape == (3, 4):
                c2w = np.vstack([c2w, [0, 0, 0, 1]])
            if c2w.shape != (4, 4):
                raise SceneError(f"{json_path}: frame {label} matrix has shape {c2w.shape}")
            w2c = invert_extrinsics(torch.from_numpy(c2w @ _OPENGL_TO_OPENCV)).numpy()
            views.append(
                View(
                    image=path,
                    intrinsics=intrinsics,
                    world_to_camera=w2c,
                    timestamp=index,
                    size=(height, width),
                    distortion=coeffs if np.any(coeffs != 0) else None,
                    camera_model=model,
                    label=label,
                )
            )
        return "", views

    return SceneSource(key, "transforms", json_path, load)


def _is_re10k_file(path: Path) -> bool:
    try:
        with open(path, encoding="utf-8") as handle:
            handle.readline()
            second = handle.readline().split()
    except (OSError, UnicodeDecodeError):
        return False
    if len(second) != 19:
        return False
    try:
        [float(x) for x in second]
    except ValueError:
        return False
    return True


def re10k_scene(txt_path: Path, frames_root: Path, key: str) -> SceneSource:
    """A RealEstate10K raw scene: ``KEY.txt`` plus frames in ``frames_root/KEY/``.

    Args:
        txt_path: the metadata file (URL line, then ``timestamp`` + 18 numbers per frame).
        frames_root: folder holding one frame folder per scene key.
        key: scene key.
    """

    def load() -> tuple[str, list[View]]:
        try:
            lines = txt_path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as error:
            raise SceneError(f"{txt_path}: cannot read ({error})") from error
        if not lines:
            raise SceneError(f"{txt_path}: empty file")
        url = lines[0].strip()
        rows = []
        for number, line in enumerate(lines[1:], start=2):
            values = line.split()
            if not values:
                continue
            if len(values) != 19:
                raise SceneError(
                    f"{txt_path}:{number}: expected 19 numbers (timestamp + 18), got {len(values)}"
                )
            try:
                timestamp = int(values[0])
                numbers = np.array([float(x) for x in values[1:]], dtype=np.float64)
            except ValueError as error:
                raise SceneError(f"{txt_path}:{number}: not a number ({error})") from error
            rows.append((timestamp, numbers))
        if not rows:
            raise SceneError(f"{txt_path}: no frames")
        folder = frames_root / key
        if not folder.is_dir():
            raise SceneError(
                f"missing frames folder {folder} (expected FRAMES/{key}/<timestamp>.png|jpg)"
            )
        files = sorted(
            (p for p in folder.iterdir() if p.suffix.lower() in IMAGE_EXTENSIONS),
            key=lambda p: natural_key(p.name),
        )
        by_stem = {p.stem: p for p in files}
        paths = [by_stem.get(str(timestamp)) for timestamp, _ in rows]
        if any(path is None for path in paths):
            if len(files) == len(rows):
                paths = list(files)
            else:
                missing = [str(t) for (t, _), p in zip(rows, paths) if p is None]
                raise SceneError(
                    f"missing images: {len(missing)} of {len(rows)} frames have no "
                    f"{folder}/<timestamp>.png|jpg (first: {missing[0]}) and the folder holds "
                    f"{len(files)} images, not one per line"
                )
        views = []
        for (timestamp, numbers), path in zip(rows, paths):
            fx, fy, cx, cy = numbers[:4]
            intrinsics = np.array([[fx, 0, cx], [0, fy, cy], [0, 0, 1]], dtype=np.float64)
            w2c = np.eye(4)
            w2c[:3, :4] = numbers[6:18].reshape(3, 4)
            views.append(
                View(
                    image=path,
                    intrinsics=intrinsics,
                    world_to_camera=w2c,
                    timestamp=timestamp,
                    label=f"timestamp {timestamp}",
                )
            )
        return url, views

    return SceneSource(key, "re10k", txt_path, load)


def _images_dir(root: Path, images: str | None) -> Path:
    if images is None:
        return root / "images"
    path = Path(images)
    if path.is_dir():
        return path
    return root / images


def _scene_at(
    folder: Path, split: str, images: str | None, frames: Path | None
) -> SceneSource | None:
    """The scene stored in ``folder`` itself (transforms.json or COLMAP), if any."""
    for name in ("transforms.json", f"transforms_{split}.json"):
        if (folder / name).is_file():
            return transforms_scene(folder / name, folder.name)
    model_dir = find_model_dir(folder)
    if model_dir is not None:
        root = _colmap_root(model_dir) if model_dir == folder else folder
        return colmap_scene(model_dir, _images_dir(root, images), root.name)
    return None


def discover(
    source: Path,
    split: str,
    images: str | None = None,
    frames: Path | None = None,
    key: str | None = None,
) -> list[SceneSource]:
    """Find the scenes in SOURCE (see the module docstring for the layouts).

    Args:
        source: a scene file/folder or a folder of scenes.
        split: split name (selects ``transforms_{split}.json`` and ``SOURCE/{split}/``).
        images: COLMAP image folder (a path, or a folder name inside each scene).
        frames: RE10K frames root (default: the folder of each ``.txt``).
        key: key override for a single scene.

    Raises:
        InputError: SOURCE does not exist, or ``key`` is given for several scenes.
    """
    source = Path(source)
    if not source.exists():
        raise InputError(f"{source}: no such file or directory")
    scenes: list[SceneSource] = []
    if source.is_file():
        if source.suffix.lower() == ".json":
            scenes = [transforms_scene(source, source.parent.name)]
        elif source.name in ("cameras.txt", "images.txt", "cameras.bin", "images.bin"):
            scene = _scene_at(source.parent, split, images, frames)
            scenes = [scene] if scene is not None else []
        elif source.suffix.lower() == ".txt":
            scenes = [re10k_scene(source, frames or source.parent, source.stem)]
        else:
            raise InputError(
                f"{source}: not a transforms .json, a RealEstate10K .txt or a COLMAP model file"
            )
    else:
        scene = _scene_at(source, split, images, frames)
        if scene is not None:
            scenes = [scene]
        else:
            _walk(source, split, images, frames, 0, scenes)
    if key is not None:
        if len(scenes) != 1:
            raise InputError(f"key= needs a single-scene SOURCE, {source} holds {len(scenes)}")
        scenes[0].key = key
    return scenes


def _walk(
    folder: Path,
    split: str,
    images: str | None,
    frames: Path | None,
    depth: int,
    scenes: list[SceneSource],
) -> None:
    try:
        entries = sorted(folder.iterdir(), key=lambda p: natural_key(p.name))
    except OSError:
        return
    stems = set()
    for path in entries:
        if path.is_file() and path.suffix.lower() == ".txt" and _is_re10k_file(path):
            scenes.append(re10k_scene(path, frames or path.parent, path.stem))
            stems.add(path.stem)
    subfolders = [p for p in entries if p.is_dir() and not p.name.startswith(".")]
    names = {p.name for p in subfolders}
    if {"train", "test"} <= names:
        subfolders = [p for p in subfolders if p.name == split]
    for sub in subfolders:
        if sub.name in stems:  # an RE10K frame folder
            continue
        scene = _scene_at(sub, split, images, frames)
        if scene is not None:
            scenes.append(scene)
        elif depth + 1 < _MAX_DEPTH:
            _walk(sub, split, images, frames, depth + 1, scenes)


# --------------------------------------------------------------------------------------------
# Images
