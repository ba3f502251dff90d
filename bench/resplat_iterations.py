"""ReSplat: quality and Gaussian count of the initial set and after each refinement iteration.

Scores trained ReSplat weights on the evaluation index of a test split (the synthetic set by
default) and prints a markdown table: PSNR / SSIM on the target views and Gaussians per scene of
the initial model and after 1, 2 and 4 recurrent iterations (``--iterations``), with the PSNR gain
over the initial set, at 2 context views and at 4 (``--views``), optionally against pixel-aligned
baselines (``--baseline``). One forward with the largest iteration count scores every count: the
model returns each iteration's Gaussians (``ModelOutput.gaussians_per_iteration``).

Views the index does not have: for ``V`` views the index's outer context frames are kept (so the
scene frame, its scale and the targets stay the same) and ``V - 2`` frames strictly between them
are added, evenly spaced and never a target frame (scenes without enough free frames are
skipped). Scoring at 4 views a model trained on 2 measures how it generalises to more views.

The targets are checked at the end: 16x fewer Gaussians than pixel-aligned, every
iteration up to 2 raises PSNR, and 2 iterations give at least 0.5 dB over the initial set.

Usage::

    python bench/resplat_iterations.py --weights logs/synthetic_resplat/runs/.../last.ckpt \\
        [--baseline logs/synthetic_pixel_aligned/runs/.../last.ckpt] \\
        [--data-root data/synthetic_64] [--views 2 4] [--iterations 1 2 4] [--max-scenes 100] \\
        [--out bench_out/resplat_iterations.json]

``--weights``/``--baseline`` take a Lightning ``.ckpt``, a ``save_pretrained`` folder (or its
``model.safetensors``), or ``hf-hub:org/repo``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    data_config,
    load_weights,
    score_targets,
    test_loader,
    to_device,
    widen_index,
)

GAUSSIAN_RATIO_TARGET = 16.0
TWO_ITERATION_GAIN_TARGET = 0.5  # dB over the initial set


# --------------------------------------------------------------------------- loading
# --------------------------------------------------------------------------- scoring
def score_scene(gaussians, target: dict, backend: str) -> dict[str, float]:
    """PSNR / SSIM of one scene's targets and its Gaussian count, as floats."""
    return {
        key: float(value.mean()) for key, value in score_targets(gaussians, target, backend).items()
    }


def evaluate_views(
    model: nn.Module,
    baselines: dict[str, nn.Module],
    loader,
    iterations: list[int],
    device: torch.device,
    backend: str,
    max_scenes: int | None,
) -> dict[str, dict[str, float]]:
    """Mean scores per row (``init``, ``K it``, baseline names) over the loader's scenes."""
    rows: dict[str, list[dict[str, float]]] = {}
    seconds: list[float] = []
    most = max(iterations)
    for number, batch in enumerate(loader):
        if max_scenes is not None and number >= max_scenes:
            break
        batch = to_device(batch, device)
        with torch.no_grad():
            start = time.perf_counter()
            pred = model(batch["context"], iterations=most)
            seconds.append(time.perf_counter() - start)
            sets = pred.gaussians_per_iteration
            for k in [0, *iterations]:
                label = "init" if k == 0 else f"{k} it"
                rows.setdefault(label, []).append(score_scene(sets[k], batch["target"], backend))
            for name, baseline in baselines.items():
                out = baseline(batch["context"])
                rows.setdefault(name, []).append(
                    score_scene(out.gaussians, batch["target"], backend)
                )
    summary = {
        label: {key: sum(r[key] for r in values) / len(values) for key in values[0]}
        | {"scenes": len(values)}
        for label, values in rows.items()
    }
    summary["_forward_seconds"] = {"mean": sum(seconds) / max(len(seconds), 1), "iterations": most}
    return summary


# --------------------------------------------------------------------------- printing
def print_table(results: dict[int, dict[str, dict[str, float]]], baselines: list[str]) -> None:
    """One markdown table: rows = init / iterations / baselines, columns per view count."""
    views = sorted(results)
    header = "| set |" + "".join(
        f" PSNR ({v} views) | ΔPSNR vs init | SSIM | Gaussians |" for v in views
    )
    print(header)
    print("|---|" + "---:|---:|---:|---:|" * len(views))
    labels = [label for label in results[views[0]] if not label.startswith("_")]
    ordered = [label for label in labels if label not in baselines] + baselines
    for label in ordered:
        cells = []
        for v in views:
            row = results[v].get(label)
            if row is None:
                cells.append(" – | – | – | – |")
                continue
            gain = row["psnr"] - results[v]["init"]["psnr"]
            delta = "–" if label in baselines or label == "init" else f"{gain:+.2f}"
            cells.append(
                f" {row['psnr']:.2f} | {delta} | {row['ssim']:.3f} | {row['gaussians']:.0f} |"
            )
        print(f"| {label} |" + "".join(cells))
    for v in views:
        scenes = results[v]["init"]["scenes"]
        timing = results[v]["_forward_seconds"]
        print(
            f"\n{v} views: {scenes} scenes; forward with {timing['iterations']} iterations "
            f"{1000 * timing['mean']:.0f} ms per scene"
        )


