"""Whole captures and view selection on a small synthetic capture: 12 ray-cast
64x64 photos of a room along a smooth camera path, written as an image folder with cameras.json.

Covers the window cover, the fusion (frame, duplicates, counts), the held-out scoring, the
planner's bad input and ``infer.py`` end to end (a posed and a pose-free model).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from config_fixtures import infer_in_process
from data_fixtures import SHARED_DATA

from models import create_model
from models.core.gaussians import Gaussians, transform_gaussians
from models.geometry.rotations import quaternion_to_matrix
from models.geometry.similarity import Similarity
from models.pipeline.capture import fusion, holdout, views
from models.pipeline.capture.inputs import load_inputs
from models.pipeline.capture.whole import CaptureError, plan_capture
from models.render.core import render

REPO_ROOT = Path(__file__).resolve().parents[1]
DRONE = SHARED_DATA / "real" / "drone_colmap"
PHOTOS = 12


@pytest.fixture(scope="module")
def posed_model():
    return create_model("pixel_aligned_tiny", pretrained=True).eval()


@pytest.fixture(scope="module")
def images(capture: Path, posed_model):
    loaded, _ = load_inputs(capture, 32, posed_model, name="pixel_aligned_tiny")
    return loaded


# --------------------------------------------------------------------------- windows


def test_window_cover(images, posed_model) -> None:
    plan = plan_capture(images, posed_model, views="all", holdout=4, name="pixel_aligned_tiny")
    assert plan.held == [0, 4, 8]
    assert plan.graph.kind == "camera distance and viewing direction"
    rest = [i for i in range(PHOTOS) if i not in plan.held]
    covered = set()
    for number, window in enumerate(plan.windows):
        assert len(window) == 2 and not set(window) & set(plan.held)
        if number:  # every later window shares a photo with the earlier ones
            assert set(window) & covered
        covered |= set(window)
    assert sorted(covered) == rest == plan.used
    # the path is smooth: every window pairs photos at most 2 apart (3 where one is held out)
    assert max(max(w) - min(w) for w in plan.windows) <= 2
    assert len(plan.windows) == len(rest) - 1  # a 2-view cover of a chain is a spanning tree


def test_select_views_around_center(images, posed_model) -> None:
    plan = plan_capture(images, posed_model, views=3, center_view="photo_06", name="x")
    assert plan.windows == [[5, 6, 7]] and plan.mode == "views"
    assert plan_capture(images, posed_model, views=3, name="x").center == PHOTOS // 2
    with pytest.raises(views.ViewError, match="center_view=nope"):
        plan_capture(images, posed_model, views=3, center_view="nope", name="x")
    angle = views.max_rotation_deg(images.extrinsics[[5, 6, 7]])
    assert 0 < angle < views.max_rotation_deg(images.extrinsics)


def test_view_angle_warning_against_the_recipe(monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    recipe = SimpleNamespace(max_view_angle=30.0, views=2)
    # views.py binds the registry's lookup at import (a module-top import)
    monkeypatch.setattr(views, "get_pretrained_cfg", lambda name: SimpleNamespace(recipe=recipe))
    assert views.view_angle_note(25.0, "m") is None
    assert "45 degrees apart, more than the 30 degrees" in views.view_angle_note(45.0, "m")
    recipe.max_view_angle = None  # not known: no warning
    assert views.view_angle_note(80.0, "m") is None


def test_pose_free_neighbours_by_image_similarity(images) -> None:
    graph = views.view_graph(images, pose_free=True)
    assert graph.kind == "image similarity"
    nearest = graph.affinity.argmax(axis=1)
    assert np.mean(np.abs(nearest - np.arange(PHOTOS)) == 1) >= 0.75  # thumbnails find neighbours
    order = views.order_affinity(5)
    assert order[2, 1] == order[2, 3] == 1.0 and order[2, 0] == 0.5


@pytest.mark.skipif(not DRONE.is_dir(), reason="no shared drone capture")
def test_covisibility_of_a_real_colmap_model() -> None:
    from datamodules.readers.colmap import read_model

    _, model_images, _ = read_model(DRONE / "sparse", points=False)
    names = sorted(image.name for image in model_images.values())
    shared = views.covisibility(DRONE / "sparse", names)
    assert shared.shape == (len(names), len(names)) and (shared == shared.T).all()
    # neighbouring frames share more points than frames far apart
    assert shared[10, 11] > shared[10, 30] and shared[10, 11] >= views.MIN_SHARED_POINTS


def test_disconnected_photos(images, posed_model, monkeypatch: pytest.MonkeyPatch) -> None:
    def graph_with(*cuts: int):
        def fake(image_set, pose_free):
            count = len(image_set.names)
            group = np.searchsorted(np.array(cuts), np.arange(count), side="right")
            affinity = (group[:, None] == group[None, :]).astype(float) - np.eye(count)
            return views.ViewGraph(list(image_set.names), affinity, "test", affinity > 0)

        return fake

    monkeypatch.setattr(views, "view_graph", graph_with(9))
    plan = plan_capture(images, posed_model, views="all", name="x")
    assert plan.used == list(range(9)) and "photo_09.png" in plan.notes[0]
    assert "3 photo(s) share no" in plan.notes[0]
    monkeypatch.setattr(views, "view_graph", graph_with(4, 8))
    with pytest.raises(CaptureError, match="under half"):
        plan_capture(images, posed_model, views="all", name="x")


def test_holdout_leaving_too_few(images, posed_model) -> None:
    keep_one = ",".join(f"photo_{i:02d}" for i in range(1, PHOTOS))
    with pytest.raises(holdout.HoldoutError, match="needs 2 per window"):
        plan_capture(images, posed_model, views="all", holdout=keep_one, name="x")
    with pytest.raises(holdout.HoldoutError, match="K >= 2"):
        holdout.holdout_indices(1, ["a", "b"])
    assert holdout.holdout_indices("photo_03,photo_01.png", images.names) == [1, 3]


# --------------------------------------------------------------------------- fusion


def _random_gaussians(count: int, seed: int = 0) -> Gaussians:
    g = torch.Generator().manual_seed(seed)
    rotations = torch.randn(1, count, 4, generator=g)
    return Gaussians(
        means=torch.randn(1, count, 3, generator=g) * 0.5 + torch.tensor([0.0, 0.0, 3.0]),
        scales=torch.rand(1, count, 3, generator=g) * 0.05 + 0.02,
        rotations=rotations / rotations.norm(dim=-1, keepdim=True),
        opacities=torch.rand(1, count, generator=g) * 0.5 + 0.4,
        harmonics=torch.randn(1, count, 3, 4, generator=g) * 0.4,
    )


def _cameras(count: int) -> tuple[torch.Tensor, torch.Tensor]:
    e = torch.eye(4).repeat(count, 1, 1)
    e[:, 0, 3] = torch.linspace(-0.3, 0.3, count)
    k = torch.tensor([[1.0, 0, 0.5], [0, 1.0, 0.5], [0, 0, 1]]).expand(count, 3, 3)
    return e, k


def test_window_to_capture_moves_scene_and_cameras_together() -> None:
    gaussians = _random_gaussians(400)
    e, k = _cameras(3)
    angle = math.radians(40)
    rotation = torch.tensor(
        [[math.cos(angle), 0, math.sin(angle)], [0, 1, 0], [-math.sin(angle), 0, math.cos(angle)]],
        dtype=torch.float64,
    )
    truth = Similarity(2.5, rotation, torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64))
    moved_e = truth.cameras(e.double()).float()
    fitted = fusion.window_to_capture(e, moved_e)  # recovered from the cameras alone
    assert abs(fitted.scale - 2.5) < 1e-6 and torch.allclose(fitted.rotation, rotation, atol=1e-6)
    moved = transform_gaussians(gaussians, fitted)
    before = render(gaussians, e[None], k[None], (48, 48), backend="torch").color
    after = render(moved, moved_e[None], k[None], (48, 48), backend="torch").color
    assert (before - after).abs().max() < 2e-3  # SH colour, orientation and scale moved exactly
    inverse = fitted.inverse()
    assert torch.allclose(
        inverse.points(fitted.points(moved_e[:, :3, 3].double())),
        moved_e[:, :3, 3].double(),
        atol=1e-6,
    )


def test_capture_frame_is_normalize_scene(images) -> None:
    from models.geometry.cameras import normalize_scene

    frame, move = fusion.capture_frame(images.extrinsics)
    expected = normalize_scene(images.extrinsics[None].double())[0][0]
    assert torch.allclose(frame, expected, atol=1e-6)
    assert torch.allclose(move.cameras(images.extrinsics.double()), expected, atol=1e-6)


def _surface(count: int = 24, depth: float = 3.0, seed: int = 0, jitter: float = 0.0):
    """A textured wall of ``count x count`` per-pixel Gaussians at ``depth`` (camera 0 looks
    at it), positions jittered along z by ``jitter`` (relative), as one window predicts it."""
    g = torch.Generator().manual_seed(seed)
    xs, ys = torch.meshgrid(
        torch.linspace(-1, 1, count), torch.linspace(-1, 1, count), indexing="ij"
    )
    n = xs.numel()
    z = depth * (1 + jitter * (torch.rand(n, generator=g) * 2 - 1))
    colour = torch.stack([xs.flatten(), ys.flatten(), (xs * ys).flatten()], -1) * 0.5  # [n, 3]
    return Gaussians(
        means=torch.stack([xs.flatten(), ys.flatten(), z], -1)[None],
        scales=torch.full((1, n, 3), 1.2 / count),
        rotations=torch.tensor([1.0, 0, 0, 0]).expand(1, n, 4).clone(),
        opacities=torch.full((1, n), 0.9),
        harmonics=(colour + 0.05 * torch.randn(n, 3, generator=g))[None, :, :, None],
    )


def _part(g: Gaussians, keep: torch.Tensor) -> Gaussians:
    out = g._gather(torch.nonzero(keep)[:, 0][None])
    out.mask = None
    return out


def test_windows_describing_one_surface_merge() -> None:
    """Three windows predict overlapping parts of one wall (depths a little apart, colours
    noisy): the fused count follows the wall's pixels, not the windows; a patch one window alone
    predicts is kept; the fused set renders the wall better than any single window."""
    e, k = _cameras(2)
    walls = [_surface(24, seed=s, jitter=0.02) for s in (1, 2, 3)]
    x = walls[0].means[0, :, 0]
    windows = [_part(walls[0], x <= 0.35), _part(walls[1], x >= -0.35), walls[2]]
    side = _random_gaussians(100, seed=4)
    side = side.replace(harmonics=side.harmonics[..., :1])  # only window 2 predicts this patch
    patch = torch.rand(1, 100, 3, generator=torch.Generator().manual_seed(4))
    side = side.replace(means=patch * torch.tensor([0.3, 0.6, 0.0]) + torch.tensor([1.1, -0.3, 3]))
    windows[1] = Gaussians.cat([windows[1], side])
    windows[2] = _part(walls[2], (x.abs() < 0.5))  # the middle only
    truth = Gaussians.cat([_surface(48), side])  # the wall as it is, finer than any window
    target = render(truth, e[None], k[None], (32, 32), backend="torch").color
    before = sum(int(w.means.shape[1]) for w in windows)
    fused, counts = fusion.merge_surfaces(windows, [(e, k)] * 3, (32, 32))
    assert counts["before"] == before and counts["after"] == int(fused.count()[0])
    assert counts["after"] < 0.7 * before  # one wall, not three overlapping parts
    assert counts["per_window_before"] == [int(w.means.shape[1]) for w in windows]
    assert sum(counts["per_window"]) == counts["after"]
    beside = int((fused.means[0, :, 0] > 1.05).sum())  # its own patch stays
    assert 10 <= beside <= 100 and counts["per_window"][1] >= beside

    def error(g: Gaussians) -> float:
        out = render(g, e[None], k[None], (32, 32), backend="torch").color
        return float((out - target).pow(2).mean())

    assert error(fused) < min(error(w) for w in windows)
    scales = fused.scales[0]
    assert torch.isfinite(scales).all() and (scales > 0).all()
    assert torch.allclose(fused.rotations[0].norm(dim=-1), torch.ones(len(scales)), atol=1e-5)


def test_merge_is_moment_matching() -> None:
    """Two Gaussians in one surface element become one with their weighted mean, colour and
    the mixture's covariance; a lone Gaussian is kept as it is."""
    e, k = _cameras(1)
    means = torch.tensor([[[0.0, 0.0, 3.0], [0.002, 0.0, 3.0], [0.9, 0.9, 3.0]]])
    g = Gaussians(
        means=means,
        scales=torch.tensor([[[0.01, 0.02, 0.03], [0.03, 0.01, 0.02], [0.05, 0.05, 0.05]]]),
        rotations=torch.tensor([1.0, 0, 0, 0]).expand(1, 3, 4).clone(),
        opacities=torch.tensor([[0.8, 0.4, 0.5]]),
        harmonics=torch.tensor([[[0.2], [0.1], [0.0]], [[0.5], [0.4], [0.3]], [[1.0]] * 3])[None],
    )
    fused, counts = fusion.merge_surfaces([g], [(e, k)], (32, 32))
    assert counts["after"] == 2
    w = torch.tensor([0.8, 0.4], dtype=torch.float64)
    w = w / w.sum()
    mean = (w[:, None] * means[0, :2].double()).sum(0)
    var = (w[:, None] * (g.scales[0, :2].double() ** 2 + (means[0, :2].double() - mean) ** 2)).sum(
        0
    )
    merged = int(torch.argmin((fused.means[0].double() - mean).norm(dim=-1)))
    assert torch.allclose(fused.means[0, merged].double(), mean, atol=1e-6)
    assert torch.allclose(
        fused.opacities[0, merged].double(),
        (w * torch.tensor([0.8, 0.4])).sum().double(),
        atol=1e-6,
    )
    covariance = torch.diag(var)
    r = quaternion_to_matrix(fused.rotations[0, merged].double())
    rebuilt = r @ torch.diag(fused.scales[0, merged].double() ** 2) @ r.T
    assert torch.allclose(rebuilt, covariance, atol=1e-8)
    lone = 1 - merged
    assert torch.allclose(fused.means[0, lone], means[0, 2]) and torch.allclose(
        fused.scales[0, lone], g.scales[0, 2]
    )


