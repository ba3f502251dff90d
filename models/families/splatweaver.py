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

import os
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from einops import rearrange, repeat
from torch import Tensor, nn

from models.core.base import ModelOutput, SplatModel, check_context
from models.core.gaussians import Gaussians
from models.geometry.cameras import camera_directions, normalize_scene, pixel_grid, transform_points
from models.geometry.similarity import umeyama
from models.layers.cardinality_router import (
    ROUTING_MODES,
    CardinalityRouter,
    HighFrequencyPrior,
    budget_shift,
    frozen_gumbel_noise,
    quantile_targets,
    route,
    target_usage_distribution,
)
from models.layers.heads import AnchorOffsetPlacement, GaussianHead, free_mean_activation
from models.layers.pixel_trunk import PixelTrunk
from models.layers.point_transformer import PointTransformerBlock
from models.layers.wavelet import detail_bands, detail_energy
from models.weights.builder import load_state_dict_strict, sub_state_dict
from models.weights.hub import PretrainedError, read_weights
from models.weights.knobs import MAX_GAUSSIANS, Knob
from models.weights.pretrained_cfg import synthetic64_cfg
from models.weights.registry import register_model, register_pretrained_cfgs

__all__ = [
    "SplatWeaver",
    "splatweaver_tiny",
    "splatweaver_small",
    "splatweaver_base",
]


def _check_arguments(near: float, far: float, num_depth_candidates: int, gumbel_tau: float) -> None:
    if not 0 < near < far:
        raise ValueError(f"need 0 < near < far, got near={near}, far={far}")
    if num_depth_candidates < 2:
        raise ValueError(f"num_depth_candidates must be >= 2, got {num_depth_candidates}")
    if gumbel_tau <= 0:
        raise ValueError(f"gumbel_tau must be > 0, got {gumbel_tau}")


def _expert_usage(
    target_usage: Sequence[float] | None, gaussians_per_pixel: float, num_experts: int
) -> list[float]:
    """The routing regulariser's target distribution over experts ``0..M``."""
    if target_usage is None:
        return target_usage_distribution(gaussians_per_pixel, num_experts)
    usage = [float(p) for p in target_usage]
    if len(usage) != num_experts + 1 or min(usage) < 0 or abs(sum(usage) - 1) > 1e-4:
        raise ValueError(
            f"target_usage must be {num_experts + 1} non-negative numbers summing to 1, "
            f"got {target_usage}"
        )
    return usage


@dataclass
class _PixelPoints:
    """One point per pixel and the cameras it was placed with (``N = V * H * W``)."""

    depth: Tensor  # [B, V, H, W] own-frame z-depth
    inverse_depth: Tensor  # [BV, 1, H, W] the depth head's normalised inverse depth
    intrinsics: Tensor  # [B, V, 3, 3] given or canonical
    intrinsics_given: bool
    coords: Tensor  # [P, 2] pixel centres, normalised
    local: Tensor  # [B, V, P, 3] own-frame points
    points: Tensor  # [B, V, P, 3] view 0's frame (pose-free) or the world frame (posed)
    extrinsics: Tensor | None  # [B, V, 4, 4] the given cameras (posed), else None


