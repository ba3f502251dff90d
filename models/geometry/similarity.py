"""Similarities between frames: ``x -> scale * rotation @ x + translation``.

The one home of the frame mapping every part of the project needs: a window's frame to the
capture's (fusion), the scene frame to the capture's own frame (inference, the viewer), the scene
frame to a pose-free model's frame (pose fit), structure-from-motion poses to a reference
(evaluation of SfM), and the rigid fits of the families. A :class:`Similarity` may carry leading
batch dimensions (``scale [*S]``, ``rotation [*S, 3, 3]``, ``translation [*S, 3]``); the things it
moves have those dimensions first. Gaussians are moved by ``models.core.gaussians.transform_gaussians``
(they and their spherical harmonics live a layer above this one).

Fits: :func:`umeyama` (points, optionally weighted; Umeyama 1991, Kabsch without the scale) and
:func:`fit_cameras` (cameras: rotation from their orientations, scale and translation from their
centres). :func:`nearest_rotation` is the one SVD projection onto SO(3).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["CAMERA_FITS", "Similarity", "fit_cameras", "nearest_rotation", "umeyama"]

#: What :func:`fit_cameras` may fit: all of it, the scale about the origin only, or nothing.
CAMERA_FITS = ("similarity", "scale", "none")


@dataclass(frozen=True)
class Similarity:
    """``x -> scale * rotation @ x + translation`` (``scale`` and ``translation`` take the
    rotation's dtype and device; a float ``scale`` becomes a tensor)."""

    scale: Tensor  # [*S]
    rotation: Tensor  # [*S, 3, 3]
    translation: Tensor  # [*S, 3]

    def __post_init__(self) -> None:
        scale = torch.as_tensor(self.scale, dtype=self.rotation.dtype, device=self.rotation.device)
        object.__setattr__(self, "scale", scale)
        object.__setattr__(self, "translation", self.translation.to(self.rotation))

    # ------------------------------------------------------------------ construction
    @staticmethod
    def identity(dtype: torch.dtype = torch.float64, device=None) -> Similarity:
        eye = torch.eye(3, dtype=dtype, device=device)
        return Similarity(torch.ones((), dtype=dtype, device=device), eye, eye[0] * 0)

    @staticmethod
    def from_pose(pose: Tensor, scale: float | Tensor = 1.0) -> Similarity:
        """``x -> R @ (scale * x) + t`` for a rigid ``pose = [R | t]`` ``[*S, 4, 4]``, e.g. a
        scene frame at ``scale`` whose origin is the capture camera ``pose``."""
        return Similarity(scale, pose[..., :3, :3], pose[..., :3, 3])

    @staticmethod
    def scaling(factor: float | Tensor, centre: Tensor) -> Similarity:
        """Scaling by ``factor`` about the point ``centre [*S, 3]``."""
        factor = torch.as_tensor(factor, dtype=centre.dtype, device=centre.device)
        eye = torch.eye(3, dtype=centre.dtype, device=centre.device).expand(*centre.shape, 3)
        return Similarity(factor, eye, centre - factor[..., None] * centre)

    # ------------------------------------------------------------------ algebra
    @property
    def batch_shape(self) -> torch.Size:
        return self.scale.shape

    def to(self, *args, **kwargs) -> Similarity:
        """Cast/move every tensor (``Tensor.to``'s arguments)."""
        return Similarity(
            *(t.to(*args, **kwargs) for t in (self.scale, self.rotation, self.translation))
        )

    def inverse(self) -> Similarity:
        r_t = self.rotation.transpose(-1, -2)
        shift = (r_t @ self.translation[..., None])[..., 0]  # [*S, 3]
        return Similarity(1.0 / self.scale, r_t, -shift / self.scale[..., None])

    def compose(self, inner: Similarity) -> Similarity:
        """``self(inner(x))`` as one similarity (also ``self @ inner``)."""
        inner = inner.to(self.rotation)
        shift = (self.rotation @ inner.translation[..., None])[..., 0]
        return Similarity(
            self.scale * inner.scale,
            self.rotation @ inner.rotation,
            self.scale[..., None] * shift + self.translation,
        )

    __matmul__ = compose

    def matrix(self) -> Tensor:
        """``[*S, 4, 4]`` homogeneous matrix ``[[s R, t], [0, 1]]``."""
        out = torch.zeros(
            *self.batch_shape, 4, 4, dtype=self.rotation.dtype, device=self.rotation.device
        )
        out[..., :3, :3] = self.scale[..., None, None] * self.rotation
        out[..., :3, 3] = self.translation
        out[..., 3, 3] = 1.0
        return out

    # ------------------------------------------------------------------ application
    def _aligned(self, ndim: int, like: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``scale, rotation, translation`` cast to ``like`` with singleton dimensions after the
        batch ones so that they broadcast against ``[*S, *rest, ...]`` of ``ndim`` rest dims."""
        pad = (1,) * (ndim - len(self.batch_shape))
        if len(pad) + len(self.batch_shape) != ndim:
            raise ValueError(
                f"a similarity of batch {tuple(self.batch_shape)} cannot move {ndim} dims"
            )
        s = self.scale.to(like).reshape((*self.batch_shape, *pad))
        r = self.rotation.to(like).reshape(*self.batch_shape, *pad, 3, 3)
        t = self.translation.to(like).reshape(*self.batch_shape, *pad, 3)
        return s, r, t

    def points(self, x: Tensor) -> Tensor:
        """Points ``[*S, ..., 3]`` moved (in their dtype)."""
        s, r, t = self._aligned(x.ndim - 1, x)
        return s[..., None] * (r @ x[..., None])[..., 0] + t

    def vectors(self, x: Tensor) -> Tensor:
        """Directions ``[*S, ..., 3]`` rotated (no scale, no translation)."""
        _, r, _ = self._aligned(x.ndim - 1, x)
        return (r @ x[..., None])[..., 0]

    def cameras(self, extrinsics: Tensor) -> Tensor:
        """Camera-to-world ``[*S, ..., 4, 4]`` moved: axes rotated, centres moved (still rigid)."""
        _, r, _ = self._aligned(extrinsics.ndim - 2, extrinsics)
        out = extrinsics.clone()
        out[..., :3, :3] = r @ extrinsics[..., :3, :3]
        out[..., :3, 3] = self.points(extrinsics[..., :3, 3])
        return out

    def to_dict(self) -> dict:
        """An unbatched similarity as JSON numbers (6 decimals)."""
        return {
            "scale": round(float(self.scale), 6),
            "rotation": [[round(float(v), 6) for v in row] for row in self.rotation],
            "translation": [round(float(v), 6) for v in self.translation],
        }


def _proper(u: Tensor, vh: Tensor) -> tuple[Tensor, Tensor]:
    """``U D V^T`` with ``D = diag(1, 1, det(U V^T))`` (a rotation, never a reflection), and
    ``D``'s diagonal ``[..., 3]``."""
    sign = torch.sign(torch.linalg.det(u @ vh))
    sign = torch.where(sign == 0, torch.ones_like(sign), sign)
    diagonal = torch.ones_like(u[..., 0])
    diagonal[..., 2] = sign
    return (u * diagonal[..., None, :]) @ vh, diagonal


def nearest_rotation(matrix: Tensor) -> Tensor:
    """The rotation ``[..., 3, 3]`` nearest (Frobenius) to ``matrix [..., 3, 3]`` (SVD)."""
    u, _, vh = torch.linalg.svd(matrix)
    return _proper(u, vh)[0]


def umeyama(
    source: Tensor, target: Tensor, weights: Tensor | None = None, *, scale: bool = True
) -> Similarity:
    """The least-squares similarity ``target ≈ s R source + t`` (Umeyama 1991), weighted.

    Args:
        source: ``[*S, P, 3]`` points.
        target: ``[*S, P, 3]`` the same points in the other frame.
        weights: ``[*S, P]`` non-negative, or ``None`` for uniform.
        scale: fit the scale; ``False`` keeps it 1 (Kabsch: a rigid fit).

    Returns:
        A :class:`Similarity` of batch ``[*S]`` in ``source``'s dtype (solved in float64). Where
        the source points coincide the scale is 1.
    """
    if source.shape != target.shape or source.shape[-1] != 3:
        raise ValueError(
            f"source and target must both be [..., P, 3], got {tuple(source.shape)} and "
            f"{tuple(target.shape)}"
        )
    a, b = source.double(), target.double()
    w = torch.ones_like(a[..., 0]) if weights is None else weights.to(a).expand_as(a[..., 0])
    w = w / w.sum(dim=-1, keepdim=True).clamp_min(1e-300)  # [*S, P]
    mean_a = (w[..., None] * a).sum(dim=-2)  # [*S, 3]
    mean_b = (w[..., None] * b).sum(dim=-2)
    a, b = a - mean_a[..., None, :], b - mean_b[..., None, :]
    covariance = torch.einsum("...p,...pi,...pj->...ij", w, b, a)  # [*S, 3, 3]
    u, sigma, vh = torch.linalg.svd(covariance)
    rotation, diagonal = _proper(u, vh)
    s = torch.ones_like(w[..., 0])
    if scale:
        variance = (w * a.square().sum(-1)).sum(-1)  # [*S]
        spread = variance > 1e-24
        s = torch.where(spread, (sigma * diagonal).sum(-1) / variance.clamp_min(1e-24), s)
    translation = mean_b - s[..., None] * (rotation @ mean_a[..., None])[..., 0]
    return Similarity(s, rotation, translation).to(source.dtype)


def fit_cameras(
    source: Tensor, target: Tensor, mode: str = "similarity", eps: float = 1e-6
) -> Similarity:
    """The similarity taking cameras ``source`` onto the same cameras ``target``.

    The rotation is the average of the per-camera relative rotations ``R_tgt R_src^T`` (projected
    onto SO(3)), so two cameras suffice; given it, the scale and translation minimise the camera
    centres' squared distances (Umeyama with the rotation fixed). ``mode="scale"`` keeps both
    frames' origins (view 0 at the origin in both, as for pose-free models) and fits the scale
    only; ``"none"`` is the identity. Where the centres coincide the scale stays 1.

    Args:
        source: ``[*S, V, 4, 4]`` camera-to-world in the source frame.
        target: ``[*S, V, 4, 4]`` the same cameras in the target frame.
        mode: one of :data:`CAMERA_FITS`.
        eps: centre spread below which the scale is left at 1.

    Returns:
        A :class:`Similarity` of batch ``[*S]``.
    """
    if mode not in CAMERA_FITS:
        raise ValueError(f"alignment must be one of {', '.join(CAMERA_FITS)}, got {mode!r}")
    if source.shape != target.shape or source.ndim < 3 or source.shape[-2:] != (4, 4):
        raise ValueError(
            f"source and target must both be [..., V, 4, 4], got {tuple(source.shape)} and "
            f"{tuple(target.shape)}"
        )
    batch = source.shape[:-3]
    eye = torch.eye(3, dtype=source.dtype, device=source.device).expand(*batch, 3, 3).clone()
    ones = torch.ones(batch, dtype=source.dtype, device=source.device)
    zeros = torch.zeros(*batch, 3, dtype=source.dtype, device=source.device)
    if mode == "none":
        return Similarity(ones, eye, zeros)
    c_src, c_tgt = source[..., :3, 3], target[..., :3, 3]  # [*S, V, 3] camera centres
    if mode == "scale":
        rotation, mean_src, mean_tgt = eye, zeros, zeros
    else:
        relative = target[..., :3, :3] @ source[..., :3, :3].transpose(-1, -2)  # [*S, V, 3, 3]
        rotation = nearest_rotation(relative.sum(dim=-3))
        c_src = (rotation[..., None, :, :] @ c_src[..., None])[..., 0]
        mean_src, mean_tgt = c_src.mean(dim=-2), c_tgt.mean(dim=-2)  # [*S, 3]
    centred_src, centred_tgt = c_src - mean_src[..., None, :], c_tgt - mean_tgt[..., None, :]
    norm = centred_src.square().sum(dim=(-2, -1))  # [*S]
    dot = (centred_src * centred_tgt).sum(dim=(-2, -1))
    s = torch.where(norm > eps**2, dot / norm.clamp_min(eps**2), ones).clamp_min(eps)
    return Similarity(s, rotation, mean_tgt - s[..., None] * mean_src)
