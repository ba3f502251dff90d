"""ReSplat: a compact initial Gaussian set refined by a weight-shared recurrent update driven by the
rendering error on the input views (after ReSplat, arXiv 2510.08575).

Initial model (posed):

1. the shared multi-view ViT (camera tokens on, frame/global attention) encodes the context views;
   a DPT head decodes its tokens to a latent grid at 1/4 of the image resolution;
2. the latent features are fused with the pixel-unshuffled image (4x4 pixels -> 48 channels), a
   depth head predicts a z-depth per latent pixel (inverse depth between ``near`` and ``far``), and
   the latent pixels are lifted to a point cloud (one point per 4x4 pixels per view);
3. a point transformer (kNN attention, k=16, interleaved with global attention over the points of
   all views) refines the point features;
4. the shared ``GaussianHead`` (``RayDepthPlacement``, a sub-pixel offset whose pixel is the
   4x4 block) decodes one Gaussian per point. The point features are the initial hidden state.

Recurrent update (weights shared across iterations), for ``i = 0 .. iterations - 1``:

1. render the context views with the current Gaussians (no gradient: they are detached);
2. error = frozen CNN features (multi-scale, resized to the latent grid) of the render minus those of
   the input, concatenated with the RGB error pixel-unshuffled to the latent grid;
3. error tokens (plus the latent pixel's Plücker ray) go through global attention over all views;
   Gaussian ``j`` is the latent pixel ``j``, so it reads the error token of its own pixel;
4. ``x = proj([raw parameters (mean, log scale, raw quaternion, opacity logit, SH) | state | error])``;
   ``state = state + PointTransformer(x)`` (kNN attention around the current means);
5. a zero-initialised MLP maps the state to additive deltas on every raw parameter; decoding is
   ``scale = exp``, ``opacity = sigmoid``, quaternion normalised.

The previous Gaussians are detached every iteration, so gradients cross iterations only through the
hidden state. Training (``models.training.recipes.ReSplatTrainingRecipe``) samples 1..``train_iterations``
iterations per step and supervises every iteration's render (``gaussians_per_iteration``) with
weight ``loss_decay ** (N - 1 - i)``. The two-stage recipe trains the initial model alone
(``train_iterations=0``), then the update with ``init_checkpoint`` and ``freeze_init=True`` (the
recipe calls ``freeze_initial_model``).
"""

from __future__ import annotations

import math
import os

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from models.core.base import ModelOutput, SplatModel, check_context
from models.core.gaussians import Gaussians
from models.geometry.cameras import normalize_scene, pixel_grid, plucker_embedding, unproject
from models.layers.feature_extractor import FrozenFeatureExtractor
from models.layers.heads import GaussianHead, RayDepthPlacement, raw_gaussian_dim
from models.layers.pixel_trunk import PixelTrunk
from models.layers.point_transformer import PointTransformer, PointTransformerBlock
from models.render.core import render
from models.weights.builder import load_state_dict_strict, sub_state_dict
from models.weights.hub import read_weights
from models.weights.knobs import MAX_GAUSSIANS, Knob
from models.weights.pretrained_cfg import synthetic64_cfg
from models.weights.registry import register_model, register_pretrained_cfgs

__all__ = [
    "ReSplat",
    "InitialModel",
    "RecurrentUpdate",
    "encode_gaussians",
    "decode_gaussians",
    "resplat_tiny",
    "resplat_vit_small",
    "resplat_vit_base",
]

DOWNSAMPLE = 4  # one Gaussian per 4x4 pixels
MAX_LOG_SCALE = math.log(10.0)  # clamp of refined scales (scene units; the baseline is 1)
MIN_LOG_SCALE = math.log(1e-7)


def encode_gaussians(gaussians: Gaussians) -> Tensor:
    """Raw parameters of the update: ``[mean 3 | log scale 3 | quaternion 4 | opacity logit 1 |
    SH 3K]`` -> ``[B, N, 11 + 3K]``."""
    b, n = gaussians.opacities.shape
    return torch.cat(
        [
            gaussians.means,
            gaussians.scales.clamp_min(1e-12).log(),
            gaussians.rotations,
            torch.logit(gaussians.opacities, eps=1e-6)[..., None],
            gaussians.harmonics.reshape(b, n, -1),
        ],
        dim=-1,
    )


