"""Gaussian splatting renderer: gsplat's CUDA rasteriser and a tiled, differentiable PyTorch one.

Both backends follow gsplat's numerics (gsplat 1.5, ``rasterize_mode="classic"``):

- EWA projection: camera covariance ``W R S S^T R^T W^T``, Jacobian of the pinhole projection
  with ``x/z`` and ``y/z`` clamped to the image extent plus 30% of the half field of view, and
  ``0.3`` added to the diagonal of the 2D covariance (no opacity compensation).
- Culling: depth outside ``[near, far]``, a singular 2D covariance, opacity below ``1/255``, or a
  bounding box outside the image. The box is gsplat's opacity-aware one: half-sizes
  ``ceil(e * sqrt(cov2d_xx))`` and ``ceil(e * sqrt(cov2d_yy))`` with
  ``e = min(3.33, sqrt(2 ln(255 o)))``, which contains every pixel the Gaussian can reach with an
  alpha of at least ``1/255``.
- Compositing per 16x16 tile, front to back by depth: pixel centres at ``+0.5``,
  ``alpha = min(0.999, o exp(-sigma))``, alphas below ``1/255`` are skipped, and a pixel stops at
  the first Gaussian that would take its transmittance to ``1e-4`` or below (that Gaussian is not
  composited). The background is added with the remaining transmittance.
- Colour: ``max(SH(mean - camera centre) + 0.5, 0)``.

``rasterize_mode="antialiased"`` (gsplat's, from Mip-Splatting) multiplies each Gaussian's opacity
per camera by the compensation ``sqrt(max(0, det(S) / det(S + 0.3 I)))`` of the 0.3 dilation of its
2D covariance ``S`` before culling, the bounding box and compositing (see
:func:`opacity_compensation`).
"""

from __future__ import annotations

import math
import warnings

import torch
import torch.utils.checkpoint
from torch import Tensor

from models.core.gaussians import Gaussians
from models.core.sh import sh_degree_of
from models.render.cpu import cpu_rasterizer_error, render_cpu
from models.render.gsplat_backend import TILE_SIZE, _render_gsplat, gsplat_available
from models.render.output import RenderOutput
from models.render.projection import EPS2D
from models.render.rasterize import _render_torch

__all__ = ["BACKENDS", "RASTERIZE_MODES", "render"]

BACKENDS = ("auto", "torch", "gsplat", "cpu")
RASTERIZE_MODES = ("classic", "antialiased")
MAX_NORMALISED_FOCAL = 50.0  # larger focal lengths are pixel intrinsics passed by mistake


def _cpu_backend_usable(dtype: torch.dtype) -> bool:
    """Whether ``auto`` takes the compiled CPU rasteriser for ``dtype`` (warns once per reason)."""
    error = cpu_rasterizer_error(dtype)
    if error is not None and error not in _CPU_FALLBACK_WARNED:
        _CPU_FALLBACK_WARNED.add(error)
        warnings.warn(
            f"the compiled CPU rasteriser is not used ({error}); rendering with the PyTorch one",
            RuntimeWarning,
            stacklevel=3,
        )
    return error is None


_CPU_FALLBACK_WARNED: set[str] = set()


# ---------------------------------------------------------------------------------- entry point
def _check_camera(name: str, value: Tensor, batch: int, views: int | None, size: int) -> None:
    if not isinstance(value, Tensor):
        raise ValueError(f"{name} must be a tensor, got {type(value).__name__}")
    if value.ndim != 4 or value.shape[-2:] != (size, size):
        raise ValueError(f"{name} must be [B, V, {size}, {size}], got {tuple(value.shape)}")
    if value.shape[0] != batch:
        raise ValueError(f"{name} has batch size {value.shape[0]} but gaussians has {batch} scenes")
    if views is not None and value.shape[1] != views:
        raise ValueError(f"{name} has {value.shape[1]} views but extrinsics has {views}")
    if not torch.isfinite(value).all():
        raise ValueError(f"{name} has non-finite values")


def _check_plane(name: str, value: float | Tensor, batch: int, views: int) -> float | Tensor:
    if isinstance(value, Tensor):
        if value.numel() == 1:
            value = value.reshape(1, 1).expand(batch, views)
        if tuple(value.shape) != (batch, views):
            raise ValueError(
                f"{name} must be a float or [B, V] = [{batch}, {views}], got {tuple(value.shape)}"
            )
        if not torch.isfinite(value).all():
            raise ValueError(f"{name} has non-finite values")
        return value
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite float or a [B, V] tensor, got {value!r}")
    return float(value)


