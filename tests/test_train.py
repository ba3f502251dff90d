"""The training stack: Hydra configs compose, train.py/eval.py run on CPU, resume, sweeps."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from config_fixtures import compose_config
from omegaconf import DictConfig

REPO = Path(__file__).resolve().parents[1]
CONFIGS = str(REPO / "configs")
# configs/model/base.yaml is the LightningModule settings the family configs extend, not a model
MODEL_CONFIGS = sorted(
    p.stem for p in (REPO / "configs" / "model").glob("*.yaml") if p.stem != "base"
)
DATA_CONFIGS = sorted(p.stem for p in (REPO / "configs" / "data").glob("*.yaml"))
EXPERIMENTS = sorted(p.stem for p in (REPO / "configs" / "experiment").glob("*.yaml"))

# Small and fast: 64x64 synthetic scenes, few steps, no workers.
FAST = [
    "data.generator.scenes=12",
    "data.generator.views=24",
    "data.batch_size=2",
    "data.val_batch_size=2",
    "data.num_workers=0",
    "data.persistent_workers=false",
    "data.val_scenes=2",
    "data.num_target_views=2",
    "trainer.accelerator=cpu",
    "trainer.enable_progress_bar=false",
    "logger=csv",
    "callbacks.model_summary=null",
]


def _run(
    script: str, *args: str, timeout: int = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """``python SCRIPT ARGS`` from the repository root, its output captured as text."""
    command = [sys.executable, script, *args]
    return subprocess.run(
        command, cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env
    )


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    """A tiny synthetic dataset generated once for the module (12 scenes of 24 views at 64²)."""
    root = tmp_path_factory.mktemp("synthetic")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "datamodules.synthetic",
            "--out",
            str(root),
            "--scenes",
            "12",
            "--resolution",
            "64",
            "--views",
            "24",
            "--seed",
            "0",
            "--workers",
            "1",
        ],
        check=True,
        cwd=REPO,
        capture_output=True,
    )
    return root


@pytest.mark.parametrize("model", MODEL_CONFIGS)
@pytest.mark.parametrize("data", DATA_CONFIGS)
def test_train_config_composes(model, data, tmp_path):
    cfg = compose_config("train.yaml", [f"model={model}", f"data={data}"], tmp_path)
    assert cfg.model._target_ == "models.training.module.SplatLitModule"
    assert cfg.model.recipe._target_.startswith("models.training.recipes.")
    assert cfg.model.net._target_ == "models.create_model"
    assert cfg.data._target_.endswith("SplatDataModule")


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_experiments_compose(experiment, tmp_path):
    cfg = compose_config("train.yaml", [f"experiment={experiment}"], tmp_path)
    from models import is_model

    assert is_model(cfg.model.net.name)
    assert cfg.task_name == experiment


def test_eval_config_requires_ckpt_path(tmp_path):
    from omegaconf.errors import MissingMandatoryValue

    cfg = compose_config("eval.yaml", [], tmp_path)
    with pytest.raises(MissingMandatoryValue):
        _ = cfg.ckpt_path


def test_fast_dev_run_every_family(data_root, tmp_path):
    """One train step + one val step for each model config, through train.train()."""
    import train

    for model in MODEL_CONFIGS:
        cfg = compose_config(
            "train.yaml",
            [f"model={model}", f"data.root={data_root}", "+trainer.fast_dev_run=true", *FAST],
            tmp_path / model,
        )
        metrics = train.train(cfg)
        assert "train/loss" in metrics, model
        assert torch.isfinite(torch.tensor(metrics["train/loss"])), model


def test_train_resume_and_eval(data_root, tmp_path):
    """Train 4 steps, resume to 6 (step count continues), then eval.py on the checkpoint."""
    import train

    common = [
        f"data.root={data_root}",
        "model=pixel_aligned",
        "trainer.val_check_interval=2",
        "trainer.limit_val_batches=1",
        "callbacks.model_checkpoint.every_n_train_steps=2",
        *FAST,
    ]
    cfg = compose_config("train.yaml", [*common, "trainer.max_steps=4"], tmp_path)
    train.train(cfg)
    last = tmp_path / "out" / "checkpoints" / "last.ckpt"
    assert last.is_file()
    state = torch.load(last, map_location="cpu", weights_only=True)
    assert state["global_step"] == 4
    assert state["hyper_parameters"]["model_name"] == "pixel_aligned_tiny"

    cfg = compose_config("train.yaml", [*common, "trainer.max_steps=6", "ckpt_path=last"], tmp_path)
    train.train(cfg)
    state = torch.load(last, map_location="cpu", weights_only=True)
    assert state["global_step"] == 6

    out = tmp_path / "eval"
    result = _run(
        "eval.py",
        "model=pixel_aligned",
        f"ckpt_path={last}",
        f"data.root={data_root}",
        "data.num_workers=0",
        "data.persistent_workers=false",
        "trainer.accelerator=cpu",
        "trainer.enable_progress_bar=false",
        f"hydra.run.dir={out}",
        f"paths.log_dir={tmp_path / 'logs'}",
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["scenes"] >= 1
    for key in ("psnr", "ssim", "baseline_nearest_view_psnr", "baseline_mean_color_psnr"):
        assert key in metrics["metrics"], key
    assert (out / "scenes.csv").read_text().count("\n") == metrics["scenes"] + 1
    assert any((out / "renders").glob("*.png"))
    assert "| psnr" in result.stdout


def test_eval_refuses_checkpoint_of_another_model(data_root, tmp_path):
    import train

    cfg = compose_config(
        "train.yaml",
        [f"data.root={data_root}", "model=pixel_aligned", "+trainer.fast_dev_run=true", *FAST],
        tmp_path,
    )
    train.train(cfg)
    # fast_dev_run saves no checkpoint: save one by hand through Lightning's format.
    from models import create_model
    from models.training.module import SplatLitModule

    module = SplatLitModule(create_model("pixel_aligned_tiny"))
    ckpt = tmp_path / "pa.ckpt"
    torch.save({"state_dict": module.state_dict(), "hyper_parameters": dict(module.hparams)}, ckpt)
    result = _run(
        "eval.py",
        "model=zipsplat",
        f"ckpt_path={ckpt}",
        f"data.root={data_root}",
        "data.num_workers=0",
        f"hydra.run.dir={tmp_path / 'e'}",
    )
    assert result.returncode == 2
    assert "pixel_aligned_tiny" in result.stderr and "zipsplat_tiny" in result.stderr
    assert "Traceback" not in result.stderr


def test_eval_builds_the_network_the_weights_record(data_root, tmp_path):
    """The shipped SplatWeaver weights are posed; configs/model/splatweaver.yaml says
    pose_free=true. eval.py builds what the weights record (no "pose_free=False vs True"
    refusal) and never builds the config's network."""
    import eval as eval_script

    cfg = compose_config(
        "eval.yaml",
        [
            "model=splatweaver",
            f"ckpt_path={REPO / 'checkpoints' / 'splatweaver_tiny'}",
            f"data.root={data_root}",
            "num_renders=0",
            *[o for o in FAST if not o.startswith("callbacks")],
        ],
        tmp_path,
    )
    assert cfg.model.net.pose_free is True
    metrics = eval_script.evaluate(cfg)
    assert math.isfinite(metrics["psnr"]) and metrics["psnr"] > 10
    record = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert record["model"] == "splatweaver_tiny"


