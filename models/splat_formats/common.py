"""What every splat format shares: the arrays, axis flips, quantisers, checks and atomic writes.

:class:`SplatArrays` holds one scene as NumPy arrays in the project's conventions (DESIGN.md):
OpenCV axes (x right, y down, z forward; the INRIA ``.ply``'s, "RDF"), wxyz unit quaternions,
linear scales, opacities in [0, 1], SH coefficients channel-major ``[N, 3, K]`` in gsplat's basis.
Each format module converts between these and its own file.
"""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
from dataclasses import dataclass

import numpy as np

from datamodules.errors import InputError

__all__ = [
    "SH_C0",
    "SplatArrays",
    "atomic_write_bytes",
    "flip_axes",
    "kd_chunk_order",
    "kmeans_1d",
    "logit",
    "morton_order",
    "pack_smallest_three",
    "read_bytes",
    "sh_parity_signs",
    "sigmoid",
    "unpack_smallest_three",
]

SH_C0 = 0.28209479177387814  # Y_0^0

# Axes whose coordinate appears with an odd power in each real SH basis function (gsplat's order:
# Y_1 ~ y, Y_2 ~ z, Y_3 ~ x; Y_4 ~ xy, Y_5 ~ yz, Y_6 ~ 3z^2 - 1, Y_7 ~ xz, Y_8 ~ x^2 - y^2; then
# y(3x^2 - y^2), xyz, y(5z^2 - 1), z(5z^2 - 3), x(5z^2 - 1), z(x^2 - y^2), x(x^2 - 3y^2)). Flipping
# an axis multiplies a coefficient by -1 once per such axis.
_SH_ODD_AXES = (
    "",
    "y", "z", "x",
    "xy", "yz", "", "xz", "",
    "y", "xyz", "y", "z", "x", "z", "x",
)  # fmt: skip


@dataclass
class SplatArrays:
    """One scene: ``means [N, 3]``, ``scales [N, 3]`` (linear), ``rotations [N, 4]`` (wxyz),
    ``opacities [N]`` in [0, 1], ``harmonics [N, 3, K]`` (float32 or float64)."""

    means: np.ndarray
    scales: np.ndarray
    rotations: np.ndarray
    opacities: np.ndarray
    harmonics: np.ndarray

    @property
    def count(self) -> int:
        return int(self.means.shape[0])

    @property
    def sh_degree(self) -> int:
        return math.isqrt(self.harmonics.shape[-1]) - 1

    def take(self, order: np.ndarray) -> SplatArrays:
        """The Gaussians in ``order`` (an index array)."""
        return SplatArrays(*(getattr(self, k)[order] for k in _FIELDS))

    def check(self, path: str | os.PathLike) -> SplatArrays:
        """Raise :class:`InputError` naming ``path`` when a value is non-finite or out of range."""
        for key in _FIELDS:
            value = getattr(self, key)
            if not np.isfinite(value).all():
                bad = int((~np.isfinite(value)).reshape(value.shape[0], -1).any(axis=1).sum())
                raise InputError(path, f"{bad} Gaussians have non-finite {key} (NaN or Inf)")
        if (self.scales <= 0).any():
            raise InputError(path, "scales must be positive")
        if ((self.opacities < 0) | (self.opacities > 1)).any():
            raise InputError(path, "opacities must be in [0, 1]")
        if (np.linalg.norm(self.rotations, axis=1) == 0).any():
            raise InputError(path, "a rotation quaternion has zero length")
        if self.harmonics.shape[-1] > 16:
            raise InputError(path, "SH degree above 3 is not supported by this format")
        return self


_FIELDS = ("means", "scales", "rotations", "opacities", "harmonics")


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.asarray(x, dtype=np.float64)))


