"""The user's own photos as a test set.

``holdout=K`` keeps every K-th photo out, starting with the first (indices 0, K, 2K, ...: the
LLFF / Mip-NeRF 360 convention), ``holdout=NAME,NAME`` the named ones (file names or stems).
Held-out photos never enter a window. :func:`score_holdout` renders each at its camera from a
scene and scores it against the photo (PSNR and SSIM of :mod:`models.pipeline.metrics`; LPIPS when its VGG
weights are on disk, else left out and said), beside the **nearest-view baseline**: the input
photo whose camera is nearest (centre distance relative to the capture's median neighbour
distance, plus the angle between viewing directions in radians), shown as is at the same size.
Everything is scored at the model's input size (``holdout.image_size``).

Photos without poses (a pose-free model on bare photos): the held-out photos have no camera to
render at, so :func:`fit_holdout_cameras` places each one as the pose-free evaluation protocol
does (``eval.py``, NoPoSplat's): it starts at the nearest input photo's camera in the scene's frame
(nearest by the capture's overlap graph) and optimises that camera against the held-out photo
with the Gaussians fixed, :data:`HOLDOUT_POSE_STEPS` steps (``models.pipeline.pose_fit``), never
touching the scene. ``summary.json`` ``holdout.cameras`` says so and how far each camera moved.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from datamodules.errors import InputError
from models.core.gaussians import Gaussians
from models.core.pixels import image_to_uint8
from models.pipeline.inference import render_views
from models.pipeline.metrics import build_lpips, lpips_inputs, psnr_per_image, ssim_per_image
from models.pipeline.pose_fit import fit_target_poses, pose_error

__all__ = [
    "HOLDOUT_POSE_STEPS",
    "HoldoutError",
    "HoldoutScores",
    "HoldoutViews",
    "holdout_indices",
    "holdout_summary",
    "holdout_table",
    "holdout_views",
    "fit_holdout_cameras",
    "nearest_views",
    "save_holdout",
    "score_holdout",
]


#: Pose-fit steps of a held-out camera the photos give no pose for (fixed, as eval's protocol).
HOLDOUT_POSE_STEPS = 100


class HoldoutError(InputError):
    """A ``holdout`` setting that does not fit the capture (one line)."""


@dataclass
class HoldoutViews:
    """Held-out photos with their cameras, in the frame of the scene that renders them.

    Attributes:
        names: photo names.
        images: ``[H, 3, h, w]`` the photos in [0, 1] (at the model's input size).
        extrinsics: ``[H, 4, 4]`` camera-to-world.
        intrinsics: ``[H, 3, 3]`` normalised.
        nearest_names: per photo, the nearest input photo (the baseline).
        nearest_images: ``[H, 3, h, w]`` those photos, resized to ``images``' size.
    """

    names: list[str]
    images: Tensor
    extrinsics: Tensor
    intrinsics: Tensor
    nearest_names: list[str]
    nearest_images: Tensor

    @property
    def image_size(self) -> tuple[int, int]:
        return int(self.images.shape[-2]), int(self.images.shape[-1])


@dataclass
class HoldoutScores:
    """What :func:`score_holdout` returns: ``metrics[name]`` per photo, ``mean`` over them, the
    renders ``[H, 3, h, w]`` and notes (e.g. LPIPS left out)."""

    metrics: dict[str, dict[str, Any]]
    mean: dict[str, float]
    renders: Tensor
    notes: list[str] = field(default_factory=list)


def holdout_indices(spec: Any, names: Sequence[str]) -> list[int]:
    """The indices ``holdout=`` names (module doc); ``None``/``0``/empty: none.

    Raises:
        HoldoutError: not a whole number >= 2 nor photo names of the capture.
    """
    if spec in (None, "", 0, False):
        return []
    if isinstance(spec, (list, tuple)):
        parts = [str(p).strip() for p in spec]
    else:
        text = str(spec).strip()
        if text.isdigit():
            k = int(text)
            if k < 2:
                raise HoldoutError(f"holdout={spec}: every K-th photo needs K >= 2")
            return list(range(0, len(names), k))
        parts = [p.strip() for p in text.split(",") if p.strip()]
    out = []
    for part in parts:
        hits = [i for i, n in enumerate(names) if part in (n, Path(n).stem)]
        if not hits:
            shown = ", ".join(list(names)[:4])
            raise HoldoutError(
                f"holdout={spec}: {part} is not a photo of this capture ({shown}, ...)"
            )
        out.append(hits[0])
    return sorted(set(out))


def nearest_views(holdout_e: Tensor, input_e: Tensor) -> list[int]:
    """Per held-out camera, the index of the nearest input camera: centre distance over the
    inputs' median nearest-neighbour distance, plus the angle between optical axes (radians)."""
    h, e = holdout_e.double().cpu(), input_e.double().cpu()
    d = torch.cdist(h[:, :3, 3], e[:, :3, 3])  # [H, V]
    if len(e) > 1:
        own = torch.cdist(e[:, :3, 3], e[:, :3, 3]) + torch.eye(len(e)) * 1e30
        unit = float(own.min(dim=1).values.median())
    else:
        unit = 1.0
    unit = unit if unit > 1e-12 else 1.0
    cosine = (h[:, None, :3, 2] * e[None, :, :3, 2]).sum(-1).clamp(-1, 1)
    return (d / unit + torch.arccos(cosine)).argmin(dim=1).tolist()


def holdout_views(
    names: Sequence[str],
    images: Tensor,
    extrinsics: Tensor,
    intrinsics: Tensor,
    held: Sequence[int],
    inputs: Sequence[int],
    nearest: Sequence[int] | None = None,
) -> HoldoutViews:
    """:class:`HoldoutViews` of photos ``held`` with their nearest photo among ``inputs``
    (``images`` ``[V, 3, h, w]``, cameras ``[V, ...]`` all in one frame); ``nearest``: the
    nearest photo's index per held-out photo when known otherwise (default: nearest camera)."""
    held, inputs = list(held), list(inputs)
    if nearest is None:
        nearest = [inputs[j] for j in nearest_views(extrinsics[held], extrinsics[inputs])]
    nearest = list(nearest)
    base = images[nearest].float()
    if base.shape[-2:] != images.shape[-2:]:
        base = torch.nn.functional.interpolate(base, size=images.shape[-2:], mode="area")
    return HoldoutViews(
        names=[names[i] for i in held],
        images=images[held].float(),
        extrinsics=extrinsics[held].float(),
        intrinsics=intrinsics[held].float(),
        nearest_names=[names[i] for i in nearest],
        nearest_images=base,
    )


def fit_holdout_cameras(
    gaussians: Gaussians,
    images: Tensor,
    start: Tensor,
    intrinsics: Tensor,
    *,
    steps: int = HOLDOUT_POSE_STEPS,
    backend: str = "auto",
) -> tuple[Tensor, dict[str, Any]]:
    """Held-out cameras placed against their photos with the scene fixed (module doc).

    Args:
        gaussians: the scene (a batch of one); never modified.
        images: ``[H, 3, h, w]`` the held-out photos in [0, 1].
        start: ``[H, 4, 4]`` camera-to-world starts (the nearest input photo's camera).
        intrinsics: ``[H, 3, 3]`` normalised (kept fixed).
        steps: pose-fit steps per camera.
        backend: renderer backend.

    Returns:
        ``[H, 4, 4]`` the fitted cameras and ``summary.json``'s ``holdout.cameras``: how they
        were placed, the steps and, per photo, how far each moved (``rotation_deg``;
        ``translation`` in scene units).
    """
    device = gaussians.means.device
    fitted = fit_target_poses(
        gaussians.detach(),
        images[None].to(device).float(),
        start[None].to(device).float(),
        intrinsics[None].to(device).float(),
        steps=int(steps),
        backend=backend,
        announce="held-out cameras' pose fit",  # how long, from its measured steps
    )[0].cpu()
    angle, distance = pose_error(fitted.double(), start.double().cpu())
    record = {
        "placement": "fitted: each held-out camera starts at its nearest input photo's camera "
        "and is optimised against the photo with the Gaussians fixed (the photos have no poses)",
        "steps": int(steps),
        "rotation_deg": [round(float(a), 3) for a in angle],
        "translation": [round(float(t), 5) for t in distance],
    }
    return fitted.float(), record


def refit_holdout_cameras(
    gaussians: Gaussians,
    views: HoldoutViews,
    names: list[str],
    extrinsics: Tensor,
    *,
    backend: str = "auto",
) -> tuple[HoldoutViews, dict[str, Any]]:
    """``views`` with their cameras placed again against ``gaussians`` (a refined scene): the
    pose-free protocol places a held-out camera against the scene it scores, and a joint
    refinement moved the input cameras and the scene they were placed against. Each starts at
    the refined camera of its nearest input photo (``extrinsics [V, 4, 4]`` of ``names``), as
    :func:`fit_holdout_cameras` does; the record is that function's."""
    start = torch.stack([extrinsics[names.index(name)] for name in views.nearest_names])
    cameras, record = fit_holdout_cameras(
        gaussians, views.images, start, views.intrinsics, backend=backend
    )
    record["placement"] += "; placed again against the refined scene, from the refined cameras"
    return dataclasses.replace(views, extrinsics=cameras), record


def score_holdout(
    gaussians: Gaussians,
    views: HoldoutViews,
    *,
    backend: str = "auto",
    lpips: bool = True,
) -> HoldoutScores:
    """Render every held-out view from ``gaussians`` (in the views' frame) and score it.

    Args:
        gaussians: the scene (a batch of one).
        views: the held-out photos (:func:`holdout_views`).
        backend: renderer backend.
        lpips: add LPIPS (and the baseline's) when its weights are on disk.

    Returns:
        :class:`HoldoutScores`; per photo ``psnr``, ``ssim``, ``nearest_view``,
        ``nearest_view_psnr``, ``nearest_view_ssim`` (and ``lpips``, ``nearest_view_lpips``).
    """
    device = gaussians.means.device
    with torch.inference_mode():
        renders = render_views(
            gaussians,
            views.extrinsics.to(device),
            views.intrinsics.to(device),
            views.image_size,
            backend,
            "held-out views",
        ).clamp(0, 1)  # [H, 3, h, w]
    target, base = views.images.cpu(), views.nearest_images.cpu()
    values = {
        "psnr": psnr_per_image(renders, target),
        "ssim": ssim_per_image(renders, target),
        "nearest_view_psnr": psnr_per_image(base, target),
        "nearest_view_ssim": ssim_per_image(base, target),
    }
    notes = []
    if lpips:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            metric = build_lpips(required=False)
        if metric is None:
            notes.append(
                "LPIPS left out: "
                + (str(caught[0].message) if caught else "its VGG weights are not on disk")
            )
        else:
            with torch.inference_mode():
                values["lpips"] = torch.stack(
                    [
                        metric(lpips_inputs(r[None]), lpips_inputs(t[None]))
                        for r, t in zip(renders, target)
                    ]
                )
                values["nearest_view_lpips"] = torch.stack(
                    [
                        metric(lpips_inputs(b[None]), lpips_inputs(t[None]))
                        for b, t in zip(base, target)
                    ]
                )
    metrics: dict[str, dict[str, Any]] = {}
    for i, name in enumerate(views.names):
        entry: dict[str, Any] = {k: round(float(v[i]), 4) for k, v in values.items()}
        entry["nearest_view"] = views.nearest_names[i]
        metrics[name] = entry
    mean = {k: round(float(v.float().mean()), 4) for k, v in values.items()}
    return HoldoutScores(metrics, mean, renders, notes)


def holdout_summary(
    views: HoldoutViews, scores: HoldoutScores, before: HoldoutScores | None = None
) -> dict[str, Any]:
    """``summary.json``'s ``holdout``: ``views``, ``image_size``, ``metrics[name]`` (plus
    ``psnr_before_refine`` when the scores ``before`` a refinement are given) and ``mean``."""
    metrics = {name: dict(entry) for name, entry in scores.metrics.items()}
    mean = dict(scores.mean)
    if before is not None:
        for name, entry in metrics.items():
            entry["psnr_before_refine"] = before.metrics[name]["psnr"]
        mean["psnr_before_refine"] = before.mean["psnr"]
    return {
        "views": list(views.names),
        "image_size": list(views.image_size),
        "rule": "every K-th photo from the first, or the named ones; never in any window",
        "baseline": "nearest_view: the input photo with the nearest camera, as is",
        "metrics": metrics,
        "mean": mean,
        "notes": list(scores.notes),
    }


def holdout_table(summary: dict[str, Any]) -> str:
    """The printed table of a ``holdout`` summary: one row per photo and the mean."""
    metrics, mean = summary["metrics"], summary["mean"]
    lpips = "lpips" in mean
    head = (
        f"{'held-out photo':<28} {'PSNR':>7} {'SSIM':>6} {'nearest PSNR':>13} {'nearest SSIM':>13}"
    )
    head += f" {'LPIPS':>6}" if lpips else ""
    head += "  nearest photo"
    lines = [head, "-" * len(head)]

    def row(label: str, e: dict, nearest: str) -> str:
        text = (
            f"{label[:28]:<28} {e['psnr']:7.2f} {e['ssim']:6.3f} {e['nearest_view_psnr']:13.2f} "
            f"{e['nearest_view_ssim']:13.3f}"
        )
        text += f" {e['lpips']:6.3f}" if lpips else ""
        return text + f"  {nearest}"

    for name, entry in metrics.items():
        lines.append(row(name, entry, entry["nearest_view"]))
    lines.append(row("mean", mean, ""))
    return "\n".join(lines)


def _error_image(render: Tensor, target: Tensor) -> np.ndarray:
    """``|render - photo|`` averaged over channels, x4, as a heat map ``[h, w, 3]`` uint8."""
    error = (render - target).abs().mean(0).mul(4).clamp(0, 1).numpy()  # [h, w]
    heat = (
        np.stack([error, np.clip(2 * error - 1, 0, 1) * 0.6, 1 - error], axis=-1) * error[..., None]
    )
    return (heat * 255 + 0.5).astype(np.uint8)


def save_holdout_renders(names: Sequence[str], renders: Tensor, folder: Path) -> None:
    """Write ``folder/<stem>.png`` per render (``renders`` ``[H, 3, h, w]`` in [0, 1])."""
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    for name, render in zip(names, renders):
        Image.fromarray(image_to_uint8(render)).save(folder / f"{Path(name).stem}.png")


def save_holdout(views: HoldoutViews, scores: HoldoutScores, folder: Path, sheet: Path) -> None:
    """Write ``folder/<stem>.png`` per render and the contact sheet ``sheet`` (a row per photo:
    photo | render | error, labelled with the PSNR and the nearest-view PSNR)."""
    from PIL import Image, ImageDraw

    save_holdout_renders(views.names, scores.renders, folder)
    h, w = views.image_size
    zoom = max(1, math.ceil(128 / max(h, w)))
    cell_h, cell_w, label = h * zoom, w * zoom, 14
    rows = len(views.names)
    canvas = Image.new("RGB", (3 * cell_w, rows * (cell_h + label) + label), "white")
    draw = ImageDraw.Draw(canvas)
    for c, title in enumerate(("photo", "render", "error x4")):
        draw.text((c * cell_w + 4, 1), title, fill="black")
    for r, name in enumerate(views.names):
        top = label + r * (cell_h + label)
        tiles = (
            image_to_uint8(views.images[r]),
            image_to_uint8(scores.renders[r]),
            _error_image(scores.renders[r], views.images[r]),
        )
        for c, tile in enumerate(tiles):
            image = Image.fromarray(tile).resize((cell_w, cell_h), Image.NEAREST)
            canvas.paste(image, (c * cell_w, top))
        e = scores.metrics[name]
        text = f"{Path(name).stem}: {e['psnr']:.2f} dB (nearest view {e['nearest_view_psnr']:.2f})"
        draw.text((4, top + cell_h + 1), text, fill="black")
    canvas.save(sheet)
