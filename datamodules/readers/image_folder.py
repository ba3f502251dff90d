"""Image folder and video input for inference.

``load_images(path, ...)`` accepts:

- a folder of images (jpg, jpeg, png, webp, bmp; any size; EXIF orientation applied; RGBA and
  palette transparency composited on white or black; grayscale and 16-bit images converted to RGB).
  Files that are not decodable images are skipped with a warning. A COLMAP scene folder with an
  ``images/`` subfolder works too;
- a video file (mp4, mov, avi, mkv, webm, m4v), sampled to ``num_views`` evenly spaced frames;
- a single image file.

Images are resized to cover ``image_size`` and centre-cropped (intrinsics adjusted). When more
images than ``num_views`` are found, ``num_views`` evenly spaced ones (in natural name order) are
used.

Optional poses, converted to splatzoo's conventions (camera-to-world, OpenCV axes, normalised
intrinsics), come from ``cameras.json`` in the folder (this project's format,
:mod:`datamodules.readers.cameras_json`) or a COLMAP text/binary model (``sparse/0``, ``sparse``
or the folder itself). Views that all share one camera centre get a warning (posed models need a
baseline).

Images are never squashed: the aspect-preserving resize covers ``image_size`` and the centre crop
cuts the rest (the intrinsics follow both). Images far smaller than ``image_size`` (shorter side
under half of it), of an aspect ratio more than 4:1 away from it, or whose centre crop keeps less
than ``CROP_WARNING`` (70%) of them (a portrait photo into a landscape shape) are used with a
warning naming the file and the share kept.
"""

from __future__ import annotations

import dataclasses
import posixpath
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageOps
from torch import Tensor

from datamodules.errors import InputError
from datamodules.readers import colmap, colmap_records
from datamodules.readers.cameras_json import read_cameras_json
from datamodules.transforms import cover_shape, crop_transform, resize_crop_image
from models.geometry.cameras import intrinsics_to_normalized, intrinsics_to_pixels, normalize_scene

