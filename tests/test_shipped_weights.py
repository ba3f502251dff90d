"""The shipped weights predict the recorded Gaussians: bit for bit on the CPU kernel set of the
recording; on other kernels (AVX2, AVX-512, scalar) to the rounding they make, and ReSplat's final
set through its renders, where depth ties on the far plane reorder (``tests/shipped_reference.py``).
"""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file
from shipped_reference import (
    FIELDS,
    FIXTURE,
    RENDERED_IN_FORWARD,
    SHIPPED,
    fixed_context,
    machine,
    predict,
)

from models import Gaussians, render


def _recorded_machine() -> dict[str, str]:
    with safe_open(str(FIXTURE), framework="pt") as handle:
        return handle.metadata() or {}


def _context_renders(tensors: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    """``[1, V, 3, H, W]``: the set ``name`` rendered at the fixed context's cameras."""
    context = fixed_context()
    gaussians = Gaussians(**{field: tensors[f"{name}/{field}"] for field in FIELDS})
    size = tuple(context["image"].shape[-2:])
    return render(gaussians, context["extrinsics"], context["intrinsics"], size).color


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_gaussians_match_recording(name: str, one_thread) -> None:
    recorded = load_file(str(FIXTURE))
    same_kernels = _recorded_machine() == machine()
    now = predict(name)
    assert set(now) <= set(recorded), sorted(set(now) - set(recorded))
    for key in now:
        assert now[key].shape == recorded[key].shape, key
        difference = (now[key] - recorded[key]).abs().max().item()
        if same_kernels:
            assert torch.equal(now[key], recorded[key]), (
                f"{key}: max abs difference {difference:.3g}"
            )
        elif name in RENDERED_IN_FORWARD and not key.startswith(f"{name}/initial/"):
            continue  # compared below through its renders
        else:  # other CPU kernels round differently: the recording's machine is in its metadata
            torch.testing.assert_close(now[key], recorded[key], atol=1e-5, rtol=1e-5, msg=key)
    if name in RENDERED_IN_FORWARD and not same_kernels:
        # A reordered pair of equal-depth Gaussians moves a few pixels by up to ~1e-2 and the
        # rest by rounding (measured 1.4e-5 mean between AVX2 and scalar kernels); a changed
        # model moves every pixel by far more than 1e-4.
        error = (_context_renders(now, name) - _context_renders(recorded, name)).abs()
        assert error.mean().item() <= 1e-4, f"{name}: mean render difference {error.mean():.3g}"
        assert error.max().item() <= 0.05, f"{name}: max render difference {error.max():.3g}"
