"""Benchmark: DepthSplat reconstruction time and peak memory on the CPU.

Each size runs in its own process (so peak memory is its own): build ``depthsplat_{size}`` with
random weights, one warm-up forward, then ``--repeats`` timed forwards of 2 views at 256x256
(``torch.set_num_threads(--threads)``, no autograd). Prints a table: parameters, median and best
wall time, the process's CPU time per forward (less sensitive to other load on the
machine than wall time), peak resident memory of the process (``ru_maxrss``: weights + activations + Python).

    python bench/depthsplat_speed.py [--sizes small base large] [--threads 2] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _worker(size: str, threads: int, repeats: int, height: int, width: int, views: int) -> dict:
    sys.path.insert(0, str(REPO))
    import torch

    from models import create_model

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = create_model(f"depthsplat_{size}").eval()
    params = sum(p.numel() for p in model.parameters())
    context = {
        "image": torch.rand(1, views, 3, height, width),
        "extrinsics": torch.eye(4).repeat(1, views, 1, 1),
        "intrinsics": torch.tensor([[0.85, 0, 0.5], [0, 0.85, 0.5], [0, 0, 1]]).repeat(
            1, views, 1, 1
        ),
        "near": torch.full((1, views), 0.5),
        "far": torch.full((1, views), 100.0),
    }
    for v in range(views):
        context["extrinsics"][0, v, 0, 3] = 0.2 * v
    times, cpu = [], []
    with torch.inference_mode():
        model(context)  # warm-up
        for _ in range(repeats):
            start, start_cpu = time.perf_counter(), time.process_time()
            out = model(context)
            times.append(time.perf_counter() - start)
            cpu.append(time.process_time() - start_cpu)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2  # KiB -> GiB
    return {
        "size": size,
        "params": params,
        "median": statistics.median(times),
        "best": min(times),
        "cpu": statistics.median(cpu),
        "peak_gib": peak,
        "gaussians": int(out.gaussians.means.shape[1]),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", default=["small", "base", "large"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--height", type=int, default=256)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--views", type=int, default=2)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    shape = (args.height, args.width, args.views)
    if args.worker:
        print(json.dumps(_worker(args.worker, args.threads, args.repeats, *shape)))
        return 0
    rows = []
    for size in args.sizes:
        cmd = [sys.executable, __file__, "--worker", size, "--threads", str(args.threads),
               "--repeats", str(args.repeats), "--height", str(args.height),
               "--width", str(args.width), "--views", str(args.views)]  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
        if done.returncode != 0:
            print(f"depthsplat_{size}: failed: {done.stderr.strip().splitlines()[-1:]}")
            continue
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    load = os.getloadavg()[0]
    print(
        f"\nDepthSplat on the CPU: {args.views} views at {args.height}x{args.width}, "
        f"{args.threads} threads, median of {args.repeats} after a warm-up (load avg {load:.1f})\n"
    )
    print(
        "| model | params (M) | Gaussians | median s | best s | CPU s (median) | peak RSS (GiB) |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| depthsplat_{r['size']} | {r['params'] / 1e6:.1f} | {r['gaussians']:,} | "
            f"{r['median']:.2f} | {r['best']:.2f} | {r['cpu']:.2f} | {r['peak_gib']:.2f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