def decode_gaussians(raw: Tensor, sh_degree: int) -> Gaussians:
    """Inverse of ``encode_gaussians``: ``scale = exp``, ``opacity = sigmoid``, unit quaternion."""
    k = (sh_degree + 1) ** 2
    means, log_scales, quats, logits, sh = raw.split([3, 3, 4, 1, 3 * k], dim=-1)
    return Gaussians(
        means=means,
        scales=log_scales.clamp(MIN_LOG_SCALE, MAX_LOG_SCALE).exp(),
        rotations=F.normalize(quats, dim=-1, eps=1e-8),
        opacities=torch.sigmoid(logits[..., 0]),
        harmonics=sh.reshape(*sh.shape[:-1], 3, k),
    )


def _latent_shape(height: int, width: int) -> tuple[int, int]:
    if height % DOWNSAMPLE or width % DOWNSAMPLE:
        raise ValueError(
            f"ReSplat needs image sides divisible by {DOWNSAMPLE} (one Gaussian per "
            f"{DOWNSAMPLE}x{DOWNSAMPLE} pixels), got {height}x{width}"
        )
    return height // DOWNSAMPLE, width // DOWNSAMPLE


def _per_point(camera: Tensor, count: int) -> Tensor:
    """Repeat a per-view tensor ``[B, V, ...]`` for the ``count`` latent pixels of each view ->
    ``[B, V*count, ...]``."""
    b, v = camera.shape[:2]
    expanded = camera[:, :, None].expand(b, v, count, *camera.shape[2:])
    return expanded.reshape(b, v * count, *camera.shape[2:])


