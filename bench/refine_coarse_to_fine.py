"""Benchmark: does coarse-to-fine (``RefineSettings.coarse_fraction``: the first fraction of the
steps at half the image size) buy time-to-quality in the refinement fit?

The case: a posed capture (default: the drone frames of ``../shared/data/real/drone_colmap``,
every 8th photo held out and never fitted), started from its SfM points, fitted at ``--size``
pixels on the long side for ``--steps`` steps with each ``--fractions`` value. It prints a
Markdown table: held-out PSNR at each quarter of the steps with the seconds spent so far, and
the final PSNR, wall time and count (the load average beside it: the machine may be shared).

    python bench/refine_coarse_to_fine.py [--photos DIR] [--steps 600] [--size 240]
        [--fractions 0,0.3,0.5] [--threads 2]
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
from models.pipeline.refine import (  # noqa: E402
    RefineSettings,
    fit_shape,
    gaussians_from_points,
    holdout_evaluator,
    refine_gaussians,
)

DEFAULT_PHOTOS = Path(__file__).resolve().parents[2] / "shared" / "data" / "real" / "drone_colmap"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--photos", type=Path, default=DEFAULT_PHOTOS)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--size", type=int, default=240)
    parser.add_argument("--fractions", default="0,0.3,0.5")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    photos = load_images(args.photos, None)
    held = [i for i in range(len(photos.names)) if i % 8 == 0]
    train = [i for i in range(len(photos.names)) if i % 8]
    xyz, rgb = read_colmap_points(args.photos)
    start = gaussians_from_points(xyz, rgb, sh_degree=3)
    shape = fit_shape(tuple(photos.images.shape[-2:]), args.size)
    evaluate, _ = holdout_evaluator(
        photos.images[held], photos.extrinsics[held], photos.intrinsics[held], shape, "auto"
    )
    rows = []
    for fraction in (float(f) for f in args.fractions.split(",")):
        settings = RefineSettings(steps=args.steps, size=args.size, coarse_fraction=fraction)
        result = refine_gaussians(
            start,
            photos.images[train],
            photos.extrinsics[train],
            photos.intrinsics[train],
            settings,
            evaluate=evaluate,
            progress=False,
        )
        curve = ", ".join(f"{e['psnr']:.2f} @ {e['seconds']:.0f} s" for e in result.evaluations)
        rows.append((fraction, curve, result))
    print(
        f"coarse-to-fine, {args.photos.name}: {len(train)} photos fitted at {shape[1]}x{shape[0]}, "
        f"{len(held)} held out, SfM start ({start.num_slots} points), {args.steps} steps, "
        f"{torch.get_num_threads()} threads, load average {os.getloadavg()[0]:.2f}"
    )
    print()
    print(
        "| coarse_fraction | held-out PSNR dB @ seconds (each quarter) | final PSNR | s | end count |"
    )
    print("|---:|---|---:|---:|---:|")
    for fraction, curve, result in rows:
        final = result.evaluations[-1]["psnr"]
        print(
            f"| {fraction:g} | {curve} | {final:.2f} | {result.seconds:.0f} | "
            f"{result.count_after} |"
        )


if __name__ == "__main__":
    main()
