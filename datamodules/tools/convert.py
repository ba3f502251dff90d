"""Convert your own captures into splatzoo's chunk format, with a report of what happened.

Usage::

    python -m datamodules.tools.convert SOURCE out=ROOT split=train|test \\
        [resolution=H,W | resolution=MAX_SIDE] [chunk_mb=100] [images=DIR] [frames=DIR] \\
        [key=KEY] [quality=95] [background=white|black] [undistort=false] [quiet=true]
    python -m datamodules.tools.convert PHOTOS poses=auto out=ROOT split=test [matching=M] ...

SOURCE is one scene or a folder of scenes (searched up to three levels deep; a folder holding
both ``train/`` and ``test/`` is only searched in the ``split`` one):

- COLMAP: a scene folder with a sparse model in ``sparse/0``, ``sparse``, ``colmap/sparse/0`` or
  the folder itself (text or binary, COLMAP 3 or 4) and its images in ``images/`` (or
  ``images=``: a path, or a folder name inside every scene such as ``images_4``). PINHOLE and
  SIMPLE_PINHOLE are stored as they are; SIMPLE_RADIAL, RADIAL, OPENCV and FULL_OPENCV are
  undistorted to a pinhole camera with the same focal length and principal point (black where the
  distorted image has no pixel) unless ``undistort=false``, which refuses them instead. Fisheye and
  other models are refused with a message naming the model. Views are ordered by image name.
- transforms.json (NeRF / instant-ngp / nerfstudio, DL3DV): a scene folder with
  ``transforms.json`` (or ``transforms_{split}.json``), or the file itself. OpenGL camera axes
  are converted to OpenCV; intrinsics per frame or shared (``fl_x, fl_y, cx, cy, w, h``, OpenCV
  distortion ``k1 k2 k3 p1 p2``), or ``camera_angle_x`` (and ``camera_angle_y``) when no focal is
  given. ``file_path`` may omit the extension, and ``images/...`` falls back to
  ``images_2/4/8`` (DL3DV ships downsampled folders). Views are ordered by file path. A folder
  with both a transforms.json and a COLMAP model is read through the transforms.json.
- RealEstate10K raw metadata: ``KEY.txt`` files (first line the video URL, then one line per frame:
  timestamp and 18 numbers, normalised intrinsics and the world-to-camera pose) with frames
  extracted to ``FRAMES/KEY/<timestamp>.png|jpg`` where FRAMES is ``frames=`` or the folder of
  the ``.txt`` files. A frame folder holding exactly one image per line is also accepted in
  name order (``00000.png, 00001.png, ...``).

- A plain folder of photos or video frames with ``poses=auto``: camera poses by
  structure-from-motion (``datamodules.tools.sfm``, pycolmap; ``matching=auto|exhaustive|sequential``),
  then converted like a COLMAP scene (images that do not register are left out and listed in the
  report; the COLMAP model is kept in ``ROOT/sfm/KEY/sparse``). Fewer than two registered
  images: exit status 2 with a one-line message, nothing written.

Scene keys are the scene folder name or the ``.txt`` stem (``key=`` overrides it for a single
scene). Images are stored as JPEG (JPEG sources that need no change are copied byte for byte),
optionally resized: ``resolution=MAX_SIDE`` downscales so the longer side is at most MAX_SIDE,
``resolution=H,W`` scales to cover HxW and centre-crops; intrinsics follow. Scenes that fail
(missing images, non-finite or non-rigid poses, unsupported cameras, duplicate keys) are skipped
and listed with the reason in ``ROOT/convert_report.json``; an existing split is appended to. The
exit status is 2, with a one-line message, when nothing was converted.
"""

from __future__ import annotations

import io
import json
import re
import shutil
import sys
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from PIL import Image as PILImage
from PIL import ImageOps
from tqdm import tqdm

