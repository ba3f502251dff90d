"""Hydra configurations of the entry points (``configs/``) as the commands would compose them,
with the run's folders under a test's temporary folder."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict

REPO_ROOT = Path(__file__).resolve().parents[1]
CONFIGS = REPO_ROOT / "configs"


def compose_config(
    name: str, overrides: list[str], tmp: Path, out: Path | None = None
) -> DictConfig:
    """``configs/<name>`` with ``overrides``, its output folder ``out`` (default ``tmp/out``)
    and its logs in ``tmp/logs``, set as the current Hydra config (what ``@hydra.main`` does)."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = compose(name, overrides=overrides, return_hydra_config=True)
    out = out or tmp / "out"
    with open_dict(cfg):
        cfg.paths.output_dir = str(out)
        cfg.paths.log_dir = str(tmp / "logs")
        cfg.hydra.runtime.output_dir = str(out)
        cfg.hydra.job.num = 0
    HydraConfig().set_config(cfg)
    return cfg


def infer_in_process(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str, str]:
    """What ``python infer.py ARGS`` runs, in this process (spares a torch start-up): the exit
    status, stdout and stderr."""
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    import infer

    capsys.readouterr()
    status = infer.run_cli(infer.compose(list(args)))
    out = capsys.readouterr()
    return status, out.out, out.err
