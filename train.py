"""Train a splatzoo model: ``python train.py experiment=synthetic_pixel_aligned``.

Hydra composes ``configs/train.yaml``; see the README for sweeps (``-m``, ``hparams_search=optuna``)
and resuming (``ckpt_path=last``).
"""

from __future__ import annotations

import os
import signal
import sys

if __name__ == "__main__":  # Ctrl-C while the imports below load: one line, no traceback
    signal.signal(signal.SIGINT, lambda *_: (print("train.py: stopped by Ctrl-C", file=sys.stderr), os._exit(130)))  # fmt: skip  # noqa: E501

import hydra
import lightning as L
import torch
from omegaconf import DictConfig, open_dict

from datamodules.errors import InputError
from models.core.command_line import quote_path_arguments, stopped_by_signal, stopped_cleanly
from models.training.cli import (
    AtomicCheckpointIO,
    StepProgressBar,
    TimeFromNow,
    UserError,
    check_checkpoint,
    check_overrides,
    continued_run,
    exit_on_user_error,
    instantiate_group,
    prepare_logger_config,
    quiet_third_party,
    resolve_ckpt_path,
    resume_safely,
)
from models.weights.registry import to_plain

CONFIG_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")


def train(cfg: DictConfig) -> dict[str, float]:
    """Fit (and optionally test) the configured model; returns the logged metrics."""
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    ckpt_path = resolve_ckpt_path(cfg.get("ckpt_path"), cfg)
    callbacks = []
    if ckpt_path is not None:
        check_checkpoint(ckpt_path)  # before Lightning reads it: one line if it is unusable
        callbacks.append(TimeFromNow())  # trainer.max_time counts from now
        run = continued_run(ckpt_path, cfg) if cfg.get("ckpt_path") == "last" else None
        if run is not None:
            print(f"ckpt_path=last: continuing run {run}", file=sys.stderr)
            with open_dict(cfg):
                cfg.paths.output_dir = run  # checkpoints and logs continue in the same run
    prepare_logger_config(cfg)
    datamodule: L.LightningDataModule = hydra.utils.instantiate(cfg.data)
    # Synthetic data is generated (first use) now, with its own progress bar counting scenes,
    # not behind the trainer's bar counting steps.
    datamodule.prepare_data()
    module: L.LightningModule = hydra.utils.instantiate(cfg.model)
    callbacks += instantiate_group(cfg.get("callbacks"))
    if cfg.trainer.get("enable_progress_bar", True):
        callbacks.append(StepProgressBar())
    loggers = instantiate_group(cfg.get("logger"))
    trainer: L.Trainer = hydra.utils.instantiate(
        cfg.trainer, callbacks=callbacks, logger=loggers or False, plugins=[AtomicCheckpointIO()]
    )
    for logger in loggers:
        logger.log_hyperparams(to_plain(cfg))
    metrics: dict[str, float] = {}
    if cfg.get("train", True):
        with resume_safely(), stopped_by_signal(trainer):  # no checkpoint is unpickled as code
            trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path, weights_only=True)
        metrics.update({k: float(v) for k, v in trainer.callback_metrics.items()})
    if cfg.get("test", False):
        best = getattr(trainer.checkpoint_callback, "best_model_path", "") or None
        with stopped_by_signal(trainer):
            trainer.test(module, datamodule=datamodule, ckpt_path=best)
        metrics.update({k: float(v) for k, v in trainer.callback_metrics.items()})
    return metrics


@hydra.main(version_base="1.3", config_path="configs", config_name="train.yaml")
@exit_on_user_error
def main(cfg: DictConfig) -> float | None:
    if "_target_" not in cfg.get("model", {}):
        raise UserError("no model selected: pass model=<name> (see configs/model/)")
    torch.set_float32_matmul_precision("high")
    metrics = train(cfg)
    name = cfg.get("optimized_metric")
    if name is None:
        return None
    if name not in metrics:
        print(
            f"optimized_metric {name!r} was not logged; logged: {sorted(metrics)}", file=sys.stderr
        )
        return None
    return metrics[name]


if __name__ == "__main__":
    os.environ.setdefault("PROJECT_ROOT", os.path.dirname(os.path.abspath(__file__)))
    sys.argv[1:] = quote_path_arguments(sys.argv[1:])  # any path a user can type
    quiet_third_party()
    with stopped_cleanly("train.py"):
        try:
            check_overrides(sys.argv[1:], CONFIG_DIR, "train.yaml", "train.py")
        except InputError as error:
            print(f"error: {' '.join(str(error).split())}", file=sys.stderr)
            sys.exit(2)
        main()
