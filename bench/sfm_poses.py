"""Structure-from-motion poses (datamodules.tools.sfm, pycolmap on the CPU): time per stage on the drone
frames, and errors against the reference COLMAP model of ``real/drone_colmap``.

    python bench/sfm_poses.py [--data ../shared/data] [--threads 2] [--runs 8,41,41-fov]

Runs (each recomputed, the cache bypassed):

- ``8``: the 8 ``examples/drone_frames`` (exhaustive matching, focal estimated); no reference;
- ``11``: every 4th of the 41 reference frames, exhaustive, focal estimated;
- ``11-fov``: the same with the reference's field of view fixed (``fov=``, ``refine_focal=False``);
- ``last11-fov``: the last 11 reference frames at half resolution, the field of view fixed (the
  default-run test in tests/test_sfm.py);
- ``41``: the 41 reference frames, sequential matching, focal estimated;
- ``41-fov``: the same with the reference's field of view fixed.

Errors: the estimate aligned to the reference by a similarity on the camera centres (Umeyama);
rotation error in degrees, centre error divided by the reference's largest camera distance;
``rel rot``: median error of the pairwise relative rotations (no alignment). ``cpu s`` is the
process's CPU time (all threads), a figure that a shared, loaded machine does not inflate the way
it inflates wall time. Prints a table.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

import pycolmap
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from datamodules.readers import colmap  # noqa: E402
from datamodules.tools.pose_errors import pose_errors  # noqa: E402
from datamodules.tools.sfm import estimate_poses, image_files  # noqa: E402


def reference_poses(model_dir: Path) -> tuple[dict[str, torch.Tensor], float]:
    """Camera-to-world poses of a COLMAP model by name, and its horizontal field of view."""
    cameras, images, _ = colmap.read_model(model_dir, points=False)
    poses = {
        i.name: torch.linalg.inv(colmap.image_world_to_camera(i)).double() for i in images.values()
    }
    camera = next(iter(cameras.values()))
    fx = colmap.camera_pinhole(camera)[0]
    return poses, math.degrees(2 * math.atan(0.5 * camera.width / fx))


def run(name: str, files: list[Path], reference, threads: int, **settings) -> dict:
    start, cpu = time.perf_counter(), time.process_time()
    result = estimate_poses(files, cache=False, verbose=0, num_threads=threads, **settings)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    row = {
        "run": name,
        "frames": len(files),
        "registered": len(result.registered),
        "matching": result.matching,
        "focal_px": result.focal_px[0],
        "reproj_px": result.mean_reprojection_error,
        "points": result.num_points3d,
        "features_s": result.timings_s["features"],
        "matching_s": result.timings_s["matching"],
        "mapping_s": result.timings_s["mapping"],
        "total_s": wall,
        "cpu_s": cpu,
    }
    if reference is not None:
        estimated = {n: p["camera_to_world"] for n, p in result.poses().items()}
        row.update(pose_errors(estimated, reference))
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default=str(REPO_ROOT.parent / "shared" / "data"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", default="8,last11-fov,41-fov")
    args = parser.parse_args()
    data = Path(args.data)
    drone8 = image_files(data / "examples" / "drone_frames")
    drone41 = image_files(data / "real" / "drone_colmap" / "images")
    reference, fov = reference_poses(data / "real" / "drone_colmap" / "sparse")
    fixed = {"fov": fov, "refine_focal": False}
    plans = {
        "8": (drone8, None, {}),
        "11": (drone41[::4], reference, {}),
        "11-fov": (drone41[::4], reference, fixed),
        "last11-fov": (drone41[30:], reference, {**fixed, "max_image_size": 424}),
        "41": (drone41, reference, {}),
        "41-fov": (drone41, reference, fixed),
    }
    rows = []
    for name in args.runs.split(","):
        files, ref, settings = plans[name]
        rows.append(run(name, files, ref, args.threads, **settings))
        print(f"done: {name}", file=sys.stderr, flush=True)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"# pycolmap {pycolmap.__version__} SfM on the CPU ({os.cpu_count()} cores, load average "
        f"{load:.1f} at the end), {args.threads} threads; reference fov {fov:.2f} deg "
        f"(f = 595 px at 848x480)"
    )
    header = (
        "| run | frames | registered | matching | focal px | reproj. px | features s | "
        "matching s | mapping s | total s | cpu s | rot. median / max deg | centre median / max | "
        "rel. rot. median deg |"
    )
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    for r in rows:
        if "rotation_median_deg" in r:
            errors = (
                f"{r['rotation_median_deg']:.2f} / {r['rotation_max_deg']:.2f} | "
                f"{r['center_median']:.4f} / {r['center_max']:.4f} | "
                f"{r['relative_rotation_median_deg']:.2f}"
            )
        else:
            errors = "- | - | -"
        print(
            f"| {r['run']} | {r['frames']} | {r['registered']} | {r['matching']} | "
            f"{r['focal_px']:.0f} | {r['reproj_px']:.3f} | {r['features_s']:.1f} | "
            f"{r['matching_s']:.1f} | {r['mapping_s']:.1f} | {r['total_s']:.1f} | {r['cpu_s']:.1f} | {errors} |"
        )


if __name__ == "__main__":
    main()
