"""Which start makes the per-scene fit best: the feed-forward set, the SfM points, or both.

    python -m bench.refine_start [captures=drone,garden] [models=pixel_aligned_tiny,...]
        [starts=auto,feed_forward,sfm] [budgets=120,300,600] [refine_size=240] [holdout=8]
        [output=DIR] [drone=PATH] [garden=PATH] [garden_views=48] [garden_size=240]
    python -m bench.refine_start report=DIR,DIR,... output=DIR   # earlier runs in one table/plot

For every capture x model x start x time budget it runs the command a user runs,
``infer.py input=... model=M views=all holdout=8 refine_time=S refine_init=START``, in a
subprocess (its own process: one thread setting, nothing shared between runs), and reads its
``summary.json``: held-out PSNR/SSIM after the fit, the nearest-view baseline at the same size,
the fit's steps and seconds, the Gaussians at the start and the end, and the held-out PSNR the fit
measured along the way (``refine.evaluations``). Prints one table per capture, writes
``DIR/refine_start.json``, ``DIR/refine_start.md`` (the tables) and ``DIR/refine_start.png``
(held-out PSNR against seconds, one panel per capture, the nearest-view baseline dashed).

Captures:

- ``drone``: the shared real drone capture (41 COLMAP-posed frames, ``real/drone_colmap``);
- ``garden``: an object-centred orbit made here: ``garden_views`` photos rendered with the
  project's renderer on a circle around the shared real garden scene's centre object
  (``gsplat_test_garden.npz``: 138,766 coloured points; the ~25k within 0.6x the cameras'
  distance of the point its three real cameras look at, each a Gaussian as 3DGS initialises
  them, scales capped at their 95th percentile), 1.3x farther out than those cameras, on black,
  written without cameras to a temporary folder, so that posed models get the project's own
  structure-from-motion poses. Nothing of it enters the repository. Its rows also say how far
  the run's cameras (structure-from-motion's, or a pose-free model's placed and refined ones)
  are from the ones the photos were rendered at (``camera_errors``: the median rotation error
  after a similarity alignment, and of every pair's relative rotation).

A run that ``infer.py`` refuses (e.g. a ``refine_init`` this build lacks) is a row saying why.
Each run's own output goes to ``<its folder>.log`` beside it (the folder printed). The runs use
torch's thread count (``OMP_NUM_THREADS`` when set). Figures from a loaded machine are not
comparable between rows run at different loads: run it alone (``flock /tmp/splatzoo-heavy.lock``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

SHARED = Path(os.environ.get("SPLATZOO_SHARED_DATA", REPO_ROOT.parent / "shared" / "data"))
DEFAULTS = {
    "captures": "drone,garden",
    "models": "pixel_aligned_tiny,resplat_tiny,zipsplat_tiny,splatweaver_tiny",
    "starts": "auto,feed_forward,sfm",
    "budgets": "120,300,600",
    "refine_size": "240",
    "holdout": "8",
    "output": None,
    "drone": str(SHARED / "real" / "drone_colmap"),
    "garden": str(SHARED / "gsplat_test_garden.npz"),
    "garden_views": "48",
    "garden_size": "240",
    "device": "cpu",
    "report": None,
}
GARDEN_KEEP = 0.6  # the orbit's object: points this close to the centre (x the cameras' distance)
GARDEN_SCALE_QUANTILE = 0.95  # no point's Gaussian larger than this quantile of the scales
GARDEN_ZOOM_OUT = 1.3  # the orbit's radius and height x the real cameras'


def parse(argv: list[str]) -> dict[str, Any]:
    """``key=value`` arguments over :data:`DEFAULTS` (an unknown key is an error)."""
    settings = dict(DEFAULTS)
    for arg in argv:
        key, sep, value = arg.partition("=")
        if not sep or key not in settings:
            raise SystemExit(f"error: {arg}: expected key=value with key in {', '.join(settings)}")
        settings[key] = value
    return settings


def _orbit(centre, up, radius: float, height: float, count: int):
    """``count`` camera-to-world poses ``[count, 4, 4]`` (OpenCV axes) on a circle of
    ``radius`` about the axis ``up`` through ``centre``, ``height`` above it, looking at it."""
    import torch

    up = up / up.norm()
    side = torch.linalg.cross(up, torch.tensor([1.0, 0.0, 0.0], dtype=up.dtype))
    if float(side.norm()) < 1e-3:
        side = torch.linalg.cross(up, torch.tensor([0.0, 1.0, 0.0], dtype=up.dtype))
    side = side / side.norm()
    other = torch.linalg.cross(up, side)
    poses = []
    for i in range(count):
        angle = 2 * math.pi * i / count
        eye = centre + radius * (math.cos(angle) * side + math.sin(angle) * other) + height * up
        forward = (centre - eye) / (centre - eye).norm()  # +z
        right = torch.linalg.cross(forward, up)  # +x (image right), with +y = down
        right = right / right.norm()
        down = torch.linalg.cross(forward, right)
        pose = torch.eye(4, dtype=up.dtype)
        pose[:3, 0], pose[:3, 1], pose[:3, 2], pose[:3, 3] = right, down, forward, eye
        poses.append(pose)
    return torch.stack(poses)


def _looked_at(cameras):
    """The point nearest to every camera's optical axis (least squares) of ``[V, 4, 4]``."""
    import torch

    eye, axis = cameras[:, :3, 3].double(), cameras[:, :3, 2].double()
    project = torch.eye(3, dtype=torch.float64) - axis[:, :, None] * axis[:, None, :]  # [V, 3, 3]
    point = torch.linalg.solve(project.sum(0), (project @ eye[:, :, None]).sum(0))[:, 0]
    return point.float()


