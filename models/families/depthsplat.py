"""DepthSplat (Xu et al., CVPR 2025; https://github.com/cvg/depthsplat), re-implemented.

A posed pixel-aligned model (pixelSplat / MVSplat lineage): one Gaussian per input pixel, on the
pixel's ray at a depth predicted by a multi-view depth trunk (``models.layers.backbones.depth_trunk``):

1. monocular features: Depth Anything V2's DINOv2 ViT-S/B/L (blocks 2/5/8/11, or 4/11/17/23 for
   ViT-L), resampled to 1/8 of the image;
2. multi-view features: a residual CNN and a 6-block windowed cross-view transformer (UniMatch);
3. plane-sweep cost volumes over 128 inverse-depth candidates in ``[1/far, 1/near]`` (32 around the
   previous estimate at a second, finer scale), regressed by a cross-view-attention U-Net into a
   softmax over the candidates;
4. a DPT upsampler to full-resolution inverse depth (a residual on the bilinear upsampling);
5. a second DPT (the "feature upsampler") to full-resolution features, a 2-conv "Gaussian
   regressor" and a 2-conv head producing 37 raw numbers per pixel, activated by the shared
   ``GaussianHead``: opacity ``sigmoid``; a sub-pixel offset of the ray ``(sigmoid - 0.5)`` pixel;
   scales ``clamp(softplus(x - 4), 1e-10, 3)`` (world units, the 2025-04-27 release); a camera-frame
   quaternion and degree-2 SH (DC starting at the pixel colour) moved to the world by the camera
   rotation (``local_frame=True``).

The released files (``MODEL_ZOO.md`` of commit 1f5e548, 2025-04-27) are ``{'state_dict': {...}}``
with ``encoder.``-prefixed keys; ``checkpoint_filter_fn`` maps them onto this module. Files of the
2025-03-27 release (sigmoid scales scaled by depth and pixel size) are not supported.
"""

from __future__ import annotations

import dataclasses
import re

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from models.core.base import ModelOutput, SplatModel, check_context
from models.geometry.cameras import pixel_grid
from models.layers.backbones.depth_trunk import (
    DepthTrunk,
    depth_trunk_size,
    depthsplat_dpt,
    depthsplat_dpt_extras,
)
from models.layers.backbones.dpt import release_dpt_key
from models.layers.heads import GaussianHead, RayDepthPlacement
from models.weights.builder import check_mapped_state, encoder_state_dict
from models.weights.input_recipe import DL3DV_REFERENCE_DEPTH, RE10K_REFERENCE_DEPTH, InputRecipe
from models.weights.knobs import MAX_GAUSSIANS
from models.weights.pretrained_cfg import PretrainedCfg
from models.weights.registry import register_model, register_pretrained_cfgs

__all__ = [
    "DepthSplat",
    "checkpoint_filter_fn",
    "depthsplat_base",
    "depthsplat_large",
    "depthsplat_small",
    "depthsplat_tiny",
]

SH_DEGREE = 2
# forward keywords a user may turn at inference time: only the Gaussian budget
INFERENCE_KNOBS = (MAX_GAUSSIANS,)
RAW_DIM = 1 + 2 + 3 + 4 + 3 * (SH_DEGREE + 1) ** 2  # opacity, offset, scale, quaternion, SH


