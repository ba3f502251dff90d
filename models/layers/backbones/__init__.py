"""Backbones: the project's multi-view ViT (DINOv2-compatible), a plain DINOv2, Depth Anything 3's
ViT, DepthSplat's depth trunk with its UniMatch features, and the one DPT head."""

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
