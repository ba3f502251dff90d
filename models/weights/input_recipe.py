"""The input recipe of a set of weights: how a capture must be prepared for them.

Every pretrained tag (released and shipped) carries an :class:`InputRecipe` in its pretrained
config (``get_pretrained_cfg(tag).recipe``): the input shape the network runs at and the multiple
its sides must be, the test-time resize and crop, the context views it was trained with, ``near``
and ``far``, and how the poses of its training data were scaled. ``models.pipeline.inference``,
``infer.py``, ``view.py`` and ``eval.py`` apply it by default; ``summary.json`` records what was
applied under ``recipe``. This module imports nothing of the project (it sits below the
pretrained configs that hold it).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

__all__ = [
    "BASELINE_DEPTH_RATIO",
    "DL3DV_REFERENCE_DEPTH",
    "MAX_UPSAMPLE",
    "POSE_SCALES",
    "RE10K_REFERENCE_DEPTH",
    "RESIZES",
    "InputRecipe",
    "fallback_recipe",
    "parse_image_size",
    "shipped_recipe",
]

# Bad input: a photo whose resize to the recipe's shape would upsample it more than this (its
# shorter side under a quarter of the recipe's) cannot show what the weights were trained on.
MAX_UPSAMPLE = 4.0
# The camera-baseline rule (no sparse points): a capture's median depth is taken as this many
# times its largest context-camera distance (neighbouring views ~10 degrees apart around what
# they look at: baseline / depth ~ 2 sin 5 deg ~ 0.17, i.e. depth ~ 6 baselines; 5 is rounder).
BASELINE_DEPTH_RATIO = 5.0
# Reference depths of the releases' training data (pose_scale="dataset"; docs/recipes.md), in the
# datasets' own units. Estimates from the configs (the datasets are not available here):
# RealEstate10K's poses (ORB-SLAM, the dataset's scale) put nearly all content beyond depth 1
# (MVSplat trains with near 1 on them, DepthSplat with 0.5): a median of 2 keeps a typical view's
# points (within ~2x of the median) inside [near, far]. DL3DV's poses are COLMAP models, which
# COLMAP normalises to a camera-centre extent of ~10 units: a walk-through's median depth ~5.
RE10K_REFERENCE_DEPTH = 2.0
DL3DV_REFERENCE_DEPTH = 5.0

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

    @property
    def view_range(self) -> tuple[int, int]:
        """``(fewest, most)`` context views it was trained / shown with."""
        return self.views, max(self.views, self.max_views or self.views)

    def shape_for(self, side: int) -> tuple[int, int]:
        """``(H, W)`` for a requested single side: the recipe's aspect ratio with that height,
        both sides rounded to :attr:`multiple` (a square recipe gives ``(side, side)``)."""
        height, width = self.image_size
        m = self.multiple
        h = max(m, round(side / m) * m)
        w = max(m, round(side * width / height / m) * m)
        return h, w

    def card(self) -> str:
        """The recipe as Markdown (model cards, docs/recipes.md)."""
        height, width = self.image_size
        fewest, most = self.view_range
        views = f"{fewest}" if fewest == most else f"{fewest} (up to {most})"
        if self.pose_scale == "dataset":
            scale = "the training data's own scale"
            if self.reference_depth is not None:
                scale += (
                    "; a capture of unknown scale is mapped so the median depth of its SfM "
                    f"points in the context views is {self.reference_depth:g}"
                )
        elif self.pose_scale == "max_baseline_1":
            scale = "largest distance between context cameras = 1"
        else:
            scale = "pose-free: the model predicts in view 0's frame at its own scale"
        rows = [
            ("input size (H x W)", f"{height} x {width} (sides multiples of {self.multiple})"),
            (
                "resize",
                "aspect-preserving resize to cover, centre crop, intrinsics updated"
                if self.resize == "resize_crop"
                else "resize to the shape",
            ),
            ("context views", views),
            ("near / far", f"near {self.near:g}, far {self.far:g}"),
            ("pose scale", scale),
            ("source", self.source),
        ]
        if self.notes:
            rows.append(("notes", self.notes))
        return "| | |\n|---|---|\n" + "\n".join(f"| {k} | {v} |" for k, v in rows)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict (``summary.json``, model cards)."""
        data = dataclasses.asdict(self)
        data["image_size"] = list(self.image_size)
        return data


def parse_image_size(value: Any) -> tuple[int, int] | int | None:
    """``image_size=`` as given on a command line or in Python: ``None``, one side (``256``,
    ``"256"``), ``"256,448"``, ``"256x448"``, ``[256, 448]`` or ``(256, 448)``.

    Returns:
        ``None``, one side (``int``) or ``(H, W)``.

    Raises:
        ValueError: anything else, or a side that is not a whole number >= 8.
    """
    if value is None or value == "":
        return None
    if isinstance(value, str):
        text = value.strip().strip("[]()")
        parts = [p for p in text.replace("x", ",").replace(" ", ",").split(",") if p]
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        parts = [value]
    else:
        try:
            parts = list(value)
        except TypeError:
            parts = [value]
    if len(parts) not in (1, 2):
        raise ValueError("must be one side or H,W (e.g. 256 or 256,448)")
    sides = []
    for part in parts:
        if isinstance(part, bool) or not str(part).strip().isdigit():
            raise ValueError("must be one side or H,W of whole numbers (e.g. 256 or 256,448)")
        sides.append(int(str(part).strip()))
    if min(sides) < 8:
        raise ValueError("sides must be at least 8 pixels")
    return sides[0] if len(sides) == 1 else (sides[0], sides[1])


# The shipped tiny models: configs/data/synthetic.yaml (image_size 64x64, near 0.25, far 50,
# 2 context views 8-20 frames apart) and datamodules.training.chunk_dataset (poses by
# models.geometry.cameras.normalize_scene: largest context-camera distance 1).
def shipped_recipe(pose_free: bool = False) -> InputRecipe:
    """The input recipe of the ``*.synthetic64`` weights this project trains and ships."""
    return InputRecipe(
        image_size=(64, 64),
        multiple=4,
        resize="resize_crop",
        views=2,
        max_views=None,
        near=0.25,
        far=50.0,
        pose_scale="max_baseline_1",
        reference_depth=None,
        max_view_angle=None,
        source=(
            "this project: configs/data/synthetic.yaml (image_size [64, 64], near 0.25, far 50, "
            "num_context_views 2) and datamodules/training/chunk_dataset.py (normalize_scene: "
            "largest context-camera distance 1)"
        ),
        notes=(
            "synthetic ray-cast rooms; pose-free: predicts Gaussians in view 0's frame at the "
            "unit-baseline scale"
            if pose_free
            else "synthetic ray-cast rooms"
        ),
    )


def fallback_recipe(
    image_size: tuple[int, int], near: float | None = None, far: float | None = None
) -> InputRecipe:
    """The recipe of a model without pretrained weights of a known tag (``pretrained=False``,
    a fine-tune of an architecture with no tag): its recorded size, its own near/far defaults
    (the shipped models' 0.25/50 when it records none) and the unit-baseline scale."""
    near = 0.25 if near is None else float(near)
    far = 50.0 if far is None else float(far)
    if not 0 < near < far:
        near, far = 0.25, 50.0
    return InputRecipe(
        image_size=tuple(int(s) for s in image_size),  # type: ignore[arg-type]
        multiple=1,
        views=2,
        near=near,
        far=far,
        pose_scale="max_baseline_1",
        source="no pretrained tag: the model's recorded image size and near/far",
    )
