import pytest
import torch
import torch.nn.functional as F

from models.gaussians import sh_to_rgb
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
        8, mean_mode="free", gaussians_per_location=3, sh_degree=2, scale_factor=0.5, max_scale=0.05
    )
    g = head(torch.randn(2, 5, 8) * 10, color=torch.rand(2, 5, 3))
    assert g.means.shape == (2, 15, 3) and g.harmonics.shape == (2, 15, 3, 9)
    assert (g.scales > 0).all() and (g.scales <= 0.05).all()
    assert ((g.opacities > 0) & (g.opacities < 1)).all()
    assert torch.allclose(g.rotations.norm(dim=-1), torch.ones(2, 15), atol=1e-5)


def test_scale_formula():
    head = GaussianHead(4, mean_mode="free", sh_degree=0, scale_factor=2.0, max_scale=10.0)
    raw = torch.zeros(1, 1, 1, head.raw_dim)
    raw[..., 3:6] = torch.tensor([0.0, 4.0, 8.0])
    g = head.decode(raw, scale_reference=torch.tensor([[3.0]]))
    expected = F.softplus(torch.tensor([-4.0, 0.0, 4.0])) * 2.0 * 3.0
    assert torch.allclose(g.scales[0, 0], expected)


def test_dc_starts_at_pixel_colour():
    head = GaussianHead(4, mean_mode="free", sh_degree=1)
    torch.nn.init.zeros_(head.proj.weight)
    color = torch.rand(1, 6, 3)
    g = head(torch.randn(1, 6, 4), color=color)
    assert torch.allclose(sh_to_rgb(g.harmonics[..., 0]), color, atol=1e-6)
    assert torch.all(g.harmonics[..., 1:] == 0)
    assert torch.allclose(g.rotations, torch.tensor([1.0, 0, 0, 0]).expand(1, 6, 4))


def test_higher_bands_scaled_down():
    head = GaussianHead(4, mean_mode="free", sh_degree=3, dc_from_color=False)
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
    head = GaussianHead(4, mean_mode="anchor_offset", gaussians_per_location=2, offset_bound=0.1)
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
    head = GaussianHead(4, mean_mode="ray_depth", gaussians_per_location=2)
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
    with pytest.raises(ValueError, match="mean_mode"):
        GaussianHead(4, mean_mode="nowhere")
    with pytest.raises(ValueError, match="sh_degree"):
        GaussianHead(4, mean_mode="free", sh_degree=4)


def test_gradients_flow():
    head = GaussianHead(8, mean_mode="free", hidden_dim=16)
    g = head(torch.randn(2, 4, 8), color=torch.rand(2, 4, 3))
    loss = (
        g.means.sum() + g.scales.sum() + g.opacities.sum() + g.harmonics.sum() + g.rotations.sum()
    )
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in head.parameters())


def test_placement_modules_match_the_mean_mode_spelling():
    """A placement module and the old ``mean_mode`` string build the same head: same parameters
    (none in the placement), bit-identical Gaussians."""
    torch.manual_seed(0)
    b, n = 2, 9
    anchors = {"anchors": torch.randn(b, n, 3), "offset_scale": torch.rand(b, n)}
    c2w = torch.eye(4)
    c2w[:3, 3] = torch.tensor([0.1, 0.2, -0.3])
    rays = {
        "depth": torch.rand(b, n, 2) + 1.0,
        "coords": torch.rand(b, n, 2),
        "pixel_size": torch.tensor([1 / 16, 1 / 12]),
        "intrinsics": torch.tensor([[1.1, 0, 0.5], [0, 0.9, 0.5], [0, 0, 1]]).expand(b, n, 3, 3),
        "extrinsics": c2w.expand(b, n, 4, 4),
    }
    cases = [
        (FreeMeanPlacement(3.0), dict(mean_mode="free", free_mean_max=3.0), {}),
        (AnchorOffsetPlacement(0.2), dict(mean_mode="anchor_offset", offset_bound=0.2), anchors),
        (RayDepthPlacement(0.5), dict(mean_mode="ray_depth", offset_bound=0.5), rays),
    ]
    features = torch.randn(b, n, 8) * 3
    color = torch.rand(b, n, 3)
    for placement, legacy, inputs in cases:
        torch.manual_seed(1)
        new = GaussianHead(8, placement, gaussians_per_location=2, hidden_dim=16)
        torch.manual_seed(1)
        old = GaussianHead(8, gaussians_per_location=2, hidden_dim=16, **legacy)
        assert new.state_dict().keys() == old.state_dict().keys()
        assert not list(new.placement.parameters())
        assert set(new.inputs) == set(inputs) | ({"pixel_size"} if inputs is rays else set())
        a = new(features, color=color, **inputs)
        c = old(features, color=color, **inputs)
        for field in ("means", "scales", "rotations", "opacities", "harmonics"):
            assert torch.equal(getattr(a, field), getattr(c, field)), field


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
    with pytest.raises(ValueError, match="one of placement or mean_mode"):
        GaussianHead(4)
    with pytest.raises(ValueError, match="one of placement or mean_mode"):
        GaussianHead(4, FreeMeanPlacement(), mean_mode="free")
    with pytest.raises(ValueError, match="go to the placement"):
        GaussianHead(4, AnchorOffsetPlacement(), offset_bound=0.5)
