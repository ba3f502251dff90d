"""What every command shares: how its ``key=value`` arguments are declared, parsed and checked,
and how it stops on Ctrl-C or SIGTERM. Every command of the project goes through here
(``train.py``, ``eval.py``, ``infer.py``, ``view.py``, ``python -m models.refine``,
``models.convert_splats``, ``models.weights.convert``, ``models.training.export``,
``datamodules.synthetic``, ``datamodules.tools.convert``, ``datamodules.tools.make_index``).

Arguments. A command declares its settings once, as a dataclass whose fields carry their type
(the annotation), their default (:data:`MISSING`: required) and their range (:func:`setting`'s
rule). The Hydra commands register that dataclass as a structured config and check the command
line with :func:`check_arguments` before Hydra reads it; the plain commands parse it with
:func:`parse_key_values` (positional paths, then ``key=value``). Both refuse the same things the
same way: an unknown key (naming the closest declared one: "did you mean"), a value of the wrong
type, a value out of range (:func:`check_values`), a missing required setting: one
:class:`SettingError` line naming ``key=value``, which :func:`run_key_value_command` (the plain
commands' ``main``) prints as ``error: ...`` with exit status 2. Hydra's override grammar
rejects unquoted values with accents, spaces and the like, so path values are quoted for it
(:func:`quote_path_arguments`).

Stopping. :func:`stopped_cleanly` is the one signal mechanism: within it, SIGTERM raises
:class:`Terminated` (a ``KeyboardInterrupt``, so every ``finally`` and ``except
KeyboardInterrupt`` cleans up as for Ctrl-C) and both end the command with one line and exit
status 130 / 143. Library code that must clean up on SIGTERM outside a command
(:class:`models.core.output_folder.OutputFolder`, the viewer's loop, the SfM child) uses the same
:func:`sigterm_raises`; :func:`stopped_by_signal` hands Lightning's handled interruptions back
to it.

Pure Python and PyYAML: no Hydra import, nothing of the project but the bad-input error.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import math
import os
import re
import signal
import sys
import threading
import traceback
import types
import typing
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from datamodules.errors import InputError

__all__ = [
    "MISSING",
    "PATH_KEYS",
    "Declared",
    "SettingError",
    "Terminated",
    "angle_problem",
    "check_arguments",
    "check_values",
    "closest",
    "config_help",
    "declared",
    "flag_arguments",
    "parse_key_values",
    "quote_lists",
    "quote_path_arguments",
    "run_key_value_command",
    "setting",
    "sigterm_raises",
    "stopped_by_signal",
    "stopped_cleanly",
    "type_problem",
]

# Settings whose values are file system paths (or weights locations), in any entry point.
PATH_KEYS = frozenset(
    {
        "input",
        "output",
        "cameras",
        "weights",
        "ckpt_path",
        "data.root",
        "paths.data_dir",
        "paths.log_dir",
        "paths.output_dir",
        "hydra.run.dir",
        "hydra.sweep.dir",
        "model.net.init_checkpoint",
        "path",
    }
)

# A value Hydra reads as a plain string without quotes: no need to touch it.
_PLAIN = re.compile(r"[A-Za-z0-9_./:@+~-]*")


def _quoted(value: str) -> str:
    """``value`` as one single-quoted Hydra string (quotes and the backslashes before them
    escaped, as Hydra's grammar wants)."""
    escaped = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", value)
    escaped = re.sub(r"(\\+)$", lambda m: m.group(1) * 2, escaped)
    return f"'{escaped}'"


def quote_lists(argv: list[str]) -> list[str]:
    """Quote ``key=a,b`` values (``image_size=H,W``) for a command that never sweeps: Hydra
    reads an unquoted comma as a sweep and refuses it outside ``-m``; the setting gets the text."""
    out = []
    for arg in argv:
        key, sep, value = arg.partition("=")
        plain = value and value[0] not in "'\"[{(" and "," in value
        out.append(f"{key}={_quoted(value)}" if sep and plain and not arg.startswith("-") else arg)
    return out


def quote_path_arguments(argv: list[str], keys: frozenset[str] = PATH_KEYS) -> list[str]:
    """Quote the values of path settings (``key=value``, also ``+key=``/``++key=``) that Hydra
    would not parse unquoted; other arguments, and values already quoted, pass unchanged.

    A path is taken as the user typed it, as a shell would: a leading ``~`` is the home folder
    (``output=~/x``, ``output=~``) and ``${...}`` is text, not an OmegaConf interpolation."""
    out = []
    for arg in argv:
        key, sep, value = arg.partition("=")
        bare = key.lstrip("+~")
        already = len(value) >= 2 and value[0] == value[-1] and value[0] in "'\""
        if sep and bare in keys and value and not already:
            if value == "~" or value.startswith("~/"):
                value = str(Path(value).expanduser())
            literal = "${" in value
            if literal:
                value = value.replace("${", "\\${")  # OmegaConf's escape: the text ${
            if literal or not _PLAIN.fullmatch(value):
                arg = f"{key}={_quoted(value)}"
            else:
                arg = f"{key}={value}"
        out.append(arg)
    return out


def config_help(config: str | Path, notes: tuple[str, ...] = ()) -> str:
    """``--help`` of a Hydra entry point: the usage (the config's first four ``# `` lines) and
    every top-level setting with its default and the comment written above it (Hydra's own help
    shows the values without them), then ``notes``."""
    lines = Path(config).read_text(encoding="utf-8").splitlines()
    header = [line[2:] for line in lines if line.startswith("# ")][:4]
    rows, comment = [], []
    for line in lines:
        if line.startswith("hydra:"):
            break
        if line.startswith("#"):
            comment.append(line.lstrip("# ").rstrip())
        elif line and not line.startswith((" ", "-", "defaults")) and ":" in line:
            key, _, value = line.partition(":")
            rows.append((f"{key}={value.strip() or '...'}", " ".join(comment)))
            comment = []
        else:
            comment = []
    width = max(len(key) for key, _ in rows)
    body = [f"  {key.ljust(width)}  {text}".rstrip() for key, text in rows]
    return "\n".join([*header, "", "Settings:", *body, *(("",) + notes if notes else ())])


def run_key_value_command(
    argv: list[str] | None,
    doc: str | None,
    body: Callable[[list[str]], None],
) -> int:
    """Run a plain command's ``main``: ``-h``/``--help`` prints ``doc``; ``body(argv)`` does
    the work; an ``InputError`` ends it as one line on stderr (``error: ...``).

    Args:
        argv: the arguments after the program name (``None``: ``sys.argv[1:]``).
        doc: the help text (the command module's docstring).
        body: the command's work, given the arguments.

    Returns:
        The exit status: 0, or 2 on bad input.
    """
    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in argv):
        print(doc)
        return 0
    try:
        body(argv)
    except InputError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


