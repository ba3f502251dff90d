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
  e3nn's Wigner matrices, ``models.core.sh.rotate_sh_e3nn``, as the released models were trained).

``in_dim=None`` builds a decode-only head (no projection; call ``decode`` with raw parameters).

Where the means go is a small *placement* module chosen at construction; the per-location inputs
it needs are keyword arguments of ``forward``/``decode`` named by its ``forward`` signature:

- ``RayDepthPlacement``: a z-depth along the pixel's ray plus a bounded sub-pixel offset
  (``(sigmoid(x) - 0.5) * pixel_size``); inputs ``depth, coords, intrinsics, extrinsics``,
  optional ``pixel_size`` -- pixel-aligned, ReSplat, DepthSplat;
- ``FreeMeanPlacement``: unconstrained xyz in the scene frame, ``sign(y) * expm1(|y|)`` clamped;
  no inputs -- ZipSplat;
- ``AnchorOffsetPlacement``: an anchor point plus ``tanh(x) * offset_bound * offset_scale``;
  inputs ``anchors``, optional ``offset_scale`` -- SplatWeaver, pose-free pixel-aligned.
"""

from __future__ import annotations

import inspect
import math

import torch
import torch.nn.functional as F
from einops import rearrange, repeat
from torch import Tensor, nn

from models.core.gaussians import Gaussians, rgb_to_sh
from models.core.sh import rotate_sh_e3nn
from models.geometry.cameras import unproject
from models.geometry.rotations import matrix_to_quaternion, quaternion_multiply

__all__ = [
    "GaussianHead",
    "MeanPlacement",
    "RayDepthPlacement",
    "FreeMeanPlacement",
    "AnchorOffsetPlacement",
    "raw_gaussian_dim",
    "free_mean_activation",
]


def raw_gaussian_dim(sh_degree: int) -> int:
    """Raw parameters per Gaussian: mean 3 + scale 3 + rotation 4 + opacity 1 + SH 3(d+1)^2."""
    return 3 + 3 + 4 + 1 + 3 * (sh_degree + 1) ** 2


def free_mean_activation(raw: Tensor, max_abs: float) -> Tensor:
    """``sign(y) * (exp|y| - 1)``, clamped to ``[-max_abs, max_abs]`` (ZipSplat's mean map)."""
    limit = math.log1p(max_abs)
    return torch.sign(raw) * torch.expm1(raw.abs().clamp(max=limit))


class MeanPlacement(nn.Module):
    """Places the means: raw mean parameters ``[B, N, G, 3]`` -> means ``[B, N, G, 3]``.

    A subclass's ``forward(raw, *, name, other=None)`` names the per-location inputs it needs
    (keyword-only; those with a default are optional). ``GaussianHead`` reads them from the
    signature, checks a call's keywords against them and passes them on. No parameters: a
    placement adds nothing to the state dict.
    """

    mode: str = ""
    required_inputs: tuple[str, ...] = ()
    optional_inputs: tuple[str, ...] = ()

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        params = list(inspect.signature(cls.forward).parameters.values())[2:]  # self, raw
        cls.required_inputs = tuple(p.name for p in params if p.default is p.empty)
        cls.optional_inputs = tuple(p.name for p in params if p.default is not p.empty)

    @property
    def inputs(self) -> tuple[str, ...]:
        return self.required_inputs + self.optional_inputs


class FreeMeanPlacement(MeanPlacement):
    """Unconstrained xyz: ``sign(y) * expm1(|y|)`` clamped to ``max_abs`` (ZipSplat)."""

    mode = "free"

    def __init__(self, max_abs: float = 100.0) -> None:
        super().__init__()
        self.max_abs = max_abs

    def forward(self, raw: Tensor) -> Tensor:
        return free_mean_activation(raw, self.max_abs)

    def extra_repr(self) -> str:
        return f"max_abs={self.max_abs}"


class AnchorOffsetPlacement(MeanPlacement):
    """An anchor plus ``tanh(x) * offset_bound`` (times ``offset_scale`` when given).

    Inputs: ``anchors [B, N, 3]``; optional ``offset_scale [B, N]`` per-location multiplier.
    """

    mode = "anchor_offset"

    def __init__(self, offset_bound: float = 1.0) -> None:
        super().__init__()
        self.offset_bound = offset_bound

    def forward(
        self, raw: Tensor, *, anchors: Tensor, offset_scale: Tensor | None = None
    ) -> Tensor:
        offset = torch.tanh(raw) * self.offset_bound
        if offset_scale is not None:
            offset = offset * offset_scale[..., None, None]
        return anchors[:, :, None, :] + offset

    def extra_repr(self) -> str:
        return f"offset_bound={self.offset_bound}"


class RayDepthPlacement(MeanPlacement):
    """A z-depth along the pixel's ray, the pixel moved by ``(sigmoid(x) - 0.5) * offset_bound``
    pixels when ``pixel_size`` is given (1.0: up to half a pixel either way).

    Inputs: ``depth [B, N]`` or ``[B, N, G]`` z-depth, ``coords [B, N, 2]`` normalised pixel
    centres, ``intrinsics [B, N, 3, 3]`` normalised and ``extrinsics [B, N, 4, 4]``
    camera-to-world (both broadcastable); optional ``pixel_size [B, N, 2]`` (broadcastable).
    """

    mode = "ray_depth"

    def __init__(self, offset_bound: float = 1.0) -> None:
        super().__init__()
        self.offset_bound = offset_bound

    def forward(
        self,
        raw: Tensor,
        *,
        depth: Tensor,
        coords: Tensor,
        intrinsics: Tensor,
        extrinsics: Tensor,
        pixel_size: Tensor | None = None,
    ) -> Tensor:
        b, n, g, _ = raw.shape
        if depth.ndim == 2:
            depth = repeat(depth, "b n -> b n g", g=g)
        xy = coords[:, :, None, :]  # [B, N, 1, 2]
        if pixel_size is not None:
            offset = (torch.sigmoid(raw[..., :2]) - 0.5) * self.offset_bound
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

    def extra_repr(self) -> str:
        return f"offset_bound={self.offset_bound}"


class GaussianHead(nn.Module):
    """Project features to ``gaussians_per_location`` Gaussians per location and activate them.

    Args:
        in_dim: feature channels ``C``; ``None``: no projection (``decode`` only).
        placement: where the means go (``RayDepthPlacement``, ``FreeMeanPlacement``,
            ``AnchorOffsetPlacement``); its ``forward`` keywords are the head's inputs.
        gaussians_per_location: Gaussians ``G`` decoded from each feature vector.
        sh_degree: SH degree ``d`` (0..3).
        hidden_dim: hidden width of a 2-layer MLP; ``None`` for a single linear layer.
        scale_factor: multiplier of ``softplus(x - 4)``.
        max_scale: clamp of the activated scale (before ``scale_reference``).
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
        placement: MeanPlacement,
        *,
        gaussians_per_location: int = 1,
        sh_degree: int = 1,
        hidden_dim: int | None = None,
        scale_factor: float = 1.0,
        max_scale: float = 0.3,
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
        if not isinstance(placement, MeanPlacement):
            raise ValueError(f"placement must be a MeanPlacement, got {type(placement).__name__}")
        if not 0 <= sh_degree <= 3:
            raise ValueError(f"sh_degree must be in 0..3, got {sh_degree}")
        if gaussians_per_location < 1:
            raise ValueError(f"gaussians_per_location must be >= 1, got {gaussians_per_location}")
        if sh_layout not in ("channel", "coefficient"):
            raise ValueError(f"sh_layout must be 'channel' or 'coefficient', got {sh_layout!r}")
        self.placement = placement
        self.sh_layout = sh_layout
        self.sh_band_scale = sh_band_scale
        self.gaussians_per_location = gaussians_per_location
        self.sh_degree = sh_degree
        self.scale_factor = scale_factor
        self.scale_shift = scale_shift
        self.max_scale = max_scale
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

    @property
    def inputs(self) -> tuple[str, ...]:
        """Per-location keyword inputs besides ``color`` and ``scale_reference``: the
        placement's, plus ``extrinsics`` for ``local_frame``."""
        names = self.placement.inputs
        if self.local_frame and "extrinsics" not in names:
            names = (*names, "extrinsics")
        return names

    def forward(
        self,
        features: Tensor,
        *,
        color: Tensor | None = None,
        scale_reference: Tensor | None = None,
        **inputs: Tensor | None,
    ) -> Gaussians:
        """Decode ``features [B, N, C]`` into ``N * G`` Gaussians (location-major).

        Args:
            features: ``[B, N, C]``.
            color: ``[B, N, 3]`` pixel colour in [0, 1] for the DC initialisation, or
                ``[B, N, G, 3]``, one per Gaussian.
            scale_reference: ``[B, N]`` multiplier of the activated scales.
            inputs: the placement's per-location inputs (see ``inputs``; ``None`` = not given),
                e.g. ``RayDepthPlacement``'s ``depth``, ``coords``, ``intrinsics``,
                ``extrinsics``, ``pixel_size``.
        """
        if self.proj is None:
            raise ValueError("this GaussianHead is decode-only (in_dim=None): call decode(raw)")
        raw = self.proj(features)  # [B, N, G * raw_dim]
        raw = rearrange(raw, "b n (g r) -> b n g r", g=self.gaussians_per_location)
        return self.decode(raw, color=color, scale_reference=scale_reference, **inputs)

    def _check_inputs(self, inputs: dict[str, Tensor | None]) -> dict[str, Tensor]:
        """The given (non-``None``) inputs, after checking them against ``inputs``."""
        given = {name: value for name, value in inputs.items() if value is not None}
        name = type(self.placement).__name__
        unknown = [key for key in inputs if key not in self.inputs]
        if unknown:
            takes = ", ".join(self.inputs) or "none"
            raise ValueError(
                f"GaussianHead with {name} got unexpected input(s) {', '.join(unknown)} "
                f"(it takes {takes}, color, scale_reference)"
            )
        missing = [key for key in self.placement.required_inputs if key not in given]
        if missing:
            raise ValueError(f"{name} needs {', '.join(missing)}")
        return given

    def decode(
        self,
        raw: Tensor,
        *,
        color: Tensor | None = None,
        scale_reference: Tensor | None = None,
        **inputs: Tensor | None,
    ) -> Gaussians:
        """Activate raw parameters ``[B, N, G, raw_dim]`` (see ``forward`` for the arguments)."""
        given = self._check_inputs(inputs)
        b, n, g, _ = raw.shape
        k = self.num_sh_coefficients
        raw_mean, raw_scale, raw_rot, raw_opacity, raw_sh = raw.split([3, 3, 4, 1, 3 * k], dim=-1)

        placed = {key: value for key, value in given.items() if key in self.placement.inputs}
        means = self.placement(raw_mean, **placed)  # [B, N, G, 3]

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
            extrinsics = given.get("extrinsics")
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
