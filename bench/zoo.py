"""The zoo benchmark: every tiny family trained and evaluated on equal terms, in one command.

Families: ``pixel_aligned`` (posed, the reference point), ``noposplat`` (pose-free pixel-aligned,
the reference for the pose-free ZipSplat), ``zipsplat``, ``resplat``, ``splatweaver``.

1. **Train** each family on the synthetic set with the same wall-clock budget per seed
   (``--minutes``, one CPU thread per run, ``--parallel`` runs side by side): ``train.py
   experiment=synthetic_<family>``. ReSplat's two-stage recipe splits its budget: half for the
   initial model (``synthetic_resplat_init``), half for the recurrent update
   (``synthetic_resplat``). A run that stopped early resumes from its ``last.ckpt``; a finished
   run (``zoo_done.json`` in its folder) is not trained again.
2. **Evaluate** every trained model on the same test index (2 context views, then 4 context views
   zero-shot, from an index widened by ``bench/common.py::widen_index``), each in a fresh process
   so its peak memory is its own: PSNR, SSIM, LPIPS (when the VGG weights are present locally),
   Gaussians per scene, parameters, reconstruction and render milliseconds per scene and the peak
   rise in resident memory (CUDA: peak allocated). Each family is scored across the knob its
   family module declares with sweep values (``models.weights.knobs``: ``Knob.sweep``): ZipSplat's
   compression ratio, ReSplat's iterations, SplatWeaver's inference-time Gaussians per pixel.
   Targets are rendered from their given poses (no test-time pose fit).
3. **Report** ``results.csv``, ``results.md`` (means over seeds, ± the standard deviation when
   there are several), ``results.json`` and ``psnr_vs_gaussians_<V>views.png`` (one curve per
   family, baselines as horizontal lines) into ``--out`` (default ``bench/results/zoo``, kept in
   the repository for the README; logs go to ``logs/zoo/<run name>/``).

Usage::

    python bench/zoo.py                     # full: 30 CPU-minutes per family and seed
    python bench/zoo.py --quick             # pipeline check in < 10 minutes (not comparable)
    python bench/zoo.py --skip-train        # re-evaluate finished runs
    python bench/zoo.py --families pixel_aligned zipsplat --seeds 0 1 --minutes 10

``--quick`` trains 1 minute per family on a 60-scene set (``data/synthetic_quick``) and scores 6
test scenes; its numbers only show that the pipeline runs, and every output says so.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import REPO_ROOT  # noqa: E402

from models.training.cli import latest_last_checkpoint  # noqa: E402

DONE_MARKER = "zoo_done.json"


# --------------------------------------------------------------------------- the families
@dataclass(frozen=True)
class Stage:
    """One ``train.py`` run: an experiment and its share of the family's budget."""

    experiment: str
    task_name: str
    share: float = 1.0
    init_from: str | None = None  # task_name of the stage whose last.ckpt initialises this one


@dataclass(frozen=True)
class Variant:
    """One scored point: a label, the knob's value and the forward kwargs."""

    label: str
    knob: float | None
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Family:
    """A family's training recipe (its stages); what is scored comes from its declared knobs."""

    name: str
    stages: tuple[Stage, ...]

    @property
    def model(self) -> str:
        return f"{self.name}_tiny"  # the registry model its experiments train

    @property
    def knob(self) -> str:
        """The swept knob's name (``-``: none)."""
        swept = _swept_knob(self.model)
        return swept.name if swept is not None else "-"

    @property
    def variants(self) -> tuple[Variant, ...]:
        """One point per value of the family's swept knob (``models.weights.knobs``: ``Knob.sweep``),
        after the model's default when the knob is off by default (SplatWeaver: as routed)."""
        knob = _swept_knob(self.model)
        if knob is None:
            return (Variant("default", None),)
        default = () if knob.default_attr is not None else (Variant("default", None),)
        return default + tuple(
            Variant(f"{knob.name}={value:g}", value, {knob.name: value}) for value in knob.sweep
        )


def _swept_knob(model: str):
    """The first knob ``model``'s family declares with sweep values, or ``None``."""
    from models.weights.knobs import inference_knobs

    return next((knob for knob in inference_knobs(model) if knob.sweep), None)


