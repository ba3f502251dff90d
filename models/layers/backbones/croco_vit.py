"""CroCo's asymmetric two-stream ViT (CroCo v2 / DUSt3R / MASt3R) and DUSt3R's DPT heads, as
NoPoSplat uses them.

The backbone:

- a ViT encoder shared by every view: 16x16 patches, pre-norm blocks (LayerNorm eps 1e-6) whose
  self-attention applies a 2D rotary embedding (base 100: half of each head's channels rotate
  with the patch row, half with the column; ``da3_vit.rope_2d``), no absolute position
  embedding; optionally one more token per view, the view's normalised intrinsics through a
  linear layer, placed at position ``(rows, 0)`` (one row below the grid);
- a decoder of blocks with self-attention, then cross-attention to the other views' tokens (both
  with the rotary embedding), then an MLP; view 0 (the reference) runs ``dec_blocks``, every
  other view ``dec_blocks2`` (same shape, other weights). With more than two views, each view
  attends to the concatenated tokens of all the others (NoPoSplat's multi-view release).

The heads (``PointHead``, ``GaussianParamHead``) are DUSt3R's DPT on four layers (the encoder's
output and three decoder layers) over this project's ``DPTHead`` reassembly and fusion (the
release's fusion crops the deepest level to the next one's size instead of resizing it), each
with the release's output stage.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from models.layers.backbones.da3_vit import Attention, Mlp, PatchEmbed, rope_2d
from models.layers.backbones.dpt import DPTHead

__all__ = [
    "CroCoViT",
    "CrossAttention",
    "DecoderBlock",
    "EncoderBlock",
    "GaussianParamHead",
    "PointHead",
    "dust3r_dpt_hooks",
    "patch_positions",
]

NORM_EPS = 1e-6
# DUSt3R's DPT: reassembled widths (shallow to deep) and the fusion width
DPT_LAYER_DIMS = (96, 192, 384, 768)
DPT_FEATURES = 256


def patch_positions(b: int, h: int, w: int, device: torch.device) -> Tensor:
    """``[b, h*w, 2]`` integer (row, column) of each patch, row-major."""
    rows = torch.arange(h, device=device)
    cols = torch.arange(w, device=device)
    return torch.cartesian_prod(rows, cols)[None].expand(b, -1, -1)


def dust3r_dpt_hooks(dec_depth: int) -> list[int]:
    """Layers DUSt3R's DPT reads: the encoder output (0) and decoder layers ``depth/2``,
    ``3 depth/4`` and ``depth`` (1-based)."""
    return [0, dec_depth * 2 // 4, dec_depth * 3 // 4, dec_depth]


class EncoderBlock(nn.Module):
    """``x + attn(norm1 x)`` (rotary), then ``x + mlp(norm2 x)``."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float = 4.0) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=NORM_EPS)
        self.attn = Attention(dim, num_heads, rope=True)
        self.norm2 = nn.LayerNorm(dim, eps=NORM_EPS)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))

    def forward(self, x: Tensor, positions: Tensor) -> Tensor:
        x = x + self.attn(self.norm1(x), positions)
        return x + self.mlp(self.norm2(x))


