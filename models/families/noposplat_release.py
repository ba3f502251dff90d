"""NoPoSplat's released models (Ye et al., ICLR 2025; https://github.com/cvg/NoPoSplat), re-implemented.

A pose-free pixel-aligned model (family ``"pixel_aligned"``, beside the project's own
``noposplat_tiny``): one Gaussian per input pixel, placed directly in view 0's camera frame.

1. CroCo's two-stream ViT (``models.layers.backbones.croco_vit``) as in MASt3R (ViT-L encoder,
   ViT-B decoder, 2D rotary embeddings), each view's normalised intrinsics as one extra encoder
   token; view 0 decodes with ``dec_blocks``, the others with ``dec_blocks2``, each
   cross-attending to all other views;
2. per view, a DUSt3R point-map DPT (head 1 for view 0, head 2 for the others): the Gaussian
   means, in view 0's frame;
3. per view, a DPT of the Gaussian parameters (plus a 7x7 convolution of the image), 83 numbers
   per pixel: opacity ``sigmoid``; scales ``0.001 * softplus(x)`` capped at 0.3; a normalised
   quaternion (xyzw in the release, wxyz here); degree-4 SH with the higher bands damped by
   ``0.1 * 0.25^d`` (the release's ``sh_mask``), no colour added (colour = SH + 0.5).

Input images are normalised to [-1, 1] inside ``forward``. The released files are PyTorch
Lightning checkpoints ``{'state_dict': {'encoder.…': …}, 'epoch', 'global_step', ...}`` (the
model wrapper's only persistent tensors are the encoder's); ``checkpoint_filter_fn`` maps them.
The 2-view and the 3-view files share one architecture: the 2-view code is the multi-view code's
``V = 2`` case.
"""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from models.core.base import ModelOutput, SplatModel, check_context
from models.core.gaussians import Gaussians
from models.layers.backbones.croco_vit import (
    CroCoViT,
    GaussianParamHead,
    PointHead,
    dust3r_dpt_hooks,
)
from models.weights.builder import check_mapped_state, encoder_state_dict
from models.weights.input_recipe import InputRecipe
from models.weights.knobs import MAX_GAUSSIANS
from models.weights.pretrained_cfg import PretrainedCfg
from models.weights.registry import register_model, register_pretrained_cfgs

__all__ = [
    "NoPoSplatRelease",
    "checkpoint_filter_fn",
    "noposplat_vitl",
    "official_key_to_ours",
]

SH_DEGREE = 4
RAW_DIM = 1 + 3 + 4 + 3 * (SH_DEGREE + 1) ** 2  # opacity, scales, quaternion xyzw, SH: 83
INFERENCE_KNOBS = (MAX_GAUSSIANS,)
# the only knob (max_gaussians) prunes the finished set: every submodule's output is knob-free
KNOB_FREE_MODULES: tuple[str, ...] = (
    "backbone",
    "point_head1",
    "point_head2",
    "gaussian_head1",
    "gaussian_head2",
)
# NoPoSplatRelease.forward_seconds (models.core.budget announces it): the heads' work per input
# pixel (both DPTs of a view, the released widths; torch.utils.flop_counter on the released
# model: 2,753,024 at every size) and the rate fitted to forwards of the released size on this
# project's CPU (2 threads; docs/ports/noposplat.md, "Preflight estimate";
# tests/test_noposplat_budget.py holds the measurements).
HEAD_FLOPS_PER_PIXEL = 2.753e6
SECONDS_PER_FLOP = 1 / 90e9


def sh_band_gain(degree: int) -> Tensor:
    """``[(d+1)^2]``: 1 for the DC band, ``0.1 * 0.25^d`` for band ``d`` (the release's mask)."""
    gain = torch.ones((degree + 1) ** 2)
    for d in range(1, degree + 1):
        gain[d * d : (d + 1) ** 2] = 0.1 * 0.25**d
    return gain


