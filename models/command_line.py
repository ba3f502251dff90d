"""What every command shares: its arguments before Hydra parses them, the
plain ``key=value`` commands' tail, and the one-line stop on Ctrl-C or SIGTERM.

Hydra's override grammar rejects unquoted values with accents, CJK characters, parentheses,
spaces and the like (``input=café`` is a lexer error), so path-valued arguments are quoted for it
here (:func:`quote_path_arguments`): a user types any path their shell passes (the settings
themselves are declared and checked in :mod:`models.pipeline.settings`);
:func:`key_value_arguments` and :func:`run_key_value_command` are the argument parsing and the
``--help`` / one-line-error tail of the plain commands (``models.training.export``,
``models.weights.convert``); :func:`stopped_cleanly` ends a command on Ctrl-C or SIGTERM with one
line and exit status 130 / 143. Pure Python: no Hydra import.
"""

from __future__ import annotations

import contextlib
import re
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from datamodules.errors import InputError

__all__ = [
    "PATH_KEYS",
    "Terminated",
    "config_help",
    "key_value_arguments",
    "quote_lists",
    "quote_path_arguments",
    "run_key_value_command",
    "stopped_cleanly",
    "truthy",
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


def truthy(value: str | None) -> bool:
    """A ``key=value`` switch's value read as a yes (``1``, ``true``, ``yes``, ``on``)."""
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def key_value_arguments(
    argv: list[str],
    keys: tuple[str, ...],
    required: tuple[str, ...],
    error: Callable[[str, str], InputError],
    usage: str,
    strip: str = "",
) -> dict[str, str]:
    """The ``key=value`` arguments of a plain (non-Hydra) command, each key one of ``keys``
    once the characters ``strip`` are taken off its start (``"+"``: ``+key=`` is ``key=``).

    Raises:
        InputError: ``error(argument, message)`` for an argument that is not ``key=value``, a key
            not in ``keys`` or a ``required`` key missing or empty; the message ends with
            ``usage``.
    """
    args: dict[str, str] = {}
    for item in argv:
        key, sep, value = item.partition("=")
        key = key.lstrip(strip)
        if not sep or not key:
            raise error(item, f"expected key=value. {usage}")
        if key not in keys:
            raise error(item, f"unknown argument {key!r}. {usage}")
        args[key] = value
    for key in required:
        if not args.get(key):
            raise error(key, f"missing {key}=... {usage}")
    return args


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
