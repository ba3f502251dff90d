"""``python -m models.refine [GAUSSIANS.ply] PHOTOS output=DIR [key=value ...]``: refine a ``.ply``
from any tool (or the photos' SfM points, ``refine_init=sfm``) against posed photos and write a new
``gaussians.ply`` with a ``summary.json`` (and, with ``holdout=K``, held-out renders) atomically.

PHOTOS is a folder with ``cameras.json`` or a COLMAP model (``sparse/``, ``sparse/0``; its images
beside it or in ``images/``), read by ``datamodules.readers.image_folder``. With ``holdout=K``
every K-th photo (0, K, 2K, ... in name order) never enters the fit; each is scored (PSNR, SSIM)
at the fit size before and after refinement, beside the nearest-view baseline (the training photo
whose camera centre is closest, resized the same).
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from PIL import Image
from torch import Tensor

from datamodules.errors import InputError
from datamodules.readers.colmap import read_colmap_points
from datamodules.readers.image_folder import load_images
from models.core.command_line import MISSING, Terminated, parse_key_values
from models.core.gaussians import Gaussians
from models.core.output_folder import OutputFolder
from models.core.pixels import image_to_uint8
from models.pipeline.capture.holdout import holdout_indices, holdout_views, score_holdout
from models.pipeline.inference import check_backend, choose_device
from models.pipeline.refine.plan import fit_shape
from models.pipeline.refine.report import plot_holdout_psnr
from models.pipeline.refine.stage import refine_checkpoint_path, start_refinement
from models.pipeline.refine.start import gaussians_from_points
from models.pipeline.refinement import (
    check_fit_memory,
    holdout_table,
    photo_shape,
    refine_settings,
)
from models.pipeline.settings import RefineCommandConfig

__all__ = ["USAGE", "main", "parse_arguments"]

PROGRAM = "models.refine"
USAGE = """usage: python -m models.refine [GAUSSIANS.ply] PHOTOS output=DIR [key=value ...]

