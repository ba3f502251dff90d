"""Parameter and optimizer surgery of the fit, as gsplat's ``strategy/ops.py`` does it.

The fit's Gaussians are ``params``: a dict of leaf tensors named by :data:`NAMES` (means
``[N, 3]``, log-scales ``[N, 3]``, raw quaternions ``[N, 4]``, opacity logits ``[N]``, SH DC
``[N, 3, 1]``, higher bands ``[N, 3, K - 1]``), each with its own Adam in ``optimizers`` (same
names). A strategy's ``state`` holds per-Gaussian statistics (tensors whose first dimension is
``N``) besides scalars. Every operation here changes the rows of all three together: kept rows
keep their Adam moments and statistics, new rows start with zero moments and zero statistics.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from models.core.gaussians import Gaussians
from models.geometry.rotations import quaternion_to_matrix
from models.render.cpu import cpu_library_loaded

__all__ = [
    "adam",
    "NAMES",
    "append",
    "clamp_screen_size",
    "count",
    "duplicate",
    "gaussians_from_parameters",
    "inject_noise",
    "inject_noise_reference",
    "keep",
    "load_parameters_state",
    "parameters_from_gaussians",
    "parameters_state",
    "relocate",
    "relocation",
    "remove",
    "reset_opacity",
    "sample_add",
    "set_lr",
    "sort_spatially",
    "spatial_order",
    "split",
]

NAMES = ("means", "scales", "rotations", "opacities", "sh_dc", "sh_rest")
_MAX_COPIES = 51  # gsplat's n_max: a Gaussian shares itself among at most this many copies

Params = dict[str, Tensor]
Optimizers = dict[str, torch.optim.Adam]


def parameters_from_gaussians(
    gaussians: Gaussians, sh_degree: int, lrs: dict[str, float]
) -> tuple[Params, Optimizers]:
    """``(params, optimizers)`` of the valid Gaussians of a batch of one, SH padded or cut to
    ``sh_degree``; one Adam per name at ``lrs[name]`` (eps 1e-15, as 3DGS)."""
    g = gaussians.detach()
    if g.mask is not None:
        g = g.compact()
    valid = g.valid_mask()[0]
    coefficients = (sh_degree + 1) ** 2
    harmonics = g.harmonics[0][valid].float()  # [N, 3, K0]
    if harmonics.shape[-1] >= coefficients:
        harmonics = harmonics[..., :coefficients]
    else:
        harmonics = F.pad(harmonics, (0, coefficients - harmonics.shape[-1]))
    opacity = g.opacities[0][valid].float().clamp(1e-6, 1 - 1e-6)
    values = {
        "means": g.means[0][valid].float(),
        "scales": g.scales[0][valid].float().clamp_min(1e-12).log(),
        "rotations": F.normalize(g.rotations[0][valid].float(), dim=-1),
        "opacities": torch.logit(opacity),
        "sh_dc": harmonics[..., :1],
        "sh_rest": harmonics[..., 1:],
    }
    params = {k: v.clone().contiguous().requires_grad_(True) for k, v in values.items()}
    optimizers = {k: adam([params[k]], lrs[k]) for k in NAMES}
    return params, optimizers


def adam(tensors: list[Tensor], lr: float) -> torch.optim.Adam:
    """3DGS's Adam (eps 1e-15), fused on a CPU or CUDA (one kernel per tensor instead of a
    dozen: 5 ms against 41 ms a step for 69k Gaussians on one CPU thread)."""
    fused = all(t.device.type in ("cpu", "cuda") for t in tensors)
    return torch.optim.Adam(tensors, lr=lr, eps=1e-15, fused=fused)


class _UnitQuaternions(torch.autograd.Function):
    """``F.normalize(q, dim=-1)`` ``[N, 4]`` (``max(|q|, 1e-12)``) with its gradient in one
    expression, ``(g - u (u . g)) / |q|``: half the time of F.normalize's autograd graph (norm,
    clamp, broadcast division: 6.4 against 2.9 ms a step at 134k Gaussians on 2 threads)."""

    @staticmethod
    def forward(ctx, q: Tensor) -> Tensor:
        inverse = (q * q).sum(-1, keepdim=True).clamp_min(1e-24).rsqrt()  # [N, 1]
        unit = q * inverse
        ctx.save_for_backward(unit, inverse)
        return unit

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        unit, inverse = ctx.saved_tensors
        return (grad - unit * (unit * grad).sum(-1, keepdim=True)) * inverse


def gaussians_from_parameters(params: Params, degree: int | None = None) -> Gaussians:
    """The activated set (a batch of one), SH cut to ``degree`` bands (differentiable)."""
    harmonics = torch.cat([params["sh_dc"], params["sh_rest"]], dim=-1)
    if degree is not None:
        harmonics = harmonics[..., : (degree + 1) ** 2]
    return Gaussians(
        means=params["means"][None],
        scales=params["scales"].exp()[None],
        rotations=_UnitQuaternions.apply(params["rotations"])[None],
        opacities=torch.sigmoid(params["opacities"])[None],
        harmonics=harmonics[None],
    )


def count(params: Params) -> int:
    return params["means"].shape[0]


def set_lr(optimizers: Optimizers, name: str, lr: float) -> None:
    for group in optimizers[name].param_groups:
        group["lr"] = lr


def parameters_state(params: Params, optimizers: Optimizers) -> dict:
    """What a checkpoint keeps of the parameters and their Adam states."""
    return {
        "tensors": {k: v.detach().clone() for k, v in params.items()},
        "optimizers": {k: o.state_dict() for k, o in optimizers.items()},
    }


def load_parameters_state(params: Params, optimizers: Optimizers, state: dict) -> None:
    """Restore :func:`parameters_state` into ``params`` / ``optimizers`` (in place)."""
    for name in NAMES:
        tensor = state["tensors"][name].detach().clone().contiguous().requires_grad_(True)
        params[name] = tensor
        optimizers[name].state.clear()
        optimizers[name].param_groups[0]["params"] = [tensor]
        optimizers[name].load_state_dict(state["optimizers"][name])


def _rows(
    params: Params,
    optimizers: Optimizers,
    state: dict,
    rows: Callable[[Tensor], Tensor],
    new: int,
    extra: Params | None = None,
) -> None:
    """Replace every parameter ``p`` by ``cat(rows(p), extra)``; Adam moments and per-Gaussian
    statistics by ``cat(rows(m), zeros(new))``."""
    size = count(params)
    for name in NAMES:
        old = params[name]
        kept = rows(old.detach())
        added = extra[name].detach().to(kept) if extra is not None else kept[:0]
        value = torch.cat([kept, added]).contiguous().requires_grad_(True)
        optimizer = optimizers[name]
        moments = optimizer.state.pop(old, None)
        optimizer.param_groups[0]["params"] = [value]
        if moments:
            for key in ("exp_avg", "exp_avg_sq"):
                m = moments[key]
                moments[key] = torch.cat([rows(m), m.new_zeros((new, *m.shape[1:]))])
            optimizer.state[value] = moments
        params[name] = value
    for key, value in state.items():
        if isinstance(value, Tensor) and value.ndim >= 1 and value.shape[0] == size:
            state[key] = torch.cat([rows(value), value.new_zeros((new, *value.shape[1:]))])


def keep(params: Params, optimizers: Optimizers, state: dict, index: Tensor) -> None:
    """Keep rows ``index`` (in that order)."""
    _rows(params, optimizers, state, lambda t: t[index], 0)


def remove(params: Params, optimizers: Optimizers, state: dict, mask: Tensor) -> None:
    """Remove the rows where ``mask`` ``[N]`` is true."""
    keep(params, optimizers, state, torch.nonzero(~mask)[:, 0])


def append(params: Params, optimizers: Optimizers, state: dict, extra: Params) -> None:
    """Append ``extra`` rows (every name), zero moments and statistics."""
    new = extra["means"].shape[0]
    _rows(params, optimizers, state, lambda t: t, new, extra)


def spatial_order(means: Tensor, bits: int = 10) -> Tensor:
    """``[N]`` the permutation that puts ``means`` ``[N, 3]`` in Z-order (Morton) along a grid of
    ``2^bits`` cells an axis over their 1st-99th percentile box (outliers share the edge cells).

    A tile's list then visits Gaussians stored near each other: the compiled CPU rasteriser's
    forward and backward passes took about a tenth less time on a 128k-Gaussian drone fit.
    """
    means = means.detach().float()
    n = means.shape[0]
    if n < 2:
        return torch.arange(n, device=means.device)
    # [3] each: order statistics by selection, not a sort of [N, 3] (4x cheaper at 130k;
    # torch.quantile refuses over 16M entries)
    lo = means.kthvalue(int(0.01 * (n - 1)) + 1, dim=0).values
    hi = means.kthvalue(int(0.99 * (n - 1)) + 1, dim=0).values
    unit = (means.clamp(lo, hi) - lo) / (hi - lo).clamp_min(1e-12)  # [N, 3] in [0, 1]
    cells = (unit * ((1 << bits) - 1)).round().long()  # [N, 3]
    code = torch.zeros(means.shape[0], dtype=torch.long, device=means.device)
    for bit in range(bits):
        for axis in range(3):
            code |= ((cells[:, axis] >> bit) & 1) << (3 * bit + axis)
    return torch.argsort(code, stable=True)


def sort_spatially(params: Params, optimizers: Optimizers, state: dict) -> None:
    """Store the rows in :func:`spatial_order` of their means (moments and statistics follow)."""
    keep(params, optimizers, state, spatial_order(params["means"]))


def duplicate(params: Params, optimizers: Optimizers, state: dict, mask: Tensor) -> None:
    """Append a copy of the rows where ``mask`` is true (3DGS's clone)."""
    index = torch.nonzero(mask)[:, 0]
    append(params, optimizers, state, {k: v.detach()[index] for k, v in params.items()})


@torch.no_grad()
def split(
    params: Params,
    optimizers: Optimizers,
    state: dict,
    mask: Tensor,
    generator: torch.Generator,
    shrink: float = 1.6,
) -> None:
    """Replace each row where ``mask`` is true by two samples of itself, scales / ``shrink``
    (3DGS's split)."""
    index = torch.nonzero(mask)[:, 0]
    chosen = {k: v.detach()[index] for k, v in params.items()}
    scales = chosen["scales"].exp()  # [S, 3]
    rotation = quaternion_to_matrix(F.normalize(chosen["rotations"], dim=-1))  # [S, 3, 3]
    noise = torch.randn((2, len(index), 3), generator=generator).to(scales)
    means = chosen["means"][None] + torch.einsum("sij,ksj->ksi", rotation, noise * scales)
    halves = {k: v.repeat(2, *([1] * (v.ndim - 1))) for k, v in chosen.items()}
    halves["means"] = means.reshape(-1, 3)
    halves["scales"] = (scales / shrink).log().repeat(2, 1)
    remove(params, optimizers, state, mask)
    append(params, optimizers, state, halves)


@torch.no_grad()
def reset_opacity(params: Params, optimizers: Optimizers, value: float) -> None:
    """Clamp every opacity to at most ``value`` and zero the opacities' moments (3DGS)."""
    params["opacities"].clamp_(max=math.log(value / (1.0 - value)))
    for moments in optimizers["opacities"].state.values():
        moments["exp_avg"].zero_()
        moments["exp_avg_sq"].zero_()


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


def _zero_moments(optimizers: Optimizers, params: Params, index: Tensor) -> None:
    for name in NAMES:
        moments = optimizers[name].state.get(params[name])
        if moments:
            moments["exp_avg"][index] = 0
            moments["exp_avg_sq"][index] = 0


@torch.no_grad()
def _share(params: Params, sources: Tensor, min_opacity: float) -> None:
    """Give every drawn source (and its copies to come) the relocated opacity and scale."""
    copies = torch.bincount(sources, minlength=count(params))[sources] + 1
    opacity, scale = relocation(
        torch.sigmoid(params["opacities"][sources]), params["scales"][sources].exp(), copies
    )
    opacity = opacity.clamp(min_opacity, 1.0 - 1e-6)
    params["opacities"][sources] = torch.logit(opacity)
    params["scales"][sources] = scale.log()


def _draw(params: Params, count_: int, min_opacity: float, generator: torch.Generator) -> Tensor:
    """``count_`` indices of live Gaussians drawn with replacement by opacity (empty: none)."""
    opacity = torch.sigmoid(params["opacities"].detach())
    alive = torch.nonzero(opacity > min_opacity)[:, 0]
    if not alive.numel() or count_ < 1:
        return alive[:0]
    drawn = torch.multinomial(opacity[alive].cpu(), count_, replacement=True, generator=generator)
    return alive[drawn.to(alive.device)]


@torch.no_grad()
def relocate(
    params: Params,
    optimizers: Optimizers,
    mask: Tensor,
    min_opacity: float,
    generator: torch.Generator,
) -> int:
    """Move the rows where ``mask`` is true ("dead") onto live ones drawn by opacity (3DGS-MCMC);
    returns how many moved."""
    dead = torch.nonzero(mask)[:, 0]
    sources = _draw(params, dead.numel(), min_opacity, generator)
    if not sources.numel():
        return 0
    _share(params, sources, min_opacity)
    for name in NAMES:
        params[name][dead] = params[name][sources]
    _zero_moments(optimizers, params, torch.cat([sources, dead]))
    return int(dead.numel())


@torch.no_grad()
def sample_add(
    params: Params,
    optimizers: Optimizers,
    state: dict,
    count_: int,
    min_opacity: float,
    generator: torch.Generator,
) -> int:
    """Add ``count_`` copies of live rows drawn by opacity (3DGS-MCMC); returns how many."""
    sources = _draw(params, count_, min_opacity, generator)
    if not sources.numel():
        return 0
    _share(params, sources, min_opacity)
    _zero_moments(optimizers, params, sources)
    append(params, optimizers, state, {k: v.detach()[sources] for k, v in params.items()})
    return int(sources.numel())


@torch.no_grad()
def inject_noise(params: Params, scaler: float, generator: torch.Generator) -> None:
    """Move low-opacity means by noise shaped by their covariance (3DGS-MCMC's SGLD term; means
    whose gate is below 1e-6 are left out, their noise being below 1e-6 of the others'). On a
    CPU where the compiled library is loaded (the ``cpu`` backend rendered), one pass
    (``torch.ops.splatzoo_cpu.mcmc_noise``); else :func:`inject_noise_reference`, which it
    equals to float rounding."""
    means = params["means"]
    sample = torch.randn(means.shape, generator=generator).to(means.device)  # [N, 3]
    if means.device.type == "cpu" and cpu_library_loaded(means.dtype):
        fields = (params[k].detach().contiguous() for k in ("opacities", "rotations", "scales"))
        torch.ops.splatzoo_cpu.mcmc_noise(means.detach(), *fields, sample.to(means.dtype), scaler)
        return
    inject_noise_reference(params, sample, scaler)


@torch.no_grad()
def inject_noise_reference(params: Params, sample: Tensor, scaler: float) -> None:
    """:func:`inject_noise` in PyTorch, with its standard normal ``sample`` ``[N, 3]``."""
    opacity = torch.sigmoid(params["opacities"])
    gate = torch.sigmoid(100.0 * ((1.0 - opacity) - 0.995))  # [N]
    moved = torch.nonzero(gate > 1e-6)[:, 0]
    if not moved.numel():
        return
    rotation = quaternion_to_matrix(F.normalize(params["rotations"][moved], dim=-1))  # [M, 3, 3]
    variances = (2.0 * params["scales"][moved]).exp()  # [M, 3]
    covariance = rotation @ (variances[:, :, None] * rotation.transpose(-1, -2))
    step = sample[moved] * gate[moved, None] * scaler
    params["means"][moved] += torch.einsum("nij,nj->ni", covariance, step)


@torch.no_grad()
def clamp_screen_size(params: Params, radii: Tensor, limit: float) -> int:
    """Shrink the Gaussians whose largest screen radius ``radii`` ``[N]`` (pixels, over the views
    seen) exceeds ``limit`` pixels to that radius (the step cost grows with covered pixels; 3DGS
    prunes such splats, shrinking keeps the count); returns how many."""
    large = radii > limit
    if not bool(large.any()):
        return 0
    params["scales"][large] += torch.log(limit / radii[large].float())[:, None]
    return int(large.sum())
