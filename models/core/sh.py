"""Real spherical harmonics in gsplat's (and the original 3DGS code's) convention.

The orthonormal real basis with the Condon-Shortley phase, ordered by degree ``l`` then order
``m = -l..l`` (Sloan, "Efficient Spherical Harmonic Evaluation", JCGT 2013): e.g.
``Y_1 = -C1 * y``, ``Y_2 = C1 * z``, ``Y_3 = -C1 * x`` for unit directions ``(x, y, z)``,
``C1 = sqrt(3 / 4 pi)``. It is evaluated here from the Legendre recurrence (``eval_sh_bases``).
Coefficients are stored channel-major, ``[..., 3, K]`` with ``K = (d + 1)^2``; the renderer turns
the result into a colour with ``max(SH + 0.5, 0)``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = [
    "MAX_SH_DEGREE",
    "eval_sh",
    "eval_sh_bases",
    "num_sh_bases",
    "rotate_sh_e3nn",
    "sh_degree_of",
    "sh_rotation",
]

MAX_SH_DEGREE = 4


def num_sh_bases(degree: int) -> int:
    """Number of coefficients ``(d + 1)^2`` of degree ``d``."""
    return (degree + 1) ** 2


def sh_degree_of(num_bases: int) -> int:
    """Degree of a coefficient count; ``ValueError`` when it is not ``(d + 1)^2`` with d <= 4."""
    degree = math.isqrt(num_bases) - 1
    if num_bases < 1 or (degree + 1) ** 2 != num_bases or degree > MAX_SH_DEGREE:
        raise ValueError(
            f"harmonics must have (d+1)^2 coefficients with 0 <= d <= {MAX_SH_DEGREE}, "
            f"got {num_bases}"
        )
    return degree


def _normalisation(degree: int, order: int) -> float:
    """``K_l^m`` of the orthonormal real basis (``sqrt 2`` folded in for ``m != 0``)."""
    m = abs(order)
    ratio = math.factorial(degree - m) / math.factorial(degree + m)
    k = math.sqrt((2 * degree + 1) / (4 * math.pi) * ratio)
    return k * math.sqrt(2.0) if order else k


def _polar_parts(degree: int, z: Tensor) -> dict[tuple[int, int], Tensor]:
    """Associated Legendre functions ``P_l^m(z)`` over ``(1 - z^2)^(m/2)`` (Condon-Shortley phase
    included), for ``0 <= m <= l <= degree``, by the standard three-term recurrence in ``l``."""
    parts: dict[tuple[int, int], Tensor] = {}
    for m in range(degree + 1):
        double_factorial = math.prod(range(2 * m - 1, 0, -2))
        parts[m, m] = torch.full_like(z, (-1) ** m * double_factorial)
        if m < degree:
            parts[m + 1, m] = (2 * m + 1) * z * parts[m, m]
        for ell in range(m + 2, degree + 1):
            previous = (2 * ell - 1) * z * parts[ell - 1, m]
            parts[ell, m] = (previous - (ell + m - 1) * parts[ell - 2, m]) / (ell - m)
    return parts


def eval_sh_bases(degree: int, directions: Tensor) -> Tensor:
    """Real SH basis functions at ``directions`` (normalised here), gsplat's convention.

    ``Y_l^m = K_l^m P_l^m(z) cos(m phi)`` for ``m > 0``, ``... sin(|m| phi)`` for ``m < 0``, at index
    ``l^2 + l + m``; the azimuthal factors times ``sin^|m|(theta)`` are the real and imaginary parts
    of ``(x + i y)^|m|`` (Sloan 2013), so no trigonometric function is evaluated.

    Args:
        degree: SH degree in ``0..4``.
        directions: ``[..., 3]`` directions, any non-zero length.

    Returns:
        ``[..., (degree + 1)^2]`` basis values.
    """
    if not 0 <= degree <= MAX_SH_DEGREE:
        raise ValueError(f"degree must be in 0..{MAX_SH_DEGREE}, got {degree}")
    if degree == 0:
        return torch.full_like(directions[..., :1], _normalisation(0, 0))
    x, y, z = torch.nn.functional.normalize(directions, dim=-1).unbind(-1)  # [...] each
    cosines, sines = [torch.ones_like(x), x], [torch.zeros_like(x), y]  # Re, Im of (x + iy)^m
    for _ in range(2, degree + 1):
        real, imaginary = cosines[-1], sines[-1]
        cosines.append(x * real - y * imaginary)
        sines.append(x * imaginary + y * real)
    polar = _polar_parts(degree, z)
    bases = []
    for ell in range(degree + 1):
        for order in range(-ell, ell + 1):
            m = abs(order)
            azimuthal = cosines[m] if order >= 0 else sines[m]
            part = polar[ell, m] if order == 0 else polar[ell, m] * azimuthal
            bases.append(_normalisation(ell, order) * part)
    return torch.stack(bases, dim=-1)


def eval_sh(harmonics: Tensor, directions: Tensor) -> Tensor:
    """Evaluate SH coefficients along view directions.

    Args:
        harmonics: ``[..., 3, K]`` coefficients, ``K = (d + 1)^2``, ``d <= 4``.
        directions: ``[..., 3]`` directions (camera centre to Gaussian), broadcastable against
            ``harmonics[..., 0, 0]``'s batch shape; normalised here.

    Returns:
        ``[..., 3]`` raw SH values (no ``+ 0.5`` offset, no clamping).
    """
    if harmonics.ndim < 2 or harmonics.shape[-2] != 3:
        raise ValueError(f"harmonics must be [..., 3, K], got {tuple(harmonics.shape)}")
    if directions.shape[-1] != 3:
        raise ValueError(f"directions must be [..., 3], got {tuple(directions.shape)}")
    degree = sh_degree_of(harmonics.shape[-1])
    bases = eval_sh_bases(degree, directions.to(harmonics.dtype))  # [..., K]
    return (harmonics * bases[..., None, :]).sum(dim=-1)  # [..., 3]


def sh_rotation(rotation: Tensor, degree: int) -> Tensor:
    """``[..., K, K]`` ``M`` with ``SH(R^T d) = SH(d) @ M`` for rotations ``R [..., 3, 3]``, so that
    coefficients ``c [..., K]`` of a scene rotated by ``R`` are ``c @ M.T`` (float64).

    Exact: each degree's span is closed under rotation, so the least-squares solution over a fixed
    set of directions (more than ``K``, in general position) is the rotation's matrix.
    """
    generator = torch.Generator().manual_seed(0)
    directions = torch.randn(256, 3, generator=generator, dtype=torch.float64)
    directions = directions.to(rotation.device)
    here = eval_sh_bases(degree, directions)  # [D, K]
    there = eval_sh_bases(degree, directions @ rotation.double())  # [..., D, K] rows R^T d
    return torch.linalg.lstsq(here.expand_as(there), there).solution  # [..., K, K]


def _e3nn_quadratic_forms(like: Tensor) -> Tensor:
    """``[5, 3, 3]`` symmetric matrices ``A_k`` with ``Y_k(d) = d^T A_k d`` for e3nn's degree-2
    real harmonics (y as the polar axis), up to one common factor."""
    s15, s5 = math.sqrt(15.0), math.sqrt(5.0)
    forms = torch.zeros(5, 3, 3, dtype=like.dtype, device=like.device)
    forms[0, 0, 2] = forms[0, 2, 0] = s15 / 2  # x z
    forms[1, 0, 1] = forms[1, 1, 0] = s15 / 2  # x y
    forms[2] = torch.diag(torch.tensor([-0.5, 1.0, -0.5], dtype=like.dtype)) * s5
    forms[3, 1, 2] = forms[3, 2, 1] = s15 / 2  # y z
    forms[4] = torch.diag(torch.tensor([-1.0, 0.0, 1.0], dtype=like.dtype)) * (s15 / 2)
    return forms


def rotate_sh_e3nn(harmonics: Tensor, rotation: Tensor) -> Tensor:
    """Rotate SH coefficients block by block with e3nn's Wigner matrices (degrees 0..2).

    This is ``rotate_sh`` of pixelSplat / MVSplat / DepthSplat (``e3nn.o3.wigner_D`` of the
    rotation's angles): degree 1 is multiplied by ``R`` itself, degree 2 by the 5x5 matrix ``D``
    with ``Y(R d) = D Y(d)`` in e3nn's real basis. That is not the exact rotation of gsplat's
    basis (whose degree-1 order is ``(-y, z, -x)``), but it is what those released models were
    trained with, so their camera-frame coefficients must be moved to the world this way.

    Args:
        harmonics: ``[..., 3, K]`` with ``K`` in (1, 4, 9).
        rotation: ``[..., 3, 3]`` (broadcastable against ``harmonics[..., 0, 0]``).
    """
    k = harmonics.shape[-1]
    if k not in (1, 4, 9):
        raise ValueError(f"rotate_sh_e3nn supports degrees 0..2 (K = 1, 4, 9), got K = {k}")
    blocks = [harmonics[..., :1]]
    r = rotation[..., None, :, :]  # [..., 1, 3, 3] over the colour channel
    if k >= 4:
        blocks.append(torch.einsum("...ij,...j->...i", r, harmonics[..., 1:4]))
    if k >= 9:
        forms = _e3nn_quadratic_forms(rotation)  # [5, 3, 3]
        # R^T A_k R expanded in the (orthogonal, equal-norm) basis {A_j}
        rotated = torch.einsum("...ai,kab,...bj->...kij", rotation, forms, rotation)
        d2 = torch.einsum("...kij,lij->...kl", rotated, forms) / (forms[0] * forms[0]).sum()
        blocks.append(torch.einsum("...ij,...j->...i", d2[..., None, :, :], harmonics[..., 4:9]))
    return torch.cat(blocks, dim=-1)
