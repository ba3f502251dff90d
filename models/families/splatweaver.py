"""SplatWeaver: a per-pixel mixture of cardinality experts that spends 0..M Gaussians per pixel.

Pipeline (after SplatWeaver, arXiv 2605.07287, at this project's scales):

1. **Pose-free per-pixel backbone.** The shared multi-view ViT (no camera tokens: neither poses nor
   intrinsics go in) and a DPT head give full-resolution features ``[B*V, C, H, W]``.
2. **One 3D point per pixel in view 0's frame** (our choice; the paper uses a VGGT/AnySplat-style
   depth/point head). Each view predicts a z-depth map in its own frame, as a softmax over
   ``num_depth_candidates`` inverse depths between ``1/far`` and ``1/near`` plus a residual
   refinement (the same depth parameterisation as the pose-free pixel-aligned model, so benchmarks
   compare Gaussian allocation, not geometry heads). The depth is unprojected along *canonical*
   rays (focal ``default_focal``, principal point at the centre) and a free 3D correction
   (zero-initialised) moves the point into view 0's frame, as NoPoSplat predicts xyz directly.
   With the default ``use_intrinsics=False`` the model is intrinsics-free: view 0 gets a correction
   too (the canonical rays may be wrong), and its focal length is estimated from its points
   (``ModelOutput.intrinsics``). With ``use_intrinsics=True`` the context intrinsics (when given)
   define the rays and view 0's points stay on them, exactly as ``noposplat_tiny``.
3. **High-frequency prior.** A one-level wavelet transform (``models.layers.wavelet``, Haar or db2) of the
   luminance; the detail sub-bands (LH, HL, HH), log-compressed, go through two small
   convolutions, are upsampled to full resolution and a sigmoid makes a per-channel gate; the
   router sees ``features + features * gate``.
4. **Router and cardinality experts.** ``M + 1`` experts (``num_experts = M = 3``); expert ``k`` is
   a small MLP (the shared ``GaussianHead`` with a hidden layer, ``AnchorOffsetPlacement``,
   ``gaussians_per_location = k``) emitting ``k`` Gaussians at the pixel's point plus tanh-bounded
   offsets measured in pixel footprints; expert 0 emits none. The router is a per-pixel
   LayerNorm and two 1x1 convolutions giving ``M + 1`` logits. In training the choice is a
   straight-through hard Gumbel-softmax sample (``gumbel_tau = 0.5``); each expert's opacities
   are multiplied by its gate value (1 in the forward pass for the chosen expert, with the soft
   sample's gradient), so the rendering loss reaches the router.
   *Our addition* (``energy_ladder=True``, default): an ordinal log-energy "ladder" is added to
   the logits (``CardinalityRouter``), with thresholds fitted to the target usage on the first
   training batch. Without it, a router trained from scratch starts with near-constant logits
   that favour few Gaussians (biases at the log target usage), so its argmax routes every pixel
   to expert 0 (no Gaussians at all at inference) for the first hundreds of steps, and the
   sampled (training) and argmax (inference) Gaussian counts disagree. ``energy_ladder=False``
   gives the paper's feature-only router.
5. **Inference is deterministic:** in eval mode the router takes the Gumbel-max choice with a
   *frozen* noise field (``routing="frozen_gumbel"``: Gumbel noise drawn once from a fixed seed,
   per view index and resolution), so the same input always gives the same Gaussians, and each
   pixel's choice is distributed exactly like the hard samples of training. The public release
   samples fresh Gumbel noise at inference (``routing="gumbel"``, random output). Plain
   ``routing="argmax"`` (the most likely expert everywhere) is available but mismatched with
   training: it empties whole flat regions that training only ever thinned out.
6. **Routing regulariser** (``losses``: ``routing_ce``, ``routing_smoothing``, ``routing_usage``,
   unweighted; ``models.training.recipes.SplatWeaverTrainingRecipe`` weighs them): cross-entropy
   with label smoothing (0.1) between the router logits and per-pixel targets made by binning the
   wavelet energy ``sqrt(LH² + HL² + HH²)`` at per-batch quantiles (the flattest pixels get
   expert 0, the most textured ones expert ``M``; bin sizes follow the target usage; pixels
   below ``energy_floor`` are always expert 0), plus a penalty ``KL(mean usage || target usage)``
   on the router's mean probabilities (the expected usage of the sampled routing). The target
   usage is the maximum-entropy distribution over ``0..M`` whose mean is
   ``target_gaussians_per_pixel`` (or an explicit ``target_usage``).
7. **Optional neighbour aggregation** (``neighbour_aggregation=True``): a kNN point-attention block
   (``models.layers.point_transformer``) over all context pixels' 3D points refines the experts' input
   features. Off by default (brute-force kNN over every pixel is slow on a CPU).

Output: a padded ``Gaussians`` set (``mask`` marks entries emitted by the chosen experts, so scenes
with different counts share one batch); ``count()`` is the sum of the routed cardinalities.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from einops import rearrange, repeat
from torch import Tensor, nn

from models.base import ModelOutput, SplatModel, check_context
from models.gaussians import Gaussians
from models.geometry.cameras import camera_directions, normalize_scene, pixel_grid, transform_points
from models.geometry.similarity import umeyama
from models.knobs import MAX_GAUSSIANS, Knob
from models.layers.heads import AnchorOffsetPlacement, GaussianHead, free_mean_activation
from models.layers.pixel_trunk import PixelTrunk
from models.layers.point_transformer import PointTransformerBlock
from models.layers.wavelet import WAVELETS, detail_bands, detail_energy
from models.registry import register_model
from models.weights.pretrained_cfg import register_pretrained_cfgs, synthetic64_cfg

__all__ = [
    "SplatWeaver",
    "HighFrequencyPrior",
    "CardinalityRouter",
    "target_usage_distribution",
    "quantile_targets",
    "straight_through_gumbel",
    "frozen_gumbel_noise",
    "route",
    "budget_shift",
    "splatweaver_tiny",
    "splatweaver_small",
    "splatweaver_base",
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


class SplatWeaver(PixelTrunk, SplatModel):
    """SplatWeaver: pose-free, 0..M Gaussians per pixel chosen by a wavelet-guided router.

    Args:
        vit_size: ViT size of the backbone, ``"tiny"``, ``"small"``, ``"base"`` or ``"large"``.
        image_size: training resolution of the backbone's position embedding (other sizes work).
        patch_size: ``None`` for the size's default (8 tiny, 14 DINOv2 sizes).
        global_layers: backbone blocks with all-view attention (``None``: every odd block).
        out_layers: backbone blocks fed to the DPT head (``None``: four evenly spaced ones).
        pretrained_backbone: ``False``, ``True`` (timm DINOv2 weights of ``vit_size``), a timm model
            name or a local weight file; see ``MultiViewTransformer``.
        init_checkpoint: start the per-pixel trunk (backbone, DPT head, depth and point heads)
            from a trained model with the same trunk: a pixel-aligned model of the same size and
            camera setting (``pose_free=False`` needs one with camera tokens), or another SplatWeaver. A
            Lightning ``.ckpt``, ``.safetensors`` file, ``save_pretrained`` folder or
            ``local-dir:``/``hf-hub:`` location; the router and experts start fresh. This is the
            released recipe's pretrained backbone (AnySplat's, there). ``None``: no init.
        dpt_features: width of the DPT fusion path.
        feature_dim: per-pixel feature channels ``C`` out of the DPT head.
        shallow_dim: channels of the full-resolution image CNN in the DPT head.
        use_intrinsics: use ``context["intrinsics"]`` (when given) for the rays and keep view 0's
            points on them (NoPoSplat); ``False``: intrinsics-free (canonical rays).
        pose_free: ``True`` (the paper's setting): cameras are predicted. ``False`` is *our
            option, not the paper's*: take known cameras like the pixel-aligned family (Plücker
            camera tokens, each pixel's point on its ray at the predicted depth, in the world
            frame). It isolates what the cardinality router buys against ``pixel_aligned_*`` on
            equal geometry.
        default_focal: normalised focal length of the canonical rays.
        num_depth_candidates: inverse-depth candidates of the depth softmax.
        near, far: depth range used when the context has no ``near``/``far``.
        depth_refine: add the residual depth refinement.
        refine_dim: hidden channels of the refinement.
        num_experts: ``M``, the largest number of Gaussians per pixel (experts ``0..M``).
        expert_hidden_dim: hidden width of each expert's MLP.
        router_hidden_dim: hidden channels of the router.
        prior_dim: channels of the high-frequency prior's convolutions.
        wavelet: ``"haar"`` or ``"db2"``.
        gumbel_tau: temperature of the Gumbel-softmax in training.
        target_gaussians_per_pixel: expected Gaussians per pixel the regulariser aims for.
        target_usage: explicit target distribution over experts ``0..M`` (overrides the above).
        energy_floor: wavelet energy at or below which a pixel's routing target is expert 0.
        energy_ladder: add the router's ordinal log-energy ladder to its logits (see
            ``CardinalityRouter``); ``False``: the paper's router (features only).
        neighbour_aggregation: refine the experts' input with kNN point attention.
        neighbour_k: neighbours of that attention.
        neighbour_heads: attention heads (must divide ``feature_dim``).
        sh_degree: SH degree of the colours.
        scale_factor: Gaussian scale at ``softplus(0)``-ish in pixel footprints (see
            ``GaussianHead``; scales are measured in depth x pixel size).
        max_scale: cap of the scale in pixel footprints.
        offset_bound: bound of each Gaussian's offset from its pixel's point, in pixel footprints.
        opacity_bias: initial opacity logit.
        drop_path_rate: backbone stochastic depth.
    """

    family = "splatweaver"
    pose_free = True
    min_views = 1

    def __init__(
        self,
        *,
        vit_size: str = "tiny",
        image_size: int = 64,
        patch_size: int | None = None,
        global_layers: list[int] | None = None,
        out_layers: list[int] | None = None,
        pretrained_backbone: bool | str = False,
        init_checkpoint: str | bool | None = None,
        dpt_features: int = 48,
        feature_dim: int = 32,
        shallow_dim: int = 16,
        use_intrinsics: bool = False,
        pose_free: bool = True,
        default_focal: float = 1.0,
        num_depth_candidates: int = 64,
        near: float = 0.1,
        far: float = 100.0,
        depth_refine: bool = True,
        refine_dim: int = 32,
        num_experts: int = 3,
        expert_hidden_dim: int = 32,
        router_hidden_dim: int = 32,
        prior_dim: int = 16,
        wavelet: str = "haar",
        gumbel_tau: float = 0.5,
        target_gaussians_per_pixel: float = 0.5,
        target_usage: list[float] | None = None,
        energy_floor: float = 0.01,
        energy_ladder: bool = True,
        neighbour_aggregation: bool = False,
        neighbour_k: int = 16,
        neighbour_heads: int = 4,
        sh_degree: int = 1,
        scale_factor: float = 30.0,
        max_scale: float = 15.0,
        offset_bound: float = 1.0,
        opacity_bias: float = 0.0,
        drop_path_rate: float = 0.0,
    ) -> None:
        super().__init__()
        if not 0 < near < far:
            raise ValueError(f"need 0 < near < far, got near={near}, far={far}")
        if num_depth_candidates < 2:
            raise ValueError(f"num_depth_candidates must be >= 2, got {num_depth_candidates}")
        if gumbel_tau <= 0:
            raise ValueError(f"gumbel_tau must be > 0, got {gumbel_tau}")
        if target_usage is None:
            usage = target_usage_distribution(target_gaussians_per_pixel, num_experts)
        else:
            usage = [float(p) for p in target_usage]
            if len(usage) != num_experts + 1 or min(usage) < 0 or abs(sum(usage) - 1) > 1e-4:
                raise ValueError(
                    f"target_usage must be {num_experts + 1} non-negative numbers summing to 1, "
                    f"got {target_usage}"
                )
        self.vit_size = vit_size
        self.use_intrinsics = use_intrinsics
        self.pose_free = pose_free  # instance value: shadows the class default
        self.default_focal = default_focal
        self.near = near
        self.far = far
        self.num_depth_candidates = num_depth_candidates
        self.num_experts = num_experts
        self.gumbel_tau = gumbel_tau
        self.energy_floor = energy_floor
        self.wavelet = wavelet

        self.build_pixel_encoder(
            vit_size,
            image_size=image_size,
            patch_size=patch_size,
            global_layers=global_layers,
            out_layers=out_layers,
            camera_tokens=not pose_free,
            pretrained_backbone=pretrained_backbone,
            drop_path_rate=drop_path_rate,
            dpt_features=dpt_features,
            feature_dim=feature_dim,
            shallow_dim=shallow_dim,
        )
        # --- point head: own-frame depth + a free correction into view 0's frame (posed: points
        # stay on their rays, no correction to predict) ---
        self.build_pixel_depth(
            feature_dim,
            num_depth_candidates,
            refine_dim=refine_dim if depth_refine else None,
            point_head=pose_free,
        )
        # --- routing ---
        self.prior = HighFrequencyPrior(feature_dim, prior_dim, wavelet)
        self.router = CardinalityRouter(
            feature_dim, router_hidden_dim, usage, energy_ladder, floor=energy_floor
        )
        self.register_buffer("target_usage", torch.tensor(usage), persistent=False)
        self.neighbour = (
            PointTransformerBlock(feature_dim, neighbour_heads, neighbour_k, mode="knn")
            if neighbour_aggregation
            else None
        )
        # --- experts 1..M (expert 0 has no parameters: it emits nothing) ---
        self.experts = nn.ModuleList(
            GaussianHead(
                feature_dim + 1,
                AnchorOffsetPlacement(offset_bound),
                gaussians_per_location=k,
                sh_degree=sh_degree,
                hidden_dim=expert_hidden_dim,
                scale_factor=scale_factor,
                max_scale=max_scale,
                opacity_bias=opacity_bias,
            )
            for k in range(1, num_experts + 1)
        )
        if init_checkpoint:
            self.load_init_checkpoint(init_checkpoint)

    # ------------------------------------------------------------------ loading
    def trunk_modules(self) -> dict[str, nn.Module]:
        """The per-pixel trunk that ``init_checkpoint`` starts from trained weights."""
        return self.pixel_trunk_modules()

    def load_init_checkpoint(self, location: str | os.PathLike) -> list[str]:
        """Load a trained trunk (see ``init_checkpoint``) strictly, module by module.

        Every trunk module of this model must be in the file with matching keys and shapes; the
        file's other entries (a pixel-aligned Gaussian head, another model's router and experts)
        are ignored.

        Returns:
            The names of the modules loaded.

        Raises:
            PretrainedError: unreadable weights, or a trunk module missing from or not matching
                the file.
        """
        from models.weights.builder import load_state_dict_strict, sub_state_dict
        from models.weights.hub import PretrainedError, read_weights

        state, path = read_weights(location, "splatweaver")
        loaded = []
        for name, module in self.trunk_modules().items():
            part = sub_state_dict(state, f"{name}.")
            if not part:
                raise PretrainedError(
                    path, f"holds no {name!r} weights to start the SplatWeaver trunk from"
                )
            load_state_dict_strict(module, part, path, f"SplatWeaver {name}")
            loaded.append(name)
        return loaded

    # ------------------------------------------------------------------ pieces
    @staticmethod
    def _frozen_noise(logits: Tensor, v: int) -> Tensor:
        """See ``frozen_gumbel_noise``."""
        return frozen_gumbel_noise(logits, v)

    def _route(self, logits: Tensor, routing: str, noise: Tensor | None) -> tuple[Tensor, Tensor]:
        """Gates ``[N, M + 1, H, W]`` and chosen cardinalities ``[N, H, W]``."""
        return route(logits, routing, noise, self.gumbel_tau)

    def _budget_shift(
        self, logits: Tensor, noise: Tensor | None, target: float, b: int, steps: int = 40
    ) -> Tensor:
        """See ``budget_shift``."""
        return budget_shift(logits, noise, target, b, steps)

    def _routing_losses(self, logits: Tensor, energy: Tensor) -> dict[str, Tensor]:
        """The regulariser's unweighted terms: cross-entropy to the quantile targets
        (``routing_ce``), to the uniform distribution (``routing_smoothing``; label smoothing
        ``e`` mixes the two, ``(1 - e) * ce + e * smoothing``, which is
        ``F.cross_entropy(..., label_smoothing=e)``) and the usage penalty (``routing_usage``)."""
        logits = logits.float()
        targets = quantile_targets(energy, self.target_usage, self.energy_floor)  # [N, H, W]
        log_p = logits.log_softmax(dim=1)  # [N, M + 1, H, W]
        ce = F.nll_loss(log_p, targets)
        smoothing = -log_p.mean(dim=1).mean()
        usage = logits.softmax(dim=1).mean(dim=(0, 2, 3))  # [M + 1]
        target = self.target_usage.float().clamp_min(1e-8)
        penalty = (usage * (usage.clamp_min(1e-8).log() - target.log())).sum()
        return {"routing_ce": ce, "routing_smoothing": smoothing, "routing_usage": penalty}

    @staticmethod
    def _estimate_focal(points: Tensor, coords: Tensor) -> Tensor:
        """Least-squares normalised focal ``[B, 2]`` of view-0 points ``[B, P, 3]`` at pixel
        centres ``coords [P, 2]`` (principal point at the centre)."""
        z = points[..., 2].clamp_min(1e-6)
        ratio = points[..., :2] / z[..., None]  # [B, P, 2]
        centred = coords - 0.5  # [P, 2]
        numerator = (ratio * centred).sum(dim=1)
        denominator = ratio.square().sum(dim=1).clamp_min(1e-12)
        return numerator / denominator

    # ------------------------------------------------------------------ forward
    def forward(
        self,
        context: dict[str, Tensor],
        *,
        max_gaussians: int | None = None,
        routing: str | None = None,
        gaussians_per_pixel: float | None = None,
    ) -> ModelOutput:
        """Predict Gaussians from the context views (poses are ignored when ``pose_free``).

        Args:
            context: ``image [B, V, 3, H, W]``; optional ``near``/``far`` ``[B, V]`` and (only
                with ``use_intrinsics=True``) ``intrinsics [B, V, 3, 3]``; ``pose_free=False``:
                ``extrinsics [B, V, 4, 4]`` and ``intrinsics [B, V, 3, 3]`` required.
            max_gaussians: keep at most this many Gaussians per scene (the most opaque).
            routing: ``"gumbel"`` (straight-through hard Gumbel-softmax sample, random),
                ``"frozen_gumbel"`` (Gumbel-max with a fixed noise field: deterministic, and each
                pixel's choice is distributed as in training) or ``"argmax"`` (the most likely
                expert everywhere); ``None``: Gumbel in training mode, frozen Gumbel in eval mode.
            gaussians_per_pixel: *inference-time budget (our addition)*: shift every pixel's
                logits by ``s * k`` for expert ``k``, with one ``s`` per scene found by bisection,
                so that the argmax routing spends at most this many Gaussians per pixel on
                average (as close as the routing allows). The shift keeps the router's ranking
                of pixels (the chosen cardinality is monotone in ``s``); deterministic routing
                only (``frozen_gumbel`` or ``argmax``).

        Returns:
            ``ModelOutput``: ``gaussians`` padded to the largest count in the batch (``mask``
            marks valid ones; ``count()`` is the sum of the routed cardinalities),
            ``losses`` (the regulariser's terms, unweighted), diagnostics ``routing_map [B, V, H, W]``
            (chosen cardinality), ``expert_usage [M + 1]`` (fraction of pixels per expert),
            ``gaussians_per_pixel``,
            ``hf_energy [B, V, H, W]``, ``depth [B, V, H, W]`` (own-frame z-depth),
            ``points [B, V, H, W, 3]`` (view 0's frame; ``pose_free=False``: the world frame),
            ``extrinsics [B, V, 4, 4]`` (fitted, view 0 identity; ``pose_free=False``: the given ones) and
            ``intrinsics [B, V, 3, 3]``.
        """
        routing = routing or ("gumbel" if self.training else "frozen_gumbel")
        if routing not in ROUTING_MODES:
            raise ValueError(f"routing must be one of {ROUTING_MODES} or None, got {routing!r}")
        b, v, h, w = check_context(context, require_poses=not self.pose_free)
        images = context["image"]  # [B, V, 3, H, W]
        dtype, device = images.dtype, images.device
        p = h * w

        # --- backbone and per-pixel features ---
        if not self.pose_free:
            extrinsics = context["extrinsics"].to(dtype)
            # Camera tokens see poses relative to view 0 at unit baseline: frame invariant.
            features = self.pixel_features(
                images, (h, w), normalize_scene(extrinsics)[0], context["intrinsics"].to(dtype)
            )
        else:
            features = self.pixel_features(images, (h, w))  # [BV, C, H, W]

        # --- one point per pixel, in view 0's frame ---
        near = context.get("near")
        far = context.get("far")
        near = torch.full((b, v), self.near, device=device) if near is None else near
        far = torch.full((b, v), self.far, device=device) if far is None else far
        pixel_depth = self.pixel_depth(features, near.to(dtype), far.to(dtype))
        depth, t = pixel_depth.depth[:, :, 0], pixel_depth.inverse  # [B, V, H, W], [BV, 1, H, W]
        given = context.get("intrinsics") if (self.use_intrinsics or not self.pose_free) else None
        if given is not None:
            intrinsics = given.to(dtype)
        else:
            canonical = torch.tensor(
                [[self.default_focal, 0.0, 0.5], [0.0, self.default_focal, 0.5], [0.0, 0.0, 1.0]],
                dtype=dtype,
                device=device,
            )
            intrinsics = canonical.expand(b, v, 3, 3)
        coords = pixel_grid((h, w), device, dtype).reshape(p, 2)  # [P, 2]
        rays = camera_directions(coords, intrinsics)  # [B, V, P, 3], z = 1
        local = rays * rearrange(depth, "b v h w -> b v (h w) 1")  # own-frame points
        if not self.pose_free:  # known cameras: every point stays on its ray, in the world frame
            points = transform_points(extrinsics, local)  # [B, V, P, 3]
        else:
            correction = free_mean_activation(self.point_head(features), 100.0)  # [BV, 3, H, W]
            correction = rearrange(correction, "(b v) c h w -> b v (h w) c", b=b)
            if given is not None:  # view 0's rays are exact: its points stay on them
                keep = torch.ones(v, dtype=dtype, device=device)
                keep[0] = 0.0
                correction = correction * keep[None, :, None, None]
            points = local + correction  # [B, V, P, 3]

        # --- high-frequency prior and routing ---
        detail = detail_bands(images, self.wavelet)  # [B, V, 3, H/2, W/2]
        energy = detail_energy(detail.detach(), (h, w))  # [B, V, H, W]
        gate = self.prior(rearrange(detail, "b v c h w -> (b v) c h w"), (h, w))
        flat_energy = rearrange(energy, "b v h w -> (b v) h w")
        logits = self.router(features + features * gate, flat_energy)  # [BV, M + 1, H, W]
        noise = self._frozen_noise(logits, v) if routing == "frozen_gumbel" else None
        budget_shift = None
        if gaussians_per_pixel is not None:
            if routing == "gumbel":
                raise ValueError(
                    "gaussians_per_pixel needs deterministic routing (frozen_gumbel or argmax)"
                )
            budget_shift = self._budget_shift(logits.detach(), noise, float(gaussians_per_pixel), b)
            ladder = torch.arange(self.num_experts + 1, device=device, dtype=logits.dtype)
            shift = repeat(budget_shift, "b -> (b v) 1 1 1", v=v)
            logits = logits + shift * ladder[None, :, None, None]
        gates, choice = self._route(logits, routing, noise)  # [BV, M + 1, H, W], [BV, H, W]
        losses = self._routing_losses(logits, flat_energy)

        # --- experts ---
        expert_in = torch.cat([features, t], dim=1)  # [BV, C + 1, H, W]
        expert_in = rearrange(expert_in, "(b v) c h w -> b (v h w) c", b=b)
        flat_points = rearrange(points, "b v p c -> b (v p) c")  # [B, N, 3]
        if self.neighbour is not None:
            refined = self.neighbour(expert_in[..., :-1], flat_points)
            expert_in = torch.cat([refined, expert_in[..., -1:]], dim=-1)
        color = rearrange(images, "b v c h w -> b (v h w) c")
        footprint = 0.5 * (1.0 / (intrinsics[..., 0, 0] * w) + 1.0 / (intrinsics[..., 1, 1] * h))
        pixel_scale = rearrange(depth, "b v h w -> b (v h w)") * repeat(
            footprint, "b v -> b (v p)", p=p
        )  # [B, N] world size of one pixel at its depth
        gates = rearrange(gates, "(b v) e h w -> b (v h w) e", b=b)
        choice = rearrange(choice, "(b v) h w -> b (v h w)", b=b)
        sets = []
        for k, expert in enumerate(self.experts, start=1):
            g = expert(
                expert_in,
                color=color,
                anchors=flat_points,
                offset_scale=pixel_scale,
                scale_reference=pixel_scale,
            )  # N * k Gaussians, location-major
            gate_k = gates[..., k].repeat_interleave(k, dim=1)  # [B, N * k]
            chosen = (choice == k).repeat_interleave(k, dim=1)
            sets.append(g.replace(opacities=g.opacities * gate_k, mask=chosen))
        gaussians = Gaussians.cat(sets).compact()
        if max_gaussians is not None:
            gaussians = gaussians.prune(max_count=max_gaussians)

        # --- extras ---
        usage = F.one_hot(choice, self.num_experts + 1).float().mean(dim=(0, 1))
        with torch.no_grad():
            if not self.pose_free:
                fitted = extrinsics.detach()
            else:
                fitted = umeyama(local, points, scale=False).matrix()  # [B, V, 4, 4]
                fitted[:, 0] = torch.eye(4, dtype=dtype, device=device)
            if given is None:  # intrinsics-free: estimate a shared focal from view 0's points
                focal = self._estimate_focal(points[:, 0], coords).clamp_min(1e-3)  # [B, 2]
                intrinsics = intrinsics.clone()
                intrinsics[..., 0, 0] = focal[:, None, 0]
                intrinsics[..., 1, 1] = focal[:, None, 1]
        diagnostics: dict[str, Tensor] = {
            "routing_map": rearrange(choice, "b (v h w) -> b v h w", v=v, h=h),
            "expert_usage": usage,
            "gaussians_per_pixel": (usage * torch.arange(len(usage), device=device)).sum(),
            "hf_energy": energy,
            "points": rearrange(points, "b v (h w) c -> b v h w c", h=h),
        }
        if budget_shift is not None:
            diagnostics["budget_shift"] = budget_shift
        return ModelOutput(
            gaussians,
            depth=depth,
            extrinsics=fitted,
            intrinsics=intrinsics,
            losses=losses,
            diagnostics=diagnostics,
        )


# Inference knobs (models.knobs): the per-pixel budget, and every family's max_gaussians. Backbone
# and DPT features do not depend on the budget (it shifts the router's logits) and are reused.
INFERENCE_KNOBS = (
    Knob(
        "gaussians_per_pixel",
        "float",
        low=0.0,
        high=None,
        high_attr="num_experts",
        sweep=(0.25, 0.5, 1.0),
        step=0.05,
        help="at most this many Gaussians per pixel on average: the router's choice shifted "
        "towards cheaper experts, keeping its ranking of pixels (off: as routed)",
    ),
    MAX_GAUSSIANS,
)
KNOB_FREE_MODULES = ("backbone", "dpt")

# ---------------------------------------------------------------------- registry entries
_TINY = dict(
    vit_size="tiny",
    image_size=64,
    dpt_features=48,
    feature_dim=32,
    shallow_dim=16,
    num_depth_candidates=64,
    expert_hidden_dim=32,
    router_hidden_dim=32,
    prior_dim=16,
    sh_degree=1,
    target_gaussians_per_pixel=0.5,
)
_SMALL = dict(
    vit_size="small",
    image_size=252,
    dpt_features=64,
    feature_dim=64,
    shallow_dim=32,
    num_depth_candidates=128,
    expert_hidden_dim=64,
    router_hidden_dim=64,
    prior_dim=32,
    sh_degree=2,
    target_gaussians_per_pixel=0.5,
)
_BASE = dict(
    vit_size="base",
    image_size=252,
    dpt_features=128,
    feature_dim=64,
    shallow_dim=32,
    num_depth_candidates=128,
    expert_hidden_dim=64,
    router_hidden_dim=64,
    prior_dim=32,
    sh_degree=2,
    target_gaussians_per_pixel=0.5,
)


@register_model
def splatweaver_tiny(**kwargs) -> SplatWeaver:
    """SplatWeaver with a tiny multi-view ViT (CPU-trainable at 64x64), 0..3 Gaussians/pixel."""
    return SplatWeaver(**{**_TINY, **kwargs})


@register_model
def splatweaver_small(**kwargs) -> SplatWeaver:
    """SplatWeaver on a ViT-S/14 (DINOv2-compatible) backbone."""
    return SplatWeaver(**{**_SMALL, **kwargs})


@register_model
def splatweaver_base(**kwargs) -> SplatWeaver:
    """SplatWeaver on a ViT-B/14 (DINOv2-compatible) backbone."""
    return SplatWeaver(**{**_BASE, **kwargs})


register_pretrained_cfgs(
    synthetic64_cfg(
        "splatweaver_tiny",
        "experiment=synthetic_splatweaver (pose_free=false), 814 steps (30 min)",
        pose_free=False,
        psnr=20.36,
        ssim=0.613,
    )
)