Refine 3D Gaussians (a .ply in the INRIA 3DGS layout, or refine_init=sfm: the photos' COLMAP
points) against posed photos (a folder with cameras.json or a COLMAP sparse/ model) and write
DIR/gaussians.ply and DIR/summary.json (with holdout=K also DIR/renders/holdout/*.png).

settings:
  output=DIR                 the output folder (new, or with overwrite=true an earlier output)
  refine=N                   optimisation steps (default 1000 unless refine_time is given)
  refine_time=S              budget in seconds (the first of refine/refine_time that is reached)
  refine_size=PX             long side the photos are fitted at (default: theirs, at most 320)
  refine_init=auto           start from GAUSSIANS.ply when given, else the photos' SfM points;
                             feed_forward or sfm choose
  refine_max_gaussians=N     cap of the densification (default: what the budget and memory allow)
  holdout=K|NAME,NAME        keep every K-th photo (from the first), or the named ones, out
                             of the fit and score them (as in infer.py)
  refine_checkpoint_every=N  save the fit's state every N steps beside DIR and resume from it
  optimize_cameras=false     refine the cameras jointly (view 0 fixed)
  backend=auto device=auto seed=0 overwrite=false
  refinement.KEY=VALUE       any RefineSettings field, e.g. refinement.densify=adc,
                             refinement.mcmc.growth=0.1 (configs/infer.yaml's refinement: node)"""

DEFAULT_STEPS = 1000


class RefineCommandError(InputError):
    """Bad command-line input (one line naming the argument)."""


def parse_arguments(argv: list[str]) -> tuple[list[str], dict[str, Any]]:
    """Positional paths and every setting of :class:`RefineCommandConfig` (``refinement.``
    nested), typed and checked as ``infer.py`` checks its own."""
    return parse_key_values(argv, RefineCommandConfig, PROGRAM)


def _holdout_indices(names: list[str], holdout: Any) -> list[int]:
    """``holdout=K`` (every K-th photo from the first) or ``NAME,NAME``, as in ``infer.py``."""
    held = holdout_indices(holdout, names)
    if held and len(names) - len(held) < 1:
        raise RefineCommandError(f"holdout={holdout}", "leaves no photo to fit")
    return held


def _load(positional: list[str], top: dict[str, Any]):
    """The start Gaussians and the photos (an ``ImageSet``)."""
    init = top["refine_init"]
    if init == "auto":  # a file given: start from it; photos alone: their SfM points
        init = top["refine_init"] = "feed_forward" if len(positional) == 2 else "sfm"
    wanted = 1 if init == "sfm" else 2
    if len(positional) != wanted:
        what = "PHOTOS" if init == "sfm" else "GAUSSIANS.ply PHOTOS"
        raise RefineCommandError(
            " ".join(positional) or "(nothing)", f"expected {what} (refine_init={init})"
        )
    photos = Path(positional[-1]).expanduser()
    if not photos.is_dir():
        raise RefineCommandError(photos, "not a folder of posed photos")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        images = load_images(photos, None, poses="auto")
    for note in caught:
        if issubclass(note.category, UserWarning):
            print(f"warning: {' '.join(str(note.message).split())}", file=sys.stderr)
    if images.extrinsics is None:
        raise RefineCommandError(
            photos, "no cameras.json or COLMAP sparse/ model: photos need poses"
        )
    if init == "sfm":
        xyz, rgb = read_colmap_points(photos, min_points=2)
        gaussians = gaussians_from_points(xyz, rgb, sh_degree=3)
    else:
        ply = Path(positional[0]).expanduser()
        if not ply.exists():
            raise RefineCommandError(ply, "file not found")
        try:
            gaussians = Gaussians.load(ply)  # any splat format (docs/formats.md)
        except ValueError as error:
            raise RefineCommandError(str(error)) from error
        if gaussians.num_slots < 1:
            raise RefineCommandError(ply, "holds no Gaussians")
    return gaussians, images


def _save_png(image: Tensor, path: Path) -> None:
    Image.fromarray(image_to_uint8(image)).save(path)


def _settings(argv: list[str]) -> tuple[list[str], dict[str, Any], Any, torch.device]:
    """The arguments, checked before anything loads: ``(positional, settings, RefineSettings,
    device)``."""
    positional, top = parse_arguments(argv)
    if top["output"] in (None, MISSING, ""):
        raise RefineCommandError("output", "set output=DIR")
    if not top["refine"] and top["refine_time"] is None:
        top["refine"] = DEFAULT_STEPS
    settings = refine_settings(top, str(top["backend"]), top["seed"])
    device = choose_device(str(top["device"]))
    check_backend(settings.backend, device)
    shape, count = photo_shape(Path(positional[-1])) if positional else ((1, 1), 1)
    check_fit_memory(settings, shape, count, str(device))
    return positional, top, settings, device


def _holdout(photos, held: list[int], train: list[int], shape: tuple[int, int]):
    """The held-out photos at the fit's size with their nearest training photo
    (``models.pipeline.capture.holdout``, as ``infer.py`` scores them), or ``None``."""
    if not held:
        return None
    resized = F.interpolate(photos.images.float(), size=shape, mode="area")
    return holdout_views(photos.names, resized, photos.extrinsics, photos.intrinsics, held, train)


def _write(folder, result, summary: dict, scores, baseline) -> None:
    """``gaussians.ply``, ``summary.json``, held-out renders and the PSNR plot, atomically."""
    with folder as staging:
        result.gaussians.save_ply(staging / "gaussians.ply")
        if scores is not None:
            (staging / "renders" / "holdout").mkdir(parents=True)
            for name, image in zip(summary["holdout"]["views"], scores.renders):
                _save_png(image, staging / "renders" / "holdout" / f"{Path(name).stem}.png")
            if len(result.evaluations) > 1:
                plot_holdout_psnr(result.evaluations, baseline, staging / "refine_psnr.png")
        (staging / "summary.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")


def run(argv: list[str]) -> int:
    """The command; returns the exit status (bad input raises an ``InputError``)."""
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    positional, top, settings, device = _settings(argv)
    folder = OutputFolder(
        top["output"], PROGRAM, inputs=positional, overwrite=bool(top["overwrite"])
    )
    gaussians, photos = _load(positional, top)
    names = photos.names
    held = _holdout_indices(names, top["holdout"])
    train = [i for i in range(len(names)) if i not in held]
    shape = fit_shape(tuple(photos.images.shape[-2:]), settings.size)
    views = _holdout(photos, held, train, shape)
    gaussians = gaussians.to(device)
    before = None
    if views is not None:
        before = score_holdout(gaussians, views, backend=settings.backend, lpips=False)
    checkpoint = None
    if top["refine_checkpoint_every"]:
        checkpoint = refine_checkpoint_path(top["output"])
    result = start_refinement(
        gaussians,
        photos.images[train],
        photos.extrinsics[train],
        photos.intrinsics[train],
        settings,
        holdout=views,
        optimize_cameras=bool(top["optimize_cameras"]),
        checkpoint_path=checkpoint,
        progress=True,
        keep=int(gaussians.count()[0]) if top["refine_init"] == "sfm" else 0,
    )
    print(result.message, file=sys.stderr)
    summary: dict[str, Any] = {
        "program": PROGRAM,
        "input": {
            "gaussians": positional[0] if len(positional) == 2 else None,
            "photos": positional[-1],
            "refine_init": top["refine_init"],
        },
        "view_names": [names[i] for i in train],
        "refine": {**result.summary(), "settings": settings.to_dict()},
    }
    scores = baseline = None
    if views is not None:
        scores = score_holdout(result.gaussians, views, backend=settings.backend, lpips=False)
        summary["holdout"] = {**holdout_table(views, before, scores), "every": top["holdout"]}
        means = summary["holdout"]["mean"]
        baseline = means["nearest_view_psnr"]
        print(
            f"held-out PSNR {means['psnr_before_refine']:.2f} -> {means['psnr']:.2f} dB "
            f"(nearest view {baseline:.2f} dB) over {len(held)} photos",
            file=sys.stderr,
        )
    _write(folder, result, summary, scores, baseline)
    if checkpoint is not None and result.stopped != "interrupted":
        checkpoint.unlink(missing_ok=True)
    print(f"wrote {folder.output}", file=sys.stderr)
    if result.stopped != "interrupted":
        return 0
    return 143 if result.interrupted_by == "SIGTERM" else 130


def main(argv: list[str] | None = None) -> int:
    """Entry point: bad input is one line on stderr and exit status 2."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        return run(argv)
    except InputError as error:
        print(f"error: {' '.join(str(error).split())}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as error:
        term = isinstance(error, Terminated)
        print(f"stopped by {'SIGTERM' if term else 'Ctrl-C'}: nothing written", file=sys.stderr)
        return 143 if term else 130
