"""Reading the chunk dataset format (pixelSplat's RE10K/ACID release, also used for DL3DV).

Layout: ``ROOT/{train,test}/NNNNNN.torch``, each a ``torch.save``d list of scene dicts, plus
``ROOT/{split}/index.json`` mapping scene key -> chunk file name. A scene dict holds:

- ``key``: str, ``url``: str,
- ``timestamps``: int64 ``[N]``,
- ``cameras``: float32 ``[N, 18]``: ``fx/W, fy/H, cx/W, cy/H, 0, 0`` then the world-to-camera
  3x4 matrix, row-major,
- ``images``: list of N uint8 tensors holding encoded JPEG/PNG bytes,
- optional ground-truth depth (written by ``datamodules.synthetic``): ``depths``, a list of N uint8
  tensors holding 16-bit grayscale PNG bytes, and ``depth_scale``, a float: z-depth in world units
  is ``png_value * depth_scale``; the value 0 means "no depth" (decoded as 0).

Chunks are read with ``torch.load(..., weights_only=True)``: a file that needs arbitrary
unpickling is refused with a ``InputError`` and never executed.
"""

from __future__ import annotations

import io
import json
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch import Tensor

from datamodules.errors import InputError

__all__ = [
    "CHUNK_SUFFIX",
    "load_index",
    "load_chunk",
    "decode_image",
    "encode_depths",
    "decode_depth",
    "cameras_to_matrices",
    "matrices_to_cameras",
    "read_json",
    "read_scene",
    "split_dir",
]

CHUNK_SUFFIX = ".torch"
DEPTH_MAX = 65535


def split_dir(root: str | Path, split: str) -> Path:
    """``ROOT/split``, checking that the root exists."""
    root = Path(root)
    if not root.is_dir():
        raise InputError(f"{root}: dataset root not found")
    return root / split


def read_json(path: str | Path, what: str, encoding: str = "utf-8") -> Any:
    """The JSON document in ``path``.

    Raises:
        InputError: ``<path>: unreadable <what> (<reason>)`` for a file that cannot be read, is
            not text in ``encoding`` or is not JSON.
    """
    try:
        with open(path, encoding=encoding) as handle:
            return json.load(handle)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise InputError(f"{path}: unreadable {what} ({error})") from error


def load_index(root: str | Path, split: str) -> dict[str, str]:
    """Read ``ROOT/split/index.json`` (scene key -> chunk file name).

    Raises:
        InputError: missing root or index, malformed JSON, or an empty split.
    """
    path = split_dir(root, split) / "index.json"
    if not path.is_file():
        raise InputError(f"{path}: missing index.json (not a chunk dataset split)")
    index = read_json(path, "index.json")
    if not isinstance(index, dict) or not all(isinstance(v, str) for v in index.values()):
        raise InputError(f"{path}: index.json must map scene keys to chunk file names")
    if not index:
        raise InputError(f"{path}: split '{split}' is empty (index.json lists no scenes)")
    return index


