"""Backbones shared by the families: a multi-view ViT (DINOv2-compatible) and a DPT head."""

from models.layers.backbones.dpt import DPTHead, FusionBlock, ResidualConvUnit
from models.layers.backbones.multiview_vit import (
    VIT_SIZES,
    BackboneOutput,
    MultiViewTransformer,
    default_out_layers,
)

__all__ = [
    "BackboneOutput",
    "DPTHead",
    "FusionBlock",
    "MultiViewTransformer",
    "ResidualConvUnit",
    "VIT_SIZES",
    "default_out_layers",
]