def logit(p: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    p = np.clip(np.asarray(p, dtype=np.float64), eps, 1 - eps)
    return np.log(p / (1 - p))


def sh_parity_signs(signs: tuple[int, int, int], coefficients: int) -> np.ndarray:
    """``[K]`` factors that carry SH coefficients through the axis flip ``diag(signs)``."""
    sign_of = dict(zip("xyz", signs))
    return np.array(
        [math.prod(sign_of[a] for a in _SH_ODD_AXES[k]) for k in range(coefficients)],
        dtype=np.float64,
    )


def flip_axes(splats: SplatArrays, signs: tuple[int, int, int]) -> SplatArrays:
    """The scene seen through ``S = diag(signs)``: ``x -> S x``, ``R -> S R S``, SH reflected.

    With ``det S = +1`` this is a rotation by 180 degrees (e.g. ``(-1, -1, 1)``, OpenCV -> glTF);
    with ``det S = -1`` a mirror (e.g. ``(1, -1, 1)``, RDF -> RUF). The quaternion's vector part
    maps to ``det(S) S v`` in both cases.
    """
    s = np.asarray(signs, dtype=np.float64)
    det = float(np.prod(s))
    rotations = splats.rotations.astype(np.float64).copy()
    rotations[:, 1:] *= det * s
    harmonics = splats.harmonics * sh_parity_signs(signs, splats.harmonics.shape[-1])
    return SplatArrays(
        means=splats.means * s,
        scales=splats.scales,
        rotations=rotations,
        opacities=splats.opacities,
        harmonics=harmonics,
    )


def pack_smallest_three(quaternions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Normalised quaternions ``[N, 4]`` -> (index of the largest component ``[N]``, the other
    three ``[N, 3]`` in order, signed so that the largest one is positive, each in
    ``[-1/sqrt 2, 1/sqrt 2]``)."""
    q = quaternions / np.linalg.norm(quaternions, axis=1, keepdims=True)
    largest = np.argmax(np.abs(q), axis=1)
    rows = np.arange(q.shape[0])
    q = q * np.where(q[rows, largest] < 0, -1.0, 1.0)[:, None]
    keep = np.ones_like(q, dtype=bool)
    keep[rows, largest] = False
    return largest, q[keep].reshape(-1, 3)


def unpack_smallest_three(largest: np.ndarray, others: np.ndarray) -> np.ndarray:
    """Inverse of :func:`pack_smallest_three`: ``[N, 4]`` unit quaternions."""
    n = largest.shape[0]
    q = np.zeros((n, 4), dtype=np.float64)
    keep = np.ones((n, 4), dtype=bool)
    keep[np.arange(n), largest] = False
    q[keep] = others.reshape(-1)
    q[np.arange(n), largest] = np.sqrt(np.clip(1.0 - (others**2).sum(axis=1), 0.0, None))
    return q


def morton_order(points: np.ndarray, bits: int = 10) -> np.ndarray:
    """Indices sorting ``points [N, 3]`` along a Z-order curve of their bounding box."""
    if points.shape[0] == 0:
        return np.zeros(0, dtype=np.int64)
    low, high = points.min(axis=0), points.max(axis=0)
    extent = np.where(high > low, high - low, 1.0)
    cells = np.clip(((points - low) / extent * (2**bits - 1)).round(), 0, 2**bits - 1)
    cells = cells.astype(np.uint64)
    code = np.zeros(points.shape[0], dtype=np.uint64)
    for bit in range(bits):
        for axis in range(3):
            code |= ((cells[:, axis] >> np.uint64(bit)) & np.uint64(1)) << np.uint64(3 * bit + axis)
    return np.argsort(code, kind="stable")


def kd_chunk_order(
    points: np.ndarray, chunk: int, levels: tuple[int, int, int] = (2047, 1023, 2047)
) -> np.ndarray:
    """Indices grouping ``points [N, 3]`` into runs of ``chunk`` (the last one shorter) with small
    bounding boxes: a k-d split, each box cut at a multiple of ``chunk`` near its median across
    the axis whose quantisation step ``extent / levels`` is largest (so that per-chunk bounds
    quantise finely). The cuts go by each point's rank along the axis (ties broken by index) and
    each chunk lists its points by index, so the result is the same on every CPU."""
    n = points.shape[0]
    ranks = np.empty((n, 3), dtype=np.int64)  # [N, 3] rank along each axis, no ties
    for axis in range(3):
        ranks[np.argsort(points[:, axis], kind="stable"), axis] = np.arange(n)
    order = np.arange(n)
    steps = np.asarray(levels, dtype=np.float64)
    pending = [(0, n)]
    while pending:
        start, stop = pending.pop()
        if stop - start <= chunk:
            continue
        box = points[order[start:stop]]  # [n, 3]
        axis = int(np.argmax((box.max(axis=0) - box.min(axis=0)) / steps))
        middle = -(-(stop - start) // (2 * chunk)) * chunk
        lower = np.argpartition(ranks[order[start:stop], axis], middle - 1)
        order[start:stop] = order[start:stop][lower]
        pending += [(start, start + middle), (start + middle, stop)]
    full = n // chunk * chunk
    order[:full] = np.sort(order[:full].reshape(-1, chunk), axis=1).reshape(-1)
    order[full:] = np.sort(order[full:])
    return order


def kmeans_1d(values: np.ndarray, k: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """A ``k``-entry sorted codebook for ``values`` and each value's nearest entry (uint8 for
    ``k <= 256``): the distinct values when there are at most ``k``; else the means of ``k``
    groups cut at equal steps of ``(rank / N + (x - min) / (max - min)) / 2``, a blend of
    quantiles (entries where values are dense) and a uniform grid (so that no gap between entries
    exceeds ``2 (max - min) / k`` and sparse tails keep their entries, as splat-transform's
    blended histogram does)."""
    flat = np.asarray(values, dtype=np.float64).reshape(-1)
    dtype = np.uint8 if k <= 256 else np.uint16
    if flat.size == 0:
        return np.zeros(k, dtype=np.float32), np.zeros(np.shape(values), dtype=dtype)
    ordered = np.sort(flat)
    low, high = ordered[0], ordered[-1]
    if np.unique(ordered).size <= k:
        centres = np.unique(ordered)
    else:
        blend = 0.5 * np.arange(ordered.size) / ordered.size + 0.5 * (ordered - low) / (high - low)
        group = np.minimum((blend * k).astype(np.int64), k - 1)
        counts = np.bincount(group, minlength=k)
        sums = np.bincount(group, weights=ordered, minlength=k)
        centres = np.unique(sums[counts > 0] / counts[counts > 0])
    codebook = np.full(k, centres[-1])
    codebook[: centres.size] = centres
    edges = (centres[1:] + centres[:-1]) / 2
    labels = np.searchsorted(edges, flat).astype(dtype)
    return codebook.astype(np.float32), labels.reshape(np.shape(values))


def atomic_write_bytes(path: str | os.PathLike, data: bytes | list[bytes]) -> None:
    """Write ``data`` to ``path`` through a temporary file beside it (never half-written)."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=".splat-", suffix=".part", dir=folder)
    try:
        with os.fdopen(handle, "wb") as stream:
            for part in [data] if isinstance(data, (bytes, bytearray, memoryview)) else data:
                stream.write(part)
        os.chmod(temporary, 0o666 & ~_umask())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def read_bytes(path: str | os.PathLike) -> bytes:
    """The file's bytes, or :class:`InputError` when it cannot be read."""
    try:
        with open(path, "rb") as stream:
            return stream.read()
    except FileNotFoundError as error:
        raise InputError(path, "no such file") from error
    except IsADirectoryError as error:
        raise InputError(path, "is a folder, not a file") from error
    except OSError as error:
        raise InputError(path, f"cannot be read ({error.strerror})") from error
