"""Every setting of the photos-to-Gaussians commands, declared once: its type (the annotation),
its range (the field's metadata) and its default (``configs/infer.yaml``, which a test keeps equal
to the defaults here).

The commands read their arguments through one parser: :func:`check_arguments` refuses an unknown
key (naming the closest one) or a value of the wrong type before Hydra reads the command line;
:func:`check_values` refuses values out of range (counts, positive and finite numbers, angles,
path lengths, choices). ``infer.py`` registers :class:`InferConfig` with Hydra as a structured
config, ``python -m models.refine`` parses its ``key=value`` arguments with
:func:`parse_key_values` over :class:`RefineCommandConfig`, and ``view.py`` its refinement
settings with :func:`refine_values`: all share the refinement's fields (:class:`RefineFields`), so a
refinement setting is checked the same way in every command. Errors are :class:`SettingError`
(an ``InputError``): one line naming ``key=value``.

Pure Python and PyYAML: no Hydra import (``infer.py`` composes the config).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import types
import typing
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from datamodules.errors import InputError
from models.refine.settings import RefineSettings

__all__ = [
    "InferConfig",
    "RefineCommandConfig",
    "RefineFields",
    "SettingError",
    "SfmConfig",
    "check_arguments",
    "angle_problem",
    "check_values",
    "closest",
    "declared",
    "parse_key_values",
    "refine_values",
]

MISSING = "???"  # OmegaConf's mark of a required value
NAME_MAX = 255  # bytes of one path component (Linux, macOS)
PATH_MAX = 4096  # bytes of a whole path (Linux)
# RefineSettings fields that the commands set from their own settings, not refinement.KEY
REFINE_TOP_LEVEL = frozenset(
    {
        "steps",
        "time",
        "size",
        "max_gaussians",
        "backend",
        "seed",
        "memory_limit",
        "checkpoint_every",
    }
)


class SettingError(InputError):
    """A ``key=value`` setting that does not exist or whose value is of the wrong kind or out of
    range (one line naming the argument)."""


def setting(default: Any = None, **rule: Any) -> Any:
    """A dataclass field with a checking rule in its metadata: ``minimum`` (whole numbers: at
    least; numbers: at least), ``above`` (numbers: greater than), ``below`` (less than),
    ``finite`` (numbers), ``choices`` (text), ``words`` (text also taken by a count, ``all``),
    ``count`` (a whole number, for ``Any`` fields), ``path`` (a file system path: lengths),
    ``angle`` (degrees in (0, 180)). Lists and dicts take a factory."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=rule)
    return field(default=default, metadata=rule)


# ---------------------------------------------------------------------------------- declarations


@dataclass
class SfmConfig:
    """Structure-from-motion (``cameras=auto``; ``models.capture.inputs``)."""

    matching: str = setting("auto", choices=("auto", "exhaustive", "sequential"))
    camera_model: str = "SIMPLE_PINHOLE"
    fov: float | None = setting(None, angle=True)
    refine_focal: bool = True
    num_threads: int = setting(2, minimum=1)
    cache: bool = True


@dataclass
class RefineFields:
    """The per-scene fit's settings, the same in ``infer.py``, ``view.py`` and
    ``python -m models.refine`` (``models.refine.RefineSettings`` takes them)."""

    refine: int = setting(0, minimum=0)
    refine_time: float | None = setting(None, above=0.0, finite=True)
    refine_size: int | None = setting(None, minimum=8)
    refine_init: str = setting("auto", choices=("auto", "feed_forward", "sfm"))
    refine_max_gaussians: int | None = setting(None, minimum=1)
    refine_checkpoint_every: int | None = setting(None, minimum=1)
    refinement: Any = setting({})  # models.refine.RefineSettings' other fields (checked there)