def test_unknown_model_lists_valid_names(tmp_path):
    result = _run(
        "train.py",
        "model.net.name=not_a_model",
        f"hydra.run.dir={tmp_path}",
        "data.generate_if_missing=false",
        f"data.root={tmp_path / 'none'}",
    )
    assert result.returncode == 2
    assert "not_a_model" in result.stderr and "pixel_aligned_tiny" in result.stderr
    assert "Traceback" not in result.stderr


def test_eval_without_ckpt_path_is_one_line(tmp_path):
    result = _run("eval.py", f"hydra.run.dir={tmp_path}")
    assert result.returncode == 2
    assert (
        result.stderr.strip()
        == "error: ckpt_path: required; pass ckpt_path=... on the command line"
    )


def test_train_refuses_a_checkpoint_that_would_run_code(tmp_path):
    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {tmp_path / 'pwned'}",))

    ckpt = tmp_path / "evil.ckpt"
    torch.save({"state_dict": {"net.x": torch.zeros(1)}, "payload": Payload()}, ckpt)
    result = _run(
        "train.py",
        "model=pixel_aligned",
        f"ckpt_path={ckpt}",
        f"hydra.run.dir={tmp_path / 'run'}",
        "trainer.accelerator=cpu",
    )
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith(f"error: {ckpt}: cannot load checkpoint with weights_only=True")
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "pwned").exists()


