"""The cardinality router of SplatWeaver (arXiv 2605.07287): per-pixel routing over experts that
emit ``0..M`` Gaussians, its high-frequency (wavelet) prior, the routing regulariser's targets and
the inference-time routing (frozen Gumbel noise, budget shift). Used by
``models.families.splatweaver`` (this project's architecture) and ``splatweaver_release``."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from einops import rearrange, repeat
from torch import Tensor, nn

from models.layers.wavelet import WAVELETS

__all__ = [
    "ROUTING_MODES",
    "HighFrequencyPrior",
    "CardinalityRouter",
    "target_usage_distribution",
    "quantile_targets",
    "straight_through_gumbel",
    "frozen_gumbel_noise",
    "route",
    "budget_shift",
]

ROUTING_MODES = ("gumbel", "frozen_gumbel", "argmax")
ROUTING_SEED = 0  # seed of the fixed noise field of "frozen_gumbel" routing


def target_usage_distribution(mean: float, num_experts: int) -> list[float]:
    """Maximum-entropy distribution over cardinalities ``0..M`` with the given mean.

    ``p_k ∝ exp(λ k)`` with ``λ`` found by bisection; ``mean = 0.5, M = 3`` gives about
    ``[0.648, 0.235, 0.086, 0.031]``.

    Args:
        mean: expected Gaussians per pixel, in ``(0, M)``.
        num_experts: ``M`` (the largest cardinality).

    Returns:
        ``M + 1`` probabilities.
    """
    if num_experts < 1:
        raise ValueError(f"num_experts must be >= 1, got {num_experts}")
    if not 0.0 < mean < num_experts:
        raise ValueError(f"target_gaussians_per_pixel must be in (0, {num_experts}), got {mean}")
    cardinalities = range(num_experts + 1)

    def distribution(lam: float) -> list[float]:
        shift = max(lam * k for k in cardinalities)  # avoid overflow
        weights = [math.exp(lam * k - shift) for k in cardinalities]
        total = sum(weights)
        return [w / total for w in weights]

    low, high = -60.0, 60.0
    for _ in range(200):
        lam = 0.5 * (low + high)
        if sum(k * p for k, p in zip(cardinalities, distribution(lam))) < mean:
            low = lam
        else:
            high = lam
    return distribution(0.5 * (low + high))


def quantile_targets(energy: Tensor, usage: Tensor, floor: float = 0.0) -> Tensor:
    """Per-pixel cardinality targets from high-frequency energy by quantiles over the batch.

    The fraction ``usage[0]`` of pixels with the lowest energy gets class 0, the next
    ``usage[1]`` class 1, and so on. A pixel's quantile is its mid-rank (pixels with equal energy
    share the middle of their run, so ties never split arbitrarily: a flat image, all energy 0,
    sits at the median); pixels whose energy is at most ``floor`` always get class 0.

    Args:
        energy: ``[...]`` non-negative energies (any shape; quantiles over all of it).
        usage: ``[M + 1]`` target fractions summing to 1.
        floor: energies at or below it count as flat.

    Returns:
        ``[...]`` int64 classes in ``0..M``.
    """
    values = energy.detach().float()
    flat = values.flatten()
    ordered = flat.sort().values
    below = torch.searchsorted(ordered, flat, right=False)  # pixels with lower energy
    at_most = torch.searchsorted(ordered, flat, right=True)  # ... lower or equal
    quantile = (below + at_most).float() / (2.0 * flat.numel())  # mid-rank in (0, 1)
    cumulative = usage.detach().float().to(flat.device).cumsum(0)[:-1]  # [M]
    classes = torch.bucketize(quantile, cumulative, right=False)
    classes = torch.where(flat > floor, classes, torch.zeros_like(classes))
    return classes.reshape(values.shape)


def straight_through_gumbel(
    logits: Tensor, tau: float, dim: int = 1, generator: torch.Generator | None = None
) -> tuple[Tensor, Tensor]:
    """Hard Gumbel-softmax sample with the soft sample's gradient (straight-through).

    Args:
        logits: ``[..., K, ...]`` unnormalised log-probabilities along ``dim``.
        tau: softmax temperature.
        dim: the category dimension.
        generator: optional random generator for the Gumbel noise.

    Returns:
        ``gates`` (one-hot in the forward pass, ``d soft`` in the backward pass) and the chosen
        ``index`` (``logits`` shape with ``dim`` removed, int64).
    """
    uniform = torch.rand(
        logits.shape, generator=generator, device=logits.device, dtype=logits.dtype
    )
    gumbel = -torch.log(-torch.log(uniform.clamp(1e-10, 1.0 - 1e-7)))
    soft = ((logits + gumbel) / tau).softmax(dim=dim)
    index = soft.argmax(dim=dim, keepdim=True)
    hard = torch.zeros_like(soft).scatter_(dim, index, 1.0)
    return hard - soft.detach() + soft, index.squeeze(dim)


def frozen_gumbel_noise(logits: Tensor, v: int) -> Tensor:
    """A fixed Gumbel(0, 1) field like ``logits [B*V, M + 1, H, W]``: drawn from a generator
    seeded with ``ROUTING_SEED``, one field per view index, the same for every scene of a
    batch (so a scene's routing does not depend on its position in the batch)."""
    n, e, h, w = logits.shape
    generator = torch.Generator().manual_seed(ROUTING_SEED)
    uniform = torch.rand((v, e, h, w), generator=generator, dtype=torch.float64)
    noise = -torch.log(-torch.log(uniform.clamp(1e-12, 1.0 - 1e-12)))
    return noise.to(device=logits.device, dtype=logits.dtype).repeat(n // v, 1, 1, 1)


def route(logits: Tensor, routing: str, noise: Tensor | None, tau: float) -> tuple[Tensor, Tensor]:
    """Gates ``[N, M + 1, H, W]`` and chosen cardinalities ``[N, H, W]`` of router ``logits``.

    ``"gumbel"``: a straight-through hard Gumbel-softmax sample at temperature ``tau``; otherwise
    the argmax of ``logits`` (plus ``noise`` when given: ``"frozen_gumbel"``), one-hot gates.
    """
    if routing == "gumbel":
        return straight_through_gumbel(logits, tau, dim=1)
    choice = (logits if noise is None else logits + noise).argmax(dim=1)  # [N, H, W]
    gates = F.one_hot(choice, logits.shape[1]).permute(0, 3, 1, 2).to(logits.dtype)
    return gates, choice


def budget_shift(
    logits: Tensor, noise: Tensor | None, target: float, b: int, steps: int = 40
) -> Tensor:
    """Per-scene shift ``s [B]`` of router ``logits [B*V, M + 1, H, W]``: the largest whose
    routing (``logits + s * k`` for expert ``k``, plus the frozen ``noise``, argmax) spends at
    most ``target`` Gaussians per pixel on average (bisection, ``steps`` halvings)."""
    num_experts = logits.shape[1] - 1
    if not 0.0 <= target <= num_experts:
        raise ValueError(f"gaussians_per_pixel must be in [0, {num_experts}], got {target}")
    v = logits.shape[0] // b
    ladder = torch.arange(logits.shape[1], device=logits.device, dtype=logits.dtype)
    ladder = ladder[None, :, None, None]
    bound = logits.abs().amax() + (0.0 if noise is None else noise.abs().amax())
    spread = 2.0 * float(bound) + 1.0  # beyond it, one expert wins everywhere
    low = torch.full((b,), -spread, device=logits.device, dtype=logits.dtype)
    high = torch.full((b,), spread, device=logits.device, dtype=logits.dtype)
    for _ in range(steps):
        mid = 0.5 * (low + high)
        shifted = logits + repeat(mid, "b -> (b v) 1 1 1", v=v) * ladder
        _, choice = route(shifted, "argmax", noise, 1.0)
        mean = rearrange(choice, "(b v) h w -> b (v h w)", b=b).float().mean(dim=-1)
        over = mean > target
        high = torch.where(over, mid, high)
        low = torch.where(over, low, mid)
    return low


class HighFrequencyPrior(nn.Module):
    """Wavelet detail bands of the luminance -> small convs -> upsample -> sigmoid gate.

    Args:
        out_dim: gate channels (the feature width it modulates).
        hidden_dim: channels of the small convolutions.
        wavelet: ``"haar"`` or ``"db2"``.
        detail_scale: coefficients are compressed as ``sign(d) log(1 + |d| / detail_scale)``.
    """

    def __init__(
        self, out_dim: int, hidden_dim: int = 16, wavelet: str = "haar", detail_scale: float = 0.01
    ) -> None:
        super().__init__()
        if wavelet not in WAVELETS:
            raise ValueError(f"wavelet must be one of {sorted(WAVELETS)}, got {wavelet!r}")
        self.wavelet = wavelet
        self.detail_scale = detail_scale
        self.net = nn.Sequential(
            nn.Conv2d(3, hidden_dim, 3, padding=1),
            nn.GELU(),
            nn.Conv2d(hidden_dim, out_dim, 3, padding=1),
        )

    def forward(self, detail: Tensor, size: tuple[int, int]) -> Tensor:
        """``detail [N, 3, h, w]`` (LH, HL, HH) -> gate ``[N, out_dim, H, W]`` in (0, 1)."""
        # Log-compress the coefficients (0.01 -> 0.69, 0.1 -> 2.4, 1 -> 4.6): typical detail is
        # ~0.01-0.2, and the routing thresholds sit on a log-like scale. Zero stays zero.
        detail = torch.sign(detail) * torch.log1p(detail.abs() / self.detail_scale)
        x = self.net(detail)  # [N, C, h, w]
        x = F.interpolate(x, size=size, mode="bilinear", align_corners=False)
        return torch.sigmoid(x)


class ChannelNorm(nn.Module):
    """LayerNorm over the channels of every pixel of ``[N, C, H, W]``."""

    def __init__(self, channels: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(channels, eps=eps)

    def forward(self, x: Tensor) -> Tensor:
        return self.norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class CardinalityRouter(nn.Module):
    """Per-pixel router giving ``M + 1`` logits: a per-pixel LayerNorm (so the routing does not
    swing with the scale of features that the rendering loss is still changing), two 1x1
    convolutions, and (``energy_ladder=True``) an ordinal *energy ladder* added to the logits.

    The ladder is ``k * s - (θ_1 + ... + θ_k)`` for expert ``k``, with the pixel's log wavelet
    energy ``s = gain * log(1 + energy / detail_scale)`` (learned ``gain``) and learned thresholds ``θ``: on its own
    its argmax is ``k`` when ``θ_k < s < θ_{k+1}``, so the router ranks pixels by high-frequency
    energy from the first step and its deterministic (argmax) routing already spends 0..M
    Gaussians by texture; the convolutions learn the rest. The thresholds start at
    ``gain * log(1 + 0.02 * 2.75^(k-1) / detail_scale)`` (energies 0.02, 0.055, 0.15, ...) and are
    re-fitted on the first training
    batch (like ActNorm) so that the ladder's routing matches the target usage on the data; the
    ``calibrated`` buffer records that this happened. Without the ladder, the output bias starts
    at the log of the target usage instead.

    Args:
        in_dim: input channels.
        hidden_dim: hidden channels.
        prior: ``M + 1`` target usage probabilities.
        energy_ladder: add the ordinal energy ladder.
        detail_scale: scale of the log-energy (see above).
        floor: energy at or below which the ladder routes a pixel to expert 0.
        gain: initial slope of the score (larger: sharper routing probabilities, so that the
            sampled routing of training and the argmax routing of inference agree).
    """

    def __init__(
        self,
        in_dim: int,
        hidden_dim: int,
        prior: Sequence[float],
        energy_ladder: bool = True,
        detail_scale: float = 0.01,
        floor: float = 0.01,
        gain: float = 4.0,
    ) -> None:
        super().__init__()
        experts = len(prior) - 1
        self.detail_scale = detail_scale
        self.floor = floor
        self.net = nn.Sequential(
            ChannelNorm(in_dim),
            nn.Conv2d(in_dim, hidden_dim, 1),
            nn.GELU(),
            nn.Conv2d(hidden_dim, experts + 1, 1),
        )
        self.register_buffer(
            "usage_prior", torch.tensor(prior, dtype=torch.float32), persistent=False
        )
        if energy_ladder:
            start = [gain * math.log1p(0.02 * 2.75**i / detail_scale) for i in range(experts)]
            self.thresholds = nn.Parameter(torch.tensor(start))  # [M]
            self.gain = nn.Parameter(torch.tensor(float(gain)))
            self.register_buffer("calibrated", torch.zeros((), dtype=torch.bool))
            with torch.no_grad():
                self.net[-1].bias.zero_()
        else:
            self.thresholds = None
            with torch.no_grad():
                self.net[-1].bias.copy_(self.usage_prior.clamp_min(1e-6).log())

    def score(self, energy: Tensor) -> Tensor:
        """Ladder score ``s`` of energies ``[...]`` (same shape)."""
        return self.gain * torch.log1p(energy / self.detail_scale)

    @torch.no_grad()
    def calibrate(self, energy: Tensor) -> None:
        """Set the thresholds to the quantiles of the score at the target's cumulative usage."""
        score = self.score(energy).flatten().float()
        cumulative = self.usage_prior.to(score.device).cumsum(0)[:-1].clamp(0.0, 1.0)  # [M]
        values = torch.quantile(score[:: max(1, score.numel() // 100_000)], cumulative)
        floor = float(self.score(torch.tensor(self.floor, device=score.device)))
        thresholds = []
        for value in values.tolist():
            lowest = floor if not thresholds else thresholds[-1] + 0.1
            thresholds.append(max(value, lowest))
        self.thresholds.copy_(torch.tensor(thresholds, device=score.device))
        self.calibrated.fill_(True)

    def forward(self, x: Tensor, energy: Tensor | None = None) -> Tensor:
        """``x [N, C, H, W]``, ``energy [N, H, W]`` -> logits ``[N, M + 1, H, W]``."""
        logits = self.net(x)
        if self.thresholds is None:
            return logits
        if energy is None:
            raise ValueError("the energy ladder needs the wavelet energy [N, H, W]")
        if self.training and not bool(self.calibrated):
            self.calibrate(energy)
        k = torch.arange(logits.shape[1], device=x.device, dtype=logits.dtype)  # [M + 1]
        offsets = torch.cat([self.thresholds.new_zeros(1), self.thresholds.cumsum(0)])
        ladder = k[:, None, None] * self.score(energy)[:, None] - offsets[:, None, None]
        return logits + ladder
