"""Similarities (models/geometry/similarity.py) and Gaussians moved by them
(models.core.gaussians.transform_gaussians)."""

from __future__ import annotations

import math

import pytest
import torch

from models.core.gaussians import Gaussians, transform_gaussians
from models.geometry.rotations import quaternion_to_matrix
from models.geometry.similarity import Similarity, fit_cameras, nearest_rotation, umeyama
from models.render.core import render


def _random_similarity(generator: torch.Generator, batch: tuple[int, ...] = ()) -> Similarity:
    q = torch.randn(*batch, 4, generator=generator, dtype=torch.float64)
    scale = torch.rand(batch, generator=generator, dtype=torch.float64) * 3 + 0.2
    translation = torch.randn(*batch, 3, generator=generator, dtype=torch.float64) * 2
    return Similarity(scale, quaternion_to_matrix(q), translation)


def _close(a: Similarity, b: Similarity, atol: float = 1e-9) -> bool:
    return all(
        torch.allclose(x, y, atol=atol)
        for x, y in ((a.scale, b.scale), (a.rotation, b.rotation), (a.translation, b.translation))
    )


@pytest.mark.parametrize("batch", [(), (3,)])
def test_compose_and_inverse_round_trip(batch) -> None:
    g = torch.Generator().manual_seed(0)
    a, b = _random_similarity(g, batch), _random_similarity(g, batch)
    points = torch.randn(*batch, 50, 3, generator=g, dtype=torch.float64)
    assert torch.allclose((a @ b).points(points), a.points(b.points(points)), atol=1e-10)
    assert torch.allclose(a.inverse().points(a.points(points)), points, atol=1e-10)
    identity = Similarity.identity().to(points)
    assert _close(a @ a.inverse(), a.inverse() @ a)
    assert torch.allclose((a @ a.inverse()).matrix(), identity.matrix().expand_as(a.matrix()))
    homogeneous = torch.cat([points, torch.ones_like(points[..., :1])], dim=-1)  # [*S, P, 4]
    by_matrix = (a.matrix()[..., None, :, :] @ homogeneous[..., None])[..., :3, 0]
    assert torch.allclose(by_matrix, a.points(points), atol=1e-10)


def test_cameras_stay_rigid_and_follow_the_points() -> None:
    g = torch.Generator().manual_seed(1)
    move = _random_similarity(g)
    cameras = torch.eye(4, dtype=torch.float64).repeat(4, 1, 1)
    cameras[:, :3, :3] = quaternion_to_matrix(torch.randn(4, 4, generator=g, dtype=torch.float64))
    cameras[:, :3, 3] = torch.randn(4, 3, generator=g, dtype=torch.float64)
    moved = move.cameras(cameras)
    rotations = moved[:, :3, :3]
    eye = torch.eye(3, dtype=torch.float64).expand_as(rotations)
    assert torch.allclose(rotations @ rotations.transpose(-1, -2), eye, atol=1e-10)
    assert torch.allclose(moved[:, :3, 3], move.points(cameras[:, :3, 3]))
    assert torch.allclose(move.cameras(cameras[1]), moved[1])  # one camera, unbatched
    # a point in front of a camera stays at the same pixel, its depth scaled
    local = torch.tensor([0.2, -0.1, 2.0], dtype=torch.float64)
    world = cameras[0, :3, :3] @ local + cameras[0, :3, 3]
    seen = moved[0, :3, :3].T @ (move.points(world[None])[0] - moved[0, :3, 3])
    assert torch.allclose(seen, local * move.scale, atol=1e-10)
    assert torch.allclose(move.inverse().cameras(moved), cameras, atol=1e-10)


@pytest.mark.parametrize("weighted", [False, True])
def test_umeyama_recovers_a_known_similarity(weighted: bool) -> None:
    g = torch.Generator().manual_seed(2)
    truth = _random_similarity(g, (2,))
    source = torch.randn(2, 40, 3, generator=g, dtype=torch.float64)
    target = truth.points(source)
    weights = torch.rand(2, 40, generator=g, dtype=torch.float64) if weighted else None
    assert _close(umeyama(source, target, weights), truth, atol=1e-9)
    rigid = Similarity(torch.ones(2, dtype=torch.float64), truth.rotation, truth.translation)
    assert _close(umeyama(source, rigid.points(source), weights, scale=False), rigid, atol=1e-9)


def test_umeyama_weights_ignore_outliers_and_noise_averages_out() -> None:
    g = torch.Generator().manual_seed(3)
    truth = _random_similarity(g)
    source = torch.randn(400, 3, generator=g, dtype=torch.float64)
    target = truth.points(source) + 0.01 * torch.randn(400, 3, generator=g, dtype=torch.float64)
    noisy = umeyama(source, target)
    assert abs(float(noisy.scale - truth.scale)) < 5e-3
    assert torch.allclose(noisy.rotation, truth.rotation, atol=5e-3)
    corrupted = target.clone()
    corrupted[:40] += 5.0 * torch.randn(40, 3, generator=g, dtype=torch.float64)
    weights = torch.ones(400, dtype=torch.float64)
    weights[:40] = 0.0
    clean = umeyama(source[40:], target[40:])  # zero weight = the point left out
    assert _close(umeyama(source, corrupted, weights), clean, atol=1e-12)
    assert not _close(umeyama(source, corrupted), clean, atol=1e-2)


def test_umeyama_keeps_scale_one_for_coincident_points_and_rejects_bad_shapes() -> None:
    points = torch.ones(5, 3, dtype=torch.float64)
    fit = umeyama(points, points + 1.0)
    assert float(fit.scale) == 1.0
    assert torch.allclose(fit.points(points), points + 1.0)
    with pytest.raises(ValueError, match="source and target"):
        umeyama(points, points[:4])