def _background(background: Tensor | None, batch: int, views: int, like: Tensor) -> Tensor:
    """``background`` as ``[B, V, 3]``."""
    if background is None:
        return torch.zeros(batch, views, 3, dtype=like.dtype, device=like.device)
    background = torch.as_tensor(background, dtype=like.dtype, device=like.device)
    if background.shape == (3,):
        background = background[None, None]
    elif background.shape == (batch, 3):
        background = background[:, None]
    elif background.shape != (batch, views, 3):
        raise ValueError(
            f"background must be [3], [B, 3] or [B, V, 3] with B={batch}, V={views}, "
            f"got {tuple(background.shape)}"
        )
    if not torch.isfinite(background).all():
        raise ValueError("background has non-finite values")
    return background.expand(batch, views, 3)


def _sanitise(gaussians: Gaussians) -> Gaussians:
    """Replace the values of masked-out entries by harmless ones (they may hold NaN)."""
    if gaussians.mask is None:
        return gaussians
    keep = gaussians.mask

    def fill(value: Tensor, default: Tensor) -> Tensor:
        shape = keep.shape + (1,) * (value.ndim - 2)
        return torch.where(keep.reshape(shape), value, default.to(value.dtype))

    return Gaussians(
        means=fill(gaussians.means, torch.zeros(())),
        scales=fill(gaussians.scales, torch.ones(())),
        rotations=fill(gaussians.rotations, torch.tensor([1.0, 0.0, 0.0, 0.0], device=keep.device)),
        opacities=fill(gaussians.opacities, torch.zeros(())),
        harmonics=fill(gaussians.harmonics, torch.zeros(())),
        mask=keep,
    )


def _check_options(backend: str, rasterize_mode: str, eps2d: float) -> float:
    """Checks ``backend``, ``rasterize_mode`` and ``eps2d``; returns ``eps2d`` as a float."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if not isinstance(rasterize_mode, str) or rasterize_mode not in RASTERIZE_MODES:
        raise ValueError(f"rasterize_mode must be one of {RASTERIZE_MODES}, got {rasterize_mode!r}")
    if isinstance(eps2d, bool) or not isinstance(eps2d, (int, float)) or not eps2d >= 0:
        raise ValueError(f"eps2d must be a number >= 0 (pixels squared), got {eps2d!r}")
    return float(eps2d)


def _check_normalised(intrinsics: Tensor) -> None:
    """Normalised intrinsics ``[B, V, 3, 3]``: pixel intrinsics passed by mistake are refused."""
    focal = intrinsics[..., [0, 1], [0, 1]]  # [B, V, 2]
    centre = intrinsics[..., [0, 1], [2, 2]]
    if (focal <= 0).any() or (focal > MAX_NORMALISED_FOCAL).any():
        raise ValueError(
            f"intrinsics must be normalised (focal / image size in (0, {MAX_NORMALISED_FOCAL}]), "
            f"got fx, fy up to {focal.abs().max().item():.4g}: pixel intrinsics passed by mistake?"
        )
    if (centre.abs() > MAX_NORMALISED_FOCAL).any():
        largest = centre.abs().max().item()
        raise ValueError(
            f"intrinsics must be normalised, got a principal point {largest:.4g} image sizes "
            "from the corner: pixel intrinsics passed by mistake?"
        )


def _check_scene(gaussians: Gaussians, extrinsics: Tensor, intrinsics: Tensor) -> None:
    """The Gaussians, their cameras' shapes, batch and device, and normalised intrinsics."""
    if not isinstance(gaussians, Gaussians):
        raise ValueError(f"gaussians must be a Gaussians, got {type(gaussians).__name__}")
    gaussians.validate("gaussians")
    batch = gaussians.batch_size
    _check_camera("extrinsics", extrinsics, batch, None, 4)
    _check_camera("intrinsics", intrinsics, batch, extrinsics.shape[1], 3)
    _check_normalised(intrinsics)
    device = gaussians.device
    for name, value in (("extrinsics", extrinsics), ("intrinsics", intrinsics)):
        if value.device != device:
            raise ValueError(f"{name} is on {value.device} but gaussians is on {device}")
    sh_degree_of(gaussians.harmonics.shape[-1])


def _check_image_size(image_size: tuple[int, int]) -> tuple[int, int]:
    if (
        not isinstance(image_size, (tuple, list))
        or len(image_size) != 2
        or not all(isinstance(s, int) and s > 0 for s in image_size)
    ):
        raise ValueError(f"image_size must be (H, W) with positive ints, got {image_size!r}")
    return (int(image_size[0]), int(image_size[1]))


