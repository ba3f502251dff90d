"""ZipSplat: the token-clustered, pose-free family with an inference-time Gaussian budget.

The pipeline (ZipSplat, arXiv 2606.05102, at our scales):

1. **Backbone.** The shared ``MultiViewTransformer`` (alternating per-frame / global attention, a
   reference-view embedding on view 0) sees only the images: no camera tokens. Its last
   ``2 * num_feature_layers`` blocks are read in consecutive (frame, global) pairs; each pair is
   concatenated, ``[frame ‖ global]``, and projected back to the refinement width, giving
   ``num_feature_layers`` feature layers of ``V * h * w`` tokens per scene.
   *Camera prior (optional):* with ``use_camera_prior`` and cameras in the context, the Plücker
   rays of the (view-0-relative, unit-baseline) cameras are patchified and added to the patch
   tokens before the first block, for the scenes a ``camera_prior`` mask selects (training draws
   it for some of the scenes, see ``models.training.recipes.ZipSplatTrainingRecipe``). It is off by
   default, so at test time the model is pose-free and ignores ``extrinsics``.
2. **Token clustering.** k-means (``models.layers.kmeans``: no gradient, uniform-stride initialisation,
   ``kmeans_iterations`` Lloyd iterations, chunked distances) on the deepest block's tokens of all
   views together, ``K = round(r * V * h * w)`` clusters; each centroid is snapped to a distinct
   real token, whose index selects the scene tokens. ``r = 1`` skips clustering (every token is a
   scene token). The same input always gives the same selection.
3. **Refinement per feature layer.** Cross-attention from the selected tokens of that layer to all
   tokens of that layer, then self-attention among the scene tokens and an MLP, each branch scaled
   by a LayerScale with a small initial value. The layers' refined scene tokens are concatenated
   and projected. *Colour skip:* a patch embedding of the raw images (plus a fixed 2D sin-cos
   position and a reference/other-view embedding) is cross-attended at the same indices and
   concatenated to the scene tokens.
4. **Head.** The shared ``GaussianHead`` with a ``FreeMeanPlacement`` decodes each scene token into
   ``gaussians_per_token`` (``G``) Gaussians with unconstrained means ``sign(y) * expm1(|y|)``
   (clamped) in the frame of context view 0; the DC colour starts at the token's patch colour.
   Exactly ``K * G`` Gaussians come out. Additions of ours (not in the paper): the head also sees
   ``log`` of the cluster size, and a cluster's Gaussian scales are multiplied by the square root
   of its size (a cluster of ``m`` patches has ``m`` patches' area to cover; at ``r = 1`` the
   factor is 1); and, with ``ray_anchor_depth`` set, the free means are offsets from a fixed point
   on the token's patch-centre ray at that depth (each view's ray taken in its own camera as if it
   sat at view 0, NoPoSplat's starting point), with the G offsets initialised to a sunflower
   pattern covering the patch. That is an initialisation choice for short CPU-budget training (the
   first renders cover the image instead of stacking every Gaussian at the origin); the offsets
   are as unconstrained as the paper's means. ``ray_anchor_depth=None`` gives the paper's plain
   free means. With ``gaussian_sites`` each of the G Gaussians gets its own site in the patch
   (the sunflower pattern, in pixels): it starts on the site's own ray, and its DC colour starts
   at the image colour there (3x3 box-filtered) instead of the patch mean, so the head predicts
   residuals of a sub-sampled image rather than G colours from one averaged patch.

Scene frame and scale: a pose-free model cannot know the metric scale or the other cameras. The
data convention (``docs/design.md``) fixes both: every batch is expressed in the frame of context view 0
(identity) with the largest context baseline scaled to 1, so Gaussians predicted in view 0's frame
line up with the ground-truth target cameras up to what the network gets wrong about that scale
(learned from the training distribution, where the baseline is always 1). The remaining error is
what test-time target-pose fit (``models.pipeline.pose_fit``) absorbs at evaluation.

Losses: L1 and LPIPS are the LightningModule's (``configs/model/zipsplat.yaml``), as is the depth
term: with ``depth_weight > 0`` it compares the rendered target depth with the ground truth (free,
the targets are rendered anyway). The model adds a Chamfer term between the Gaussian means and the
points of the context views' ground-truth depth maps, ``losses["chamfer"]`` (unweighted; the
training recipe weighs it and asks for it with ``chamfer_points``), when the context holds
``depth`` and ``extrinsics`` and gradients are on.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from einops import rearrange, repeat
from timm.layers import build_sincos2d_pos_embed, trunc_normal_
from torch import Tensor, nn

from models.core.base import ModelOutput, SplatModel, check_context
from models.geometry.cameras import (
    camera_directions,
    normalize_scene,
    pixel_grid,
    plucker_embedding,
    unproject,
)
from models.layers.backbones import VIT_SIZES, MultiViewTransformer
from models.layers.cross_attention import CrossAttentionBlock
from models.layers.heads import FreeMeanPlacement, GaussianHead
from models.layers.kmeans import cluster_count, kmeans_select
from models.weights.knobs import MAX_GAUSSIANS, Knob
from models.weights.pretrained_cfg import synthetic64_cfg
from models.weights.registry import register_model, register_pretrained_cfgs

__all__ = [
    "ZipSplat",
    "chamfer_distance",
    "compression_schedule",
    "zipsplat_tiny",
    "zipsplat_small",
    "zipsplat_base",
    "zipsplat_large",
]


def gather_tokens(tokens: Tensor, index: Tensor) -> Tensor:
    """Select tokens ``index [B, K]`` from ``tokens [B, N, C]``; returns ``[B, K, C]``."""
    return torch.gather(tokens, 1, index[..., None].expand(-1, -1, tokens.shape[-1]))


def chamfer_distance(points: Tensor, reference: Tensor, chunk_size: int = 2048) -> Tensor:
    """Symmetric Chamfer distance (mean Euclidean nearest-neighbour distance, both directions).

    Nearest neighbours are found without gradient (chunked ``cdist``); the distances of the
    matched pairs are then recomputed differentiably, so the backward pass costs ``O(M + P)``
    instead of the dense ``O(M * P)``.

    Args:
        points: ``[B, M, 3]`` (e.g. Gaussian means).
        reference: ``[B, P, 3]`` (e.g. ground-truth surface points).
        chunk_size: rows of ``points`` per distance block.

    Returns:
        ``[B]``: ``mean_m min_p |x_m - y_p| + mean_p min_m |x_m - y_p|``.
    """
    with torch.no_grad():
        to_reference, to_points, to_points_dist = [], [], []
        for start in range(0, points.shape[1], chunk_size):
            d = torch.cdist(points[:, start : start + chunk_size].detach(), reference.detach())
            to_reference.append(d.argmin(dim=2))  # [B, m]
            value, index = d.min(dim=1)  # [B, P]
            to_points.append(index + start)
            to_points_dist.append(value)
        nearest_reference = torch.cat(to_reference, dim=1)  # [B, M]
        best = torch.stack(to_points_dist).argmin(dim=0, keepdim=True)  # [1, B, P]
        nearest_point = torch.stack(to_points).gather(0, best)[0]  # [B, P]

    def pick(x: Tensor, index: Tensor) -> Tensor:
        return torch.gather(x, 1, index[..., None].expand(-1, -1, 3))

    forward = (points - pick(reference, nearest_reference)).norm(dim=-1).mean(dim=1)
    backward = (pick(points, nearest_point) - reference).norm(dim=-1).mean(dim=1)
    return forward + backward


def compression_schedule(
    step: int, max_steps: int, r_min_final: float, anneal_fraction: float, views: int
) -> float:
    """Lower bound ``r_min`` of the sampled compression ratio at ``step``.

    ``r_min`` falls linearly from 1 to ``r_min_final * (2 / views) ** 0.5`` over the first
    ``anneal_fraction`` of training and stays there (more views have more tokens, so they can be
    compressed further for the same scene-token count).
    """
    final = min(1.0, r_min_final * (2.0 / max(views, 1)) ** 0.5)
    span = max(anneal_fraction * max(max_steps, 1), 1.0)
    t = min(max(step / span, 0.0), 1.0)
    return 1.0 - t * (1.0 - final)


def _feature_blocks(vit_size: str, num_feature_layers: int) -> tuple[int, int]:
    """The first block whose output is a feature layer, and the backbone's depth."""
    if vit_size not in VIT_SIZES:
        raise ValueError(f"vit_size must be one of {sorted(VIT_SIZES)}, got {vit_size!r}")
    depth = VIT_SIZES[vit_size]["depth"]
    return max(0, depth - 2 * num_feature_layers), depth


