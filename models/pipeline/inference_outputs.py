"""A :class:`~models.pipeline.reconstruction.Reconstruction`'s output folder, written atomically through
:class:`models.core.output_folder.OutputFolder` (the helper the exporter uses too): ``gaussians.ply``
(and more formats), ``renders/`` (the known input views), ``path/`` and ``path.mp4`` (the camera
path, :func:`camera_path`), ``cameras.json``, ``sparse/`` (structure-from-motion poses),
``cardinality/`` (MoE-cardinality models) and ``summary.json``. Each part is its own function;
:func:`write_reconstruction` calls them in order. ``models.pipeline.inference`` re-exports these names.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from models.core.gaussians import Gaussians, transform_gaussians
from models.core.output_folder import OutputFolder
from models.core.pixels import image_to_uint8
from models.geometry.camera_paths import interpolate_cameras, orbit_cameras
from models.geometry.cameras import intrinsics_to_pixels
from models.pipeline.metrics import psnr
from models.pipeline.reconstruction import (
    CAPTURE_PLACEMENTS,
    Reconstruction,
    StageTimer,
    progress,
)
from models.render.core import render
from models.splat_formats import parse_formats, suffix_of

__all__ = ["camera_path", "output_folder", "render_views", "write_reconstruction"]

PROGRAM = "infer.py"  # the program name in the output marker (earlier outputs stay replaceable)
CARDINALITY_COLOURS = ((0, 0, 255), (0, 255, 0), (255, 255, 0), (255, 0, 0))  # 0, 1, 2, 3+


# --------------------------------------------------------------------------- rendering


def render_views(
    gaussians: Gaussians,
    extrinsics: Tensor,
    intrinsics: Tensor,
    shape: tuple[int, int],
    backend: str = "auto",
    desc: str = "render",
    views_per_call: int = 8,
) -> Tensor:
    """Render every camera, ``views_per_call`` at a time (batched views are several times cheaper
    per view on the torch backend); returns ``[N, 3, H, W]`` on CPU."""

    out = []
    with progress(total=extrinsics.shape[0], desc=desc, unit="view") as bar:
        for start in range(0, extrinsics.shape[0], views_per_call):
            stop = min(start + views_per_call, extrinsics.shape[0])
            color = render(
                gaussians,
                extrinsics[None, start:stop],
                intrinsics[None, start:stop],
                shape,
                backend=backend,
            ).color  # [1, n, 3, H, W]
            out.append(color[0].float().cpu())
            bar.update(stop - start)
    return torch.cat(out)


def camera_path(result: Reconstruction, frames: int = 30) -> tuple[Tensor, Tensor, str]:
    """The path ``write_reconstruction`` renders: interpolated through the known cameras, or (one
    known camera) a small orbit around view 0 looking at the Gaussians' median depth.

    Returns:
        ``[frames, 4, 4]``, ``[frames, 3, 3]`` (CPU) and a description.
    """
    known = result.known
    if len(known) >= 2:
        path_e, path_k = interpolate_cameras(
            result.extrinsics[known].cpu(), result.intrinsics[known].cpu(), frames
        )
        return path_e, path_k, "interpolated between the input cameras"
    gaussians = result.gaussians
    depth = gaussians.means[0, :, 2][gaussians.valid_mask()[0]].float().cpu()
    depth = depth[depth > 0]
    look_at = float(depth.median()) if depth.numel() else 1.0
    path_e, path_k = orbit_cameras(
        result.extrinsics[0].cpu(), look_at, result.intrinsics[0].cpu(), frames, 0.1 * look_at
    )
    return path_e, path_k, "orbit around the first view"


# --------------------------------------------------------------------------- writing


def output_folder(
    output: str | os.PathLike, inputs: Iterable[str | os.PathLike] = (), overwrite: bool = False
) -> OutputFolder:
    """The atomic output folder of a reconstruction, checked now: it replaces nothing but an
    earlier reconstruction output (with ``overwrite``), and is, holds or lies in no input.

    Raises:
        OutputFolderError: one line naming the folder.
    """
    return OutputFolder(output, PROGRAM, inputs=inputs, overwrite=overwrite)


def _save_pngs(images: Tensor, paths: Iterable[Path]) -> None:
    from PIL import Image

    for array, path in zip(image_to_uint8(images), paths):
        Image.fromarray(array).save(path)


def _write_video(frames: np.ndarray, path: Path, fps: int) -> None:
    """``[N, H, W, 3]`` uint8 → H.264 MP4 (imageio-ffmpeg)."""
    import imageio.v2 as imageio

    with imageio.get_writer(
        path, fps=fps, codec="libx264", quality=8, macro_block_size=2, ffmpeg_log_level="error"
    ) as writer:
        for frame in frames:
            writer.append_data(frame)


def _save_cardinality(counts: Tensor, folder: Path, names: list[str]) -> dict[str, float]:
    """Gaussians-per-pixel maps ``[V, H, W]`` as PNGs (blue 0, green 1, yellow 2, red 3 or
    more) and ``cardinality.npy``; returns the mean count per pixel and the empty share."""
    from PIL import Image

    folder.mkdir()
    np.save(folder / "cardinality.npy", counts.numpy().astype(np.uint8))
    palette = torch.tensor(CARDINALITY_COLOURS, dtype=torch.uint8)
    for name, view in zip(names, counts):
        Image.fromarray(palette[view.clamp(0, 3)].numpy()).save(folder / name)
    return {
        "gaussians_per_pixel": round(float(counts.float().mean()), 4),
        "empty_pixel_share": round(float((counts == 0).float().mean()), 4),
    }


def _camera_entry(pose: Tensor, k_pixels: Tensor, size: tuple[int, int]) -> dict[str, Any]:
    return {
        "camera_to_world": [[float(x) for x in row] for row in pose.double().cpu()],
        "fx": float(k_pixels[0, 0]),
        "fy": float(k_pixels[1, 1]),
        "cx": float(k_pixels[0, 2]),
        "cy": float(k_pixels[1, 2]),
        "width": int(size[1]),
        "height": int(size[0]),
    }


def _input_cameras(result: Reconstruction, render_names: list[str]) -> list[dict[str, Any]]:
    """``cameras.json`` frames of the known views, in the input images' pixels when the image
    set says how it resized them (``ImageSet.original_intrinsics``), else the model's."""
    shape = result.image_size
    intrinsics = result.intrinsics.cpu()
    source = result.source
    if source is not None and hasattr(source, "original_intrinsics"):
        pixels, sizes = source.original_intrinsics(intrinsics), list(source.original_sizes)
    else:
        pixels, sizes = intrinsics_to_pixels(intrinsics.double(), shape), [shape] * len(intrinsics)
    capture = result.frame.to_capture.cameras(result.extrinsics.double().cpu())  # [V, 4, 4]
    kinds = dict.fromkeys(CAPTURE_PLACEMENTS, "input")  # cameras.json's name since its release
    return [
        {
            "file": result.names[i],
            "render": f"renders/{render_names[i]}",
            "pose": kinds.get(result.placement[i], result.placement[i]),
            **_camera_entry(capture[i], pixels[i], sizes[i]),
        }
        for i in result.known
    ]