class DepthSplat(SplatModel):
    """DepthSplat's encoder: posed images in, one Gaussian per pixel out.

    Args:
        vit_size: Depth Anything V2 ViT size, ``"vits"``, ``"vitb"`` or ``"vitl"``; or ``"custom"``
            with ``vit_dim``/``vit_depth``/``vit_heads``/``mono_layers``/``dpt_*`` (test sizes).
        num_scales: cost-volume scales (1: small; 2: base and large).
        upsample_factor: image / last cost-volume resolution (2, 4 or 8).
        lowest_resolution: image / first cost-volume resolution (4 or 8).
        num_depth_candidates: inverse-depth candidates of the first scale.
        unet_dim: width of the first scale's U-Net.
        transformer_depth: blocks of the cross-view transformer.
        regressor_dim: channels of the Gaussian regressor.
        max_scale: upper clamp of the scales (the release: 3; its README suggests 0.1 for
            512x960 inputs).
        min_scale: lower clamp of the scales.
        near, far: depth range when the context has none (RealEstate10K's 0.5 / 100; DL3DV's
            far is 200).
        local_mv_match: with more than 3 views, each view matches its this many nearest views
            (by camera centre).
        vit_dim, vit_depth, vit_heads, mono_layers, dpt_depth_features, dpt_features,
            dpt_out_channels: ``vit_size="custom"`` only.
    """

    family = "pixel_aligned"  # the method: DepthSplat is a pixel-aligned model
    pose_free = False
    min_views = 2

    def __init__(
        self,
        *,
        vit_size: str = "vits",
        num_scales: int = 1,
        upsample_factor: int = 4,
        lowest_resolution: int = 4,
        num_depth_candidates: int = 128,
        unet_dim: int = 128,
        transformer_depth: int = 6,
        regressor_dim: int = 64,
        max_scale: float = 3.0,
        min_scale: float = 1e-10,
        near: float = 0.5,
        far: float = 100.0,
        local_mv_match: int = 2,
        vit_dim: int | None = None,
        vit_depth: int | None = None,
        vit_heads: int | None = None,
        mono_layers: list[int] | None = None,
        dpt_depth_features: int | None = None,
        dpt_features: int | None = None,
        dpt_out_channels: list[int] | None = None,
    ) -> None:
        super().__init__()
        if not 0 < near < far:
            raise ValueError(f"need 0 < near < far, got near={near}, far={far}")
        vit_spec, dpt, embed = depth_trunk_size(
            vit_size, vit_dim=vit_dim, vit_depth=vit_depth, vit_heads=vit_heads,
            mono_layers=mono_layers, dpt_depth_features=dpt_depth_features,
            dpt_features=dpt_features, dpt_out_channels=dpt_out_channels,
        )  # fmt: skip
        self.near, self.far = near, far
        self.local_mv_match = local_mv_match
        self.depth = DepthTrunk(
            vit_spec,
            num_scales=num_scales,
            upsample_factor=upsample_factor,
            lowest_resolution=lowest_resolution,
            num_depth_candidates=num_depth_candidates,
            unet_dim=unet_dim,
            transformer_depth=transformer_depth,
            mono_layers=tuple(mono_layers) if mono_layers is not None else None,
            dpt=dpt,
        )
        features = dpt["features"]
        self.feature_dpt = depthsplat_dpt(
            embed, features, dpt["out_channels"], self.depth.layout, with_depth=False
        )
        # [image, depth, match confidence, features] -> regressor
        self.regressor = nn.Sequential(
            nn.Conv2d(3 + 1 + 1 + features, regressor_dim, 3, padding=1),
            nn.GELU(),
            nn.Conv2d(regressor_dim, regressor_dim, 3, padding=1),
        )
        # [regressor output, image, features, match confidence] -> raw Gaussian parameters
        self.raw_head = nn.Sequential(
            nn.Conv2d(regressor_dim + 3 + features + 1, RAW_DIM, 3, padding=1,
                      padding_mode="replicate"),
            nn.GELU(),
            nn.Conv2d(RAW_DIM, RAW_DIM, 3, padding=1, padding_mode="replicate"),
        )  # fmt: skip
        with torch.no_grad():  # the release's initialisation: SH and scales start at zero
            self.raw_head[-1].weight[3:6].zero_()
            self.raw_head[-1].bias[3:6].zero_()
            self.raw_head[-1].weight[10:].zero_()
            self.raw_head[-1].bias[10:].zero_()
        self.gaussian_head = GaussianHead(
            None,
            RayDepthPlacement(offset_bound=1.0),
            sh_degree=SH_DEGREE,
            max_scale=max_scale,
            min_scale=min_scale,
            dc_from_color=True,
            local_frame=True,
        )

    def _depth_range(self, context: dict[str, Tensor], b: int, v: int, like: Tensor):
        out = []
        for key, default in (("near", self.near), ("far", self.far)):
            value = context.get(key)
            if value is None:
                value = torch.full((b, v), default, dtype=like.dtype, device=like.device)
            out.append(value.to(like.dtype))
        return out

    def _neighbours(self, extrinsics: Tensor) -> Tensor | None:
        """``[B, V, 1 + M]`` nearest views by camera centre (the view itself first), > 3 views."""
        if extrinsics.shape[1] <= 3:
            return None
        centres = extrinsics[:, :, :3, 3]
        order = torch.argsort(torch.cdist(centres, centres, p=2))
        return order[:, :, : self.local_mv_match + 1]

    def forward(
        self, context: dict[str, Tensor], *, max_gaussians: int | None = None
    ) -> ModelOutput:
        """Reconstruct from ``context`` (``image``, ``extrinsics``, ``intrinsics``, optional
        ``near``/``far`` ``[B, V]``); ``H`` and ``W`` must be multiples of ``lowest_resolution``
        times 4 (16 or 32) for the windowed attention and the U-Net.

        Returns:
            ``V * H * W`` Gaussians per scene (view-major, row-major pixels) in the frame of the
            given extrinsics; ``depth`` ``[B, V, H, W]``.
        """
        b, v, h, w = check_context(context, require_poses=True)
        if v < 2:
            raise ValueError("DepthSplat needs at least 2 context views")
        images = context["image"]
        extrinsics, intrinsics = context["extrinsics"], context["intrinsics"]
        near, far = self._depth_range(context, b, v, images)
        trunk = self.depth(images, intrinsics, extrinsics, near, far, self._neighbours(extrinsics))
        depth = trunk["depth"]  # [B, V, H, W]
        extras = depthsplat_dpt_extras(self.depth.layout, trunk["cnn"], trunk["match"])
        features = self.feature_dpt.fuse_maps(trunk["mono"], extras)  # [BV, F, H, W]
        confidence = trunk["match_prob"].amax(dim=1, keepdim=True)
        confidence = F.interpolate(confidence, size=(h, w), mode="nearest")  # [BV, 1, H, W]
        flat_images = images.flatten(0, 1)
        x = self.regressor(
            torch.cat([flat_images, depth.flatten(0, 1)[:, None], confidence, features], dim=1)
        )
        raw = self.raw_head(torch.cat([x, flat_images, features, confidence], dim=1))
        raw = rearrange(raw, "(b v) c h w -> b (v h w) c", b=b)  # [B, N, 37]
        opacity, offset, scale, quat_xyzw, sh = raw.split([1, 2, 3, 4, 3 * 9], dim=-1)
        quat_wxyz = torch.cat([quat_xyzw[..., 3:], quat_xyzw[..., :3]], dim=-1)
        # the head's layout: mean (2 offsets + unused), scale, rotation wxyz, opacity, SH
        raw_head = torch.cat(
            [offset, torch.zeros_like(opacity), scale, quat_wxyz, opacity, sh], dim=-1
        )[:, :, None]  # [B, N, 1, 38]
        n = v * h * w
        coords = pixel_grid((h, w), images.device, images.dtype).reshape(1, 1, h * w, 2)
        pixel_size = torch.tensor([1.0 / w, 1.0 / h], device=images.device, dtype=images.dtype)

        def per_pixel(t: Tensor) -> Tensor:  # [B, V, ...] -> [B, N, ...]
            return t[:, :, None].expand(b, v, h * w, *t.shape[2:]).reshape(b, n, *t.shape[2:])

        gaussians = self.gaussian_head.decode(
            raw_head,
            color=rearrange(images, "b v c h w -> b (v h w) c"),
            depth=depth.reshape(b, n),
            coords=coords.expand(b, v, h * w, 2).reshape(b, n, 2),
            pixel_size=pixel_size,
            intrinsics=per_pixel(intrinsics),
            extrinsics=per_pixel(extrinsics),
        )
        if max_gaussians is not None:
            gaussians = gaussians.prune(max_count=max_gaussians)
        return ModelOutput(gaussians, depth=depth)


