"""``view.py``'s work: the Gaussians to show for a ``.ply``, an ``infer.py`` output folder or
photos reconstructed here with a model's knobs live (:func:`build`), the photos' reconstruction
(:func:`live_scene`, through ``models.pipeline.inference`` and ``models.pipeline.capture.inputs`` as ``infer.py``)
and its refinement (``refine=N`` / ``refine_time=S``, checked by
:mod:`models.pipeline.refinement` as every command checks them).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from models.core import budget
from models.core.gaussians import transform_gaussians
from models.core.output_folder import OutputFile, free_file_name
from models.core.pixels import image_to_uint8
from models.pipeline import inference
from models.pipeline.capture.whole import subset
from models.pipeline.refinement import refine_settings
from models.pipeline.run import load_stage
from models.splat_formats import is_splat_file
from models.view.server import (
    SplatViewer,
    ViewCamera,
    ViewerError,
    ViewScene,
    check_port,
    load_view_scene,
)
from models.weights.knobs import KnobRunner, declared_knob_names

__all__ = ["build", "live_scene", "settings_from_summary"]

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_SAVE = "gaussians_view.ply"  # save= unless given


def live_scene(source: Path, settings: dict[str, Any]):
    """Load ``settings['model']`` and the photos in ``source`` (as ``infer.py`` does, through
    ``models.pipeline.inference`` and ``models.pipeline.capture.inputs``); returns ``(ViewScene, KnobRunner, initial
    knob values)``."""
    name = str(settings["model"])
    device = inference.choose_device(settings["device"])
    numbers = {}
    for key in ("near", "far", "scene_scale"):
        try:
            numbers[key] = None if settings[key] is None else float(settings[key])
        except (TypeError, ValueError):
            raise inference.InferenceError(f"{key}={settings[key]}", "must be a number") from None
    wanted_names = set(settings.get("view_names") or ())

    def pick(images):  # an infer.py views=N output: the photos it chose
        wanted = [i for i, n in enumerate(images.names) if n in wanted_names]
        return subset(images, wanted) if wanted else images

    loaded = load_stage(
        source, name, settings["weights"], device, settings["image_size"],
        views=int(settings["views"]) if settings["views"] is not None else None,
        cameras=settings["cameras"], sfm={}, pick=pick if wanted_names else None,
    )  # fmt: skip
    model, recipe, images = loaded.model, loaded.recipe, loaded.images
    window = inference.window_input(  # the recipe's near/far and scale, as infer.py
        model,
        images,
        fov=float(settings["fov"]),
        name=name,
        near=numbers["near"],
        far=numbers["far"],
        scene_scale=numbers["scene_scale"],
        recipe=recipe,
    )
    for note in loaded.notes + window.warnings:
        if note not in loaded.shown:
            print(f"warning: {note}", file=sys.stderr)
    shape, views = images.images.shape[-2:], len(images)
    estimate = budget.forward_estimate(model, views, shape, device=str(device), name=name)
    budget.check(estimate)  # one line naming image_size when it cannot fit
    budget.announce(estimate)
    frame = window.prepared.frame  # the viewer shows the capture's own frame, as infer.py writes
    runner = KnobRunner(
        model, window.context, transform=lambda g: transform_gaussians(g, frame.to_capture)
    )
    initial = {k: settings[k] for k in declared_knob_names() if settings[k] is not None}
    gaussians = _first_forward(runner, initial, name, source)
    # the forward's views placed as infer.py places them (no pose fit: the viewer starts at once)
    placed = inference.window_reconstruction(
        model, window, runner.output, inference.place_views(window, runner.output)
    )
    path_e, _, _ = inference.camera_path(placed, 30)  # infer.py's: interpolated, or an orbit
    path = frame.to_capture.cameras(path_e.double().cpu()).numpy()
    if settings.get("refine") or settings.get("refine_time"):
        gaussians = _refined(placed, images, settings, frame)
    cameras = _view_cameras(placed, images)
    scene = ViewScene(gaussians, cameras, path, title=f"{source.name} · {name}")
    return scene, runner, initial


def _first_forward(runner: KnobRunner, initial: dict[str, Any], name: str, source: Path):
    """The Gaussians of the first forward with the knobs given on the command line."""
    for key in initial:
        if key not in runner.knobs:
            raise inference.InferenceError(
                f"{key}={initial[key]}",
                f"model {name} has no {key!r} knob (knobs: {', '.join(runner.knobs)})",
            )
    try:
        gaussians = runner.run(**initial)
    except ValueError as error:  # a knob value out of range (Knob.check names it)
        raise inference.InferenceError("view.py", str(error)) from error
    if int(gaussians.count()[0]) == 0:
        raise inference.InferenceError(source, f"model {name} produced no Gaussians for this input")
    return gaussians


def _view_cameras(placed, images) -> list[ViewCamera]:
    """The known input cameras as the viewer's frustums, in the capture's own frame."""
    height, width = images.images.shape[-2:]
    to_capture = placed.frame.to_capture
    return [
        ViewCamera(
            name=images.names[i],
            extrinsics=to_capture.cameras(placed.extrinsics[i].double().cpu()).numpy(),
            intrinsics=placed.intrinsics[i].double().cpu().numpy(),
            size=(int(height), int(width)),
            image=image_to_uint8(images.images[i]),
        )
        for i in placed.known
    ]


def _refined(placed, images, settings: dict[str, Any], frame):
    """``refine=N`` / ``refine_time=S``: the Gaussians refined (``models.pipeline.inference.
    refine_reconstruction``) on the input photos at the model's input size and crop, in the
    capture's frame. A knob moved later re-runs the feed-forward pass only (the refinement is
    not repeated; say ``refine=`` again to refine that)."""
    refine = settings.get("refine_settings") or refine_settings(
        {k: settings.get(k) for k in ("refine", "refine_time", "refine_size")},
        str(settings["backend"]),
        0,
    )
    refined, fitted = inference.refine_reconstruction(placed, images.images.float(), refine)
    print(
        f"{fitted.message}; a knob change re-runs the feed-forward pass only (not the refinement)",
        file=sys.stderr,
    )
    return transform_gaussians(refined.gaussians, frame.to_capture)


def settings_from_summary(folder: Path, settings: dict[str, Any]) -> tuple[Path, dict] | None:
    """The input and settings to reconstruct an ``infer.py`` output folder again, or ``None``."""
    summary_path = folder / "summary.json"
    if not summary_path.is_file():
        return None
    try:
        summary = json.loads(summary_path.read_text(encoding="utf-8"))
    except ValueError:
        return None
    recorded = Path(str(summary.get("input") or "")).expanduser()
    # A relative input is relative to where infer.py ran: try here, then the repository.
    candidates = (
        [recorded] if recorded.is_absolute() else [Path.cwd() / recorded, REPO_ROOT / recorded]
    )
    source = next((c for c in candidates if str(recorded) not in ("", ".") and c.exists()), None)
    if not summary.get("model") or source is None:
        return None
    windows = (summary.get("scene") or {}).get("windows") or []
    if len(windows) > 1:  # models.pipeline.capture.whole: many forward passes fused
        print(
            f"note: {folder} fuses {len(windows)} windows of the whole capture: shown as saved "
            "(knobs are not live here; run infer.py again with views=all and the knob)",
            file=sys.stderr,
        )
        return None
    merged = dict(settings)
    if windows:  # views=N (or holdout=): the photos that went into the one window
        merged["view_names"], merged["views"] = list(windows[0]), None
    merged["model"] = settings["model"] or summary["model"]
    if settings["weights"] is None and summary.get("weights") and not settings["model"]:
        merged["weights"] = summary["weights"]
    if merged["views"] is None and summary.get("views") and not windows:
        merged["views"] = summary["views"]
    if settings["image_size"] is None and summary.get("image_size"):
        merged["image_size"] = ",".join(str(side) for side in summary["image_size"])
    recipe = summary.get("recipe") or {}
    for key in ("near", "far", "scene_scale"):  # what infer.py applied
        if merged.get(key) is None and recipe.get(key) is not None:
            merged[key] = recipe[key]
    for key, value in (summary.get("forward_kwargs") or {}).items():
        if key in declared_knob_names() and merged[key] is None:
            merged[key] = value
    return source, merged


def build(path: str, settings: dict[str, Any]):
    """The ``SplatViewer`` for ``path`` (started, serving)."""
    source = Path(path).expanduser()
    check_port(settings["host"], settings["port"])  # before loading anything
    save = _save_path(settings["save"])
    OutputFile(save, "view.py", (source,), suffix=".ply")  # refused now, not at the first Save
    runner, initial, scene = None, {}, None
    live = str(settings["live"]).lower()
    if not source.exists():
        raise ViewerError(f"{source}: not found")
    is_output = source.is_dir() and (source / "gaussians.ply").is_file()
    if source.is_file() and not is_splat_file(source) and settings["model"]:
        scene, runner, initial = live_scene(source, settings)  # a video or one image
    elif source.is_dir() and not is_output:
        if not settings["model"]:
            raise ViewerError(
                f"{source}: nothing to show (no gaussians.ply; for a folder of photos pass "
                "model=NAME, e.g. model=zipsplat_tiny)"
            )
        scene, runner, initial = live_scene(source, settings)
    elif is_output and live != "false":
        again = settings_from_summary(source, settings)
        if again is None and live == "true":
            raise ViewerError(
                f"{source}: live=true needs summary.json naming the model and an input that exists"
            )
        saved = load_view_scene(source)  # validates the folder, gives the saved cameras
        if again is not None:
            scene, runner, initial = live_scene(*again)  # the capture's frame, as the files
            scene.cameras = saved.cameras or scene.cameras
            scene.path = saved.path if saved.path is not None else scene.path
            scene.title = saved.title
        else:
            scene = saved
    else:
        scene = load_view_scene(source)
    if runner is None:
        initial = {"max_gaussians": settings["max_gaussians"]} if settings["max_gaussians"] else {}
        for key in declared_knob_names():
            if key != "max_gaussians" and settings[key] is not None:
                raise ViewerError(f"{key}={settings[key]}: needs a model (pass model=NAME)")
    return SplatViewer(
        scene,
        runner,
        host=settings["host"],
        port=settings["port"],
        save_path=save,
        render_backend=settings["backend"],
        initial=initial,
        inputs=(source,),
    )


def _save_path(save: str | None) -> Path:
    """Where Save writes: ``save=`` as given (refused later if it exists), or the default name,
    numbered (``gaussians_view-1.ply``, ...) when an earlier run's file is there."""
    if save is None or save == DEFAULT_SAVE:
        return free_file_name(DEFAULT_SAVE)
    return Path(save).expanduser()
