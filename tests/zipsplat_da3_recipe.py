"""The recipe of the ZipSplat (DA3) parity fixtures: deterministic weights as a function of a key
manifest, fixed inputs and the cases. The fixture files in ``tests/fixtures/zipsplat_da3/`` were
produced by running the official code (outside this repository) on exactly these weights and
inputs; ``tests/test_zipsplat_da3.py`` rebuilds both and compares this project's port.

Weights: element ``i`` of tensor ``key`` is an integer hash of ``crc32(key)`` and ``i`` mapped to
``u`` in ``[-1, 1)`` (no random-number stream), then scaled by the tensor's role: LayerNorm
weights ``1 + 0.1 u``, LayerScale ``0.1 u``, biases ``0.02 u``, token/position embeddings
``0.5 u``, other weights ``u / sqrt(fan_in)``.
"""

from __future__ import annotations

import json
import math
import zlib
from pathlib import Path

import torch
from torch import Tensor

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "zipsplat_da3"
SIZES = {"s": "small", "b": "base", "l": "large", "g": "giant"}

# name -> (size letter, views, height, width, compression, camera prior)
CASES: dict[str, tuple[str, int, int, int, float, bool]] = {
    "s_v2_252_r1": ("s", 2, 252, 252, 1.0, False),
    "s_v3_252_r025": ("s", 3, 252, 252, 0.25, False),
    "s_v2_168x224_r05": ("s", 2, 168, 224, 0.5, False),
    "s_v2_252_r1_prior": ("s", 2, 252, 252, 1.0, True),
    "g_v2_252_r1": ("g", 2, 252, 252, 1.0, False),
    "g_v2_252_r025": ("g", 2, 252, 252, 0.25, False),
}
# Every SAMPLE_STRIDE-th Gaussian of the official output is stored.
SAMPLE_STRIDE = {"s": 7, "g": 29}


def load_manifest(size: str) -> dict:
    """The key manifest of ZipSplat's ``da3<size>`` configuration."""
    return json.loads((FIXTURES / f"manifest_da3{size}.json").read_text())


def _unit_hash(key: str, count: int) -> Tensor:
    """``count`` float32 values in ``[-1, 1)``, a pure function of ``key`` and the index."""
    index = torch.arange(count, dtype=torch.int64)
    x = (index * 2654435761 + zlib.crc32(key.encode())) % 4294967296
    x = x ^ (x >> 16)
    x = (x * 73244475) % 4294967296
    x = x ^ (x >> 16)
    x = (x * 73244475) % 4294967296
    x = x ^ (x >> 16)
    return (x.to(torch.float64) / 2147483648.0 - 1.0).to(torch.float32)


def deterministic_tensor(key: str, shape: list[int]) -> Tensor:
    """The fixture value of official tensor ``key`` with ``shape``."""
    u = _unit_hash(key, math.prod(shape)).reshape(shape)
    name = key.rsplit(".", 1)[-1]
    if key.endswith(("pos_embed", "cls_token", "camera_token")):
        return 0.5 * u
    if name == "gamma":
        return 0.1 * u
    if name == "bias":
        return 0.02 * u
    if len(shape) == 1:  # LayerNorm weights
        return 1.0 + 0.1 * u
    fan_in = math.prod(shape[1:])
    return u / math.sqrt(fan_in)


def deterministic_state_dict(manifest: dict) -> dict[str, Tensor]:
    """Official-format state dict (official key names) of a manifest."""
    return {k: deterministic_tensor(k, v["shape"]) for k, v in sorted(manifest["keys"].items())}


def release_container(state: dict[str, Tensor], size: str) -> dict:
    """The release's ``.tar`` layout around a state dict (``conf`` abridged to the backbone)."""
    manifest = load_manifest(size)
    return {
        "model": state,
        "conf": {"model": {"backbone": manifest["config"]}},
        "epoch": 0,
        "eval": {},
    }


def fixture_images(views: int, height: int, width: int) -> Tensor:
    """``[1, V, 3, H, W]`` smooth coloured patterns in [0, 1], different per view."""
    y = torch.linspace(0.0, 1.0, height, dtype=torch.float64)[:, None]
    x = torch.linspace(0.0, 1.0, width, dtype=torch.float64)[None, :]
    out = torch.empty(1, views, 3, height, width, dtype=torch.float64)
    for v in range(views):
        for c in range(3):
            fx, fy = 1.0 + 0.7 * c + 0.3 * v, 2.0 - 0.4 * c + 0.5 * v
            phase = 0.9 * v + 1.7 * c
            wave = torch.sin(2 * math.pi * (fx * x + fy * y) + phase)
            ring = torch.cos(6.0 * ((x - 0.3 - 0.1 * v) ** 2 + (y - 0.6) ** 2).sqrt() + c)
            out[0, v, c] = 0.5 + 0.3 * wave + 0.15 * ring
    return out.clamp(0.0, 1.0).to(torch.float32)


def fixture_cameras(views: int) -> tuple[Tensor, Tensor]:
    """Camera-to-world ``[1, V, 4, 4]`` (view 0 identity) and normalised intrinsics."""
    extrinsics = torch.eye(4, dtype=torch.float64).repeat(1, views, 1, 1)
    for v in range(1, views):
        angle = 0.08 * v
        c, s = math.cos(angle), math.sin(angle)
        extrinsics[0, v, :3, :3] = torch.tensor(
            [[c, 0.0, s], [0.0, 1.0, 0.0], [-s, 0.0, c]], dtype=torch.float64
        )
        extrinsics[0, v, :3, 3] = torch.tensor([0.3 * v, -0.05 * v, 0.1 * v])
    intrinsics = torch.tensor(
        [[0.9, 0.0, 0.5], [0.0, 0.95, 0.5], [0.0, 0.0, 1.0]], dtype=torch.float64
    ).repeat(1, views, 1, 1)
    return extrinsics.float(), intrinsics.float()