def _save_formats(gaussians, staging: Path, formats: Iterable[str], timer) -> dict[str, dict]:
    """Write ``gaussians.<suffix>`` for each format; ``{name: {"file", "bytes"}}`` (ply too)."""
    written = {
        "ply": {"file": "gaussians.ply", "bytes": (staging / "gaussians.ply").stat().st_size}
    }
    for name in parse_formats(list(formats)):
        file = "gaussians" + suffix_of(name)
        with timer(f"save_{name}"):
            gaussians.save(staging / file)
        written[name] = {"file": file, "bytes": (staging / file).stat().st_size}
    return written


@dataclass
class WriteSettings:
    """How :func:`write_reconstruction` writes: ``frames`` cameras on the rendered path at
    ``fps``, the renderer ``backend``, more ``formats`` of the Gaussians."""

    frames: int = 30
    fps: int = 15
    backend: str = "auto"
    formats: tuple[str, ...] = ()


def _render_names(result: Reconstruction) -> list[str]:
    """``NN_<stem>.png`` per input view (``renders/``, ``cardinality/``)."""
    return [f"{i:02d}_{Path(name).stem}.png" for i, name in enumerate(result.names)]


def write_input_renders(
    result: Reconstruction, staging: Path, backend: str, timer: StageTimer
) -> list[float]:
    """``renders/NN_<name>.png``: the known input views rendered; returns their PSNR against
    the model's input images."""
    gaussians, known = result.gaussians, result.known
    device = gaussians.means.device
    with timer("render_inputs", device), torch.inference_mode():
        rendered = render_views(
            gaussians,
            result.extrinsics[known].to(device),
            result.intrinsics[known].to(device),
            result.image_size,
            backend,
            "input views",
        )
    (staging / "renders").mkdir()
    names = _render_names(result)
    _save_pngs(rendered, [staging / "renders" / names[i] for i in known])
    return [psnr(r, result.images[i]) for i, r in zip(known, rendered)]