FAMILIES: dict[str, Family] = {
    "pixel_aligned": Family(
        "pixel_aligned", (Stage("synthetic_pixel_aligned", "synthetic_pixel_aligned"),)
    ),
    "noposplat": Family("noposplat", (Stage("synthetic_noposplat", "synthetic_noposplat"),)),
    "zipsplat": Family("zipsplat", (Stage("synthetic_zipsplat", "synthetic_zipsplat"),)),
    "resplat": Family(
        "resplat",
        (
            Stage("synthetic_resplat_init", "synthetic_resplat_init", 0.5),
            Stage(
                "synthetic_resplat", "synthetic_resplat", 0.5, init_from="synthetic_resplat_init"
            ),
        ),
    ),
    "splatweaver": Family(
        "splatweaver", (Stage("synthetic_splatweaver", "synthetic_splatweaver"),)
    ),
}


# --------------------------------------------------------------------------- settings
@dataclass
class Settings:
    families: list[str]
    seeds: list[int]
    minutes: float
    run_name: str
    out: Path
    parallel: int
    views: list[int]
    max_scenes: int | None
    quick: bool
    data_root: str | None
    skip_train: bool
    threads: int

    @property
    def data_overrides(self) -> list[str]:
        if self.quick:
            return [f"data.root={self.data_root_path}", "data.generator.scenes=60"]
        return [f"data.root={self.data_root_path}"]

    @property
    def data_root_path(self) -> str:
        default = "synthetic_quick" if self.quick else "synthetic_64"
        return str(Path(self.data_root) if self.data_root else REPO_ROOT / "data" / default)

    @property
    def log_dir(self) -> Path:
        """Where the training / evaluation logs go (git-ignored)."""
        return REPO_ROOT / "logs" / "zoo" / self.run_name

    def run_dir(self, stage: Stage, seed: int) -> Path:
        return REPO_ROOT / "logs" / stage.task_name / "runs" / f"{self.run_name}_s{seed}"


def parse_args(argv: list[str] | None = None) -> Settings:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    parser.add_argument("--seeds", type=int, nargs="+", default=[42])
    parser.add_argument("--minutes", type=float, default=None, help="training budget per family")
    parser.add_argument("--run-name", default=None, help="run folder prefix (default: zoo)")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="default: bench/results/zoo (--quick: bench_out/zoo_quick)",
    )
    parser.add_argument("--parallel", type=int, default=2, help="training runs side by side")
    parser.add_argument("--views", type=int, nargs="+", default=[2, 4], help="context views")
    parser.add_argument("--max-scenes", type=int, default=None, help="score at most N scenes")
    parser.add_argument("--quick", action="store_true", help="pipeline check, < 10 minutes")
    parser.add_argument("--data-root", default=None, help="synthetic set folder")
    parser.add_argument("--skip-train", action="store_true", help="evaluate finished runs only")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads per process")
    args = parser.parse_args(argv)
    if args.parallel < 1 or args.threads < 1:
        parser.error("--parallel and --threads must be >= 1")
    if any(v < 2 for v in args.views):
        parser.error("--views must be >= 2 (the index's outer context frames are kept)")
    minutes = args.minutes if args.minutes is not None else (1.0 if args.quick else 30.0)
    if minutes <= 0:
        parser.error("--minutes must be > 0")
    return Settings(
        families=args.families,
        seeds=args.seeds,
        minutes=minutes,
        run_name=args.run_name or ("zoo_quick" if args.quick else "zoo"),
        out=args.out
        or (
            REPO_ROOT / "bench_out" / "zoo_quick"
            if args.quick
            else REPO_ROOT / "bench" / "results" / "zoo"
        ),
        parallel=args.parallel,
        views=sorted(set(args.views)),
        max_scenes=args.max_scenes if args.max_scenes is not None else (6 if args.quick else None),
        quick=args.quick,
        data_root=args.data_root,
        skip_train=args.skip_train,
        threads=args.threads,
    )


def _env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        OMP_NUM_THREADS=str(threads),
        MKL_NUM_THREADS=str(threads),
        OMP_WAIT_POLICY="PASSIVE",  # no busy-waiting threads when runs share the CPU
        WANDB_MODE=env.get("WANDB_MODE", "disabled"),
        PYTHONUNBUFFERED="1",
    )
    return env


def _clock(minutes: float) -> str:
    seconds = max(1, round(minutes * 60))
    return f"00:{seconds // 3600:02d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


