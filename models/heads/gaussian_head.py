"""The shared Gaussian head: raw feature vectors in, ``Gaussians`` out.

Every family ends here, so the activations live in exactly one place:

- scale: ``softplus(x - scale_shift) * scale_factor`` (``scale_shift = 4`` by default), clamped
  to ``max_scale``, then optionally multiplied by a per-location ``scale_reference`` (e.g. depth
  times the pixel footprint), then floored at ``min_scale`` (DepthSplat's release:
  ``clamp(softplus(x - 4), 1e-10, 3)``, world units);
- opacity: ``sigmoid``;
- rotation: normalised quaternion (wxyz);
- colour: SH coefficients; the DC term optionally starts at the pixel colour, higher bands are
  scaled down (``0.1 * 0.25**degree``) so training starts view-independent;
- ``local_frame=True`` (DepthSplat's release): rotations and SH are predicted in each location's
  camera frame and moved to the world by the camera-to-world rotation (quaternion product; SH with
  e3nn's Wigner matrices, ``models.sh.rotate_sh_e3nn``, as the released models were trained).

``in_dim=None`` builds a decode-only head (no projection; call ``decode`` with raw parameters).

Three ways to place the means (``mean_mode``):

- ``ray_depth``: a z-depth along the pixel's ray plus a bounded sub-pixel offset
  (``(sigmoid(x) - 0.5) * pixel_size``) -- pixel-aligned, ReSplat;
- ``free``: unconstrained xyz in the scene frame, ``sign(y) * expm1(|y|)`` clamped -- ZipSplat;
- ``anchor_offset``: an anchor point plus ``tanh(x) * offset_bound * offset_scale`` -- SplatWeaver.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from einops import rearrange, repeat
from torch import Tensor, nn

from ..cameras import unproject
from ..gaussians import Gaussians, rgb_to_sh
from ..rotations import matrix_to_quaternion, quaternion_multiply
from ..sh import rotate_sh_e3nn

__all__ = ["GaussianHead", "MEAN_MODES", "raw_gaussian_dim", "free_mean_activation"]

MEAN_MODES = ("ray_depth", "free", "anchor_offset")


def raw_gaussian_dim(sh_degree: int) -> int:
    """Raw parameters per Gaussian: mean 3 + scale 3 + rotation 4 + opacity 1 + SH 3(d+1)^2."""
    return 3 + 3 + 4 + 1 + 3 * (sh_degree + 1) ** 2


def free_mean_activation(raw: Tensor, max_abs: float) -> Tensor:
    """``sign(y) * (exp|y| - 1)``, clamped to ``[-max_abs, max_abs]`` (ZipSplat's mean map)."""
    limit = math.log1p(max_abs)
    return torch.sign(raw) * torch.expm1(raw.abs().clamp(max=limit))


class GaussianHead(nn.Module):
    """Project features to ``gaussians_per_location`` Gaussians per location and activate them.

    Args:
        in_dim: feature channels ``C``; ``None``: no projection (``decode`` only).
        mean_mode: ``"ray_depth"``, ``"free"`` or ``"anchor_offset"``.
        gaussians_per_location: Gaussians ``G`` decoded from each feature vector.
        sh_degree: SH degree ``d`` (0..3).
        hidden_dim: hidden width of a 2-layer MLP; ``None`` for a single linear layer.
        scale_factor: multiplier of ``softplus(x - 4)``.
        max_scale: clamp of the activated scale (before ``scale_reference``).
        offset_bound: ``anchor_offset`` bound (times ``offset_scale``); ``ray_depth``: bound of the
            sub-pixel offset in pixels (1.0 = up to half a pixel either way).
        free_mean_max: ``free`` means are clamped to this absolute value.
        dc_from_color: add the pixel colour's DC coefficient to the predicted DC.
        opacity_bias: initial bias of the opacity logit.
        min_scale: floor of the final scales.
        local_frame: rotations and SH are in the camera frame of ``extrinsics`` (see above).
        scale_shift: the scale is ``softplus(x - scale_shift) * scale_factor`` (released
            architectures that use ``softplus(x)`` set 0).
        activation: hidden activation of the 2-layer MLP, ``"gelu"`` or ``"relu"``.
        sh_layout: order of the ``3 (d+1)^2`` raw SH values: ``"channel"`` (channel-major, ours)
            or ``"coefficient"`` (coefficient-major, ``[K, 3]``, as ZipSplat's release stores them).
        sh_band_scale: scale the raw higher SH bands down (``0.1 * 0.25**degree``); ports of
            released weights turn it off.
    """

    def __init__(
        self,
        in_dim: int | None,
        *,
        mean_mode: str,
        gaussians_per_location: int = 1,
        sh_degree: int = 1,
        hidden_dim: int | None = None,
        scale_factor: float = 1.0,
        max_scale: float = 0.3,
        offset_bound: float = 1.0,
        free_mean_max: float = 100.0,
        dc_from_color: bool = True,
        opacity_bias: float = 0.0,
        min_scale: float = 1e-7,
        local_frame: bool = False,
        scale_shift: float = 4.0,
        activation: str = "gelu",
        sh_layout: str = "channel",
        sh_band_scale: bool = True,
    ) -> None:
        super().__init__()
        if activation not in ("gelu", "relu"):
            raise ValueError(f"activation must be 'gelu' or 'relu', got {activation!r}")
        if mean_mode not in MEAN_MODES:
            raise ValueError(f"mean_mode must be one of {MEAN_MODES}, got {mean_mode!r}")
        if not 0 <= sh_degree <= 3:
            raise ValueError(f"sh_degree must be in 0..3, got {sh_degree}")
        if gaussians_per_location < 1:
            raise ValueError(f"gaussians_per_location must be >= 1, got {gaussians_per_location}")
        if sh_layout not in ("channel", "coefficient"):
            raise ValueError(f"sh_layout must be 'channel' or 'coefficient', got {sh_layout!r}")
        self.mean_mode = mean_mode
        self.sh_layout = sh_layout
        self.sh_band_scale = sh_band_scale
        self.gaussians_per_location = gaussians_per_location
        self.sh_degree = sh_degree
        self.scale_factor = scale_factor
        self.scale_shift = scale_shift
        self.max_scale = max_scale
        self.offset_bound = offset_bound
        self.free_mean_max = free_mean_max
        self.dc_from_color = dc_from_color
        self.min_scale = min_scale
        self.local_frame = local_frame
        if local_frame and sh_degree > 2:
            raise ValueError(f"local_frame supports sh_degree <= 2, got {sh_degree}")
        self.raw_dim = raw_gaussian_dim(sh_degree)
        out_dim = gaussians_per_location * self.raw_dim
        if in_dim is None:
            self.proj = None
        elif hidden_dim is None:
            self.proj = nn.Linear(in_dim, out_dim)
            last = self.proj
        else:
            self.proj = nn.Sequential(
                nn.Linear(in_dim, hidden_dim),
                nn.GELU() if activation == "gelu" else nn.ReLU(),
                nn.Linear(hidden_dim, out_dim),
            )
            last = self.proj[-1]
        if self.proj is not None:
            with torch.no_grad():
                bias = last.bias.view(gaussians_per_location, self.raw_dim)
                bias.zero_()
                bias[:, 6] = 1.0  # quaternion w: start near the identity rotation
                bias[:, 10] = opacity_bias
        coefficients = (sh_degree + 1) ** 2
        sh_mask = torch.ones(coefficients)
        for degree in range(1, sh_degree + 1):
            sh_mask[degree**2 : (degree + 1) ** 2] = 0.1 * 0.25**degree
        self.register_buffer("sh_mask", sh_mask, persistent=False)

    @property
    def num_sh_coefficients(self) -> int:
        return (self.sh_degree + 1) ** 2

    def forward(
        self,
        features: Tensor,
        *,
        color: Tensor | None = None,
        depth: Tensor | None = None,
        coords: Tensor | None = None,
        pixel_size: Tensor | None = None,
        intrinsics: Tensor | None = None,
        extrinsics: Tensor | None = None,
        anchors: Tensor | None = None,
        offset_scale: Tensor | None = None,
        scale_reference: Tensor | None = None,
    ) -> Gaussians:
        """Decode ``features [B, N, C]`` into ``N * G`` Gaussians (location-major).

        Args:
            features: ``[B, N, C]``.
            color: ``[B, N, 3]`` pixel colour in [0, 1] for the DC initialisation, or
                ``[B, N, G, 3]``, one per Gaussian.
            depth: ``ray_depth``: ``[B, N]`` or ``[B, N, G]`` z-depth.
            coords: ``ray_depth``: ``[B, N, 2]`` normalised pixel centres.
            pixel_size: ``ray_depth``: ``[B, N, 2]`` (or broadcastable) normalised pixel size.
            intrinsics: ``ray_depth``: ``[B, N, 3, 3]`` normalised (broadcastable).
            extrinsics: ``ray_depth``: ``[B, N, 4, 4]`` camera-to-world (broadcastable).
            anchors: ``anchor_offset``: ``[B, N, 3]`` anchor points.
            offset_scale: ``anchor_offset``: ``[B, N]`` per-location multiplier of the bound.
            scale_reference: ``[B, N]`` multiplier of the activated scales.
        """
        if self.proj is None:
            raise ValueError("this GaussianHead is decode-only (in_dim=None): call decode(raw)")
        raw = self.proj(features)  # [B, N, G * raw_dim]
        raw = rearrange(raw, "b n (g r) -> b n g r", g=self.gaussians_per_location)
        return self.decode(
            raw,
            color=color,
            depth=depth,
            coords=coords,
            pixel_size=pixel_size,
            intrinsics=intrinsics,
            extrinsics=extrinsics,
            anchors=anchors,
            offset_scale=offset_scale,
            scale_reference=scale_reference,
        )

    def decode(
        self,
        raw: Tensor,
        *,
        color: Tensor | None = None,
        depth: Tensor | None = None,
        coords: Tensor | None = None,
        pixel_size: Tensor | None = None,
        intrinsics: Tensor | None = None,
        extrinsics: Tensor | None = None,
        anchors: Tensor | None = None,
        offset_scale: Tensor | None = None,
        scale_reference: Tensor | None = None,
    ) -> Gaussians:
        """Activate raw parameters ``[B, N, G, raw_dim]`` (see ``forward`` for the arguments)."""
        b, n, g, _ = raw.shape
        k = self.num_sh_coefficients
        raw_mean, raw_scale, raw_rot, raw_opacity, raw_sh = raw.split([3, 3, 4, 1, 3 * k], dim=-1)

        means = self._place_means(
            raw_mean, depth, coords, pixel_size, intrinsics, extrinsics, anchors, offset_scale
        )  # [B, N, G, 3]

        scales = F.softplus(raw_scale - self.scale_shift) * self.scale_factor
        scales = scales.clamp(max=self.max_scale)
        if scale_reference is not None:
            scales = scales * scale_reference[..., None, None]
        scales = scales.clamp_min(self.min_scale)  # [B, N, G, 3]

        rotations = F.normalize(raw_rot, dim=-1, eps=1e-8)  # [B, N, G, 4]
        opacities = torch.sigmoid(raw_opacity[..., 0])  # [B, N, G]

        order = "(c k)" if self.sh_layout == "channel" else "(k c)"
        harmonics = rearrange(raw_sh, f"b n g {order} -> b n g c k", c=3)
        if self.sh_band_scale:
            harmonics = harmonics * self.sh_mask
        if self.dc_from_color and color is not None:
            dc = rgb_to_sh(color)  # [B, N, 3] per location or [B, N, G, 3] per Gaussian
            dc = dc[:, :, None, :, None] if dc.dim() == 3 else dc[..., None]
            harmonics = torch.cat([harmonics[..., :1] + dc, harmonics[..., 1:]], dim=-1)
        if self.local_frame:
            if extrinsics is None:
                raise ValueError("local_frame=True needs extrinsics")
            c2w = extrinsics[..., :3, :3].expand(b, n, 3, 3)[:, :, None]  # [B, N, 1, 3, 3]
            rotations = quaternion_multiply(matrix_to_quaternion(c2w), rotations)
            harmonics = rotate_sh_e3nn(harmonics, c2w)

        def flat(t: Tensor) -> Tensor:
            return t.reshape(b, n * g, *t.shape[3:])

        return Gaussians(
            means=flat(means),
            scales=flat(scales),
            rotations=flat(rotations),
            opacities=flat(opacities),
            harmonics=flat(harmonics),
        )

    def _place_means(
        self,
        raw_mean: Tensor,
        depth: Tensor | None,
        coords: Tensor | None,
        pixel_size: Tensor | None,
        intrinsics: Tensor | None,
        extrinsics: Tensor | None,
        anchors: Tensor | None,
        offset_scale: Tensor | None,
    ) -> Tensor:
        b, n, g, _ = raw_mean.shape
        if self.mean_mode == "free":
            return free_mean_activation(raw_mean, self.free_mean_max)
        if self.mean_mode == "anchor_offset":
            if anchors is None:
                raise ValueError("mean_mode='anchor_offset' needs anchors [B, N, 3]")
            offset = torch.tanh(raw_mean) * self.offset_bound
            if offset_scale is not None:
                offset = offset * offset_scale[..., None, None]
            return anchors[:, :, None, :] + offset
        # ray_depth
        missing = [
            name
            for name, value in (
                ("depth", depth),
                ("coords", coords),
                ("intrinsics", intrinsics),
                ("extrinsics", extrinsics),
            )
            if value is None
        ]
        if missing:
            raise ValueError(f"mean_mode='ray_depth' needs {', '.join(missing)}")
        if depth.ndim == 2:
            depth = repeat(depth, "b n -> b n g", g=g)
        xy = coords[:, :, None, :]  # [B, N, 1, 2]
        if pixel_size is not None:
            offset = (torch.sigmoid(raw_mean[..., :2]) - 0.5) * self.offset_bound
            xy = xy + offset * pixel_size[..., None, :]
        else:
            xy = xy.expand(b, n, g, 2)
        # Treat (N, G) as the point dimension of one camera per location.
        points = unproject(
            xy.reshape(b * n, g, 2),
            depth.reshape(b * n, g),
            intrinsics.expand(b, n, 3, 3).reshape(b * n, 3, 3),
            extrinsics.expand(b, n, 4, 4).reshape(b * n, 4, 4),
        )
        return points.reshape(b, n, g, 3)
