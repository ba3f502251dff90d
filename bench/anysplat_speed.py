"""Benchmark: AnySplat's released architecture (``anysplat_vggt``) on this machine's CPU.

One forward pass of V views at the inputs' size, timed, with its peak resident memory: each
configuration in a fresh subprocess; the resident memory after loading the weights, and the peak
during the forward pass (``VmHWM`` reset through ``/proc/self/clear_refs`` after loading, as
``models.core.budget`` was calibrated). Weights: a release-format folder (``config.json`` +
``model.safetensors``, e.g. deterministic test weights) or, without ``--weights``, random ones
(time and memory do not depend on the values except through the voxel count, reported).
Inputs: ``image [1, V, 3, H, W]`` in [0, 1] from a ``.safetensors`` file (``--images``; the first
V views), else the shared drone frames repeated to V.

    python bench/anysplat_speed.py --views 2 8 [--model anysplat_vggt] [--weights DIR]
        [--images FILE] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

SHARED = Path(os.environ.get("SPLATZOO_SHARED_DATA", REPO.parent / "shared" / "data"))
DRONE = SHARED / "examples" / "drone_frames"


def _rss(field: str) -> int:
    """``VmRSS`` / ``VmHWM`` of this process, bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


def _images(path: str | None, views: int, size: int) -> torch.Tensor:
    if path:
        from safetensors.torch import load_file

        images = load_file(path)["image"]
        if images.shape[1] < views:
            raise SystemExit(f"error: --images {path}: {images.shape[1]} views, {views} asked")
        return images[:, :views].float().contiguous()
    from datamodules.readers.image_folder import load_images

    frames = load_images(DRONE, image_size=(size, size)).images  # [8, 3, S, S]
    return frames[torch.arange(views) % len(frames)][None]


def _one_run(
    model: str, views: int, size: int, threads: int, weights: str | None, images: str | None
):
    """(child process) load the model, then time one forward pass."""
    torch.set_num_threads(threads)
    from models import create_model

    torch.manual_seed(0)
    start = time.perf_counter()
    net = create_model(model, pretrained=weights or False).eval()
    load_s = time.perf_counter() - start
    batch = _images(images, views, size)
    loaded = _rss("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    with torch.no_grad():
        start = time.perf_counter()
        out = net({"image": batch})
        seconds = time.perf_counter() - start
    return {
        "seconds": seconds,
        "load_s": load_s,
        "input": list(batch.shape[-2:]),
        "gaussians": int(out.gaussians.count()[0]),
        "loaded_gb": loaded / 1e9,
        "forward_peak_gb": _rss("VmHWM") / 1e9,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="anysplat_vggt", help="or anysplat_vggt_tiny")
    parser.add_argument("--views", type=int, nargs="*", default=[2, 8])
    parser.add_argument("--size", type=int, default=448, help="without --images")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--weights", default=None, help="release-format folder or file")
    parser.add_argument("--images", default=None, help=".safetensors with image [1, V, 3, H, W]")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_one_run(**json.loads(args.child))))
        return 0
    if args.size % 14:
        print(f"error: --size {args.size}: must be a multiple of 14", file=sys.stderr)
        return 2
    print(f"{args.model}, float32, {args.threads} thread(s)\n")
    print("| views | input | forward s | Gaussians | RSS after load GB | peak during forward GB |")
    print("|---|---|---|---|---|---|")
    for views in args.views:
        child = {"model": args.model, "views": views, "size": args.size, "threads": args.threads}
        child |= {"weights": args.weights, "images": args.images}
        command = [sys.executable, __file__, "--child", json.dumps(child)]
        done = subprocess.run(command, capture_output=True, text=True)
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        if done.returncode or not lines:
            tail = (done.stderr.strip().splitlines() or ["killed"])[-1]
            print(f"| {views} | | failed: {tail[:80]} | | | |", flush=True)
            continue
        r = json.loads(lines[-1])
        print(
            f"| {views} | {r['input'][0]}x{r['input'][1]} | {r['seconds']:.1f} | "
            f"{r['gaussians']:,} | {r['loaded_gb']:.2f} | {r['forward_peak_gb']:.2f} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
