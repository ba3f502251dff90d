"""Convert a Gaussian-splat file from any format splatzoo reads into any it writes.

    python -m models.convert_splats IN OUT [spz_version=4|3] [overwrite=true]

IN and OUT are chosen by suffix: ``.ply`` (INRIA; a PlayCanvas compressed layout is recognised by
its header), ``.compressed.ply``, ``.spz``, ``.sog``, ``meta.json`` (unbundled SOG: the images are
written beside it; as input, the folder holding it also works), ``.glb`` (``KHR_gaussian_splatting``)
and ``.splat``. ``spz_version=3`` writes the older gzip SPZ. OUT is written atomically (a temporary
file beside it, renamed into place); an existing OUT is replaced only with ``overwrite=true`` and
never when it is IN. Errors are one line on stderr and exit status 2. docs/formats.md describes
the formats.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from datamodules.errors import InputError
from models.core.command_line import parse_key_values, run_key_value_command, setting
from models.core.gaussians import Gaussians
from models.splat_formats import format_of
from models.splat_formats.sog import _FILES

PROGRAM = "python -m models.convert_splats"
USAGE = f"usage: {PROGRAM} IN OUT [spz_version=4|3] [overwrite=true]"


@dataclass
class ConvertSplatsSettings:
    """``python -m models.convert_splats IN OUT key=value ...``."""

    spz_version: int = setting(4, choices=(3, 4))  # 3: the older gzip SPZ
    overwrite: bool = False


def convert_splats(source: str, target: str, spz_version: int = 4, overwrite: bool = False) -> int:
    """Convert ``source`` into ``target`` (formats by suffix); returns the Gaussians written."""
    kind = format_of(target)
    if Path(source).resolve() == Path(target).resolve():
        raise InputError(target, "is the input: refusing to replace it")
    if os.path.isdir(target):
        raise InputError(target, "is a folder (an unbundled SOG is written as FOLDER/meta.json)")
    if os.path.lexists(target) and not overwrite:
        raise InputError(target, "exists: pass overwrite=true to replace it")
    if kind == "sog" and not overwrite and target.lower().endswith(".json"):
        taken = [n for n in _sog_images(target) if os.path.lexists(n)]
        if taken:
            raise InputError(taken[0], "exists: pass overwrite=true to replace it")
    gaussians = Gaussians.load(source)
    gaussians.save(target, spz_version=spz_version)
    return gaussians.num_slots


def _sog_images(meta: str) -> list[str]:
    folder = os.path.dirname(os.path.abspath(meta))
    return [os.path.join(folder, name) for names in _FILES.values() for name in names]


def _convert(argv: list[str]) -> None:
    paths, options = parse_key_values(argv, ConvertSplatsSettings, PROGRAM)
    if len(paths) != 2:
        raise InputError("arguments", f"expected IN and OUT, got {len(paths)} paths. {USAGE}")
    source, target = paths
    count = convert_splats(source, target, options["spz_version"], options["overwrite"])
    print(f"converted {source} -> {target} ({count} Gaussians, {format_of(target)})")


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit status (2 on bad input)."""
    return run_key_value_command(argv, __doc__, _convert)
