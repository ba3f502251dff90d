"""Benchmark: ReSplat release architectures, time and peak memory on the CPU per iteration count.

Each (configuration, iterations) runs in its own process (so peak memory is its own): build the
architecture of a released tag with random weights (timing does not depend on the values), run
the compiled CPU rasteriser once on a toy scene (so its one-time build is not timed), then one
forward of ``--views`` views (``torch.set_num_threads(--threads)``, no autograd). Prints wall
time, process CPU time and peak resident memory (``ru_maxrss``), with the load average before
and after (the machine may be shared).

    python bench/resplat_speed.py [--configs re10k small_dl3dv] [--iterations 0 1 2 4] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONFIGS = {
    # label: (architecture.tag, height, width, views)
    "re10k": ("resplat_base.re10k_256x256_view2", 256, 256, 2),
    "small_dl3dv": ("resplat_small.dl3dv_256x448_view8", 256, 448, 8),
}


def _worker(label: str, iterations: int, threads: int) -> dict:
    sys.path.insert(0, str(REPO))
    import torch

    from models import create_model, get_pretrained_cfg, render
    from models.core.gaussians import Gaussians

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    name, height, width, views = CONFIGS[label]
    arch = name.split(".")[0]
    model = create_model(arch, **get_pretrained_cfg(name).arch_kwargs).eval()
    toy = Gaussians(torch.zeros(1, 1, 3) + torch.tensor([0.0, 0.0, 2.0]),
                    torch.full((1, 1, 3), 0.1), torch.tensor([[[1.0, 0, 0, 0]]]),
                    torch.full((1, 1), 0.5), torch.zeros(1, 1, 3, 16))  # fmt: skip
    eye = torch.eye(4)[None, None]
    k = torch.tensor([[[[0.9, 0, 0.5], [0, 0.9, 0.5], [0, 0, 1.0]]]])
    render(toy, eye, k, (16, 16))  # builds/loads the CPU rasteriser outside the timing
    context = {
        "image": torch.rand(1, views, 3, height, width),
        "extrinsics": torch.eye(4).repeat(1, views, 1, 1),
        "intrinsics": torch.tensor(
            [[0.85, 0, 0.5], [0, 0.85 * width / height, 0.5], [0, 0, 1]]
        ).repeat(1, views, 1, 1),  # fmt: skip
    }
    for v in range(views):
        context["extrinsics"][0, v, 0, 3] = 0.1 * v
    with torch.inference_mode():
        start, start_cpu = time.perf_counter(), time.process_time()
        out = model(context, iterations=iterations)
        wall = time.perf_counter() - start
        cpu = time.process_time() - start_cpu
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2  # KiB -> GiB
    return {
        "config": label,
        "weights": name,
        "input": f"{views} x {height}x{width}",
        "iterations": iterations,
        "gaussians": out.gaussians.num_slots,
        "params": sum(p.numel() for p in model.parameters()),
        "wall": wall,
        "cpu": cpu,
        "peak_gb": peak,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--iterations", type=int, nargs="+", default=[0, 1, 2, 4])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(_worker(args.worker[0], int(args.worker[1]), args.threads)))
        return 0
    print(f"threads {args.threads}; load average before {os.getloadavg()[0]:.2f}")
    print("| weights | input | iterations | Gaussians | wall s | CPU s | peak RSS GB | load |")
    print("|---|---|---|---|---|---|---|---|")
    for label in args.configs:
        for its in args.iterations:
            cmd = [sys.executable, __file__, "--worker", label, str(its),
                   "--threads", str(args.threads)]  # fmt: skip
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                tail = proc.stderr.strip().splitlines()[-1:] or ["?"]
                print(f"| {CONFIGS[label][0]} | | {its} | failed: {tail[0]} | | | | |")
                continue
            r = json.loads(proc.stdout.strip().splitlines()[-1])
            print(f"| {r['weights']} | {r['input']} | {its} | {r['gaussians']:,} | "
                  f"{r['wall']:.1f} | {r['cpu']:.1f} | {r['peak_gb']:.2f} | "
                  f"{os.getloadavg()[0]:.2f} |", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
