"""Benchmark: the step time of the refinement fit (``models.pipeline.refine.refine_gaussians``) with each
renderer backend, in the same run, split into render forward (+ loss), backward, densification and
optimiser (Adam, the MCMC noise, schedules).

The case: a posed capture (default: the drone frames of ``../shared/data/real/drone_colmap``,
every 8th photo left out), started from its SfM points (``refine_init=sfm``) or from ``--ply``
(a set in the capture's frame, e.g. the ``gaussians.ply`` of an ``infer.py`` run on it: the step
time at the counts a fit reaches), fitted at
``--size`` pixels on the long side for ``--steps`` steps per backend after ``--warmup`` untimed
ones, with MCMC densification every 10 steps so that the densify column is not empty, and one SH
band more every ``--sh-degree-every`` steps (default 1: the set's full degree from each run's
fourth step on, as a fit runs most of its steps; until 6 Dec 2026 the bench kept the fit's 250, so its
short runs timed degree 0 only: ``--sh-degree-every 250`` gives those figures). It prints
a Markdown table of milliseconds per step; the load average is printed beside it (the machine
may be shared).

    python bench/refine_speed.py [--photos DIR] [--ply PATH] [--backends cpu,torch] [--steps 30]
        [--size 240] [--threads N] [--sh-degree-every 1]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from datamodules.readers.colmap import read_colmap_points  # noqa: E402
from datamodules.readers.image_folder import load_images  # noqa: E402
from models import Gaussians  # noqa: E402
from models.pipeline.refine import (  # noqa: E402
    MCMCSettings,
    RefineSettings,
    gaussians_from_points,
    refine_gaussians,
)

DEFAULT_PHOTOS = Path(__file__).resolve().parents[2] / "shared" / "data" / "real" / "drone_colmap"
COLUMNS = ("forward", "backward", "densify", "optimizer")


def time_backend(gaussians, images, extrinsics, intrinsics, backend: str, args) -> dict:
    """Per-step milliseconds of each part, over ``args.steps`` steps after the warm-up."""
    common = dict(
        size=args.size,
        backend=backend,
        densify="mcmc",
        mcmc=MCMCSettings(start=0, every=10, growth=0.02),
        max_gaussians=int(gaussians.num_slots * 1.2),
        sh_degree_every=args.sh_degree_every,
    )
    warm = refine_gaussians(
        gaussians,
        images,
        extrinsics,
        intrinsics,
        RefineSettings(steps=args.warmup, **common),
        progress=False,
    )
    result = refine_gaussians(
        warm.gaussians,
        images,
        extrinsics,
        intrinsics,
        RefineSettings(steps=args.steps, **common),
        progress=False,
    )
    row = {k: 1000 * result.timings[k] / result.steps for k in COLUMNS}
    row["total"] = 1000 * result.seconds / result.steps
    row["gaussians"] = result.count_after
    row["shape"] = result.image_size
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--photos", type=Path, default=DEFAULT_PHOTOS)
    parser.add_argument("--ply", type=Path, default=None, help="start from this set")
    parser.add_argument("--backends", default="cpu,torch")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--size", type=int, default=240)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--sh-degree-every", type=int, default=1)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    photos = load_images(args.photos, None)
    train = [i for i in range(len(photos)) if i % 8]
    if args.ply is None:
        xyz, rgb = read_colmap_points(args.photos, min_points=2)
        start = gaussians_from_points(xyz, rgb, sh_degree=3)
    else:
        start = Gaussians.load_ply(args.ply)
    rows = {}
    for backend in args.backends.split(","):
        rows[backend] = time_backend(
            start,
            photos.images[train],
            photos.extrinsics[train],
            photos.intrinsics[train],
            backend,
            args,
        )
    any_row = next(iter(rows.values()))
    height, width = any_row["shape"]
    print(
        f"refinement step, {args.photos.name}: {len(train)} photos at {width}x{height}, "
        f"~{any_row['gaussians']} Gaussians ({'SfM start' if args.ply is None else args.ply.name}, "
        f"SH {start.sh_degree}, a band more every {args.sh_degree_every} steps), {args.steps} steps, "
        f"{torch.get_num_threads()} threads, load average {os.getloadavg()[0]:.2f}"
    )
    print()
    print("| backend | forward ms | backward ms | densify ms | optimizer ms | step ms |")
    print("|---|---:|---:|---:|---:|---:|")
    for backend, row in rows.items():
        print(
            f"| {backend} | {row['forward']:.1f} | {row['backward']:.1f} | {row['densify']:.1f} "
            f"| {row['optimizer']:.1f} | {row['total']:.1f} |"
        )


if __name__ == "__main__":
    main()
