"""splatzoo models: the registry, Gaussians, cameras, the shared head, the renderer and the
families. Importing this package needs neither Lightning, Hydra nor wandb."""

from .base import ModelOutput, SplatModel
from .factory import create_model, load_model
from .gaussians import Gaussians
from .pretrained_cfg import PretrainedCfg, register_pretrained_cfgs
from .registry import get_pretrained_cfg, is_model, list_models, register_model
from .render import RenderOutput, render

__all__ = [
    "Gaussians",
    "ModelOutput",
    "RenderOutput",
    "SplatModel",
    "PretrainedCfg",
    "create_model",
    "get_pretrained_cfg",
    "register_pretrained_cfgs",
    "is_model",
    "load_model",
    "list_models",
    "register_model",
    "render",
]
