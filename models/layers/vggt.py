"""VGGT-style geometry trunk: a DINOv2 patch encoder, an alternating frame/global attention
aggregator with camera and register tokens, an iterative camera head and VGGT's DPT head.

This is this project's implementation of the architecture described in VGGT (Wang et al., CVPR
2025) as AnySplat and SplatWeaver use it; parameter names follow the module tree of those releases
so that their checkpoints map onto it key by key (the families' ``checkpoint_filter_fn`` do the
renaming and checking); the DPT heads have the project's one layout, which
``models.layers.backbones.dpt.release_dpt_key`` maps the release's names onto.

Pieces:

- ``Block``: pre-norm transformer block (optional QK-norm and 2D RoPE, LayerScale);
- ``DinoPatchEncoder``: DINOv2 ViT with register tokens; its normalised patch tokens are the
  aggregator's input tokens (position embedding resampled bicubically to other grids);
- ``AlternatingAggregator``: a camera token and register tokens per view (one set for view 0,
  another for the others), then ``depth`` pairs of (per-view attention, all-view attention);
  intermediate outputs are ``[frame tokens || global tokens]`` (``2C`` channels);
- ``CameraHead``: adaptive-LayerNorm trunk on the camera tokens refining a 9-number pose encoding
  (translation, quaternion xyzw, two fields of view) over a few iterations;
- ``pose_encoding_to_cameras``: that encoding to world-to-camera ``[R|t]`` and pixel intrinsics;
- ``vggt_dpt``: VGGT's DPT head, the project's ``DPTHead`` (``models.layers.backbones.dpt``) with
  its VGGT options (token LayerNorm, UV embedding, rectified residual units, aligned corners).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.layers.backbones.da3_vit import LayerScale, Mlp  # the same DINOv2-style blocks
from models.layers.backbones.dpt import DPTHead
from models.layers.release_frame import unproject_depth

__all__ = [
    "Block",
    "DinoPatchEncoder",
    "AlternatingAggregator",
    "CameraHead",
    "RotaryEmbedding2D",
    "pose_encoding_to_cameras",
    "quaternion_xyzw_to_matrix",
    "trunk_and_geometry",
    "vggt_dpt",
]

RESNET_MEAN = (0.485, 0.456, 0.406)
RESNET_STD = (0.229, 0.224, 0.225)


# ----------------------------------------------------------------------------- blocks
class RotaryEmbedding2D(nn.Module):
    """2D rotary position embedding: the first half of each head's channels rotates with the
    token's row, the second half with its column (RoPE-ViT / CroCo style)."""

    def __init__(self, frequency: float = 100.0) -> None:
        super().__init__()
        self.frequency = frequency

    def _rotate(self, x: Tensor, position: Tensor) -> Tensor:
        """``x [B, heads, N, d]`` rotated by integer positions ``[B, N]``."""
        d = x.shape[-1]
        exponents = torch.arange(0, d, 2, device=x.device).float() / d
        inv_freq = 1.0 / (self.frequency**exponents)  # [d / 2]
        angles = position.to(inv_freq.dtype)[..., None] * inv_freq  # [B, N, d / 2]
        angles = torch.cat([angles, angles], dim=-1).to(x.dtype)
        cos, sin = angles.cos()[:, None], angles.sin()[:, None]  # [B, 1, N, d]
        half = d // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin

    def forward(self, x: Tensor, positions: Tensor) -> Tensor:
        """``x [B, heads, N, D]``, ``positions [B, N, 2]`` (row, column) -> same shape as ``x``."""
        rows, cols = x.chunk(2, dim=-1)
        return torch.cat(
            [self._rotate(rows, positions[..., 0]), self._rotate(cols, positions[..., 1])], dim=-1
        )


class Attention(nn.Module):
    """Multi-head self-attention with optional per-head LayerNorm on q, k and 2D RoPE."""

    def __init__(
        self, dim: int, num_heads: int, qk_norm: bool = False, rope: RotaryEmbedding2D | None = None
    ) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"dim {dim} must be divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        head_dim = dim // num_heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.q_norm = nn.LayerNorm(head_dim) if qk_norm else nn.Identity()
        self.k_norm = nn.LayerNorm(head_dim) if qk_norm else nn.Identity()
        self.proj = nn.Linear(dim, dim)
        self.rope = rope

    def forward(self, x: Tensor, positions: Tensor | None = None) -> Tensor:
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.num_heads, c // self.num_heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # [B, heads, N, d] each
        q, k = self.q_norm(q), self.k_norm(k)
        if self.rope is not None and positions is not None:
            q, k = self.rope(q, positions), self.rope(k, positions)
        out = F.scaled_dot_product_attention(q, k, v)  # [B, heads, N, d]
        return self.proj(out.transpose(1, 2).reshape(b, n, c))


