"""One thin LightningModule for every family: render the targets, compute the losses, log.

The network (``net``, any ``SplatModel``) and its family's training recipe (``recipe``, a
``models.training.recipes.TrainingRecipe``; the family's default when not given) are injected. The
architecture stays in the network; the training settings are the recipe's:
``recipe.train_kwargs(net, step, max_steps)`` gives per-step forward keywords (ZipSplat's sampled
compression, ReSplat's iteration count), ``recipe.weigh(pred.losses)`` the weighted auxiliary
terms added to the loss, and ``recipe.render_targets(pred)`` (a list of ``(weight, Gaussians)``)
the sets whose renders are supervised (ReSplat's iterations).
"""

from __future__ import annotations

import math
import os
import warnings
from typing import Any

import lightning as L
import torch
from torch import Tensor, nn
from torchmetrics import MeanMetric

from models.core.base import ModelOutput
from models.core.gaussians import Gaussians
from models.pipeline import pose_fit
from models.pipeline.metrics import (
    build_lpips,
    lpips_inputs,
    mean_color_baseline,
    nearest_view_baseline,
    psnr_per_image,
    ssim_per_image,
)
from models.render.core import render
from models.training.recipes import TrainingRecipe, default_recipe, recipe_record
from models.weights.registry import to_plain

__all__ = ["SplatLitModule", "net_identity"]


def net_identity(net: nn.Module) -> dict[str, Any]:
    """What a checkpoint records to rebuild its network: registry name, class and config."""
    config = getattr(net, "_hub_mixin_config", None)
    return {
        "model_name": getattr(net, "registry_name", None),
        "model_class": f"{type(net).__module__}.{type(net).__qualname__}",
        "model_config": dict(config) if config is not None else None,
    }


