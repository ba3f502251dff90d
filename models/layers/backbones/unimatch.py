"""UniMatch-style multi-view matching features: a residual CNN and a windowed cross-view
transformer (DepthSplat's and ReSplat's "multi-view branch").

- ``ConvStem``: a 7x7 stride-2 convolution and three stages of two residual blocks (instance
  norm), returning features at 1/2, 1/2 or 1/4, and 1/4 or 1/8 of the input (``lowest_scale``).
- ``CrossViewTransformer``: ``depth`` blocks of single-head window attention (2x2 windows by
  default, every other block with a half-window cyclic shift as in Swin): self-attention within
  each view, then cross-attention from each view to the other views (all of them, or the views
  named by a nearest-neighbour table), followed by an MLP on ``[x, message]``.
- ``window_sine_embedding``: DETR's normalised sine position code, computed per window.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "ConvStem",
    "CrossViewTransformer",
    "other_view_index",
    "window_sine_embedding",
]


class _ResidualBlock(nn.Module):
    """Two 3x3 convolutions with instance norm; a strided 1x1 shortcut when the shape changes."""

    def __init__(self, in_dim: int, dim: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_dim, dim, 3, stride=stride, padding=1, bias=False)
        self.conv2 = nn.Conv2d(dim, dim, 3, padding=1, bias=False)
        self.norm1 = nn.InstanceNorm2d(dim)
        self.norm2 = nn.InstanceNorm2d(dim)
        self.shortcut = None
        if stride != 1 or in_dim != dim:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_dim, dim, 1, stride=stride), nn.InstanceNorm2d(dim)
            )

    def forward(self, x: Tensor) -> Tensor:
        y = F.relu(self.norm1(self.conv1(x)))
        y = F.relu(self.norm2(self.conv2(y)))
        if self.shortcut is not None:
            x = self.shortcut(x)
        return F.relu(x + y)


class ConvStem(nn.Module):
    """Residual CNN; ``forward`` returns the three stage outputs, highest resolution first.

    Args:
        out_dim: channels of the last (projected) stage.
        lowest_scale: 4 or 8, the downsampling of the last stage.
    """

    dims = (64, 96, 128)

    def __init__(self, out_dim: int = 128, lowest_scale: int = 8) -> None:
        super().__init__()
        if lowest_scale not in (4, 8):
            raise ValueError(f"lowest_scale must be 4 or 8, got {lowest_scale}")
        d1, d2, d3 = self.dims
        self.stem = nn.Conv2d(3, d1, 7, stride=2, padding=3, bias=False)
        self.stem_norm = nn.InstanceNorm2d(d1)
        self.stage1 = nn.Sequential(_ResidualBlock(d1, d1, 1), _ResidualBlock(d1, d1, 1))
        stride2 = 1 if lowest_scale == 4 else 2
        self.stage2 = nn.Sequential(_ResidualBlock(d1, d2, stride2), _ResidualBlock(d2, d2, 1))
        self.stage3 = nn.Sequential(_ResidualBlock(d2, d3, 2), _ResidualBlock(d3, d3, 1))
        self.proj = nn.Conv2d(d3, out_dim, 1)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: Tensor) -> list[Tensor]:
        x = F.relu(self.stem_norm(self.stem(x)))
        f1 = self.stage1(x)  # 1/2
        f2 = self.stage2(f1)  # 1/2 or 1/4
        f3 = self.proj(self.stage3(f2))  # 1/4 or 1/8
        return [f1, f2, f3]


def window_sine_embedding(
    channels: int, height: int, width: int, splits: int, device=None, dtype=None
) -> Tensor:
    """DETR sine position code ``[channels, H, W]``, normalised within each of splits x splits
    windows (so every window carries the same code)."""
    hs, ws = height // splits, width // splits
    feats = channels // 2
    eps, scale = 1e-6, 2 * math.pi
    y = torch.arange(1, hs + 1, dtype=torch.float32, device=device)
    x = torch.arange(1, ws + 1, dtype=torch.float32, device=device)
    y = y / (hs + eps) * scale
    x = x / (ws + eps) * scale
    i = torch.arange(feats, dtype=torch.float32, device=device)
    dim_t = 10000 ** (2 * torch.div(i, 2, rounding_mode="floor") / feats)

    def code(t: Tensor) -> Tensor:  # [n] -> [n, feats], sin on even, cos on odd channels
        p = t[:, None] / dim_t
        return torch.stack([p[:, 0::2].sin(), p[:, 1::2].cos()], dim=2).flatten(1)

    cy = code(y)[:, None, :].expand(hs, ws, feats)
    cx = code(x)[None, :, :].expand(hs, ws, feats)
    window = torch.cat([cy, cx], dim=-1).permute(2, 0, 1)  # [C, hs, ws]
    return window.repeat(1, splits, splits).to(dtype or torch.float32)


def _to_windows(x: Tensor, splits: int) -> Tensor:
    """``[N, H, W, C]`` -> ``[N * splits^2, H/splits * W/splits, C]`` (image-major, row-major)."""
    n, h, w, c = x.shape
    x = x.view(n, splits, h // splits, splits, w // splits, c).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(n * splits * splits, (h // splits) * (w // splits), c)


def _from_windows(x: Tensor, splits: int, h: int, w: int) -> Tensor:
    """Inverse of ``_to_windows``: ``[N * s^2, L, C]`` -> ``[N, H, W, C]``."""
    c = x.shape[-1]
    n = x.shape[0] // (splits * splits)
    x = x.view(n, splits, splits, h // splits, w // splits, c).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(n, h, w, c)


def _shift_mask(h: int, w: int, splits: int, device) -> Tensor:
    """Swin's additive mask ``[s^2, L, L]`` (0 or -100) for half-window shifted windows."""
    wh, ww = h // splits, w // splits
    sh, sw = wh // 2, ww // 2
    label = torch.zeros(h, w, device=device)
    count = 0
    for rows in (slice(0, -wh), slice(-wh, -sh), slice(-sh, None)):
        for cols in (slice(0, -ww), slice(-ww, -sw), slice(-sw, None)):
            label[rows, cols] = count
            count += 1
    windows = _to_windows(label[None, :, :, None], splits)[..., 0]  # [s^2, L]
    diff = windows[:, None, :] - windows[:, :, None]
    return torch.where(diff != 0, -100.0, 0.0).to(torch.float32)