from datamodules.errors import InputError
from datamodules.readers.chunk_writer import ChunkWriter, camera_row, encode_bytes
from datamodules.readers.colmap_records import ColmapError
from datamodules.readers.undistort import undistort_image
from datamodules.tools.scene_sources import (
    Resolution,
    SceneError,
    SceneSource,
    View,
    check_view,
    colmap_scene,
    discover,
)
from datamodules.tools.sfm import SfmError, estimate_poses
from models.core.command_line import (
    MISSING,
    SettingError,
    parse_key_values,
    run_key_value_command,
    setting,
    stopped_cleanly,
)
from models.core.output_folder import check_output_folder, write_marker
from models.core.pixels import image_from_uint8, image_to_uint8
from models.geometry.cameras import (
    intrinsics_to_normalized,
    intrinsics_to_pixels,
)

__all__ = [
    "resize_and_crop",
    "convert",
    "sfm_scene",
    "main",
]


@dataclass
class _Options:
    resolution: Resolution = field(default_factory=Resolution)
    quality: int = 95
    background: tuple[int, int, int] = (255, 255, 255)
    undistort: bool = True


def resize_and_crop(
    image: PILImage.Image, intrinsics: np.ndarray, resolution: Resolution
) -> tuple[PILImage.Image, np.ndarray]:
    """Resize (and for an exact shape, centre-crop) an image, moving its intrinsics along.

    Args:
        image: RGB image.
        intrinsics: ``[3, 3]`` normalised intrinsics of ``image``.
        resolution: target.

    Returns:
        The new image and its normalised intrinsics.
    """
    width, height = image.size
    if resolution.shape is not None:
        out_h, out_w = resolution.shape
        scale = max(out_h / height, out_w / width)
        new_w, new_h = max(out_w, round(width * scale)), max(out_h, round(height * scale))
    elif resolution.max_side is not None and max(width, height) > resolution.max_side:
        scale = resolution.max_side / max(width, height)
        new_w, new_h = max(1, round(width * scale)), max(1, round(height * scale))
        out_h, out_w = new_h, new_w
    else:
        return image, intrinsics
    if (new_w, new_h) != (width, height):
        image = image.resize((new_w, new_h), PILImage.Resampling.LANCZOS)
    left, top = (new_w - out_w) // 2, (new_h - out_h) // 2
    if (left, top, out_w, out_h) != (0, 0, new_w, new_h):
        image = image.crop((left, top, left + out_w, top + out_h))
    # A resize maps the image rectangle onto itself, so normalised intrinsics are unchanged by it;
    # the crop shifts the principal point and renormalises by the cropped size.
    pixels = intrinsics_to_pixels(torch.from_numpy(intrinsics), (new_h, new_w))
    pixels[0, 2] -= left
    pixels[1, 2] -= top
    return image, intrinsics_to_normalized(pixels, (out_h, out_w)).numpy()


def _open_rgb(view: View, background: tuple[int, int, int]) -> tuple[PILImage.Image, bool, str]:
    """Open a view's image oriented like its camera; returns (RGB image, untouched, note)."""
    try:
        image = PILImage.open(view.image)
        image.load()
    except FileNotFoundError as error:
        raise SceneError(f"missing image {view.image}") from error
    except OSError as error:
        raise SceneError(f"unreadable image {view.image}: {error}") from error
    note = ""
    orientation = image.getexif().get(0x0112, 1)
    untouched = image.format == "JPEG" and image.mode == "RGB" and orientation == 1
    if view.size is not None:
        height, width = view.size
        if image.size != (width, height):
            transposed = ImageOps.exif_transpose(image) if orientation != 1 else image
            if transposed.size == (width, height):
                image, untouched = transposed, False
            elif abs(image.size[0] / image.size[1] - width / height) <= 0.01 * width / height:
                note = f"images are {image.size[0]}x{image.size[1]}, cameras {width}x{height}"
            else:
                raise SceneError(
                    f"image {view.image} is {image.size[0]}x{image.size[1]} but its camera is "
                    f"{width}x{height}"
                )
    if image.mode in ("RGBA", "LA", "P", "PA"):
        rgba = image.convert("RGBA")
        canvas = PILImage.new("RGB", rgba.size, background)
        canvas.paste(rgba, mask=rgba.getchannel("A"))
        image, untouched = canvas, False
    elif image.mode != "RGB":
        image, untouched = image.convert("RGB"), False
    return image, untouched, note


