"""Chunk dataset: example format, scene frame, resize/crop, flips, skipping, safety, real data."""

from __future__ import annotations

import json
import logging
import pathlib
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from datamodules import InputError, read_scene
from datamodules.readers.chunk_writer import ChunkWriter, camera_row, encode_bytes
from datamodules.readers.chunks import load_chunk, load_index
from datamodules.synthetic import SyntheticSettings, generate_dataset
from datamodules.training.chunk_dataset import ChunkDataset
from datamodules.training.samplers import BoundedViewSampler, EvaluationViewSampler
from datamodules.transforms import flip_views
from models.core.pixels import image_from_uint8, image_to_uint8
from models.geometry.cameras import pixel_grid, project, transform_points, unproject

RES, VIEWS = 32, 24


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    settings = SyntheticSettings(scenes=6, resolution=RES, views=VIEWS, seed=11, test_fraction=0.34)
    out = tmp_path_factory.mktemp("chunks") / "data"
    # small chunks: several chunk files per split, to exercise sharding
    return generate_dataset(out, settings, workers=1, chunk_mb=0.15, progress=False)


def sampler(**kwargs) -> BoundedViewSampler:
    return BoundedViewSampler(
        **{"num_context_views": 2, "num_target_views": 3, "min_gap": 8, "max_gap": 16, **kwargs}
    )


def reprojection(views: dict, a: int, b: int) -> tuple[float, float]:
    """Median relative depth error and agreement fraction of view ``a`` reprojected into ``b``."""
    depth = views["depth"]
    height, width = depth.shape[-2:]
    coords = pixel_grid((height, width)).reshape(-1, 2)
    points = unproject(coords, depth[a].reshape(-1), views["intrinsics"][a], views["extrinsics"][a])
    uv, z = project(points, views["extrinsics"][b], views["intrinsics"][b])
    inside = (z > 0) & (uv > 0).all(-1) & (uv < 1).all(-1)
    grid = (uv[inside] * 2 - 1)[None, None]
    inverse = F.grid_sample(1 / depth[b][None, None], grid, align_corners=False)[0, 0, 0]
    error = (1 / inverse - z[inside]).abs() / z[inside]
    return error.median().item(), (error < 0.01).float().mean().item()


def merged(example: dict) -> dict:
    return {
        k: torch.cat([example["context"][k], example["target"][k]])
        for k in ("image", "depth", "intrinsics", "extrinsics")
    }


def test_example_format(root: Path) -> None:
    dataset = ChunkDataset(root, "train", sampler(), image_size=(RES, RES), near=0.25, far=50.0)
    examples = list(dataset)
    assert len(examples) == dataset.num_scenes == 4 and not dataset.skipped
    example = examples[0]
    assert set(example) == {"context", "target", "scene"} and example["scene"].startswith(
        "syn_train_"
    )
    for role, count in (("context", 2), ("target", 3)):
        views = example[role]
        assert set(views) == {"image", "extrinsics", "intrinsics", "near", "far", "index", "depth"}
        assert (
            views["image"].shape == (count, 3, RES, RES) and views["image"].dtype == torch.float32
        )
        assert 0 <= views["image"].min() and views["image"].max() <= 1
        assert views["extrinsics"].shape == (count, 4, 4) and views["intrinsics"].shape == (
            count,
            3,
            3,
        )
        assert views["depth"].shape == (count, RES, RES)
        assert torch.equal(views["near"], torch.full((count,), 0.25))
        assert torch.equal(views["far"], torch.full((count,), 50.0))
        assert views["index"].dtype == torch.int64
    context, target = example["context"]["index"], example["target"]["index"]
    assert 8 <= context[1] - context[0] <= 16
    assert ((target >= context[0]) & (target <= context[1])).all()
    depth = torch.cat([example["context"]["depth"], example["target"]["depth"]])
    assert 0.25 <= depth.min() and depth.max() <= 50.0  # GT depth inside near/far