class InitialModel(PixelTrunk, nn.Module):
    """The initial model: images and cameras to Gaussians at 1/4 resolution plus point features.

    Args:
        vit_size: ``MultiViewTransformer`` size.
        image_size: the backbone's training resolution.
        patch_size: the backbone's patch size (``None``: the size's default).
        pretrained_backbone: passed to ``MultiViewTransformer``.
        backbone_dim: the backbone's width (``None``: the size's default).
        backbone_depth: the backbone's blocks (``None``: the size's default).
        backbone_heads: the backbone's heads (``None``: the size's default).
        dim: point feature width (also the hidden state width).
        num_depth_candidates: inverse-depth candidates of the depth softmax.
        dpt_features: DPT fusion width.
        blocks: point transformer blocks (kNN and global alternate).
        heads: attention heads.
        knn_k: neighbours of the kNN attention.
        sh_degree: SH degree.
        scale_factor: ``GaussianHead`` scale multiplier (in units of a latent pixel's footprint).
        max_scale: ``GaussianHead`` scale clamp (footprints).
        opacity_bias: initial opacity logit.
    """

    def __init__(
        self,
        *,
        vit_size: str,
        image_size: int | list[int],
        patch_size: int | None,
        pretrained_backbone: bool | str,
        backbone_dim: int | None,
        backbone_depth: int | None,
        backbone_heads: int | None,
        dim: int,
        num_depth_candidates: int,
        dpt_features: int,
        blocks: int,
        heads: int,
        knn_k: int,
        sh_degree: int,
        scale_factor: float,
        max_scale: float,
        opacity_bias: float,
    ) -> None:
        super().__init__()
        self.build_pixel_encoder(
            vit_size,
            image_size=image_size,
            patch_size=patch_size,
            backbone_dim=backbone_dim,
            backbone_depth=backbone_depth,
            backbone_heads=backbone_heads,
            camera_tokens=True,
            pretrained_backbone=pretrained_backbone,
            dpt_features=dpt_features,
            feature_dim=dim,
            shallow_dim=0,
        )
        unshuffled = 3 * DOWNSAMPLE**2
        self.fuse = nn.Sequential(
            nn.Conv2d(dim + unshuffled, dim, 3, padding=1),
            nn.GELU(),
            nn.Conv2d(dim, dim, 3, padding=1),
        )
        self.build_pixel_depth(dim, num_depth_candidates, activation="gelu")
        self.point_in = nn.Linear(dim + 3, dim)  # + normalised inverse depth, latent xy
        self.points = PointTransformer(dim, depth=blocks, heads=heads, k=knn_k)
        self.head = GaussianHead(
            dim,
            RayDepthPlacement(),
            sh_degree=sh_degree,
            hidden_dim=dim,
            scale_factor=scale_factor,
            max_scale=max_scale,
            dc_from_color=True,
            opacity_bias=opacity_bias,
        )

    def forward(
        self, images: Tensor, extrinsics: Tensor, intrinsics: Tensor, near: Tensor, far: Tensor
    ) -> tuple[Gaussians, Tensor, Tensor]:
        """Predict the initial Gaussians.

        Args:
            images: ``[B, V, 3, H, W]`` in [0, 1].
            extrinsics: ``[B, V, 4, 4]`` camera-to-world (scene frame).
            intrinsics: ``[B, V, 3, 3]`` normalised.
            near: ``[B, V]``.
            far: ``[B, V]``.

        Returns:
            Gaussians (``B, V*h*w``; view-major, then row-major over the latent grid), point
            features ``[B, V*h*w, dim]`` (the initial hidden state) and depth ``[B, V, h, w]``.
        """
        b, v, _, height, width = images.shape
        h, w = _latent_shape(height, width)
        # Camera tokens see the poses relative to view 0 at unit baseline (frame invariant).
        feats = self.pixel_features(images, (h, w), normalize_scene(extrinsics)[0], intrinsics)
        unshuffled = F.pixel_unshuffle(images.flatten(0, 1), DOWNSAMPLE)  # [BV, 48, h, w]
        feats = self.fuse(torch.cat([feats, unshuffled], dim=1))  # [BV, dim, h, w]

        # Softmax over inverse-depth candidates between 1/far and 1/near (MVSplat / DepthSplat).
        pixel_depth = self.pixel_depth(feats, near, far)
        disparity = pixel_depth.inverse[:, 0]  # [BV, h, w] in [0, 1]
        depth = pixel_depth.depth[:, :, 0].flatten(0, 1)  # [BV, h, w]

        coords = pixel_grid((h, w), images.device, images.dtype).reshape(1, 1, h * w, 2)
        coords = coords.expand(b, v, h * w, 2)
        depth_flat = depth.reshape(b, v, h * w)
        points = unproject(coords, depth_flat, intrinsics, extrinsics)  # [B, V, hw, 3]

        tokens = rearrange(feats, "(b v) c h w -> b (v h w) c", b=b)
        extra = torch.cat([disparity.reshape(b, v * h * w, 1), coords.reshape(b, -1, 2)], dim=-1)
        tokens = self.point_in(torch.cat([tokens, extra], dim=-1))
        points = points.reshape(b, v * h * w, 3)
        tokens = self.points(tokens, points)  # [B, N, dim]

        color = F.avg_pool2d(images.flatten(0, 1), DOWNSAMPLE)  # [BV, 3, h, w]
        color = rearrange(color, "(b v) c h w -> b (v h w) c", b=b)
        intr = _per_point(intrinsics, h * w)  # [B, N, 3, 3]
        extr = _per_point(extrinsics, h * w)  # [B, N, 4, 4]
        pixel_size = torch.tensor([1.0 / w, 1.0 / h], dtype=images.dtype, device=images.device)
        # Footprint of one latent pixel at depth d: d * pixel / focal (mean of x and y).
        footprint = 0.5 * (
            pixel_size[0] / intrinsics[..., 0, 0] + pixel_size[1] / intrinsics[..., 1, 1]
        )  # [B, V]
        scale_reference = depth_flat * footprint[..., None]  # [B, V, hw]
        gaussians = self.head(
            tokens,
            color=color,
            depth=depth_flat.reshape(b, v * h * w),
            coords=coords.reshape(b, v * h * w, 2),
            pixel_size=pixel_size,
            intrinsics=intr,
            extrinsics=extr,
            scale_reference=scale_reference.reshape(b, v * h * w),
        )
        return gaussians, tokens, depth.reshape(b, v, h, w)


