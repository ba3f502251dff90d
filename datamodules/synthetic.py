"""Synthetic scene generator writing the chunk format (so every loader path is the real one).

Usage::

    python -m datamodules.synthetic out=DIR scenes=N resolution=R views=V seed=S \\
        [kind=room|object] [workers=W] [test_fraction=0.1] [supersample=2] [chunk_mb=2] \\
        [overwrite=true] [quiet=true]

Settings are ``key=value``, checked as every command's (:mod:`models.core.command_line`); the form
the project's design writes, ``--out DIR --scenes N --resolution R --seed S`` (any setting as
``--name VALUE``, ``-`` for ``_``; ``--overwrite``, ``--quiet``), is read the same way.

Scenes are ray-cast analytically with NumPy (all pixels of all views at once), never with the
Gaussian renderer:

- ``room``: a box room (floor, walls, ceiling) holding 3-8 random primitives (spheres, boxes,
  cylinders), lit by a point light under the ceiling with shadows; the camera walks like RE10K
  footage (forward, sideways or diagonal, with a gentle bend, small yaw/pitch/roll drift). The walk
  speed is 0.9-1.6 % of the distance to the facing wall per frame, so a context gap of 8-20 frames
  overlaps strongly and has a baseline of roughly 7-32 % of the scene depth.
- ``object``: primitives on a ground plane under a sky dome, lit by the sun with shadows; the camera
  orbits them at 2.3-3.7 degrees per frame.

Depth range: a scene is resampled (deterministically) until, for any two frames 6-20 apart
(``GUARANTEED_GAPS``), every GT depth divided by their distance lies in ``SCENE_DEPTH_RANGE`` =
[0.25, 50]: after normalisation to the scene frame (unit context baseline) GT depth is inside the
near/far planes of ``configs/data/synthetic.yaml`` for the gaps it samples.

Surfaces carry procedural solid textures (checker, stripes, smooth value noise summed over several
frequencies) with Lambertian shading. Fields of view are 50-90 degrees, square pixels, principal
point within 2 % of the centre. Anti-aliasing is adaptive: pixels on silhouettes or colour edges get
``supersample`` squared rays; depth is the exact z-depth of the pixel-centre ray.

Output (``DIR``): ``train/`` and ``test/`` chunk splits (see ``datamodules.readers.chunks``; every scene
stores ``depths``, 16-bit PNG z-depth with ``depth_scale``), ``evaluation_index.json`` for the test
split (2 context views ``0.4-0.7 x (V - 1)`` frames apart, 3 targets between them, like the RE10K
index) and ``metadata.json`` with the settings. Scene ``i`` of a split is generated from
``SeedSequence([seed, split_code, i])`` (train 0, test 1), so output is deterministic for a seed,
independent of the worker count, and train and test scenes never share a seed. The folder is
written under a temporary name and renamed when complete.
"""

from __future__ import annotations

import io
import json
import logging
import multiprocessing
import multiprocessing.pool
import os
import signal
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from datamodules.errors import InputError
from datamodules.readers.chunk_writer import ChunkWriter, encode_bytes
from datamodules.readers.chunks import encode_depths
from datamodules.synthetic_render import render_scene
from datamodules.synthetic_scenes import SceneSpec, sample_scene
from models.core import budget
from models.core.command_line import (
    MISSING,
    SettingError,
    flag_arguments,
    parse_key_values,
    run_key_value_command,
    setting,
    stopped_cleanly,
)
from models.core.output_folder import OutputFolder, OutputFolderError

__all__ = [
    "SyntheticSettings",
    "SceneSpec",
    "sample_scene",
    "render_scene",
    "generate_scene",
    "depth_fits",
    "GUARANTEED_GAPS",
    "SCENE_DEPTH_RANGE",
    "generate_dataset",
    "ensure_synthetic",
    "is_complete",
    "main",
]

log = logging.getLogger(__name__)