def garden_orbit(npz: Path, views: int):
    """The garden orbit's object and cameras (module doc): ``(scene, poses [V, 4, 4] c2w,
    intrinsics [3, 3] normalised, (width, height) of the real cameras)``."""
    import numpy as np
    import torch

    from models.pipeline.refine import gaussians_from_points

    data = np.load(npz)
    means = torch.from_numpy(data["means3d"]).float()  # [N, 3]
    cameras = torch.linalg.inv(torch.from_numpy(data["viewmats"]).float())  # c2w [3, 4, 4]
    centre = _looked_at(cameras)
    up = -cameras[:, :3, 1].mean(0)  # OpenCV +y is down in every real camera
    offset = cameras[:, :3, 3].mean(0) - centre
    height = float(offset @ (up / up.norm()))
    radius = float((offset - height * up / up.norm()).norm())
    # the object: the points within GARDEN_KEEP of the cameras' distance from the centre; the
    # sparse background points, as 3DGS initialises them, are screen-filling fog
    near = (means - centre).norm(dim=1) < GARDEN_KEEP * float(offset.norm())
    scene = gaussians_from_points(means[near], torch.from_numpy(data["colors"])[near], opacity=0.9)
    cap = float(scene.scales.quantile(GARDEN_SCALE_QUANTILE))  # isolated points' blobs
    scene = dataclasses.replace(scene, scales=scene.scales.clamp(max=cap))
    poses = _orbit(centre, up, GARDEN_ZOOM_OUT * radius, GARDEN_ZOOM_OUT * height, views)
    width, height_px = int(data["width"]), int(data["height"])
    k = torch.from_numpy(data["Ks"][0]).float().clone()
    k[0] /= width
    k[1] /= height_px
    return scene, torch.stack(list(poses)), k, (width, height_px)


def garden_name(index: int) -> str:
    """The file name of the garden orbit's photo ``index``."""
    return f"orbit_{index:03d}.png"


def make_garden(npz: Path, folder: Path, views: int, size: int) -> dict[str, Any]:
    """The garden orbit's photos in ``folder`` (module doc); returns the camera each was
    rendered at (``[4, 4]`` camera-to-world) by file name."""
    import torch
    from PIL import Image

    from models.render.core import render

    scene, poses, k, (width, height_px) = garden_orbit(npz, views)
    h = round(size * height_px / width)
    folder.mkdir(parents=True, exist_ok=True)
    for i, pose in enumerate(poses):
        with torch.inference_mode():
            out = render(scene, pose[None, None], k[None, None], (h, size), backend="auto")
        pixels = (out.color[0, 0].clamp(0, 1) * 255 + 0.5).to(torch.uint8).permute(1, 2, 0)
        Image.fromarray(pixels.numpy()).save(folder / garden_name(i))
    return {garden_name(i): pose for i, pose in enumerate(poses)}


