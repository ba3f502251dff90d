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
# The first forward of the released size (625 M parameters) in a fresh process, 2 threads, on
# the shared 2-core machine, 2026-12-04 (docs/ports/noposplat.md, "Preflight estimate"):
# (views, H, W, wall seconds, seconds the process's threads waited for a CPU taken by other
# processes, from /proc/self/task/*/schedstat as bench/noposplat_speed.py reports it; None: not
# recorded).
MEASURED = [
    # a scratch script: noposplat_vitl with random weights, model(context) as the bench times it
    (2, 256, 256, 8.59, 0.1),
    (3, 256, 256, 10.63, 0.1),
    (2, 512, 512, 44.09, 19.7),
    (4, 256, 256, 21.92, 9.6),
    (2, 384, 384, 33.07, 21.2),
    (3, 256, 256, 26.86, 18.9),
    (2, 256, 256, 14.48, 6.7),
    (3, 256, 256, 10.4, 0.6),  # under torch.profiler
    (2, 256, 256, 8.76, None),  # infer.py on examples/drone_frames (timings_s.inference)
    # bench/noposplat_speed.py --one re10k_3views --weights <the deterministic file>
    (3, 256, 256, 11.2, 0.1),
    (3, 256, 256, 12.7, 0.1),
    (3, 256, 256, 11.6, 0.1),
    (3, 256, 256, 21.4, 13.0),
    (3, 256, 256, 12.5, 0.2),
]
# The runs other processes did not slow by more than half of their time (a run that waited
# longer measures the machine's load, not the model; the progress bar still runs then).
UNLOADED = [row for row in MEASURED if row[4] is None or row[4] <= row[3] / 2]


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


@pytest.mark.parametrize("views,height,width,seconds,waited", UNLOADED)
def test_forward_seconds_within_2x_of_measured(
    released, views: int, height: int, width: int, seconds: float, waited: float | None
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
