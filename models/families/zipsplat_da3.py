"""ZipSplat's released model (``cvg/ZipSplat``, Apache-2.0) in the token-clustered family.

The release (arXiv 2606.05102; code at commit ``e1b592d``) reconstructs a scene from unposed
images at 252 x 252 in one forward pass:

1. **Backbone.** Depth Anything 3's multi-view ViT (``models.layers.backbones.da3_vit``) returns the
   ``[local ‖ global]`` tokens of three layers (giant: blocks 19, 29, 39). With a camera prior
   (optional, off by default) the DA3 camera encoder's tokens replace the learned camera tokens.
2. **Per-layer preparation.** Each half is LayerNormed (``pre_norm_local``/``pre_norm_global``)
   and the token is ``Linear([local ‖ global]) + (local + global) / 2`` (``downscale``).
3. **Clustering** on the deepest layer's tokens of all views together: ``K = max(1, int(r * N))``
   clusters (``r`` = ``compression``, truncated as the release does), release k-means
   (``models.layers.kmeans.kmeans_nearest_tokens``: 5 Lloyd iterations from the tokens at
   ``round(linspace(0, N - 1, K))``, deterministic), each centroid replaced by the index of its
   nearest token. ``K = N`` skips clustering.
4. **Scene tokens.** Start from the deepest layer's selected tokens; for each layer, deepest
   first, the layer's selected tokens read from all of its tokens through a
   ``models.layers.cross_attention.CrossAttentionBlock`` (q/k normalisation, no self-attention);
   what that block adds to its queries is added to the scene tokens, which then pass a
   self-attention block. Heads of width 64, per-channel branch gains.
5. **Colour skip.** A 14 x 14 patch embedding of the raw images (width 128), cross-attended at the
   same selected tokens (a full residual block, MLP ratio 1), concatenated to the scene tokens.
6. **Head.** ``Mlp(C -> 2C -> C)`` then the shared ``GaussianHead`` (one linear layer) decodes 32
   Gaussians per token: means ``sign(y) * expm1(|clamp(y, +-5)|)``, scales
   ``clamp(softplus(x - 4), 1e-6, 15)``, normalised quaternions (wxyz), ``sigmoid`` opacity, SH
   degree 1 stored coefficient-major ``[K, 3]`` (turned into this project's ``[3, K]``).

The release predicts **no cameras**: its Gaussians are in the camera frame of view 0 (OpenCV
axes), at the scale its training data was normalised to (not this project's unit-baseline
convention), so anything that renders a given camera must place it first (``infer.py`` and
``eval.py`` use the test-time pose fit of ``models.pipeline.pose_fit``).

Weights: ``checkpoint_filter_fn`` reads the release's ``.tar`` (``{'model', 'conf', 'epoch',
'eval'}``, unprefixed keys). The release loads it non-strictly; the only extra keys it names are
BatchNorm statistics (``*running_mean``/``*running_var``/``*num_batches_tracked``, which it drops
silently; this architecture has no BatchNorm, so the released file holds none) and a DDP
``module.`` prefix (stripped): this filter tolerates exactly those and refuses anything else.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

import torch
from einops import rearrange
from torch import Tensor, nn

from models.core.base import ModelOutput, SplatModel, check_context
from models.families.zipsplat import INFERENCE_KNOBS as _FAMILY_KNOBS
from models.layers.backbones.da3_vit import DA3_SIZES, Block, DA3Encoder, Mlp, PatchEmbed
from models.layers.cross_attention import CrossAttentionBlock
from models.layers.heads import FreeMeanPlacement, GaussianHead
from models.layers.kmeans import kmeans_nearest_tokens
from models.weights.input_recipe import InputRecipe
from models.weights.pretrained_cfg import PretrainedCfg
from models.weights.registry import register_model, register_pretrained_cfgs

__all__ = [
    "INFERENCE_KNOBS",
    "ZipSplatDA3",
    "checkpoint_filter_fn",
    "zipsplat_da3_tiny",
    "zipsplat_da3s",
    "zipsplat_da3b",
    "zipsplat_da3l",
    "zipsplat_da3g",
]

# Inference-time knobs (readable without building a model): the token-clustered family's.
INFERENCE_KNOBS = _FAMILY_KNOBS


def _gather(tokens: Tensor, index: Tensor) -> Tensor:
    """``tokens [B, N, C]`` at ``index [B, K]`` -> ``[B, K, C]``."""
    return torch.gather(tokens, 1, index[..., None].expand(-1, -1, tokens.shape[-1]))


class ZipSplatDA3(SplatModel):
    """ZipSplat's released architecture (see the module docstring).

    Args:
        vit_size: Depth Anything 3 ViT size, ``"small"``, ``"base"``, ``"large"`` or ``"giant"``
            (ZipSplat's ``configs/model/backbone/da3{s,b,l,g}.yaml``).
        embed_dim, depth, num_heads, out_layers, alt_start, ffn: override the size's backbone
            shape (the tiny test variant); ``None`` keeps the size's.
        patch_size: patch side (14 in DA3).
        pos_embed_size: side in pixels of the stored position-embedding grid (518 in DA3).
        image_size: the square input side the weights were trained at (252); any multiple of
            ``patch_size`` runs.
        color_dim: width of the colour skip.
        gaussians_per_token: Gaussians decoded per scene token.
        sh_degree: SH degree of the colours.
        fuse_layer_scale: initial LayerScale of the refinement blocks.
        compression: default cluster ratio in ``(0, 1]`` (the ``compression`` forward keyword
            overrides it).
        kmeans_iterations: Lloyd iterations.
        kmeans_chunk_size: rows per k-means distance block.
        camera_encoder: build DA3's camera encoder (the release has it; used with a camera prior).
    """

    family = "zipsplat"
    pose_free = True
    min_views = 1

    def __init__(
        self,
        *,
        vit_size: str = "giant",
        embed_dim: int | None = None,
        depth: int | None = None,
        num_heads: int | None = None,
        out_layers: list[int] | None = None,
        alt_start: int | None = None,
        ffn: str | None = None,
        patch_size: int = 14,
        pos_embed_size: int = 518,
        image_size: int = 252,
        color_dim: int = 128,
        gaussians_per_token: int = 32,
        sh_degree: int = 1,
        fuse_layer_scale: float = 0.01,
        compression: float = 1.0,
        kmeans_iterations: int = 5,
        kmeans_chunk_size: int = 2048,
        camera_encoder: bool = True,
    ) -> None:
        super().__init__()
        if vit_size not in DA3_SIZES:
            raise ValueError(f"vit_size must be one of {sorted(DA3_SIZES)}, got {vit_size!r}")
        if not 0.0 < compression <= 1.0:
            raise ValueError(f"compression must be in (0, 1], got {compression}")
        overrides = dict(
            embed_dim=embed_dim,
            depth=depth,
            num_heads=num_heads,
            out_layers=tuple(out_layers) if out_layers is not None else None,
            alt_start=alt_start,
            ffn=ffn,
        )
        overrides = {k: v for k, v in overrides.items() if v is not None}
        self.backbone = DA3Encoder(
            vit_size,
            camera_encoder=camera_encoder,
            patch_size=patch_size,
            pos_embed_size=pos_embed_size,
            **overrides,
        )
        dim = self.backbone.embed_dim
        layers = len(self.backbone.vit.out_layers)
        heads = max(1, dim // 64)
        self.vit_size = vit_size
        self.image_size = image_size
        self.patch_size = patch_size
        self.compression = compression
        self.kmeans_iterations = kmeans_iterations
        self.kmeans_chunk_size = kmeans_chunk_size
        self.gaussians_per_token = gaussians_per_token

        self.pre_norm_local = nn.ModuleList(nn.LayerNorm(dim) for _ in range(layers))
        self.pre_norm_global = nn.ModuleList(nn.LayerNorm(dim) for _ in range(layers))
        self.downscale = nn.ModuleList(nn.Linear(2 * dim, dim) for _ in range(layers))
        self.cross_attention = nn.ModuleList(
            CrossAttentionBlock(dim, heads, 4.0, fuse_layer_scale, False, qk_norm=True)
            for _ in range(layers)
        )
        self.self_attention = nn.ModuleList(
            Block(dim, heads, init_values=fuse_layer_scale, qk_norm=True) for _ in range(layers)
        )
        self.color_embed = PatchEmbed(patch_size, 3, color_dim)
        self.color_cross_attention = CrossAttentionBlock(
            color_dim, max(1, color_dim // 64), 1.0, fuse_layer_scale, False, qk_norm=True
        )
        head_dim = dim + color_dim
        self.head_mlp = Mlp(head_dim, 2 * head_dim, head_dim)
        self.gaussian_head = GaussianHead(
            head_dim,
            FreeMeanPlacement(math.expm1(5.0)),  # |y| clamped at log1p(expm1(5)) = 5 exactly
            gaussians_per_location=gaussians_per_token,
            sh_degree=sh_degree,
            hidden_dim=None,
            scale_factor=1.0,
            max_scale=15.0,
            min_scale=1e-6,
            dc_from_color=False,
            sh_layout="coefficient",
            sh_band_scale=False,
        )

    def _check_images(self, h: int, w: int) -> None:
        p = self.patch_size
        if h % p or w % p or h < p or w < p:
            raise ValueError(
                f"context['image'] is {h}x{w}: this ZipSplat (DA3 backbone) takes sides that "
                f"are positive multiples of {p} (the release runs at "
                f"{self.image_size}x{self.image_size}; resize or crop first)"
            )

    def _layer_tokens(self, layers: list[Tensor]) -> list[Tensor]:
        """One ``C``-wide token per patch and layer, all views in one sequence.

        The backbone hands over, per layer, each patch's view-local and cross-view features side
        by side (``[B, V, T, 2C]``). Both halves are normalised on their own; the token is their
        mean plus a learned linear map of the pair, so an untrained map starts from the mean.

        Args:
            layers: the chosen backbone layers, deepest first.

        Returns:
            ``[B, V*T, C]`` per layer (view-major), in the same order.
        """
        width = self.backbone.embed_dim
        merged = []
        parts = zip(layers, self.pre_norm_local, self.pre_norm_global, self.downscale)
        for pair, norm_view, norm_scene, mix in parts:
            in_view = norm_view(pair[..., :width])  # [B, V, T, C]
            across_views = norm_scene(pair[..., width:])
            mixed = mix(torch.cat([in_view, across_views], dim=-1))
            merged.append((mixed + (in_view + across_views) / 2).flatten(1, 2))  # [B, V*T, C]
        return merged

    def forward(
        self,
        context: dict[str, Tensor],
        *,
        compression: float | None = None,
        max_gaussians: int | None = None,
        camera_prior: bool = False,
    ) -> ModelOutput:
        """Predict Gaussians in the camera frame of context view 0.

        Args:
            context: ``image [B, V, 3, H, W]`` in [0, 1], sides multiples of the patch size;
                ``extrinsics``/``intrinsics`` are used only with ``camera_prior``.
            compression: cluster ratio ``r`` in ``(0, 1]`` (``None``: the configured default).
            max_gaussians: keep at most this many Gaussians per scene (the most opaque).
            camera_prior: feed the context cameras to DA3's camera encoder (the release's
                ``use_priors``); needs ``extrinsics`` and ``intrinsics``.

        Returns:
            ``ModelOutput`` with ``K * gaussians_per_token`` Gaussians (token-major) and diagnostics
            ``scene_token_index [B, K]`` (into the view-major token list), ``compression``,
            ``num_scene_tokens`` and ``camera_prior``.
        """
        r = self.compression if compression is None else float(compression)
        if not 0.0 < r <= 1.0:
            raise ValueError(f"compression must be in (0, 1], got {r}")
        b, v, h, w = check_context(context, require_poses=camera_prior)
        self._check_images(h, w)
        images = context["image"]
        cameras = (context["extrinsics"], context["intrinsics"]) if camera_prior else (None, None)
        features = self.backbone(images, *cameras)[::-1]  # deepest layer first
        layers = self._layer_tokens(features)  # [B, N, C] each
        n = layers[0].shape[1]
        k = max(1, int(n * r))
        if k >= n:
            k = n
            index = torch.arange(n, device=images.device).expand(b, n)
        else:
            _, index, _ = kmeans_nearest_tokens(
                layers[0], k, self.kmeans_iterations, self.kmeans_chunk_size
            )

        scene = _gather(layers[0], index)  # [B, K, C]
        for tokens, cross, self_attention in zip(layers, self.cross_attention, self.self_attention):
            scene = scene + cross(_gather(tokens, index), tokens, residual_only=True)
            scene = self_attention(scene)
        color = rearrange(self.color_embed(images.flatten(0, 1)), "(b v) t c -> b (v t) c", b=b)
        color = self.color_cross_attention(_gather(color, index), color)  # [B, K, C_color]
        features = self.head_mlp(torch.cat([scene, color], dim=-1))
        gaussians = self.gaussian_head(features)
        if max_gaussians is not None:
            gaussians = gaussians.prune(max_count=max_gaussians)
        diagnostics = {
            "scene_token_index": index,
            "compression": r,
            "num_scene_tokens": k,
            "camera_prior": bool(camera_prior),
        }
        return ModelOutput(gaussians, diagnostics=diagnostics)


# ---------------------------------------------------------------------- official weights
_RENAMES = (  # official prefix -> ours (every other key keeps its name)
    ("backbone.backbone.", "backbone.vit."),
    ("gaussian_head.gaussian_head.0.", "head_mlp."),
    ("gaussian_head.gaussian_head.1.", "gaussian_head.proj."),
)
# What the release's non-strict loader names and ignores: BatchNorm statistics (none in this
# architecture) and a DDP "module." prefix.
_TOLERATED_SUFFIXES = ("running_mean", "running_var", "num_batches_tracked")


# Inside the cross-attention blocks (``cross_attention.<i>.``, ``color_cross_attention.``) the
# release names the parts of this project's CrossAttentionBlock differently.
_BLOCK_PARTS = (  # official part -> ours
    ("norm_q.", "norm_query."),
    ("norm_kv.", "norm_memory."),
    ("attn.q_proj.", "cross.q."),
    ("attn.kv_proj.", "cross.kv."),
    ("attn.q_norm.", "cross.q_norm."),
    ("attn.k_norm.", "cross.k_norm."),
    ("attn.proj.", "cross.proj."),
    ("ls1.", "ls_cross."),
    ("norm2.", "norm_mlp."),
    ("ls2.", "ls_mlp."),
)
_BLOCK_PREFIX = re.compile(r"(color_cross_attention\.|cross_attention\.\d+\.)")


def _official_to_ours(key: str) -> str:
    for official, ours in _RENAMES:
        if key.startswith(official):
            return ours + key[len(official) :]
    block = _BLOCK_PREFIX.match(key)
    if block:
        part = key[block.end() :]
        for official, ours in _BLOCK_PARTS:
            if part.startswith(official):
                return block.group(0) + ours + part[len(official) :]
    return key


def checkpoint_filter_fn(checkpoint: Mapping, model: nn.Module) -> dict[str, Tensor]:
    """Map ZipSplat's release file (or its bare state dict) to this model's state dict.

    Args:
        checkpoint: what ``torch.load(path, weights_only=True)`` returned for
            ``zipsplat-da3g-252p.tar`` (``{'model', 'conf', 'epoch', 'eval'}``) or a state dict.
        model: the ``ZipSplatDA3`` to fill.

    Returns:
        Every parameter of ``model`` under its own name.

    Raises:
        ValueError: one line, when the file is not this release's format or not this size.
    """
    if not isinstance(checkpoint, Mapping):
        raise ValueError(f"not a ZipSplat release file: expected a dict, got {type(checkpoint)}")
    state = checkpoint
    for key in ("model", "state_dict"):
        if isinstance(checkpoint.get(key), Mapping):
            state = checkpoint[key]
            break
    if not state or not all(isinstance(v, Tensor) for v in state.values()):
        raise ValueError(
            "not a ZipSplat release file: no state dict of tensors under 'model' "
            f"(top-level keys: {sorted(map(str, checkpoint))[:6]})"
        )
    if all(k.startswith("module.") for k in state):
        state = {k[len("module.") :]: v for k, v in state.items()}
    if not any(k.startswith("backbone.backbone.") for k in state):
        raise ValueError(
            "not a ZipSplat release file: no 'backbone.backbone.*' (DA3 ViT) keys "
            f"(first keys: {sorted(state)[:3]})"
        )
    expected = model.state_dict()
    out, unknown = {}, []
    for key, value in state.items():
        if key.endswith(_TOLERATED_SUFFIXES):
            continue
        ours = _official_to_ours(key)
        if ours not in expected:
            unknown.append(key)
            continue
        if tuple(value.shape) != tuple(expected[ours].shape):
            raise ValueError(
                f"{key} has shape {tuple(value.shape)} but this model's {ours} is "
                f"{tuple(expected[ours].shape)}: the file is for another ZipSplat/DA3 size"
            )
        out[ours] = value
    missing = sorted(set(expected) - set(out))
    if unknown or missing:
        parts = []
        if unknown:
            parts.append(f"{len(unknown)} unexpected key(s), e.g. {sorted(unknown)[:3]}")
        if missing:
            parts.append(f"{len(missing)} missing key(s), e.g. {missing[:3]}")
        raise ValueError("file does not match this ZipSplat/DA3 architecture: " + "; ".join(parts))
    return out


register_pretrained_cfgs(
    {
        "zipsplat_da3g.re10k_dl3dv_252px": PretrainedCfg(
            hf_hub_id="veichta/zipsplat",
            hf_hub_filename="zipsplat-da3g-252p.tar",
            file_format="official",
            arch_kwargs={},
            # Read 2026-12-01: cvg/ZipSplat README "License" (e1b592d and the Hub-indexed copy);
            # ByteDance-Seed/Depth-Anything-3 README "Model Cards" table. The weights' own Hub
            # model card (huggingface.co/veichta/zipsplat) was not reachable from here.
            license=(
                "CC-BY-NC-4.0, non-commercial use only (the released weights, per cvg/ZipSplat's "
                "README; its code is Apache-2.0). Required by their inputs: initialised from "
                "Depth Anything 3 Giant (depth-anything/DA3-GIANT, CC-BY-NC-4.0; DA3-Large is "
                "CC-BY-NC-4.0 too, DA3-Base/Small are Apache-2.0) and trained on DL3DV-10K "
                "(CC-BY-NC-4.0). Full terms: the Hub model card veichta/zipsplat (not read here)"
            ),
            source="ZipSplat (arXiv 2606.05102), github.com/cvg/ZipSplat @ e1b592d",
            train_data="RealEstate10K + DL3DV (2-24 context views, 252 x 252)",
            input_size=(252, 252),
            views=None,
            pose_free=True,
            recipe=InputRecipe(
                image_size=(252, 252),
                multiple=14,
                resize="resize_crop",
                views=2,
                max_views=24,
                near=0.1,
                far=100.0,
                pose_scale="pose_free",
                source=(
                    "cvg/ZipSplat splatfactory/configs/data/composed_252.yaml (resize 252, "
                    "edge_divisible_by 14, aspect_ratio_range [1.0, 1.0], image_num_range [2, 24], "
                    "near 0.1, far 100, normalize_baseline false) and "
                    "splatfactory/configs/model/zipsplat.yaml (img_size 252) @ e1b592d"
                ),
                notes="pose-free: input poses only place the output",
            ),
            metrics={
                "re10k_6v/psnr": 26.20,
                "re10k_6v/ssim": 0.842,
                "re10k_6v/lpips": 0.158,
                "dl3dv_6v/psnr": 25.24,
                "dl3dv_6v/ssim": 0.804,
                "dl3dv_6v/lpips": 0.172,
                "dl3dv_12v/psnr": 24.27,
                "dl3dv_12v/ssim": 0.767,
                "dl3dv_12v/lpips": 0.197,
                "dl3dv_24v/psnr": 24.14,
                "dl3dv_24v/ssim": 0.768,
                "dl3dv_24v/lpips": 0.198,
            },
            metrics_source="authors' paper/README, not verified here",
            notes=(
                "1.45 B parameters; 32 Gaussians per scene token, SH degree 1; no cameras "
                "predicted (Gaussians in view 0's camera frame at the release's own scale)"
            ),
        )
    }
)


# ---------------------------------------------------------------------- registry entries
_TINY = dict(
    vit_size="small",
    embed_dim=64,
    depth=6,
    num_heads=2,
    out_layers=[3, 4, 5],
    alt_start=2,
    patch_size=8,
    pos_embed_size=64,
    image_size=64,
    color_dim=32,
    gaussians_per_token=4,
)


@register_model
def zipsplat_da3_tiny(**kwargs) -> ZipSplatDA3:
    """The release's architecture at test size (64 px, 8 px patches, width 64)."""
    return ZipSplatDA3(**{**_TINY, **kwargs})


@register_model
def zipsplat_da3s(**kwargs) -> ZipSplatDA3:
    """ZipSplat on Depth Anything 3 Small (ZipSplat's ``da3s`` config)."""
    return ZipSplatDA3(**{"vit_size": "small", **kwargs})


@register_model
def zipsplat_da3b(**kwargs) -> ZipSplatDA3:
    """ZipSplat on Depth Anything 3 Base (``da3b``)."""
    return ZipSplatDA3(**{"vit_size": "base", **kwargs})


@register_model
def zipsplat_da3l(**kwargs) -> ZipSplatDA3:
    """ZipSplat on Depth Anything 3 Large (``da3l``)."""
    return ZipSplatDA3(**{"vit_size": "large", **kwargs})


@register_model
def zipsplat_da3g(**kwargs) -> ZipSplatDA3:
    """ZipSplat on Depth Anything 3 Giant: the released model (1.45 B parameters)."""
    return ZipSplatDA3(**{"vit_size": "giant", **kwargs})
