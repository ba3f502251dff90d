"""Test-time target-pose fit (models/pipeline/pose_fit.py)."""

from __future__ import annotations

import math

import pytest
import torch

from models import Gaussians
from models.core.gaussians import rgb_to_sh
from models.geometry.similarity import Similarity, fit_cameras
from models.pipeline.pose_fit import fit_target_poses, pose_error, se3_delta

SIZE = (32, 32)


pytestmark = pytest.mark.usefixtures("one_thread")


def _scene(n: int = 300, seed: int = 0) -> Gaussians:
    """Opaque coloured blobs filling the view of a camera at the origin looking down +z."""
    g = torch.Generator().manual_seed(seed)
    z = 2.5 + 1.5 * torch.rand(n, generator=g)
    xy = (torch.rand(n, 2, generator=g) * 2 - 1) * 0.6 * z[:, None]
    means = torch.cat([xy, z[:, None]], dim=1)
    rgb = torch.rand(n, 3, generator=g)
    rotations = torch.randn(n, 4, generator=g)
    return Gaussians(
        means=means[None],
        scales=(0.06 + 0.1 * torch.rand(n, 3, generator=g))[None],
        rotations=(rotations / rotations.norm(dim=-1, keepdim=True))[None],
        opacities=torch.full((1, n), 0.95),
        harmonics=rgb_to_sh(rgb)[None, :, :, None],
    )


def _cameras(v: int) -> tuple[torch.Tensor, torch.Tensor]:
    extrinsics = torch.eye(4).repeat(1, v, 1, 1)  # [1, V, 4, 4]
    extrinsics[0, :, 0, 3] = torch.linspace(-0.2, 0.2, v)
    intrinsics = torch.tensor([[1.0, 0.0, 0.5], [0.0, 1.0, 0.5], [0.0, 0.0, 1.0]])
    return extrinsics, intrinsics.repeat(1, v, 1, 1)


