"""Where does SplatWeaver put its Gaussians? Quality, budget and routing on the synthetic test set.

Scores trained SplatWeaver weights (and, optionally, pixel-aligned baselines) on the evaluation
index of a test split and prints markdown tables:

- PSNR / SSIM on the target views and Gaussians per scene, SplatWeaver vs each baseline, with
  the Gaussian-count ratio and the PSNR difference (targets: >= 2x fewer Gaussians, PSNR within
  0.3 dB or better);
- routing vs high-frequency energy over every context pixel: Pearson and Spearman correlation
  between the routed cardinality (0..M) and the wavelet energy ``sqrt(LH² + HL² + HH²)``, mean
  cardinality on textured/edge pixels vs flat pixels (and their ratio), and mean cardinality per
  energy decile;

and writes, into ``--out``:

- ``cardinality_maps/NN_<scene>.png`` for the first ``--maps`` scenes: one row per context view,
  [input image | per-pixel cardinality | wavelet energy], magnified ``--zoom`` times, with a
  legend; cardinality colours: 0 black, 1 blue, 2 orange, 3 red (further experts: lighter reds);
- ``routing_vs_energy.png``: mean cardinality per energy decile (bar chart);
- ``summary.json``: every number printed.

Usage::

    python bench/splatweaver_routing.py --weights logs/.../checkpoints/last.ckpt \\
        --baseline logs/.../pixel_aligned/last.ckpt [--data-root data/synthetic_64] \\
        [--max-scenes 100] [--refine-steps 0] [--out bench_out/splatweaver]

``--weights``/``--baseline`` take a Lightning ``.ckpt``, a ``save_pretrained`` folder (or its
``model.safetensors``), or ``hf-hub:org/repo``. Pose-free models can be scored after test-time
target-pose fit (``--refine-steps 100``, as eval.py does); it is off by default (slow on a
CPU).

``bench/results/splatweaver_routing/`` holds the output of (``checkpoints/splatweaver_tiny`` is the
export of the checkpoint it records)::

    python bench/splatweaver_routing.py --weights checkpoints/splatweaver_tiny \\
        --out bench/results/splatweaver_routing --maps 4
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import data_config, load_weights, score_targets, test_loader, to_device  # noqa: E402

PALETTE = [(0, 0, 0), (49, 130, 189), (253, 174, 97), (215, 25, 28)]
EDGE_THRESHOLD = 0.05  # wavelet energy above which a pixel counts as textured / on an edge


# --------------------------------------------------------------------------- scoring
def score(
    model: nn.Module, batch: dict, refine_steps: int, backend: str
) -> tuple[dict[str, float], dict]:
    """PSNR/SSIM of one scene's targets (raw and, for pose-free models, refined poses)."""
    context, target = batch["context"], batch["target"]
    with torch.no_grad():
        pred = model(context)
        gaussians = pred.gaussians.detach()
        scores = score_targets(gaussians, target, backend)
    result = {
        "psnr": float(scores["psnr"].mean()),
        "ssim": float(scores["ssim"].mean()),
        "gaussians": int(gaussians.count()[0]),
    }
    if refine_steps > 0 and getattr(model, "pose_free", False):
        from models.pipeline.pose_fit import fit_target_poses

        with torch.enable_grad():
            refined = fit_target_poses(
                gaussians,
                target["image"],
                target["extrinsics"],
                target["intrinsics"],
                steps=refine_steps,
                backend=backend,
            )
        with torch.no_grad():
            scores = score_targets(gaussians, target, backend, extrinsics=refined)
        result["refined_psnr"] = float(scores["psnr"].mean())
        result["refined_ssim"] = float(scores["ssim"].mean())
    return result, pred.diagnostics


def rank(values: Tensor) -> Tensor:
    """Average ranks (ties share the mean rank), as Spearman's correlation needs."""
    ordered, order = values.sort()
    ranks = torch.empty_like(values, dtype=torch.float64)
    ranks[order] = torch.arange(len(values), dtype=torch.float64)
    # Average over ties: every member of a run of equal values gets the run's mean rank.
    _, inverse, counts = torch.unique_consecutive(ordered, return_inverse=True, return_counts=True)
    ends = counts.cumsum(0).double()
    mean_rank = ends - (counts.double() + 1) / 2
    ranks[order] = mean_rank[inverse]
    return ranks