class RecurrentUpdate(nn.Module):
    """One weight-shared refinement step driven by the rendering error.

    Args:
        dim: hidden state width.
        error_channels: channels of the raw error (frozen CNN features + 48 RGB).
        sh_degree: SH degree of the Gaussians.
        blocks: kNN point transformer blocks.
        error_blocks: global attention blocks over the error tokens.
        heads: attention heads.
        knn_k: neighbours of the kNN attention.
        global_attention: interleave global attention in the update's point transformer.
    """

    def __init__(
        self,
        *,
        dim: int,
        error_channels: int,
        sh_degree: int,
        blocks: int,
        error_blocks: int,
        heads: int,
        knn_k: int,
        global_attention: bool,
    ) -> None:
        super().__init__()
        self.sh_degree = sh_degree
        self.raw_dim = raw_gaussian_dim(sh_degree)
        self.error_in = nn.Linear(error_channels + 6, dim)  # + the latent pixel's Plücker ray
        self.error_attention = nn.ModuleList(
            PointTransformerBlock(dim, heads, knn_k, mode="global") for _ in range(error_blocks)
        )
        self.error_norm = nn.LayerNorm(dim)
        self.input = nn.Sequential(nn.Linear(self.raw_dim + 2 * dim, dim), nn.LayerNorm(dim))
        self.points = PointTransformer(
            dim,
            depth=blocks,
            heads=heads,
            k=knn_k,
            global_attention="points" if global_attention else None,
        )
        self.delta = nn.Sequential(
            nn.LayerNorm(dim), nn.Linear(dim, dim), nn.GELU(), nn.Linear(dim, self.raw_dim)
        )
        nn.init.zeros_(self.delta[-1].weight)
        nn.init.zeros_(self.delta[-1].bias)

    def error_tokens(self, error: Tensor, rays: Tensor) -> Tensor:
        """``error [B, V, C_e, h, w]``, ``rays [B, V, 6, h, w]`` -> tokens ``[B, V*h*w, dim]``."""
        x = torch.cat([error, rays], dim=2)
        x = self.error_in(rearrange(x, "b v c h w -> b (v h w) c"))
        for block in self.error_attention:
            x = block(x)  # global attention: no positions needed
        return self.error_norm(x)

    def forward(
        self, raw: Tensor, state: Tensor, error: Tensor, rays: Tensor
    ) -> tuple[Tensor, Tensor]:
        """One step.

        Args:
            raw: ``[B, N, raw_dim]`` current raw parameters (detached by the caller).
            state: ``[B, N, dim]`` hidden state.
            error: ``[B, V, C_e, h, w]`` raw error with ``N = V*h*w``.
            rays: ``[B, V, 6, h, w]`` Plücker rays of the latent pixels.

        Returns:
            The new raw parameters ``raw + delta`` and the new state.
        """
        tokens = self.error_tokens(error, rays)  # [B, N, dim]
        x = self.input(torch.cat([raw, state, tokens], dim=-1))
        state = state + self.points(x, raw[..., :3].detach())
        return raw + self.delta(state), state


