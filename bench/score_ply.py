"""Benchmark helper: score 3DGS scene files from any tool on a posed capture's held-out photos,
as ``infer.py ... holdout=K refine_size=S`` scores its own refined scene.

The photos are read once the way ``infer.py``'s fit reads them (``load_images`` with the fit's
second size, ``models.pipeline.run.refine_shape``: the whole photo, ``--size`` pixels on the long
side); every ``--holdout``-th photo from the first (name order) is held out and rendered at its
camera from each scene file, beside the nearest-view baseline (the training photo nearest in
camera, resized the same): the same photos, size and baseline as ``summary.json``'s ``holdout``.
Each file must be in the capture's own frame (for a COLMAP capture: COLMAP's world, e.g.
``gaussians_from_points`` of its points, or another tool's output in that frame). Two training
photos are rendered too (``train_psnr``): a file in another frame scores low on them as well.

    python -m bench.score_ply PHOTOS SCENE.ply [SCENE.ply ...] [--holdout 8] [--size 240]

It prints one JSON line per file: held-out mean PSNR/SSIM, the baseline, the count, the PSNR
per held-out photo and on the two training photos.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from datamodules.errors import InputError  # noqa: E402
from datamodules.readers.image_folder import load_images  # noqa: E402
from models.core.gaussians import Gaussians  # noqa: E402
from models.pipeline.capture.holdout import (  # noqa: E402
    HoldoutViews,
    holdout_indices,
    holdout_views,
    score_holdout,
)
from models.pipeline.run import refine_shape  # noqa: E402


def capture_views(photos: Path, holdout: int, size: int) -> tuple[HoldoutViews, HoldoutViews]:
    """The held-out views and two training views (the frame check) of ``photos`` at the fit
    size ``size`` (long side), as ``infer.py`` reads them."""
    loaded = load_images(photos, None, poses="auto", fit_shape_of=lambda s: refine_shape(s, size))
    if loaded.extrinsics is None or loaded.fit is None:
        raise SystemExit(f"error: {photos}: no cameras.json or COLMAP model: photos need poses")
    fit, names = loaded.fit, loaded.names
    held = holdout_indices(holdout, names)
    train = [i for i in range(len(names)) if i not in held]
    if not held or len(train) < 3:
        raise SystemExit(f"error: holdout={holdout}: needs held-out photos and 3 training ones")
    views = holdout_views(names, fit.images, fit.extrinsics, fit.intrinsics, held, train)
    check = [train[0], train[len(train) // 2]]
    rest = [i for i in train if i not in check]
    train_views = holdout_views(names, fit.images, fit.extrinsics, fit.intrinsics, check, rest)
    return views, train_views


def score_file(path: Path, views: HoldoutViews, train_views: HoldoutViews) -> dict[str, Any]:
    """One scene file's row (JSON-ready)."""
    gaussians = Gaussians.load(path)
    held = score_holdout(gaussians, views, lpips=False)
    train = score_holdout(gaussians, train_views, lpips=False)
    return {
        "file": str(path),
        "gaussians": int(gaussians.num_slots),
        "psnr": round(held.mean["psnr"], 3),
        "ssim": round(held.mean["ssim"], 4),
        "nearest_view_psnr": round(held.mean["nearest_view_psnr"], 3),
        "nearest_view_ssim": round(held.mean["nearest_view_ssim"], 4),
        "per_photo_psnr": {name: round(float(m["psnr"]), 2) for name, m in held.metrics.items()},
        "train_psnr": round(train.mean["psnr"], 2),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("photos", type=Path)
    parser.add_argument("scenes", type=Path, nargs="+")
    parser.add_argument("--holdout", type=int, default=8)
    parser.add_argument("--size", type=int, default=240)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    missing = [str(p) for p in args.scenes if not p.is_file()]
    if missing:
        raise SystemExit(f"error: {missing[0]}: file not found")
    try:
        views, train_views = capture_views(args.photos, args.holdout, args.size)
        for path in args.scenes:
            print(json.dumps(score_file(path, views, train_views)), flush=True)
    except (InputError, ValueError) as error:  # unreadable photos, cameras or scene file
        raise SystemExit(f"error: {' '.join(str(error).split())}") from None


if __name__ == "__main__":
    main()
