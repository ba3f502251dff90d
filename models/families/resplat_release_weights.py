"""ReSplat's released files: their tags (``register_pretrained_cfgs``) and their keys.

The configs: one per file on the Hub (``haofeixu/resplat``), with the release scripts' input
recipes, licences and metrics. The keys -> ``models.families.resplat_release``'s names:

The release's point transformers interleave differently (``pt.blocks.i`` kNN blocks and
``pt.mv_blocks.i`` view attentions are our ``pt.blocks.2i`` and ``pt.blocks.2i+1``), name their
layers otherwise and fuse each kNN attention's ``q`` and ``kv`` projections; the depth trunk's keys
are DepthSplat's. The family's ``checkpoint_filter_fn`` applies these to a whole file.
"""

from __future__ import annotations

import re

from torch import Tensor

from models.families.depthsplat import official_key_to_ours as depthsplat_key
from models.weights.input_recipe import DL3DV_REFERENCE_DEPTH, RE10K_REFERENCE_DEPTH, InputRecipe
from models.weights.pretrained_cfg import PretrainedCfg
from models.weights.registry import register_pretrained_cfgs

__all__ = ["DL3DV_LAYOUT", "RE10K_LAYOUT", "official_key_to_ours", "split_fused_qkv"]

# the release's keys (after "encoder.") that are not the depth trunk keep their names here
_OWN_PREFIXES = ("gaussian_regressor.", "proj.", "pt.", "gaussian_head.", "update_proj.",
                 "update_rgb_error_proj.", "update_module.", "update_head.", "update_feature.",
                 "update_error_attn.")  # fmt: skip


# the release's point-layer names -> models.layers.point_transformer's (first match wins)
_KNN_BLOCK_NAMES = {"attn.proj.": "attn.out.", "mlp.fc1.": "mlp.0.", "mlp.fc2.": "mlp.2."}
_VIEW_ATTENTION_NAMES = {
    "attn.attn.proj.": "block.attn.out.",
    "attn.attn.": "block.attn.",
    "attn.norm": "block.norm",
    "attn.mlp.fc1.": "block.mlp.0.",
    "attn.mlp.fc2.": "block.mlp.2.",
}
# a kNN attention's fused projection: our q and kv rows (checkpoint_filter_fn splits it)
_FUSED_QKV = re.compile(r"(pt|update_module\.1)\.blocks\.\d+\.attn\.qkv\.weight")


def _rename(rest: str, names: dict[str, str]) -> str:
    for old, new in names.items():
        if rest.startswith(old):
            return new + rest[len(old) :]
    return rest


def _point_layer_key(key: str) -> str:
    """The release's point-transformer keys in the unified layout: the initial transformer's
    ``blocks.i`` (kNN) and ``mv_blocks.i`` (view attention) interleave as ``blocks.2i`` and
    ``blocks.2i+1``; other keys are unchanged."""
    if match := re.fullmatch(r"(pt|update_module\.1)\.blocks\.(\d+)\.(.+)", key):
        prefix, i, rest = match.groups()
        i = 2 * int(i) if prefix == "pt" else int(i)
        return f"{prefix}.blocks.{i}.{_rename(rest, _KNN_BLOCK_NAMES)}"
    if match := re.fullmatch(r"pt\.mv_blocks\.(\d+)\.(.+)", key):
        return f"pt.blocks.{2 * int(match[1]) + 1}.{_rename(match[2], _VIEW_ATTENTION_NAMES)}"
    if match := re.fullmatch(r"update_error_attn\.(\d+)\.(.+)", key):
        return f"update_error_attn.{match[1]}.{_rename(match[2], _VIEW_ATTENTION_NAMES)}"
    return key


def split_fused_qkv(key: str, value: Tensor) -> dict[str, Tensor]:
    """Our tensors of one mapped key: a kNN attention's fused ``attn.qkv.weight [3P, C]`` is our
    ``attn.q.weight [P, C]`` and ``attn.kv.weight [2P, C]``; any other key is itself."""
    if not _FUSED_QKV.fullmatch(key):
        return {key: value}
    p = value.shape[0] // 3
    base = key[: -len("qkv.weight")]
    return {base + "q.weight": value[:p], base + "kv.weight": value[p:]}


