"""Write an evaluation index JSON for a chunk dataset, like the released RE10K/ACID/DL3DV ones.

Usage::

    python -m datamodules.tools.make_index ROOT context=2 gap=MIN,MAX targets=3 seed=S \\
        [split=test] [out=ROOT/evaluation_index_test.json] [exclude_context=true]

For every scene in ``ROOT/{split}/index.json``: draw a frame gap ``g`` uniformly in
``[MIN, min(MAX, V - 1)]`` and a start ``s`` in ``[0, V - 1 - g]``; the context views are ``s`` and
``s + g`` (more context views are spread evenly in between, one view: just ``s``); the targets are
``targets`` distinct frames drawn from ``[s, s + g]`` (they may coincide with a context frame,
as in the released RE10K/ACID index, unless ``exclude_context=true``), sorted. Scenes that are too
short get ``null``. Draws are seeded per scene from ``(seed, key)``, so a scene's entry does not
depend on which other scenes are in the dataset.
"""

from __future__ import annotations

import json
import os
import random
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from datamodules.errors import InputError
from models.core.command_line import (
    MISSING,
    SettingError,
    parse_key_values,
    run_key_value_command,
    setting,
    stopped_cleanly,
)

__all__ = ["MakeIndexConfig", "scene_lengths", "sample_entry", "make_index", "main"]

PROGRAM = "datamodules.tools.make_index"
USAGE = (
    f"usage: python -m {PROGRAM} ROOT gap=MIN,MAX [context=2] [targets=3] [seed=0] "
    "[split=test] [out=FILE] [exclude_context=true]"
)


def scene_lengths(root: str | Path, split: str) -> dict[str, int]:
    """Number of views of every scene of ``root/split``, in index order.

    Raises:
        InputError: missing index or chunk, or a key the chunk does not hold.
    """
    directory = Path(root) / split
    index_path = directory / "index.json"
    if not index_path.is_file():
        raise InputError(f"{index_path}: not found (is {root} a chunk dataset?)")
    with open(index_path, encoding="utf-8") as handle:
        index: dict[str, str] = json.load(handle)
    lengths: dict[str, int] = {}
    by_chunk: dict[str, list[str]] = {}
    for key, chunk in index.items():
        by_chunk.setdefault(chunk, []).append(key)
    found: dict[str, int] = {}
    for chunk, keys in by_chunk.items():
        path = directory / chunk
        if not path.is_file():
            raise InputError(f"{path}: chunk listed in index.json is missing")
        wanted = set(keys)
        try:  # memory-map: only the timestamps are needed, not the images
            examples = torch.load(path, weights_only=True, mmap=True)
        except RuntimeError:  # legacy (non-zip) serialisation cannot be memory-mapped
            examples = torch.load(path, weights_only=True)
        for example in examples:
            if example["key"] in wanted:
                found[example["key"]] = int(example["timestamps"].shape[0])
        absent = wanted - found.keys()
        if absent:
            raise InputError(f"{path}: does not hold scene {sorted(absent)[0]!r} from index.json")
    for key in index:
        lengths[key] = found[key]
    return lengths


def sample_entry(
    num_views: int,
    context: int,
    gap: tuple[int, int],
    targets: int,
    rng: random.Random,
    exclude_context: bool = False,
) -> dict[str, list[int]] | None:
    """One index entry, or None when the scene is too short.

    Args:
        num_views: views in the scene.
        context: number of context views (>= 1).
        gap: ``(min, max)`` distance between the first and last context frame (the target window).
        targets: number of target views.
        rng: random generator.
        exclude_context: draw targets among non-context frames only.
    """
    # The window [s, s + g] must fit the context frames and enough target candidates.
    needed = max(context, targets + (context if exclude_context else 0))
    low = max(gap[0], needed - 1)
    high = min(gap[1], num_views - 1)
    if low > high:
        return None
    frame_gap = rng.randint(low, high)
    start = rng.randint(0, num_views - 1 - frame_gap)
    if context == 1:
        contexts = [start]
    else:
        contexts = [start + round(frame_gap * i / (context - 1)) for i in range(context)]
    window = range(start, start + frame_gap + 1)
    candidates = [i for i in window if not (exclude_context and i in contexts)]
    return {"context": contexts, "target": sorted(rng.sample(candidates, targets))}


def make_index(
    root: str | Path,
    context: int,
    gap: tuple[int, int],
    targets: int,
    seed: int,
    split: str = "test",
    exclude_context: bool = False,
) -> dict[str, dict[str, list[int]] | None]:
    """Evaluation index of every scene of ``root/split`` (see the module docstring)."""
    if context < 1 or targets < 1:
        raise InputError("context and targets must be at least 1")
    if gap[0] < 0 or gap[0] > gap[1]:
        raise InputError(f"gap needs 0 <= MIN <= MAX, got {gap[0]},{gap[1]}")
    index = {}
    for key, num_views in scene_lengths(root, split).items():
        rng = random.Random(f"{seed}:{key}")
        index[key] = sample_entry(num_views, context, gap, targets, rng, exclude_context)
    return index


@dataclass
class MakeIndexConfig:
    """``python -m datamodules.tools.make_index ROOT key=value ...``."""

    gap: list[int] = setting(MISSING, length=2, minimum=1)  # MIN,MAX frames between contexts
    context: int = setting(2, minimum=1)  # context views per scene
    targets: int = setting(3, minimum=1)  # target views per scene
    seed: int = 0
    split: str = "test"
    out: str | None = setting(None, path=True)  # default ROOT/evaluation_index_SPLIT.json
    exclude_context: bool = False  # targets never coincide with a context frame


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit status (2 on bad input)."""
    return run_key_value_command(None if argv is None else list(argv), __doc__, _make_index)


def _make_index(argv: list[str]) -> None:
    paths, args = parse_key_values(argv, MakeIndexConfig, PROGRAM)
    if len(paths) != 1:
        raise SettingError("arguments", f"expected one ROOT, got {len(paths)} paths: {USAGE}")
    root = paths[0]
    out = (
        Path(args["out"]) if args["out"] else Path(root) / f"evaluation_index_{args['split']}.json"
    )
    low, high = args["gap"]
    try:
        index = make_index(
            root,
            args["context"],
            (low, high),
            args["targets"],
            args["seed"],
            args["split"],
            args["exclude_context"],
        )
    except (ValueError, OSError, RuntimeError) as error:  # an InputError, or unreadable JSON/chunk
        raise InputError(" ".join(str(error).split())) from error
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    try:
        tmp.write_text(json.dumps(index), encoding="utf-8")
        os.replace(tmp, out)
    finally:  # a stop between the two leaves no temporary file
        tmp.unlink(missing_ok=True)
    kept = sum(entry is not None for entry in index.values())
    print(f"wrote {out}: {kept} of {len(index)} scenes indexed ({len(index) - kept} too short)")


if __name__ == "__main__":
    with stopped_cleanly(PROGRAM):
        sys.exit(main())
