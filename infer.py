"""Reconstruct 3D Gaussians from your own images or video, and render them (``python infer.py
--help`` lists every setting). A thin command line over :mod:`models.inference`:
``models.capture.inputs.load_inputs`` reads the views and their poses (``cameras.json``, COLMAP or
structure-from-motion), :func:`~models.inference.reconstruct` runs the model and places the views,
:func:`~models.inference.write_reconstruction` writes ``gaussians.ply``, ``cameras.json``,
``renders/``, ``path/``, ``path.mp4``, ``sparse/`` and ``summary.json`` atomically. Bad input is
one line on stderr naming the path or setting, and exit status 2.

The configuration is ``configs/infer.yaml``, registered with Hydra as a structured config (no
config folder on Hydra's search path), so ``model=NAME`` is a plain setting naming a registry
model and never clashes with the training configs' ``configs/model`` group.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

if __name__ == "__main__":  # Ctrl-C while the imports below load: one line, no traceback
    signal.signal(signal.SIGINT, lambda *_: (print("infer.py: stopped by Ctrl-C", file=sys.stderr), os._exit(130)))  # fmt: skip  # noqa: E501

REPO_ROOT = Path(__file__).resolve().parent
if str(REPO_ROOT) not in sys.path:  # `python /path/to/infer.py` from another folder
    sys.path.insert(0, str(REPO_ROOT))

import hydra  # noqa: E402
from hydra.core.config_store import ConfigStore  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from datamodules.errors import InputError  # noqa: E402
from models.command_line import (  # noqa: E402
    angle_setting,
    check_settings,
    config_help,
    quote_lists,
    quote_path_arguments,
    stopped_cleanly,
)
from models.inference import InferenceError  # noqa: E402
from models.registry import to_plain  # noqa: E402
from models.splat_formats import parse_formats  # noqa: E402

__all__ = [
    "compose",
    "forward_kwargs",
    "help_text",
    "image_size_arguments",
    "main",
    "run",
    "run_cli",
]

CONFIG = REPO_ROOT / "configs" / "infer.yaml"
ConfigStore.instance().store(name="infer", node=OmegaConf.load(CONFIG))
COUNTS = {"views": 1, "orbit_frames": 1, "fps": 1, "max_gaussians": 1, "fusion_max_gaussians": 1}


def _check_count(cfg: DictConfig, key: str, minimum: int) -> None:
    """A count setting is a whole number >= ``minimum`` (``None``: the default)."""
    value = cfg.get(key)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, str)) or not str(value).isdigit():
        raise InferenceError(f"{key}={value}", f"must be a whole number >= {minimum}")
    if int(value) < minimum:
        raise InferenceError(f"{key}={value}", f"must be at least {minimum}")


def _positive(cfg: DictConfig, key: str) -> float | None:
    """A positive number setting (``near``, ``far``, ``scene_scale``), or ``None``."""
    value = cfg.get(key)
    if value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise InferenceError(f"{key}={value}", "must be a positive number") from None
    if not number > 0 or number == float("inf"):
        raise InferenceError(f"{key}={value}", "must be a positive number")
    return number


def image_size_arguments(argv: list[str]) -> list[str]:
    """``image_size=256,448`` (or ``256x448``) → ``image_size=[256,448]`` (Hydra reads a bare
    comma list as a sweep)."""
    out = []
    for arg in argv:
        key, sep, value = arg.partition("=")
        if sep and key.lstrip("+") == "image_size" and not value.startswith("["):
            parts = value.replace("x", ",").split(",")
            if len(parts) == 2 and all(p.strip().isdigit() for p in parts):
                arg = f"{key}=[{parts[0].strip()},{parts[1].strip()}]"
        out.append(arg)
    return out


# Checks beyond the type of each setting's default (check_settings derives those).
RULES = {"fov": angle_setting, "sfm.fov": angle_setting}


def arguments(argv: list[str]) -> list[str]:
    """The command line checked against ``configs/infer.yaml`` (every declared key, its type,
    ``RULES``) and made ready for Hydra (paths literal, ``~`` the home folder, ``a,b`` text).

    Raises:
        SettingError: one line naming the argument (an unknown key names the closest one).
    """
    argv = quote_lists(quote_path_arguments(image_size_arguments(argv)))
    check_settings(argv, OmegaConf.to_container(OmegaConf.load(CONFIG)), "infer.py", RULES)
    return argv


def forward_kwargs(model, cfg: DictConfig) -> dict:
    """The knobs set in ``cfg`` (any family's declared knob name), checked against ``model``'s
    declarations (``models.knobs``); a knob the family lacks is refused by name."""
    from models.inference import check_knobs
    from models.knobs import declared_knob_names

    names = declared_knob_names()
    return check_knobs(model, {k: cfg.get(k) for k in names if k in cfg}, str(cfg.model))


def run(cfg: DictConfig) -> Path:
    """Run inference as configured; returns the output folder (bad input: an ``InputError``,
    one line)."""
    import torch

    from models import budget, inference
    from models.capture.inputs import load_inputs, needs_sfm, sfm_preflight

    started = time.perf_counter()
    if any(OmegaConf.is_missing(cfg, k) or not cfg[k] for k in ("input", "output")):
        raise InferenceError(
            "infer.py", "usage: python infer.py input=PATH output=DIR [model=NAME]"
        )
    output, source = Path(str(cfg.output)).expanduser(), Path(str(cfg.input)).expanduser()
    if not source.exists():
        raise InferenceError(source, "input not found")
    inputs = [source] + [
        Path(str(value)).expanduser()
        for value in (cfg.get("cameras"), cfg.get("weights"))
        if value not in (None, "", True, "auto") and ":" not in str(value)[:10]
    ]
    folder = inference.output_folder(output, inputs, bool(cfg.overwrite))  # checked now
    formats = parse_formats(cfg.get("formats"))  # spz, sog, ... beside gaussians.ply
    refine = _refine_settings(cfg)  # None: no refinement (refine=0, no refine_time)
    capture = _capture_mode(cfg)  # views=N|all, center_view=, holdout= (models.capture.whole)
    for key, minimum in {**COUNTS, "iterations": 0}.items():
        if not (key == "views" and str(cfg.get(key)) == "all"):
            _check_count(cfg, key, minimum)
    device = inference.choose_device(str(cfg.device))
    inference.check_backend(str(cfg.backend), device)
    torch.manual_seed(int(cfg.seed))
    timings = {}
    start = time.perf_counter()
    loaded = inference.load_for_inference(str(cfg.model), cfg.weights, device)
    timings["load_model"] = round(time.perf_counter() - start, 4)
    model = loaded.model
    knobs = forward_kwargs(model, cfg)
    recipe = inference.model_recipe(model)
    image_size = cfg.image_size
    if OmegaConf.is_config(image_size):
        image_size = OmegaConf.to_container(image_size)
    size = inference.input_size(model, image_size, recipe)
    near, far, scale = (_positive(cfg, k) for k in ("near", "far", "scene_scale"))
    shown = _warn(loaded.notes)  # the weights' notes now, not after the inputs load
    sfm = to_plain(cfg.sfm) if cfg.get("sfm") else {}
    load_views = _load_views(cfg, source, capture)
    if needs_sfm(source, model, cfg.cameras):  # minutes of SfM: every other check first
        preflight = sfm_preflight(source, load_views, sfm)
        shown += _warn(preflight.notes)
        budget.check(_preflight_estimate(cfg, model, preflight, size, capture, device))
    start = time.perf_counter()
    images, notes = load_inputs(
        source, size, model, name=str(cfg.model), views=load_views, cameras=cfg.cameras, sfm=sfm
    )
    timings["load_inputs"] = round(time.perf_counter() - start, 4)
    inference.check_input(images, recipe, str(cfg.model), size)
    notes = loaded.notes + notes
    views = cfg.get("views")  # views=all: each window has the recipe's count
    notes += inference.recipe_warnings(
        recipe, str(cfg.model), views=int(views) if str(views).isdigit() else None
    )
    _warn([note for note in notes if note not in shown])
    points = None
    if refine is not None and str(cfg.refine_init) in ("sfm", "auto"):  # before the forward pass
        points = _sfm_points(images, cfg, required=str(cfg.refine_init) == "sfm")
    if capture:
        return _run_capture(
            cfg, model, images, knobs, folder, notes, timings, loaded, device, started,
            refine, points, near=near, far=far, scene_scale=scale,
        )  # fmt: skip
    import warnings

    shape, views = images.images.shape[-2:], len(images.names)
    estimate = budget.forward_estimate(model, views, shape, device=str(device), name=str(cfg.model))
    budget.check(estimate)  # one line naming image_size when it cannot fit
    budget.announce(estimate)
    with budget.running(estimate), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = inference.reconstruct(
            model,
            images,
            fit_poses=int(cfg.fit_poses),
            backend=str(cfg.backend),
            fov=float(cfg.fov),
            name=str(cfg.model),
            near=near,
            far=far,
            scene_scale=scale,
            recipe=recipe,
            **knobs,
        )
    for note in result.warnings:
        print(f"warning: {note}", file=sys.stderr)
    notes += result.warnings
    for warning in caught:  # other warnings pass on as they came
        if " ".join(str(warning.message).split()) not in result.warnings:
            warnings.warn_explicit(
                warning.message, warning.category, warning.filename, warning.lineno
            )
    result.timings = {**timings, **result.timings}
    more: dict = {}
    fitted = None
    if refine is not None:  # per-scene refinement on every input photo
        photos, k, full = _refine_photos(cfg, model, images, refine, result.names)
        if not full and not all(p in ("given", "sfm") for p in result.placement):
            k = None  # predicted / placed cameras: the model's intrinsics, its crop
        start_set = None
        if points is not None:
            start_set = _points_start(points, result.frame.to_capture.inverse().points)
            start_set = _auto_start(cfg, result.gaussians, start_set, result, k, refine, photos)
        result, fitted = inference.refine_reconstruction(
            result,
            photos,
            refine,
            intrinsics=k,
            start=start_set,
            checkpoint_path=_checkpoint(cfg, output),
        )
        more["refine"] = _refine_record(cfg, refine, fitted, output)
        print(fitted.message, file=sys.stderr)
    inference.write_reconstruction(
        result,
        folder,
        frames=int(cfg.orbit_frames),
        fps=int(cfg.fps),
        backend=str(cfg.backend),
        summary={"weights": loaded.weights, "input": str(source), "warnings": notes, **more},
        started=started,
        formats=formats,
    )
    print(
        f"{output}: {result.count} Gaussians from {len(result.names)} view(s) with {cfg.model} "
        f"in {result.timings['total']:.1f} s on {device}"
    )
    _after_refine(cfg, output, fitted)
    return output


def _warn(notes: list[str]) -> list[str]:
    """Print ``notes`` as warnings on stderr; returns them."""
    for note in notes:
        print(f"warning: {note}", file=sys.stderr)
    return list(notes)


def _preflight_estimate(cfg: DictConfig, model, preflight, size, capture: bool, device):
    """The forward pass's estimate before structure-from-motion, from the photos it will pose:
    every photo in one pass, or one window (``views=N``: N of them, ``views=all``: the recipe's
    count, ``holdout=``: less the held-out photos). ``holdout=`` and ``center_view=`` are checked
    against the folder's photo names here. After SfM the posed photos are estimated again."""
    from models import budget
    from models.capture.holdout import holdout_indices
    from models.capture.views import center_index
    from models.capture.whole import window_size

    count, views, names = preflight.count, cfg.get("views"), preflight.names
    if capture:
        if names:  # a folder (a video's frames are not extracted yet)
            held = cfg.get("holdout")
            held = holdout_indices(to_plain(held) if OmegaConf.is_list(held) else held, names)
            count -= len(held)
            rest = [i for i in range(len(names)) if i not in held] or [0]
            center_index(names, cfg.get("center_view"), rest)
        if str(views) == "all":
            count = window_size(model, str(cfg.model))
        elif views is not None:
            count = min(int(views), count)
    name = str(cfg.model)
    return budget.forward_estimate(model, max(count, 1), size, device=str(device), name=name)


class RefineInterrupted(Exception):
    """Ctrl-C or SIGTERM during the refinement: the output holds what the fit had (exit status
    130 / 143, ``status``)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def _refine_settings(cfg: DictConfig):
    """``models.refine.RefineSettings`` from ``refine=`` / ``refine_time=`` / ``refine_size=`` /
    ``refine_max_gaussians=`` / ``refinement.*``, or ``None`` when neither budget is set."""
    steps, seconds = cfg.get("refine"), cfg.get("refine_time")
    init = str(cfg.get("refine_init") or "auto")
    from models.refine.start import START_RULES

    if init not in START_RULES:
        raise InferenceError(f"refine_init={init}", f"must be one of {', '.join(START_RULES)}")
    if not steps and seconds in (None, "", 0):
        if init != "auto":  # set, but nothing would use it
            raise InferenceError(
                f"refine_init={init}", "starts a refinement: add refine=N or refine_time=S"
            )
        return None
    from models.refine import settings_from_config

    settings = settings_from_config(
        refine=steps,
        refine_time=seconds,
        refine_size=cfg.get("refine_size"),
        refine_max_gaussians=cfg.get("refine_max_gaussians"),
        refinement=to_plain(cfg.refinement) if cfg.get("refinement") else {},
        backend=str(cfg.backend),
        seed=int(cfg.seed),
    )
    every = cfg.get("refine_checkpoint_every")
    if every is not None:
        if isinstance(every, bool) or not str(every).isdigit() or int(every) < 1:
            raise InferenceError(f"refine_checkpoint_every={every}", "must be a whole number >= 1")
        settings.checkpoint_every = int(every)
    return settings


def _sfm_points(images, cfg: DictConfig, required: bool = True):
    """``(xyz, rgb)`` of the capture's COLMAP / structure-from-motion points (its own frame) for
    ``refine_init=sfm`` (none: one line, exit status 2) or ``auto`` (none: ``None``)."""
    from datamodules.readers.colmap import read_colmap_points

    sfm = getattr(images, "sfm", None)
    cameras = cfg.get("cameras")
    if sfm is not None:
        where = Path(sfm.model_dir)
    elif cameras not in (None, "", "auto") and Path(str(cameras)).expanduser().is_dir():
        where = Path(str(cameras)).expanduser()
    else:
        where = Path(str(images.source))
    if images.extrinsics is None:
        if not required:
            return None
        raise InferenceError(where, "refine_init=sfm needs posed photos with their SfM points")
    try:
        return read_colmap_points(where, min_points=2)
    except InputError:
        if required:
            raise
        return None


def _points_start(points, move):
    """3DGS's start from SfM points ``(xyz, rgb)`` moved into the reconstruction's frame by
    ``move`` (``[N, 3] -> [N, 3]``)."""
    from models.refine import gaussians_from_points

    xyz, rgb = points
    return gaussians_from_points(move(xyz.double()).float(), rgb, sh_degree=3)


def _auto_start(cfg, feed_forward, points, recon, intrinsics, settings, photos):
    """``refine_init=auto``: the merged start (``models.refine.start.merged_start``, training
    cameras only); ``sfm``: the points."""
    from models.refine import fit_shape
    from models.refine.start import merged_start

    if str(cfg.refine_init) != "auto":
        return points
    k = recon.intrinsics if intrinsics is None else intrinsics
    shape = fit_shape(tuple(photos.shape[-2:]), settings.size)
    start, counts = merged_start(
        feed_forward.to("cpu"), points, recon.extrinsics.float().cpu(), k.float().cpu(), shape
    )
    print(
        f"refine_init=auto: {counts['sfm']} SfM points + {counts['feed_forward']} feed-forward "
        "Gaussians where the SfM cloud has gaps",
        file=sys.stderr,
    )
    return start


def _refine_photos(cfg: DictConfig, model, images, settings, names: list[str]):
    """The photos of ``names`` loaded again at the refinement's size, ``(photos, intrinsics,
    full)``: with the capture's own intrinsics (``full``) the whole photo at its aspect ratio and
    ``refine_size`` on the long side (default: its size, at most 320), else the model's crop
    at that size (``intrinsics`` then ``None``: the reconstruction's hold)."""
    import warnings

    from models.capture.inputs import load_inputs
    from models.refine import fit_shape

    full = images.intrinsics is not None and images.extrinsics is not None
    aspect = images.original_sizes[0] if full else tuple(images.images.shape[-2:])
    shape = fit_shape(tuple(int(v) for v in aspect), settings.size)
    source = Path(str(cfg.input)).expanduser()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        photos, _ = load_inputs(
            source,
            shape,
            model,
            name=str(cfg.model),
            views=_load_views(cfg, source, _capture_mode(cfg)),
            cameras=cfg.cameras,
            sfm=to_plain(cfg.sfm) if cfg.get("sfm") else {},
        )
    index = {n: i for i, n in enumerate(photos.names)}
    missing = [n for n in names if n not in index]
    if missing:
        raise InferenceError(source, f"{missing[0]} not found again at refine_size={settings.size}")
    pick = [index[n] for n in names]
    k = photos.intrinsics[pick].float() if full else None
    return photos.images[pick].float(), k, full


def _checkpoint(cfg: DictConfig, output: Path) -> Path | None:
    """``.<output name>.refine-checkpoint.pt`` beside the output (``refine_checkpoint_every``),
    never inside it: a rerun with the same output (``overwrite=true``) resumes from it; a
    finished fit removes it."""
    if cfg.get("refine_checkpoint_every") is None:
        return None
    out = output.expanduser().resolve()
    return out.with_name(f".{out.name}.refine-checkpoint.pt")


def _refine_record(cfg: DictConfig, settings, fitted, output: Path) -> dict:
    """``summary.json``'s ``refine``."""
    checkpoint = _checkpoint(cfg, output)
    return {
        **fitted.summary(),
        "init": str(cfg.refine_init),
        "checkpoint": str(checkpoint)
        if checkpoint is not None and fitted.stopped == "interrupted"
        else None,
        "settings": settings.to_dict(),
    }


def _after_refine(cfg: DictConfig, output: Path, fitted) -> None:
    """A finished fit removes its checkpoint; an interrupted one keeps it and raises
    :class:`RefineInterrupted` (the output is written: exit status 130, or 143 for SIGTERM)."""
    if fitted is None:
        return
    checkpoint = _checkpoint(cfg, output)
    if fitted.stopped == "interrupted":
        where = f"; rerun with overwrite=true to resume from {checkpoint}" if checkpoint else ""
        raise RefineInterrupted(
            f"{output}: refinement interrupted by {fitted.interrupted_by} at step "
            f"{fitted.steps}; wrote what it had{where}",
            143 if fitted.interrupted_by == "SIGTERM" else 130,
        )
    if checkpoint is not None:
        checkpoint.unlink(missing_ok=True)


def _capture_mode(cfg: DictConfig) -> bool:
    """``views=N`` / ``views=all`` / ``center_view=`` / ``holdout=``: the photos are planned into
    windows (``models.capture.whole``); none of them: every photo in one pass, as before."""
    return any(cfg.get(k) not in (None, "") for k in ("views", "center_view", "holdout"))


def _load_views(cfg: DictConfig, source: Path, capture: bool) -> int | None:
    """Views ``load_inputs`` reads: a video's sampled frames (``views=N``; ``all``: the default
    8); a folder: all of its photos when they are planned into windows, else at most ``views``."""
    from datamodules.readers.image_folder import VIDEO_EXTENSIONS

    views = cfg.get("views")
    if views is None or str(views) == "all":
        return None
    video = source.is_file() and source.suffix.lower() in VIDEO_EXTENSIONS
    return int(views) if video or not capture else None


def _run_capture(
    cfg,
    model,
    images,
    knobs,
    folder,
    notes,
    timings,
    loaded,
    device,
    started,
    refine,
    points,
    **overrides,
):
    """``views=N|all`` / ``center_view`` / ``holdout``: plan, estimate (refused when it cannot
    fit), reconstruct every window, fuse, score the held-out photos and write; ``overrides``:
    ``near``, ``far``, ``scene_scale`` for every window."""
    from models import budget
    from models.capture.whole import (
        capture_estimate,
        plan_capture,
        print_holdout,
        reconstruct_capture,
        write_capture,
    )

    plan = plan_capture(
        images,
        model,
        views=cfg.get("views"),
        center_view=cfg.get("center_view"),
        holdout=to_plain(cfg.holdout)
        if OmegaConf.is_list(cfg.get("holdout"))
        else cfg.get("holdout"),
        name=str(cfg.model),
    )
    for note in plan.notes:
        print(f"warning: {note}", file=sys.stderr)
    estimate = capture_estimate(model, plan, device)
    budget.check(estimate)  # one line naming image_size when one window cannot fit
    budget.announce(estimate, force=len(plan.windows) > 1)
    knobs = dict(knobs)
    capture = reconstruct_capture(
        model,
        plan,
        fit_poses=int(cfg.fit_poses),
        backend=str(cfg.backend),
        fov=float(cfg.fov),
        fusion_max_gaussians=cfg.get("fusion_max_gaussians"),
        **overrides,
        **knobs,
    )
    later = [n for n in capture.notes if n not in plan.notes]
    for note in later:
        print(f"warning: {note}", file=sys.stderr)
    output = Path(str(cfg.output)).expanduser()
    fitted = plot = None
    if refine is not None:
        capture, fitted, plot = _refine_capture(cfg, model, images, capture, refine, points)
    result = capture.reconstruction
    result.timings = {**timings, **result.timings}
    write_capture(
        capture,
        folder,
        frames=int(cfg.orbit_frames),
        fps=int(cfg.fps),
        backend=str(cfg.backend),
        summary={
            "weights": loaded.weights,
            "input": str(Path(str(cfg.input)).expanduser()),
            "warnings": notes + capture.notes,
        },
        started=started,
        formats=parse_formats(cfg.get("formats")),
        extra=plot,
    )
    print_holdout(capture)
    if fitted is not None and "holdout" in capture.summary:
        mean, size = capture.summary["holdout"]["mean"], capture.summary["holdout"]["image_size"]
        print(
            f"held-out PSNR {mean['psnr_before_refine']:.2f} dB before refinement -> "
            f"{mean['psnr']:.2f} dB after {fitted.steps} steps ({fitted.seconds / 60:.1f} min); "
            f"nearest view {mean['nearest_view_psnr']:.2f} dB; scored at {size[1]}x{size[0]}"
        )
    print(
        f"{cfg.output}: {result.count} Gaussians from {len(result.names)} view(s) in "
        f"{len(plan.windows)} window(s) with {cfg.model} in {result.timings['total']:.1f} s on "
        f"{device}"
    )
    _after_refine(cfg, output, fitted)
    return output


def _refine_capture(cfg, model, images, capture, settings, points):
    """The fused scene refined on its non-held-out photos; the held-out photos scored before and
    after at the refinement's size (``holdout.image_size``, the nearest-view baseline too).
    Returns ``(capture, RefineResult, extra)``; ``extra(staging)`` writes ``refine_psnr.png``."""
    import dataclasses

    import torch

    from models import inference
    from models.capture import fusion
    from models.capture import holdout as holdout_lib
    from models.refine import plot_holdout_psnr

    recon = capture.reconstruction
    plan = capture.plan
    held_names = list(capture.holdout_views.names) if capture.holdout_views is not None else []
    photos, k, full = _refine_photos(cfg, model, images, settings, recon.names + held_names)
    used = len(recon.names)
    train_k = k[:used] if full else None
    views = None
    if held_names:
        hv = capture.holdout_views
        every_e = torch.cat([recon.extrinsics.float(), hv.extrinsics.float()])
        every_k = k if full else torch.cat([recon.intrinsics.float(), hv.intrinsics.float()])
        count = len(recon.names) + len(held_names)
        views = holdout_lib.holdout_views(
            recon.names + held_names,
            photos,
            every_e,
            every_k,
            list(range(used, count)),
            list(range(used)),
        )
    start = None
    if points is not None:
        _, move = fusion.capture_frame(images.extrinsics[plan.used])
        start = _points_start(points, move.points)
        start = _auto_start(cfg, recon.gaussians, start, recon, train_k, settings, photos[:used])
    backend = str(cfg.backend)
    before = None
    if views is not None:
        before = holdout_lib.score_holdout(recon.gaussians, views, backend=backend)
    refined, fitted = inference.refine_reconstruction(
        recon,
        photos[:used],
        settings,
        intrinsics=train_k,
        holdout=views,
        start=start,
        checkpoint_path=_checkpoint(cfg, Path(str(cfg.output)).expanduser()),
    )
    print(fitted.message, file=sys.stderr)
    summary = dict(capture.summary)
    record = _refine_record(cfg, settings, fitted, Path(str(cfg.output)).expanduser())
    scores = None
    if views is not None:
        scores = holdout_lib.score_holdout(refined.gaussians, views, backend=backend)
        if "holdout" in summary:  # the feed-forward scores at the model's input size
            record["holdout_mean_at_input_size"] = summary["holdout"]["mean"]
        table = holdout_lib.holdout_summary(views, scores, before=before)
        for name, entry in table["metrics"].items():
            entry["ssim_before_refine"] = before.metrics[name]["ssim"]
        table["mean"]["ssim_before_refine"] = before.mean["ssim"]
        table["scored_at"] = (
            "the refinement's size: before (feed-forward), after (refined) and the nearest view"
        )
        summary["holdout"] = table
    summary["refine"] = record
    capture = dataclasses.replace(
        capture, reconstruction=refined, holdout_views=views, holdout_scores=scores,
        summary=summary,
    )  # fmt: skip
    baseline = summary["holdout"]["mean"]["nearest_view_psnr"] if views is not None else None

    def extra(staging: Path) -> None:
        if fitted.evaluations:
            plot_holdout_psnr(fitted.evaluations, baseline, staging / "refine_psnr.png")

    return capture, fitted, extra


def run_cli(cfg: DictConfig) -> int:
    """``run`` with bad input reported as one line on stderr; returns the exit status (0 or 2)."""
    try:
        output = run(cfg)
    except InputError as error:
        print(f"error: {' '.join(str(error).split())}", file=sys.stderr)
        return 2
    except RefineInterrupted as stopped:
        print(str(stopped), file=sys.stderr)
        return stopped.status
    if cfg.get("view"):  # the viewer on the result (view.py), until Ctrl-C
        from view import serve_cli

        return serve_cli([str(output), f"device={cfg.device}"])
    return 0


def compose(overrides: list[str]) -> DictConfig:
    """The configuration for command-line ``overrides`` (Hydra's compose API), for running
    ``run_cli`` from Python."""
    from hydra import compose as hydra_compose
    from hydra import initialize

    with initialize(version_base="1.3", config_path=None, job_name="infer"):
        return hydra_compose(config_name="infer", overrides=arguments(overrides))


@hydra.main(version_base="1.3", config_path=None, config_name="infer")
def main(cfg: DictConfig) -> None:
    """Hydra entry point: bad input → one line on stderr, exit status 2."""
    status = run_cli(cfg)
    if status:
        sys.exit(status)


def help_text() -> str:
    """``--help``: the usage and every setting of ``configs/infer.yaml`` with its explanation."""
    return config_help(
        CONFIG,
        (
            "??? marks a required setting. Paths may hold any character (quote them for your "
            "shell).",
            "Models: python -c 'import models; print(models.list_models(pretrained=True))'",
        ),
    )


if __name__ == "__main__":
    if any(arg in ("-h", "--help") for arg in sys.argv[1:]):
        print(help_text())
        sys.exit(0)
    with stopped_cleanly("infer.py"):
        try:
            sys.argv[1:] = arguments(sys.argv[1:])
        except InputError as error:
            print(f"error: {' '.join(str(error).split())}", file=sys.stderr)
            sys.exit(2)
        main()