def _compose_run(overrides: list[str], tmp: Path, run: str) -> DictConfig:
    """A train config whose run folder is ``logs/train/runs/<run>`` (as Hydra would make it)."""
    return compose_config("train.yaml", overrides, tmp, tmp / "logs" / "train" / "runs" / run)


def test_resume_continues_the_run_with_time_from_now(data_root, tmp_path):
    """ckpt_path=last continues in the run it resumes; a new max_time counts from now."""
    import train

    common = [
        f"data.root={data_root}",
        "model=pixel_aligned",
        "trainer.limit_val_batches=0",
        "trainer.log_every_n_steps=1",
        "callbacks.model_checkpoint.every_n_train_steps=2",
        *FAST,
    ]
    cfg = _compose_run(
        [*common, "trainer.max_steps=4", "trainer.max_time=00:01:00:00"], tmp_path, "a"
    )
    train.train(cfg)
    first = Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt"
    state = torch.load(first, map_location="cpu", weights_only=True)
    timers = [k for k in state["callbacks"] if k.startswith("Timer")]
    assert timers, "the timer's state is saved with the checkpoint"
    for key in timers:  # pretend the first run already spent two hours
        state["callbacks"][key]["time_elapsed"] = {
            "train": 7200.0,
            "sanity_check": 0.0,
            "validate": 0.0,
            "test": 0.0,
            "predict": 0.0,
        }
    torch.save(state, first)

    cfg = _compose_run(
        [*common, "trainer.max_steps=6", "trainer.max_time=00:00:10:00", "ckpt_path=last"],
        tmp_path,
        "b",
    )
    train.train(cfg)
    state = torch.load(first, map_location="cpu", weights_only=True)
    assert state["global_step"] == 6  # ten more minutes from now, not "time limit reached"
    assert cfg.paths.output_dir == str(first.parent.parent)  # continued in run "a"
    assert not (tmp_path / "logs" / "train" / "runs" / "b" / "checkpoints").exists()
    # The CSV metrics of both parts are in the run's one metrics.csv (Lightning deletes it).
    import csv

    with open(first.parent.parent / "csv" / "metrics.csv", newline="") as handle:
        steps = {int(row["step"]) for row in csv.DictReader(handle)}
    assert min(steps) < 3 and max(steps) >= 4, steps


def _training_batch(data_root: Path, batch_size: int) -> dict:
    """The first training batch of the module's synthetic data (64x64, 2 context + 2 targets)."""
    from datamodules.training.datamodule import SplatDataModule

    dm = SplatDataModule(
        root=str(data_root),
        image_size=[64, 64],
        num_context_views=2,
        num_target_views=2,
        batch_size=batch_size,
        num_workers=0,
        min_context_gap=8,
        max_context_gap=12,
        generate_if_missing=False,
        near=0.25,
        far=50.0,
    )
    dm.setup("fit")
    return next(iter(dm.train_dataloader()))


def test_few_steps_lower_the_loss(data_root):
    """Overfit one synthetic batch: the loss must fall."""
    from models import create_model
    from models.training.module import SplatLitModule

    batch = _training_batch(data_root, batch_size=2)
    module = SplatLitModule(create_model("pixel_aligned_tiny"), lr=2e-3, warmup_steps=0)
    optimizer = torch.optim.Adam(module.parameters(), lr=2e-3)
    losses = []
    for step in range(12):
        loss, _ = module.compute_loss(batch, step)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert min(losses[-3:]) < 0.7 * losses[0], losses


