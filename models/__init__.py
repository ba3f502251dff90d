"""splatzoo models: the registry, Gaussians, cameras, the shared head, the renderer and the
families. Importing this package needs neither Lightning, Hydra nor wandb."""

from .base import ModelOutput, SplatModel
from .gaussians import Gaussians
from .registry import create_model, is_model, list_models, register_model

try:  # the renderer lands with the foundation issue
    from .render import RenderOutput, render
except ModuleNotFoundError as _error:  # pragma: no cover - removed once render.py exists
    if _error.name != f"{__name__}.render":
        raise

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
