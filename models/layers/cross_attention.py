"""Cross-attention of a few query tokens over many memory tokens, and the residual block around it.

The token-clustered family refines its scene tokens with it (``models.families.zipsplat``), and
the ZipSplat release port with the same block (``models.families.zipsplat_da3``, with q/k
normalisation and the residual-update output).
"""

from __future__ import annotations

import torch.nn.functional as F
from einops import rearrange
from timm.layers import LayerScale, Mlp
from timm.models.vision_transformer import Attention
from torch import Tensor, nn

__all__ = ["CrossAttention", "CrossAttentionBlock"]


class CrossAttention(nn.Module):
    """Multi-head attention of queries ``[B, K, C]`` over a memory ``[B, N, C_mem]``.

    Args:
        dim: query width ``C`` (and output width).
        num_heads: attention heads (``dim`` must be divisible by it).
        memory_dim: memory width ``C_mem`` (``None``: ``dim``).
        qk_norm: LayerNorm each head's queries and keys before the dot product.
    """

    def __init__(
        self, dim: int, num_heads: int, memory_dim: int | None = None, qk_norm: bool = False
    ) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"dim {dim} is not divisible by {num_heads} heads")
        self.num_heads = num_heads
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(memory_dim or dim, 2 * dim)
        head_dim = dim // num_heads
        self.q_norm = nn.LayerNorm(head_dim) if qk_norm else None
        self.k_norm = nn.LayerNorm(head_dim) if qk_norm else None
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: Tensor, memory: Tensor) -> Tensor:
        q = rearrange(self.q(x), "b k (h d) -> b h k d", h=self.num_heads)
        k, v = rearrange(self.kv(memory), "b n (two h d) -> two b h n d", two=2, h=self.num_heads)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        out = F.scaled_dot_product_attention(q, k, v)  # [B, h, K, d]
        return self.proj(rearrange(out, "b h k d -> b k (h d)"))


class CrossAttentionBlock(nn.Module):
    """Queries read from a memory, then (optionally) from each other, then pass an MLP.

    Three pre-norm residual branches, each multiplied by a per-channel gain that starts at
    ``init_values``: cross-attention to the memory, self-attention among the queries (optional),
    MLP. ``forward(..., residual_only=True)`` returns what the branches add to the queries
    instead of the updated queries, for a caller that keeps its own token stream.

    Args:
        dim: token width.
        num_heads: attention heads.
        mlp_ratio: MLP hidden width over ``dim``.
        init_values: initial gain of every branch.
        self_attention: include the self-attention branch.
        qk_norm: normalise queries and keys in the cross-attention.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        mlp_ratio: float = 2.0,
        init_values: float = 0.05,
        self_attention: bool = True,
        qk_norm: bool = False,
    ) -> None:
        super().__init__()
        self.norm_query = nn.LayerNorm(dim)
        self.norm_memory = nn.LayerNorm(dim)
        self.cross = CrossAttention(dim, num_heads, qk_norm=qk_norm)
        self.ls_cross = LayerScale(dim, init_values)
        if self_attention:
            self.norm_self = nn.LayerNorm(dim)
            self.attn = Attention(dim, num_heads=num_heads, qkv_bias=True)
            self.ls_self = LayerScale(dim, init_values)
        else:
            self.attn = None
        self.norm_mlp = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))
        self.ls_mlp = LayerScale(dim, init_values)

    def forward(self, x: Tensor, memory: Tensor, residual_only: bool = False) -> Tensor:
        """``x [B, K, C]`` queries, ``memory [B, N, C]``; returns ``[B, K, C]``."""
        read = self.ls_cross(self.cross(self.norm_query(x), self.norm_memory(memory)))
        if residual_only:
            if self.attn is not None:
                raise ValueError("residual_only needs a block without self-attention")
            return read + self.ls_mlp(self.mlp(self.norm_mlp(x + read)))
        x = x + read
        if self.attn is not None:
            x = x + self.ls_self(self.attn(self.norm_self(x)))
        return x + self.ls_mlp(self.mlp(self.norm_mlp(x)))