SPLIT_CODES = {"train": 0, "test": 1}
FORMAT_VERSION = 1
# For any two frames 6-20 apart used as context views, GT depth in scene-frame units (divided by
# their distance) lies in SCENE_DEPTH_RANGE: the synthetic data config uses it as near/far.
GUARANTEED_GAPS = (6, 20)
SCENE_DEPTH_RANGE = (0.25, 50.0)
MAX_ATTEMPTS = 50


@dataclass
class SyntheticSettings:
    """What a synthetic dataset was generated with (stored in ``metadata.json``)."""

    scenes: int = 1000
    resolution: int = 64
    views: int = 24
    seed: int = 0
    kind: str = "room"
    test_fraction: float = 0.1
    supersample: int = 2
    version: int = FORMAT_VERSION

    def split_sizes(self) -> dict[str, int]:
        """Scenes per split."""
        test = 0 if self.test_fraction <= 0 else max(1, round(self.scenes * self.test_fraction))
        return {"train": self.scenes - test, "test": test}

    def validate(self) -> None:
        """Raise ``InputError`` for settings that cannot be generated."""
        if self.kind not in ("room", "object"):
            raise InputError(f"kind must be 'room' or 'object', got {self.kind!r}")
        if self.resolution < 8 or self.views < 2 or self.supersample < 1:
            raise InputError("need resolution >= 8, views >= 2, supersample >= 1")
        if not 0 <= self.test_fraction < 1:
            raise InputError(f"test_fraction must be in [0, 1), got {self.test_fraction}")
        if self.split_sizes()["train"] < 1:
            raise InputError(f"{self.scenes} scenes leave no training scene")


# ----------------------------------------------------------------------------- dataset


def scene_key(split: str, index: int) -> str:
    """Key of scene ``index`` of a split."""
    return f"syn_{split}_{index:06d}"


def depth_fits(
    extrinsics: np.ndarray,
    depth: np.ndarray,
    gaps: tuple[int, int] = GUARANTEED_GAPS,
    depth_range: tuple[float, float] = SCENE_DEPTH_RANGE,
) -> bool:
    """Whether every pixel's depth, divided by the distance between any two frames ``gaps``
    apart, lies in ``depth_range`` (so the scene-frame depth of any such context pair does).

    Args:
        extrinsics: ``[V, 4, 4]`` camera-to-world.
        depth: ``[V, H, W]`` z-depth.
        gaps: ``(min, max)`` frame gap; the minimum is lowered to ``V - 1`` for short scenes.
        depth_range: ``(near, far)`` in scene-frame units.
    """
    centers = extrinsics[:, :3, 3]
    views = len(centers)
    distances = np.linalg.norm(centers[:, None] - centers[None], axis=-1)  # [V, V]
    gap = np.abs(np.arange(views)[:, None] - np.arange(views)[None])
    low = min(gaps[0], views - 1)
    shortest = distances[(gap >= low) & (gap <= gaps[1])].min()
    longest = distances[(gap >= 1) & (gap <= gaps[1])].max()
    if shortest <= 0:
        return False
    return bool(
        depth.min() / longest >= depth_range[0] and depth.max() / shortest <= depth_range[1]
    )


def generate_scene(split: str, index: int, settings: SyntheticSettings) -> dict:
    """Generate one scene as a chunk-format dict of NumPy arrays and bytes.

    Returns:
        ``key, url, timestamps [V] int64, cameras [V, 18] float32, images (JPEG bytes),
        depths (16-bit PNG bytes), depth_scale``.
    """
    entropy = [settings.seed, SPLIT_CODES[split], index]
    for attempt in range(MAX_ATTEMPTS):  # resample (deterministically) until depths fit
        spec = sample_scene(entropy + ([attempt] if attempt else []), settings.kind, settings.views)
        images, depth = render_scene(spec, settings.resolution, settings.supersample)
        if depth_fits(spec.extrinsics, depth):
            break
    encoded = []
    for image in images:
        buffer = io.BytesIO()
        Image.fromarray(image).save(buffer, format="JPEG", quality=95, subsampling=0)
        encoded.append(buffer.getvalue())
    depths, depth_scale = encode_depths(depth)
    w2c = np.linalg.inv(spec.extrinsics)  # [V, 4, 4]
    k = spec.intrinsics
    head = np.array([k[0, 0], k[1, 1], k[0, 2], k[1, 2], 0.0, 0.0])
    cameras = np.concatenate(
        [np.tile(head, (settings.views, 1)), w2c[:, :3, :4].reshape(settings.views, 12)], axis=1
    )
    return {
        "key": scene_key(split, index),
        "url": f"synthetic://{settings.kind}/seed={settings.seed}/{split}/{index}",
        "timestamps": np.arange(settings.views, dtype=np.int64) * 33_333,
        "cameras": cameras.astype(np.float32),
        "images": encoded,
        "depths": depths,
        "depth_scale": float(depth_scale),
    }


