"""ZipSplat's quality/size curve: PSNR, SSIM and Gaussian count at several cluster ratios.

    python bench/zipsplat_ratio.py --weights CKPT_OR_DIR [--baseline PIXEL_ALIGNED_CKPT_OR_DIR]
        [--data synthetic] [--root DIR] [--ratios 1 0.5 0.25 0.1] [--refine-steps 100]
        [--max-scenes N] [--batch-size 8] [--threads N] [--json OUT.json]

Scores a trained ZipSplat (a Lightning ``.ckpt`` from ``train.py experiment=synthetic_zipsplat``,
or a ``save_pretrained`` folder) on the test split of the data config (the evaluation index picks
context and target views, as in ``eval.py``) at every ratio, and optionally a pixel-aligned
baseline once, then prints a Markdown table. Metrics follow ``eval.py``: PSNR on images clipped
to [0, 1] and SSIM (11x11 Gaussian window), averaged over each scene's targets, then over scenes.
Pose-free models are also scored after test-time target-pose fit
(``models.pipeline.pose_fit``), the pose-free protocol; ``--refine-steps 0`` skips it.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import data_config, load_weights, score_targets, test_loader, to_device  # noqa: E402

from models.pipeline.pose_fit import fit_target_poses  # noqa: E402
from models.weights.hub import PretrainedError  # noqa: E402


@torch.no_grad()
def evaluate(
    model: torch.nn.Module,
    loader,
    kwargs: dict,
    refine_steps: int,
    max_scenes: int | None,
    backend: str,
) -> dict[str, float]:
    """Mean per-scene metrics of ``model(context, **kwargs)`` over the loader's scenes."""
    pose_free = bool(getattr(model, "pose_free", False))
    sums: dict[str, float] = {}
    scenes = 0
    start = time.perf_counter()
    for batch in loader:
        context, target = batch["context"], batch["target"]
        if max_scenes is not None:
            keep = max_scenes - scenes
            if keep <= 0:
                break
            context = {k: v[:keep] for k, v in context.items()}
            target = {k: v[:keep] for k, v in target.items()}
        pred = model(context, **kwargs)
        gaussians = pred.gaussians.detach()
        images = target["image"]
        scores = score_targets(gaussians, target, backend)
        b = images.shape[0]
        _, v, _, h, w = context["image"].shape
        values = {
            "gaussians": gaussians.count().double(),
            "pixels_per_gaussian": (v * h * w) / gaussians.count().double(),
            "psnr": scores["psnr"].double(),
            "ssim": scores["ssim"].double(),
        }
        if pose_free and refine_steps > 0:
            with torch.enable_grad():
                refined = fit_target_poses(
                    gaussians,
                    images,
                    target["extrinsics"],
                    target["intrinsics"],
                    steps=refine_steps,
                    backend=backend,
                )
            scores = score_targets(gaussians, target, backend, extrinsics=refined)
            values["refined_psnr"] = scores["psnr"].double()
            values["refined_ssim"] = scores["ssim"].double()
        for key, value in values.items():
            sums[key] = sums.get(key, 0.0) + float(value.sum())
        scenes += b
    if scenes == 0:
        raise RuntimeError("the test split produced no scenes")
    result = {key: value / scenes for key, value in sums.items()}
    result["scenes"] = scenes
    result["seconds_per_scene"] = (time.perf_counter() - start) / scenes
    return result


def markdown_table(rows: list[dict]) -> str:
    """Rows of ``{"model", "ratio", metrics...}`` as a Markdown table."""

    def number(row: dict, key: str, digits: int) -> str:
        value = row.get(key)
        return "–" if value is None or math.isnan(value) else f"{value:.{digits}f}"

    lines = [
        "| model | r | Gaussians | pixels / Gaussian | PSNR | SSIM | PSNR (refined) "
        "| SSIM (refined) | s / scene |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['model']} | {row['ratio']} | {row['gaussians']:.0f} "
            f"| {number(row, 'pixels_per_gaussian', 1)} | {number(row, 'psnr', 2)} "
            f"| {number(row, 'ssim', 4)} | {number(row, 'refined_psnr', 2)} "
            f"| {number(row, 'refined_ssim', 4)} | {number(row, 'seconds_per_scene', 2)} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--weights", required=True, help="ZipSplat .ckpt or save_pretrained folder")
    parser.add_argument(
        "--baseline", help="pixel-aligned .ckpt or folder scored once for comparison"
    )
    parser.add_argument(
        "--data", default="synthetic", help="data config (configs/data/<name>.yaml)"
    )
    parser.add_argument("--root", help="dataset root (overrides the data config's)")
    parser.add_argument("--ratios", type=float, nargs="+", default=[1.0, 0.5, 0.25, 0.1])
    parser.add_argument("--refine-steps", type=int, default=100, help="0 skips pose fit")
    parser.add_argument("--max-scenes", type=int, help="score only the first N test scenes")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    parser.add_argument("--backend", default="auto", help="renderer backend")
    parser.add_argument("--json", help="also write the rows to this JSON file")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        model = load_weights(args.weights)
        baseline = load_weights(args.baseline) if args.baseline else None
    except (PretrainedError, ValueError, TypeError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    device = "cuda" if torch.cuda.is_available() else "cpu"
    loader = test_loader(data_config(args.data, args.root), batch_size=args.batch_size)
    name = model.registry_name

    rows = []
    if baseline is not None:
        metrics = evaluate(
            baseline.to(device),
            (to_device(batch, device) for batch in loader),
            {},
            args.refine_steps,
            args.max_scenes,
            args.backend,
        )
        rows.append({"model": baseline.registry_name, "ratio": "–", **metrics})
        print(markdown_table(rows[-1:]).splitlines()[-1], file=sys.stderr)
    model = model.to(device)
    for ratio in args.ratios:
        metrics = evaluate(
            model,
            (to_device(batch, device) for batch in loader),
            {"compression": ratio},
            args.refine_steps,
            args.max_scenes,
            args.backend,
        )
        rows.append({"model": name, "ratio": f"{ratio:g}", **metrics})
        print(markdown_table(rows[-1:]).splitlines()[-1], file=sys.stderr)
    print(markdown_table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
