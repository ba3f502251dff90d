"""Image metrics and reference baselines, with no Lightning: PSNR, SSIM, LPIPS (torchmetrics' VGG
when its weights are on disk) and the nearest-view / mean-colour baselines. Used by training,
eval.py, infer.py and the benches alike."""

from __future__ import annotations

import os
import warnings

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "VGG16_WEIGHTS",
    "build_lpips",
    "lpips_inputs",
    "mean_color_baseline",
    "nearest_view_baseline",
    "psnr",
    "psnr_per_image",
    "ssim_per_image",
]


def psnr_per_image(prediction: Tensor, target: Tensor) -> Tensor:
    """PSNR of images clipped to [0, 1]; ``[..., 3, H, W]`` → ``[...]``."""
    mse = (prediction.clamp(0, 1) - target.clamp(0, 1)).square().flatten(-3).mean(-1)
    return -10 * torch.log10(mse.clamp_min(1e-10))


def ssim_per_image(prediction: Tensor, target: Tensor) -> Tensor:
    """SSIM with an 11x11 Gaussian window (sigma 1.5); ``[..., 3, H, W]`` → ``[...]``."""
    lead = prediction.shape[:-3]
    p = prediction.clamp(0, 1).reshape(-1, *prediction.shape[-3:]).float()
    t = target.clamp(0, 1).reshape(-1, *target.shape[-3:]).float()
    # torchmetrics is imported on first use: its import loads matplotlib, which writes a font
    # cache into the home folder (a command refusing a bad setting must leave nothing there)
    from torchmetrics.functional.image import structural_similarity_index_measure

    values = structural_similarity_index_measure(
        p, t, data_range=1.0, kernel_size=11, sigma=1.5, reduction="none"
    )
    return values.reshape(lead)


VGG16_WEIGHTS = "vgg16-397923af.pth"  # the torchvision file torchmetrics' LPIPS loads


_LPIPS_WARNED: set[str] = set()


def build_lpips(required: bool) -> nn.Module | None:
    """torchmetrics' VGG LPIPS, or ``None`` (with a warning) when its weights are not available.

    The VGG weights come from torchvision's cache (``$TORCH_HOME/hub/checkpoints``); offline without
    them LPIPS cannot be computed. ``required=True`` turns the warning into an error.
    """
    vgg_file = os.path.join(torch.hub.get_dir(), "checkpoints", VGG16_WEIGHTS)
    try:
        if not os.path.isfile(vgg_file):  # never try a download: offline machines hang or fail
            raise FileNotFoundError(f"{vgg_file} is missing")
        from torchmetrics.image.lpip import LearnedPerceptualImagePatchSimilarity

        metric = LearnedPerceptualImagePatchSimilarity(net_type="vgg", normalize=True)
    except Exception as error:  # no weights offline, or lpips extras missing
        message = (
            "LPIPS (VGG) weights are not available locally "
            f"({type(error).__name__}: {str(error).splitlines()[0][:160]}); "
            "put torchvision's vgg16 weights there to enable it"
        )
        if required:
            raise RuntimeError(message) from error
        if message not in _LPIPS_WARNED:  # once per process, not once per module and stage
            _LPIPS_WARNED.add(message)
            warnings.warn(message + ". LPIPS is skipped.", stacklevel=2)
        return None
    for p in metric.parameters():
        p.requires_grad_(False)
    return metric


def psnr(prediction: Tensor, target: Tensor) -> float:
    """PSNR of two images (or image sets) as one number: the MSE over every pixel."""
    mse = (prediction.clamp(0, 1) - target.clamp(0, 1)).square().mean().clamp_min(1e-10)
    return float(-10 * torch.log10(mse))


def lpips_inputs(images: Tensor) -> Tensor:
    """``[..., 3, H, W]`` in [0, 1] → ``[N, 3, H, W]`` in [-1, 1], what the LPIPS network takes."""
    return images.flatten(0, -4).clamp(0, 1) * 2 - 1


def mean_color_baseline(context: dict[str, Tensor], target_images: Tensor) -> Tensor:
    """Baseline: every target pixel gets the mean colour of the context views."""
    mean = context["image"].mean(dim=(1, 3, 4))  # [B, 3]
    return mean[:, None, :, None, None].expand_as(target_images)


def nearest_view_baseline(context: dict[str, Tensor], target: dict[str, Tensor]) -> Tensor:
    """Baseline: each target is the context image whose camera centre is closest."""
    ctx_centers = context["extrinsics"][..., :3, 3]  # [B, Vc, 3]
    tgt_centers = target["extrinsics"][..., :3, 3]  # [B, Vt, 3]
    nearest = torch.cdist(tgt_centers, ctx_centers).argmin(dim=-1)  # [B, Vt]
    index = nearest[..., None, None, None].expand(-1, -1, *context["image"].shape[2:])
    image = torch.gather(context["image"], 1, index)
    if image.shape[-2:] != target["image"].shape[-2:]:
        image = F.interpolate(image.flatten(0, 1), size=target["image"].shape[-2:], mode="bilinear")
        image = image.reshape(target["image"].shape)
    return image