# ---------------------------------------------------------------------------------- declarations

MISSING = "???"  # OmegaConf's mark of a required value
NAME_MAX = 255  # bytes of one path component (Linux, macOS)
PATH_MAX = 4096  # bytes of a whole path (Linux)


class SettingError(InputError):
    """A ``key=value`` setting that does not exist, is missing or whose value is of the wrong
    kind or out of range (one line naming the argument)."""


def setting(default: Any = None, **rule: Any) -> Any:
    """A dataclass field with a checking rule in its metadata: ``minimum`` (whole numbers: at
    least; numbers: at least), ``maximum``, ``above`` (numbers: greater than), ``below``
    (numbers: less than), ``finite``
    (numbers), ``choices`` (values), ``words`` (text also taken by a count, ``all``), ``count``
    (a whole number, for ``Any`` fields), ``path`` (a file system path: lengths), ``angle``
    (degrees in (0, 180)), ``length`` (lists: how many items), ``fields`` (a dict setting whose
    ``name.KEY`` settings are declared elsewhere: a function returning them, by dotted name).
    Lists and dicts take a factory; ``MISSING`` marks a required setting."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=rule)
    return field(default=default, metadata=rule)


@dataclass(frozen=True)
class Declared:
    """One declared setting: its dotted name, base type (``bool``, ``int``, ``float``, ``str``,
    ``list[...]`` or ``Any``), whether ``null`` is allowed, its default and its rule."""

    name: str
    kind: Any
    optional: bool
    default: Any
    rule: dict


# ---------------------------------------------------------------------------------- the fields


def _kind(annotation: Any) -> tuple[Any, bool]:
    """``(base type, optional)`` of a field annotation."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        return (rest[0] if len(rest) == 1 else Any), len(rest) < len(args)
    return annotation, annotation is Any


def _item_type(kind: Any) -> Any:
    """The item type of a ``list[T]`` setting, or ``None`` for any other kind."""
    if typing.get_origin(kind) is list:
        return (typing.get_args(kind) or (Any,))[0]
    return None


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


def _known(schema: type, extra: dict[str, Declared] | None) -> dict[str, Declared]:
    """Every key a command takes: ``schema``'s (a ``fields`` setting replaced by the settings
    its rule declares) and ``extra``."""
    known = {**declared(schema), **(extra or {})}
    for name, item in list(known.items()):
        if "fields" in item.rule:
            del known[name]
            known.update(item.rule["fields"]())
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


def _list_items(text: str) -> list[str]:
    """``A,B`` or ``[A, B]`` (a list setting's text) → its items."""
    text = text.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    return [part.strip().strip("'\"") for part in text.split(",")] if text.strip() else []