__all__ = [
    "IMAGE_EXTENSIONS",
    "VIDEO_EXTENSIONS",
    "ImageSet",
    "load_images",
    "load_image_folder",
    "load_video",
    "natural_key",
    "open_image",
    "crop_fraction",
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
        sfm: the structure-from-motion result the poses came from, or None.
        points: ``[P, 3]`` sparse points of the COLMAP / SfM model (the poses' frame), or None;
            they set the scale of a capture for a release (``models.pipeline.inference.scene_scale``).
        fit: the same views at a second size (``fit_shape_of=`` of :func:`load_images`: a
            per-scene fit's), resized from the same decoded images, or None.
    """

    images: Tensor
    names: list[str]
    source: Path
    original_sizes: list[tuple[int, int]]
    extrinsics: Tensor | None = None
    intrinsics: Tensor | None = None
    pose_source: str | None = None
    sfm: Any = (
        None  # the datamodules.tools.sfm.SfmResult when the poses came from structure-from-motion
    )
    points: Tensor | None = None  # [P, 3] sparse points of a COLMAP / SfM model, poses' frame
    fit: ImageSet | None = None  # the same views at a second size (load_images' fit_shape_of)

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

    def original_intrinsics(self, intrinsics: Tensor) -> Tensor:
        """Normalised intrinsics ``[V, 3, 3]`` of these (resized, centre-cropped) views as pixel
        intrinsics of the original images (``original_sizes``), e.g. to write them back out."""
        shape = tuple(self.images.shape[-2:])
        out = []
        for k, original in zip(intrinsics, self.original_sizes):
            a = torch.eye(3, dtype=torch.float64)
            if tuple(original) != shape:
                a, _, _ = crop_transform(cover_shape(tuple(original), shape), shape)
            k = torch.linalg.inv(a.double()) @ k.double().cpu()
            out.append(intrinsics_to_pixels(k, tuple(original)))
        return torch.stack(out)


# (H, W) of a second size given the views loaded at the first (load_images' fit_shape_of)
FitShape = Callable[[ImageSet], tuple[int, int]]


def natural_key(name: str) -> list:
    """Sort key of natural name order: ``frame2`` before ``frame10``, case ignored."""
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


def _colmap_poses(folder: Path) -> dict[str, dict] | None:
    """Poses of a COLMAP model below ``folder`` in the ``read_cameras_json`` layout, or None."""
    model = colmap.find_model_dir(folder)
    if model is None:
        return None
    try:
        cameras, images, _ = colmap.read_model(model, points=False)
    except colmap_records.ColmapError as error:  # its message names the file already
        raise InputError(str(error) if str(model) in str(error) else f"{model}: {error}") from error
    out: dict[str, dict] = {}
    for image in images.values():
        camera = cameras.get(image.camera_id)
        if camera is None:
            raise InputError(f"{model}: image {image.name} uses unknown camera {image.camera_id}")
        try:
            pose = colmap.image_pose(image, camera)
            distortion = colmap.camera_distortion(camera)
        except colmap_records.UnsupportedCameraError as error:
            raise InputError(f"{model}: {error}") from error
        if np.abs(distortion).max() > 1e-6:
            warnings.warn(
                f"{model}: camera {camera.id} ({camera.model}) has lens distortion, which is "
                "ignored (undistort the images for exact poses)",
                stacklevel=4,  # load_image_folder's caller
            )
        out[image.name] = pose
    return out


def _sparse_points(model: Path) -> Tensor | None:
    """``[P, 3]`` float64 positions of a COLMAP model's points (None when it has none)."""
    try:
        xyz, _ = colmap.read_colmap_points(model, min_points=1)
    except colmap_records.ColmapError:
        return None
    return xyz


def _colmap_model_dir(folder: Path) -> Path | None:
    """The COLMAP model folder below ``folder`` (``sparse/0``, ``sparse`` or itself), or None."""
    return colmap.find_model_dir(folder)


def _some(names: list[str], count: int = 2) -> str:
    """The first ``count`` names, and how many more."""
    shown = ", ".join(names[:count])
    return shown + (f" and {len(names) - count} more" if len(names) > count else "")


def _match_poses(files: list[Path], table: dict[str, dict], root: Path) -> dict[Path, dict]:
    """The pose entry of each file that has one: listed by file name or by its path relative to
    the input folder (``images/a.jpg``)."""
    keys = {posixpath.normpath(name.replace("\\", "/")): entry for name, entry in table.items()}
    out = {}
    for file in files:
        for key in (file.name, file.relative_to(root).as_posix()):
            if key in keys:
                out[file] = keys[key]
                break
    return out


def _warn_no_baseline(poses: list[Tensor], pose_file: Path | None) -> None:
    """Warn when every view has the same camera centre: posed models need a baseline."""
    if len(poses) < 2:
        return
    stacked = torch.stack(poses).double()  # [V, 4, 4]
    centres = stacked[:, :3, 3]  # [V, 3]
    spread = float((centres - centres[:1]).norm(dim=-1).max())
    if spread > 1e-6 * max(1.0, float(centres.norm(dim=-1).max())):
        return
    same = bool((stacked - stacked[:1]).abs().max() < 1e-6)
    what = "identical cameras" if same else "cameras at the same position"
    warnings.warn(
        f"{pose_file}: all {len(poses)} views have {what}; posed models estimate depth from "
        "the baseline between views, which is zero here",
        stacklevel=4,  # load_image_folder's caller
    )


def _size_warnings(
    labels: list[str], sizes: list[tuple[int, int]], image_size: tuple[int, int]
) -> None:
    """Warn (one line per kind and size) about inputs far smaller than the model's input
    (shorter side under half of it) or of an aspect ratio over 4x away from it."""
    height, width = image_size
    groups: dict[tuple[str, int, int], list[str]] = {}
    for label, (w, h) in zip(labels, sizes):
        if min(w, h) < 0.5 * min(height, width):
            groups.setdefault(("small", w, h), []).append(label)
        mismatch = (w / h) / (width / height)
        if max(mismatch, 1 / mismatch) > 4:
            groups.setdefault(("aspect", w, h), []).append(label)
        elif crop_fraction((h, w), image_size) < CROP_WARNING:
            groups.setdefault(("crop", w, h), []).append(label)
    for (kind, w, h), names in groups.items():
        who = _some(list(dict.fromkeys(names)), 3)
        scale = max(height / h, width / w)  # the resize that covers the model's input
        if kind == "small":
            message = (
                f"{who}: {w}x{h} pixels is far smaller than the model's {width}x{height} input "
                f"(upsampled {scale:.3g}x; expect a blurry result)"
            )
        elif kind == "crop":
            kept = crop_fraction((h, w), image_size)
            orientation = "portrait" if h > w else "landscape" if w > h else "square"
            target = "portrait" if height > width else "landscape" if width > height else "square"
            message = (
                f"{who}: a {orientation} {w}x{h} photo into the model's {target} {width}x{height} "
                f"input (W x H): the centre crop keeps {kept:.0%} of the image "
                f"(image_size={height},{width}; set image_size= to keep more)"
            )
        else:
            kept = crop_fraction((h, w), image_size)
            message = (
                f"{who}: {w}x{h} has an extreme aspect ratio ({max(w, h) / min(w, h):.3g}:1); the "
                f"centre crop to the model's {width}x{height} input keeps {kept:.0%} of it"
            )
        warnings.warn(message, stacklevel=4)


# A centre crop that keeps less than this share of a photo is reported (a portrait photo into a
# landscape recipe keeps ~32% of it at 9:16 into 256x448; a 4:3 photo into a square 75%).
CROP_WARNING = 0.7


def crop_fraction(in_shape: tuple[int, int], out_shape: tuple[int, int]) -> float:
    """Share of an ``in_shape`` ``(H, W)`` image that the aspect-preserving resize and centre
    crop to ``out_shape`` keeps (1 when the aspect ratios agree)."""
    scaled = cover_shape(tuple(in_shape), tuple(out_shape))
    return out_shape[0] * out_shape[1] / (scaled[0] * scaled[1])


def _spread(count: int, total: int) -> list[int]:
    return sorted(set(np.linspace(0, total - 1, count).round().astype(int).tolist()))


def _image_files(folder: Path) -> list[Path]:
    files = []
    for path in sorted(folder.iterdir(), key=lambda p: natural_key(p.name)):
        if path.name.startswith(".") or path.is_dir():
            continue
        if path.suffix.lower() in IMAGE_EXTENSIONS:
            files.append(path)
        elif path.name.lower() not in _SIDECARS:
            warnings.warn(f"{path}: not an image (skipped)", stacklevel=3)
    return files


def load_image_folder(
    path: str | Path,
    image_size: tuple[int, int] | None = None,
    num_views: int | None = None,
    min_views: int = 1,
    background: str | tuple[int, int, int] = "white",
    poses: str = "auto",
    fit_shape_of: FitShape | None = None,
) -> ImageSet:
    """Load a folder of images (see the module docstring).

    Args:
        path: the folder (or a scene folder with an ``images/`` subfolder).
        image_size: output ``(H, W)``; None keeps the size (all images must then agree).
        num_views: use at most this many evenly spaced images.
        min_views: fewer usable images than this is an error.
        background: colour behind transparent pixels: ``"white"``, ``"black"`` or ``(r, g, b)``.
        poses: ``"auto"`` (``cameras.json``, else a COLMAP model, else none), ``"none"``,
            ``"cameras.json"``, ``"colmap"``, a path to a ``cameras.json`` file or to a COLMAP
            model folder.
        fit_shape_of: ``(H, W)`` of a second size of the same views (``ImageSet.fit``) given the
            loaded set, or None.

    Raises:
        InputError: no images, too few images, or bad pose files (one line naming the path).
    """
    root = Path(path)
    if not root.is_dir():
        raise InputError(f"{root}: not a folder")
    folder = root
    if (root / "images").is_dir() and not any(
        p.suffix.lower() in IMAGE_EXTENSIONS for p in root.iterdir() if p.is_file()
    ):
        folder = root / "images"
    pose_table, pose_source, pose_file = _find_poses(root, folder, poses)
    files = _image_files(folder)
    entries: dict[Path, dict] = {}
    if pose_table is not None:
        files, entries = _posed_files(files, pose_table, pose_source, pose_file, root, folder)
    if not files:
        raise InputError(f"{folder}: no images found ({', '.join(IMAGE_EXTENSIONS)})")
    loaded = _open_images(files, entries, background, pose_source)
    if len(loaded) < max(min_views, 1):
        what = "no readable images" if not loaded else f"only {len(loaded)} readable image(s)"
        raise InputError(f"{folder}: {what}, at least {max(min_views, 1)} needed")
    if num_views is not None and len(loaded) > num_views:
        loaded = [loaded[i] for i in _spread(num_views, len(loaded))]

    named = [(f.name, im) for f, im in loaded]
    result = _assemble(named, image_size, root, labels=[str(f) for f, _ in loaded])
    if pose_table is not None:
        images = _posed_image_set(loaded, entries, result, pose_source, pose_file)
    else:
        result.pop("crops")
        images = ImageSet(**result)
    if fit_shape_of is not None:
        posed = (loaded, entries) if pose_table is not None else None
        images.fit = _fit_image_set(images, named, fit_shape_of, posed)
    return images


def _find_poses(
    root: Path, folder: Path, poses: str
) -> tuple[dict[str, dict] | None, str | None, Path | None]:
    """``(pose table, "cameras.json" | "colmap", its file)`` as ``poses`` asks (all ``None``
    when there are none); ``InputError`` when a pose source that was asked for is missing."""
    pose_table, pose_source, pose_file = None, None, None
    if poses not in ("auto", "none", "cameras.json", "colmap") and Path(poses).is_dir():
        pose_file = Path(poses)  # a COLMAP model folder elsewhere (sparse/0, sparse or itself)
        pose_table, pose_source = _colmap_poses(pose_file), "colmap"
        if pose_table is None:
            raise InputError(f"{pose_file}: no COLMAP model (cameras, images) found in this folder")
    elif poses not in ("auto", "none", "cameras.json", "colmap"):
        pose_file = Path(poses)
        pose_table, pose_source = read_cameras_json(pose_file), "cameras.json"
    elif poses in ("auto", "cameras.json"):
        for candidate in (root / "cameras.json", folder / "cameras.json"):
            if candidate.is_file():
                pose_file = candidate
                pose_table, pose_source = read_cameras_json(candidate), "cameras.json"
                break
        if pose_table is None and poses == "cameras.json":
            raise InputError(f"{root}: no cameras.json found")
    if pose_table is None and poses in ("auto", "colmap"):
        pose_table = _colmap_poses(root)
        pose_source = "colmap" if pose_table is not None else None
        pose_file = _colmap_model_dir(root) if pose_table is not None else None
        if pose_table is None and poses == "colmap":
            raise InputError(f"{root}: no COLMAP model (sparse/0, sparse or the folder) found")
    return pose_table, pose_source, pose_file


def _posed_files(
    files: list[Path],
    pose_table: dict[str, dict],
    pose_source: str | None,
    pose_file: Path | None,
    root: Path,
    folder: Path,
) -> tuple[list[Path], dict[Path, dict]]:
    """The files that have a pose (the others skipped with a warning) and their pose entries."""
    if not pose_table:
        empty = "has no registered images" if pose_source == "colmap" else "lists no frames"
        raise InputError(f"{pose_file}: {empty}")
    entries = _match_poses(files, pose_table, root)
    if files and not entries:
        listed = list(pose_table)
        raise InputError(
            f"{pose_file}: none of the {len(listed)} files it lists exists in {folder} "
            f"(looked for {_some(listed)}; the folder has {_some([f.name for f in files])})"
        )
    unposed = [f for f in files if f not in entries]
    if unposed:
        warnings.warn(
            f"{root}: {len(unposed)} image(s) without a pose in {pose_source} skipped "
            f"(first: {unposed[0].name})",
            stacklevel=3,  # load_image_folder's caller
        )
        files = [f for f in files if f in entries]
    return files, entries


def _open_images(
    files: list[Path], entries: dict[Path, dict], background, pose_source: str | None
) -> list[tuple[Path, Image.Image]]:
    """The readable images (others skipped with a warning), in their stored orientation when
    that is the size their pose entry gives."""
    loaded: list[tuple[Path, Image.Image]] = []
    for file in files:
        try:
            entry = entries.get(file)
            image = open_image(file, background)
            if entry is not None and "width" in entry:
                expected = (entry["width"], entry["height"])
                if image.size != expected:
                    raw = open_image(file, background, exif=False)
                    if raw.size != expected:
                        raise InputError(
                            f"{file}: image is {image.size[0]}x{image.size[1]}, "
                            f"{pose_source} says {expected[0]}x{expected[1]}"
                        )
                    image = raw  # the poses refer to the stored (not EXIF-rotated) pixels
            loaded.append((file, image))
        except ValueError as error:
            if isinstance(error, InputError):
                raise
            warnings.warn(f"{file}: {error} (skipped)", stacklevel=3)  # load_image_folder's caller
    return loaded


def _posed_image_set(
    loaded: list[tuple[Path, Image.Image]],
    entries: dict[Path, dict],
    result: dict,
    pose_source: str | None,
    pose_file: Path | None,
) -> ImageSet:
    """The ``ImageSet`` with cameras (intrinsics through each image's resize/crop) and, for a
    COLMAP model, its sparse points."""
    _warn_no_baseline([entries[f]["camera_to_world"] for f, _ in loaded], pose_file)
    extrinsics, intrinsics = [], []
    for (file, image), crop in zip(loaded, result.pop("crops")):
        entry = entries[file]
        intrinsics.append(crop @ _normalized_intrinsics(entry, image))
        extrinsics.append(entry["camera_to_world"].float())
    points = None
    if pose_source == "colmap" and pose_file is not None:
        model_dir = _colmap_model_dir(pose_file) or pose_file
        points = _sparse_points(model_dir)
    return ImageSet(
        extrinsics=torch.stack(extrinsics),
        intrinsics=torch.stack(intrinsics),
        pose_source=pose_source,
        points=points,
        **result,
    )


def _normalized_intrinsics(entry: dict, image: Image.Image) -> Tensor:
    """``[3, 3]`` normalised intrinsics of a pose entry (pixels ``fx``, ``fy``, ``cx``, ``cy``)
    for the image as read, before any resize or crop."""
    k_px = torch.tensor(
        [[entry["fx"], 0.0, entry["cx"]], [0.0, entry["fy"], entry["cy"]], [0.0, 0.0, 1.0]],
        dtype=torch.float64,
    )
    return intrinsics_to_normalized(k_px, (image.height, image.width)).float()


def _fit_image_set(
    images: ImageSet,
    named: list[tuple[str, Image.Image]],
    fit_shape_of: FitShape,
    posed: tuple[list[tuple[Path, Image.Image]], dict[Path, dict]] | None = None,
) -> ImageSet:
    """``images`` at ``fit_shape_of(images)``, resized and cropped from the same decoded
    ``named`` images (no second read); ``posed`` (the loaded files and their pose entries):
    intrinsics through the second crop."""
    with warnings.catch_warnings():  # the size warnings were given for the first size
        warnings.simplefilter("ignore")
        result = _assemble(named, fit_shape_of(images), images.source)
    crops = result.pop("crops")
    intrinsics = None
    if posed is not None:
        loaded, entries = posed
        intrinsics = torch.stack(
            [crop @ _normalized_intrinsics(entries[f], im) for (f, im), crop in zip(loaded, crops)]
        )
    return dataclasses.replace(images, images=result["images"], intrinsics=intrinsics, fit=None)


def _assemble(
    named: list[tuple[str, Image.Image]],
    image_size: tuple[int, int] | None,
    source: Path,
    labels: list[str] | None = None,
) -> dict:
    """Resize/crop images and stack them; returns ImageSet fields plus the crop transforms.

    ``labels`` name the images in warnings about sizes far from ``image_size`` (default: the
    source).
    """
    if image_size is None and len({im.size for _, im in named}) > 1:
        raise InputError(f"{source}: images differ in size; set an image shape to resize them")
    if image_size is not None:
        _size_warnings(
            labels or [str(source)] * len(named), [im.size for _, im in named], tuple(image_size)
        )
    images, crops = [], []
    for _, image in named:
        tensor, crop = resize_crop_image(image, tuple(image_size) if image_size else None)
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
    image_size: tuple[int, int] | None = None,
    min_views: int = 1,
    fit_shape_of: FitShape | None = None,
) -> ImageSet:
    """Sample ``num_views`` evenly spaced frames (first and last included) from a video.

    Raises:
        InputError: unreadable video or fewer frames than ``min_views``.
    """
    import imageio_ffmpeg

    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: video not found")
    try:
        total, _ = imageio_ffmpeg.count_frames_and_secs(str(path))
    except (RuntimeError, OSError, ValueError, IndexError) as error:
        raise InputError(
            f"{path}: unreadable video ({str(error).strip().splitlines()[0]})"
        ) from error
    if total < max(min_views, 1):
        raise InputError(f"{path}: {total} frame(s), at least {max(min_views, 1)} needed")
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
        raise InputError(
            f"{path}: unreadable video ({str(error).strip().splitlines()[0]})"
        ) from error
    if len(frames) != len(wanted):
        raise InputError(f"{path}: decoded {len(frames)} of the {len(wanted)} requested frames")
    named = [(f"{path.stem}_frame{i:05d}", Image.fromarray(f)) for i, f in zip(wanted, frames)]
    result = _assemble(named, image_size, path)
    result.pop("crops")
    images = ImageSet(**result)
    if fit_shape_of is not None:
        images.fit = _fit_image_set(images, named, fit_shape_of)
    return images


def load_images(
    path: str | Path,
    image_size: tuple[int, int] | None = None,
    num_views: int | None = None,
    min_views: int = 1,
    background: str | tuple[int, int, int] = "white",
    poses: str = "auto",
    fit_shape_of: FitShape | None = None,
) -> ImageSet:
    """Load a folder of images, a video or a single image (see the module docstring).

    Args:
        path: folder, video file or image file.
        image_size: output ``(H, W)``.
        num_views: images to use (evenly spaced); for a video, frames to sample (default 8).
        min_views: fewer usable views is an error.
        background: colour behind transparent pixels.
        poses: pose source for folders (see ``load_image_folder``).
        fit_shape_of: ``(H, W)`` of a second size of the same views given the loaded set: the
            views are read once and resized to both (``ImageSet.fit``); None: one size.
    """
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: input not found")
    if path.is_dir():
        return load_image_folder(
            path, image_size, num_views, min_views, background, poses, fit_shape_of
        )
    suffix = path.suffix.lower()
    if suffix in VIDEO_EXTENSIONS:
        return load_video(path, num_views or 8, image_size, min_views, fit_shape_of)
    if suffix in IMAGE_EXTENSIONS:
        if min_views > 1:
            raise InputError(f"{path}: a single image, at least {min_views} needed")
        try:
            image = open_image(path, background)
        except ValueError as error:
            raise InputError(f"{path}: {error}") from error
        result = _assemble([(path.name, image)], image_size, path)
        result.pop("crops")
        images = ImageSet(**result)
        if fit_shape_of is not None:
            images.fit = _fit_image_set(images, [(path.name, image)], fit_shape_of)
        return images
    raise InputError(
        f"{path}: unsupported input (a folder, a video {', '.join(VIDEO_EXTENSIONS)} "
        f"or an image {', '.join(IMAGE_EXTENSIONS)})"
    )
