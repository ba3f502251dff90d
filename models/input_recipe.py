"""The input recipe of a set of weights: how a capture must be prepared for them.

Every pretrained tag (released and shipped) carries an :class:`InputRecipe` in its pretrained
config (``get_pretrained_cfg(tag).recipe``): the input shape the network runs at and the multiple
its sides must be, the test-time resize and crop, the context views it was trained with, ``near``
and ``far``, and how the poses of its training data were scaled. ``models.inference``,
``infer.py``, ``view.py`` and ``eval.py`` apply it by default; ``summary.json`` records what was
applied under ``recipe``. This module imports nothing of the project (it sits below the
pretrained configs that hold it).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

__all__ = ["POSE_SCALES", "RESIZES", "InputRecipe"]

# How a training set's poses were scaled:
# - "dataset": the dataset's own scale, never rescaled (RE10K, ACID, DL3DV as the releases load
#   them); a capture of unknown scale is mapped to it by a documented rule (``reference_depth``);
# - "max_baseline_1": the largest distance between context camera centres is 1 (this project's
#   own models; pixelSplat-style ``make_baseline_1``);
# - "pose_free": the model predicts Gaussians in view 0's frame at its own scale; input poses
#   only place the output.
POSE_SCALES = ("dataset", "max_baseline_1", "pose_free")
# Test-time image preparation: "resize_crop" = aspect-preserving resize until the image covers
# ``image_size``, then a centre crop (pixelSplat / DepthSplat / ReSplat), intrinsics updated;
# "resize" = resize to ``image_size`` exactly (only for models trained on squashed images).
RESIZES = ("resize_crop", "resize")


@dataclass(frozen=True)
class InputRecipe:
    """How inputs were prepared for a set of weights in training and evaluation.

    Attributes:
        image_size: ``(H, W)`` the network was trained / evaluated at.
        multiple: the network needs ``H`` and ``W`` to be multiples of this (patch size, the
            coarsest feature stride).
        resize: one of :data:`RESIZES`.
        views: context views it was trained with.
        max_views: the most context views it was shown to handle (``None``: ``views``).
        near: near plane (depth candidates / culling) in the training scale.
        far: far plane in the training scale.
        pose_scale: one of :data:`POSE_SCALES`.
        reference_depth: for ``pose_scale="dataset"``: the typical (median) scene depth of the
            training data in its own units, which a capture of unknown scale is mapped to.
        max_view_angle: largest rotation (degrees) between context views of its training or
            evaluation views; farther views get a warning.
        source: where the recipe was read (``repository file@commit``), or this project's config.
        notes: anything else a user should know.
    """

    image_size: tuple[int, int]
    multiple: int = 1
    resize: str = "resize_crop"
    views: int = 2
    max_views: int | None = None
    near: float = 1.0
    far: float = 100.0
    pose_scale: str = "dataset"
    reference_depth: float | None = None
    max_view_angle: float | None = None
    source: str = ""
    notes: str = ""

    def __post_init__(self) -> None:
        height, width = self.image_size
        if height <= 0 or width <= 0 or self.multiple < 1:
            raise ValueError(f"bad recipe shape {self.image_size} / multiple {self.multiple}")
        if height % self.multiple or width % self.multiple:
            raise ValueError(f"recipe shape {self.image_size} is not a multiple of {self.multiple}")
        if self.resize not in RESIZES:
            raise ValueError(f"resize must be one of {RESIZES}, not {self.resize!r}")
        if self.pose_scale not in POSE_SCALES:
            raise ValueError(f"pose_scale must be one of {POSE_SCALES}, not {self.pose_scale!r}")
        if not 0 < self.near < self.far:
            raise ValueError(f"need 0 < near < far, got {self.near}, {self.far}")

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict (``summary.json``, model cards)."""
        data = dataclasses.asdict(self)
        data["image_size"] = list(self.image_size)
        return data