class ReSplat(SplatModel):
    """ReSplat: initial 1/4-resolution Gaussians and a recurrent, error-driven refinement.

    Args:
        vit_size: ``MultiViewTransformer`` size (``"tiny"``, ``"small"``, ``"base"``, ...).
        image_size: the backbone's training resolution.
        patch_size: the backbone's patch size (``None``: the size's default).
        pretrained_backbone: DINOv2 weights for the backbone (see ``MultiViewTransformer``);
            ignored by ``from_pretrained`` (the checkpoint holds every weight).
        backbone_dim: the backbone's width (``None``: the size's default).
        backbone_depth: the backbone's blocks (``None``: the size's default).
        backbone_heads: the backbone's attention heads (``None``: the size's default).
        dim: point feature / hidden state width.
        num_depth_candidates: inverse-depth candidates of the initial model's depth softmax.
        dpt_features: DPT fusion width.
        init_blocks: point transformer blocks of the initial model (kNN and global alternate).
        update_blocks: kNN point transformer blocks of the update.
        update_global_attention: interleave global attention in the update's point transformer.
        error_blocks: global attention blocks over the error tokens.
        heads: attention heads.
        knn_k: neighbours of the kNN attention.
        sh_degree: SH degree.
        scale_factor: initial-model scale multiplier, in latent-pixel footprints.
        max_scale: initial-model scale clamp, in footprints.
        opacity_bias: initial opacity logit.
        iterations: refinement iterations at inference (the ``iterations`` forward default).
        init_checkpoint: weights of a trained initial model, loaded strictly into it: a Lightning
            ``.ckpt``, a ``.safetensors`` file or a ``save_pretrained`` folder of a ReSplat model
            (its ``init_model.*`` entries) or of the initial model alone. ``None``/``False``: none.
        feature_extractor: timm model of the frozen error features.
        feature_weights: ``"seeded"`` (offline, default), ``"pretrained"`` or ``"filterbank"``.
        feature_levels: timm feature levels used.
        near: near plane when the context has none.
        far: far plane when the context has none.
        render_backend: renderer backend of the context renders.
    """

    family = "resplat"
    pose_free = False
    min_views = 1

    def __init__(
        self,
        *,
        vit_size: str = "tiny",
        image_size: int | list[int] = 64,
        patch_size: int | None = None,
        pretrained_backbone: bool | str = False,
        backbone_dim: int | None = None,
        backbone_depth: int | None = None,
        backbone_heads: int | None = None,
        dim: int = 64,
        num_depth_candidates: int = 64,
        dpt_features: int = 64,
        init_blocks: int = 2,
        update_blocks: int = 2,
        update_global_attention: bool = False,
        error_blocks: int = 1,
        heads: int = 4,
        knn_k: int = 16,
        sh_degree: int = 1,
        scale_factor: float = 25.0,
        max_scale: float = 8.0,
        opacity_bias: float = 2.0,
        iterations: int = 2,
        init_checkpoint: str | bool | None = None,
        feature_extractor: str = "resnet18",
        feature_weights: str = "seeded",
        feature_levels: list[int] | tuple[int, ...] = (0, 1, 2),
        near: float = 0.5,
        far: float = 100.0,
        render_backend: str = "auto",
    ) -> None:
        super().__init__()
        if iterations < 0:
            raise ValueError(f"iterations must be >= 0, got {iterations}")
        self.sh_degree = sh_degree
        self.iterations = iterations
        self.freeze_init = False  # training state (the recipe's freeze_initial_model), not config
        self.near = near
        self.far = far
        self.render_backend = render_backend
        self.init_model = InitialModel(
            vit_size=vit_size,
            image_size=image_size,
            patch_size=patch_size,
            pretrained_backbone=pretrained_backbone,
            backbone_dim=backbone_dim,
            backbone_depth=backbone_depth,
            backbone_heads=backbone_heads,
            dim=dim,
            num_depth_candidates=num_depth_candidates,
            dpt_features=dpt_features,
            blocks=init_blocks,
            heads=heads,
            knn_k=knn_k,
            sh_degree=sh_degree,
            scale_factor=scale_factor,
            max_scale=max_scale,
            opacity_bias=opacity_bias,
        )
        self.extractor = FrozenFeatureExtractor(
            feature_extractor, weights=feature_weights, out_indices=tuple(feature_levels)
        )
        self.updater = RecurrentUpdate(
            dim=dim,
            error_channels=self.extractor.out_channels + 3 * DOWNSAMPLE**2,
            sh_degree=sh_degree,
            blocks=update_blocks,
            error_blocks=error_blocks,
            heads=heads,
            knn_k=knn_k,
            global_attention=update_global_attention,
        )
        if init_checkpoint:
            self.load_init_checkpoint(init_checkpoint)

    # ------------------------------------------------------------------ weights
    def load_init_checkpoint(self, location: str | os.PathLike) -> None:
        """Load a trained initial model strictly into ``self.init_model``.

        Args:
            location: a Lightning ``.ckpt``, a ``.safetensors`` file, a ``save_pretrained`` folder
                (or ``local-dir:``/``hf-hub:`` location) of a ReSplat model, or of the initial
                model alone.

        Raises:
            PretrainedError: unreadable weights, or keys/shapes that do not match the initial model.
        """
        state, path = read_weights(location, "resplat")
        state = sub_state_dict(state, "init_model.") or state  # a whole ReSplat, or its init
        load_state_dict_strict(self.init_model, state, path, "ReSplat initial model")

    def freeze_initial_model(self, frozen: bool = True) -> None:
        """Freeze the initial model (ReSplat's refinement stage): no gradients, eval mode, and
        its forward runs without autograd."""
        self.freeze_init = frozen
        self.init_model.requires_grad_(not frozen)
        self.train(self.training)

    def train(self, mode: bool = True) -> ReSplat:
        super().train(mode)
        if self.freeze_init:
            self.init_model.eval()
        return self

    # ------------------------------------------------------------------ error signal
    def error_features(
        self, rendered: Tensor, images: Tensor, image_features: Tensor | None = None
    ) -> Tensor:
        """Raw rendering error on the latent grid.

        Args:
            rendered: ``[B, V, 3, H, W]`` renders of the context views.
            images: ``[B, V, 3, H, W]`` the context images.
            image_features: ``extractor(images, (h, w))`` when already computed.

        Returns:
            ``[B, V, C_f + 48, h, w]``: frozen CNN feature difference (render minus input) and the
            pixel-unshuffled RGB difference. Exactly zero where the render equals the input.
        """
        h, w = _latent_shape(*images.shape[-2:])
        if image_features is None:
            image_features = self.extractor(images, (h, w))
        feature_error = self.extractor(rendered, (h, w)) - image_features
        rgb_error = F.pixel_unshuffle((rendered - images).flatten(0, 1), DOWNSAMPLE)
        rgb_error = rgb_error.reshape(*images.shape[:2], *rgb_error.shape[1:])
        return torch.cat([feature_error, rgb_error], dim=2)

    # ------------------------------------------------------------------ forward
    def forward(
        self,
        context: dict[str, Tensor],
        *,
        iterations: int | None = None,
        max_gaussians: int | None = None,
    ) -> ModelOutput:
        """Predict Gaussians from posed context views.

        Args:
            context: ``image [B, V, 3, H, W]``, ``extrinsics [B, V, 4, 4]``, ``intrinsics
                [B, V, 3, 3]``, optional ``near``/``far`` ``[B, V]``.
            iterations: refinement iterations (``None``: the configured ``iterations``).
            max_gaussians: keep at most this many (the most opaque) Gaussians of the result.

        Returns:
            ``ModelOutput``: the last iteration's Gaussians, ``gaussians_per_iteration``
            (init first; the training recipe weighs their renders), ``depth`` ``[B, V, H, W]`` (the initial depth, upsampled), ``latent_depth``
            ``[B, V, h, w]`` and ``iterations``.
        """
        b, v, height, width = check_context(context, require_poses=True)
        h, w = _latent_shape(height, width)
        iterations = self.iterations if iterations is None else int(iterations)
        if iterations < 0:
            raise ValueError(f"iterations must be >= 0, got {iterations}")
        images = context["image"]
        extrinsics, intrinsics = context["extrinsics"], context["intrinsics"]
        near = context.get("near")
        far = context.get("far")
        near = images.new_full((b, v), self.near) if near is None else near
        far = images.new_full((b, v), self.far) if far is None else far

        with torch.set_grad_enabled(torch.is_grad_enabled() and not self.freeze_init):
            gaussians, state, latent_depth = self.init_model(
                images, extrinsics, intrinsics, near, far
            )
        per_iteration = [gaussians]
        if iterations > 0:
            with torch.no_grad():
                image_features = self.extractor(images, (h, w))
                # Latent pixels' rays, relative to view 0 at unit baseline (frame invariant).
                scene_extrinsics = normalize_scene(extrinsics)[0]
                rays = plucker_embedding(scene_extrinsics, intrinsics, (h, w))  # [B, V, 6, h, w]
            raw = encode_gaussians(gaussians)
            for _ in range(iterations):
                raw = raw.detach()
                current = per_iteration[-1].detach()
                with torch.no_grad():
                    rendered = render(
                        current,
                        extrinsics,
                        intrinsics,
                        (height, width),
                        backend=self.render_backend,
                    ).color
                    error = self.error_features(rendered, images, image_features)
                raw, state = self.updater(raw, state, error, rays)
                per_iteration.append(decode_gaussians(raw, self.sh_degree))

        final = per_iteration[-1]
        if max_gaussians is not None:
            final = final.prune(max_count=max_gaussians)
        depth = F.interpolate(
            latent_depth.flatten(0, 1)[:, None],
            size=(height, width),
            mode="bilinear",
            align_corners=False,
        )
        return ModelOutput(
            final,
            depth=depth.reshape(b, v, height, width),
            gaussians_per_iteration=per_iteration,
            diagnostics={"latent_depth": latent_depth, "iterations": iterations},
        )


