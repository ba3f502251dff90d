"""Evaluate a checkpoint: ``python eval.py model=pixel_aligned ckpt_path=PATH [data=synthetic]``,
or a released model as its authors do:
``python eval.py release=depthsplat_small.re10k_256x256_view2 [weights=FILE] data=re10k``
(the tag's input recipe: shape, resize + centre crop, near/far, poses in the dataset's scale; the
release's evaluation index from ``eval_index_dir``; see docs/eval.md).

Follows the RE10K protocol: the data's evaluation index picks context and target views, each scene
is scored by the mean over its targets, then scenes are averaged. Writes ``metrics.json``, a
per-scene ``scenes.csv`` and sample renders into the run folder, and prints a table. Pose-free
models are scored with and without test-time target-pose fit: their frame may differ from
the scene frame by a similarity (a release's own depth normalisation), so the target poses are first
mapped into it (``target_pose_alignment``, fitted on the context views, see
``models.pipeline.pose_fit.place_targets``), then refined; ``metrics.json`` says how
(``target_pose_placement``).
"""

from __future__ import annotations

import csv
import json
import math
import os
import shutil
import signal
import sys
import tempfile

if __name__ == "__main__":  # Ctrl-C while the imports below load: one line, no traceback
    signal.signal(signal.SIGINT, lambda *_: (print("eval.py: stopped by Ctrl-C", file=sys.stderr), os._exit(130)))  # fmt: skip  # noqa: E501

import hydra
import lightning as L
import torch
from omegaconf import DictConfig, open_dict

from datamodules.errors import InputError
from datamodules.training.datamodule import recipe_data_settings
from models import create_model, get_pretrained_cfg
from models.core.command_line import quote_path_arguments, stopped_by_signal, stopped_cleanly
from models.core.output_folder import mark_staging, remove_stale_folders
from models.geometry.similarity import CAMERA_FITS
from models.training.cli import (
    StepProgressBar,
    UserError,
    check_overrides,
    exit_on_user_error,
    instantiate_group,
    quiet_third_party,
)
from models.weights.registry import to_plain

CONFIG_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")


def summarise(records: list[dict]) -> dict[str, float]:
    """Mean over scenes of every numeric per-scene field."""
    keys = [k for k in records[0] if k != "scene"]
    return {k: sum(r[k] for r in records) / len(records) for k in keys}