# ----------------------------------------------------------------------------- official weights
# official key (after "encoder.") -> ours, applied in order; the first matching rule wins
_RULES: list[tuple[str, str]] = [
    # the monocular ViT keeps DINOv2's names
    (r"^depth_predictor\.pretrained\.", "depth.backbone."),
    # CNN
    (r"^depth_predictor\.backbone\.conv1\.", "depth.cnn.stem."),
    (r"^depth_predictor\.backbone\.conv2\.", "depth.cnn.proj."),
    (r"^depth_predictor\.backbone\.layer(\d)\.(\d)\.downsample\.0\.",
     r"depth.cnn.stage\1.\2.shortcut.0."),
    (r"^depth_predictor\.backbone\.layer(\d)\.", r"depth.cnn.stage\1."),
    # cross-view transformer
    (r"^depth_predictor\.transformer\.layers\.(\d+)\.cross_attn_ffn\.",
     r"depth.matcher.blocks.\1.cross_attn."),
    (r"^depth_predictor\.transformer\.layers\.(\d+)\.self_attn\.",
     r"depth.matcher.blocks.\1.self_attn."),
    # pyramids
    (r"^depth_predictor\.mv_pyramid\.", "depth.match_pyramid."),
    (r"^depth_predictor\.mono_pyramid\.", "depth.mono_pyramid."),
    # per-scale regressors
    (r"^depth_predictor\.regressor\.(\d+)\.0\.", r"depth.scales.\1.proj_in."),
    (r"^depth_predictor\.regressor\.(\d+)\.1\.", r"depth.scales.\1.norm_in."),
    (r"^depth_predictor\.regressor\.(\d+)\.3\.", r"depth.scales.\1.unet."),
    (r"^depth_predictor\.regressor\.(\d+)\.4\.", r"depth.scales.\1.proj_out."),
    (r"^depth_predictor\.regressor_residual\.(\d+)\.", r"depth.scales.\1.shortcut."),
    (r"^depth_predictor\.depth_head\.(\d+)\.", r"depth.scales.\1.depth_head."),
    # DPTs (models.layers.backbones.dpt.release_dpt_key maps the rest), the refiner's own head
    (r"^depth_predictor\.upsampler\.scratch\.output_conv\.", "depth.refiner_head."),
    (r"^depth_predictor\.upsampler\.", "depth.refiner."),
    (r"^feature_upsampler\.", "feature_dpt."),
    (r"^gaussian_regressor\.", "regressor."),
    (r"^gaussian_head\.", "raw_head."),
]  # fmt: skip
# inner renames, applied to the whole key after the prefix rules
_INNER: list[tuple[str, str]] = [
    # transformer layers
    (r"\.q_proj\.", ".q."), (r"\.k_proj\.", ".k."), (r"\.v_proj\.", ".v."),
    (r"\.merge\.", ".out."), (r"(attn)\.norm1\.", r"\1.norm."), (r"(attn)\.norm2\.", r"\1.mlp_norm."),
    # U-Net
    (r"\.unet\.input_blocks\.0\.0\.", ".unet.down.0.conv."),
    (r"\.unet\.input_blocks\.(\d+)\.0\.op\.", r".unet.down.\1.conv."),
    (r"\.unet\.input_blocks\.(\d+)\.0\.", r".unet.down.\1.res."),
    (r"\.unet\.input_blocks\.(\d+)\.1\.", r".unet.down.\1.attn."),
    (r"\.unet\.middle_block\.0\.", ".unet.mid.0."),
    (r"\.unet\.middle_block\.2\.", ".unet.mid.1."),
    (r"\.unet\.output_blocks\.(\d+)\.\d\.conv\.", r".unet.up.\1.upsample."),
    (r"\.unet\.output_blocks\.(\d+)\.0\.", r".unet.up.\1.res."),
    (r"\.unet\.output_blocks\.(\d+)\.1\.", r".unet.up.\1.attn."),
    (r"\.unet\.out\.0\.", ".unet.out_norm."),
    (r"\.unet\.out\.2\.", ".unet.out_conv."),
    (r"\.in_layers\.0\.", ".norm1."), (r"\.in_layers\.2\.", ".conv1."),
    (r"\.out_layers\.0\.", ".norm2."), (r"\.out_layers\.3\.", ".conv2."),
    (r"\.skip_connection\.", ".skip."), (r"\.attn\.proj_out\.", ".attn.proj."),
]  # fmt: skip
_DPT_HEADS = ("depth.refiner.", "feature_dpt.")  # DPTHead modules, named by release_dpt_key
_RULES_RE = [(re.compile(a), b) for a, b in _RULES]
_INNER_RE = [(re.compile(a), b) for a, b in _INNER]


