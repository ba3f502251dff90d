"""The pixel-aligned family (posed and pose-free)."""

from __future__ import annotations

import inspect
import json
import math

import pytest
import torch

from models import create_model, list_models
from models.core.base import ModelOutput, SplatModel
from models.families.pixel_aligned import (
    PixelAligned,
    noposplat_tiny,
    pixel_aligned_base,
    pixel_aligned_small,
    pixel_aligned_tiny,
)
from models.geometry.cameras import pixel_grid, project
from models.geometry.similarity import umeyama

H = W = 64
# A narrower, shallower backbone and head for the behaviour tests (the registered tiny model is
# exercised in the forward/backward test); the geometry code is the same.
MICRO = dict(
    backbone_dim=32,
    backbone_depth=2,
    backbone_heads=2,
    dpt_features=16,
    feature_dim=16,
    shallow_dim=8,
    num_depth_candidates=16,
)


def _rotation(axis: torch.Tensor, angle: float) -> torch.Tensor:
    axis = axis / axis.norm()
    k = torch.tensor([[0.0, -axis[2], axis[1]], [axis[2], 0.0, -axis[0]], [-axis[1], axis[0], 0.0]])
    return torch.eye(3) + math.sin(angle) * k + (1 - math.cos(angle)) * k @ k


def _context(b: int = 1, v: int = 2, near: float | None = 1.0, far: float | None = 20.0) -> dict:
    """Posed context with rotated, translated cameras and non-trivial intrinsics."""
    extrinsics = torch.eye(4).repeat(b, v, 1, 1)
    for i in range(v):
        extrinsics[:, i, :3, :3] = _rotation(torch.tensor([0.2, 1.0, 0.1]), 0.15 * i)
        extrinsics[:, i, :3, 3] = torch.tensor([0.8 * i, 0.1 * i, -0.05 * i])
    intrinsics = torch.tensor([[0.9, 0.0, 0.52], [0.0, 1.1, 0.47], [0.0, 0.0, 1.0]])
    context = {
        "image": torch.rand(b, v, 3, H, W),
        "extrinsics": extrinsics,
        "intrinsics": intrinsics.repeat(b, v, 1, 1),
    }
    if near is not None:
        context["near"] = torch.full((b, v), near)
    if far is not None:
        context["far"] = torch.full((b, v), far)
    return context


@pytest.fixture(scope="module")
def posed() -> PixelAligned:
    torch.manual_seed(0)
    return pixel_aligned_tiny(**MICRO).eval()


@pytest.fixture(scope="module")
def pose_free() -> PixelAligned:
    torch.manual_seed(0)
    return noposplat_tiny(**MICRO).eval()


def test_registry_entries_and_overrides() -> None:
    names = list_models(family="pixel_aligned")
    for name in (
        "pixel_aligned_tiny",
        "pixel_aligned_small",
        "pixel_aligned_base",
        "noposplat_tiny",
    ):
        assert name in names
    model = create_model("pixel_aligned_tiny", sh_degree=0, num_depth_candidates=8)
    assert isinstance(model, PixelAligned) and isinstance(model, SplatModel)
    assert model.family == "pixel_aligned"
    assert model.gaussian_head.sh_degree == 0 and model.num_depth_candidates == 8


def test_pose_free_is_per_instance(posed: PixelAligned, pose_free: PixelAligned) -> None:
    assert posed.pose_free is False and pose_free.pose_free is True
    assert PixelAligned.pose_free is False  # the class default: posed
    assert pose_free.backbone.camera_embed is not None  # intrinsics-only ray tokens
    assert noposplat_tiny(**MICRO, intrinsics_tokens=False).backbone.camera_embed is None


@pytest.mark.parametrize(
    ("gaussians_per_pixel", "overrides"), [(1, {}), (2, MICRO)], ids=["tiny", "micro-G2"]
)
def test_forward_backward_counts_and_gradients(gaussians_per_pixel: int, overrides: dict) -> None:
    model = pixel_aligned_tiny(**overrides, gaussians_per_pixel=gaussians_per_pixel, sh_degree=2)
    context = _context(b=2, v=2)
    pred = model(context)
    assert isinstance(pred, ModelOutput)
    g = pred.gaussians.validate()
    n = 2 * H * W * gaussians_per_pixel
    assert g.means.shape == (2, n, 3) and g.harmonics.shape == (2, n, 3, 9)
    assert g.mask is None and g.count().tolist() == [n, n]
    assert pred.extras["depth"].shape == (2, 2, H, W)
    assert pred.extras["depth_coarse"].shape == (2, 2, H, W)
    loss = (
        g.means.square().mean()
        + g.scales.mean()
        + g.opacities.mean()
        + g.harmonics.square().mean()
        + pred.extras["depth"].mean()
    )
    loss.backward()
    no_grad = [name for name, p in model.named_parameters() if p.grad is None]
    assert no_grad == []
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