def test_scene_frame_and_consistency_with_read_scene(root: Path) -> None:
    dataset = ChunkDataset(root, "train", sampler(num_context_views=3))
    example = next(iter(dataset))
    ctx = example["context"]["extrinsics"]
    assert torch.allclose(ctx[0], torch.eye(4), atol=1e-5)
    centers = ctx[:, :3, 3]
    assert torch.cdist(centers, centers).max().item() == pytest.approx(1.0, abs=1e-5)

    raw = read_scene(root, "train", example["scene"])
    index = torch.cat([example["context"]["index"], example["target"]["index"]])
    poses = raw["extrinsics"][index].double()
    scale = torch.cdist(poses[:3, :3, 3], poses[:3, :3, 3]).max()
    expected = torch.linalg.inv(poses[0]) @ poses
    expected[:, :3, 3] /= scale
    got = torch.cat([ctx, example["target"]["extrinsics"]]).double()
    assert torch.allclose(got, expected, atol=1e-4)
    depth = torch.cat([example["context"]["depth"], example["target"]["depth"]])
    assert torch.allclose(depth, raw["depth"][index] / scale.float(), rtol=1e-4)
    assert torch.allclose(example["context"]["image"], raw["image"][index[:3]], atol=1e-6)


def test_resize_crop_keeps_geometry_consistent(root: Path) -> None:
    shape = (20, 36)  # other aspect ratio: resize to cover, then centre-crop
    dataset = ChunkDataset(root, "test", sampler(), image_size=shape)
    example = next(iter(dataset))
    views = merged(example)
    assert example["context"]["image"].shape[-2:] == shape and views["depth"].shape[-2:] == shape
    raw = read_scene(root, "test", example["scene"])
    k_raw = raw["intrinsics"][example["context"]["index"][0]]
    k = example["context"]["intrinsics"][0]
    scaled_w = round(RES * 36 / 32)  # cover: 32x32 -> 36x36, crop rows 8..28
    assert k[0, 0].item() == pytest.approx(k_raw[0, 0].item() * scaled_w / 36, rel=1e-5)
    assert k[1, 1].item() == pytest.approx(k_raw[1, 1].item() * 36 / 20, rel=1e-5)
    assert k[1, 2].item() == pytest.approx((k_raw[1, 2].item() * 36 - 8) / 20, rel=1e-5)
    error, agree = reprojection(views, 0, 1)
    assert error < 5e-3 and agree > 0.5


def test_flip_keeps_geometry_consistent(root: Path) -> None:
    example = next(iter(ChunkDataset(root, "test", sampler())))
    views = merged(example)
    flipped = flip_views(views)
    assert torch.equal(flipped["depth"], views["depth"].flip(-1))
    for a, b in ((0, 1), (1, 3)):
        error, agree = reprojection(views, a, b)
        error_f, agree_f = reprojection(flipped, a, b)
        assert error_f < 2e-3 and agree_f > 0.6 and abs(agree_f - agree) < 0.05
    # flipping only the images (not the cameras) breaks consistency
    wrong = dict(views, depth=views["depth"].flip(-1))
    assert reprojection(wrong, 0, 1)[1] < 0.5
    # the dataset's augmentation: some examples flipped, scene frame intact, still consistent
    plain = list(ChunkDataset(root, "train", sampler(), seed=5))
    augmented = list(ChunkDataset(root, "train", sampler(), seed=5, augment=True))
    flips = 0
    for a, b in zip(plain, augmented):
        assert a["scene"] == b["scene"] and torch.equal(
            a["context"]["index"], b["context"]["index"]
        )
        if torch.equal(b["context"]["image"], a["context"]["image"].flip(-1)):
            flips += 1
            assert torch.allclose(b["context"]["extrinsics"][0], torch.eye(4), atol=1e-5)
            assert reprojection(merged(b), 0, 1)[1] > 0.6
        else:
            assert torch.equal(b["context"]["image"], a["context"]["image"])
    assert 0 < flips < len(plain) or len(plain) < 3


def test_shuffle_and_worker_sharding(root: Path) -> None:
    assert len(ChunkDataset(root, "train", sampler()).chunks) >= 2
    keys = set(load_index(root, "train"))
    dataset = ChunkDataset(root, "train", sampler(), shuffle=True, seed=1)
    first, second = [e["scene"] for e in dataset], [e["scene"] for e in dataset]
    assert set(first) == set(second) == keys and first != second
    loader = DataLoader(dataset, batch_size=None, num_workers=2)
    seen = [e["scene"] for e in loader]
    assert sorted(seen) == sorted(keys)  # each scene once: chunks are sharded across workers


