"""DepthSplat's multi-view depth trunk: monocular (Depth Anything V2 / DINOv2) and multi-view
(UniMatch CNN + cross-view transformer) features, plane-sweep cost volumes, a cross-view U-Net
regressor per scale and a DPT upsampler to full-resolution inverse depth.

Shared by the DepthSplat port and the ReSplat port (which starts from the same trunk).

Conventions inside: images ``[B, V, 3, H, W]`` in [0, 1]; intrinsics normalised; extrinsics
camera-to-world OpenCV; depth candidates are *inverse* depths between ``1/far`` and ``1/near``.
The cost volume uses each reference view's intrinsics for its source views too, as the released
code does (views of one scene share intrinsics in its training data).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from models.layers.backbones.dinov2 import DINOV2_SIZES, DinoV2
from models.layers.backbones.dpt import DPTHead
from models.layers.backbones.unimatch import (
    ConvStem,
    CrossViewTransformer,
    gather_views,
    window_sine_embedding,
)
from models.layers.depth_head import DepthSoftmaxHead

__all__ = [
    "DepthTrunk",
    "CrossViewUNet",
    "DPT_CONFIGS",
    "DPT_EXTRAS",
    "MONO_LAYERS",
    "depthsplat_dpt",
    "depthsplat_dpt_extras",
    "depth_trunk_size",
]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

# Depth Anything V2's DPT widths per ViT: fusion width of the depth and feature DPTs, and the
# four projected widths
DPT_CONFIGS: dict[str, dict] = {
    "vits": {"depth_features": 32, "features": 64, "out_channels": (48, 96, 192, 384)},
    "vitb": {"depth_features": 48, "features": 96, "out_channels": (96, 192, 384, 768)},
    "vitl": {"depth_features": 64, "features": 128, "out_channels": (128, 256, 512, 1024)},
}
# DINOv2 blocks whose tokens feed the DPTs (Depth Anything V2's choice)
MONO_LAYERS: dict[str, tuple[int, ...]] = {
    "vits": (2, 5, 8, 11),
    "vitb": (2, 5, 8, 11),
    "vitl": (4, 11, 17, 23),
}


# ----------------------------------------------------------------------------- cross-view U-Net
def _group_norm(channels: int) -> nn.GroupNorm:
    return nn.GroupNorm(8 if channels % 8 == 0 else 4, channels)


class _ResBlock(nn.Module):
    """Pre-norm residual block: (GN, SiLU, conv) twice; 1x1 shortcut when channels change."""

    def __init__(self, in_dim: int, dim: int) -> None:
        super().__init__()
        self.norm1 = _group_norm(in_dim)
        self.conv1 = nn.Conv2d(in_dim, dim, 3, padding=1)
        self.norm2 = _group_norm(dim)
        self.conv2 = nn.Conv2d(dim, dim, 3, padding=1)
        nn.init.zeros_(self.conv2.weight)
        nn.init.zeros_(self.conv2.bias)
        self.skip = nn.Conv2d(in_dim, dim, 1) if in_dim != dim else None

    def forward(self, x: Tensor) -> Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(F.silu(self.norm2(h)))
        return (x if self.skip is None else self.skip(x)) + h


class _CrossViewAttention(nn.Module):
    """Multi-head self-attention over the tokens of all views of a scene (heads of 32 channels;
    q, k, v interleaved per head in the 1x1 ``qkv`` projection)."""

    def __init__(self, dim: int, head_dim: int = 32) -> None:
        super().__init__()
        self.heads = dim // head_dim
        self.norm = _group_norm(dim)
        self.qkv = nn.Conv1d(dim, 3 * dim, 1)
        self.proj = nn.Conv1d(dim, dim, 1)
        nn.init.zeros_(self.proj.weight)
        nn.init.zeros_(self.proj.bias)

    def forward(self, x: Tensor, views: int) -> Tensor:
        bv, c, h, w = x.shape
        tokens = x.reshape(bv, c, h * w)
        qkv = self.qkv(self.norm(tokens))  # [BV, 3C, T]
        qkv = rearrange(qkv, "(b v) (n k d) t -> k (b n) d (v t)", v=views, n=self.heads, k=3)
        q, k, v = qkv.unbind(0)  # [B n, d, V T]
        scale = q.shape[1] ** -0.25
        weight = torch.softmax(torch.einsum("bct,bcs->bts", q * scale, k * scale), dim=-1)
        out = torch.einsum("bts,bcs->bct", weight, v)  # [B n, d, V T]
        out = rearrange(out, "(b n) d (v t) -> (b v) (n d) t", v=views, n=self.heads)
        return (tokens + self.proj(out)).reshape(bv, c, h, w)


class _UNetStep(nn.Module):
    """One step of the U-Net: a conv, or a residual block with optional attention, optionally
    followed by a nearest-neighbour 2x upsampling convolution."""

    def __init__(
        self,
        conv: nn.Module | None = None,
        res: nn.Module | None = None,
        attn: nn.Module | None = None,
        upsample: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.conv, self.res, self.attn, self.upsample = conv, res, attn, upsample

    def forward(self, x: Tensor, views: int) -> Tensor:
        if self.conv is not None:
            x = self.conv(x)
        if self.res is not None:
            x = self.res(x)
        if self.attn is not None:
            x = self.attn(x, views)
        if self.upsample is not None:
            x = self.upsample(F.interpolate(x, scale_factor=2, mode="nearest"))
        return x


class CrossViewUNet(nn.Module):
    """Constant-width U-Net (no time embedding) with cross-view attention at chosen strides.

    Args:
        dim: channels everywhere.
        levels: resolution levels (``levels - 1`` downsamplings).
        attn_strides: downsampling factors (1, 2, 4, ...) with attention.
    """

    def __init__(self, dim: int, levels: int = 3, attn_strides: tuple[int, ...] = (4,)) -> None:
        super().__init__()

        def attn(stride: int) -> nn.Module | None:
            return _CrossViewAttention(dim) if stride in attn_strides else None

        down = [_UNetStep(conv=nn.Conv2d(dim, dim, 3, padding=1))]
        stride = 1
        for level in range(levels):
            down.append(_UNetStep(res=_ResBlock(dim, dim), attn=attn(stride)))
            if level != levels - 1:
                down.append(_UNetStep(conv=nn.Conv2d(dim, dim, 3, stride=2, padding=1)))
                stride *= 2
        self.down = nn.ModuleList(down)
        self.mid = nn.ModuleList([_ResBlock(dim, dim), _ResBlock(dim, dim)])
        up = []
        for level in reversed(range(levels)):
            for i in range(2):
                upsample = nn.Conv2d(dim, dim, 3, padding=1) if level and i == 1 else None
                up.append(
                    _UNetStep(res=_ResBlock(2 * dim, dim), attn=attn(stride), upsample=upsample)
                )
                if upsample is not None:
                    stride //= 2
        self.up = nn.ModuleList(up)
        self.out_norm = _group_norm(dim)
        self.out_conv = nn.Conv2d(dim, dim, 3, padding=1)
        nn.init.zeros_(self.out_conv.weight)
        nn.init.zeros_(self.out_conv.bias)

    def forward(self, x: Tensor, views: int) -> Tensor:
        skips = []
        for step in self.down:
            x = step(x, views)
            skips.append(x)
        for block in self.mid:
            x = block(x)
        for step in self.up:
            x = step(torch.cat([x, skips.pop()], dim=1), views)
        return self.out_conv(F.silu(self.out_norm(x)))


# ----------------------------------------------------------------------------- DPT
# Per (upsample_factor, num_scales) layout of the release, the maps concatenated before and after
# each of the three finest reassembled layers (at 1/2, 1/4 and 1/8 of the image; the order of the
# release's fuse convolutions' input channels): the CNN stages (highest resolution first), the
# transformer features per scale (highest resolution first) and, in the depth refiner, the
# coarse inverse depth (at the last cost-volume resolution).
DPT_EXTRAS: dict[tuple[int, int], tuple[tuple[tuple[str, ...], tuple[str, ...]], ...]] = {
    (4, 1): ((("cnn0", "cnn1"), ()), (("cnn2",), ("match0", "depth")), ((), ())),
    (2, 2): ((("cnn0", "cnn1", "match0", "depth"), ()), (("cnn2",), ("match1",)), ((), ())),
    (4, 2): ((("cnn0",), ()), (("cnn1",), ("match0", "depth")), (("cnn2",), ("match1",))),
    (8, 1): ((("cnn0",), ()), (("cnn1",), ()), (("cnn2",), ("match0", "depth"))),
}


def depthsplat_dpt(
    vit_dim: int,
    features: int,
    out_channels: Sequence[int],
    layout: tuple[int, int],
    *,
    with_depth: bool,
    cnn_dims: tuple[int, int, int] = (64, 96, 128),
    match_dim: int = 128,
) -> DPTHead:
    """Depth Anything V2's DPT with DepthSplat's extra maps (``DPT_EXTRAS``), as a ``DPTHead``.

    Args:
        vit_dim: ViT token channels.
        features: fusion width.
        out_channels: the four projected widths.
        layout: ``(upsample_factor, num_scales)``, one of ``DPT_EXTRAS``.
        with_depth: the coarse inverse depth joins (the depth refiner).
        cnn_dims, match_dim: channels of the CNN stages and of the transformer output.

    Returns:
        A head without output stage: ``fuse_maps`` gives ``features`` channels at full
        resolution from the four ViT maps at 1/8.
    """
    if layout not in DPT_EXTRAS:
        raise ValueError(f"unsupported (upsample_factor, num_scales) = {layout}")
    dims = {"cnn0": cnn_dims[0], "cnn1": cnn_dims[1], "cnn2": cnn_dims[2],
            "match0": match_dim if layout[1] == 1 else match_dim // 2, "match1": match_dim,
            "depth": 1 if with_depth else 0}  # fmt: skip
    extra_dims = [sum(dims[n] for n in before + after) for before, after in DPT_EXTRAS[layout]]
    return DPTHead(
        vit_dim,
        layer_dims=out_channels,
        features=features,
        align_corners=True,
        upsample_last=True,
        extra_dims=extra_dims,
        head_dim=0,
        out_dim=0,
        shallow_dim=0,
    )


def depthsplat_dpt_extras(
    layout: tuple[int, int], cnn: list[Tensor], match: list[Tensor], depth: Tensor | None = None
) -> list[tuple[list[Tensor], list[Tensor]]]:
    """``DPTHead.fuse_maps``'s ``extras`` of a ``depthsplat_dpt``: the CNN stages ``cnn`` and
    transformer features ``match`` (highest resolution first) and, for the refiner, the coarse
    inverse depth ``depth [BV, 1, h, w]`` at the last cost-volume resolution."""
    maps = {"cnn0": cnn[0], "cnn1": cnn[1], "cnn2": cnn[2], "match0": match[0]}
    if len(match) > 1:
        maps["match1"] = match[1]
    if depth is not None:
        maps["depth"] = depth
    return [
        ([maps[n] for n in before if n in maps], [maps[n] for n in after if n in maps])
        for before, after in DPT_EXTRAS[layout]
    ]


# ----------------------------------------------------------------------------- the trunk
def depth_trunk_size(
    vit_size: str,
    *,
    vit_dim: int | None = None,
    vit_depth: int | None = None,
    vit_heads: int | None = None,
    mono_layers: Sequence[int] | None = None,
    dpt_depth_features: int | None = None,
    dpt_features: int | None = None,
    dpt_out_channels: Sequence[int] | None = None,
) -> tuple[str | tuple[int, int, int], dict, int]:
    """A family's size arguments -> ``DepthTrunk``'s ``vit_size`` and ``dpt``, and the ViT width.

    ``vit_size`` is ``"vits"``, ``"vitb"``, ``"vitl"`` (Depth Anything V2's DPT widths), or
    ``"custom"`` with every other argument but ``mono_layers``, which the trunk needs too (the
    families' reduced test sizes).

    Raises:
        ValueError: an unknown size, or a custom one with arguments missing (named).
    """
    if vit_size == "custom":
        needed = dict(vit_dim=vit_dim, vit_depth=vit_depth, vit_heads=vit_heads,
                      mono_layers=mono_layers, dpt_depth_features=dpt_depth_features,
                      dpt_features=dpt_features, dpt_out_channels=dpt_out_channels)  # fmt: skip
        missing = [k for k, value in needed.items() if value is None]
        if missing:
            raise ValueError(f"vit_size='custom' needs {', '.join(missing)}")
        dpt = {"depth_features": dpt_depth_features, "features": dpt_features,
               "out_channels": tuple(dpt_out_channels)}  # fmt: skip
        return (vit_dim, vit_depth, vit_heads), dpt, vit_dim
    if vit_size in DINOV2_SIZES:
        return vit_size, DPT_CONFIGS[vit_size], DINOV2_SIZES[vit_size][0]
    raise ValueError(f"vit_size must be 'vits', 'vitb', 'vitl' or 'custom', got {vit_size!r}")


class _Pyramid(nn.Module):
    """SimpleFeaturePyramid: scale 1 as is, scale 2 by a transposed conv (half the channels)."""

    def __init__(self, dim: int, num_scales: int) -> None:
        super().__init__()
        stages = [nn.Sequential()]
        if num_scales > 1:
            stages.append(
                nn.Sequential(
                    nn.ConvTranspose2d(dim, dim // 2, 2, stride=2),
                    nn.GELU(),
                    nn.Conv2d(dim // 2, dim // 2, 3, padding=1),
                )
            )
        if num_scales > 2:
            raise ValueError("at most 2 scales are supported")
        self.stages = nn.ModuleList(stages)

    def forward(self, x: Tensor) -> list[Tensor]:
        return [stage(x) for stage in self.stages]  # low to high resolution


class _ScaleRegressor(nn.Module):
    """Cost volume + features -> U-Net -> softmax over the scale's depth candidates."""

    def __init__(self, in_dim: int, dim: int, candidates: int, levels: int, attn: tuple) -> None:
        super().__init__()
        self.proj_in = nn.Conv2d(in_dim, dim, 3, padding=1)
        self.norm_in = nn.GroupNorm(8, dim)
        self.unet = CrossViewUNet(dim, levels=levels, attn_strides=attn)
        self.proj_out = nn.Conv2d(dim, dim, 3, padding=1)
        self.shortcut = nn.Conv2d(in_dim, dim, 1)
        self.depth_head = DepthSoftmaxHead(
            dim,
            candidates,
            hidden_dim=2 * dim,
            activation="gelu",
            out_kernel=3,
            padding_mode="replicate",
        )  # the per-pixel candidates are the caller's: only its probabilities are used

    def forward(self, x: Tensor, views: int) -> Tensor:
        h = F.gelu(self.norm_in(self.proj_in(x)))
        h = self.proj_out(self.unet(h, views)) + self.shortcut(x)
        return self.depth_head.probabilities(h)[:, 0]  # [BV, D, h, w]


def _warp_cost(ref: Tensor, src: Tensor, intrinsics: Tensor, pose: Tensor, depth: Tensor) -> Tensor:
    """Plane-sweep correlation of ``ref [N, C, h, w]`` with ``src [N, C, h, w]`` warped at each
    candidate depth ``depth [N, D, h, w]``; ``pose [N, 4, 4]`` maps ref-camera to src-camera
    points; ``intrinsics [N, 3, 3]`` in feature pixels (integer pixel coordinates)."""
    n, c, h, w = ref.shape
    d = depth.shape[1]
    with torch.no_grad():
        ys, xs = torch.meshgrid(
            torch.arange(h, device=ref.device, dtype=ref.dtype),
            torch.arange(w, device=ref.device, dtype=ref.dtype),
            indexing="ij",
        )
        pixels = torch.stack([xs, ys, torch.ones_like(xs)]).view(1, 3, h * w).expand(n, 3, h * w)
        rays = torch.linalg.inv(intrinsics) @ pixels  # [N, 3, hw]
        points = (pose[:, :3, :3] @ rays)[:, :, None, :] * depth.view(n, 1, d, h * w)
        points = points + pose[:, :3, 3:, None]  # [N, 3, D, hw]
        proj = (intrinsics @ points.view(n, 3, -1)).view(n, 3, d, h * w)
        xy = proj[:, :2] / proj[:, 2:].clamp(min=1e-3)
        grid = torch.stack([2 * xy[:, 0] / (w - 1) - 1, 2 * xy[:, 1] / (h - 1) - 1], dim=-1)
    warped = F.grid_sample(
        src, grid.view(n, d * h, w, 2), mode="bilinear", padding_mode="zeros", align_corners=True
    ).view(n, c, d, h, w)
    return (ref[:, :, None] * warped).sum(1) / c**0.5  # [N, D, h, w]


class DepthTrunk(nn.Module):
    """Multi-view depth: returns inverse-depth-derived depth and the intermediate features.

    Args:
        vit_size: ``"vits"``, ``"vitb"`` or ``"vitl"`` (Depth Anything V2's DINOv2 size); or a
            ``(dim, depth, heads)`` tuple for reduced test sizes.
        num_scales: cost-volume scales (1 or 2).
        upsample_factor: image / last-scale resolution.
        lowest_resolution: image / first-scale CNN resolution (4 or 8).
        num_depth_candidates: inverse-depth candidates at the first scale (``/4`` per later scale).
        unet_dim: U-Net width at the first scale (halved per later scale).
        transformer_depth: cross-view transformer blocks.
        mono_layers: ViT blocks feeding the DPTs (``None``: Depth Anything V2's for ``vit_size``).
        dpt: ``{"depth_features", "features", "out_channels"}`` (``None``: the ``vit_size``'s).
        log_depth: candidates uniform in log depth between ``near`` and ``far`` instead of in
            inverse depth (ReSplat's depth models; one cost-volume scale only).
        max_vit_width: the ViT input is at most this wide (ReSplat: 560; ``None``: no bound).
        wide_attn_splits: the transformer uses 4 windows per side above 96 feature columns and
            8 above 192 (ReSplat; the position code keeps 2).
    """

    def __init__(
        self,
        vit_size: str | tuple[int, int, int] = "vits",
        *,
        num_scales: int = 1,
        upsample_factor: int = 4,
        lowest_resolution: int = 4,
        num_depth_candidates: int = 128,
        unet_dim: int = 128,
        transformer_depth: int = 6,
        mono_layers: tuple[int, ...] | None = None,
        dpt: dict | None = None,
        log_depth: bool = False,
        max_vit_width: int | None = None,
        wide_attn_splits: bool = False,
    ) -> None:
        super().__init__()
        if log_depth and num_scales != 1:
            raise ValueError("log_depth supports one cost-volume scale")
        self.log_depth = log_depth
        self.max_vit_width = max_vit_width
        self.wide_attn_splits = wide_attn_splits
        if isinstance(vit_size, str):
            if vit_size not in DINOV2_SIZES:
                raise ValueError(
                    f"vit_size must be one of {sorted(DINOV2_SIZES)}, got {vit_size!r}"
                )
            vit_dim, vit_depth, vit_heads = DINOV2_SIZES[vit_size]
            mono_layers = mono_layers or MONO_LAYERS[vit_size]
            dpt = dpt or DPT_CONFIGS[vit_size]
        else:
            vit_dim, vit_depth, vit_heads = vit_size
            if mono_layers is None or dpt is None:
                raise ValueError("a custom vit_size needs mono_layers and dpt")
        if upsample_factor * 2 ** (num_scales - 1) != lowest_resolution:
            raise ValueError(
                f"upsample_factor x 2^(num_scales-1) must equal lowest_resolution, got "
                f"{upsample_factor} x 2^{num_scales - 1} != {lowest_resolution}"
            )
        self.num_scales = num_scales
        self.upsample_factor = upsample_factor
        self.lowest_resolution = lowest_resolution
        self.num_depth_candidates = num_depth_candidates
        self.mono_layers = tuple(mono_layers)
        self.match_dim = 128
        self.cnn = ConvStem(self.match_dim, lowest_scale=lowest_resolution)
        self.matcher = CrossViewTransformer(self.match_dim, depth=transformer_depth)
        # the monocular ViT is the "backbone" (the training stack scales its learning rate)
        self.backbone = DinoV2(vit_dim, vit_depth, vit_heads)
        if num_scales > 1:
            self.match_pyramid = _Pyramid(self.match_dim, num_scales)
            self.mono_pyramid = _Pyramid(vit_dim, num_scales)
        scales = []
        levels, attn = 3, (4,)
        for i in range(num_scales):
            in_dim = (
                num_depth_candidates // 4**i
                + (self.match_dim - 32 * i)
                + self.match_dim // 2**i
                + vit_dim // 2**i
            )
            if i > 0:
                levels, attn = levels + 1, tuple(2 * a for a in attn)
            scales.append(
                _ScaleRegressor(
                    in_dim, unet_dim // 2**i, num_depth_candidates // 4**i, levels, attn
                )
            )
        self.scales = nn.ModuleList(scales)
        self.layout = (upsample_factor, num_scales)
        self.refiner = depthsplat_dpt(
            vit_dim, dpt["depth_features"], dpt["out_channels"], self.layout, with_depth=True
        )
        f = dpt["depth_features"]  # the refiner's output layers: a residual on the inverse depth
        self.refiner_head = nn.Sequential(
            nn.Conv2d(f, f // 2, 3, padding=1, padding_mode="replicate"),
            nn.GELU(),
            nn.Conv2d(f // 2, 16, 3, padding=1, padding_mode="replicate"),
            nn.GELU(),
            nn.Conv2d(16, 1, 1),
        )
        nn.init.zeros_(self.refiner_head[-1].weight)
        nn.init.zeros_(self.refiner_head[-1].bias)
        self.register_buffer("mean", torch.tensor(IMAGENET_MEAN).view(3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(IMAGENET_STD).view(3, 1, 1), persistent=False)

    def _mono_features(
        self, x: Tensor, size: tuple[int, int]
    ) -> tuple[list[Tensor], list[Tensor], Tensor]:
        """The ViT's maps at its own 1/14 grid, the same at 1/8, and the last one at the
        lowest matching resolution (``x``: normalised images ``[BV, 3, H, W]``)."""
        height, width = size
        bv = x.shape[0]
        rh, rw = height // 14 * 14, width // 14 * 14
        if self.max_vit_width is not None and width > self.max_vit_width:
            rw = self.max_vit_width // 14 * 14
            rh = int(height / width * self.max_vit_width) // 14 * 14
        vit_in = F.interpolate(x, (rh, rw), mode="bilinear", align_corners=True)
        tokens = self.backbone.intermediate_tokens(vit_in, self.mono_layers)
        raw_mono = [
            t.reshape(bv, rh // 14, rw // 14, -1).permute(0, 3, 1, 2).contiguous() for t in tokens
        ]
        mono = [
            F.interpolate(t, (height // 8, width // 8), mode="bilinear", align_corners=True)
            for t in raw_mono
        ]
        mono_last = mono[-1]
        if self.lowest_resolution == 4:
            mono_last = F.interpolate(
                mono_last, scale_factor=2, mode="bilinear", align_corners=True
            )
        return raw_mono, mono, mono_last

    def _candidates(
        self,
        s: int,
        steps: Tensor,
        inv_depth: Tensor | None,
        inv_min: Tensor,
        inv_max: Tensor,
        size: tuple[int, int],
    ) -> tuple[Tensor, Tensor | None]:
        """Scale ``s``'s depth candidates ``[BV, D, h, w]``: the whole range at the first scale,
        then a window around the previous scale's (upsampled) inverse depth, also returned."""
        if s == 0:
            candidates = inv_min + steps.view(1, -1, 1, 1) * (inv_max - inv_min)
            return candidates.expand(inv_min.shape[0], steps.shape[0], *size), inv_depth
        inv_depth = F.interpolate(
            inv_depth, scale_factor=2, mode="bilinear", align_corners=True
        ).detach()
        count = steps.shape[0]
        interval = (inv_max - inv_min) / (self.num_depth_candidates - 1) / 2**s
        lo = torch.maximum(inv_depth - interval * (count // 2), inv_min)
        hi = torch.minimum(inv_depth + interval * (count // 2 - 1), inv_max)
        return lo + steps.view(1, -1, 1, 1) * (hi - lo), inv_depth  # [BV, D, h, w]

    def forward(
        self,
        images: Tensor,
        intrinsics: Tensor,
        extrinsics: Tensor,
        near: Tensor,
        far: Tensor,
        neighbours: Tensor | None = None,
    ) -> dict[str, Tensor | list[Tensor]]:
        """Predict depth.

        Args:
            images: ``[B, V, 3, H, W]`` in [0, 1].
            intrinsics: ``[B, V, 3, 3]`` normalised.
            extrinsics: ``[B, V, 4, 4]`` camera-to-world.
            near, far: ``[B, V]``.
            neighbours: ``[B, V, 1 + M]`` views to match against (first column the view itself),
                or ``None`` for all the others.

        Returns:
            ``depth [B, V, H, W]`` (z-depth), ``match_prob [BV, D, h, w]`` (last scale), the CNN
            stages ``cnn`` (highest resolution first), ``match`` (transformer features per scale,
            highest first), ``mono`` (the four ViT maps at 1/8), ``raw_mono`` (the same maps at
            the ViT's own 1/14 grid).
        """
        b, v, _, height, width = images.shape
        x = ((images - self.mean) / self.std).flatten(0, 1)  # [BV, 3, H, W]
        # the candidates' range: inverse depth [1/far, 1/near], or log depth [log near, log far]
        # (the latter computed from the inverses, as the release does)
        inv_min = (1.0 / far).reshape(b * v, 1, 1, 1)
        inv_max = (1.0 / near).reshape(b * v, 1, 1, 1)
        if self.log_depth:
            inv_min, inv_max = torch.log(1.0 / inv_max), torch.log(1.0 / inv_min)

        cnn = self.cnn(x)  # 1/2, 1/2|1/4, 1/4|1/8
        low = cnn[2]
        pos = window_sine_embedding(self.match_dim, *low.shape[-2:], 2, low.device, low.dtype)
        splits = 2
        if self.wide_attn_splits:
            splits = 8 if low.shape[-1] > 192 else 4 if low.shape[-1] > 96 else 2
        match = self.matcher((low + pos).unflatten(0, (b, v)), splits, neighbours).flatten(0, 1)
        match_scales = self.match_pyramid(match) if self.num_scales > 1 else [match]

        raw_mono, mono, mono_last = self._mono_features(x, (height, width))
        mono_scales = self.mono_pyramid(mono_last) if self.num_scales > 1 else [mono_last]

        index = (
            neighbours[:, :, 1:]
            if neighbours is not None
            else torch.tensor(
                [[j for j in range(v) if j != i] for i in range(v)], device=images.device
            ).expand(b, v, v - 1)
        )  # [B, V, M]
        m = index.shape[-1]
        # pose taking reference-camera points to each source camera: inv(E_src) @ E_ref
        src_ext = gather_views(extrinsics, index)  # [B, V, M, 4, 4]
        pose = torch.linalg.inv(src_ext) @ extrinsics[:, :, None]
        pixel_scale = torch.tensor([width, height, 1.0], device=images.device, dtype=images.dtype)

        inv_depth = None
        prob = None
        for s in range(self.num_scales):
            factor = self.upsample_factor * 2 ** (self.num_scales - 1 - s)
            k = intrinsics * pixel_scale.view(3, 1)
            k = torch.cat([k[..., :2, :] / factor, k[..., 2:, :]], dim=-2)  # [B, V, 3, 3]
            feats = match_scales[s]  # [BV, C, h, w]
            c, h, w = feats.shape[1:]
            count = self.num_depth_candidates // 4**s
            # float32 steps cast to the input dtype, as the release computes them
            steps = torch.linspace(0, 1, count, device=images.device).to(images.dtype)
            candidates, inv_depth = self._candidates(s, steps, inv_depth, inv_min, inv_max, (h, w))
            src = gather_views(feats.unflatten(0, (b, v)), index).flatten(0, 2)  # [BVM, C, h, w]
            ref = feats.unflatten(0, (b, v))[:, :, None].expand(b, v, m, c, h, w).flatten(0, 2)
            cost = _warp_cost(
                ref,
                src,
                k[:, :, None].expand(b, v, m, 3, 3).flatten(0, 2),
                pose.flatten(0, 2),
                (candidates.exp() if self.log_depth else 1.0 / candidates)[:, None]
                .expand(b * v, m, count, h, w)
                .flatten(0, 1),
            )
            cost = cost.view(b * v, m, count, h, w).mean(1)
            inputs = torch.cat([cost, cnn[2 - s], feats, mono_scales[s]], dim=1)
            prob = self.scales[s](inputs, v)
            inv_depth = (prob * candidates).sum(1, keepdim=True)  # [BV, 1, h, w]

        extras = depthsplat_dpt_extras(self.layout, cnn, match_scales[::-1], inv_depth)
        residual = self.refiner_head(self.refiner.fuse_maps(mono, extras))  # [BV, 1, H, W]
        inv_depth = F.interpolate(
            inv_depth, scale_factor=self.upsample_factor, mode="bilinear", align_corners=True
        )
        inv_depth = torch.maximum(torch.minimum(inv_depth + residual, inv_max), inv_min)
        depth = inv_depth[:, 0].exp() if self.log_depth else 1.0 / inv_depth[:, 0]
        depth = depth.unflatten(0, (b, v))  # [B, V, H, W]
        return {"depth": depth, "match_prob": prob, "cnn": cnn, "match": match_scales[::-1],
                "mono": mono, "raw_mono": raw_mono}  # fmt: skip
