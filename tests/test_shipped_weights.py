"""The shipped weights predict the recorded Gaussians: bit for bit on the CPU kernel set of the
recording, to 1e-5 on other kernels (``tests/shipped_reference.py``)."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file
from shipped_reference import FIELDS, FIXTURE, SHIPPED, machine, predict


def _recorded_machine() -> dict[str, str]:
    with safe_open(str(FIXTURE), framework="pt") as handle:
        return handle.metadata() or {}


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_gaussians_bit_identical(name: str, one_thread) -> None:
    recorded = load_file(str(FIXTURE))
    same_kernels = _recorded_machine() == machine()
    now = predict(name)
    for field in FIELDS:
        key = f"{name}/{field}"
        assert now[key].shape == recorded[key].shape, key
        difference = (now[key] - recorded[key]).abs().max().item()
        if same_kernels:
            assert torch.equal(now[key], recorded[key]), (
                f"{key}: max abs difference {difference:.3g}"
            )
        else:  # other CPU kernels round differently: the recording's machine is in its metadata
            assert difference <= 1e-5, f"{key}: max abs difference {difference:.3g}"
