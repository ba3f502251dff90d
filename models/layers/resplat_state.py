"""ReSplat's release: the raw Gaussian state of its recurrent update and the update's pieces.

The family (``models.families.resplat_release``) builds the model from these: the raw parameter
layout (``RawState``: camera-frame quaternions, raw scales, opacity logits, SH), the frozen
ResNet-18 whose features measure the rendering error, the point-layer options that make
``models.layers.point_transformer`` the release's, and the lifting of latent pixels to points.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.core.gaussians import Gaussians
from models.geometry.rotations import matrix_to_quaternion, quaternion_multiply

__all__ = [
    "D_SH",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "MIN_SCALE",
    "RAW_DIM",
    "RELEASE_POINT_OPTIONS",
    "RESNET_DIM",
    "STATE_PARAMS",
    "FrozenResNet18",
    "PointLinear",
    "RawState",
    "lift",
    "pixel_grid",
    "rgb_to_sh",
    "view_heads",
]

SH_DEGREE = 3
D_SH = (SH_DEGREE + 1) ** 2
RAW_DIM = 4 + 3 + 1 + 2 + 3 * D_SH  # quaternion, scale, opacity, offset, SH (58)
STATE_PARAMS = 3 + 3 + 4 + 1 + 3 * D_SH  # mean, scale, quaternion, opacity logit, SH (59)
RESNET_DIM = 64 + 64 + 128
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
MIN_SCALE = 1e-6

# ----------------------------------------------------------------------------- point layers
# The release's point transformers are models.layers.point_transformer's with these options:
# single-head kNN attention over projections of width attn_proj_dim, bias-free, no relative
# position encoding, its matmul arithmetic, chunks of 2^16 queries; pre-norm blocks with MLPs of
# ratio 4; no final norm.
RELEASE_POINT_OPTIONS = dict(
    heads=1,
    relative_position=False,
    qkv_bias=False,
    mlp_ratio=4.0,
    final_norm=False,
    matmul=True,
    chunk=1 << 16,
)


def view_heads(dim: int) -> int:
    """Heads of the release's low-resolution view attention at width ``dim``."""
    if dim in (3, 48):
        return 1
    return 2 if dim % 32 != 0 and dim % 16 == 0 else 4


class FrozenResNet18(nn.Module):
    """torchvision's ResNet-18 stem, layer1 and layer2 (ImageNet weights in the release), always
    in eval mode; returns conv1's output (before batch norm), layer1's and layer2's."""

    def __init__(self) -> None:
        super().__init__()
        from torchvision.models import resnet18

        net = resnet18(weights=None)
        self.conv1, self.bn1, self.relu, self.maxpool = net.conv1, net.bn1, net.relu, net.maxpool
        self.layer1, self.layer2 = net.layer1, net.layer2
        for p in self.parameters():
            p.requires_grad_(False)

    def train(self, mode: bool = True) -> FrozenResNet18:
        return super().train(False)

    def forward(self, x: Tensor) -> list[Tensor]:
        a = self.conv1(x)
        b = self.layer1(self.maxpool(self.relu(self.bn1(a))))
        return [a, b, self.layer2(b)]


# ----------------------------------------------------------------------------- geometry helpers
def pixel_grid(h: int, w: int, device, dtype) -> Tensor:
    """Pixel centres ``[h*w, 2]`` (x, y) in (0, 1), row-major."""
    ys = (torch.arange(h, device=device, dtype=dtype) + 0.5) / h
    xs = (torch.arange(w, device=device, dtype=dtype) + 0.5) / w
    y, x = torch.meshgrid(ys, xs, indexing="ij")
    return torch.stack([x, y], dim=-1).reshape(h * w, 2)


def lift(xy: Tensor, depth: Tensor, extrinsics: Tensor, intrinsics: Tensor) -> Tensor:
    """World points of normalised pixels ``xy [B, V, N, 2]`` at z-depth ``depth [B, V, N]``."""
    ones = torch.ones_like(xy[..., :1])
    k_inv = torch.linalg.inv(intrinsics)[:, :, None]  # [B, V, 1, 3, 3]
    dirs = (k_inv @ torch.cat([xy, ones], dim=-1)[..., None])[..., 0]
    dirs = dirs / dirs[..., -1:]
    dirs = (extrinsics[:, :, None, :3, :3] @ dirs[..., None])[..., 0]
    return extrinsics[:, :, None, :3, 3] + dirs * depth[..., None]


def rgb_to_sh(rgb: Tensor) -> Tensor:
    return (rgb - 0.5) / 0.28209479177387814


class RawState:
    """The release's Gaussian parameters: means ``[B, N, 3]``, scales, camera-frame raw
    quaternions (xyzw), opacity logits ``[B, N, 1]``, flattened SH ``[B, N, 3*16]``
    (channel-major). Gaussian ``n`` belongs to view ``n // (N / V)``."""

    def __init__(self, means, scales, quats, opacity_logits, sh) -> None:
        self.means, self.scales, self.quats = means, scales, quats
        self.opacity_logits, self.sh = opacity_logits, sh

    def flat(self) -> Tensor:
        return torch.cat(
            [self.means, self.scales, self.quats, self.opacity_logits, self.sh], dim=-1
        )

    def gaussians(self, extrinsics: Tensor, opacities: Tensor | None = None) -> Gaussians:
        """World-frame Gaussians (wxyz quaternions: the view's camera rotation times the
        camera-frame one); ``opacities`` overrides ``sigmoid(logits)``."""
        b, n = self.means.shape[:2]
        v = extrinsics.shape[1]
        unit = self.quats / (self.quats.norm(dim=-1, keepdim=True) + 1e-8)
        cam_wxyz = torch.cat([unit[..., 3:], unit[..., :3]], dim=-1).view(b, v, n // v, 4)
        c2w = matrix_to_quaternion(extrinsics[..., :3, :3])[:, :, None]  # [B, V, 1, 4]
        world = quaternion_multiply(c2w.expand_as(cam_wxyz), cam_wxyz).reshape(b, n, 4)
        if opacities is None:
            opacities = torch.sigmoid(self.opacity_logits[..., 0])
        return Gaussians(
            means=self.means,
            scales=self.scales,
            rotations=F.normalize(world, dim=-1),
            opacities=opacities,
            harmonics=self.sh.reshape(b, n, 3, D_SH),
        )


class PointLinear(nn.Module):
    """The update's input projection (``update_module.0.linear``)."""

    def __init__(self, in_dim: int, out_dim: int) -> None:
        super().__init__()
        self.linear = nn.Linear(in_dim, out_dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear(x)
