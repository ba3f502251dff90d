"""What a reconstruction is: the :class:`Reconstruction` that ``models.pipeline.inference.reconstruct``
returns and every later stage (fusion, refinement, writing) takes, the :class:`SceneFrame` that
maps its scene frame back to the capture, the inference error types and the small helpers the
stages share (:class:`StageTimer`, :func:`progress`). Imports nothing above the model registry.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from datamodules.errors import InputError
from models.core.gaussians import Gaussians
from models.geometry.similarity import Similarity
from models.weights.input_recipe import InputRecipe

__all__ = [
    "CAPTURE_PLACEMENTS",
    "PLACEMENTS",
    "InferenceError",
    "KnobError",
    "Reconstruction",
    "SceneFrame",
    "StageTimer",
    "model_name",
    "progress",
]

# How a view was placed: given cameras (cameras=, cameras.json, COLMAP), structure-from-motion,
# view 0 of a pose-free model (the identity), predicted by the model, test-time pose fit,
# or not at all (pose-free, no prediction, no refinement).
PLACEMENTS = ("given", "sfm", "identity", "predicted", "refined", "unknown")
#: The placements that are the capture's own cameras (given with the photos, or SfM's).
CAPTURE_PLACEMENTS = ("given", "sfm")


class InferenceError(InputError):
    """Unusable input or settings for inference; one line naming ``path``."""


class KnobError(InferenceError):
    """A knob the model does not declare, or a value of the wrong type or out of range."""


# --------------------------------------------------------------------------- result


@dataclass
class SceneFrame:
    """How the model's scene frame sits in the capture's own frame (DESIGN, "Scene frame").

    Attributes:
        to_capture: scene frame -> capture: ``p = R0 @ (scale * q) + t0`` with ``[R0 | t0]`` the
            first context camera's camera-to-world in the capture (identity without poses); the
            model saw the capture divided by ``scale`` (its recipe's training scale).
        rule: how the scale was chosen (one line).
        near: the near plane the model got (scene units).
        far: the far plane the model got (scene units).
    """

    to_capture: Similarity = field(default_factory=Similarity.identity)
    rule: str = "no poses: the scene frame is view 0's camera frame at the model's scale"
    near: float = 1.0
    far: float = 100.0

    @property
    def scale(self) -> float:
        """Capture units per scene unit (``summary.json`` ``recipe.scene_scale``)."""
        return float(self.to_capture.scale)

    def to_dict(self) -> dict[str, Any]:
        return {"scene_scale": self.scale, "scene_scale_rule": self.rule}


@dataclass
class Reconstruction:
    """What :func:`reconstruct` returns.

    Attributes:
        gaussians: the Gaussians of the scene (a batch of one), in the scene frame (view 0 is the
            identity, at the recipe's training scale; ``frame`` maps it to the capture).
        extrinsics: ``[V, 4, 4]`` camera-to-world of every input view in that frame (the identity
            where ``placement`` is ``"unknown"``).
        intrinsics: ``[V, 3, 3]`` normalised, for ``images``.
        placement: per view, how it was placed (one of :data:`PLACEMENTS`).
        poses: one line saying how the views were placed (``summary.json``'s ``poses``).
        images: ``[V, 3, H, W]`` the model's input views in [0, 1] (CPU).
        names: a name per view (file names for an image set).
        model: the model's registry name.
        family: the model's family.
        pose_free: whether the model ignores input cameras.
        knobs: the inference knobs it ran with (checked, converted).
        timings: seconds per stage (``inference``, ``pose_fit``; callers add their own).
        maps: per-family per-view maps, e.g. ``"cardinality"`` ``[V, H, W]`` int64 (Gaussians per
            pixel of a MoE-cardinality model).
        source: the ``ImageSet`` the images came from (original sizes, SfM result), or ``None``.
        frame: where the scene frame sits in the capture (:class:`SceneFrame`): what is
            written goes back to the capture's frame and scale through it.
        recipe: the input recipe applied (``summary.json`` ``recipe``).
        warnings: where the input or settings left the recipe (one line each).
    """

    gaussians: Gaussians
    extrinsics: Tensor
    intrinsics: Tensor
    placement: list[str]
    poses: str
    images: Tensor
    names: list[str]
    model: str
    family: str | None = None
    pose_free: bool = False
    knobs: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    maps: dict[str, Tensor] = field(default_factory=dict)
    source: Any = None
    frame: SceneFrame = field(default_factory=SceneFrame)
    recipe: InputRecipe | None = None
    warnings: list[str] = field(default_factory=list)

    def recipe_record(self) -> dict[str, Any]:
        """``summary.json``'s ``recipe``: what was applied, and the tag's recipe."""
        record: dict[str, Any] = {
            "input_size": list(self.image_size),
            "near": float(self.frame.near),
            "far": float(self.frame.far),
            **self.frame.to_dict(),
        }
        if self.recipe is not None:
            record["pose_scale"] = self.recipe.pose_scale
            record["trained"] = self.recipe.to_dict()
        return record

    @property
    def known(self) -> list[int]:
        """Indices of the views with a known camera."""
        return [i for i, kind in enumerate(self.placement) if kind != "unknown"]

    @property
    def image_size(self) -> tuple[int, int]:
        """``(H, W)`` of the model's input (and of the renders)."""
        return int(self.images.shape[-2]), int(self.images.shape[-1])

    @property
    def count(self) -> int:
        """Gaussians in the scene."""
        return int(self.gaussians.count()[0])


# --------------------------------------------------------------------------- helpers


class StageTimer:
    """Wall time per stage, in seconds, into ``stages``."""

    def __init__(self, stages: dict[str, float]) -> None:
        self.stages = stages

    @contextlib.contextmanager
    def __call__(self, name: str, device: torch.device | None = None) -> Iterator[None]:
        start = time.perf_counter()
        yield
        if device is not None and device.type == "cuda":
            torch.cuda.synchronize(device)
        self.stages[name] = round(time.perf_counter() - start, 4)


def progress(iterable=None, **kwargs):
    """tqdm on an interactive stderr only (pipes and logs stay clean)."""
    from tqdm.auto import tqdm

    return tqdm(iterable, disable=None, leave=False, dynamic_ncols=True, **kwargs)


def model_name(model: nn.Module) -> str:
    """The model's registry name (its class name when it has none)."""
    return str(getattr(model, "registry_name", None) or type(model).__name__)
