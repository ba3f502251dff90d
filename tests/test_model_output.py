"""ModelOutput's typed fields and its read-only ``extras`` dict (DESIGN: ``pred.extras``)."""

from __future__ import annotations

import pytest
import torch
from data_fixtures import random_context

from models import create_model
from models.core.base import ModelOutput
from models.core.gaussians import Gaussians


def _gaussians(n: int = 4) -> Gaussians:
    return Gaussians(
        means=torch.zeros(1, n, 3),
        scales=torch.ones(1, n, 3),
        rotations=torch.tensor([1.0, 0, 0, 0]).expand(1, n, 4),
        opacities=torch.full((1, n), 0.5),
        harmonics=torch.zeros(1, n, 3, 1),
    )


def test_typed_fields_and_read_only_extras_view() -> None:
    g = _gaussians()
    depth = torch.rand(1, 2, 3, 3)
    out = ModelOutput(
        g,
        depth=depth,
        render_targets=[(1.0, g)],
        losses={"chamfer": torch.tensor(2.0)},
        diagnostics={"routing_map": torch.zeros(1, 2, 3, 3)},
    )
    assert out.depth is depth and out.extrinsics is None and out.gaussians_per_iteration is None
    assert set(out.extras) == {"depth", "render_targets", "loss/chamfer", "routing_map"}
    assert out.extras["depth"] is depth and float(out.extras["loss/chamfer"]) == 2.0
    with pytest.raises(TypeError):
        out.extras["depth"] = None  # read-only
    out.losses["routing"] = torch.tensor(1.0)  # the typed dicts are the mutable ones
    assert "loss/routing" in out.extras


def test_extras_is_not_a_constructor_argument() -> None:
    with pytest.raises(TypeError, match="extras"):
        ModelOutput(_gaussians(), extras={"depth": torch.ones(1)})
    out = ModelOutput(_gaussians())
    assert dict(out.extras) == {}  # nothing but the Gaussians
    with pytest.raises(AttributeError):
        out.extras = {}  # a property, not a field


@pytest.mark.parametrize("name", ["pixel_aligned_tiny", "resplat_tiny", "splatweaver_tiny"])
def test_families_fill_typed_fields(name: str) -> None:
    """Producers use the typed fields: depth everywhere, cameras for the pose-free one,
    per-iteration sets for the recurrent one, diagnostics for the router."""
    model = create_model(name).eval()
    context = random_context(model)
    with torch.no_grad():
        out = model(context)
    b, v, _, h, w = context["image"].shape
    assert out.depth is not None and out.depth.shape == (b, v, h, w)
    if name == "resplat_tiny":
        assert len(out.gaussians_per_iteration) >= 2  # the recipe weighs their renders
        assert out.gaussians is out.gaussians_per_iteration[-1]
    if name == "splatweaver_tiny":
        assert out.extrinsics.shape == (b, v, 4, 4) and out.intrinsics.shape == (b, v, 3, 3)
        assert "routing_map" in out.diagnostics and "routing_map" not in vars(out)