def official_key_to_ours(key: str) -> str | None:
    """Map one official key (without ``encoder.``) to this module's name, ``None`` if unknown."""
    for pattern, repl in _RULES_RE:
        if pattern.search(key):
            key = pattern.sub(repl, key, count=1)
            break
    else:
        return None
    for head in _DPT_HEADS:
        if key.startswith(head):
            name = release_dpt_key(key[len(head) :])
            return None if name is None else head + name
    for pattern, repl in _INNER_RE:
        key = pattern.sub(repl, key)
    return key


def checkpoint_filter_fn(checkpoint: dict, model: nn.Module) -> dict[str, Tensor]:
    """Map a released DepthSplat file onto ``model``'s state dict.

    Accepts the release's ``{'state_dict': {'encoder.…': …}}`` (a Lightning checkpoint's
    ``state_dict``; the model wrapper holds no other persistent tensors: the decoder's background
    colour and the LPIPS loss are non-persistent buffers), the inner dict, or the encoder's own
    state dict without the ``encoder.`` prefix. Every key is consumed; nothing is dropped.

    Raises:
        ValueError: one line saying what is wrong (not a DepthSplat file, unknown keys, or a
            file of another size: the first mismatching shapes are named).
    """
    bare = encoder_state_dict(checkpoint, "DepthSplat")
    if not any(k.startswith("depth_predictor.") for k in bare):
        raise ValueError("no 'encoder.depth_predictor.*' keys: not a DepthSplat checkpoint")
    if not any(k.startswith("gaussian_head.") for k in bare):
        raise ValueError(
            "no 'encoder.gaussian_head.*' keys: a depth-only DepthSplat file, not a Gaussian one"
        )
    target = model.state_dict()
    mapped: dict[str, Tensor] = {}
    unknown = []
    for key, value in bare.items():
        ours = official_key_to_ours(key)
        if ours is None or ours not in target:
            unknown.append(key)
            continue
        mapped[ours] = value
    return check_mapped_state(mapped, unknown, target, "DepthSplat", "depthsplat_* architecture")