# --------------------------------------------------------------------------- training
def train_stage(settings: Settings, stage: Stage, seed: int, log: Path) -> dict[str, Any]:
    """Run (or resume, or skip when finished) one training stage; returns its record."""
    run_dir = settings.run_dir(stage, seed)
    marker = run_dir / DONE_MARKER
    if marker.is_file():
        return json.loads(marker.read_text()) | {"skipped": True}
    if settings.skip_train:
        raise RuntimeError(f"{run_dir}: not trained (no {DONE_MARKER}); run without --skip-train")
    overrides = [
        f"experiment={stage.experiment}",
        f"run_name={run_dir.name}",
        f"seed={seed}",
        f"trainer.max_time={_clock(settings.minutes * stage.share)}",
        "trainer.enable_progress_bar=false",
        "trainer.accelerator=cpu",
        "data.batch_size=4",
        "data.num_workers=0",
        "data.persistent_workers=false",
        "data.generator_workers=1",
        "logger=csv",
        *settings.data_overrides,
    ]
    if settings.quick:
        overrides += [
            "trainer.val_check_interval=10",
            "trainer.limit_val_batches=1",
            "callbacks.model_checkpoint.every_n_train_steps=5",
        ]
    else:
        overrides += [
            "trainer.val_check_interval=100",
            "trainer.limit_val_batches=2",
            "callbacks.model_checkpoint.every_n_train_steps=25",
        ]
    if stage.init_from is not None:
        init = REPO_ROOT / "logs" / stage.init_from / "runs" / run_dir.name / "checkpoints"
        init_checkpoint = latest_last_checkpoint(init)
        if init_checkpoint is None:
            raise RuntimeError(f"{init}: no last checkpoint of {stage.init_from} to start from")
        overrides.append(f"model.net.init_checkpoint={init_checkpoint}")
    if latest_last_checkpoint(run_dir / "checkpoints") is not None:
        overrides.append("ckpt_path=last")  # resume; the timer's elapsed time is restored
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with log.open("a", encoding="utf-8") as handle:
        handle.write(f"\n$ python train.py {' '.join(overrides)}\n")
        handle.flush()
        result = subprocess.run(
            [sys.executable, "train.py", *overrides],
            cwd=REPO_ROOT,
            env=_env(settings.threads),
            stdout=handle,
            stderr=subprocess.STDOUT,
            check=False,
        )
    if result.returncode != 0:
        raise RuntimeError(f"training {stage.experiment} (seed {seed}) failed; see {log}")
    found = latest_last_checkpoint(run_dir / "checkpoints")
    if found is None:
        raise RuntimeError(f"training {stage.experiment} wrote no last checkpoint; see {log}")
    checkpoint = Path(found)
    record = {
        "experiment": stage.experiment,
        "seed": seed,
        "minutes_budget": settings.minutes * stage.share,
        "wall_seconds_this_call": round(time.perf_counter() - start, 1),
        "steps": _checkpoint_steps(checkpoint),
        "checkpoint": str(checkpoint.relative_to(REPO_ROOT)),
        "quick": settings.quick,
    }
    marker.write_text(json.dumps(record, indent=1), encoding="utf-8")
    return record


def _checkpoint_steps(path: Path) -> int:
    import torch

    checkpoint = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    return int(checkpoint.get("global_step", 0))


def prepare_data(settings: Settings) -> None:
    """Generate the synthetic set once, before parallel runs could race to write it."""
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    with initialize_config_dir(config_dir=str(REPO_ROOT / "configs"), version_base="1.3"):
        cfg = compose(config_name="train.yaml", overrides=settings.data_overrides)
    cfg.data.generator_workers = settings.parallel
    instantiate(cfg.data).prepare_data()


def train_all(settings: Settings) -> dict[tuple[str, int], list[dict[str, Any]]]:
    """Train every (family, seed) chain, ``--parallel`` at a time; stages of a chain in order."""
    from tqdm import tqdm

    if not settings.skip_train:
        prepare_data(settings)

    chains = [(name, seed) for name in settings.families for seed in settings.seeds]
    records: dict[tuple[str, int], list[dict[str, Any]]] = {}
    bar = tqdm(total=len(chains), desc="training", unit="run")

    def run_chain(name: str, seed: int) -> None:
        chain = []
        for stage in FAMILIES[name].stages:
            log = settings.log_dir / f"train_{stage.task_name}_s{seed}.log"
            record = train_stage(settings, stage, seed, log)
            chain.append(record)
            state = "already trained" if record.get("skipped") else "trained"
            tqdm.write(f"{stage.experiment} seed {seed}: {state}, {record['steps']} steps")
        records[(name, seed)] = chain
        bar.update()

    with ThreadPoolExecutor(max_workers=settings.parallel) as pool:
        for future in [pool.submit(run_chain, name, seed) for name, seed in chains]:
            future.result()
    bar.close()
    return records


