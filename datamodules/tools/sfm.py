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
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from datamodules.errors import InputError
from datamodules.readers import colmap_records
from datamodules.readers.image_folder import (
    IMAGE_EXTENSIONS,
    VIDEO_EXTENSIONS,
    load_video,
    natural_key,
)
from datamodules.tools.sfm_cache import (
    cache_key,
    default_cache_dir,
    remove_stale,
    staged_folder,
    store_entry,
)
from datamodules.tools.sfm_result import SfmResult, read_entry, write_entry
from models.core import budget
from models.core.command_line import sigterm_raises
from models.core.output_folder import mark_staging
from models.core.pixels import image_to_uint8

__all__ = [
    "MATCHING",
    "SfmError",
    "SfmSettings",
    "SfmResult",
    "estimate_poses",
    "cache_root",
    "image_files",
    "poses_for_input",
]

MATCHING = ("auto", "exhaustive", "sequential")
_EXHAUSTIVE_MAX = (
    30  # auto: exhaustive matching up to this many images (435 pairs), else sequential
)
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

    def with_pose_free_model(self, model: str) -> SfmError:
        """The same error with the pose-free ``model`` to use named at the end (the caller,
        which knows the models, names one: this package knows none)."""
        if not self.message.endswith("use a pose-free model instead"):
            return self
        return SfmError(f"{self.message}: model={model}", self.registered, self.total)


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
        if self.camera_model not in colmap_records.SUPPORTED_MODELS:
            raise ValueError(
                f"camera_model={self.camera_model!r}: must be one of "
                f"{', '.join(colmap_records.SUPPORTED_MODELS)}"
            )
        if self.fov is not None and not 1.0 <= float(self.fov) <= 179.0:
            raise ValueError(f"fov={self.fov}: must be in [1, 179] degrees")
        for name in ("max_image_size", "max_num_features", "overlap", "num_threads"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name}={getattr(self, name)}: must be >= 1")


# ---------------------------------------------------------------------------------- helpers


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
        with sigterm_raises():
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
    chosen = _check_images(folder, names, sizes, settings)
    key = cache_key(folder, names, settings, version)
    root = cache_root(cache)
    remove_stale(root)
    if root is not None:
        cached = read_entry(root / key, folder)
        if cached is not None:
            if verbose:
                print(
                    f"sfm: reusing the cached model {root / key} "
                    f"({len(cached.registered)}/{len(names)} images registered)",
                    file=sys.stderr,
                )
            return _finish(cached, out_dir, len(names), verbose)
    stage_seconds = _check_budget(folder, sizes, chosen, settings, verbose)
    result = _run_colmap(folder, names, sizes, settings, chosen, key, root, verbose, stage_seconds)
    return _finish(result, out_dir, len(names), verbose)


def _check_images(
    folder: Path, names: list[str], sizes: list[tuple[int, int]], settings: SfmSettings
) -> str:
    """The matching to run (``auto`` decided by the count); ``SfmError`` for fewer than two
    images or ``fov=`` over images of several sizes."""
    chosen = settings.matching
    if chosen == "auto":
        chosen = "exhaustive" if len(names) <= _EXHAUSTIVE_MAX else "sequential"
    if len(names) < 2:
        shown = f" ({names[0]})" if names else ""
        raise SfmError(
            f"{folder}: structure-from-motion needs at least 2 overlapping images, got "
            f"{len(names)}{shown}; registered 0; use a pose-free model instead",
            registered=0,
            total=len(names),
        )
    single = settings.single_camera if settings.single_camera is not None else len(set(sizes)) == 1
    if settings.fov is not None and not single:
        raise SfmError(f"{folder}: fov= needs images of one size (one shared camera)")
    return chosen


def _check_budget(
    folder: Path, sizes: list[tuple[int, int]], chosen: str, settings: SfmSettings, verbose: int
) -> dict[str, float]:
    """Refuse a run over the memory budget (``models.core.budget``); announce the estimate, at
    the machine's speed measured now (``budget.machine_slowdown``, when it is said). Returns
    each stage's estimated seconds (the SfM child says the rest after each stage from them)."""
    arguments = _budget_arguments(sizes, chosen, settings)
    try:
        budget.check(budget.sfm_estimate(*arguments))
    except budget.BudgetError as error:
        raise SfmError(f"{folder}: {error.message}", total=len(sizes)) from None
    if not verbose:
        return budget.sfm_stage_seconds(*arguments)
    slowdown = budget.machine_slowdown(settings.num_threads)
    budget.announce(budget.sfm_estimate(*arguments, slowdown=slowdown), force=True)
    return budget.sfm_stage_seconds(*arguments, slowdown=slowdown)


def _budget_arguments(sizes: list[tuple[int, int]], chosen: str, settings: SfmSettings) -> tuple:
    """``budget.sfm_estimate``'s and ``sfm_stage_seconds``' arguments."""
    largest = max(sizes, key=lambda size: size[0] * size[1])
    return (
        len(sizes), largest, chosen, settings.overlap, settings.max_image_size, settings.num_threads
    )  # fmt: skip


def _run_colmap(
    folder: Path,
    names: list[str],
    sizes: list[tuple[int, int]],
    settings: SfmSettings,
    chosen: str,
    key: str,
    root: Path | None,
    verbose: int,
    stage_seconds: dict[str, float],
) -> SfmResult:
    """COLMAP in a child process, in a work folder below ``root`` (or the temporary folder);
    the finished entry is moved into the cache (or a temporary folder removed at exit).
    ``stage_seconds``: each stage's estimate, for the child's lines."""
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
            # each stage's estimate: the child says the rest after each stage, measured against it
            "stage_seconds": stage_seconds,
        }
        info = _colmap_in_child(spec, work)
        if info is None:
            count = json.loads((work / "error.json").read_text(encoding="utf-8"))["registered"]
            raise SfmError(
                f"{folder}: structure-from-motion registered {count} of {len(names)} images "
                "(they need texture and overlapping views); use a pose-free model instead",
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
        write_entry(entry, result)
        if root is not None and not store_entry(entry, root / key):
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
    return result


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
        with staged_folder(target) as staging:
            for path in result.model_dir.iterdir():
                shutil.copy2(path, staging / path.name)
        result.model_dir = target
    return result


# ---------------------------------------------------------------------------------- inputs


def _video_frames(video: Path, num_views: int, root: Path) -> Path:
    """The ``num_views`` frames ``load_video`` samples, as PNG files in a folder below ``root``
    keyed by the video's bytes (reused when present)."""
    from PIL import Image

    digest = hashlib.sha256(f"{num_views}\0".encode())
    with open(video, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    folder = root / "frames" / f"{video.stem}-{digest.hexdigest()[:16]}-{num_views}"
    if folder.is_dir() and image_files(folder):
        return folder
    frames = load_video(video, num_views=num_views, image_size=None, min_views=1)
    folder.parent.mkdir(parents=True, exist_ok=True)
    with staged_folder(folder) as staging:
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
    source = Path(source).expanduser()
    settings = settings or SfmSettings()
    root = cache_root(cache)
    remove_stale(root)  # before this run's own temporary frames exist
    if root is None:  # frames in a temporary folder removed at exit (or by the next run)
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
            f"overlapping images needed); registered 0; use a pose-free model instead",
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
            with staged_folder(image_folder) as staging:
                result.undistort(staging)
    cameras_json = result.write_cameras_json(entry / "cameras.json", image_folder)
    return result, image_folder, cameras_json
