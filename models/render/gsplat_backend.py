"""The gsplat backend (CUDA only; gsplat is never imported at module import time)."""

from __future__ import annotations

import functools
import warnings

import torch
import torch.utils.checkpoint
from torch import Tensor

from models.core.gaussians import Gaussians
from models.geometry.cameras import intrinsics_to_pixels, world_to_camera
from models.render.output import (
    RenderOutput,
)
from models.render.projection import (
    EPS2D,
)

__all__ = ["TILE_SIZE", "gsplat_available"]

TILE_SIZE = 16


# ---------------------------------------------------------------------------------- gsplat backend
def _render_gsplat(
    gaussians: Gaussians,
    extrinsics: Tensor,
    intrinsics: Tensor,
    image_size: tuple[int, int],
    background: Tensor,
    near: float | Tensor,
    far: float | Tensor,
    rasterize_mode: str = "classic",
    eps2d: float = EPS2D,
) -> RenderOutput:
    """``gsplat.rasterization`` (CUDA, float32), imported here and nowhere else."""
    from gsplat import rasterization

    height, width = image_size
    near_value, far_value = _scalar_plane(near), _scalar_plane(far)
    if near_value is None or far_value is None:
        # Per-view planes: gsplat takes one plane per call, so render view by view.
        outputs = [
            _render_gsplat(
                gaussians,
                extrinsics[:, v : v + 1],
                intrinsics[:, v : v + 1],
                image_size,
                background[:, v : v + 1],
                near[:, v : v + 1] if isinstance(near, Tensor) else near,
                far[:, v : v + 1] if isinstance(far, Tensor) else far,
                rasterize_mode,
                eps2d,
            )
            for v in range(extrinsics.shape[1])
        ]
        return RenderOutput(
            *(
                torch.cat([getattr(o, k) for o in outputs], dim=1)
                for k in RenderOutput.__annotations__
            )
        )
    opacities = gaussians.opacities
    if gaussians.mask is not None:
        opacities = torch.where(gaussians.mask, opacities, torch.zeros_like(opacities))
    colors, alphas, meta = rasterization(
        means=gaussians.means,
        quats=gaussians.rotations,
        scales=gaussians.scales,
        opacities=opacities,
        colors=gaussians.harmonics.transpose(-1, -2).contiguous(),  # [B, N, K, 3]
        viewmats=world_to_camera(extrinsics),
        Ks=intrinsics_to_pixels(intrinsics, image_size),
        width=width,
        height=height,
        near_plane=near_value,
        far_plane=far_value,
        eps2d=eps2d,
        sh_degree=gaussians.sh_degree,
        packed=False,
        tile_size=TILE_SIZE,
        backgrounds=background.contiguous(),
        render_mode="RGB+D",  # accumulated depth sum_i w_i z_i (not divided by alpha)
        rasterize_mode=rasterize_mode,
    )  # [B, V, H, W, 4], [B, V, H, W, 1]
    return RenderOutput(
        color=colors[..., :3].permute(0, 1, 4, 2, 3),
        depth=colors[..., 3],
        alpha=alphas[..., 0],
        radii=meta["radii"],
        means2d=meta["means2d"],
    )


def _scalar_plane(value: float | Tensor) -> float | None:
    """A near/far plane as one float, or ``None`` when it differs between views."""
    if not isinstance(value, Tensor):
        return float(value)
    flat = value.flatten()
    if flat.numel() == 0 or bool((flat == flat[0]).all()):
        return float(flat[0]) if flat.numel() else 0.0
    return None


@functools.cache
def _gsplat_works(device: str) -> bool:
    """Whether gsplat imports and rasterises on ``device`` (cached per device)."""
    try:
        from gsplat import rasterization

        means = torch.tensor([[0.0, 0.0, 2.0]], device=device)
        colors, _, _ = rasterization(
            means=means,
            quats=torch.tensor([[1.0, 0.0, 0.0, 0.0]], device=device),
            scales=torch.full((1, 3), 0.1, device=device),
            opacities=torch.ones(1, device=device) * 0.5,
            colors=torch.ones(1, 3, device=device),
            viewmats=torch.eye(4, device=device)[None],
            Ks=torch.tensor([[[16.0, 0, 8], [0, 16.0, 8], [0, 0, 1]]], device=device),
            width=16,
            height=16,
            packed=False,
        )
        torch.cuda.synchronize(device)
        return bool(colors.sum() > 0)
    except Exception as error:  # import errors, JIT build failures, missing kernels
        warnings.warn(
            f"gsplat is not usable on {device} ({type(error).__name__}: {error}); "
            "falling back to the PyTorch renderer",
            RuntimeWarning,
            stacklevel=3,
        )
        return False


def gsplat_available(device: torch.device | str = "cuda") -> bool:
    """Whether ``backend="gsplat"`` works on ``device`` (a CUDA device; the answer is cached)."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return _gsplat_works(str(device))
