"""The pixel-aligned family: one (or ``gaussians_per_pixel``) Gaussian per input pixel.

Posed (pixelSplat / MVSplat / DepthSplat lineage): a multi-view ViT with camera (Plücker) tokens
and alternating frame / global attention, a DPT head to full-resolution features, per-pixel depth
from a softmax over ``num_depth_candidates`` inverse depths between ``1/far`` and ``1/near``
(MVSplat) plus a small residual refinement, then the shared ``GaussianHead`` with a
``RayDepthPlacement``: each Gaussian sits on its pixel's ray at the predicted depth, with a bounded
sub-pixel offset, and its scales are measured in pixel footprints at that depth.

Pose-free (``pose_free=True``, NoPoSplat-style): no pose tokens (optionally intrinsics-only ray
tokens); Gaussians are predicted directly in the first view's camera frame. Each view predicts a
depth map in its own frame and a 3D correction: view 0's anchor points are its pixels unprojected
at their depth (exact rays: view 0 is the scene frame); the other views' anchors are their own
unprojection plus the correction times the depth (together a point map in view 0's frame). The
head runs in ``anchor_offset`` mode around these anchors. The other views' cameras are recovered
by a rigid fit between their own-frame points and their view-0-frame anchors
(``ModelOutput.extrinsics``).
"""

from __future__ import annotations

import torch
from einops import rearrange, repeat
from torch import Tensor

from models.core.base import ModelOutput, SplatModel, check_context
from models.core.gaussians import Gaussians
from models.geometry.cameras import camera_directions, normalize_scene, pixel_grid
from models.geometry.similarity import umeyama
from models.layers.heads import AnchorOffsetPlacement, GaussianHead, RayDepthPlacement
from models.layers.pixel_trunk import PixelTrunk
from models.weights.knobs import MAX_GAUSSIANS
from models.weights.pretrained_cfg import synthetic64_cfg
from models.weights.registry import register_model, register_pretrained_cfgs

__all__ = [
    "PixelAligned",
    "pixel_aligned_tiny",
    "pixel_aligned_small",
    "pixel_aligned_base",
    "noposplat_tiny",
]


