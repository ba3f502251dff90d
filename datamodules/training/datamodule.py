"""LightningDataModule over chunk datasets (RE10K, ACID, DL3DV, synthetic).

Batches (``batch_size`` B, V context / target views)::

    batch["context"] / batch["target"]:
        image       [B, V, 3, H, W] float in [0, 1]
        extrinsics  [B, V, 4, 4]    camera-to-world, scene frame (context view 0 = identity,
                                    largest context baseline = 1)
        intrinsics  [B, V, 3, 3]    normalised
        near, far   [B, V]          configured values (scene-frame units)
        index       [B, V]          frame indices in the scene (int64)
        depth       [B, V, H, W]    when the dataset stores depth, divided by the scene scale
    batch["scene"]: list of B scene keys

Training samples views with the ``bounded`` sampler (context gap warmed up over
``warm_up_steps``; the current step reaches the loader workers through shared memory). Validation
uses the test split with the first ``val_scenes`` entries of the evaluation index, testing the full
index; without an index both use a seeded ``bounded`` sampler on the test split.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import lightning as L
from torch.utils.data import DataLoader

from datamodules.errors import InputError
from datamodules.synthetic import SyntheticSettings, ensure_synthetic, is_complete
from datamodules.training.chunk_dataset import ChunkDataset
from datamodules.training.samplers import (
    AllViewSampler,
    BoundedViewSampler,
    EvaluationViewSampler,
    StepTracker,
    ViewSampler,
)

__all__ = ["SplatDataModule", "recipe_data_settings", "worker_init"]

log = logging.getLogger(__name__)


def recipe_data_settings(recipe: Any) -> dict[str, Any]:
    """The data settings an input recipe (``models.weights.input_recipe.InputRecipe``) fixes at test time:
    ``image_size`` (resize to cover, centre crop, intrinsics updated), ``near``, ``far``,
    ``pose_scale`` and ``num_context_views``. ``eval.py`` applies them over ``data=`` for a
    release tag, as the release's own test loader does."""
    if recipe.resize != "resize_crop":
        raise ValueError(f"recipe resize {recipe.resize!r}: the chunk loader only resizes+crops")
    return {
        "image_size": [int(recipe.image_size[0]), int(recipe.image_size[1])],
        "near": float(recipe.near),
        "far": float(recipe.far),
        "pose_scale": "dataset" if recipe.pose_scale == "dataset" else "max_baseline_1",
        "num_context_views": int(recipe.views),
    }


def _worker_terminated(signum, frame) -> None:  # noqa: ARG001
    os._exit(0)


def worker_init(worker_id: int) -> None:
    """``worker_init_fn`` of the data module's loaders: signals in a loader worker.

    PyTorch's worker handles SIGTERM in C (``torch.utils.data._utils.signal_handling``): it
    exits quietly when its parent sends it, and dies by the signal when anyone else does (the
    terminal's or ``timeout``'s process group, a job scheduler); the parent's SIGCHLD handler
    then raises ``DataLoader worker ... is killed by signal`` while it handles its own SIGTERM,
    a traceback instead of ``models.core.command_line.stopped_cleanly``'s one line. Here a worker
    exits quietly (status 0) on any SIGTERM, and Ctrl-C raises ``KeyboardInterrupt``, which the
    worker loop catches, rather than whatever handler the forking process had installed.
    Lightning seeds workers (``seed_everything(workers=True)``) only when a loader has no
    ``worker_init_fn``, so its seeding is called here.
    """
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _worker_terminated)
    if int(os.environ.get("PL_SEED_WORKERS", 0)):
        from lightning.fabric.utilities.seed import pl_worker_init_function

        pl_worker_init_function(worker_id)