# --------------------------------------------------------------------------- evaluation
def evaluate_model(request: dict[str, Any]) -> dict[str, Any]:
    """Score one checkpoint (in this process) at every view count and variant."""
    import tempfile

    import torch
    from common import data_config, load_weights, score_targets, test_loader, to_device, widen_index

    from models.pipeline.metrics import build_lpips

    rss_before = _rss_mb()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    family = FAMILIES[request["family"]]
    model = load_weights(request["checkpoint"], device)
    parameters = sum(p.numel() for p in model.parameters())
    lpips = build_lpips(required=False)
    if lpips is not None:
        lpips = lpips.to(device)
    data_cfg = data_config("synthetic", request["data_root"])
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for views in request["views"]:
            index = Path(tmp) / f"index_{views}.json"
            kept, _ = widen_index(str(data_cfg.eval_index), views, index)
            loader = test_loader(data_cfg, views, index)
            sums: dict[str, dict[str, float]] = {}
            scenes = 0
            for number, batch in enumerate(loader):
                if request["max_scenes"] is not None and number >= request["max_scenes"]:
                    break
                batch = to_device(batch, device)
                cache: dict[str, tuple[Any, float]] = {}
                for variant in family.variants:
                    key = json.dumps(variant.kwargs, sort_keys=True)
                    with torch.no_grad():
                        if key not in cache:
                            _sync(device)
                            start = time.perf_counter()
                            pred = model(batch["context"], **variant.kwargs)
                            _sync(device)
                            cache[key] = (pred, time.perf_counter() - start)
                        pred, seconds = cache[key]
                        gaussians = pred.gaussians
                        _sync(device)
                        start = time.perf_counter()
                        scores = score_targets(gaussians, batch["target"], lpips=lpips)
                        _sync(device)
                        render_seconds = time.perf_counter() - start  # with the metrics
                        values = {
                            "psnr": float(scores["psnr"].mean()),
                            "ssim": float(scores["ssim"].mean()),
                            "gaussians": float(scores["gaussians"].mean()),
                            "recon_ms": 1000 * seconds,
                            "render_ms": 1000 * render_seconds,
                        }
                        if "lpips" in scores:
                            values["lpips"] = float(scores["lpips"].mean())
                    total = sums.setdefault(variant.label, {})
                    for name, value in values.items():
                        total[name] = total.get(name, 0.0) + value
                scenes += 1
            if scenes == 0:
                raise RuntimeError(f"no test scenes at {views} views")
            for variant in family.variants:
                mean = {k: v / scenes for k, v in sums[variant.label].items()}
                rows.append(
                    {
                        "family": family.name,
                        "model": model.registry_name,
                        "variant": variant.label,
                        "knob": variant.knob,
                        "views": views,
                        "seed": request["seed"],
                        "scenes": scenes,
                        "parameters": parameters,
                        **mean,
                    }
                )
    peak = (
        torch.cuda.max_memory_allocated() / 2**20
        if device.type == "cuda"
        else _peak_rss_mb() - rss_before
    )
    for row in rows:
        row["peak_mb"] = peak
    return {"rows": rows}


def evaluate_baselines(request: dict[str, Any]) -> dict[str, Any]:
    """Mean colour and nearest context view on the same targets, per view count."""
    import tempfile

    import torch
    from common import data_config, test_loader, widen_index

    from models.pipeline.metrics import (
        mean_color_baseline,
        nearest_view_baseline,
        psnr_per_image,
        ssim_per_image,
    )

    data_cfg = data_config("synthetic", request["data_root"])
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for views in request["views"]:
            index = Path(tmp) / f"index_{views}.json"
            widen_index(str(data_cfg.eval_index), views, index)
            totals = {"mean colour": [0.0, 0.0], "nearest view": [0.0, 0.0]}
            scenes = 0
            for number, batch in enumerate(test_loader(data_cfg, views, index)):
                if request["max_scenes"] is not None and number >= request["max_scenes"]:
                    break
                target = batch["target"]["image"]
                with torch.no_grad():
                    guesses = {
                        "mean colour": mean_color_baseline(batch["context"], target),
                        "nearest view": nearest_view_baseline(batch["context"], batch["target"]),
                    }
                for name, image in guesses.items():
                    totals[name][0] += float(psnr_per_image(image, target).mean())
                    totals[name][1] += float(ssim_per_image(image, target).mean())
                scenes += 1
            for name, (psnr, ssim) in totals.items():
                rows.append(
                    {
                        "family": "baseline",
                        "model": name,
                        "variant": "-",
                        "views": views,
                        "scenes": scenes,
                        "psnr": psnr / scenes,
                        "ssim": ssim / scenes,
                    }
                )
    return {"rows": rows}


