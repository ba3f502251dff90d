"""Training: the LightningModule and one recipe per family (loss-term weights and schedules).

Never imported by ``import models`` (it imports Lightning).
"""

from models.training.module import SplatLitModule, net_identity
from models.training.recipes import (
    ReSplatTrainingRecipe,
    SplatWeaverTrainingRecipe,
    TrainingRecipe,
    ZipSplatTrainingRecipe,
    default_recipe,
)

__all__ = [
    "TrainingRecipe",
    "ReSplatTrainingRecipe",
    "SplatLitModule",
    "SplatWeaverTrainingRecipe",
    "ZipSplatTrainingRecipe",
    "default_recipe",
    "net_identity",
]