def _resolve_backend(backend: str, gaussians: Gaussians) -> str:
    """``"auto"``: gsplat for CUDA float32 when it works, the compiled CPU rasteriser for CPU
    tensors when it builds, else torch."""
    device = gaussians.device
    if backend == "gsplat":
        if device.type != "cuda":
            raise ValueError(f"backend='gsplat' needs CUDA tensors, got gaussians on {device}")
        if gaussians.dtype != torch.float32:
            raise ValueError(f"backend='gsplat' needs float32 gaussians, got {gaussians.dtype}")
    if backend == "cpu":
        if device.type != "cpu":
            raise ValueError(f"backend='cpu' needs CPU tensors, got gaussians on {device}")
        error = cpu_rasterizer_error(gaussians.dtype)
        if error is not None:
            raise RuntimeError(f"backend='cpu' is not available: {error}")
    if backend != "auto":
        return backend
    use_gsplat = gaussians.dtype == torch.float32 and gsplat_available(device)
    backend = "gsplat" if use_gsplat else "torch"
    if device.type == "cpu" and _cpu_backend_usable(gaussians.dtype):
        backend = "cpu"
    return backend


def render(
    gaussians: Gaussians,
    extrinsics: Tensor,
    intrinsics: Tensor,
    image_size: tuple[int, int],
    background: Tensor | None = None,
    backend: str = "auto",
    near: float | Tensor = 0.01,
    far: float | Tensor = 1e10,
    tile_size: int = TILE_SIZE,
    chunk: int = 32,
    max_elements: int = 1 << 20,
    recompute: bool = True,
    rasterize_mode: str = "classic",
    eps2d: float = EPS2D,
) -> RenderOutput:
    """Render Gaussians into every view of every scene.

    Args:
        gaussians: a batch of ``B`` Gaussian sets (masked-out entries never render).
        extrinsics: ``[B, V, 4, 4]`` camera-to-world, OpenCV axes.
        intrinsics: ``[B, V, 3, 3]`` normalised (row 0 divided by the width, row 1 by the height).
        image_size: ``(H, W)`` in pixels.
        background: ``[3]``, ``[B, 3]`` or ``[B, V, 3]``; black when ``None``.
        backend: ``"torch"`` (tiled PyTorch rasteriser, any device), ``"gsplat"`` (CUDA, float32),
            ``"cpu"`` (the compiled CPU rasteriser of :mod:`models.render.cpu`, float32/64) or
            ``"auto"`` (gsplat for CUDA float32 tensors when it works, the compiled one for CPU
            tensors when it builds, else torch with one warning saying why).
        near: near plane (camera z), a float or ``[B, V]``; closer Gaussians are culled.
        far: far plane, a float or ``[B, V]``.
        tile_size: torch backend: tile side in pixels (gsplat uses 16).
        chunk: torch backend: Gaussians per tile composited per round (at least).
        max_elements: torch backend: bound on the (tile, pixel, Gaussian) entries of one step,
            the memory knob: without autograd, the intermediates are a few times
            ``max_elements`` floats.
        recompute: torch backend under autograd: recompute each compositing step in the
            backward pass instead of keeping its intermediates (memory stays bounded by
            ``max_elements`` instead of growing with the work; about 20% slower).
        rasterize_mode: ``"classic"`` or ``"antialiased"`` (gsplat's: each opacity is multiplied
            per view by :func:`opacity_compensation` of the Gaussian's 2D covariance; every
            backend).
        eps2d: the screen-space dilation added to each 2D covariance's diagonal, in pixels²
            (gsplat's ``eps2d``; 0.3 by default, as gsplat; ReSplat's release renders with 0.1).

    Returns:
        A :class:`RenderOutput`; ``depth`` is the expected z ``sum_i w_i z_i``, *not* divided by
        ``alpha``.

    Raises:
        ValueError: naming the argument, for wrong shapes or batch sizes, non-finite values,
            intrinsics in pixels instead of normalised, or an unknown backend or rasterize_mode.
    """
    eps2d = _check_options(backend, rasterize_mode, eps2d)
    _check_scene(gaussians, extrinsics, intrinsics)
    batch, views = extrinsics.shape[:2]
    image_size = _check_image_size(image_size)
    near = _check_plane("near", near, batch, views)
    far = _check_plane("far", far, batch, views)
    for name, value in (("tile_size", tile_size), ("chunk", chunk), ("max_elements", max_elements)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    background = _background(background, batch, views, gaussians.means)

    backend = _resolve_backend(backend, gaussians)
    gaussians = _sanitise(gaussians)
    extrinsics = extrinsics.to(gaussians.dtype)
    intrinsics = intrinsics.to(gaussians.dtype)
    views = (extrinsics, intrinsics, image_size, background, near, far)
    if backend == "gsplat" and bool(gaussians.valid_mask().any()):  # gsplat: no empty sets
        return _render_gsplat(gaussians, *views, rasterize_mode, eps2d)
    if backend == "cpu":
        return render_cpu(gaussians, *views, tile_size, rasterize_mode, eps2d)
    return _render_torch(
        gaussians, *views, tile_size, chunk, max_elements, recompute, rasterize_mode, eps2d
    )