def _sync(device) -> None:
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize()


def _rss_mb() -> float:
    with open("/proc/self/statm", encoding="utf-8") as handle:
        pages = int(handle.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: kilobytes


def evaluate_all(settings: Settings, trained: dict[tuple[str, int], list[dict]]) -> list[dict]:
    """Run every evaluation in its own process (``--parallel`` at a time)."""
    from tqdm import tqdm

    common = {
        "views": settings.views,
        "max_scenes": settings.max_scenes,
        "data_root": settings.data_root_path,
    }
    requests = [{"kind": "baselines", "seed": None, **common}]
    for (name, seed), chain in sorted(trained.items()):
        requests.append(
            {"kind": "model", "family": name, "seed": seed, "checkpoint": chain[-1]["checkpoint"]}
            | common
        )
    rows: list[dict] = []
    bar = tqdm(total=len(requests), desc="evaluating", unit="model")

    def run(request: dict) -> list[dict]:
        label = request.get("family", "baselines")
        log = settings.log_dir / f"eval_{label}_s{request['seed']}.log"
        result = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--evaluate-one", json.dumps(request)],
            cwd=REPO_ROOT,
            env=_env(settings.threads),
            capture_output=True,
            text=True,
            check=False,
        )
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(result.stdout + result.stderr, encoding="utf-8")
        if result.returncode != 0:
            raise RuntimeError(f"evaluating {label} failed; see {log}")
        payload = json.loads(result.stdout.strip().splitlines()[-1])
        bar.update()
        return payload["rows"]

    with ThreadPoolExecutor(max_workers=settings.parallel) as pool:
        for future in [pool.submit(run, request) for request in requests]:
            rows.extend(future.result())
    bar.close()
    return rows


# --------------------------------------------------------------------------- reporting
NUMERIC = ("psnr", "ssim", "lpips", "gaussians", "parameters", "recon_ms", "render_ms", "peak_mb")


def aggregate(rows: list[dict]) -> list[dict]:
    """Means (and standard deviations) over seeds of rows with the same model/variant/views."""
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault((row["family"], row["model"], row["variant"], row["views"]), []).append(
            row
        )
    merged = []
    for (family, model, variant, views), members in groups.items():
        out: dict[str, Any] = {
            "family": family,
            "model": model,
            "variant": variant,
            "views": views,
            "knob": members[0].get("knob"),
            "seeds": len(members),
            "scenes": members[0].get("scenes"),
        }
        for key in NUMERIC:
            values = [m[key] for m in members if m.get(key) is not None]
            if values:
                out[key] = statistics.fmean(values)
                out[f"{key}_std"] = statistics.stdev(values) if len(values) > 1 else None
        merged.append(out)
    order = {name: i for i, name in enumerate(["baseline", *FAMILIES])}
    merged.sort(key=lambda r: (r["views"], order.get(r["family"], 99)))
    return merged