def test_element_camera_nearest_or_most_central() -> None:
    """An element is looked up in the camera that sees it nearest; with ``centre_weight`` in
    one that sees it nearer the middle of its image, a little farther."""
    e, k = _cameras(2)  # at x = -0.3 and 0.3
    e[1, 2, 3] = -0.5  # camera 1 steps back: it sees the point farther, near its centre
    point = torch.tensor([[0.1, 0.0, 1.0]], dtype=torch.float64)  # near camera 0's right border
    camera, u, _, z = fusion._nearest_views(point, e.double(), k.double(), 0.0)
    assert int(camera[0]) == 0 and abs(float(z[0]) - 1.0) < 1e-9 and abs(float(u[0]) - 0.9) < 1e-6
    camera, u, _, z = fusion._nearest_views(point, e.double(), k.double(), 10.0)
    assert int(camera[0]) == 1 and abs(float(z[0]) - 1.5) < 1e-6


def test_fused_count_is_capped() -> None:
    e, k = _cameras(2)
    windows = [_random_gaussians(500), _random_gaussians(500, seed=1)]
    capped, counts = fusion.fuse_windows(
        windows, [(e, k), (e, k)], (32, 32), fusion_max_gaussians=300, backend="torch"
    )
    assert counts["final"] == 300 == int(capped.count()[0]) < counts["after"]
    assert counts["per_window_predicted"] == [500, 500] and counts["fusion_max_gaussians"] == 300


