"""AnySplat's released model (``lhjiang/anysplat``) in this project's code: a pose-free
pixel-aligned model (one Gaussian per input pixel, placed at the pixel's predicted depth along
its predicted ray) whose per-pixel Gaussians are merged into voxels.

Architecture of the release (``InternRobotics/AnySplat`` at 57937e4,
``src/model/encoder/anysplat.py``), re-implemented here:

1. **Trunk** (``models.layers.vggt``, shared with the SplatWeaver port): VGGT-1B's DINOv2
   ViT-L/14 patch encoder and 24 pairs of per-view / all-view attention blocks. The release stores
   this aggregator in bfloat16 and feeds it the images rounded to bfloat16; we round the input the
   same way and compute in the weights' dtype of this model (float32 unless you cast it).
2. **Cameras (pose-free):** VGGT's camera head (9-number encoding refined over 4 iterations):
   world-to-camera ``[R|t]`` and intrinsics with the principal point at the image centre.
3. **Depth:** VGGT's DPT depth head (``exp`` depth, ``1 + exp`` confidence); every pixel is
   unprojected with its predicted camera (``models.layers.release_frame.unproject_depth``).
4. **Gaussian head:** a third DPT on the same four layers up to its 128-channel full-resolution
   map, plus a 7x7 convolution of the image (``image_merger``), the UV embedding, then
   ``conv 3x3 + ReLU + conv 1x1`` to ``1 + 7 + 3 (d + 1)^2`` raw parameters and one voxel weight
   per pixel (no activation).
5. **Differentiable voxelisation:** the pixels' points are binned into voxels of side
   ``voxel_size`` (``round(p / voxel_size)``, in the release's world units); within a voxel the
   points *and the raw parameters* are averaged with the softmax of the voxel weight
   (``exp(c - max) / (sum + 1e-6)``); one Gaussian per occupied voxel, ordered by voxel index
   (lexicographic, as ``torch.unique`` sorts). ``voxel_size=0`` skips the merge: one Gaussian
   per pixel (the release's ``voxelize: false`` path).
6. **Activations:** opacity ``sigmoid`` (the release's opacity mapping with its configured
   exponent 1), scale ``0.001 * softplus(x)`` capped at 0.3, normalised quaternion (the release's
   xyzw, stored here as wxyz), SH degree 4 with the higher bands scaled by ``0.1 * 0.25^l``. The
   means are the voxel-averaged points (no offset).

Forward keywords: ``voxel_size`` (the merge, this family's inference knob; the tag's default is
the release's 0.002), ``max_gaussians``, ``frame="scene"`` (default: predicted view 0 the
identity, the largest predicted camera distance 1, SH rotated) or ``"release"`` (VGGT's frame).

``checkpoint_filter_fn`` maps the release's ``model.safetensors`` onto this model; the training
configuration's frozen VGGT copies (``encoder.distill_*``) are accepted and dropped.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from models.core.base import ModelOutput, SplatModel, check_context
from models.core.gaussians import Gaussians
from models.layers.backbones.dpt import add_uv_embedding, release_dpt_key
from models.layers.release_frame import pad_scenes, to_scene_frame
from models.layers.vggt import (
    AlternatingAggregator,
    CameraHead,
    trunk_and_geometry,
    vggt_dpt,
)
from models.weights.builder import check_mapped_state
from models.weights.input_recipe import InputRecipe
from models.weights.knobs import MAX_GAUSSIANS, Knob
from models.weights.pretrained_cfg import PretrainedCfg
from models.weights.registry import register_model, register_pretrained_cfgs

__all__ = [
    "AnySplatRelease",
    "DISTILL_PREFIXES",
    "DROPPED_KEYS",
    "INFERENCE_KNOBS",
    "KNOB_FREE_MODULES",
    "anysplat_vggt",
    "anysplat_vggt_tiny",
    "checkpoint_filter_fn",
    "decode_raw_gaussians",
    "voxel_merge",
]

FRAMES = ("scene", "release")


# ----------------------------------------------------------------------------- voxelisation
def voxel_merge(
    points: Tensor, features: Tensor, weights: Tensor, voxel_size: float
) -> tuple[Tensor, Tensor]:
    """Merge per-pixel points and features into voxels (the release's differentiable
    voxelisation).

    Args:
        points: ``[N, 3]`` world points; ``features: [N, C]``; ``weights: [N]`` raw voxel weights
            (softmax within each voxel).
        voxel_size: voxel side in the points' units (> 0).

    Returns:
        ``(points [M, 3], features [M, C])``, one row per occupied voxel, ordered by voxel index.
    """
    index = torch.round(points.detach() / voxel_size).int()  # [N, 3]
    _, inverse = torch.unique(index, dim=0, return_inverse=True)  # [N]
    count = int(inverse.max()) + 1 if inverse.numel() else 0
    peak = weights.new_full((count,), float("-inf"))
    peak = peak.scatter_reduce(0, inverse, weights, reduce="amax", include_self=True)  # [M]
    scores = torch.exp(weights - peak[inverse])  # [N]
    total = weights.new_zeros(count).index_add(0, inverse, scores)  # [M]
    share = (scores / (total[inverse] + 1e-6))[:, None]  # [N, 1], the release's 1e-6
    merged_points = points.new_zeros(count, 3).index_add(0, inverse, points * share)
    merged = features.new_zeros(count, features.shape[1]).index_add(0, inverse, features * share)
    return merged_points, merged


def decode_raw_gaussians(
    means: Tensor, raw: Tensor, sh_degree: int, scale_factor: float, max_scale: float
) -> Gaussians:
    """One scene's Gaussians from raw parameters ``[N, 1 + 3 + 4 + 3 K]`` (the release's layout:
    density, scale, quaternion xyzw, SH channel-major) at ``means [N, 3]``; batch size 1."""
    k = (sh_degree + 1) ** 2
    density, scales, quaternion, sh = raw.split((1, 3, 4, 3 * k), dim=-1)
    scales = (scale_factor * F.softplus(scales)).clamp_max(max_scale)
    quaternion = quaternion / (quaternion.norm(dim=-1, keepdim=True) + 1e-8)
    degree = torch.arange(k, device=raw.device).float().sqrt().floor()  # band of each basis
    damping = torch.where(degree > 0, 0.1 * 0.25**degree, torch.ones_like(degree))
    return Gaussians(
        means=means[None],
        scales=scales[None],
        rotations=quaternion[None][..., [3, 0, 1, 2]],  # xyzw -> wxyz
        opacities=torch.sigmoid(density[None, :, 0]),
        harmonics=(sh.reshape(-1, 3, k) * damping.to(sh.dtype))[None],
    )


# ----------------------------------------------------------------------------- memory model
# AnySplatRelease.forward_memory / forward_seconds (models.core.budget announces and checks them).
# Float32 arrays alive at the peak: per pixel, in units of the Gaussian DPT's and the depth DPT's
# full-resolution widths and of the raw parameters; per token, in units of the trunk's width.
MEMORY_GAUSSIAN_MAPS = 3
MEMORY_DEPTH_MAPS = 3
MEMORY_RAW_COPIES = 2
MEMORY_TOKEN_ARRAYS = 20
MEMORY_MARGIN = 1.2
MEMORY_PROCESS_BYTES = 800 * 2**20  # Python, torch and the project imported
HEAD_FLOPS_PER_PIXEL = 4e6  # the heads' convolutions per input pixel (released widths)
SECONDS_PER_FLOP = 1 / 86e9  # measured: released size, 2 and 3 views of 448x448, 2 threads


# ----------------------------------------------------------------------------- the model
class AnySplatRelease(SplatModel):
    """AnySplat as released (VGGT trunk, DPT Gaussian head, differentiable voxelisation).

    Architecture arguments only (defaults: the released model, 1.19 B parameters without the
    distillation copies).

    Args:
        embed_dim, depth, num_heads: aggregator width, block pairs, heads.
        encoder_depth, encoder_heads: DINOv2 patch encoder (its width is ``embed_dim``).
        num_register_tokens: register tokens (encoder and aggregator).
        patch_size: pixels per patch; image sides must be multiples of it.
        pos_grid: side of the encoder's stored position-embedding grid (37: 518 pixels).
        image_size: input side the weights were demoed at (``infer.py``'s default size).
        out_layers: aggregator blocks fed to the DPT heads.
        camera_depth, camera_heads: camera head trunk.
        depth_features, depth_channels: depth DPT widths.
        gaussian_features, gaussian_channels: Gaussian DPT widths (its full-resolution map has
            ``gaussian_features // 2`` channels: 128 as released).
        sh_degree: SH degree (4 as released).
        voxel_size: default voxel side of the merge (release units; 0: one Gaussian per pixel).
        scale_factor, max_scale: scale ``scale_factor * softplus(x)``, capped at ``max_scale``.
    """

    family = "pixel_aligned"  # per-pixel Gaussians on predicted depth, merged into voxels
    pose_free = True
    min_views = 1

    def __init__(
        self,
        *,
        embed_dim: int = 1024,
        depth: int = 24,
        num_heads: int = 16,
        encoder_depth: int = 24,
        encoder_heads: int = 16,
        num_register_tokens: int = 4,
        patch_size: int = 14,
        pos_grid: int = 37,
        image_size: int = 448,
        out_layers: Sequence[int] = (4, 11, 17, 23),
        camera_depth: int = 4,
        camera_heads: int = 16,
        depth_features: int = 256,
        depth_channels: Sequence[int] = (256, 512, 1024, 1024),
        gaussian_features: int = 256,
        gaussian_channels: Sequence[int] = (256, 512, 1024, 1024),
        sh_degree: int = 4,
        voxel_size: float = 0.002,
        scale_factor: float = 0.001,
        max_scale: float = 0.3,
    ) -> None:
        super().__init__()
        out_layers = [int(i) for i in out_layers]
        if len(out_layers) != 4 or not all(0 <= i < depth for i in out_layers):
            raise ValueError(
                f"out_layers must be 4 block indices in 0..{depth - 1}, got {out_layers}"
            )
        if not 0 <= sh_degree <= 4:
            raise ValueError(f"sh_degree must be in 0..4, got {sh_degree}")
        if voxel_size < 0:
            raise ValueError(f"voxel_size must be >= 0, got {voxel_size}")
        self.patch_size = patch_size
        self.image_size = image_size
        self.out_layers = out_layers
        self.sh_degree = sh_degree
        self.voxel_size = float(voxel_size)
        self.scale_factor = scale_factor
        self.max_scale = max_scale
        self.raw_dim = 1 + 3 + 4 + 3 * (sh_degree + 1) ** 2
        width = gaussian_features // 2
        self.gaussian_width, self.depth_width = width, depth_features // 2  # full-resolution maps
        self.aggregator = AlternatingAggregator(
            embed_dim,
            depth,
            num_heads,
            num_register_tokens=num_register_tokens,
            patch_size=patch_size,
            encoder_depth=encoder_depth,
            encoder_heads=encoder_heads,
            pos_grid=pos_grid,
        )
        self.camera_head = CameraHead(2 * embed_dim, camera_depth, camera_heads)
        self.depth_head = vggt_dpt(2 * embed_dim, depth_features, depth_channels, out_dim=2)
        self.feature_head = vggt_dpt(2 * embed_dim, gaussian_features, gaussian_channels, 0)
        self.image_merger = nn.Sequential(nn.Conv2d(3, width, 7, padding=3), nn.ReLU())
        self.gaussian_out = nn.Sequential(
            nn.Conv2d(width, width, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(width, self.raw_dim + 1, 1),
        )

    # ------------------------------------------------------------------ memory and time
    def forward_memory(self, views: int, height: int, width: int) -> int:
        """Estimated peak resident bytes of a forward pass over one scene of ``views`` images of
        ``height x width`` (what ``models.core.budget`` announces and checks): the process and the
        weights, the trunk's tokens (the kept layers and one block's working arrays, ``[V, T,
        C]`` each; attention runs through ``scaled_dot_product_attention``, no score matrix)
        and the heads' full-resolution maps (the Gaussian and depth DPTs' last maps, the raw
        parameters and their copies in the merge). Calibrated on measured peaks (the module's
        ``MEMORY_*`` constants; docs/ports/anysplat.md, Speed and memory)."""
        tokens = views * self._tokens_per_view(height, width)
        pixels = views * height * width
        per_pixel = (
            MEMORY_GAUSSIAN_MAPS * self.gaussian_width
            + MEMORY_DEPTH_MAPS * self.depth_width
            + MEMORY_RAW_COPIES * (self.raw_dim + 1)
        )
        per_token = MEMORY_TOKEN_ARRAYS * self.aggregator.camera_token.shape[-1]
        activations = 4 * (pixels * per_pixel + tokens * per_token)
        weights = sum(t.numel() * t.element_size() for t in self.state_dict().values())
        return int(MEMORY_PROCESS_BYTES + weights + MEMORY_MARGIN * activations)

    def max_views_within(self, available: int, height: int, width: int) -> int:
        """The most views of ``height x width`` whose :meth:`forward_memory` fits in
        ``available`` bytes (0: not even one)."""
        low, high = 0, 1
        while high < 1 << 16 and self.forward_memory(high, height, width) <= available:
            low, high = high, 2 * high
        while high - low > 1:  # forward_memory(low) fits, forward_memory(high) does not
            middle = (low + high) // 2
            fits = self.forward_memory(middle, height, width) <= available
            low, high = (middle, high) if fits else (low, middle)
        return low

    def forward_seconds(self, views: int, height: int, width: int) -> float:
        """Estimated CPU seconds of a forward pass: the trunk's matrix products (2 x its
        parameters per token) and attention (per view and across all views), and the heads'
        per-pixel work, at a rate measured on this project's CPU (``SECONDS_PER_FLOP``)."""
        per_view = self._tokens_per_view(height, width)
        tokens = views * per_view
        width_c = self.aggregator.camera_token.shape[-1]
        trunk = 2 * sum(p.numel() for p in self.aggregator.parameters()) * tokens
        attention = 4 * width_c * self.aggregator.depth * (views * per_view**2 + tokens**2)
        heads = HEAD_FLOPS_PER_PIXEL * (self.gaussian_width / 128) ** 2 * views * height * width
        return float(SECONDS_PER_FLOP * (trunk + attention + heads))

    def _tokens_per_view(self, height: int, width: int) -> int:
        p = self.patch_size
        return (height // p) * (width // p) + self.aggregator.patch_start_idx

    # ------------------------------------------------------------------ pieces
    def _raw_gaussians(self, layers: list[Tensor], images: Tensor, start: int) -> Tensor:
        """Per-pixel raw parameters and voxel weight ``[B*V, raw_dim + 1, H, W]``."""
        h, w = images.shape[-2:]
        grid = (h // self.patch_size, w // self.patch_size)
        fused = self.feature_head.fuse_maps(self.feature_head.token_maps(layers, grid, start))
        fused = F.interpolate(fused, size=(h, w), mode="bilinear", align_corners=True)
        fused = add_uv_embedding(fused + self.image_merger(images.flatten(0, 1)))
        return self.gaussian_out(fused)

    def _scene(self, raw: Tensor, points: Tensor, voxel_size: float) -> Gaussians:
        """One scene: ``raw [N, raw_dim + 1]``, ``points [N, 3]`` -> Gaussians (batch 1)."""
        features, weights = raw[:, : self.raw_dim], raw[:, self.raw_dim]
        if voxel_size > 0:
            points, features = voxel_merge(points, features, weights, voxel_size)
        return decode_raw_gaussians(
            points, features, self.sh_degree, self.scale_factor, self.max_scale
        )

    # ------------------------------------------------------------------ forward
    def forward(
        self,
        context: dict[str, Tensor],
        *,
        voxel_size: float | None = None,
        max_gaussians: int | None = None,
        frame: str = "scene",
    ) -> ModelOutput:
        """Predict Gaussians and cameras from ``context["image"] [B, V, 3, H, W]`` in [0, 1].

        Poses and intrinsics in ``context`` are ignored (pose-free). ``H`` and ``W`` must be
        multiples of ``patch_size`` (14).

        Args:
            voxel_size: side of the voxels the per-pixel Gaussians merge into, in the release's
                world units (``None``: the model's, 0.002 as released; 0: no merge).
            max_gaussians: keep at most this many per scene (the most opaque).
            frame: ``"scene"`` (predicted view 0 = identity, largest camera distance 1) or
                ``"release"`` (the release's world frame).

        Returns:
            ``ModelOutput`` with padded ``gaussians`` (``mask`` where scenes differ),
            ``extrinsics [B, V, 4, 4]`` (camera-to-world, predicted), ``intrinsics [B, V, 3, 3]``
            (normalised), ``depth [B, V, H, W]``, ``depth_conf``, ``points [B, V, H, W, 3]``,
            ``pose_encoding [B, V, 9]``, ``voxel_ratio [B]`` (Gaussians per pixel) and
            ``scene_scale [B]`` (distances of the release's frame divided by it).
        """
        if frame not in FRAMES:
            raise ValueError(f"frame must be one of {FRAMES}, got {frame!r}")
        voxel_size = self.voxel_size if voxel_size is None else float(voxel_size)
        if not voxel_size >= 0:
            raise ValueError(f"voxel_size must be >= 0, got {voxel_size}")
        b, v, h, w = check_context(context, require_poses=False)
        p = self.patch_size
        if h % p or w % p:
            raise ValueError(
                f"context['image'] is {h}x{w}; AnySplat needs sides that are multiples of {p}"
            )
        dtype = self.camera_head.embed_pose.weight.dtype
        images = context["image"].to(dtype)
        layers, cameras, geometry = trunk_and_geometry(
            self.aggregator, self.camera_head, self.depth_head, images, self.out_layers, dtype
        )
        (encoding, c2w, intrinsics), (depth, depth_conf, points) = cameras, geometry
        start = self.aggregator.patch_start_idx

        # --- Gaussians: per pixel, merged into voxels one scene at a time ---
        raw = rearrange(
            self._raw_gaussians(layers, images, start), "(b v) c h w -> b (v h w) c", b=b
        )
        flat_points = rearrange(points, "b v h w c -> b (v h w) c")
        scenes = [self._scene(raw[i], flat_points[i], voxel_size) for i in range(b)]
        gaussians = pad_scenes(scenes)
        ratio = torch.tensor([g.num_slots / (v * h * w) for g in scenes], device=images.device)

        scale = torch.ones(b, dtype=dtype, device=images.device)
        if frame == "scene":
            c2w, gaussians, points, scale = to_scene_frame(c2w, gaussians, points)
            depth = depth / scale[:, None, None, None]
        if max_gaussians is not None:
            gaussians = gaussians.prune(max_count=max_gaussians)
        diagnostics = {
            "depth_conf": depth_conf,
            "points": points,
            "pose_encoding": encoding,
            "voxel_ratio": ratio,
            "scene_scale": scale,
        }
        return ModelOutput(
            gaussians, depth=depth, extrinsics=c2w, intrinsics=intrinsics, diagnostics=diagnostics
        )


# Inference knobs (models.weights.knobs): the voxel side of the merge, and every family's max_gaussians.
# The trunk, the cameras, the depth and the per-pixel raw parameters do not depend on them.
INFERENCE_KNOBS = (
    Knob(
        "voxel_size",
        "float",
        low=0.0,
        high=None,
        step=0.001,
        sweep=(0.0, 0.002, 0.005, 0.01),
        default_attr="voxel_size",
        help="side of the voxels the per-pixel Gaussians merge into, in the release's world units "
        "(VGGT's: mean point distance about 1); larger: fewer Gaussians; 0: one per pixel",
    ),
    MAX_GAUSSIANS,
)
KNOB_FREE_MODULES = (
    "aggregator",
    "camera_head",
    "depth_head",
    "feature_head",
    "image_merger",
    "gaussian_out",
)


# ----------------------------------------------------------------------------- official weights
# Release keys with no counterpart here, and why (consumed and dropped).
DROPPED_KEYS = {
    # DINOv2's mask-token embedding: only used for masked-image training, never at inference.
    "encoder.aggregator.patch_embed.mask_token": "DINOv2 mask token (masked training only)",
}
# The training configuration's frozen VGGT copies (``distill: true``), the teacher of its
# distillation loss; unused at inference. A file may hold them or not: both load.
DISTILL_PREFIXES = (
    "encoder.distill_aggregator.",
    "encoder.distill_camera_head.",
    "encoder.distill_depth_head.",
)
_HEAD_RENAMES = (  # release prefix under encoder.gaussian_param_head. -> ours
    ("input_merger.", "image_merger."),
    ("scratch.output_conv2.", "gaussian_out."),
)


def _map_key(key: str) -> str | None:
    """Our parameter name of a release key (``None``: not a key of this release)."""
    if not key.startswith("encoder."):
        return None
    key = key[len("encoder.") :]
    if key.startswith(("aggregator.", "camera_head.")):
        return key
    for part, ours in (("depth_head.", "depth_head."), ("gaussian_param_head.", "feature_head.")):
        if not key.startswith(part):
            continue
        rest = key[len(part) :]
        for old, new in _HEAD_RENAMES if part == "gaussian_param_head." else ():
            if rest.startswith(old):
                return new + rest[len(old) :]
        rest = release_dpt_key(rest)
        return None if rest is None else ours + rest
    return None


def checkpoint_filter_fn(checkpoint: dict, model: nn.Module) -> dict[str, Tensor]:
    """Map the release's ``model.safetensors`` (or a ``torch.load``-ed dict holding it under
    ``state_dict``/``model``) onto ``AnySplatRelease``.

    Keys lose ``encoder.``; the Gaussian head's DPT becomes ``feature_head``, its image
    convolution ``image_merger`` and its output convolutions ``gaussian_out``. ``DROPPED_KEYS``
    and the distillation copies (``DISTILL_PREFIXES``) are consumed and dropped; any other key
    this architecture lacks is refused. Tensors come back in the model's dtypes.

    Raises:
        ValueError: one line, when the file is not this release's format or does not match the
            model's configuration (unknown or missing keys, shapes).
    """
    state = checkpoint
    for wrapper in ("state_dict", "model"):
        if isinstance(state, dict) and isinstance(state.get(wrapper), dict):
            state = state[wrapper]
    if not isinstance(state, dict) or not all(isinstance(v, Tensor) for v in state.values()):
        raise ValueError("not an AnySplat release checkpoint: expected a dict of tensors")
    if "encoder.aggregator.camera_token" not in state or not any(
        k.startswith("encoder.gaussian_param_head.scratch.output_conv2.") for k in state
    ):
        raise ValueError(
            "not an AnySplat release checkpoint: no 'encoder.aggregator.camera_token' or "
            f"'encoder.gaussian_param_head.*' (found {len(state)} keys, e.g. {sorted(state)[:2]})"
        )
    targets = model.state_dict()
    mapped: dict[str, Tensor] = {}
    unknown = []
    for key, value in state.items():
        if key in DROPPED_KEYS or key.startswith(DISTILL_PREFIXES):
            continue
        name = _map_key(key)
        if name is None or name not in targets:
            unknown.append(key)
            continue
        mapped[name] = value
    return check_mapped_state(mapped, unknown, targets, "AnySplat", "anysplat_* architecture")


# ----------------------------------------------------------------------------- registry
_TINY = dict(
    embed_dim=32,
    depth=4,
    num_heads=2,
    encoder_depth=2,
    encoder_heads=2,
    pos_grid=4,
    image_size=56,
    out_layers=[0, 1, 2, 3],
    camera_depth=1,
    camera_heads=2,
    depth_features=32,
    depth_channels=[16, 32, 32, 32],
    gaussian_features=256,
    gaussian_channels=[16, 32, 32, 32],
)


@register_model
def anysplat_vggt(**kwargs) -> AnySplatRelease:
    """AnySplat as released (VGGT-1B trunk, one Gaussian per pixel merged into voxels)."""
    return AnySplatRelease(**kwargs)


@register_model
def anysplat_vggt_tiny(**kwargs) -> AnySplatRelease:
    """The released architecture at a tiny width and depth (tests; the parity fixtures' size).
    Its Gaussian DPT keeps the released 256 features (the release hard-codes the 128
    full-resolution channels)."""
    return AnySplatRelease(**{**_TINY, **kwargs})


register_pretrained_cfgs(
    {
        "anysplat_vggt.official_448": PretrainedCfg(
            hf_hub_id="lhjiang/anysplat",
            hf_hub_filename="model.safetensors",
            file_format="official",
            license=(
                "MIT for the code (InternRobotics/AnySplat LICENSE; the Hub card's own licence was "
                "not readable here). The weights are fine-tuned from facebook/VGGT-1B, whose "
                "checkpoint is licensed for non-commercial use (CC BY-NC 4.0 on its model card; "
                "Meta's separate VGGT-1B-Commercial is not AnySplat's start), with DINOv2 "
                "(Apache-2.0) under it: treat the released file as non-commercial"
            ),
            source=(
                "Jiang, Mao, Xu, Lu, Ren, Xiangli, Dai, Chen, Yi, Liu: AnySplat: Feed-forward 3D "
                "Gaussian Splatting from Unconstrained Views, SIGGRAPH Asia 2025 (arXiv "
                "2505.23716); github.com/InternRobotics/AnySplat (57937e4)"
            ),
            train_data=(
                "not stated for the released file; the repository's config/experiment/"
                "multi-dataset.yaml mixes DL3DV, CO3Dv2 and ScanNet++ at 224x448, 2 to 23 "
                "context views per sample (src/dataset/data_sampler.py), 30k steps, bf16"
            ),
            input_size=(448, 448),
            views=None,
            pose_free=True,
            recipe=InputRecipe(
                image_size=(448, 448),
                multiple=14,
                resize="resize_crop",
                views=12,
                max_views=24,
                near=0.01,
                far=100.0,
                pose_scale="pose_free",
                source=(
                    "InternRobotics/AnySplat src/utils/image.py process_image (shorter side to "
                    "448, centre crop 448x448, [-1, 1]; inference.py maps back to [0, 1]), "
                    "inference.py (12 views of examples/vrnerf/riverview), "
                    "config/experiment/multi-dataset.yaml (input_image_shape [224, 448], "
                    "voxel_size 0.002), src/model/model/anysplat.py (near 0.01, far 100) @ 57937e4"
                ),
                notes=(
                    "pose-free: the model predicts the cameras and its own scale (VGGT's, mean "
                    "point distance about 1); near/far bound the rendering only; voxel_size is "
                    "in that scale"
                ),
            ),
            metrics={},
            metrics_source="authors' paper; no figure recorded here (not verified)",
            notes=(
                "The Hub file is the state dict of the official PyTorchModelHubMixin class "
                "(config.json: encoder_cfg, decoder_cfg). Aggregator weights bfloat16 (1,210 "
                "tensors), heads float32; 1.19 B parameters. The training config keeps frozen "
                "VGGT copies for distillation (encoder.distill_*, 1.16 B more if present): "
                "accepted and dropped. Voxel merge at voxel_size 0.002 as released."
            ),
        ),
    }
)