def pearson(x: Tensor, y: Tensor) -> float:
    x = x.double() - x.double().mean()
    y = y.double() - y.double().mean()
    denominator = (x.square().sum() * y.square().sum()).sqrt()
    return float((x * y).sum() / denominator) if denominator > 0 else float("nan")


def routing_statistics(
    cardinality: Tensor, energy: Tensor, flat_threshold: float, edge_threshold: float
) -> dict[str, float | list]:
    """Correlations and flat vs textured cardinalities over all context pixels."""
    c = cardinality.flatten().double()
    e = energy.flatten().double()
    flat = e <= flat_threshold
    edge = e >= edge_threshold
    stats: dict[str, float | list] = {
        "pixels": int(c.numel()),
        "pearson": pearson(c, e),
        "spearman": pearson(rank(c), rank(e)),
        "mean_cardinality": float(c.mean()),
        "flat_fraction": float(flat.double().mean()),
        "edge_fraction": float(edge.double().mean()),
        "flat_mean_cardinality": float(c[flat].mean()) if flat.any() else float("nan"),
        "edge_mean_cardinality": float(c[edge].mean()) if edge.any() else float("nan"),
    }
    flat_mean, edge_mean = stats["flat_mean_cardinality"], stats["edge_mean_cardinality"]
    if flat_mean > 0:
        stats["edge_to_flat_ratio"] = edge_mean / flat_mean
    else:  # no Gaussian on flat pixels: infinite when edges get some, undefined otherwise
        stats["edge_to_flat_ratio"] = float("inf") if edge_mean > 0 else float("nan")
    # Mean cardinality per energy decile (equal-count bins of the ranked energies).
    ranks = rank(e) / max(len(e) - 1, 1)
    decile = (ranks * 10).clamp(max=9.999).floor().long()
    stats["decile_energy"] = [
        float(e[decile == d].mean()) for d in range(10) if (decile == d).any()
    ]
    stats["decile_cardinality"] = [
        float(c[decile == d].mean()) for d in range(10) if (decile == d).any()
    ]
    stats["usage"] = [float((c == k).double().mean()) for k in range(int(c.max()) + 1)]
    return stats


# --------------------------------------------------------------------------- pictures
def colour_cardinality(cardinality: Tensor, num_experts: int) -> Tensor:
    """``[H, W]`` int -> ``[3, H, W]`` colours in [0, 1]."""
    palette = list(PALETTE)
    while len(palette) <= num_experts:  # more experts: lighter reds
        r, g, b = palette[-1]
        palette.append((min(255, r + 20), min(255, g + 60), min(255, b + 60)))
    table = torch.tensor(palette[: num_experts + 1], dtype=torch.float32) / 255.0
    return table[cardinality.long().clamp(0, num_experts)].permute(2, 0, 1)


def save_cardinality_map(
    path: Path, images: Tensor, cardinality: Tensor, energy: Tensor, num_experts: int, zoom: int
) -> None:
    """Rows: context views; columns: image | cardinality | energy (normalised per scene)."""
    from torchvision.utils import save_image

    scale = energy.max().clamp_min(1e-6)
    rows = []
    for view in range(images.shape[0]):
        e = (energy[view] / scale).clamp(0, 1)[None].expand(3, -1, -1)
        rows.append(
            torch.cat(
                [images[view].clamp(0, 1), colour_cardinality(cardinality[view], num_experts), e],
                dim=-1,
            )
        )
    grid = torch.cat(rows, dim=-2)[None]
    if zoom > 1:
        grid = F.interpolate(grid, scale_factor=zoom, mode="nearest")
    grid = torch.cat([grid[0], legend(grid.shape[-1], num_experts)], dim=-2)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_image(grid, path)


