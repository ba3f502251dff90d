"""Helpers for the Hydra entry points (``train.py``, ``eval.py``, ``infer.py``).

Imported only by the scripts, so ``import models`` stays free of Hydra and Lightning.
"""

from __future__ import annotations

import functools
import glob
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import hydra
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from omegaconf import DictConfig, OmegaConf, open_dict

__all__ = [
    "UserError",
    "exit_on_user_error",
    "instantiate_group",
    "resolve_ckpt_path",
    "AtomicCheckpointIO",
    "prepare_logger_config",
]


class UserError(Exception):
    """Bad input from the user: reported as one line on stderr, exit status 2."""


def exit_on_user_error(fn: Callable) -> Callable:
    """Turn ``UserError``/``ValueError``/``FileNotFoundError`` into one line and exit status 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (UserError, ValueError, FileNotFoundError) as error:
            print(f"error: {_first_line(error)}", file=sys.stderr)
            sys.exit(2)
        except hydra.errors.InstantiationException as error:
            cause = error.__cause__ or error
            if isinstance(cause, (UserError, ValueError, FileNotFoundError)):
                print(f"error: {_first_line(cause)}", file=sys.stderr)
                sys.exit(2)
            raise

    return wrapper


def _first_line(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0]


def instantiate_group(config: DictConfig | None) -> list[Any]:
    """Instantiate every ``_target_`` entry of a config group (callbacks, loggers)."""
    objects = []
    if not config:
        return objects
    for _, entry in config.items():
        if isinstance(entry, DictConfig) and "_target_" in entry:
            objects.append(hydra.utils.instantiate(entry))
    return objects


def prepare_logger_config(cfg: DictConfig) -> None:
    """wandb without an API key runs offline (WANDB_MODE=disabled is honoured by wandb itself)."""
    logger = cfg.get("logger")
    if not logger or "wandb" not in logger:
        return
    logged_in = bool(os.environ.get("WANDB_API_KEY")) or Path("~/.netrc").expanduser().exists()
    if not logged_in:
        with open_dict(cfg):
            cfg.logger.wandb.offline = True


def latest_last_checkpoint(folder: str | os.PathLike) -> str | None:
    """The newest ``last.ckpt`` / ``last-vN.ckpt`` in ``folder`` (or ``None``).

    Lightning writes ``last-v1.ckpt`` beside an existing ``last.ckpt`` that its callback did not
    write itself (e.g. after the run folder was moved), so "last" means the newest of them.
    """
    candidates = glob.glob(os.path.join(os.fspath(folder), "last*.ckpt"))
    return max(candidates, key=os.path.getmtime) if candidates else None


def resolve_ckpt_path(ckpt_path: str | None, cfg: DictConfig) -> str | None:
    """Resolve ``ckpt_path=last``: this run's ``last.ckpt``, else the newest one of the same task.

    Returns ``None`` (fresh start) when ``last`` finds nothing; raises for a missing explicit path.
    """
    if ckpt_path is None:
        return None
    if ckpt_path != "last":
        if not os.path.isfile(ckpt_path):
            raise FileNotFoundError(f"{ckpt_path}: checkpoint not found")
        return ckpt_path
    here = latest_last_checkpoint(os.path.join(cfg.paths.output_dir, "checkpoints"))
    if here is not None:
        return here
    pattern = os.path.join(
        cfg.paths.log_dir, cfg.task_name, "runs", "*", "checkpoints", "last*.ckpt"
    )
    candidates = sorted(glob.glob(pattern), key=os.path.getmtime)
    if not candidates:
        print(f"ckpt_path=last: no checkpoint matches {pattern}; starting fresh", file=sys.stderr)
        return None
    print(f"ckpt_path=last: resuming from {candidates[-1]}", file=sys.stderr)
    return candidates[-1]


class AtomicCheckpointIO(TorchCheckpointIO):
    """Write checkpoints to a temporary file in the same folder, then rename into place.

    A run killed mid-write (SIGKILL) leaves the previous checkpoint intact, never a truncated one.
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options=None) -> None:
        path = os.fspath(path)
        folder = os.path.dirname(path) or "."
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp_", suffix=".ckpt")
        os.close(fd)
        try:
            super().save_checkpoint(checkpoint, tmp, storage_options)
            with open(tmp, "rb") as handle:
                os.fsync(handle.fileno())
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)


def config_to_yaml(cfg: DictConfig) -> str:
    return OmegaConf.to_yaml(cfg, resolve=True)