def load_chunk(path: str | Path) -> list[dict]:
    """Load one chunk file safely (``weights_only=True``).

    Raises:
        InputError: the file is missing, corrupt, needs arbitrary unpickling, or is not a list of
            scene dicts.
    """
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: chunk file not found")
    try:
        chunk = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else "unpickling error"
        if "weights_only" in str(error) or "Unsupported global" in str(error):
            reason = "it needs arbitrary unpickling, which weights_only=True forbids"
        raise InputError(f"{path}: refused to load chunk: {reason}") from error
    except (RuntimeError, OSError, EOFError, ValueError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise InputError(f"{path}: corrupt chunk file ({first})") from error
    if not isinstance(chunk, list) or not all(isinstance(s, dict) and "key" in s for s in chunk):
        raise InputError(f"{path}: not a chunk (expected a list of scene dicts with a 'key')")
    return chunk


def decode_image(data: Tensor) -> Image.Image:
    """Decode encoded JPEG/PNG bytes (a uint8 tensor) into an RGB PIL image.

    Raises:
        ValueError: the bytes are not a decodable image.
    """
    try:
        image = Image.open(io.BytesIO(data.numpy().tobytes()))
        image.load()
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as error:
        raise ValueError(f"undecodable image ({error})") from error
    if image.mode != "RGB":
        image = image.convert("RGB")
    return image


def encode_depths(depths: np.ndarray) -> tuple[list[bytes], float]:
    """Encode ``[V, H, W]`` depth maps with one shared scale (the largest depth)."""
    depths = np.asarray(depths, dtype=np.float64)
    valid = np.isfinite(depths) & (depths > 0)
    top = float(depths[valid].max()) if valid.any() else 1.0
    scale = top / (DEPTH_MAX - 1)
    encoded = []
    for depth, ok in zip(depths, valid):
        quantised = np.zeros(depth.shape, dtype=np.uint16)
        quantised[ok] = np.clip(np.round(depth[ok] / scale), 1, DEPTH_MAX).astype(np.uint16)
        buffer = io.BytesIO()
        Image.fromarray(quantised).save(buffer, format="PNG", compress_level=6)
        encoded.append(buffer.getvalue())
    return encoded, scale


def decode_depth(data: Tensor, scale: float) -> Tensor:
    """Decode 16-bit PNG depth bytes into a float32 z-depth map ``[H, W]`` (0 = no depth).

    Raises:
        ValueError: the bytes are not a decodable PNG.
    """
    try:
        image = Image.open(io.BytesIO(data.numpy().tobytes()))
        array = np.asarray(image).astype(np.float32)
    except (OSError, SyntaxError, ValueError) as error:
        raise ValueError(f"undecodable depth map ({error})") from error
    if array.ndim != 2:
        raise ValueError(f"depth map must be single-channel, got shape {array.shape}")
    return torch.from_numpy(array * np.float32(scale))


def cameras_to_matrices(cameras: Tensor) -> tuple[Tensor, Tensor]:
    """Parse 18-number camera rows.

    Args:
        cameras: ``[N, 18]`` rows (normalised intrinsics, then world-to-camera 3x4 row-major).

    Returns:
        Camera-to-world extrinsics ``[N, 4, 4]`` and normalised intrinsics ``[N, 3, 3]``, float32.
    """
    rows = cameras.to(torch.float64)
    n = rows.shape[0]
    intrinsics = torch.zeros(n, 3, 3, dtype=torch.float64)
    intrinsics[:, 0, 0] = rows[:, 0]
    intrinsics[:, 1, 1] = rows[:, 1]
    intrinsics[:, 0, 2] = rows[:, 2]
    intrinsics[:, 1, 2] = rows[:, 3]
    intrinsics[:, 2, 2] = 1.0
    w2c = torch.eye(4, dtype=torch.float64).repeat(n, 1, 1)  # [N, 4, 4]
    w2c[:, :3, :4] = rows[:, 6:18].reshape(n, 3, 4)
    c2w = torch.linalg.inv(w2c)
    return c2w.to(torch.float32), intrinsics.to(torch.float32)


def matrices_to_cameras(extrinsics: Tensor, intrinsics: Tensor) -> Tensor:
    """Camera-to-world ``[N, 4, 4]`` and normalised intrinsics ``[N, 3, 3]`` to rows ``[N, 18]``."""
    w2c = torch.linalg.inv(extrinsics.to(torch.float64))  # [N, 4, 4]
    k = intrinsics.to(torch.float64)
    head = torch.stack([k[:, 0, 0], k[:, 1, 1], k[:, 0, 2], k[:, 1, 2]], dim=-1)  # [N, 4]
    zeros = torch.zeros_like(head[:, :2])
    rows = torch.cat([head, zeros, w2c[:, :3, :4].reshape(-1, 12)], dim=-1)
    return rows.to(torch.float32)


def find_scene(root: str | Path, split: str, key: str) -> tuple[Path, dict]:
    """Locate and load one scene dict through ``index.json``.

    Raises:
        InputError: the key is not in the index or not in its chunk.
    """
    index = load_index(root, split)
    if key not in index:
        raise InputError(f"{Path(root) / split / 'index.json'}: no scene with key {key!r}")
    path = Path(root) / split / index[key]
    for scene in load_chunk(path):
        if scene["key"] == key:
            return path, scene
    raise InputError(f"{path}: scene {key!r} listed in index.json is not in the chunk")


def read_scene(root: str | Path, split: str, key: str) -> dict:
    """One scene of a chunk dataset: all views, no resizing, no normalisation.

    Args:
        root: dataset root (holding ``train/`` and ``test/``).
        split: split name.
        key: scene key.

    Returns:
        ``image [V, 3, H, W]`` float in [0, 1], ``extrinsics [V, 4, 4]`` camera-to-world,
        ``intrinsics [V, 3, 3]`` normalised, ``timestamps [V]``, ``depth [V, H, W]`` when stored,
        ``key`` and ``url``.

    Raises:
        InputError: missing files, unknown key, or an undecodable image (naming the chunk).
    """
    path, scene = find_scene(root, split, key)
    extrinsics, intrinsics = cameras_to_matrices(scene["cameras"])
    images = []
    for i, data in enumerate(scene["images"]):
        try:
            image = decode_image(data)
        except ValueError as error:
            raise InputError(f"{path}: scene {key!r} view {i}: {error}") from error
        images.append(torch.from_numpy(np.asarray(image).copy()).permute(2, 0, 1))
    out = {
        "image": torch.stack(images).float() / 255.0,  # [V, 3, H, W]
        "extrinsics": extrinsics,
        "intrinsics": intrinsics,
        "timestamps": scene["timestamps"],
        "key": key,
        "url": scene.get("url", ""),
    }
    if "depths" in scene:
        try:
            out["depth"] = torch.stack(
                [decode_depth(d, float(scene["depth_scale"])) for d in scene["depths"]]
            )
        except ValueError as error:
            raise InputError(f"{path}: scene {key!r}: {error}") from error
    return out