# ----------------------------------------------------------------------------- registry
_SMALL = dict(vit_size="vits", num_scales=1, upsample_factor=4, lowest_resolution=4)
_BASE = dict(vit_size="vitb", num_scales=2, upsample_factor=2, lowest_resolution=4)
_LARGE = dict(vit_size="vitl", num_scales=2, upsample_factor=2, lowest_resolution=4)
_BASE_448 = dict(upsample_factor=4, lowest_resolution=8)  # 256x448 / 448x768 files
_SMALL_768 = dict(upsample_factor=8, lowest_resolution=8)

_HUB = "haofeixu/depthsplat"
_SOURCE = "DepthSplat (Xu et al., CVPR 2025), https://github.com/cvg/depthsplat @ 1f5e548"
_METRICS_SOURCE = "authors' paper/README, not verified here"
_LICENSE_SMALL = (
    "MIT (DepthSplat code and weights); the monocular ViT-S comes from Depth Anything V2 "
    "Small, Apache-2.0"
)
_LICENSE_BASE_LARGE = (
    "MIT (DepthSplat code); the weights contain Depth Anything V2 ViT-{size} weights, "
    "CC-BY-NC-4.0 (non-commercial use only)"
)


_REPO = "cvg/depthsplat"
_COMMIT = "1f5e548"
_CROP = "src/dataset/shims/crop_shim.py (rescale_and_crop: cover, centre crop, intrinsics)"


