"""splatzoo data stack: chunk datasets (RE10K/ACID/DL3DV format), the synthetic scene generator,
view samplers, image-folder/video input and the LightningDataModule.

Importing this package loads only its error class (``InputError``, which ``models`` derives its
own from): the readers, the Lightning data module, the chunk dataset and the generator are
imported on first access.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from datamodules.errors import InputError

if TYPE_CHECKING:  # pragma: no cover
    from datamodules.readers.chunks import cameras_to_matrices, load_chunk, load_index, read_scene
    from datamodules.readers.image_folder import ImageSet, load_images
    from datamodules.synthetic import SyntheticSettings, generate_dataset
    from datamodules.training.chunk_dataset import ChunkDataset
    from datamodules.training.datamodule import SplatDataModule
    from datamodules.training.samplers import (
        AllViewSampler,
        BoundedViewSampler,
        EvaluationViewSampler,
        VideoViewSampler,
        make_view_sampler,
    )

_LAZY = {
    "cameras_to_matrices": "readers.chunks",
    "load_chunk": "readers.chunks",
    "load_index": "readers.chunks",
    "read_scene": "readers.chunks",
    "ChunkDataset": "training.chunk_dataset",
    "SplatDataModule": "training.datamodule",
    "ImageSet": "readers.image_folder",
    "load_images": "readers.image_folder",
    "AllViewSampler": "training.samplers",
    "BoundedViewSampler": "training.samplers",
    "EvaluationViewSampler": "training.samplers",
    "VideoViewSampler": "training.samplers",
    "make_view_sampler": "training.samplers",
    "SyntheticSettings": "synthetic",
    "generate_dataset": "synthetic",
}

__all__ = [
    "InputError",
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
