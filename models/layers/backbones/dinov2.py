"""A plain DINOv2 ViT (patch 14, class token, LayerScale) built from timm's blocks.

Parameter names are DINOv2's own (``patch_embed.proj``, ``cls_token``, ``pos_embed``,
``blocks.N.{norm1,attn.qkv,attn.proj,ls1.gamma,norm2,mlp.fc1,mlp.fc2,ls2.gamma}``, ``norm``), so
Meta's and Depth Anything V2's checkpoints load unchanged. What differs from timm's
``VisionTransformer`` is the position-embedding resampling: DINOv2 resamples its 37x37 grid with
a bicubic ``scale_factor`` of ``(n + 0.1) / 37`` (no antialiasing), which gives slightly different
numbers from resampling to a target size; released models built on DINOv2 (Depth Anything V2,
DepthSplat) were trained with DINOv2's rule, so it is reproduced here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import partial

import torch
import torch.nn.functional as F
from timm.models.vision_transformer import Block
from torch import Tensor, nn

__all__ = ["DINOV2_SIZES", "DinoV2"]

# embed_dim, depth, heads of the released DINOv2 sizes (ViT-S/B/L/14)
DINOV2_SIZES: dict[str, tuple[int, int, int]] = {
    "vits": (384, 12, 6),
    "vitb": (768, 12, 12),
    "vitl": (1024, 24, 16),
}


class _PatchEmbed(nn.Module):
    """Non-overlapping patches by one strided convolution (``patch_embed.proj``)."""

    def __init__(self, patch_size: int, in_chans: int, embed_dim: int) -> None:
        super().__init__()
        self.proj = nn.Conv2d(in_chans, embed_dim, patch_size, stride=patch_size)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)  # [B, h*w, C]


class DinoV2(nn.Module):
    """DINOv2 ViT returning normalised patch tokens of chosen blocks.

    Args:
        embed_dim, depth, num_heads: ViT width, blocks and heads.
        patch_size: patch side in pixels.
        image_size: side of the square training grid of ``pos_embed`` (518 for DINOv2).
        interpolate_offset: DINOv2's position-embedding resampling offset.
    """

    def __init__(
        self,
        embed_dim: int = 384,
        depth: int = 12,
        num_heads: int = 6,
        *,
        patch_size: int = 14,
        image_size: int = 518,
        interpolate_offset: float = 0.1,
    ) -> None:
        super().__init__()
        self.embed_dim = embed_dim
        self.patch_size = patch_size
        self.interpolate_offset = interpolate_offset
        grid = image_size // patch_size
        self.patch_embed = _PatchEmbed(patch_size, 3, embed_dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, 1 + grid * grid, embed_dim))
        norm = partial(nn.LayerNorm, eps=1e-6)
        self.blocks = nn.ModuleList(
            [
                Block(embed_dim, num_heads, mlp_ratio=4.0, qkv_bias=True, init_values=1.0,
                      norm_layer=norm)
                for _ in range(depth)
            ]
        )  # fmt: skip
        for block in self.blocks:
            # explicit q k^T softmax v, as DINOv2 computes it without xFormers (the release's
            # float32 numbers to ~1e-7; fused attention differs by ~1e-5 after 12 blocks)
            block.attn.fused_attn = False
        self.norm = norm(embed_dim)
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        nn.init.normal_(self.cls_token, std=1e-6)

    def _position_embedding(self, h: int, w: int, dtype: torch.dtype) -> Tensor:
        """``[1, 1 + h*w, C]`` for a grid of ``h x w`` patches (DINOv2's bicubic rule)."""
        n = self.pos_embed.shape[1] - 1
        side = math.isqrt(n)
        if h * w == n and h == w:
            return self.pos_embed.to(dtype)
        pos = self.pos_embed.float()
        grid = pos[:, 1:].reshape(1, side, side, -1).permute(0, 3, 1, 2)
        if self.interpolate_offset:
            factor = ((h + self.interpolate_offset) / side, (w + self.interpolate_offset) / side)
            grid = F.interpolate(grid, scale_factor=factor, mode="bicubic", antialias=False)
        else:
            grid = F.interpolate(grid, size=(h, w), mode="bicubic", antialias=False)
        grid = grid.permute(0, 2, 3, 1).reshape(1, h * w, -1)
        return torch.cat([pos[:, :1], grid], dim=1).to(dtype)

    def intermediate_tokens(self, images: Tensor, layers: Sequence[int]) -> list[Tensor]:
        """Normalised patch tokens ``[B, h*w, C]`` after each block in ``layers``.

        Args:
            images: ``[B, 3, H, W]`` with ``H`` and ``W`` multiples of the patch size.
            layers: block indices (0-based), ascending.
        """
        b, _, height, width = images.shape
        h, w = height // self.patch_size, width // self.patch_size
        x = self.patch_embed(images)
        x = torch.cat([self.cls_token.expand(b, -1, -1).to(x.dtype), x], dim=1)
        x = x + self._position_embedding(h, w, x.dtype)
        wanted = set(layers)
        outputs = []
        for index, block in enumerate(self.blocks):
            x = block(x)
            if index in wanted:
                outputs.append(self.norm(x)[:, 1:])
            if index >= max(layers):
                break
        return outputs
