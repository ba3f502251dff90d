"""Geometric image transforms that keep cameras consistent.

- ``resize_crop_image``: scale so the image covers the target shape, then centre-crop; returns the
  3x3 matrix that maps normalised intrinsics of the source to those of the output
  (``K_out = A @ K_in``). A pure resize does not change normalised intrinsics (pixel centres sit at
  ``(i + 0.5) / W`` at every resolution); the crop does.
- ``flip_views``: horizontal flip of images with the matching mirror of the world (x -> -x in every
  camera frame), so multi-view geometry stays consistent.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import Tensor

from models.core.pixels import image_from_uint8

__all__ = [
    "cover_shape",
    "crop_transform",
    "resize_crop_image",
    "resize_crop_depth",
    "flip_views",
]


def cover_shape(in_shape: tuple[int, int], out_shape: tuple[int, int]) -> tuple[int, int]:
    """Smallest ``(H, W)`` with the input's aspect ratio that covers ``out_shape``."""
    h_in, w_in = in_shape
    h_out, w_out = out_shape
    scale = max(h_out / h_in, w_out / w_in)
    return max(h_out, round(h_in * scale)), max(w_out, round(w_in * scale))


def crop_transform(
    scaled_shape: tuple[int, int], out_shape: tuple[int, int]
) -> tuple[Tensor, int, int]:
    """Centre-crop offsets and the normalised-intrinsics transform of a crop.

    Args:
        scaled_shape: ``(H, W)`` of the (resized) image before cropping.
        out_shape: ``(H, W)`` after cropping.

    Returns:
        ``A [3, 3]`` with ``K_out = A @ K_in`` for normalised intrinsics, and the crop's
        ``top`` and ``left`` offsets in pixels.
    """
    h_s, w_s = scaled_shape
    h_out, w_out = out_shape
    top, left = (h_s - h_out) // 2, (w_s - w_out) // 2
    a = torch.tensor(
        [
            [w_s / w_out, 0.0, -left / w_out],
            [0.0, h_s / h_out, -top / h_out],
            [0.0, 0.0, 1.0],
        ],
        dtype=torch.float32,
    )
    return a, top, left


def resize_crop_image(
    image: Image.Image, out_shape: tuple[int, int] | None
) -> tuple[Tensor, Tensor]:
    """Resize (Lanczos) so the image covers ``out_shape``, then centre-crop.

    Args:
        image: an RGB PIL image.
        out_shape: ``(H, W)``, or None to keep the image as it is.

    Returns:
        The image ``[3, H, W]`` float in [0, 1] and ``A [3, 3]`` (``K_out = A @ K_in``).
    """
    if image.mode != "RGB":
        image = image.convert("RGB")
    in_shape = (image.height, image.width)
    if out_shape is None or tuple(out_shape) == in_shape:
        return image_from_uint8(image), torch.eye(3)
    scaled = cover_shape(in_shape, tuple(out_shape))
    if scaled != in_shape:
        image = image.resize((scaled[1], scaled[0]), Image.Resampling.LANCZOS)
    a, top, left = crop_transform(scaled, tuple(out_shape))
    array = np.asarray(image)[top : top + out_shape[0], left : left + out_shape[1]]
    return image_from_uint8(array), a


def resize_crop_depth(depth: Tensor, out_shape: tuple[int, int] | None) -> Tensor:
    """Nearest-neighbour resize + centre crop of a depth map, matching ``resize_crop_image``.

    Args:
        depth: ``[H, W]``.
        out_shape: ``(H, W)`` or None.

    Returns:
        ``[H_out, W_out]``.
    """
    in_shape = tuple(depth.shape[-2:])
    if out_shape is None or tuple(out_shape) == in_shape:
        return depth
    scaled = cover_shape(in_shape, tuple(out_shape))
    if scaled != in_shape:
        depth = F.interpolate(depth[None, None], size=scaled, mode="nearest-exact")[0, 0]
    _, top, left = crop_transform(scaled, tuple(out_shape))
    return depth[top : top + out_shape[0], left : left + out_shape[1]]


_MIRROR = torch.diag(torch.tensor([-1.0, 1.0, 1.0, 1.0]))


def flip_views(views: dict) -> dict:
    """Flip a set of views horizontally and mirror the world to match.

    Images (and depth) are flipped left-right; every camera-to-world matrix ``E`` becomes
    ``M E M`` with ``M = diag(-1, 1, 1, 1)`` (the world mirrored in x and each camera's x axis
    negated), and normalised intrinsics get ``cx -> 1 - cx`` and negated skew. Depth is unchanged,
    so unprojecting flipped depth through flipped cameras gives the mirrored points.

    Args:
        views: dict with ``image [V, 3, H, W]``, ``extrinsics [V, 4, 4]``, ``intrinsics [V, 3, 3]``
            and optionally ``depth [V, H, W]``; other entries are copied.

    Returns:
        A new dict.
    """
    out = dict(views)
    out["image"] = views["image"].flip(-1)
    if "depth" in views:
        out["depth"] = views["depth"].flip(-1)
    mirror = _MIRROR.to(views["extrinsics"])
    out["extrinsics"] = mirror @ views["extrinsics"] @ mirror
    intrinsics = views["intrinsics"].clone()
    intrinsics[..., 0, 2] = 1.0 - intrinsics[..., 0, 2]
    intrinsics[..., 0, 1] = -intrinsics[..., 0, 1]
    out["intrinsics"] = intrinsics
    return out
