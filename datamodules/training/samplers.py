"""View samplers: which frames of a scene become context and target views.

- ``bounded``: two outer context frames ``gap`` apart (``gap`` uniform in a [min, max] range that is
  warmed up linearly from an initial range over the first training steps), any extra context views
  strictly between them, and targets between the outer context views.
- ``evaluation``: fixed indices from an evaluation index JSON
  ``{key: {"context": [...], "target": [...]} | null}`` (null entries are skipped).
- ``all``: evenly spaced context views (all frames by default), every frame as a target.
- ``video``: context views from an index entry or evenly spaced; targets are the trajectory from the
  first to the last context view (every ``stride``-th frame), for rendering a video.

A sampler raises ``ValueError`` when a scene cannot be sampled (too few views); datasets skip such
scenes and count them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from datamodules.errors import InputError
from datamodules.readers.chunks import read_json

__all__ = [
    "StepTracker",
    "ViewIndices",
    "ViewSampler",
    "BoundedViewSampler",
    "EvaluationViewSampler",
    "AllViewSampler",
    "VideoViewSampler",
    "load_evaluation_index",
    "make_view_sampler",
]


class StepTracker:
    """The global training step in shared memory, readable from data-loader worker processes."""

    def __init__(self) -> None:
        self._step = torch.zeros(1, dtype=torch.int64).share_memory_()

    def set(self, step: int) -> None:
        """Record the current training step."""
        self._step.fill_(int(step))

    def get(self) -> int:
        """The last recorded training step."""
        return int(self._step.item())


@dataclass
class ViewIndices:
    """Frame indices of one example: ``context [Vc]`` and ``target [Vt]`` (int64)."""

    context: Tensor
    target: Tensor


class ViewSampler(ABC):
    """Chooses context and target frames of a scene."""

    #: scene keys the sampler is restricted to (in order), or None for any scene.
    keys: list[str] | None = None

    @abstractmethod
    def sample(
        self, key: str, num_views: int, generator: torch.Generator | None = None
    ) -> ViewIndices:
        """Frame indices for scene ``key`` with ``num_views`` frames.

        Raises:
            ValueError: the scene cannot be sampled (e.g. too few views).
        """


def _randint(low: int, high: int, generator: torch.Generator | None) -> int:
    """Uniform integer in ``[low, high]`` (inclusive)."""
    return int(torch.randint(low, high + 1, (1,), generator=generator).item())


def _choose(low: int, high: int, count: int, generator: torch.Generator | None) -> Tensor:
    """``count`` sorted frames in ``[low, high]``: distinct when possible, else with repeats."""
    span = high - low + 1
    if span >= count:
        picked = torch.randperm(span, generator=generator)[:count] + low
    else:
        picked = torch.randint(low, high + 1, (count,), generator=generator)
    return picked.sort().values


class BoundedViewSampler(ViewSampler):
    """Context views a bounded gap apart, targets between them.

    Args:
        num_context_views: context views per example (>= 1).
        num_target_views: target views per example (>= 1).
        min_gap: final minimum frame distance between the outer context views.
        max_gap: final maximum distance (respected, clamped to the scene length).
        initial_min_gap: minimum at step 0 (default ``min_gap``).
        initial_max_gap: maximum at step 0 (default ``max_gap``).
        warm_up_steps: steps over which the range moves linearly to ``[min_gap, max_gap]``.
        min_target_distance: targets keep at least this many frames from the outer context views
            (0 allows targets on the context frames).
        step_tracker: where the current training step is read (None: always the final range).
    """

    def __init__(
        self,
        num_context_views: int = 2,
        num_target_views: int = 4,
        min_gap: int = 8,
        max_gap: int = 20,
        initial_min_gap: int | None = None,
        initial_max_gap: int | None = None,
        warm_up_steps: int = 0,
        min_target_distance: int = 0,
        step_tracker: StepTracker | None = None,
    ) -> None:
        if num_context_views < 1 or num_target_views < 1:
            raise ValueError("num_context_views and num_target_views must be >= 1")
        if min_gap < 0 or max_gap < min_gap:
            raise ValueError(f"need 0 <= min_gap <= max_gap, got {min_gap}, {max_gap}")
        self.num_context_views = num_context_views
        self.num_target_views = num_target_views
        self.min_gap, self.max_gap = int(min_gap), int(max_gap)
        self.initial_min_gap = int(min_gap if initial_min_gap is None else initial_min_gap)
        self.initial_max_gap = int(max_gap if initial_max_gap is None else initial_max_gap)
        if self.initial_max_gap < self.initial_min_gap:
            raise ValueError("initial_max_gap must be >= initial_min_gap")
        self.warm_up_steps = int(warm_up_steps)
        self.min_target_distance = int(min_target_distance)
        self.step_tracker = step_tracker

    def gap_range(self, step: int | None = None) -> tuple[int, int]:
        """The ``[min, max]`` context gap at a training step (default: the tracker's step)."""
        if step is None:
            step = self.step_tracker.get() if self.step_tracker is not None else self.warm_up_steps
        fraction = 1.0 if self.warm_up_steps <= 0 else min(max(step, 0) / self.warm_up_steps, 1.0)
        low = round(self.initial_min_gap + (self.min_gap - self.initial_min_gap) * fraction)
        high = round(self.initial_max_gap + (self.max_gap - self.initial_max_gap) * fraction)
        return low, max(low, high)

    def sample(
        self, key: str, num_views: int, generator: torch.Generator | None = None
    ) -> ViewIndices:
        low, high = self.gap_range()
        if self.num_context_views == 1:
            low = 0
        needed = max(low, self.num_context_views - 1, 2 * self.min_target_distance)
        if num_views - 1 < needed:
            raise ValueError(f"scene {key!r} has {num_views} views, needs at least {needed + 1}")
        gap = _randint(needed, max(needed, min(high, num_views - 1)), generator)
        if self.num_context_views == 1:
            center = _randint(0, num_views - 1, generator)
            context = torch.tensor([center])
            first = max(0, center - gap)
            last = min(num_views - 1, center + gap)
        else:
            first = _randint(0, num_views - 1 - gap, generator)
            last = first + gap
            inner = _choose(first + 1, last - 1, self.num_context_views - 2, generator)
            context = torch.cat([torch.tensor([first]), inner, torch.tensor([last])])
        lo_t, hi_t = first + self.min_target_distance, last - self.min_target_distance
        target = _choose(lo_t, hi_t, self.num_target_views, generator)
        return ViewIndices(context.long(), target.long())


def load_evaluation_index(path: str | Path) -> dict[str, dict[str, list[int]] | None]:
    """Read an evaluation index JSON ``{key: {"context": [...], "target": [...]} | null}``.

    Raises:
        InputError: missing or malformed file.
    """
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: evaluation index not found")
    index = read_json(path, "evaluation index")
    if not isinstance(index, dict):
        raise InputError(f"{path}: evaluation index must be a JSON object keyed by scene")
    for key, entry in index.items():
        if entry is None:
            continue
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("context"), list)
            or not isinstance(entry.get("target"), list)
            or not all(isinstance(i, int) for i in entry["context"] + entry["target"])
        ):
            raise InputError(f"{path}: entry {key!r} needs integer lists 'context' and 'target'")
    return index


