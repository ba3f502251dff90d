"""Look at Gaussians in the browser, with the model's inference knobs live (viser).

    python view.py PATH [model=NAME] [weights=...] [host=127.0.0.1] [port=0] [save=FILE.ply]
        [device=auto] [live=auto] [compression=R] [iterations=K] [gaussians_per_pixel=G]
        [max_gaussians=N] [views=N] [image_size=H,W|S] [near=N] [far=F] [scene_scale=S]
        [cameras=PATH] [fov=60] [refine=N] [refine_time=S] [refine_size=PX]

``PATH`` is a splat file (``.ply``, ``.compressed.ply``, ``.spz``, ``.sog``, ``meta.json``, ``.glb``,
``.splat``; docs/formats.md), an ``infer.py`` output folder (``gaussians.ply``,
``cameras.json``, ``renders/``, ``summary.json``), or a folder of photos, a video or an image with
``model=NAME`` (reconstructed here, as ``infer.py`` would). The viewer shows the Gaussians, the input cameras as
frustums with their images, the rendered camera path, and a panel with the model's inference
knobs: moving one re-runs the reconstruction (reusing what the knob does not change) and updates
the scene and the Gaussian count. An ``infer.py`` folder is reconstructed again from its
``summary.json`` (model, weights, input) when the input is still there (``live=false``: show the
saved files only; ``max_gaussians`` then prunes the saved set). ``refine=N`` / ``refine_time=S``
(photos reconstructed here) refine the Gaussians on the input photos before serving
(``models.pipeline.inference.refine_reconstruction``); a knob moved later re-runs the feed-forward pass
only, not the refinement.

It binds to 127.0.0.1 (``host=`` to change, with a warning when not loopback) on a free port
(``port=0``) or the one given, prints the URL, and stops cleanly on Ctrl-C. Bad input (not a 3DGS
.ply, a folder with nothing to show, a busy port, bad settings) is one line on stderr, exit 2.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
from pathlib import Path

if __name__ == "__main__":  # Ctrl-C while the imports below load: one line, no traceback
    signal.signal(signal.SIGINT, lambda *_: (print("view.py: stopped by Ctrl-C", file=sys.stderr), os._exit(130)))  # fmt: skip  # noqa: E501
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent
if str(REPO_ROOT) not in sys.path:  # `python /path/to/view.py` from another folder
    sys.path.insert(0, str(REPO_ROOT))

from datamodules.errors import InputError  # noqa: E402
from models.core.command_line import Declared, parse_key_values, stopped_cleanly  # noqa: E402
from models.pipeline.refinement import (  # noqa: E402
    check_fit_memory,
    photo_shape,
    refine_settings,
)
from models.pipeline.settings import RefineFields, ViewConfig  # noqa: E402
from models.view.live import build  # noqa: E402
from models.view.server import ViewerError  # noqa: E402
from models.weights.knobs import MAX_GAUSSIANS, declared_knob_names  # noqa: E402

USAGE = (
    "usage: python view.py PATH [model=NAME] [weights=...] [host=127.0.0.1] [port=0] "
    "[save=FILE.ply] [device=auto] [live=auto|true|false] [KNOB=VALUE ...]"
)


KNOB_KEYS = (
    declared_knob_names()
)  # the knobs the families declare (models.weights.knobs), read once
# The knobs as settings: any value here, checked against the model's declarations once it loads
KNOBS = {key: Declared(key, Any, True, None, {}) for key in KNOB_KEYS}


def parse_args(argv: list[str]) -> tuple[str, dict[str, Any]]:
    """``PATH key=value ...`` → ``(PATH, settings)``, checked as every command checks its
    settings (:class:`ViewConfig` and the knobs), then the refinement's memory.

    Raises:
        InputError: one line naming the argument.
    """
    paths, settings = parse_key_values(argv, ViewConfig, "view.py", extra=KNOBS)
    if len(paths) != 1:
        raise ViewerError(USAGE)
    for key, check in CHECKS.items():
        value = settings[key]
        problem = None if value is None else check(str(value))
        if problem is not None:
            raise ViewerError(f"{key}={value}: {problem}")
    refine = {name: settings[name] for name in REFINE_KEYS}
    settings["refine_settings"] = refine_settings(refine, str(settings["backend"]), 0)
    if settings["refine_settings"] is not None:  # before anything loads
        shape, photos = photo_shape(Path(paths[0]))
        check_fit_memory(settings["refine_settings"], shape, photos, str(settings["device"]))
    return paths[0], settings


def _size(value: str) -> str | None:
    parts = value.split(",")
    ok = len(parts) in (1, 2) and all(p.strip().isdigit() and int(p) >= 1 for p in parts)
    return None if ok else "must be a whole number >= 1 (one side) or H,W"


def _max_gaussians(value: str) -> str | None:
    try:
        MAX_GAUSSIANS.check(value)
    except ValueError as error:
        return str(error).split(": ", 1)[-1]
    return None


# Values checked before anything loads (the model's other knobs: against its declarations).
CHECKS = {"image_size": _size, "max_gaussians": _max_gaussians}
REFINE_KEYS = [item.name for item in dataclasses.fields(RefineFields)]


def serve_cli(argv: list[str]) -> int:
    """Parse, build and serve until Ctrl-C; bad input → one line on stderr, 2."""
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__.strip())
        return 0
    try:
        path, settings = parse_args(argv)
        viewer = build(path, settings)
    except InputError as error:
        print(f"error: {' '.join(str(error).split())}", file=sys.stderr)
        return 2
    try:
        print(
            f"splatzoo viewer: {viewer.url} ({viewer.count:,} Gaussians; Ctrl-C to stop)",
            flush=True,
        )
        viewer.serve_forever()
    except KeyboardInterrupt:  # Ctrl-C before the serving loop took over: the same normal stop
        viewer.stop()
    print("viewer stopped", flush=True)
    return 0


if __name__ == "__main__":
    with stopped_cleanly("view.py"):
        sys.exit(serve_cli(sys.argv[1:]))
