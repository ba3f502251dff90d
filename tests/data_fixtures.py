"""Inputs the tests share: where the real data is (never copied into the repository:
``../shared/data`` beside the repository, or ``$SPLATZOO_SHARED_DATA`` where the checkout lies
elsewhere, e.g. a git worktree), gsplat's garden scene from it, and a small random context."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("SPLATZOO_SHARED_DATA", REPO_ROOT.parent / "shared" / "data"))
GARDEN = SHARED_DATA / "gsplat_test_garden.npz"


def garden_scene(path: Path = GARDEN):
    """gsplat's real garden test asset (138,766 points seen by 3 cameras at 648x420) as small
    isotropic Gaussians (scale 0.01, opacity 0.8: gsplat's own test draws scales up to 0.02).

    Returns:
        ``(gaussians, extrinsics [1, 3, 4, 4], intrinsics [1, 3, 3, 3], (H, W))``, float32 on
        the CPU; camera-to-world extrinsics and normalised intrinsics.
    """
    import numpy as np
    import torch

    from models.core.gaussians import Gaussians, rgb_to_sh
    from models.geometry.cameras import intrinsics_to_normalized

    data = np.load(path)
    height, width = int(data["height"]), int(data["width"])
    means = torch.from_numpy(data["means3d"]).float()[None]  # [1, N, 3]
    num = means.shape[1]
    rgb = torch.from_numpy(data["colors"]).float()[None] / 255.0
    gaussians = Gaussians(
        means=means,
        scales=torch.full((1, num, 3), 0.01),
        rotations=torch.tensor([1.0, 0.0, 0.0, 0.0]).repeat(1, num, 1),
        opacities=torch.full((1, num), 0.8),
        harmonics=rgb_to_sh(rgb)[..., None],
    )
    extrinsics = torch.linalg.inv(torch.from_numpy(data["viewmats"]).float())[None]
    ks = torch.from_numpy(data["Ks"]).float()  # [3, 3, 3] in pixels
    intrinsics = intrinsics_to_normalized(ks, (height, width))[None]
    return gaussians, extrinsics, intrinsics, (height, width)


def random_context(model, size: int = 32) -> dict:
    """Two random ``size``² views for ``model``; posed models also get two cameras one unit
    apart along x (normalised intrinsics, focal 1)."""
    import torch

    context = {"image": torch.rand(1, 2, 3, size, size)}
    if not getattr(model, "pose_free", False):
        context["extrinsics"] = torch.eye(4).expand(1, 2, 4, 4).clone()
        context["extrinsics"][:, 1, 0, 3] = 1.0
        intrinsics = torch.tensor([[1.0, 0, 0.5], [0, 1.0, 0.5], [0, 0, 1]])
        context["intrinsics"] = intrinsics.expand(1, 2, 3, 3)
    return context
