"""ZipSplat's quality/size curve: PSNR, SSIM and Gaussian count at several cluster ratios.

    python bench/zipsplat_ratio.py --weights CKPT_OR_DIR [--baseline PIXEL_ALIGNED_CKPT_OR_DIR]
        [--data synthetic] [--root DIR] [--ratios 1 0.5 0.25 0.1] [--refine-steps 100]
        [--max-scenes N] [--batch-size 8] [--threads N] [--json OUT.json]

Scores a trained ZipSplat (a Lightning ``.ckpt`` from ``train.py experiment=synthetic_zipsplat``,
or a ``save_pretrained`` folder) on the test split of the data config (the evaluation index picks
context and target views, as in ``eval.py``) at every ratio, and optionally a pixel-aligned
baseline once, then prints a Markdown table. Metrics follow ``eval.py``: PSNR on images clipped
to [0, 1] and SSIM (11x11 Gaussian window), averaged over each scene's targets, then over scenes.
Pose-free models are also scored after test-time target-pose refinement
(``models.pose_refinement``), the pose-free protocol; ``--refine-steps 0`` skips it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from models import create_model, render  # noqa: E402
from models.lightning_module import psnr_per_image, ssim_per_image  # noqa: E402
from models.pose_refinement import refine_target_poses  # noqa: E402
from models.pretrained import (  # noqa: E402
    METADATA_KEY,
    WEIGHTS_NAME,
    PretrainedError,
    load_checkpoint_state_dict,
    load_state_dict_strict,
    read_config,
    read_safetensors,
)


def load_network(path: str | os.PathLike) -> tuple[torch.nn.Module, str]:
    """Rebuild a network with its recorded constructor arguments and load its weights strictly.

    Args:
        path: a Lightning ``.ckpt`` (the LightningModule records ``model_name`` and
            ``model_config``) or a ``save_pretrained`` folder (``config.json`` +
            ``model.safetensors``).

    Returns:
        The model in eval mode and its registry name.
    """
    path = Path(path).expanduser()
    if path.is_file() and path.suffix == ".ckpt":
        state, checkpoint = load_checkpoint_state_dict(path)
        hparams = checkpoint.get("hyper_parameters") or {}
        name = hparams.get("model_name")
        config = dict(hparams.get("model_config") or {})
    elif path.is_dir():
        config = read_config(path)
        if config is None:
            raise PretrainedError(path, "no config.json in this folder")
        name = (config.pop(METADATA_KEY, None) or {}).get("model_name")
        state = read_safetensors(path / WEIGHTS_NAME)
    else:
        raise PretrainedError(path, "expected a .ckpt file or a save_pretrained folder")
    if not name:
        raise PretrainedError(path, "the weights do not record their registry model name")
    config.pop("pretrained_backbone", None)  # the loaded weights replace any initial ones
    model = create_model(name, **config)
    load_state_dict_strict(model, state, path, name)
    return model.eval(), name


def test_loader(data: str, root: str | None, batch_size: int):
    """The data config's test loader (``configs/data/<data>.yaml``, through Hydra)."""
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    overrides = [
        f"data={data}",
        f"data.test_batch_size={batch_size}",
        "data.num_workers=0",
        "data.persistent_workers=false",
    ]
    if root is not None:
        overrides += [f"data.root={root}", "data.generate_if_missing=false"]
    with initialize_config_dir(config_dir=str(REPO_ROOT / "configs"), version_base="1.3"):
        cfg = compose(config_name="train.yaml", overrides=overrides)
    datamodule = instantiate(cfg.data)
    datamodule.setup("test")
    return datamodule.test_dataloader()


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
        shape = (int(images.shape[-2]), int(images.shape[-1]))
        out = render(gaussians, target["extrinsics"], target["intrinsics"], shape, backend=backend)
        b = images.shape[0]
        _, v, _, h, w = context["image"].shape
        values = {
            "gaussians": gaussians.count().double(),
            "pixels_per_gaussian": (v * h * w) / gaussians.count().double(),
            "psnr": psnr_per_image(out.color, images).mean(dim=1).double(),
            "ssim": ssim_per_image(out.color, images).mean(dim=1).double(),
        }
        if pose_free and refine_steps > 0:
            refined = refine_target_poses(
                gaussians,
                images,
                target["extrinsics"],
                target["intrinsics"],
                steps=refine_steps,
                backend=backend,
            )
            out = render(gaussians, refined, target["intrinsics"], shape, backend=backend)
            values["refined_psnr"] = psnr_per_image(out.color, images).mean(dim=1).double()
            values["refined_ssim"] = ssim_per_image(out.color, images).mean(dim=1).double()
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
    parser.add_argument("--refine-steps", type=int, default=100, help="0 skips pose refinement")
    parser.add_argument("--max-scenes", type=int, help="score only the first N test scenes")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    parser.add_argument("--backend", default="auto", help="renderer backend")
    parser.add_argument("--json", help="also write the rows to this JSON file")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        model, name = load_network(args.weights)
        baseline = load_network(args.baseline) if args.baseline else None
    except (PretrainedError, ValueError, TypeError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    device = "cuda" if torch.cuda.is_available() else "cpu"
    loader = test_loader(args.data, args.root, args.batch_size)

    rows = []
    if baseline is not None:
        base_model, base_name = baseline
        metrics = evaluate(
            base_model.to(device),
            _on(loader, device),
            {},
            args.refine_steps,
            args.max_scenes,
            args.backend,
        )
        rows.append({"model": base_name, "ratio": "–", **metrics})
        print(markdown_table(rows[-1:]).splitlines()[-1], file=sys.stderr)
    model = model.to(device)
    for ratio in args.ratios:
        metrics = evaluate(
            model,
            _on(loader, device),
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


def _on(loader, device: str):
    """Batches of ``loader`` with their tensors moved to ``device``."""
    for batch in loader:
        yield {
            key: {k: v.to(device) for k, v in value.items()} if isinstance(value, dict) else value
            for key, value in batch.items()
        }


if __name__ == "__main__":
    sys.exit(main())