def evaluation_entry(index: int, settings: SyntheticSettings) -> dict | None:
    """Evaluation views of test scene ``index``: 2 context views and up to 3 targets between."""
    views = settings.views
    if views < 3:
        return None
    rng = np.random.default_rng(
        np.random.SeedSequence([settings.seed, SPLIT_CODES["test"], index, 1])
    )
    low = max(2, round(0.4 * (views - 1)))
    high = max(low, round(0.7 * (views - 1)))
    gap = int(rng.integers(low, high + 1))
    start = int(rng.integers(0, views - gap))
    targets = rng.choice(np.arange(start + 1, start + gap), size=min(3, gap - 1), replace=False)
    return {"context": [start, start + gap], "target": sorted(int(i) for i in targets)}


def _task(args: tuple[str, int, SyntheticSettings]) -> dict:
    return generate_scene(*args)


_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def _worker_init() -> None:
    """Give a generator worker the default SIGTERM action and let Ctrl-C reach only the parent.

    A forked worker inherits the parent's handlers (``OutputFolder``'s SIGTERM-as-exit,
    ``stopped_cleanly``'s, Lightning's SIGTERM "bypass" that only logs); with those,
    ``Pool.terminate`` could not end a worker blocked on the task queue's lock, and the parent
    waited on it forever.
    """
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)


def _worker_pool(workers: int) -> multiprocessing.pool.Pool:
    """A pool whose workers start with SIGTERM/SIGINT blocked until :func:`_worker_init` has
    reset their handlers (no window in which an inherited handler runs in a worker)."""
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        return multiprocessing.get_context("fork").Pool(workers, initializer=_worker_init)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def _to_chunk_scene(scene: dict) -> dict:
    import torch

    return {
        "key": scene["key"],
        "url": scene["url"],
        "timestamps": torch.from_numpy(scene["timestamps"]),
        "cameras": torch.from_numpy(scene["cameras"]),
        "images": [encode_bytes(b) for b in scene["images"]],
        "depths": [encode_bytes(b) for b in scene["depths"]],
        "depth_scale": scene["depth_scale"],
    }


def is_complete(root: str | Path) -> bool:
    """Whether ``root`` holds a finished synthetic dataset."""
    root = Path(root)
    return (root / "metadata.json").is_file() and all(
        (root / split / "index.json").is_file() for split in ("train", "test")
    )


def generate_dataset(
    out: str | Path,
    settings: SyntheticSettings | None = None,
    workers: int = 1,
    chunk_mb: float = 2.0,
    progress: bool = True,
    overwrite: bool = False,
    said_seconds: float | None = None,
) -> Path:
    """Generate a synthetic chunk dataset into ``out`` (written under a temporary name first).

    Args:
        out: output folder; must not exist or be empty unless ``overwrite``.
        settings: what to generate.
        workers: processes generating scenes in parallel.
        chunk_mb: approximate chunk size (image bytes).
        progress: show a tqdm progress bar.
        overwrite: replace an existing non-empty ``out``.
        said_seconds: the time said before it started (:func:`ensure_synthetic`): said again,
            marked ``revised``, when the scenes' measured times are off by more than 2x from it
            (``models.core.budget.Countdown``).

    Returns:
        The output folder.
    """
    settings = settings or SyntheticSettings()
    settings.validate()
    out = Path(out)
    folder = OutputFolder(out, "datamodules.synthetic", overwrite=overwrite)
    sizes = settings.split_sizes()
    tasks = [(split, i, settings) for split in ("train", "test") for i in range(sizes[split])]
    try:
        with folder as tmp:
            _generate_into(tmp, settings, sizes, tasks, workers, chunk_mb, progress, said_seconds)
    except OutputFolderError:
        if not overwrite and is_complete(out):  # another process finished first
            return out
        raise
    return out


