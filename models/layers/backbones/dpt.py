"""A DPT-style dense head: multi-layer ViT tokens in, per-pixel features at full resolution out.

As in DPT / Depth Anything: each chosen layer's patch tokens are *reassembled* into a feature map
(1x1 projection, then resampled to 4x, 2x, 1x and 1/2x the patch grid for the first to the fourth
layer), projected to a common width, and *fused* from coarse to fine with residual convolution
units and upsampling. The fused map (4x the patch grid) is upsampled to the input resolution and,
optionally, concatenated with a shallow CNN feature of the raw image computed at full resolution
(cheap, and it carries the fine detail that patch tokens lose), then mixed by two convolutions.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

__all__ = ["DPTHead", "ResidualConvUnit", "FusionBlock", "REASSEMBLE_FACTORS"]

# Resampling factor of each reassembled layer relative to the patch grid (shallow to deep).
REASSEMBLE_FACTORS = (4.0, 2.0, 1.0, 0.5)


class ResidualConvUnit(nn.Module):
    """``x + conv2(relu(conv1(relu(x))))`` with 3x3 convolutions.

    ``rectify_input=True`` rectifies the input before the skip too,
    ``relu(x) + conv2(relu(conv1(relu(x))))``: the released DPTs (Depth Anything, VGGT) apply an
    in-place ReLU to the input, so their skip adds the rectified input.
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
    """Add a refined skip feature, refine, resize to ``size``, project (1x1).

    The one fusion step of every DPT in the project: this head's, DepthSplat's
    (``models.layers.backbones.depth_trunk``) and VGGT's (``models.layers.vggt``).

    Args:
        channels: width of the fusion path.
        has_skip: build the refinement of a skip input.
        align_corners: of the bilinear resize (the released DPTs: ``True``).
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
    """Reassemble + fuse multi-layer tokens into full-resolution per-pixel features.

    Args:
        in_dim: token width ``C`` of the backbone.
        num_layers: how many token layers come in (1..4; DPT uses 4).
        layer_dims: channels of each reassembled layer (shallow to deep); ``None``:
            ``features * (1/2, 1, 2, 4)``, each capped at ``in_dim``.
        features: width of the fusion path.
        out_dim: channels of the output ``C_out``.
        shallow_dim: channels of the full-resolution CNN feature of the raw image (0: none).
        in_chans: channels of that raw image.
    """

    def __init__(
        self,
        in_dim: int,
        *,
        num_layers: int = 4,
        layer_dims: Sequence[int] | None = None,
        features: int = 64,
        out_dim: int = 64,
        shallow_dim: int = 16,
        in_chans: int = 3,
    ) -> None:
        super().__init__()
        if not 1 <= num_layers <= len(REASSEMBLE_FACTORS):
            raise ValueError(
                f"num_layers must be in 1..{len(REASSEMBLE_FACTORS)}, got {num_layers}"
            )
        if layer_dims is None:
            layer_dims = [max(8, min(in_dim, int(features * m))) for m in (0.5, 1, 2, 4)]
            layer_dims = layer_dims[:num_layers]
        if len(layer_dims) != num_layers:
            raise ValueError(
                f"layer_dims has {len(layer_dims)} entries, num_layers is {num_layers}"
            )
        self.num_layers = num_layers
        self.out_dim = out_dim
        self.shallow_dim = shallow_dim
        self.reassemble = nn.ModuleList(
            _resample_layer(in_dim, dim, factor)
            for dim, factor in zip(layer_dims, REASSEMBLE_FACTORS)
        )
        self.layer_rn = nn.ModuleList(
            nn.Conv2d(dim, features, 3, padding=1, bias=False) for dim in layer_dims
        )
        # fusion[i] fuses into layer i; the deepest one has no skip (its input is the layer).
        self.fusion = nn.ModuleList(
            FusionBlock(features, has_skip=i < num_layers - 1) for i in range(num_layers)
        )
        head_dim = max(8, features // 2)
        self.head_in = nn.Conv2d(features, head_dim, 3, padding=1)
        if shallow_dim > 0:
            self.shallow = nn.Sequential(
                nn.Conv2d(in_chans, shallow_dim, 3, padding=1),
                nn.ReLU(inplace=True),
                nn.Conv2d(shallow_dim, shallow_dim, 3, padding=1),
                nn.ReLU(inplace=True),
            )
        else:
            self.shallow = None
        self.head_out = nn.Sequential(
            nn.Conv2d(head_dim + max(shallow_dim, 0), out_dim, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.Conv2d(out_dim, out_dim, 1),
        )

    def forward(
        self,
        tokens: Sequence[Tensor],
        grid_size: tuple[int, int],
        out_size: tuple[int, int],
        image: Tensor | None = None,
    ) -> Tensor:
        """Decode tokens into per-pixel features.

        Args:
            tokens: ``num_layers`` tensors ``[B, V, h*w, C]`` (or ``[B*V, h*w, C]``), shallow first.
            grid_size: ``(h, w)`` patch grid.
            out_size: ``(H, W)`` output resolution.
            image: ``[B*V, in_chans, H, W]`` (or ``[B, V, ...]``) raw image for the shallow CNN;
                required when ``shallow_dim > 0``.

        Returns:
            ``[B*V, out_dim, H, W]``.
        """
        if len(tokens) != self.num_layers:
            raise ValueError(f"expected {self.num_layers} token layers, got {len(tokens)}")
        h, w = grid_size
        maps = []
        for layer, reassemble, rn in zip(tokens, self.reassemble, self.layer_rn):
            layer = layer.reshape(-1, *layer.shape[-2:])  # [BV, h*w, C]
            fmap = rearrange(layer, "n (h w) c -> n c h w", h=h, w=w)
            maps.append(rn(reassemble(fmap)))  # [BV, F, h*s, w*s]

        path = None
        for i in reversed(range(self.num_layers)):
            target = tuple(maps[i - 1].shape[-2:]) if i > 0 else tuple(maps[0].shape[-2:])
            if path is None:
                path = self.fusion[i](maps[i], None, target)
            else:
                path = self.fusion[i](path, maps[i], target)
        # path: [BV, F, 4h, 4w] (the shallowest layer's resolution)

        x = self.head_in(path)
        x = F.interpolate(x, size=tuple(out_size), mode="bilinear", align_corners=False)
        x = F.relu(x)
        if self.shallow is not None:
            if image is None:
                raise ValueError("DPTHead with shallow_dim > 0 needs the raw image")
            image = image.reshape(-1, *image.shape[-3:])
            if tuple(image.shape[-2:]) != tuple(out_size):
                image = F.interpolate(
                    image, size=tuple(out_size), mode="bilinear", align_corners=False
                )
            x = torch.cat([x, self.shallow(image)], dim=1)
        return self.head_out(x)  # [BV, C_out, H, W]
