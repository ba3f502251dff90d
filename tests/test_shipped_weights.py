"""The shipped weights predict exactly the recorded Gaussians (``tests/shipped_reference.py``)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file
from shipped_reference import FIELDS, FIXTURE, SHIPPED, predict


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_gaussians_bit_identical(name: str, one_thread) -> None:
    recorded = load_file(str(FIXTURE))
    now = predict(name)
    for field in FIELDS:
        key = f"{name}/{field}"
        assert now[key].shape == recorded[key].shape, key
        difference = (now[key] - recorded[key]).abs().max().item()
        assert torch.equal(now[key], recorded[key]), f"{key}: max abs difference {difference:.3g}"