class SplatDataModule(L.LightningDataModule):
    """Chunk-dataset data module (see the module docstring for the batch format).

    Args:
        root: dataset root with ``train/`` and ``test/`` chunk splits.
        image_size: ``(H, W)`` the images are resized and centre-cropped to.
        num_context_views: context views per example.
        num_target_views: target views per training example.
        sampler: training view sampler, ``bounded`` or ``all``.
        min_context_gap: final minimum frame gap between the outer context views.
        max_context_gap: final maximum gap.
        initial_min_context_gap: minimum gap at step 0 (default: ``min_context_gap``).
        initial_max_context_gap: maximum gap at step 0 (default: ``max_context_gap``).
        warm_up_steps: steps over which the gap range moves to its final values.
        min_target_distance: frames kept between targets and the outer context views.
        near: near plane of every view (scene-frame units).
        far: far plane of every view.
        max_fov: skip scenes with a wider field of view (degrees).
        augment: random horizontal flips in training.
        baseline_epsilon: skip examples with context cameras closer than this.
        batch_size: training batch size.
        val_batch_size: validation batch size (default: ``batch_size``).
        test_batch_size: test batch size.
        num_workers: data-loader worker processes.
        persistent_workers: keep workers alive between epochs.
        pin_memory: pin batches for faster host-to-GPU copies.
        eval_index: evaluation index JSON for validation and test (None: seeded bounded sampling).
        val_scenes: scenes of the evaluation index used for validation.
        allow_missing_scenes: ignore evaluation-index scenes absent from the test split.
        pose_scale: ``"max_baseline_1"`` or ``"dataset"`` (see ``ChunkDataset``).
        train_split: training split folder.
        test_split: test split folder.
        seed: base seed of view sampling and shuffling.
        generate_if_missing: generate the synthetic dataset at ``root`` on first use.
        generator: ``SyntheticSettings`` fields (scenes, resolution, views, seed, kind,
            test_fraction, supersample).
        generator_workers: processes used for generation.
    """

    def __init__(
        self,
        root: str | Path,
        image_size: tuple[int, int] | list[int] = (256, 256),
        num_context_views: int = 2,
        num_target_views: int = 4,
        sampler: str = "bounded",
        min_context_gap: int = 45,
        max_context_gap: int = 192,
        initial_min_context_gap: int | None = None,
        initial_max_context_gap: int | None = None,
        warm_up_steps: int = 0,
        min_target_distance: int = 0,
        near: float = 1.0,
        far: float = 100.0,
        max_fov: float = 100.0,
        augment: bool = True,
        baseline_epsilon: float = 1e-3,
        batch_size: int = 8,
        val_batch_size: int | None = None,
        test_batch_size: int = 1,
        num_workers: int = 2,
        persistent_workers: bool = True,
        pin_memory: bool = False,
        eval_index: str | Path | None = None,
        val_scenes: int = 8,
        allow_missing_scenes: bool = False,
        train_split: str = "train",
        test_split: str = "test",
        seed: int = 0,
        generate_if_missing: bool = False,
        generator: Mapping[str, Any] | None = None,
        generator_workers: int = 2,
        pose_scale: str = "max_baseline_1",
    ) -> None:
        super().__init__()
        if sampler not in ("bounded", "all"):
            raise ValueError(f"training sampler must be 'bounded' or 'all', got {sampler!r}")
        self.root = Path(str(root))
        self.image_size = (int(image_size[0]), int(image_size[1]))
        self.num_context_views = int(num_context_views)
        self.num_target_views = int(num_target_views)
        self.sampler_name = sampler
        self.gaps = {
            "min_gap": int(min_context_gap),
            "max_gap": int(max_context_gap),
            "initial_min_gap": initial_min_context_gap,
            "initial_max_gap": initial_max_context_gap,
            "warm_up_steps": int(warm_up_steps),
            "min_target_distance": int(min_target_distance),
        }
        self.near, self.far = float(near), float(far)
        self.max_fov = float(max_fov)
        self.augment = bool(augment)
        self.baseline_epsilon = float(baseline_epsilon)
        self.batch_size = int(batch_size)
        self.val_batch_size = int(val_batch_size or batch_size)
        self.test_batch_size = int(test_batch_size)
        self.num_workers = int(num_workers)
        self.persistent_workers = bool(persistent_workers)
        self.pin_memory = bool(pin_memory)
        self.eval_index = Path(str(eval_index)) if eval_index else None
        self.val_scenes = int(val_scenes)
        self.allow_missing_scenes = bool(allow_missing_scenes)
        self.train_split, self.test_split = train_split, test_split
        self.seed = int(seed)
        self.generate_if_missing = bool(generate_if_missing)
        self.generator = dict(generator or {})
        self.generator_workers = int(generator_workers)
        self.pose_scale = str(pose_scale)
        self.step_tracker = StepTracker()
        self.datasets: dict[str, ChunkDataset] = {}

    # ------------------------------------------------------------------ preparation

    def prepare_data(self) -> None:
        """Generate the synthetic dataset at ``root`` if configured and missing."""
        if not self.generate_if_missing:
            return

        settings = SyntheticSettings(**self.generator)
        try:
            ensure_synthetic(self.root, settings, workers=self.generator_workers)
        except TypeError as error:  # unknown generator keys
            raise InputError(f"{self.root}: bad generator settings ({error})") from error

    def setup(self, stage: str | None = None) -> None:
        """Build the datasets a stage needs (validating the files)."""
        if self.generate_if_missing:
            if not is_complete(self.root):
                self.prepare_data()
        if stage in (None, "fit"):
            self.datasets["train"] = self.dataset(
                self.train_split, self.train_sampler(), train=True
            )
        if stage in (None, "fit", "validate"):
            self.datasets["val"] = self.dataset(self.test_split, self.eval_sampler(self.val_scenes))
        if stage in (None, "test", "predict"):
            self.datasets["test"] = self.dataset(self.test_split, self.eval_sampler(None))
        trainer = getattr(self, "trainer", None)
        if trainer is not None:
            for dataset in self.datasets.values():
                dataset.set_shard(trainer.global_rank, trainer.world_size)

    def train_sampler(self) -> ViewSampler:
        """The training view sampler (reads the step from ``step_tracker``)."""
        if self.sampler_name == "all":
            return AllViewSampler(self.num_context_views)
        return BoundedViewSampler(
            self.num_context_views,
            self.num_target_views,
            step_tracker=self.step_tracker,
            **self.gaps,
        )

    def eval_sampler(self, max_scenes: int | None) -> ViewSampler:
        """Evaluation-index sampler (first ``max_scenes`` entries), or fixed bounded sampling."""
        if self.eval_index is not None:
            return EvaluationViewSampler(self.eval_index, self.num_context_views, max_scenes)
        gaps = dict(self.gaps, initial_min_gap=None, initial_max_gap=None, warm_up_steps=0)
        return BoundedViewSampler(self.num_context_views, self.num_target_views, **gaps)

    def dataset(self, split: str, sampler: ViewSampler, train: bool = False) -> ChunkDataset:
        """A dataset over ``split`` with this module's image shape, planes and filters.

        Also the way to get a trajectory for rendering, e.g.
        ``dm.dataset("test", VideoViewSampler(index_path=...))``.
        """
        dataset = ChunkDataset(
            self.root,
            split,
            sampler,
            image_size=self.image_size,
            near=self.near,
            far=self.far,
            max_fov=self.max_fov,
            augment=self.augment and train,
            shuffle=train,
            seed=self.seed,
            deterministic=not train,
            baseline_epsilon=self.baseline_epsilon,
            allow_missing_scenes=self.allow_missing_scenes,
            pose_scale=self.pose_scale,
        )
        if isinstance(sampler, EvaluationViewSampler) and sampler.num_null:
            log.info("%s: %d null entries skipped", sampler.path, sampler.num_null)
        return dataset

    # ------------------------------------------------------------------ loaders

    def _loader(self, dataset: ChunkDataset, batch_size: int, train: bool) -> DataLoader:
        workers = self.num_workers
        return DataLoader(
            dataset,
            batch_size=batch_size,
            num_workers=workers,
            persistent_workers=self.persistent_workers and workers > 0,
            pin_memory=self.pin_memory,
            drop_last=train,
            worker_init_fn=worker_init if workers > 0 else None,
        )

    def _get(self, name: str) -> ChunkDataset:
        if name not in self.datasets:
            self.setup({"train": "fit", "val": "validate", "test": "test"}[name])
        return self.datasets[name]

    def train_dataloader(self) -> DataLoader:
        """Shuffled, augmented training batches."""
        return self._loader(self._get("train"), self.batch_size, train=True)

    def val_dataloader(self) -> DataLoader:
        """A few evaluation-index scenes of the test split."""
        return self._loader(self._get("val"), self.val_batch_size, train=False)

    def test_dataloader(self) -> DataLoader:
        """The full evaluation index on the test split."""
        return self._loader(self._get("test"), self.test_batch_size, train=False)

    def predict_dataloader(self) -> DataLoader:
        """Same as ``test_dataloader``."""
        return self.test_dataloader()

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Publish the global step to the loader workers (for the gap warm-up)."""
        trainer = getattr(self, "trainer", None)
        if trainer is not None and trainer.training:
            self.step_tracker.set(trainer.global_step)
        return batch