def _generate_into(
    tmp: Path,
    settings: SyntheticSettings,
    sizes: dict[str, int],
    tasks: list,
    workers: int,
    chunk_mb: float,
    progress: bool,
    said_seconds: float | None = None,
) -> None:
    from tqdm import tqdm

    writers = {split: ChunkWriter(tmp, split, chunk_mb=chunk_mb) for split in sizes}
    pool = _worker_pool(workers) if workers > 1 else None  # forked before tqdm starts a thread
    bar = tqdm(
        total=len(tasks),
        desc=f"synthetic {settings.kind} scenes",
        unit="scene",
        disable=not progress,
        dynamic_ncols=True,
    )
    timer = _SceneTimer(len(tasks), 1 if pool is None else POOL_CHUNK * workers, said_seconds)
    if pool is not None:
        try:
            for scene in pool.imap(_task, tasks, chunksize=POOL_CHUNK):
                writers[scene["key"].split("_")[1]].add(_to_chunk_scene(scene))
                bar.update()
                timer.done()
            pool.close()  # workers take their end-of-work sentinel and exit by themselves
        except BaseException:
            pool.terminate()  # SIGTERM: the workers' default action ends them at once
            raise
        finally:
            pool.join()
    else:
        for task in tasks:
            scene = _task(task)
            writers[task[0]].add(_to_chunk_scene(scene))
            bar.update()
            timer.done()
    bar.close()
    for split, writer in writers.items():
        writer.close()
        if sizes[split] == 0:  # an empty split still gets an (empty) index
            (tmp / split).mkdir(parents=True, exist_ok=True)
            (tmp / split / "index.json").write_text("{}", encoding="utf-8")
    index = {scene_key("test", i): evaluation_entry(i, settings) for i in range(sizes["test"])}
    (tmp / "evaluation_index.json").write_text(json.dumps(index), encoding="utf-8")
    (tmp / "metadata.json").write_text(json.dumps(asdict(settings), indent=2), encoding="utf-8")


# Scenes a pool worker takes at a time.
POOL_CHUNK = 4


