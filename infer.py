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

from datamodules.errors import DataError  # noqa: E402
from models.command_line import (  # noqa: E402
    check_settings,
    config_help,
    quote_lists,
    quote_path_arguments,
    stopped_cleanly,
)
from models.errors import PathError  # noqa: E402
from models.geometry.camera_paths import interpolate_cameras, orbit_cameras  # noqa: E402, F401
from models.inference import InferenceError as InferError  # noqa: E402
from models.registry import to_plain  # noqa: E402

__all__ = [
    "InferError",
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
COUNTS = {"views": 1, "orbit_frames": 1, "fps": 1, "max_gaussians": 1}


def _check_count(cfg: DictConfig, key: str, minimum: int) -> None:
    """A count setting is a whole number >= ``minimum`` (``None``: the default)."""
    value = cfg.get(key)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, str)) or not str(value).isdigit():
        raise InferError(f"{key}={value}", f"must be a whole number >= {minimum}")
    if int(value) < minimum:
        raise InferError(f"{key}={value}", f"must be at least {minimum}")


def _positive(cfg: DictConfig, key: str) -> float | None:
    """A positive number setting (``near``, ``far``, ``scene_scale``), or ``None``."""
    value = cfg.get(key)
    if value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise InferError(f"{key}={value}", "must be a positive number") from None
    if not number > 0 or number == float("inf"):
        raise InferError(f"{key}={value}", "must be a positive number")
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


def _angle(value: str) -> str | None:
    return None if 0 < float(value) < 180 else "must be an angle in degrees between 0 and 180"


# Checks beyond the type of each setting's default (check_settings derives those).
RULES = {"fov": _angle, "sfm.fov": _angle}


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
    """Run inference as configured; returns the output folder (bad input: ``PathError`` or
    ``DataError``, one line)."""
    import torch

    from models import budget, inference
    from models.capture.inputs import load_inputs

    started = time.perf_counter()
    if any(OmegaConf.is_missing(cfg, k) or not cfg[k] for k in ("input", "output")):
        raise InferError("infer.py", "usage: python infer.py input=PATH output=DIR [model=NAME]")
    output, source = Path(str(cfg.output)).expanduser(), Path(str(cfg.input)).expanduser()
    if not source.exists():
        raise InferError(source, "input not found")
    inputs = [source] + [
        Path(str(value)).expanduser()
        for value in (cfg.get("cameras"), cfg.get("weights"))
        if value not in (None, "", True, "auto") and ":" not in str(value)[:10]
    ]
    folder = inference.output_folder(output, inputs, bool(cfg.overwrite))  # checked now
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
    start = time.perf_counter()
    images, notes = load_inputs(
        source,
        size,
        model,
        name=str(cfg.model),
        views=_load_views(cfg, source, capture),
        cameras=cfg.cameras,
        sfm=to_plain(cfg.sfm) if cfg.get("sfm") else {},
    )
    timings["load_inputs"] = round(time.perf_counter() - start, 4)
    inference.check_input(images, recipe, str(cfg.model), size)
    notes = loaded.notes + notes
    views = cfg.get("views")  # views=all: each window has the recipe's count
    notes += inference.recipe_warnings(
        recipe, str(cfg.model), views=int(views) if str(views).isdigit() else None
    )
    for note in notes:
        print(f"warning: {note}", file=sys.stderr)
    if capture:
        return _run_capture(
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
            near=near,
            far=far,
            scene_scale=scale,
        )
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
            refine_poses=int(cfg.refine_poses),
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
    inference.write_reconstruction(
        result,
        folder,
        frames=int(cfg.orbit_frames),
        fps=int(cfg.fps),
        backend=str(cfg.backend),
        summary={"weights": loaded.weights, "input": str(source), "warnings": notes},
        started=started,
    )
    print(
        f"{output}: {result.count} Gaussians from {len(result.names)} view(s) with {cfg.model} "
        f"in {result.timings['total']:.1f} s on {device}"
    )
    return output


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
    cfg, model, images, knobs, folder, notes, timings, loaded, device, started, **overrides
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
        refine_poses=int(cfg.refine_poses),
        backend=str(cfg.backend),
        fov=float(cfg.fov),
        max_gaussians=knobs.pop("max_gaussians", None),
        **overrides,
        **knobs,
    )
    later = [n for n in capture.notes if n not in plan.notes]
    for note in later:
        print(f"warning: {note}", file=sys.stderr)
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
    )
    print_holdout(capture)
    print(
        f"{cfg.output}: {result.count} Gaussians from {len(result.names)} view(s) in "
        f"{len(plan.windows)} window(s) with {cfg.model} in {result.timings['total']:.1f} s on "
        f"{device}"
    )
    return Path(str(cfg.output)).expanduser()


def run_cli(cfg: DictConfig) -> int:
    """``run`` with bad input reported as one line on stderr; returns the exit status (0 or 2)."""
    try:
        output = run(cfg)
    except (PathError, DataError) as error:
        print(f"error: {' '.join(str(error).split())}", file=sys.stderr)
        return 2
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
        except PathError as error:
            print(f"error: {' '.join(str(error).split())}", file=sys.stderr)
            sys.exit(2)
        main()