def test_floaters_other_windows_see_through_are_removed() -> None:
    e, k = _cameras(2)
    xs, ys = torch.meshgrid(torch.linspace(-2, 2, 40), torch.linspace(-2, 2, 40), indexing="ij")
    count = xs.numel()
    wall = Gaussians(  # an opaque wall at z = 3 that both windows see
        means=torch.stack([xs.flatten(), ys.flatten(), torch.full((count,), 3.0)], -1)[None],
        scales=torch.full((1, count, 3), 0.08),
        rotations=torch.tensor([1.0, 0, 0, 0]).expand(1, count, 4).clone(),
        opacities=torch.full((1, count), 0.95),
        harmonics=torch.zeros(1, count, 3, 1),
    )
    floaters = _random_gaussians(30, seed=5).replace(  # in front of it, in the middle
        means=torch.rand(1, 30, 3) * torch.tensor([0.4, 0.4, 0.5])
        + torch.tensor([-0.2, -0.2, 1.0]),
        harmonics=torch.zeros(1, 30, 3, 1),
    )
    kept, removed = fusion.remove_floaters(
        [wall, Gaussians.cat([wall, floaters])], [(e, k), (e, k)], (32, 32), backend="torch"
    )
    assert removed == 30
    assert int(kept[0].count()[0]) == count == int(kept[1].count()[0])


