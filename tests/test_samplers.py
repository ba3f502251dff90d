"""View samplers: bounded (with warm-up), evaluation (real index files), all, video."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

from datamodules import InputError
from datamodules.training.samplers import (
    AllViewSampler,
    BoundedViewSampler,
    EvaluationViewSampler,
    StepTracker,
    VideoViewSampler,
    make_view_sampler,
)


def draws(sampler, num_views: int, count: int = 300, seed: int = 0) -> list:
    generator = torch.Generator().manual_seed(seed)
    return [sampler.sample("scene", num_views, generator) for _ in range(count)]


def test_bounded_gap_and_targets() -> None:
    sampler = BoundedViewSampler(2, 4, min_gap=10, max_gap=30)
    gaps = set()
    for views in draws(sampler, num_views=200):
        first, last = views.context.tolist()
        gaps.add(last - first)
        assert 10 <= last - first <= 30  # the maximum is respected (MVSplat ignores it)
        assert (
            views.target.shape == (4,) and ((views.target >= first) & (views.target <= last)).all()
        )
        assert views.target.unique().numel() == 4  # distinct when the span allows
    assert min(gaps) == 10 and max(gaps) == 30


def test_bounded_more_context_views_and_target_distance() -> None:
    sampler = BoundedViewSampler(4, 2, min_gap=6, max_gap=12, min_target_distance=2)
    for views in draws(sampler, num_views=40):
        context = views.context
        assert context.shape == (4,) and (context.diff() > 0).all()
        assert 6 <= context[-1] - context[0] <= 12
        assert ((views.target >= context[0] + 2) & (views.target <= context[-1] - 2)).all()


def test_bounded_short_scene_and_single_context() -> None:
    sampler = BoundedViewSampler(2, 3, min_gap=8, max_gap=20)
    for views in draws(sampler, num_views=12, count=50):
        assert 8 <= views.context[1] - views.context[0] <= 11  # clamped to the scene
    with pytest.raises(ValueError, match="has 8 views"):
        sampler.sample("short", 8)
    single = BoundedViewSampler(1, 2, min_gap=0, max_gap=3)
    for views in draws(single, num_views=10, count=50):
        (center,) = views.context.tolist()
        assert ((views.target - center).abs() <= 3).all()


def test_bounded_warm_up_schedule() -> None:
    tracker = StepTracker()
    sampler = BoundedViewSampler(
        2, 1, min_gap=45, max_gap=135, initial_min_gap=25, initial_max_gap=25,
        warm_up_steps=1000, step_tracker=tracker,
    )  # fmt: skip
    assert sampler.gap_range() == (25, 25)
    assert {int(v.context[1] - v.context[0]) for v in draws(sampler, 300, 30)} == {25}
    tracker.set(500)
    assert sampler.gap_range() == (35, 80)
    tracker.set(5000)
    assert sampler.gap_range() == (45, 135)
    gaps = [int(v.context[1] - v.context[0]) for v in draws(sampler, 300, 200)]
    assert min(gaps) >= 45 and max(gaps) <= 135 and max(gaps) > 100
    assert BoundedViewSampler(2, 1, 5, 9).gap_range() == (5, 9)  # no tracker: final range
    with pytest.raises(ValueError):
        BoundedViewSampler(2, 1, min_gap=9, max_gap=5)


def test_bounded_is_deterministic_for_a_generator() -> None:
    sampler = BoundedViewSampler(3, 4, min_gap=10, max_gap=40)
    a, b = draws(sampler, 100, 20, seed=3), draws(sampler, 100, 20, seed=3)
    assert all(
        torch.equal(x.context, y.context) and torch.equal(x.target, y.target) for x, y in zip(a, b)
    )


class _Steps(IterableDataset):
    def __init__(self, tracker: StepTracker) -> None:
        self.tracker = tracker

    def __iter__(self):
        for _ in range(400):
            time.sleep(0.005)
            yield self.tracker.get()


def test_step_tracker_reaches_worker_processes() -> None:
    tracker = StepTracker()
    iterator = iter(DataLoader(_Steps(tracker), batch_size=None, num_workers=1))
    assert next(iterator) == 0
    tracker.set(1234)
    assert 1234 in [next(iterator) for _ in range(100)]


@pytest.mark.parametrize(
    ("name", "keys", "usable", "context"),
    [
        ("evaluation_index_re10k.json", 7194, 6474, 2),
        ("evaluation_index_acid.json", 1848, 1595, 2),
        ("dl3dv_start_0_distance_50_ctx_6v_video_0_50.json", None, None, 6),
    ],
)
def test_evaluation_index_real_files(shared_data: Path, name, keys, usable, context) -> None:
    path = shared_data / "evaluation_index" / name
    raw = json.loads(path.read_text())
    sampler = EvaluationViewSampler(path, num_context_views=context)
    if keys is not None:
        assert len(raw) == keys and len(sampler) == usable and sampler.num_null == keys - usable
    assert sampler.keys == [k for k, v in raw.items() if v is not None]  # file order, nulls skipped
    key = sampler.keys[0]
    views = sampler.sample(key, num_views=1000)
    assert (
        views.context.tolist() == raw[key]["context"]
        and views.target.tolist() == raw[key]["target"]
    )
    null_key = next((k for k, v in raw.items() if v is None), None)
    if null_key is not None:
        with pytest.raises(ValueError, match="not in"):
            sampler.sample(null_key, 1000)
    with pytest.raises(ValueError, match="asks for frame"):
        sampler.sample(key, num_views=max(raw[key]["context"] + raw[key]["target"]))
    assert EvaluationViewSampler(path, max_scenes=5).keys == sampler.keys[:5]


def test_evaluation_index_errors(shared_data: Path, tmp_path: Path) -> None:
    re10k = shared_data / "evaluation_index" / "evaluation_index_re10k.json"
    with pytest.raises(InputError, match=r"\[2\] context views, configured 3"):
        EvaluationViewSampler(re10k, num_context_views=3)
    with pytest.raises(InputError, match="not found") as error:
        EvaluationViewSampler(tmp_path / "missing.json")
    assert str(tmp_path / "missing.json") in str(error.value)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"a": {"context": [0, 1]}}))
    with pytest.raises(InputError, match="'a' needs integer lists"):
        EvaluationViewSampler(bad)
    bad.write_text("{not json")
    with pytest.raises(InputError, match="unreadable"):
        EvaluationViewSampler(bad)


def test_all_and_video_samplers(tmp_path: Path) -> None:
    everything = AllViewSampler().sample("s", 7)
    assert everything.context.tolist() == list(range(7)) == everything.target.tolist()
    assert AllViewSampler(3).sample("s", 9).context.tolist() == [0, 4, 8]
    video = VideoViewSampler(num_context_views=2, stride=3).sample("s", 11)
    assert video.context.tolist() == [0, 10] and video.target.tolist() == [0, 3, 6, 9, 10]
    index = tmp_path / "index.json"
    index.write_text(json.dumps({"s": {"context": [4, 12], "target": [5]}, "t": None}))
    from_index = VideoViewSampler(index_path=index, num_target_views=5)
    assert from_index.keys == ["s"]
    views = from_index.sample("s", 20)
    assert views.context.tolist() == [4, 12] and views.target.tolist() == [4, 6, 8, 10, 12]
    assert isinstance(make_view_sampler("all"), AllViewSampler)
    with pytest.raises(ValueError, match="unknown view sampler"):
        make_view_sampler("random")
