"""Densification rules: 3DGS-MCMC relocation (Kheradmand et al. 2024, as gsplat's
``MCMCStrategy``) and 3DGS adaptive density control (Kerbl et al. 2023, as gsplat's
``DefaultStrategy``). Both act on :class:`~models.refine.params.GaussianParameters` in place and
return counts of what they did."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from models.geometry.rotations import quaternion_to_matrix
from models.refine.params import GaussianParameters
from models.refine.settings import ADCSettings, MCMCSettings

__all__ = ["ADC", "MCMC", "relocation"]

_MAX_COPIES = 51  # gsplat's n_max: a Gaussian shares itself among at most this many copies


def relocation(opacities: Tensor, scales: Tensor, copies: Tensor) -> tuple[Tensor, Tensor]:
    """The MCMC paper's relocation rule (its eq. 9, gsplat's ``compute_relocation``).

    A Gaussian of opacity ``o`` and scale ``s`` split into ``n`` identical copies keeps its
    rendered contribution when each copy has ``o' = 1 - (1 - o)^(1/n)`` and
    ``s' = o / (sum_{i=1..n} sum_{k=0..i-1} C(i-1, k) (-1)^k o'^(k+1) / sqrt(k+1)) * s``.

    Args:
        opacities: ``[M]``; scales: ``[M, 3]``; copies: ``[M]`` int, ``n >= 1`` per row.
    """
    n = copies.clamp(1, _MAX_COPIES).to(opacities.dtype)
    new_opacity = 1.0 - (1.0 - opacities).pow(1.0 / n)
    denominator = torch.zeros_like(opacities)
    top = int(n.max().item()) if n.numel() else 1
    for i in range(1, top + 1):
        active = (n >= i).to(opacities.dtype)
        for k in range(i):
            term = math.comb(i - 1, k) * (-1) ** k / math.sqrt(k + 1)
            denominator = denominator + active * term * new_opacity.pow(k + 1)
    coefficient = opacities / denominator.clamp_min(1e-12)
    return new_opacity, coefficient[:, None] * scales


def _opacities(params: GaussianParameters) -> Tensor:
    return torch.sigmoid(params.tensors["opacities"].detach())


class MCMC:
    """Relocation of dead Gaussians, growth to the cap and the noise on means (see
    :class:`~models.refine.settings.MCMCSettings`)."""

    def __init__(self, settings: MCMCSettings, cap: int, generator: torch.Generator) -> None:
        self.settings = settings
        self.cap = cap
        self.generator = generator
        self.relocated = 0
        self.added = 0

    def state_dict(self) -> dict:
        return {"relocated": self.relocated, "added": self.added}

    def load_state_dict(self, state: dict) -> None:
        self.relocated, self.added = int(state["relocated"]), int(state["added"])

    def observe(self, out, image_size) -> None:  # noqa: ARG002  (no statistics needed)
        """MCMC needs no view-space statistics."""

    def regulariser(self, params: GaussianParameters) -> Tensor:
        t = params.tensors
        return (
            self.settings.opacity_reg * torch.sigmoid(t["opacities"]).mean()
            + self.settings.scale_reg * t["scales"].exp().mean()
        )

    def _sample(self, alive: Tensor, count: int) -> Tensor:
        """``count`` indices of live Gaussians drawn with replacement by opacity."""
        weights = _opacities(self._params)[alive]
        drawn = torch.multinomial(weights, count, replacement=True, generator=self.generator)
        return alive[drawn]

    def _share(self, params: GaussianParameters, sources: Tensor) -> None:
        """Give every drawn source (and its copies) the relocated opacity and scale."""
        copies = torch.bincount(sources, minlength=params.count)[sources] + 1
        opacity, scale = relocation(
            _opacities(params)[sources], params.tensors["scales"].detach()[sources].exp(), copies
        )
        opacity = opacity.clamp(self.settings.min_opacity, 1.0 - 1e-6)
        params.assign(sources, {"opacities": torch.logit(opacity), "scales": scale.log()})

    @torch.no_grad()
    def step(self, params: GaussianParameters) -> dict[str, int]:
        """One refinement: relocate the dead, then add Gaussians up to the cap."""
        self._params = params
        opacity = _opacities(params)
        dead = torch.nonzero(opacity <= self.settings.min_opacity)[:, 0]
        alive = torch.nonzero(opacity > self.settings.min_opacity)[:, 0]
        relocated = added = 0
        if dead.numel() and alive.numel():
            sources = self._sample(alive, dead.numel())
            self._share(params, sources)
            params.assign(dead, {k: v.detach()[sources] for k, v in params.tensors.items()})
            params.reset_moments(torch.cat([sources, dead]))
            relocated = dead.numel()
        target = min(self.cap, int(math.ceil(params.count * (1.0 + self.settings.growth))))
        grow = target - params.count
        alive = torch.nonzero(_opacities(params) > self.settings.min_opacity)[:, 0]
        if grow > 0 and alive.numel():
            sources = self._sample(alive, grow)
            self._share(params, sources)
            params.reset_moments(sources)
            extra = {k: v.detach()[sources] for k, v in params.tensors.items()}
            params.select_and_append(torch.arange(params.count), extra)
            added = grow
        self.relocated += relocated
        self.added += added
        return {"relocated": relocated, "added": added}

    @torch.no_grad()
    def noise(self, params: GaussianParameters, lr_means: float) -> None:
        """Move low-opacity means by noise shaped by their covariance (the SGLD term; means
        whose gate is below 1e-6 are left out, their noise being below 1e-6 of the others')."""
        t = params.tensors
        opacity = torch.sigmoid(t["opacities"])
        gate = torch.sigmoid(100.0 * ((1.0 - opacity) - 0.995))  # [N]
        sample = torch.randn(t["means"].shape, generator=self.generator).to(t["means"].device)
        moved = torch.nonzero(gate > 1e-6)[:, 0]
        if not moved.numel():
            return
        rotation = quaternion_to_matrix(F.normalize(t["rotations"][moved], dim=-1))  # [M, 3, 3]
        variances = (2.0 * t["scales"][moved]).exp()  # [M, 3]
        covariance = rotation @ (variances[:, :, None] * rotation.transpose(-1, -2))
        step = sample[moved] * gate[moved, None] * (self.settings.noise_lr * lr_means)
        t["means"][moved] += torch.einsum("nij,nj->ni", covariance, step)


class ADC:
    """Clone, split and prune by the view-space gradient (see
    :class:`~models.refine.settings.ADCSettings`)."""

    def __init__(
        self, settings: ADCSettings, cap: int, extent: float, generator: torch.Generator
    ) -> None:
        self.settings = settings
        self.cap = cap
        self.extent = extent
        self.generator = generator
        self.grad_sum: Tensor | None = None
        self.seen: Tensor | None = None
        self.cloned = self.split = self.pruned = self.resets = 0

    def state_dict(self) -> dict:
        return {
            "grad_sum": self.grad_sum,
            "seen": self.seen,
            "counts": [self.cloned, self.split, self.pruned, self.resets],
        }

    def load_state_dict(self, state: dict) -> None:
        self.grad_sum, self.seen = state["grad_sum"], state["seen"]
        self.cloned, self.split, self.pruned, self.resets = (int(c) for c in state["counts"])

    def regulariser(self, params: GaussianParameters) -> Tensor:  # noqa: ARG002
        return torch.zeros(())

    def observe(self, out, image_size: tuple[int, int]) -> None:
        """Accumulate the NDC-space gradient norm of each projected mean seen by this view."""
        grad = out.means2d.grad
        if grad is None:
            return
        height, width = image_size
        grad = grad.detach().reshape(-1, grad.shape[-2], 2)  # [I, N, 2]
        scale = torch.tensor([width / 2.0, height / 2.0], dtype=grad.dtype, device=grad.device)
        norm = (grad * scale).norm(dim=-1)  # [I, N]
        visible = (out.radii.reshape(norm.shape[0], norm.shape[1], 2) > 0).any(-1)  # [I, N]
        count = norm.shape[1]
        if self.grad_sum is None or self.grad_sum.shape[0] != count:
            self.grad_sum = torch.zeros(count, dtype=norm.dtype, device=norm.device)
            self.seen = torch.zeros(count, dtype=norm.dtype, device=norm.device)
        self.grad_sum += (norm * visible).sum(0)
        self.seen += visible.sum(0)

    @torch.no_grad()
    def step(self, params: GaussianParameters, after_reset: bool) -> dict[str, int]:
        """Clone and split where the averaged gradient is large, then prune."""
        s = self.settings
        cloned = split = 0
        if self.grad_sum is not None and self.grad_sum.shape[0] == params.count:
            mean_grad = self.grad_sum / self.seen.clamp_min(1)
            large = mean_grad >= s.grad_threshold
            max_scale = params.tensors["scales"].detach().exp().amax(-1)
            small = max_scale <= s.percent_dense * self.extent
            room = max(0, self.cap - params.count)
            clone = torch.nonzero(large & small)[:, 0]
            divide = torch.nonzero(large & ~small)[:, 0]
            if clone.numel() + divide.numel() > room:  # the largest gradients first
                order = torch.argsort(mean_grad[torch.cat([clone, divide])], descending=True)
                chosen = torch.cat([clone, divide])[order[:room]]
                clone = chosen[small[chosen]]
                divide = chosen[~small[chosen]]
            cloned, split = int(clone.numel()), int(divide.numel())
            extra = {k: v.detach()[clone] for k, v in params.tensors.items()}
            if split:
                t = {k: v.detach()[divide] for k, v in params.tensors.items()}
                scales = t["scales"].exp()  # [S, 3]
                rotation = quaternion_to_matrix(F.normalize(t["rotations"], dim=-1))
                offsets = (
                    torch.randn((2, split, 3), generator=self.generator, device=scales.device)
                    * scales
                )
                means = t["means"][None] + torch.einsum("sij,ksj->ksi", rotation, offsets)
                halves = {k: v.repeat(2, *([1] * (v.ndim - 1))) for k, v in t.items()}
                halves["means"] = means.reshape(-1, 3)
                halves["scales"] = (scales / 1.6).log().repeat(2, 1)
                extra = {k: torch.cat([extra[k], halves[k]]) for k in extra}
            keep = torch.ones(params.count, dtype=torch.bool, device=params.tensors["means"].device)
            keep[divide] = False
            params.select_and_append(torch.nonzero(keep)[:, 0], extra)
        opacity = _opacities(params)
        prune = opacity < s.min_opacity
        if after_reset:
            prune |= (
                params.tensors["scales"].detach().exp().amax(-1) > s.max_world_scale * self.extent
            )
        if bool(prune.all()):  # never prune everything: keep the most opaque
            prune[torch.argmax(opacity)] = False
        pruned = int(prune.sum())
        if pruned:
            params.select_and_append(torch.nonzero(~prune)[:, 0])
        self.grad_sum = self.seen = None
        self.cloned += cloned
        self.split += split
        self.pruned += pruned
        return {"cloned": cloned, "split": split, "pruned": pruned}

    @torch.no_grad()
    def reset_opacity(self, params: GaussianParameters) -> None:
        """Clamp every opacity to at most ``2 * min_opacity`` (and zero its moments)."""
        ceiling = torch.logit(torch.tensor(2.0 * self.settings.min_opacity)).item()
        params.tensors["opacities"].clamp_(max=ceiling)
        params.reset_moments(None, ("opacities",))
        self.resets += 1