def check_targets(
    results: dict[int, dict[str, dict[str, float]]], baselines: list[str]
) -> list[str]:
    """The issue's targets, one line each (PASS/FAIL)."""
    lines = []
    for v, rows in sorted(results.items()):
        psnr = {label: row["psnr"] for label, row in rows.items() if not label.startswith("_")}
        steps = [label for label in ("init", "1 it", "2 it") if label in psnr]
        rising = all(psnr[b] > psnr[a] for a, b in zip(steps, steps[1:]))
        lines.append(f"{v} views: PSNR rises with each of {' -> '.join(steps)}: {rising}")
        if "2 it" in psnr:
            gain = psnr["2 it"] - psnr["init"]
            ok = gain >= TWO_ITERATION_GAIN_TARGET
            lines.append(
                f"{v} views: 2 iterations {gain:+.2f} dB over init "
                f"(target >= {TWO_ITERATION_GAIN_TARGET}): {ok}"
            )
        for name in baselines:
            ratio = rows[name]["gaussians"] / rows["init"]["gaussians"]
            lines.append(
                f"{v} views: {ratio:.1f}x fewer Gaussians than {name} "
                f"(target {GAUSSIAN_RATIO_TARGET:.0f}x): {ratio >= GAUSSIAN_RATIO_TARGET - 1e-6}"
            )
    return lines


# --------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--weights", required=True, help="ReSplat weights (.ckpt, folder, hf-hub:)")
    parser.add_argument(
        "--baseline", action="append", default=[], help="pixel-aligned weights (repeatable)"
    )
    parser.add_argument("--data", default="synthetic", help="data config name (configs/data)")
    parser.add_argument("--data-root", default=None, help="override the data config's root")
    parser.add_argument("--index", default=None, help="override the evaluation index JSON")
    parser.add_argument("--views", type=int, nargs="+", default=[2, 4], help="context views")
    parser.add_argument(
        "--iterations", type=int, nargs="+", default=[1, 2, 4], help="iteration counts scored"
    )
    parser.add_argument("--max-scenes", type=int, default=None, help="score at most N scenes")
    parser.add_argument("--backend", default="auto", help="renderer backend")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--out", default=None, help="write every number to this JSON file")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if any(k < 1 for k in args.iterations) or any(v < 2 for v in args.views):
        raise SystemExit("--iterations must be >= 1 and --views >= 2")
    iterations = sorted(set(args.iterations))
    device = torch.device(args.device)
    model = load_weights(args.weights, device)
    if getattr(model, "family", None) != "resplat":
        raise SystemExit(f"{args.weights}: not ReSplat weights (family {model.family!r})")
    baselines: dict[str, nn.Module] = {}
    for location in args.baseline:
        baseline = load_weights(location, device)
        name = getattr(baseline, "registry_name", None) or type(baseline).__name__
        baselines[f"{name} ({Path(location).name})" if name in baselines else name] = baseline

    data_cfg = data_config(args.data, args.data_root, args.index)
    base_index = Path(args.index or str(data_cfg.eval_index))
    results: dict[int, dict[str, dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for views in sorted(set(args.views)):
            index = Path(tmp) / f"index_{views}.json"
            kept, skipped = widen_index(base_index, views, index)
            print(f"{views} views: {kept} scenes ({skipped} without enough free frames)")
            loader = test_loader(data_cfg, views, index)
            results[views] = evaluate_views(
                model, baselines, loader, iterations, device, args.backend, args.max_scenes
            )
    print()
    print_table(results, list(baselines))
    checks = check_targets(results, list(baselines))
    print()
    for line in checks:
        print(f"- {line}")
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        payload = {"weights": args.weights, "baselines": args.baseline, "results": results}
        out.write_text(json.dumps(payload | {"checks": checks}, indent=1), encoding="utf-8")
        print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