class EvaluationViewSampler(ViewSampler):
    """Fixed context/target indices from an evaluation index JSON.

    Args:
        index_path: the JSON file (e.g. ``evaluation_index_re10k.json``).
        num_context_views: if given, every entry must have this many context views.
        max_scenes: keep only the first ``max_scenes`` usable entries (file order).
    """

    def __init__(
        self,
        index_path: str | Path,
        num_context_views: int | None = None,
        max_scenes: int | None = None,
    ) -> None:
        self.path = Path(index_path)
        index = load_evaluation_index(self.path)
        self.entries = {k: v for k, v in index.items() if v is not None}
        self.num_null = len(index) - len(self.entries)
        if num_context_views is not None:
            counts = {len(v["context"]) for v in self.entries.values()}
            if counts and counts != {num_context_views}:
                raise InputError(
                    f"{self.path}: entries have {sorted(counts)} context views, "
                    f"configured {num_context_views}"
                )
        keys = list(self.entries)
        if max_scenes is not None:
            keys = keys[:max_scenes]
            self.entries = {k: self.entries[k] for k in keys}
        self.keys = keys

    def __len__(self) -> int:
        return len(self.entries)

    def sample(
        self, key: str, num_views: int, generator: torch.Generator | None = None
    ) -> ViewIndices:
        entry = self.entries.get(key)
        if entry is None:
            raise ValueError(f"scene {key!r} is not in {self.path}")
        indices = entry["context"] + entry["target"]
        if max(indices) >= num_views or min(indices) < 0:
            raise ValueError(
                f"scene {key!r}: {self.path} asks for frame {max(indices)} of {num_views}"
            )
        return ViewIndices(torch.tensor(entry["context"]), torch.tensor(entry["target"]))