def camera_errors(cameras_json: Path, reference: dict[str, Any]) -> dict[str, float]:
    """How far a run's cameras (its ``cameras.json``: the fitted photos, in the capture frame)
    are from the ones the photos were rendered at (``datamodules.tools.pose_errors``: aligned
    by a similarity, so any frame and scale is right; relative rotations need no alignment)."""
    import torch

    from datamodules.tools.pose_errors import pose_errors

    frames = json.loads(cameras_json.read_text())["frames"]
    estimated = {f["file"]: torch.tensor(f["camera_to_world"]) for f in frames}
    return pose_errors(estimated, reference)


def run_one(
    capture: Path,
    model: str,
    start: str,
    budget: int,
    settings: dict,
    out: Path,
    reference: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One ``infer.py`` run; its row (``error`` when it was refused). ``reference``: the
    capture's true cameras by photo name (the garden orbit's), for the row's ``cameras``."""
    command = [
        sys.executable, str(REPO_ROOT / "infer.py"), f"input={capture}", f"output={out}",
        f"model={model}", "views=all", f"holdout={settings['holdout']}",
        f"refine_time={budget}", f"refine_size={settings['refine_size']}",
        f"refine_init={start}", f"device={settings['device']}", "overwrite=true",
    ]  # fmt: skip
    log = out.parent / f"{out.name}.log"  # the run's own output, to follow it while it runs
    log.parent.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    with open(log, "w") as handle:
        done = subprocess.run(command, stdout=handle, stderr=subprocess.STDOUT, cwd=REPO_ROOT)
    wall = time.perf_counter() - began
    row: dict[str, Any] = {"model": model, "start": start, "budget_s": budget, "wall_s": wall}
    if done.returncode != 0:
        lines = log.read_text(errors="replace").strip().splitlines()
        row["error"] = lines[-1] if lines else f"exit status {done.returncode}"
        return row
    summary = json.loads((out / "summary.json").read_text())
    mean, fit = summary["holdout"]["mean"], summary.get("refine", {})
    row.update(
        psnr=mean["psnr"],
        ssim=mean["ssim"],
        psnr_start=mean.get("psnr_before_refine"),
        nearest_view_psnr=mean["nearest_view_psnr"],
        steps=fit.get("steps"),
        fit_s=fit.get("seconds"),
        gaussians_start=fit.get("count_before"),
        gaussians_end=fit.get("count_after"),
        curve=[(e["seconds"], e["psnr"]) for e in fit.get("evaluations", []) if "psnr" in e],
        image_size=summary["holdout"]["image_size"],
        start_opacity=fit.get("settings", {}).get("start_opacity"),
        # photos without poses: the held-out cameras are placed against the refined scene after
        # the fit, so the curve along it (at the first placement) is not its score
        cameras_placed_after="cameras_before_refine" in summary["holdout"],
    )
    if reference is not None:
        row["cameras"] = camera_errors(out / "cameras.json", reference)
    return row


def table(rows: list[dict[str, Any]]) -> str:
    """A markdown table of one capture's rows."""
    head = (
        "| model | start | opacity cap | budget s | held-out PSNR | SSIM "
        "| feed-forward set before the fit | nearest view | steps | Gaussians start -> end "
        "| cameras' rotation error, relative (deg) |\n"
        "|---|---|---|---:|---:|---:|---:|---:|---:|---|---:|"
    )
    lines = [head]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['start']} || {r['budget_s']} | {r['error']} ||||||")
            continue
        start = "" if r["psnr_start"] is None else f"{r['psnr_start']:.2f}"
        cap = r.get("start_opacity")  # absent: a run from before refinement.start_opacity
        lines.append(
            f"| {r['model']} | {r['start']} | {'none' if cap is None else cap} | "
            f"{r['budget_s']} | {r['psnr']:.2f} | "
            f"{r['ssim']:.3f} | {start} | {r['nearest_view_psnr']:.2f} | {r['steps']} | "
            f"{r['gaussians_start']:,} -> {r['gaussians_end']:,} | {_camera_cell(r)} |"
        )
    return "\n".join(lines)


def _camera_cell(row: dict[str, Any]) -> str:
    """The median rotation error of a row's cameras and of their pairwise relative rotations
    against the true ones (blank where the capture has none: the drone's are its COLMAP model's)."""
    errors = row.get("cameras")
    if not errors:
        return ""
    return f"{errors['rotation_median_deg']:.2f}, {errors['relative_rotation_median_deg']:.2f}"