def sunflower_sites(count: int, patch_size: int) -> Tensor:
    """``[G, 2]`` sunflower sites in pixels around a patch centre (x, y)."""
    i = torch.arange(count, dtype=torch.float32)
    radius = 0.5 * patch_size * torch.sqrt((i + 0.5) / count)
    angle = i * math.pi * (3.0 - math.sqrt(5.0))
    return torch.stack([radius * torch.cos(angle), radius * torch.sin(angle)], dim=-1)


class ZipSplat(SplatModel):
    """Token-clustered, pose-free Gaussian predictor with a compression ratio knob.

    Args:
        vit_size: ViT size of the backbone, ``"tiny"``, ``"small"``, ``"base"`` or ``"large"``.
        image_size: training resolution of the backbone's position embedding (other sizes work).
        patch_size: ``None`` for the size's default (8 tiny, 14 DINOv2 sizes).
        global_layers: backbone blocks with all-view attention (``None``: every odd block).
        num_feature_layers: feature layers, each a (frame, global) pair of consecutive blocks
            from the end of the backbone.
        pretrained_backbone: ``False``, ``True`` (timm DINOv2 weights of ``vit_size``), a timm name
            or a local weight file; see ``MultiViewTransformer``.
        drop_path_rate: backbone stochastic depth.
        dim: refinement width (``None``: the backbone width).
        num_heads: refinement heads (``None``: the backbone's).
        mlp_ratio: refinement MLP width over ``dim``.
        layerscale_init: initial LayerScale value of the refinement branches.
        color_dim: width of the colour skip (patch embedding of the raw images).
        gaussians_per_token: Gaussians ``G`` decoded from each scene token.
        sh_degree: SH degree of the colours.
        head_hidden_dim: hidden width of the head MLP (``None``: ``dim``).
        scale_factor: the scale is ``softplus(x - 4) * scale_factor`` (scene units) times the
            square root of the cluster size; 8 starts at ~0.15, about a seventh of the width of
            an 8-pixel patch at depth 6 in the synthetic data.
        max_scale: cap of the scale before the cluster-size factor.
        free_mean_max: clamp of the free mean offsets.
        opacity_bias: initial opacity logit.
        ray_anchor_depth: depth of the fixed ray anchor the free means start from (scene units,
            where the context baseline is 1; the synthetic rooms' median depth is ~6); ``None``
            for plain free means (see the module docstring).
        gaussian_sites: give each of a token's G Gaussians its own site in the token's patch (a
            sunflower pattern in pixels): its free mean starts on the site's ray at
            ``ray_anchor_depth`` and its DC colour at the (3x3 box-filtered) image colour there,
            instead of all G starting from the patch centre's ray and the patch's mean colour.
            Ours (see the module docstring); needs ``ray_anchor_depth``.
        default_focal: normalised focal length assumed when the context has no intrinsics.
        compression: default cluster ratio ``r`` in ``(0, 1]`` (a forward keyword overrides it).
        kmeans_iterations: Lloyd iterations.
        kmeans_chunk_size: tokens per k-means distance block.
        use_camera_prior: build the camera-prior embedding (used only when a forward call asks
            for it and the context has cameras).
    """

    family = "zipsplat"
    pose_free = True
    min_views = 1

    def __init__(
        self,
        *,
        vit_size: str = "tiny",
        image_size: int = 64,
        patch_size: int | None = None,
        global_layers: list[int] | None = None,
        num_feature_layers: int = 3,
        pretrained_backbone: bool | str = False,
        drop_path_rate: float = 0.0,
        dim: int | None = None,
        num_heads: int | None = None,
        mlp_ratio: float = 2.0,
        layerscale_init: float = 0.05,
        color_dim: int = 32,
        gaussians_per_token: int = 10,
        sh_degree: int = 1,
        head_hidden_dim: int | None = None,
        scale_factor: float = 8.0,
        max_scale: float = 1.0,
        free_mean_max: float = 100.0,
        opacity_bias: float = 0.0,
        ray_anchor_depth: float | None = 6.0,
        gaussian_sites: bool = False,
        default_focal: float = 1.0,
        compression: float = 1.0,
        kmeans_iterations: int = 5,
        kmeans_chunk_size: int = 4096,
        use_camera_prior: bool = True,
    ) -> None:
        super().__init__()
        cluster_count(1, compression)  # validates the ratio
        if num_feature_layers < 1:
            raise ValueError(f"num_feature_layers must be >= 1, got {num_feature_layers}")
        self.vit_size = vit_size
        self.compression = compression
        self.kmeans_iterations = kmeans_iterations
        self.kmeans_chunk_size = kmeans_chunk_size
        self.default_focal = default_focal
        self.ray_anchor_depth = ray_anchor_depth
        if gaussian_sites and ray_anchor_depth is None:
            raise ValueError("gaussian_sites=True needs a ray_anchor_depth (the sites' rays)")
        self.gaussian_sites = gaussian_sites
        self.use_camera_prior = use_camera_prior
        self.gaussians_per_token = gaussians_per_token

        first, depth = _feature_blocks(vit_size, num_feature_layers)
        # Feature layers: consecutive (frame, global) block pairs, as slices of the outputs.
        self.layer_slices: list[tuple[int, int]] = [
            (i, min(i + 2, depth - first)) for i in range(0, depth - first, 2)
        ]
        self.backbone = MultiViewTransformer(
            vit_size,
            image_size=image_size,
            patch_size=patch_size,
            global_layers=global_layers,
            use_camera_tokens=False,
            out_layers=list(range(first, depth)),
            pretrained_backbone=pretrained_backbone,
            drop_path_rate=drop_path_rate,
        )
        groups = self.layer_slices
        width = self.backbone.embed_dim
        self.patch_size = self.backbone.patch_size
        self.img_width = self.backbone.image_size[1]
        dim = dim or width
        num_heads = num_heads or self.backbone.num_heads
        self.dim = dim

        self.layer_proj = nn.ModuleList(nn.Linear((j - i) * width, dim) for i, j in groups)
        self.refine = nn.ModuleList(
            CrossAttentionBlock(dim, num_heads, mlp_ratio, layerscale_init) for _ in groups
        )
        self.fuse = nn.Sequential(
            nn.LayerNorm(len(groups) * dim), nn.Linear(len(groups) * dim, dim)
        )

        self._build_color_skip(color_dim, mlp_ratio, layerscale_init)
        p = self.patch_size

        # Camera prior: patchified Plücker rays added to the patch tokens.
        prior = nn.Conv2d(6, width, kernel_size=p, stride=p) if use_camera_prior else None
        self.camera_prior_embed = prior

        self.head_norm = nn.LayerNorm(dim + color_dim)
        self.gaussian_head = GaussianHead(
            dim + color_dim + 1,
            FreeMeanPlacement(free_mean_max),
            gaussians_per_location=gaussians_per_token,
            sh_degree=sh_degree,
            hidden_dim=head_hidden_dim or dim,
            scale_factor=scale_factor,
            max_scale=max_scale,
            dc_from_color=True,
            opacity_bias=opacity_bias,
        )
        sites = sunflower_sites(gaussians_per_token, self.patch_size)  # [G, 2]
        self.register_buffer("site_offsets", sites, persistent=False)
        self._init_weights()

    def _build_color_skip(self, color_dim: int, mlp_ratio: float, layerscale_init: float) -> None:
        """The colour skip: patchified colours, a reference/other-view embedding and a
        cross-attention over the views."""
        p = self.patch_size
        self.color_embed = nn.Conv2d(3, color_dim, kernel_size=p, stride=p)
        self.color_view_embed = nn.Parameter(torch.zeros(2, color_dim))  # reference, other views
        self.color_refine = CrossAttentionBlock(
            color_dim, max(1, color_dim // 32), mlp_ratio, layerscale_init, self_attention=False
        )

    def _init_weights(self) -> None:
        trunc_normal_(self.color_view_embed, std=0.02)
        if self.camera_prior_embed is not None:
            # Small but non-zero: the prior starts as a gentle nudge of the patch tokens.
            trunc_normal_(self.camera_prior_embed.weight, std=0.02)
            nn.init.zeros_(self.camera_prior_embed.bias)
        if self.ray_anchor_depth is not None and not self.gaussian_sites:
            # Spread each token's G Gaussians over its patch (a sunflower pattern in the image
            # plane at the anchor depth, assuming the default focal length) instead of stacking
            # them on the patch centre, so the first renders cover the image.
            g = self.gaussians_per_token
            to_plane = self.ray_anchor_depth / (self.default_focal * self.img_width)
            offset = self.site_offsets * to_plane  # [G, 2] pixels -> the anchor depth's plane
            raw = torch.sign(offset) * torch.log1p(offset.abs())  # inverse of the free mean map
            last = self.gaussian_head.proj
            last = last[-1] if isinstance(last, nn.Sequential) else last
            with torch.no_grad():
                last.bias.view(g, -1)[:, :2] = raw

    # ------------------------------------------------------------------ pieces
    def _intrinsics(self, context: dict[str, Tensor], b: int, v: int, like: Tensor) -> Tensor:
        intrinsics = context.get("intrinsics")
        if intrinsics is None:
            f = self.default_focal
            intrinsics = torch.tensor(
                [[f, 0.0, 0.5], [0.0, f, 0.5], [0.0, 0.0, 1.0]],
                dtype=like.dtype,
                device=like.device,
            ).expand(b, v, 3, 3)
        return intrinsics.to(like.dtype)

    def _prior_mask(self, context: dict[str, Tensor], camera_prior: bool | float | Tensor, b: int):
        """``[B]`` float mask of the scenes given the camera prior, or ``None`` for none."""
        if self.camera_prior_embed is None or context.get("extrinsics") is None:
            return None
        device = context["image"].device
        if isinstance(camera_prior, Tensor):
            mask = camera_prior.to(device=device, dtype=torch.bool).reshape(-1).expand(b)
        elif isinstance(camera_prior, bool):
            if not camera_prior:
                return None
            mask = torch.ones(b, dtype=torch.bool, device=device)
        else:
            probability = float(camera_prior)
            if probability <= 0.0:
                return None
            mask = torch.rand(b, device=device) < probability
        if not bool(mask.any()):
            return None
        return mask

    def _camera_prior_tokens(
        self, context: dict[str, Tensor], intrinsics: Tensor, mask: Tensor, size: tuple[int, int]
    ) -> Tensor:
        """Patchified Plücker rays ``[B*V, h*w, C]`` of the view-0-relative cameras, zero for the
        scenes outside ``mask``."""
        extrinsics = normalize_scene(context["extrinsics"].to(intrinsics.dtype))[0]
        rays = plucker_embedding(extrinsics, intrinsics, size)  # [B, V, 6, H', W']
        tokens = self.camera_prior_embed(rays.flatten(0, 1))  # [BV, C, h, w]
        tokens = rearrange(tokens, "n c h w -> n (h w) c")
        keep = repeat(mask.to(tokens.dtype), "b -> (b v) 1 1", v=extrinsics.shape[1])
        return tokens * keep

    @contextmanager
    def _patch_token_offset(self, offset: Tensor | None) -> Iterator[None]:
        """Add ``offset [B*V, h*w, C]`` to the backbone's patch tokens inside the block (a forward
        hook on ``backbone.patch_embed``, so the backbone's weights and names stay untouched)."""
        if offset is None:
            yield
            return
        handle = self.backbone.patch_embed.register_forward_hook(
            lambda module, args, output: output + offset.to(output.dtype)
        )
        try:
            yield
        finally:
            handle.remove()

    def _color_tokens(self, images: Tensor) -> Tensor:
        """Colour skip tokens ``[B, V*h*w, C_color]`` of images ``[B, V, 3, H', W']``."""
        b, v = images.shape[:2]
        tokens = self.color_embed(images.flatten(0, 1))  # [BV, C, h, w]
        h, w = tokens.shape[-2:]
        position = build_sincos2d_pos_embed(
            [h, w], tokens.shape[1], device=tokens.device, dtype=tokens.dtype
        )  # [h*w, C]
        tokens = rearrange(tokens, "(b v) c h w -> b v (h w) c", b=b) + position
        view = torch.zeros(v, dtype=torch.long, device=images.device)
        view[1:] = 1
        tokens = tokens + self.color_view_embed[view][None, :, None, :]
        return rearrange(tokens, "b v n c -> b (v n) c")

    def _ray_anchors(self, intrinsics: Tensor, coords: Tensor) -> Tensor:
        """``[B, V*n, 3]`` points at ``ray_anchor_depth`` on the rays through normalised image
        points ``coords [n, 2]`` of every view, each in its own camera placed at the origin."""
        b, v = intrinsics.shape[:2]
        rays = camera_directions(coords[None, None].expand(b, v, -1, -1), intrinsics)
        return rearrange(rays * self.ray_anchor_depth, "b v n c -> b (v n) c")  # z = depth

    def _site_coords(self, grid: tuple[int, int], like: Tensor) -> Tensor:
        """``[h*w, G, 2]`` normalised image coordinates of every patch's Gaussian sites."""
        h, w = grid
        p = self.patch_size
        centres = pixel_grid(grid, like.device, like.dtype).reshape(-1, 1, 2)  # [h*w, 1, 2]
        size = torch.tensor([w * p, h * p], dtype=like.dtype, device=like.device)
        return centres + self.site_offsets.to(like.dtype) / size  # [h*w, G, 2]

    def _site_colors(self, images: Tensor, sites: Tensor) -> Tensor:
        """``[B, V*h*w, G, 3]`` box-filtered colours of ``images [B, V, 3, H, W]`` at ``sites``."""
        b = images.shape[0]
        smooth = F.avg_pool2d(
            images.flatten(0, 1), 3, stride=1, padding=1, count_include_pad=False
        )  # [BV, 3, H, W]
        grid = (sites * 2.0 - 1.0)[None].expand(smooth.shape[0], -1, -1, -1)  # [BV, n, G, 2]
        color = F.grid_sample(smooth, grid, mode="bilinear", align_corners=False)  # [BV,3,n,G]
        return rearrange(color, "(b v) c n g -> b (v n) g c", b=b).clamp(0.0, 1.0)

    def _chamfer(
        self, context: dict[str, Tensor], means: Tensor, intrinsics: Tensor, max_points: int
    ) -> Tensor:
        """Chamfer loss between ``means [B, M, 3]`` and points of the context GT depth."""
        depth = context["depth"].to(means.dtype)  # [B, V, H, W]
        b, v, h, w = depth.shape
        coords = pixel_grid((h, w), means.device, means.dtype).reshape(1, 1, h * w, 2)
        points = unproject(
            coords.expand(b, v, -1, -1),
            depth.reshape(b, v, h * w),
            intrinsics,
            context["extrinsics"].to(means.dtype),
        ).reshape(b, v * h * w, 3)
        valid = (depth.reshape(b, -1) > 0) & torch.isfinite(depth.reshape(b, -1))
        losses = []
        for i in range(b):
            scene_points = points[i][valid[i]]
            if scene_points.shape[0] == 0:
                continue
            if scene_points.shape[0] > max_points:
                pick = torch.randperm(scene_points.shape[0], device=means.device)
                scene_points = scene_points[pick[:max_points]]
            losses.append(chamfer_distance(means[i : i + 1], scene_points[None])[0])
        if not losses:
            return means.new_zeros(())
        return torch.stack(losses).mean()

    # ------------------------------------------------------------------ forward
    def _cluster(self, tokens: Tensor, k: int) -> tuple[Tensor, Tensor]:
        """k-means on the deepest block's tokens ``[B, N, C]``: the scene tokens' indices
        ``[B, K]`` and cluster sizes ``[B, K]`` (all tokens, size 1, when ``K = N``)."""
        b, n = tokens.shape[:2]
        if k == n:
            index = torch.arange(n, device=tokens.device).expand(b, n)
            return index, torch.ones(b, n, dtype=tokens.dtype, device=tokens.device)
        index, assignment = kmeans_select(
            tokens, k, self.kmeans_iterations, self.kmeans_chunk_size, return_assignment=True
        )
        cluster_size = torch.zeros(b, k, dtype=tokens.dtype, device=tokens.device)
        cluster_size.scatter_add_(1, assignment, torch.ones_like(assignment, dtype=tokens.dtype))
        return index, cluster_size.clamp_min(1.0)

    def _scene_tokens(self, layers: list[Tensor], index: Tensor) -> Tensor:
        """Per feature layer, the scene tokens attend to all tokens; fused to ``[B, K, dim]``."""
        refined = []
        for (i, j), proj, block in zip(self.layer_slices, self.layer_proj, self.refine):
            tokens = proj(torch.cat(layers[i:j], dim=-1))  # [B, N, dim]: [frame ‖ global]
            refined.append(block(gather_tokens(tokens, index), tokens))  # [B, K, dim]
        return self.fuse(torch.cat(refined, dim=-1))

    def _colors_and_anchors(
        self, images: Tensor, intrinsics: Tensor, grid: tuple[int, int], index: Tensor
    ) -> tuple[Tensor, Tensor | None]:
        """Colours of the scene tokens' Gaussians (per site ``[B, K, G, 3]`` or per patch
        ``[B, K, 3]``) and their ray anchors ``[B, K*G, 3]`` (``None`` without anchors)."""
        b = images.shape[0]
        g = self.gaussians_per_token
        if self.gaussian_sites:
            sites = self._site_coords(grid, images)  # [h*w, G, 2]
            site_color = self._site_colors(images, sites)  # [B, N, G, 3]
            color = gather_tokens(site_color.flatten(2), index).unflatten(2, (g, 3))
            anchors = self._ray_anchors(intrinsics, sites.reshape(-1, 2))  # [B, N*G, 3]
            anchors = rearrange(anchors, "b (n g) c -> b n (g c)", g=g)
            return color, gather_tokens(anchors, index).reshape(b, -1, 3)  # [B, K*G, 3]
        patch_color = F.avg_pool2d(images.flatten(0, 1), self.patch_size)  # [BV, 3, h, w]
        patch_color = rearrange(patch_color, "(b v) c h w -> b (v h w) c", b=b)
        color = gather_tokens(patch_color, index).clamp(0.0, 1.0)  # [B, K, 3]
        if self.ray_anchor_depth is None:
            return color, None
        centres = pixel_grid(grid, images.device, images.dtype).reshape(-1, 2)
        anchors = gather_tokens(self._ray_anchors(intrinsics, centres), index)
        return color, repeat(anchors, "b k c -> b (k g) c", g=g)  # on each token's centre ray

    def forward(
        self,
        context: dict[str, Tensor],
        *,
        compression: float | None = None,
        ratio: float | None = None,
        max_gaussians: int | None = None,
        camera_prior: bool | float | Tensor = False,
        chamfer_points: int = 0,
    ) -> ModelOutput:
        """Predict Gaussians in the frame of context view 0.

        Args:
            context: ``image [B, V, 3, H, W]``; optional ``intrinsics`` (ray anchors, camera
                prior), ``extrinsics`` (camera prior and the Chamfer loss only: the prediction
                never uses them otherwise) and ``depth [B, V, H, W]`` (Chamfer loss).
            compression: cluster ratio ``r`` in ``(0, 1]``; ``None``: the configured default.
            ratio: alias of ``compression``.
            max_gaussians: keep at most this many Gaussians per scene (the most opaque).
            camera_prior: give the camera prior to every scene (``True``), none (``False``), each
                with this probability (a float), or per scene (a ``[B]`` bool tensor). Needs
                ``use_camera_prior`` and cameras in the context; ignored otherwise.
            chamfer_points: training only: compute the (unweighted) Chamfer loss with this many
                ground-truth points per scene (0: none; needs ``depth`` and ``extrinsics`` in the
                context and gradients on).

        Returns:
            ``ModelOutput`` with ``K * G`` Gaussians (``K = round(r * V * h * w)``; fewer when
            pruned), diagnostics ``scene_token_index [B, K]`` (into the view-major token list),
            ``cluster_size [B, K]``, ``compression``, ``num_scene_tokens``, ``camera_prior [B]``
            and, in training with GT depth, ``losses["chamfer"]``.
        """
        if compression is not None and ratio is not None and compression != ratio:
            raise ValueError(f"compression={compression} and ratio={ratio} disagree; pass one")
        r = compression if compression is not None else ratio
        r = self.compression if r is None else float(r)
        b, v, h, w = check_context(context, require_poses=False)
        images = context["image"]  # [B, V, 3, H, W]
        intrinsics = self._intrinsics(context, b, v, images)  # [B, V, 3, 3]
        grid = self.backbone.patch_grid(h, w)
        input_size = (grid[0] * self.patch_size, grid[1] * self.patch_size)
        n = v * grid[0] * grid[1]
        k = cluster_count(n, r)

        prior_mask = self._prior_mask(context, camera_prior, b)
        offset = None
        if prior_mask is not None:
            offset = self._camera_prior_tokens(context, intrinsics, prior_mask, input_size)
        with self._patch_token_offset(offset):
            out = self.backbone(images)
        layers = [rearrange(f, "b v n c -> b (v n) c") for f in out.features]  # [B, N, C] each

        index, cluster_size = self._cluster(layers[-1], k)  # [B, K], [B, K]
        scene = self._scene_tokens(layers, index)  # [B, K, dim]

        # Colour skip.
        if input_size != (h, w):
            images_in = F.interpolate(
                images.flatten(0, 1), size=input_size, mode="bilinear", antialias=True
            ).reshape(b, v, 3, *input_size)
        else:
            images_in = images
        color_tokens = self._color_tokens(images_in)  # [B, N, C_color]
        color_scene = self.color_refine(gather_tokens(color_tokens, index), color_tokens)

        features = self.head_norm(torch.cat([scene, color_scene], dim=-1))
        features = torch.cat([features, cluster_size.log()[..., None]], dim=-1)
        color, anchors = self._colors_and_anchors(images_in, intrinsics, grid, index)
        gaussians = self.gaussian_head(features, color=color, scale_reference=cluster_size.sqrt())
        if anchors is not None:
            gaussians = gaussians.replace(means=gaussians.means + anchors)
        if offset is None and self.camera_prior_embed is not None and torch.is_grad_enabled():
            # Keep the unused prior weights in the graph (a zero term): DDP requires every
            # parameter to get a gradient in every step.
            unused = sum(p.sum() for p in self.camera_prior_embed.parameters())
            gaussians = gaussians.replace(means=gaussians.means + 0.0 * unused)

        diagnostics: dict[str, Tensor | float | int] = {
            "scene_token_index": index,
            "cluster_size": cluster_size,
            "compression": r,
            "num_scene_tokens": k,
            "camera_prior": (
                prior_mask
                if prior_mask is not None
                else torch.zeros(b, dtype=torch.bool, device=images.device)
            ),
        }
        losses: dict[str, Tensor] = {}
        if (
            chamfer_points > 0
            and torch.is_grad_enabled()
            and context.get("depth") is not None
            and context.get("extrinsics") is not None
        ):
            losses["chamfer"] = self._chamfer(context, gaussians.means, intrinsics, chamfer_points)
        if max_gaussians is not None:
            gaussians = gaussians.prune(max_count=max_gaussians)
        return ModelOutput(gaussians, losses=losses, diagnostics=diagnostics)


# Inference knobs (models.weights.knobs): the cluster ratio, and every family's max_gaussians. The backbone
# sees only the images (and the camera prior, not a knob), so a re-run with another ratio reuses it.
INFERENCE_KNOBS = (
    Knob(
        "compression",
        "float",
        low=0.0,
        high=1.0,
        step=0.01,
        low_open=True,
        sweep=(1.0, 0.5, 0.25, 0.1),
        default_attr="compression",
        help="cluster ratio r: k-means keeps r of the tokens as scene tokens, each decoding "
        "gaussians_per_token Gaussians (fewer tokens, fewer Gaussians)",
    ),
    MAX_GAUSSIANS,
)
KNOB_FREE_MODULES = ("backbone",)

# ---------------------------------------------------------------------- registry entries
# At r = 1 each scene token decodes G Gaussians for a patch of p^2 pixels: tiny 64 px / 10 = 6.4x
# fewer Gaussians than pixels, the DINOv2 sizes 196 px / 32 = 6.1x (the paper's ratio).
_TINY = dict(
    vit_size="tiny",
    image_size=64,
    num_feature_layers=3,
    color_dim=32,
    gaussians_per_token=10,
    sh_degree=1,
    ray_anchor_depth=6.0,
)
_SMALL = dict(
    vit_size="small",
    image_size=252,
    num_feature_layers=3,
    color_dim=64,
    gaussians_per_token=32,
    sh_degree=1,
)
_BASE = dict(
    vit_size="base",
    image_size=252,
    num_feature_layers=3,
    dim=512,
    num_heads=8,
    color_dim=96,
    gaussians_per_token=32,
    sh_degree=1,
)
_LARGE = dict(
    vit_size="large",
    image_size=252,
    num_feature_layers=3,
    dim=768,
    num_heads=12,
    color_dim=128,
    gaussians_per_token=32,
    sh_degree=1,
)


@register_model
def zipsplat_tiny(**kwargs) -> ZipSplat:
    """ZipSplat with a tiny multi-view ViT (CPU-trainable at 64x64)."""
    return ZipSplat(**{**_TINY, **kwargs})


@register_model
def zipsplat_small(**kwargs) -> ZipSplat:
    """ZipSplat on a ViT-S/14 (DINOv2-compatible) backbone."""
    return ZipSplat(**{**_SMALL, **kwargs})


@register_model
def zipsplat_base(**kwargs) -> ZipSplat:
    """ZipSplat on a ViT-B/14 (DINOv2-compatible) backbone."""
    return ZipSplat(**{**_BASE, **kwargs})


@register_model
def zipsplat_large(**kwargs) -> ZipSplat:
    """ZipSplat on a ViT-L/14 (DINOv2-compatible) backbone."""
    return ZipSplat(**{**_LARGE, **kwargs})


register_pretrained_cfgs(
    synthetic64_cfg(
        "zipsplat_tiny",
        "experiment=synthetic_zipsplat (gaussian_sites=true), 1,925 steps (30 min, one CPU thread); r = 1, no pose fit",
        pose_free=True,
        psnr=18.72,
        ssim=0.521,
    )
)
