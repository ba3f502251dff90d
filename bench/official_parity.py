"""Benchmark: parity of the ports with the official implementations, from recorded fixtures.

For each recorded official output (``tests/fixtures/<port>/official_*.npz``; how they were made is
in that folder's README), rebuild the deterministic weights from the key manifest, load them
through ``create_model(arch, pretrained=<file>)`` and print the max abs error of every Gaussian
field against the official numbers. No weights or network are needed.

    python bench/official_parity.py [--port depthsplat] [--only TAG ...] [--threads 2]

One function per port (``depthsplat_rows``) returns the table rows; add yours beside it.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

import torch  # noqa: E402

TOLERANCE = 1e-4


def depthsplat_rows(only: list[str] | None = None) -> tuple[list[str], list[list[str]]]:
    """One row per recorded DepthSplat configuration."""
    import depthsplat_fixtures as fx

    from models import create_model, get_pretrained_cfg

    fields = list(fx.FIELDS)
    rows = []
    for tag in fx.list_official_samples():
        if only and tag not in only:
            continue
        meta, _ = fx.load_official_sample(tag)
        name = fx.pretrained_name_of(meta["config"])
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "depthsplat-fixture.pth"
            torch.save(fx.manifest_weights(fx.load_manifest(meta["config"])), path)
            arch_kwargs = get_pretrained_cfg(name).arch_kwargs
            model = create_model(name.split(".")[0], pretrained=str(path), **arch_kwargs)
        start = time.perf_counter()
        errors = fx.parity_errors(tag, model)
        seconds = time.perf_counter() - start
        del model
        worst = max(errors[k] for k in fields if k != "depth")
        rows.append(
            [
                name,
                f"{meta['height']}x{meta['width']}",
                str(meta["views"]),
                *(f"{errors[k]:.1e}" for k in fields),
                "yes" if worst <= TOLERANCE else "NO",
                f"{seconds:.1f}",
            ]
        )
    header = ["weights (architecture.tag)", "input", "views", *fields, "<= 1e-4", "port s"]
    return header, rows


PORTS = {"depthsplat": depthsplat_rows}


def print_table(header: list[str], rows: list[list[str]]) -> None:
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", choices=sorted(PORTS), action="append")
    parser.add_argument("--only", nargs="*", help="fixture tags (e.g. small_64x64_v2)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    failed = False
    for port in args.port or sorted(PORTS):
        print(f"\n{port}: max abs error against the official implementation (depth: z-depth, "
              "not a Gaussian field; rotations as world rotation matrices)\n")  # fmt: skip
        header, rows = PORTS[port](args.only)
        print_table(header, rows)
        failed |= any(row[-2] != "yes" for row in rows)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
