"""Depth Anything 3's multi-view ViT (a DINOv2 ViT with alternating per-view / all-view attention)
and its camera-prior encoder, in this project's code.

What it computes (Lin et al., "Depth Anything 3", 2025, as ZipSplat's release uses it):

- patch embedding (a stride-``p`` convolution), a class token and a learned absolute position
  embedding stored for 518 px (37 x 37 patches), resampled bicubically to the input grid with
  DINOv2's ``+0.1`` offset trick (``F.interpolate(scale_factor=(h + 0.1) / 37, ...)``, no
  antialiasing). The input is the image in [0, 1] as is (no ImageNet normalisation).
- ``depth`` pre-norm blocks (LayerNorm eps 1e-6, LayerScale). From block ``alt_start`` on, odd
  blocks attend over every view's tokens together ("global"), the others within a view ("local");
  at block ``alt_start`` the class token of every view is replaced by a camera token: a learned
  one for view 0 and another shared by the other views, or, with a camera prior, the
  ``CameraEncoder``'s token of each view. Blocks from ``qknorm_start`` LayerNorm queries and keys
  per head (eps 1e-5); blocks from ``rope_start`` apply a 2D rotary embedding (base frequency 100,
  the first half of each head's channels rotated by the patch row, the second half by the column).
  Local blocks use the patch's (row + 1, column + 1); global blocks give every patch (1, 1), so
  RoPE only separates the camera token from the patches there; the camera token is at (0, 0).
- at each output layer the token of the last local block and of the current block are
  concatenated, ``[local ‖ current]``; the final LayerNorm is applied to the second half only.
- the MLP is GELU (S/B/L) or SwiGLU (giant; hidden ``(int(4 * D * 2 / 3) + 7) // 8 * 8``), in
  plain PyTorch: ``w3(silu(a) * b)`` with ``a, b = w12(x).chunk(2)``. (The release uses xformers'
  fused SwiGLU when installed; its own notes say that drifts slightly from this arithmetic.)
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

__all__ = ["DA3_SIZES", "CameraEncoder", "DA3Encoder", "DA3VisionTransformer", "rotation_to_quat"]

# The Depth Anything 3 sizes as ZipSplat's configs define them (configs/model/backbone/da3*.yaml):
# width, depth, heads, MLP, first alternating/qk-norm/RoPE block and the three layers it reads.
DA3_SIZES: dict[str, dict] = {
    "small": dict(
        embed_dim=384, depth=12, num_heads=6, ffn="mlp", alt_start=5, out_layers=(5, 7, 11)
    ),
    "base": dict(
        embed_dim=768, depth=12, num_heads=12, ffn="mlp", alt_start=4, out_layers=(5, 8, 11)
    ),
    "large": dict(
        embed_dim=1024, depth=24, num_heads=16, ffn="mlp", alt_start=8, out_layers=(11, 17, 23)
    ),
    "giant": dict(
        embed_dim=1536, depth=40, num_heads=24, ffn="swiglu", alt_start=13, out_layers=(19, 29, 39)
    ),
}


class LayerScale(nn.Module):
    """Per-channel residual gain ``x * gamma``."""

    def __init__(self, dim: int, init_values: float) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.full((dim,), float(init_values)))

    def forward(self, x: Tensor) -> Tensor:
        return x * self.gamma


class Mlp(nn.Module):
    """``fc2(gelu(fc1(x)))``."""

    def __init__(self, in_dim: int, hidden_dim: int, out_dim: int | None = None) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_dim, hidden_dim)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden_dim, out_dim or in_dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.act(self.fc1(x)))


class SwiGLU(nn.Module):
    """``w3(silu(a) * b)``, ``a, b = w12(x).chunk(2)``; hidden width rounded as DINOv2 does."""

    def __init__(self, in_dim: int, hidden_dim: int) -> None:
        super().__init__()
        hidden = (int(hidden_dim * 2 / 3) + 7) // 8 * 8
        self.w12 = nn.Linear(in_dim, 2 * hidden)
        self.w3 = nn.Linear(hidden, in_dim)

    def forward(self, x: Tensor) -> Tensor:
        a, b = self.w12(x).chunk(2, dim=-1)
        return self.w3(F.silu(a) * b)


def _rotate_half(x: Tensor) -> Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat([-second, first], dim=-1)


def rope_2d(x: Tensor, positions: Tensor, base: float = 100.0) -> Tensor:
    """2D rotary embedding of ``x [B, heads, N, d]`` at integer ``positions [B, N, 2]`` (row, col).

    The first ``d / 2`` channels rotate with the row, the rest with the column; in each half the
    frequencies are ``base ** (-2i / (d / 2))`` and channels ``j`` and ``j + d / 4`` form a pair.
    """
    half = x.shape[-1] // 2
    inv_freq = 1.0 / (base ** (torch.arange(0, half, 2, device=x.device).float() / half))
    out = []
    for axis, part in enumerate(x.chunk(2, dim=-1)):
        angles = positions[..., axis].to(inv_freq.dtype)[..., None] * inv_freq  # [B, N, half/2]
        angles = torch.cat([angles, angles], dim=-1).to(x.dtype)[:, None]  # [B, 1, N, half]
        out.append(part * angles.cos() + _rotate_half(part) * angles.sin())
    return torch.cat(out, dim=-1)


class Attention(nn.Module):
    """Multi-head self-attention with optional per-head q/k LayerNorm and 2D RoPE."""

    def __init__(self, dim: int, num_heads: int, qk_norm: bool = False, rope: bool = False):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"dim {dim} is not divisible by {num_heads} heads")
        self.num_heads = num_heads
        head_dim = dim // num_heads
        if rope and head_dim % 4:
            raise ValueError(f"2D RoPE needs a head width divisible by 4, got {head_dim}")
        self.qkv = nn.Linear(dim, 3 * dim)
        self.q_norm = nn.LayerNorm(head_dim) if qk_norm else nn.Identity()
        self.k_norm = nn.LayerNorm(head_dim) if qk_norm else nn.Identity()
        self.proj = nn.Linear(dim, dim)
        self.rope = rope

    def forward(self, x: Tensor, positions: Tensor | None = None) -> Tensor:
        q, k, v = rearrange(
            self.qkv(x), "b n (three h d) -> three b h n d", three=3, h=self.num_heads
        )
        q, k = self.q_norm(q), self.k_norm(k)
        if self.rope and positions is not None:
            q, k = rope_2d(q, positions), rope_2d(k, positions)
        out = F.scaled_dot_product_attention(q, k, v)  # [B, h, N, d]
        return self.proj(rearrange(out, "b h n d -> b n (h d)"))


class Block(nn.Module):
    """Pre-norm transformer block: ``x + ls1(attn(norm1 x))``, then ``x + ls2(mlp(norm2 x))``."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        mlp_ratio: float = 4.0,
        ffn: str = "mlp",
        init_values: float = 1.0,
        norm_eps: float = 1e-5,
        qk_norm: bool = False,
        rope: bool = False,
    ) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps)
        self.attn = Attention(dim, num_heads, qk_norm=qk_norm, rope=rope)
        self.ls1 = LayerScale(dim, init_values)
        self.norm2 = nn.LayerNorm(dim, eps=norm_eps)
        hidden = int(dim * mlp_ratio)
        self.mlp = SwiGLU(dim, hidden) if ffn == "swiglu" else Mlp(dim, hidden)
        self.ls2 = LayerScale(dim, init_values)

    def forward(self, x: Tensor, positions: Tensor | None = None) -> Tensor:
        x = x + self.ls1(self.attn(self.norm1(x), positions))
        return x + self.ls2(self.mlp(self.norm2(x)))