@pytest.mark.parametrize("world_size", [2, 3, 5])
def test_rank_sharding_gives_every_rank_the_same_number_of_examples(
    root: Path, world_size: int
) -> None:
    """Distributed ranks must never run out of data at different times (DDP would hang)."""
    index_path = root / "evaluation_index.json"
    keys = sorted(json.loads(index_path.read_text()))
    per_rank = []
    for rank in range(world_size):
        dataset = ChunkDataset(root, "test", EvaluationViewSampler(index_path))
        dataset.set_shard(rank, world_size)
        per_rank.append([e["scene"] for e in dataset])
    quota = -(-len(keys) // world_size)
    assert [len(scenes) for scenes in per_rank] == [quota] * world_size
    assert sorted({k for scenes in per_rank for k in scenes}) == keys  # every scene is scored
    padded = sum(len(scenes) for scenes in per_rank) - len(keys)
    assert padded == quota * world_size - len(keys)  # repeats only to even the ranks out
    # Training with fewer chunks than ranks: scene sharding, disjoint before padding.
    train_keys = set(load_index(root, "train"))
    chunks = len(ChunkDataset(root, "train", sampler()).chunks)
    ranks = chunks + 1
    seen = []
    for rank in range(ranks):
        dataset = ChunkDataset(root, "train", sampler(), shuffle=True, seed=3)
        dataset.set_shard(rank, ranks)
        seen.append([e["scene"] for e in dataset])
    assert len({len(scenes) for scenes in seen}) == 1 and len(seen[0]) > 0
    assert {k for scenes in seen for k in scenes} == train_keys


def test_evaluation_index(root: Path, tmp_path: Path) -> None:
    index_path = root / "evaluation_index.json"
    dataset = ChunkDataset(root, "test", EvaluationViewSampler(index_path))
    index = json.loads(index_path.read_text())
    examples = list(dataset)
    assert [e["scene"] for e in examples] == sorted(index)
    for example in examples:
        assert example["context"]["index"].tolist() == index[example["scene"]]["context"]
        assert example["target"]["index"].tolist() == index[example["scene"]]["target"]
    bad = tmp_path / "index.json"
    bad.write_text(
        json.dumps(
            {
                **index,
                "nope_1": {"context": [0, 5], "target": [2]},
                "nope_2": None,
                "nope_3": {"context": [0, 1], "target": [0]},
            }
        )
    )
    with pytest.raises(InputError, match=r"2 of 4 scenes are missing") as error:
        ChunkDataset(root, "test", EvaluationViewSampler(bad))
    assert str(bad) in str(error.value)
    kept = ChunkDataset(root, "test", EvaluationViewSampler(bad), allow_missing_scenes=True)
    assert kept.num_scenes == len(index)


def test_missing_root_index_and_empty_split(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="dataset root not found") as error:
        ChunkDataset(tmp_path / "nowhere", "train", sampler())
    assert str(tmp_path / "nowhere") in str(error.value)
    with pytest.raises(InputError, match="missing index.json"):
        ChunkDataset(tmp_path, "train", sampler())
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "index.json").write_text("{}")
    with pytest.raises(InputError, match="is empty") as error:
        ChunkDataset(tmp_path, "train", sampler())
    assert len(str(error.value).splitlines()) == 1


def copy_split(root: Path, tmp_path: Path, edit) -> Path:
    """A copy of the train split with every chunk's scenes passed through ``edit``."""
    out = tmp_path / "copy"
    shutil.copytree(root / "train", out / "train")
    for chunk_path in (out / "train").glob("*.torch"):
        torch.save([edit(scene) for scene in load_chunk(chunk_path)], chunk_path)
    return out


def test_bad_scenes_are_skipped_and_counted(root: Path, tmp_path: Path, caplog) -> None:
    first, second = sorted(load_index(root, "train"))[:2]

    def edit(scene: dict) -> dict:
        if scene["key"] == first:  # corrupt every image (whichever views get sampled)
            scene["images"] = [encode_bytes(b"\xff\xd8 not a jpeg") for _ in scene["images"]]
        if scene["key"] == second:
            scene["cameras"][3, 7] = float("nan")
        return scene

    copy = copy_split(root, tmp_path, edit)
    dataset = ChunkDataset(copy, "train", sampler())
    with caplog.at_level(logging.WARNING, logger="datamodules.training.chunk_dataset"):
        keys = [e["scene"] for e in dataset]
    assert (
        first not in keys and second not in keys and len(keys) == len(load_index(root, "train")) - 2
    )
    assert dataset.skipped == {"corrupt_image": 1, "nonfinite_cameras": 1}
    assert any(first in r.getMessage() for r in caplog.records)


def test_wide_field_of_view_is_skipped(root: Path) -> None:
    dataset = ChunkDataset(root, "train", sampler(), max_fov=30.0)
    with pytest.raises(InputError, match="no usable scene"):
        list(dataset)
    assert dataset.skipped["fov"] == 4


