"""``infer.py``'s work, from typed settings (:class:`~models.pipeline.settings.InferConfig`):
check every setting, load the model and the inputs, reconstruct (every photo in one pass, or
planned windows fused into one set), refine, score the held-out photos and write the output
folder atomically. ``Pipeline(settings).run()`` is what ``infer.py`` runs.
"""

from __future__ import annotations

import dataclasses
import sys
import time
import warnings
from pathlib import Path

import torch

from datamodules.errors import InputError
from datamodules.readers.colmap import read_colmap_points
from datamodules.readers.image_folder import VIDEO_EXTENSIONS
from models.core import budget
from models.core.command_line import check_values
from models.pipeline import inference
from models.pipeline.capture import fusion
from models.pipeline.capture import holdout as holdout_lib
from models.pipeline.capture.holdout import holdout_indices
from models.pipeline.capture.inputs import load_inputs, needs_sfm, sfm_preflight
from models.pipeline.capture.views import center_index
from models.pipeline.capture.whole import (
    capture_estimate,
    plan_capture,
    print_holdout,
    reconstruct_capture,
    window_size,
    write_capture,
)
from models.pipeline.inference import InferenceError, check_knobs
from models.pipeline.refine import fit_shape, gaussians_from_points, plot_holdout_psnr
from models.pipeline.refine.stage import refine_checkpoint_path
from models.pipeline.refine.start import merged_start
from models.pipeline.refinement import (
    check_fit_memory,
    holdout_table,
    photo_shape,
    refine_settings,
)
from models.pipeline.settings import InferConfig
from models.splat_formats import parse_formats
from models.weights.knobs import declared_knob_names

__all__ = [
    "Loaded",
    "Pipeline",
    "RefineInterrupted",
    "forward_kwargs",
    "load_stage",
    "settings_from",
]


def settings_from(config) -> InferConfig:
    """Typed settings from a composed configuration (Hydra's ``DictConfig`` of
    :class:`InferConfig`, or an ``InferConfig``), every value checked against its rule.

    Raises:
        SettingError: one line naming ``key=value``.
    """
    if not isinstance(config, InferConfig):
        from omegaconf import OmegaConf

        if any(OmegaConf.is_missing(config, k) or not config[k] for k in ("input", "output")):
            raise InferenceError(
                "infer.py", "usage: python infer.py input=PATH output=DIR [model=NAME]"
            )
        config = OmegaConf.to_object(config)
    check_values(dataclasses.asdict(config), InferConfig)
    return config


def forward_kwargs(model, settings) -> dict:
    """The knobs set in ``settings`` (any family's declared knob name), checked against
    ``model``'s declarations (``models.weights.knobs``); a knob the family lacks is refused by name."""
    get = settings.get if hasattr(settings, "get") else lambda k: getattr(settings, k, None)
    knobs = {k: get(k) for k in declared_knob_names()}
    return check_knobs(model, {k: v for k, v in knobs.items() if v is not None}, str(get("model")))


@dataclasses.dataclass
class Loaded:
    """What the load stage hands on: the model, its knobs and recipe, the inputs at the model's
    input size, the warnings (``shown``: those printed already) and the timings."""

    model: object
    weights: object
    knobs: dict
    recipe: object
    images: object
    notes: list
    timings: dict
    points: object = None
    shown: list = dataclasses.field(default_factory=list)


