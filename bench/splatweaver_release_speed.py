"""Benchmark: SplatWeaver's released architecture on this machine (CPU by default).

1. Speed and peak memory of the released configuration (``splatweaver_vggt``, 1.19 B parameters,
   float32) for V views at S x S pixels, **random weights** (the released file cannot be
   downloaded here; time and memory do not depend on the values except through the number of
   Gaussians the router emits, reported). Each configuration runs in a fresh subprocess so its
   peak resident memory (``ru_maxrss``) is its own; the model build is not timed.
2. Cardinality statistics (mean Gaussians per pixel, share of empty pixels, expert usage) on the
   shared real drone frames, with **deterministic test weights** (``tests/
   splatweaver_release_weights.py``), **not the released weights**: they only show that the
   routing modes and the budget run on real photos, not what the trained router would choose.

    python bench/splatweaver_release_speed.py [--views 2 6] [--size 448] [--threads 2]
        [--stats-model splatweaver_vggt_tiny] [--skip-speed] [--skip-stats]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

import torch  # noqa: E402

DRONE = REPO.parent / "shared" / "data" / "examples" / "drone_frames"


def _one_run(views: int, size: int, threads: int, repeats: int) -> dict:
    """(child process) build the released model with random weights and time its forward."""
    torch.set_num_threads(threads)
    from models import create_model

    torch.manual_seed(0)
    model = create_model("splatweaver_vggt").eval()
    images = torch.rand(1, views, 3, size, size)
    times = []
    with torch.no_grad():
        for _ in range(repeats):
            start = time.perf_counter()
            out = model({"image": images})
            times.append(time.perf_counter() - start)
    return {
        "seconds": min(times),
        "gaussians": int(out.gaussians.count()[0]),
        "peak_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6,
        "parameters": sum(p.numel() for p in model.parameters()),
    }


def speed(views: list[int], sizes: list[int], threads: int, repeats: int) -> None:
    print(
        "\nsplatweaver_vggt (released configuration, random weights, float32, "
        f"{threads} thread(s), {torch.get_num_threads()} available)\n"
    )
    print("| views | input | forward s | Gaussians | peak RSS GB |")
    print("|---|---|---|---|---|")
    for size in sizes:
        for v in views:
            command = [
                sys.executable,
                __file__,
                "--child",
                json.dumps({"views": v, "size": size, "threads": threads, "repeats": repeats}),
            ]
            done = subprocess.run(command, capture_output=True, text=True)
            lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
            if done.returncode or not lines:
                tail = (done.stderr.strip().splitlines() or ["killed"])[-1]
                print(f"| {v} | {size}x{size} | failed: {tail[:80]} | | |")
                continue
            r = json.loads(lines[-1])
            print(
                f"| {v} | {size}x{size} | {r['seconds']:.1f} | {r['gaussians']} | "
                f"{r['peak_gb']:.1f} |",
                flush=True,
            )


def stats(name: str, size: int, threads: int) -> None:
    from splatweaver_release_weights import deterministic_state, load_manifest

    from datamodules.readers.image_folder import load_images
    from models import create_model
    from models.families.splatweaver_release import checkpoint_filter_fn

    torch.set_num_threads(threads)
    config = "tiny" if name.endswith("_tiny") else "released"
    model = create_model(name).eval()
    model.load_state_dict(checkpoint_filter_fn(deterministic_state(load_manifest(config)), model))
    frames = load_images(DRONE, image_size=(size, size))
    images = frames.images[None]  # [1, V, 3, S, S]
    print(
        f"\n{name} with DETERMINISTIC TEST WEIGHTS (not the released weights): "
        f"{images.shape[1]} drone frames at {size}x{size}\n"
    )
    print("| routing | Gaussians | mean Gaussians / pixel | empty pixels | usage 0 / 1 / 2 / 3 |")
    print("|---|---|---|---|---|")
    runs = [("frozen_gumbel", None), ("argmax", None), ("gumbel", None), ("frozen_gumbel", 0.5)]
    for routing, budget in runs:
        with torch.no_grad():
            out = model({"image": images}, routing=routing, gaussians_per_pixel=budget)
        counts = out.diagnostics["routing_map"].float()
        usage = " / ".join(f"{u:.3f}" for u in out.diagnostics["expert_usage"].tolist())
        label = routing if budget is None else f"{routing}, gaussians_per_pixel={budget}"
        print(
            f"| {label} | {int(out.gaussians.count()[0])} | {counts.mean():.3f} | "
            f"{(counts == 0).float().mean():.3f} | {usage} |",
            flush=True,
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--views", type=int, nargs="*", default=[2, 6])
    parser.add_argument("--size", type=int, nargs="*", default=[448])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--stats-model", default="splatweaver_vggt_tiny")
    parser.add_argument("--stats-size", type=int, default=None, help="default: the model's")
    parser.add_argument("--skip-speed", action="store_true")
    parser.add_argument("--skip-stats", action="store_true")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_one_run(**json.loads(args.child))))
        return 0
    bad = [s for s in args.size if s % 14]
    if bad:
        print(f"error: --size {bad[0]}: must be a multiple of 14", file=sys.stderr)
        return 2
    if not args.skip_speed:
        speed(args.views, args.size, args.threads, args.repeats)
    if not args.skip_stats:
        size = args.stats_size or (56 if args.stats_model.endswith("_tiny") else 448)
        stats(args.stats_model, size, args.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
