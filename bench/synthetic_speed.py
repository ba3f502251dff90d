"""Benchmark: synthetic scene generation speed.

Times ``datamodules.synthetic.generate_dataset`` for 1,000 scenes x 24 views at 64x64 with
``--workers 2`` (the target is under 5 minutes on 2 cores) and prints a table with wall time,
CPU time per scene, output size and the machine's load average (other work on the machine slows
the wall time down; CPU time per scene does not depend on it).

    python bench/synthetic_speed.py [--scenes 1000] [--views 24] [--resolution 64] [--workers 2]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from datamodules.synthetic import SyntheticSettings, generate_dataset  # noqa: E402

TARGET_SECONDS = 300.0


def _cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenes", type=int, default=1000)
    parser.add_argument("--views", type=int, default=24)
    parser.add_argument("--resolution", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--kind", choices=["room", "object"], default="room")
    parser.add_argument("--supersample", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="keep the dataset here")
    args = parser.parse_args()

    settings = SyntheticSettings(
        scenes=args.scenes,
        resolution=args.resolution,
        views=args.views,
        kind=args.kind,
        supersample=args.supersample,
    )
    scratch = Path(tempfile.mkdtemp(prefix="synthetic_speed_"))
    out = args.out if args.out is not None else scratch / "data"
    load_before = os.getloadavg()[0]
    cpu_before, start = _cpu_seconds(), time.perf_counter()
    try:
        generate_dataset(out, settings, workers=args.workers, progress=True)
        wall = time.perf_counter() - start
        cpu = _cpu_seconds() - cpu_before
        size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    load_after = os.getloadavg()[0]

    rows = [
        ("scenes x views", f"{args.scenes} x {args.views}"),
        (
            "resolution",
            f"{args.resolution}x{args.resolution} ({args.supersample}x{args.supersample} rays/pixel)",
        ),
        ("kind / workers", f"{args.kind} / {args.workers}"),
        ("wall time", f"{wall:.1f} s"),
        ("scenes per second", f"{args.scenes / wall:.2f}"),
        ("CPU time per scene", f"{1000 * cpu / args.scenes:.0f} ms"),
        ("output size", f"{size / 2**20:.1f} MiB"),
        (
            "load average (start, end)",
            f"{load_before:.1f}, {load_after:.1f} on {os.cpu_count()} cores",
        ),
        ("target", f"< {TARGET_SECONDS:.0f} s: {'PASS' if wall < TARGET_SECONDS else 'FAIL'}"),
    ]
    width = max(len(name) for name, _ in rows)
    print(f"| {'synthetic generator'.ljust(width)} | value |")
    print(f"| {'-' * width} | ----- |")
    for name, value in rows:
        print(f"| {name.ljust(width)} | {value} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
