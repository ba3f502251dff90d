"""A VGGT-trunk release's outputs in this project's conventions, shared by the ports whose
trunk is ``models.layers.vggt`` (SplatWeaver's and AnySplat's releases).

- ``unproject_depth``: depth maps to world points with VGGT's predicted cameras (pixel ``(u, v)``
  at integer coordinates, as VGGT and both releases unproject);
- ``to_scene_frame``: cameras, Gaussians (means, scales, rotations, SH) and points from the
  release's world frame (VGGT's: roughly the first predicted camera) into the project's scene
  frame (view 0 the identity, the largest camera-centre distance 1);
- ``pad_scenes``: single-scene Gaussian sets stacked into one padded batch (``mask``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from models.core.gaussians import Gaussians, transform_gaussians
from models.geometry.cameras import invert_extrinsics, normalize_scene
from models.geometry.similarity import Similarity

__all__ = [
    "pad_scenes",
    "stack_scenes",
    "to_scene_frame",
    "unproject_depth",
]


def unproject_depth(depth: Tensor, w2c: Tensor, intrinsics: Tensor) -> Tensor:
    """World points ``[B, V, H, W, 3]`` of ``depth [B, V, H, W]`` (pixel ``(u, v)`` at integer
    coordinates, as released) with world-to-camera ``[B, V, 3, 4]``, pixel intrinsics."""
    h, w = depth.shape[-2:]
    u = torch.arange(w, device=depth.device, dtype=depth.dtype)[None, None, None, :]
    v = torch.arange(h, device=depth.device, dtype=depth.dtype)[None, None, :, None]
    k = intrinsics[..., None, None, :, :]  # [B, V, 1, 1, 3, 3]
    x = (u - k[..., 0, 2]) * depth / k[..., 0, 0]
    y = (v - k[..., 1, 2]) * depth / k[..., 1, 1]
    camera = torch.stack([x, y, depth], dim=-1)  # [B, V, H, W, 3]
    rotation = w2c[..., :3, :3]
    center = -torch.einsum("bvji,bvj->bvi", rotation, w2c[..., :3, 3])  # -R^T t
    return torch.einsum("bvji,bvhwj->bvhwi", rotation, camera) + center[:, :, None, None]


def pad_scenes(scenes: list[Gaussians]) -> Gaussians:
    """Stack single-scene sets into one batch, padded to the largest count (``mask`` marks valid
    entries; ``None`` when every scene has the same count)."""
    counts = [g.num_slots for g in scenes]
    most = max(counts)
    if all(c == most for c in counts):
        return stack_scenes(scenes)
    padded = []
    for g, count in zip(scenes, counts):
        extra = most - count

        def grow(t: Tensor, fill: float, extra: int = extra) -> Tensor:
            pad = t.new_full((1, extra, *t.shape[2:]), fill)
            return torch.cat([t, pad], dim=1)

        rotations = grow(g.rotations, 0.0)
        rotations[:, count:, 0] = 1.0
        mask = torch.arange(most, device=g.device)[None] < count
        padded.append(
            Gaussians(
                means=grow(g.means, 0.0),
                scales=grow(g.scales, 1e-7),
                rotations=rotations,
                opacities=grow(g.opacities, 0.0),
                harmonics=grow(g.harmonics, 0.0),
                mask=mask,
            )
        )
    return stack_scenes(padded)


def stack_scenes(scenes: list[Gaussians]) -> Gaussians:
    fields = ("means", "scales", "rotations", "opacities", "harmonics")
    out = {key: torch.cat([getattr(g, key) for g in scenes], dim=0) for key in fields}
    masks = [g.mask for g in scenes]
    out["mask"] = (
        None
        if all(m is None for m in masks)
        else torch.cat([g.valid_mask() for g in scenes], dim=0)
    )
    return Gaussians(**out)


def to_scene_frame(
    c2w: Tensor, gaussians: Gaussians, points: Tensor
) -> tuple[Tensor, Gaussians, Tensor, Tensor]:
    """Move cameras ``[B, V, 4, 4]``, Gaussians and points ``[B, V, H, W, 3]`` into the scene
    frame: view 0 the identity, the largest camera-centre distance 1 (``normalize_scene``)."""
    moved, _, scale = normalize_scene(c2w)  # scale [B]
    reference = invert_extrinsics(c2w[:, :1])[:, 0]  # [B, 4, 4]
    to_scene = Similarity(1.0 / scale, reference[:, :3, :3], reference[:, :3, 3] / scale[:, None])
    return moved, transform_gaussians(gaussians, to_scene), to_scene.points(points), scale
