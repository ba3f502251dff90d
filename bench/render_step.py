"""Benchmark: training steps of ``pixel_aligned_tiny`` with each renderer backend on the CPU.

One fixed random batch (8 scenes, 2 context + 4 target views at 64², 8,192 Gaussians per scene):
model forward, render of the targets, MSE, backward and an Adam step, timed per step (median of
the timed steps after one warm-up step), for ``render(..., backend=B)`` with each backend asked
for. It prints a Markdown table of wall and process CPU milliseconds.

    python bench/render_step.py [--backends torch,cpu] [--steps 5] [--threads 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from models import create_model  # noqa: E402
from models.render.core import render  # noqa: E402


def views(batch: int, count: int, size: int) -> dict[str, torch.Tensor]:
    """``count`` cameras per scene on a short baseline, random target images."""
    extrinsics = torch.eye(4).repeat(batch, count, 1, 1)
    extrinsics[..., 0, 3] = torch.linspace(-0.2, 0.2, count)
    intrinsics = torch.tensor([[0.9, 0, 0.5], [0, 0.9, 0.5], [0, 0, 1.0]]).repeat(
        batch, count, 1, 1
    )
    return {
        "image": torch.rand(batch, count, 3, size, size),
        "extrinsics": extrinsics,
        "intrinsics": intrinsics,
        "near": torch.full((batch, count), 0.25),
        "far": torch.full((batch, count), 50.0),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default="torch,cpu")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    batch, size = 8, 64
    net = create_model("pixel_aligned_tiny")
    optimizer = torch.optim.Adam(net.parameters(), 1e-4)
    context, target = views(batch, 2, size), views(batch, 4, size)
    print(
        f"torch.set_num_threads({args.threads}), {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.1f} at start"
    )
    print()
    print("| backend | Gaussians per scene | step wall ms | step CPU ms |")
    print("|---|---|---|---|")
    for backend in args.backends.split(","):
        wall, cpu = [], []
        for step in range(args.steps + 1):
            start, cpu_start = time.perf_counter(), time.process_time()
            output = net(context)
            out = render(
                output.gaussians, target["extrinsics"], target["intrinsics"], (size, size),
                backend=backend,
            )  # fmt: skip
            loss = (out.color - target["image"]).square().mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if step:
                wall.append(time.perf_counter() - start)
                cpu.append(time.process_time() - cpu_start)
        print(
            f"| {backend} | {output.gaussians.num_slots:,} | {1e3 * statistics.median(wall):,.0f} "
            f"| {1e3 * statistics.median(cpu):,.0f} |",
            flush=True,
        )
    print()
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