class PatchEmbed(nn.Module):
    """Non-overlapping ``p x p`` patches to tokens: ``[N, 3, H, W] -> [N, h*w, C]``."""

    def __init__(self, patch_size: int, in_chans: int, embed_dim: int) -> None:
        super().__init__()
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)


def rotation_to_quat(matrix: Tensor) -> Tensor:
    """Rotation matrices ``[..., 3, 3]`` to unit quaternions ``[..., 4]`` (wxyz, ``w >= 0``).

    Depth Anything 3's own arithmetic (its clamp at 0, not :mod:`models.geometry.rotations`'
    1e-12), kept so the port stays bit-exact with the release.

    Each of the four algebraic candidates is computed and the one with the largest denominator
    (the best conditioned) is kept.
    """
    m = matrix.reshape(*matrix.shape[:-2], 9)
    m00, m01, m02, m10, m11, m12, m20, m21, m22 = m.unbind(-1)
    squares = torch.stack(
        [1 + m00 + m11 + m22, 1 + m00 - m11 - m22, 1 - m00 + m11 - m22, 1 - m00 - m11 + m22], -1
    )
    roots = torch.sqrt(squares.clamp_min(0.0))  # [..., 4]: 2|w|, 2|x|, 2|y|, 2|z|
    candidates = torch.stack(
        [
            torch.stack([roots[..., 0] ** 2, m21 - m12, m02 - m20, m10 - m01], -1),
            torch.stack([m21 - m12, roots[..., 1] ** 2, m10 + m01, m02 + m20], -1),
            torch.stack([m02 - m20, m10 + m01, roots[..., 2] ** 2, m12 + m21], -1),
            torch.stack([m10 - m01, m20 + m02, m21 + m12, roots[..., 3] ** 2], -1),
        ],
        dim=-2,
    )  # [..., 4 candidates, 4]
    candidates = candidates / (2.0 * roots[..., None].clamp_min(0.1))
    best = roots.argmax(dim=-1)[..., None, None].expand(*roots.shape[:-1], 1, 4)
    quat = candidates.gather(-2, best).squeeze(-2)
    return torch.where(quat[..., :1] < 0, -quat, quat)


