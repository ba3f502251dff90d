"""Command-line arguments every entry point shares, before Hydra parses them.

Hydra's override grammar rejects unquoted values with accents, CJK characters, parentheses,
spaces and the like (``input=café`` is a lexer error), so path-valued arguments are quoted for it
here: a user types any path their shell passes. Pure Python: no Hydra import.
"""

from __future__ import annotations

import contextlib
import re
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

__all__ = ["PATH_KEYS", "Terminated", "config_help", "quote_path_arguments", "stopped_cleanly"]

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


def quote_path_arguments(argv: list[str], keys: frozenset[str] = PATH_KEYS) -> list[str]:
    """Quote the values of path settings (``key=value``, also ``+key=``/``++key=``) that Hydra
    would not parse unquoted; other arguments, and values already quoted, pass unchanged."""
    out = []
    for arg in argv:
        key, sep, value = arg.partition("=")
        bare = key.lstrip("+~")
        already = len(value) >= 2 and value[0] == value[-1] and value[0] in "'\""
        if sep and bare in keys and value and not already and not _PLAIN.fullmatch(value):
            arg = f"{key}={_quoted(value)}"
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


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C so that every ``finally`` and ``except KeyboardInterrupt``
    cleans up the same way."""


def _terminated(signum, frame) -> None:  # noqa: ARG001
    raise Terminated()


@contextlib.contextmanager
def stopped_cleanly(program: str) -> Iterator[None]:
    """Run a command's body so that Ctrl-C and SIGTERM end it with one line on stderr
    (``infer.py: stopped by Ctrl-C``) and exit status 130 / 143, not a traceback; what the body
    cleans up in ``finally`` clauses (staging folders, SfM work folders, child processes) is
    cleaned up first."""
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminated) if main else None
    if main:  # the entry scripts' early Ctrl-C guard (while importing) hands over to this block
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    except KeyboardInterrupt as error:
        term = isinstance(error, Terminated)
        print(f"{program}: stopped by {'SIGTERM' if term else 'Ctrl-C'}", file=sys.stderr)
        raise SystemExit(143 if term else 130) from None
    except SystemExit as error:
        if error.code == 143:  # models.output_folder.terminate_as_exit
            print(f"{program}: stopped by SIGTERM", file=sys.stderr)
        raise
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous)