def _process_view(view: View, options: _Options) -> tuple[torch.Tensor, np.ndarray, tuple, str]:
    """Encoded JPEG bytes, final normalised intrinsics, (H, W) and a note for one view."""
    image, untouched, note = _open_rgb(view, options.background)
    intrinsics = view.intrinsics
    if view.distortion is not None:
        if not options.undistort:
            raise SceneError(
                f"camera model {view.camera_model} of {view.label or view.image.name} has "
                "non-zero distortion and undistort=false was given"
            )
        array = undistort_image(
            image_from_uint8(image), torch.from_numpy(intrinsics), view.distortion
        )
        image, untouched = PILImage.fromarray(image_to_uint8(array)), False
    resized, intrinsics = resize_and_crop(image, intrinsics, options.resolution)
    if resized is not image:
        untouched = False
    if untouched:
        data = view.image.read_bytes()
    else:
        buffer = io.BytesIO()
        resized.save(buffer, format="JPEG", quality=options.quality)
        data = buffer.getvalue()
    return encode_bytes(data), intrinsics, (resized.size[1], resized.size[0]), note


def _convert_scene(scene: SceneSource, options: _Options, progress: tqdm) -> tuple[dict, dict]:
    url, views = scene.load()
    if not views:
        raise SceneError("no views")
    for view in views:
        check_view(view)
    images, rows, sizes, notes = [], [], set(), set()
    progress.reset(total=len(views))
    progress.set_description(scene.key[:24])
    for view in views:
        data, intrinsics, size, note = _process_view(view, options)
        images.append(data)
        rows.append(
            camera_row(torch.from_numpy(intrinsics), torch.from_numpy(view.world_to_camera))
        )
        sizes.add(size)
        if note:
            notes.add(note)
        progress.update()
    cameras = torch.stack(rows)
    if not torch.isfinite(cameras).all():
        raise SceneError("non-finite camera values after conversion (float32 overflow)")
    if len(sizes) > 1:
        notes.add("views have different sizes; pass resolution=H,W to make them equal")
    if any(view.distortion is not None for view in views):
        notes.add("undistorted to a pinhole camera")
    example = {
        "key": scene.key,
        "url": url,
        "timestamps": torch.tensor([view.timestamp for view in views], dtype=torch.int64),
        "cameras": cameras,
        "images": images,
    }
    info = {
        "key": scene.key,
        "kind": scene.kind,
        "source": str(scene.origin),
        "views": len(views),
        "sizes": sorted([list(size) for size in sizes]),
        "notes": sorted(notes),
    }
    return example, info


# --------------------------------------------------------------------------------------------
# Command


def _options(
    resolution: Resolution | None, chunk_mb: float, quality: int, background: str, undistort: bool
) -> _Options:
    if chunk_mb <= 0:
        raise InputError(f"chunk_mb must be positive, got {chunk_mb}")
    if not 1 <= quality <= 100:
        raise InputError(f"quality must be in 1..100, got {quality}")
    if background not in ("white", "black"):
        raise InputError(f"background must be white or black, got {background!r}")
    return _Options(
        resolution=resolution or Resolution(),
        quality=quality,
        background=(255, 255, 255) if background == "white" else (0, 0, 0),
        undistort=undistort,
    )


def _write_scenes(
    scenes: list[SceneSource], writer: ChunkWriter, options: _Options, quiet: bool
) -> tuple[list[dict], list[dict]]:
    """Convert and write every scene; a scene that fails is skipped with its reason. Returns
    (converted, skipped) records."""
    converted, skipped = [], []
    outer = tqdm(scenes, unit="scene", disable=quiet, dynamic_ncols=True)
    inner = tqdm(total=0, unit="view", leave=False, disable=quiet, dynamic_ncols=True)
    failures = (OSError, ValueError, KeyError, TypeError, PILImage.DecompressionBombError)
    try:
        for scene in outer:
            record = {"key": scene.key, "kind": scene.kind, "source": str(scene.origin)}
            if scene.key in writer:
                skipped.append({**record, "reason": f"duplicate key {scene.key!r}"})
                continue
            try:
                example, info = _convert_scene(scene, options, inner)
            except (SceneError, ColmapError) as error:
                skipped.append({**record, "reason": str(error)})
                continue
            except failures as error:
                skipped.append({**record, "reason": f"{type(error).__name__}: {error}"})
                continue
            info["chunk"] = writer.add(example)
            converted.append(info)
        writer.close()
    finally:
        inner.close()
        outer.close()
    return converted, skipped