def load_stage(
    source: Path,
    name: str,
    weights,
    device,
    image_size,
    *,
    views: int | None,
    cameras,
    sfm: dict,
    knobs=None,
    estimate=None,
    pick=None,
    fit_shape_of=None,
) -> Loaded:
    """Load the model ``name`` and the inputs in ``source`` at its input size (``infer.py`` and
    ``view.py`` alike). Every check that needs the model runs before structure-from-motion:
    ``knobs(model) -> dict`` (the forward knobs, checked), the forward pass's memory
    (``estimate(model, preflight, size)``, default: ``views`` or every photo at once).
    ``pick(images)`` keeps some of the photos (``view.py`` on an ``infer.py`` folder).
    ``fit_shape_of(images) -> (H, W)``: the same photos at a refinement's size too, from the same
    read (``ImageSet.fit``, :func:`refine_shape`)."""
    start = time.perf_counter()
    loaded = inference.load_for_inference(name, weights, device)
    timings = {"load_model": round(time.perf_counter() - start, 4)}
    model = loaded.model
    forward = knobs(model) if knobs is not None else {}
    recipe = inference.model_recipe(model)
    size = inference.input_size(model, image_size, recipe)
    shown = _warn(loaded.notes)  # the weights' notes now, not after the inputs load
    if needs_sfm(source, model, cameras):  # minutes of SfM: every other check first
        preflight = sfm_preflight(source, views, sfm)
        shown += _warn(preflight.notes)
        if estimate is None:
            count = preflight.count if views is None else min(views, preflight.count)
            work = budget.forward_estimate(
                model, max(count, 1), size, device=str(device), name=name
            )
        else:
            work = estimate(model, preflight, size)
        budget.check(work)
    start = time.perf_counter()
    images, notes = load_inputs(
        source, size, model, name=name, views=views, cameras=cameras, sfm=sfm,
        fit_shape_of=fit_shape_of,
    )  # fmt: skip
    timings["load_inputs"] = round(time.perf_counter() - start, 4)
    if pick is not None:
        images = pick(images)
    inference.check_input(images, recipe, name, size)
    notes = loaded.notes + notes
    return Loaded(model, loaded.weights, forward, recipe, images, notes, timings, shown=shown)


class Pipeline:
    """``infer.py``: ``Pipeline(settings).run()`` checks every setting (before any work: the
    output folder, the refinement's memory), loads the model and the inputs, reconstructs
    (:func:`forward_all` or :func:`forward_capture`), refines and writes."""

    def __init__(self, settings: InferConfig) -> None:
        self.s = settings_from(settings)
        self.started = time.perf_counter()
        self.output = Path(self.s.output).expanduser()
        self.source = Path(self.s.input).expanduser()
        self.refine = None
        self.capture = False

    def plan(self):
        """Every check that needs no model: the input, the output folder, the refinement
        (settings and memory). Returns the (staged, not yet created) output folder."""
        s, source = self.s, self.source
        if not source.exists():
            raise InferenceError(source, "input not found")
        inputs = [source] + [
            Path(str(value)).expanduser()
            for value in (s.cameras, s.weights)
            if value not in (None, "", True, "auto") and ":" not in str(value)[:10]
        ]
        folder = inference.output_folder(self.output, inputs, s.overwrite)  # checked now
        self.refine = refine_settings(dataclasses.asdict(s), s.backend, s.seed)
        self.capture = _capture_mode(s)  # views=N|all, center_view=, holdout=
        self.device = inference.choose_device(s.device)
        inference.check_backend(s.backend, self.device)
        if self.refine is not None:  # before the model, SfM and the forward pass
            shape, photos = photo_shape(source)
            check_fit_memory(self.refine, shape, photos, str(self.device))
        return folder

    def load(self) -> Loaded:
        """The model (its knobs and recipe checked) and the inputs at its input size."""
        s = self.s
        torch.manual_seed(s.seed)
        loaded = load_stage(
            self.source, s.model, s.weights, self.device, s.image_size,
            views=_load_views(s, self.source, self.capture), cameras=s.cameras,
            sfm=dataclasses.asdict(s.sfm), knobs=lambda model: forward_kwargs(model, s),
            estimate=lambda model, preflight, size: _preflight_estimate(
                s, model, preflight, size, self.capture, self.device
            ),
            fit_shape_of=None if self.refine is None else self._refine_shape,
        )  # fmt: skip
        views = s.views  # views=all: each window has the recipe's count
        more = inference.recipe_warnings(
            loaded.recipe, s.model, views=int(views) if str(views).isdigit() else None
        )
        loaded.notes += more
        _warn([note for note in loaded.notes if note not in loaded.shown])
        if self.refine is not None and s.refine_init in ("sfm", "auto"):  # before the forward
            loaded.points = _sfm_points(loaded.images, s, required=s.refine_init == "sfm")
        return loaded

    def _refine_shape(self, images) -> tuple[int, int]:
        return refine_shape(images, self.refine.size)

    def run(self) -> Path:
        """Plan, load, reconstruct, refine, write; returns the output folder."""
        folder = self.plan()
        loaded = self.load()
        if self.capture:
            return _run_capture(self, loaded, folder)
        return _run_all(self, loaded, folder)


