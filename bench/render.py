"""Benchmark: the tiled PyTorch rasteriser, the compiled CPU one and an all-pixels x all-Gaussians
dense one.

For each resolution (64^2, 128^2, 256^2) and Gaussian count (4k, 16k, 65k) it times the forward
and the forward+backward pass of ``render(..., backend="torch")`` (tiled), of
``render(..., backend="cpu")`` (the compiled CPU rasteriser, on CPU only) and of a dense renderer
written here (every pixel against every Gaussian, the same projection and compositing rules), and
measures their peak memory. Then it renders the real garden scene (``../shared/data``, 138,766
points, 3 cameras, 648x420) forward. It prints a Markdown table; ``--methods tiled,cpu`` leaves
the (slow) dense renderer out. Workers run with ``torch.set_num_threads(--threads)`` (2).

Memory is measured honestly for each backend: every configuration runs in a fresh subprocess;
on CPU the peak resident set size (``VmHWM``) is reset through ``/proc/self/clear_refs`` right
before the measured calls and the table reports its rise above the resident size at that moment
(tensors, allocator slack and all; libraries are initialised on a tiny render first); on CUDA it is ``torch.cuda.max_memory_allocated`` above the
allocation before the calls. Dense configurations whose predicted peak exceeds ``--dense-limit-gb``
(8 GB) are skipped. Wall times depend on the machine's load (printed); CPU times less so.

    OMP_NUM_THREADS=2 python bench/render.py [--quick] [--device cpu|cuda] [--repeats 3]
        [--methods tiled,cpu,dense] [--threads 2]

Workers get ``OMP_WAIT_POLICY=PASSIVE`` unless it is set (``--wait-policy inherit`` to keep
OpenMP's default): on a shared machine with more runnable processes than cores, spinning OpenMP
threads make each small op wait for a descheduled sibling thread.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from data_fixtures import GARDEN, garden_scene  # noqa: E402

from models.core.gaussians import Gaussians, rgb_to_sh  # noqa: E402
from models.core.sh import eval_sh  # noqa: E402
from models.geometry.cameras import (  # noqa: E402
    intrinsics_to_pixels,
    world_to_camera,
)
from models.render.core import render  # noqa: E402
from models.render.projection import ALPHA_THRESHOLD, project_gaussians  # noqa: E402
from models.render.rasterize import MAX_ALPHA, TRANSMITTANCE_MIN  # noqa: E402

# Dense peak bytes per (pixel, Gaussian) entry, measured with this script on CPU (float32):
# 26 and 44 bytes at 64^2 x 4096 (about 7 and 11 float32 tensors alive at the peak), rounded up.
DENSE_BYTES_PER_ENTRY = {"fwd": 28, "fwd+bwd": 48}


# ------------------------------------------------------------------------------------ scenes
def random_scene(num: int, seed: int = 0, degree: int = 1) -> Gaussians:
    """``num`` random Gaussians filling the frustum of the camera of :func:`camera`."""
    g = torch.Generator().manual_seed(seed)
    z = 2.0 + 6.0 * torch.rand(num, generator=g)
    xy = (torch.rand(num, 2, generator=g) - 0.5) * 1.2 * z[:, None]
    means = torch.cat([xy, z[:, None]], dim=1)
    scales = torch.exp(math.log(0.01) + math.log(6.0) * torch.rand(num, 3, generator=g))
    rotations = torch.nn.functional.normalize(torch.randn(num, 4, generator=g), dim=-1)
    opacities = 0.2 + 0.75 * torch.rand(num, generator=g)
    harmonics = 0.3 * torch.randn(num, 3, (degree + 1) ** 2, generator=g)
    harmonics[..., 0] = rgb_to_sh(torch.rand(num, 3, generator=g))
    return Gaussians(means[None], scales[None], rotations[None], opacities[None], harmonics[None])


def camera() -> tuple[torch.Tensor, torch.Tensor]:
    """One identity camera with a 53-degree field of view, ``[1, 1, 4, 4]``, ``[1, 1, 3, 3]``."""
    intrinsics = torch.tensor([[1.0, 0.0, 0.5], [0.0, 1.0, 0.5], [0.0, 0.0, 1.0]])
    return torch.eye(4)[None, None], intrinsics[None, None]


# ------------------------------------------------------------------------------------ dense
def render_dense(
    gaussians: Gaussians, extrinsics: torch.Tensor, intrinsics: torch.Tensor, shape: tuple[int, int]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """All pixels x all Gaussians, one ``[H, W, N]`` tensor per quantity (one scene, one view).

    Same projection, culling and compositing rules as the tiled renderer; no tiles, no early
    termination. Returns colour ``[3, H, W]``, depth and alpha ``[H, W]``.
    """
    height, width = shape
    projection = project_gaussians(
        gaussians.means,
        gaussians.scales,
        gaussians.rotations,
        world_to_camera(extrinsics),
        intrinsics_to_pixels(intrinsics, shape),
        shape,
        opacities=gaussians.opacities,
    )
    order = torch.argsort(
        torch.where(projection.valid, projection.depths, math.inf)[0, 0].detach(), stable=True
    )
    means2d = projection.means2d[0, 0, order]  # [N, 2]
    a, b, c = projection.conics[0, 0, order].unbind(-1)  # [N]
    valid = projection.valid[0, 0, order]
    opacity = torch.where(valid, gaussians.opacities[0, order], 0.0)
    directions = gaussians.means[0, order] - extrinsics[0, 0, :3, 3]
    color = torch.clamp_min(eval_sh(gaussians.harmonics[0, order], directions) + 0.5, 0.0)
    values = torch.cat(
        [color, projection.depths[0, 0, order, None], torch.ones_like(opacity[:, None])], dim=1
    )  # [N, 5]
    px = torch.arange(width, dtype=a.dtype) + 0.5
    py = torch.arange(height, dtype=a.dtype) + 0.5
    dx = means2d[None, None, :, 0] - px[None, :, None]  # [1, W, N]
    dy = means2d[None, None, :, 1] - py[:, None, None]  # [H, 1, N]
    sigma = 0.5 * (a * dx * dx + c * dy * dy) + (b * dx) * dy  # [H, W, N]
    alpha = torch.clamp_max(opacity * torch.exp(-sigma), MAX_ALPHA)
    alpha = torch.where((alpha >= ALPHA_THRESHOLD) & (sigma >= 0), alpha, 0.0)
    t_after = torch.cumprod(1.0 - alpha, dim=-1)  # [H, W, N]
    t_before = torch.cat([torch.ones_like(t_after[..., :1]), t_after[..., :-1]], dim=-1)
    weights = torch.where(t_after.detach() > TRANSMITTANCE_MIN, alpha * t_before, 0.0)
    out = (weights @ values).permute(2, 0, 1)  # [5, H, W]
    return out[:3], out[3], out[4]


# ------------------------------------------------------------------------------------ worker
def _rss_bytes(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run_worker(spec: dict) -> dict:
    """Time one configuration in this process and measure its peak memory."""
    device = torch.device(spec["device"])
    torch.set_num_threads(spec["threads"])
    backend = "cpu" if spec["method"] == "cpu" else "torch"
    if spec["scene"] == "garden":
        gaussians, extrinsics, intrinsics, shape = garden_scene()
    else:
        gaussians = random_scene(spec["num"])
        extrinsics, intrinsics = camera()
        shape = (spec["resolution"], spec["resolution"])
    gaussians = gaussians.to(device)
    extrinsics, intrinsics = extrinsics.to(device), intrinsics.to(device)
    backward = spec["mode"] == "fwd+bwd"
    params = [gaussians.means, gaussians.scales, gaussians.rotations, gaussians.opacities]
    params.append(gaussians.harmonics)

    def once() -> torch.Tensor:
        for p in params:
            p.grad = None
            p.requires_grad_(backward)
        with torch.set_grad_enabled(backward):
            if spec["method"] == "dense":
                color = render_dense(gaussians, extrinsics, intrinsics, shape)[0]
            else:
                color = render(gaussians, extrinsics, intrinsics, shape, backend=backend).color
            if backward:
                (color * color).sum().backward()
        return color.detach()

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    # Initialise the libraries (thread pools, allocator arenas, autograd) on a tiny problem of
    # the same kind, so that the peak below is the renderer's working memory.
    tiny = random_scene(64).to(device)
    tiny_camera = [t.to(device) for t in camera()]
    with torch.set_grad_enabled(backward):
        for p in (tiny.means, tiny.opacities):
            p.requires_grad_(backward)
        if spec["method"] == "dense":
            color = render_dense(tiny, *tiny_camera, (16, 16))[0]
        else:
            color = render(tiny, *tiny_camera, (16, 16), backend=backend).color
        if backward:
            color.sum().backward()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    else:
        base = _rss_bytes("VmRSS")
        if not _reset_peak():
            return {"error": "cannot reset VmHWM"}
    times, cpu = [], []
    color = None
    for i in range(spec["repeats"] + 1):  # the first call warms up and is not timed
        start, cpu_start = time.perf_counter(), _cpu_seconds()
        color = once()
        sync()
        if i:
            times.append(time.perf_counter() - start)
            cpu.append(_cpu_seconds() - cpu_start)
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device) - base
    else:
        peak = _rss_bytes("VmHWM") - base
    return {
        "ms": 1e3 * statistics.median(times),
        "cpu_ms": 1e3 * statistics.median(cpu),
        "peak_mb": peak / 2**20,
        "checksum": float(color.double().sum()),
        "coverage": float((color.sum(-3) > 0).double().mean()),
    }


def measure(spec: dict, timeout: float, env: dict[str, str]) -> dict:
    """Run :func:`run_worker` in a fresh interpreter (so peaks do not leak between configs)."""
    command = [sys.executable, __file__, "--worker", json.dumps(spec)]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip().splitlines()[-1:]
        return {"error": f"exit {result.returncode}: {' '.join(tail)[:120]}"}
    return json.loads(result.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------------------------ table
def cell(result: dict | None, key: str, estimate: float | None = None) -> str:
    """A table cell: the measurement, an estimate for a skipped run, or the error."""
    if result is None:
        if estimate is None:
            return "skipped (OOM risk)"
        return f"skipped (OOM risk; ~{estimate:,.0f} est.)"
    if "error" in result:
        return result["error"]
    return f"{result[key]:,.0f}"


def speedup(dense: float | None, tiled: dict, key: str, estimated: bool) -> str:
    if dense is None or "error" in tiled or tiled[key] <= 0:
        return "-"
    return f"{'~' if estimated else ''}{dense / tiled[key]:.0f}x{' (est.)' if estimated else ''}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="64^2/128^2 with 4k/16k, no garden")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dense-limit-gb", type=float, default=8.0)
    parser.add_argument(
        "--methods",
        default="tiled,cpu,dense",
        help="comma-separated subset of tiled (torch backend), cpu (compiled CPU backend), dense",
    )
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads of workers")
    parser.add_argument("--timeout", type=float, default=900.0, help="per configuration, seconds")
    parser.add_argument(
        "--wait-policy",
        choices=["passive", "inherit"],
        default="passive",
        help="OMP_WAIT_POLICY of the workers when it is not set already: 'passive' stops idle "
        "OpenMP threads from spinning, which on a shared, oversubscribed machine otherwise "
        "slows every small op down by orders of magnitude",
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(run_worker(json.loads(args.worker))))
        return 0

    methods = {m.strip() for m in args.methods.split(",") if m.strip()}
    unknown = methods - {"tiled", "cpu", "dense"}
    if unknown or "tiled" not in methods:
        parser.error(
            f"--methods must include tiled and be among tiled,cpu,dense, got {args.methods}"
        )
    if args.device != "cpu":
        methods.discard("cpu")
    env = dict(os.environ)
    if args.wait_policy == "passive":
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    resolutions = [64, 128] if args.quick else [64, 128, 256]
    counts = [4096, 16384] if args.quick else [4096, 16384, 65536]
    print(
        f"device {args.device}, torch {torch.__version__}, "
        f"OMP_NUM_THREADS={env.get('OMP_NUM_THREADS', 'unset')}, "
        f"OMP_WAIT_POLICY={env.get('OMP_WAIT_POLICY', 'unset')}, {os.cpu_count()} CPUs, "
        f"torch.set_num_threads({args.threads}), "
        f"load average {os.getloadavg()[0]:.1f} at start"
    )
    print(
        "times: median of the timed calls, wall ms (process CPU ms); peak: rise of the peak "
        "resident set (CPU) or of max_memory_allocated (CUDA) during the calls, MB; "
        "est.: scaled linearly in pixels x Gaussians from the largest dense run of that pass"
    )
    print()
    print(
        "| res | Gaussians | pass | tiled ms (CPU ms) | cpu ms (CPU ms) | cpu vs tiled | "
        "dense ms (CPU ms) | dense vs tiled | tiled peak MB | cpu peak MB | dense peak MB | "
        "dense/tiled memory |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    largest: dict[str, tuple[int, dict]] = {}  # pass -> (entries, result) of the largest dense run
    for resolution in resolutions:
        for num in counts:
            for mode in ("fwd", "fwd+bwd"):
                spec = {
                    "device": args.device,
                    "scene": "random",
                    "resolution": resolution,
                    "num": num,
                    "mode": mode,
                    "repeats": args.repeats,
                    "threads": args.threads,
                }
                tiled = measure({**spec, "method": "tiled"}, args.timeout, env)
                compiled = None
                if "cpu" in methods:
                    compiled = measure({**spec, "method": "cpu"}, args.timeout, env)
                entries = resolution * resolution * num
                predicted = entries * DENSE_BYTES_PER_ENTRY[mode] / 1e9
                dense, est_ms, est_mb = None, None, None
                run_dense = "dense" in methods
                if run_dense and predicted <= args.dense_limit_gb:
                    dense = measure({**spec, "method": "dense"}, args.timeout, env)
                    if "error" not in dense and entries >= largest.get(mode, (0, None))[0]:
                        largest[mode] = (entries, dense)
                elif run_dense and mode in largest:
                    base_entries, base = largest[mode]
                    est_ms = base["ms"] * entries / base_entries
                    est_mb = base["peak_mb"] * entries / base_entries
                dense_ms = dense["ms"] if dense and "error" not in dense else est_ms
                dense_mb = dense["peak_mb"] if dense and "error" not in dense else est_mb
                dense_time = cell(dense, "ms", est_ms) if run_dense else "-"
                if dense is not None and "error" not in dense:
                    dense_time += f" ({dense['cpu_ms']:,.0f})"
                estimated = dense is None
                cpu_time, cpu_speedup, cpu_peak = "-", "-", "-"
                if compiled is not None:
                    cpu_time = f"{cell(compiled, 'ms')} ({cell(compiled, 'cpu_ms')})"
                    cpu_peak = cell(compiled, "peak_mb")
                    if "error" not in compiled and "error" not in tiled:
                        cpu_speedup = f"{tiled['ms'] / compiled['ms']:.1f}x"
                print(
                    f"| {resolution}² | {num:,} | {mode} | {cell(tiled, 'ms')} "
                    f"({cell(tiled, 'cpu_ms')}) | {cpu_time} | {cpu_speedup} | {dense_time} | "
                    f"{speedup(dense_ms, tiled, 'ms', estimated)} | {cell(tiled, 'peak_mb')} | "
                    f"{cpu_peak} | {cell(dense, 'peak_mb', est_mb) if 'dense' in methods else '-'} | "
                    f"{speedup(dense_mb, tiled, 'peak_mb', estimated)} |",
                    flush=True,
                )
                if compiled is not None and "error" not in compiled and "error" not in tiled:
                    gap = abs(compiled["checksum"] - tiled["checksum"]) / max(
                        1.0, tiled["checksum"]
                    )
                    if gap > 1e-5:
                        print(f"  (warning: cpu and tiled images differ, relative {gap:.2e})")
                if dense is not None and "error" not in dense and "error" not in tiled:
                    gap = abs(dense["checksum"] - tiled["checksum"]) / max(1.0, tiled["checksum"])
                    if gap > 1e-4:
                        print(f"  (warning: tiled and dense images differ, relative {gap:.2e})")
    if not args.quick:
        if GARDEN.is_file():
            spec = {
                "device": args.device,
                "scene": "garden",
                "mode": "fwd",
                "repeats": args.repeats,
                "threads": args.threads,
            }
            garden = measure({**spec, "method": "tiled"}, args.timeout, env)
            cpu_time, cpu_speedup, cpu_peak = "-", "-", "-"
            if "cpu" in methods:
                compiled = measure({**spec, "method": "cpu"}, args.timeout, env)
                cpu_time = f"{cell(compiled, 'ms')} ({cell(compiled, 'cpu_ms')})"
                cpu_peak = cell(compiled, "peak_mb")
                if "error" not in compiled and "error" not in garden:
                    cpu_speedup = f"{garden['ms'] / compiled['ms']:.1f}x"
            print(
                f"| garden 648x420, 3 cameras | 138,766 | fwd | {cell(garden, 'ms')} "
                f"({cell(garden, 'cpu_ms')}) | {cpu_time} | {cpu_speedup} | - | - | "
                f"{cell(garden, 'peak_mb')} | {cpu_peak} | - | - |"
            )
        else:
            print(f"garden scene skipped: {GARDEN} not found")
    print()
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
