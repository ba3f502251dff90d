"""What the commands that refine share: a held-out scorer for the fit's curve, the plot of
held-out PSNR against steps."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch.nn.functional as F
from torch import Tensor

from models.core.gaussians import Gaussians
from models.pipeline.metrics import psnr_per_image
from models.render import render

__all__ = ["holdout_evaluator", "plot_holdout_psnr"]


def holdout_evaluator(
    images: Tensor, extrinsics: Tensor, intrinsics: Tensor, shape: tuple[int, int], backend: str
) -> tuple[Callable[[Gaussians, Tensor], dict[str, float]], Tensor]:
    """``(evaluate, targets)``: ``evaluate(gaussians, train_extrinsics)`` is the mean PSNR of the
    held-out photos ``images`` ``[H, 3, h, w]`` (resized to ``shape`` with area averaging, the
    ``targets``) rendered at their cameras (``[H, 4, 4]``, normalised ``[H, 3, 3]``) — the
    ``evaluate`` of :func:`models.pipeline.refine.refine_gaussians`."""
    target = images.float()
    if tuple(target.shape[-2:]) != tuple(shape):
        target = F.interpolate(target, size=shape, mode="area")
    device = target.device

    def evaluate(gaussians: Gaussians, _train_extrinsics: Tensor) -> dict[str, float]:
        out = render(
            gaussians,
            extrinsics[None].to(device),
            intrinsics[None].to(device),
            shape,
            backend=backend,
        )
        return {"psnr": float(psnr_per_image(out.color[0].clamp(0, 1), target).mean())}

    return evaluate, target


def plot_holdout_psnr(evaluations: list[dict], baseline: float | None, path: Path) -> None:
    """Held-out PSNR against steps (a PNG), with the nearest-view baseline as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(5, 3.2), dpi=100)
    axis.plot(
        [e["step"] for e in evaluations], [e["psnr"] for e in evaluations], "o-", label="refined"
    )
    if baseline is not None:
        axis.axhline(baseline, color="grey", linestyle="--", label="nearest view")
    axis.set_xlabel("step")
    axis.set_ylabel("held-out PSNR (dB)")
    axis.legend()
    axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