# Inference knobs (models.weights.knobs): the refinement iterations, and every family's max_gaussians. The
# initial model (backbone, depth, initial set) does not depend on them and is reused.
INFERENCE_KNOBS = (
    Knob(
        "iterations",
        "int",
        low=0,
        high=16,
        step=1,
        sweep=(0, 1, 2, 4),
        default_attr="iterations",
        help="recurrent refinement steps driven by the rendering error on the input views "
        "(0: the initial set); the count stays the same, the fit improves",
    ),
    MAX_GAUSSIANS,
)
KNOB_FREE_MODULES = ("init_model",)

# ---------------------------------------------------------------------- registry
_TINY = dict(
    vit_size="tiny",
    image_size=64,
    dim=64,
    dpt_features=64,
    init_blocks=2,
    update_blocks=2,
    error_blocks=1,
    heads=4,
    knn_k=16,
    num_depth_candidates=64,
    sh_degree=1,
)
_SMALL = dict(
    vit_size="small",
    image_size=252,
    dim=128,
    dpt_features=128,
    init_blocks=4,
    update_blocks=4,
    error_blocks=2,
    heads=4,
    knn_k=16,
    num_depth_candidates=128,
    sh_degree=2,
)
_BASE = dict(
    vit_size="base",
    image_size=252,
    dim=192,
    dpt_features=192,
    init_blocks=6,
    update_blocks=6,
    error_blocks=2,
    heads=6,
    knn_k=16,
    num_depth_candidates=128,
    sh_degree=2,
)


@register_model
def resplat_tiny(**kwargs) -> ReSplat:
    """ReSplat with the tiny multi-view ViT (64x64 synthetic scale, CPU-trainable)."""
    return ReSplat(**{**_TINY, **kwargs})


@register_model
def resplat_vit_small(**kwargs) -> ReSplat:
    """ReSplat with a ViT-S/14 backbone (DINOv2 shape; ``pretrained_backbone=True`` loads it)."""
    return ReSplat(**{**_SMALL, **kwargs})


@register_model
def resplat_vit_base(**kwargs) -> ReSplat:
    """ReSplat with a ViT-B/14 backbone (DINOv2 shape; ``pretrained_backbone=True`` loads it)."""
    return ReSplat(**{**_BASE, **kwargs})


register_pretrained_cfgs(
    synthetic64_cfg(
        "resplat_tiny",
        "synthetic_resplat_init 15 min + synthetic_resplat 15 min (1,150 + 858 steps); 2 iterations",
        pose_free=False,
        psnr=19.31,
        ssim=0.547,
    )
)
