"""Exact k-nearest neighbours of 3D points, on any device, in bounded memory.

ReSplat's release uses Pointcept's CUDA ``pointops.knn_query``; this is the project's replacement:

- ``"cdist"``: squared distances between a block of queries and all points of the scene, then
  ``topk``; blocks are sized so that one block's distance matrix holds at most ``max_elements``
  floats. Distances are computed as differences (not the ``|a|^2 + |b|^2 - 2ab`` expansion), one
  coordinate at a time with separately rounded operations, so they are the same bits on every
  CPU kernel set (AVX-512, AVX2, scalar) and the neighbour sets are exact in float32. Ties are
  broken by the lower index (``topk`` alone breaks them differently per kernel set: the shipped
  ReSplat's first kNN has exact ties on its regular grid of points). Any device; the one method
  that takes a ``mask``.
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
    and one coordinate's squares, plus its top-k, and the int64 result)."""
    block = max(1, min(points, max_elements // max(points, 1)))
    return 8 * block * points + 12 * block * k + 8 * points * k


def _squared_distances(queries: Tensor, points: Tensor) -> Tensor:
    """``[M, N]`` squared distances, summed x, y, z in that order with one rounding per operation
    (no fused multiply-add, no vectorised reduction): the same bits on every kernel set."""
    dist = queries[:, None, 0] - points[None, :, 0]  # [M, N]
    dist.mul_(dist)
    for axis in range(1, points.shape[-1]):
        term = queries[:, None, axis] - points[None, :, axis]
        dist.add_(term.mul_(term))
    return dist


def _nearest(dist: Tensor, k: int) -> Tensor:
    """``[M, k]`` indices of the ``k`` smallest entries of each row of ``dist [M, N]``, ordered by
    (distance, index): where the ``k``-th distance is tied, the lower indices win."""
    index = dist.topk(k, dim=1, largest=False, sorted=False).indices  # [M, k], any tie order
    index = index.sort(dim=1).values
    order = dist.gather(1, index).sort(dim=1, stable=True).indices
    index = index.gather(1, order)
    kth = dist.gather(1, index[:, -1:])  # [M, 1]
    tied = (dist <= kth).sum(dim=1) > k  # rows where topk had to choose among equals
    if tied.any():
        index[tied] = dist[tied].sort(dim=1, stable=True).indices[:, :k]
    return index


def _knn_cdist(
    points: Tensor, queries: Tensor, k: int, max_elements: int, valid: Tensor | None
) -> Tensor:
    n = points.shape[0]
    block = max(1, min(queries.shape[0], max_elements // max(n, 1)))
    out = []
    for start in range(0, queries.shape[0], block):
        dist = _squared_distances(queries[start : start + block], points)  # [block, N]
        if valid is not None:
            dist = dist.masked_fill_(~valid[None, :], float("inf"))
        out.append(_nearest(dist, k))
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
