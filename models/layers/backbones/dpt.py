"""The project's one DPT head: multi-layer ViT tokens (or maps) in, dense features out.

As in DPT / Depth Anything: each chosen layer's patch tokens are *reassembled* into a feature map
(1x1 projection, then resampled to 4x, 2x, 1x and 1/2x the patch grid for the first to the fourth
layer), projected to a common width, and *fused* from coarse to fine with residual convolution
units and upsampling. An output stage (``head_in``, a resize to the output size, ``head_out``)
turns the fused map into per-pixel features; the project's models concatenate a shallow CNN
feature of the raw image computed at full resolution before ``head_out`` (cheap, and it carries
the fine detail that patch tokens lose).

Options cover the released DPTs that the ports load (their official names map onto this module's
through ``release_dpt_key``):

- Depth Anything V2 / DepthSplat / ReSplat (``models.layers.backbones.depth_trunk``,
  ``models.families.depthsplat``): maps in (``fuse_maps``), extra CNN / multi-view / coarse-depth
  maps concatenated at the three finest levels and merged by a 1x1 ``fuse`` convolution, corners
  aligned, the last fusion upsampling too (``upsample_last``), no output stage (``head_dim=0``);
- VGGT (SplatWeaver's release): a LayerNorm on the tokens (``token_norm``), prefix tokens
  skipped, a sine-cosine UV embedding after each projection and before ``head_out``
  (``uv_embed``, which replaces the ReLU there), rectified residual units (``rectify``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

__all__ = [
    "DPTHead",
    "ResidualConvUnit",
    "FusionBlock",
    "REASSEMBLE_FACTORS",
    "add_uv_embedding",
    "release_dpt_key",
    "uv_embedding",
]

# Resampling factor of each reassembled layer relative to the patch grid (shallow to deep).
REASSEMBLE_FACTORS = (4.0, 2.0, 1.0, 0.5)


class ResidualConvUnit(nn.Module):
    """``x + conv2(relu(conv1(relu(x))))`` with 3x3 convolutions.

    ``rectify_input=True`` rectifies the input before the skip too,
    ``relu(x) + conv2(relu(conv1(relu(x))))``: VGGT's DPT applies an in-place ReLU to the input,
    so its skip adds the rectified input.
    """

    def __init__(self, channels: int, rectify_input: bool = False) -> None:
        super().__init__()
        self.rectify_input = rectify_input
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: Tensor) -> Tensor:
        if self.rectify_input:
            x = F.relu(x)
            return x + self.conv2(F.relu(self.conv1(x)))
        return x + self.conv2(F.relu(self.conv1(F.relu(x))))


class FusionBlock(nn.Module):
    """Add a refined skip feature, refine, resize to ``size``, project (1x1): one fusion step.

    Args:
        channels: width of the fusion path.
        has_skip: build the refinement of a skip input.
        align_corners: of the bilinear resize.
        rectify_input: of the residual units (see ``ResidualConvUnit``).
    """

    def __init__(
        self,
        channels: int,
        has_skip: bool,
        align_corners: bool = False,
        rectify_input: bool = False,
    ) -> None:
        super().__init__()
        self.align_corners = align_corners
        self.skip_unit = ResidualConvUnit(channels, rectify_input) if has_skip else None
        self.unit = ResidualConvUnit(channels, rectify_input)
        self.out_conv = nn.Conv2d(channels, channels, 1)

    def forward(
        self, x: Tensor, skip: Tensor | None = None, size: tuple[int, int] | None = None
    ) -> Tensor:
        """``x [N, C, h, w]`` (+ ``skip``, same shape) -> ``[N, C, *size]`` (``None``: ``2h, 2w``)."""
        if skip is not None:
            if self.skip_unit is None:
                raise ValueError("this FusionBlock was built without a skip input")
            x = x + self.skip_unit(skip)
        x = self.unit(x)
        size = (2 * x.shape[-2], 2 * x.shape[-1]) if size is None else tuple(size)
        if tuple(x.shape[-2:]) != size:
            x = F.interpolate(x, size=size, mode="bilinear", align_corners=self.align_corners)
        return self.out_conv(x)


def uv_embedding(channels: int, grid: tuple[int, int], aspect: float, like: Tensor) -> Tensor:
    """Sine-cosine embedding ``[channels, h, w]`` of a UV grid spanning the image diagonal.

    x and y each get ``channels / 2`` channels (sines then cosines, frequencies
    ``100^(-i / (channels / 4))``); the grid spans ``±aspect/diag`` by ``±1/diag`` (pixel-centred).
    """
    h, w = grid
    diag = (aspect**2 + 1.0) ** 0.5
    span_x, span_y = aspect / diag, 1.0 / diag
    xs = torch.linspace(
        -span_x * (w - 1) / w, span_x * (w - 1) / w, w, dtype=like.dtype, device=like.device
    )
    ys = torch.linspace(
        -span_y * (h - 1) / h, span_y * (h - 1) / h, h, dtype=like.dtype, device=like.device
    )
    uu, vv = torch.meshgrid(xs, ys, indexing="xy")  # [h, w]
    quarter = channels // 4
    omega = torch.arange(quarter, dtype=torch.float64, device=like.device) / (channels / 4.0)
    omega = 1.0 / 100.0**omega

    def embed(pos: Tensor) -> Tensor:
        angles = pos.reshape(-1).double()[:, None] * omega  # [hw, C/4]
        return torch.cat([angles.sin(), angles.cos()], dim=1).float()

    emb = torch.cat([embed(uu), embed(vv)], dim=-1)  # [hw, C]
    return emb.reshape(h, w, channels).permute(2, 0, 1).to(like.dtype)


def add_uv_embedding(x: Tensor, ratio: float = 0.1) -> Tensor:
    """``x [N, C, h, w]`` plus ``ratio`` times the UV embedding of its grid.

    The grid's aspect ``w / h`` is the image's (every map it is added to has the image's aspect:
    the patch grid, or the image itself), and the same rational number rounds to the same float.
    """
    h, w = x.shape[-2:]
    return x + ratio * uv_embedding(x.shape[1], (h, w), w / h, x)[None]


def _resample_layer(in_dim: int, out_dim: int, factor: float) -> nn.Module:
    """1x1 projection then resampling by ``factor`` (transposed conv up, strided conv down)."""
    project = nn.Conv2d(in_dim, out_dim, 1)
    if factor > 1:
        k = int(factor)
        return nn.Sequential(project, nn.ConvTranspose2d(out_dim, out_dim, k, stride=k))
    if factor < 1:
        k = int(round(1 / factor))
        return nn.Sequential(project, nn.Conv2d(out_dim, out_dim, 3, stride=k, padding=1))
    return project


class DPTHead(nn.Module):
    """Reassemble + fuse multi-layer tokens into dense features (see the module for the options).

    ``forward`` runs ``token_maps`` -> ``fuse_maps`` -> ``output_stage``; a caller with maps
    instead of tokens, or with output layers of its own, calls the parts.

    Args:
        in_dim: token width ``C`` of the backbone, or one width per layer (DUSt3R reads its
            encoder's and its decoder's tokens).
        num_layers: how many token layers come in (1..4; DPT uses 4).
        layer_dims: channels of each reassembled layer (shallow to deep); ``None``:
            ``features * (1/2, 1, 2, 4)``, each capped at ``in_dim``.
        features: width of the fusion path.
        token_norm: LayerNorm the tokens first (VGGT).
        uv_embed: add the UV embedding after each projection and, instead of the ReLU, after
            the output resize (VGGT).
        align_corners: of every bilinear resize (the released DPTs: ``True``).
        rectify: rectified residual units (see ``ResidualConvUnit``; VGGT).
        upsample_last: the shallowest fusion upsamples 2x too, so the fused map is at 8x the
            patch grid (the released DPTs); else it stays at the first layer's 4x.
        extra_dims: channels concatenated to each of the first ``len(extra_dims)`` reassembled
            layers, merged back to the layer's width by a 1x1 ``fuse`` convolution (DepthSplat;
            a 0 entry still builds the convolution).
        head_dim: channels of ``head_in``, the 3x3 convolution that ends ``fuse_maps``; ``None``:
            ``max(8, features // 2)``; 0: no output stage (``fuse_maps`` returns the fused path).
        out_dim: channels of ``head_out`` (3x3 conv, ReLU, 1x1 conv); 0: none (``output_stage``
            ends after the resize).
        out_hidden: hidden channels of ``head_out`` (``None``: ``out_dim``).
        shallow_dim: channels of the full-resolution CNN feature of the raw image (0: none).
        in_chans: channels of that raw image.
    """

    def __init__(
        self,
        in_dim: int | Sequence[int],
        *,
        num_layers: int = 4,
        layer_dims: Sequence[int] | None = None,
        features: int = 64,
        token_norm: bool = False,
        uv_embed: bool = False,
        align_corners: bool = False,
        rectify: bool = False,
        upsample_last: bool = False,
        extra_dims: Sequence[int] = (),
        head_dim: int | None = None,
        out_dim: int = 64,
        out_hidden: int | None = None,
        shallow_dim: int = 16,
        in_chans: int = 3,
    ) -> None:
        super().__init__()
        if not 1 <= num_layers <= len(REASSEMBLE_FACTORS):
            raise ValueError(
                f"num_layers must be in 1..{len(REASSEMBLE_FACTORS)}, got {num_layers}"
            )
        in_dims = [in_dim] * num_layers if isinstance(in_dim, int) else list(in_dim)
        if len(in_dims) != num_layers:
            raise ValueError(f"in_dim has {len(in_dims)} entries, num_layers is {num_layers}")
        if token_norm and len(set(in_dims)) > 1:
            raise ValueError("token_norm needs one token width")
        if layer_dims is None:
            width = min(in_dims)
            layer_dims = [max(8, min(width, int(features * m))) for m in (0.5, 1, 2, 4)]
            layer_dims = layer_dims[:num_layers]
        if len(layer_dims) != num_layers:
            raise ValueError(
                f"layer_dims has {len(layer_dims)} entries, num_layers is {num_layers}"
            )
        if len(extra_dims) > num_layers:
            raise ValueError(f"extra_dims has {len(extra_dims)} entries, > num_layers {num_layers}")
        head_dim = max(8, features // 2) if head_dim is None else head_dim
        if head_dim == 0 and (out_dim or shallow_dim):
            raise ValueError("head_dim=0 (no output stage) needs out_dim=0 and shallow_dim=0")
        self.num_layers = num_layers
        self.out_dim = out_dim
        self.shallow_dim = shallow_dim
        self.uv_embed = uv_embed
        self.align_corners = align_corners
        self.upsample_last = upsample_last
        self.norm = nn.LayerNorm(in_dims[0]) if token_norm else None
        self.reassemble = nn.ModuleList(
            _resample_layer(width, dim, factor)
            for width, dim, factor in zip(in_dims, layer_dims, REASSEMBLE_FACTORS)
        )
        self.fuse = (
            nn.ModuleList(nn.Conv2d(d + e, d, 1) for d, e in zip(layer_dims, extra_dims))
            if extra_dims
            else None
        )
        self.layer_rn = nn.ModuleList(
            nn.Conv2d(dim, features, 3, padding=1, bias=False) for dim in layer_dims
        )
        # fusion[i] fuses into layer i; the deepest one has no skip (its input is the layer).
        self.fusion = nn.ModuleList(
            FusionBlock(features, i < num_layers - 1, align_corners, rectify)
            for i in range(num_layers)
        )
        self.head_in = nn.Conv2d(features, head_dim, 3, padding=1) if head_dim else None
        if shallow_dim > 0:
            self.shallow = nn.Sequential(
                nn.Conv2d(in_chans, shallow_dim, 3, padding=1),
                nn.ReLU(inplace=True),
                nn.Conv2d(shallow_dim, shallow_dim, 3, padding=1),
                nn.ReLU(inplace=True),
            )
        else:
            self.shallow = None
        hidden = out_hidden or out_dim
        self.head_out = (
            nn.Sequential(
                nn.Conv2d(head_dim + max(shallow_dim, 0), hidden, 3, padding=1),
                nn.ReLU(inplace=True),
                nn.Conv2d(hidden, out_dim, 1),
            )
            if out_dim
            else None
        )

    def forward(
        self,
        tokens: Sequence[Tensor],
        grid_size: tuple[int, int],
        out_size: tuple[int, int],
        image: Tensor | None = None,
        *,
        prefix_tokens: int = 0,
    ) -> Tensor:
        """Decode tokens into per-pixel features.

        Args:
            tokens: ``num_layers`` tensors ``[B, V, P, C]`` (or ``[B*V, P, C]``), shallow first:
                ``prefix_tokens`` special tokens, then the ``h*w`` patch tokens.
            grid_size: ``(h, w)`` patch grid.
            out_size: ``(H, W)`` output resolution.
            image: ``[B*V, in_chans, H, W]`` (or ``[B, V, ...]``) raw image for the shallow CNN;
                required when ``shallow_dim > 0``.
            prefix_tokens: tokens before the patch tokens (camera, registers), skipped.

        Returns:
            ``[B*V, out_dim, H, W]``.
        """
        maps = self.token_maps(tokens, grid_size, prefix_tokens)
        return self.output_stage(self.fuse_maps(maps), out_size, image)

    def token_maps(
        self, tokens: Sequence[Tensor], grid_size: tuple[int, int], prefix_tokens: int = 0
    ) -> list[Tensor]:
        """Patch tokens (see ``forward``) -> ``num_layers`` maps ``[B*V, C, h, w]``."""
        if len(tokens) != self.num_layers:
            raise ValueError(f"expected {self.num_layers} token layers, got {len(tokens)}")
        h, w = grid_size
        maps = []
        for layer in tokens:
            if prefix_tokens:
                layer = layer[..., prefix_tokens:, :]
            layer = layer.reshape(-1, *layer.shape[-2:])  # [BV, h*w, C]
            if self.norm is not None:
                layer = self.norm(layer)
            maps.append(rearrange(layer, "n (h w) c -> n c h w", h=h, w=w))
        return maps

    def fuse_maps(
        self,
        maps: Sequence[Tensor],
        extras: Sequence[tuple[Sequence[Tensor], Sequence[Tensor]]] = (),
    ) -> Tensor:
        """Reassemble and fuse layer maps, then ``head_in``.

        Args:
            maps: ``num_layers`` maps ``[N, C, h, w]`` on the patch grid, shallow first.
            extras: per level with a ``fuse`` convolution, the maps (at that level's resolution)
                concatenated before and after the reassembled layer, in the ``fuse``
                convolution's channel order.

        Returns:
            ``[N, head_dim, 4h, 4w]`` (``8h, 8w`` with ``upsample_last``; ``features`` channels
            with ``head_dim=0``).
        """
        if len(maps) != self.num_layers:
            raise ValueError(f"expected {self.num_layers} layer maps, got {len(maps)}")
        if len(extras) != (0 if self.fuse is None else len(self.fuse)):
            raise ValueError(f"expected extra maps for {len(self.fuse or ())} levels")
        levels = []
        for i, (fmap, stage, rn) in enumerate(zip(maps, self.reassemble, self.layer_rn)):
            # [project, resample] (a layer kept at the grid: the projection alone)
            project, resample = stage if isinstance(stage, nn.Sequential) else (stage, None)
            x = project(fmap)
            if self.uv_embed:
                x = add_uv_embedding(x)
            if resample is not None:
                x = resample(x)
            if i < len(extras):
                before, after = extras[i]
                x = self.fuse[i](torch.cat([*before, x, *after], dim=1))
            levels.append(rn(x))  # [N, F, h*s, w*s]

        path = None
        for i in reversed(range(self.num_layers)):
            if i > 0:
                target = tuple(levels[i - 1].shape[-2:])
            else:
                target = None if self.upsample_last else tuple(levels[0].shape[-2:])
            if path is None:
                path = self.fusion[i](levels[i], None, target)
            else:
                path = self.fusion[i](path, levels[i], target)
        # path: [N, F, 4h, 4w] (the shallowest layer's resolution; 8h, 8w with upsample_last)
        return path if self.head_in is None else self.head_in(path)

    def output_stage(
        self, x: Tensor, out_size: tuple[int, int], image: Tensor | None = None
    ) -> Tensor:
        """``fuse_maps``'s output -> resize to ``out_size``, ReLU (UV embedding with
        ``uv_embed``), concatenate the shallow CNN feature of ``image``, ``head_out``.

        Returns:
            ``[N, out_dim, H, W]`` (``head_dim`` channels without ``head_out``).
        """
        if self.head_in is None:
            raise ValueError("this DPTHead was built without an output stage (head_dim=0)")
        x = F.interpolate(
            x, size=tuple(out_size), mode="bilinear", align_corners=self.align_corners
        )
        x = add_uv_embedding(x) if self.uv_embed else F.relu(x)
        if self.shallow is not None:
            if image is None:
                raise ValueError("DPTHead with shallow_dim > 0 needs the raw image")
            image = image.reshape(-1, *image.shape[-3:])
            if tuple(image.shape[-2:]) != tuple(out_size):
                image = F.interpolate(
                    image, size=tuple(out_size), mode="bilinear", align_corners=False
                )
            x = torch.cat([x, self.shallow(image)], dim=1)
        return x if self.head_out is None else self.head_out(x)  # [BV, C_out, H, W]


# The released DPTs' parameter names (Depth Anything V2, DepthSplat, VGGT), relative to the head.
_RELEASE_LAYER = re.compile(r"^(projects|resize_layers|concat_projects)\.(\d)\.(.+)$")
_RELEASE_SCRATCH = re.compile(r"^scratch\.(layer(\d)_rn|refinenet(\d)|output_conv[12])\.(.+)$")
_RELEASE_UNITS = {"resConfUnit1.": "skip_unit.", "resConfUnit2.": "unit."}


def release_dpt_key(name: str) -> str | None:
    """This head's name of a released DPT's parameter ``name`` (relative to the head, e.g.
    ``scratch.refinenet4.out_conv.weight`` -> ``fusion.3.out_conv.weight``); ``None`` if it is
    not one of the head's parameters."""
    if name.startswith("norm."):
        return name
    match = _RELEASE_LAYER.match(name)
    if match:
        kind, i, rest = match.group(1), int(match.group(2)), match.group(3)
        if kind == "concat_projects":
            return f"fuse.{i}.{rest}"
        if kind == "resize_layers":
            return f"reassemble.{i}.1.{rest}"
        # a layer without resampling has the projection itself as its reassemble stage
        return (
            f"reassemble.{i}.{rest}" if REASSEMBLE_FACTORS[i] == 1 else f"reassemble.{i}.0.{rest}"
        )
    match = _RELEASE_SCRATCH.match(name)
    if match is None:
        return None
    part, rest = match.group(1), match.group(4)
    if match.group(2):
        return f"layer_rn.{int(match.group(2)) - 1}.{rest}"
    if match.group(3):
        for old, new in _RELEASE_UNITS.items():
            rest = new + rest[len(old) :] if rest.startswith(old) else rest
        return f"fusion.{int(match.group(3)) - 1}.{rest}"
    return ("head_in." if part == "output_conv1" else "head_out.") + rest
