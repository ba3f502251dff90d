"""Batched, deterministic k-means that selects real tokens (ZipSplat's token clustering).

``kmeans_select(tokens [B, N, C], k)`` runs Lloyd's algorithm under ``no_grad`` with a
uniform-stride initialisation and returns, per scene, the indices of ``k`` *distinct* real tokens:
each centroid is replaced by the nearest token among those assigned to it (so two centroids can
never pick the same token), and a centroid whose cluster is empty takes the nearest token not yet
taken. Distances are computed in chunks of tokens, so memory is ``O(chunk * k)`` rather than
``O(N * k)``. Nothing is random: the same input always gives the same indices.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["cluster_count", "kmeans_nearest_tokens", "kmeans_select", "nearest_centroid"]


def cluster_count(num_tokens: int, ratio: float) -> int:
    """Number of clusters ``K = round(ratio * num_tokens)``, clamped to ``[1, num_tokens]``.

    Raises:
        ValueError: when ``ratio`` is not in ``(0, 1]``.
    """
    if not 0.0 < ratio <= 1.0:
        raise ValueError(f"compression ratio must be in (0, 1], got {ratio}")
    return max(1, min(num_tokens, int(round(ratio * num_tokens))))


def _squared_distances(points: Tensor, centroids: Tensor) -> Tensor:
    """``[B, P, K]`` squared Euclidean distances of ``points [B, P, C]`` to ``centroids [B, K, C]``."""
    d = (
        points.pow(2).sum(-1, keepdim=True)
        - 2.0 * points @ centroids.transpose(1, 2)
        + centroids.pow(2).sum(-1)[:, None, :]
    )
    return d.clamp_min(0.0)


def nearest_centroid(
    tokens: Tensor, centroids: Tensor, chunk_size: int = 4096
) -> tuple[Tensor, Tensor]:
    """Assign every token to its nearest centroid, ``chunk_size`` tokens at a time.

    Args:
        tokens: ``[B, N, C]``.
        centroids: ``[B, K, C]``.
        chunk_size: tokens per distance block.

    Returns:
        The assignment ``[B, N]`` (int64; ties go to the lowest centroid index) and the squared
        distance to the assigned centroid ``[B, N]``.
    """
    assignments, distances = [], []
    for start in range(0, tokens.shape[1], chunk_size):
        d = _squared_distances(tokens[:, start : start + chunk_size], centroids)  # [B, P, K]
        value, index = d.min(dim=-1)
        assignments.append(index)
        distances.append(value)
    return torch.cat(assignments, dim=1), torch.cat(distances, dim=1)


def _fill_empty(tokens: Tensor, centroids: Tensor, selected: Tensor, chunk_size: int) -> Tensor:
    """Give every centroid with ``selected == -1`` the nearest token not selected yet.

    Args:
        tokens: ``[N, C]`` of one scene.
        centroids: ``[K, C]``.
        selected: ``[K]`` token index per centroid, ``-1`` where none was chosen.
        chunk_size: centroids per distance block.

    Returns:
        ``[K]`` distinct token indices.
    """
    selected = selected.clone()
    used = torch.zeros(tokens.shape[0], dtype=torch.bool, device=tokens.device)
    used[selected[selected >= 0]] = True
    # Rounds: every pending centroid proposes its nearest unused token; of centroids proposing the
    # same token the lowest index wins; the others try again. At least one centroid is placed per
    # round, usually all of them.
    while bool((selected < 0).any()):
        pending = torch.nonzero(selected < 0).squeeze(1)  # [E]
        proposals = []
        for start in range(0, pending.numel(), chunk_size):
            block = centroids[pending[start : start + chunk_size]]  # [e, C]
            d = _squared_distances(tokens[None], block[None])[0]  # [N, e]
            d = d.masked_fill(used[:, None], float("inf"))
            proposals.append(d.argmin(dim=0))
        proposal = torch.cat(proposals)  # [E]
        winner = torch.full((tokens.shape[0],), pending.numel(), device=tokens.device)
        order = torch.arange(pending.numel(), device=tokens.device)
        winner = winner.scatter_reduce(0, proposal, order, reduce="amin")
        won = winner[proposal] == order
        selected[pending[won]] = proposal[won]
        used[proposal[won]] = True
    return selected


@torch.no_grad()
def kmeans_select(
    tokens: Tensor,
    k: int,
    iterations: int = 5,
    chunk_size: int = 4096,
    return_assignment: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """Cluster tokens and return the indices of ``k`` distinct representative tokens per scene.

    Args:
        tokens: ``[B, N, C]`` features (all views of a scene together).
        k: clusters per scene, ``1 <= k <= N``; ``k == N`` returns every token.
        iterations: Lloyd iterations after the uniform-stride initialisation.
        chunk_size: tokens per distance block (memory ``B * chunk_size * k``).
        return_assignment: also return each token's cluster.

    Returns:
        ``[B, k]`` int64 token indices, distinct within a scene, sorted ascending; with
        ``return_assignment`` also ``[B, N]`` int64: the position (in the returned index list) of
        each token's cluster. A cluster that was empty and took an unused token has no members
        (its token belongs to the cluster it was assigned to).
    """
    b, n, _ = tokens.shape
    if not 1 <= k <= n:
        raise ValueError(f"k must be in [1, {n}], got {k}")
    device = tokens.device
    if k == n:
        index = torch.arange(n, device=device).expand(b, n).clone()
        return (index, index.clone()) if return_assignment else index
    points = tokens.detach().float()  # [B, N, C]
    # Uniform-stride initialisation: tokens 0, N/k, 2N/k, ... (view-major, raster order).
    init = torch.div(torch.arange(k, device=device) * n, k, rounding_mode="floor")  # [k]
    centroids = points[:, init].clone()  # [B, k, C]
    for _ in range(iterations):
        assign, _ = nearest_centroid(points, centroids, chunk_size)  # [B, N]
        sums = torch.zeros_like(centroids).scatter_add_(
            1, assign[..., None].expand_as(points), points
        )
        counts = torch.zeros(b, k, device=device).scatter_add_(
            1, assign, torch.ones_like(assign, dtype=torch.float32)
        )
        # An empty cluster keeps its previous centroid.
        centroids = torch.where(
            counts[..., None] > 0, sums / counts.clamp_min(1.0)[..., None], centroids
        )
    assign, distance = nearest_centroid(points, centroids, chunk_size)  # [B, N]

    # Snap each centroid to its nearest member token (ties: lowest token index).
    inf = torch.full((b, k), float("inf"), device=device)
    best = inf.scatter_reduce(1, assign, distance, reduce="amin")  # [B, k]
    is_best = distance == best.gather(1, assign)  # [B, N]
    token_index = torch.arange(n, device=device).expand(b, n)
    candidate = torch.where(is_best, token_index, torch.full_like(token_index, n))
    selected = torch.full((b, k), n, device=device, dtype=torch.long)
    selected = selected.scatter_reduce(1, assign, candidate, reduce="amin")  # [B, k]
    selected = torch.where(selected < n, selected, torch.full_like(selected, -1))
    for i in range(b):
        if bool((selected[i] < 0).any()):
            selected[i] = _fill_empty(points[i], centroids[i], selected[i], chunk_size)
    selected, order = selected.sort(dim=1)
    if not return_assignment:
        return selected
    position = torch.empty_like(order).scatter_(
        1, order, torch.arange(k, device=device).expand(b, k)
    )
    return selected, position.gather(1, assign)


@torch.no_grad()
def kmeans_nearest_tokens(
    tokens: Tensor, k: int, iterations: int = 5, chunk_size: int = 2048
) -> tuple[Tensor, Tensor, Tensor]:
    """k-means as ZipSplat's release runs it (for ports of its weights; ``kmeans_select`` is ours).

    Differences from ``kmeans_select``: the initial centroids are the tokens
    ``round(linspace(0, N - 1, k))``; a cluster that goes empty gets the zero vector as its
    centroid; each final centroid takes the index of its nearest token (two centroids may pick
    the same token); Euclidean distances come from ``torch.cdist``. Deterministic.

    Args:
        tokens: ``[B, N, C]``.
        k: clusters, ``1 <= k <= N``.
        iterations: Lloyd iterations.
        chunk_size: rows per distance block.

    Returns:
        Centroids ``[B, k, C]``, the nearest token of each ``[B, k]`` (int64) and the last
        assignment of every token ``[B, N]`` (int64).
    """
    b, n, c = tokens.shape
    if not 1 <= k <= n:
        raise ValueError(f"k must be in [1, {n}], got {k}")
    device = tokens.device
    start = torch.linspace(0, n - 1, k, device=device).round().long()  # [k]
    centroids = tokens[:, start]  # [B, k, C]
    assign = torch.zeros(b, n, dtype=torch.long, device=device)
    for _ in range(iterations):
        assign = torch.cat(
            [
                torch.cdist(tokens[:, s : s + chunk_size], centroids).argmin(dim=-1)
                for s in range(0, n, chunk_size)
            ],
            dim=1,
        )  # [B, N]
        sums = torch.zeros_like(centroids).scatter_add_(
            1, assign[..., None].expand(-1, -1, c), tokens
        )
        counts = torch.zeros(b, k, 1, device=device, dtype=tokens.dtype).scatter_add_(
            1, assign[..., None], torch.ones(b, n, 1, device=device, dtype=tokens.dtype)
        )
        centroids = sums / counts.clamp(min=1)
    nearest = torch.cat(
        [
            torch.cdist(centroids[:, s : s + chunk_size], tokens).argmin(dim=-1)
            for s in range(0, k, chunk_size)
        ],
        dim=1,
    )  # [B, k]
    return centroids, nearest, assign
