"""The one conversion between 8-bit pixels ``[..., H, W, 3]`` (files, viewers, videos) and the
project's float images ``[..., 3, H, W]`` in [0, 1] (rounded to nearest on the way out). A utility
of the lowest layer: the readers, the inference library and the commands all use it."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

__all__ = ["image_from_uint8", "image_to_uint8"]


def image_from_uint8(pixels) -> Tensor:
    """8-bit pixels ``[..., H, W, 3]`` (an array, a tensor or a PIL image) → float32
    ``[..., 3, H, W]`` in [0, 1]."""
    array = torch.as_tensor(np.array(pixels, dtype=np.uint8, copy=True))
    return array.movedim(-1, -3).float() / 255.0


def image_to_uint8(image: Tensor) -> np.ndarray:
    """Float ``[..., 3, H, W]`` in [0, 1] (clamped) → 8-bit ``[..., H, W, 3]`` (a NumPy array)."""
    pixels = (image.detach().float().clamp(0, 1) * 255 + 0.5).to(torch.uint8)
    return pixels.movedim(-3, -1).cpu().numpy()