class CameraEncoder(nn.Module):
    """Camera prior to one token per view (DA3's ``cam_enc``).

    The encoding of a camera is ``[t, q_xyzw, fov_y, fov_x]`` of its world-to-camera transform,
    lifted by an MLP (9 -> D/2 -> D), LayerNormed, run through ``depth`` self-attention blocks
    (16 heads, LayerScale 0.01) and LayerNormed again.
    """

    def __init__(self, dim: int, depth: int = 4, num_heads: int = 16) -> None:
        super().__init__()
        self.pose_branch = Mlp(9, dim // 2, dim)
        self.token_norm = nn.LayerNorm(dim)
        self.trunk = nn.Sequential(*[Block(dim, num_heads, init_values=0.01) for _ in range(depth)])
        self.trunk_norm = nn.LayerNorm(dim)

    @staticmethod
    def encode(extrinsics: Tensor, intrinsics: Tensor) -> Tensor:
        """``[B, V, 9]`` encodings of camera-to-world ``extrinsics [B, V, 4, 4]`` and normalised
        ``intrinsics [B, V, 3, 3]``."""
        rotation = extrinsics[..., :3, :3].transpose(-1, -2)  # world-to-camera
        translation = -(rotation @ extrinsics[..., :3, 3:])[..., 0]
        quat = rotation_to_quat(rotation)[..., [1, 2, 3, 0]]  # xyzw
        fov_y = 2 * torch.atan(0.5 / intrinsics[..., 1, 1])
        fov_x = 2 * torch.atan(0.5 / intrinsics[..., 0, 0])
        return torch.cat([translation, quat, fov_y[..., None], fov_x[..., None]], -1).float()

    def forward(self, extrinsics: Tensor, intrinsics: Tensor) -> Tensor:
        """Camera tokens ``[B, V, D]``."""
        tokens = self.token_norm(self.pose_branch(self.encode(extrinsics, intrinsics)))
        return self.trunk_norm(self.trunk(tokens))


class DA3VisionTransformer(nn.Module):
    """The DA3 ViT (see the module docstring).

    Args:
        embed_dim, depth, num_heads: transformer shape.
        out_layers: blocks whose ``[local ‖ current]`` tokens are returned.
        alt_start: first block of alternating attention (and of the camera token).
        qknorm_start, rope_start: first blocks with q/k norm and RoPE (``None``: ``alt_start``).
        ffn: ``"mlp"`` (GELU) or ``"swiglu"``.
        patch_size: patch side in pixels.
        pos_embed_size: side (pixels) of the stored position-embedding grid (518 in DA3).
        mlp_ratio: MLP hidden width over ``embed_dim``.
    """

    def __init__(
        self,
        *,
        embed_dim: int,
        depth: int,
        num_heads: int,
        out_layers: Sequence[int],
        alt_start: int,
        qknorm_start: int | None = None,
        rope_start: int | None = None,
        ffn: str = "mlp",
        patch_size: int = 14,
        pos_embed_size: int = 518,
        mlp_ratio: float = 4.0,
    ) -> None:
        super().__init__()
        if not 0 <= alt_start < depth:
            raise ValueError(f"alt_start must be in [0, {depth}), got {alt_start}")
        if any(not 0 <= i < depth for i in out_layers):
            raise ValueError(f"out_layers must be in [0, {depth}), got {list(out_layers)}")
        qknorm_start = alt_start if qknorm_start is None else qknorm_start
        rope_start = alt_start if rope_start is None else rope_start
        self.embed_dim = embed_dim
        self.patch_size = patch_size
        self.out_layers = [int(i) for i in out_layers]
        self.alt_start = alt_start
        self.rope_start = rope_start
        grid = pos_embed_size // patch_size
        self.patch_embed = PatchEmbed(patch_size, 3, embed_dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.camera_token = nn.Parameter(torch.randn(1, 2, embed_dim) * 0.02)
        self.pos_embed = nn.Parameter(torch.randn(1, grid * grid + 1, embed_dim) * 0.02)
        self.blocks = nn.ModuleList(
            [
                Block(
                    embed_dim,
                    num_heads,
                    mlp_ratio=mlp_ratio,
                    ffn=ffn,
                    init_values=1.0,
                    norm_eps=1e-6,
                    qk_norm=i >= qknorm_start,
                    rope=i >= rope_start,
                )
                for i in range(depth)
            ]
        )
        self.norm = nn.LayerNorm(embed_dim, eps=1e-6)

    def is_global(self, index: int) -> bool:
        """Whether block ``index`` attends over all views."""
        return index >= self.alt_start and index % 2 == 1

    def position_embedding(self, h: int, w: int) -> Tensor:
        """``[1, 1 + h*w, C]``: the stored embedding resampled to an ``h x w`` grid as DINOv2
        does (bicubic with ``scale_factor = (n + 0.1) / M``, which lands on ``n`` exactly)."""
        stored = self.pos_embed
        m = int(math.isqrt(stored.shape[1] - 1))
        if h == w == m:
            return stored
        patches = stored[:, 1:].float().reshape(1, m, m, -1).permute(0, 3, 1, 2)
        patches = F.interpolate(
            patches, scale_factor=((h + 0.1) / m, (w + 0.1) / m), mode="bicubic", antialias=False
        )
        if patches.shape[-2:] != (h, w):  # pragma: no cover - guarded by the +0.1 offset
            raise RuntimeError(f"position embedding resampled to {patches.shape[-2:]}, not {h, w}")
        patches = patches.permute(0, 2, 3, 1).reshape(1, h * w, -1)
        return torch.cat([stored[:, :1].float(), patches], dim=1).to(stored.dtype)

    def forward(self, images: Tensor, camera_tokens: Tensor | None = None) -> list[Tensor]:
        """Tokens of ``images [B, V, 3, H, W]`` (sides multiples of the patch size).

        Args:
            images: in [0, 1].
            camera_tokens: ``[B, V, C]`` to use instead of the learned camera tokens.

        Returns:
            One ``[B, V, h*w, 2C]`` tensor per ``out_layers`` entry, in that order.
        """
        b, v, _, height, width = images.shape
        h, w = height // self.patch_size, width // self.patch_size
        x = self.patch_embed(images.flatten(0, 1))  # [BV, hw, C]
        x = torch.cat([self.cls_token.expand(b * v, -1, -1), x], dim=1)
        x = x + self.position_embedding(h, w)
        x = rearrange(x, "(b v) n c -> b v n c", b=b)  # [B, V, 1 + hw, C]

        rows, cols = torch.meshgrid(
            torch.arange(h, device=images.device),
            torch.arange(w, device=images.device),
            indexing="ij",
        )
        local_pos = torch.stack([rows.flatten(), cols.flatten()], -1) + 1  # [hw, 2]
        local_pos = torch.cat([local_pos.new_zeros(1, 2), local_pos])  # camera token at (0, 0)
        global_pos = torch.ones_like(local_pos)
        global_pos[0] = 0

        outputs, local = [], x
        for i, block in enumerate(self.blocks):
            if i == self.alt_start:
                if camera_tokens is None:
                    camera_tokens = torch.cat(
                        [self.camera_token[:, :1], self.camera_token[:, 1:].expand(-1, v - 1, -1)],
                        dim=1,
                    ).expand(b, -1, -1)
                x = torch.cat([camera_tokens[:, :, None].to(x.dtype), x[:, :, 1:]], dim=2)
            use_rope = i >= self.rope_start
            if self.is_global(i):
                pos = global_pos.repeat(v, 1)[None].expand(b, -1, -1) if use_rope else None
                x = rearrange(
                    block(rearrange(x, "b v n c -> b (v n) c"), pos), "b (v n) c -> b v n c", v=v
                )
            else:
                pos = local_pos[None].expand(b * v, -1, -1) if use_rope else None
                x = rearrange(block(x.flatten(0, 1), pos), "(b v) n c -> b v n c", b=b)
                local = x
            if i in self.out_layers:
                outputs.append(torch.cat([local, self.norm(x)], dim=-1)[:, :, 1:])
        return outputs


class DA3Encoder(nn.Module):
    """The DA3 ViT plus its camera-prior encoder (``vit`` and ``cam_enc``).

    Args:
        vit_size: a ``DA3_SIZES`` key; the other arguments override its entries.
        camera_encoder: build ``cam_enc`` (the release has one, used only with a camera prior).
    """

    def __init__(
        self, vit_size: str = "small", *, camera_encoder: bool = True, **overrides
    ) -> None:
        super().__init__()
        if vit_size not in DA3_SIZES:
            raise ValueError(f"vit_size must be one of {sorted(DA3_SIZES)}, got {vit_size!r}")
        spec = {**DA3_SIZES[vit_size], **overrides}
        self.vit = DA3VisionTransformer(**spec)
        self.embed_dim = self.vit.embed_dim
        self.patch_size = self.vit.patch_size
        self.cam_enc = CameraEncoder(self.embed_dim) if camera_encoder else None

    def forward(
        self,
        images: Tensor,
        extrinsics: Tensor | None = None,
        intrinsics: Tensor | None = None,
    ) -> list[Tensor]:
        """Per-output-layer tokens ``[B, V, h*w, 2C]``; with cameras, their tokens replace the
        learned camera tokens."""
        tokens = None
        if extrinsics is not None and intrinsics is not None:
            if self.cam_enc is None:
                raise ValueError("this backbone has no camera encoder (camera_encoder=False)")
            tokens = self.cam_enc(extrinsics, intrinsics)
        return self.vit(images, tokens)