START_COLOURS = {"auto": "tab:blue", "feed_forward": "tab:orange", "sfm": "tab:green"}
MODEL_MARKERS = {
    "pixel_aligned_tiny": "o",
    "resplat_tiny": "s",
    "splatweaver_tiny": "^",
    "zipsplat_tiny": "D",
}


def plot(results: dict[str, list[dict[str, Any]]], path: Path) -> None:
    """Held-out PSNR against seconds of fit, a panel per capture."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4), squeeze=False)
    for ax, (capture, rows) in zip(axes[0], results.items()):
        baselines = set()
        for r in rows:
            if "error" in r or not r["curve"]:
                continue
            seconds, psnr = zip(*r["curve"])
            if r.get("cameras_placed_after"):  # only the end is a score (run_one)
                seconds, psnr = (r["fit_s"],), (r["psnr"],)
            cap = r.get("start_opacity")
            label = (
                f"{r['model']} {r['start']}{'' if cap is None else f' cap {cap}'} {r['budget_s']}s"
            )
            style = {  # a colour per start, a marker per model, dotted without the opacity cap
                "color": START_COLOURS.get(r["start"], "black"),
                "marker": MODEL_MARKERS.get(r["model"], "."),
                "linestyle": ":" if cap is None else "-",
            }
            ax.plot(seconds, psnr, label=label, **style)
            baselines.add(round(r["nearest_view_psnr"], 2))
        for baseline in sorted(baselines):  # one per image size (a pose-free model's crop)
            ax.axhline(baseline, linestyle="--", color="grey", label=f"nearest view {baseline} dB")
        ax.set(title=capture, xlabel="seconds of fit", ylabel="held-out PSNR (dB)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def run_all(settings: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Every capture x model x start x budget of ``settings``: the rows, by capture."""
    scratch = Path(tempfile.mkdtemp(prefix="refine_start_inputs_"))
    captures: dict[str, Path] = {}
    references: dict[str, dict[str, Any]] = {}  # the true cameras, where the capture has them
    for name in settings["captures"].split(","):
        if name == "drone":
            captures[name] = Path(settings["drone"])
        elif name == "garden":
            print(f"garden: rendering {settings['garden_views']} orbit photos", file=sys.stderr)
            captures[name] = scratch / "garden"
            references[name] = make_garden(
                Path(settings["garden"]),
                captures[name],
                int(settings["garden_views"]),
                int(settings["garden_size"]),
            )
        else:
            raise SystemExit(f"error: captures={name}: expected drone or garden")
    results: dict[str, list[dict[str, Any]]] = {}
    runs = [
        (c, m, s, int(b))
        for c in captures
        for m in settings["models"].split(",")
        for s in settings["starts"].split(",")
        for b in settings["budgets"].split(",")
    ]
    for number, (capture, model, start, budget) in enumerate(runs, 1):
        out = scratch / "runs" / f"{capture}_{model}_{start}_{budget}"
        print(
            f"[{number}/{len(runs)}] {capture} {model} {start} {budget}s: {out}.log",
            file=sys.stderr,
        )
        reference = references.get(capture)
        row = run_one(captures[capture], model, start, budget, settings, out, reference)
        results.setdefault(capture, []).append(row)
    return results


def read_reports(folders: str) -> dict[str, list[dict[str, Any]]]:
    """The rows of earlier runs' ``refine_start.json`` (comma-separated folders), by capture."""
    results: dict[str, list[dict[str, Any]]] = {}
    for folder in folders.split(","):
        path = Path(folder) / "refine_start.json"
        if not path.is_file():
            raise SystemExit(f"error: report={folder}: no refine_start.json there")
        for capture, rows in json.loads(path.read_text()).items():
            results.setdefault(capture, []).extend(rows)
    return results


def main(argv: list[str]) -> int:
    settings = parse(argv)
    output = Path(settings["output"] or tempfile.mkdtemp(prefix="refine_start_"))
    output.mkdir(parents=True, exist_ok=True)
    report = settings["report"]
    results = read_reports(report) if report else run_all(settings)
    text = "\n\n".join(f"### {c}\n\n{table(rows)}" for c, rows in results.items())
    print(text)
    (output / "refine_start.md").write_text(text + "\n")
    (output / "refine_start.json").write_text(json.dumps(results, indent=1))
    plot(results, output / "refine_start.png")
    print(f"wrote {output}/refine_start.md, .json and .png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
