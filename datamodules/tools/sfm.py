"""Camera poses from a plain set of photos by structure-from-motion (COLMAP through pycolmap).

``estimate_poses(images, out_dir)`` runs SIFT feature extraction, matching (exhaustive for small
sets, sequential for video frames or many ordered images) and COLMAP's incremental mapper on the
CPU, keeps the largest reconstruction and writes it as a COLMAP text model (readable by
``datamodules.readers.colmap.read_model``) to ``out_dir/sparse``. Cameras come back in splatzoo's
conventions (OpenCV camera-to-world, normalised intrinsics); ``SfmResult.scene_frame`` expresses
them in the scene frame of ``models.geometry.cameras.normalize_scene`` (first view the identity, largest
camera distance 1), and ``SfmResult.export`` writes the model itself in that frame, so that its
points line up with Gaussians predicted from the same views.

The default camera is one ``SIMPLE_PINHOLE`` (one focal length, principal point at the centre)
shared by all images of the same size: frames of one video need no undistortion then. Other
COLMAP models (``SIMPLE_RADIAL``, ``OPENCV``, ...) are accepted; ``SfmResult.undistort`` resamples
the images into the pinhole camera with the same focal length (``datamodules.tools.convert``'s
undistortion).

Results are cached under ``~/.cache/splatzoo/sfm/<key>`` (``$SPLATZOO_SFM_CACHE`` or
``$XDG_CACHE_HOME/splatzoo/sfm`` when set), keyed by the images' bytes and names, the settings and
the pycolmap version, so a rerun on the same input reuses the model. Everything is written to a
temporary folder first and renamed into place, so an interrupted or failed run leaves nothing
behind. Fewer than two registered images raise ``SfmError`` (one line).
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from datamodules.errors import InputError
from datamodules.readers import colmap
from datamodules.readers.image_folder import IMAGE_EXTENSIONS, natural_key
from models.geometry.cameras import normalize_scene
from models.geometry.similarity import umeyama
from models.pixels import image_from_uint8, image_to_uint8

__all__ = [
    "MATCHING",
    "SfmError",
    "SfmSettings",
    "SfmResult",
    "estimate_poses",
    "cache_root",
    "default_cache_dir",
    "image_files",
    "poses_for_input",
    "pose_free_hint",
    "pose_errors",
]

MATCHING = ("auto", "exhaustive", "sequential")
_EXHAUSTIVE_MAX = (
    30  # auto: exhaustive matching up to this many images (435 pairs), else sequential
)
_CACHE_VERSION = 1
_REMOVE_AT_EXIT: list[Path] = []  # temporary results (cache=False), removed at exit


@atexit.register
def _cleanup() -> None:  # pragma: no cover - runs at interpreter exit
    while _REMOVE_AT_EXIT:
        shutil.rmtree(_REMOVE_AT_EXIT.pop(), ignore_errors=True)


class SfmError(InputError):
    """Structure-from-motion could not pose the images (one-line message).

    Attributes:
        registered: images in the largest reconstruction (0 when none).
        total: images given.
    """

    def __init__(self, message: str, registered: int = 0, total: int = 0) -> None:
        super().__init__(message)
        self.registered = registered
        self.total = total


@dataclass
class SfmSettings:
    """What the reconstruction depends on (part of the cache key).

    Attributes:
        matching: ``"exhaustive"`` (every pair), ``"sequential"`` (each image with its
            ``overlap`` successors in name order, for video frames) or ``"auto"`` (exhaustive up
            to 30 images, else sequential).
        camera_model: COLMAP camera model of the estimated camera(s).
        single_camera: one camera shared by all images (None: when all images have one size).
        fov: prior horizontal field of view in degrees (None: COLMAP's default, a focal of 1.2x
            the longer image side, or the EXIF focal length when the photos have one).
        refine_focal: refine the focal length in bundle adjustment (False keeps the prior).
        max_image_size: images are downscaled for feature extraction to at most this side.
        max_num_features: SIFT features per image.
        overlap: successors each image is matched with in sequential matching.
        num_threads: CPU threads of every stage (results are repeatable at a fixed count).
        seed: random seed of RANSAC and the mapper.
    """

    matching: str = "auto"
    camera_model: str = "SIMPLE_PINHOLE"
    single_camera: bool | None = None
    fov: float | None = None
    refine_focal: bool = True
    max_image_size: int = 1600
    max_num_features: int = 8192
    overlap: int = 10
    num_threads: int = 2
    seed: int = 0

    def check(self) -> None:
        """Raise ``ValueError`` naming the first invalid setting."""
        if self.matching not in MATCHING:
            raise ValueError(f"matching={self.matching!r}: must be one of {', '.join(MATCHING)}")
        if self.camera_model not in colmap.SUPPORTED_MODELS:
            raise ValueError(
                f"camera_model={self.camera_model!r}: must be one of "
                f"{', '.join(colmap.SUPPORTED_MODELS)}"
            )
        if self.fov is not None and not 1.0 <= float(self.fov) <= 179.0:
            raise ValueError(f"fov={self.fov}: must be in [1, 179] degrees")
        for name in ("max_image_size", "max_num_features", "overlap", "num_threads"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name}={getattr(self, name)}: must be >= 1")


@dataclass
class SfmResult:
    """A finished reconstruction.

    Attributes:
        model_dir: folder with ``cameras.txt``, ``images.txt``, ``points3D.txt`` (COLMAP's world
            frame).
        image_dir: the folder the image names are relative to.
        registered: names of the posed images, in natural name order.
        missing: names of the images that did not register.
        num_points3d: triangulated points.
        mean_reprojection_error: mean over all observations, pixels.
        camera_model: COLMAP model of the cameras.
        focal_px: focal length(s) of the camera(s) in pixels (``fx`` of each camera).
        matching: the matching actually run.
        timings_s: seconds per stage (``features``, ``matching``, ``mapping``, ``total``) of the
            run that made the model (a cached result keeps the original timings).
        cached: the model came from the cache.
        key: the cache key.
    """

    model_dir: Path
    image_dir: Path
    registered: list[str]
    missing: list[str]
    num_points3d: int
    mean_reprojection_error: float
    camera_model: str
    focal_px: list[float]
    matching: str
    timings_s: dict[str, float] = field(default_factory=dict)
    cached: bool = False
    key: str = ""

    # ------------------------------------------------------------------ cameras

    def poses(self) -> dict[str, dict]:
        """Per registered image: ``camera_to_world [4, 4]`` float64 (COLMAP's world frame), pinhole
        ``fx, fy, cx, cy`` in pixels, ``width``, ``height`` and ``distortion`` (OpenCV
        ``[k1, k2, p1, p2, k3, k4, k5, k6]``, zeros for pinhole cameras); the layout of
        ``image_folder.read_cameras_json``."""
        memo = self.__dict__.get("_poses")
        if memo is not None and memo[0] == self.model_dir:
            return dict(memo[1])
        cameras, images, _ = colmap.read_model(self.model_dir, points=False)
        out: dict[str, dict] = {}
        for image in images.values():
            camera = cameras[image.camera_id]
            distortion = colmap.camera_distortion(camera)
            out[image.name] = {**colmap.image_pose(image, camera), "distortion": distortion}
        poses = {name: out[name] for name in self.registered}
        self.__dict__["_poses"] = (self.model_dir, poses)
        return dict(poses)

    @property
    def distorted(self) -> bool:
        """The cameras have non-zero lens distortion (images must be undistorted to use them)."""
        return any(np.abs(p["distortion"]).max() > 0 for p in self.poses().values())

    def scene_frame(self, names: Sequence[str] | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """Cameras of ``names`` (default: all registered) in the scene frame.

        Returns:
            ``extrinsics [V, 4, 4]`` camera-to-world (first view the identity, largest camera
            distance 1), ``intrinsics [V, 3, 3]`` normalised by each image's size and the
            ``scale`` that COLMAP's world distances were divided by.
        """
        from models.geometry.cameras import intrinsics_to_normalized

        poses = self.poses()
        names = list(names) if names is not None else self.registered
        unknown = [n for n in names if n not in poses]
        if unknown:
            raise KeyError(f"not registered: {', '.join(unknown[:5])}")
        c2w = torch.stack([poses[n]["camera_to_world"] for n in names])  # [V, 4, 4]
        extrinsics, _, scale = normalize_scene(c2w)
        intrinsics = torch.stack(
            [
                intrinsics_to_normalized(
                    torch.tensor(
                        [[p["fx"], 0.0, p["cx"]], [0.0, p["fy"], p["cy"]], [0.0, 0.0, 1.0]],
                        dtype=torch.float64,
                    ),
                    (p["height"], p["width"]),
                )
                for p in (poses[n] for n in names)
            ]
        )
        return extrinsics, intrinsics, scale

    def write_cameras_json(self, path: str | Path, image_dir: str | Path | None = None) -> Path:
        """Write the registered cameras as ``cameras.json`` (COLMAP's world frame, pinhole
        intrinsics in pixels); ``image_dir`` (default ``self.image_dir``) is recorded for
        reference only."""
        frames = []
        for name, pose in self.poses().items():
            frames.append(
                {
                    "file": name,
                    "camera_to_world": pose["camera_to_world"].tolist(),
                    **{k: pose[k] for k in ("fx", "fy", "cx", "cy", "width", "height")},
                }
            )
        path = Path(path)
        data = {
            "frames": frames,
            "poses": "structure-from-motion (pycolmap), COLMAP world frame",
            "images": str(image_dir or self.image_dir),
        }
        path.write_text(json.dumps(data, indent=2), encoding="utf-8")
        return path

    def export(
        self, dest: str | Path, names: Sequence[str] | None = None, scene_frame: bool = True
    ) -> Path:
        """Write the model as COLMAP text to ``dest`` (created), moved into the scene frame of
        ``names`` (default: all registered; the frame ``scene_frame(names)`` uses), so that its
        cameras and points agree with Gaussians predicted from those views; ``scene_frame=False``
        keeps COLMAP's own world frame (the capture's frame, where ``infer.py`` writes).
        """
        pycolmap = import_pycolmap()

        if not scene_frame:
            dest = Path(dest)
            dest.mkdir(parents=True, exist_ok=True)
            pycolmap.Reconstruction(str(self.model_dir)).write_text(str(dest))
            return dest

        poses = self.poses()
        names = list(names) if names is not None else self.registered
        c2w = torch.stack([poses[n]["camera_to_world"] for n in names])  # [V, 4, 4]
        _, _, scale = normalize_scene(c2w)
        w2c = torch.linalg.inv(c2w[0]).numpy()  # [4, 4]
        s = 1.0 / float(scale)
        rotation = pycolmap.Rotation3d(w2c[:3, :3])
        transform = pycolmap.Sim3d(s, rotation, (w2c[:3, 3] * s).reshape(3, 1))
        reconstruction = pycolmap.Reconstruction(str(self.model_dir))
        reconstruction.transform(transform)
        dest = Path(dest)
        dest.mkdir(parents=True, exist_ok=True)
        reconstruction.write_text(str(dest))
        return dest

    def undistort(self, dest: str | Path) -> Path:
        """Write the registered images, resampled into the pinhole part of their cameras, to
        ``dest`` (PNG, same names with ``.png``); a distortion-free camera's image is copied.

        Returns:
            ``dest``.
        """
        from PIL import Image

        from datamodules.readers.undistort import undistort_image

        dest = Path(dest)
        dest.mkdir(parents=True, exist_ok=True)
        for name, pose in self.poses().items():
            source = self.image_dir / name
            if np.abs(pose["distortion"]).max() == 0:
                shutil.copy2(source, dest / name)
                continue
            with Image.open(source) as image:
                array = image_from_uint8(image.convert("RGB"))
            k = torch.tensor(
                [
                    [pose["fx"] / pose["width"], 0.0, pose["cx"] / pose["width"]],
                    [0.0, pose["fy"] / pose["height"], pose["cy"] / pose["height"]],
                    [0.0, 0.0, 1.0],
                ],
                dtype=torch.float64,
            )
            out = undistort_image(array, k, pose["distortion"])
            Image.fromarray(image_to_uint8(out)).save(dest / name)
        return dest

    def summary(self) -> dict:
        """A JSON-ready summary (for ``summary.json`` and reports)."""
        return {
            "registered": len(self.registered),
            "images": len(self.registered) + len(self.missing),
            "missing": list(self.missing),
            "mean_reprojection_error_px": round(self.mean_reprojection_error, 4),
            "points3d": self.num_points3d,
            "camera_model": self.camera_model,
            "focal_px": [round(f, 2) for f in self.focal_px],
            "matching": self.matching,
            "cached": self.cached,
            "timings_s": dict(self.timings_s),
        }


# ---------------------------------------------------------------------------------- helpers


def default_cache_dir() -> Path:
    """``$SPLATZOO_SFM_CACHE``, else ``$XDG_CACHE_HOME/splatzoo/sfm``, else
    ``~/.cache/splatzoo/sfm``."""
    if os.environ.get("SPLATZOO_SFM_CACHE"):
        return Path(os.environ["SPLATZOO_SFM_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "splatzoo" / "sfm"


def image_files(folder: str | Path) -> list[Path]:
    """Image files directly in ``folder`` (or its ``images/`` subfolder when it has none), in
    natural name order; hidden files skipped."""
    folder = Path(folder)
    files = [
        p
        for p in folder.iterdir()
        if p.is_file() and not p.name.startswith(".") and p.suffix.lower() in IMAGE_EXTENSIONS
    ]
    if not files and (folder / "images").is_dir():
        return image_files(folder / "images")
    return sorted(files, key=lambda p: natural_key(p.name))


def _resolve_inputs(images: str | Path | Sequence[str | Path]) -> tuple[Path, list[str]]:
    """The common image folder and the image names relative to it."""
    if isinstance(images, (str, os.PathLike)):
        folder = Path(images).expanduser()
        if not folder.is_dir():
            raise SfmError(f"{folder}: not a folder of images")
        files = image_files(folder)
    else:
        files = [Path(p).expanduser() for p in images]
        for path in files:
            if not path.is_file():
                raise SfmError(f"{path}: image not found")
    if not files:
        raise SfmError(f"{images}: no images found ({', '.join(IMAGE_EXTENSIONS)})")
    folder = files[0].parent
    if any(p.parent.resolve() != folder.resolve() for p in files):
        raise SfmError(f"{files[0].parent}: the images must lie in one folder")
    names = [p.name for p in files]
    if len(set(names)) != len(names):
        raise SfmError(f"{folder}: duplicate image names")
    return folder, names


def _cache_key(folder: Path, names: list[str], settings: SfmSettings, version: str) -> str:
    digest = hashlib.sha256()
    meta = {"v": _CACHE_VERSION, "pycolmap": version, "settings": asdict(settings)}
    digest.update(json.dumps(meta, sort_keys=True).encode())
    for name in names:
        digest.update(name.encode() + b"\0")
        with open(folder / name, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        digest.update(b"\1")
    return digest.hexdigest()[:24]


def _readable_images(folder: Path, names: list[str]) -> tuple[list[str], list[tuple[int, int]]]:
    """The names that decode (others skipped with the image loader's warning) and their sizes."""
    from PIL import Image

    kept, sizes = [], []
    for name in names:
        try:
            with Image.open(folder / name) as image:
                image.load()  # a truncated or corrupt file fails here, not inside COLMAP
                sizes.append(image.size)
            kept.append(name)
        except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as error:
            warnings.warn(
                f"{folder / name}: not a readable image ({error}) (skipped)", stacklevel=3
            )
    return kept, sizes


def cache_root(cache: bool | str | Path) -> Path | None:
    """The cache folder, created, or ``None`` (``cache=False``, or a folder that cannot be
    written: then a warning, and the run goes on without the cache)."""
    if cache is False:
        return None
    root = default_cache_dir() if cache is True else Path(cache).expanduser()
    try:
        root.mkdir(parents=True, exist_ok=True)
        if not os.access(root, os.W_OK | os.X_OK):
            raise PermissionError("not writable")
    except OSError as error:
        reason = getattr(error, "strerror", None) or str(error)
        warnings.warn(
            f"{root}: the structure-from-motion cache cannot be written ({reason}); running "
            "without it (set SPLATZOO_SFM_CACHE to a writable folder)",
            stacklevel=3,
        )
        return None
    return root


_CLEANED_TEMP: list[bool] = []  # the temporary folder's stale work was removed in this process


def _remove_stale(root: Path | None) -> None:
    """Work folders of killed runs (in the cache and the temporary folder). The temporary folder
    once per process: later, what is there of this process's marked folders is in use (a
    video's frames when the cache is off)."""
    from models.output_folder import remove_stale_folders

    if not _CLEANED_TEMP:
        temp = Path(tempfile.gettempdir())
        remove_stale_folders(temp, (".sfm-*", "splatzoo-sfm-frames-*", "splatzoo-sfm-*"))
        _CLEANED_TEMP.append(True)
    if root is not None:
        remove_stale_folders(root, (".sfm-*",))
        remove_stale_folders(root / "frames", (".*.tmp-*",))


def import_pycolmap():
    """``import pycolmap`` keeping Python's SIGTERM handling: pycolmap installs glog's failure
    handler for SIGTERM on import (a C++ stack dump, sometimes a hang), which is put back here."""
    import signal

    previous = signal.getsignal(signal.SIGTERM)
    import pycolmap

    if previous is not None:
        signal.signal(signal.SIGTERM, previous)
    return pycolmap


def _pycolmap_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("pycolmap")
    except PackageNotFoundError:
        raise SfmError("pycolmap is not installed (pip install pycolmap)") from None


def _work_went_away(spec: dict, work: Path) -> SfmError:
    return SfmError(
        f"{spec['folder']}: structure-from-motion failed (the folder it works in, "
        f"{work.parent}, went away during the run); set SPLATZOO_SFM_CACHE to a folder that stays"
    )


def _colmap_in_child(spec: dict, work: Path) -> dict | None:
    """Run ``sfm_worker.py`` on ``spec`` and wait; ``None`` when fewer than two images
    registered. Ctrl-C or SIGTERM kill the child at once (then re-raised)."""
    import subprocess

    from models.output_folder import terminate_as_exit

    spec_path = work / "spec.json"
    try:
        spec_path.write_text(json.dumps(spec), encoding="utf-8")
    except OSError:
        raise _work_went_away(spec, work) from None
    worker = Path(__file__).with_name("sfm_worker.py")
    process = subprocess.Popen(
        [sys.executable, str(worker), str(spec_path)], start_new_session=True
    )
    try:
        with terminate_as_exit():
            code = process.wait()
    except BaseException:
        process.kill()  # SIGKILL: no native handler runs, nothing hangs
        process.wait()
        raise
    if not work.is_dir() and code != 0 or not (work / "entry").is_dir() and code == 0:
        raise _work_went_away(spec, work)
    if code == 3:  # sfm_worker.EXIT_TOO_FEW
        return None
    if code == 4:  # sfm_worker.EXIT_FAILED: its one line
        message = json.loads((work / "failure.json").read_text(encoding="utf-8"))["message"]
        if not Path(spec["folder"]).is_dir():
            message = "the images' folder went away during the run"
        raise SfmError(f"{spec['folder']}: structure-from-motion failed ({message})")
    if code != 0:
        raise SfmError(f"{spec['folder']}: structure-from-motion failed (pycolmap exit {code})")
    return json.loads((work / "entry" / "worker.json").read_text(encoding="utf-8"))


def pose_free_hint() -> str:
    """The first pose-free model that loads by name (shipped weights first), for error messages."""
    try:
        from models.registry import pose_free_models

        names = [name.split(" ")[0] for name in pose_free_models()]
    except Exception:  # the hint must never turn into a different error
        names = []
    return names[0] if names else "zipsplat_tiny"


def _write_entry(entry: Path, result: SfmResult) -> None:
    data = asdict(result)
    data["model_dir"] = "sparse"
    data["image_dir"] = str(result.image_dir)
    data.pop("cached")
    (entry / "result.json").write_text(json.dumps(data, indent=2), encoding="utf-8")


def _read_entry(entry: Path, image_dir: Path) -> SfmResult | None:
    try:
        data = json.loads((entry / "result.json").read_text(encoding="utf-8"))
        data["model_dir"] = entry / "sparse"
        data["image_dir"] = image_dir
        result = SfmResult(**data, cached=True)
        _, images, _ = colmap.read_model(result.model_dir, points=False)  # a corrupt entry: redo
    except (OSError, ValueError, TypeError, colmap.ColmapError):
        return None
    if not set(result.registered) <= {image.name for image in images.values()}:
        return None
    return result


# ---------------------------------------------------------------------------------- main


def estimate_poses(
    images: str | Path | Sequence[str | Path],
    out_dir: str | Path | None = None,
    matching: str = "auto",
    settings: SfmSettings | None = None,
    cache: bool | str | Path = True,
    verbose: int = 1,
    **overrides,
) -> SfmResult:
    """Estimate camera poses of photos by structure-from-motion (pycolmap, CPU).

    Args:
        images: a folder of images (or a scene folder with ``images/``) or a list of image files
            in one folder. Their order (natural name order for a folder) is the sequence order
            for sequential matching and the order of ``SfmResult.registered``.
        out_dir: when given, the model is also written to ``out_dir/sparse`` (COLMAP's world
            frame, text), replacing an older one there.
        matching: ``"auto"``, ``"exhaustive"`` or ``"sequential"`` (see ``SfmSettings``).
        settings: all settings (``matching`` and ``overrides`` are applied on top).
        cache: True (the default cache folder), a folder, or False (recompute; the model then
            lives in a temporary folder removed at exit unless ``out_dir`` is given).
        verbose: 0 silent, 1 one line per stage and a mapping progress bar, 2 COLMAP's log too.
        **overrides: ``SfmSettings`` fields, e.g. ``camera_model="SIMPLE_RADIAL"``, ``fov=70``.

    Returns:
        The ``SfmResult`` (``model_dir`` is ``out_dir/sparse`` when ``out_dir`` is given, else the
        cached copy).

    Raises:
        SfmError: no images, unreadable images, or fewer than two images registered (one line
            with the counts and a pose-free model to use instead).
        ValueError: an invalid setting (named).
    """
    version = _pycolmap_version()
    settings = SfmSettings(**{**asdict(settings or SfmSettings()), **overrides})
    settings.matching = matching if matching != "auto" else settings.matching
    settings.check()
    folder, names = _resolve_inputs(images)
    names, sizes = _readable_images(folder, names)
    chosen = settings.matching
    if chosen == "auto":
        chosen = "exhaustive" if len(names) <= _EXHAUSTIVE_MAX else "sequential"
    if len(names) < 2:
        shown = f" ({names[0]})" if names else ""
        raise SfmError(
            f"{folder}: structure-from-motion needs at least 2 overlapping images, got "
            f"{len(names)}{shown}; registered 0; use a pose-free model instead: "
            f"model={pose_free_hint()}",
            registered=0,
            total=len(names),
        )
    single = settings.single_camera if settings.single_camera is not None else len(set(sizes)) == 1
    if settings.fov is not None and not single:
        raise SfmError(f"{folder}: fov= needs images of one size (one shared camera)")

    key = _cache_key(folder, names, settings, version)
    root = cache_root(cache)
    _remove_stale(root)
    if root is not None:
        cached = _read_entry(root / key, folder)
        if cached is not None:
            if verbose:
                print(
                    f"sfm: reusing the cached model {root / key} "
                    f"({len(cached.registered)}/{len(names)} images registered)",
                    file=sys.stderr,
                )
            return _finish(cached, out_dir, len(names), verbose)

    from models import budget
    from models.output_folder import mark_staging

    largest = max(sizes, key=lambda size: size[0] * size[1])
    estimate = budget.sfm_estimate(
        len(names), largest, chosen, settings.overlap, settings.max_image_size, settings.num_threads
    )
    try:
        budget.check(estimate)
    except budget.BudgetError as error:
        raise SfmError(f"{folder}: {error.message}", total=len(names)) from None
    if verbose:
        budget.announce(estimate, force=True)
    start = time.perf_counter()
    parent = root if root is not None else Path(tempfile.gettempdir())
    work = Path(tempfile.mkdtemp(prefix=f".sfm-{key}-", dir=parent))
    mark_staging(work)
    try:
        spec = {
            "folder": str(folder),
            "names": names,
            "sizes": sizes,
            "work": str(work),
            "settings": asdict(settings),
            "matching": chosen,
            "verbose": int(verbose),
        }
        info = _colmap_in_child(spec, work)
        if info is None:
            count = json.loads((work / "error.json").read_text(encoding="utf-8"))["registered"]
            raise SfmError(
                f"{folder}: structure-from-motion registered {count} of {len(names)} images "
                "(they need texture and overlapping views); use a pose-free model instead: "
                f"model={pose_free_hint()}",
                registered=count,
                total=len(names),
            )
        entry = work / "entry"
        (entry / "worker.json").unlink()
        posed = set(info["posed"])
        result = SfmResult(
            model_dir=entry / "sparse",
            image_dir=folder,
            registered=[n for n in names if n in posed],
            missing=[n for n in names if n not in posed],
            num_points3d=info["num_points3d"],
            mean_reprojection_error=info["mean_reprojection_error"],
            camera_model=settings.camera_model,
            focal_px=info["focal_px"],
            matching=chosen,
            timings_s={**info["timings_s"], "total": round(time.perf_counter() - start, 3)},
            key=key,
        )
        _write_entry(entry, result)
        if root is not None and not _store_entry(entry, root / key):
            root = None  # the cache went away during the run: its one warning, then no cache
        if root is not None:
            result.model_dir = root / key / "sparse"
        else:
            keep = Path(tempfile.mkdtemp(prefix="splatzoo-sfm-"))
            mark_staging(keep)
            shutil.move(str(entry), keep / "entry")
            result.model_dir = keep / "entry" / "sparse"
            _REMOVE_AT_EXIT.append(keep)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return _finish(result, out_dir, len(names), verbose)


def _store_entry(entry: Path, final: Path) -> bool:
    """Move a finished entry into the cache; ``False``, with a warning, when the cache cannot
    take it any more (its folder was removed or made read-only during the run)."""
    try:
        if final.exists():  # another process finished the same input (or a corrupt entry)
            shutil.rmtree(final, ignore_errors=True)
        entry.rename(final)
    except OSError as error:
        reason = getattr(error, "strerror", None) or str(error)
        warnings.warn(
            f"{final.parent}: the structure-from-motion cache cannot be written ({reason}); "
            "running without it (set SPLATZOO_SFM_CACHE to a writable folder)",
            stacklevel=4,
        )
        return False
    return True


@contextlib.contextmanager
def _staged_folder(target: Path) -> Iterator[Path]:
    """A staging folder beside ``target`` (``.<name>.tmp-*``) that replaces ``target`` when the
    block succeeds; removed, and ``target`` left as it was, when the block fails."""
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        yield staging
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def _finish(result: SfmResult, out_dir: str | Path | None, total: int, verbose: int) -> SfmResult:
    """Warn about unregistered images, copy the model to ``out_dir/sparse``."""
    if result.missing:
        shown = ", ".join(result.missing[:10])
        more = f" and {len(result.missing) - 10} more" if len(result.missing) > 10 else ""
        warnings.warn(
            f"{result.image_dir}: {len(result.missing)} of {total} images did not register in "
            f"structure-from-motion and are left out: {shown}{more}",
            stacklevel=3,
        )
    if verbose:
        print(
            f"sfm: {len(result.registered)}/{total} images registered, "
            f"{result.num_points3d} points, mean reprojection error "
            f"{result.mean_reprojection_error:.2f} px",
            file=sys.stderr,
        )
    if out_dir is not None:
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        target = out_dir / "sparse"
        with _staged_folder(target) as staging:
            for path in result.model_dir.iterdir():
                shutil.copy2(path, staging / path.name)
        result.model_dir = target
    return result


# ---------------------------------------------------------------------------------- inputs


def _video_frames(video: Path, num_views: int, root: Path) -> Path:
    """The ``num_views`` frames ``load_video`` samples, as PNG files in a folder below ``root``
    keyed by the video's bytes (reused when present)."""
    from PIL import Image

    from datamodules.readers.image_folder import load_video

    digest = hashlib.sha256(f"{num_views}\0".encode())
    with open(video, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    folder = root / "frames" / f"{video.stem}-{digest.hexdigest()[:16]}-{num_views}"
    if folder.is_dir() and image_files(folder):
        return folder
    frames = load_video(video, num_views=num_views, image_size=None, min_views=1)
    folder.parent.mkdir(parents=True, exist_ok=True)
    with _staged_folder(folder) as staging:
        for name, image in zip(frames.names, frames.images):
            Image.fromarray(image_to_uint8(image)).save(staging / f"{name}.png")
    return folder


def poses_for_input(
    source: str | Path,
    num_views: int | None = None,
    settings: SfmSettings | None = None,
    cache: bool | str | Path = True,
    verbose: int = 1,
) -> tuple[SfmResult, Path, Path]:
    """Structure-from-motion for ``infer.py``-style input, ready for ``load_images``.

    Args:
        source: a folder of images (every image in it is used: more views pose better) or a
            video (the ``num_views`` frames, default 8, that ``load_video`` samples).
        num_views: frames sampled from a video.
        settings: ``SfmSettings``.
        cache: as in ``estimate_poses`` (video frames are cached there too).
        verbose: as in ``estimate_poses``.

    Returns:
        ``(result, image_folder, cameras_json)``: load ``image_folder`` with
        ``poses=cameras_json`` (COLMAP's world frame; ``ImageSet.context`` normalises it).
        ``image_folder`` holds undistorted copies when the cameras have lens distortion.

    Raises:
        SfmError: as ``estimate_poses``; a single image (one line).
    """
    from datamodules.readers.image_folder import VIDEO_EXTENSIONS

    source = Path(source).expanduser()
    settings = settings or SfmSettings()
    root = cache_root(cache)
    _remove_stale(root)  # before this run's own temporary frames exist
    if root is None:  # frames in a temporary folder removed at exit (or by the next run)
        from models.output_folder import mark_staging

        cache = False
        root = Path(tempfile.mkdtemp(prefix="splatzoo-sfm-frames-"))
        mark_staging(root)
        _REMOVE_AT_EXIT.append(root)
    if source.is_file() and source.suffix.lower() in VIDEO_EXTENSIONS:
        folder = _video_frames(source, int(num_views or 8), root)
        if settings.matching == "auto":
            settings = SfmSettings(**{**asdict(settings), "matching": "sequential"})
    elif source.is_file():
        raise SfmError(
            f"{source}: a single image cannot be posed by structure-from-motion (at least 2 "
            f"overlapping images needed); registered 0; use a pose-free model instead: "
            f"model={pose_free_hint()}",
            total=1,
        )
    else:
        folder = source
    try:
        result = estimate_poses(folder, settings=settings, cache=cache, verbose=verbose)
    except SfmError as error:
        if folder == source:
            raise
        # Name the video, not the frames folder made from it (and the cache setting it is in).
        message = str(error).replace(f"{folder}: ", f"{source}: ", 1)
        if "went away" in message:
            where = "a temporary folder" if cache is False else f"the SfM cache {root}"
            message = (
                f"{source}: structure-from-motion failed (the frames taken from it, in {where}, "
                "went away during the run); set SPLATZOO_SFM_CACHE to a folder that stays"
            )
        raise SfmError(message, error.registered, error.total) from None
    entry = result.model_dir.parent
    image_folder = result.image_dir
    if result.distorted:
        image_folder = entry / "undistorted"
        if not image_folder.is_dir():
            with _staged_folder(image_folder) as staging:
                result.undistort(staging)
    cameras_json = result.write_cameras_json(entry / "cameras.json", image_folder)
    return result, image_folder, cameras_json


# ---------------------------------------------------------------------------------- evaluation


def _angle(rotation: np.ndarray) -> float:
    """Rotation angle of ``[3, 3]`` in degrees."""
    return float(np.degrees(np.arccos(np.clip((np.trace(rotation) - 1) / 2, -1.0, 1.0))))


def pose_errors(estimated: dict[str, Tensor], reference: dict[str, Tensor]) -> dict[str, float]:
    """Errors of estimated camera-to-world poses against reference ones (shared names).

    The estimate is aligned to the reference by the least-squares similarity (``models.geometry.similarity.umeyama``) that
    maps its camera centres, and a point one scene extent (the largest camera distance) ahead of
    each camera on its optical axis, onto the reference's: centres alone leave the rotation about
    a short, nearly straight camera path ill-determined, which would show up as rotation error.
    Rotation errors are the angles between aligned and reference orientations, centre errors
    distances divided by the reference's largest camera distance (the scene frame's unit).
    ``relative_rotation_*`` compares every pair's relative rotation and needs no alignment.

    Args:
        estimated: name → ``[4, 4]`` camera-to-world.
        reference: name → ``[4, 4]`` camera-to-world.

    Returns:
        ``views``, ``rotation_median_deg``, ``rotation_max_deg``, ``center_median``,
        ``center_max``, ``relative_rotation_median_deg``, ``relative_rotation_max_deg``, ``scale``.
    """
    names = [n for n in reference if n in estimated]
    if len(names) < 3:
        raise ValueError(f"need at least 3 shared views to align, got {len(names)}")
    est = np.stack([np.asarray(estimated[n], np.float64) for n in names])  # [V, 4, 4]
    ref = np.stack([np.asarray(reference[n], np.float64) for n in names])

    def extent_of(poses: np.ndarray) -> float:
        return float(np.linalg.norm(poses[:, None, :3, 3] - poses[None, :, :3, 3], axis=-1).max())

    extent, extent_est = extent_of(ref), extent_of(est)
    ahead = [
        np.concatenate([p[:, :3, 3], p[:, :3, 3] + d * p[:, :3, 2]])
        for p, d in ((est, extent_est), (ref, extent))
    ]  # [2V, 3] each
    fit = umeyama(torch.from_numpy(ahead[0]), torch.from_numpy(ahead[1]))
    scale, rotation = float(fit.scale), fit.rotation.numpy()
    aligned = fit.points(torch.from_numpy(est[:, :3, 3])).numpy()  # [V, 3]
    centers = np.linalg.norm(aligned - ref[:, :3, 3], axis=-1) / extent
    rotations = np.array([_angle((rotation @ e[:3, :3]).T @ r[:3, :3]) for e, r in zip(est, ref)])
    relative = np.array(
        [
            _angle((est[i, :3, :3].T @ est[j, :3, :3]).T @ (ref[i, :3, :3].T @ ref[j, :3, :3]))
            for i in range(len(names))
            for j in range(i + 1, len(names))
        ]
    )
    return {
        "views": len(names),
        "rotation_median_deg": float(np.median(rotations)),
        "rotation_max_deg": float(rotations.max()),
        "center_median": float(np.median(centers)),
        "center_max": float(centers.max()),
        "relative_rotation_median_deg": float(np.median(relative)),
        "relative_rotation_max_deg": float(relative.max()),
        "scale": scale,
    }
