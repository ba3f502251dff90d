"""Pieces every benchmark shares: loading trained weights, the test split (at any number of
context views) and scoring a scene's target views.

Benchmarks run as scripts (``python bench/<name>.py``); importing this module puts the repository
root on ``sys.path`` so that ``models`` and ``datamodules`` import from a checkout.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from datamodules.training.samplers import load_evaluation_index  # noqa: E402
from models import Gaussians, load_model, render  # noqa: E402
from models.pipeline.metrics import lpips_inputs, psnr_per_image, ssim_per_image  # noqa: E402

__all__ = [
    "REPO_ROOT",
    "data_config",
    "load_weights",
    "score_targets",
    "test_loader",
    "to_device",
    "widen_index",
]


def load_weights(location: str, device: torch.device | str = "cpu", **overrides: Any) -> nn.Module:
    """The registry model that ``location`` (``.ckpt``, folder, ``hf-hub:``) describes, with its
    weights, in eval mode on ``device`` (see ``models.weights.factory.load_model``)."""
    return load_model(location, **overrides).to(device).eval()


def data_config(name: str = "synthetic", root: str | None = None, index: str | None = None):
    """``configs/data/<name>.yaml`` as train.py composes it, with optional root / index."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(REPO_ROOT / "configs"), version_base="1.3"):
        cfg = compose(config_name="train.yaml", overrides=[f"data={name}"])
    data_cfg = cfg.data
    if root:
        data_cfg.root = root
        data_cfg.generate_if_missing = False
    if index:
        data_cfg.eval_index = str(index)
    return data_cfg


def test_loader(data_cfg, views: int | None = None, index: str | Path | None = None, batch_size=1):
    """The test loader of ``data_cfg`` (evaluation index order), optionally with ``views``
    context views and another evaluation index."""
    from hydra.utils import instantiate

    data_cfg = data_cfg.copy()
    if index is not None:
        data_cfg.eval_index = str(index)
    if views is not None:
        data_cfg.num_context_views = views
    data_cfg.test_batch_size = batch_size
    data_cfg.num_workers = 0
    data_cfg.persistent_workers = False
    datamodule = instantiate(data_cfg)
    datamodule.setup("test")
    return datamodule.test_dataloader()


def widen_index(index_path: str | Path, views: int, out_path: str | Path) -> tuple[int, int]:
    """Write an evaluation index with ``views`` context views per scene.

    The outer context frames and the targets of each entry are kept (so the scene frame, its
    scale and the targets stay the same); ``views - 2`` frames strictly between the outer ones
    are added, evenly spaced and never a target. Entries without enough free frames become
    ``null`` (skipped by the evaluation sampler).

    Returns:
        ``(kept, skipped)`` scene counts.
    """
    if views < 2:
        raise ValueError(f"views must be >= 2, got {views}")
    index = load_evaluation_index(index_path)
    widened: dict[str, dict[str, list[int]] | None] = {}
    kept = skipped = 0
    for key, entry in index.items():
        if entry is None:
            widened[key] = None
            continue
        first, last = min(entry["context"]), max(entry["context"])
        targets = set(entry["target"])
        free = [f for f in range(first + 1, last) if f not in targets]
        extra: list[int] = []
        for m in range(1, views - 1):
            wanted = first + (last - first) * m / (views - 1)
            candidates = [f for f in free if f not in extra]
            if not candidates:
                break
            extra.append(min(candidates, key=lambda f: (abs(f - wanted), f)))
        if len(extra) < views - 2:
            widened[key] = None
            skipped += 1
            continue
        widened[key] = {"context": sorted([first, last] + extra), "target": list(entry["target"])}
        kept += 1
    Path(out_path).write_text(json.dumps(widened, indent=1), encoding="utf-8")
    return kept, skipped


def to_device(batch: dict, device: torch.device | str) -> dict:
    """``batch`` with the tensors of its ``context``/``target`` dicts moved to ``device``."""
    return {
        key: ({k: v.to(device) for k, v in value.items()} if isinstance(value, dict) else value)
        for key, value in batch.items()
    }


def score_targets(
    gaussians: Gaussians,
    target: dict[str, Tensor],
    backend: str = "auto",
    extrinsics: Tensor | None = None,
    lpips: nn.Module | None = None,
) -> dict[str, Tensor]:
    """Render the target views and score them.

    Args:
        gaussians: ``[B, N]`` Gaussians.
        target: ``image [B, T, 3, H, W]``, ``extrinsics``, ``intrinsics``.
        backend: renderer backend.
        extrinsics: ``[B, T, 4, 4]`` to render from instead of ``target["extrinsics"]`` (refined
            poses).
        lpips: a ``models.pipeline.metrics.build_lpips`` module to also score LPIPS with.

    Returns:
        Per-scene ``psnr``, ``ssim`` (means over the targets), ``gaussians`` (count) and, with
        ``lpips``, ``lpips``; each ``[B]``.
    """
    images = target["image"]
    shape = (int(images.shape[-2]), int(images.shape[-1]))
    poses = target["extrinsics"] if extrinsics is None else extrinsics
    out = render(gaussians, poses, target["intrinsics"], shape, backend=backend)
    scores = {
        "psnr": psnr_per_image(out.color, images).mean(dim=1),
        "ssim": ssim_per_image(out.color, images).mean(dim=1),
        "gaussians": gaussians.count().to(images.dtype),
    }
    if lpips is not None:
        p, t = lpips_inputs(out.color), lpips_inputs(images)
        scores["lpips"] = lpips.net(p, t).reshape(images.shape[:2]).mean(dim=1)
    return scores