def _forward_options(s: InferConfig, loaded: Loaded) -> dict:
    """The forward's settings every window shares: pose fitting, renderer, field of view, the
    recipe's overrides and the family's knobs."""
    return {
        "pose_fit_steps": s.pose_fit_steps,
        "pose_fit_size": s.pose_fit_size,
        "backend": s.backend,
        "fov": s.fov,
        "near": s.near,
        "far": s.far,
        "scene_scale": s.scene_scale,
        **loaded.knobs,
    }


def forward_all(pipeline: Pipeline, loaded: Loaded):
    """Every photo in one forward pass (estimated first: refused when it cannot fit)."""
    s, device, model = pipeline.s, pipeline.device, loaded.model
    images = loaded.images
    shape, views = images.images.shape[-2:], len(images.names)
    estimate = budget.forward_estimate(model, views, shape, device=str(device), name=s.model)
    budget.check(estimate)  # one line naming image_size when it cannot fit
    budget.announce(estimate)
    with budget.running(estimate), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = inference.reconstruct(
            model,
            images,
            name=s.model,
            recipe=loaded.recipe,
            **_forward_options(s, loaded),
        )
    _warn(result.warnings)
    for warning in caught:  # other warnings pass on as they came
        if " ".join(str(warning.message).split()) not in result.warnings:
            warnings.warn_explicit(
                warning.message, warning.category, warning.filename, warning.lineno
            )
    result.timings = {**loaded.timings, **result.timings}
    return result


def _run_all(pipeline: Pipeline, loaded: Loaded, folder) -> Path:
    """Every photo in one pass, refined on all of them, written."""
    s, output = pipeline.s, pipeline.output
    result = forward_all(pipeline, loaded)
    notes = loaded.notes + result.warnings
    more: dict = {}
    fitted = None
    if pipeline.refine is not None:  # per-scene refinement on every input photo
        result, fitted, _, _ = refine_stage(
            pipeline, loaded, result, result.frame.to_capture.inverse().points
        )
        more["refine"] = _refine_record(s, pipeline.refine, fitted, output)
    inference.write_reconstruction(
        result,
        folder,
        frames=s.orbit_frames,
        fps=s.fps,
        backend=s.backend,
        summary={
            "weights": loaded.weights, "input": str(pipeline.source), "warnings": notes, **more,
        },
        started=pipeline.started,
        formats=parse_formats(s.formats),
    )  # fmt: skip
    print(
        f"{output}: {result.count} Gaussians from {len(result.names)} view(s) with {s.model} "
        f"in {result.timings['total']:.1f} s on {pipeline.device}"
    )
    _after_refine(s, output, fitted)
    return output


def _warn(notes: list[str]) -> list[str]:
    """Print ``notes`` as warnings on stderr; returns them."""
    for note in notes:
        print(f"warning: {note}", file=sys.stderr)
    return list(notes)


def _preflight_estimate(s: InferConfig, model, preflight, size, capture: bool, device):
    """The forward pass's estimate before structure-from-motion, from the photos it will pose:
    every photo in one pass, or one window (``views=N``: N of them, ``views=all``: the recipe's
    count, ``holdout=``: less the held-out photos). ``holdout=`` and ``center_view=`` are checked
    against the folder's photo names here. After SfM the posed photos are estimated again."""
    count, views, names = preflight.count, s.views, preflight.names
    if capture:
        if names:  # a folder (a video's frames are not extracted yet)
            held = s.holdout
            held = holdout_indices(held, names)
            count -= len(held)
            rest = [i for i in range(len(names)) if i not in held] or [0]
            center_index(names, s.center_view, rest)
        if str(views) == "all":
            count = window_size(model, s.model)
        elif views is not None:
            count = min(int(views), count)
    name = s.model
    return budget.forward_estimate(model, max(count, 1), size, device=str(device), name=name)