def convert(
    source: str | Path,
    out: str | Path,
    split: str,
    resolution: Resolution | None = None,
    chunk_mb: float = 100.0,
    images: str | None = None,
    frames: str | Path | None = None,
    key: str | None = None,
    quality: int = 95,
    background: str = "white",
    undistort: bool = True,
    quiet: bool = False,
    poses: str | None = None,
    matching: str = "auto",
) -> dict:
    """Convert SOURCE into ``out/split`` and write ``out/convert_report.json``.

    Args:
        source: scene or folder of scenes.
        out: dataset root.
        split: split folder name.
        resolution: output size (None keeps the original).
        chunk_mb: target chunk size in megabytes.
        images: COLMAP image folder override.
        frames: RE10K frames root override.
        key: key override for a single scene.
        quality: JPEG quality.
        background: colour behind transparent pixels, ``"white"`` or ``"black"``.
        undistort: undistort distorted cameras (else skip such scenes).
        quiet: no progress bar.
        poses: ``"auto"``: SOURCE is a folder of photos posed by structure-from-motion.
        matching: structure-from-motion matching (``datamodules.tools.sfm.MATCHING``).

    Returns:
        The report (also written to ``out/convert_report.json``).

    Raises:
        InputError: bad SOURCE/arguments, or no scenes found.
    """
    out = Path(out)
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", split) or split in (".", ".."):
        raise InputError(f"invalid split name {split!r}")
    # convert adds to a dataset root; it never deletes, and writes only into its own roots
    inputs = [Path(source)] + ([Path(frames)] if frames else [])
    check_output_folder(out, PROGRAM, inputs=inputs, replace=False)
    options = _options(resolution, chunk_mb, quality, background, undistort)
    sfm = None
    if poses not in (None, "auto"):
        raise InputError(f"poses must be auto, got {poses!r}")
    if poses == "auto":
        scene, sfm = sfm_scene(Path(source), key, matching, quiet)
        scenes = [scene]
    else:
        scenes = discover(Path(source), split, images, Path(frames) if frames else None, key)
    if not scenes:
        raise InputError(
            f"{source}: no scenes found (looked for COLMAP models, transforms.json and "
            "RealEstate10K .txt files, up to 3 folders deep)"
        )
    writer = ChunkWriter(out, split, chunk_mb)
    converted, skipped = _write_scenes(scenes, writer, options, quiet)
    report = {
        "source": str(source),
        "out": str(out),
        "split": split,
        "resolution": str(options.resolution),
        "found": len(scenes),
        "converted": converted,
        "skipped": skipped,
        "views": sum(info["views"] for info in converted),
        "chunks": writer.written,
    }
    out.mkdir(parents=True, exist_ok=True)
    if sfm is not None:
        report["sfm"] = sfm.summary()
        if converted:  # keep the structure-from-motion model beside the data
            kept = out / "sfm" / scenes[0].key / "sparse"
            shutil.rmtree(kept, ignore_errors=True)
            shutil.copytree(sfm.model_dir, kept)
            report["sfm"]["model"] = str(kept)
    with open(out / "convert_report.json", "w", encoding="utf-8") as handle:
        json.dump(report, handle, indent=2)
    write_marker(out, PROGRAM)
    return report


