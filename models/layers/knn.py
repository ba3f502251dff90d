"""Exact k-nearest neighbours of 3D points, on any device, in bounded memory.

ReSplat's release uses Pointcept's CUDA ``pointops.knn_query``; this is the project's replacement:

- ``"cdist"``: ``torch.cdist`` between a block of queries and all points of the scene, then
  ``topk``; blocks are sized so that one block's distance matrix holds at most ``max_elements``
  floats. Distances are computed as differences (not the ``|a|^2 + |b|^2 - 2ab`` expansion), so
  the neighbour sets are exact in float32. Any device; the one method that takes a ``mask``.
- ``"kdtree"``: scipy's ``cKDTree`` (float64, exact), CPU tensors only.
- ``"auto"``: the faster one for the device, as measured by ``bench/knn.py`` (the KD-tree on CPU
  when scipy is importable, ``cdist`` elsewhere).

Neighbours include the point itself (distance 0) and come sorted by distance. The project's
point transformer (``models.layers.point_transformer``) and both ports search with it.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["KNN_METHODS", "knn", "knn_memory_bytes", "max_points_for"]

KNN_METHODS = ("auto", "cdist", "kdtree")
MAX_ELEMENTS = 1 << 24  # distance-matrix entries per block (64 MiB of float32)


def _scipy_available() -> bool:
    try:
        import scipy.spatial  # noqa: F401
    except ImportError:
        return False
    return True


def knn_memory_bytes(points: int, k: int, max_elements: int = MAX_ELEMENTS) -> int:
    """Peak bytes of one ``"cdist"`` call on a scene of ``points`` points (the block's distances
    plus its top-k, and the int64 result)."""
    block = max(1, min(points, max_elements // max(points, 1)))
    return 4 * block * points + 12 * block * k + 8 * points * k


def _knn_cdist(
    points: Tensor, queries: Tensor, k: int, max_elements: int, valid: Tensor | None
) -> Tensor:
    n = points.shape[0]
    block = max(1, min(queries.shape[0], max_elements // max(n, 1)))
    out = []
    for start in range(0, queries.shape[0], block):
        q = queries[start : start + block]
        dist = torch.cdist(q[None], points[None], compute_mode="donot_use_mm_for_euclid_dist")[0]
        if valid is not None:
            dist = dist.masked_fill(~valid[None, :], float("inf"))  # [block, N]
        out.append(dist.topk(k, dim=1, largest=False, sorted=True).indices)
    return torch.cat(out, dim=0)


def _knn_kdtree(points: Tensor, queries: Tensor, k: int) -> Tensor:
    from scipy.spatial import cKDTree

    tree = cKDTree(points.detach().double().numpy())
    _, idx = tree.query(queries.detach().double().numpy(), k=k)
    idx = idx.reshape(queries.shape[0], k)
    return torch.from_numpy(idx).to(torch.long)


def knn(
    points: Tensor,
    k: int,
    queries: Tensor | None = None,
    *,
    mask: Tensor | None = None,
    method: str = "auto",
    max_elements: int = MAX_ELEMENTS,
) -> Tensor:
    """Indices of the ``k`` nearest ``points`` of every query, per scene.

    Args:
        points: ``[B, N, 3]`` (or ``[N, 3]``).
        k: neighbours per query (at most ``N``).
        queries: ``[B, M, 3]`` (``None``: the points themselves).
        mask: ``[B, N]`` bool, the valid points; invalid ones are returned only when a scene has
            fewer than ``k`` valid points (``"cdist"`` only; ``"auto"`` picks it).
        method: ``"auto"``, ``"cdist"`` or ``"kdtree"`` (see the module docstring).
        max_elements: ``"cdist"``: distance entries per block, the memory bound.

    Returns:
        ``[B, M, k]`` int64 indices into each scene's points, nearest first.

    Raises:
        ValueError: for a bad shape, ``k`` out of range or an unknown method.
    """
    if method not in KNN_METHODS:
        raise ValueError(f"knn method must be one of {KNN_METHODS}, got {method!r}")
    squeeze = points.ndim == 2
    if squeeze:
        points = points[None]
        queries = None if queries is None else queries[None]
        mask = None if mask is None else mask[None]
    if points.ndim != 3 or points.shape[-1] != 3:
        raise ValueError(f"knn points must be [B, N, 3], got {tuple(points.shape)}")
    queries = points if queries is None else queries
    if queries.shape[0] != points.shape[0] or queries.shape[-1] != 3:
        raise ValueError(
            f"knn queries must be [B, M, 3] matching points {tuple(points.shape)}, "
            f"got {tuple(queries.shape)}"
        )
    if not 1 <= k <= points.shape[1]:
        raise ValueError(f"knn k={k} must be in [1, {points.shape[1]}] (the point count)")
    if mask is not None and tuple(mask.shape) != tuple(points.shape[:2]):
        raise ValueError(
            f"knn mask must be [B, N] {tuple(points.shape[:2])}, got {tuple(mask.shape)}"
        )
    if method == "auto":
        kdtree = points.device.type == "cpu" and mask is None and _scipy_available()
        method = "kdtree" if kdtree else "cdist"
    if method == "kdtree" and points.device.type != "cpu":
        raise ValueError(f"knn method 'kdtree' needs CPU tensors, got {points.device}")
    if method == "kdtree" and mask is not None:
        raise ValueError("knn method 'kdtree' takes no mask; use 'cdist'")
    result = []
    with torch.no_grad():
        for i, (p, q) in enumerate(zip(points, queries)):
            if method == "kdtree":
                result.append(_knn_kdtree(p, q, k))
            else:
                valid = None if mask is None else mask[i]
                result.append(_knn_cdist(p, q, k, max_elements, valid))
    out = torch.stack(result).to(points.device)
    return out[0] if squeeze else out


def max_points_for(k: int, budget_bytes: int, max_elements: int = MAX_ELEMENTS) -> int:
    """Largest scene (points) whose ``"cdist"`` kNN fits ``budget_bytes``."""
    lo, hi = k, 1 << 34
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if knn_memory_bytes(mid, k, max_elements) <= budget_bytes:
            lo = mid
        else:
            hi = mid - 1
    return lo
