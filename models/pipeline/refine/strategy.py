"""Densification strategies, as gsplat's ``strategy`` package splits them: each owns its schedule,
its state and two hooks with one signature, ``step_pre_backward(params, optimizers, state, step,
info)`` and ``step_post_backward(...)``; the surgery is :mod:`models.pipeline.refine.ops`.

- :class:`MCMCStrategy`: 3DGS-MCMC (Kheradmand et al. 2024, gsplat's ``MCMCStrategy``).
- :class:`ADCStrategy`: 3DGS adaptive density control (Kerbl et al. 2023, gsplat's
  ``DefaultStrategy``).
- :class:`Strategy`: no densification (the base: the screen-size cap only).

``info`` holds what the step knows: ``render`` (the render output of this step's view, with
``radii`` ``[1, 1, N, 2]`` and ``means2d``), ``image_size`` ``(H, W)``, ``progress`` (fraction of
the planned steps done) and ``lr_means`` (the means' learning rate now). Every strategy keeps the
largest screen radius of each Gaussian (``state["max_radii"]``) and shrinks those above
``max_screen_size`` pixels on its refinement steps.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from models.pipeline.refine import ops
from models.pipeline.refine.settings import ADCSettings, MCMCSettings

__all__ = ["ADCStrategy", "MCMCStrategy", "Strategy", "make_strategy"]

Params = ops.Params
Optimizers = ops.Optimizers


class Strategy:
    """No densification: the count stays; Gaussians above the screen-size cap are shrunk every
    ``every`` steps."""

    every = 100
    #: The fraction one densification round adds to the count in :meth:`expected_counts`: a
    #: plan's cap lands on that schedule, so a re-plan moves it by whole rounds.
    round_growth = 0.0

    def __init__(self, cap: int, max_screen_size: float | None, generator: torch.Generator) -> None:
        self.cap = int(cap)
        self.max_screen_size = max_screen_size
        self.generator = generator

    def initialize_state(self) -> dict[str, Any]:
        return {"max_radii": None, "counts": {"shrunk": 0}}

    def regularisation(self, params: Params) -> Tensor | float:  # noqa: ARG002
        """A term added to the loss (none)."""
        return 0.0

    def expected_counts(
        self, start: int, steps: int, cap: int, done: int = 0
    ) -> list[tuple[int, int]]:
        """``[(from_step, count)]``: the count the schedule leads to over the steps from ``done``
        to ``steps`` of a fit of ``steps`` steps, from ``start`` Gaussians at step ``done``
        with the cap ``cap`` (for planning the step time; ``from_step`` counted from
        ``done``); here constant."""
        return [(0, start)]

    def step_pre_backward(
        self, params: Params, optimizers: Optimizers, state: dict, step: int, info: dict
    ) -> None:
        """Before ``loss.backward()``."""

    def step_post_backward(
        self, params: Params, optimizers: Optimizers, state: dict, step: int, info: dict
    ) -> None:
        """After the optimizer step (``step`` counts the steps done)."""
        self._track_radii(state, info)
        if step % self.every == 0:
            self._cap_screen_size(params, state)

    def _track_radii(self, state: dict, info: dict) -> None:
        radii = info["render"].radii
        if radii is None:
            return
        largest = radii.detach().reshape(-1, radii.shape[-2], 2).amax(dim=(0, 2)).float()  # [N]
        if state["max_radii"] is None or state["max_radii"].shape != largest.shape:
            state["max_radii"] = largest
        else:
            torch.maximum(state["max_radii"], largest, out=state["max_radii"])

    def _cap_screen_size(self, params: Params, state: dict) -> None:
        radii = state["max_radii"]
        if self.max_screen_size is None or radii is None or radii.shape[0] != ops.count(params):
            return
        state["counts"]["shrunk"] += ops.clamp_screen_size(params, radii, self.max_screen_size)
        state["max_radii"] = None


class MCMCStrategy(Strategy):
    """Relocation of dead Gaussians, growth to the cap and the noise on means (see
    :class:`~models.pipeline.refine.settings.MCMCSettings`)."""

    def __init__(
        self,
        settings: MCMCSettings,
        cap: int,
        extent: float,
        max_screen_size: float | None,
        generator: torch.Generator,
    ) -> None:
        super().__init__(cap, max_screen_size, generator)
        self.settings = settings
        self.every = settings.every
        self.extent = extent
        self.round_growth = settings.growth

    def initialize_state(self) -> dict[str, Any]:
        return {"max_radii": None, "counts": {"relocated": 0, "added": 0, "shrunk": 0}}

    def regularisation(self, params: Params) -> Tensor:
        s = self.settings
        return (
            s.opacity_reg * torch.sigmoid(params["opacities"]).mean()
            + s.scale_reg * params["scales"].exp().mean() / self.extent
        )

    def expected_counts(
        self, start: int, steps: int, cap: int, done: int = 0
    ) -> list[tuple[int, int]]:
        s, counts, current = self.settings, [(0, start)], start
        for step in range(max(s.start, s.every), steps + 1, s.every):
            if step / steps >= s.stop_fraction:
                break
            if step <= done:
                continue
            current = max(current, min(cap, int(math.ceil(current * (1.0 + s.growth)))))
            counts.append((step - done, current))
        return counts

    def step_post_backward(
        self, params: Params, optimizers: Optimizers, state: dict, step: int, info: dict
    ) -> None:
        s = self.settings
        # lr_means already carries one factor of the extent, the covariance two: in units of the
        # extent the step is the same whatever the frame's scale
        scaler = s.noise_lr * info["lr_means"] / self.extent**2
        ops.inject_noise(params, scaler, self.generator)
        self._track_radii(state, info)
        if step < s.start or step % s.every or info["progress"] >= s.stop_fraction:
            return
        self._cap_screen_size(params, state)  # before the rows move
        counts = state["counts"]
        opacity = torch.sigmoid(params["opacities"].detach())
        dead = opacity <= s.min_opacity
        counts["relocated"] += ops.relocate(params, optimizers, dead, s.min_opacity, self.generator)
        grow = min(self.cap, int(math.ceil(ops.count(params) * (1.0 + s.growth)))) - ops.count(
            params
        )
        if grow > 0:
            counts["added"] += ops.sample_add(
                params, optimizers, state, grow, s.min_opacity, self.generator
            )


class ADCStrategy(Strategy):
    """Clone, split and prune by the view-space gradient; opacity resets (see
    :class:`~models.pipeline.refine.settings.ADCSettings`)."""

    def __init__(
        self,
        settings: ADCSettings,
        cap: int,
        extent: float,
        max_screen_size: float | None,
        generator: torch.Generator,
    ) -> None:
        super().__init__(cap, max_screen_size, generator)
        self.settings = settings
        self.extent = extent
        self.every = settings.every

    def initialize_state(self) -> dict[str, Any]:
        counts = {"cloned": 0, "split": 0, "pruned": 0, "resets": 0, "shrunk": 0}
        return {"grad_sum": None, "seen": None, "max_radii": None, "counts": counts}

    def expected_counts(
        self, start: int, steps: int, cap: int, done: int = 0
    ) -> list[tuple[int, int]]:
        """Pessimistic: the cap from the first refinement on."""
        return [(0, start), (max(0, self.settings.start - done), max(start, cap))]

    def step_pre_backward(
        self, params: Params, optimizers: Optimizers, state: dict, step: int, info: dict
    ) -> None:
        means2d = info["render"].means2d
        if means2d is not None and means2d.requires_grad:
            means2d.retain_grad()

    def step_post_backward(
        self, params: Params, optimizers: Optimizers, state: dict, step: int, info: dict
    ) -> None:
        s = self.settings
        self._observe(state, info)
        self._track_radii(state, info)
        window = info["progress"] < s.stop_fraction
        if window and step >= s.start and step % s.every == 0:
            self._refine(params, optimizers, state, after_reset=step > s.reset_every)
        if window and step % s.reset_every == 0:
            ops.reset_opacity(params, optimizers, 2.0 * s.min_opacity)
            state["counts"]["resets"] += 1

    def _observe(self, state: dict, info: dict) -> None:
        """Accumulate the NDC-space gradient norm of each projected mean seen by this view."""
        out = info["render"]
        grad = None if out.means2d is None else out.means2d.grad
        if grad is None:
            return
        height, width = info["image_size"]
        grad = grad.detach().reshape(-1, grad.shape[-2], 2)  # [I, N, 2]
        scale = torch.tensor([width / 2.0, height / 2.0], dtype=grad.dtype, device=grad.device)
        norm = (grad * scale).norm(dim=-1)  # [I, N]
        visible = (out.radii.reshape(norm.shape[0], norm.shape[1], 2) > 0).any(-1)  # [I, N]
        if state["grad_sum"] is None or state["grad_sum"].shape[0] != norm.shape[1]:
            state["grad_sum"] = torch.zeros_like(norm[0])
            state["seen"] = torch.zeros_like(norm[0])
        state["grad_sum"] += (norm * visible).sum(0)
        state["seen"] += visible.sum(0)

    @torch.no_grad()
    def _refine(self, params: Params, optimizers: Optimizers, state: dict, after_reset: bool):
        """Clone and split where the averaged gradient is large (largest first, up to the cap),
        then prune the transparent ones (and the huge ones after a reset)."""
        s, counts = self.settings, state["counts"]
        self._cap_screen_size(params, state)  # before the rows move
        if state["grad_sum"] is not None and state["grad_sum"].shape[0] == ops.count(params):
            mean_grad = state["grad_sum"] / state["seen"].clamp_min(1)
            large = mean_grad >= s.grad_threshold
            room = max(0, self.cap - ops.count(params))
            if int(large.sum()) > room:
                top = torch.argsort(torch.where(large, mean_grad, -1.0), descending=True)[:room]
                large = torch.zeros_like(large)
                large[top] = True
            small = params["scales"].exp().amax(-1) <= s.percent_dense * self.extent
            clone, divide = large & small, large & ~small
            ops.duplicate(params, optimizers, state, clone)
            divide = torch.cat([divide, divide.new_zeros(int(clone.sum()))])
            ops.split(params, optimizers, state, divide, self.generator)
            counts["cloned"] += int(clone.sum())
            counts["split"] += int(divide.sum())
        opacity = torch.sigmoid(params["opacities"])
        prune = opacity < s.min_opacity
        if after_reset:
            prune |= params["scales"].exp().amax(-1) > s.max_world_scale * self.extent
        if bool(prune.all()):  # never prune everything: keep the most opaque
            prune[torch.argmax(opacity)] = False
        if bool(prune.any()):
            ops.remove(params, optimizers, state, prune)
            counts["pruned"] += int(prune.sum())
        state["grad_sum"] = state["seen"] = None


def make_strategy(
    densify: str,
    mcmc: MCMCSettings,
    adc: ADCSettings,
    cap: int,
    extent: float,
    max_screen_size: float | None,
    generator: torch.Generator,
) -> Strategy:
    """The strategy named ``densify`` (``"mcmc"``, ``"adc"`` or ``"none"``)."""
    if densify == "mcmc":
        return MCMCStrategy(mcmc, cap, extent, max_screen_size, generator)
    if densify == "adc":
        return ADCStrategy(adc, cap, extent, max_screen_size, generator)
    return Strategy(cap, max_screen_size, generator)