def sfm_scene(source: Path, key: str | None, matching: str = "auto", quiet: bool = False):
    """A folder of photos posed by structure-from-motion, as a COLMAP ``SceneSource``.

    Returns:
        ``(scene, SfmResult)``.

    Raises:
        InputError: not a folder, or fewer than two images registered (one line).
    """
    if not source.is_dir():
        raise InputError(f"{source}: poses=auto needs a folder of photos")
    try:
        result = estimate_poses(source, matching=matching, verbose=0 if quiet else 1)
    except (SfmError, ValueError) as error:
        raise InputError(" ".join(str(error).split())) from error
    return colmap_scene(result.model_dir, result.image_dir, key or source.name), result


PROGRAM = "datamodules.tools.convert"
USAGE = f"usage: python -m {PROGRAM} SOURCE out=ROOT split=train|test [key=value ...] (--help)"


@dataclass
class ConvertConfig:
    """``python -m datamodules.tools.convert SOURCE out=ROOT split=SPLIT key=value ...``."""

    out: str = setting(MISSING, path=True)  # dataset root (ROOT/SPLIT/*.torch)
    split: str = MISSING  # split folder, e.g. train or test
    resolution: list[int] | None = setting(None, minimum=1)  # H,W (resize+crop) or MAX_SIDE
    chunk_mb: float = setting(100.0, above=0.0, finite=True)  # chunk size (MB)
    images: str | None = None  # COLMAP image folder (a path, or a name inside each scene)
    frames: str | None = setting(None, path=True)  # RealEstate10K frames root
    key: str | None = None  # scene key for a single-scene SOURCE
    quality: int = setting(95, minimum=1, maximum=100)  # JPEG quality
    background: str = setting("white", choices=("white", "black"))  # behind transparency
    undistort: bool = True  # false: skip distorted cameras instead of undistorting them
    quiet: bool = False  # no progress bar
    poses: str | None = setting(None, choices=("auto",))  # auto: structure-from-motion
    matching: str = setting("auto", choices=("auto", "exhaustive", "sequential"))  # poses=auto


def _parse_resolution(values: list[int] | None) -> Resolution | None:
    if not values:
        return None
    if len(values) == 1:
        return Resolution(max_side=values[0])
    if len(values) == 2:
        return Resolution(shape=(values[0], values[1]))
    raise InputError(f"resolution takes H,W or one max side, got {len(values)} numbers")


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit status (0 ok, 2 nothing converted/bad input)."""
    with warnings.catch_warnings():
        warnings.simplefilter("default")
        warnings.showwarning = _one_line_warning
        return run_key_value_command(None if argv is None else list(argv), __doc__, _run)


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:  # noqa: ARG001
    """A warning as one ``warning:`` line (a skipped photo, an unwritable SfM cache)."""
    print(f"warning: {' '.join(str(message).split())}", file=sys.stderr)


def _run(argv: list[str]) -> None:
    paths, args = parse_key_values(argv, ConvertConfig, PROGRAM)
    if len(paths) != 1:
        raise SettingError("arguments", f"expected one SOURCE, got {len(paths)} paths: {USAGE}")
    source = paths[0]
    report = convert(
        source,
        args["out"],
        args["split"],
        resolution=_parse_resolution(args["resolution"]),
        chunk_mb=args["chunk_mb"],
        images=args["images"],
        frames=args["frames"],
        key=args["key"],
        quality=args["quality"],
        background=args["background"],
        undistort=args["undistort"],
        quiet=args["quiet"],
        poses=args["poses"],
        matching=args["matching"],
    )
    report_path = Path(args["out"]) / "convert_report.json"
    if not report["converted"]:
        first = report["skipped"][0]
        raise InputError(
            f"nothing converted from {source}: {len(report['skipped'])} scene(s) skipped "
            f"(first: {first['key']}: {first['reason']}); see {report_path}"
        )
    print(
        f"converted {len(report['converted'])} scene(s), {report['views']} views into "
        f"{len(report['chunks'])} chunk(s) in {Path(args['out']) / args['split']}; "
        f"skipped {len(report['skipped'])}; report: {report_path}"
    )


if __name__ == "__main__":
    with stopped_cleanly(PROGRAM):
        sys.exit(main())