def window_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    splits: int,
    shift: bool,
    mask: Tensor | None,
    fused: bool = False,
) -> Tensor:
    """Single-head attention within windows, keys from ``M`` views.

    Args:
        q: ``[N, H, W, C]``.
        k, v: ``[N, M, H, W, C]``.
        splits: windows per side.
        shift: cyclically shift by half a window first (and back after), with ``mask``.
        mask: ``[s^2, L, L]`` shift mask.
        fused: ``scaled_dot_product_attention`` instead of explicit matmuls (ReSplat's release;
            float32 numbers differ by ~1e-6).

    Keys of one window are ordered position-major, view-minor, and the shift mask is tiled over
    the key axis view-major -- the layout of the released UniMatch/DepthSplat code (for ``M > 1``
    it pairs some keys with another position's mask entry; kept, the weights were trained so).
    """
    n, h, w, c = q.shape
    m = k.shape[1]
    if shift:
        sh, sw = (h // splits) // 2, (w // splits) // 2
        q = torch.roll(q, shifts=(-sh, -sw), dims=(1, 2))
        k = torch.roll(k, shifts=(-sh, -sw), dims=(2, 3))
        v = torch.roll(v, shifts=(-sh, -sw), dims=(2, 3))
    qw = _to_windows(q, splits)  # [N s^2, L, C]

    def keys(t: Tensor) -> Tensor:  # [N, M, H, W, C] -> [N s^2, L * M, C], position-major
        t = t.permute(0, 2, 3, 1, 4).reshape(n, h, w, m * c)
        t = _to_windows(t, splits)
        return t.reshape(t.shape[0], -1, c)

    kw, vw = keys(k), keys(v)
    bias = None
    if shift:
        bias = mask.repeat(n, 1, m).to(q.dtype)  # [N s^2, L, L * M]
    if fused:
        out = F.scaled_dot_product_attention(
            qw[:, None], kw[:, None], vw[:, None], attn_mask=None if bias is None else bias[:, None]
        )[:, 0]
    else:
        # explicit matmuls (not fused attention): DepthSplat's float32 numbers to ~1e-7
        scores = torch.matmul(qw, kw.transpose(1, 2)) / c**0.5  # [N s^2, L, L * M]
        if bias is not None:
            scores = scores + bias
        out = torch.matmul(torch.softmax(scores, dim=-1), vw)
    out = _from_windows(out, splits, h, w)
    if shift:
        out = torch.roll(out, shifts=(sh, sw), dims=(1, 2))
    return out


class _AttentionLayer(nn.Module):
    """Projections, window attention, merge + LayerNorm, optional MLP on ``[x, message]``."""

    def __init__(self, dim: int, mlp: bool, mlp_ratio: int = 4) -> None:
        super().__init__()
        self.q = nn.Linear(dim, dim, bias=False)
        self.k = nn.Linear(dim, dim, bias=False)
        self.v = nn.Linear(dim, dim, bias=False)
        self.out = nn.Linear(dim, dim, bias=False)
        self.norm = nn.LayerNorm(dim)
        self.fused = False  # scaled_dot_product_attention (ReSplat's release sets it)
        self.mlp = None
        if mlp:
            hidden = 2 * dim * mlp_ratio
            self.mlp = nn.Sequential(
                nn.Linear(2 * dim, hidden, bias=False),
                nn.GELU(),
                nn.Linear(hidden, dim, bias=False),
            )
            self.mlp_norm = nn.LayerNorm(dim)

    def forward(
        self, x: Tensor, context: Tensor, splits: int, shift: bool, mask: Tensor | None
    ) -> Tensor:
        """``x [N, H, W, C]`` attends to ``context [N, M, H, W, C]``."""
        message = window_attention(
            self.q(x), self.k(context), self.v(context), splits, shift, mask, self.fused
        )
        message = self.norm(self.out(message))
        if self.mlp is not None:
            message = self.mlp_norm(self.mlp(torch.cat([x, message], dim=-1)))
        return x + message


def other_view_index(views: int, neighbours: Tensor | None, batch: int, device) -> Tensor:
    """``[B, V, M]`` indices of the views each view attends to / matches against.

    ``neighbours``: ``[B, V, 1 + M]`` nearest-view table whose first column is the view itself,
    or ``None`` for all other views in order.
    """
    if neighbours is not None:
        return neighbours[:, :, 1:]
    rows = [[j for j in range(views) if j != i] for i in range(views)]
    return torch.tensor(rows, device=device).expand(batch, views, views - 1)


def gather_views(x: Tensor, index: Tensor) -> Tensor:
    """``x [B, V, ...]``, ``index [B, V, M]`` -> ``[B, V, M, ...]``."""
    b, v, m = index.shape
    flat = index.reshape(b, v * m)
    out = x[torch.arange(b, device=x.device)[:, None], flat]
    return out.reshape(b, v, m, *x.shape[2:])


class _TransformerBlock(nn.Module):
    def __init__(self, dim: int, mlp_ratio: int) -> None:
        super().__init__()
        self.self_attn = _AttentionLayer(dim, mlp=False)
        self.cross_attn = _AttentionLayer(dim, mlp=True, mlp_ratio=mlp_ratio)


class CrossViewTransformer(nn.Module):
    """Window self- and cross-view attention over per-view feature maps.

    Args:
        dim: feature channels.
        depth: blocks (odd ones use shifted windows).
        mlp_ratio: MLP expansion (of the concatenated ``2 * dim`` input).
    """

    def __init__(self, dim: int = 128, depth: int = 6, mlp_ratio: int = 4) -> None:
        super().__init__()
        self.dim = dim
        self.blocks = nn.ModuleList([_TransformerBlock(dim, mlp_ratio) for _ in range(depth)])
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)

    def forward(
        self, features: Tensor, splits: int = 2, neighbours: Tensor | None = None
    ) -> Tensor:
        """``features [B, V, C, H, W]`` -> ``[B, V, C, H, W]``.

        Args:
            splits: windows per side.
            neighbours: ``[B, V, 1 + M]`` nearest-view table (first column the view itself), or
                ``None``: each view attends to all the others.
        """
        b, v, c, h, w = features.shape
        x = features.permute(0, 1, 3, 4, 2)  # [B, V, H, W, C]
        index = other_view_index(v, neighbours, b, features.device)  # [B, V, M]
        mask = _shift_mask(h, w, splits, features.device) if splits > 1 else None
        for i, block in enumerate(self.blocks):
            shift = splits > 1 and i % 2 == 1
            # the other views as they entered this block (before its self-attention)
            context = gather_views(x, index).reshape(b * v, -1, h, w, c)
            flat = x.reshape(b * v, h, w, c)
            flat = block.self_attn(flat, flat[:, None], splits, shift, mask)
            x = block.cross_attn(flat, context, splits, shift, mask).view(b, v, h, w, c)
        return x.permute(0, 1, 4, 2, 3).contiguous()
