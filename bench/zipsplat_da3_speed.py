"""Speed and peak memory of ZipSplat's released architecture on this machine.

    python bench/zipsplat_da3_speed.py [--arch zipsplat_da3g] [--views 2 6 12]
        [--compression 1 0.25] [--size 252] [--repeats 1] [--threads N] [--device cpu]

Random weights (the timing does not depend on them; the released file cannot be downloaded
here). One process runs every configuration in order of increasing memory (views ascending,
compression ascending within a view count), so the process's peak resident memory after each
forward is that configuration's peak (on CUDA: ``torch.cuda.max_memory_allocated``, reset per
configuration). Prints a Markdown table: forward seconds (median of ``--repeats``), Gaussians,
peak memory, and the weights' size for reference.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from models import create_model  # noqa: E402


def _peak_gib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="zipsplat_da3g")
    parser.add_argument("--views", type=int, nargs="+", default=[2, 6, 12])
    parser.add_argument("--compression", type=float, nargs="+", default=[1.0, 0.25])
    parser.add_argument("--size", type=int, default=252)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)

    start = time.perf_counter()
    model = create_model(args.arch).to(device).eval()
    build_s = time.perf_counter() - start
    params = sum(p.numel() for p in model.parameters())
    weights_gib = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**30
    print(
        f"{args.arch}: {params / 1e9:.3f} B parameters ({weights_gib:.2f} GiB float32), built in "
        f"{build_s:.0f} s; device {device}, {torch.get_num_threads()} threads, load average "
        f"{os.getloadavg()[0]:.1f}, peak after build {_peak_gib(device):.2f} GiB",
        flush=True,
    )
    generator = torch.Generator().manual_seed(0)
    rows = []
    for views in sorted(args.views):
        images = torch.rand(1, views, 3, args.size, args.size, generator=generator).to(device)
        for r in sorted(args.compression):
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            times = []
            with torch.inference_mode():
                for _ in range(args.repeats):
                    t = time.perf_counter()
                    out = model({"image": images}, compression=r)
                    if device.type == "cuda":
                        torch.cuda.synchronize(device)
                    times.append(time.perf_counter() - t)
            rows.append(
                (
                    views,
                    r,
                    statistics.median(times),
                    out.gaussians.means.shape[1],
                    _peak_gib(device),
                )
            )
            print(f"  {views} views, compression {r}: {rows[-1][2]:.1f} s", flush=True)
            del out
    print("\n| views | compression | forward s | Gaussians | peak memory GiB |")
    print("|---|---|---|---|---|")
    for views, r, seconds, count, peak in rows:
        print(f"| {views} | {r:g} | {seconds:.1f} | {count:,} | {peak:.2f} |")
    print(
        f"\n({args.size} px, weights {weights_gib:.2f} GiB; peak = whole process on CPU, "
        f"load average at the end {os.getloadavg()[0]:.1f})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
