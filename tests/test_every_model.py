"""Every tiny registered model (the families' own and the ports' test sizes, a new family's
included without editing this file) builds, predicts valid Gaussians from a fixed context, and
those render to finite images with gradients reaching the model."""

from __future__ import annotations

import pytest
import torch
from shipped_reference import fixed_context

from models import create_model, list_models, render


def _side(model: torch.nn.Module, wanted: int = 64) -> int:
    """A side near ``wanted`` that the model's patch size divides (VGGT's trunk: 14)."""
    patch = int(getattr(model, "patch_size", 1) or 1)
    return max(patch, wanted // patch * patch)


@pytest.mark.parametrize("name", list_models("*_tiny"))
def test_tiny_model_predicts_renderable_gaussians(name: str, one_thread) -> None:
    torch.manual_seed(0)
    model = create_model(name)
    views = max(2, int(getattr(model, "min_views", 1)))
    context = fixed_context(views=views, size=_side(model))
    output = model.eval()(context)
    gaussians = output.gaussians
    gaussians.validate(name)
    assert gaussians.batch_size == 1 and int(gaussians.count()[0]) > 0
    for field in ("means", "scales", "rotations", "opacities", "harmonics"):
        assert torch.isfinite(getattr(gaussians, field)).all(), field
    # A camera that sees every Gaussian (an untrained model's free means go anywhere): on the
    # -z side of them at three times their extent, looking along +z, 90 degrees wide.
    extent = float(gaussians.means.detach().abs().max()) + 1e-3
    camera = torch.eye(4)[None, None].clone()  # [1, 1, 4, 4]
    camera[0, 0, 2, 3] = -3.0 * extent
    intrinsics = torch.tensor([[0.5, 0.0, 0.5], [0.0, 0.5, 0.5], [0.0, 0.0, 1.0]])[None, None]
    rendered = render(gaussians, camera, intrinsics, (24, 24), backend="torch", far=1e6)
    assert rendered.color.shape == (1, 1, 3, 24, 24)
    assert torch.isfinite(rendered.color).all() and rendered.alpha.max() > 0
    loss = rendered.color.mean() + rendered.alpha.mean()
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and any(bool(g.abs().sum() > 0) for g in grads), "no gradient reached the model"
