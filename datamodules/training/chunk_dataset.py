"""Iterable dataset over the chunk format (RE10K, ACID, DL3DV, synthetic).

One example is ``{"context": views, "target": views, "scene": key}`` where ``views`` holds
``image [V, 3, H, W]`` float in [0, 1], ``extrinsics [V, 4, 4]`` camera-to-world in the scene
frame (first context camera = identity, largest context baseline = 1), ``intrinsics [V, 3, 3]``
normalised, ``near [V]``, ``far [V]`` (the configured values, scene-frame units), ``index [V]``
(frame indices) and, when the chunk stores depth, ``depth [V, H, W]`` divided by the scene scale.

The dataset reads one chunk at a time (shuffled chunk order and scene order in training) and never
holds more than one chunk per worker in memory. Training shards chunks across data-loader workers
and distributed ranks; evaluation splits (and training sets with fewer chunks than shards) shard
scenes instead, with every shard yielding the same number of examples, so that no distributed rank
waits for one that ran out of data. Bad scenes are skipped and counted in ``skipped`` (per process): non-finite or
malformed cameras, a field of view above ``max_fov``, too few views for the sampler, a context
baseline below ``baseline_epsilon``, an undecodable image or depth map, an unreadable chunk file.
A chunk that needs arbitrary unpickling is refused (``InputError``), never executed.
"""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import IterableDataset, get_worker_info

from datamodules.errors import InputError
from datamodules.readers.chunks import (
    cameras_to_matrices,
    decode_depth,
    decode_image,
    load_chunk,
    load_index,
)
from datamodules.training.samplers import ViewSampler
from datamodules.transforms import flip_views, resize_crop_depth, resize_crop_image
from models.geometry.cameras import focal_to_fov, invert_extrinsics, normalize_scene

# how a split's poses enter the scene frame (``InputRecipe.pose_scale``; pose-free models are
# given the project's own normalisation)
POSE_SCALES = ("max_baseline_1", "dataset", "pose_free")

__all__ = ["ChunkDataset"]

log = logging.getLogger(__name__)


