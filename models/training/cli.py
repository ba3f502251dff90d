"""Helpers for the Hydra entry points (``train.py``, ``eval.py``, ``infer.py``).

Imported only by the scripts, so ``import models`` stays free of Hydra and Lightning.
"""

from __future__ import annotations

import functools
import glob
import logging
import os
import re
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import hydra
import lightning as L
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.callbacks import RichProgressBar
from lightning.pytorch.loggers.csv_logs import CSVLogger, ExperimentWriter
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import MissingMandatoryValue

from datamodules.errors import InputError
from models.core.command_line import SettingError, closest
from models.weights.hub import PretrainedError, checkpoint_safe_globals, load_checkpoint_state_dict

__all__ = [
    "check_overrides",
    "UserError",
    "exit_on_user_error",
    "instantiate_group",
    "resolve_ckpt_path",
    "check_checkpoint",
    "continued_run",
    "TimeFromNow",
    "ResumableCSVLogger",
    "StepProgressBar",
    "quiet_third_party",
    "resume_safely",
    "AtomicCheckpointIO",
    "prepare_logger_config",
]


class UserError(InputError):
    """Bad input to ``train.py``/``eval.py`` (a setting, a checkpoint, an evaluation index)."""


# Bad input: every ``InputError``, and the ``ValueError`` a model or data constructor that Hydra
# instantiates raises for a setting it refuses; a missing file.
_BAD_INPUT = (InputError, ValueError, FileNotFoundError)


