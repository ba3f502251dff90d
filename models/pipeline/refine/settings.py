"""The settings of a per-scene refinement fit: budget, image size, optimiser, schedules and the
densification rule, with the defaults of 3DGS (Kerbl et al. 2023) and gsplat's 3DGS-MCMC strategy
(Kheradmand et al. 2024) adapted to short CPU budgets (densification starts and repeats sooner).

The library speaks of its arguments (``steps``, ``time``, ``size``, ``max_gaussians``, ...);
:func:`settings_from_config` is the command line's edge: it maps ``infer.py``'s keys onto
:class:`RefineSettings` (``refine`` -> ``steps``, ``refine_time`` -> ``time``, ``refine_size`` ->
``size``, ``refine_max_gaussians`` -> ``max_gaussians``, the ``refinement:`` node -> every other
field, nested ``mcmc:`` / ``adc:``) and the errors' arguments back onto those keys
(:data:`CONFIG_KEYS`).
"""

from __future__ import annotations

import dataclasses
import math
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
    "CONFIG_KEYS",
    "config_key",
    "settings_from_config",
]

#: Long side (pixels) the photos are fitted at when ``size`` is not set: their own size, capped
#: here (a 2-core CPU runs about 3 steps a second at 240x136 with 50k Gaussians).
DEFAULT_MAX_SIZE = 320
DENSIFY_RULES = ("mcmc", "adc", "none")


