"""splatzoo models: the registry, Gaussians, cameras, the shared head, the renderer and the
families. Importing this package needs neither Lightning, Hydra nor wandb."""

from .base import ModelOutput, SplatModel
from .gaussians import Gaussians
from .registry import create_model, is_model, list_models, register_model
from .render import RenderOutput, render

__all__ = [
    "Gaussians",
    "ModelOutput",
    "RenderOutput",
    "SplatModel",
    "create_model",
    "is_model",
    "list_models",
    "register_model",
    "render",
]