def official_key_to_ours(key: str) -> str | None:
    """One official key (without ``encoder.``) -> this module's name, ``None`` if unknown; a kNN
    attention's fused ``….attn.qkv.weight`` keeps that name and ``split_fused_qkv`` makes it ours.
    """
    if key.startswith("depth_predictor."):
        ours = depthsplat_key(key)
        return None if ours is None else "depth_predictor." + ours[len("depth.") :]
    if key.startswith(_OWN_PREFIXES):
        return _point_layer_key(key)
    return None


# ----------------------------------------------------------------------------- the files
# the architecture arguments of the DL3DV files and of the RE10K file
DL3DV_LAYOUT = dict(lowest_resolution=8, latent_downsample=4, gaussians_per_latent=1, far=200.0)
RE10K_LAYOUT = dict(lowest_resolution=4, latent_downsample=2, gaussians_per_latent=4, far=100.0)
_HUB = "haofeixu/resplat"
_SOURCE = (
    "ReSplat (Xu, Barath, Geiger, Pollefeys; arXiv 2510.08575), official code commit cc4594a "
    "('resplat release', 2026-03-24), https://github.com/baoxperceptionio/resplat"
)
_METRICS_SOURCE = "authors' release scripts (scripts/*.sh of cc4594a), not verified here"
_LICENSE = (
    "MIT (the ReSplat release's LICENSE covers its code and weights; author Haofei Xu); "
    "the weights contain a "
    "DINOv2 ViT-{size} initialised from Depth Anything V2 {da} ({da_licence}) through "
    "DepthSplat/UniMatch (MIT), and torchvision's ImageNet ResNet-18, whose weights carry no "
    "stated licence (unstated; torchvision's BSD-3-Clause covers its code)"
)
_LIC = {
    "S": _LICENSE.format(size="S", da="Small", da_licence="Apache-2.0"),
    "B": _LICENSE.format(size="B", da="Base", da_licence="CC-BY-NC-4.0: non-commercial use only"),
    "L": _LICENSE.format(size="L", da="Large", da_licence="CC-BY-NC-4.0: non-commercial use only"),
}


def _recipe(shape, views: int, script: str, notes: str = "") -> InputRecipe:
    """A release's input recipe: its experiment config's near/far (dataset scale) and the shape
    and views of its training script (``scripts/<script>.sh`` of cc4594a)."""
    re10k = script.startswith("re10k")
    experiment = "re10k" if re10k else "dl3dv"
    far = 100.0 if re10k else 200.0
    return InputRecipe(
        image_size=shape,
        multiple=32 if re10k else 64,
        resize="resize_crop",
        views=views,
        near=0.01,
        far=far,
        pose_scale="dataset",
        reference_depth=RE10K_REFERENCE_DEPTH if re10k else DL3DV_REFERENCE_DEPTH,
        source=(
            f"baoxperceptionio/resplat config/experiment/{experiment}.yaml (near 0.01, far "
            f"{far:g}, make_baseline_1 false, baseline_scale_bounds false) and "
            f"scripts/{script}.sh (image_shape, num_context_views) @ cc4594a"
        ),
        notes=notes or "near/far in the dataset's own scale",
    )


def _cfg(
    filename: str,
    size: str,
    train: str,
    input_size,
    views,
    metrics,
    recipe: InputRecipe | None = None,
    **kw,
) -> PretrainedCfg:
    return PretrainedCfg(
        recipe=recipe,
        hf_hub_id=_HUB,
        hf_hub_filename=filename,
        file_format="official",
        sha256_prefix=filename.rsplit("-", 1)[1].split(".")[0],
        arch_kwargs=kw,
        license=_LIC[size],
        source=_SOURCE,
        train_data=train,
        input_size=input_size,
        views=views,
        pose_free=False,
        metrics=metrics,
        metrics_source=_METRICS_SOURCE,
    )


