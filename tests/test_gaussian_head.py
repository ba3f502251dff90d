import pytest
import torch
import torch.nn.functional as F

from models.core.gaussians import sh_to_rgb
from models.geometry.cameras import project
from models.layers.heads import (
    AnchorOffsetPlacement,
    FreeMeanPlacement,
    GaussianHead,
    RayDepthPlacement,
    free_mean_activation,
)


def test_activations_and_shapes():
    head = GaussianHead(
        8,
        FreeMeanPlacement(),
        gaussians_per_location=3,
        sh_degree=2,
        scale_factor=0.5,
        max_scale=0.05,
    )
    g = head(torch.randn(2, 5, 8) * 10, color=torch.rand(2, 5, 3))
    assert g.means.shape == (2, 15, 3) and g.harmonics.shape == (2, 15, 3, 9)
    assert (g.scales > 0).all() and (g.scales <= 0.05).all()
    assert ((g.opacities > 0) & (g.opacities < 1)).all()
    assert torch.allclose(g.rotations.norm(dim=-1), torch.ones(2, 15), atol=1e-5)


def test_scale_formula():
    head = GaussianHead(4, FreeMeanPlacement(), sh_degree=0, scale_factor=2.0, max_scale=10.0)
    raw = torch.zeros(1, 1, 1, head.raw_dim)
    raw[..., 3:6] = torch.tensor([0.0, 4.0, 8.0])
    g = head.decode(raw, scale_reference=torch.tensor([[3.0]]))
    expected = F.softplus(torch.tensor([-4.0, 0.0, 4.0])) * 2.0 * 3.0
    assert torch.allclose(g.scales[0, 0], expected)


def test_dc_starts_at_pixel_colour():
    head = GaussianHead(4, FreeMeanPlacement(), sh_degree=1)
    torch.nn.init.zeros_(head.proj.weight)
    color = torch.rand(1, 6, 3)
    g = head(torch.randn(1, 6, 4), color=color)
    assert torch.allclose(sh_to_rgb(g.harmonics[..., 0]), color, atol=1e-6)
    assert torch.all(g.harmonics[..., 1:] == 0)
    assert torch.allclose(g.rotations, torch.tensor([1.0, 0, 0, 0]).expand(1, 6, 4))


def test_higher_bands_scaled_down():
    head = GaussianHead(4, FreeMeanPlacement(), sh_degree=3, dc_from_color=False)
    raw = torch.ones(1, 1, 1, head.raw_dim)
    g = head.decode(raw)
    h = g.harmonics[0, 0, 0]
    assert h[0] == 1.0
    assert torch.allclose(h[1:4], torch.full((3,), 0.1 * 0.25))
    assert torch.allclose(h[9:], torch.full((7,), 0.1 * 0.25**3))


def test_free_mean_activation():
    y = torch.tensor([-2.0, 0.0, 1.0, 50.0])
    out = free_mean_activation(y, max_abs=100.0)
    assert torch.allclose(out[:3], torch.tensor([-(torch.e**2 - 1), 0.0, torch.e - 1]))
    assert torch.isclose(out[3], torch.tensor(100.0))


def test_anchor_offset_bounded():
    head = GaussianHead(4, AnchorOffsetPlacement(0.1), gaussians_per_location=2)
    anchors = torch.randn(1, 7, 3)
    g = head(torch.randn(1, 7, 4) * 100, anchors=anchors, offset_scale=torch.full((1, 7), 0.5))
    diff = g.means.reshape(1, 7, 2, 3) - anchors[:, :, None]
    assert diff.abs().max() <= 0.05 + 1e-6
    with pytest.raises(ValueError, match="anchors"):
        head(torch.randn(1, 7, 4))


