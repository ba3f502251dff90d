"""The shared per-pixel trunk and depth head (models.layers.pixel_trunk, models.layers.depth_head):
the families that use it keep their state-dict layout, and its pieces compute what they say."""

import pytest
import torch
from torch import nn

from models import create_model
from models.layers.depth_head import (
    ConvHead,
    DepthRefinement,
    DepthSoftmaxHead,
    inverse_depth_to_depth,
)
from models.layers.pixel_trunk import PIXEL_TRUNK_PARTS, PixelTrunk


def test_depth_head_keys_and_expectation():
    """Same keys as the plain Sequential it replaces; the output is the softmax expectation of
    evenly spaced normalised inverse depths, per group of ``D`` logits."""
    torch.manual_seed(0)
    head = DepthSoftmaxHead(6, 5, depths=2, activation="gelu")
    plain = nn.Sequential(nn.Conv2d(6, 6, 3, padding=1), nn.GELU(), nn.Conv2d(6, 10, 1))
    assert head.state_dict().keys() == plain.state_dict().keys()
    plain.load_state_dict(head.state_dict())
    x = torch.randn(3, 6, 4, 5)
    logits = plain(x).reshape(3, 2, 5, 4, 5)
    prob = head.probabilities(x)
    assert torch.allclose(prob, logits.softmax(dim=2), atol=1e-6)
    assert torch.allclose(prob.sum(dim=2), torch.ones(3, 2, 4, 5), atol=1e-6)
    expected = (logits.softmax(dim=2) * torch.linspace(0, 1, 5).view(1, 1, 5, 1, 1)).sum(dim=2)
    assert torch.allclose(head(x), expected, atol=1e-6)
    with pytest.raises(ValueError, match="num_depth_candidates"):
        DepthSoftmaxHead(6, 1)
    with pytest.raises(ValueError, match="activation"):
        ConvHead(6, 2, activation="tanh")


def test_inverse_depth_to_depth_and_refinement():
    near = torch.tensor([[0.5, 1.0]])
    far = torch.tensor([[10.0, 100.0]])
    # [BV=2, G=1, 2, 2]: view 0 at t = 0 (far), view 1 at t = 1 (near)
    t = torch.stack([torch.zeros(1, 2, 2), torch.ones(1, 2, 2)])
    depth = inverse_depth_to_depth(t, near, far)  # [1, 2, 1, 2, 2]
    assert torch.allclose(depth[0, 0], torch.full((1, 2, 2), 10.0))
    assert torch.allclose(depth[0, 1], torch.full((1, 2, 2), 1.0))
    mid = inverse_depth_to_depth(torch.full((2, 1, 1, 1), 0.5), near, far)
    assert torch.allclose(mid.flatten(), 1 / (0.5 / far + 0.5 / near).flatten())
    refine = DepthRefinement(4, 8, depths=1)
    t = torch.rand(2, 1, 3, 3) * 0.9 + 0.05
    assert torch.allclose(refine(torch.randn(2, 4, 3, 3), t), t, atol=1e-6)  # starts as identity


@pytest.mark.parametrize(
    "name, kwargs, parts",
    [
        ("pixel_aligned_tiny", {}, ("backbone", "dpt", "depth_head", "depth_refine")),
        ("noposplat_tiny", {}, PIXEL_TRUNK_PARTS),
        ("splatweaver_tiny", {}, PIXEL_TRUNK_PARTS),
        (
            "splatweaver_tiny",
            {"pose_free": False},
            ("backbone", "dpt", "depth_head", "depth_refine"),
        ),
    ],
)
def test_families_register_the_trunk_parts_flat(name, kwargs, parts):
    """The trunk's parts are the host's own children (flat keys ``backbone.*``, ...)."""
    model = create_model(name, **kwargs)
    assert isinstance(model, PixelTrunk)
    assert tuple(model.pixel_trunk_modules()) == parts
    children = dict(model.named_children())
    for part in parts:
        assert children[part] is getattr(model, part)
        assert any(key.startswith(f"{part}.") for key in model.state_dict())
    assert not any(key.startswith("trunk") for key in model.state_dict())


def test_pose_free_trunks_are_interchangeable():
    """A pose-free pixel-aligned model and SplatWeaver build the same trunk (same keys and
    shapes), so one starts the other (SplatWeaver's ``init_checkpoint``)."""
    pixel = create_model("noposplat_tiny", intrinsics_tokens=False)
    weaver = create_model("splatweaver_tiny")
    a = {
        n: {k: v.shape for k, v in m.state_dict().items()}
        for n, m in pixel.pixel_trunk_modules().items()
    }
    b = {
        n: {k: v.shape for k, v in m.state_dict().items()}
        for n, m in weaver.pixel_trunk_modules().items()
    }
    assert a == b


def test_resplat_initial_model_uses_the_trunk():
    model = create_model("resplat_tiny")
    init = model.init_model
    assert isinstance(init, PixelTrunk)
    assert init.depth_refine is None and init.point_head is None
    assert isinstance(init.depth_head[1], nn.GELU)  # ReSplat's depth head activation
    names = [name for name, _ in init.named_children()]
    assert names[:4] == ["backbone", "dpt", "fuse", "depth_head"]  # construction order kept