def write_outputs(folder: str, records: list[dict], samples: list[dict], meta: dict) -> dict:
    """Write ``scenes.csv``, ``renders/`` and ``metrics.json`` into ``folder``: each complete or
    not at all. They are written into a hidden staging folder there (removed on any error, Ctrl-C
    and SIGTERM; a killed run's by the next one), then moved into place, ``metrics.json`` last:
    when it is there, the others are whole."""
    from torchvision.utils import save_image

    summary = summarise(records)
    os.makedirs(folder, exist_ok=True)
    remove_stale_folders(folder, (".eval.tmp-*",))
    staging = tempfile.mkdtemp(prefix=".eval.tmp-", dir=folder)
    mark_staging(staging)
    try:
        with open(os.path.join(staging, "scenes.csv"), "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(records[0]))
            writer.writeheader()
            writer.writerows(records)
        render_dir = os.path.join(staging, "renders")
        os.makedirs(render_dir)
        for i, sample in enumerate(samples):
            # one row per target: context views | target | render
            rows = []
            for target, rendered in zip(sample["target"], sample["render"]):
                rows.append(torch.cat([*sample["context"], target, rendered.clamp(0, 1)], dim=-1))
            name = f"{i:02d}_{sample['scene']}.png"
            save_image(torch.cat(rows, dim=-2), os.path.join(render_dir, name))
        with open(os.path.join(staging, "metrics.json"), "w") as handle:
            json.dump({**meta, "scenes": len(records), "metrics": summary}, handle, indent=2)
        if os.path.exists(os.path.join(folder, "metrics.json")):  # an older set: not whole now
            os.remove(os.path.join(folder, "metrics.json"))
        for name in ("scenes.csv", "renders", "metrics.json"):
            target = os.path.join(folder, name)
            if os.path.isdir(target):
                shutil.rmtree(target)
            os.replace(os.path.join(staging, name), target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return summary


def print_table(summary: dict[str, float], scenes: int) -> None:
    rows = [("metric", "value")] + [
        (k, f"{v:.4f}" if not math.isnan(v) else "nan") for k, v in summary.items()
    ]
    width = max(len(r[0]) for r in rows)
    print(f"\nEvaluated {scenes} scenes")
    print(f"| {'metric'.ljust(width)} | value |")
    print(f"|{'-' * (width + 2)}|-------|")
    for key, value in rows[1:]:
        print(f"| {key.ljust(width)} | {value} |")


def target_pose_placement(refined: bool, alignment: str, steps: int) -> str:
    """One sentence for ``metrics.json``: where the scores' target cameras came from."""
    if not refined:
        return "ground-truth target poses (scene frame), no refinement"
    how = {
        "similarity": "mapped into the model's frame by a similarity (scale, rotation, "
        "translation) fitted between the known context poses and the context views placed in "
        "that frame (coarse scale search, then pose fit against their own images)",
        "scale": "mapped into the model's frame by a scale fitted between the known context "
        "poses and the context views placed in that frame (coarse scale search, then pose "
        "refinement against their own images)",
        "none": "taken as they are (the model's frame assumed to be the scene frame)",
    }[alignment]
    return (
        f"psnr/ssim/lpips: ground-truth target poses (scene frame); refined_*: those poses {how}, "
        f"then refined for {steps} steps against the target images with the Gaussians frozen"
        + (
            "; aligned_*: mapped but not refined; frame_scale: model units per scene unit; "
            "frame_residual: RMS context-centre misfit of the similarity (scene units)"
            if alignment != "none"
            else ""
        )
    )


def context_views_of(index_path: str) -> int:
    """Context views of the first non-null entry of an evaluation index."""
    with open(index_path) as handle:
        index = json.load(handle)
    for entry in index.values():
        if entry is not None:
            return len(entry["context"])
    raise UserError(f"{index_path}: the evaluation index has no usable entry")


def release_setup(cfg: DictConfig) -> tuple[torch.nn.Module, dict, dict]:
    """A release tag's network, its data settings and what ``metrics.json`` records of it.

    The tag's recipe sets the data (``recipe_data_settings``), the evaluation index is
    ``eval_index_dir`` / the data config's index file name (the released RE10K/ACID/DL3DV files
    are never copied into the repository).
    """
    tag = str(cfg.release)
    try:
        pretrained = get_pretrained_cfg(tag)
    except (KeyError, LookupError, ValueError) as error:
        raise UserError(f"release={tag}: not a registered architecture.tag ({error})") from None
    if pretrained.recipe is None:
        raise UserError(f"release={tag}: the tag carries no input recipe to evaluate it with")
    name = cfg.data.get("eval_index")
    if not name:
        raise UserError("data.eval_index: the data config names no evaluation index file")
    folder = os.path.abspath(str(cfg.eval_index_dir))
    index_path = os.path.join(folder, os.path.basename(str(name)))
    if not os.path.isfile(index_path):
        raise UserError(
            f"eval_index_dir={folder}: {os.path.basename(str(name))} not found (point "
            "eval_index_dir= at the folder of the released evaluation index files)"
        )
    settings = recipe_data_settings(pretrained.recipe)
    settings["num_context_views"] = context_views_of(index_path)
    settings["eval_index"] = index_path
    architecture = tag.split(".")[0]
    weights = cfg.get("weights")
    if weights:
        net = create_model(architecture, pretrained=str(weights), **pretrained.arch_kwargs)
    else:
        net = create_model(tag, pretrained=True)
    meta = {
        "release": tag,
        "weights": str(weights)
        if weights
        else f"{pretrained.hf_hub_id}/{pretrained.hf_hub_filename}",
        "recipe": pretrained.recipe.to_dict(),
        "eval_index": index_path,
    }
    return net, settings, meta


def evaluate(cfg: DictConfig) -> dict[str, float]:
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    with open_dict(cfg):
        cfg.model.fit_target_poses = cfg.fit_target_poses
        cfg.model.eval_kwargs = cfg.eval_kwargs
        cfg.model.num_val_images = cfg.num_renders

    alignment = str(cfg.get("target_pose_alignment", "similarity"))
    if alignment not in CAMERA_FITS:
        raise UserError(
            f"target_pose_alignment={alignment}: must be one of {', '.join(CAMERA_FITS)}"
        )
    release_meta: dict = {}
    applied: dict = {}  # data settings the release's recipe replaced
    if cfg.get("release"):
        # a released model: its tag's network, recipe and the authors' evaluation index
        net, settings, release_meta = release_setup(cfg)
        datamodule: L.LightningDataModule = hydra.utils.instantiate(cfg.data, **settings)
        applied = settings
        weights_label = release_meta["weights"]
    else:
        datamodule = hydra.utils.instantiate(cfg.data)
        # The network the weights describe, built and loaded by the factory: their recorded
        # constructor arguments win over the config's `net:` (a release file takes its tag's);
        # the config's network is never built.
        name = cfg.model.net.get("name")
        if name is None:
            raise UserError(f"model.net: needs a registry 'name' to load {cfg.ckpt_path}")
        net = create_model(str(name), pretrained=str(cfg.ckpt_path))
        weights_label = str(cfg.ckpt_path)
    module = hydra.utils.instantiate(cfg.model, net=net)
    module.target_pose_alignment = alignment  # read by the test step (pose-free models)
    loggers = instantiate_group(cfg.get("logger"))
    callbacks = [StepProgressBar()] if cfg.trainer.get("enable_progress_bar", True) else []
    trainer: L.Trainer = hydra.utils.instantiate(
        cfg.trainer, logger=loggers or False, callbacks=callbacks
    )
    with stopped_by_signal(trainer):
        trainer.test(module, datamodule=datamodule)
    if not module.test_records:
        raise UserError(
            "the test split produced no scenes (check data.root and the evaluation index)"
        )
    refined = bool(cfg.fit_target_poses) and bool(getattr(net, "pose_free", False))
    meta = {
        "model": getattr(net, "registry_name", type(net).__name__),
        "ckpt_path": weights_label,
        **release_meta,
        "data": {**to_plain(cfg.data), **applied},
        "eval_kwargs": to_plain(cfg.eval_kwargs),
        "fit_target_poses": refined,
        "target_pose_alignment": alignment if refined else None,
        "target_pose_placement": target_pose_placement(
            refined, alignment, int(module.hparams.pose_fit_steps)
        ),
    }
    summary = write_outputs(cfg.paths.output_dir, module.test_records, module.test_samples, meta)
    print_table(summary, len(module.test_records))
    if refined:
        print(f"target poses: {meta['target_pose_placement']}")
    print(f"results in {cfg.paths.output_dir}")
    return summary


@hydra.main(version_base="1.3", config_path="configs", config_name="eval.yaml")
@exit_on_user_error
def main(cfg: DictConfig) -> None:
    evaluate(cfg)


if __name__ == "__main__":
    os.environ.setdefault("PROJECT_ROOT", os.path.dirname(os.path.abspath(__file__)))
    sys.argv[1:] = quote_path_arguments(sys.argv[1:])  # any path a user can type
    quiet_third_party()
    with stopped_cleanly("eval.py"):
        try:
            check_overrides(sys.argv[1:], CONFIG_DIR, "eval.yaml", "eval.py")
        except InputError as error:
            print(f"error: {' '.join(str(error).split())}", file=sys.stderr)
            sys.exit(2)
        main()