class ChunkDataset(IterableDataset):
    """Examples sampled from a chunk dataset split.

    Args:
        root: dataset root (holding ``train/`` and ``test/``).
        split: split folder name.
        view_sampler: chooses context/target frames; if it has ``keys`` (an evaluation index),
            only those scenes are read.
        image_size: output ``(H, W)``; images are resized to cover it and centre-cropped, with the
            intrinsics adjusted. None keeps the stored size.
        near: near plane given to every view (scene-frame units).
        far: far plane given to every view.
        max_fov: scenes with a horizontal or vertical field of view above this (degrees) are
            skipped.
        augment: random horizontal flip (images, depth and cameras flipped consistently).
        shuffle: shuffle chunk order and scenes within a chunk (each pass differently).
        seed: base seed.
        deterministic: seed every pass identically (validation/test).
        baseline_epsilon: skip examples whose context cameras are closer than this (world units).
        allow_missing_scenes: with a restricted key list, ignore keys absent from the split instead
            of raising.
        pose_scale: ``"max_baseline_1"`` (this project's models: the largest context baseline
            becomes 1) or ``"dataset"`` (a release trained on the dataset's own scale: poses only
            made relative to the first context camera, never rescaled; ``InputRecipe.pose_scale``).
    """

    def __init__(
        self,
        root: str | Path,
        split: str,
        view_sampler: ViewSampler,
        image_size: tuple[int, int] | None = None,
        near: float = 1.0,
        far: float = 100.0,
        max_fov: float = 100.0,
        augment: bool = False,
        shuffle: bool = False,
        seed: int = 0,
        deterministic: bool = False,
        baseline_epsilon: float = 1e-3,
        allow_missing_scenes: bool = False,
        pose_scale: str = "max_baseline_1",
    ) -> None:
        super().__init__()
        if pose_scale not in POSE_SCALES:
            raise InputError(f"pose_scale={pose_scale!r}: must be one of {', '.join(POSE_SCALES)}")
        self.pose_scale = pose_scale
        self.root = Path(root)
        self.split = split
        self.view_sampler = view_sampler
        self.image_size = tuple(int(s) for s in image_size) if image_size is not None else None
        self.near, self.far = float(near), float(far)
        self.max_fov = float(max_fov)
        self.augment = augment
        self.shuffle = shuffle
        self.seed = int(seed)
        self.deterministic = deterministic
        self.baseline_epsilon = float(baseline_epsilon)
        self.rank, self.world_size = 0, 1
        self.skipped: Counter[str] = Counter()
        self._epoch = 0

        index = load_index(self.root, split)
        keys = view_sampler.keys
        if keys is not None:
            missing = [k for k in keys if k not in index]
            if missing and not allow_missing_scenes:
                source = getattr(view_sampler, "path", "the evaluation index")
                raise InputError(
                    f"{source}: {len(missing)} of {len(keys)} scenes are missing from "
                    f"{self.root / split / 'index.json'} (first: {', '.join(missing[:3])})"
                )
            keys = [k for k in keys if k in index]
            if not keys:
                raise InputError(f"{self.root / split}: none of the requested scenes is present")
        else:
            keys = list(index)
        self.keys = keys
        wanted: dict[str, set[str]] = {}
        for key in keys:
            wanted.setdefault(index[key], set()).add(key)
        self._wanted = wanted
        self.chunks = sorted(wanted)
        for name in self.chunks:
            if not (self.root / split / name).is_file():
                raise InputError(
                    f"{self.root / split / name}: chunk listed in index.json is missing"
                )

    @property
    def num_scenes(self) -> int:
        """Scenes this dataset may yield (before skips)."""
        return len(self.keys)

    def set_shard(self, rank: int, world_size: int) -> None:
        """Read only this distributed rank's share of the chunks."""
        self.rank, self.world_size = int(rank), int(world_size)

    def _skip(self, reason: str, message: str) -> None:
        self.skipped[reason] += 1
        log.warning("skipping %s (%s); skipped so far: %s", message, reason, dict(self.skipped))

    def _seeds(self) -> tuple[int, int, int, int]:
        """``(pass seed, shard, number of shards, example seed)`` for this worker and pass."""
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        shard = self.rank * workers + worker
        shards = self.world_size * workers
        if self.deterministic:
            base, epoch = 0, 0
        else:
            base = (info.seed - info.id) if info is not None else torch.initial_seed()
            epoch = self._epoch
            self._epoch += 1
        pass_seed = int(
            np.random.SeedSequence([self.seed, base % 2**63, epoch]).generate_state(1)[0]
        )
        example_seed = int(
            np.random.SeedSequence([self.seed, base % 2**63, epoch, shard]).generate_state(1)[0]
        )
        return pass_seed, shard, shards, example_seed

    def __iter__(self):
        pass_seed, shard, shards, example_seed = self._seeds()
        chunks = list(self.chunks)
        if self.shuffle:
            order = torch.randperm(len(chunks), generator=torch.Generator().manual_seed(pass_seed))
            chunks = [chunks[i] for i in order]
        generator = torch.Generator().manual_seed(example_seed)
        if shards > 1 and (not self.shuffle or len(chunks) < shards):
            yield from self._iter_scene_shard(chunks, shard, shards, pass_seed, generator)
            return
        chunks = chunks[shard::shards]
        yielded = 0
        for scene, path in self._scenes(chunks, generator if self.shuffle else None):
            example = self.load_example(scene, generator, path)
            if example is not None:
                yielded += 1
                yield example
        self._check_yielded(chunks, yielded)

    def _scenes(self, chunks: list[str], order: torch.Generator | None):
        """``(scene, chunk path)`` of the wanted scenes of ``chunks``, read one chunk at a time
        (lazily), each chunk's scenes shuffled with ``order`` when given."""
        for name in chunks:
            path = self.root / self.split / name
            try:
                chunk = load_chunk(path)
            except InputError as error:
                if "refused" in str(error):
                    raise
                self._skip("corrupt_chunk", str(error))
                continue
            scenes = [s for s in chunk if s["key"] in self._wanted[name]]
            if order is not None:
                scenes = [scenes[i] for i in torch.randperm(len(scenes), generator=order)]
            for scene in scenes:
                yield scene, path

    def _check_yielded(self, chunks: list[str], yielded: int) -> None:
        if chunks and yielded == 0 and self.skipped:
            raise InputError(
                f"{self.root / self.split}: no usable scene in {len(chunks)} chunk(s) "
                f"(skipped: {dict(self.skipped)})"
            )

    def _iter_scene_shard(
        self,
        chunks: list[str],
        shard: int,
        shards: int,
        pass_seed: int,
        generator: torch.Generator,
    ):
        """Scene-level sharding: every shard reads every chunk and keeps every ``shards``-th scene.

        Used for evaluation splits and when there are fewer chunks than shards (chunk sharding
        would leave a rank without data, and distributed training would wait for it forever).
        Every shard yields the same number of examples, ``ceil(scenes / shards)``: a shard that
        runs short repeats the first usable scenes, as ``DistributedSampler`` pads (so a
        distributed evaluation may score a few scenes twice).
        """
        quota = -(-len(self.keys) // shards)
        order_generator = torch.Generator().manual_seed(pass_seed)  # the same on every shard
        yielded = 0
        for sweep in range(2):  # sweep 1 pads a short shard with the first usable scenes
            position = 0
            shuffle = order_generator if self.shuffle and sweep == 0 else None
            for scene, path in self._scenes(chunks, shuffle):
                mine = sweep == 1 or position % shards == shard
                position += 1
                if not mine:
                    continue
                example = self.load_example(scene, generator, path)
                if example is None:
                    continue
                yield example
                yielded += 1
                if yielded >= quota:
                    return
        self._check_yielded(chunks, yielded)

    def load_example(
        self, scene: dict, generator: torch.Generator | None = None, path: Path | None = None
    ) -> dict | None:
        """Build one example from a scene dict, or None (counted in ``skipped``) if unusable."""
        key = str(scene.get("key"))
        where = f"scene {key!r} in {path}"
        cameras = scene.get("cameras")
        images = scene.get("images")
        if (
            not isinstance(cameras, Tensor)
            or cameras.ndim != 2
            or cameras.shape[1] != 18
            or not isinstance(images, list)
            or len(images) != cameras.shape[0]
        ):
            self._skip("malformed_scene", where)
            return None
        if not torch.isfinite(cameras).all():
            self._skip("nonfinite_cameras", where)
            return None
        extrinsics, intrinsics = cameras_to_matrices(cameras)  # [N, 4, 4], [N, 3, 3]
        if not torch.isfinite(extrinsics).all():
            self._skip("nonfinite_cameras", f"{where} (singular pose)")
            return None
        if (focal_to_fov(intrinsics).rad2deg() > self.max_fov).any():
            self._skip("fov", where)
            return None
        try:
            indices = self.view_sampler.sample(key, cameras.shape[0], generator)
        except ValueError as error:
            self._skip("too_few_views", f"{where}: {error}")
            return None

        has_depth = "depths" in scene and "depth_scale" in scene
        decoded: dict[int, tuple[Tensor, Tensor, Tensor | None]] = {}
        for i in torch.cat([indices.context, indices.target]).unique().tolist():
            try:
                image, crop = resize_crop_image(decode_image(images[i]), self.image_size)
                depth = None
                if has_depth:
                    depth = decode_depth(scene["depths"][i], float(scene["depth_scale"]))
                    depth = resize_crop_depth(depth, self.image_size)
            except (ValueError, IndexError) as error:
                self._skip("corrupt_image", f"{where} view {i}: {error}")
                return None
            decoded[i] = (image, crop, depth)

        def gather(idx: Tensor) -> dict:
            ids = idx.tolist()
            views = {
                "image": torch.stack([decoded[i][0] for i in ids]),  # [V, 3, H, W]
                "extrinsics": extrinsics[idx],  # [V, 4, 4]
                "intrinsics": torch.stack([decoded[i][1] @ intrinsics[i] for i in ids]),
                "index": idx.clone(),  # [V]
            }
            if has_depth:
                views["depth"] = torch.stack([decoded[i][2] for i in ids])  # [V, H, W]
            return views

        context, target = gather(indices.context), gather(indices.target)
        coin = torch.rand(1, generator=generator).item()  # drawn always: sampling ignores augment
        if self.augment and coin < 0.5:
            context, target = flip_views(context), flip_views(target)

        centers = context["extrinsics"][:, :3, 3]  # [Vc, 3]
        if centers.shape[0] > 1:
            baseline = torch.cdist(centers.double(), centers.double()).max().item()
            if baseline < self.baseline_epsilon:
                self._skip("baseline", f"{where}: context baseline {baseline:.2e}")
                return None
        if self.pose_scale == "dataset":
            # relative to the first context camera, the dataset's own scale; in float64, so that
            # the float32 result is the nearest to the exact one (translations of ~10 units)
            reference = invert_extrinsics(context["extrinsics"][:1].double())  # [1, 4, 4]
            ctx_ext = (reference @ context["extrinsics"].double()).float()
            tgt_ext = (reference @ target["extrinsics"].double()).float()
            scale = torch.ones(())
        else:
            ctx_ext, (tgt_ext,), scale = normalize_scene(
                context["extrinsics"], target["extrinsics"]
            )
        context["extrinsics"], target["extrinsics"] = ctx_ext, tgt_ext
        for views in (context, target):
            count = views["index"].shape[0]
            views["near"] = torch.full((count,), self.near)
            views["far"] = torch.full((count,), self.far)
            if has_depth:
                views["depth"] = views["depth"] / scale
        return {"context": context, "target": target, "scene": key}
