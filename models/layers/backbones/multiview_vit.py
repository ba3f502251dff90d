"""A multi-view ViT backbone with alternating per-frame and global attention.

The parameters that a plain ViT has keep timm's DINOv2 names (``patch_embed.proj``, ``cls_token``,
``pos_embed``, ``blocks.N.{norm1,attn.qkv,attn.proj,ls1,norm2,mlp.fc1,mlp.fc2,ls2}``, ``norm``), so
DINOv2 weights from timm load into it unchanged. On top of that, as in VGGT and Depth Anything 3:

- blocks alternate between *frame* attention (each view's tokens attend only within that view) and
  *global* attention (all views' tokens attend to each other); which blocks are global is a
  constructor choice, the blocks' weights are the same kind either way;
- a learned reference-view embedding is added to every token of view 0, so pose-free models know
  which frame is the reference;
- optional camera conditioning: per-pixel Plücker rays (direction, moment) are patchified by a
  convolution and added to the patch tokens when poses are known.

Any number of views (1..N) runs through one model; the image size may differ from ``image_size``
(the position embedding is resampled, images whose sides are not multiples of the patch size are
resized to the nearest multiple).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from einops import rearrange
from timm.layers import PatchEmbed, resample_abs_pos_embed, resample_patch_embed, trunc_normal_
from timm.models.vision_transformer import Block
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from models.geometry.cameras import plucker_embedding

__all__ = [
    "BackboneOutput",
    "MultiViewTransformer",
    "VIT_SIZES",
    "default_out_layers",
]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

# Architecture of each size. ``timm_name`` is the timm model whose pretrained weights
# ``pretrained_backbone=True`` loads; ``timm_arch`` is the timm architecture a local weight file is
# read through (it is built with this size's exact hyper-parameters, so tiny works too).
VIT_SIZES: dict[str, dict] = {
    "tiny": dict(
        embed_dim=128,
        depth=6,
        num_heads=4,
        patch_size=8,
        image_size=64,
        init_values=None,
        timm_name=None,
        timm_arch="vit_small_patch14_dinov2",
    ),
    "small": dict(
        embed_dim=384,
        depth=12,
        num_heads=6,
        patch_size=14,
        image_size=252,
        init_values=1e-5,
        timm_name="vit_small_patch14_dinov2.lvd142m",
        timm_arch="vit_small_patch14_dinov2",
    ),
    "base": dict(
        embed_dim=768,
        depth=12,
        num_heads=12,
        patch_size=14,
        image_size=252,
        init_values=1e-5,
        timm_name="vit_base_patch14_dinov2.lvd142m",
        timm_arch="vit_base_patch14_dinov2",
    ),
    "large": dict(
        embed_dim=1024,
        depth=24,
        num_heads=16,
        patch_size=14,
        image_size=252,
        init_values=1e-5,
        timm_name="vit_large_patch14_dinov2.lvd142m",
        timm_arch="vit_large_patch14_dinov2",
    ),
}

# Parameter names of a plain timm ViT (the part that pretrained weights fill).
_VIT_PREFIXES = ("cls_token", "pos_embed", "patch_embed.", "blocks.", "norm.")
# Keys of a timm checkpoint that have no counterpart here (classifier bits).
_IGNORED_PREFIXES = ("head.", "fc_norm.", "head_drop.")


def default_out_layers(depth: int, count: int = 4) -> list[int]:
    """``count`` evenly spaced block indices ending at the last block (DPT's choice).

    ``depth=12`` gives ``[2, 5, 8, 11]`` (Depth Anything's ViT-S/B layers).
    """
    count = min(count, depth)
    return sorted({(depth * (i + 1)) // count - 1 for i in range(count)})


@dataclass
class BackboneOutput:
    """What ``MultiViewTransformer.forward`` returns.

    Attributes:
        features: one tensor per ``out_layers`` entry, patch tokens ``[B, V, h*w, C]`` after the
            final norm (row-major over the ``h x w`` patch grid).
        cls_tokens: the matching class tokens ``[B, V, C]``.
        grid_size: ``(h, w)`` patch grid.
        input_size: ``(H', W')`` the resolution the patches were cut from (``H, W`` rounded to
            multiples of the patch size).
    """

    features: list[Tensor]
    cls_tokens: list[Tensor]
    grid_size: tuple[int, int]
    input_size: tuple[int, int]


class MultiViewTransformer(nn.Module):
    """ViT over several views with alternating frame / global attention.

    Args:
        vit_size: ``"tiny"``, ``"small"``, ``"base"`` or ``"large"`` (ViT-S/B/L are DINOv2 shapes).
        image_size: training resolution (square int or ``[H, W]``); sets the stored position
            embedding grid. ``None``: the size's default.
        patch_size: ``None``: the size's default (8 for tiny, 14 otherwise).
        in_chans: image channels.
        embed_dim, depth, num_heads, init_values: override the size's defaults.
        mlp_ratio: MLP hidden width over ``embed_dim``.
        global_layers: indices of blocks with global (all-view) attention; the others attend
            within one view. ``None``: every odd block (frame, global, frame, global, ...).
        use_camera_tokens: add patchified Plücker ray embeddings to the patch tokens (needs
            extrinsics and intrinsics in ``forward``).
        out_layers: block indices whose (normed) outputs are returned. ``None``: four evenly
            spaced blocks ending at the last one.
        pretrained_backbone: ``False``; ``True`` for the size's DINOv2 weights from timm (needs
            internet once); a timm model name (``"vit_small_patch14_dinov2.lvd142m"``, prefix
            ``"timm:"`` optional); or a local weight file (``"file:/path.safetensors"`` or a path
            ending in ``.safetensors``/``.pth``/``.pt``/``.bin``) holding a timm ViT state dict of
            this size's architecture, read through timm's ``pretrained_cfg_overlay=dict(file=...)``.
        normalize_input: subtract the ImageNet mean and divide by its std (what DINOv2 expects);
            images come in as [0, 1].
        drop_path_rate: stochastic depth, linearly increasing over the blocks.
    """

    def __init__(
        self,
        vit_size: str = "tiny",
        *,
        image_size: int | Sequence[int] | None = None,
        patch_size: int | None = None,
        in_chans: int = 3,
        embed_dim: int | None = None,
        depth: int | None = None,
        num_heads: int | None = None,
        init_values: float | None | str = "default",
        mlp_ratio: float = 4.0,
        global_layers: Sequence[int] | None = None,
        use_camera_tokens: bool = False,
        out_layers: Sequence[int] | None = None,
        pretrained_backbone: bool | str = False,
        normalize_input: bool = True,
        drop_path_rate: float = 0.0,
    ) -> None:
        super().__init__()
        if vit_size not in VIT_SIZES:
            raise ValueError(f"vit_size must be one of {sorted(VIT_SIZES)}, got {vit_size!r}")
        spec = VIT_SIZES[vit_size]
        self.vit_size = vit_size
        self.embed_dim = embed_dim or spec["embed_dim"]
        self.depth = depth or spec["depth"]
        self.num_heads = num_heads or spec["num_heads"]
        self.patch_size = patch_size or spec["patch_size"]
        self.init_values = spec["init_values"] if init_values == "default" else init_values
        self.mlp_ratio = mlp_ratio
        self.in_chans = in_chans
        image_size = image_size if image_size is not None else spec["image_size"]
        img_hw = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
        self.image_size: tuple[int, int] = (int(img_hw[0]), int(img_hw[1]))
        self.grid_size: tuple[int, int] = (
            self.image_size[0] // self.patch_size,
            self.image_size[1] // self.patch_size,
        )
        if min(self.grid_size) < 1:
            raise ValueError(
                f"image_size {self.image_size} is smaller than patch_size {self.patch_size}"
            )
        if self.embed_dim % self.num_heads:
            raise ValueError(
                f"embed_dim {self.embed_dim} is not divisible by {self.num_heads} heads"
            )

        self._set_layers(global_layers, out_layers)
        self.use_camera_tokens = use_camera_tokens
        self.normalize_input = normalize_input
        self.grad_checkpointing = False
        self._build_vit(in_chans, mlp_ratio, drop_path_rate)
        self._build_multiview(use_camera_tokens)
        self._init_weights()
        self.pretrained_source: str | None = None
        if pretrained_backbone:
            self.load_pretrained_backbone(pretrained_backbone)

    def _set_layers(
        self, global_layers: Sequence[int] | None, out_layers: Sequence[int] | None
    ) -> None:
        """``global_layers`` (default: every second block from 1) and ``out_layers`` (default:
        ``default_out_layers``), sorted, each checked against the depth."""
        if global_layers is None:
            global_layers = range(1, self.depth, 2)
        self.global_layers: list[int] = sorted({int(i) for i in global_layers})
        if out_layers is None:
            out_layers = default_out_layers(self.depth)
        self.out_layers: list[int] = sorted({int(i) for i in out_layers})
        for name, layers in (
            ("global_layers", self.global_layers),
            ("out_layers", self.out_layers),
        ):
            bad = [i for i in layers if not 0 <= i < self.depth]
            if bad:
                raise ValueError(f"{name} {bad} out of range for depth {self.depth}")
        if not self.out_layers:
            raise ValueError("out_layers must name at least one block")

    def _build_vit(self, in_chans: int, mlp_ratio: float, drop_path_rate: float) -> None:
        """The plain-ViT part (DINOv2 names)."""
        self.patch_embed = PatchEmbed(
            img_size=self.image_size,  # timm's name
            patch_size=self.patch_size,
            in_chans=in_chans,
            embed_dim=self.embed_dim,
            strict_img_size=False,
        )
        self.cls_token = nn.Parameter(torch.zeros(1, 1, self.embed_dim))
        num_patches = self.grid_size[0] * self.grid_size[1]
        self.pos_embed = nn.Parameter(torch.zeros(1, 1 + num_patches, self.embed_dim))
        dpr = [drop_path_rate * i / max(1, self.depth - 1) for i in range(self.depth)]
        self.blocks = nn.ModuleList(
            Block(
                dim=self.embed_dim,
                num_heads=self.num_heads,
                mlp_ratio=mlp_ratio,
                qkv_bias=True,
                init_values=self.init_values,
                drop_path=dpr[i],
                norm_layer=partial(nn.LayerNorm, eps=1e-6),
            )
            for i in range(self.depth)
        )
        self.norm = nn.LayerNorm(self.embed_dim, eps=1e-6)

    def _build_multiview(self, use_camera_tokens: bool) -> None:
        """The multi-view additions: view 0's reference embedding, the camera-token embedding,
        the input normalisation."""
        self.ref_embed = nn.Parameter(torch.zeros(1, 1, self.embed_dim))  # view 0's tokens
        if use_camera_tokens:
            self.camera_embed = nn.Conv2d(
                6, self.embed_dim, kernel_size=self.patch_size, stride=self.patch_size
            )
        else:
            self.camera_embed = None
        self.register_buffer(
            "image_mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), persistent=False
        )
        self.register_buffer(
            "image_std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1), persistent=False
        )

    # ------------------------------------------------------------------ init / weights
    def _init_weights(self) -> None:
        trunc_normal_(self.pos_embed, std=0.02)
        nn.init.normal_(self.cls_token, std=1e-6)
        trunc_normal_(self.ref_embed, std=0.02)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                trunc_normal_(module.weight, std=0.02)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        if self.camera_embed is not None:
            # Same scale as the patch embedding (fan-in init); zeroed when pretrained weights load.
            nn.init.kaiming_uniform_(self.camera_embed.weight, a=5**0.5)
            nn.init.zeros_(self.camera_embed.bias)

    def timm_kwargs(self) -> dict:
        """Keyword arguments that make ``timm.create_model(<dinov2 arch>, ...)`` this architecture."""
        return dict(
            embed_dim=self.embed_dim,
            depth=self.depth,
            num_heads=self.num_heads,
            mlp_ratio=self.mlp_ratio,
            patch_size=self.patch_size,
            img_size=self.image_size,
            # timm.create_model drops None-valued kwargs; 0 also means "no LayerScale" there.
            init_values=self.init_values or 0.0,
            in_chans=self.in_chans,
            num_classes=0,
        )

    def vit_keys(self) -> list[str]:
        """State-dict keys of the plain-ViT part (the ones pretrained weights fill)."""
        return [k for k in self.state_dict() if k.startswith(_VIT_PREFIXES)]

    def load_pretrained_backbone(self, source: bool | str) -> None:
        """Fill the plain-ViT part from timm weights (see ``pretrained_backbone``).

        Raises:
            ValueError: for tiny with ``True`` (no public weights of that shape), or when the
                checkpoint's names or shapes do not match (strict).
        """
        import timm

        spec = VIT_SIZES[self.vit_size]
        overlay = None
        if source is True:
            if spec["timm_name"] is None:
                raise ValueError(
                    f"vit_size {self.vit_size!r} has no public pretrained weights; pass a weight file "
                    "('file:/path.safetensors') or use vit_size='small'|'base'|'large'"
                )
            name = spec["timm_name"]
            kwargs = self.timm_kwargs()
        elif isinstance(source, str):
            path = source.removeprefix("file:")
            is_file = source.startswith("file:") or path.endswith(
                (".safetensors", ".pth", ".pt", ".bin")
            )
            if is_file:
                path = os.path.expanduser(path)
                if not os.path.isfile(path):
                    raise FileNotFoundError(f"pretrained_backbone file not found: {path}")
                name = spec["timm_arch"]
                overlay = dict(file=path)
                kwargs = self.timm_kwargs()
            else:
                # A named timm model: its own architecture, our grid (timm resamples pos_embed).
                name = source.removeprefix("timm:")
                kwargs = dict(img_size=self.image_size, num_classes=0)
        else:
            raise TypeError(f"pretrained_backbone must be a bool or a str, got {type(source)}")
        reference = timm.create_model(
            name, pretrained=True, pretrained_cfg_overlay=overlay, **kwargs
        )
        self.load_vit_state_dict(reference.state_dict())
        self.pretrained_source = source if isinstance(source, str) else name

    def load_vit_state_dict(self, state_dict: dict[str, Tensor]) -> None:
        """Copy a timm ViT state dict into the plain-ViT part, strictly.

        The position embedding is resampled to this model's grid and the patch embedding to its
        patch size when they differ. The new modules (reference-view and camera embeddings) are
        zeroed, so the loaded network computes what the pretrained one did at the start.

        Raises:
            ValueError: listing missing or unexpected keys, or shape mismatches.
        """
        source = {k: v for k, v in state_dict.items() if not k.startswith(_IGNORED_PREFIXES)}
        own = self.state_dict()
        expected = set(self.vit_keys())
        missing = sorted(expected - set(source))
        unexpected = sorted(set(source) - expected)
        if missing or unexpected:
            raise ValueError(
                "pretrained ViT weights do not match the backbone: "
                f"missing {missing[:8]}{'...' if len(missing) > 8 else ''}, "
                f"unexpected {unexpected[:8]}{'...' if len(unexpected) > 8 else ''}"
            )
        converted: dict[str, Tensor] = {}
        for key, value in source.items():
            if key == "pos_embed" and value.shape != own[key].shape:
                value = resample_abs_pos_embed(
                    value, new_size=list(self.grid_size), num_prefix_tokens=1
                )
            elif key == "patch_embed.proj.weight" and value.shape != own[key].shape:
                value = resample_patch_embed(value, new_size=[self.patch_size, self.patch_size])
            if value.shape != own[key].shape:
                raise ValueError(
                    f"pretrained {key} has shape {tuple(value.shape)}, "
                    f"the backbone wants {tuple(own[key].shape)}"
                )
            converted[key] = value
        result = self.load_state_dict(converted, strict=False)
        assert not result.unexpected_keys, result.unexpected_keys
        with torch.no_grad():
            self.ref_embed.zero_()
            if self.camera_embed is not None:
                self.camera_embed.weight.zero_()
                self.camera_embed.bias.zero_()

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute block activations in the backward pass (saves memory for large models)."""
        self.grad_checkpointing = enable

    # ------------------------------------------------------------------ forward
    def patch_grid(self, height: int, width: int) -> tuple[int, int]:
        """Patch grid ``(h, w)`` used for an ``H x W`` input (sides rounded to patch multiples)."""
        p = self.patch_size
        return max(1, round(height / p)), max(1, round(width / p))

    def _position_embedding(self, grid: tuple[int, int]) -> Tensor:
        if grid == self.grid_size:
            return self.pos_embed
        return resample_abs_pos_embed(
            self.pos_embed, new_size=list(grid), old_size=list(self.grid_size), num_prefix_tokens=1
        )

    def forward(
        self,
        images: Tensor,
        extrinsics: Tensor | None = None,
        intrinsics: Tensor | None = None,
    ) -> BackboneOutput:
        """Encode ``images [B, V, C, H, W]`` (values in [0, 1]).

        Args:
            images: ``[B, V, C, H, W]``.
            extrinsics: ``[B, V, 4, 4]`` camera-to-world (needed with camera tokens).
            intrinsics: ``[B, V, 3, 3]`` normalised (needed with camera tokens).

        Returns:
            ``BackboneOutput`` with ``[B, V, h*w, C]`` features from ``out_layers``.
        """
        if images.ndim != 5:
            raise ValueError(f"images must be [B, V, C, H, W], got {tuple(images.shape)}")
        b, v, _, height, width = images.shape
        grid = self.patch_grid(height, width)
        input_size = (grid[0] * self.patch_size, grid[1] * self.patch_size)

        x = rearrange(images, "b v c h w -> (b v) c h w")
        if self.normalize_input:
            x = (x - self.image_mean) / self.image_std
        if input_size != (height, width):
            x = F.interpolate(
                x, size=input_size, mode="bilinear", align_corners=False, antialias=True
            )
        tokens = self.patch_embed(x)  # [BV, h*w, C]

        if self.camera_embed is not None:
            if extrinsics is None or intrinsics is None:
                raise ValueError("use_camera_tokens=True needs extrinsics and intrinsics")
            rays = plucker_embedding(extrinsics, intrinsics, input_size)  # [B, V, 6, H', W']
            rays = rearrange(rays, "b v c h w -> (b v) c h w").to(tokens.dtype)
            camera = self.camera_embed(rays)  # [BV, C, h, w]
            tokens = tokens + rearrange(camera, "n c h w -> n (h w) c")

        pos = self._position_embedding(grid)  # [1, 1 + h*w, C]
        cls = (self.cls_token + pos[:, :1]).expand(tokens.shape[0], -1, -1)
        x = torch.cat([cls, tokens + pos[:, 1:]], dim=1)  # [BV, T, C]
        x = rearrange(x, "(b v) t c -> b v t c", b=b, v=v)
        x = torch.cat([x[:, :1] + self.ref_embed, x[:, 1:]], dim=1)  # mark the reference view

        features: list[Tensor] = []
        cls_tokens: list[Tensor] = []
        global_set = set(self.global_layers)
        for index, block in enumerate(self.blocks):
            if index in global_set:
                x = self._run_block(block, rearrange(x, "b v t c -> b (v t) c"))
                x = rearrange(x, "b (v t) c -> b v t c", v=v)
            else:
                x = self._run_block(block, rearrange(x, "b v t c -> (b v) t c"))
                x = rearrange(x, "(b v) t c -> b v t c", b=b)
            if index in self.out_layers:
                normed = self.norm(x)  # [B, V, T, C]
                cls_tokens.append(normed[:, :, 0])
                features.append(normed[:, :, 1:])
            if index >= self.out_layers[-1]:
                break  # later blocks feed no output
        return BackboneOutput(
            features=features, cls_tokens=cls_tokens, grid_size=grid, input_size=input_size
        )

    def _run_block(self, block: nn.Module, x: Tensor) -> Tensor:
        if self.grad_checkpointing and torch.is_grad_enabled():
            return checkpoint(block, x, use_reentrant=False)
        return block(x)
