"""splatzoo models: the registry, Gaussians, cameras, the shared head, the renderer and the
families. Importing this package loads neither Lightning, Hydra nor wandb."""

import models.layers._timm_import  # noqa: F401  (first: timm without wandb)
from models.core.base import ModelOutput, SplatModel
from models.core.gaussians import Gaussians
from models.render.core import render
from models.render.output import RenderOutput
from models.weights.factory import create_model, load_model
from models.weights.pretrained_cfg import PretrainedCfg
from models.weights.registry import (
    get_pretrained_cfg,
    is_model,
    list_families,
    list_models,
    register_model,
    register_pretrained_cfgs,
)

# isort: off
# Last, so that a family module may import anything above (its @register_model entry points run).
import models.families  # noqa: E402, F401
# isort: on

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
    "list_families",
    "list_models",
    "register_model",
    "render",
]