class PixelAligned(PixelTrunk, SplatModel):
    """Pixel-aligned Gaussian predictor (posed, or pose-free with ``pose_free=True``).

    Args:
        vit_size: ViT size of the backbone, ``"tiny"``, ``"small"``, ``"base"`` or ``"large"``.
        image_size: training resolution of the backbone's position embedding (other sizes work).
        patch_size: ``None`` for the size's default (8 tiny, 14 DINOv2 sizes).
        backbone_dim, backbone_depth, backbone_heads: override the size's ViT width, number of
            blocks and attention heads (``None``: the size's).
        global_layers: backbone blocks with all-view attention (``None``: every odd block).
        out_layers: backbone blocks fed to the DPT head (``None``: four evenly spaced ones).
        pretrained_backbone: ``False``, ``True`` (timm DINOv2 weights of ``vit_size``), a timm model
            name or a local weight file (``"file:/path.safetensors"``); see
            ``MultiViewTransformer``. Ignored by ``from_pretrained`` (the checkpoint holds all).
        pose_free: NoPoSplat-style; ignores extrinsics, predicts in view 0's camera frame.
        use_camera_tokens: posed: add Plücker ray tokens of the (view-0-relative) cameras.
        intrinsics_tokens: pose-free: add ray-direction tokens from the intrinsics alone.
        default_focal: pose-free without ``context["intrinsics"]``: assumed normalised focal
            length (principal point at the centre).
        dpt_features: width of the DPT fusion path.
        feature_dim: per-pixel feature channels out of the DPT head.
        shallow_dim: channels of the full-resolution image CNN concatenated in the DPT head.
        num_depth_candidates: inverse-depth candidates ``D`` of the depth softmax.
        near, far: depth range used when the context has no ``near``/``far``.
        depth_refine: add the residual depth refinement.
        refine_dim: hidden channels of the refinement.
        gaussians_per_pixel: Gaussians ``G`` per pixel (each with its own depth).
        sh_degree: SH degree of the colours.
        head_hidden_dim: hidden width of the Gaussian head MLP (``None``: linear).
        scale_factor: multiplier of ``softplus(x - 4)``. Scales are measured in pixel footprints
            (the head multiplies them by depth x pixel size at unit depth), so the default 30
            starts Gaussians at about half a pixel.
        max_scale: cap of the scale in pixel footprints.
        offset_bound: sub-pixel offset bound in pixels (posed); anchor offset bound in pixel
            footprints (pose-free).
        opacity_bias: initial opacity logit.
        drop_path_rate: backbone stochastic depth.
    """

    family = "pixel_aligned"

    def __init__(
        self,
        *,
        vit_size: str = "tiny",
        image_size: int = 64,
        patch_size: int | None = None,
        backbone_dim: int | None = None,
        backbone_depth: int | None = None,
        backbone_heads: int | None = None,
        global_layers: list[int] | None = None,
        out_layers: list[int] | None = None,
        pretrained_backbone: bool | str = False,
        pose_free: bool = False,
        use_camera_tokens: bool = True,
        intrinsics_tokens: bool = True,
        default_focal: float = 1.0,
        dpt_features: int = 48,
        feature_dim: int = 32,
        shallow_dim: int = 16,
        num_depth_candidates: int = 64,
        near: float = 1.0,
        far: float = 100.0,
        depth_refine: bool = True,
        refine_dim: int = 32,
        gaussians_per_pixel: int = 1,
        sh_degree: int = 1,
        head_hidden_dim: int | None = None,
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
        self.pose_free = pose_free  # instance attribute: shadows SplatModel.pose_free
        self.vit_size = vit_size
        self.default_focal = default_focal
        self.near = near
        self.far = far
        self.num_depth_candidates = num_depth_candidates
        self.gaussians_per_pixel = gaussians_per_pixel
        self.camera_tokens = intrinsics_tokens if pose_free else use_camera_tokens

        self.build_pixel_encoder(
            vit_size,
            image_size=image_size,
            patch_size=patch_size,
            backbone_dim=backbone_dim,
            backbone_depth=backbone_depth,
            backbone_heads=backbone_heads,
            global_layers=global_layers,
            out_layers=out_layers,
            camera_tokens=self.camera_tokens,
            pretrained_backbone=pretrained_backbone,
            drop_path_rate=drop_path_rate,
            dpt_features=dpt_features,
            feature_dim=feature_dim,
            shallow_dim=shallow_dim,
        )
        g = gaussians_per_pixel
        self.build_pixel_depth(
            feature_dim,
            num_depth_candidates,
            depths_per_pixel=g,
            refine_dim=refine_dim if depth_refine else None,
            point_head=pose_free,  # pose-free: starts at each view's own unprojection
        )
        self.gaussian_head = GaussianHead(
            feature_dim + g,
            AnchorOffsetPlacement(offset_bound) if pose_free else RayDepthPlacement(offset_bound),
            gaussians_per_location=g,
            sh_degree=sh_degree,
            hidden_dim=head_hidden_dim,
            scale_factor=scale_factor,
            max_scale=max_scale,
            opacity_bias=opacity_bias,
        )

    # ------------------------------------------------------------------ forward
    def _depth_range(
        self, context: dict[str, Tensor], shape: tuple[int, int], like: Tensor
    ) -> tuple[Tensor, Tensor]:
        """``near``, ``far`` ``[B, V]`` from the context, else the constructor's values."""
        out = []
        for key, default in (("near", self.near), ("far", self.far)):
            value = context.get(key)
            if value is None:
                value = torch.full(shape, default, dtype=like.dtype, device=like.device)
            out.append(value.to(like.dtype))
        return out[0], out[1]

    def _pose_free_gaussians(
        self,
        features: Tensor,
        head_in: Tensor,
        color: Tensor,
        depth_loc: Tensor,
        coords: Tensor,
        intr_loc: Tensor,
        scale_reference: Tensor,
        v: int,
    ) -> tuple[Gaussians, Tensor, Tensor]:
        """Pose-free: each view's own-frame points moved into view 0's frame by the point head.

        Returns the Gaussians, the anchors ``[B, N, 3]`` in view 0's frame (``N = V*H*W``) and
        each view's camera ``[B, V, 4, 4]`` (a rigid fit of its own-frame points to its anchors,
        no gradient; view 0 is the identity).
        """
        b = head_in.shape[0]
        dtype, device = head_in.dtype, head_in.device
        # Own-frame points, [B, V*H*W, G, 3] -> anchors in view 0's frame.
        rays = camera_directions(coords[:, :, None, :], intr_loc)  # [B, N, 1, 3], z = 1
        local = rays * depth_loc[..., None]  # [B, N, G, 3]
        # The correction is relative to the depth (scale-aware) and linear, so a zero-initialised
        # point head starts every view at its own unprojection and still gets gradients.
        correction = self.point_head(features)  # [BV, 3G, H, W]
        correction = rearrange(correction, "(b v) (g c) h w -> b v (h w) g c", b=b, v=v, c=3)
        keep = torch.ones(v, dtype=dtype, device=device)
        keep[0] = 0.0  # view 0 is the scene frame: its points stay on its rays
        correction = correction * keep[None, :, None, None, None]
        correction = rearrange(correction, "b v p g c -> b (v p) g c") * depth_loc[..., None]
        anchors = local + correction  # [B, N, G, 3] in view 0's frame
        # The head takes one anchor per location; extra Gaussians of a pixel share the
        # first anchor, each with its own bounded offset.
        gaussians = self.gaussian_head(
            head_in,
            color=color,
            anchors=anchors[:, :, 0],
            offset_scale=scale_reference,
            scale_reference=scale_reference,
        )
        with torch.no_grad():
            fitted = umeyama(
                rearrange(local[:, :, 0], "b (v p) c -> b v p c", v=v),
                rearrange(anchors[:, :, 0], "b (v p) c -> b v p c", v=v),
                scale=False,
            ).matrix()
            fitted[:, 0] = torch.eye(4, dtype=dtype, device=device)
        return gaussians, anchors[:, :, 0], fitted

    def forward(
        self, context: dict[str, Tensor], *, max_gaussians: int | None = None
    ) -> ModelOutput:
        """Predict Gaussians from the context views.

        Args:
            context: ``image [B, V, 3, H, W]``; posed: ``extrinsics [B, V, 4, 4]`` and
                ``intrinsics [B, V, 3, 3]``; optional ``near``/``far`` ``[B, V]``.
            max_gaussians: keep at most this many Gaussians per scene (the most opaque).

        Returns:
            ``ModelOutput`` with ``V * H * W * gaussians_per_pixel`` Gaussians (fewer when
            pruned), ``depth [B, V, H, W]`` (z-depth in each view's own frame; with
            several Gaussians per pixel, the first one's) and diagnostics ``depth_coarse`` (before the
            refinement); pose-free also ``points [B, V, H, W, 3]`` (anchors in view 0's frame),
            ``extrinsics [B, V, 4, 4]`` (a rigid fit of each view's own-frame points to its
            anchors, no gradient; view 0 is the identity) and the ``intrinsics`` used.
        """
        b, v, h, w = check_context(context, require_poses=not self.pose_free)
        images = context["image"]  # [B, V, 3, H, W]
        dtype, device = images.dtype, images.device
        intrinsics = context.get("intrinsics")
        if intrinsics is None:
            intrinsics = torch.tensor(
                [[self.default_focal, 0.0, 0.5], [0.0, self.default_focal, 0.5], [0.0, 0.0, 1.0]],
                dtype=dtype,
                device=device,
            ).expand(b, v, 3, 3)
        intrinsics = intrinsics.to(dtype)
        if self.pose_free:
            extrinsics = torch.eye(4, dtype=dtype, device=device).expand(b, v, 4, 4)
            token_extrinsics = extrinsics
        else:
            extrinsics = context["extrinsics"].to(dtype)
            # Camera tokens see poses relative to view 0 at unit baseline: frame invariant.
            token_extrinsics = normalize_scene(extrinsics)[0]

        features = self.pixel_features(
            images,
            (h, w),
            token_extrinsics if self.camera_tokens else None,
            intrinsics if self.camera_tokens else None,
        )  # [BV, C, H, W]
        near, far = self._depth_range(context, (b, v), images)
        pixel_depth = self.pixel_depth(features, near, far)
        depth, depth_coarse = pixel_depth.depth, pixel_depth.coarse  # [B, V, G, H, W]
        t = pixel_depth.inverse  # [BV, G, H, W]

        head_in = torch.cat([features, t], dim=1)  # [BV, C + G, H, W]
        head_in = rearrange(head_in, "(b v) c h w -> b (v h w) c", b=b, v=v)
        color = rearrange(images, "b v c h w -> b (v h w) c")
        depth_loc = rearrange(depth, "b v g h w -> b (v h w) g")
        coords = pixel_grid((h, w), device, dtype).reshape(1, h * w, 2)  # [1, HW, 2]
        coords = repeat(coords, "1 p c -> b (v p) c", b=b, v=v)
        pixel_size = torch.tensor([1.0 / w, 1.0 / h], dtype=dtype, device=device).view(1, 1, 2)
        # World size of one pixel at unit depth (mean of x and y), [B, V].
        footprint = 0.5 * (1.0 / (intrinsics[..., 0, 0] * w) + 1.0 / (intrinsics[..., 1, 1] * h))
        scale_reference = depth_loc[..., 0] * repeat(footprint, "b v -> b (v p)", p=h * w)
        intr_loc = repeat(intrinsics, "b v i j -> b (v p) i j", p=h * w)

        out_depth = depth[:, :, 0]  # [B, V, H, W]
        diagnostics: dict[str, Tensor] = {"depth_coarse": depth_coarse[:, :, 0]}
        fitted = out_intrinsics = None
        if not self.pose_free:
            gaussians = self.gaussian_head(
                head_in,
                color=color,
                depth=depth_loc,
                coords=coords,
                pixel_size=pixel_size,
                intrinsics=intr_loc,
                extrinsics=repeat(extrinsics, "b v i j -> b (v p) i j", p=h * w),
                scale_reference=scale_reference,
            )
        else:
            gaussians, points, fitted = self._pose_free_gaussians(
                features, head_in, color, depth_loc, coords, intr_loc, scale_reference, v
            )
            diagnostics["points"] = rearrange(points, "b (v h w) c -> b v h w c", v=v, h=h)
            out_intrinsics = intrinsics
        if max_gaussians is not None:
            gaussians = gaussians.prune(max_count=max_gaussians)
        return ModelOutput(
            gaussians,
            depth=out_depth,
            extrinsics=fitted,
            intrinsics=out_intrinsics,
            diagnostics=diagnostics,
        )


# Inference knobs (models.weights.knobs): one Gaussian per pixel; only max_gaussians (a prune of the result).
INFERENCE_KNOBS = (MAX_GAUSSIANS,)
KNOB_FREE_MODULES: tuple[str, ...] = ()

# ---------------------------------------------------------------------- registry entries
_TINY = dict(
    vit_size="tiny",
    image_size=64,
    dpt_features=48,
    feature_dim=32,
    shallow_dim=16,
    num_depth_candidates=64,
    sh_degree=1,
)
_SMALL = dict(
    vit_size="small",
    image_size=252,
    dpt_features=64,
    feature_dim=64,
    shallow_dim=32,
    num_depth_candidates=128,
    sh_degree=2,
    head_hidden_dim=64,
)
_BASE = dict(
    vit_size="base",
    image_size=252,
    dpt_features=128,
    feature_dim=64,
    shallow_dim=32,
    num_depth_candidates=128,
    sh_degree=2,
    head_hidden_dim=64,
)


@register_model
def pixel_aligned_tiny(**kwargs) -> PixelAligned:
    """Posed pixel-aligned model with a tiny multi-view ViT (CPU-trainable at 64x64)."""
    return PixelAligned(**{**_TINY, **kwargs})


@register_model
def pixel_aligned_small(**kwargs) -> PixelAligned:
    """Posed pixel-aligned model on a ViT-S/14 (DINOv2-compatible) backbone."""
    return PixelAligned(**{**_SMALL, **kwargs})


@register_model
def pixel_aligned_base(**kwargs) -> PixelAligned:
    """Posed pixel-aligned model on a ViT-B/14 (DINOv2-compatible) backbone."""
    return PixelAligned(**{**_BASE, **kwargs})


@register_model
def noposplat_tiny(**kwargs) -> PixelAligned:
    """Pose-free (NoPoSplat-style) pixel-aligned model with a tiny multi-view ViT."""
    return PixelAligned(**{**_TINY, "pose_free": True, **kwargs})


register_pretrained_cfgs(
    synthetic64_cfg(
        "pixel_aligned_tiny",
        "experiment=synthetic_pixel_aligned, 782 steps (30 min, one CPU thread)",
        pose_free=False,
        psnr=22.1,
        ssim=0.726,
    )
)
