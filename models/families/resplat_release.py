"""ReSplat's released models (Xu, Barath, Geiger, Pollefeys; arXiv 2510.08575), re-implemented.

The official code is commit ``cc4594a`` ("resplat release", 2026-03-24); the files are on the
Hub at ``haofeixu/resplat``. Family ``"resplat"`` (as the project's own ``resplat_tiny``): a
compact initial set, then a weight-shared recurrent update driven by the rendering error on the
context views; ``iterations=K`` is the forward knob (0: the initial set) and every iteration's
Gaussians are in ``extras["gaussians_per_iteration"]``.

Initial model (one Gaussian per ``latent_downsample x latent_downsample`` pixels, times
``gaussians_per_latent``):

1. DepthSplat's multi-view depth trunk (``models.layers.backbones.depth_trunk``) with 128 candidates
   uniform in *log* depth between ``near`` and ``far``, the ViT input at most 560 wide, and wider
   transformer windows at high resolution;
2. the four raw ViT maps resized to 1/16 and pixel-shuffled, the CNN stages and the transformer
   features brought to the latent grid, concatenated with the pixel-unshuffled image, the latent
   depth and the match confidence, then a 2-conv regressor;
3. a linear projection and a point transformer over the lifted latent pixels (6 blocks of kNN
   attention, k=16, each followed by a low-resolution global attention over all views);
4. an MLP head: per Gaussian a camera-frame quaternion (xyzw), ``clamp(softplus(s - 4), 1e-6,
   max_scale)`` scales, a sigmoid opacity, a sub-pixel ray offset and degree-3 SH whose DC starts
   at the (area-downsampled) pixel colour; the SH is *not* rotated to the world frame (the
   release's ``no_rotate_sh``).

Recurrent update, for ``i = 0 .. iterations - 1`` (weights shared):

1. render the context views (``models.render``, black background, the release's
   antialiased mode with ``eps2d = 0.1`` when the renderer has it);
2. error = frozen ResNet-18 features (conv1, layer1, layer2, resized to the Gaussian grid) of the
   render minus those of the input, plus a linear projection of the RGB error; a global
   low-resolution attention over all views;
3. ``state += PointTransformer(Linear([mean, scale, raw quaternion, opacity logit, SH | state |
   error]))`` (4 blocks of kNN attention, k=8, around the current means);
4. an MLP maps the state to additive deltas of those raw parameters.

The point transformers and the view attentions are the project's own
(``models.layers.point_transformer`` with ``RELEASE_POINT_OPTIONS``: single-head bias-free kNN
attention over ``attn_proj_dim``-wide projections without position encoding, in the release's
matmul arithmetic, MLP ratio 4, no final norm); ``checkpoint_filter_fn`` renames the release's
keys into that layout and splits each fused kNN ``qkv`` projection into ``q`` and ``kv``. The
kNN is the project's exact one (``models.layers.knn``), any device.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from models.core.base import ModelOutput, SplatModel, check_context
from models.families.resplat_release_weights import (
    DL3DV_LAYOUT,
    official_key_to_ours,
    split_fused_qkv,
)
from models.layers.backbones.depth_trunk import DepthTrunk, depth_trunk_size
from models.layers.point_transformer import PointTransformer, ViewGridAttention
from models.layers.resplat_state import (
    D_SH,
    IMAGENET_MEAN,
    IMAGENET_STD,
    MIN_SCALE,
    RAW_DIM,
    RELEASE_POINT_OPTIONS,
    RESNET_DIM,
    STATE_PARAMS,
    FrozenResNet18,
    PointLinear,
    RawState,
    lift,
    pixel_grid,
    rgb_to_sh,
    view_heads,
)
from models.render import render
from models.weights.builder import check_mapped_state, encoder_state_dict
from models.weights.knobs import MAX_GAUSSIANS, Knob
from models.weights.registry import register_model

__all__ = [
    "ReSplatRelease",
    "checkpoint_filter_fn",
    "resplat_base",
    "resplat_large",
    "resplat_small",
    "resplat_release_tiny",
]

# The screen-space dilation of the release's renders inside the update (its gsplat eps2d).
RELEASE_EPS2D = 0.1


# ----------------------------------------------------------------------------- the model
def _check_arguments(latent_downsample, gaussians_per_latent, lowest_resolution, near, far):
    if (latent_downsample, gaussians_per_latent) not in ((4, 1), (2, 4)):
        raise ValueError(
            "(latent_downsample, gaussians_per_latent) must be (4, 1) (the DL3DV files) or "
            f"(2, 4) (the RE10K file), got ({latent_downsample}, {gaussians_per_latent})"
        )
    if lowest_resolution not in (4, 8):
        raise ValueError(f"lowest_resolution must be 4 or 8, got {lowest_resolution}")
    if not 0 < near < far:
        raise ValueError(f"need 0 < near < far, got near={near}, far={far}")


class ReSplatRelease(SplatModel):
    """ReSplat's released architecture: posed images in, a compact Gaussian set refined by
    ``iterations`` recurrent updates out.

    Args:
        vit_size: DINOv2 size of the depth trunk (``"vits"``, ``"vitb"``, ``"vitl"``) or ``"custom"``
            with ``vit_dim``/``vit_depth``/``vit_heads``/``mono_layers``/``dpt_*`` (test sizes).
        lowest_resolution: image / cost-volume resolution (8: the DL3DV files; 4: RE10K's).
        num_depth_candidates: log-depth candidates.
        unet_dim, transformer_depth: the depth trunk's U-Net width and transformer blocks.
        regressor_dim: channels of the regressor, the projection and the point transformer.
        latent_downsample: pixels per latent side (4: DL3DV files, 2: RE10K's).
        gaussians_per_latent: Gaussians per latent pixel, 1 or 4 (RE10K's: 2x2 sub-pixels).
        knn_k, init_blocks, attn_proj_dim: the initial point transformer.
        recurrent_update: whether the file has the recurrent update (the large model has none).
        state_dim, update_k, update_blocks, error_attn_blocks: the recurrent update.
        max_scale: upper clamp of the initial scales (1; the 540x960 file: 3).
        depth_half_res: run the depth trunk at half resolution (the 540x960 file).
        near, far: depth range when the context has none (the release's 0.01 / 100; DL3DV 200).
        local_mv_match: with more than 3 views each view matches its this many nearest views.
        iterations: refinement iterations when the forward is not told (the release's eval: 2).
        knn_method: ``models.layers.knn`` method of both point transformers.
        render_backend: ``models.render`` backend of the update's renders.
        memory_budget_gb: refuse a context whose kNN/attention would need more (see
            ``max_views``).
        vit_dim, vit_depth, vit_heads, mono_layers, dpt_depth_features, dpt_features,
            dpt_out_channels: ``vit_size="custom"`` only.
    """

    family = "resplat"
    pose_free = False
    min_views = 2

    def __init__(
        self,
        *,
        vit_size: str = "vitb",
        lowest_resolution: int = 8,
        num_depth_candidates: int = 128,
        unet_dim: int = 128,
        transformer_depth: int = 6,
        regressor_dim: int = 512,
        latent_downsample: int = 4,
        gaussians_per_latent: int = 1,
        knn_k: int = 16,
        init_blocks: int = 6,
        attn_proj_dim: int = 64,
        recurrent_update: bool = True,
        state_dim: int = 512,
        update_k: int = 8,
        update_blocks: int = 4,
        error_attn_blocks: int = 1,
        max_scale: float = 1.0,
        depth_half_res: bool = False,
        near: float = 0.01,
        far: float = 100.0,
        local_mv_match: int = 2,
        iterations: int = 2,
        knn_method: str = "auto",
        render_backend: str = "auto",
        memory_budget_gb: float = 24.0,
        vit_dim: int | None = None,
        vit_depth: int | None = None,
        vit_heads: int | None = None,
        mono_layers: list[int] | None = None,
        dpt_depth_features: int | None = None,
        dpt_features: int | None = None,
        dpt_out_channels: list[int] | None = None,
    ) -> None:
        super().__init__()
        _check_arguments(latent_downsample, gaussians_per_latent, lowest_resolution, near, far)
        if iterations < 0:
            raise ValueError(f"iterations must be >= 0, got {iterations}")
        vit_spec, dpt, embed = depth_trunk_size(
            vit_size, vit_dim=vit_dim, vit_depth=vit_depth, vit_heads=vit_heads,
            mono_layers=mono_layers, dpt_depth_features=dpt_depth_features,
            dpt_features=dpt_features, dpt_out_channels=dpt_out_channels,
        )  # fmt: skip
        self.latent_downsample = latent_downsample
        self.gaussians_per_latent = gaussians_per_latent
        self.lowest_resolution = lowest_resolution
        self.max_scale = max_scale
        self.depth_half_res = depth_half_res
        self.near, self.far = near, far
        self.local_mv_match = local_mv_match
        self.iterations = iterations
        self.render_backend = render_backend
        self.memory_budget_gb = memory_budget_gb
        self.recurrent_update = recurrent_update
        self.knn_k, self.update_k = knn_k, update_k
        # the depth trunk's own upsampling factor: the last cost volume is at 1/lowest_resolution
        self.depth_predictor = DepthTrunk(
            vit_spec,
            num_scales=1,
            upsample_factor=lowest_resolution,
            lowest_resolution=lowest_resolution,
            num_depth_candidates=num_depth_candidates,
            unet_dim=unet_dim,
            transformer_depth=transformer_depth,
            mono_layers=tuple(mono_layers) if mono_layers is not None else None,
            dpt=dpt,
            log_depth=True,
            max_vit_width=560,
            wide_attn_splits=True,
        )
        self._use_fused_attention()
        self._build_initial(embed, regressor_dim, init_blocks, attn_proj_dim, knn_method)
        if recurrent_update:
            self._build_update(
                regressor_dim, state_dim, update_blocks, error_attn_blocks, attn_proj_dim,
                knn_method,
            )  # fmt: skip
        self.register_buffer("rgb_mean", torch.tensor(IMAGENET_MEAN).view(3, 1, 1), False)
        self.register_buffer("rgb_std", torch.tensor(IMAGENET_STD).view(3, 1, 1), False)

    def _use_fused_attention(self) -> None:
        """The release's DINOv2 attends through scaled_dot_product_attention (DepthSplat's
        through explicit softmax, which models.layers.backbones.dinov2 reproduces by default),
        and so does its UniMatch transformer."""
        for block in self.depth_predictor.backbone.blocks:
            block.attn.fused_attn = True
        for layer in self.depth_predictor.matcher.modules():
            if hasattr(layer, "fused"):
                layer.fused = True

    def _build_initial(
        self, embed: int, c: int, init_blocks: int, attn_proj_dim: int, knn_method: str
    ) -> None:
        """The initial model after the depth trunk: regressor, projection, point transformer,
        Gaussian head (``c``: the regressor's width)."""
        match_dim = 128
        if self.latent_downsample == 4:
            features = embed // 4 + 64 + 96 + 128 + match_dim
        elif self.lowest_resolution == 8:
            features = embed // 64 * 4 + 64 + 96 // 4 + 128 // 16 + match_dim // 16
        else:
            features = embed // 64 * 4 + 64 + 96 + 128 // 4 + match_dim // 4
        self.feature_dim = features
        image_dim = 3 * self.latent_downsample**2
        self.gaussian_regressor = nn.Sequential(
            nn.Conv2d(image_dim + 1 + 1 + features, c, 3, padding=1),
            nn.GELU(),
            nn.Conv2d(c, c, 3, padding=1),
        )
        self.proj = nn.Linear(c + image_dim + features + 1, c)
        # init_blocks kNN blocks, each followed by a low-resolution view attention
        self.pt = PointTransformer(
            c,
            2 * init_blocks,
            k=self.knn_k,
            global_attention="views",
            global_heads=view_heads(c),
            inner_dim=attn_proj_dim,
            knn_method=knn_method,
            **RELEASE_POINT_OPTIONS,
        )
        m = self.gaussians_per_latent
        out = RAW_DIM * m
        self.gaussian_head = nn.Sequential(nn.Linear(c, out), nn.GELU(), nn.Linear(out, out))
        # the release's initialisation: only the quaternions start random
        nn.init.zeros_(self.gaussian_head[-1].weight[4 * m :])
        nn.init.zeros_(self.gaussian_head[-1].bias[4 * m :])

    def _build_update(
        self, c: int, state_dim: int, blocks: int, error_attn_blocks: int, attn_proj_dim: int,
        knn_method: str,
    ) -> None:  # fmt: skip
        """The recurrent update's modules (``c``: the regressor's width)."""
        self.update_proj = nn.Conv2d(c, state_dim, 1)
        rgb_in = 3 if self.gaussians_per_latent == 4 else 3 * self.latent_downsample**2
        self.update_rgb_error_proj = nn.Sequential(
            nn.Linear(rgb_in, RESNET_DIM), nn.LayerNorm(RESNET_DIM)
        )
        self.update_module = nn.Sequential(
            PointLinear(STATE_PARAMS + state_dim + RESNET_DIM, state_dim),
            PointTransformer(
                state_dim,
                blocks,
                k=self.update_k,
                global_attention=None,
                inner_dim=attn_proj_dim,
                knn_method=knn_method,
                **RELEASE_POINT_OPTIONS,
            ),
        )
        layers: list[nn.Module] = []
        for _ in range(3):
            layers += [nn.Linear(state_dim, state_dim), nn.GELU()]
        self.update_head = nn.Sequential(*layers, nn.Linear(state_dim, STATE_PARAMS))
        nn.init.zeros_(self.update_head[-1].weight)
        nn.init.zeros_(self.update_head[-1].bias)
        self.update_feature = FrozenResNet18()
        self.update_error_attn = nn.ModuleList(
            [
                ViewGridAttention(RESNET_DIM, view_heads(RESNET_DIM))
                for _ in range(error_attn_blocks)
            ]
        )

    # ------------------------------------------------------------------ sizes and budgets
    @property
    def divisor(self) -> int:
        """``H`` and ``W`` must be multiples of this (windows, U-Net, 4x4 global attention)."""
        trunk = self.lowest_resolution * 4 * (2 if self.depth_half_res else 1)
        return max(trunk, self.latent_downsample * 4 * 4)

    def gaussians_per_view(self, height: int, width: int) -> int:
        return height * width // self.latent_downsample**2 * self.gaussians_per_latent

    def memory_estimate(self, views: int, height: int, width: int, iterations: int) -> int:
        """Rough peak bytes of a forward (float32): the weights, the kNN's gathered neighbours,
        the global attentions' token arrays, the per-point and per-Gaussian activations, times a
        1.5 margin, plus 1 GiB (the depth trunk at these sizes and Python). A model of the
        code's largest arrays, checked against ``bench/resplat_speed.py``'s peak memory."""
        latent = views * height * width // self.latent_downsample**2
        n = latent * self.gaussians_per_latent if iterations > 0 else latent
        c = self.gaussian_regressor[0].out_channels
        tokens = latent // 16
        # global attentions run through scaled_dot_product_attention, whose CPU and CUDA kernels
        # do not hold the score matrix: a few token-by-channel arrays
        attention = 4 * tokens * c * 16 * 4
        knn_gather = 4 * latent * self.knn_k * 64 * 3
        per_point = 4 * latent * (c * 12 + self.feature_dim * 2)
        update = 0
        if iterations > 0 and self.recurrent_update:
            update = 4 * n * (4 * 512 + self.update_k * 64 * 3 + RESNET_DIM * 4)
            update += 4 * (n // 16) * RESNET_DIM * 16 * 4
        weights = 4 * sum(p.numel() for p in self.parameters())
        return int(1.5 * (attention + knn_gather + per_point + update)) + weights + 2**30

    def max_views(self, height: int, width: int, iterations: int | None = None) -> int:
        """The most context views whose forward fits ``memory_budget_gb``."""
        iterations = self.iterations if iterations is None else iterations
        budget = self.memory_budget_gb * 2**30
        views = 1
        while views < 4096 and self.memory_estimate(views + 1, height, width, iterations) <= budget:
            views += 1
        return views

    def _check(self, b: int, v: int, h: int, w: int, iterations: int) -> None:
        if v < 2:
            raise ValueError(f"ReSplat needs at least 2 context views, got {v}")
        d = self.divisor
        if h % d or w % d:
            raise ValueError(
                f"image size {h}x{w}: height and width must be multiples of {d} for this model"
            )
        if h > w:
            raise ValueError(f"image size {h}x{w}: ReSplat's depth trunk needs height <= width")
        if self.memory_estimate(v, h, w, iterations) * b > self.memory_budget_gb * 2**30:
            fit = self.max_views(h, w, iterations)
            raise ValueError(
                f"{v} views of {h}x{w} need more than memory_budget_gb={self.memory_budget_gb:g} "
                f"for the kNN/attention of {iterations} iteration(s): at most {fit} view(s) fit "
                "(pass fewer views, a smaller size, or raise memory_budget_gb)"
            )

    # ------------------------------------------------------------------ initial model
    def _neighbours(self, extrinsics: Tensor) -> Tensor | None:
        if extrinsics.shape[1] <= 3:
            return None
        centres = extrinsics[:, :, :3, 3]
        return torch.argsort(torch.cdist(centres, centres, p=2))[:, :, : self.local_mv_match + 1]

    def _depth(self, images, intrinsics, extrinsics, near, far) -> dict:
        neighbours = self._neighbours(extrinsics)
        if not self.depth_half_res:
            return self.depth_predictor(images, intrinsics, extrinsics, near, far, neighbours)
        b, v = images.shape[:2]
        half = F.interpolate(images.flatten(0, 1), scale_factor=0.5, mode="bilinear",
                             align_corners=True).unflatten(0, (b, v))  # fmt: skip
        out = self.depth_predictor(half, intrinsics, extrinsics, near, far, neighbours)

        def up(x: Tensor) -> Tensor:
            return F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=True)

        out = dict(out)
        for key in ("cnn", "match", "mono", "raw_mono"):
            out[key] = [up(x) for x in out[key]]
        out["match_prob"] = up(out["match_prob"])
        return out

    def initial(self, context: dict[str, Tensor]) -> tuple[RawState, Tensor, Tensor]:
        """The initial set: ``(raw state, condition features [BV, C, h, w], depth [B, V, H, W])``."""
        images = context["image"]
        extrinsics, intrinsics = context["extrinsics"], context["intrinsics"]
        b, v, _, height, width = images.shape
        near, far = self._depth_range(context, b, v, images)
        trunk = self._depth(images, intrinsics, extrinsics, near, far)
        depth = trunk["depth"]  # [B, V, H', W'] (H/2 with depth_half_res)
        ld, m = self.latent_downsample, self.gaussians_per_latent
        mono = [
            F.interpolate(x, size=(height // 16, width // 16), mode="bilinear", align_corners=True)
            for x in trunk["raw_mono"]
        ]
        cnn = list(trunk["cnn"])  # highest resolution first
        match = trunk["match"][0]
        if ld == 4:
            mono = torch.cat([F.pixel_shuffle(x, 4) for x in mono], dim=1)
            size = (height // 4, width // 4)
            cnn = torch.cat(
                [F.interpolate(x, size=size, mode="bilinear", align_corners=True) for x in cnn],
                dim=1,
            )
            if match.shape[-2:] != size:
                match = F.interpolate(match, size=size, mode="bilinear", align_corners=True)
        else:
            mono = torch.cat([F.pixel_shuffle(x, 8) for x in mono], dim=1)
            if self.lowest_resolution == 8:
                cnn = torch.cat([cnn[0], F.pixel_shuffle(cnn[1], 2), F.pixel_shuffle(cnn[2], 4)],
                                dim=1)  # fmt: skip
                match = F.pixel_shuffle(match, 4)
            else:
                cnn = torch.cat([cnn[0], cnn[1], F.pixel_shuffle(cnn[2], 2)], dim=1)
                match = F.pixel_shuffle(match, 2)
        features = torch.cat([mono, cnn, match], dim=1)  # [BV, F, h, w]
        confidence = trunk["match_prob"].amax(dim=1, keepdim=True)
        flat_images = images.flatten(0, 1)
        unshuffled = F.pixel_unshuffle(flat_images, ld)  # [BV, 3 ld^2, h, w]
        factor = 1.0 / (ld // 2) if self.depth_half_res else 1.0 / ld
        latent_depth = F.interpolate(depth, scale_factor=factor, mode="bilinear",
                                     align_corners=True)  # [B, V, h, w]  # fmt: skip
        h, w = latent_depth.shape[-2:]
        confidence = F.interpolate(confidence, size=(h, w), mode="nearest")
        x = self.gaussian_regressor(
            torch.cat([unshuffled, latent_depth.flatten(0, 1)[:, None], confidence, features], 1)
        )
        x = torch.cat([x, unshuffled, features, confidence], dim=1)
        tokens = self.proj(rearrange(x, "bv c h w -> (bv h w) c"))  # [B*N, C]
        xy = pixel_grid(h, w, images.device, images.dtype).expand(b, v, h * w, 2)
        points = lift(xy, latent_depth.flatten(2), extrinsics, intrinsics).reshape(b, -1, 3)
        refined = self.pt(tokens.view(b, v * h * w, -1), points, grid=(v, h, w))  # [B, N, C]
        tokens = tokens + refined.flatten(0, 1)
        condition = rearrange(tokens, "(bv h w) c -> bv c h w", h=h, w=w)
        raw = self.gaussian_head(tokens).view(b, v, h * w, -1)
        quat, scale, opacity, offset, sh = raw.split([4 * m, 3 * m, m, 2 * m, 3 * D_SH * m], -1)
        if m > 1:
            r = 2

            def sub(t: Tensor) -> Tensor:  # [B, V, h*w, c*4] -> [B, V, (2h)(2w), c]
                return rearrange(t, "b v (h w) (c x y) -> b v (h x w y) c", h=h, w=w, x=r, y=r)

            quat, scale, opacity, offset, sh = map(sub, (quat, scale, opacity, offset, sh))
            gh, gw = 2 * h, 2 * w  # (latent_downsample 2): the full-resolution depth and colour
            gdepth = depth
            colour = flat_images
        else:
            gh, gw = h, w
            gdepth = latent_depth
            colour = F.interpolate(flat_images, scale_factor=1.0 / ld, mode="area")
        xy = pixel_grid(gh, gw, images.device, images.dtype).expand(b, v, gh * gw, 2)
        pixel = 1 / torch.tensor((gw, gh), dtype=torch.float32, device=images.device)
        xy = xy + (torch.sigmoid(offset) - 0.5) * pixel
        means = lift(xy, gdepth.flatten(2), extrinsics, intrinsics)
        scales = torch.clamp(F.softplus(scale - 4.0), min=MIN_SCALE, max=self.max_scale)
        sh = sh.reshape(b, v, gh * gw, 3, D_SH).clone()
        colour = rearrange(colour, "(b v) c h w -> b v (h w) c", b=b)
        sh[..., 0] = sh[..., 0] + rgb_to_sh(colour)

        def flat(t: Tensor) -> Tensor:
            return t.reshape(b, v * gh * gw, *t.shape[3:])

        state = RawState(flat(means), flat(scales), flat(quat), flat(opacity),
                         flat(sh).reshape(b, v * gh * gw, 3 * D_SH))  # fmt: skip
        return state, condition, depth

    # ------------------------------------------------------------------ recurrent update
    def _render_options(self) -> dict:
        """The release's gsplat call: antialiased, a 0.1 px² dilation (gsplat's default: 0.3)."""
        return {"rasterize_mode": "antialiased", "eps2d": RELEASE_EPS2D}

    def render_context(self, state: RawState, context: dict[str, Tensor], opacities=None):
        """Render the context views as the update sees them: ``[B, V, 3, H, W]``."""
        images = context["image"]
        b, v, _, height, width = images.shape
        near, far = self._depth_range(context, b, v, images)
        return render(
            state.gaussians(context["extrinsics"], opacities),
            context["extrinsics"],
            context["intrinsics"],
            (height, width),
            backend=self.render_backend,
            near=float(near[0, 0]),
            far=float(far[0, 0]),
            **self._render_options(),
        ).color

    def _resnet(self, images: Tensor, size: tuple[int, int]) -> Tensor:
        feats = self.update_feature((images - self.rgb_mean) / self.rgb_std)
        feats = [
            f if f.shape[-2:] == size
            else F.interpolate(f, size=size, mode="bilinear", align_corners=True)
            for f in feats
        ]  # fmt: skip
        return torch.cat(feats, dim=1)

    def update(
        self,
        state: RawState,
        condition: Tensor,
        context: dict[str, Tensor],
        iterations: int,
        renders: list[Tensor] | None = None,
    ) -> list[RawState]:
        """``iterations`` recurrent updates; returns the state after each.

        Args:
            renders: when given, each iteration's context render is appended (tests).
        """
        images = context["image"]
        b, v, _, height, width = images.shape
        ld, m = self.latent_downsample, self.gaussians_per_latent
        h, w = height // ld, width // ld
        gh, gw = (2 * h, 2 * w) if m > 1 else (h, w)
        hidden = self.update_proj(condition)
        if m > 1:
            hidden = F.interpolate(hidden, scale_factor=2, mode="bilinear", align_corners=True)
        hidden = rearrange(hidden, "(b v) c h w -> (b v h w) c", b=b)
        flat_images = images.flatten(0, 1)
        with torch.no_grad():
            image_features = self._resnet(flat_images, (gh, gw))
        out = []
        # the release re-derives the opacity logits from the rendered opacities (clamped logit)
        logits = torch.logit(torch.sigmoid(state.opacity_logits), eps=1e-6)
        current = RawState(state.means, state.scales, state.quats, logits, state.sh)
        for _ in range(iterations):
            with torch.no_grad():
                rendered = self.render_context(current, context)
            if renders is not None:
                renders.append(rendered)
            flat_rendered = rendered.flatten(0, 1)
            with torch.no_grad():
                error = self._resnet(flat_rendered, (gh, gw)) - image_features
            error = rearrange(error, "(b v) c h w -> b (v h w) c", b=b)
            rgb = flat_rendered - flat_images
            if m == 1:
                rgb = F.pixel_unshuffle(rgb, ld)
            rgb = rearrange(rgb, "(b v) c h w -> b (v h w) c", b=b)
            error = error + self.update_rgb_error_proj(rgb)
            for block in self.update_error_attn:
                error = block(error, (v, gh, gw))
            previous = current.flat().detach()  # [B, N, 59]
            x = torch.cat([previous.flatten(0, 1), hidden, error.flatten(0, 1)], dim=-1)
            x = self.update_module[0](x)
            means = current.means.detach()
            hidden = self.update_module[1](x.view(b, -1, x.shape[-1]), means).flatten(0, 1) + hidden
            delta = self.update_head(hidden).view(b, -1, STATE_PARAMS)
            dm, ds, dq, do, dsh = delta.split([3, 3, 4, 1, 3 * D_SH], dim=-1)
            current = RawState(
                current.means.detach() + dm,
                (current.scales.detach() + ds).clamp(min=MIN_SCALE),
                current.quats.detach() + dq,
                current.opacity_logits.detach() + do,
                current.sh.detach() + dsh,
            )
            out.append(current)
        return out

    # ------------------------------------------------------------------ forward
    def _depth_range(self, context: dict[str, Tensor], b: int, v: int, like: Tensor):
        out = []
        for key, default in (("near", self.near), ("far", self.far)):
            value = context.get(key)
            if value is None:
                value = torch.full((b, v), default, dtype=like.dtype, device=like.device)
            out.append(value.to(like.dtype))
        return out

    def forward(
        self,
        context: dict[str, Tensor],
        *,
        iterations: int | None = None,
        max_gaussians: int | None = None,
    ) -> ModelOutput:
        """Reconstruct from posed context views.

        Args:
            context: ``image [B, V, 3, H, W]``, ``extrinsics [B, V, 4, 4]``, ``intrinsics``,
                optional ``near``/``far`` ``[B, V]``; ``H``, ``W`` multiples of ``divisor``.
            iterations: recurrent updates (``None``: the configured ``iterations``; 0: the
                initial set).
            max_gaussians: keep at most this many (the most opaque) Gaussians of the result.

        Returns:
            the last iteration's Gaussians (view-major, row-major grid, in the frame of the given
            extrinsics); extras ``gaussians_per_iteration`` (the initial set first), ``depth``
            ``[B, V, H, W]`` and ``iterations``.
        """
        b, v, height, width = check_context(context, require_poses=True)
        iterations = self.iterations if iterations is None else int(iterations)
        if iterations < 0:
            raise ValueError(f"iterations must be >= 0, got {iterations}")
        if iterations > 0 and not self.recurrent_update:
            raise ValueError(
                f"iterations={iterations}: this model (file) has no recurrent update; use 0"
            )
        self._check(b, v, height, width, iterations)
        state, condition, depth = self.initial(context)
        extrinsics = context["extrinsics"]
        per_iteration = [state.gaussians(extrinsics)]
        if iterations > 0:
            for s in self.update(state, condition, context, iterations):
                per_iteration.append(s.gaussians(extrinsics))
        final = per_iteration[-1]
        if max_gaussians is not None:
            final = final.prune(max_count=max_gaussians)
        if depth.shape[-2:] != (height, width):
            depth = F.interpolate(depth, size=(height, width), mode="bilinear",
                                  align_corners=True)  # fmt: skip
        return ModelOutput(
            gaussians=final,
            depth=depth,
            gaussians_per_iteration=per_iteration,
            diagnostics={"iterations": iterations},
        )


# ----------------------------------------------------------------------------- official weights
def checkpoint_filter_fn(checkpoint: dict, model: nn.Module) -> dict[str, Tensor]:
    """Map a released ReSplat file onto ``model``'s state dict.

    Accepts ``{'state_dict': {'encoder.…': …}}`` (the release: the Lightning wrapper's state dict,
    whose only persistent tensors are the encoder's), the inner dict, or the encoder's state dict
    without the prefix. Every key is consumed, including the frozen ResNet-18's batch-norm
    statistics and ``num_batches_tracked`` counters (kept as buffers, unused in eval mode).

    Raises:
        ValueError: one line (not a ReSplat file, unknown keys, missing keys, other size).
    """
    bare = encoder_state_dict(checkpoint, "ReSplat")
    if not any(k.startswith("depth_predictor.") for k in bare) or "proj.weight" not in bare:
        raise ValueError(
            "no 'encoder.depth_predictor.*' and 'encoder.proj.*' keys: not a ReSplat "
            "Gaussian file (a depth-only resplat-depth-* file, or another model's?)"
        )
    if any(k.startswith("feature_upsampler.") for k in bare):
        raise ValueError("'encoder.feature_upsampler.*' keys: a DepthSplat file, not ReSplat")
    target = model.state_dict()
    has_update = any(k.startswith("update_") for k in bare)
    if has_update != getattr(model, "recurrent_update", True):
        raise ValueError(
            "the file has no recurrent update (the large model): build it with recurrent_update=False"
            if not has_update
            else "the file has a recurrent update but the model was built with recurrent_update=False"
        )
    mapped: dict[str, Tensor] = {}
    unknown = []
    for key, value in bare.items():
        ours = official_key_to_ours(key)
        tensors = {} if ours is None else split_fused_qkv(ours, value)
        if not tensors or any(name not in target for name in tensors):
            unknown.append("encoder." + key)
            continue
        mapped.update(tensors)
    return check_mapped_state(mapped, unknown, target, "ReSplat", "resplat_* tag")


# ----------------------------------------------------------------------------- knobs, registry
INFERENCE_KNOBS = (
    Knob(
        "iterations",
        "int",
        low=0,
        high=16,
        step=1,
        default_attr="iterations",
        help="recurrent refinement steps driven by the rendering error on the input views "
        "(0: the initial set; the release evaluates 2 or 4)",
    ),
    MAX_GAUSSIANS,
)
KNOB_FREE_MODULES = ("depth_predictor",)  # the depth trunk does not depend on the knobs


@register_model
def resplat_small(**kwargs) -> ReSplatRelease:
    """ReSplat-S as released: DINOv2 ViT-S depth trunk, 256-channel regressor (76.6 M)."""
    return ReSplatRelease(**{**dict(vit_size="vits", regressor_dim=256), **DL3DV_LAYOUT, **kwargs})


@register_model
def resplat_base(**kwargs) -> ReSplatRelease:
    """ReSplat-B as released: DINOv2 ViT-B, 512-channel regressor (224.0 M; the RE10K file's
    layout: ``latent_downsample=2, gaussians_per_latent=4, lowest_resolution=4``)."""
    return ReSplatRelease(**{**dict(vit_size="vitb", regressor_dim=512), **DL3DV_LAYOUT, **kwargs})


@register_model
def resplat_large(**kwargs) -> ReSplatRelease:
    """ReSplat-L as released: DINOv2 ViT-L, 768-channel regressor, no recurrent update
    (559.5 M)."""
    large = dict(vit_size="vitl", regressor_dim=768, recurrent_update=False, iterations=0)
    return ReSplatRelease(**{**large, **DL3DV_LAYOUT, **kwargs})


@register_model
def resplat_release_tiny(**kwargs) -> ReSplatRelease:
    """A reduced release architecture for tests (not released): a 4-block ViT of width 64, one
    transformer block, 16 candidates, 32-channel regressor, a 64-channel state."""
    tiny = dict(
        vit_size="custom", vit_dim=64, vit_depth=4, vit_heads=2, mono_layers=[0, 1, 2, 3],
        dpt_depth_features=16, dpt_features=32, dpt_out_channels=[16, 32, 64, 64],
        num_depth_candidates=16, unet_dim=32, transformer_depth=1, regressor_dim=32, init_blocks=1,
        attn_proj_dim=16, state_dim=64, update_blocks=1, iterations=1, render_backend="torch",
        **DL3DV_LAYOUT,
    )  # fmt: skip
    return ReSplatRelease(**{**tiny, **kwargs})
