"""splatzoo data stack: chunk datasets (RE10K/ACID/DL3DV format), the synthetic scene generator,
view samplers, image-folder/video input and the LightningDataModule.

Importing this package is light (torch, NumPy, Pillow): the Lightning data module, the chunk
dataset and the generator are imported on first access.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from .chunks import cameras_to_matrices, load_chunk, load_index, read_scene
from .errors import DataError

if TYPE_CHECKING:  # pragma: no cover
    from .chunk_dataset import ChunkDataset
    from .datamodule import SplatDataModule
    from .image_folder import ImageSet, load_images
    from .samplers import (
        AllViewSampler,
        BoundedViewSampler,
        EvaluationViewSampler,
        VideoViewSampler,
        make_view_sampler,
    )
    from .synthetic import SyntheticSettings, generate_dataset

_LAZY = {
    "ChunkDataset": "chunk_dataset",
    "SplatDataModule": "datamodule",
    "ImageSet": "image_folder",
    "load_images": "image_folder",
    "AllViewSampler": "samplers",
    "BoundedViewSampler": "samplers",
    "EvaluationViewSampler": "samplers",
    "VideoViewSampler": "samplers",
    "make_view_sampler": "samplers",
    "SyntheticSettings": "synthetic",
    "generate_dataset": "synthetic",
}

__all__ = [
    "DataError",
    "cameras_to_matrices",
    "load_chunk",
    "load_index",
    "read_scene",
    "ChunkDataset",
    "SplatDataModule",
    "ImageSet",
    "load_images",
    "AllViewSampler",
    "BoundedViewSampler",
    "EvaluationViewSampler",
    "VideoViewSampler",
    "make_view_sampler",
    "SyntheticSettings",
    "generate_dataset",
]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