class RefineSettingsError(InputError):
    """A fit argument of the wrong type, out of range, or too large for this machine: one line
    naming the argument (``size``, ``steps``, ``time``, ``max_gaussians``, ...; the command line
    maps it to its key with :func:`settings_from_config`'s table).

    Attributes:
        argument: the argument (also ``path``).
        largest: the largest value that fits this machine, when that is what is wrong.
    """

    def __init__(self, argument: str, message: str, largest: int | float | None = None) -> None:
        super().__init__(argument, message)
        self.argument = argument
        self.largest = largest


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _whole(value: Any, argument: str, minimum: int, optional: bool = False) -> None:
    """Refuse ``value`` unless a whole number >= ``minimum`` (or ``None`` when ``optional``)."""
    if value is None and optional:
        return
    if not (_number(value) and float(value).is_integer() and value >= minimum):
        raise RefineSettingsError(argument, f"must be a whole number >= {minimum}, got {value!r}")


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
    ``opacity_reg * mean(opacity) + scale_reg * mean(scale)``. Lengths in both (Sigma, lr_means,
    scale) are in units of the scene extent, so the fit is the same in any frame's scale (the
    paper's noise grows with the cube of the frame's scale); ``noise_lr`` = 1e7 there is the middle
    of a plateau measured on the drone capture (3e6-3e7 within 0.1 dB, 3e5 1.5 dB lower at 120 s;
    ``docs/refine.md``).
    """

    start: int = 100
    every: int = 100
    stop_fraction: float = 0.85
    min_opacity: float = 0.005
    growth: float = 0.05
    noise_lr: float = 1e7
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
        steps: optimisation steps (one photo each); ``None``: the steps ``time`` buys.
        time: budget in seconds; ``None``: only ``steps``. Before the first step the fit measures
            its step time on the start and plans its steps, working count and cap from it
            (:func:`models.pipeline.refine.plan.budget_fit`), re-plans from its real steps, and
            never does fewer steps than it last announced (stopping early only at twice the
            budget, on Ctrl-C or on a non-finite loss). The
            learning-rate decay and the densification window follow the fraction of the planned
            steps done.
        size: long side in pixels the photos are fitted at (``None``: their size capped at
            :data:`DEFAULT_MAX_SIZE`).
        max_gaussians: the densification cap (``None``: set by the budget: the largest count
            whose expected step time still buys the planned steps within ``time``, and that fits
            in memory); a start above it keeps its most important Gaussians (opacity x screen
            footprint), announced.
        min_steps: with a time budget, the steps the fit plans at least: the working count is
            pruned (announced) until the measured step time buys them. 1000 by default: the SH
            bands are all on at step 750 (``3 x sh_degree_every``), MCMC densifies 8 times
            (every 100 steps from 100 to 85%), and each of ~35 photos is seen ~28 times; the
            drone capture's fit from SfM points reached 28.2 dB held-out in 1,315 steps.
        max_screen_fraction: the screen-size cap: a Gaussian whose radius (3 sigma) exceeds this
            fraction of the long side (at least 16 px) in a training view is shrunk to it, at the
            start and on each densification step (gsplat's ``prune_scale2d`` 0.15; ``None``: no
            cap).
        start_opacity: every opacity of the start is capped at this before the first step (3DGS
            starts its points at 0.1 and its opacity reset clamps to 0.01): a feed-forward set's
            Gaussians at a wrong depth then fade and are relocated by the densification instead of
            occluding the scene (on the garden orbit of docs/refine.md: 26.4 against 21.2 dB
            held-out after 120 s); the start is pruned by its own opacities first. ``None``:
            the start's opacities as they are (a finished scene from another tool).
        coarse_fraction: coarse-to-fine: the first this fraction of the planned steps fit the
            photos at half the size (a step then costs about a third; 0: off; measured in
            ``bench/refine_coarse_to_fine.py``, docs/refine.md).
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
    min_steps: int = 1000
    max_screen_fraction: float | None = 0.15
    start_opacity: float | None = 0.1
    coarse_fraction: float = 0.0
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
        """Raise :class:`RefineSettingsError` naming the argument when one has the wrong type or
        is out of range."""
        if self.steps is None and self.time is None:
            raise RefineSettingsError("steps", "set steps or time (a budget > 0)")
        _whole(self.steps, "steps", 1, optional=True)
        if self.time is not None and not (_number(self.time) and 0 < self.time < math.inf):
            raise RefineSettingsError("time", f"must be finite seconds > 0, got {self.time!r}")
        _whole(self.size, "size", 8, optional=True)
        _whole(self.max_gaussians, "max_gaussians", 1, optional=True)
        _whole(self.min_steps, "min_steps", 1)
        fraction = self.max_screen_fraction
        if fraction is not None and not (_number(fraction) and 0 < fraction <= 1):
            raise RefineSettingsError("max_screen_fraction", f"must be in (0, 1], got {fraction!r}")
        opacity = self.start_opacity
        if opacity is not None and not (_number(opacity) and 0 < opacity <= 1):
            raise RefineSettingsError("start_opacity", f"must be in (0, 1], got {opacity!r}")
        if not (_number(self.coarse_fraction) and 0 <= self.coarse_fraction < 1):
            raise RefineSettingsError(
                "coarse_fraction", f"must be in [0, 1), got {self.coarse_fraction!r}"
            )
        if self.densify not in DENSIFY_RULES:
            raise RefineSettingsError(
                "densify", f"must be one of {', '.join(DENSIFY_RULES)}, got {self.densify!r}"
            )
        if self.sh_degree is not None:
            _whole(self.sh_degree, "sh_degree", 0)
            if self.sh_degree > 3:
                raise RefineSettingsError("sh_degree", f"must be 0..3, got {self.sh_degree}")
        if not (_number(self.ssim_weight) and 0 <= self.ssim_weight <= 1):
            raise RefineSettingsError("ssim_weight", f"must be in [0, 1], got {self.ssim_weight}")
        for name in ("sh_degree_every", "checkpoint_every"):
            _whole(getattr(self, name), name, 1)
        for rule in ("mcmc", "adc"):
            sub = getattr(self, rule)
            if int(sub.every) < 1 or int(sub.start) < 0 or not 0 <= sub.stop_fraction <= 1:
                raise RefineSettingsError(
                    rule, "needs every >= 1, start >= 0 and stop_fraction in [0, 1]"
                )
        if len(self.background) != 3:
            raise RefineSettingsError("background", "must be three numbers in [0, 1]")
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


#: The command line's key of each library argument (the rest: ``refinement.<argument>``).
CONFIG_KEYS = {
    "steps": "refine",
    "time": "refine_time",
    "size": "refine_size",
    "max_gaussians": "refine_max_gaussians",
}


def config_key(argument: str) -> str:
    """``infer.py``'s key of a :class:`RefineSettings` argument (``size`` -> ``refine_size``)."""
    return CONFIG_KEYS.get(argument, f"refinement.{argument}")


def settings_from_config(
    refine: int | None = None,
    refine_time: float | None = None,
    refine_size: int | None = None,
    refine_max_gaussians: int | None = None,
    refinement: Mapping[str, Any] | None = None,
    backend: str | None = None,
    seed: int | None = None,
) -> RefineSettings:
    """:class:`RefineSettings` from ``infer.py``'s settings (``refine=0``/``null`` and no
    ``refine_time`` means no refinement: the caller checks that before calling).

    Raises:
        RefineSettingsError: an unknown ``refinement.`` key or a value out of range, naming the
            command line's key.
    """
    settings = _merge(RefineSettings(), dict(refinement or {}), "refinement.")
    top: dict[str, Any] = {
        "steps": int(refine) if refine else None,
        "time": float(refine_time) if refine_time else None,
        "size": int(refine_size) if refine_size else None,
        "max_gaussians": int(refine_max_gaussians) if refine_max_gaussians else None,
    }
    if backend is not None:
        top["backend"] = backend
    if seed is not None:
        top["seed"] = int(seed)
    try:
        return dataclasses.replace(settings, **top).check()
    except RefineSettingsError as error:
        raise RefineSettingsError(
            config_key(error.argument), error.message, error.largest
        ) from None