def _perturb(extrinsics: torch.Tensor, degrees: float, distance: float, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    axis = torch.nn.functional.normalize(
        torch.randn(*extrinsics.shape[:-2], 3, generator=g), dim=-1
    )
    direction = torch.nn.functional.normalize(
        torch.randn(*extrinsics.shape[:-2], 3, generator=g), dim=-1
    )
    delta = se3_delta(axis * math.radians(degrees), direction * distance)
    return extrinsics @ delta


def test_se3_delta_is_rigid_and_identity_at_zero():
    assert torch.allclose(se3_delta(torch.zeros(3), torch.zeros(3)), torch.eye(4))
    delta = se3_delta(torch.tensor([0.3, -0.2, 0.5]), torch.tensor([1.0, 2.0, 3.0]))
    rotation = delta[:3, :3]
    assert torch.allclose(rotation @ rotation.T, torch.eye(3), atol=1e-6)
    assert torch.allclose(torch.linalg.det(rotation), torch.tensor(1.0), atol=1e-6)
    angle, _ = pose_error(delta, torch.eye(4))
    assert angle.item() == pytest.approx(math.degrees(math.sqrt(0.09 + 0.04 + 0.25)), rel=1e-4)


def test_refinement_recovers_perturbed_target_poses():
    from models import render

    gaussians = _scene()
    truth, intrinsics = _cameras(2)
    with torch.no_grad():
        image = render(gaussians, truth, intrinsics, SIZE, backend="torch").color  # [1, 2, 3, H, W]
    start = _perturb(truth, degrees=3.0, distance=0.08, seed=1)
    rot0, trans0 = pose_error(start, truth)

    with torch.inference_mode():  # eval.py calls it under inference mode
        refined = fit_target_poses(gaussians, image, start, intrinsics, steps=100, backend="torch")
    rot1, trans1 = pose_error(refined, truth)
    assert refined.shape == truth.shape and not refined.requires_grad
    # Still rigid camera-to-world matrices.
    r = refined[..., :3, :3]
    assert torch.allclose(r @ r.transpose(-1, -2), torch.eye(3).expand_as(r), atol=1e-4)
    assert (rot1 < 0.3 * rot0).all(), (rot0, rot1)
    assert (trans1 < 0.3 * trans0).all(), (trans0, trans1)


def test_zero_steps_and_bad_shapes():
    gaussians = _scene(n=20)
    extrinsics, intrinsics = _cameras(1)
    image = torch.rand(1, 1, 3, *SIZE)
    out = fit_target_poses(gaussians, image, extrinsics, intrinsics, steps=0)
    assert torch.equal(out, extrinsics)
    with pytest.raises(ValueError, match="extrinsics"):
        fit_target_poses(gaussians, image, extrinsics[:, :, :3], intrinsics, steps=1)


# ---------------------------------------------------------------------- frame alignment
def _random_similarity(b: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    scale = 0.2 + 5 * torch.rand(b, generator=g)
    axis = torch.randn(b, 3, generator=g)
    rotation = se3_delta(axis, torch.zeros(b, 3))[:, :3, :3]
    return scale, rotation, torch.randn(b, 3, generator=g)


def test_fit_cameras_recovers_a_known_similarity():
    source = _perturb(torch.eye(4).repeat(2, 4, 1, 1), degrees=20.0, distance=1.0, seed=3)
    scale, rotation, translation = _random_similarity(2, seed=4)
    target = Similarity(scale, rotation, translation).cameras(source)
    # Rigid still, and the relative geometry is the source's scaled.
    r = target[..., :3, :3]
    assert torch.allclose(r @ r.transpose(-1, -2), torch.eye(3).expand_as(r), atol=1e-5)
    gap = (target[:, 1, :3, 3] - target[:, 0, :3, 3]).norm(dim=-1)
    assert torch.allclose(gap, scale * (source[:, 1, :3, 3] - source[:, 0, :3, 3]).norm(dim=-1))

    fit = fit_cameras(source, target, "similarity")
    assert torch.allclose(fit.scale, scale, rtol=1e-4)
    assert torch.allclose(fit.rotation, rotation, atol=1e-5)
    assert torch.allclose(fit.translation, translation, atol=1e-4)
    assert torch.allclose(fit.cameras(source), target, atol=1e-4)

    # Scale only (both origins kept), from cameras scaled about the origin.
    scaled = source.clone()
    scaled[..., :3, 3] *= scale[:, None, None]
    fit = fit_cameras(source, scaled, "scale")
    assert torch.allclose(fit.scale, scale, rtol=1e-5)
    assert torch.equal(fit.rotation, torch.eye(3).expand(2, 3, 3))
    assert torch.equal(fit.translation, torch.zeros(2, 3))
    fit = fit_cameras(source, target, "none")
    assert torch.equal(fit.scale, torch.ones(2)) and torch.equal(fit.translation, torch.zeros(2, 3))

    # One camera: the scale is undetermined (1); the pose itself is matched exactly.
    fit = fit_cameras(source[:, :1], target[:, :1], "similarity")
    assert torch.equal(fit.scale, torch.ones(2))
    assert torch.allclose(fit.cameras(source[:, :1]), target[:, :1], atol=1e-5)
    with pytest.raises(ValueError, match="alignment"):
        fit_cameras(source, target, "affine")


def _wide_scene(n: int = 600, seed: int = 0) -> Gaussians:
    """Opaque blobs seen by cameras from x = 0 to x = 1 (unit context baseline) looking down +z."""
    g = torch.Generator().manual_seed(seed)
    z = 4 + 3 * torch.rand(n, generator=g)
    x = -0.5 * z + (z + 1.0) * torch.rand(n, generator=g)
    y = (torch.rand(n, generator=g) * 2 - 1) * 0.5 * z
    rotations = torch.randn(n, 4, generator=g)
    return Gaussians(
        means=torch.stack([x, y, z], dim=1)[None],
        scales=(0.12 + 0.2 * torch.rand(n, 3, generator=g))[None],
        rotations=(rotations / rotations.norm(dim=-1, keepdim=True))[None],
        opacities=torch.full((1, n), 0.95),
        harmonics=rgb_to_sh(torch.rand(n, 3, generator=g))[None, :, :, None],
    )


def _posed(centres: list[list[float]], rotations: list[list[float]]) -> dict[str, torch.Tensor]:
    extrinsics = se3_delta(torch.tensor(rotations), torch.tensor(centres))[None]  # [1, V, 4, 4]
    intrinsics = torch.tensor([[1.0, 0.0, 0.5], [0.0, 1.0, 0.5], [0.0, 0.0, 1.0]])
    return {"extrinsics": extrinsics, "intrinsics": intrinsics.repeat(1, len(centres), 1, 1)}


class _ScaledFrameModel(torch.nn.Module):
    """A stub pose-free "model": the true scene's Gaussians in a frame scaled by ``s``."""

    pose_free = True

    def __init__(self, gaussians: Gaussians, s: float) -> None:
        super().__init__()
        self.gaussians = gaussians.replace(means=gaussians.means * s, scales=gaussians.scales * s)

    def forward(self, context, **kwargs):
        from models.core.base import ModelOutput

        return ModelOutput(gaussians=self.gaussians)


@pytest.mark.filterwarnings("ignore:.*self.trainer.*:UserWarning")
@pytest.mark.filterwarnings("ignore:LPIPS.*:UserWarning")
@pytest.mark.parametrize("s", [3.3, pytest.param(0.3, marks=pytest.mark.slow)])
def test_eval_step_recovers_targets_in_a_scaled_model_frame(s, monkeypatch):
    """The model's frame is the scene frame scaled by s (not a search candidate). Through the
    test step: with the alignment the refined targets are the true ones (PSNR > 40 dB), without
    it (refinement from the scene-frame poses, as before) they are not."""
    from models import render
    from models.pipeline import pose_fit
    from models.training.module import SplatLitModule

    gaussians = _wide_scene()
    context = _posed([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0]], [[0.0, 0.0, 0.0], [0.0, 0.05, 0.0]])
    target = _posed([[0.5, 0.1, 0.1], [0.8, -0.1, 0.0]], [[0.02, 0.03, 0.0], [0.0, -0.04, 0.02]])
    with torch.no_grad():
        for views in (context, target):
            views["image"] = render(
                gaussians, views["extrinsics"], views["intrinsics"], SIZE, backend="torch"
            ).color
    truth = target["extrinsics"].clone()
    truth[..., :3, 3] *= s  # the targets' true poses in the model's frame

    placements = []
    original = pose_fit.place_targets

    def recording(*args, **kwargs):
        placements.append(original(*args, **kwargs))
        return placements[-1]

    monkeypatch.setattr(pose_fit, "place_targets", recording)
    records = {}
    for alignment in ("similarity", "none"):
        module = SplatLitModule(
            _ScaledFrameModel(gaussians, s),
            render_backend="torch",
            pose_fit_steps=60,
            compute_baselines=False,
        )
        module.target_pose_alignment = alignment
        with torch.inference_mode():
            module.test_step({"context": context, "target": target, "scene": [alignment]}, 0)
        records[alignment] = module.test_records[0]
        placed = placements[-1]
        angle, distance = pose_error(placed.refined, truth)
        if alignment == "similarity":
            assert placed.frame.to_model.scale.item() == pytest.approx(s, rel=0.02)
            assert placed.frame.residual.item() < 0.01
            assert (angle < 0.2).all() and (distance / s < 0.01).all(), (angle, distance / s)
        else:
            assert placed.frame.to_model.scale.item() == 1.0
            assert (distance / s > 0.1).all(), distance / s

    good, bad = records["similarity"], records["none"]
    assert good["frame_scale"] == pytest.approx(s, rel=0.02)
    assert good["refined_psnr"] > 40.0, good
    assert good["aligned_psnr"] > good["psnr"] + 3.0, good
    assert bad["refined_psnr"] < 25.0, bad
    assert "frame_scale" not in bad and "aligned_psnr" not in bad
    # Unrefined GT poses are scored the same in both runs.
    assert good["psnr"] == pytest.approx(bad["psnr"])


def test_pose_fit_announces_its_estimate_once(monkeypatch, capsys) -> None:
    """After two steps a long fit says on stderr how long the rest will take (from the steps'
    measured times, ``models.core.budget.Countdown``); a short one, or one not asked to, says
    nothing."""
    import models.core.budget

    g = Gaussians(
        means=torch.randn(1, 200, 3) * 0.3 + torch.tensor([0.0, 0.0, 2.0]),
        scales=torch.full((1, 200, 3), 0.05),
        rotations=torch.tensor([1.0, 0.0, 0.0, 0.0]).repeat(1, 200, 1),
        opacities=torch.full((1, 200), 0.8),
        harmonics=rgb_to_sh(torch.rand(1, 200, 3))[..., None],
    )
    extrinsics = torch.eye(4).repeat(1, 2, 1, 1)
    intrinsics = torch.tensor([[1.0, 0, 0.5], [0, 1.0, 0.5], [0, 0, 1]]).repeat(1, 2, 1, 1)
    image = torch.rand(1, 2, 3, 16, 16)
    fit_target_poses(g, image, extrinsics, intrinsics, steps=3, backend="torch", announce=True)
    assert capsys.readouterr().err == ""  # well under BIG_SECONDS
    monkeypatch.setattr(models.core.budget, "BIG_SECONDS", 0.0)
    fit_target_poses(g, image, extrinsics, intrinsics, steps=3, backend="torch")
    assert capsys.readouterr().err == ""  # not asked to
    fit_target_poses(g, image, extrinsics, intrinsics, steps=3, backend="torch", announce=True)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("pose fit: 3 steps of 2 cameras at 16x16 px")
    assert " s" in lines[0] and "about" in lines[0]
    fit_target_poses(g, image, extrinsics, intrinsics, steps=1, backend="torch", announce=True)
    assert capsys.readouterr().err == ""  # one step: nothing left to say after it
