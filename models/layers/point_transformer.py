"""Point-cloud attention: kNN point attention, global attention over points or over the views'
low-resolution grid, and a point transformer that interleaves them.

The one point transformer of the zoo: ReSplat (``models.families.resplat``: its initial model,
recurrent update and error attention), ReSplat's release (``models.families.resplat_release``)
and SplatWeaver's optional neighbour aggregation build theirs from these options. Neighbours come
from the project's one kNN search, ``models.layers.knn.knn``:

- ``gather_neighbors(values, index)``: the neighbours' rows of per-point values;
- ``KNNAttention(dim, heads, k, ...)``: multi-head attention of every point over its ``k``
  nearest neighbours (the point itself included), optionally with a learned encoding of the
  relative positions added to keys and values (Point Transformer style);
- ``GlobalAttention(dim, heads)``: plain multi-head self-attention over all points;
- ``PointTransformerBlock(dim, heads, k, mode)``: pre-norm residual block, kNN or global
  attention followed by an MLP;
- ``ViewGridAttention(dim, heads)``: global attention over all views at ``1/down`` of their
  grid (pixel-unshuffle, a global block over every view's tokens, pixel-shuffle, a 3x3 conv);
- ``PointTransformer(dim, depth, heads, k, global_attention=...)``: kNN blocks alternating
  with global attention over the points (``"points"``), over the views' grid (``"views"``) or
  none (``None``), with an optional final norm.

Two arithmetics compute the same kNN attention (``matmul``): elementwise products and sums
(faster on a CPU; the project's models) or, as the ReSplat release does, queries, keys and values
from one fused projection and batched matmuls. Both sum in a different order, which moves the
outputs by float32 rounding; near kNN ties that rounding can change a later neighbour set, so
each architecture keeps the arithmetic its weights were checked with.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from models.layers.knn import knn

__all__ = [
    "GLOBAL_ATTENTION",
    "gather_neighbors",
    "KNNAttention",
    "GlobalAttention",
    "PointTransformerBlock",
    "ViewGridAttention",
    "PointTransformer",
]

GLOBAL_ATTENTION = ("points", "views", None)  # PointTransformer's kinds of global attention


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

    With ``relative_position``, relative positions ``p_j - p_i`` (and their length) are divided
    by the point's mean neighbour distance, so the layer is invariant to the scene's scale and
    translation, and encoded by a small MLP whose output is added to the keys and values (Point
    Transformer style). Without it the layer sees features only (the ReSplat release's).

    Args:
        dim: feature channels ``C``.
        heads: attention heads (``inner_dim`` must be divisible by it).
        k: neighbours per point (clipped to the number of points).
        inner_dim: width ``P`` of queries, keys and values (``None``: ``dim``).
        qkv_bias: biases of the query and key/value projections.
        relative_position: add the relative-position encoding to keys and values.
        pos_hidden: hidden width of the position MLP (``None``: ``max(16, inner_dim // 4)``).
        matmul: the ReSplat release's arithmetic (queries, keys and values from one fused
            projection, scores and weighted sums as batched matmuls); ``False``: elementwise
            products and sums (much faster on a CPU).
        chunk: queries per step (bounds the gathered neighbours' memory); ``None``: all at once.
    """

    def __init__(
        self,
        dim: int,
        heads: int = 4,
        k: int = 16,
        *,
        inner_dim: int | None = None,
        qkv_bias: bool = True,
        relative_position: bool = True,
        pos_hidden: int | None = None,
        matmul: bool = False,
        chunk: int | None = None,
    ) -> None:
        super().__init__()
        inner = inner_dim or dim
        if inner % heads:
            raise ValueError(f"KNNAttention: width {inner} is not divisible by heads {heads}")
        if chunk is not None and chunk < 1:
            raise ValueError(f"KNNAttention: chunk must be >= 1 or None, got {chunk}")
        self.dim = dim
        self.inner_dim = inner
        self.heads = heads
        self.k = k
        self.matmul = matmul
        self.chunk = chunk
        self.q = nn.Linear(dim, inner, bias=qkv_bias)
        self.kv = nn.Linear(dim, 2 * inner, bias=qkv_bias)
        self.pos = None
        if relative_position:
            hidden = pos_hidden or max(16, inner // 4)
            self.pos = nn.Sequential(nn.Linear(4, hidden), nn.GELU(), nn.Linear(hidden, inner))
        self.out = nn.Linear(inner, dim)

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
        b, n, _ = x.shape
        k = index.shape[-1]
        offsets = torch.arange(b, device=index.device)[:, None, None] * n
        rows = (index + offsets).reshape(b * n, k)  # [B*N, k] neighbour rows of the flat points
        flat_points = points.reshape(b * n, 3)
        if self.matmul:
            weight = torch.cat([self.q.weight, self.kv.weight])  # [3P, C]: the fused projection
            bias = None if self.q.bias is None else torch.cat([self.q.bias, self.kv.bias])
            qkv = F.linear(x.reshape(b * n, -1), weight, bias)  # [B*N, 3P]
            q, key, value = qkv.chunk(3, dim=-1)  # [B*N, P] each
        else:
            q = self.q(x).reshape(b * n, -1)  # [B*N, P]
            kv = self.kv(x).reshape(b * n, -1)  # [B*N, 2P]
        step = self.chunk or b * n
        out = []
        for start in range(0, b * n, step):
            stop = start + step
            pos = self._relative(flat_points, rows[start:stop], start)
            if self.matmul:
                out.append(self._attend_matmul(q[start:stop], key, value, rows[start:stop], pos))
            else:
                out.append(self._attend_elementwise(q[start:stop], kv, rows[start:stop], pos))
        out = out[0] if len(out) == 1 else torch.cat(out, dim=0)  # [B*N, P]
        return self.out(out.reshape(b, n, -1))

    def _relative(self, points: Tensor, rows: Tensor, start: int) -> Tensor | None:
        """Encoded relative positions ``[m, k, P]`` of the queries ``start .. start + m`` over
        their neighbour ``rows [m, k]`` (``points [B*N, 3]``); ``None`` without the encoding."""
        if self.pos is None:
            return None
        m, k = rows.shape
        neighbours = points.index_select(0, rows.reshape(-1)).reshape(m, k, 3)
        rel = neighbours - points[start : start + m, None, :]  # [m, k, 3]
        dist = rel.norm(dim=-1, keepdim=True)  # [m, k, 1]
        radius = dist.mean(dim=1, keepdim=True).detach().clamp_min(1e-6)  # [m, 1, 1]
        return self.pos(torch.cat([rel / radius, dist / radius], dim=-1))  # [m, k, P]

    def _attend_elementwise(
        self, q: Tensor, kv: Tensor, rows: Tensor, pos: Tensor | None
    ) -> Tensor:
        """``q [m, P]``, ``kv [B*N, 2P]``, ``rows [m, k]``, ``pos [m, k, P]`` -> ``[m, P]``."""
        m, k = rows.shape
        p, h = self.inner_dim, self.heads
        d = p // h
        kv = kv.index_select(0, rows.reshape(-1)).reshape(m, k, 2 * p)  # [m, k, 2P]
        key, value = kv[..., :p], kv[..., p:]
        if pos is not None:
            key, value = key + pos, value + pos
        key, value = key.reshape(m, k, h, d), value.reshape(m, k, h, d)
        q = q.reshape(m, 1, h, d)
        # Elementwise products: much faster than batched (1 x d) @ (d x k) matmuls on a CPU.
        attn = ((q * key).sum(-1) * d**-0.5).softmax(dim=1)  # [m, k, h]
        return (attn[..., None] * value).sum(dim=1).reshape(m, p)  # [m, h, d] -> [m, P]

    def _attend_matmul(
        self, q: Tensor, key: Tensor, value: Tensor, rows: Tensor, pos: Tensor | None
    ) -> Tensor:
        """``q [m, P]``, ``key``/``value [B*N, P]``, ``rows [m, k]``, ``pos [m, k, P]`` ->
        ``[m, P]``."""
        m, k = rows.shape
        p, h = self.inner_dim, self.heads
        d = p // h
        keys, values = key[rows], value[rows]  # [m, k, P]
        if pos is not None:
            keys, values = keys + pos, values + pos
        keys = keys.reshape(m, k, h, d).permute(0, 2, 3, 1)  # [m, h, d, k]
        values = values.reshape(m, k, h, d).transpose(1, 2)  # [m, h, k, d]
        scores = torch.matmul(q.reshape(m, h, 1, d), keys) * d**-0.5  # [m, h, 1, k]
        return torch.matmul(torch.softmax(scores, dim=-1), values).reshape(m, p)


class GlobalAttention(nn.Module):
    """Multi-head self-attention over all points (``scaled_dot_product_attention``).

    Args:
        dim: feature channels ``C``.
        heads: attention heads.
        qkv_bias: bias of the fused query/key/value projection.
    """

    def __init__(self, dim: int, heads: int = 4, *, qkv_bias: bool = True) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"GlobalAttention: dim {dim} is not divisible by heads {heads}")
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
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
        qkv_bias: biases of the attention's input projections.
        **knn_options: ``KNNAttention``'s keyword options (``inner_dim``, ``relative_position``,
            ``matmul``, ``chunk``; ``"knn"`` blocks only).
    """

    def __init__(
        self,
        dim: int,
        heads: int = 4,
        k: int = 16,
        mode: str = "knn",
        mlp_ratio: float = 2.0,
        *,
        qkv_bias: bool = True,
        **knn_options,
    ) -> None:
        super().__init__()
        if mode not in ("knn", "global"):
            raise ValueError(f"PointTransformerBlock: mode must be 'knn' or 'global', got {mode!r}")
        self.mode = mode
        self.norm1 = nn.LayerNorm(dim)
        if mode == "knn":
            self.attn = KNNAttention(dim, heads, k, qkv_bias=qkv_bias, **knn_options)
        else:
            self.attn = GlobalAttention(dim, heads, qkv_bias=qkv_bias)
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


class ViewGridAttention(nn.Module):
    """Global attention over all views at ``1/down`` of their grid: pixel-unshuffle each view's
    ``down x down`` cells, project to ``dim``, normalise, a global ``PointTransformerBlock``
    over the tokens of every view, project back, normalise, pixel-shuffle, a 3x3 conv, and a
    residual around it all (the ReSplat release's low-resolution multi-view attention).

    Args:
        dim: feature channels ``C``.
        heads: attention heads of the global block.
        down: grid downsampling (the grid's sides must be multiples of it).
        mlp_ratio: the global block's MLP width relative to ``dim``.
        qkv_bias: bias of the global block's query/key/value projection.
    """

    def __init__(
        self,
        dim: int,
        heads: int = 4,
        down: int = 4,
        *,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = False,
    ) -> None:
        super().__init__()
        self.down = down
        self.proj1 = nn.Linear(dim * down**2, dim)
        self.norm1 = nn.LayerNorm(dim)
        self.block = PointTransformerBlock(
            dim, heads, mode="global", mlp_ratio=mlp_ratio, qkv_bias=qkv_bias
        )
        self.proj2 = nn.Linear(dim, dim * down**2)
        self.norm2 = nn.LayerNorm(dim * down**2)
        self.conv = nn.Conv2d(dim, dim, 3, padding=1)

    def forward(self, x: Tensor, grid: tuple[int, int, int]) -> Tensor:
        """``x [B, V*h*w, C]`` (view-major, row-major grid), ``grid = (V, h, w)`` -> same."""
        views, h, w = grid
        residual = x
        y = rearrange(x, "b (v h w) c -> (b v) c h w", v=views, h=h, w=w)
        y = F.pixel_unshuffle(y, self.down)  # [BV, C down^2, h/down, w/down]
        y = rearrange(y, "(b v) c h w -> b (v h w) c", v=views)
        y = self.block(self.norm1(self.proj1(y)))  # [B, V h w / down^2, C]
        y = self.norm2(self.proj2(y))
        y = rearrange(y, "b (v h w) c -> (b v) c h w", v=views, h=h // self.down, w=w // self.down)
        y = self.conv(F.pixel_shuffle(y, self.down))  # [BV, C, h, w]
        return rearrange(y, "(b v) c h w -> b (v h w) c", v=views) + residual


class PointTransformer(nn.Module):
    """A stack of point transformer blocks: kNN blocks at even positions, global attention at
    odd ones (``knn, global, knn, global, ...``) unless ``global_attention`` is ``None``. The
    kNN graph is computed once per forward.

    Args:
        dim: feature channels.
        depth: number of blocks (kNN and global together).
        heads: attention heads of the kNN attention (and of the global one unless
            ``global_heads``).
        k: neighbours of the kNN attention.
        global_attention: ``"points"``: global self-attention blocks over all points;
            ``"views"``: ``ViewGridAttention`` over the views' grid (the forward needs
            ``grid``); ``None``: every block kNN.
        global_heads: heads of the global attention (``None``: ``heads``).
        view_down: ``ViewGridAttention``'s grid downsampling.
        mlp_ratio: MLP hidden width relative to ``dim`` (every block).
        qkv_bias: biases of the attentions' input projections (every block).
        final_norm: a LayerNorm on the output.
        knn_method: ``models.layers.knn`` method of the neighbour search.
        **knn_options: ``KNNAttention``'s keyword options (``inner_dim``, ``relative_position``,
            ``matmul``, ``chunk``).
    """

    def __init__(
        self,
        dim: int,
        depth: int = 2,
        heads: int = 4,
        k: int = 16,
        *,
        global_attention: str | None = "points",
        global_heads: int | None = None,
        view_down: int = 4,
        mlp_ratio: float = 2.0,
        qkv_bias: bool = True,
        final_norm: bool = True,
        knn_method: str = "cdist",
        **knn_options,
    ) -> None:
        super().__init__()
        if global_attention not in GLOBAL_ATTENTION:
            raise ValueError(
                f"PointTransformer: global_attention must be one of {GLOBAL_ATTENTION}, "
                f"got {global_attention!r}"
            )
        self.k = k
        self.knn_method = knn_method
        self.global_attention = global_attention
        g_heads = global_heads or heads
        blocks: list[nn.Module] = []
        for i in range(depth):
            if global_attention is None or i % 2 == 0:
                blocks.append(PointTransformerBlock(dim, heads, k, "knn", mlp_ratio,
                                                    qkv_bias=qkv_bias, **knn_options))  # fmt: skip
            elif global_attention == "points":
                blocks.append(PointTransformerBlock(dim, g_heads, k, "global", mlp_ratio,
                                                    qkv_bias=qkv_bias))  # fmt: skip
            else:
                blocks.append(ViewGridAttention(dim, g_heads, view_down, mlp_ratio=mlp_ratio,
                                                qkv_bias=qkv_bias))  # fmt: skip
        self.blocks = nn.ModuleList(blocks)
        self.norm = nn.LayerNorm(dim) if final_norm else None

    def forward(
        self,
        x: Tensor,
        points: Tensor,
        index: Tensor | None = None,
        grid: tuple[int, int, int] | None = None,
    ) -> Tensor:
        """Run the blocks.

        Args:
            x: ``[B, N, C]`` point features.
            points: ``[B, N, 3]`` point positions.
            index: ``[B, N, k]`` a kNN graph to reuse (computed when ``None``); gradients never
                flow through the neighbour search (positions still receive gradients through the
                relative encodings).
            grid: ``(V, h, w)`` with ``N = V*h*w`` (view-major points): ``"views"`` only.

        Returns:
            ``[B, N, C]`` (normalised with ``final_norm``).
        """
        if self.global_attention == "views" and grid is None:
            raise ValueError("a point transformer with view attention needs the views' grid")
        if index is None:
            index = knn(points.detach(), min(self.k, points.shape[1]), method=self.knn_method)
        for block in self.blocks:
            if isinstance(block, ViewGridAttention):
                x = block(x, grid)
            else:
                x = block(x, points, index)
        return x if self.norm is None else self.norm(x)