class SplatLitModule(L.LightningModule):
    """Training, validation and test logic shared by every family.

    Args:
        net: the network (a ``SplatModel``).
        recipe: the family's training recipe (loss-term weights, schedules, training-only
            forward keywords); ``None``: the family's default (``recipes.default_recipe``).
        lr: AdamW learning rate.
        backbone_lr_scale: multiplier of ``lr`` for parameters under a ``backbone`` attribute.
        weight_decay: AdamW weight decay.
        betas: AdamW betas.
        warmup_steps: linear warm-up steps.
        min_lr_ratio: the cosine schedule ends at ``lr * min_lr_ratio``.
        photometric_loss: ``"mse"`` or ``"l1"``.
        lpips_weight: weight of the LPIPS loss (0 disables it).
        lpips_start_step: step from which the LPIPS loss is added.
        depth_weight: weight of the depth loss when the batch has GT depth.
        render_backend: ``"auto"``, ``"torch"``, ``"gsplat"`` or ``"cpu"`` (see ``models.render``).
        background: RGB background of the renders.
        num_val_images: validation scenes whose renders are logged.
        fit_target_poses: test-time target-pose fit for pose-free models.
        pose_fit_steps: Adam steps of that refinement.
        compute_baselines: also score the mean-colour and nearest-context-view baselines in test.
        eval_kwargs: forward keywords at validation/test time (e.g. ``{"compression": 0.5}``).
    """

    def __init__(
        self,
        net: nn.Module,
        lr: float = 2e-4,
        backbone_lr_scale: float = 1.0,
        weight_decay: float = 0.01,
        betas: tuple[float, float] = (0.9, 0.999),
        warmup_steps: int = 100,
        min_lr_ratio: float = 0.1,
        photometric_loss: str = "mse",
        lpips_weight: float = 0.0,
        lpips_start_step: int = 0,
        depth_weight: float = 0.0,
        render_backend: str = "auto",
        background: tuple[float, float, float] = (0.0, 0.0, 0.0),
        num_val_images: int = 3,
        fit_target_poses: bool = True,
        pose_fit_steps: int = 100,
        compute_baselines: bool = True,
        eval_kwargs: dict | None = None,
        recipe: TrainingRecipe | None = None,
    ) -> None:
        super().__init__()
        if photometric_loss not in ("mse", "l1"):
            raise ValueError(f"photometric_loss must be 'mse' or 'l1', got {photometric_loss!r}")
        self.save_hyperparameters(ignore=["net", "recipe"], logger=False)
        # Hydra passes OmegaConf containers; checkpoints must load with weights_only=True.
        for key, value in list(self.hparams.items()):
            self.hparams[key] = to_plain(value)
        self.hparams.update(net_identity(net))
        self.recipe = recipe if recipe is not None else default_recipe(net)
        self.hparams["recipe"] = to_plain(recipe_record(self.recipe))  # plain, for the logs
        self.recipe.setup(net)
        self.net = net
        self.lpips = build_lpips(required=False) if lpips_weight > 0 else None
        self.lpips_metric: nn.Module | None = None  # built lazily for validation/test
        self.val_psnr = MeanMetric()
        self.val_ssim = MeanMetric()
        self.val_lpips = MeanMetric()
        self.skipped_steps = 0
        self.test_records: list[dict[str, Any]] = []
        self.test_samples: list[dict[str, Tensor]] = []

    # ------------------------------------------------------------------ helpers
    def _background(self, like: Tensor) -> Tensor:
        return torch.tensor(self.hparams.background, dtype=like.dtype, device=like.device)

    def render_views(
        self, gaussians: Gaussians, views: dict[str, Tensor], extrinsics: Tensor | None = None
    ):
        """Render ``views``' cameras in float32 (autocast off: the rasteriser wants fp32)."""
        image = views["image"]
        shape = image.shape[-2:]
        with torch.autocast(device_type=image.device.type, enabled=False):
            return render(
                gaussians.to(torch.float32),
                (views["extrinsics"] if extrinsics is None else extrinsics).float(),
                views["intrinsics"].float(),
                (int(shape[0]), int(shape[1])),
                background=self._background(image.float()),
                backend=self.hparams.render_backend,
            )

    def _photometric(self, prediction: Tensor, target: Tensor) -> Tensor:
        if self.hparams.photometric_loss == "l1":
            return (prediction - target).abs().mean()
        return (prediction - target).square().mean()

    def _lpips_loss(self, prediction: Tensor, target: Tensor) -> Tensor:
        p, t = lpips_inputs(prediction), lpips_inputs(target)
        return self.lpips.net(p, t).mean()

    def forward(self, context: dict[str, Tensor], **kwargs) -> ModelOutput:
        return self.net(context, **kwargs)

    def _max_steps(self) -> int:
        trainer = getattr(self, "_trainer", None)
        if trainer is None:
            return 1
        if trainer.max_steps and trainer.max_steps > 0:
            return int(trainer.max_steps)
        try:
            return max(int(trainer.estimated_stepping_batches), 1)
        except Exception:  # infinite iterable without max_steps
            return 100_000

    def compute_loss(self, batch: dict[str, Any], step: int) -> tuple[Tensor, dict[str, Tensor]]:
        """Forward, render the targets, and sum every loss term; returns (loss, logged terms)."""
        context, target = batch["context"], batch["target"]
        kwargs = self.recipe.train_kwargs(self.net, step, self._max_steps())
        pred: ModelOutput = self.net(context, **kwargs)
        render_targets = self.recipe.render_targets(pred)
        terms: dict[str, Tensor] = {}
        loss = target["image"].new_zeros(())
        photometric = loss
        use_lpips = self.lpips is not None and step >= self.hparams.lpips_start_step
        depth_weight = self.hparams.depth_weight
        for weight, gaussians in render_targets:
            out = self.render_views(gaussians, target)
            term = self._photometric(out.color, target["image"])
            if use_lpips:
                term = term + self.hparams.lpips_weight * self._lpips_loss(
                    out.color, target["image"]
                )
            if depth_weight > 0 and "depth" in target and pred.depth is None:
                term = term + depth_weight * self._depth_loss(out.depth, out.alpha, target["depth"])
            photometric = photometric + weight * term
        loss = loss + photometric
        terms["loss/photometric"] = photometric.detach()
        if depth_weight > 0 and "depth" in context and pred.depth is not None:
            depth_term = self._depth_loss(pred.depth, None, context["depth"])
            loss = loss + depth_weight * depth_term
            terms["loss/depth"] = depth_term.detach()
        for name, value in self.recipe.weigh(pred.losses).items():
            loss = loss + value
            terms[f"loss/{name}"] = value.detach()
        terms["gaussians/count"] = pred.gaussians.count().float().mean()
        for key, value in kwargs.items():
            if isinstance(value, (int, float)):
                terms[f"train_kwargs/{key}"] = torch.tensor(float(value))
        return loss, terms

    @staticmethod
    def _depth_loss(depth: Tensor, alpha: Tensor | None, gt: Tensor) -> Tensor:
        """Relative L1 between (alpha-normalised) depth and GT depth where both are valid."""
        if alpha is not None:
            valid = alpha > 0.5
            depth = depth / alpha.clamp_min(1e-6)
        else:
            valid = torch.ones_like(gt, dtype=torch.bool)
        valid = valid & (gt > 0) & torch.isfinite(gt)
        if not valid.any():
            return depth.new_zeros(())
        return ((depth - gt).abs() / gt.clamp_min(1e-6))[valid].mean()

    # ------------------------------------------------------------------ training
    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor | None:
        loss, terms = self.compute_loss(batch, self.global_step)
        batch_size = batch["target"]["image"].shape[0]
        if not torch.isfinite(loss):
            # Skip the step (Lightning skips backward and the optimiser when None is returned).
            self.skipped_steps += 1
            self.log("train/skipped_steps", float(self.skipped_steps), batch_size=batch_size)
            warnings.warn(f"non-finite loss at step {self.global_step}: step skipped", stacklevel=1)
            return None
        self.log("train/loss", loss, prog_bar=True, batch_size=batch_size)
        for key, value in terms.items():
            name = key if key.startswith("gaussians/") else f"train/{key}"
            self.log(name, value, batch_size=batch_size)
        return loss

    def on_before_optimizer_step(self, optimizer) -> None:
        # A finite loss can still give non-finite gradients: drop the update, never save NaNs.
        grads = [p.grad for p in self.parameters() if p.grad is not None]
        if grads and not all(torch.isfinite(g).all() for g in grads):
            self.skipped_steps += 1
            self.log("train/skipped_steps", float(self.skipped_steps))
            for p in self.parameters():
                p.grad = None
            warnings.warn(f"non-finite gradients at step {self.global_step}: zeroed", stacklevel=1)

    # ------------------------------------------------------------------ evaluation
    def _eval_kwargs(self) -> dict[str, Any]:
        return dict(self.hparams.eval_kwargs or {})

    def _lpips_value(self, prediction: Tensor, target: Tensor) -> Tensor | None:
        if self.lpips_metric is None:
            if getattr(self, "_lpips_unavailable", False):
                return None
            self.lpips_metric = self.lpips or build_lpips(required=False)
            if self.lpips_metric is None:
                self._lpips_unavailable = True
                return None
            self.lpips_metric.to(prediction.device)
        p, t = lpips_inputs(prediction), lpips_inputs(target)
        return self.lpips_metric.net(p, t).reshape(prediction.shape[:2])

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        pred = self.net(batch["context"], **self._eval_kwargs())
        out = self.render_views(pred.gaussians, batch["target"])
        target = batch["target"]["image"]
        psnr = psnr_per_image(out.color, target).mean(dim=1)  # per scene [B]
        ssim = ssim_per_image(out.color, target).mean(dim=1)
        batch_size = target.shape[0]
        self.val_psnr.update(psnr)
        self.val_ssim.update(ssim)
        self.log("val/psnr", self.val_psnr, prog_bar=True, batch_size=batch_size)
        self.log("val/ssim", self.val_ssim, batch_size=batch_size)
        lp = self._lpips_value(out.color, target)
        if lp is not None:
            self.val_lpips.update(lp.mean(dim=1))
            self.log("val/lpips", self.val_lpips, batch_size=batch_size)
        self.log("val/gaussians", pred.gaussians.count().float().mean(), batch_size=batch_size)
        if batch_idx == 0:
            self._log_images(batch, out.color)

    def _log_images(self, batch: dict[str, Any], rendered: Tensor) -> None:
        """Log [context | target | render] strips for the first few scenes of the batch."""
        n = min(self.hparams.num_val_images, rendered.shape[0])
        if n == 0 or self.logger is None:
            return
        rows = []
        for i in range(n):
            parts = list(batch["context"]["image"][i]) + [
                batch["target"]["image"][i, 0],
                rendered[i, 0],
            ]
            rows.append(torch.cat([p.clamp(0, 1) for p in parts], dim=-1))
        grid = torch.cat(rows, dim=-2).detach().float().cpu()  # [3, h, w]
        from lightning.pytorch.loggers import TensorBoardLogger, WandbLogger

        key = "val/renders"
        if isinstance(self.logger, WandbLogger):
            self.logger.log_image(key=key, images=[grid], step=self.global_step)
        elif isinstance(self.logger, TensorBoardLogger):
            self.logger.experiment.add_image(key, grid, self.global_step)
        elif self.logger.log_dir is not None:
            from torchvision.utils import save_image

            folder = os.path.join(self.logger.log_dir, "val_renders")
            os.makedirs(folder, exist_ok=True)
            save_image(grid, os.path.join(folder, f"step_{self.global_step:07d}.png"))

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        """Score each scene (mean over its targets) and keep per-scene records."""
        context, target = batch["context"], batch["target"]
        pred = self.net(context, **self._eval_kwargs())
        gaussians = pred.gaussians.detach()
        images = target["image"]
        results: dict[str, Tensor] = {}
        out = self.render_views(gaussians, target)
        results.update(self._scores("", out.color, images))
        pose_free = bool(getattr(self.net, "pose_free", False))
        if pose_free and self.hparams.fit_target_poses:
            # The model's frame may differ from the scene frame by a similarity: the targets' GT
            # poses are mapped into it (fitted on the context views), then refined there.
            placed = pose_fit.place_targets(
                gaussians,
                context,
                target,
                steps=self.hparams.pose_fit_steps,
                backend=self.hparams.render_backend,
                alignment=getattr(self, "target_pose_alignment", "similarity"),  # set by eval.py
                background=self._background(images),
            )
            if placed.frame.mode != "none":
                out_aligned = self.render_views(gaussians, target, extrinsics=placed.initial)
                results.update(self._scores("aligned_", out_aligned.color, images))
                results["frame_scale"] = placed.frame.to_model.scale
                results["frame_residual"] = placed.frame.residual
            out_refined = self.render_views(gaussians, target, extrinsics=placed.refined)
            results.update(self._scores("refined_", out_refined.color, images))
            out = out_refined
        if self.hparams.compute_baselines:
            results.update(
                self._scores("baseline_mean_color_", mean_color_baseline(context, images), images)
            )
            results.update(
                self._scores(
                    "baseline_nearest_view_", nearest_view_baseline(context, target), images
                )
            )
        counts = gaussians.count()
        for i, scene in enumerate(batch.get("scene", [str(batch_idx)] * images.shape[0])):
            record = {"scene": scene, "gaussians": int(counts[i])}
            record.update({k: float(v[i]) for k, v in results.items()})
            self.test_records.append(record)
        if len(self.test_samples) < self.hparams.num_val_images:
            self.test_samples.append(
                {
                    "scene": batch.get("scene", [str(batch_idx)])[0],
                    "context": context["image"][0].detach().cpu(),
                    "target": images[0].detach().cpu(),
                    "render": out.color[0].detach().cpu(),
                }
            )
        self.log("test/psnr", results["psnr"].mean(), batch_size=images.shape[0])

    def _scores(self, prefix: str, prediction: Tensor, target: Tensor) -> dict[str, Tensor]:
        scores = {
            f"{prefix}psnr": psnr_per_image(prediction, target).mean(dim=1),
            f"{prefix}ssim": ssim_per_image(prediction, target).mean(dim=1),
        }
        lp = self._lpips_value(prediction, target)
        if lp is not None:
            scores[f"{prefix}lpips"] = lp.mean(dim=1)
        return scores

    # ------------------------------------------------------------------ optimisation
    def configure_optimizers(self):
        backbone, rest = [], []
        for name, param in self.net.named_parameters():
            if not param.requires_grad:
                continue
            (backbone if ".backbone." in f".{name}" else rest).append(param)
        lr = self.hparams.lr
        groups = [{"params": rest, "lr": lr}]
        if backbone:
            groups.append({"params": backbone, "lr": lr * self.hparams.backbone_lr_scale})
        optimizer = torch.optim.AdamW(
            groups, lr=lr, weight_decay=self.hparams.weight_decay, betas=tuple(self.hparams.betas)
        )
        total = self._max_steps()
        warmup = min(self.hparams.warmup_steps, max(total - 1, 0))
        floor = self.hparams.min_lr_ratio

        def schedule(step: int) -> float:
            if step < warmup:
                return (step + 1) / (warmup + 1)
            progress = min((step - warmup) / max(total - warmup, 1), 1.0)
            return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
        }