def write_camera_path(
    result: Reconstruction, staging: Path, settings: WriteSettings, timer: StageTimer
) -> tuple[Tensor, Tensor, str]:
    """``path/frame_NNNN.png`` and ``path.mp4`` along :func:`camera_path`; returns its
    ``[frames, 4, 4]`` and ``[frames, 3, 3]`` cameras (scene frame) and its description."""
    device = result.gaussians.means.device
    path_e, path_k, path_kind = camera_path(result, settings.frames)
    with timer("render_path", device), torch.inference_mode():
        path = render_views(
            result.gaussians,
            path_e.to(device),
            path_k.to(device),
            result.image_size,
            settings.backend,
            "camera path",
        )
    (staging / "path").mkdir()
    _save_pngs(path, [staging / "path" / f"frame_{i:04d}.png" for i in range(len(path))])
    with timer("write_video"):
        _write_video(image_to_uint8(path), staging / "path.mp4", int(settings.fps))
    return path_e, path_k, path_kind


def cameras_record(result: Reconstruction, path_e: Tensor, path_k: Tensor) -> dict[str, Any]:
    """``cameras.json``: the input cameras (:func:`_input_cameras`) and the path's, in the
    capture's own frame and scale."""
    frame, shape = result.frame, result.image_size
    path_capture = frame.to_capture.cameras(path_e.double().cpu())  # [frames, 4, 4]
    cameras: dict[str, Any] = {
        "frame": "the capture's own frame and scale, as gaussians.ply (OpenCV axes, "
        "camera-to-world); the model ran in view 0's frame divided by "
        f"scene_scale={frame.scale:.6g} ({frame.rule})",
        "scene_scale": float(frame.scale),
        "poses": result.poses,
        "frames": _input_cameras(result, _render_names(result)),
        "path": [
            {
                "render": f"path/frame_{j:04d}.png",
                **_camera_entry(e, intrinsics_to_pixels(k, shape), shape),
            }
            for j, (e, k) in enumerate(zip(path_capture, path_k))
        ],
    }
    unknown = [n for n, kind in zip(result.names, result.placement) if kind == "unknown"]
    if unknown:
        cameras["unknown_poses"] = unknown
    return cameras


def summary_record(
    result: Reconstruction,
    settings: WriteSettings,
    path_kind: str,
    input_psnr: list[float],
    timings: dict[str, float],
) -> dict[str, Any]:
    """``summary.json``'s entries about the reconstruction (callers add theirs after)."""
    device = result.gaussians.means.device
    source = getattr(result.source, "source", None)
    sfm = getattr(result.source, "sfm", None)
    return {
        "model": result.model,
        "family": result.family,
        "pose_free": result.pose_free,
        "input": str(source) if source is not None else None,
        "views": len(result.names),
        "view_names": result.names,
        "image_size": list(result.image_size),
        "recipe": result.recipe_record(),
        "forward_kwargs": dict(result.knobs),
        "gaussians": result.count,
        "poses": result.poses,
        "placement": result.placement,
        "camera_path": f"{settings.frames} frames, {path_kind}",
        "input_view_psnr": [round(p, 3) for p in input_psnr],
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "render_backend": settings.backend,
        "timings_s": timings,
        "sfm": sfm.summary() if sfm is not None else None,
    }