def test_nearest_rotation_is_a_proper_rotation() -> None:
    g = torch.Generator().manual_seed(4)
    rotation = quaternion_to_matrix(torch.randn(6, 4, generator=g, dtype=torch.float64))
    noisy = rotation + 1e-3 * torch.randn(6, 3, 3, generator=g, dtype=torch.float64)
    projected = nearest_rotation(noisy)
    assert torch.allclose(projected, rotation, atol=5e-3)
    assert torch.allclose(torch.linalg.det(projected), torch.ones(6, dtype=torch.float64))
    assert torch.allclose(nearest_rotation(-torch.eye(3)).det(), torch.tensor(1.0))


def test_fit_cameras_recovers_a_similarity_from_two_cameras() -> None:
    g = torch.Generator().manual_seed(5)
    truth = _random_similarity(g, (2,))
    source = torch.eye(4, dtype=torch.float64).repeat(2, 2, 1, 1)
    source[:, 1, :3, :3] = quaternion_to_matrix(torch.tensor([0.9, 0.1, 0.3, 0.0]).double())
    source[:, 1, :3, 3] = torch.tensor([0.5, 0.1, -0.2])
    target = truth.cameras(source)
    assert _close(fit_cameras(source, target), truth, atol=1e-9)
    assert _close(fit_cameras(source, target, "none"), Similarity.identity().to(source), 0)
    with pytest.raises(ValueError, match="alignment"):
        fit_cameras(source, target, "affine")


def _scene(degree: int) -> Gaussians:
    g = torch.Generator().manual_seed(6)
    n = 300
    return Gaussians(
        means=(torch.rand(1, n, 3, generator=g) - 0.5) * torch.tensor([2.0, 2.0, 1.0])
        + torch.tensor([0.0, 0.0, 3.0]),
        scales=torch.rand(1, n, 3, generator=g) * 0.08 + 0.02,
        rotations=torch.nn.functional.normalize(torch.randn(1, n, 4, generator=g), dim=-1),
        opacities=torch.rand(1, n, generator=g) * 0.6 + 0.3,
        harmonics=torch.randn(1, n, 3, (degree + 1) ** 2, generator=g) * 0.4,
    )


@pytest.mark.parametrize("degree", [1, 3])
def test_moved_gaussians_render_as_the_scene_seen_by_moved_cameras(degree: int) -> None:
    """Rotating the scene with its cameras changes no pixel: positions, shapes and the
    view-dependent colour (SH rotated) all follow the similarity."""
    axis = torch.nn.functional.normalize(torch.tensor([0.3, -0.8, 0.5]), dim=0)
    angle = 1.1
    q = torch.cat([torch.tensor([math.cos(angle / 2)]), axis * math.sin(angle / 2)])
    move = Similarity(1.7, quaternion_to_matrix(q.double()), torch.tensor([0.4, -1.0, 2.0]))
    gaussians = _scene(degree)
    cameras = torch.eye(4).repeat(2, 1, 1)
    cameras[1, 0, 3] = 0.5
    k = torch.tensor([[0.9, 0, 0.5], [0, 0.9, 0.5], [0, 0, 1.0]]).expand(2, 3, 3)
    before = render(gaussians, cameras[None], k[None], (40, 40), backend="torch")
    moved = transform_gaussians(gaussians, move)
    moved_cameras = move.cameras(cameras.double()).float()
    after = render(moved, moved_cameras[None], k[None], (40, 40), backend="torch")
    assert (before.color - after.color).abs().max() < 2e-4
    assert torch.allclose(before.depth * 1.7, after.depth, atol=2e-3)
    stale = render(
        transform_gaussians(gaussians, move).replace(harmonics=gaussians.harmonics),
        moved_cameras[None],
        k[None],
        (40, 40),
        backend="torch",
    )
    assert (stale.color - before.color).abs().max() > 1e-2  # the SH rotation is what matters
    back = transform_gaussians(moved, move.inverse())
    assert torch.allclose(back.means, gaussians.means, atol=1e-5)
    assert torch.allclose(back.harmonics, gaussians.harmonics, atol=1e-5)


def test_batched_similarity_moves_each_scene_by_its_own() -> None:
    g = torch.Generator().manual_seed(7)
    moves = _random_similarity(g, (2,))
    scene = _scene(2)
    other = scene.replace(harmonics=-scene.harmonics.flip(1), means=scene.means.flip(1) + 1.0)
    scenes = [scene, other]
    pair = scene.map(lambda t: t.new_zeros(2, *t.shape[1:]))  # two different scenes
    pair = pair.replace(
        **{k: torch.cat([getattr(g, k) for g in scenes]) for k in ("means", "harmonics")},
        scales=scene.scales.expand(2, -1, -1),
        rotations=scene.rotations.expand(2, -1, -1),
        opacities=scene.opacities.expand(2, -1),
    )
    both = transform_gaussians(pair, moves)
    assert both.harmonics.shape == pair.harmonics.shape
    for i in range(2):
        one = Similarity(moves.scale[i], moves.rotation[i], moves.translation[i])
        alone = transform_gaussians(scenes[i], one)
        assert torch.allclose(both.means[i], alone.means[0], atol=1e-5)
        assert torch.allclose(both.harmonics[i], alone.harmonics[0], atol=1e-5)
        assert torch.allclose(both.rotations[i], alone.rotations[0], atol=1e-6)
