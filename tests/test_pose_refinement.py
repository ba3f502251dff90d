"""Test-time target-pose refinement (models/pose_refinement.py)."""

from __future__ import annotations

import math

import pytest
import torch

from models import Gaussians
from models.gaussians import rgb_to_sh
from models.pose_refinement import pose_error, refine_target_poses, se3_delta

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
        refined = refine_target_poses(
            gaussians, image, start, intrinsics, steps=100, backend="torch"
        )
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
    out = refine_target_poses(gaussians, image, extrinsics, intrinsics, steps=0)
    assert torch.equal(out, extrinsics)
    with pytest.raises(ValueError, match="extrinsics"):
        refine_target_poses(gaussians, image, extrinsics[:, :, :3], intrinsics, steps=1)