@dataclass
class InferConfig(RefineFields):
    """``configs/infer.yaml``: ``python infer.py key=value ...`` (the comments there say what
    each setting does)."""

    input: str = setting(MISSING, path=True)
    output: str = setting(MISSING, path=True)
    model: str = "zipsplat_tiny"
    weights: str | None = setting(None, path=True)
    views: Any = setting(None, count=True, minimum=1, words=("all",))
    center_view: str | None = None
    holdout: Any = None
    compression: Any = None  # the families' knobs: checked against the model's declarations
    iterations: Any = setting(None, count=True, minimum=0)
    gaussians_per_pixel: Any = None
    voxel_size: Any = None
    max_gaussians: Any = setting(None, count=True, minimum=1)
    fusion_max_gaussians: int | None = setting(None, minimum=1)
    formats: Any = setting([])  # extra splat files beside gaussians.ply (models.splat_formats)
    image_size: Any = None
    near: float | None = setting(None, above=0.0, finite=True)
    far: float | None = setting(None, above=0.0, finite=True)
    scene_scale: float | None = setting(None, above=0.0, finite=True)
    cameras: str | None = setting(None, path=True)
    sfm: SfmConfig = field(default_factory=SfmConfig)
    fov: float = setting(60.0, angle=True)
    orbit_frames: int = setting(30, minimum=1)
    fps: int = setting(15, minimum=1)
    pose_fit_steps: int = setting(50, minimum=0)
    pose_fit_size: int = setting(128, minimum=8)
    overwrite: bool = False
    view: bool = False
    device: str = "auto"
    backend: str = setting("auto", choices=("auto", "torch", "gsplat", "cpu"))
    seed: int = 0


@dataclass
class RefineCommandConfig(RefineFields):
    """``python -m models.refine [GAUSSIANS.ply] PHOTOS key=value ...``."""

    output: str = setting(MISSING, path=True)
    holdout: Any = None
    optimize_cameras: bool = False
    overwrite: bool = False
    device: str = "auto"
    backend: str = setting("auto", choices=("auto", "torch", "gsplat", "cpu"))
    seed: int = 0


# ---------------------------------------------------------------------------------- the fields


@dataclass(frozen=True)
class Declared:
    """One declared setting: its dotted name, base type (``bool``, ``int``, ``float``, ``str``
    or ``Any``), whether ``null`` is allowed, its default and its rule."""

    name: str
    kind: Any
    optional: bool
    default: Any
    rule: dict


def _kind(annotation: Any) -> tuple[Any, bool]:
    """``(base type, optional)`` of a field annotation."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        return (rest[0] if len(rest) == 1 else Any), len(rest) < len(args)
    return annotation, annotation is Any


def declared(schema: type, prefix: str = "") -> dict[str, Declared]:
    """Every leaf setting of the dataclass ``schema`` by dotted name (nested dataclasses
    flattened: ``sfm.matching``)."""
    hints = typing.get_type_hints(schema)
    out: dict[str, Declared] = {}
    for item in dataclasses.fields(schema):
        kind, optional = _kind(hints[item.name])
        name = f"{prefix}{item.name}"
        if dataclasses.is_dataclass(kind):
            out.update(declared(kind, f"{name}."))
            continue
        default = item.default
        if item.default_factory is not dataclasses.MISSING:
            default = item.default_factory()
        out[name] = Declared(name, kind, optional, default, dict(item.metadata))
    return out


def refinement_fields() -> dict[str, Declared]:
    """``refinement.KEY`` settings: the fields of ``models.refine.RefineSettings`` that the
    commands' own settings (``refine``, ``refine_time``, ...) do not set."""
    return {
        name: item
        for name, item in declared(RefineSettings, "refinement.").items()
        if name.split(".")[1] not in REFINE_TOP_LEVEL
    }


def _known(schema: type, extra: dict[str, Declared] | None) -> dict[str, Declared]:
    """Every key a command takes: ``schema``'s, the refinement's fields, ``extra``."""
    known = {**declared(schema), **(extra or {})}
    if "refinement" in known:
        del known["refinement"]
        known.update(refinement_fields())
    return known


def closest(name: str, names: Iterable[str]) -> str | None:
    """The declared name ``name`` was most likely meant to be (``orbit_frame`` → ``orbit_frames``)."""
    names = list(names)
    tail = {n.rsplit(".", 1)[-1]: n for n in names}
    found = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
    if not found:  # a misspelt leaf of a group: sfm.matchng → sfm.matching
        found = [tail[t] for t in difflib.get_close_matches(name.rsplit(".", 1)[-1], tail, 1, 0.75)]
    return found[0] if found else None