def test_nan_loss_step_is_skipped(data_root):
    from models import create_model
    from models.training.module import SplatLitModule

    batch = _training_batch(data_root, batch_size=1)
    batch["target"]["image"] = torch.full_like(batch["target"]["image"], float("nan"))
    module = SplatLitModule(create_model("pixel_aligned_tiny"))
    with pytest.warns(UserWarning, match="non-finite loss"):
        assert module.training_step(batch, 0) is None
    assert module.skipped_steps == 1


def _subprocess_run(data_root: Path) -> list[str]:
    """Settings of the multi-process runs: one validation batch, one scene a batch, in-process
    data loading, no progress bar."""
    return [
        "trainer.limit_val_batches=1",
        f"data.root={data_root}",
        "data.num_workers=0",
        "data.persistent_workers=false",
        "data.batch_size=1",
        "data.num_target_views=2",
        "trainer.enable_progress_bar=false",
    ]


@pytest.mark.slow
def test_ddp_two_cpu_processes(data_root, tmp_path):
    result = _run(
        "train.py",
        "trainer=ddp",
        "trainer.accelerator=cpu",
        "trainer.devices=2",
        "trainer.max_steps=3",
        "trainer.val_check_interval=3",
        *_subprocess_run(data_root),
        f"hydra.run.dir={tmp_path / 'ddp'}",
        "callbacks.model_summary=null",
        timeout=900,
        env={**os.environ, "PROJECT_ROOT": str(REPO)},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    ckpt = torch.load(
        tmp_path / "ddp" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True
    )
    assert ckpt["global_step"] == 3


@pytest.mark.slow
def test_optuna_sweep_two_trials(data_root, tmp_path):
    result = _run(
        "train.py",
        "-m",
        "hparams_search=optuna",
        "hydra.sweeper.n_trials=2",
        "hydra.sweeper.sampler.n_startup_trials=2",
        "trainer.max_steps=2",
        "trainer.val_check_interval=2",
        *_subprocess_run(data_root),
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        "callbacks.model_summary=null",
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    results = (tmp_path / "sweep" / "optimization_results.yaml").read_text()
    assert "best_value" in results


def test_ckpt_path_last_takes_the_newest_last_checkpoint(tmp_path):
    import time

    from omegaconf import OmegaConf

    from models.training.cli import latest_last_checkpoint, resolve_ckpt_path

    run = tmp_path / "logs" / "task" / "runs" / "a"
    (run / "checkpoints").mkdir(parents=True)
    cfg = OmegaConf.create(
        {"paths": {"output_dir": str(run), "log_dir": str(tmp_path / "logs")}, "task_name": "task"}
    )
    assert latest_last_checkpoint(run / "checkpoints") is None
    assert resolve_ckpt_path("last", cfg) is None  # nothing yet: a fresh start
    (run / "checkpoints" / "last.ckpt").write_bytes(b"old")
    time.sleep(0.02)
    newer = run / "checkpoints" / "last-v1.ckpt"  # Lightning's name after the folder moved
    newer.write_bytes(b"new")
    assert resolve_ckpt_path("last", cfg) == str(newer)
    other = tmp_path / "logs" / "task" / "runs" / "b"
    cfg.paths.output_dir = str(other)  # a new run of the same task resumes the newest one
    assert resolve_ckpt_path("last", cfg) == str(newer)
    with pytest.raises(FileNotFoundError):
        resolve_ckpt_path(str(tmp_path / "missing.ckpt"), cfg)


@pytest.mark.parametrize(
    ("script", "arg", "expected"),
    [
        ("train.py", "trainer.max_stepz=3", "unknown setting of train.py (did you mean trainer.max_steps?)"),
        pytest.param("eval.py", "trainer.max_stepz=3", "unknown setting of eval.py (did you mean trainer.max_steps?)", marks=pytest.mark.slow),  # the same check as train.py
    ],
)  # fmt: skip
def test_unknown_setting_is_one_line_with_a_guess(script: str, arg: str, expected: str) -> None:
    """train.py and eval.py refuse a setting their configuration lacks as every command does:
    one line naming it and the closest one, exit status 2, before anything runs."""
    result = subprocess.run(
        [sys.executable, script, arg],
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr[-2000:]
    assert lines[0].startswith(f"error: {arg}: {expected}"), lines
