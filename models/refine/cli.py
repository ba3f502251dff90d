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
from torch import Tensor

from datamodules.errors import InputError
from models.capture.holdout import holdout_indices
from models.command_line import Terminated
from models.pipeline.refinement import check_fit_memory, photo_shape, refine_settings
from models.pipeline.settings import MISSING, RefineCommandConfig, parse_key_values
from models.refine.report import holdout_evaluator, plot_holdout_psnr

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
  refine_init=feed_forward   start from GAUSSIANS.ply (feed_forward) or the SfM points (sfm)
  refine_max_gaussians=N     cap of the densification (default: twice the starting count)
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


def _check_finite(gaussians, ply: Path) -> None:
    """Refuse a ``.ply`` with NaN or infinite values (the fit would diverge at once)."""
    fields = ("means", "scales", "rotations", "opacities", "harmonics")
    bad = [f for f in fields if not torch.isfinite(getattr(gaussians, f)).all()]
    if bad:
        raise RefineCommandError(ply, f"holds NaN or infinite values in {', '.join(bad)}")


def _load(positional: list[str], top: dict[str, Any]):
    """The start Gaussians and the photos (an ``ImageSet``)."""
    from datamodules.readers.image_folder import load_images
    from models.gaussians import Gaussians
    from models.refine.start import gaussians_from_points, read_colmap_points

    init = top["refine_init"]
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
        xyz, rgb = read_colmap_points(photos)
        gaussians = gaussians_from_points(xyz, rgb, sh_degree=3)
    else:
        ply = Path(positional[0]).expanduser()
        if not ply.is_file():
            raise RefineCommandError(ply, "file not found")
        try:
            gaussians = Gaussians.load_ply(ply)
        except ValueError as error:
            raise RefineCommandError(str(error)) from error
        if gaussians.num_slots < 1:
            raise RefineCommandError(ply, "holds no Gaussians")
        _check_finite(gaussians, ply)
    return gaussians, images


def _scores(rendered: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
    from models.metrics import psnr_per_image, ssim_per_image

    return psnr_per_image(rendered, target), ssim_per_image(rendered, target)


def _save_png(image: Tensor, path: Path) -> None:
    from PIL import Image

    array = (image.detach().clamp(0, 1) * 255 + 0.5).to(torch.uint8).permute(1, 2, 0).cpu().numpy()
    Image.fromarray(array).save(path)


def run(argv: list[str]) -> int:
    """The command; returns the exit status (bad input raises an ``InputError``)."""
    from models.inference import check_backend, choose_device
    from models.metrics import nearest_view_baseline
    from models.output_folder import OutputFolder
    from models.refine.fit import fit_shape, refine_gaussians

    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    positional, top = parse_arguments(argv)
    if top["output"] in (None, MISSING, ""):
        raise RefineCommandError("output", "set output=DIR")
    if not top["refine"] and top["refine_time"] is None:
        top["refine"] = DEFAULT_STEPS
    settings = refine_settings(top, str(top["backend"]), top["seed"])
    every = top["refine_checkpoint_every"]
    device = choose_device(str(top["device"]))
    check_backend(settings.backend, device)
    shape, count = photo_shape(Path(positional[-1])) if positional else ((1, 1), 1)
    check_fit_memory(settings, shape, count, str(device))  # before anything loads
    folder = OutputFolder(
        top["output"], PROGRAM, inputs=positional, overwrite=bool(top["overwrite"])
    )
    gaussians, photos = _load(positional, top)
    names = photos.names
    held = _holdout_indices(names, top["holdout"])
    train = [i for i in range(len(names)) if i not in held]
    shape = fit_shape(tuple(photos.images.shape[-2:]), settings.size)
    evaluate, held_images = None, None
    if held:
        evaluate, held_images = holdout_evaluator(
            photos.images[held].to(device),
            photos.extrinsics[held].to(device),
            photos.intrinsics[held].to(device),
            shape,
            settings.backend,
        )
    gaussians = gaussians.to(device)
    before = None
    if held:
        from models.render import render

        with torch.no_grad():
            out = render(
                gaussians,
                photos.extrinsics[held][None].to(device),
                photos.intrinsics[held][None].to(device),
                shape,
                backend=settings.backend,
            )
        before = _scores(out.color[0], held_images)
    checkpoint = None
    if every:
        out_path = Path(top["output"]).expanduser().resolve()
        checkpoint = out_path.with_name(f".{out_path.name}.refine-checkpoint.pt")
    result = refine_gaussians(
        gaussians,
        photos.images[train].to(device),
        photos.extrinsics[train].to(device),
        photos.intrinsics[train].to(device),
        settings,
        optimize_cameras=bool(top["optimize_cameras"]),
        evaluate=evaluate,
        checkpoint_path=checkpoint,
        progress=True,
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
    renders = {}
    if held:
        from models.render import render

        with torch.no_grad():
            out = render(
                result.gaussians,
                photos.extrinsics[held][None].to(device),
                photos.intrinsics[held][None].to(device),
                shape,
                backend=settings.backend,
            )
        psnr, ssim = _scores(out.color[0], held_images)
        context = {
            "image": F.interpolate(photos.images[train], size=shape, mode="area")[None],
            "extrinsics": photos.extrinsics[train][None],
        }
        nearest = nearest_view_baseline(
            context, {"image": held_images[None].cpu(), "extrinsics": photos.extrinsics[held][None]}
        )[0]
        nearest_psnr, nearest_ssim = _scores(nearest, held_images.cpu())
        metrics = {}
        for j, i in enumerate(held):
            metrics[names[i]] = {
                "psnr": round(float(psnr[j]), 3),
                "ssim": round(float(ssim[j]), 4),
                "nearest_view_psnr": round(float(nearest_psnr[j]), 3),
                "nearest_view_ssim": round(float(nearest_ssim[j]), 4),
                "psnr_before_refine": round(float(before[0][j]), 3),
                "ssim_before_refine": round(float(before[1][j]), 4),
            }
            renders[Path(names[i]).stem] = out.color[0, j]
        means = {
            k: round(sum(m[k] for m in metrics.values()) / len(metrics), 3)
            for k in next(iter(metrics.values()))
        }
        summary["holdout"] = {
            "views": [names[i] for i in held],
            "image_size": list(shape),
            "every": top["holdout"],
            "metrics": metrics,
            "mean": means,
        }
        print(
            f"held-out PSNR {means['psnr_before_refine']:.2f} -> {means['psnr']:.2f} dB "
            f"(nearest view {means['nearest_view_psnr']:.2f} dB) over {len(held)} photos",
            file=sys.stderr,
        )
    with folder as staging:
        result.gaussians.save_ply(staging / "gaussians.ply")
        if renders:
            (staging / "renders" / "holdout").mkdir(parents=True)
            for stem, image in renders.items():
                _save_png(image, staging / "renders" / "holdout" / f"{stem}.png")
            if len(result.evaluations) > 1:
                plot_holdout_psnr(
                    result.evaluations,
                    summary["holdout"]["mean"]["nearest_view_psnr"],
                    staging / "refine_psnr.png",
                )
        (staging / "summary.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
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