def _shown(text: str) -> str:
    """A value as an error line shows it (a path of thousands of characters: its start)."""
    return text if len(text) <= 80 else f"{text[:40]}...({len(text)} characters)"


# ---------------------------------------------------------------------------------- types


def _read(text: str) -> Any:
    """A command-line value as YAML reads it (``3`` an int, ``0.5`` a float, ``null`` None)."""
    try:
        return yaml.safe_load(text) if text.strip() != "" else None
    except yaml.YAMLError:
        return text


def type_problem(item: Declared, text: str) -> str | None:
    """What is wrong with the text ``text`` for ``item``'s type, or ``None``."""
    stripped = text.strip().strip("'\"")
    low = stripped.lower()
    if low in ("null", "none", "~", ""):
        return None if item.optional or item.kind in (Any, str) else "must be set (not null)"
    shown = "null" if item.default is None else str(item.default).lower()
    if item.kind is bool:
        return None if low in ("true", "false") else "must be true or false"
    if item.kind is int:
        try:
            int(stripped)
        except ValueError:
            return f"must be a whole number (default {shown})"
    if item.kind is float:
        try:
            number = float(stripped)
        except ValueError:
            return f"must be a number (default {shown})"
        if not math.isfinite(number):
            return f"must be a finite number (default {shown})"
    return None


def check_arguments(
    argv: list[str], schema: type, program: str, extra: dict[str, Declared] | None = None
) -> None:
    """Refuse a ``key=value`` argument whose key ``schema`` does not declare (naming the closest
    declared one; ``refinement.KEY`` is left to ``models.refine``) or whose value does not fit its
    type, before Hydra reads the command line. Hydra's own arguments (``-m``, ``hydra.*``) pass.

    Raises:
        SettingError: one line naming the argument.
    """
    known = _known(schema, extra)
    groups = {n.rsplit(".", 1)[0] for n in known if "." in n}
    for arg in argv:
        if arg.startswith("-"):
            continue
        key, sep, value = arg.partition("=")
        bare = key.lstrip("+~")
        if not sep:
            raise SettingError(_shown(arg), f"not a setting of {program} (settings are key=value)")
        if bare == "hydra" or bare.startswith(("hydra.", "hydra/")):
            continue
        if bare not in known:
            group = bare.rsplit(".", 1)[0] if "." in bare else None
            shown = sorted(known)
            if group in groups:
                shown = [n for n in shown if n.startswith(f"{group}.")]  # that group's keys
            guess = closest(bare, sorted(known))
            hint = f"did you mean {guess}? " if guess else ""
            raise SettingError(
                _shown(arg), f"unknown setting of {program} ({hint}settings: {', '.join(shown)})"
            )
        item = known[bare]
        problem = type_problem(item, value)
        if problem is None and value.strip().lower() not in ("null", "none", ""):
            if item.rule.get("path"):  # before Hydra stats it
                problem = _path_problem(value.strip().strip("'\""))
            elif item.rule.get("angle"):
                problem = _rule_problem(item, _read(value))
        if problem is not None:
            raise SettingError(_shown(arg), problem)


# ---------------------------------------------------------------------------------- ranges


def _path_problem(text: str) -> str | None:
    """A path whose whole or one component the file system cannot hold."""
    encoded = os.fsencode(str(Path(text).expanduser()))
    if len(encoded) >= PATH_MAX:
        return f"the path is {len(encoded)} bytes long, longer than the system's {PATH_MAX - 1}"
    longest = max((len(part) for part in encoded.split(b"/")), default=0)
    if longest > NAME_MAX:
        return (
            f"one folder or file name in the path is {longest} bytes long, longer than the "
            f"system's {NAME_MAX}"
        )
    return None


def _count_problem(value: Any, minimum: int) -> str | None:
    text = str(value)
    if isinstance(value, bool) or not isinstance(value, (int, str)) or not text.isdigit():
        return f"must be a whole number >= {minimum}"
    return None if int(text) >= minimum else f"must be at least {minimum}"


