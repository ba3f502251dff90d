"""Deterministic weights for SplatWeaver-release parity fixtures, as a function of a key manifest.

Every element is an integer hash of the key name and the element index (no random stream), mapped
to ``[-1, 1)`` and scaled per kind of tensor so that the network stays numerically tame:
weight matrices by ``1 / sqrt(fan_in)``, LayerNorm weights around 1, LayerScale around 0.1,
biases and tokens small; the router's weights are 10x larger (its biases 10x smaller, the last
one centring the tiny configuration's logits on the fixed images) so that every expert gets
pixels. The camera head's last layer is small, with a bias such that its 4 iterations add up to
a plausible camera (identity rotation, ~57 degree fields of view). Tensors are returned in the
manifest's dtypes (bfloat16 where the release stores bfloat16).

The same function built the weights that the official code ran on (see the fixture README), so a
test can rebuild them bit for bit.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import torch

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "splatweaver_release"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_manifest(name: str) -> dict:
    """``tests/fixtures/splatweaver_release/manifest_<name>.json``."""
    return json.loads((FIXTURES / f"manifest_{name}.json").read_text())


def _unit(key: str, count: int) -> torch.Tensor:
    """``count`` float64 values in ``[-1, 1)``: a 32-bit integer hash of (key, index)."""
    seed = int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "little")
    h = torch.arange(count, dtype=torch.int64)
    h = (h * 2654435761 + seed) & 0xFFFFFFFF
    for multiplier in (0x45D9F3B, 0x45D9F3B):
        h = h ^ (h >> 16)
        h = (h * multiplier) & 0xFFFFFFFF
    h = h ^ (h >> 16)
    return h.double() / 2.0**31 - 1.0


def deterministic_tensor(key: str, shape: list[int]) -> torch.Tensor:
    """The float32 value of tensor ``key`` (before any dtype rounding)."""
    count = math.prod(shape)
    u = _unit(key, count).reshape(shape)
    leaf = key.rsplit(".", 1)[-1]
    if key.endswith("pose_branch.fc2.bias"):  # 4 iterations add up to ~(0, identity, 1 rad)
        base = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.25, 0.25, 0.25], dtype=torch.float64)
        value = base + 0.02 * u
    elif key.endswith("pose_branch.fc2.weight"):  # small updates: plausible cameras
        value = 0.1 * u / math.sqrt(shape[1])
    elif key.endswith("gs_moe.gating.2.bias"):  # centres the tiny router's logits
        base = torch.tensor([-0.8, 0.9, 0.05, -0.3], dtype=torch.float64)
        value = base + 0.002 * u
    elif leaf == "gamma":
        value = 0.1 + 0.05 * u
    elif len(shape) == 1 and leaf == "weight" and "norm" in key:
        value = 1.0 + 0.1 * u
    elif len(shape) >= 2 and leaf == "weight":
        value = u / math.sqrt(math.prod(shape[1:]))
        if ".gating." in key:  # the router: large enough that features, not biases, decide
            value = 10.0 * value
    elif leaf == "bias":
        value = (0.002 if ".gating." in key else 0.02) * u
    else:  # tokens, position embeddings
        value = 0.1 * u
    return value.float()


def deterministic_state(manifest: dict) -> dict[str, torch.Tensor]:
    """Every tensor of ``manifest["tensors"]`` in its stored dtype."""
    return {
        key: deterministic_tensor(key, entry["shape"]).to(DTYPES[entry["dtype"]])
        for key, entry in manifest["tensors"].items()
    }


def fixed_images(views: int, height: int, width: int) -> torch.Tensor:
    """Smooth colour gradients with a few sharp edges: ``[1, V, 3, H, W]`` in [0, 1], quantised
    to 8 bits (like decoded photos)."""
    y, x = torch.meshgrid(
        torch.linspace(0, 1, height, dtype=torch.float64),
        torch.linspace(0, 1, width, dtype=torch.float64),
        indexing="ij",
    )
    out = []
    for v in range(views):
        r = 0.5 + 0.4 * torch.sin(6.0 * x + 2.0 * v)
        g = 0.5 + 0.4 * torch.cos(5.0 * y - 1.5 * v)
        b = ((x * (7 + v) + y * 5).floor() % 2) * 0.6 + 0.2  # stripes: high frequency
        box = (x > 0.3 + 0.1 * v) & (x < 0.7) & (y > 0.25) & (y < 0.6)
        image = torch.stack([r, g, b]) * torch.where(box, 0.4, 1.0)
        out.append(image)
    images = torch.stack(out)[None].clamp(0, 1)
    return ((images * 255).round() / 255).float()