def test_ray_depth_lands_within_subpixel_offset():
    b, n = 1, 16
    coords = torch.rand(b, n, 2)
    depth = torch.rand(b, n) + 1.0
    K = torch.tensor([[1.0, 0, 0.5], [0, 1.0, 0.5], [0, 0, 1]])
    c2w = torch.eye(4)
    c2w[:3, 3] = torch.tensor([0.3, -0.2, 0.1])
    pixel = torch.tensor([1 / 32, 1 / 32])
    head = GaussianHead(4, RayDepthPlacement(), gaussians_per_location=2)
    g = head(
        torch.randn(b, n, 4) * 10,
        depth=depth,
        coords=coords,
        pixel_size=pixel.expand(b, n, 2),
        intrinsics=K.expand(b, n, 3, 3),
        extrinsics=c2w.expand(b, n, 4, 4),
    )
    uv, z = project(g.means, c2w, K)
    expected = coords.repeat_interleave(2, dim=1)
    assert (uv - expected).abs().max() <= pixel.max() / 2 + 1e-6
    assert torch.allclose(z, depth.repeat_interleave(2, dim=1), atol=1e-5)
    with pytest.raises(ValueError, match="depth"):
        head(torch.randn(b, n, 4), coords=coords)


def test_bad_configuration():
    with pytest.raises(ValueError, match="placement must be a MeanPlacement"):
        GaussianHead(4, "free")
    with pytest.raises(ValueError, match="sh_degree"):
        GaussianHead(4, FreeMeanPlacement(), sh_degree=4)


def test_gradients_flow():
    head = GaussianHead(8, FreeMeanPlacement(), hidden_dim=16)
    g = head(torch.randn(2, 4, 8), color=torch.rand(2, 4, 3))
    loss = (
        g.means.sum() + g.scales.sum() + g.opacities.sum() + g.harmonics.sum() + g.rotations.sum()
    )
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in head.parameters())


def test_placements_hold_no_parameters_and_name_their_inputs():
    """The placement adds nothing to the state dict; the head's inputs are the placement's."""
    cases = [
        (FreeMeanPlacement(3.0), set()),
        (AnchorOffsetPlacement(0.2), {"anchors", "offset_scale"}),
        (RayDepthPlacement(0.5), {"depth", "coords", "pixel_size", "intrinsics", "extrinsics"}),
    ]
    for placement, inputs in cases:
        head = GaussianHead(8, placement, gaussians_per_location=2, hidden_dim=16)
        assert not list(head.placement.parameters())
        plain = GaussianHead(8, FreeMeanPlacement(), gaussians_per_location=2, hidden_dim=16)
        assert set(head.state_dict()) == set(plain.state_dict())
        assert set(head.inputs) == inputs, type(placement).__name__


def test_placement_inputs_are_checked():
    head = GaussianHead(4, RayDepthPlacement())
    assert head.placement.required_inputs == ("depth", "coords", "intrinsics", "extrinsics")
    assert head.placement.optional_inputs == ("pixel_size",)
    with pytest.raises(ValueError, match="needs coords, intrinsics, extrinsics"):
        head(torch.randn(1, 3, 4), depth=torch.ones(1, 3))
    free = GaussianHead(4, FreeMeanPlacement())
    with pytest.raises(ValueError, match="unexpected input.*anchors"):
        free(torch.randn(1, 3, 4), anchors=torch.zeros(1, 3, 3))
    # local_frame takes the camera-to-world rotation even when the placement does not need it
    local = GaussianHead(None, FreeMeanPlacement(), local_frame=True)
    assert local.inputs == ("extrinsics",)
    raw = torch.randn(1, 3, 1, local.raw_dim)
    g = local.decode(raw, extrinsics=torch.eye(4).expand(1, 3, 4, 4))
    assert torch.equal(g.means, free_mean_activation(raw[..., :3], 100.0).reshape(1, 3, 3))
    with pytest.raises(TypeError, match="offset_bound"):
        GaussianHead(4, AnchorOffsetPlacement(), offset_bound=0.5)  # the placement's setting
