"""Writing the chunk dataset format (pixelSplat's RE10K/ACID release layout).

``ROOT/{split}/NNNNNN.torch`` files, each a ``torch.save``d list of scene dicts ``{key: str,
url: str, timestamps: int64[N], cameras: float32[N, 18], images: list[uint8 tensor of encoded
JPEG/PNG bytes]}``, and ``ROOT/{split}/index.json`` mapping key -> chunk file name. A camera row is
``fx/W, fy/H, cx/W, cy/H, 0, 0`` then the world-to-camera 3x4 matrix, row-major.

Writes are atomic (temporary file + rename) and ``index.json`` is rewritten after every chunk, so
an interrupted run leaves a consistent, loadable dataset. Opening a split that already holds
chunks appends to it: numbering continues after the highest existing chunk and the index is
merged.
"""

from __future__ import annotations

import io
import json
import os
import re
from pathlib import Path

import torch
from torch import Tensor

__all__ = [
    "ChunkWriter",
    "camera_row",
    "encode_bytes",
    "example_nbytes",
]

_CHUNK_NAME = re.compile(r"^(\d{6})\.torch$")


def camera_row(intrinsics: Tensor, world_to_camera: Tensor) -> Tensor:
    """The 18-number camera row of one view.

    Args:
        intrinsics: ``[3, 3]`` normalised intrinsics (row 0 / width, row 1 / height).
        world_to_camera: ``[4, 4]`` (or ``[3, 4]``) world-to-camera matrix, OpenCV axes.

    Returns:
        float32 ``[18]``: ``fx, fy, cx, cy, 0, 0`` and the 3x4 matrix row-major.
    """
    k = intrinsics.to(torch.float64)
    head = torch.stack([k[0, 0], k[1, 1], k[0, 2], k[1, 2]])
    zeros = torch.zeros(2, dtype=torch.float64)
    pose = world_to_camera.to(torch.float64)[:3, :4].reshape(12)
    return torch.cat([head, zeros, pose]).to(torch.float32)


def encode_bytes(data: bytes) -> Tensor:
    """Encoded image bytes as the uint8 tensor the chunk format stores."""
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).clone()


def example_nbytes(example: dict) -> int:
    """Approximate serialised size of one scene dict in bytes (images, depths, cameras)."""
    encoded = sum(int(data.numel()) for data in example["images"])
    encoded += sum(int(data.numel()) for data in example.get("depths", ()))
    return encoded + example["cameras"].numel() * 4 + example["timestamps"].numel() * 8


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as handle:
        handle.write(data)
    os.replace(tmp, path)


class ChunkWriter:
    """Accumulates scenes and writes them as chunk files of about ``chunk_mb`` megabytes.

    Args:
        root: dataset root.
        split: split folder name (``"train"``/``"test"``).
        chunk_mb: target chunk size; a chunk is closed before it would exceed it (a single scene
            larger than that gets a chunk of its own).

    Example:
        >>> writer = ChunkWriter(root, "train")  # doctest: +SKIP
        >>> writer.add(example)                   # returns the chunk name the scene goes to
        >>> writer.close()
    """

    def __init__(self, root: str | Path, split: str, chunk_mb: float = 100.0) -> None:
        if chunk_mb <= 0:
            raise ValueError(f"chunk_mb must be positive, got {chunk_mb}")
        self.directory = Path(root) / split
        self.limit = int(chunk_mb * 1024 * 1024)
        self.index: dict[str, str] = {}
        index_path = self.directory / "index.json"
        if index_path.is_file():
            with open(index_path, encoding="utf-8") as handle:
                self.index = dict(json.load(handle))
        numbers = [-1]
        if self.directory.is_dir():
            for path in self.directory.iterdir():
                match = _CHUNK_NAME.match(path.name)
                if match:
                    numbers.append(int(match.group(1)))
        self._next = max(numbers) + 1
        self._pending: list[dict] = []
        self._pending_bytes = 0
        self.written: list[str] = []

    def __contains__(self, key: str) -> bool:
        return key in self.index or any(example["key"] == key for example in self._pending)

    def _current_name(self) -> str:
        return f"{self._next:06d}.torch"

    def add(self, example: dict) -> str:
        """Queue one scene dict; flushes the current chunk first when it would overflow.

        Returns:
            The file name of the chunk the scene is written to.
        """
        if example["key"] in self:
            raise ValueError(f"duplicate scene key {example['key']!r}")
        size = example_nbytes(example)
        if self._pending and self._pending_bytes + size > self.limit:
            self.flush()
        self._pending.append(example)
        self._pending_bytes += size
        return self._current_name()

    def flush(self) -> None:
        """Write the pending scenes as one chunk and update ``index.json``."""
        if not self._pending:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        name = self._current_name()
        buffer = io.BytesIO()
        torch.save(self._pending, buffer)
        _atomic_write_bytes(self.directory / name, buffer.getvalue())
        for example in self._pending:
            self.index[example["key"]] = name
        payload = json.dumps(self.index, indent=2).encode("utf-8")
        _atomic_write_bytes(self.directory / "index.json", payload)
        self.written.append(name)
        self._next += 1
        self._pending = []
        self._pending_bytes = 0

    def close(self) -> list[str]:
        """Flush what is pending.

        Returns:
            The chunk file names written by this writer.
        """
        self.flush()
        return list(self.written)