def _wall(depth: float, side: int = 40) -> Gaussians:
    """An opaque grey wall of ``side`` x ``side`` Gaussians at ``z = depth``."""
    xs, ys = torch.meshgrid(torch.linspace(-2, 2, side), torch.linspace(-2, 2, side), indexing="ij")
    count = xs.numel()
    return Gaussians(
        means=torch.stack([xs.flatten(), ys.flatten(), torch.full((count,), depth)], -1)[None],
        scales=torch.full((1, count, 3), 0.08 * depth / 3),
        rotations=torch.tensor([1.0, 0, 0, 0]).expand(1, count, 4).clone(),
        opacities=torch.full((1, count), 0.95),
        harmonics=torch.zeros(1, count, 3, 1),
    )


def test_a_window_that_misjudges_depth_keeps_its_surface() -> None:
    """Three windows see one wall at z = 3; one of them puts it 20% nearer. The floater check
    alone removes that window's whole surface (the others see through it); agreeing on depth
    first moves it onto the wall along its own cameras' rays, where it stays."""
    e, k = _cameras(2)
    windows = [_wall(3.0), _wall(2.4), _wall(3.0)]
    cameras = [(e, k)] * 3
    kept, removed = fusion.remove_floaters(windows, cameras, (32, 32), backend="torch")
    seen = int(kept[1].count()[0])
    assert seen < 0.6 * int(windows[1].count()[0])  # the old rule: most of it removed
    agreed, moved = fusion.agree_depths(windows, cameras, (32, 32), backend="torch")
    centre = e[0, :3, 3]
    near = agreed[1].means[0]
    inside = ((windows[1].means[0][:, :2]).abs() < 0.5).all(-1)  # seen by both cameras
    assert moved > 0 and inside.any()
    assert torch.allclose(near[inside, 2], torch.full_like(near[inside, 2], 3.0), atol=0.05)
    ray = (windows[1].means[0] - centre)[inside]
    along = (near[inside] - centre) / (near[inside, 2:] - centre[2]) * ray[:, 2:]
    assert torch.allclose(along, ray, atol=0.05)  # moved along its camera's rays
    assert torch.allclose(agreed[0].means, windows[0].means)  # the agreeing ones stay
    kept, _ = fusion.remove_floaters(agreed, cameras, (32, 32), backend="torch")
    assert int(kept[1].count()[0]) > 0.9 * int(windows[1].count()[0])


