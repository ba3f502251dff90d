"""Train a splatzoo model: ``python train.py experiment=synthetic_pixel_aligned``.

Hydra composes ``configs/train.yaml``; see the README for sweeps (``-m``, ``hparams_search=optuna``)
and resuming (``ckpt_path=last``).
"""

from __future__ import annotations

import os
import sys

import hydra
import lightning as L
import torch
from omegaconf import DictConfig, OmegaConf

from models.cli import (
    AtomicCheckpointIO,
    UserError,
    exit_on_user_error,
    instantiate_group,
    prepare_logger_config,
    resolve_ckpt_path,
)


def train(cfg: DictConfig) -> dict[str, float]:
    """Fit (and optionally test) the configured model; returns the logged metrics."""
    L.seed_everything(cfg.seed, workers=True)
    prepare_logger_config(cfg)
    datamodule: L.LightningDataModule = hydra.utils.instantiate(cfg.data)
    module: L.LightningModule = hydra.utils.instantiate(cfg.model)
    callbacks = instantiate_group(cfg.get("callbacks"))
    loggers = instantiate_group(cfg.get("logger"))
    trainer: L.Trainer = hydra.utils.instantiate(
        cfg.trainer, callbacks=callbacks, logger=loggers or False, plugins=[AtomicCheckpointIO()]
    )
    for logger in loggers:
        logger.log_hyperparams(OmegaConf.to_container(cfg, resolve=True))
    ckpt_path = resolve_ckpt_path(cfg.get("ckpt_path"), cfg)
    metrics: dict[str, float] = {}
    if cfg.get("train", True):
        trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path)
        metrics.update({k: float(v) for k, v in trainer.callback_metrics.items()})
    if cfg.get("test", False):
        best = getattr(trainer.checkpoint_callback, "best_model_path", "") or None
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
    main()