def _recipe(size, multiple, views, max_views, far, sources: str, notes: str = "") -> InputRecipe:
    dl3dv = far > 100
    return InputRecipe(
        image_size=size,
        multiple=multiple,
        resize="resize_crop",
        views=views,
        max_views=max_views,
        near=0.5,
        far=far,
        pose_scale="dataset",
        reference_depth=DL3DV_REFERENCE_DEPTH if dl3dv else RE10K_REFERENCE_DEPTH,
        source=f"{_REPO} {sources} and {_CROP} @ {_COMMIT}",
        notes=notes
        or (
            "near/far in the dataset's own scale (make_baseline_1: false, "
            "baseline_scale_bounds: false)"
        ),
    )


_R_256 = _recipe(
    (256, 256), 16, 2, None, 100.0,
    "config/experiment/re10k.yaml (image_shape [256, 256], near 0.5, far 100, make_baseline_1 "
    "false, baseline_scale_bounds false)",
)  # fmt: skip
_R_256x448 = _recipe(
    (256, 448), 32, 2, None, 100.0,
    "config/experiment/re10k.yaml (near 0.5, far 100) with scripts/dl3dv_depthsplat_train.sh "
    "(dataset.image_shape=[256,448])",
)  # fmt: skip
_R_DL3DV_448 = dataclasses.replace(
    _recipe((256, 448), 32, 2, 6, 200.0, ""),
    source=(
        f"{_REPO} config/dataset/dl3dv.yaml (image_shape [270, 480], ori_image_shape [270, 480]),"
        " config/experiment/dl3dv.yaml (near 0.5, far 200, make_baseline_1 false, "
        "shim_patch_size 16), config/model/encoder/depthsplat.yaml (downscale_factor 4), "
        "src/model/encoder/encoder_depthsplat.py (get_data_shim: patch 16 x 4 = 64) and "
        "src/dataset/shims/patch_shim.py (centre crop to multiples of 64), "
        f"scripts/dl3dv_depthsplat_train.sh (DL3DV stage: min_views 2, max_views 6) @ {_COMMIT}"
    ),
    notes=(
        "trained and evaluated on DL3DV's 270x480 frames centre-cropped to 256x448 without "
        "resizing (the patch shim; the training script's image_shape [256,448] is its RE10K "
        "stage); near/far in the dataset's own scale (make_baseline_1: false)"
    ),
)  # fmt: skip
_R_768 = {
    views: _recipe(
        (448, 768), 32, views, most, 200.0,
        "config/experiment/dl3dv.yaml (near 0.5, far 200, make_baseline_1 false) and the "
        f"file's name (448x768, random {views}-{most} views)",
        "near/far in the dataset's own scale; the README renders this file at 512x960 with "
        "up to 12 views",
    )
    for views, most in ((2, 6), (4, 10))
}  # fmt: skip


def _cfg(
    filename: str,
    sha: str,
    license_: str,
    train: str,
    size,
    views,
    metrics=None,
    recipe: InputRecipe | None = None,
    **kw,
):
    return PretrainedCfg(
        recipe=recipe,
        hf_hub_id=_HUB,
        hf_hub_filename=filename,
        file_format="official",
        sha256_prefix=sha,
        arch_kwargs=kw,
        license=license_,
        source=_SOURCE,
        train_data=train,
        input_size=size,
        views=views,
        pose_free=False,
        metrics=metrics or {},
        metrics_source=_METRICS_SOURCE if metrics else None,
    )