register_pretrained_cfgs(
    {
        "resplat_small.dl3dv_256x448_view8": _cfg(
            "resplat-small-dl3dv-256x448-view8-548993fe.pth", "S", "DL3DV", (256, 448), 8,
            {"dl3dv/psnr@1it": 28.168, "dl3dv/psnr@2it": 28.727, "dl3dv/psnr@4it": 29.065,
             "dl3dv/ssim@4it": 0.902, "dl3dv/lpips@4it": 0.105},
            iterations=2, recipe=_recipe((256, 448), 8, "dl3dv_view8_256x448_small_refine"),
            **DL3DV_LAYOUT,
        ),
        "resplat_base.dl3dv_256x448_view8": _cfg(
            "resplat-base-dl3dv-256x448-view8-1934a04c.pth", "B", "DL3DV", (256, 448), 8,
            {"dl3dv/psnr@1it": 28.523, "dl3dv/psnr@2it": 28.959, "dl3dv/psnr@4it": 29.198,
             "dl3dv/ssim@4it": 0.904, "dl3dv/lpips@4it": 0.104},
            iterations=2, recipe=_recipe((256, 448), 8, "dl3dv_view8_256x448_base_refine"),
            **DL3DV_LAYOUT,
        ),
        "resplat_base.dl3dv_256x448_view16": _cfg(
            "resplat-base-dl3dv-256x448-view16-f38bf984.pth", "B", "DL3DV", (256, 448), 16,
            {"dl3dv16/psnr@4it": 29.017, "dl3dv16/ssim@4it": 0.901, "dl3dv16/lpips@4it": 0.105},
            iterations=4, recipe=_recipe((256, 448), 16, "dl3dv_view16_256x448_base_refine"),
            **DL3DV_LAYOUT,
        ),
        "resplat_base.dl3dv_256x448_view32": _cfg(
            "resplat-base-dl3dv-256x448-view32-439b63a6.pth", "B", "DL3DV", (256, 448), 32,
            {"dl3dv32/psnr@4it": 28.301, "dl3dv32/ssim@4it": 0.891, "dl3dv32/lpips@4it": 0.114},
            iterations=4, recipe=_recipe((256, 448), 32, "dl3dv_view32_256x448_base_refine"),
            **DL3DV_LAYOUT,
        ),
        "resplat_base.dl3dv_512x960_view8": _cfg(
            "resplat-base-dl3dv-512x960-view8-8179ed87.pth", "B", "DL3DV", (512, 960), 8,
            {"dl3dv/psnr@2it": 27.513, "dl3dv/psnr@4it": 27.698, "dl3dv/ssim@4it": 0.868,
             "dl3dv/lpips@4it": 0.160},
            iterations=2, recipe=_recipe((512, 960), 8, "dl3dv_view8_512x960_base_refine"),
            **DL3DV_LAYOUT,
        ),
        "resplat_base.dl3dv_540x960_view16": _cfg(
            "resplat-base-dl3dv-540x960-view16-a72dc6d0.pth", "B", "DL3DV", (540, 960), 16,
            {"dl3dv16/psnr@0it": 22.684, "dl3dv16/psnr@1it": 23.234, "dl3dv16/psnr@2it": 23.512},
            iterations=2, max_scale=3.0, depth_half_res=True,
            recipe=_recipe(
                (512, 960), 16, "dl3dv_view16_540x960_base_refine",
                "trained at 512x960 (from 540x960 frames); the release script tests at 540x960, "
                "which this port cannot take (sides must be multiples of 64): 512x960 here",
            ),
            **DL3DV_LAYOUT,
        ),
        "resplat_base.re10k_256x256_view2": _cfg(
            "resplat-base-re10k-256x256-view2-b90d1b53.pth", "B", "RealEstate10K", (256, 256), 2,
            {"re10k/psnr@0it": 29.06, "re10k/psnr@2it": 29.751, "re10k/ssim@2it": 0.912,
             "re10k/lpips@2it": 0.100, "acid_zero_shot/psnr@2it": 29.870},
            iterations=2, recipe=_recipe((256, 256), 2, "re10k_view2_256x256_base_refine"),
            **RE10K_LAYOUT,
        ),
        "resplat_large.dl3dv_256x448_view8": _cfg(
            "resplat-large-dl3dv-256x448-view8-62f1703a.pth", "L", "DL3DV", (256, 448), 8,
            {"dl3dv/psnr@0it": 27.861, "dl3dv/ssim@0it": 0.886, "dl3dv/lpips@0it": 0.121},
            iterations=0, recurrent_update=False,
            recipe=_recipe((256, 448), 8, "dl3dv_view8_256x448_large_init"), **DL3DV_LAYOUT,
        ),
    }
)  # fmt: skip