def test_means_lie_on_context_rays_at_the_predicted_depth(posed: PixelAligned) -> None:
    context = _context(b=1, v=2)
    with torch.no_grad():
        pred = posed(context)
    means = pred.gaussians.means.reshape(1, 2, H * W, 3)  # view-major, then pixel row-major
    uv, z = project(
        means, context["extrinsics"], context["intrinsics"]
    )  # [1, V, HW, 2], [1, V, HW]
    centres = pixel_grid((H, W)).reshape(1, 1, H * W, 2)
    offset_px = (uv - centres) * torch.tensor([W, H])
    bound = 0.5 * posed.gaussian_head.placement.offset_bound
    assert offset_px.abs().max() <= bound + 1e-3
    assert offset_px.abs().max() > 1e-3  # the sub-pixel offset is used
    torch.testing.assert_close(z, pred.extras["depth"].reshape(1, 2, H * W), rtol=1e-4, atol=1e-4)


def test_depth_stays_within_near_far(posed: PixelAligned) -> None:
    with torch.no_grad():
        depth = posed(_context(near=2.0, far=5.0)).extras["depth"]
        assert depth.min() >= 2.0 - 1e-4 and depth.max() <= 5.0 + 1e-4
        default = posed(_context(near=None, far=None)).extras["depth"]
    assert default.min() >= posed.near - 1e-4 and default.max() <= posed.far + 1e-3
    assert not torch.allclose(default, depth)