class NoPoSplatRelease(SplatModel):
    """NoPoSplat's encoder: 2+ images (and their intrinsics) in, one Gaussian per pixel out, in
    view 0's camera frame.

    Args:
        enc_dim, enc_depth, enc_heads: ViT encoder (released: 1024, 24, 16).
        dec_dim, dec_depth, dec_heads: ViT decoder (released: 768, 12, 12); ``dec_depth`` >= 4.
        max_scale: cap of the scales (the release: 0.3).
        near, far: the rendering range reported with the output (the release's test loader:
            0.1 and 100, see the recipe).
    """

    family = "pixel_aligned"  # the method: NoPoSplat is a pixel-aligned model
    pose_free = True
    min_views = 2

    def __init__(
        self,
        *,
        enc_dim: int = 1024,
        enc_depth: int = 24,
        enc_heads: int = 16,
        dec_dim: int = 768,
        dec_depth: int = 12,
        dec_heads: int = 12,
        max_scale: float = 0.3,
        near: float = 0.1,
        far: float = 100.0,
    ) -> None:
        super().__init__()
        if dec_depth < 4:
            raise ValueError(f"dec_depth must be >= 4 (the DPTs read 4 layers), got {dec_depth}")
        self.max_scale, self.near, self.far = max_scale, near, far
        self.backbone = CroCoViT(
            enc_dim=enc_dim, enc_depth=enc_depth, enc_heads=enc_heads,
            dec_dim=dec_dim, dec_depth=dec_depth, dec_heads=dec_heads,
        )  # fmt: skip
        self.hooks = dust3r_dpt_hooks(dec_depth)
        self.point_head1 = PointHead(enc_dim, dec_dim)
        self.point_head2 = PointHead(enc_dim, dec_dim)
        self.gaussian_head1 = GaussianParamHead(enc_dim, dec_dim, RAW_DIM)
        self.gaussian_head2 = GaussianParamHead(enc_dim, dec_dim, RAW_DIM)
        self.register_buffer("sh_gain", sh_band_gain(SH_DEGREE), persistent=False)

    def forward(
        self, context: dict[str, Tensor], *, max_gaussians: int | None = None
    ) -> ModelOutput:
        """Reconstruct from ``context["image"] [B, V, 3, H, W]`` in [0, 1] and
        ``context["intrinsics"]`` (normalised); extrinsics are ignored. ``H`` and ``W`` must be
        multiples of 16.

        Returns:
            ``V * H * W`` Gaussians per scene (view-major, row-major pixels) in view 0's camera
            frame; ``points [B, V, H, W, 3]`` (the means as maps) in the diagnostics.
        """
        b, v, h, w = check_context(context, require_poses=False)
        p = self.backbone.patch_size
        if h % p or w % p:
            raise ValueError(f"context['image'] is {h}x{w}; NoPoSplat needs multiples of {p}")
        if context.get("intrinsics") is None:
            raise ValueError("NoPoSplat needs context['intrinsics'] (normalised, [B, V, 3, 3])")
        images = context["image"] * 2.0 - 1.0  # the release's normalisation (mean 0.5, std 0.5)
        layers = self.backbone(images, context["intrinsics"])
        grid = (h // p, w // p)
        points, raws = [], []
        for i in range(v):
            first = i == 0
            picked = [layers[k][:, i] for k in self.hooks]  # [B, h*w, C] each
            point_head = self.point_head1 if first else self.point_head2
            gaussian_head = self.gaussian_head1 if first else self.gaussian_head2
            points.append(point_head(picked, grid))  # [B, H, W, 3]
            raws.append(gaussian_head(picked, grid, images[:, i]))  # [B, 83, H, W]
        points = torch.stack(points, dim=1)  # [B, V, H, W, 3]
        raw = rearrange(torch.stack(raws, dim=1), "b v c h w -> b (v h w) c")
        gaussians = self._activate(raw, rearrange(points, "b v h w c -> b (v h w) c"))
        if max_gaussians is not None:
            gaussians = gaussians.prune(max_count=max_gaussians)
        return ModelOutput(gaussians, diagnostics={"points": points})

    def forward_flops(self, views: int, height: int, width: int) -> float:
        """Floating-point operations of one forward on ``views`` images of ``height x width``:
        the backbone's matrix products (2 x its parameters per token, one decoder stream per
        view; each view's cross-attention projects the other views' tokens), its attention
        (the encoder's within a view, the decoder's over all views) and the heads' per-pixel
        convolutions. Within 0.1 % of ``torch.utils.flop_counter`` at the released size."""
        backbone = self.backbone
        grid = (height // backbone.patch_size) * (width // backbone.patch_size)
        tokens = grid + (backbone.intrinsic_encoder is not None)  # per view
        all_tokens = views * tokens
        stream = sum(p.numel() for p in backbone.dec_blocks2.parameters())
        matmul = 2 * (sum(p.numel() for p in backbone.parameters()) - stream) * all_tokens
        dec_dim, dec_depth = backbone.dec_dim, backbone.dec_depth
        memory = 4 * dec_dim**2 * dec_depth * all_tokens * (views - 2)  # K, V of > 1 other view
        encoder = backbone.enc_dim * len(backbone.enc_blocks)
        attention = 4 * all_tokens * tokens * (encoder + dec_dim * dec_depth * views)
        return float(matmul + memory + attention + HEAD_FLOPS_PER_PIXEL * views * height * width)

    def forward_seconds(self, views: int, height: int, width: int) -> float:
        """Estimated seconds of one forward on this project's CPU (2 threads):
        :meth:`forward_flops` at the measured rate (``SECONDS_PER_FLOP``)."""
        return SECONDS_PER_FLOP * self.forward_flops(int(views), int(height), int(width))

    def _activate(self, raw: Tensor, means: Tensor) -> Gaussians:
        """``raw [B, N, 83]`` (the release's layout), ``means [B, N, 3]`` -> Gaussians."""
        opacity, scale, quat_xyzw, sh = raw.split([1, 3, 4, 3 * (SH_DEGREE + 1) ** 2], dim=-1)
        scales = (0.001 * F.softplus(scale)).clamp_max(self.max_scale)
        quat_xyzw = quat_xyzw / (quat_xyzw.norm(dim=-1, keepdim=True) + 1e-8)
        rotations = torch.cat([quat_xyzw[..., 3:], quat_xyzw[..., :3]], dim=-1)  # wxyz
        harmonics = rearrange(sh, "b n (c k) -> b n c k", c=3) * self.sh_gain
        return Gaussians(
            means=means,
            scales=scales,
            rotations=rotations,
            opacities=torch.sigmoid(opacity[..., 0]),
            harmonics=harmonics,
        )


# ----------------------------------------------------------------------------- official weights
# The official modules (after "encoder."): backbone.*, downstream_head{1,2}.dpt.* (point maps),
# gaussian_param_head{,2}.dpt.* (Gaussian parameters).
_HEADS = {
    "downstream_head1.dpt.": "point_head1.",
    "downstream_head2.dpt.": "point_head2.",
    "gaussian_param_head.dpt.": "gaussian_head1.",
    "gaussian_param_head2.dpt.": "gaussian_head2.",
}
# each head's own output stage (after the DPT): release name -> ours
_OUTPUT = {
    "point": {"head.0.": "conv1.", "head.2.": "conv2.", "head.4.": "conv3."},
    "gaussian": {"head.0.": "conv1.", "head.4.": "conv2.", "input_merger.0.": "image_conv."},
}
_ACT = re.compile(r"^act_postprocess\.(\d)\.(\d)\.(.+)$")
_RN = re.compile(r"^scratch\.layer_rn\.(\d)\.(.+)$")
_FUSION = re.compile(r"^scratch\.refinenet(\d)\.(resConfUnit[12]|out_conv)\.(.+)$")
_UNITS = {"resConfUnit1": "skip_unit", "resConfUnit2": "unit", "out_conv": "out_conv"}
# Keys of the release that its forward never reads: the CroCo pretraining mask token, the
# deepest fusion's skip unit (it has no skip input), and the DPTs' second name of each layer_rn
# convolution (``scratch.layer{i}_rn``, the same tensor as ``scratch.layer_rn.{i-1}``).
_UNUSED = re.compile(
    r"^(backbone\.mask_token"
    r"|[a-z_0-9]+\.dpt\.scratch\.refinenet4\.resConfUnit1\..+"
    r"|[a-z_0-9]+\.dpt\.scratch\.layer\d_rn\.weight)$"
)
_ALIAS = re.compile(r"^([a-z_0-9]+\.dpt\.scratch)\.layer(\d)_rn\.weight$")


def _dpt_key(rest: str, kind: str) -> str | None:
    """Our name (relative to the head) of a DPT parameter ``rest`` of the release."""
    match = _ACT.match(rest)
    if match:
        level, part, tail = int(match.group(1)), int(match.group(2)), match.group(3)
        if level == 2:  # the grid-resolution level: the projection alone
            return f"dpt.reassemble.2.{tail}" if part == 0 else None
        return f"dpt.reassemble.{level}.{part}.{tail}"
    match = _RN.match(rest)
    if match:
        return f"dpt.layer_rn.{match.group(1)}.{match.group(2)}"
    match = _FUSION.match(rest)
    if match:
        level = int(match.group(1)) - 1
        return f"dpt.fusion.{level}.{_UNITS[match.group(2)]}.{match.group(3)}"
    for old, new in _OUTPUT[kind].items():
        if rest.startswith(old):
            return new + rest[len(old) :]
    return None


def official_key_to_ours(key: str) -> str | None:
    """Map one official key (without ``encoder.``) to this module's name; ``None`` for a key
    this architecture has no place for (the unused keys included: see ``_UNUSED``)."""
    if key.startswith("backbone."):
        return None if _UNUSED.match(key) else key
    for prefix, ours in _HEADS.items():
        if key.startswith(prefix):
            kind = "point" if ours.startswith("point") else "gaussian"
            name = _dpt_key(key[len(prefix) :], kind)
            return None if name is None else ours + name
    return None


def checkpoint_filter_fn(checkpoint: dict, model: nn.Module) -> dict[str, Tensor]:
    """Map a released NoPoSplat file onto ``model``'s state dict.

    Accepts the release's Lightning checkpoint (``{'state_dict': {'encoder.…': …}, ...}``), its
    ``state_dict``, or the encoder's own state dict without the ``encoder.`` prefix. Every key is
    consumed: mapped, or one of the keys the release's forward never reads (``_UNUSED``; each
    ``layer{i}_rn`` must equal its ``layer_rn.{i-1}``, as in a file saved from the model).

    Raises:
        ValueError: one line saying what is wrong (not a NoPoSplat file, unknown keys, a file
            of another size, a truncated file).
    """
    bare = encoder_state_dict(checkpoint, "NoPoSplat")
    if not any(k.startswith("backbone.dec_blocks2.") for k in bare):
        raise ValueError("no 'encoder.backbone.dec_blocks2.*' keys: not a NoPoSplat checkpoint")
    if not any(k.startswith("gaussian_param_head") for k in bare):
        raise ValueError("no 'encoder.gaussian_param_head*' keys: not a NoPoSplat checkpoint")
    target = model.state_dict()
    mapped: dict[str, Tensor] = {}
    unknown = []
    for key, value in bare.items():
        alias = _ALIAS.match(key)
        if alias:
            twin = f"{alias.group(1)}.layer_rn.{int(alias.group(2)) - 1}.weight"
            if twin in bare and bare[twin].device.type != "meta":
                if not torch.equal(bare[twin], value):
                    raise ValueError(f"{key} differs from {twin} (one tensor in the release)")
        if _UNUSED.match(key):
            continue
        ours = official_key_to_ours(key)
        if ours is None or ours not in target:
            unknown.append(key)
            continue
        mapped[ours] = value
    return check_mapped_state(mapped, unknown, target, "NoPoSplat", "noposplat_* architecture")


# ----------------------------------------------------------------------------- registry
_HUB = "botaoye/NoPoSplat"
_COMMIT = "9b04307"
_REPO = "cvg/NoPoSplat"
_SOURCE = (
    "Ye, Liu, Xu, Zhou, Peng, Geiger, Pollefeys, Songyou: No Pose, No Problem: Surprisingly "
    f"Simple 3D Gaussian Splats from Sparse Unposed Images (ICLR 2025); github.com/{_REPO} "
    f"@ {_COMMIT}"
)
_LICENSE = (
    "no licence stated for the checkpoints (the Hub repository sets none; the README names "
    "none); NoPoSplat's code is MIT (LICENSE of cvg/NoPoSplat) and its backbone/head code "
    "CroCo/DUSt3R's, CC-BY-NC-SA-4.0. The network was initialised from MASt3R "
    "(MASt3R_ViTLarge_BaseDecoder_512_catmlpdpt_metric.pth: CC-BY-NC-SA-4.0, plus MASt3R's "
    "CHECKPOINTS_NOTICE: training-data terms, several non-commercial): treat the weights as "
    "CC-BY-NC-SA-4.0, non-commercial use only"
)
_CROP = "src/dataset/shims/crop_shim.py (rescale_and_crop: cover, centre crop, intrinsics)"
_POSES = (
    "config/dataset/base_dataset.yaml (make_baseline_1: true, relative_pose: true) and "
    "src/dataset/dataset_re10k.py (first-to-last context camera distance 1, poses relative to "
    "context view 0, near 0.1 / far 100 divided by that baseline)"
)


def _recipe(size: int, views: int, experiment: str, notes: str = "") -> InputRecipe:
    return InputRecipe(
        image_size=(size, size),
        multiple=16,
        resize="resize_crop",
        views=views,
        max_views=None,
        near=0.1,
        far=100.0,
        pose_scale="pose_free",
        source=f"{_REPO} {experiment}, {_POSES} and {_CROP} @ {_COMMIT}",
        notes=(
            "pose-free: predicts Gaussians in view 0's camera frame at the training scale "
            "(first-to-last context camera distance 1); intrinsics are an input. The loader's "
            "near/far are 0.1/100 in the dataset's units divided by the context baseline (so "
            "constant in the data's units); they bound rendering only. " + notes
        ).strip(),
    )


def _cfg(filename: str, train: str, recipe: InputRecipe, notes: str = "") -> PretrainedCfg:
    return PretrainedCfg(
        hf_hub_id=_HUB,
        hf_hub_filename=filename,
        file_format="official",
        license=_LICENSE,
        source=_SOURCE,
        train_data=train,
        input_size=recipe.image_size,
        views=recipe.views,
        pose_free=True,
        recipe=recipe,
        metrics={},
        metrics_source=None,
        notes=(
            "The authors evaluate with test-time target-pose optimisation (eval.py does the "
            "same for pose-free models). " + notes
        ).strip(),
    )


register_pretrained_cfgs(
    {
        "noposplat_vitl.re10k": _cfg(
            "re10k.ckpt", "RealEstate10K (256x256, 2 context views)",
            _recipe(256, 2, "config/experiment/re10k.yaml (config/dataset/re10k.yaml: "
                    "input_image_shape [256, 256] from 360x640)"),
        ),
        "noposplat_vitl.acid": _cfg(
            "acid.ckpt", "ACID (256x256, 2 context views)",
            _recipe(256, 2, "config/experiment/acid.yaml (roots datasets/acid, "
                    "input_image_shape [256, 256])"),
        ),
        "noposplat_vitl.mixRe10kDl3dv": _cfg(
            "mixRe10kDl3dv.ckpt", "RealEstate10K + DL3DV (256x256, 2 context views)",
            _recipe(256, 2, "config/experiment/re10k_dl3dv.yaml (input_image_shape [256, 256]; "
                    "DL3DV 270x480 frames)"),
        ),
        "noposplat_vitl.mixRe10kDl3dv_512x512": _cfg(
            "mixRe10kDl3dv_512x512.ckpt",
            "RealEstate10K 720p + DL3DV 960p (512x512, 2 context views)",
            _recipe(512, 2, "config/experiment/re10k_dl3dv_512x512.yaml (input_image_shape "
                    "[512, 512] from 720x1280 / 540x960)"),
        ),
        "noposplat_vitl.re10k_3views": _cfg(
            "re10k_3views.ckpt", "RealEstate10K (256x256, 3 context views)",
            _recipe(256, 3, "config/experiment/re10k_3view.yaml (encoder noposplat_multi, "
                    "backbone croco_multi, num_context_views 3)"),
        ),
    }
)  # fmt: skip


@register_model
def noposplat_vitl(**kwargs) -> NoPoSplatRelease:
    """NoPoSplat as released: MASt3R's ViT-L encoder / ViT-B decoder, DUSt3R point heads and
    Gaussian DPT heads (625 M parameters)."""
    return NoPoSplatRelease(**kwargs)