class CrossAttention(nn.Module):
    """Multi-head attention of ``query`` tokens to ``memory`` tokens, rotary on both sides."""

    def __init__(self, dim: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.projq = nn.Linear(dim, dim)
        self.projk = nn.Linear(dim, dim)
        self.projv = nn.Linear(dim, dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, query: Tensor, memory: Tensor, qpos: Tensor, kpos: Tensor) -> Tensor:
        """``query [N, Lq, C]``, ``memory [N, Lk, C]``, positions ``[N, L, 2]`` -> ``[N, Lq, C]``."""
        heads = self.num_heads
        q = rearrange(self.projq(query), "n l (h d) -> n h l d", h=heads)
        k = rearrange(self.projk(memory), "n l (h d) -> n h l d", h=heads)
        v = rearrange(self.projv(memory), "n l (h d) -> n h l d", h=heads)
        q, k = rope_2d(q, qpos), rope_2d(k, kpos)
        out = F.scaled_dot_product_attention(q, k, v)
        return self.proj(rearrange(out, "n h l d -> n l (h d)"))


class DecoderBlock(nn.Module):
    """Self-attention, cross-attention to the (normalised) other views, MLP; pre-norm."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float = 4.0) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=NORM_EPS)
        self.attn = Attention(dim, num_heads, rope=True)
        self.cross_attn = CrossAttention(dim, num_heads)
        self.norm2 = nn.LayerNorm(dim, eps=NORM_EPS)
        self.norm3 = nn.LayerNorm(dim, eps=NORM_EPS)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))
        self.norm_y = nn.LayerNorm(dim, eps=NORM_EPS)

    def forward(self, x: Tensor, memory: Tensor, xpos: Tensor, mpos: Tensor) -> Tensor:
        x = x + self.attn(self.norm1(x), xpos)
        memory = self.norm_y(memory)
        x = x + self.cross_attn(self.norm2(x), memory, xpos, mpos)
        return x + self.mlp(self.norm3(x))


def _others(x: Tensor) -> Tensor:
    """``[B, V, L, ...]`` -> ``[B, V, (V-1) L, ...]``: for each view, the other views' tokens
    concatenated in view order."""
    v = x.shape[1]
    rows = [torch.cat([x[:, j] for j in range(v) if j != i], dim=1) for i in range(v)]
    return torch.stack(rows, dim=1)


class CroCoViT(nn.Module):
    """The two-stream ViT (see the module docstring).

    Args:
        enc_dim, enc_depth, enc_heads: encoder width, blocks and heads (MASt3R ViT-L: 1024, 24,
            16).
        dec_dim, dec_depth, dec_heads: decoder width, blocks (per stream) and heads (ViT-B:
            768, 12, 12).
        patch_size: patch side in pixels.
        intrinsics_token: append the intrinsics token to each view's patches.
    """

    def __init__(
        self,
        *,
        enc_dim: int = 1024,
        enc_depth: int = 24,
        enc_heads: int = 16,
        dec_dim: int = 768,
        dec_depth: int = 12,
        dec_heads: int = 12,
        patch_size: int = 16,
        intrinsics_token: bool = True,
    ) -> None:
        super().__init__()
        self.patch_size = patch_size
        self.enc_dim, self.dec_dim, self.dec_depth = enc_dim, dec_dim, dec_depth
        self.patch_embed = PatchEmbed(patch_size, 3, enc_dim)
        self.intrinsic_encoder = nn.Linear(9, enc_dim) if intrinsics_token else None
        self.enc_blocks = nn.ModuleList(EncoderBlock(enc_dim, enc_heads) for _ in range(enc_depth))
        self.enc_norm = nn.LayerNorm(enc_dim, eps=NORM_EPS)
        self.decoder_embed = nn.Linear(enc_dim, dec_dim)
        self.dec_blocks = nn.ModuleList(DecoderBlock(dec_dim, dec_heads) for _ in range(dec_depth))
        self.dec_blocks2 = nn.ModuleList(DecoderBlock(dec_dim, dec_heads) for _ in range(dec_depth))
        self.dec_norm = nn.LayerNorm(dec_dim, eps=NORM_EPS)

    def encode(self, images: Tensor, intrinsics: Tensor | None) -> tuple[Tensor, Tensor]:
        """``images [N, 3, H, W]`` (normalised to [-1, 1]), ``intrinsics [N, 3, 3]`` ->
        tokens ``[N, L, enc_dim]`` and their positions ``[N, L, 2]``."""
        n, _, h, w = images.shape
        grid = (h // self.patch_size, w // self.patch_size)
        x = self.patch_embed(images)  # [N, h*w, C]
        pos = patch_positions(n, *grid, images.device)
        if self.intrinsic_encoder is not None:
            if intrinsics is None:
                raise ValueError("this model needs context['intrinsics'] (its intrinsics token)")
            token = self.intrinsic_encoder(intrinsics.reshape(n, 1, 9).to(x.dtype))
            x = torch.cat([x, token], dim=1)
            extra = pos.new_tensor([grid[0], 0]).expand(n, 1, 2)
            pos = torch.cat([pos, extra], dim=1)
        for block in self.enc_blocks:
            x = block(x, pos)
        return self.enc_norm(x), pos

    def forward(self, images: Tensor, intrinsics: Tensor | None) -> list[Tensor]:
        """``images [B, V, 3, H, W]`` in [-1, 1] (V >= 2), ``intrinsics [B, V, 3, 3]``
        (normalised) -> ``dec_depth + 1`` layers ``[B, V, h*w, C]``: the encoder's output
        (``enc_dim``), then each decoder block's (``dec_dim``; the last one normalised). The
        intrinsics token is dropped from the outputs."""
        b, v = images.shape[:2]
        if v < 2:
            raise ValueError(f"CroCoViT needs at least 2 views (cross-view decoder), got {v}")
        flat_k = None if intrinsics is None else intrinsics.flatten(0, 1)
        tokens, pos = self.encode(images.flatten(0, 1), flat_k)
        tokens = tokens.unflatten(0, (b, v))  # [B, V, L, C]
        pos = pos.unflatten(0, (b, v))
        layers = [tokens]
        x = self.decoder_embed(tokens)
        memory_pos = _others(pos)  # [B, V, (V-1)L, 2]
        for first, rest in zip(self.dec_blocks, self.dec_blocks2):
            memory = _others(x)
            x0 = first(x[:, 0], memory[:, 0], pos[:, 0], memory_pos[:, 0])
            xr = rest(
                x[:, 1:].flatten(0, 1),
                memory[:, 1:].flatten(0, 1),
                pos[:, 1:].flatten(0, 1),
                memory_pos[:, 1:].flatten(0, 1),
            ).unflatten(0, (b, v - 1))
            x = torch.cat([x0[:, None], xr], dim=1)
            layers.append(x)
        layers[-1] = self.dec_norm(layers[-1])
        if self.intrinsic_encoder is not None:
            layers = [layer[:, :, :-1] for layer in layers]
        return layers


class _DUSt3RDPT(nn.Module):
    """DUSt3R's DPT reassembly and fusion over four layers (``DPTHead`` parts)."""

    def __init__(self, enc_dim: int, dec_dim: int) -> None:
        super().__init__()
        self.dpt = DPTHead(
            [enc_dim, dec_dim, dec_dim, dec_dim],
            layer_dims=DPT_LAYER_DIMS,
            features=DPT_FEATURES,
            align_corners=True,
            upsample_last=True,
            head_dim=0,
            out_dim=0,
            shallow_dim=0,
        )

    def fused(self, layers: Sequence[Tensor], grid: tuple[int, int]) -> Tensor:
        """Four layers ``[N, h*w, C_i]`` -> the fused map ``[N, 256, 8h, 8w]``."""
        dpt = self.dpt
        maps = [rearrange(t, "n (h w) c -> n c h w", h=grid[0], w=grid[1]) for t in layers]
        levels = [rn(stage(m)) for m, stage, rn in zip(maps, dpt.reassemble, dpt.layer_rn)]
        # the deepest level: refined, upsampled 2x, cropped to the next level (the release)
        path = dpt.fusion[3](levels[3], None, None)
        path = path[..., : levels[2].shape[-2], : levels[2].shape[-1]]
        for i in (2, 1, 0):
            path = dpt.fusion[i](path, levels[i], None)  # each upsamples 2x
        return path


class PointHead(_DUSt3RDPT):
    """DUSt3R's point-map head: DPT, then 3x3 conv (256 -> 128), 2x bilinear upsampling,
    3x3 conv, ReLU, 1x1 conv to xyz; ``exp`` activation: ``xyz / |xyz| * expm1(|xyz|)``."""

    def __init__(self, enc_dim: int, dec_dim: int, hidden: int = 128) -> None:
        super().__init__(enc_dim, dec_dim)
        self.conv1 = nn.Conv2d(DPT_FEATURES, DPT_FEATURES // 2, 3, padding=1)
        self.conv2 = nn.Conv2d(DPT_FEATURES // 2, hidden, 3, padding=1)
        self.conv3 = nn.Conv2d(hidden, 3, 1)

    def forward(self, layers: Sequence[Tensor], grid: tuple[int, int]) -> Tensor:
        """-> points ``[N, H, W, 3]`` (``H = 16 h``)."""
        x = self.conv1(self.fused(layers, grid))
        x = F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=True)
        x = self.conv3(F.relu(self.conv2(x))).permute(0, 2, 3, 1)  # [N, H, W, 3]
        norm = x.norm(dim=-1, keepdim=True)
        return x / norm.clip(min=1e-8) * torch.expm1(norm)


class GaussianParamHead(_DUSt3RDPT):
    """NoPoSplat's Gaussian-parameter head: DPT, 2x bilinear upsampling to the image, plus a
    7x7 conv (ReLU) of the image itself, then 3x3 conv (no bias), ReLU, 1x1 conv."""

    def __init__(self, enc_dim: int, dec_dim: int, out_dim: int) -> None:
        super().__init__(enc_dim, dec_dim)
        self.image_conv = nn.Conv2d(3, DPT_FEATURES, 7, padding=3)
        self.conv1 = nn.Conv2d(DPT_FEATURES, DPT_FEATURES, 3, padding=1, bias=False)
        self.conv2 = nn.Conv2d(DPT_FEATURES, out_dim, 1)

    def forward(self, layers: Sequence[Tensor], grid: tuple[int, int], images: Tensor) -> Tensor:
        """``images [N, 3, H, W]`` (as the backbone saw them) -> ``[N, out_dim, H, W]``."""
        x = self.fused(layers, grid)
        x = F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=True)
        x = x + F.relu(self.image_conv(images))
        return self.conv2(F.relu(self.conv1(x)))