@dataclass
class _Routing:
    """The router's choice per pixel, flattened to ``N = V * H * W``."""

    gates: Tensor  # [B, N, M + 1] straight-through gates
    choice: Tensor  # [B, N] chosen cardinality
    energy: Tensor  # [B, V, H, W] wavelet detail energy
    losses: dict[str, Tensor]
    budget_shift: Tensor | None  # [B] the logit shift meeting gaussians_per_pixel


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
        _check_arguments(near, far, num_depth_candidates, gumbel_tau)
        usage = _expert_usage(target_usage, target_gaussians_per_pixel, num_experts)
        self.vit_size = vit_size
        self.use_intrinsics = use_intrinsics
        self.pose_free = pose_free  # instance value: shadows the class default
        self.default_focal, self.near, self.far = default_focal, near, far
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
        # --- routing, then experts 1..M (expert 0 has no parameters: it emits nothing) ---
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
        head = dict(sh_degree=sh_degree, hidden_dim=expert_hidden_dim, scale_factor=scale_factor)
        head.update(max_scale=max_scale, opacity_bias=opacity_bias)
        self.experts = nn.ModuleList(
            GaussianHead(
                feature_dim + 1,
                AnchorOffsetPlacement(offset_bound),
                gaussians_per_location=k,
                **head,
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
        if gaussians_per_pixel is not None and routing == "gumbel":
            raise ValueError(
                "gaussians_per_pixel needs deterministic routing (frozen_gumbel or argmax)"
            )
        b, v, h, w = check_context(context, require_poses=not self.pose_free)
        images = context["image"]  # [B, V, 3, H, W]
        features = self._features(context, (h, w))  # [BV, C, H, W]
        geometry = self._pixel_points(context, features)
        routed = self._routing(images, features, routing, gaussians_per_pixel)
        gaussians = self._expert_gaussians(images, features, geometry, routed)
        if max_gaussians is not None:
            gaussians = gaussians.prune(max_count=max_gaussians)
        extrinsics, intrinsics = self._cameras(geometry)
        usage = F.one_hot(routed.choice, self.num_experts + 1).float().mean(dim=(0, 1))
        diagnostics: dict[str, Tensor] = {
            "routing_map": rearrange(routed.choice, "b (v h w) -> b v h w", v=v, h=h),
            "expert_usage": usage,
            "gaussians_per_pixel": (usage * torch.arange(len(usage), device=usage.device)).sum(),
            "hf_energy": routed.energy,
            "points": rearrange(geometry.points, "b v (h w) c -> b v h w c", h=h),
        }
        if routed.budget_shift is not None:
            diagnostics["budget_shift"] = routed.budget_shift
        return ModelOutput(
            gaussians,
            depth=geometry.depth,
            extrinsics=extrinsics,
            intrinsics=intrinsics,
            losses=routed.losses,
            diagnostics=diagnostics,
        )

    def _features(self, context: dict[str, Tensor], size: tuple[int, int]) -> Tensor:
        """Per-pixel features ``[BV, C, H, W]`` (posed: camera tokens see poses relative to view
        0 at unit baseline, so the features are frame invariant)."""
        images = context["image"]
        if self.pose_free:
            return self.pixel_features(images, size)
        extrinsics = context["extrinsics"].to(images.dtype)
        intrinsics = context["intrinsics"].to(images.dtype)
        return self.pixel_features(images, size, normalize_scene(extrinsics)[0], intrinsics)

    def _pixel_points(self, context: dict[str, Tensor], features: Tensor) -> _PixelPoints:
        """One point per pixel: in view 0's frame (pose-free) or the world frame (posed)."""
        images = context["image"]
        b, v, _, h, w = images.shape
        dtype, device = images.dtype, images.device
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
        coords = pixel_grid((h, w), device, dtype).reshape(h * w, 2)  # [P, 2]
        rays = camera_directions(coords, intrinsics)  # [B, V, P, 3], z = 1
        local = rays * rearrange(depth, "b v h w -> b v (h w) 1")  # own-frame points
        extrinsics = None
        if not self.pose_free:  # known cameras: every point stays on its ray, in the world frame
            extrinsics = context["extrinsics"].to(dtype)
            points = transform_points(extrinsics, local)  # [B, V, P, 3]
        else:
            correction = free_mean_activation(self.point_head(features), 100.0)  # [BV, 3, H, W]
            correction = rearrange(correction, "(b v) c h w -> b v (h w) c", b=b)
            if given is not None:  # view 0's rays are exact: its points stay on them
                keep = torch.ones(v, dtype=dtype, device=device)
                keep[0] = 0.0
                correction = correction * keep[None, :, None, None]
            points = local + correction  # [B, V, P, 3]
        return _PixelPoints(
            depth, t, intrinsics, given is not None, coords, local, points, extrinsics
        )

    def _routing(
        self, images: Tensor, features: Tensor, routing: str, gaussians_per_pixel: float | None
    ) -> _Routing:
        """The high-frequency prior, the router's logits (budget-shifted when asked) and the
        chosen experts, flattened to ``[B, N, ...]`` with ``N = V * H * W``."""
        b, v, _, h, w = images.shape
        detail = detail_bands(images, self.wavelet)  # [B, V, 3, H/2, W/2]
        energy = detail_energy(detail.detach(), (h, w))  # [B, V, H, W]
        gate = self.prior(rearrange(detail, "b v c h w -> (b v) c h w"), (h, w))
        flat_energy = rearrange(energy, "b v h w -> (b v) h w")
        logits = self.router(features + features * gate, flat_energy)  # [BV, M + 1, H, W]
        noise = self._frozen_noise(logits, v) if routing == "frozen_gumbel" else None
        shift = None
        if gaussians_per_pixel is not None:
            shift = self._budget_shift(logits.detach(), noise, float(gaussians_per_pixel), b)
            ladder = torch.arange(self.num_experts + 1, device=images.device, dtype=logits.dtype)
            logits = logits + repeat(shift, "b -> (b v) 1 1 1", v=v) * ladder[None, :, None, None]
        gates, choice = self._route(logits, routing, noise)  # [BV, M + 1, H, W], [BV, H, W]
        return _Routing(
            gates=rearrange(gates, "(b v) e h w -> b (v h w) e", b=b),
            choice=rearrange(choice, "(b v) h w -> b (v h w)", b=b),
            energy=energy,
            losses=self._routing_losses(logits, flat_energy),
            budget_shift=shift,
        )

    def _expert_gaussians(
        self, images: Tensor, features: Tensor, geometry: _PixelPoints, routed: _Routing
    ) -> Gaussians:
        """Every expert's Gaussians at every pixel, masked to the routed ones and compacted."""
        b, v, _, h, w = images.shape
        expert_in = torch.cat([features, geometry.inverse_depth], dim=1)  # [BV, C + 1, H, W]
        expert_in = rearrange(expert_in, "(b v) c h w -> b (v h w) c", b=b)
        flat_points = rearrange(geometry.points, "b v p c -> b (v p) c")  # [B, N, 3]
        if self.neighbour is not None:
            refined = self.neighbour(expert_in[..., :-1], flat_points)
            expert_in = torch.cat([refined, expert_in[..., -1:]], dim=-1)
        color = rearrange(images, "b v c h w -> b (v h w) c")
        intrinsics = geometry.intrinsics
        footprint = 0.5 * (1.0 / (intrinsics[..., 0, 0] * w) + 1.0 / (intrinsics[..., 1, 1] * h))
        pixel_scale = rearrange(geometry.depth, "b v h w -> b (v h w)") * repeat(
            footprint, "b v -> b (v p)", p=h * w
        )  # [B, N] world size of one pixel at its depth
        sets = []
        for k, expert in enumerate(self.experts, start=1):
            g = expert(
                expert_in,
                color=color,
                anchors=flat_points,
                offset_scale=pixel_scale,
                scale_reference=pixel_scale,
            )  # N * k Gaussians, location-major
            gate_k = routed.gates[..., k].repeat_interleave(k, dim=1)  # [B, N * k]
            chosen = (routed.choice == k).repeat_interleave(k, dim=1)
            sets.append(g.replace(opacities=g.opacities * gate_k, mask=chosen))
        return Gaussians.cat(sets).compact()

    @torch.no_grad()
    def _cameras(self, geometry: _PixelPoints) -> tuple[Tensor, Tensor]:
        """Extrinsics ``[B, V, 4, 4]`` (given, or fitted with view 0 the identity) and
        intrinsics ``[B, V, 3, 3]`` (given, or a shared focal estimated from view 0's points)."""
        if geometry.extrinsics is not None:
            fitted = geometry.extrinsics.detach()
        else:
            fitted = umeyama(geometry.local, geometry.points, scale=False).matrix()  # [B, V, 4, 4]
            fitted[:, 0] = torch.eye(4, dtype=fitted.dtype, device=fitted.device)
        intrinsics = geometry.intrinsics
        if not geometry.intrinsics_given:
            focal = self._estimate_focal(geometry.points[:, 0], geometry.coords).clamp_min(1e-3)
            intrinsics = intrinsics.clone()
            intrinsics[..., 0, 0] = focal[:, None, 0]
            intrinsics[..., 1, 1] = focal[:, None, 1]
        return fitted, intrinsics


# Inference knobs (models.weights.knobs): the per-pixel budget, and every family's max_gaussians. Backbone
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