def exit_on_user_error(fn: Callable) -> Callable:
    """Turn bad input (``InputError``, ``ValueError``, ``FileNotFoundError``) into one line and
    exit status 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except _BAD_INPUT as error:
            print(f"error: {_first_line(error)}", file=sys.stderr)
            sys.exit(2)
        except MissingMandatoryValue as error:
            key = getattr(error, "full_key", None) or "a setting"
            print(f"error: {key}: required; pass {key}=... on the command line", file=sys.stderr)
            sys.exit(2)
        except hydra.errors.InstantiationException as error:
            cause = error.__cause__ or error
            if isinstance(cause, _BAD_INPUT):
                print(f"error: {_first_line(cause)}", file=sys.stderr)
                sys.exit(2)
            raise

    return wrapper


def check_overrides(
    argv: list[str], config_dir: str | Path, config_name: str, program: str
) -> None:
    """Compose the configuration with the command line's overrides before the run, so that a
    setting the configuration does not have is one line naming it and the closest one (``did you
    mean``), as in every other command, instead of Hydra's multi-line report.

    Raises:
        SettingError: an unknown setting, or an override Hydra cannot apply (its first line).
    """
    if any(arg in ("-m", "--multirun") for arg in argv):
        return  # a sweep: Hydra's sweeper reads its own grammar
    overrides = [arg for arg in argv if not arg.startswith("-")]
    try:
        _compose(config_dir, config_name, program, overrides)
    except (hydra.errors.HydraException, ValueError) as error:
        if isinstance(error, InputError):
            raise
        text = str(error)
        unknown = re.search(r"Could not override '([^']+)'", text)
        if unknown is None:
            raise SettingError(" ".join(overrides) or program, _first_line(error)) from None
        key = unknown.group(1)
        given = next((a for a in overrides if a.partition("=")[0].lstrip("+~") == key), key)
        rest = [a for a in overrides if a != given]
        raise SettingError(
            given, _unknown_message(key, rest, config_dir, config_name, program)
        ) from None


def _compose(config_dir: str | Path, config_name: str, program: str, overrides: list[str]):
    with hydra.initialize_config_dir(
        version_base="1.3", config_dir=str(config_dir), job_name=program.removesuffix(".py")
    ):
        return hydra.compose(config_name=config_name, overrides=overrides)


def _unknown_message(
    key: str, rest: list[str], config_dir: str | Path, config_name: str, program: str
) -> str:
    """``unknown setting of PROGRAM (did you mean ...?)``, the guess taken among the keys of the
    configuration the other overrides compose."""
    try:
        composed = OmegaConf.to_container(_compose(config_dir, config_name, program, rest))
    except (hydra.errors.HydraException, ValueError):
        composed = {}
    names = list(_leaf_names(composed))
    guess = closest(key, names)
    group = key.rpartition(".")[0]
    if guess is None and group:
        siblings = [n for n in names if n.startswith(f"{group}.")]
        guess = closest(key, siblings)
    hint = f" (did you mean {guess}?)" if guess else ""
    return f"unknown setting of {program}{hint}; to add it, write +{key}=..."


def _leaf_names(tree: Any, prefix: str = "") -> Iterator[str]:
    if isinstance(tree, dict):
        for name, value in tree.items():
            yield from _leaf_names(value, f"{prefix}{name}.")
    elif prefix:
        yield prefix[:-1]


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


def continued_run(ckpt_path: str, cfg: DictConfig) -> str | None:
    """The run folder a ``ckpt_path=last`` checkpoint belongs to (``<run>/checkpoints/x.ckpt``
    under this task's runs), when it is not this run's: the resumed run continues there."""
    folder = os.path.dirname(os.path.dirname(os.path.abspath(ckpt_path)))
    runs = os.path.abspath(os.path.join(cfg.paths.log_dir, cfg.task_name, "runs"))
    if os.path.dirname(folder) != runs or folder == os.path.abspath(cfg.paths.output_dir):
        return None
    return folder


class TimeFromNow(L.Callback):
    """On resume, ``trainer.max_time`` counts from now: Lightning's timer restores the time a
    run already spent, so a resumed run would otherwise stop at once."""

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        from lightning.pytorch.callbacks import Timer

        # ``setup`` runs before the checkpoint's callback states are restored: the timer then
        # ignores the elapsed time saved with the checkpoint.
        for callback in trainer.callbacks:
            if isinstance(callback, Timer):
                callback.load_state_dict = lambda state_dict: None


def check_checkpoint(path: str) -> None:
    """Refuse a training checkpoint that ``weights_only=True`` cannot read (a pickle that would
    run code, a truncated file) before Lightning touches it; one line naming the file."""
    try:
        load_checkpoint_state_dict(path)
    except PretrainedError as error:
        raise UserError(str(error)) from None


def resume_safely():
    """The context in which ``trainer.fit(..., weights_only=True)`` may read this project's
    checkpoints: the data-only classes they hold (OmegaConf hyper-parameters) allowlisted."""
    import torch

    return torch.serialization.safe_globals(checkpoint_safe_globals())


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


class ResumableCSVLogger(CSVLogger):
    """Lightning's CSV logger without its deletion of an existing ``metrics.csv``: a resumed run
    appends to the metrics of the run it continues (the header is widened when keys are new)."""

    @property
    def experiment(self):
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _AppendingWriter(log_dir=self.log_dir)
        return self._experiment


class _AppendingWriter(ExperimentWriter):
    def _check_log_dir_exists(self) -> None:
        """Keep the earlier ``metrics.csv`` (Lightning's version deletes it)."""


class StepProgressBar(RichProgressBar):
    """Lightning's rich progress bar, without ``Epoch 0/-2`` for step-budgeted runs (this project
    trains by ``max_steps``/``max_time``: an endless epoch count is not a total)."""

    def _get_train_description(self, current_epoch: int) -> str:
        description = f"Epoch {current_epoch}"
        max_epochs = self.trainer.max_epochs
        if max_epochs is not None and max_epochs > 0:
            description += f"/{max_epochs - 1}"
        if self.trainer.max_steps and self.trainer.max_steps > 0:
            description += f" · step {self.trainer.global_step}/{self.trainer.max_steps}"
        return description


# Lightning's start-up chatter that says nothing about the user's run.
_NOISE = (
    "💡 Tip:",
    "GPU available:",
    "TPU available:",
    "HPU available:",
    "Trainer already configured with model summary callbacks",
    "\nDetected KeyboardInterrupt",  # train.py says it in one line (stopped_cleanly)
    "Received SIGTERM",  # likewise (Lightning's signal connector, "[rank: 0] " first)
    "Bypassing SIGTERM",
)


class _DropNoise(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = re.sub(r"^\[rank: \d+\] ", "", str(record.getMessage()))
        return not message.startswith(_NOISE)


def quiet_third_party() -> None:
    """Drop Lightning's product tips and accelerator notices and a deprecation warning that
    Lightning's own code triggers (``LeafSpec``), so a run's output is the run."""
    for name in (
        "lightning.pytorch.utilities.rank_zero",
        "lightning.fabric.utilities.rank_zero",
        "lightning.pytorch.trainer.connectors.signal_connector",
    ):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropNoise) for f in logger.filters):
            logger.addFilter(_DropNoise())
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)")
