"""Reconstruct 3D Gaussians from your own images or video, and render them.

    python infer.py input=PATH output=DIR [model=NAME] [weights=PATH|local-dir:...|hf-hub:...]
        [views=N] [compression=R] [iterations=K] [image_size=S] [cameras=PATH] [overwrite=true]

``input`` is a folder of images, a video (sampled to ``views`` frames) or one image. Pose-free models
need no cameras; posed models read ``cameras.json`` or a COLMAP model (``cameras=`` or found in the
input folder), else (or with ``cameras=auto``) estimate poses by structure-from-motion
(``datamodules.sfm``, pycolmap; settings ``sfm.*``). ``output`` receives:

- ``gaussians.ply``: the Gaussians (INRIA 3DGS layout; opens in SuperSplat and other viewers);
- ``cameras.json``: the input cameras in the scene frame (given, or predicted by a pose-free model),
  in the input images' pixels, plus the rendered path's cameras;
- ``renders/NN_<name>.png``: the input views rendered from the Gaussians (poses known);
- ``path/frame_XXXX.png`` and ``path.mp4``: a camera path interpolated between the input views
  (a small orbit around the first view when there is one view or the poses are unknown);
- ``sparse/``: with structure-from-motion poses, the COLMAP text model in the same scene frame;
- ``summary.json``: model, weights, Gaussian count, timings per stage, device (and ``sfm``:
  images registered, mean reprojection error, points, timings).

Everything is written to a temporary folder beside ``output`` and renamed into place at the end, so
an interrupted run never leaves half an output. Bad input (no images, too few views, unreadable
files, weights of another model, a posed model without poses, an existing output without
``overwrite=true``) is one line on stderr naming the path, and exit status 2.

The configuration is ``configs/infer.yaml`` (Hydra). ``model=NAME`` names a registry model (it is
read before Hydra, whose ``configs/model`` group holds the training configs).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hydra
import numpy as np
import torch
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf, open_dict
from torch import Tensor

REPO_ROOT = Path(__file__).resolve().parent
if str(REPO_ROOT) not in sys.path:  # `python /path/to/infer.py` from another folder
    sys.path.insert(0, str(REPO_ROOT))

from datamodules.errors import DataError  # noqa: E402
from models.command_line import quote_path_arguments  # noqa: E402
from models.errors import PathError  # noqa: E402
from models.output_folder import OutputFolder, OutputFolderError  # noqa: E402
from models.pretrained import PretrainedError  # noqa: E402

__all__ = [
    "InferError",
    "compose",
    "run",
    "run_cli",
    "interpolate_cameras",
    "orbit_cameras",
    "main",
]

_MODEL_OVERRIDE: list[str] = []  # ``model=NAME`` taken from the command line before Hydra
_TEMPORARY_FILES: list[str] = []  # removed when ``run`` ends


class InferError(PathError):
    """Unusable input or settings; reported as one line naming ``path``."""


# --------------------------------------------------------------------------- helpers


def _progress(iterable=None, **kwargs):
    """tqdm on an interactive stderr only (pipes and logs stay clean)."""
    from tqdm.auto import tqdm

    return tqdm(iterable, disable=None, leave=False, dynamic_ncols=True, **kwargs)


class _Timer:
    """Wall time per stage, in seconds."""

    def __init__(self) -> None:
        self.stages: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str, device: torch.device | None = None) -> Iterator[None]:
        start = time.perf_counter()
        yield
        if device is not None and device.type == "cuda":
            torch.cuda.synchronize(device)
        self.stages[name] = round(time.perf_counter() - start, 4)


def choose_device(spec: str) -> torch.device:
    """``auto`` → CUDA when available, else CPU; anything else is parsed by ``torch.device``."""
    if spec in (None, "", "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(spec)
    except (RuntimeError, ValueError) as error:
        raise InferError(f"device={spec}", "not a device (auto, cpu, cuda, cuda:N)") from error
    if device.type == "cuda" and not torch.cuda.is_available():
        raise InferError(f"device={spec}", "CUDA is not available on this machine (use device=cpu)")
    return device


# What an infer.py output folder written before the output marker existed may hold.
_INFER_ENTRIES = ("gaussians.ply", "cameras.json", "renders", "path", "path.mp4", "summary.json")


def _legacy_output(folder: Path) -> tuple[str, ...] | None:
    """The entries of an older infer.py output (it has our ``summary.json``), else ``None``."""
    try:
        summary = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if isinstance(summary, dict) and {"gaussians", "timings_s", "model"} <= summary.keys():
        return _INFER_ENTRIES
    return None


def output_folder(output: Path, inputs: list[Path], overwrite: bool) -> OutputFolder:
    """The atomic output of a run: refuses to replace anything but an earlier infer.py output,
    and any output that is, holds or lies inside one of the ``inputs``."""
    try:
        return OutputFolder(
            output, "infer.py", inputs=inputs, overwrite=overwrite, legacy=_legacy_output
        )
    except OutputFolderError as error:
        raise InferError(error.path, error.message) from None


def _save_png(image: Tensor, path: Path) -> None:
    """``[3, H, W]`` in [0, 1] → PNG."""
    from PIL import Image

    array = (image.detach().clamp(0, 1) * 255 + 0.5).to(torch.uint8).permute(1, 2, 0).cpu().numpy()
    Image.fromarray(array).save(path)


CARDINALITY_COLOURS = ((0, 0, 255), (0, 255, 0), (255, 255, 0), (255, 0, 0))  # 0, 1, 2, 3+


def _save_cardinality(routing_map: Tensor, folder: Path, names: list[str]) -> dict[str, float]:
    """Per-view Gaussians-per-pixel maps of MoE-cardinality models (``extras["routing_map"]``
    ``[V, H, W]``) as PNGs (blue 0, green 1, yellow 2, red 3 or more) and ``cardinality.npy``;
    returns the mean count per pixel and the share of empty pixels."""
    from PIL import Image

    folder.mkdir()
    counts = routing_map.detach().to(torch.int64).cpu()
    np.save(folder / "cardinality.npy", counts.numpy().astype(np.uint8))
    palette = torch.tensor(CARDINALITY_COLOURS, dtype=torch.uint8)
    for name, view in zip(names, counts):
        Image.fromarray(palette[view.clamp(0, 3)].numpy()).save(folder / name)
    return {
        "gaussians_per_pixel": round(float(counts.float().mean()), 4),
        "empty_pixel_share": round(float((counts == 0).float().mean()), 4),
    }


def _to_uint8(images: Tensor) -> np.ndarray:
    """``[N, 3, H, W]`` in [0, 1] → ``[N, H, W, 3]`` uint8."""
    return (
        (images.detach().clamp(0, 1) * 255 + 0.5).to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()
    )


def _write_video(frames: np.ndarray, path: Path, fps: int) -> None:
    """``[N, H, W, 3]`` uint8 → H.264 MP4 (imageio-ffmpeg)."""
    import imageio.v2 as imageio

    with imageio.get_writer(
        path, fps=fps, codec="libx264", quality=8, macro_block_size=2, ffmpeg_log_level="error"
    ) as writer:
        for frame in frames:
            writer.append_data(frame)


# --------------------------------------------------------------------------- cameras


def _slerp(q0: np.ndarray, q1: np.ndarray, t: float) -> np.ndarray:
    if np.dot(q0, q1) < 0:
        q1 = -q1
    dot = float(np.clip(np.dot(q0, q1), -1.0, 1.0))
    if dot > 0.9995:
        q = q0 + t * (q1 - q0)
        return q / np.linalg.norm(q)
    theta = math.acos(dot)
    return (math.sin((1 - t) * theta) * q0 + math.sin(t * theta) * q1) / math.sin(theta)


def interpolate_cameras(
    extrinsics: Tensor, intrinsics: Tensor, frames: int
) -> tuple[Tensor, Tensor]:
    """A camera path through the given cameras, in order.

    Rotations are slerped, camera centres and intrinsics linearly interpolated between neighbours.

    Args:
        extrinsics: ``[V, 4, 4]`` camera-to-world, ``V >= 2``.
        intrinsics: ``[V, 3, 3]`` normalised.
        frames: cameras on the path (the first and last are the first and last input cameras).

    Returns:
        ``[frames, 4, 4]`` and ``[frames, 3, 3]``.
    """
    from datamodules.colmap import qvec_to_rotmat, rotmat_to_qvec

    poses = extrinsics.detach().double().cpu().numpy()
    ks = intrinsics.detach().double().cpu().numpy()
    quats = [rotmat_to_qvec(p[:3, :3]) for p in poses]
    out_e, out_k = [], []
    for s in np.linspace(0.0, len(poses) - 1, frames):
        i = min(int(math.floor(s)), len(poses) - 2)
        t = s - i
        pose = np.eye(4)
        pose[:3, :3] = qvec_to_rotmat(_slerp(quats[i], quats[i + 1], t))
        pose[:3, 3] = (1 - t) * poses[i][:3, 3] + t * poses[i + 1][:3, 3]
        out_e.append(pose)
        out_k.append((1 - t) * ks[i] + t * ks[i + 1])
    dtype = extrinsics.dtype
    return torch.tensor(np.stack(out_e), dtype=dtype), torch.tensor(np.stack(out_k), dtype=dtype)


def orbit_cameras(
    center: Tensor, look_at_depth: float, intrinsics: Tensor, frames: int, radius: float
) -> tuple[Tensor, Tensor]:
    """A small circular orbit around a camera, looking at a point in front of it.

    Args:
        center: ``[4, 4]`` camera-to-world of the orbit's centre camera.
        look_at_depth: distance along its optical axis of the point every camera looks at.
        intrinsics: ``[3, 3]`` normalised (used for every frame).
        frames: cameras on the orbit.
        radius: orbit radius in scene units (in the camera's image plane).

    Returns:
        ``[frames, 4, 4]`` and ``[frames, 3, 3]``.
    """
    base = center.detach().double().cpu()
    target = torch.tensor([0.0, 0.0, look_at_depth], dtype=torch.float64)
    poses = []
    for angle in np.linspace(0.0, 2 * math.pi, frames, endpoint=False):
        position = torch.tensor(
            [radius * math.cos(angle), radius * math.sin(angle), 0.0], dtype=torch.float64
        )
        forward = target - position
        forward = forward / forward.norm()
        right = torch.linalg.cross(torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64), forward)
        right = right / right.norm()
        down = torch.linalg.cross(forward, right)
        local = torch.eye(4, dtype=torch.float64)
        local[:3, 0], local[:3, 1], local[:3, 2], local[:3, 3] = right, down, forward, position
        poses.append(base @ local)
    dtype = center.dtype
    return torch.stack(poses).to(dtype), intrinsics.detach().cpu().expand(frames, 3, 3).to(dtype)


# --------------------------------------------------------------------------- stages


def _pop_model_override(argv: list[str]) -> list[str]:
    """Take ``model=NAME`` out of the command line (Hydra would read it as the training-config
    group ``configs/model``); ``run`` applies it."""
    rest = []
    for arg in argv:
        if arg.startswith("model="):
            _MODEL_OVERRIDE[:] = [arg.split("=", 1)[1]]
        else:
            rest.append(arg)
    return rest


def _pose_free_models() -> list[str]:
    """Pose-free models that load by name (``model=<name>`` with no ``weights=``): weights shipped
    in this checkout first, then released weights (downloaded on first use). Read from the
    pretrained configs: nothing is built."""
    from models import get_pretrained_cfg, list_models

    shipped, released = [], []
    for tag in list_models(pretrained=True):
        cfg = get_pretrained_cfg(tag)
        if not cfg.pose_free:
            continue
        default = get_pretrained_cfg(cfg.architecture) == cfg
        name = cfg.architecture if default else cfg.name
        if cfg.local_dir is not None:
            if (REPO_ROOT / cfg.local_dir).is_dir():
                shipped.append(name)
        else:
            released.append(f"{name} (downloads its weights)")
    return shipped + released


def load_model(cfg: DictConfig) -> tuple[torch.nn.Module, str, list[str]]:
    """Build ``cfg.model`` with its weights; returns the model, a weights description and the
    loader's warnings (one line each, e.g. constructor arguments that differ from the weights')."""
    from models import create_model, is_model, list_models

    name = str(cfg.model)
    if not is_model(name):
        raise InferError(f"model={name}", f"unknown model; valid names: {', '.join(list_models())}")
    weights = cfg.weights
    pretrained: bool | str = True if weights in (None, "", True) else str(weights)
    if isinstance(pretrained, str) and not pretrained.startswith(("hf-hub:", "local-dir:")):
        if not Path(pretrained).expanduser().exists():
            raise InferError(
                pretrained,
                "weights not found (a folder, .safetensors, .ckpt, "
                "local-dir:/path or hf-hub:org/repo)",
            )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = create_model(name, pretrained=pretrained)
    notes = [  # this project's warnings (not third-party libraries' notices)
        " ".join(str(w.message).split())
        for w in caught
        if issubclass(w.category, UserWarning)
        and Path(w.filename).resolve().is_relative_to(REPO_ROOT)
    ]
    if pretrained is True:
        from models.pretrained import default_weights

        described = default_weights(name)
    else:
        described = str(pretrained)
    return model, described, notes


def load_inputs(cfg: DictConfig, model: torch.nn.Module, image_size: int) -> tuple[Any, list[str]]:
    """Load the input views for ``model``; returns the ``ImageSet`` and warnings (one line each).

    Raises:
        DataError, InferError: one line naming the input, with the skipped files when too few
        views remain.
    """
    from datamodules.image_folder import VIDEO_EXTENSIONS, load_images

    source = Path(str(cfg.input)).expanduser()
    pose_free = bool(getattr(model, "pose_free", False))
    min_views = int(getattr(model, "min_views", 1))
    poses = "auto"
    cameras = cfg.cameras
    if str(cameras) == "auto" or (not cameras and not pose_free and _without_poses(source)):
        return _sfm_inputs(cfg, source, min_views, image_size)
    if cameras:
        cameras_path = Path(str(cameras)).expanduser()
        if not cameras_path.exists():
            raise InferError(cameras_path, "cameras file or COLMAP folder not found")
        poses = (
            str(cameras_path) if cameras_path.is_file() else _colmap_as_cameras_json(cameras_path)
        )
    if not pose_free and source.is_file():
        kind = "a video" if source.suffix.lower() in VIDEO_EXTENSIONS else "a single image"
        raise _needs_poses(source, str(cfg.model), f"{kind} has no camera poses")

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            images = load_images(
                source,
                image_shape=(image_size, image_size),
                num_views=int(cfg.views) if cfg.views is not None else None,
                min_views=min_views,
                poses=poses,
            )
        except DataError as error:
            skipped = [
                str(w.message)
                for w in caught
                if issubclass(w.category, UserWarning) and "(skipped)" in str(w.message)
            ]
            if skipped:
                names = ", ".join(Path(m.split(":", 1)[0]).name for m in skipped[:5])
                more = f" and {len(skipped) - 5} more" if len(skipped) > 5 else ""
                raise DataError(f"{error} (skipped unreadable: {names}{more})") from error
            raise
    notes = [
        " ".join(str(w.message).split()) for w in caught if issubclass(w.category, UserWarning)
    ]
    if not pose_free and images.extrinsics is None:
        raise _needs_poses(source, str(cfg.model), "no cameras.json or COLMAP sparse/ model found")
    return images, notes


def _without_poses(source: Path) -> bool:
    """A folder without ``cameras.json`` or a COLMAP model, or a video: poses come from
    structure-from-motion (a single image stays an error: it cannot be posed)."""
    from datamodules.colmap import find_model_dir
    from datamodules.image_folder import VIDEO_EXTENSIONS

    if source.is_file():
        return source.suffix.lower() in VIDEO_EXTENSIONS
    jsons = (source / "cameras.json", source / "images" / "cameras.json")
    return not any(p.is_file() for p in jsons) and find_model_dir(source) is None


def _sfm_inputs(cfg: DictConfig, source: Path, min_views: int, image_size: int):
    """Poses by structure-from-motion (``datamodules.sfm``, settings ``cfg.sfm``), then the
    images loaded with them; the result rides along as ``ImageSet.sfm``."""
    from datamodules.image_folder import load_images
    from datamodules.sfm import SfmSettings, poses_for_input

    options = OmegaConf.to_container(cfg.sfm, resolve=True) if cfg.get("sfm") else {}
    cache = options.pop("cache", True)
    try:
        settings = SfmSettings(**options)
        settings.check()
    except (TypeError, ValueError) as error:
        raise InferError("sfm", " ".join(str(error).split())) from error
    views = int(cfg.views) if cfg.views is not None else None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result, folder, cameras_json = poses_for_input(source, views, settings, cache=cache)
        images = load_images(
            folder, (image_size, image_size), views, min_views, poses=str(cameras_json)
        )
    images.pose_source, images.sfm = "structure-from-motion", result
    notes = [" ".join(str(w.message).split()) for w in caught if w.category is UserWarning]
    return images, notes


def _colmap_as_cameras_json(folder: Path) -> str:
    """The COLMAP model in ``folder`` (``sparse/0``, ``sparse`` or the folder) as a temporary
    ``cameras.json`` (read by the data stack's COLMAP reader); returns its path."""
    from datamodules.image_folder import _colmap_poses

    table = _colmap_poses(folder)
    if table is None:
        raise InferError(folder, "no COLMAP model (cameras, images) found in this folder")
    frames = [
        {
            "file": name,
            "camera_to_world": entry["camera_to_world"].double().tolist(),
            **{k: entry[k] for k in ("fx", "fy", "cx", "cy", "width", "height") if k in entry},
        }
        for name, entry in table.items()
    ]
    handle, path = tempfile.mkstemp(prefix="splatzoo-colmap-", suffix=".json")
    with os.fdopen(handle, "w", encoding="utf-8") as file:
        json.dump({"frames": frames}, file)
    _TEMPORARY_FILES.append(path)
    return path


def _needs_poses(source: Path, name: str, reason: str) -> InferError:
    hint = ", ".join(_pose_free_models()) or "a pose-free model"
    return InferError(
        source,
        f"model {name} needs camera poses ({reason}); add cameras.json or a COLMAP model, "
        f"pass cameras=PATH, or use a pose-free model: model={hint}",
    )


def forward_kwargs(model: torch.nn.Module, cfg: DictConfig) -> dict[str, Any]:
    """The inference knobs set in ``cfg`` (``compression``, ``iterations``,
    ``gaussians_per_pixel``, ``max_gaussians``), checked against what the model's family declares
    (``models.knobs``: name, type, range); a knob the family does not have is refused by name."""
    from models.knobs import inference_knobs

    declared = {knob.name: knob for knob in inference_knobs(model)}
    kwargs = {}
    for key in ("compression", "iterations", "gaussians_per_pixel", "max_gaussians"):
        value = cfg.get(key)
        if value is None:
            continue
        if key not in declared:
            knobs = ", ".join(sorted(declared)) or "none"
            raise InferError(
                f"{key}={value}", f"model {cfg.model} has no {key!r} setting (its knobs: {knobs})"
            )
        try:
            kwargs[key] = declared[key].check(value, model)
        except ValueError as error:
            raise InferError(f"{key}={value}", str(error).split(": ", 1)[-1]) from None
    return kwargs


def _check_count(cfg: DictConfig, key: str) -> None:
    """A count setting must be a positive whole number (``None`` = the default) — ``iterations``
    may be 0."""
    value = cfg.get(key)
    if value is None:
        return
    minimum = 0 if key == "iterations" else 1
    if isinstance(value, bool) or not isinstance(value, (int, str)) or not str(value).isdigit():
        raise InferError(f"{key}={value}", f"must be a whole number >= {minimum}")
    if int(value) < minimum:
        raise InferError(f"{key}={value}", f"must be at least {minimum}")


def _image_size(cfg: DictConfig, model: torch.nn.Module) -> int:
    if cfg.image_size is not None:
        size = int(cfg.image_size)
    else:
        config = getattr(model, "_hub_mixin_config", None) or {}
        size = int(config.get("img_size") or getattr(model, "img_size", 0) or 64)
    if size < 8:
        raise InferError(f"image_size={size}", "must be at least 8 pixels")
    return size


def render_views(
    gaussians,
    extrinsics: Tensor,
    intrinsics: Tensor,
    shape: tuple[int, int],
    backend: str,
    desc: str,
    views_per_call: int = 8,
) -> Tensor:
    """Render every camera, ``views_per_call`` at a time (batched views are several times cheaper
    per view on the torch backend); returns ``[N, 3, H, W]`` on CPU."""
    from models import render

    out = []
    with _progress(total=extrinsics.shape[0], desc=desc, unit="view") as bar:
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


def _pixel_intrinsics(k_norm: Tensor, out_shape: tuple[int, int], original: tuple[int, int]):
    """Normalised intrinsics of the model-size crop → pixels of the original image."""
    from datamodules.transforms import cover_shape, crop_transform
    from models.cameras import intrinsics_to_pixels

    if tuple(original) == tuple(out_shape):
        a = torch.eye(3)
    else:
        a, _, _ = crop_transform(cover_shape(tuple(original), tuple(out_shape)), tuple(out_shape))
    k = torch.linalg.inv(a.double()) @ k_norm.double().cpu()
    return intrinsics_to_pixels(k, tuple(original))


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


# --------------------------------------------------------------------------- main


def run(cfg: DictConfig) -> Path:
    """Run inference as configured; returns the output folder.

    Raises:
        InferError, DataError, PretrainedError: bad input (one line naming the path).
    """
    from models.cameras import intrinsics_to_pixels
    from models.metrics import psnr

    timer = _Timer()
    total_start = time.perf_counter()
    missing = [k for k in ("input", "output") if OmegaConf.is_missing(cfg, k) or not cfg[k]]
    if missing:
        raise InferError("infer.py", "usage: python infer.py input=PATH output=DIR [model=NAME]")
    output = Path(str(cfg.output)).expanduser()
    source = Path(str(cfg.input)).expanduser()
    overwrite = bool(cfg.overwrite)
    if not source.exists():
        raise InferError(source, "input not found")
    inputs = [source] + [
        Path(str(value)).expanduser()
        for value in (cfg.get("cameras"), cfg.get("weights"))
        if value not in (None, "", True, "auto") and ":" not in str(value)[:10]
    ]
    folder = output_folder(output, inputs, overwrite)
    for key in ("views", "orbit_frames", "fps", "image_size", "max_gaussians", "iterations"):
        _check_count(cfg, key)
    device = choose_device(str(cfg.device))
    if cfg.backend not in ("auto", "torch", "gsplat", "cpu"):
        raise InferError(f"backend={cfg.backend}", "must be auto, torch, gsplat or cpu")
    if cfg.backend == "gsplat" and device.type != "cuda":
        raise InferError("backend=gsplat", f"needs a CUDA device (device is {device})")
    if cfg.backend == "cpu" and device.type != "cpu":
        raise InferError("backend=cpu", f"needs device=cpu (device is {device})")
    if cfg.backend == "cpu":
        from models.render_cpu import cpu_rasterizer_error

        if (error := cpu_rasterizer_error()) is not None:
            raise InferError(
                "backend=cpu", f"the compiled CPU rasteriser is not available: {error}"
            )
    torch.manual_seed(int(cfg.seed))

    with timer("load_model"):
        model, weights, model_notes = load_model(cfg)
        model = model.to(device).eval()
    kwargs = forward_kwargs(model, cfg)
    size = _image_size(cfg, model)
    shape = (size, size)
    with timer("load_inputs"):
        images, notes = load_inputs(cfg, model, size)
    notes = model_notes + notes
    for note in notes:
        print(f"warning: {note}", file=sys.stderr)

    pose_free = bool(getattr(model, "pose_free", False))
    context = images.context(default_fov=float(cfg.fov))
    context = {k: v.to(device) for k, v in context.items()}
    # Pose-free models get no poses (they only render the result when the model predicts none).
    input_extrinsics = context.pop("extrinsics", None) if pose_free else None
    views = len(images)
    with timer("inference", device), torch.inference_mode():
        for _ in _progress(range(1), desc="inference", unit="forward"):
            try:
                pred = model(context, **kwargs)
            except ValueError as error:  # the model refuses this input (e.g. its image size)
                raise InferError(f"model={cfg.model}", str(error)) from error
    gaussians = pred.gaussians.detach()
    count = int(gaussians.count()[0])
    if count == 0:
        raise InferError(source, f"model {cfg.model} produced no Gaussians for this input")

    # Cameras of the input views in the scene frame (view 0 = identity).
    intrinsics = context["intrinsics"][0].float()  # [V, 3, 3]
    unknown: list[str] = []
    if not pose_free:
        extrinsics = context["extrinsics"][0].float()
        pose_note = f"input ({images.pose_source})"
        pose_kind = ["input"] * views
    elif pred.extrinsics is not None:
        extrinsics = pred.extrinsics[0].float()
        if pred.intrinsics is not None:
            intrinsics = pred.intrinsics[0].float()
        pose_note = f"predicted by {cfg.model}"
        pose_kind = ["identity"] + ["predicted"] * (views - 1)
    elif input_extrinsics is not None:
        # The model saw no poses; its scene frame is the same normalised frame (view 0 = identity,
        # unit baseline), so the given cameras render it.
        extrinsics = input_extrinsics[0].float()
        pose_note = f"input ({images.pose_source}); pose-free {cfg.model} does not predict cameras"
        pose_kind = ["input"] * views
    else:
        extrinsics = torch.eye(4, device=device).expand(views, 4, 4).clone()
        steps = int(cfg.refine_poses)
        if views > 1 and steps > 0:
            # Place views 1.. by test-time pose refinement (as eval does for pose-free models),
            # each starting from view 0's pose, against its own image with the Gaussians frozen.
            from models.pose_refinement import refine_target_poses

            targets = context["image"][:, 1:].float()  # [1, V-1, 3, H, W]
            if max(targets.shape[-2:]) > 128:  # fit at <= 128 px (intrinsics are normalised)
                factor = 128 / max(targets.shape[-2:])
                small = [max(8, round(n * factor)) for n in targets.shape[-2:]]
                targets = F.interpolate(targets[0], size=small, mode="area")[None]
            with timer("refine_poses", device):
                extrinsics[1:] = refine_target_poses(
                    gaussians,
                    targets,
                    extrinsics[None, 1:],
                    intrinsics[None, 1:],
                    steps=steps,
                    backend=str(cfg.backend),
                )[0]
            pose_note = (
                f"refined: pose-free {cfg.model} predicts no cameras; views 1.. placed by "
                f"test-time pose refinement ({steps} steps from view 0's pose, at "
                f"{targets.shape[-1]}x{targets.shape[-2]} px)"
            )
            pose_kind = ["identity"] + ["refined"] * (views - 1)
        else:
            pose_note = f"unknown (pose-free {cfg.model} does not predict cameras)"
            pose_kind = ["identity"] + ["unknown"] * (views - 1)
            unknown = images.names[1:]
    known = [i for i, kind in enumerate(pose_kind) if kind != "unknown"]
    render_names = [f"{i:02d}_{Path(name).stem}.png" for i, name in enumerate(images.names)]

    with folder as staging:
        with timer("save_ply"):
            gaussians.save_ply(staging / "gaussians.ply")

        with timer("render_inputs", device), torch.inference_mode():
            rendered = render_views(
                gaussians, extrinsics[known], intrinsics[known], shape, cfg.backend, "input views"
            )
        (staging / "renders").mkdir()
        for i, image in zip(known, rendered):
            _save_png(image, staging / "renders" / render_names[i])
        input_psnr = [psnr(r, images.images[i]) for i, r in zip(known, rendered)]
        cardinality = None
        if isinstance(pred.diagnostics.get("routing_map"), Tensor):  # MoE-cardinality models
            cardinality = _save_cardinality(
                pred.diagnostics["routing_map"][0], staging / "cardinality", render_names
            )

        frames = int(cfg.orbit_frames)
        if len(known) >= 2:
            path_e, path_k = interpolate_cameras(
                extrinsics[known].cpu(), intrinsics[known].cpu(), frames
            )
            path_kind = "interpolated between the input cameras"
        else:
            depth = gaussians.means[0, :, 2][gaussians.valid_mask()[0]]
            depth = depth[depth > 0]
            look_at = float(depth.median()) if depth.numel() else 1.0
            path_e, path_k = orbit_cameras(
                extrinsics[0].cpu(), look_at, intrinsics[0].cpu(), frames, radius=0.1 * look_at
            )
            path_kind = "orbit around the first view"
        with timer("render_path", device), torch.inference_mode():
            path = render_views(
                gaussians, path_e.to(device), path_k.to(device), shape, cfg.backend, "camera path"
            )
        (staging / "path").mkdir()
        for i, image in enumerate(path):
            _save_png(image, staging / "path" / f"frame_{i:04d}.png")
        with timer("write_video"):
            _write_video(_to_uint8(path), staging / "path.mp4", int(cfg.fps))

        cameras = {
            "frame": "scene frame of the Gaussians: view 0 is the identity (OpenCV axes, "
            "camera-to-world); posed inputs are scaled to a largest camera distance of 1",
            "poses": pose_note,
            "frames": [
                {
                    "file": images.names[i],
                    "render": f"renders/{render_names[i]}",
                    "pose": pose_kind[i],
                    **_camera_entry(
                        extrinsics[i],
                        _pixel_intrinsics(intrinsics[i], shape, images.original_sizes[i]),
                        images.original_sizes[i],
                    ),
                }
                for i in known
            ],
            "path": [
                {
                    "render": f"path/frame_{j:04d}.png",
                    **_camera_entry(e, intrinsics_to_pixels(k, shape), shape),
                }
                for j, (e, k) in enumerate(zip(path_e, path_k))
            ],
        }
        if unknown:
            cameras["unknown_poses"] = unknown
        (staging / "cameras.json").write_text(json.dumps(cameras, indent=2), encoding="utf-8")
        if getattr(images, "sfm", None) is not None:  # the COLMAP model, in the same scene frame
            images.sfm.export(staging / "sparse", images.names)

        timer.stages["total"] = round(time.perf_counter() - total_start, 4)
        summary = {
            "model": str(cfg.model),
            "family": getattr(model, "family", None),
            "pose_free": pose_free,
            "weights": weights,
            "input": str(source),
            "views": views,
            "view_names": images.names,
            "image_size": [size, size],
            "forward_kwargs": dict(kwargs),
            "gaussians": count,
            "poses": pose_note,
            "camera_path": f"{frames} frames, {path_kind}",
            "input_view_psnr": [round(p, 3) for p in input_psnr],
            "device": str(device),
            "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "render_backend": str(cfg.backend),
            "timings_s": timer.stages,
            "sfm": images.sfm.summary() if getattr(images, "sfm", None) is not None else None,
            "warnings": notes,
        }
        if cardinality is not None:
            summary["cardinality"] = cardinality
        (staging / "summary.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
    print(
        f"{output}: {count} Gaussians from {views} view(s) with {cfg.model} "
        f"in {timer.stages['total']:.1f} s on {device}"
    )
    return output


def run_cli(cfg: DictConfig) -> int:
    """``run`` with bad input reported as one line on stderr; returns the exit status (0 or 2)."""
    if _MODEL_OVERRIDE:
        with open_dict(cfg):
            cfg.model = _MODEL_OVERRIDE[-1]
    try:
        output = run(cfg)
    except (InferError, DataError, PretrainedError, OutputFolderError) as error:
        print(f"error: {' '.join(str(error).split())}", file=sys.stderr)
        return 2
    finally:
        while _TEMPORARY_FILES:
            with contextlib.suppress(OSError):
                os.remove(_TEMPORARY_FILES.pop())
    if cfg.get("view"):  # the viewer on the result (view.py), until Ctrl-C
        from view import serve_cli

        return serve_cli([str(output), f"device={cfg.device}"])
    return 0


def compose(overrides: list[str]) -> DictConfig:
    """The configuration for command-line ``overrides`` (Hydra's compose API, ``model=`` included),
    for running ``run_cli`` from Python."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    model = [a.split("=", 1)[1] for a in overrides if a.startswith("model=")]
    rest = quote_path_arguments([a for a in overrides if not a.startswith("model=")])
    with initialize_config_dir(
        version_base="1.3", config_dir=str(REPO_ROOT / "configs"), job_name="infer"
    ):
        cfg = hydra_compose(config_name="infer", overrides=rest)
    if model:
        with open_dict(cfg):
            cfg.model = model[-1]
    return cfg


@hydra.main(version_base="1.3", config_path="configs", config_name="infer")
def main(cfg: DictConfig) -> None:
    """Hydra entry point: bad input → one line on stderr, exit status 2."""
    status = run_cli(cfg)
    if status:
        sys.exit(status)


def help_text(config: Path = REPO_ROOT / "configs" / "infer.yaml") -> str:
    """``--help``: the usage and every setting with its default and the explanation written
    above it in ``configs/infer.yaml`` (Hydra's own help shows the values without them)."""
    lines = config.read_text(encoding="utf-8").splitlines()
    header = [line[2:] for line in lines if line.startswith("# ")][:4]
    rows, comment = [], []
    for line in lines:
        if line.startswith("hydra:"):
            break
        if line.startswith("#"):
            comment.append(line.lstrip("# ").rstrip())
        elif line and not line.startswith((" ", "-", "defaults")) and ":" in line:
            key, _, value = line.partition(":")
            rows.append((f"{key}={value.strip() or '...'}", " ".join(comment)))
            comment = []
        else:
            comment = []
    width = max(len(key) for key, _ in rows)
    body = [f"  {key.ljust(width)}  {text}".rstrip() for key, text in rows]
    notes = [
        "",
        "??? marks a required setting. Paths may hold any character (quote them for your shell).",
        "Models: python -c 'import models; print(models.list_models(pretrained=True))'",
    ]
    return "\n".join([*header, "", "Settings:", *body, *notes])


if __name__ == "__main__":
    if any(arg in ("-h", "--help") for arg in sys.argv[1:]):
        print(help_text())
        sys.exit(0)
    sys.argv[1:] = quote_path_arguments(_pop_model_override(sys.argv[1:]))
    main()