def test_scales_follow_depth_times_pixel_footprint(posed: PixelAligned) -> None:
    context = _context()
    with torch.no_grad():
        near = posed(context)
        context["near"], context["far"] = context["near"] * 3, context["far"] * 3
        far = posed(context)
    # Same image and cameras, the depth range times 3: depths and scales both scale by 3.
    torch.testing.assert_close(far.extras["depth"], 3 * near.extras["depth"], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(
        far.gaussians.scales, 3 * near.gaussians.scales, rtol=1e-4, atol=1e-6
    )


def test_predictions_move_with_a_rigid_change_of_world_frame(posed: PixelAligned) -> None:
    context = _context()
    transform = torch.eye(4)
    transform[:3, :3] = _rotation(torch.tensor([1.0, -0.3, 0.5]), 0.7)
    transform[:3, 3] = torch.tensor([2.0, -1.0, 0.5])
    moved = {**context, "extrinsics": transform @ context["extrinsics"]}
    with torch.no_grad():
        a = posed(context)
        b = posed(moved)
    expected = a.gaussians.means @ transform[:3, :3].T + transform[:3, 3]
    torch.testing.assert_close(b.gaussians.means, expected, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(b.extras["depth"], a.extras["depth"], rtol=1e-4, atol=1e-4)


def test_posed_model_uses_the_relative_pose(posed: PixelAligned) -> None:
    context = _context()
    other = {**context, "extrinsics": context["extrinsics"].clone()}
    other["extrinsics"][:, 1, :3, 3] += torch.tensor([0.0, 0.5, 0.3])
    with torch.no_grad():
        a = posed(context).extras["depth"]
        b = posed(other).extras["depth"]
    assert (a - b).abs().max() > 1e-5
    with pytest.raises(ValueError, match="extrinsics"):
        posed({"image": context["image"], "intrinsics": context["intrinsics"]})


def test_max_gaussians_keeps_the_most_opaque(posed: PixelAligned) -> None:
    context = _context(b=2)
    with torch.no_grad():
        full = posed(context).gaussians
        pruned = posed(context, max_gaussians=1000).gaussians
    assert pruned.count().tolist() == [1000, 1000]
    assert pruned.means.shape == (2, 1000, 3)
    top = full.opacities.topk(1000, dim=1).values
    torch.testing.assert_close(pruned.opacities, top)


def test_save_and_load_round_trip(tmp_path, posed: PixelAligned) -> None:
    model = pixel_aligned_tiny(
        **MICRO, sh_degree=0, gaussians_per_pixel=2, global_layers=[0], pose_free=True
    ).eval()
    model.save_pretrained(tmp_path / "model")
    config = json.loads((tmp_path / "model" / "config.json").read_text())
    arguments = set(inspect.signature(PixelAligned.__init__).parameters) - {"self"}
    assert arguments <= set(config), sorted(arguments - set(config))
    assert config["global_layers"] == [0] and config["gaussians_per_pixel"] == 2
    assert config["backbone_dim"] == 32 and config["pose_free"] is True

    loaded = PixelAligned.from_pretrained(tmp_path / "model").eval()
    state, loaded_state = model.state_dict(), loaded.state_dict()
    assert state.keys() == loaded_state.keys()
    for key in state:
        assert torch.equal(state[key], loaded_state[key]), key
    context = _context()
    with torch.no_grad():
        a, b = model(context), loaded(context)
    assert torch.equal(a.gaussians.means, b.gaussians.means)
    assert torch.equal(a.gaussians.harmonics, b.gaussians.harmonics)
    assert loaded.pose_free is True


def test_from_pretrained_does_not_refetch_backbone_weights(tmp_path) -> None:
    import timm
    from safetensors.torch import save_file

    reference = timm.create_model(
        "vit_small_patch14_dinov2",
        pretrained=False,
        embed_dim=32,
        depth=2,
        num_heads=2,
        patch_size=8,
        img_size=64,  # timm's name
        init_values=0.0,
        num_classes=0,
    )
    weights = tmp_path / "vit.safetensors"
    save_file(reference.state_dict(), str(weights))
    model = pixel_aligned_tiny(**MICRO, pretrained_backbone=f"file:{weights}")
    torch.testing.assert_close(
        model.backbone.blocks[1].attn.qkv.weight, reference.blocks[1].attn.qkv.weight
    )
    model.save_pretrained(tmp_path / "model")
    weights.unlink()  # loading the checkpoint must not need the backbone file any more
    loaded = PixelAligned.from_pretrained(tmp_path / "model")
    assert torch.equal(loaded.backbone.pos_embed, model.backbone.pos_embed)
    saved = json.loads((tmp_path / "model" / "config.json").read_text())
    assert saved["pretrained_backbone"] == f"file:{weights}"


def test_pose_free_ignores_extrinsics_and_anchors_view_zero_on_its_rays(
    pose_free: PixelAligned,
) -> None:
    context = _context(b=1, v=3)
    without = {k: v for k, v in context.items() if k != "extrinsics"}
    with torch.no_grad():
        a = pose_free(context)
        b = pose_free(without)
        c = pose_free({**context, "extrinsics": torch.eye(4).repeat(1, 3, 1, 1)})
    assert torch.equal(a.gaussians.means, b.gaussians.means)
    assert torch.equal(a.gaussians.means, c.gaussians.means)
    g = a.gaussians
    assert g.means.shape == (1, 3 * H * W, 3)
    # View 0 is the scene frame: its Gaussians project back near their own pixels.
    view0 = g.means[:, : H * W]
    uv, z = project(view0, torch.eye(4), context["intrinsics"][:, 0])
    offset_px = (uv - pixel_grid((H, W)).reshape(1, H * W, 2)) * torch.tensor([W, H])
    bound = pose_free.gaussian_head.placement.offset_bound
    assert offset_px.abs().max() <= 1.05 * bound * math.sqrt(2)
    depth0 = a.extras["depth"][:, 0].reshape(1, H * W)
    assert ((z - depth0).abs() / depth0).max() < 0.05
    extrinsics = a.extras["extrinsics"]
    assert extrinsics.shape == (1, 3, 4, 4)
    torch.testing.assert_close(extrinsics[:, 0], torch.eye(4)[None])
    torch.testing.assert_close(extrinsics[..., :3, :3].det(), torch.ones(1, 3), atol=1e-4, rtol=0)


def test_pose_free_forward_backward_without_intrinsics(pose_free: PixelAligned) -> None:
    model = noposplat_tiny(**MICRO, intrinsics_tokens=False)
    pred = model({"image": torch.rand(2, 2, 3, H, W)}, max_gaussians=500)
    assert pred.gaussians.count().tolist() == [500, 500]
    pred.gaussians.means.mean().backward()
    assert model.point_head[-1].weight.grad.abs().sum() > 0
    assert model.backbone.ref_embed.grad.abs().sum() > 0
    # Without intrinsics, the pose-free model assumes default_focal with a centred principal point.
    images = torch.rand(1, 2, 3, H, W)
    f = pose_free.default_focal
    assumed = torch.tensor([[f, 0.0, 0.5], [0.0, f, 0.5], [0.0, 0.0, 1.0]]).repeat(1, 2, 1, 1)
    with torch.no_grad():
        a = pose_free({"image": images}).gaussians.means
        b = pose_free({"image": images, "intrinsics": assumed}).gaussians.means
    assert torch.equal(a, b)


def test_rigid_umeyama_recovers_a_transform() -> None:
    source = torch.randn(2, 50, 3)
    transform = torch.eye(4).repeat(2, 1, 1)
    transform[0, :3, :3] = _rotation(torch.tensor([0.3, 0.2, 1.0]), 2.5)
    transform[1, :3, :3] = _rotation(torch.tensor([1.0, 0.0, 0.0]), -0.4)
    transform[:, :3, 3] = torch.tensor([[1.0, 2.0, 3.0], [-0.5, 0.0, 0.25]])
    target = source @ transform[:, :3, :3].transpose(1, 2) + transform[:, None, :3, 3]
    fitted = umeyama(source, target, scale=False).matrix()
    torch.testing.assert_close(fitted, transform, atol=1e-4, rtol=0)


def test_larger_sizes_build() -> None:
    with torch.device("meta"):
        small = pixel_aligned_small()
        base = pixel_aligned_base()
    assert small.backbone.embed_dim == 384 and small.backbone.patch_size == 14
    assert base.backbone.embed_dim == 768 and base.backbone.depth == 12
    assert sum(p.numel() for p in small.parameters()) < sum(p.numel() for p in base.parameters())
