"""Deterministic DepthSplat weights and inputs for the official-parity fixtures.

Everything here is a closed-form function of a key manifest (``fixtures/depthsplat/manifest_*``)
and of integers, so the test can rebuild exactly what was fed to the official code when the
fixtures were recorded (``fixtures/depthsplat/README.md``):

- ``manifest_weights``: each tensor from an integer hash of ``(key, element index)``
  (murmur3's finaliser, 32-bit arithmetic, no RNG stream), scaled like a sensible init:
  matrices/kernels uniform in ``±sqrt(3 / fan_in)``; 1-D ``.weight`` (norm scales)
  ``1 ± 0.1``; biases ``±0.05``; LayerScale ``gamma`` ``0.1 ± 0.05``; ``pos_embed``/``cls_token``
  ``±0.1``; BN ``running_var`` in ``[0.5, 1.5)``, ``running_mean`` ``±0.1``.
- ``make_context``: images ``0.5 + 0.3 sin(...) + 0.15 cos(...)``, cameras on a gentle curve
  looking down +z, normalised intrinsics with a focal of 0.85 image widths.
"""

from __future__ import annotations

import json
import math
import zlib
from pathlib import Path

import torch
from torch import Tensor

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "depthsplat"
RECIPE_VERSION = 1

_MASK = 0xFFFFFFFF


def _mul32(x: Tensor, c: int) -> Tensor:
    """``(x * c) mod 2^32`` for ``x < 2^32`` held in int64, without overflowing."""
    lo, hi = c & 0xFFFF, c >> 16
    return (x * lo + (((x * hi) & 0xFFFF) << 16)) & _MASK


def hashed_uniform(key: str, numel: int) -> Tensor:
    """``numel`` float64 values in ``[0, 1)`` from ``(crc32(key), index)``."""
    seed = zlib.crc32(key.encode("utf-8"))
    x = torch.arange(numel, dtype=torch.int64)
    x = (_mul32(x, 0x9E3779B1) + _mul32(torch.tensor(seed, dtype=torch.int64), 0x85EBCA77)) & _MASK
    x = x ^ (x >> 16)
    x = _mul32(x, 0x85EBCA6B)
    x = x ^ (x >> 13)
    x = _mul32(x, 0xC2B2AE35)
    x = x ^ (x >> 16)
    return x.to(torch.float64) / 2.0**32


def deterministic_tensor(key: str, shape: list[int], dtype: str = "float32") -> Tensor:
    """The tensor ``key`` of the recipe above."""
    numel = math.prod(shape)
    if dtype.startswith("int"):
        return torch.zeros(shape, dtype=getattr(torch, dtype))
    u = hashed_uniform(key, numel)
    s = 2 * u - 1  # [-1, 1)
    name = key.rsplit(".", 1)[-1]
    if name == "running_var":
        values = 0.5 + u
    elif name == "running_mean":
        values = 0.1 * s
    elif name == "gamma":
        values = 0.1 + 0.05 * s
    elif name in ("pos_embed", "cls_token", "mask_token", "register_tokens"):
        values = 0.1 * s
    elif len(shape) >= 2:
        fan_in = max(1, math.prod(shape[1:]))
        values = math.sqrt(3.0 / fan_in) * s
    elif name == "weight":
        values = 1.0 + 0.1 * s
    else:
        values = 0.05 * s
    return values.to(getattr(torch, dtype)).reshape(shape)


def load_manifest(config: str) -> dict:
    return json.loads((FIXTURES / f"manifest_{config}.json").read_text())


def manifest_weights(manifest: dict) -> dict:
    """The release container ``{'state_dict': {key: tensor}}`` for a manifest."""
    state = {
        key: deterministic_tensor(key, spec["shape"], spec["dtype"])
        for key, spec in manifest["keys"].items()
    }
    return {manifest["container"]["state_dict_key"]: state}


def _rotation_y(degrees: float) -> Tensor:
    a = math.radians(degrees)
    c, s = math.cos(a), math.sin(a)
    return torch.tensor([[c, 0.0, s], [0.0, 1.0, 0.0], [-s, 0.0, c]], dtype=torch.float64)


def make_context(height: int, width: int, views: int, near: float = 0.5, far: float = 100.0):
    """The fixed input of the parity fixtures (batch 1), float32, in the project's conventions."""
    ys = (torch.arange(height, dtype=torch.float64) + 0.5) / height
    xs = (torch.arange(width, dtype=torch.float64) + 0.5) / width
    y, x = torch.meshgrid(ys, xs, indexing="ij")
    images = torch.empty(1, views, 3, height, width, dtype=torch.float64)
    for v in range(views):
        for c in range(3):
            phase = 2 * math.pi * (3 * (c + 1) * x + 2 * (v + 1) * y) + c
            images[0, v, c] = (
                0.5 + 0.3 * torch.sin(phase) + 0.15 * torch.cos(2 * math.pi * (5 * x * y + 0.3 * v))
            )
    extrinsics = torch.eye(4, dtype=torch.float64).repeat(1, views, 1, 1)
    for v in range(views):
        extrinsics[0, v, :3, :3] = _rotation_y(-4.0 * v)
        extrinsics[0, v, :3, 3] = torch.tensor([0.25 * v + 0.03 * v * v, 0.02 * v * v, 0.05 * v])
    intrinsics = torch.eye(3, dtype=torch.float64).repeat(1, views, 1, 1)
    intrinsics[..., 0, 0] = 0.85
    intrinsics[..., 1, 1] = 0.85 * width / height
    intrinsics[..., 0, 2] = 0.5
    intrinsics[..., 1, 2] = 0.5
    return {
        "image": images.float(),
        "extrinsics": extrinsics.float(),
        "intrinsics": intrinsics.float(),
        "near": torch.full((1, views), near),
        "far": torch.full((1, views), far),
    }


def sample_index(count: int, samples: int = 2048) -> Tensor:
    """Fixed Gaussian indices recorded in the fixtures: every ``count // samples``-th."""
    step = max(1, count // samples)
    return torch.arange(0, count, step)[:samples]