def markdown(rows: list[dict], header: str) -> str:
    has_lpips = any("lpips" in r for r in rows)
    columns = ["views", "model", "variant", "PSNR", "SSIM"]
    columns += ["LPIPS"] if has_lpips else []
    columns += ["Gaussians", "params", "recon ms", "render ms", "peak MB"]
    lines = [header, "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]

    def number(row: dict, key: str, fmt: str) -> str:
        if row.get(key) is None:
            return "–"
        text = format(row[key], fmt)
        std = row.get(f"{key}_std")
        return f"{text} ± {format(std, fmt)}" if std is not None else text

    for r in rows:
        cells = [str(r["views"]), f"`{r['model']}`" if r["family"] != "baseline" else r["model"]]
        cells += [r["variant"], number(r, "psnr", ".2f"), number(r, "ssim", ".3f")]
        cells += [number(r, "lpips", ".3f")] if has_lpips else []
        cells += [
            number(r, "gaussians", ",.0f"),
            number(r, "parameters", ",.0f"),
            number(r, "recon_ms", ".0f"),
            number(r, "render_ms", ".0f"),
            number(r, "peak_mb", ".0f"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path, title: str, views: int) -> None:
    """PSNR vs Gaussians per scene: a curve per family, baselines as horizontal lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8.4, 4.6))
    colours = {"pixel_aligned": "#000000", "noposplat": "#7f7f7f", "zipsplat": "#1f77b4"}
    colours |= {"resplat": "#2ca02c", "splatweaver": "#d62728"}
    for name in FAMILIES:
        points = [r for r in rows if r["family"] == name and r["views"] == views]
        if not points:
            continue
        points.sort(key=lambda r: r["gaussians"])
        xs = [r["gaussians"] for r in points]
        ys = [r["psnr"] for r in points]
        style = ("*" if name == "pixel_aligned" else "D") if len(points) == 1 else "o-"
        size = (14 if name == "pixel_aligned" else 8) if len(points) == 1 else 5
        ax.plot(xs, ys, style, color=colours[name], markersize=size, label=points[0]["model"])
        if len(points) > 1:
            same_x: dict[float, int] = {}
            for r in sorted(points, key=lambda r: -r["psnr"]):
                # points at one count (ReSplat's iterations) get stacked labels, not overlapping
                slot = same_x.get(round(r["gaussians"]), 0)
                same_x[round(r["gaussians"])] = slot + 1
                ax.annotate(
                    r["variant"],
                    (r["gaussians"], r["psnr"]),
                    fontsize=7,
                    xytext=(4 + 28 * slot, 3),
                    textcoords="offset points",
                )
    for r in rows:
        if r["family"] == "baseline" and r["views"] == views:
            style = ":" if r["model"] == "mean colour" else "--"
            ax.axhline(
                r["psnr"],
                color="grey",
                linestyle=style,
                linewidth=1,
                label=f"baseline: {r['model']}",
            )
    ax.set_xscale("log")
    ax.set_xlabel("Gaussians per scene (log)")
    ax.set_ylabel("PSNR (dB)")
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def report(settings: Settings, rows: list[dict], trained: dict, seconds: float) -> str:
    merged = aggregate(rows)
    today = dt.date.today().isoformat()
    command = "python bench/zoo.py " + " ".join(sys.argv[1:])
    mode = (
        "QUICK MODE: pipeline check only (1-minute training, few scenes); not comparable"
        if settings.quick
        else f"{settings.minutes:g} CPU-minutes of training per family and seed"
    )
    header = (
        f"Zoo benchmark ({today}, `{command.strip()}`): {mode}; seeds {settings.seeds}; "
        f"one CPU thread per process; targets rendered from their given poses."
    )
    settings.out.mkdir(parents=True, exist_ok=True)
    with (settings.out / "results.csv").open("w", newline="", encoding="utf-8") as handle:
        keys = sorted({k for r in rows for k in r}, key=lambda k: (k not in ("family", "model"), k))
        writer = csv.DictWriter(handle, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)
    training = [
        f"- `{r['experiment']}` seed {r['seed']}: {r['steps']} steps in "
        f"{r['minutes_budget']:g} min budget"
        for chain in trained.values()
        for r in chain
    ]
    text = markdown(merged, header) + "\n\nTraining:\n" + "\n".join(training) + "\n"
    (settings.out / "results.md").write_text(text, encoding="utf-8")
    payload = {
        "date": today,
        "command": command,
        "quick": settings.quick,
        "minutes": settings.minutes,
        "seeds": settings.seeds,
        "training": {f"{k[0]}_s{k[1]}": v for k, v in trained.items()},
        "rows": rows,
        "summary": merged,
        "seconds": seconds,
    }
    (settings.out / "results.json").write_text(json.dumps(payload, indent=1), encoding="utf-8")
    for views in settings.views:
        title = f"{'QUICK (not comparable): ' if settings.quick else ''}synthetic test set, "
        title += f"{views} context views" + (" (zero-shot)" if views != 2 else "")
        plot(merged, settings.out / f"psnr_vs_gaussians_{views}views.png", title, views)
    return text


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--evaluate-one"]:
        request = json.loads(argv[1])
        run = evaluate_baselines if request["kind"] == "baselines" else evaluate_model
        print(json.dumps(run(request)))
        return 0
    settings = parse_args(argv)
    start = time.perf_counter()
    if settings.quick:
        print("QUICK MODE: 1-minute training on a 60-scene set; the numbers are not comparable")
    trained = train_all(settings)
    rows = evaluate_all(settings, trained)
    text = report(settings, rows, trained, time.perf_counter() - start)
    print(text)
    print(f"wrote {settings.out} in {time.perf_counter() - start:.0f} s")
    if any(math.isnan(r.get("psnr", 0.0)) for r in rows):
        print("warning: some PSNR values are NaN", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
