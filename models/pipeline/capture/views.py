"""Which photos of a capture go together into one forward pass.

A :class:`ViewGraph` says how strongly each pair of photos overlaps:

- posed models, structure-from-motion points known (an SfM run, or the input's COLMAP model):
  **co-visibility**, the number of 3D points two photos both observe;
- posed models otherwise: **camera distance and viewing direction**,
  ``exp(-d / d0) * max(cos(angle), 0)`` with ``d0`` the median nearest-neighbour distance;
- pose-free models: **order** for a video (``1 / |i - j|``), else **image similarity** of small
  thumbnails (16 x 16, normalised cross-correlation turned into ``exp(-(1 - ncc) / m0)``).

:func:`select_views` picks ``N`` overlapping views around a centre (``views=N``):
starting from the centre, it adds the photo with the largest summed overlap with those picked
(the centre's counted twice, so that the views gather around it).
:func:`cover_windows` covers the whole capture with overlapping windows of a model's view count
(``views=all``): the first window is ``select_views`` around the centre; each next window starts
at the uncovered photo that overlaps most with a covered one, takes that covered photo (the
overlap that later ties the windows together) and fills up with photos of the largest summed
overlap, uncovered ones counted double. Every photo lands in a window; each window after the
first shares at least one photo with an earlier one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from datamodules.errors import InputError
from datamodules.readers.colmap import find_model_dir, read_model
from datamodules.readers.image_folder import VIDEO_EXTENSIONS
from models.weights.registry import get_pretrained_cfg

__all__ = [
    "MIN_SHARED_POINTS",
    "ViewGraph",
    "center_index",
    "components",
    "cover_windows",
    "covisibility",
    "image_affinity",
    "max_rotation_deg",
    "nearest_photos",
    "order_affinity",
    "pose_affinity",
    "select_views",
    "view_angle_note",
    "view_graph",
]

# Two photos sharing fewer SfM points than this are not connected (COLMAP's own two-view
# geometry needs 15 inlier matches).
MIN_SHARED_POINTS = 15


class ViewError(InputError):
    """A view setting that does not fit the capture (one line naming the setting)."""


@dataclass
class ViewGraph:
    """Pairwise overlap of a capture's photos.

    Attributes:
        names: photo names, in capture order.
        affinity: ``[V, V]`` symmetric, non-negative, zero diagonal; larger = more overlap.
        kind: what the overlap measures (for messages and ``summary.json``).
        connected: ``[V, V]`` bool, pairs that count as connected (co-visibility: at least
            :data:`MIN_SHARED_POINTS` shared points; the other measures: every pair).
    """

    names: list[str]
    affinity: np.ndarray
    kind: str
    connected: np.ndarray

    def __len__(self) -> int:
        return len(self.names)


def _kernel(distance: np.ndarray) -> np.ndarray:
    """``exp(-d / d0)`` with ``d0`` the median nearest-neighbour distance (diagonal 0)."""
    d = distance.astype(np.float64).copy()
    np.fill_diagonal(d, np.inf)
    nearest = d.min(axis=1)
    scale = float(np.median(nearest[np.isfinite(nearest)])) if np.isfinite(nearest).any() else 1.0
    scale = scale if scale > 1e-12 else 1.0
    out = np.exp(-d / scale)
    np.fill_diagonal(out, 0.0)
    return out


def covisibility(model_dir: str | Path, names: Sequence[str]) -> np.ndarray | None:
    """``[V, V]`` number of COLMAP 3D points each pair of ``names`` both observes (from the
    images' observations in ``model_dir``), or ``None`` when the model has no observations or
    misses a photo."""
    from scipy import sparse

    _, images, _ = read_model(model_dir, points=False)
    by_name = {}
    for image in images.values():
        by_name[image.name] = image
        by_name.setdefault(Path(image.name).name, image)
    rows, cols = [], []
    for row, name in enumerate(names):
        image = by_name.get(name) or by_name.get(Path(name).name)
        if image is None:
            return None
        ids = np.unique(image.point3d_ids[image.point3d_ids >= 0])
        rows.append(np.full(len(ids), row))
        cols.append(ids)
    if not sum(len(c) for c in cols):
        return None
    row_ids, col_ids = np.concatenate(rows), np.concatenate(cols)
    _, col_index = np.unique(col_ids, return_inverse=True)
    seen = sparse.csr_matrix(
        (np.ones(len(row_ids), dtype=np.float64), (row_ids, col_index)),
        shape=(len(names), int(col_index.max()) + 1),
    )
    shared = (seen @ seen.T).toarray()  # [V, V]
    np.fill_diagonal(shared, 0.0)
    return shared


def pose_affinity(extrinsics: Tensor) -> np.ndarray:
    """Overlap from cameras alone: ``exp(-d / d0) * max(cos(angle between optical axes), 0)``;
    ``extrinsics`` ``[V, 4, 4]`` camera-to-world."""
    e = extrinsics.double().cpu()
    centers = e[:, :3, 3]
    axes = e[:, :3, 2]  # +z forward
    distance = torch.cdist(centers, centers).numpy()
    cosine = (axes @ axes.T).clamp(min=0).numpy()
    return _kernel(distance) * cosine


def order_affinity(count: int) -> np.ndarray:
    """Video frames: ``1 / |i - j|`` (neighbouring frames overlap most)."""
    index = np.arange(count)
    gap = np.abs(index[:, None] - index[None, :]).astype(np.float64)
    with np.errstate(divide="ignore"):
        out = np.where(gap > 0, 1.0 / np.maximum(gap, 1), 0.0)
    return out


def image_affinity(images: Tensor, side: int = 16) -> np.ndarray:
    """Similarity of ``side x side`` thumbnails of ``images`` ``[V, 3, H, W]``: normalised
    cross-correlation ``ncc`` mapped to ``exp(-(1 - ncc) / m0)``."""
    small = torch.nn.functional.interpolate(images.float(), size=(side, side), mode="area")
    flat = small.flatten(1)
    flat = flat - flat.mean(dim=1, keepdim=True)
    flat = flat / flat.norm(dim=1, keepdim=True).clamp_min(1e-8)
    ncc = (flat @ flat.T).double().numpy()
    return _kernel(np.clip(1.0 - ncc, 0.0, 2.0))


def _model_dir(images: Any) -> Path | None:
    """The COLMAP model behind an image set's poses (an SfM run or the input's own)."""
    sfm = getattr(images, "sfm", None)
    if sfm is not None:
        return Path(sfm.model_dir)
    if getattr(images, "pose_source", None) == "colmap":
        return find_model_dir(images.source)
    return None


def view_graph(images: Any, pose_free: bool) -> ViewGraph:
    """The overlap graph of an ``ImageSet`` for a posed or a pose-free model (module doc)."""
    names = list(images.names)
    count = len(names)
    every = np.ones((count, count), dtype=bool)
    np.fill_diagonal(every, False)
    if pose_free:
        source = Path(images.source)
        if source.is_file() and source.suffix.lower() in VIDEO_EXTENSIONS:
            return ViewGraph(names, order_affinity(count), "video order", every)
        return ViewGraph(names, image_affinity(images.images), "image similarity", every)
    model_dir = _model_dir(images)
    if model_dir is not None:
        shared = covisibility(model_dir, names)
        if shared is not None:
            kind = "structure-from-motion co-visibility (shared 3D points)"
            return ViewGraph(names, shared, kind, shared >= MIN_SHARED_POINTS)
    if images.extrinsics is None:
        return ViewGraph(names, image_affinity(images.images), "image similarity", every)
    return ViewGraph(
        names, pose_affinity(images.extrinsics), "camera distance and viewing direction", every
    )


def components(graph: ViewGraph, allowed: Sequence[int] | None = None) -> list[list[int]]:
    """Connected components of ``graph`` over ``allowed`` views, largest first."""
    allowed = list(range(len(graph))) if allowed is None else list(allowed)
    left, out = set(allowed), []
    while left:
        start = min(left)
        stack, part = [start], {start}
        while stack:
            i = stack.pop()
            for j in np.nonzero(graph.connected[i])[0]:
                j = int(j)
                if j in left and j not in part:
                    part.add(j)
                    stack.append(j)
        left -= part
        out.append(sorted(part))
    return sorted(out, key=lambda c: (-len(c), c[0]))


def center_index(names: Sequence[str], center_view: str | None, allowed: Sequence[int]) -> int:
    """The view ``center_view`` names (file name or its stem), else the middle of ``allowed``.

    Raises:
        ViewError: the name is not a photo of the capture, or a held-out one.
    """
    allowed = list(allowed)
    if center_view in (None, ""):
        return allowed[len(allowed) // 2]
    wanted = str(center_view)
    matches = [i for i, n in enumerate(names) if wanted in (n, Path(n).stem)]
    if not matches:
        shown = ", ".join(list(names)[:4])
        raise ViewError(f"center_view={wanted}: not a photo of this capture (e.g. {shown})")
    if matches[0] not in allowed:
        raise ViewError(f"center_view={wanted}: that photo is held out or not connected")
    return matches[0]


def nearest_photos(graph: ViewGraph, photos: Sequence[int], among: Sequence[int]) -> list[int]:
    """Per photo of ``photos``, the photo of ``among`` it overlaps most (the largest affinity;
    ties: capture order): the nearest view when the photos have no poses."""
    among = [int(i) for i in among]
    return [among[int(np.argmax(graph.affinity[int(i), among]))] for i in photos]


def select_views(graph: ViewGraph, count: int, center: int, allowed: Sequence[int]) -> list[int]:
    """``count`` overlapping views around ``center``: greedily the view with the largest summed
    overlap with those already picked, the centre's counted twice (connected ones first);
    returned in capture order."""
    allowed = [int(i) for i in allowed]
    picked = [int(center)]
    while len(picked) < min(count, len(allowed)):
        rest = [i for i in allowed if i not in picked]
        # the centre's overlap counts twice: the views gather around it, not drift away
        scores = [
            (
                bool(graph.connected[i, picked].any()),
                float(graph.affinity[i, picked].sum() + graph.affinity[i, center]),
                -i,
            )
            for i in rest
        ]
        picked.append(-max(scores)[2])
    return sorted(picked)


def _best(graph: ViewGraph, window: list[int], candidates: list[int], bonus=None) -> int:
    """The candidate with the largest (bonus-weighted) summed overlap with ``window``,
    connected candidates first; ties: capture order."""
    a = graph.affinity
    scores = []
    for i in candidates:
        linked = bool(graph.connected[i, window].any())
        weight = bonus(i) if bonus is not None else 1.0
        scores.append((linked, float(a[i, window].sum()) * weight, -i))
    return -max(scores)[2]


def cover_windows(
    graph: ViewGraph, size: int, center: int, allowed: Sequence[int]
) -> list[list[int]]:
    """Overlapping windows of ``size`` views covering every ``allowed`` view (module doc)."""
    allowed = [int(i) for i in allowed]
    if len(allowed) <= size:
        return [sorted(allowed)]
    windows = [select_views(graph, size, center, allowed)]
    covered = set(windows[0])
    a = graph.affinity
    while len(covered) < len(allowed):
        uncovered = [i for i in allowed if i not in covered]
        done = sorted(covered)
        seed = _best(graph, done, uncovered, bonus=None) if size > 1 else uncovered[0]
        if size == 1:
            window = [seed]
        else:
            scores = [(bool(graph.connected[seed, j]), float(a[seed, j]), -j) for j in done]
            window = [seed, -max(scores)[2]]
        while len(window) < size:
            rest = [i for i in allowed if i not in window]
            window.append(_best(graph, window, rest, bonus=lambda i: 1.0 if i in covered else 2.0))
        windows.append(sorted(window))
        covered.update(window)
    return windows


def max_rotation_deg(extrinsics: Tensor) -> float:
    """Largest rotation (degrees) between any two of ``extrinsics`` ``[V, 4, 4]``."""
    r = extrinsics[:, :3, :3].double().cpu()
    if len(r) < 2:
        return 0.0
    trace = torch.einsum("aji,bji->ab", r, r)  # trace(R_a^T R_b)
    cosine = ((trace - 1) / 2).clamp(-1, 1)
    return float(torch.rad2deg(torch.arccos(cosine)).max())


def view_angle_note(angle: float, model: str, what: str = "the views") -> str | None:
    """A warning when ``angle`` exceeds the largest view rotation the release was trained with
    (``get_pretrained_cfg(model).recipe.max_view_angle``; none known: no warning)."""
    cfg = get_pretrained_cfg(model)
    recipe = getattr(cfg, "recipe", None) if cfg is not None else None
    limit = getattr(recipe, "max_view_angle", None)
    if limit is None or angle <= float(limit):
        return None
    return (
        f"{what} are {angle:.0f} degrees apart, more than the {float(limit):.0f} degrees between "
        f"the training views of {model}; expect a poorer fusion (more, closer photos help)"
    )