register_pretrained_cfgs(
    {
        "depthsplat_small.re10k_256x256_view2": _cfg(
            "depthsplat-gs-small-re10k-256x256-view2-cfeab6b1.pth", "cfeab6b1", _LICENSE_SMALL,
            "RealEstate10K", (256, 256), 2, recipe=_R_256,
        ),
        "depthsplat_small.re10kdl3dv_448x768_randview4_10": _cfg(
            "depthsplat-gs-small-re10kdl3dv-448x768-randview4-10-c08188db.pth", "c08188db",
            _LICENSE_SMALL, "RealEstate10K 256x448, then RealEstate10K + DL3DV 448x768",
            (448, 768), 10, recipe=_R_768[4], far=200.0, **_SMALL_768,
        ),
        "depthsplat_base.re10k_256x256_view2": _cfg(
            "depthsplat-gs-base-re10k-256x256-view2-ca7b6795.pth", "ca7b6795",
            _LICENSE_BASE_LARGE.format(size="B"), "RealEstate10K", (256, 256), 2, recipe=_R_256,
        ),
        "depthsplat_base.re10k_256x448_view2": _cfg(
            "depthsplat-gs-base-re10k-256x448-view2-fea94f65.pth", "fea94f65",
            _LICENSE_BASE_LARGE.format(size="B"), "RealEstate10K", (256, 448), 2,
            recipe=_R_256x448, **_BASE_448,
        ),
        "depthsplat_base.dl3dv_256x448_randview2_6": _cfg(
            "depthsplat-gs-base-dl3dv-256x448-randview2-6-02c7b19d.pth", "02c7b19d",
            _LICENSE_BASE_LARGE.format(size="B"), "RealEstate10K, then DL3DV (2-6 views)",
            (256, 448), 6, recipe=_R_DL3DV_448, far=200.0, **_BASE_448,
        ),
        "depthsplat_base.re10kdl3dv_448x768_randview2_6": _cfg(
            "depthsplat-gs-base-re10kdl3dv-448x768-randview2-6-f8ddd845.pth", "f8ddd845",
            _LICENSE_BASE_LARGE.format(size="B"),
            "RealEstate10K 256x448, then RealEstate10K + DL3DV 448x768 (2-6 views)",
            (448, 768), 6, recipe=_R_768[2], far=200.0, **_BASE_448,
        ),
        "depthsplat_large.re10k_256x256_view2": _cfg(
            "depthsplat-gs-large-re10k-256x256-view2-e0f0f27a.pth", "e0f0f27a",
            _LICENSE_BASE_LARGE.format(size="L"), "RealEstate10K", (256, 256), 2,
            metrics={"re10k/psnr": 27.47}, recipe=_R_256,
        ),
    }
)  # fmt: skip


@register_model
def depthsplat_small(**kwargs) -> DepthSplat:
    """DepthSplat-S: DINOv2 ViT-S (Depth Anything V2 Small), one cost-volume scale (38.3 M)."""
    return DepthSplat(**{**_SMALL, **kwargs})


@register_model
def depthsplat_base(**kwargs) -> DepthSplat:
    """DepthSplat-B: DINOv2 ViT-B, two cost-volume scales (120.7 M)."""
    return DepthSplat(**{**_BASE, **kwargs})


@register_model
def depthsplat_large(**kwargs) -> DepthSplat:
    """DepthSplat-L: DINOv2 ViT-L, two cost-volume scales (354.3 M)."""
    return DepthSplat(**{**_LARGE, **kwargs})


@register_model
def depthsplat_tiny(**kwargs) -> DepthSplat:
    """A reduced DepthSplat for tests and CPU training (not released): a 4-block ViT of width 64,
    2 transformer blocks, 32 candidates, a 32-channel U-Net."""
    tiny = dict(
        vit_size="custom", vit_dim=64, vit_depth=4, vit_heads=2, mono_layers=[0, 1, 2, 3],
        dpt_depth_features=16, dpt_features=32, dpt_out_channels=[16, 32, 64, 64],
        num_scales=1, upsample_factor=4, lowest_resolution=4, num_depth_candidates=32, unet_dim=32,
        transformer_depth=2, regressor_dim=32, far=20.0,
    )  # fmt: skip
    return DepthSplat(**{**tiny, **kwargs})