def legend(width: int, num_experts: int, height: int = 18) -> Tensor:
    """A strip ``[3, height, width]``: the cardinality colours with their counts, and column
    titles."""
    from PIL import Image, ImageDraw

    strip = Image.new("RGB", (width, height), (255, 255, 255))
    draw = ImageDraw.Draw(strip)
    colours = colour_cardinality(torch.arange(num_experts + 1)[None], num_experts)  # [3, 1, M+1]
    x = 4
    draw.text((x, 3), "Gaussians/pixel:", fill=(0, 0, 0))
    x += 100
    for k in range(num_experts + 1):
        rgb = tuple(int(c * 255) for c in colours[:, 0, k])
        draw.rectangle([x, 4, x + 10, 14], fill=rgb, outline=(0, 0, 0))
        draw.text((x + 13, 3), str(k), fill=(0, 0, 0))
        x += 30
    draw.text((x + 10, 3), "columns: image | cardinality | wavelet energy", fill=(0, 0, 0))
    array = torch.frombuffer(bytearray(strip.tobytes()), dtype=torch.uint8)
    return array.reshape(height, width, 3).permute(2, 0, 1).float() / 255.0


def save_decile_plot(path: Path, stats: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3))
    deciles = range(1, len(stats["decile_cardinality"]) + 1)
    ax.bar(deciles, stats["decile_cardinality"], color="#3182bd")
    ax.set_xlabel("wavelet energy decile (1 = flattest)")
    ax.set_ylabel("mean Gaussians per pixel")
    ratio = stats["edge_to_flat_ratio"]
    ratio_text = "no Gaussians on flat pixels" if math.isinf(ratio) else f"edge/flat {ratio:.1f}x"
    ax.set_title(
        f"SplatWeaver routing (Spearman {stats['spearman']:.2f}, {ratio_text})", fontsize=9
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--weights", required=True, help="SplatWeaver weights (.ckpt, folder, hf-hub:)"
    )
    parser.add_argument(
        "--baseline", action="append", default=[], help="pixel-aligned weights (repeatable)"
    )
    parser.add_argument("--data", default="synthetic", help="data config name (configs/data)")
    parser.add_argument("--data-root", default=None, help="override the data config's root")
    parser.add_argument("--index", default=None, help="override the evaluation index JSON")
    parser.add_argument("--max-scenes", type=int, default=None, help="score at most N scenes")
    parser.add_argument(
        "--maps", type=int, default=6, help="scenes whose cardinality maps are saved"
    )
    parser.add_argument("--zoom", type=int, default=4, help="magnification of the map PNGs")
    parser.add_argument("--refine-steps", type=int, default=0, help="target-pose fit steps")
    parser.add_argument("--edge-threshold", type=float, default=EDGE_THRESHOLD)
    parser.add_argument(
        "--flat-threshold",
        type=float,
        default=None,
        help="energy at or below which a pixel is flat (default: the model's energy_floor)",
    )
    parser.add_argument("--backend", default="auto", help="renderer backend")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--out", default="bench_out/splatweaver_routing")
    return parser.parse_args(argv)


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    out_dir = Path(args.out)
    model = load_weights(args.weights, device)
    if getattr(model, "family", None) != "splatweaver":
        raise SystemExit(f"{args.weights}: not SplatWeaver weights (family {model.family!r})")
    baselines = {location: load_weights(location, device) for location in args.baseline}
    flat_threshold = args.flat_threshold if args.flat_threshold is not None else model.energy_floor
    loader = test_loader(data_config(args.data, args.data_root, args.index))

    records: dict[str, list[dict]] = {"splatweaver": []}
    records.update({location: [] for location in baselines})
    cardinalities, energies = [], []
    started = time.perf_counter()
    for index, batch in enumerate(loader):
        if args.max_scenes is not None and index >= args.max_scenes:
            break
        batch = to_device(batch, device)
        scene = batch.get("scene", [str(index)])[0]
        result, extras = score(model, batch, args.refine_steps, args.backend)
        records["splatweaver"].append({"scene": scene, **result})
        routing = extras["routing_map"][0].cpu()  # [V, H, W]
        energy = extras["hf_energy"][0].cpu()
        cardinalities.append(routing.flatten())
        energies.append(energy.flatten())
        if index < args.maps:
            name = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in scene)
            save_cardinality_map(
                out_dir / "cardinality_maps" / f"{index:02d}_{name}.png",
                batch["context"]["image"][0].cpu(),
                routing,
                energy,
                model.num_experts,
                args.zoom,
            )
        for location, baseline in baselines.items():
            base_result, _ = score(baseline, batch, args.refine_steps, args.backend)
            records[location].append({"scene": scene, **base_result})
    if not records["splatweaver"]:
        raise SystemExit("the test split produced no scenes (check --data-root and --index)")

    stats = routing_statistics(
        torch.cat(cardinalities), torch.cat(energies), flat_threshold, args.edge_threshold
    )
    summary: dict = {
        "weights": args.weights,
        "scenes": len(records["splatweaver"]),
        "seconds": time.perf_counter() - started,
        "flat_threshold": flat_threshold,
        "edge_threshold": args.edge_threshold,
        "models": {},
        "routing": stats,
    }
    for key, rows in records.items():
        metrics = [k for k in rows[0] if k != "scene"]
        summary["models"][key] = {k: mean([r[k] for r in rows]) for k in metrics}
    ours = summary["models"]["splatweaver"]
    comparisons = {}
    for location in baselines:
        theirs = summary["models"][location]
        comparisons[location] = {
            "count_ratio": (
                theirs["gaussians"] / ours["gaussians"] if ours["gaussians"] > 0 else float("inf")
            ),
            "psnr_delta": ours["psnr"] - theirs["psnr"],
        }
        if "refined_psnr" in ours and "refined_psnr" in theirs:
            comparisons[location]["refined_psnr_delta"] = (
                ours["refined_psnr"] - theirs["refined_psnr"]
            )
        comparisons[location]["meets_target"] = bool(
            comparisons[location]["count_ratio"] >= 2.0
            and comparisons[location]["psnr_delta"] >= -0.3
        )
    summary["comparisons"] = comparisons

    out_dir.mkdir(parents=True, exist_ok=True)
    save_decile_plot(out_dir / "routing_vs_energy.png", stats)
    with open(out_dir / "summary.json", "w", encoding="utf-8") as handle:
        json.dump({**summary, "per_scene": records}, handle, indent=2)
    print_report(summary)
    print(f"\nwrote {out_dir}/summary.json, routing_vs_energy.png, cardinality_maps/")
    return summary