def write_reconstruction(
    result: Reconstruction,
    output: str | os.PathLike | OutputFolder,
    *,
    frames: int = 30,
    fps: int = 15,
    backend: str = "auto",
    overwrite: bool = False,
    inputs: Iterable[str | os.PathLike] = (),
    summary: Mapping[str, Any] | None = None,
    started: float | None = None,
    extra: Callable[[Path], None] | None = None,
    formats: Iterable[str] = (),
) -> Path:
    """Write ``result``'s output folder atomically (nothing half-written, ever).

    Writes ``gaussians.ply``, ``renders/NN_<name>.png`` (the known input views rendered),
    ``path/frame_0000.png``, ..., and ``path.mp4`` (:func:`camera_path`), ``cameras.json`` (input
    cameras in the input images' pixels, and the path's), ``sparse/`` (structure-from-motion
    poses), ``cardinality/`` (MoE-cardinality maps) and ``summary.json``.

    Args:
        result: what ``models.pipeline.inference.reconstruct`` returned.
        output: the folder, or an :func:`output_folder` made (and so checked) earlier.
        frames: cameras on the rendered path.
        fps: frame rate of ``path.mp4``.
        backend: renderer backend.
        overwrite: replace an earlier reconstruction output (see :func:`output_folder`).
        inputs: paths the output may neither be, hold nor lie inside.
        summary: more ``summary.json`` entries (e.g. ``weights``, ``input``, ``warnings``).
        started: ``time.perf_counter()`` when the caller's run began (``timings_s.total``;
            default: the sum of the stages).
        extra: called with the staging folder before ``summary.json`` is written, to add
            files of the caller's (e.g. ``models.pipeline.capture``'s held-out renders).
        formats: more files of the Gaussians, ``gaussians.<suffix>`` (``models.splat_formats``
            names: spz, sog, glb, splat, compressed.ply); ``summary.json`` lists every
            ``gaussians.*`` file with its size under ``formats``.

    Returns:
        The output folder.

    Raises:
        OutputFolderError: the output may not be written or replaced (one line).
    """
    folder = (
        output if isinstance(output, OutputFolder) else output_folder(output, inputs, overwrite)
    )
    settings = WriteSettings(frames, fps, backend, tuple(formats))
    timings = dict(result.timings)
    timer = StageTimer(timings)
    with folder as staging:
        with timer("save_ply"):  # in the capture's own frame and scale
            moved = transform_gaussians(result.gaussians, result.frame.to_capture)
            moved.save_ply(staging / "gaussians.ply")
        written = _save_formats(moved, staging, settings.formats, timer)
        input_psnr = write_input_renders(result, staging, backend, timer)
        cardinality = None
        if "cardinality" in result.maps:
            cardinality = _save_cardinality(
                result.maps["cardinality"], staging / "cardinality", _render_names(result)
            )
        path_e, path_k, path_kind = write_camera_path(result, staging, settings, timer)
        cameras = cameras_record(result, path_e, path_k)
        (staging / "cameras.json").write_text(json.dumps(cameras, indent=2), encoding="utf-8")
        sfm = getattr(result.source, "sfm", None)
        if sfm is not None:  # the COLMAP model, in the capture's frame (as gaussians.ply)
            sfm.export(staging / "sparse", result.names, scene_frame=False)
        if extra is not None:
            extra(staging)
        total = time.perf_counter() - started if started is not None else sum(timings.values())
        timings["total"] = round(total, 4)
        record = {
            **summary_record(result, settings, path_kind, input_psnr, timings),
            **dict(summary or {}),
        }
        if cardinality is not None:
            record["cardinality"] = cardinality
        record["formats"] = written
        (staging / "summary.json").write_text(json.dumps(record, indent=2), encoding="utf-8")
    result.timings.update(timings)
    return folder.output