def _spread(first: int, last: int, count: int) -> Tensor:
    """``count`` evenly spaced frames from ``first`` to ``last`` (both included)."""
    return torch.linspace(first, last, count).round().long()


class AllViewSampler(ViewSampler):
    """Every frame as a target; context views evenly spaced (all frames when not set)."""

    def __init__(self, num_context_views: int | None = None) -> None:
        self.num_context_views = num_context_views

    def sample(
        self, key: str, num_views: int, generator: torch.Generator | None = None
    ) -> ViewIndices:
        count = self.num_context_views or num_views
        if num_views < count:
            raise ValueError(f"scene {key!r} has {num_views} views, needs {count}")
        return ViewIndices(_spread(0, num_views - 1, count), torch.arange(num_views))


class VideoViewSampler(ViewSampler):
    """A trajectory for rendering: targets run from the first to the last context view.

    Args:
        num_context_views: evenly spaced context views (used when no index entry exists).
        index_path: optional evaluation index supplying the context views per scene.
        stride: every ``stride``-th frame is a target (the last context frame is always included).
        num_target_views: if set, that many evenly spaced targets instead of ``stride``.
    """

    def __init__(
        self,
        num_context_views: int = 2,
        index_path: str | Path | None = None,
        stride: int = 1,
        num_target_views: int | None = None,
    ) -> None:
        self.num_context_views = num_context_views
        self.index = EvaluationViewSampler(index_path) if index_path is not None else None
        self.keys = self.index.keys if self.index is not None else None
        self.stride = max(1, int(stride))
        self.num_target_views = num_target_views

    def sample(
        self, key: str, num_views: int, generator: torch.Generator | None = None
    ) -> ViewIndices:
        if self.index is not None:
            context = self.index.sample(key, num_views).context
        else:
            if num_views < self.num_context_views:
                raise ValueError(
                    f"scene {key!r} has {num_views} views, needs {self.num_context_views}"
                )
            context = _spread(0, num_views - 1, self.num_context_views)
        first, last = int(context.min()), int(context.max())
        if self.num_target_views is not None:
            target = _spread(first, last, self.num_target_views)
        else:
            target = torch.arange(first, last + 1, self.stride)
            if int(target[-1]) != last:
                target = torch.cat([target, torch.tensor([last])])
        return ViewIndices(context.long(), target.long())


def make_view_sampler(name: str, **kwargs) -> ViewSampler:
    """Build a sampler by name: ``bounded``, ``evaluation``, ``all`` or ``video``."""
    samplers = {
        "bounded": BoundedViewSampler,
        "evaluation": EvaluationViewSampler,
        "all": AllViewSampler,
        "video": VideoViewSampler,
    }
    if name not in samplers:
        raise ValueError(f"unknown view sampler {name!r} (choose from {', '.join(samplers)})")
    return samplers[name](**kwargs)
