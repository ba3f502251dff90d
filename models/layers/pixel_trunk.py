"""The per-pixel trunk shared by every family that predicts per-pixel depth.

Multi-view ViT (``MultiViewTransformer``) -> DPT head (``DPTHead``) to per-pixel features ->
inverse-depth softmax (``DepthSoftmaxHead``) -> optional residual refinement
(``DepthRefinement``) -> optional zero-initialised point head (a 3D correction per depth, which
each family applies its own way). The pixel-aligned family, SplatWeaver and ReSplat's initial
model use it.

``PixelTrunk`` is a mixin of ``nn.Module`` classes: it builds its parts *on the host* under the
names ``backbone``, ``dpt``, ``depth_head``, ``depth_refine`` and ``point_head``
(``PIXEL_TRUNK_PARTS``), so the host's state-dict keys are those the families had before the
trunk was shared (the shipped weights load unchanged) and a trunk trained in one family can start
another (SplatWeaver's ``init_checkpoint``). The encoder and the depth part are built by two
calls, so a host can put its own modules between them (ReSplat fuses the DPT features with the
pixel-unshuffled image before its depth head) and keep its construction order (and so its seeded
initialisation).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor, nn

from models.layers.backbones import DPTHead, MultiViewTransformer
from models.layers.depth_head import (
    ConvHead,
    DepthRefinement,
    DepthSoftmaxHead,
    inverse_depth_to_depth,
)

__all__ = ["PixelTrunk", "PixelDepth", "PIXEL_TRUNK_PARTS"]

PIXEL_TRUNK_PARTS = ("backbone", "dpt", "depth_head", "depth_refine", "point_head")


@dataclass
class PixelDepth:
    """Per-pixel depth of ``B`` scenes of ``V`` views, ``G`` depths per pixel.

    Attributes:
        depth: ``[B, V, G, H, W]`` z-depth in each view's frame (after the refinement).
        coarse: ``[B, V, G, H, W]`` the softmax estimate before the refinement.
        inverse: ``[B*V, G, H, W]`` refined normalised inverse depth in (0, 1).
    """

    depth: Tensor
    coarse: Tensor
    inverse: Tensor


class PixelTrunk:
    """Mixin: builds and runs the per-pixel trunk on an ``nn.Module`` host (see the module)."""

    backbone: MultiViewTransformer
    dpt: DPTHead
    depth_head: DepthSoftmaxHead
    depth_refine: DepthRefinement | None
    point_head: ConvHead | None

    def build_pixel_encoder(
        self,
        vit_size: str,
        *,
        image_size: int | list[int],
        feature_dim: int,
        dpt_features: int,
        shallow_dim: int,
        camera_tokens: bool,
        pretrained_backbone: bool | str = False,
        patch_size: int | None = None,
        backbone_dim: int | None = None,
        backbone_depth: int | None = None,
        backbone_heads: int | None = None,
        global_layers: list[int] | None = None,
        out_layers: list[int] | None = None,
        drop_path_rate: float = 0.0,
    ) -> None:
        """Build ``backbone`` (see ``MultiViewTransformer``) and ``dpt`` (``feature_dim``
        channels out; ``shallow_dim > 0`` adds a full-resolution image CNN)."""
        self.backbone = MultiViewTransformer(
            vit_size,
            image_size=image_size,
            patch_size=patch_size,
            embed_dim=backbone_dim,
            depth=backbone_depth,
            num_heads=backbone_heads,
            global_layers=global_layers,
            out_layers=out_layers,
            use_camera_tokens=camera_tokens,
            pretrained_backbone=pretrained_backbone,
            drop_path_rate=drop_path_rate,
        )
        self.dpt = DPTHead(
            self.backbone.embed_dim,
            num_layers=len(self.backbone.out_layers),
            features=dpt_features,
            out_dim=feature_dim,
            shallow_dim=shallow_dim,
        )

    def build_pixel_depth(
        self,
        feature_dim: int,
        num_depth_candidates: int,
        *,
        depths_per_pixel: int = 1,
        activation: str = "relu",
        refine_dim: int | None = None,
        point_head: bool = False,
    ) -> None:
        """Build ``depth_head`` (``activation`` between its convolutions), ``depth_refine``
        (``refine_dim`` hidden channels; ``None``: no refinement) and ``point_head`` (3 values
        per depth, zero-initialised; ``False``: none)."""
        g = depths_per_pixel
        self.depth_head = DepthSoftmaxHead(
            feature_dim, num_depth_candidates, depths=g, activation=activation
        )
        self.depth_refine = (
            None if refine_dim is None else DepthRefinement(feature_dim, refine_dim, g)
        )
        self.point_head = ConvHead(feature_dim, 3 * g, zero_init=True) if point_head else None

    def pixel_features(
        self,
        images: Tensor,
        size: tuple[int, int],
        extrinsics: Tensor | None = None,
        intrinsics: Tensor | None = None,
    ) -> Tensor:
        """Per-pixel features ``[B*V, C, *size]`` of ``images [B, V, 3, H, W]``; the cameras
        (``[B, V, 4, 4]`` camera-to-world, ``[B, V, 3, 3]`` normalised) feed the camera tokens."""
        tokens = self.backbone(images, extrinsics, intrinsics)
        return self.dpt(tokens.features, tokens.grid_size, size, images)

    def pixel_depth(self, features: Tensor, near: Tensor, far: Tensor) -> PixelDepth:
        """Depth of ``features [B*V, C, H, W]`` between ``near`` and ``far`` ``[B, V]``."""
        t = self.depth_head(features)  # [BV, G, H, W] in [0, 1]
        coarse = t
        if self.depth_refine is not None:
            t = self.depth_refine(features, t)
        depth = inverse_depth_to_depth(t, near, far)
        coarse = depth if self.depth_refine is None else inverse_depth_to_depth(coarse, near, far)
        return PixelDepth(depth=depth, coarse=coarse, inverse=t)

    def pixel_trunk_modules(self) -> dict[str, nn.Module]:
        """The trunk's parts this host has (``None`` ones left out), by attribute name."""
        parts = {name: getattr(self, name, None) for name in PIXEL_TRUNK_PARTS}
        return {name: module for name, module in parts.items() if module is not None}
