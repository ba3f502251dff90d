"""The settings of a per-scene refinement fit: budget, image size, optimiser, schedules and the
densification rule, with the defaults of 3DGS (Kerbl et al. 2023) and gsplat's 3DGS-MCMC strategy
(Kheradmand et al. 2024) adapted to short CPU budgets (densification starts and repeats sooner).

``infer.py``/``configs/infer.yaml`` map onto :class:`RefineSettings` with
:func:`settings_from_config`: ``refine`` (steps), ``refine_time`` (seconds), ``refine_size`` (long
side in pixels), ``max_gaussians`` (the densification cap) and the ``refinement:`` node (every
other field, nested ``mcmc:`` / ``adc:``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from datamodules.errors import InputError

__all__ = [
    "ADCSettings",
    "DEFAULT_MAX_SIZE",
    "DENSIFY_RULES",
    "MCMCSettings",
    "RefineSettings",
    "RefineSettingsError",
    "settings_from_config",
]

#: Long side (pixels) the photos are fitted at when ``size`` is not set: their own size, capped
#: here (a 2-core CPU runs about 3 steps a second at 240x136 with 50k Gaussians).
DEFAULT_MAX_SIZE = 320
DENSIFY_RULES = ("mcmc", "adc", "none")


class RefineSettingsError(InputError):
    """A refinement setting out of range (one line naming the ``key=``)."""


@dataclass
class MCMCSettings:
    """3DGS-MCMC (Kheradmand et al. 2024, gsplat's ``MCMCStrategy``).

    Every ``every`` steps from ``start`` until ``stop_fraction`` of the budget: Gaussians with
    opacity <= ``min_opacity`` ("dead") are moved onto live ones sampled in proportion to their
    opacity (the source and its copies share its opacity and scale by the paper's relocation rule,
    so the rendered image is unchanged), then ``growth`` x the count new ones are added the same
    way, up to the cap (``max_gaussians``). Every step, each mean gets noise
    ``N(0, Sigma) * sigmoid(100 (1 - opacity - 0.995)) * noise_lr * lr_means`` (Sigma: its
    covariance), which moves transparent Gaussians and leaves opaque ones in place; the loss adds
    ``opacity_reg * mean(opacity) + scale_reg * mean(scale)``.
    """

    start: int = 100
    every: int = 100
    stop_fraction: float = 0.85
    min_opacity: float = 0.005
    growth: float = 0.05
    noise_lr: float = 5e5
    opacity_reg: float = 0.01
    scale_reg: float = 0.01


@dataclass
class ADCSettings:
    """3DGS adaptive density control (Kerbl et al. 2023).

    Every ``every`` steps from ``start`` until ``stop_fraction`` of the budget: Gaussians whose
    mean view-space positional gradient (NDC units, averaged over the steps that saw them) is
    at least ``grad_threshold`` are cloned when their largest scale is at most
    ``percent_dense`` x the scene extent, else split into two samples of themselves with scales
    divided by 1.6; Gaussians with opacity below ``min_opacity`` are pruned, and (after the first
    opacity reset) those larger than ``max_world_scale`` x the extent. Every ``reset_every`` steps
    every opacity is clamped to at most ``2 * min_opacity`` (the pruning then removes what the
    photos do not bring back). Growth stops at the cap (``max_gaussians``).
    """

    start: int = 200
    every: int = 100
    stop_fraction: float = 0.6
    grad_threshold: float = 0.0002
    percent_dense: float = 0.01
    min_opacity: float = 0.005
    max_world_scale: float = 0.1
    reset_every: int = 1000


@dataclass
class RefineSettings:
    """How to refine Gaussians against posed photos.

    Attributes:
        steps: optimisation steps (one photo each); ``None``: only ``time`` limits the fit.
        time: budget in seconds (the fit stops at the first step after it); ``None``: only
            ``steps``. The learning-rate decay and the densification window follow the fraction
            of the budget used (the larger of steps/``steps`` and seconds/``time``).
        size: long side in pixels the photos are fitted at (``None``: their size capped at
            :data:`DEFAULT_MAX_SIZE`).
        max_gaussians: the cap on the count (``None``: twice the starting count); a start
            above it keeps its most opaque Gaussians.
        densify: ``"mcmc"`` (default, :class:`MCMCSettings`), ``"adc"``
            (:class:`ADCSettings`) or ``"none"``.
        sh_degree: the fitted SH degree (``None``: the start's); one band is switched on every
            ``sh_degree_every`` steps, from 0.
        ssim_weight: lambda of the loss ``(1 - lambda) L1 + lambda (1 - SSIM)`` (3DGS's 0.2).
        lr_means: position learning rate times the scene extent (1.1 x the largest camera
            distance from the cameras' centroid), decayed exponentially to ``lr_means_final``.
        lr_scales, lr_rotations, lr_opacities, lr_sh: 3DGS's Adam rates (log-scales, raw
            quaternions, opacity logits, SH DC; the higher bands take ``lr_sh / 20``).
        lr_cameras: joint camera refinement (``optimize_cameras``): Adam rate of each view's
            se(3) delta (radians; translation in scene extents), decayed like the means.
        background: RGB behind the Gaussians, in [0, 1].
        backend: the renderer (``models.render.render``'s ``backend``).
        checkpoint_every: steps between checkpoints when a checkpoint path is given.
        seed: the random seed of view order, densification and noise.
        memory_limit: bytes the fit may use (``None``: the device's available memory).
    """

    steps: int | None = None
    time: float | None = None
    size: int | None = None
    max_gaussians: int | None = None
    densify: str = "mcmc"
    mcmc: MCMCSettings = field(default_factory=MCMCSettings)
    adc: ADCSettings = field(default_factory=ADCSettings)
    sh_degree: int | None = None
    sh_degree_every: int = 250
    ssim_weight: float = 0.2
    lr_means: float = 1.6e-4
    lr_means_final: float = 1.6e-6
    lr_scales: float = 5e-3
    lr_rotations: float = 1e-3
    lr_opacities: float = 5e-2
    lr_sh: float = 2.5e-3
    lr_cameras: float = 1e-3
    background: tuple[float, float, float] = (0.0, 0.0, 0.0)
    backend: str = "auto"
    checkpoint_every: int = 500
    seed: int = 0
    memory_limit: int | None = None

    def check(self) -> RefineSettings:
        """Raise :class:`RefineSettingsError` naming the setting when one is out of range."""
        if self.steps is None and self.time is None:
            raise RefineSettingsError("refine", "set refine=STEPS or refine_time=SECONDS (> 0)")
        if self.steps is not None and (isinstance(self.steps, bool) or int(self.steps) < 1):
            raise RefineSettingsError("refine", f"must be a positive step count, got {self.steps}")
        if self.time is not None and not float(self.time) > 0:
            raise RefineSettingsError("refine_time", f"must be > 0 seconds, got {self.time}")
        if self.size is not None and int(self.size) < 8:
            raise RefineSettingsError("refine_size", f"must be at least 8 pixels, got {self.size}")
        if self.max_gaussians is not None and int(self.max_gaussians) < 1:
            raise RefineSettingsError(
                "max_gaussians", f"must be a positive count, got {self.max_gaussians}"
            )
        if self.densify not in DENSIFY_RULES:
            raise RefineSettingsError(
                "refinement.densify",
                f"must be one of {', '.join(DENSIFY_RULES)}, got {self.densify!r}",
            )
        if self.sh_degree is not None and not 0 <= int(self.sh_degree) <= 3:
            raise RefineSettingsError("refinement.sh_degree", f"must be 0..3, got {self.sh_degree}")
        if not 0 <= self.ssim_weight <= 1:
            raise RefineSettingsError(
                "refinement.ssim_weight", f"must be in [0, 1], got {self.ssim_weight}"
            )
        for name in ("sh_degree_every", "checkpoint_every"):
            if int(getattr(self, name)) < 1:
                raise RefineSettingsError(f"refinement.{name}", "must be a positive step count")
        for rule in ("mcmc", "adc"):
            sub = getattr(self, rule)
            if int(sub.every) < 1 or int(sub.start) < 0 or not 0 <= sub.stop_fraction <= 1:
                raise RefineSettingsError(
                    f"refinement.{rule}",
                    "needs every >= 1, start >= 0 and stop_fraction in [0, 1]",
                )
        if len(self.background) != 3:
            raise RefineSettingsError("refinement.background", "must be three numbers in [0, 1]")
        return self

    def to_dict(self) -> dict[str, Any]:
        """Every field as plain Python (``summary.json``'s ``refine.settings``)."""
        out = dataclasses.asdict(self)
        out["background"] = list(self.background)
        return out


def _merge(instance: Any, values: Mapping[str, Any], prefix: str) -> Any:
    """A copy of the dataclass ``instance`` with ``values`` set (nested dataclasses by mapping)."""
    known = {f.name: f for f in dataclasses.fields(instance)}
    changes = {}
    for key, value in values.items():
        if key not in known:
            raise RefineSettingsError(
                f"{prefix}{key}", f"unknown setting (known: {', '.join(sorted(known))})"
            )
        current = getattr(instance, key)
        if dataclasses.is_dataclass(current):
            if not isinstance(value, Mapping):
                raise RefineSettingsError(f"{prefix}{key}", "must be a mapping of settings")
            value = _merge(current, value, f"{prefix}{key}.")
        elif key == "background" and value is not None:
            value = tuple(float(v) for v in value)
        changes[key] = value
    return dataclasses.replace(instance, **changes)


def settings_from_config(
    refine: int | None = None,
    refine_time: float | None = None,
    refine_size: int | None = None,
    max_gaussians: int | None = None,
    refinement: Mapping[str, Any] | None = None,
    backend: str | None = None,
    seed: int | None = None,
) -> RefineSettings:
    """:class:`RefineSettings` from ``infer.py``'s settings (``refine=0``/``null`` and no
    ``refine_time`` means no refinement: the caller checks that before calling).

    Raises:
        RefineSettingsError: an unknown ``refinement.`` key or a value out of range.
    """
    settings = _merge(RefineSettings(), dict(refinement or {}), "refinement.")
    top: dict[str, Any] = {
        "steps": int(refine) if refine else None,
        "time": float(refine_time) if refine_time else None,
        "size": int(refine_size) if refine_size else None,
        "max_gaussians": int(max_gaussians) if max_gaussians else None,
    }
    if backend is not None:
        top["backend"] = backend
    if seed is not None:
        top["seed"] = int(seed)
    return dataclasses.replace(settings, **top).check()