class _Payload:
    """Unpickling this would create a file: a stand-in for arbitrary code in a chunk."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return pathlib.Path.touch, (self.marker,)


def test_unsafe_chunk_is_refused(root: Path, tmp_path: Path) -> None:
    marker = tmp_path / "executed"
    copy = copy_split(root, tmp_path, lambda scene: {**scene, "url": _Payload(marker)})
    dataset = ChunkDataset(copy, "train", sampler())
    with pytest.raises(InputError, match="refused to load chunk") as error:
        list(dataset)
    assert ".torch" in str(error.value) and len(str(error.value).splitlines()) == 1
    assert not marker.exists()


def test_real_images_and_colmap_poses_through_the_chunk_format(
    shared_data: Path, tmp_path: Path
) -> None:
    """pixelSplat-style chunk built from real frames + SfM poses; 3D points must reproject onto
    their observed keypoints after resize/crop, conversion to camera-to-world and normalisation."""
    from datamodules.readers import colmap

    scene_dir = shared_data / "real" / "drone_colmap"
    cameras, images, points = colmap.read_model(scene_dir, points=True)
    chosen = sorted(images.values(), key=lambda im: im.name)[:6]
    width, height = 848, 480
    rows = torch.stack(
        [
            camera_row(
                colmap.camera_intrinsics(cameras[im.camera_id]), colmap.image_world_to_camera(im)
            )
            for im in chosen
        ]
    )
    scene = {
        "key": "drone",
        "url": "",
        "timestamps": torch.arange(len(chosen)) * 266_933,
        "cameras": rows,
        "images": [encode_bytes((scene_dir / "images" / im.name).read_bytes()) for im in chosen],
    }
    writer = ChunkWriter(tmp_path, "test")
    writer.add(scene)
    writer.close()
    (tmp_path / "index.json").write_text(
        json.dumps({"drone": {"context": [0, 5], "target": [2, 3]}})
    )
    dataset = ChunkDataset(
        tmp_path, "test", EvaluationViewSampler(tmp_path / "index.json"), image_size=(256, 256)
    )
    example = next(iter(dataset))
    assert (
        example["context"]["image"].shape == (2, 3, 256, 256) and "depth" not in example["context"]
    )

    w2c = torch.stack([colmap.image_world_to_camera(im) for im in chosen])
    c2w = torch.linalg.inv(w2c)
    scale = (c2w[0, :3, 3] - c2w[5, :3, 3]).norm()
    to_scene = torch.linalg.inv(c2w[0])
    scaled_w = round(width * 256 / height)  # 848x480 covers 256x256 at 452x256
    left = (scaled_w - 256) // 2
    for role in ("context", "target"):
        views = example[role]
        for v, frame in enumerate(views["index"].tolist()):
            image = chosen[frame]
            keep = image.point3d_ids >= 0
            xyz = torch.tensor(np.stack([points[i].xyz for i in image.point3d_ids[keep]]))
            xyz = transform_points(to_scene, xyz) / scale
            uv, z = project(xyz.float(), views["extrinsics"][v], views["intrinsics"][v])
            observed = torch.tensor(image.xys[keep], dtype=torch.float32)
            observed[:, 0] = observed[:, 0] * scaled_w / width - left
            observed[:, 1] = observed[:, 1] * 256 / height
            residual = (uv * 256 - observed).norm(dim=-1)
            inside = (observed >= 0).all(-1) & (observed < 256).all(-1)
            assert (z > 0).all() and residual[inside].median() < 1.0, residual[inside].median()


def test_image_uint8_round_trip_is_exact_and_rounds_to_nearest() -> None:
    pixels = np.random.default_rng(0).integers(0, 256, size=(2, 5, 7, 3), dtype=np.uint8)
    image = image_from_uint8(pixels)
    assert image.shape == (2, 3, 5, 7) and image.dtype == torch.float32
    np.testing.assert_array_equal(image_to_uint8(image), pixels)
    from PIL import Image

    np.testing.assert_array_equal(
        image_to_uint8(image_from_uint8(Image.fromarray(pixels[0]))), pixels[0]
    )
    values = torch.tensor([-0.5, 0.0, 0.4 / 255, 0.6 / 255, 254.6 / 255, 1.0, 2.0])
    out = image_to_uint8(values.reshape(1, 1, 7).expand(3, 1, 7))[0, :, 0]
    np.testing.assert_array_equal(out, [0, 0, 0, 1, 255, 255, 255])
