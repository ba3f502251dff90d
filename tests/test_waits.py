"""Long waits said with a measured estimate: the fusion's surface merge, timed on a sample of the
Gaussians before it runs (``models.pipeline.capture.fusion``), with injected timings."""

from __future__ import annotations

import types

import torch

from models.core.gaussians import Gaussians
from models.pipeline.capture import fusion


def _set(count: int) -> Gaussians:
    return Gaussians(
        means=torch.randn(1, count, 3),
        scales=torch.full((1, count, 3), 0.05),
        rotations=torch.tensor([1.0, 0.0, 0.0, 0.0]).repeat(1, count, 1),
        opacities=torch.full((1, count), 0.5),
        harmonics=torch.zeros(1, count, 3, 1),
    )


def test_the_merge_is_said_from_a_timed_sample(monkeypatch, capsys) -> None:
    """Every MERGE_SAMPLE-th Gaussian of each window is merged first; the merge's time said is
    that sample's time x MERGE_SAMPLE."""
    clock = types.SimpleNamespace(now=50.0)
    merged_counts: list[list[int]] = []

    def fake_merge(sets, cameras, shape, cell, depth_tolerance):
        merged_counts.append([int(g.means.shape[1]) for g in sets])
        clock.now += 0.5  # the sample's merge took 0.5 s
        return sets[0], {}

    monkeypatch.setattr(fusion, "merge_surfaces", fake_merge)
    monkeypatch.setattr(fusion, "time", types.SimpleNamespace(perf_counter=lambda: clock.now))
    sets = [_set(1600), _set(800), _set(35)]
    fusion._announce_merge(sets, [None] * 3, (64, 64), 2.0, 0.3)
    assert merged_counts == [[100, 50, 3]]  # every 16th of each window
    sample = fusion.MERGE_SAMPLE
    assert sample == 16
    assert capsys.readouterr().err == (
        "fusion of 3 windows: surface merge of 2435 Gaussians: about 8.0 s more "
        "(16 1/16 share(s) at 0.5 s each, measured)\n"
    )


def test_a_small_fusion_times_no_sample(monkeypatch) -> None:
    """Under BIG_SECONDS of floater check the merge is not sampled (nothing to say)."""
    calls = []
    monkeypatch.setattr(fusion, "_announce_merge", lambda *args: calls.append(args))
    monkeypatch.setattr(fusion, "agree_depths", lambda sets, *a, **k: (list(sets), 0))
    monkeypatch.setattr(fusion, "remove_floaters", lambda sets, *a, **k: (list(sets), 0))
    monkeypatch.setattr(
        fusion, "merge_surfaces", lambda sets, *a: (sets[0], {"before": 2, "after": 1})
    )
    fused, counts = fusion.fuse_windows([_set(10), _set(10)], [None, None], (8, 8))
    assert calls == [] and counts["seconds"]["merge"] >= 0.0
    monkeypatch.setattr(fusion.budget, "BIG_SECONDS", 0.0)
    fusion.fuse_windows([_set(10), _set(10)], [None, None], (8, 8))
    assert len(calls) == 1  # from BIG_SECONDS of check on: sampled and said