def type_problem(item: Declared, text: str) -> str | None:
    """What is wrong with the text ``text`` for ``item``'s type, or ``None``."""
    stripped = text.strip().strip("'\"")
    low = stripped.lower()
    if low in ("null", "none", "~", ""):
        return None if item.optional or item.kind in (Any, str) else "must be set (not null)"
    shown = "null" if item.default is None else str(item.default).lower()
    of = _item_type(item.kind)
    if of is not None:
        parts = _list_items(stripped)
        inner = Declared(item.name, of, False, None, {})
        problems = [p for p in (type_problem(inner, part) for part in parts) if p]
        if problems:
            return f"{problems[0].split(' (default')[0]} in every item (items: A,B)"
        return None
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
            if item.rule.get("angle"):
                return _rule_problem(item, stripped)
            return f"must be a number (default {shown})"
        if not math.isfinite(number):
            return f"must be a finite number (default {shown})"
    return None


def check_arguments(
    argv: list[str], schema: type, program: str, extra: dict[str, Declared] | None = None
) -> None:
    """Refuse a ``key=value`` argument whose key ``schema`` does not declare (naming the closest
    declared one; ``refinement.KEY`` is left to ``models.pipeline.refine``) or whose value does not fit its
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
    if "below" in rule and not value < rule["below"]:
        return f"must be in [{rule.get('minimum', 0)}, {rule['below']})"
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
        choices = [str(choice) for choice in rule["choices"]]
        ok = str(value) in choices
        return None if ok else f"must be one of {', '.join(choices)}"
    if "length" in rule and isinstance(value, list) and len(value) != rule["length"]:
        return f"must be {rule['length']} items (A,B), got {len(value)}"
    if isinstance(value, list):  # each item by the same rule
        each = Declared(item.name, _item_type(item.kind) or Any, False, None, rule)
        return next((problem for v in value if (problem := _rule_problem(each, v))), None)
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
        value = _get(values, name)
        if value is None or value == MISSING:
            continue
        problem = _rule_problem(item, value)
        if problem is not None:
            text = ",".join(map(str, value)) if isinstance(value, list) else str(value)
            raise SettingError(f"{name}={_shown(text)}", problem)


def parse_key_values(
    argv: list[str],
    schema: type,
    program: str,
    extra: dict[str, Declared] | None = None,
    hint: str = "",
) -> tuple[list[str], dict[str, Any]]:
    """``PATH ... key=value ...`` of a command: the positional arguments and every declared
    setting (defaults filled in; ``group.a.b=`` nested), checked as :func:`check_arguments` and
    :func:`check_values` check ``infer.py``'s; a setting whose default is :data:`MISSING` must be
    given. ``hint`` ends the error of an unknown or missing setting (another command to use).

    Raises:
        SettingError: one line naming the argument.
    """
    for arg in argv:
        if arg.startswith("-"):
            raise SettingError(_shown(arg), f"not a setting of {program} (settings are key=value)")
    positional = [a for a in argv if "=" not in a]
    pairs = [a for a in argv if "=" in a]
    try:
        check_arguments(pairs, schema, program, extra)
    except SettingError as error:
        raise _hinted(error, hint) from None
    known = _known(schema, extra)
    values: dict[str, Any] = {}
    for name, item in known.items():
        _put(values, name, item.default)
    for arg in pairs:
        key, _, text = arg.partition("=")
        key = key.lstrip("+")
        item = known.get(key)
        _put(values, key, _typed(item, text))
    for name, item in known.items():
        if item.default == MISSING and _get(values, name) in (MISSING, None, ""):
            raise _hinted(SettingError(name, f"missing {name}=... (required)"), hint)
    check_values(values, schema)
    return positional, values


def flag_arguments(argv: list[str], switches: Iterable[str] = ()) -> list[str]:
    """``--name VALUE`` / ``--name=VALUE`` (``-`` in a name read as ``_``) and the bare
    ``--switch`` of ``switches`` → ``name=VALUE`` / ``switch=true``, for the one command whose
    flag form is part of the project's contract (``python -m datamodules.synthetic --out DIR
    --scenes N ...``); its ``key=value`` arguments pass unchanged to :func:`parse_key_values`."""
    switches = set(switches)
    out: list[str] = []
    rest = list(argv)
    while rest:
        arg = rest.pop(0)
        if not arg.startswith("--") or arg == "--":
            out.append(arg)
            continue
        name, sep, value = arg[2:].partition("=")
        name = name.replace("-", "_")
        if sep:
            out.append(f"{name}={value}")
        elif name in switches:
            out.append(f"{name}=true")
        elif rest and not rest[0].startswith("--"):
            out.append(f"{name}={rest.pop(0)}")
        else:
            raise SettingError(arg, "needs a value (--name VALUE, or name=VALUE)")
    return out


def _hinted(error: SettingError, hint: str) -> SettingError:
    return SettingError(error.path, f"{error.message} {hint}") if hint else error


def _typed(item: Declared | None, text: str) -> Any:
    """A checked command-line value as its setting's type."""
    value = _read(text)
    if item is None or value is None:
        return value
    of = _item_type(item.kind)
    if of is not None:
        return [
            _typed(Declared(item.name, of, False, None, {}), part) for part in _list_items(text)
        ]
    if item.kind is str:
        return text.strip()  # text settings keep what was typed (paths: 1e3, 007)
    if item.kind is float:
        return float(value)
    return value


