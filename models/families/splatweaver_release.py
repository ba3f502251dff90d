"""SplatWeaver's released model (``Jeasco/SplatWeaver``) in this project's code: the MoE-cardinality
family (0..M Gaussians per pixel) on a VGGT-style pose-free trunk.

Architecture of the release (``yecongwan/SplatWeaver`` at 6a157ce), re-implemented here:

1. **Trunk** (``models.layers.vggt``): a DINOv2 ViT-L/14 patch encoder with 4 registers, then 24
   pairs of per-view / all-view attention blocks (2D RoPE, QK-norm) with a camera token and 4
   register tokens per view. The release runs this aggregator on images rounded to bfloat16 (its
   weights are stored in bfloat16); we round the input the same way and compute in the weights'
   dtype of this model (float32 unless you cast it).
2. **Cameras (pose-free):** VGGT's camera head refines a 9-number encoding (translation,
   quaternion, fields of view) over 4 iterations; it gives world-to-camera ``[R|t]`` and
   intrinsics with the principal point at the image centre.
3. **Depth:** VGGT's DPT depth head (``exp`` depth, ``1 + exp`` confidence); every pixel is
   unprojected with the predicted camera (pixel ``(u, v)`` at integer coordinates, as released).
4. **Gaussian features:** a second DPT on the same four layers (features 256 -> 128 channels at
   full resolution) plus a small image CNN, a sine-cosine UV embedding and ``conv + ReLU``.
5. **High-frequency prior:** the db2 wavelet detail bands (LH, HL, HH, PyWavelets' symmetric
   border) of the luminance, two convolutions, bilinear upsampling, a conv and a sigmoid: a
   per-channel gate ``g``; the router sees ``f + f_pre * g`` (``f_pre``: features before the last
   conv).
6. **Router and cardinality experts:** two 1x1 convolutions give ``M + 1 = 4`` logits per pixel;
   expert ``k`` (an MLP, the shared ``GaussianHead`` with ReLU) emits ``k`` Gaussians within
   ``tanh * 0.005`` of the pixel's point; expert 0 emits none. The release samples the expert with
   a hard Gumbel-softmax (``tau = 0.5``) *at inference too*, so its output is random.
7. **Neighbour refinement:** every emitted Gaussian attends over its 9 nearest emitted Gaussians
   (itself included) in 3D (vector attention with a relative-position MLP) and a linear layer adds
   a correction to its raw parameters. The release finds the neighbours with an approximate faiss
   IVF search on the GPU (``nlist = N // 10000``, ``nprobe = 4``); we use an **exact** kNN
   (``scipy``'s k-d tree on the CPU when available, else blocked ``torch.cdist``), so outputs can
   differ from the release's wherever its approximate search misses a true neighbour.
8. **Activations** (the shared ``GaussianHead.decode``): opacity ``sigmoid``, scale
   ``0.001 * softplus(x)`` capped at 0.4, normalised quaternion, SH degree 2 with the higher bands
   scaled by ``0.1 * 0.25^l``.

Routing modes (forward keyword ``routing``): ``"frozen_gumbel"`` (default; Gumbel-max with a fixed
noise field, this family's deterministic routing distributed like training), ``"argmax"`` and
``"gumbel"`` (fresh noise every call: the release's behaviour). ``gaussians_per_pixel=g`` shifts
the logits so that the routing spends at most ``g`` Gaussians per pixel on average (this family's
budget knob). ``frame="scene"`` (default) moves the output into the project's scene frame
(predicted view 0 is the identity, the largest predicted camera distance is 1, SH rotated);
``frame="release"`` keeps the release's frame (VGGT's world frame).

``checkpoint_filter_fn`` maps the release's ``model.safetensors`` (``encoder.aggregator.*`` in
bfloat16, the heads in float32) onto this model.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from models.core.base import ModelOutput, SplatModel, check_context
from models.core.gaussians import Gaussians
from models.families.splatweaver import INFERENCE_KNOBS as _FAMILY_KNOBS
from models.layers.backbones.dpt import add_uv_embedding, release_dpt_key
from models.layers.cardinality_router import budget_shift, frozen_gumbel_noise, route
from models.layers.heads import AnchorOffsetPlacement, GaussianHead
from models.layers.heads.gaussian_head import raw_gaussian_dim
from models.layers.knn import knn
from models.layers.release_frame import pad_scenes, to_scene_frame
from models.layers.vggt import (
    AlternatingAggregator,
    CameraHead,
    trunk_and_geometry,
    vggt_dpt,
)
from models.layers.wavelet import WAVELETS
from models.weights.input_recipe import InputRecipe
from models.weights.pretrained_cfg import PretrainedCfg
from models.weights.registry import register_model, register_pretrained_cfgs

__all__ = [
    "SplatWeaverRelease",
    "ReleaseHighFrequencyPrior",
    "NeighbourRefiner",
    "checkpoint_filter_fn",
    "exact_knn",
    "pywt_detail_bands",
    "splatweaver_vggt",
    "splatweaver_vggt_tiny",
]

ROUTING_MODES = ("frozen_gumbel", "argmax", "gumbel")
FRAMES = ("scene", "release")


# ----------------------------------------------------------------------------- wavelet prior
def pywt_detail_bands(image: Tensor, wavelet: str = "db2") -> Tensor:
    """One-level detail bands (LH, HL, HH) of the BT.601 luminance, PyWavelets' conventions.

    ``mode="symmetric"`` in PyWavelets' sense (half-sample reflection, edge sample repeated) and
    its output length ``floor((N + L - 1) / 2)`` (225 for 448 pixels with db2), which the released
    prior (``pytorch_wavelets.DWTForward``) uses; ``models.layers.wavelet`` pads by replication instead.

    Args:
        image: ``[N, 3, H, W]`` in [0, 1].

    Returns:
        ``[N, 3, h, w]``: low-pass along x / high-pass along y (LH), HL, HH.
    """
    lo, hi = (torch.tensor(f, dtype=image.dtype, device=image.device) for f in WAVELETS[wavelet])
    taps = lo.numel()
    r, g, b = image[:, 0], image[:, 1], image[:, 2]
    x = (0.299 * r + 0.587 * g + 0.114 * b)[:, None]  # [N, 1, H, W]

    def analyse(x: Tensor, dim: int) -> tuple[Tensor, Tensor]:
        n = x.shape[dim]
        out = (n + taps - 1) // 2
        pad = 2 * (out - 1) - n + taps
        before, after = pad // 2, (pad + 1) // 2
        parts = [x.narrow(dim, 0, before).flip(dim), x, x.narrow(dim, n - after, after).flip(dim)]
        x = torch.cat(parts, dim=dim)
        shape = [1, 1, 1, 1]
        shape[dim] = taps
        stride = [1, 1]
        stride[dim - 2] = 2
        channels = x.shape[1]
        kernel = torch.cat([lo.reshape(shape), hi.reshape(shape)] * channels)
        y = F.conv2d(x, kernel, stride=tuple(stride), groups=channels)  # [N, 2C, ...]
        return y

    rows = analyse(x, 3)  # [N, 2, H, w']: (x-low, x-high)
    bands = analyse(rows, 2)  # [N, 4, h', w']: (xl yl, xl yh, xh yl, xh yh)
    return bands[:, 1:]


class ReleaseHighFrequencyPrior(nn.Module):
    """The release's wavelet guidance: detail bands -> conv 5x5 -> conv 1x1 -> bilinear upsample
    -> conv 3x3 -> sigmoid: a gate ``[N, out_dim, H, W]`` in (0, 1).

    Args:
        out_dim: gate channels.
        hidden_dim: channels of the first two convolutions.
        wavelet: ``"db2"`` (released) or ``"haar"``.
    """

    def __init__(self, out_dim: int, hidden_dim: int = 32, wavelet: str = "db2") -> None:
        super().__init__()
        self.wavelet = wavelet
        self.reduce = nn.Sequential(
            nn.Conv2d(3, hidden_dim, 5, padding=2), nn.Conv2d(hidden_dim, hidden_dim, 1)
        )
        self.expand = nn.Sequential(nn.Conv2d(hidden_dim, out_dim, 3, padding=1), nn.Sigmoid())

    def forward(self, images: Tensor) -> Tensor:
        """``images [N, 3, H, W]`` in [0, 1] -> gate ``[N, out_dim, H, W]``."""
        detail = pywt_detail_bands(images, self.wavelet)
        x = F.interpolate(
            self.reduce(detail), size=images.shape[-2:], mode="bilinear", align_corners=False
        )
        return self.expand(x)


# ----------------------------------------------------------------------------- kNN refinement
def exact_knn(points: Tensor, k: int) -> Tensor:
    """Exact ``k`` nearest neighbours of every point among ``points [N, 3]`` (itself included).

    Returns ``[N, k]`` int64 indices; with fewer than ``k`` points the missing neighbours are the
    point itself (as the release's search fills its misses). The project's search
    (``models.layers.knn``): its k-d tree above 4096 points on the CPU, else ``"cdist"``.
    """
    n = points.shape[0]
    found = min(k, n)
    if n == 0:
        return torch.zeros(0, k, dtype=torch.long, device=points.device)
    tree = points.device.type == "cpu" and n > 4096 and importlib.util.find_spec("scipy")
    method = "kdtree" if tree else "cdist"
    index = knn(points.detach(), found, method=method, max_elements=1 << 28)  # [N, found], 1 GB
    if found < k:
        own = torch.arange(n, device=points.device)[:, None].expand(n, k - found)
        index = torch.cat([index, own], dim=1)
    return index


class NeighbourRefiner(nn.Module):
    """Vector attention of every Gaussian over its ``k`` nearest Gaussians in 3D; a linear layer
    turns the result into a correction of its raw parameters.

    Input rows: ``[mean (3), raw parameters (out_dim), pixel feature]``; output ``[N, out_dim]``:
    ``head(attention) + raw parameters``.
    """

    def __init__(self, in_dim: int, out_dim: int, dim: int = 32, neighbours: int = 9) -> None:
        super().__init__()
        self.out_dim = out_dim
        self.neighbours = neighbours
        self.input = nn.Linear(in_dim, dim)
        self.to_q = nn.Linear(dim, dim)
        self.to_k = nn.Linear(dim, dim)
        self.to_v = nn.Linear(dim, dim)
        self.pos_mlp = nn.Sequential(nn.Linear(3, dim), nn.ReLU(), nn.Linear(dim, dim))
        self.attn_mlp = nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.Linear(dim, dim))
        self.head = nn.Linear(dim, out_dim)

    def forward(self, rows: Tensor, chunk: int = 65536) -> Tensor:
        """``rows [N, 3 + out_dim + pixel]`` -> refined raw parameters ``[N, out_dim]``."""
        positions = rows[:, :3]
        neighbours = exact_knn(positions, self.neighbours)  # [N, k]
        x = self.input(rows)  # [N, dim]
        q, k, v = self.to_q(x), self.to_k(x), self.to_v(x)
        out = []
        for start in range(0, rows.shape[0], chunk):
            idx = neighbours[start : start + chunk]  # [c, k]
            relative = self.pos_mlp(positions[idx] - positions[start : start + chunk, None])
            weights = self.attn_mlp(q[start : start + chunk, None] - k[idx] + relative)
            weights = weights.softmax(dim=1)  # over the neighbours
            out.append((weights * (v[idx] + relative)).sum(dim=1))
        fused = torch.cat(out) if out else x[:0]
        return self.head(fused) + rows[:, 3 : 3 + self.out_dim]


# ----------------------------------------------------------------------------- the model
class SplatWeaverRelease(SplatModel):
    """SplatWeaver as released (VGGT trunk, wavelet-guided cardinality experts, kNN refiner).

    Architecture arguments only (defaults: the released 1.19 B-parameter model).

    Args:
        embed_dim, depth, num_heads: aggregator width, block pairs, heads.
        encoder_depth, encoder_heads: DINOv2 patch encoder (its width is ``embed_dim``).
        num_register_tokens: register tokens (encoder and aggregator).
        patch_size: pixels per patch; image sides must be multiples of it.
        pos_grid: side of the encoder's stored position-embedding grid (37: 518 pixels).
        image_size: input side the weights were trained / demoed at (``infer.py``'s default size).
        out_layers: aggregator blocks fed to both DPT heads.
        camera_depth, camera_heads: camera head trunk.
        depth_features, depth_channels: depth DPT widths.
        gaussian_features, gaussian_channels: Gaussian-feature DPT widths (per-pixel features
            have ``gaussian_features // 2`` channels).
        num_experts: ``M``, the most Gaussians per pixel.
        router_hidden_dim: hidden channels of the router.
        prior_hidden_dim: channels of the wavelet prior's first convolutions.
        pixel_feature_dim: width of the per-pixel feature the refiner sees.
        refiner_dim: width of the neighbour attention.
        neighbours: neighbours per Gaussian (itself included).
        offset_bound: bound of a Gaussian's offset from its pixel's point (world units).
        sh_degree: SH degree.
        gumbel_tau: temperature of ``routing="gumbel"``.
        scale_factor, max_scale: scale ``scale_factor * softplus(x)``, capped at ``max_scale``.
    """

    family = "splatweaver"  # the method, as the architectures of models/families/splatweaver.py
    pose_free = True
    min_views = 1

    def __init__(
        self,
        *,
        embed_dim: int = 1024,
        depth: int = 24,
        num_heads: int = 16,
        encoder_depth: int = 24,
        encoder_heads: int = 16,
        num_register_tokens: int = 4,
        patch_size: int = 14,
        pos_grid: int = 37,
        image_size: int = 448,
        out_layers: Sequence[int] = (4, 11, 17, 23),
        camera_depth: int = 4,
        camera_heads: int = 16,
        depth_features: int = 256,
        depth_channels: Sequence[int] = (256, 512, 1024, 1024),
        gaussian_features: int = 256,
        gaussian_channels: Sequence[int] = (256, 512, 1024, 1024),
        num_experts: int = 3,
        router_hidden_dim: int = 32,
        prior_hidden_dim: int = 32,
        pixel_feature_dim: int = 32,
        refiner_dim: int = 32,
        neighbours: int = 9,
        offset_bound: float = 0.005,
        sh_degree: int = 2,
        gumbel_tau: float = 0.5,
        scale_factor: float = 0.001,
        max_scale: float = 0.4,
    ) -> None:
        super().__init__()
        out_layers = [int(i) for i in out_layers]
        if len(out_layers) != 4 or not all(0 <= i < depth for i in out_layers):
            raise ValueError(
                f"out_layers must be 4 block indices in 0..{depth - 1}, got {out_layers}"
            )
        if num_experts < 1:
            raise ValueError(f"num_experts must be >= 1, got {num_experts}")
        self.patch_size = patch_size
        self.image_size = image_size
        self.out_layers = out_layers
        self.num_experts = num_experts
        self.gumbel_tau = gumbel_tau
        width = gaussian_features // 2
        self.aggregator = AlternatingAggregator(
            embed_dim,
            depth,
            num_heads,
            num_register_tokens=num_register_tokens,
            patch_size=patch_size,
            encoder_depth=encoder_depth,
            encoder_heads=encoder_heads,
            pos_grid=pos_grid,
        )
        self.camera_head = CameraHead(2 * embed_dim, camera_depth, camera_heads)
        # VGGT's DPTs: the depth head ends in a 32-channel output_conv2 (depth, confidence); the
        # Gaussian-feature head stops after head_in (its output layers are this model's)
        self.depth_head = vggt_dpt(2 * embed_dim, depth_features, depth_channels, out_dim=2)
        self.feature_head = vggt_dpt(2 * embed_dim, gaussian_features, gaussian_channels, 0)
        self.image_encoder = nn.Sequential(
            nn.Conv2d(3, 32, 7, padding=3), nn.ReLU(), nn.Conv2d(32, width, 5, padding=2), nn.ReLU()
        )
        self.prior = ReleaseHighFrequencyPrior(width, prior_hidden_dim)
        self.feature_conv = nn.Sequential(nn.Conv2d(width, width, 3, padding=1), nn.ReLU())
        self.router = nn.Sequential(
            nn.Conv2d(width, router_hidden_dim, 1),
            nn.ReLU(),
            nn.Conv2d(router_hidden_dim, num_experts + 1, 1),
        )
        self.pixel_projector = nn.Sequential(
            nn.Linear(width, pixel_feature_dim),
            nn.ReLU(),
            nn.Linear(pixel_feature_dim, pixel_feature_dim),
        )
        self.experts = nn.ModuleList(
            GaussianHead(
                width,
                AnchorOffsetPlacement(offset_bound),
                gaussians_per_location=k,
                sh_degree=sh_degree,
                hidden_dim=width,
                scale_factor=scale_factor,
                max_scale=max_scale,
                dc_from_color=False,
                scale_shift=0.0,
                activation="relu",
            )
            for k in range(1, num_experts + 1)
        )
        raw = raw_gaussian_dim(sh_degree)
        self.refiner = NeighbourRefiner(raw + pixel_feature_dim, raw - 3, refiner_dim, neighbours)

    # ------------------------------------------------------------------ pieces
    def _scene_gaussians(
        self, choice: Tensor, gates: Tensor, features: Tensor, points: Tensor
    ) -> Gaussians:
        """One scene's Gaussians (expert-major, then pixel, then slot, as released).

        Args:
            choice: ``[N]`` chosen cardinality per pixel; ``gates [N, M + 1]``.
            features: ``[N, C]`` per-pixel features; ``points [N, 3]``.

        Returns:
            ``Gaussians`` with batch size 1.
        """
        raw_means, rows, anchors = [], [], []
        for k, expert in enumerate(self.experts, start=1):
            index = (choice == k).nonzero().squeeze(-1)
            if index.numel() == 0:
                continue
            f = features.index_select(0, index)
            raw = expert.proj(f) * gates.index_select(0, index)[:, k : k + 1]  # [P, k * R]
            raw = raw.reshape(index.numel() * k, -1)  # [P * k, R], pixel-major
            anchor = points.index_select(0, index).repeat_interleave(k, dim=0)
            means = anchor + torch.tanh(raw[:, :3]) * expert.placement.offset_bound
            pixel = self.pixel_projector(f).repeat_interleave(k, dim=0)
            raw_means.append(raw[:, :3])
            rows.append(torch.cat([means, raw[:, 3:], pixel], dim=1))
            anchors.append(anchor)
        raw_dim = self.refiner.out_dim + 3
        if rows:
            refined = self.refiner(torch.cat(rows))  # [G, R - 3]
            raw = torch.cat([torch.cat(raw_means), refined], dim=1)
            anchor = torch.cat(anchors)
        else:
            raw = features.new_zeros(0, raw_dim)
            anchor = features.new_zeros(0, 3)
        # decode places the means again (anchor + tanh * bound: the refiner's positions)
        return self.experts[0].decode(raw[None, :, None], anchors=anchor[None])

    # ------------------------------------------------------------------ forward
    def forward(
        self,
        context: dict[str, Tensor],
        *,
        routing: str = "frozen_gumbel",
        gaussians_per_pixel: float | None = None,
        max_gaussians: int | None = None,
        frame: str = "scene",
    ) -> ModelOutput:
        """Predict Gaussians and cameras from ``context["image"] [B, V, 3, H, W]`` in [0, 1].

        Poses and intrinsics in ``context`` are ignored (pose-free). ``H`` and ``W`` must be
        multiples of ``patch_size`` (14).

        Args:
            routing: ``"frozen_gumbel"`` (deterministic, distributed like the training samples),
                ``"argmax"`` or ``"gumbel"`` (fresh noise: the release's behaviour).
            gaussians_per_pixel: at most this many Gaussians per pixel on average (deterministic
                routings only).
            max_gaussians: keep at most this many per scene (the most opaque).
            frame: ``"scene"`` (predicted view 0 = identity, largest camera distance 1) or
                ``"release"`` (the release's world frame).

        Returns:
            ``ModelOutput`` with padded ``gaussians`` (``mask`` where scenes differ),
            ``extrinsics [B, V, 4, 4]`` (camera-to-world, predicted), ``intrinsics [B, V, 3, 3]``
            (normalised), ``routing_map [B, V, H, W]`` (Gaussians per pixel, 0..M),
            ``expert_usage [M + 1]``, ``gaussians_per_pixel``, ``router_logits
            [B, V, M + 1, H, W]``, ``depth [B, V, H, W]``, ``depth_conf``, ``points
            [B, V, H, W, 3]``, ``pose_encoding [B, V, 9]`` and ``scene_scale [B]`` (distances of the
            release's frame divided by it; 1 with ``frame="release"``).
        """
        if routing not in ROUTING_MODES:
            raise ValueError(f"routing must be one of {ROUTING_MODES}, got {routing!r}")
        if frame not in FRAMES:
            raise ValueError(f"frame must be one of {FRAMES}, got {frame!r}")
        b, v, h, w = check_context(context, require_poses=False)
        p = self.patch_size
        if h % p or w % p:
            raise ValueError(
                f"context['image'] is {h}x{w}; SplatWeaver needs sides that are multiples of {p}"
            )
        images = context["image"]
        dtype = self.camera_head.embed_pose.weight.dtype
        images = images.to(dtype)
        layers, cameras, geometry = trunk_and_geometry(
            self.aggregator, self.camera_head, self.depth_head, images, self.out_layers, dtype
        )
        features, logits = self._route_features(images, layers)
        noise = frozen_gumbel_noise(logits, v) if routing == "frozen_gumbel" else None
        shift = None
        if gaussians_per_pixel is not None:
            if routing == "gumbel":
                raise ValueError(
                    "gaussians_per_pixel needs deterministic routing (frozen_gumbel or argmax)"
                )
            shift = budget_shift(logits.detach(), noise, float(gaussians_per_pixel), b)
            ladder = torch.arange(self.num_experts + 1, device=logits.device, dtype=logits.dtype)
            logits = (
                logits + shift.repeat_interleave(v)[:, None, None, None] * ladder[:, None, None]
            )
        gates, choice = route(logits, routing, noise, self.gumbel_tau)

        # --- experts and neighbour refinement, one scene at a time (kNN within a scene) ---
        encoding, c2w, intrinsics = cameras
        depth, depth_conf, points = geometry
        flat_features = rearrange(features, "(b v) c h w -> b (v h w) c", b=b)
        flat_points = rearrange(points, "b v h w c -> b (v h w) c")
        flat_gates = rearrange(gates, "(b v) e h w -> b (v h w) e", b=b)
        flat_choice = rearrange(choice, "(b v) h w -> b (v h w)", b=b)
        scenes = [
            self._scene_gaussians(flat_choice[i], flat_gates[i], flat_features[i], flat_points[i])
            for i in range(b)
        ]
        gaussians = pad_scenes(scenes)

        # --- frame ---
        scale = torch.ones(b, dtype=dtype, device=images.device)
        if frame == "scene":
            c2w, gaussians, points, scale = to_scene_frame(c2w, gaussians, points)
            depth = depth / scale[:, None, None, None]
        if max_gaussians is not None:
            gaussians = gaussians.prune(max_count=max_gaussians)

        usage = F.one_hot(choice, self.num_experts + 1).to(dtype).mean(dim=(0, 1, 2))
        diagnostics = {
            "routing_map": rearrange(choice, "(b v) h w -> b v h w", b=b),
            "expert_usage": usage,
            "gaussians_per_pixel": (usage * torch.arange(len(usage), device=usage.device)).sum(),
            "router_logits": rearrange(logits, "(b v) e h w -> b v e h w", b=b),
            "depth_conf": depth_conf,
            "points": points,
            "pose_encoding": encoding,
            "scene_scale": scale,
        }
        if shift is not None:
            diagnostics["budget_shift"] = shift
        return ModelOutput(
            gaussians, depth=depth, extrinsics=c2w, intrinsics=intrinsics, diagnostics=diagnostics
        )

    def _route_features(self, images: Tensor, layers: list[Tensor]) -> tuple[Tensor, Tensor]:
        """Per-pixel features ``[BV, C, H, W]`` (DPT maps, image encoder, UV embedding) and the
        router's logits ``[BV, M + 1, H, W]`` (wavelet-guided)."""
        b, v, _, h, w = images.shape
        p = self.patch_size
        flat_images = images.reshape(b * v, 3, h, w)
        maps = self.feature_head.token_maps(
            layers, (h // p, w // p), self.aggregator.patch_start_idx
        )
        fused = self.feature_head.fuse_maps(maps)  # [BV, C, 8h, 8w]
        fused = F.interpolate(fused, size=(h, w), mode="bilinear", align_corners=True)
        fused = add_uv_embedding(fused + self.image_encoder(flat_images))
        features = self.feature_conv(fused)  # [BV, C, H, W]
        logits = self.router(features + fused * self.prior(flat_images))  # [BV, M + 1, H, W]
        return features, logits


# ----------------------------------------------------------------------------- official weights
# Per-Gaussian raw layout: the release's [xyz 3, density 1, scale 3, rotation xyzw 4, SH] and ours
# (GaussianHead) [xyz 3, scale 3, rotation wxyz 4, opacity 1, SH]: ours[j] = release[_ORDER[j]].
def _raw_order(raw_dim: int) -> list[int]:
    return [0, 1, 2, 4, 5, 6, 10, 7, 8, 9, 3] + list(range(11, raw_dim))


_HEAD_RENAMES = (  # release prefix under encoder.gaussian_param_head. -> ours
    ("scratch.output_conv2.", "feature_conv."),
    ("input_merger.", "image_encoder."),
    ("wave_merger1.", "prior.reduce."),
    ("wave_merger2.", "prior.expand."),
    ("gs_moe.gating.", "router."),
    ("gs_moe.pixel_projector.", "pixel_projector."),
    ("gs_moe.gs_predictor.pt_block.", "refiner."),
    ("gs_moe.gs_predictor.input.", "refiner.input."),
    ("gs_moe.gs_predictor.head.0.", "refiner.head."),
    ("", "feature_head."),  # the DPT part (release_dpt_key names it)
)
# Release keys with no counterpart here, and why.
DROPPED_KEYS = {
    # DINOv2's mask-token embedding: only used for masked-image training, never at inference.
    "encoder.aggregator.patch_embed.mask_token": "DINOv2 mask token (masked training only)",
}


def _map_key(key: str) -> str | None:
    """Our parameter name of a release key (``None``: not a key of this release)."""
    ours = _map_prefix(key)
    if ours is None:
        return None
    head, _, rest = ours.partition(".")
    if head in ("depth_head", "feature_head"):  # the DPTs: DPTHead's names
        rest = release_dpt_key(rest)
        return None if rest is None else f"{head}.{rest}"
    return ours


def _map_prefix(key: str) -> str | None:
    if not key.startswith("encoder."):
        return None
    key = key[len("encoder.") :]
    for part in ("aggregator.", "camera_head.", "depth_head."):
        if key.startswith(part):
            return key
    prefix = "gaussian_param_head."
    if not key.startswith(prefix):
        return None
    key = key[len(prefix) :]
    if key.startswith("gs_moe.experts."):
        index, rest = key[len("gs_moe.experts.") :].split(".", 1)
        return f"experts.{int(index) - 1}.proj.{rest}"
    for old, new in _HEAD_RENAMES:
        if key.startswith(old):
            return new + key[len(old) :]
    return None  # pragma: no cover - the last rename matches everything


def checkpoint_filter_fn(checkpoint: dict, model: nn.Module) -> dict[str, Tensor]:
    """Map the release's ``model.safetensors`` (or a ``torch.load``-ed dict holding it under
    ``state_dict``/``model``) onto ``SplatWeaverRelease``.

    Keys lose ``encoder.``; the Gaussian head's parts are renamed (``_HEAD_RENAMES``); the experts'
    last layers and the refiner's input/output layers are permuted from the release's per-Gaussian
    layout to ``GaussianHead``'s (rotation xyzw -> wxyz, opacity after it). Tensors keep their
    stored dtype (bfloat16 for the aggregator): ``load_state_dict`` casts while it copies, so no
    float32 copy of the file is held beside the model (cast first for ``assign=True``).
    ``DROPPED_KEYS`` are consumed and dropped.

    Raises:
        ValueError: one line, when the file is not this release's format or does not match the
            model's configuration (unknown or missing keys, shapes).
    """
    state = checkpoint
    for wrapper in ("state_dict", "model"):
        if isinstance(state, dict) and isinstance(state.get(wrapper), dict):
            state = state[wrapper]
    if not isinstance(state, dict) or not all(isinstance(v, Tensor) for v in state.values()):
        raise ValueError("not a SplatWeaver release checkpoint: expected a dict of tensors")
    if "encoder.aggregator.camera_token" not in state:
        raise ValueError(
            "not a SplatWeaver release checkpoint: no 'encoder.aggregator.camera_token' "
            f"(found {len(state)} keys, e.g. {sorted(state)[:3]})"
        )
    targets = model.state_dict()
    out: dict[str, Tensor] = {}
    unknown = []
    for key, value in state.items():
        if key in DROPPED_KEYS:
            continue
        name = _map_key(key)
        if name is None or name not in targets:
            unknown.append(key)
            continue
        out[name] = value
    if unknown:
        raise ValueError(
            f"{len(unknown)} key(s) this SplatWeaver configuration does not have, e.g. "
            f"{', '.join(unknown[:4])} (a different architecture size?)"
        )
    # per-Gaussian layout: experts' output rows, refiner input columns and output rows
    raw_dim = model.refiner.out_dim + 3
    order = torch.tensor(_raw_order(raw_dim))
    for k in range(1, model.num_experts + 1):
        rows = torch.cat([order + j * raw_dim for j in range(k)])
        for suffix in ("weight", "bias"):
            name = f"experts.{k - 1}.proj.2.{suffix}"
            if name in out and out[name].shape[0] == rows.numel():
                out[name] = out[name][rows]
    name = "refiner.input.weight"
    if name in out and out[name].shape[1] >= raw_dim:
        columns = torch.cat([order, torch.arange(raw_dim, out[name].shape[1])])
        out[name] = out[name][:, columns]
    head_rows = order[3:] - 3
    for suffix in ("weight", "bias"):
        name = f"refiner.head.{suffix}"
        if name in out and out[name].shape[0] == head_rows.numel():
            out[name] = out[name][head_rows]
    missing = sorted(set(targets) - set(out))
    if missing:
        raise ValueError(
            f"the checkpoint lacks {len(missing)} weight(s) of this model, e.g. "
            f"{', '.join(missing[:4])}"
        )
    for name, value in out.items():
        target = targets[name]
        if tuple(value.shape) != tuple(target.shape):
            raise ValueError(
                f"{name}: shape {tuple(value.shape)} in the checkpoint, "
                f"{tuple(target.shape)} in the model (a different architecture size?)"
            )
    return out


# Inference knobs (models.weights.knobs): the family's per-pixel budget and max_gaussians. The trunk, the
# per-pixel features and the router's logits do not depend on them (the budget shifts the logits).
INFERENCE_KNOBS = _FAMILY_KNOBS
KNOB_FREE_MODULES = (
    "aggregator",
    "camera_head",
    "depth_head",
    "image_encoder",
    "prior",
    "feature_conv",
    "router",
)

# ----------------------------------------------------------------------------- registry
_TINY = dict(
    embed_dim=32,
    depth=4,
    num_heads=2,
    encoder_depth=2,
    encoder_heads=2,
    pos_grid=4,
    image_size=56,
    out_layers=[0, 1, 2, 3],
    camera_depth=1,
    camera_heads=2,
    depth_features=32,
    depth_channels=[16, 32, 32, 32],
    gaussian_features=256,
    gaussian_channels=[16, 32, 32, 32],
)


@register_model
def splatweaver_vggt(**kwargs) -> SplatWeaverRelease:
    """SplatWeaver as released (1.19 B parameters: VGGT-1B trunk, 0..3 Gaussians per pixel)."""
    return SplatWeaverRelease(**kwargs)


@register_model
def splatweaver_vggt_tiny(**kwargs) -> SplatWeaverRelease:
    """The released architecture at a tiny width and depth (tests; the parity fixtures' size).
    Its Gaussian-feature DPT keeps the released 256 features (the release hard-codes the 128
    full-resolution channels)."""
    return SplatWeaverRelease(**{**_TINY, **kwargs})


register_pretrained_cfgs(
    {
        "splatweaver_vggt.official_448": PretrainedCfg(
            hf_hub_id="Jeasco/SplatWeaver",
            hf_hub_filename="model.safetensors",
            file_format="official",
            license=(
                "Apache-2.0 (the repository's LICENSE; the Hub file states no other). The trunk "
                "starts from VGGT-1B (facebook/VGGT-1B: its own licence) and DINOv2 (Apache-2.0)"
            ),
            source=(
                "Wan, Li, Shao, Zuo: SplatWeaver: Learning to Allocate Gaussian Primitives for "
                "Generalizable Novel View Synthesis, arXiv 2605.07287; "
                "github.com/yecongwan/SplatWeaver (6a157ce)"
            ),
            train_data=(
                "not stated for the released file; the repository's training command "
                "(+experiment=multi-dataset) mixes DL3DV, CO3D, ScanNet++ and in-the-wild video "
                "at 224x448"
            ),
            input_size=(448, 448),
            views=None,
            pose_free=True,
            recipe=InputRecipe(
                image_size=(448, 448),
                multiple=14,
                resize="resize_crop",
                views=2,
                max_views=16,
                near=0.1,
                far=100.0,
                pose_scale="pose_free",
                source=(
                    "yecongwan/SplatWeaver demo.py and src/utils/image.py process_image (448x448 "
                    "centre crop, 16 views in its example) and config/experiment/"
                    "multi-dataset.yaml (training at input_image_shape [224, 448]) @ 6a157ce"
                ),
                notes=(
                    "pose-free: input poses only place the output; the configs set no near/far "
                    "(the model predicts depth), 0.1/100 bound the port's rendering only"
                ),
            ),
            metrics={},
            metrics_source=(
                "authors' paper/README, not verified here (the README shows a figure only, "
                "figures/performance.png; no numbers to record)"
            ),
            notes=(
                "The demo centre-crops to 448x448 and feeds any number of views (16 in its "
                "example). Aggregator weights are bfloat16 in the file (1,210 tensors), heads "
                "float32; 1.19 B parameters. The release samples its router with Gumbel noise at "
                "inference; this port defaults to frozen-Gumbel routing (deterministic). Its kNN "
                "is an approximate faiss GPU search; this port's is exact."
            ),
        ),
    }
)
