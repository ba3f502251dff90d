"""What is known about a set of pretrained weights, apart from the architecture: the
:class:`PretrainedCfg` dataclass (timm's ``_pretrained``), and :func:`synthetic64_cfg` for the
weights this project ships.

Weights are named ``architecture.tag`` (e.g. ``zipsplat_tiny.synthetic64``,
``depthsplat_small.re10k_256x256_view2``). A family module declares the tags of its
architectures with ``register_pretrained_cfgs`` of :mod:`models.weights.registry`, which holds the
tables (the one registry, as timm's ``_registry``); ``create_model("architecture.tag",
pretrained=True)`` loads those weights, ``create_model("architecture", pretrained=True)`` the
architecture's default tag (the first registered). The bottom of the weights line: it imports only
the input recipe (models.weights.input_recipe) of the project.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from models.weights.input_recipe import InputRecipe, shipped_recipe

__all__ = [
    "PretrainedCfg",
    "synthetic64_cfg",
]


@dataclass(frozen=True)
class PretrainedCfg:
    """Facts about one set of weights.

    Attributes:
        hf_hub_id: Hugging Face Hub repository (``org/name``) holding the file.
        hf_hub_filename: the file in that repository (an official release file, or this
            project's ``model.safetensors``); ``None`` with ``hf_hub_id`` means the whole
            ``save_pretrained`` folder.
        hf_hub_revision: a pinned revision (commit, tag or branch), or ``None`` for the default.
        local_dir: a ``save_pretrained`` folder shipped with the project (relative paths are
            relative to the repository root).
        file_format: ``"splatzoo"`` (this project's ``config.json`` + safetensors) or
            ``"official"`` (the authors' release file, mapped by the family's
            ``checkpoint_filter_fn``).
        sha256_prefix: the leading hex digits of the file's sha256 (releases name their files
            with it); checked for a file claiming to be this release: downloaded for the tag, or
            carrying ``hf_hub_filename`` (any other file loads unchecked, as not the release).
        arch_kwargs: constructor arguments these weights need beyond the architecture defaults.
        license: licence of the weights (and of any third-party weights inside them).
        source: where they come from (paper, repository).
        train_data: what they were trained on.
        input_size: ``(H, W)`` they were trained at.
        views: number of context views they were trained with.
        pose_free: whether the model needs no input cameras.
        metrics: reported figures, keyed ``"<dataset>/<metric>"``; their provenance is in
            ``metrics_source``.
        metrics_source: who measured ``metrics`` (e.g. "authors' paper, not verified here").
        notes: anything else a user should know.
        recipe: how inputs must be prepared for these weights (:class:`InputRecipe`).
    """

    hf_hub_id: str | None = None
    hf_hub_filename: str | None = None
    hf_hub_revision: str | None = None
    local_dir: str | None = None
    file_format: str = "splatzoo"
    sha256_prefix: str | None = None
    arch_kwargs: dict[str, Any] = field(default_factory=dict)
    license: str | None = None
    source: str | None = None
    train_data: str | None = None
    input_size: tuple[int, int] | None = None
    views: int | None = None
    pose_free: bool | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    metrics_source: str | None = None
    notes: str | None = None
    recipe: InputRecipe | None = None
    architecture: str = ""
    tag: str = ""

    def __post_init__(self) -> None:
        if self.file_format not in ("splatzoo", "official"):
            raise ValueError(
                f"file_format must be 'splatzoo' or 'official', not {self.file_format!r}"
            )
        if self.hf_hub_id is None and self.local_dir is None:
            raise ValueError("a pretrained config needs hf_hub_id or local_dir")

    @property
    def name(self) -> str:
        """``architecture.tag``."""
        return f"{self.architecture}.{self.tag}"

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict (for model cards and ``config.json``)."""
        data = dataclasses.asdict(self)
        if data["input_size"] is not None:
            data["input_size"] = list(data["input_size"])
        if self.recipe is not None:
            data["recipe"] = self.recipe.to_dict()
        return data


def synthetic64_cfg(
    architecture: str, recipe: str, pose_free: bool, psnr: float, ssim: float
) -> dict[str, PretrainedCfg]:
    """``{"<architecture>.synthetic64": cfg}`` of weights this project trained and ships in
    ``checkpoints/<architecture>/`` (64x64 synthetic rooms, 2 context views, 30 CPU minutes)."""
    return {
        f"{architecture}.synthetic64": PretrainedCfg(
            local_dir=f"checkpoints/{architecture}",
            license="Apache-2.0",
            source=f"trained by this project (checkpoints/README.md): {recipe}",
            train_data="synthetic 64x64 rooms (python -m datamodules.synthetic), 2 context views",
            input_size=(64, 64),
            views=2,
            pose_free=pose_free,
            metrics={"synthetic64/psnr": psnr, "synthetic64/ssim": ssim},
            metrics_source="this project, 100 synthetic test scenes (python bench/zoo.py)",
            notes="a 30-CPU-minute demo and test model, not a converged one",
            recipe=shipped_recipe(pose_free),
        )
    }
