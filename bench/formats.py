"""Splat file formats: size, write/read time and render fidelity, ours against splat-transform's.

    python bench/formats.py [--infer-output DIR] [--no-garden] [--size H,W] [--backend torch]
        [--cameras 1] [--formats "sog,compressed.ply"]

For gsplat's garden scene (138,766 Gaussians, SH degree 0) and, with ``--infer-output``, an
``infer.py`` output folder (its ``gaussians.ply`` seen from its ``cameras.json`` input cameras),
prints one Markdown table per scene: per format the file size and its ratio to the INRIA ``.ply``,
the write and read times of splatzoo's writer/reader, the render PSNR of the decoded scene against
the original, and the same figures for PlayCanvas' splat-transform converting the same ``.ply``
(its time is the whole command, Node start-up included; its files are read back by splatzoo).
splat-transform writes no ``.splat``; its SOG runs on the CPU (``-g cpu``). Times are wall-clock
on this machine (shared, loaded: compare the columns, not absolute values).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from data_fixtures import GARDEN, garden_scene  # noqa: E402
from splat_format_fixtures import file_size, splat_transform  # noqa: E402

from models.core.gaussians import Gaussians  # noqa: E402
from models.geometry.cameras import intrinsics_to_normalized  # noqa: E402
from models.render import render  # noqa: E402

FORMATS = {  # name -> (file name, our save options, splat-transform options or None)
    "spz (v4)": ("scene.spz", {}, []),
    "spz (v3)": ("scene.spz", {"spz_version": 3}, ["--spz-version", "3"]),
    "sog": ("scene.sog", {}, ["-g", "cpu"]),
    "sog (meta.json)": ("meta.json", {}, ["-g", "cpu"]),
    "glb": ("scene.glb", {}, []),
    "splat": ("scene.splat", {}, None),
    "compressed.ply": ("scene.compressed.ply", {}, []),
}


def infer_scene(folder: Path):
    """``gaussians.ply`` and the input cameras of an ``infer.py`` output folder."""
    gaussians = Gaussians.load(folder / "gaussians.ply")
    frames = json.loads((folder / "cameras.json").read_text())["frames"]
    frames = [f for f in frames if "camera_to_world" in f]
    poses = torch.tensor([f["camera_to_world"] for f in frames], dtype=torch.float32)
    height, width = frames[0]["height"], frames[0]["width"]
    k = torch.tensor(
        [[[f["fx"], 0, f["cx"]], [0, f["fy"], f["cy"]], [0, 0, 1]] for f in frames],
        dtype=torch.float32,
    )
    return (
        gaussians,
        poses[None],
        intrinsics_to_normalized(k, (height, width))[None],
        (height, width),
    )


def timed(function):
    start = time.perf_counter()
    value = function()
    return value, time.perf_counter() - start


def measure(scene, folder: Path, args) -> list[str]:
    gaussians, extrinsics, intrinsics, _ = scene
    extrinsics, intrinsics = extrinsics[:, : args.cameras], intrinsics[:, : args.cameras]
    size = tuple(int(s) for s in args.size.split(","))

    def image(scene) -> torch.Tensor:  # [1, V, 3, H, W]
        with torch.no_grad():
            rendered = render(scene, extrinsics, intrinsics, size, backend=args.backend)
        return rendered.color.clamp(0, 1)

    reference = image(gaussians)  # rendered once, not once a format

    def psnr(decoded) -> float:
        k = gaussians.harmonics.shape[-1]  # SH bands a format dropped render as zero
        if decoded.harmonics.shape[-1] < k:
            pad = torch.zeros(*decoded.harmonics.shape[:-1], k - decoded.harmonics.shape[-1])
            decoded = decoded.replace(harmonics=torch.cat([decoded.harmonics, pad], dim=-1))
        mse = ((image(decoded) - reference) ** 2).mean().item()
        return 10 * math.log10(1.0 / max(mse, 1e-12))

    source = folder / "scene.ply"
    _, ply_write = timed(lambda: gaussians.save(source))
    _, ply_read = timed(lambda: Gaussians.load(source))
    ply_bytes = source.stat().st_size
    rows = [
        f"| .ply (INRIA) | {ply_bytes / 1e3:,.1f} kB | 1.00 | {ply_write:.2f} | {ply_read:.2f} "
        "| exact | - | - | - | - |"
    ]
    command = splat_transform()
    chosen = {n: FORMATS[n] for n in args.formats} if args.formats else FORMATS
    for name, (file, options, theirs) in chosen.items():
        ours = folder / "ours" / name.replace(" ", "_") / file
        ours.parent.mkdir(parents=True)
        _, write = timed(lambda ours=ours, options=options: gaussians.save(ours, **options))
        decoded, read = timed(lambda ours=ours: Gaussians.load(ours))
        cells = [f"{file_size(ours) / 1e3:,.1f} kB", f"{file_size(ours) / ply_bytes:.3f}"]
        cells += [f"{write:.2f}", f"{read:.2f}", f"{psnr(decoded):.2f}"]
        if command is None or theirs is None:
            cells += ["-"] * 4
        else:
            path = folder / "theirs" / name.replace(" ", "_") / file
            path.parent.mkdir(parents=True)
            _, seconds = timed(
                lambda path=path, theirs=theirs: subprocess.run(
                    [*command, "-q", "-w", *theirs, str(source), str(path)],
                    check=True,
                    capture_output=True,
                )
            )
            cells += [f"{file_size(path) / 1e3:,.1f} kB", f"{file_size(path) / ply_bytes:.3f}"]
            cells += [f"{seconds:.2f}", f"{psnr(Gaussians.load(path)):.2f}"]
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
        print(rows[-1], file=sys.stderr, flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--infer-output", type=Path, help="an infer.py output folder")
    parser.add_argument("--size", default="210,324", help="render size H,W for the PSNR")
    parser.add_argument("--backend", default="torch", help="renderer backend for the PSNR")
    parser.add_argument("--cameras", type=int, default=1, help="cameras rendered per scene")
    parser.add_argument("--no-garden", action="store_true", help="only the infer.py output")
    parser.add_argument("--formats", default="", help=f"comma-separated rows of {list(FORMATS)}")
    args = parser.parse_args()
    args.formats = [n.strip() for n in args.formats.split(",") if n.strip()]
    unknown = [n for n in args.formats if n not in FORMATS]
    if unknown:
        parser.error(f"--formats: unknown {unknown} (known: {', '.join(FORMATS)})")
    scenes = {}
    if not args.no_garden:
        if GARDEN.is_file():
            scenes[f"garden ({GARDEN.name})"] = garden_scene(GARDEN)
        else:
            print(f"garden scene skipped: {GARDEN} not found", file=sys.stderr)
    if args.infer_output is not None:
        scenes[f"infer.py output ({args.infer_output})"] = infer_scene(args.infer_output)
    if splat_transform() is None:
        print("splat-transform not installed (.node/): its columns are '-'", file=sys.stderr)
    header = (
        "| format | ours: size | ratio to .ply | write s | read s | render PSNR dB "
        "| splat-transform: size | ratio | convert s | render PSNR dB |\n"
        "|---|---|---|---|---|---|---|---|---|---|"
    )
    for title, scene in scenes.items():
        count, degree = scene[0].num_slots, scene[0].sh_degree
        with tempfile.TemporaryDirectory(prefix="splat-formats-") as folder:
            rows = measure(scene, Path(folder), args)
        print(f"\n{title}: {count:,} Gaussians, SH degree {degree}; PSNR at {args.size} px, "
              f"{args.cameras} camera(s), backend {args.backend}\n")  # fmt: skip
        print(header)
        print("\n".join(rows))
    return 0


if __name__ == "__main__":
    if shutil.which("node") is None:
        print("node not found: splat-transform columns will be '-'", file=sys.stderr)
    sys.exit(main())
