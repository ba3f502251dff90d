"""Benchmark: NoPoSplat's released architecture on this CPU, per tag (forward seconds, peak memory).

Each tag runs in a fresh process (so its peak resident memory is its own): ``noposplat_vitl``
at the released size (625 M parameters), random weights or ``--weights FILE`` (a file in the
authors' Lightning format, loaded by ``create_model``), one forward pass of the tag's recipe
input (size, views) under ``torch.no_grad``. Peak memory: the process's peak resident set once
the model is built and loaded, and the peak during the forward (Linux: the peak is reset through
``/proc/self/clear_refs`` before it; the loaded model included). ``--one`` also reports the
seconds the process's threads waited, runnable, for a CPU during the forward (``/proc/self/task/
*/schedstat``: time other processes took from the cores, so a slow run on a loaded machine shows
as such), its page faults and the load average. Prints a table; the official
encoder's figures, measured the same way in a scratch folder, are in docs/ports/noposplat.md.

    flock /tmp/splatzoo-heavy.lock python bench/noposplat_speed.py [--threads 2] [--tags re10k ...]
        [--weights re10k.ckpt]
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TAGS = ("re10k", "mixRe10kDl3dv_512x512", "re10k_3views")


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _peak_gb() -> float:
    """The process's peak resident set since start or the last ``_reset_peak`` (GB)."""
    status = Path("/proc/self/status").read_text()
    return int(re.search(r"VmHWM:\s+(\d+)", status).group(1)) / 2**20  # kB -> GB


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM (Linux >= 4.0)


def _thread_times() -> dict[str, tuple[float, float]]:
    """Per thread of this process: (seconds on a CPU, seconds runnable but waiting for one), from
    ``/proc/self/task/*/schedstat`` (Linux; empty elsewhere)."""
    times = {}
    for task in Path("/proc/self/task").glob("*"):
        try:
            on_cpu, waiting = task.joinpath("schedstat").read_text().split()[:2]
        except (OSError, ValueError):
            continue
        times[task.name] = (int(on_cpu) / 1e9, int(waiting) / 1e9)
    return times


def _waited(before: dict[str, tuple[float, float]]) -> float:
    """Seconds this process's threads waited for a CPU since ``before`` (other processes using
    the cores: the machine's load, not this code's work)."""
    after = _thread_times()
    return sum(wait - before.get(name, (0.0, 0.0))[1] for name, (_, wait) in after.items())


def _faults() -> int:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_minflt + usage.ru_majflt


def run_one(tag: str, threads: int, weights: str | None = None) -> dict:
    """Build the tag's architecture, run one forward at its recipe; seconds and memory."""
    sys.path.insert(0, str(REPO))
    sys.path.insert(0, str(REPO / "tests"))
    import torch
    from depthsplat_fixtures import make_context

    from models import create_model, get_pretrained_cfg

    torch.set_num_threads(threads)
    recipe = get_pretrained_cfg(f"noposplat_vitl.{tag}").recipe
    torch.manual_seed(0)
    model = create_model("noposplat_vitl", pretrained=weights or False).eval()
    built = _peak_gb()
    _reset_peak()
    context = make_context(*recipe.image_size, recipe.views)
    with torch.no_grad():
        threads_before, faults = _thread_times(), _faults()
        start, cpu = time.perf_counter(), _cpu_seconds()
        out = model(context)
        seconds, cpu = time.perf_counter() - start, _cpu_seconds() - cpu
        waited, faults = _waited(threads_before), _faults() - faults
    return {
        "tag": tag,
        "input": f"{recipe.image_size[0]}x{recipe.image_size[1]}",
        "views": recipe.views,
        "gaussians": int(out.gaussians.count()[0]),
        "seconds": round(seconds, 1),
        "cpu_seconds": round(cpu, 1),
        "peak_gb_built": round(built, 2),
        "peak_gb_forward": round(_peak_gb(), 2),
        "waited_for_cpu_s": round(waited, 1),
        "page_faults": faults,
        "load_average": Path("/proc/loadavg").read_text().split()[0],
        "threads": threads,
        "weights": weights or "random",
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tags", nargs="*", default=list(TAGS), choices=TAGS)
    parser.add_argument("--weights", help="a file in the authors' format (default: random)")
    parser.add_argument("--one", choices=TAGS, help="run one tag in this process, print JSON")
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_one(args.one, args.threads, args.weights)))
        return 0
    print(
        f"noposplat_vitl, {args.weights or 'random weights'}, one forward, {args.threads} threads"
    )
    print(
        "| tag | input | views | Gaussians | forward s | CPU s | peak GB built | peak GB forward |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for tag in args.tags:
        print(f"running {tag} (minutes) ...", file=sys.stderr, flush=True)
        child = subprocess.run(
            [sys.executable, __file__, "--one", tag, "--threads", str(args.threads)]
            + (["--weights", args.weights] if args.weights else []),
            capture_output=True,
            text=True,
            check=False,
        )
        if child.returncode:
            print(f"{tag}: failed: {child.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
            return 1
        r = json.loads(child.stdout.strip().splitlines()[-1])
        print(
            f"| {r['tag']} | {r['input']} | {r['views']} | {r['gaussians']:,} | {r['seconds']} "
            f"| {r['cpu_seconds']} | {r['peak_gb_built']} | {r['peak_gb_forward']} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