def test_fusion_keeps_the_depth_agreement_that_renders_its_photos_better() -> None:
    """With the windows' own photos, the fusion with and without the depth agreement are both
    made and the one that renders those photos better is kept (and said)."""
    e, k = _cameras(2)
    truth = _wall(3.0)
    truth.harmonics[..., 0, 0] = torch.linspace(-1.5, 1.5, truth.means.shape[1])
    photos = render(truth, e[None], k[None], (32, 32), backend="torch").color[0]
    windows = [truth, truth.replace(means=truth.means * 0.8, scales=truth.scales * 0.8), truth]
    cameras = [(e, k)] * 3
    fused, counts = fusion.fuse_windows(
        windows, cameras, (32, 32), backend="torch", images=[photos] * 3
    )
    scores = counts["depth_agreement"]["input_psnr"]
    assert counts["depth_agreement"]["used"] == (scores["agreed"] >= scores["as_placed"])
    kept = fusion.input_psnr(fused, cameras, [photos] * 3, backend="torch")
    assert kept == pytest.approx(max(scores.values()), abs=1e-2)
    # the window that put the wall 20% nearer, moved back onto it: the agreed fusion wins
    assert counts["depth_agreement"]["used"] and counts["depth_agreed"] > 0
    assert scores["agreed"] > scores["as_placed"]


# --------------------------------------------------------------------------- scoring


def test_perfect_render_scores_high_and_baseline_is_nearest() -> None:
    gaussians = _random_gaussians(600)
    e, k = _cameras(4)
    shots = render(gaussians, e[None], k[None], (32, 32), backend="torch").color[0]
    names = [f"v{i}.png" for i in range(4)]
    held = holdout.holdout_views(names, shots, e, k, held=[1, 2], inputs=[0, 3])
    assert held.nearest_names == ["v0.png", "v3.png"]
    scores = holdout.score_holdout(gaussians, held, backend="torch", lpips=False)
    assert scores.mean["psnr"] > 40 and scores.mean["ssim"] > 0.99
    from models.pipeline.metrics import psnr_per_image

    expected = float(psnr_per_image(shots[0], shots[1]))
    assert abs(scores.metrics["v1.png"]["nearest_view_psnr"] - round(expected, 4)) < 1e-3
    assert scores.mean["nearest_view_psnr"] < scores.mean["psnr"]
    summary = holdout.holdout_summary(held, scores, before=scores)
    assert summary["views"] == ["v1.png", "v2.png"] and summary["image_size"] == [32, 32]
    assert summary["metrics"]["v2.png"]["psnr_before_refine"] == scores.metrics["v2.png"]["psnr"]
    assert "mean" in holdout.holdout_table(summary)