class RefineInterrupted(Exception):
    """Ctrl-C or SIGTERM during the refinement: the output holds what the fit had (exit status
    130 / 143, ``status``)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def _sfm_points(images, s: InferConfig, required: bool = True):
    """``(xyz, rgb)`` of the capture's COLMAP / structure-from-motion points (its own frame) for
    ``refine_init=sfm`` (none: one line, exit status 2) or ``auto`` (none: ``None``)."""
    sfm = getattr(images, "sfm", None)
    cameras = s.cameras
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
    except InputError as error:
        if required:
            raise InferenceError(
                error.path, f"{error.message}: refine_init=sfm needs them"
            ) from None
        return None


def _points_start(points, move):
    """3DGS's start from SfM points ``(xyz, rgb)`` moved into the reconstruction's frame by
    ``move`` (``[N, 3] -> [N, 3]``)."""
    xyz, rgb = points
    return gaussians_from_points(move(xyz.double()).float(), rgb, sh_degree=3)


def refine_shape(images, size: int | None) -> tuple[int, int]:
    """``(H, W)`` the per-scene fit reads its photos at (``images`` at the model's input size):
    with the capture's own intrinsics the whole photo at its aspect ratio and ``size`` on the long
    side (default: its size, at most 320), else the model's crop at that size."""
    full = images.intrinsics is not None and images.extrinsics is not None
    aspect = images.original_sizes[0] if full else tuple(images.images.shape[-2:])
    return fit_shape(tuple(int(v) for v in aspect), size)


def _refine_photos(images, names: list[str]):
    """The photos of ``names`` at the refinement's size, ``(photos, intrinsics, full)``: read
    with the model's inputs (``images.fit``, :func:`refine_shape`), with the capture's own
    intrinsics (``full``) or the model's crop (``intrinsics`` then ``None``: the
    reconstruction's hold)."""
    full = images.intrinsics is not None and images.extrinsics is not None
    photos = images.fit
    index = {n: i for i, n in enumerate(photos.names)}
    pick = [index[n] for n in names]
    k = photos.intrinsics[pick].float() if full else None
    return photos.images[pick].float(), k, full


def _checkpoint(s: InferConfig, output: Path) -> Path | None:
    """The fit's checkpoint (``models.pipeline.refine.stage.refine_checkpoint_path``) when
    ``refine_checkpoint_every`` is set, else ``None``."""
    if s.refine_checkpoint_every is None:
        return None
    return refine_checkpoint_path(output)


def _refine_record(s: InferConfig, settings, fitted, output: Path) -> dict:
    """``summary.json``'s ``refine``."""
    checkpoint = _checkpoint(s, output)
    return {
        **fitted.summary(),
        "init": s.refine_init,
        "refine_max_gaussians": settings.max_gaussians,
        "checkpoint": str(checkpoint)
        if checkpoint is not None and fitted.stopped == "interrupted"
        else None,
        "settings": settings.to_dict(),
    }


def _after_refine(s: InferConfig, output: Path, fitted) -> None:
    """A finished fit removes its checkpoint; an interrupted one keeps it and raises
    :class:`RefineInterrupted` (the output is written: exit status 130, or 143 for SIGTERM)."""
    if fitted is None:
        return
    checkpoint = _checkpoint(s, output)
    if fitted.stopped == "interrupted":
        where = f"; rerun with overwrite=true to resume from {checkpoint}" if checkpoint else ""
        raise RefineInterrupted(
            f"{output}: refinement interrupted by {fitted.interrupted_by} at step "
            f"{fitted.steps}; wrote what it had{where}",
            143 if fitted.interrupted_by == "SIGTERM" else 130,
        )
    if checkpoint is not None:
        checkpoint.unlink(missing_ok=True)


def _capture_mode(s: InferConfig) -> bool:
    """``views=N`` / ``views=all`` / ``center_view=`` / ``holdout=``: the photos are planned into
    windows (``models.pipeline.capture.whole``); none of them: every photo in one pass, as before."""
    return any(getattr(s, k) not in (None, "") for k in ("views", "center_view", "holdout"))


def _load_views(s: InferConfig, source: Path, capture: bool) -> int | None:
    """Views ``load_inputs`` reads: a video's sampled frames (``views=N``; ``all``: the default
    8); a folder: all of its photos when they are planned into windows, else at most ``views``."""
    views = s.views
    if views is None or str(views) == "all":
        return None
    video = source.is_file() and source.suffix.lower() in VIDEO_EXTENSIONS
    return int(views) if video or not capture else None


def forward_capture(pipeline: Pipeline, loaded: Loaded):
    """``views=N|all`` / ``center_view`` / ``holdout``: plan the windows, estimate (refused when
    one cannot fit), reconstruct every window and fuse them (``models.pipeline.capture.whole``)."""
    s, model = pipeline.s, loaded.model
    plan = plan_capture(
        loaded.images, model, views=s.views, center_view=s.center_view, holdout=s.holdout,
        name=s.model,
    )  # fmt: skip
    _warn(plan.notes)
    estimate = capture_estimate(model, plan, pipeline.device)
    budget.check(estimate)  # one line naming image_size when one window cannot fit
    if len(plan.windows) == 1:  # several: timed on their first windows (reconstruct_capture)
        budget.announce(estimate)
    capture = reconstruct_capture(
        model,
        plan,
        fusion_max_gaussians=s.fusion_max_gaussians,
        **_forward_options(s, loaded),
    )
    _warn([n for n in capture.notes if n not in plan.notes])
    return capture


def _run_capture(pipeline: Pipeline, loaded: Loaded, folder) -> Path:
    """The planned windows fused, refined, scored on the held-out photos and written."""
    s, output = pipeline.s, pipeline.output
    capture = forward_capture(pipeline, loaded)
    plan, notes = capture.plan, loaded.notes
    fitted = plot = None
    if pipeline.refine is not None:
        capture, fitted, plot = _refine_capture(pipeline, loaded, capture)
    result = capture.reconstruction
    result.timings = {**loaded.timings, **result.timings}
    write_capture(
        capture,
        folder,
        frames=s.orbit_frames,
        fps=s.fps,
        backend=s.backend,
        summary={
            "weights": loaded.weights,
            "input": str(pipeline.source),
            "warnings": notes + capture.notes,
        },
        started=pipeline.started,
        formats=parse_formats(s.formats),
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
        f"{s.output}: {result.count} Gaussians from {len(result.names)} view(s) in "
        f"{len(plan.windows)} window(s) with {s.model} in {result.timings['total']:.1f} s on "
        f"{pipeline.device}"
    )
    _after_refine(s, output, fitted)
    return output


def refine_stage(pipeline: Pipeline, loaded: Loaded, recon, to_scene, held=None):
    """The one place ``infer.py`` starts a refinement: ``recon`` (a ``Reconstruction``) fitted
    on its photos read at ``refine_size`` (``_refine_photos``), from the feed-forward set or the
    SfM points moved into its frame by ``to_scene``; ``held`` (``HoldoutViews`` at the model's
    size) are read at the fit's size too and scored before the fit. Returns ``(refined,
    RefineResult, held-out views at the fit's size or None, their scores before or None)``."""
    s, settings = pipeline.s, pipeline.refine
    held_names = list(held.names) if held is not None else []
    names = recon.names + held_names
    photos, k, full = _refine_photos(loaded.images, names)
    used = len(recon.names)
    views = before = None
    if held_names:
        every_e = torch.cat([recon.extrinsics.float(), held.extrinsics.float()])
        every_k = k if full else torch.cat([recon.intrinsics.float(), held.intrinsics.float()])
        held_at, inputs = list(range(used, len(names))), list(range(used))
        views = holdout_lib.holdout_views(names, photos, every_e, every_k, held_at, inputs)
        before = holdout_lib.score_holdout(recon.gaussians, views, backend=s.backend)
    start, keep = None, 0
    if loaded.points is not None:
        start = _points_start(loaded.points, to_scene)
        keep = int(start.count()[0])  # never pruned below the SfM points (sfm and auto)
        if s.refine_init == "auto":
            start = _auto_start(recon, start, k[:used] if full else None, settings, photos[:used])
    refined, fitted = inference.refine_reconstruction(
        recon,
        photos[:used],
        settings,
        intrinsics=k[:used] if full else None,  # else the model's intrinsics, its crop
        holdout=views,
        start=start,
        checkpoint_path=_checkpoint(s, pipeline.output),
        keep=keep,
    )
    print(fitted.message, file=sys.stderr)
    return refined, fitted, views, before


def _auto_start(recon, points, intrinsics, settings, photos):
    """``refine_init=auto``: the merged start (``models.pipeline.refine.start.merged_start``: the SfM
    points plus the feed-forward Gaussians where the SfM cloud has gaps; training cameras
    only, never a held-out photo)."""
    k = recon.intrinsics if intrinsics is None else intrinsics
    shape = fit_shape(tuple(photos.shape[-2:]), settings.size)
    start, counts = merged_start(
        recon.gaussians.to("cpu"), points, recon.extrinsics.float().cpu(), k.float().cpu(), shape
    )
    print(
        f"refine_init=auto: {counts['sfm']} SfM points + {counts['feed_forward']} feed-forward "
        "Gaussians where the SfM cloud has gaps"
        + (
            f" ({counts['off_depth']} more left out: not confirmed at the points' depth)"
            if counts.get("off_depth")
            else ""
        ),
        file=sys.stderr,
    )
    return start


def _refine_capture(pipeline: Pipeline, loaded: Loaded, capture):
    """The fused scene refined on its non-held-out photos; the held-out photos scored before and
    after at the refinement's size (``holdout.image_size``, the nearest-view baseline too).
    Returns ``(capture, RefineResult, extra)``; ``extra(staging)`` writes ``refine_psnr.png``."""
    s, settings, recon = pipeline.s, pipeline.refine, capture.reconstruction
    to_scene = None
    if loaded.points is not None:  # refine_init=sfm: the points into the fused set's frame
        to_scene = fusion.capture_frame(loaded.images.extrinsics[capture.plan.used])[1].points
    refined, fitted, views, before = refine_stage(
        pipeline, loaded, recon, to_scene, capture.holdout_views
    )
    backend = s.backend
    summary = dict(capture.summary)
    record = _refine_record(s, settings, fitted, Path(s.output).expanduser())
    scores = placed = None
    placed_before = summary.get("holdout", {}).get("cameras")
    if views is not None and placed_before is not None:  # fitted cameras (no poses): again
        views, placed = holdout_lib.refit_holdout_cameras(
            refined.gaussians, views, refined.names, refined.extrinsics, backend=backend
        )
    if views is not None:
        scores = holdout_lib.score_holdout(refined.gaussians, views, backend=backend)
        if "holdout" in summary:  # the feed-forward scores at the model's input size
            record["holdout_mean_at_input_size"] = summary["holdout"]["mean"]
        table = holdout_table(views, before, scores)
        table["scored_at"] = (
            "the refinement's size: before (feed-forward), after (refined) and the nearest view"
        )
        if placed is not None:
            table["cameras"], table["cameras_before_refine"] = placed, placed_before
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
        if views is not None:  # the feed-forward scene at the held-out cameras, before the fit
            holdout_lib.save_holdout_renders(
                views.names, before.renders, staging / "renders" / "holdout_before"
            )

    return capture, fitted, extra
