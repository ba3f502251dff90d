"""The zoo on your own capture: every listed model on the same windows and held-out photos.

    python -m bench.capture input=PHOTOS holdout=8 models=pixel_aligned_tiny,zipsplat_tiny \
        [output=DIR] [image_size=N] [device=auto] [backend=auto] [views=all]

Loads the capture once per input size (``models.pipeline.capture.inputs.load_inputs``: cameras.json, a
COLMAP model, or structure-from-motion), plans the windows and held-out photos once
(``models.pipeline.capture.whole.plan_capture`` with the first model; a model with another view count gets
its own windows over the same photos, said in the table), then per model reconstructs every
window, fuses them and scores the held-out photos (``reconstruct_capture``). Writes
``DIR/capture.json``, ``DIR/capture.md`` (the table) and ``DIR/capture.png`` (held-out PSNR
against the number of Gaussians, seconds beside each point, the nearest-view baseline as a
line). A model that cannot run here (weights not on disk, bad input for it) is a table row
saying why.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import torch  # noqa: E402

from datamodules.errors import InputError  # noqa: E402

DEFAULTS = {
    "input": None,
    "models": "pixel_aligned_tiny,zipsplat_tiny",
    "holdout": "8",
    "views": "all",
    "output": None,
    "image_size": None,
    "device": "auto",
    "backend": "auto",
}


def parse(argv: list[str]) -> dict[str, Any]:
    """``key=value`` arguments over :data:`DEFAULTS` (an unknown key is an error)."""
    settings = dict(DEFAULTS)
    for arg in argv:
        key, sep, value = arg.partition("=")
        if not sep or key not in settings:
            raise SystemExit(f"error: {arg}: expected key=value with key in {', '.join(settings)}")
        settings[key] = value
    if not settings["input"]:
        raise SystemExit("error: input=PHOTOS is required")
    return settings


def run_model(name: str, settings: dict, cache: dict, first_plan: list) -> dict[str, Any]:
    """One model on the capture; a row of the table."""
    from models.pipeline import inference
    from models.pipeline.capture.inputs import load_inputs
    from models.pipeline.capture.whole import plan_capture, reconstruct_capture, window_size

    device = inference.choose_device(settings["device"])
    start = time.perf_counter()
    loaded = inference.load_for_inference(name, None, device)
    model = loaded.model
    size = inference.input_size(model, settings["image_size"])
    if size not in cache:
        cache[size] = load_inputs(settings["input"], size, model, name=name)[0]
    images = cache[size]
    note = ""
    if first_plan and first_plan[0].size == window_size(model, name):
        plan = dataclasses.replace(first_plan[0], images=images, name=name)
    else:
        plan = plan_capture(
            images, model, views=settings["views"], holdout=settings["holdout"], name=name
        )
        if first_plan:
            note = f"own windows ({plan.size} views each)"
        else:
            first_plan.append(plan)
    begin = time.perf_counter()
    capture = reconstruct_capture(model, plan, backend=settings["backend"])
    seconds = time.perf_counter() - begin
    mean = capture.summary.get("holdout", {}).get("mean", {})
    return {
        "model": name,
        "family": getattr(model, "family", None),
        "pose_free": bool(getattr(model, "pose_free", False)),
        "windows": len(plan.windows),
        "gaussians": capture.reconstruction.count,
        "merged": capture.counts["merged"],
        "seconds": round(seconds, 2),
        "seconds_with_loading": round(time.perf_counter() - start, 2),
        "psnr": mean.get("psnr"),
        "ssim": mean.get("ssim"),
        "lpips": mean.get("lpips"),
        "nearest_view_psnr": mean.get("nearest_view_psnr"),
        "image_size": list(images.images.shape[-2:]),
        "held_out": list(capture.summary.get("holdout", {}).get("views", [])),
        "note": note,
    }


def table(rows: list[dict]) -> str:
    """The markdown table of ``rows``."""
    lines = [
        "| model | windows | Gaussians | seconds | held-out PSNR | SSIM | nearest-view PSNR | note |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        if r.get("error"):
            lines.append(f"| {r['model']} | | | | | | | not run: {r['error']} |")
            continue
        lines.append(
            f"| {r['model']} | {r['windows']} | {r['gaussians']:,} | {r['seconds']:.1f} | "
            f"{r['psnr']:.2f} | {r['ssim']:.3f} | {r['nearest_view_psnr']:.2f} | {r['note']} |"
        )
    return "\n".join(lines)


def plot(rows: list[dict], path: Path, title: str) -> None:
    """Held-out PSNR vs Gaussians (log), seconds written beside each point, nearest-view line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [r for r in rows if not r.get("error") and r["psnr"] is not None]
    fig, ax = plt.subplots(figsize=(7.0, 4.2))
    for r in done:
        ax.scatter(r["gaussians"], r["psnr"], s=40, marker="D" if r["pose_free"] else "o")
        ax.annotate(
            f"{r['model']} ({r['seconds']:.0f} s)",
            (r["gaussians"], r["psnr"]),
            textcoords="offset points",
            xytext=(6, 4),
            fontsize=8,
        )
    baselines = sorted({r["nearest_view_psnr"] for r in done if r["nearest_view_psnr"]})
    for value in baselines:
        ax.axhline(value, color="grey", linestyle="--", linewidth=1)
    if baselines:
        ax.text(ax.get_xlim()[0], baselines[0], " nearest-view baseline", va="bottom", fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("Gaussians in the fused scene")
    ax.set_ylabel("held-out PSNR (dB)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str]) -> int:
    settings = parse(argv)
    source = Path(settings["input"]).expanduser()
    output = Path(settings["output"] or f"capture_bench_{source.name}").expanduser()
    rows, cache, first_plan = [], {}, []
    for name in [m.strip() for m in settings["models"].split(",") if m.strip()]:
        try:
            rows.append(run_model(name, settings, cache, first_plan))
        except (RuntimeError, ValueError) as error:  # InputError is a ValueError
            if isinstance(error, InputError) and not first_plan and "holdout" in str(error):
                print(f"error: {' '.join(str(error).split())}", file=sys.stderr)
                return 2
            rows.append({"model": name, "error": " ".join(str(error).split())[:160]})
        row = rows[-1]
        shown = row.get("error") or f"held-out PSNR {row['psnr']:.2f} dB in {row['seconds']:.1f} s"
        print(f"{name}: {shown}", flush=True)
    output.mkdir(parents=True, exist_ok=True)
    held = next((r["held_out"] for r in rows if r.get("held_out")), [])
    title = f"{source.name}: {len(held)} held-out photos, {len(rows)} models"
    text = table(rows)
    load = Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else []
    record = {"input": str(source), "settings": settings, "rows": rows, "load": load}
    record["device"] = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    (output / "capture.json").write_text(json.dumps(record, indent=2), encoding="utf-8")
    (output / "capture.md").write_text(text + "\n", encoding="utf-8")
    plot(rows, output / "capture.png", title)
    print(text)
    print(f"wrote {output}/capture.json, capture.md, capture.png (load {' '.join(load)})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
