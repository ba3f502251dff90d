"""Point-cloud attention: kNN point attention, global attention, and a point transformer that
interleaves them.

Shared by ReSplat (initial model and recurrent update) and usable by any family that lifts
features to 3D points (e.g. SplatWeaver's optional neighbour aggregation). Neighbours come from
the project's one kNN search, ``models.layers.knn.knn`` (``"cdist"``: exact in float32, ties in
one fixed order):

- ``gather_neighbors(values, index)``: the neighbours' rows of per-point values;
- ``KNNAttention(dim, heads, k)``: multi-head attention of every point over its ``k`` nearest
  neighbours, with a learned encoding of the relative positions added to keys and values
  (Point Transformer style);
- ``GlobalAttention(dim, heads)``: plain multi-head self-attention over all points;
- ``PointTransformer(dim, depth, heads, k)``: pre-norm residual blocks alternating kNN attention
  and global attention, each followed by an MLP.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from models.layers.knn import knn

__all__ = [
    "gather_neighbors",
    "KNNAttention",
    "GlobalAttention",
    "PointTransformerBlock",
    "PointTransformer",
]


def gather_neighbors(values: Tensor, index: Tensor) -> Tensor:
    """Gather per-point values of neighbours.

    Args:
        values: ``[B, N, ...]``.
        index: ``[B, M, k]`` indices into ``N``.

    Returns:
        ``[B, M, k, ...]``.
    """
    b, n = values.shape[:2]
    _, m, k = index.shape
    offsets = torch.arange(b, device=index.device)[:, None, None] * n
    flat = (index + offsets).reshape(-1)  # [B*M*k] rows of the flattened values
    rows = values.reshape(b * n, -1).index_select(0, flat)
    return rows.reshape(b, m, k, *values.shape[2:])


class KNNAttention(nn.Module):
    """Multi-head attention of every point over its ``k`` nearest neighbours.

    Relative positions ``p_j - p_i`` (and their length) are divided by the point's mean neighbour
    distance, so the layer is invariant to the scene's scale and translation, and encoded by a
    small MLP whose output is added to the keys and values (Point Transformer style).

    Args:
        dim: feature channels ``C``.
        heads: attention heads (``dim`` must be divisible by it).
        k: neighbours per point (clipped to the number of points).
        pos_hidden: hidden width of the position MLP (``None``: ``max(16, dim // 4)``).
    """

    def __init__(
        self, dim: int, heads: int = 4, k: int = 16, pos_hidden: int | None = None
    ) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"KNNAttention: dim {dim} is not divisible by heads {heads}")
        self.dim = dim
        self.heads = heads
        self.k = k
        hidden = pos_hidden or max(16, dim // 4)
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, 2 * dim)
        self.pos = nn.Sequential(nn.Linear(4, hidden), nn.GELU(), nn.Linear(hidden, dim))
        self.out = nn.Linear(dim, dim)

    def forward(self, x: Tensor, points: Tensor, index: Tensor | None = None) -> Tensor:
        """Attend over neighbours.

        Args:
            x: ``[B, N, C]`` point features.
            points: ``[B, N, 3]`` point positions.
            index: ``[B, N, k]`` precomputed ``knn(points, k)`` (computed when ``None``).

        Returns:
            ``[B, N, C]``.
        """
        if index is None:
            index = knn(points.detach(), min(self.k, points.shape[1]), method="cdist")
        b, n, c = x.shape
        k, h = index.shape[-1], self.heads
        d = c // h
        rel = gather_neighbors(points, index) - points[:, :, None, :]  # [B, N, k, 3]
        dist = rel.norm(dim=-1, keepdim=True)  # [B, N, k, 1]
        radius = dist.mean(dim=2, keepdim=True).detach().clamp_min(1e-6)  # [B, N, 1, 1]
        pos = self.pos(torch.cat([rel / radius, dist / radius], dim=-1))  # [B, N, k, C]
        kv = gather_neighbors(self.kv(x), index)  # [B, N, k, 2C]
        key = (kv[..., :c] + pos).reshape(b, n, k, h, d)
        value = (kv[..., c:] + pos).reshape(b, n, k, h, d)
        q = self.q(x).reshape(b, n, 1, h, d)
        # Elementwise products: much faster than batched (1 x d) @ (d x k) matmuls on a CPU.
        attn = ((q * key).sum(-1) * d**-0.5).softmax(dim=2)  # [B, N, k, h]
        out = (attn[..., None] * value).sum(dim=2)  # [B, N, h, d]
        return self.out(out.reshape(b, n, c))


class GlobalAttention(nn.Module):
    """Multi-head self-attention over all points (``scaled_dot_product_attention``).

    Args:
        dim: feature channels ``C``.
        heads: attention heads.
    """

    def __init__(self, dim: int, heads: int = 4) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"GlobalAttention: dim {dim} is not divisible by heads {heads}")
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """``x [B, N, C]`` -> ``[B, N, C]``; ``mask [B, N]`` bool hides invalid keys."""
        q, k, v = rearrange(self.qkv(x), "b n (t h d) -> t b h n d", t=3, h=self.heads)
        attn_mask = None if mask is None else mask[:, None, None, :]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
        return self.out(rearrange(out, "b h n d -> b n (h d)"))


class PointTransformerBlock(nn.Module):
    """Pre-norm residual block: attention (kNN or global) then an MLP.

    Args:
        dim: feature channels.
        heads: attention heads.
        k: neighbours of the kNN attention.
        mode: ``"knn"`` or ``"global"``.
        mlp_ratio: hidden width of the MLP relative to ``dim``.
    """

    def __init__(
        self, dim: int, heads: int = 4, k: int = 16, mode: str = "knn", mlp_ratio: float = 2.0
    ) -> None:
        super().__init__()
        if mode not in ("knn", "global"):
            raise ValueError(f"PointTransformerBlock: mode must be 'knn' or 'global', got {mode!r}")
        self.mode = mode
        self.norm1 = nn.LayerNorm(dim)
        self.attn = KNNAttention(dim, heads, k) if mode == "knn" else GlobalAttention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        hidden = int(dim * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(
        self, x: Tensor, points: Tensor | None = None, index: Tensor | None = None
    ) -> Tensor:
        """``x [B, N, C]``, ``points [B, N, 3]`` (kNN blocks only), ``index [B, N, k]`` ->
        ``[B, N, C]``."""
        if self.mode == "knn":
            if points is None:
                raise ValueError("a kNN point transformer block needs the points")
            x = x + self.attn(self.norm1(x), points, index)
        else:
            x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class PointTransformer(nn.Module):
    """A stack of point transformer blocks; kNN and global attention alternate
    (``knn, global, knn, global, ...``). The kNN graph is computed once per forward.

    Args:
        dim: feature channels.
        depth: number of blocks.
        heads: attention heads.
        k: neighbours of the kNN attention.
        global_attention: interleave global attention blocks; ``False`` makes every block kNN.
        mlp_ratio: MLP hidden width relative to ``dim``.
    """

    def __init__(
        self,
        dim: int,
        depth: int = 2,
        heads: int = 4,
        k: int = 16,
        global_attention: bool = True,
        mlp_ratio: float = 2.0,
    ) -> None:
        super().__init__()
        self.k = k
        modes = ["global" if global_attention and i % 2 == 1 else "knn" for i in range(depth)]
        self.blocks = nn.ModuleList(
            PointTransformerBlock(dim, heads, k, mode, mlp_ratio) for mode in modes
        )
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: Tensor, points: Tensor, index: Tensor | None = None) -> Tensor:
        """``x [B, N, C]``, ``points [B, N, 3]`` -> ``[B, N, C]`` (normalised output).

        ``index [B, N, k]`` may be passed to reuse a kNN graph; gradients never flow through the
        neighbour search (positions still receive gradients through the relative encodings).
        """
        if index is None and any(block.mode == "knn" for block in self.blocks):
            index = knn(points.detach(), min(self.k, points.shape[1]), method="cdist")
        for block in self.blocks:
            x = block(x, points, index)
        return self.norm(x)