def print_report(summary: dict) -> None:
    print(f"\n{summary['scenes']} test scenes, {summary['seconds']:.0f} s\n")
    print("| model | PSNR | SSIM | refined PSNR | Gaussians / scene |")
    print("|---|---|---|---|---|")
    for key, m in summary["models"].items():
        refined = f"{m['refined_psnr']:.2f}" if "refined_psnr" in m else "-"
        print(f"| {key} | {m['psnr']:.2f} | {m['ssim']:.3f} | {refined} | {m['gaussians']:.0f} |")
    for location, c in summary["comparisons"].items():
        verdict = "meets" if c["meets_target"] else "misses"
        print(
            f"\nvs {location}: {c['count_ratio']:.2f}x fewer Gaussians, "
            f"PSNR {c['psnr_delta']:+.2f} dB ({verdict} the >= 2x / >= -0.3 dB target)"
        )
    s = summary["routing"]
    print("\n| routing statistic | value |")
    print("|---|---|")
    print(f"| mean Gaussians per context pixel | {s['mean_cardinality']:.3f} |")
    print(f"| expert usage (0..M) | {', '.join(f'{u:.3f}' for u in s['usage'])} |")
    print(f"| Pearson (cardinality, energy) | {s['pearson']:.3f} |")
    print(f"| Spearman (cardinality, energy) | {s['spearman']:.3f} |")
    print(
        f"| flat pixels (energy <= {summary['flat_threshold']:g}): share, mean cardinality | "
        f"{s['flat_fraction']:.2f}, {s['flat_mean_cardinality']:.3f} |"
    )
    print(
        f"| edge/textured pixels (energy >= {summary['edge_threshold']:g}): share, mean "
        f"cardinality | {s['edge_fraction']:.2f}, {s['edge_mean_cardinality']:.3f} |"
    )
    ratio = s["edge_to_flat_ratio"]
    if math.isinf(ratio):
        ratio_text = "inf (flat pixels get no Gaussians)"
    else:
        ratio_text = f"{ratio:.2f}x"
    print(f"| edge / flat mean cardinality | {ratio_text} |")
    print("\n| energy decile | mean energy | mean cardinality |")
    print("|---|---|---|")
    for i, (e, c) in enumerate(zip(s["decile_energy"], s["decile_cardinality"]), start=1):
        print(f"| {i} | {e:.4f} | {c:.3f} |")


if __name__ == "__main__":
    main()