def _number_problem(value: Any, rule: dict) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "must be a number"
    if rule.get("finite") and not math.isfinite(value):
        return "must be a finite number"
    if "above" in rule and not value > rule["above"]:
        return "must be a positive number" if rule["above"] == 0 else f"must be > {rule['above']}"
    if "minimum" in rule and not value >= rule["minimum"]:
        return f"must be at least {rule['minimum']}"
    if "maximum" in rule and not value <= rule["maximum"]:
        return f"must be in [{rule.get('minimum', 0)}, {rule['maximum']}]"
    return None


def _rule_problem(item: Declared, value: Any, text: str | None = None) -> str | None:
    """What ``item``'s rule refuses in ``value`` (typed), or ``None``."""
    rule = item.rule
    if value is None:
        return None
    if rule.get("path"):
        return _path_problem(str(value if text is None else text.strip().strip("'\"")))
    if rule.get("angle"):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < 180
        return None if ok else "must be an angle in degrees between 0 and 180"
    if "choices" in rule:
        choices = rule["choices"]
        ok = str(value) in choices
        return None if ok else f"must be one of {', '.join(choices)}"
    if rule.get("count") or (item.kind is int and "minimum" in rule and "maximum" not in rule):
        if str(value) in rule.get("words", ()):
            return None
        if text is not None and rule.get("count"):
            return None  # an Any count: its range is checked once composed (check_values)
        return _count_problem(value, rule["minimum"])
    if item.kind in (int, float) and rule:
        return _number_problem(value, rule)
    return None


def angle_problem(text: str) -> str | None:
    """What is wrong with ``text`` as an angle in degrees in (0, 180), or ``None``."""
    item = Declared("angle", float, False, None, {"angle": True})
    return _rule_problem(item, _read(text))


def refine_values(argv: list[str], program: str) -> dict[str, Any]:
    """The refinement's settings (:class:`RefineFields`) among ``key=value`` arguments, typed
    and checked as every command checks them (other arguments are left to the caller)."""
    names = {f.name for f in dataclasses.fields(RefineFields)}
    mine = [a for a in argv if a.partition("=")[0].lstrip("+").split(".")[0] in names]
    return parse_key_values(mine, RefineFields, program)[1]


def check_values(values: dict[str, Any], schema: type, skip: Iterable[str] = ()) -> None:
    """Refuse values (typed, as composed) that ``schema``'s rules refuse: counts below their
    minimum, numbers out of range or not finite, angles, choices, paths too long.

    Raises:
        SettingError: one line naming ``key=value``.
    """
    skip = set(skip)
    for name, item in declared(schema).items():
        if name in skip:
            continue
        value: Any = values
        for part in name.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if value is None or value == MISSING:
            continue
        problem = _rule_problem(item, value)
        if problem is not None:
            raise SettingError(f"{name}={_shown(str(value))}", problem)


def parse_key_values(
    argv: list[str],
    schema: type,
    program: str,
    extra: dict[str, Declared] | None = None,
) -> tuple[list[str], dict[str, Any]]:
    """``PATH ... key=value ...`` of a plain command: the positional arguments and every
    declared setting (defaults filled in; ``refinement.a.b=`` nested), checked as
    :func:`check_arguments` and :func:`check_values` check ``infer.py``'s.

    Raises:
        SettingError: one line naming the argument.
    """
    positional = [a for a in argv if "=" not in a]
    pairs = [a for a in argv if "=" in a]
    check_arguments(pairs, schema, program, extra)
    known = _known(schema, extra)
    values: dict[str, Any] = {}
    for name, item in known.items():
        _put(values, name, item.default)
    for arg in pairs:
        key, _, text = arg.partition("=")
        key = key.lstrip("+")
        item = known.get(key)
        value = _read(text)
        if item is not None and item.kind is str and value is not None:
            value = text.strip()  # text settings keep what was typed (paths: 1e3, 007)
        if item is not None and item.kind is float and value is not None:
            value = float(value)
        _put(values, key, value)
    check_values(values, schema)
    return positional, values


def _put(values: dict, dotted: str, value: Any) -> None:
    node = values
    parts = dotted.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
