"""Training recipes: each family's loss-term weights and schedules, apart from its architecture.

A model's forward returns its auxiliary loss terms **unweighted** (``ModelOutput.losses``); a
recipe, injected by config (``configs/model/<family>.yaml``: ``recipe: {_target_: ...}``), says how
training uses them:

- ``setup(net)``: once, before the optimiser is built (ReSplat's stage 2 freezes the initial model);
- ``train_kwargs(net, step, max_steps)``: training-only forward keywords of one step (ZipSplat's
  sampled cluster ratio and camera-prior share, ReSplat's iteration count);
- ``render_targets(pred)``: the ``(weight, Gaussians)`` sets whose renders the photometric loss
  supervises (ReSplat: every iteration, decayed);
- ``weigh(losses)``: the weighted auxiliary terms added to the loss.

None of them is a constructor argument, so none is published in ``config.json`` with the weights.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from models.core.base import ModelOutput
from models.core.gaussians import Gaussians
from models.families.zipsplat import compression_schedule

__all__ = [
    "TrainingRecipe",
    "ReSplatTrainingRecipe",
    "SplatWeaverTrainingRecipe",
    "ZipSplatTrainingRecipe",
    "default_recipe",
    "recipe_record",
]


@dataclass
class TrainingRecipe:
    """The plain recipe: one render of ``pred.gaussians``, auxiliary terms weighted by
    ``loss_weights`` (a term without an entry has weight 1). Pixel-aligned and DepthSplat models
    use it as it is.

    Args:
        loss_weights: weight of each auxiliary loss term, by name (``ModelOutput.losses``).
    """

    loss_weights: dict[str, float] = field(default_factory=dict)

    def setup(self, net: nn.Module) -> None:
        """Prepare ``net`` for training (called once by the LightningModule)."""

    def train_kwargs(self, net: nn.Module, step: int, max_steps: int) -> dict[str, Any]:
        """Training-only forward keywords of one step."""
        return {}

    def render_targets(self, pred: ModelOutput) -> list[tuple[float, Gaussians]]:
        """``(weight, Gaussians)`` sets the photometric loss renders and supervises."""
        return pred.render_targets or [(1.0, pred.gaussians)]

    def weigh(self, losses: dict[str, Tensor]) -> dict[str, Tensor]:
        """The weighted auxiliary loss terms, by name (terms of weight 0 left out)."""
        weighted = {}
        for name, value in losses.items():
            weight = float(self.loss_weights.get(name, 1.0))
            if weight != 0.0:
                weighted[name] = weight * value
        return weighted


@dataclass
class ZipSplatTrainingRecipe(TrainingRecipe):
    """ZipSplat: a sampled cluster ratio per step, the camera prior for some scenes, Chamfer.

    Args:
        camera_prior_prob: fraction of training scenes given the camera prior (0 when the model
            has no camera-prior embedding).
        r_min_final: lower end of the sampled ratio after the anneal, at 2 views.
        anneal_fraction: fraction of training over which ``r_min`` anneals from 1.
        train_views: context views of the training data (scales ``r_min_final`` by
            ``(2 / train_views) ** 0.5``).
        chamfer_weight: weight of the Chamfer term between the Gaussian means and the context
            views' ground-truth depth points (0: not computed).
        chamfer_points: ground-truth points sampled per scene for it.
    """

    camera_prior_prob: float = 0.2
    r_min_final: float = 0.5
    anneal_fraction: float = 0.5
    train_views: int = 2
    chamfer_weight: float = 0.1
    chamfer_points: int = 2048

    def __post_init__(self) -> None:
        if not 0.0 <= self.camera_prior_prob <= 1.0:
            raise ValueError(f"camera_prior_prob must be in [0, 1], got {self.camera_prior_prob}")
        if not 0.0 < self.r_min_final <= 1.0:
            raise ValueError(f"r_min_final must be in (0, 1], got {self.r_min_final}")
        self.loss_weights = {"chamfer": self.chamfer_weight, **self.loss_weights}

    def train_kwargs(self, net: nn.Module, step: int, max_steps: int) -> dict[str, Any]:
        """``compression``: ``r ~ U[r_min, 1]`` with ``r_min`` from ``compression_schedule``
        (drawn from torch's global generator, so seeded runs repeat); ``camera_prior``: the
        probability with which each scene gets the prior; ``chamfer_points`` when the Chamfer
        term is on."""
        r_min = compression_schedule(
            step, max_steps, self.r_min_final, self.anneal_fraction, self.train_views
        )
        r = r_min + (1.0 - r_min) * float(torch.rand(()))
        has_prior = getattr(net, "camera_prior_embed", None) is not None
        kwargs: dict[str, Any] = {
            "compression": r,
            "camera_prior": self.camera_prior_prob if has_prior else 0.0,
        }
        if self.chamfer_weight > 0:
            kwargs["chamfer_points"] = self.chamfer_points
        return kwargs


@dataclass
class ReSplatTrainingRecipe(TrainingRecipe):
    """ReSplat: 1..``train_iterations`` iterations per step, every iteration's render
    supervised with weight ``loss_decay ** (N - 1 - i)``; two stages.

    Args:
        train_iterations: training samples 1..this many iterations per step; 0 trains the
            initial model alone (stage 1).
        loss_decay: per-iteration loss weight ``loss_decay ** (N - 1 - i)``.
        freeze_init: freeze the initial model and drop its render from the loss (stage 2).
    """

    train_iterations: int = 4
    loss_decay: float = 0.9
    freeze_init: bool = False

    def __post_init__(self) -> None:
        if self.train_iterations < 0:
            raise ValueError(f"train_iterations must be >= 0, got {self.train_iterations}")
        if self.freeze_init and self.train_iterations == 0:
            raise ValueError("freeze_init=True needs train_iterations >= 1 (nothing would train)")

    def setup(self, net: nn.Module) -> None:
        if self.freeze_init:
            net.freeze_initial_model()

    def train_kwargs(self, net: nn.Module, step: int, max_steps: int) -> dict[str, Any]:
        if self.train_iterations == 0:
            return {"iterations": 0}
        return {"iterations": int(torch.randint(1, self.train_iterations + 1, ()).item())}

    def render_targets(self, pred: ModelOutput) -> list[tuple[float, Gaussians]]:
        sets = pred.gaussians_per_iteration or [pred.gaussians]
        count = len(sets)
        return [
            (self.loss_decay ** (count - 1 - i), g)
            for i, g in enumerate(sets)
            if not (i == 0 and self.freeze_init and count > 1)
        ]


@dataclass
class SplatWeaverTrainingRecipe(TrainingRecipe):
    """SplatWeaver: the routing regulariser ``routing_weight * (CE_smoothed + usage_weight * KL)``.

    The model returns the parts unweighted: ``routing_ce`` (cross-entropy to the quantile
    targets), ``routing_smoothing`` (cross-entropy to the uniform distribution) and
    ``routing_usage`` (``KL(mean usage || target usage)``); label smoothing ``e`` is the mix
    ``(1 - e) * routing_ce + e * routing_smoothing``, which is exactly
    ``F.cross_entropy(..., label_smoothing=e)``.

    Args:
        routing_weight: weight of the whole regulariser.
        usage_weight: weight of the usage penalty relative to the cross-entropy.
        label_smoothing: label smoothing of the routing cross-entropy.
    """

    routing_weight: float = 0.01
    usage_weight: float = 1.0
    label_smoothing: float = 0.1

    def __post_init__(self) -> None:
        if not 0.0 <= self.label_smoothing <= 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1], got {self.label_smoothing}")
        e = self.label_smoothing
        self.loss_weights = {
            "routing_ce": self.routing_weight * (1.0 - e),
            "routing_smoothing": self.routing_weight * e,
            "routing_usage": self.routing_weight * self.usage_weight,
            **self.loss_weights,
        }

    def weigh(self, losses: dict[str, Tensor]) -> dict[str, Tensor]:
        """One logged term ``routing`` (the regulariser, as before the split) plus any other."""
        weighted = super().weigh(losses)
        parts = [
            weighted.pop(k)
            for k in ("routing_ce", "routing_smoothing", "routing_usage")
            if k in weighted
        ]
        if parts:
            weighted["routing"] = sum(parts)
        return weighted


# Recipes by family (``SplatModel.family``) when a config gives none.
_DEFAULTS: dict[str, type[TrainingRecipe]] = {
    "zipsplat": ZipSplatTrainingRecipe,
    "resplat": ReSplatTrainingRecipe,
    "splatweaver": SplatWeaverTrainingRecipe,
}


def default_recipe(net: nn.Module) -> TrainingRecipe:
    """The family's recipe with its default settings (the plain ``TrainingRecipe`` for the others)."""
    return _DEFAULTS.get(getattr(net, "family", ""), TrainingRecipe)()


def recipe_record(recipe: TrainingRecipe) -> dict[str, Any]:
    """A plain record of a recipe for checkpoint hyper-parameters (``weights_only`` loadable)."""
    record = {"class": f"{type(recipe).__module__}.{type(recipe).__qualname__}"}
    if dataclasses.is_dataclass(recipe):
        record.update(dataclasses.asdict(recipe))
    return record