# --------------------------------------------------------------------------- infer.py


COMMON = ("image_size=32", "orbit_frames=4", "backend=torch", "device=cpu")


def test_infer_views_all_holdout(capture: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    from PIL import Image

    from models.core import budget

    monkeypatch.setattr(budget, "BIG_SECONDS", 0.0)  # every wait said, however short
    output = tmp_path / "out"
    status, out, err = infer_in_process(
        capsys, f"input={capture}", f"output={output}", "model=pixel_aligned_tiny",
        "views=all", "holdout=4", *COMMON,
    )  # fmt: skip
    assert status == 0, err
    assert "nearest PSNR" in out
    # the windows' time, measured on the second window, then the fusion's, on its first window
    assert (
        "whole capture (pixel_aligned_tiny): 8 windows (their fusion is said after): about" in err
    )
    assert "more (6 window(s) at" in err and "fusion of 8 windows" in err
    assert "fusion of 8 windows: surface merge of" in err  # timed on a sample first
    summary = json.loads((output / "summary.json").read_text())
    windows = summary["scene"]["windows"]
    held = [f"photo_{i:02d}.png" for i in (0, 4, 8)]
    assert summary["holdout"]["views"] == held and summary["holdout"]["image_size"] == [32, 32]
    assert sorted({n for w in windows for n in w}) == summary["view_names"]
    assert not set(held) & set(summary["view_names"]) and len(summary["view_names"]) == 9
    fusion_counts = summary["scene"]["fusion"]
    assert fusion_counts["before"] > fusion_counts["after"] == summary["gaussians"]
    for name in held:
        entry = summary["holdout"]["metrics"][name]
        assert {"psnr", "ssim", "nearest_view_psnr", "nearest_view"} <= entry.keys()
        assert Image.open(output / "renders" / "holdout" / f"{Path(name).stem}.png").size == (
            32,
            32,
        )
    assert summary["holdout"]["mean"]["psnr"] > 14  # a real scene, not noise
    assert (output / "holdout_sheet.png").is_file() and (output / "gaussians.ply").is_file()
    cameras = json.loads((output / "cameras.json").read_text())
    assert len(cameras["frames"]) == 9 and len(cameras["path"]) == 4
    # view.py shows a fused output as saved (and says so): its knobs would re-run every window
    import view
    from models.view import live

    settings = {"model": None, "weights": None, "views": None, "image_size": None}
    settings |= {k: None for k in view.KNOB_KEYS}
    assert live.settings_from_summary(output, settings) is None
    assert "fuses 8 windows" in capsys.readouterr().err


def test_infer_pose_free_views_all(capture: Path, tmp_path: Path, capsys) -> None:
    output = tmp_path / "free"
    status, _, err = infer_in_process(
        capsys, f"input={capture}", f"output={output}", "model=zipsplat_tiny",
        "views=all", "holdout=photo_05", "fusion_max_gaussians=1500", *COMMON,
    )  # fmt: skip
    assert status == 0, err
    summary = json.loads((output / "summary.json").read_text())
    assert summary["pose_free"] and summary["scene"]["selection"] == "image similarity"
    fused = summary["scene"]["fusion"]
    assert fused["after"] > 1500 == fused["final"] == summary["gaussians"]
    assert list(summary["holdout"]["metrics"]) == ["photo_05.png"]


def test_fit_holdout_cameras_moves_towards_the_photo() -> None:
    """A held-out camera started at a neighbour's pose is fitted against its photo with the
    scene fixed: the render gets closer to the photo and the record says how far it moved."""
    e, k = _cameras(3)
    wall = _surface(32)
    photo = render(wall, e[None, 1:2], k[None, 1:2], (32, 32), backend="torch").color[0]
    before = wall.means.clone()
    fitted, record = holdout.fit_holdout_cameras(
        wall, photo, e[0:1], k[1:2], steps=60, backend="torch"
    )
    assert torch.equal(wall.means, before)  # the scene is never touched

    def error(camera: torch.Tensor) -> float:
        out = render(wall, camera[None], k[None, 1:2], (32, 32), backend="torch").color[0]
        return float((out - photo).pow(2).mean())

    assert error(fitted) < 0.5 * error(e[0:1])
    moved = (fitted[0, :3, 3] - e[0, :3, 3]).norm()
    assert abs(record["translation"][0] - float(moved)) < 1e-4 and record["steps"] == 60
    assert "fitted" in record["placement"]


def test_refit_holdout_cameras_follows_the_refined_scene() -> None:
    """After a joint refinement moved the scene and the input cameras together, the held-out
    camera is placed again against the refined scene from its neighbour's refined camera: the
    camera placed against the scene before it renders the moved scene badly."""
    e, k = _cameras(3)
    wall = _surface(32)
    photo = render(wall, e[None, 1:2], k[None, 1:2], (32, 32), backend="torch").color[0]
    shift = torch.eye(4)
    shift[:3, 3] = torch.tensor([0.2, -0.1, 0.3])  # what the refinement did to the frame
    moved = wall.replace(means=wall.means + shift[:3, 3])
    views = holdout.HoldoutViews(
        names=["held"], images=photo, extrinsics=e[1:2], intrinsics=k[1:2],
        nearest_names=["left"], nearest_images=photo,
    )  # fmt: skip
    again, record = holdout.refit_holdout_cameras(
        moved, views, ["left", "right"], shift @ e[[0, 2]], backend="torch"
    )
    assert torch.equal(again.images, views.images) and again.names == ["held"]

    def error(camera: torch.Tensor) -> float:
        out = render(moved, camera[None], k[None, 1:2], (32, 32), backend="torch").color[0]
        return float((out - photo).pow(2).mean())

    assert error(again.extrinsics) < 0.2 * error(views.extrinsics)
    assert "refined scene" in record["placement"] and len(record["translation"]) == 1


def test_infer_pose_free_holdout_without_poses(
    capture: Path, tmp_path: Path, capsys, monkeypatch
) -> None:
    """Photos without poses, a pose-free model, ``holdout=``: the held-out cameras are fitted
    (issue 39 item 4) instead of stopping, and the fit is announced with its time (issue 40)."""
    import shutil

    from models.core import budget

    monkeypatch.setattr(budget, "BIG_SECONDS", 0.0)  # every wait said, however short
    bare = tmp_path / "bare"
    bare.mkdir()
    for photo in sorted(capture.glob("photo_*.png"))[:6]:
        shutil.copy(photo, bare / photo.name)
    output = tmp_path / "free"
    status, out, err = infer_in_process(
        capsys, f"input={bare}", f"output={output}", "model=zipsplat_tiny",
        "views=all", "holdout=photo_02", "pose_fit_steps=5", *COMMON,
    )  # fmt: skip
    assert status == 0, err
    summary = json.loads((output / "summary.json").read_text())
    cameras = summary["holdout"]["cameras"]
    assert "fitted" in cameras["placement"] and cameras["steps"] == holdout.HOLDOUT_POSE_STEPS
    assert (
        f"held-out cameras' pose fit: {holdout.HOLDOUT_POSE_STEPS} steps of 1 cameras at 32x32 px: about"
        in err
    )
    assert len(cameras["translation"]) == 1 and len(cameras["rotation_deg"]) == 1
    entry = summary["holdout"]["metrics"]["photo_02.png"]
    assert entry["nearest_view"] in ("photo_01.png", "photo_03.png") and entry["psnr"] > 5


def test_infer_holdout_too_few_is_one_line(capture: Path, tmp_path: Path, capsys) -> None:
    names = ",".join(f"photo_{i:02d}" for i in range(1, PHOTOS))
    status, _, err = infer_in_process(
        capsys, f"input={capture}", f"output={tmp_path / 'x'}", "model=pixel_aligned_tiny",
        "views=all", f"holdout=[{names}]", *COMMON,
    )  # fmt: skip
    assert status == 2 and len(err.strip().splitlines()) == 1 and "holdout=" in err
    assert not (tmp_path / "x").exists()


# --------------------------------------------------------------------------- frames


def _similar_capture(images, truth: Similarity):
    """``images`` with its poses (and sparse points) in another frame: ``truth`` of its own."""
    import dataclasses

    points = images.points
    return dataclasses.replace(
        images,
        extrinsics=truth.cameras(images.extrinsics.double()).float(),
        points=None if points is None else truth.points(points.double()).float(),
    )


def _assert_same_gaussians(a: Gaussians, b: Gaussians, scale: float = 1.0) -> None:
    size = max(float(a.means.abs().max()), 1.0)
    assert torch.allclose(a.means, b.means, atol=2e-5 * size), (a.means - b.means).abs().max()
    assert torch.allclose(a.scales, b.scales, rtol=1e-4, atol=1e-7 * scale)
    dots = (a.rotations * b.rotations).sum(-1).abs()  # q and -q: one rotation
    assert float(dots.min()) > 1 - 1e-5, float(dots.min())
    assert torch.allclose(a.opacities, b.opacities, atol=1e-5)
    assert torch.allclose(a.harmonics, b.harmonics, atol=2e-4)


@pytest.mark.parametrize("model_name", ["pixel_aligned_tiny", "zipsplat_tiny"])
def test_whole_capture_frame_round_trip(images, model_name: str, monkeypatch) -> None:
    """A capture whose poses (and points) are a known similarity of another's, reconstructed
    window by window: each window's Gaussians as they enter the fusion are the same in the
    capture frame, the similarity's image of the other's in the capture's own frame (what is
    written), and render alike from each capture's own cameras; so does the fused set."""
    from models.pipeline.capture.whole import reconstruct_capture

    model = create_model(model_name, pretrained=True).eval()
    angle = math.radians(70)
    c, s = math.cos(angle), math.sin(angle)
    rotation = torch.tensor([[c, -s, 0], [s * 0.6, c * 0.6, -0.8], [s * 0.8, c * 0.8, 0.6]])
    truth = Similarity(3.7, rotation.double(), torch.tensor([4.0, -1.5, 2.0]).double())
    other = _similar_capture(images, truth)
    fuse = fusion.fuse_windows
    entered: list[list[Gaussians]] = []

    def recording(sets, *args, **kwargs):
        entered.append(list(sets))
        return fuse(sets, *args, **kwargs)

    monkeypatch.setattr(fusion, "fuse_windows", recording)
    results = []
    for capture_images in (images, other):
        plan = plan_capture(capture_images, model, views="all", name=model_name)
        assert len(plan.windows) > 1
        with torch.no_grad():
            results.append(
                reconstruct_capture(model, plan, pose_fit_steps=0, backend="torch", lpips=False)
            )
    first, second = results
    assert first.plan.windows == second.plan.windows
    # the capture frame (first used photo the identity, largest camera distance 1) is the same
    e_a, e_b = first.reconstruction.extrinsics, second.reconstruction.extrinsics
    assert torch.allclose(e_a, e_b, atol=1e-5)
    to_own_a = first.reconstruction.frame.to_capture
    to_own_b = second.reconstruction.frame.to_capture
    assert abs(to_own_b.scale / to_own_a.scale - truth.scale) < 1e-4
    if not model.pose_free:  # each window's own cameras land on the capture's, in both frames
        from models.pipeline.capture.whole import subset
        from models.pipeline.inference import reconstruct

        for result, photos in ((first, images), (second, other)):
            back = result.reconstruction.frame.to_capture
            steps = result.summary["scene"]["window_to_frame"]
            for window, step in zip(result.plan.windows, steps):
                alone = reconstruct(
                    model, subset(photos, window), pose_fit_steps=0, backend="torch"
                )
                move = Similarity(
                    step["scale"],
                    *(torch.tensor(step[k]).double() for k in ("rotation", "translation")),
                )
                mapped = back.cameras(move.cameras(alone.extrinsics.double()))
                expected = photos.extrinsics[window].double()
                size = float(expected[:, :3, 3].abs().max())
                assert torch.allclose(mapped, expected, atol=1e-4 * max(size, 1.0))
    k = first.reconstruction.intrinsics
    shape = tuple(images.images.shape[-2:])
    own_a, own_b = images.extrinsics[first.plan.used], other.extrinsics[first.plan.used]
    pairs = [*zip(*entered), (first.reconstruction.gaussians, second.reconstruction.gaussians)]
    for number, (set_a, set_b) in enumerate(pairs):
        fused = number == len(pairs) - 1
        if not fused:  # the fusion's voxel and depth tests may flip a Gaussian on float noise
            _assert_same_gaussians(set_a, set_b)
        own_set_a = transform_gaussians(set_a, to_own_a)  # the captures' own frames
        own_set_b = transform_gaussians(set_b, to_own_b)
        if not fused:
            _assert_same_gaussians(
                transform_gaussians(own_set_a, truth), own_set_b, scale=truth.scale
            )
        render_a = render(own_set_a, own_a[None], k[None], shape, backend="torch").color
        render_b = render(own_set_b, own_b[None], k[None], shape, backend="torch").color
        difference = (render_a - render_b).abs()
        assert float(difference.mean()) < 1e-4 and float(difference.max()) < (
            0.2 if fused else 2e-3
        )