def _get(values: dict, dotted: str) -> Any:
    value: Any = values
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _put(values: dict, dotted: str, value: Any) -> None:
    node = values
    parts = dotted.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value


# ---------------------------------------------------------------------------------- stopping


class Terminated(KeyboardInterrupt, SystemExit):
    """SIGTERM, raised like Ctrl-C so that every ``finally`` and ``except KeyboardInterrupt``
    cleans up the same way, and, when nothing reports it, the exit status 143 of a process ended
    by SIGTERM (it is also a ``SystemExit`` with ``code`` 143)."""

    def __init__(self) -> None:
        super().__init__()
        self.code = 128 + signal.SIGTERM


def _terminated(signum, frame) -> None:  # noqa: ARG001
    raise Terminated()


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """Within the block, SIGTERM raises :class:`Terminated` (in the main thread; elsewhere, and
    inside an enclosing block, nothing changes); the previous handler is put back after it."""
    main = threading.current_thread() is threading.main_thread()
    if not main or signal.getsignal(signal.SIGTERM) is _terminated:
        yield
        return
    previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def stopped_cleanly(program: str) -> Iterator[None]:
    """Run a command's body so that Ctrl-C and SIGTERM end it with one line on stderr
    (``infer.py: stopped by Ctrl-C``) and exit status 130 / 143, not a traceback; what the body
    cleans up in ``finally`` clauses (staging folders, SfM work folders, child processes) is
    cleaned up first. Every command runs its body in this block."""
    if threading.current_thread() is threading.main_thread():
        # the entry scripts' early Ctrl-C guard (while importing) hands over to this block
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with sigterm_raises():
            yield
    except KeyboardInterrupt as error:
        term = isinstance(error, Terminated)
        print(f"{program}: stopped by {'SIGTERM' if term else 'Ctrl-C'}", file=sys.stderr)
        raise SystemExit(143 if term else 130) from None


@contextlib.contextmanager
def stopped_by_signal(trainer: Any) -> Iterator[None]:
    """Around a Lightning ``trainer.fit`` / ``trainer.test`` inside :func:`stopped_cleanly`:
    Lightning ends a run that Ctrl-C or SIGTERM interrupted with ``sys.exit(1)``; this raises the
    interruption again (:class:`Terminated` when ``trainer.received_sigterm``), so that
    :func:`stopped_cleanly` prints its one line and exits 130 / 143. Lightning's own SIGTERM
    handler runs first and sets ``trainer.received_sigterm``."""
    previous = threading.excepthook
    threading.excepthook = _quiet_after_sigterm(trainer, previous)
    try:
        yield
    except KeyboardInterrupt:
        raise
    except SystemExit:
        if trainer.interrupted:
            raise (Terminated() if trainer.received_sigterm else KeyboardInterrupt()) from None
        raise
    except (OSError, EOFError, RuntimeError):
        # A SIGTERM to the process group also ends the loader workers: a batch being handed
        # over then fails (multiprocessing's resource_sharer: the worker that held its file
        # descriptor is gone). That is the stop, not an error of its own.
        if getattr(trainer, "received_sigterm", False):
            raise Terminated() from None
        raise
    finally:
        if not getattr(trainer, "received_sigterm", False):  # stopping: the hook stays to the end
            threading.excepthook = previous


def _quiet_after_sigterm(trainer: Any, previous: Callable) -> Callable:
    """A ``threading.excepthook`` that drops what multiprocessing's resource_sharer thread
    raises once ``trainer`` received SIGTERM (the group's SIGTERM ended the loader worker it was
    handing a batch to: the stop, not an error); everything else goes to ``previous``."""

    def hook(args: Any) -> None:
        where = {frame.f_code.co_filename for frame, _ in traceback.walk_tb(args.exc_traceback)}
        sharer = any(name.endswith("resource_sharer.py") for name in where)
        if sharer and getattr(trainer, "received_sigterm", False):
            return
        previous(args)

    return hook