class Block(nn.Module):
    """Pre-norm transformer block with LayerScale on both residual branches.

    Args:
        dim: token width.
        num_heads: attention heads.
        mlp_ratio: MLP hidden width over ``dim``.
        init_values: LayerScale initial value (``None``: no LayerScale).
        qk_norm: LayerNorm on each head's queries and keys.
        rope: shared 2D RoPE module (``None``: no rotary embedding).
        norm_eps: epsilon of the two block LayerNorms (DINOv2 uses 1e-6, VGGT's trunk 1e-5).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        mlp_ratio: float = 4.0,
        init_values: float | None = None,
        qk_norm: bool = False,
        rope: RotaryEmbedding2D | None = None,
        norm_eps: float = 1e-5,
    ) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps)
        self.attn = Attention(dim, num_heads, qk_norm=qk_norm, rope=rope)
        self.ls1 = LayerScale(dim, init_values) if init_values else nn.Identity()
        self.norm2 = nn.LayerNorm(dim, eps=norm_eps)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))
        self.ls2 = LayerScale(dim, init_values) if init_values else nn.Identity()

    def forward(self, x: Tensor, positions: Tensor | None = None) -> Tensor:
        x = x + self.ls1(self.attn(self.norm1(x), positions))
        return x + self.ls2(self.mlp(self.norm2(x)))


# ----------------------------------------------------------------------------- DINOv2 encoder
class PatchProjection(nn.Module):
    """Non-overlapping patch convolution: ``[N, 3, H, W] -> [N, (H/p)(W/p), C]``."""

    def __init__(self, patch_size: int, embed_dim: int) -> None:
        super().__init__()
        self.patch_size = patch_size
        self.proj = nn.Conv2d(3, embed_dim, kernel_size=patch_size, stride=patch_size)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)


class DinoPatchEncoder(nn.Module):
    """DINOv2 ViT with register tokens; returns its final-normed patch tokens.

    Args:
        embed_dim, depth, num_heads: ViT shape (ViT-L/14: 1024, 24, 16).
        patch_size: patch side in pixels.
        pos_grid: side of the stored square position-embedding grid (37 for 518-pixel DINOv2).
        num_register_tokens: register tokens after the class token.
        init_values: LayerScale initial value.
    """

    def __init__(
        self,
        embed_dim: int = 1024,
        depth: int = 24,
        num_heads: int = 16,
        patch_size: int = 14,
        pos_grid: int = 37,
        num_register_tokens: int = 4,
        init_values: float = 1.0,
    ) -> None:
        super().__init__()
        self.patch_size = patch_size
        self.pos_grid = pos_grid
        self.patch_embed = PatchProjection(patch_size, embed_dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, pos_grid * pos_grid + 1, embed_dim))
        self.register_tokens = nn.Parameter(torch.zeros(1, num_register_tokens, embed_dim))
        self.blocks = nn.ModuleList(
            Block(embed_dim, num_heads, init_values=init_values, norm_eps=1e-6)
            for _ in range(depth)
        )
        self.norm = nn.LayerNorm(embed_dim, eps=1e-6)
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        nn.init.normal_(self.cls_token, std=1e-6)
        nn.init.normal_(self.register_tokens, std=1e-6)

    def position_embedding(self, grid: tuple[int, int], dtype: torch.dtype) -> Tensor:
        """``[1, 1 + h*w, C]``: the stored grid, resampled bicubically (antialiased) if needed."""
        h, w = grid
        if h == w == self.pos_grid:
            return self.pos_embed
        pos = self.pos_embed.float()
        cls, patches = pos[:, :1], pos[:, 1:]
        m = self.pos_grid
        patches = patches.reshape(1, m, m, -1).permute(0, 3, 1, 2)
        patches = F.interpolate(patches, size=(h, w), mode="bicubic", antialias=True)
        patches = patches.permute(0, 2, 3, 1).reshape(1, h * w, -1)
        return torch.cat([cls, patches], dim=1).to(dtype)

    def forward(self, images: Tensor) -> Tensor:
        """``images [N, 3, H, W]`` (normalised) -> patch tokens ``[N, (H/p)(W/p), C]``."""
        n, _, height, width = images.shape
        p = self.patch_size
        x = self.patch_embed(images)  # [N, P, C]
        x = torch.cat([self.cls_token.expand(n, -1, -1), x], dim=1)
        x = x + self.position_embedding((height // p, width // p), x.dtype)
        x = torch.cat([x[:, :1], self.register_tokens.expand(n, -1, -1), x[:, 1:]], dim=1)
        for block in self.blocks:
            x = block(x)
        return self.norm(x)[:, 1 + self.register_tokens.shape[1] :]


# ----------------------------------------------------------------------------- aggregator
class AlternatingAggregator(nn.Module):
    """Per-view and all-view attention in alternation over DINOv2 patch tokens plus camera and
    register tokens (VGGT's aggregator).

    Args:
        embed_dim, depth, num_heads, mlp_ratio: shape of the frame and global blocks (``depth``
            of each kind).
        num_register_tokens: register tokens per view.
        patch_size: pixels per patch.
        encoder_depth, encoder_heads, pos_grid: the DINOv2 patch encoder (same width).
        rope_frequency: base frequency of the 2D RoPE.
        init_values: LayerScale initial value of the frame and global blocks.
    """

    def __init__(
        self,
        embed_dim: int = 1024,
        depth: int = 24,
        num_heads: int = 16,
        mlp_ratio: float = 4.0,
        num_register_tokens: int = 4,
        patch_size: int = 14,
        encoder_depth: int = 24,
        encoder_heads: int = 16,
        pos_grid: int = 37,
        rope_frequency: float = 100.0,
        init_values: float = 0.01,
    ) -> None:
        super().__init__()
        self.patch_size = patch_size
        self.depth = depth
        self.patch_embed = DinoPatchEncoder(
            embed_dim, encoder_depth, encoder_heads, patch_size, pos_grid, num_register_tokens
        )
        self.rope = RotaryEmbedding2D(rope_frequency)

        def blocks() -> nn.ModuleList:
            return nn.ModuleList(
                Block(embed_dim, num_heads, mlp_ratio, init_values, qk_norm=True, rope=self.rope)
                for _ in range(depth)
            )

        self.frame_blocks = blocks()
        self.global_blocks = blocks()
        # index 0: view 0's token; index 1: every other view's
        self.camera_token = nn.Parameter(torch.randn(1, 2, 1, embed_dim) * 1e-6)
        self.register_token = nn.Parameter(torch.randn(1, 2, num_register_tokens, embed_dim) * 1e-6)
        self.patch_start_idx = 1 + num_register_tokens
        # ImageNet statistics rounded to bfloat16: the releases hold their aggregator (these
        # constants included) in bfloat16, so that is what their normalisation uses.
        for name, value in (("image_mean", RESNET_MEAN), ("image_std", RESNET_STD)):
            constant = torch.tensor(value).to(torch.bfloat16).float().view(1, 1, 3, 1, 1)
            self.register_buffer(name, constant, persistent=False)

    @staticmethod
    def _per_view(token: Tensor, b: int, s: int) -> Tensor:
        """``[1, 2, X, C]`` -> ``[B*S, X, C]`` (entry 0 for view 0, entry 1 for the rest)."""
        first = token[:, :1].expand(b, 1, *token.shape[2:])
        rest = token[:, 1:].expand(b, s - 1, *token.shape[2:])
        return torch.cat([first, rest], dim=1).reshape(b * s, *token.shape[2:])

    def forward(self, images: Tensor, layers: Sequence[int]) -> list[Tensor]:
        """``images [B, S, 3, H, W]`` in [0, 1] (sides multiples of the patch size).

        Returns:
            ``[B, S, P, 2C]`` tokens (camera, registers, patches) after each block index in
            ``sorted(set(layers) | {depth - 1})``.
        """
        b, s, _, height, width = images.shape
        h, w = height // self.patch_size, width // self.patch_size
        x = (images - self.image_mean) / self.image_std
        patches = self.patch_embed(x.reshape(b * s, 3, height, width))  # [BS, hw, C]
        tokens = torch.cat(
            [self._per_view(self.camera_token, b, s), self._per_view(self.register_token, b, s)]
            + [patches],
            dim=1,
        )  # [BS, P, C]
        _, p, c = tokens.shape
        grid = torch.cartesian_prod(
            torch.arange(h, device=images.device), torch.arange(w, device=images.device)
        )  # [hw, 2] (row, column)
        positions = torch.cat(
            [torch.zeros(self.patch_start_idx, 2, dtype=grid.dtype, device=grid.device), grid + 1]
        )  # special tokens at 0, patches from 1
        frame_positions = positions.expand(b * s, p, 2)
        global_positions = positions.repeat(s, 1).expand(b, s * p, 2)
        wanted = set(layers) | {self.depth - 1}
        outputs = []
        for i in range(self.depth):
            tokens = self.frame_blocks[i](tokens.reshape(b * s, p, c), frame_positions)
            frame_out = tokens.reshape(b, s, p, c)
            tokens = self.global_blocks[i](tokens.reshape(b, s * p, c), global_positions)
            if i in wanted:
                outputs.append(torch.cat([frame_out, tokens.reshape(b, s, p, c)], dim=-1))
        return outputs


# ----------------------------------------------------------------------------- camera head
class CameraHead(nn.Module):
    """Iterative camera prediction from the camera tokens of the last aggregator layer.

    Each iteration embeds the current 9-number encoding (a learned empty encoding at first),
    modulates the normalised camera tokens (adaptive LayerNorm: shift, scale, gate), runs the
    trunk across views and adds a predicted delta. Encodings: translation (linear), quaternion
    xyzw (linear), two fields of view (ReLU).
    """

    def __init__(
        self,
        dim: int = 2048,
        trunk_depth: int = 4,
        num_heads: int = 16,
        mlp_ratio: float = 4.0,
        init_values: float = 0.01,
    ) -> None:
        super().__init__()
        self.trunk = nn.Sequential(
            *(Block(dim, num_heads, mlp_ratio, init_values) for _ in range(trunk_depth))
        )
        self.token_norm = nn.LayerNorm(dim)
        self.trunk_norm = nn.LayerNorm(dim)
        self.empty_pose_tokens = nn.Parameter(torch.zeros(1, 1, 9))
        self.embed_pose = nn.Linear(9, dim)
        self.poseLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(dim, 3 * dim))
        self.adaln_norm = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.pose_branch = Mlp(dim, dim // 2, 9)

    def forward(self, tokens: Tensor, iterations: int = 4) -> list[Tensor]:
        """``tokens [B, S, P, dim]`` (last layer) -> encodings ``[B, S, 9]``, one per iteration."""
        camera = self.token_norm(tokens[:, :, 0])  # [B, S, dim]
        b, s, _ = camera.shape
        encoding = None
        encodings = []
        for _ in range(iterations):
            source = self.empty_pose_tokens.expand(b, s, -1) if encoding is None else encoding
            shift, scale, gate = self.poseLN_modulation(self.embed_pose(source)).chunk(3, dim=-1)
            x = gate * (self.adaln_norm(camera) * (1 + scale) + shift) + camera
            delta = self.pose_branch(self.trunk_norm(self.trunk(x)))
            encoding = delta if encoding is None else encoding + delta
            encodings.append(torch.cat([encoding[..., :7], F.relu(encoding[..., 7:])], dim=-1))
        return encodings


def quaternion_xyzw_to_matrix(q: Tensor) -> Tensor:
    """Rotation matrices ``[..., 3, 3]`` of (not necessarily unit) quaternions ``[..., 4]`` xyzw:
    VGGT's order and arithmetic (``2 / |q|^2``), kept apart from :mod:`models.geometry.rotations`
    so the port stays exact with the release."""
    x, y, z, w = q.unbind(-1)
    two_s = 2.0 / (q * q).sum(-1)
    m = torch.stack(
        [
            1 - two_s * (y * y + z * z),
            two_s * (x * y - z * w),
            two_s * (x * z + y * w),
            two_s * (x * y + z * w),
            1 - two_s * (x * x + z * z),
            two_s * (y * z - x * w),
            two_s * (x * z - y * w),
            two_s * (y * z + x * w),
            1 - two_s * (x * x + y * y),
        ],
        dim=-1,
    )
    return m.reshape(*q.shape[:-1], 3, 3)


def pose_encoding_to_cameras(encoding: Tensor, size: tuple[int, int]) -> tuple[Tensor, Tensor]:
    """VGGT's 9-number encoding to cameras.

    Args:
        encoding: ``[..., 9]``: world-to-camera translation, quaternion xyzw, field of view
            (vertical, horizontal) in radians.
        size: ``(H, W)`` in pixels.

    Returns:
        World-to-camera ``[R | t]`` ``[..., 3, 4]`` (OpenCV axes) and pixel intrinsics
        ``[..., 3, 3]`` (principal point at ``(W/2, H/2)``).
    """
    h, w = size
    rotation = quaternion_xyzw_to_matrix(encoding[..., 3:7])
    extrinsics = torch.cat([rotation, encoding[..., :3, None]], dim=-1)
    fy = (h / 2.0) / (torch.tan(encoding[..., 7] / 2.0) + 1e-3)
    fx = (w / 2.0) / (torch.tan(encoding[..., 8] / 2.0) + 1e-3)
    intrinsics = torch.zeros(
        *encoding.shape[:-1], 3, 3, dtype=encoding.dtype, device=encoding.device
    )
    intrinsics[..., 0, 0] = fx
    intrinsics[..., 1, 1] = fy
    intrinsics[..., 0, 2] = w / 2
    intrinsics[..., 1, 2] = h / 2
    intrinsics[..., 2, 2] = 1.0
    return extrinsics, intrinsics


# ----------------------------------------------------------------------------- DPT
def vggt_dpt(dim: int, features: int, channels: Sequence[int], out_dim: int) -> DPTHead:
    """VGGT's DPT on ``dim``-channel aggregator tokens (``2C``).

    ``features`` fusion width, ``channels`` the four projection widths; ``head_in`` (the
    release's ``output_conv1``) halves the width at 8x the patch grid; ``head_out`` (its
    ``output_conv2``: 3x3 conv to 32 channels, ReLU, 1x1 conv) gives ``out_dim`` channels (0: no
    ``head_out``, for a model with output layers of its own). Call it with the aggregator's
    ``patch_start_idx`` as ``prefix_tokens``.
    """
    return DPTHead(
        dim,
        layer_dims=channels,
        features=features,
        token_norm=True,
        uv_embed=True,
        align_corners=True,
        rectify=True,
        upsample_last=True,
        head_dim=features // 2,
        out_dim=out_dim,
        out_hidden=32,
        shallow_dim=0,
    )


def trunk_and_geometry(
    aggregator: AlternatingAggregator,
    camera_head: CameraHead,
    depth_head: DPTHead,
    images: Tensor,
    out_layers: Sequence[int],
    dtype: torch.dtype,
) -> tuple[list[Tensor], tuple[Tensor, Tensor, Tensor], tuple[Tensor, Tensor, Tensor]]:
    """The VGGT trunk and its camera and depth heads on ``images [B, V, 3, H, W]`` in [0, 1],
    as the releases built on VGGT-1B run them (SplatWeaver's, AnySplat's): the aggregator's input
    rounded to bfloat16 (the released aggregator's dtype), its outputs cast to ``dtype``.

    Returns:
        ``(layers, cameras, geometry)``: the aggregator's ``out_layers`` ``[B, V, T, 2C]``; the
        cameras ``(pose encoding [B, V, 9], c2w [B, V, 4, 4], normalised intrinsics
        [B, V, 3, 3])``; the geometry ``(depth [B, V, H, W], depth confidence, points
        [B, V, H, W, 3])``, all in the release's frame.
    """
    b, v, _, h, w = images.shape
    p = aggregator.patch_size
    trunk_in = images.to(torch.bfloat16).to(aggregator.camera_token.dtype)
    outputs = aggregator(trunk_in, list(out_layers))
    kept = sorted(set(out_layers) | {aggregator.depth - 1})
    by_layer = {layer: t.to(dtype) for layer, t in zip(kept, outputs)}
    layers = [by_layer[i] for i in out_layers]
    start = aggregator.patch_start_idx

    encoding = camera_head(by_layer[aggregator.depth - 1])[-1]  # [B, V, 9]
    w2c, pixel_k = pose_encoding_to_cameras(encoding, (h, w))
    raw_depth = depth_head(layers, (h // p, w // p), (h, w), prefix_tokens=start)
    raw_depth = raw_depth.unflatten(0, (b, v))  # [B, V, 2, H, W]
    depth = torch.exp(raw_depth[:, :, 0])
    depth_conf = 1 + torch.exp(raw_depth[:, :, 1])
    points = unproject_depth(depth, w2c, pixel_k)  # [B, V, H, W, 3]
    bottom = w2c.new_tensor([0.0, 0.0, 0.0, 1.0]).expand(b, v, 1, 4)
    c2w = torch.linalg.inv(torch.cat([w2c, bottom], dim=2))  # [B, V, 4, 4]
    intrinsics = torch.stack(
        [pixel_k[..., 0, :] / w, pixel_k[..., 1, :] / h, pixel_k[..., 2, :]], dim=-2
    )
    return layers, (encoding, c2w, intrinsics), (depth, depth_conf, points)