class _SceneTimer:
    """The scenes' measured times into a ``budget.Countdown`` (only when a time was said up
    front: it says the rest again, ``revised``, when that is off by more than 2x), ``batch``
    scenes a unit: a pool's workers hand their scenes back in chunks, several at once."""

    def __init__(self, scenes: int, batch: int, said: float | None) -> None:
        units = -(-scenes // batch)
        unit = "scene" if batch == 1 else f"{batch}-scene batch"
        what = f"generating the synthetic dataset: {scenes} scenes"
        self.countdown = None if said is None else budget.Countdown(what, units, unit, said)
        self.batch, self.count, self.last = batch, 0, time.perf_counter()

    def done(self) -> None:
        """One more scene finished."""
        self.count += 1
        if self.countdown is not None and self.count % self.batch == 0:
            now = time.perf_counter()
            self.countdown.done(now - self.last)
            self.last = now


def ensure_synthetic(
    root: str | Path, settings: SyntheticSettings, workers: int = 1, progress: bool = True
) -> Path:
    """Generate the dataset at ``root`` unless a complete one is there.

    An existing dataset generated with another kind, resolution, view count, seed, supersampling
    or format version is an error (use another root); other differences (scene count) only warn.
    """
    root = Path(root)
    if is_complete(root):
        try:
            stored = json.loads((root / "metadata.json").read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as error:
            raise InputError(f"{root / 'metadata.json'}: unreadable ({error})") from error
        wanted = asdict(settings)
        different = {k: (stored.get(k), v) for k, v in wanted.items() if stored.get(k) != v}
        essential = {"kind", "resolution", "views", "seed", "supersample", "version"}
        if essential & set(different):
            raise InputError(
                f"{root}: holds synthetic data generated with other settings "
                f"(stored, requested: {different}); choose another root"
            )
        if different:
            log.warning(
                "%s: generated with different settings (stored, requested): %s", root, different
            )
        return root
    seconds = generation_seconds(settings, workers)
    print(  # before any training or evaluation progress bar: say what the wait is for
        f"generating the synthetic dataset into {root}: {settings.scenes} {settings.kind} scenes "
        f"(train and test) of {settings.views} views at {settings.resolution}x"
        f"{settings.resolution} px, about {_duration(seconds)} (first use only; later runs, "
        "training and evaluation, reuse it)",
        file=sys.stderr,
        flush=True,
    )
    return generate_dataset(
        root, settings, workers=workers, progress=progress, said_seconds=seconds
    )


# CPU seconds per scene of 24 views at 64² with 2x2 rays per pixel on an idle machine
# (docs/benchmarks.md, "Synthetic data generation": 198 ms); the time grows with rays.
SCENE_SECONDS = 0.2


def generation_seconds(settings: SyntheticSettings, workers: int = 1) -> float:
    """Estimated wall seconds of ``generate_dataset``: the scenes' rays at the measured rate,
    shared by the workers, slowed by the other load of the machine (its load average)."""
    cpus = os.cpu_count() or 1
    rays = settings.views * settings.resolution**2 * settings.supersample**2
    per_scene = SCENE_SECONDS * rays / (24 * 64**2 * 4)
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = 0.0
    parallel = max(1, min(workers, cpus))
    return settings.scenes * per_scene / parallel * max(1.0, (load + parallel) / cpus)


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


@dataclass
class SyntheticCommandConfig:
    """``python -m datamodules.synthetic out=DIR key=value ...`` (or, as the design's contract
    writes it, ``--out DIR --scenes N --resolution R --seed S``)."""

    out: str = setting(MISSING, path=True)  # output folder
    scenes: int = setting(1000, minimum=1)  # total scenes (train + test)
    resolution: int = setting(64, minimum=8)  # image side in pixels
    views: int = setting(24, minimum=2)  # frames per scene
    seed: int = 0
    kind: str = setting("room", choices=("room", "object"))
    workers: int = setting(1, minimum=1)  # parallel processes
    test_fraction: float = setting(0.1, minimum=0.0, below=1.0)  # share of test scenes
    supersample: int = setting(2, minimum=1)  # rays per pixel per axis
    chunk_mb: float = setting(2.0, above=0.0, finite=True)  # approximate chunk size
    overwrite: bool = False  # replace an earlier output
    quiet: bool = False  # no progress bar


def main(argv: list[str] | None = None) -> int:
    """Command line entry point; returns the exit status (2 on bad input)."""
    return run_key_value_command(argv, __doc__, _generate)


def _generate(argv: list[str]) -> None:
    args = flag_arguments(argv, switches=("overwrite", "quiet"))
    paths, top = parse_key_values(args, SyntheticCommandConfig, "datamodules.synthetic")
    if paths:
        raise SettingError(paths[0], "not a setting (settings are key=value or --name VALUE)")
    settings = SyntheticSettings(**{name: top[name] for name in SETTING_NAMES})
    start = time.perf_counter()
    try:
        settings.validate()
        out = generate_dataset(
            top["out"],
            settings,
            workers=top["workers"],
            chunk_mb=top["chunk_mb"],
            progress=not top["quiet"],
            overwrite=top["overwrite"],
        )
    except (ValueError, OSError) as error:  # an InputError, or the chunk writer's chunk_mb
        raise InputError(" ".join(str(error).split())) from error
    sizes = settings.split_sizes()
    print(
        f"wrote {sizes['train']} train + {sizes['test']} test scenes to {out} "
        f"in {time.perf_counter() - start:.1f} s"
    )


SETTING_NAMES = ("scenes", "resolution", "views", "seed", "kind", "test_fraction", "supersample")


if __name__ == "__main__":
    with stopped_cleanly("datamodules.synthetic"):
        sys.exit(main())
