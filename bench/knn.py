"""Benchmark: exact kNN of 3D points on the CPU, torch ``cdist`` in blocks vs scipy's cKDTree.

ReSplat's update queries the ``k`` nearest Gaussians of every Gaussian (k=16 in the initial
model, 8 in the update). Point counts of the released configurations: 2 views at 256x256 with
one Gaussian per pixel (RE10K file) 131,072; 8 views of 256x448 at 1/4 57,344; 32 views 229,376.
Points are a noisy depth-map-like cloud (rows of a grid lifted at smooth depths). Prints the
median wall time of ``models.layers.knn.knn`` per method, and which one ``method="auto"`` picks.

    python bench/knn.py [--points 8192 57344 131072] [--k 8 16] [--threads 2] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _cloud(n: int, seed: int = 0):
    import torch

    g = torch.Generator().manual_seed(seed)
    side = int(n**0.5) + 1
    ys, xs = torch.meshgrid(torch.linspace(-1, 1, side), torch.linspace(-1, 1, side), indexing="ij")
    z = 2 + 0.5 * torch.sin(3 * xs) * torch.cos(2 * ys)
    pts = torch.stack([xs * z, ys * z, z], -1).reshape(-1, 3)[:n]
    return (pts + 0.01 * torch.randn(pts.shape, generator=g))[None]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, nargs="+", default=[8192, 57344, 131072])
    parser.add_argument("--k", type=int, nargs="+", default=[8, 16])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    import torch

    from models.layers.knn import knn

    torch.set_num_threads(args.threads)
    print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}; "
          f"threads {args.threads}")  # fmt: skip
    print(f"{'points':>8} {'k':>3} {'cdist (s)':>10} {'kdtree (s)':>11} {'faster':>8} {'same':>5}")
    for n in args.points:
        pts = _cloud(n)
        for k in args.k:
            times, results = {}, {}
            for method in ("cdist", "kdtree"):
                runs = []
                for _ in range(args.repeats):
                    start = time.perf_counter()
                    results[method] = knn(pts, k, method=method)
                    runs.append(time.perf_counter() - start)
                times[method] = statistics.median(runs)
            same = torch.equal(results["cdist"].sort(-1).values, results["kdtree"].sort(-1).values)
            faster = min(times, key=times.get)
            print(f"{n:>8} {k:>3} {times['cdist']:>10.3f} {times['kdtree']:>11.3f} "
                  f"{faster:>8} {str(same):>5}")  # fmt: skip


if __name__ == "__main__":
    main()
