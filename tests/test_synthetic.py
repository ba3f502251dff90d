"""Synthetic scene generator: chunk format, determinism, round trip and multi-view consistency."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from datamodules import read_scene
from datamodules.readers.chunks import load_chunk, load_index
from datamodules.synthetic import (
    SCENE_DEPTH_RANGE,
    SyntheticSettings,
    depth_fits,
    generate_dataset,
    generate_scene,
    main,
    sample_scene,
)
from models.geometry.cameras import (
    intrinsics_to_normalized,
    intrinsics_to_pixels,
    pixel_grid,
    project,
    unproject,
)

RES, VIEWS = 32, 24


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("synthetic") / "data"
    code = main(
        ["--out", str(out), "--scenes", "5", "--resolution", str(RES), "--views", str(VIEWS),
         "--seed", "3", "--test-fraction", "0.4", "--quiet"]
    )  # fmt: skip
    assert code == 0
    return out


def consistency(scene: dict, a: int, b: int, tolerance: float = 0.01) -> tuple[float, float, float]:
    """Reproject view ``a``'s GT depth into view ``b``.

    ``b``'s depth is sampled bilinearly in inverse depth (exact on planes) at the projections.

    Returns:
        For the points landing inside ``b``: the median relative depth error, the fraction that
        agrees within ``tolerance`` (the rest: occlusions and edges) and the median colour
        difference of the agreeing points.
    """
    depth, image = scene["depth"], scene["image"]
    height, width = depth.shape[-2:]
    coords = pixel_grid((height, width)).reshape(-1, 2)  # [P, 2]
    points = unproject(
        coords, depth[a].reshape(-1), scene["intrinsics"][a], scene["extrinsics"][a]
    )  # [P, 3]
    uv, z = project(points, scene["extrinsics"][b], scene["intrinsics"][b])
    inside = (z > 0) & (uv > 0).all(-1) & (uv < 1).all(-1)
    assert inside.float().mean() > 0.3, "views barely overlap"
    grid = (uv[inside] * 2 - 1)[None, None]  # [1, 1, P', 2]
    inverse = F.grid_sample(1 / depth[b][None, None], grid, align_corners=False)[0, 0, 0]
    error = (1 / inverse - z[inside]).abs() / z[inside]
    agree = error < tolerance
    colors_b = F.grid_sample(image[b][None], grid, align_corners=False)[0, :, 0]  # [3, P']
    colors_a = image[a].reshape(3, -1)[:, inside]
    color = (colors_a - colors_b)[:, agree].abs().median().item()
    return error.median().item(), agree.float().mean().item(), color


def test_cli_writes_chunk_format(dataset: Path) -> None:
    meta = json.loads((dataset / "metadata.json").read_text())
    assert meta["resolution"] == RES and meta["views"] == VIEWS and meta["kind"] == "room"
    train, test = load_index(dataset, "train"), load_index(dataset, "test")
    assert len(train) == 3 and len(test) == 2 and not set(train) & set(test)
    chunk = load_chunk(dataset / "train" / train[next(iter(train))])
    scene = chunk[0]
    assert scene["cameras"].shape == (VIEWS, 18) and scene["cameras"].dtype == torch.float32
    assert scene["timestamps"].dtype == torch.int64 and scene["timestamps"].shape == (VIEWS,)
    assert len(scene["images"]) == len(scene["depths"]) == VIEWS
    assert (scene["cameras"][:, 4:6] == 0).all()
    image = Image.open(io.BytesIO(scene["images"][0].numpy().tobytes()))
    assert image.format == "JPEG" and image.size == (RES, RES)
    depth_png = Image.open(io.BytesIO(scene["depths"][0].numpy().tobytes()))
    assert depth_png.format == "PNG" and np.asarray(depth_png).dtype == np.uint16
    assert isinstance(scene["depth_scale"], float) and scene["depth_scale"] > 0

    index = json.loads((dataset / "evaluation_index.json").read_text())
    assert set(index) == set(test)
    for entry in index.values():
        first, last = entry["context"]
        assert 0 <= first < last < VIEWS and 9 <= last - first <= 16
        assert len(entry["target"]) == 3 and all(first < t < last for t in entry["target"])


def test_deterministic_and_independent_of_workers(dataset: Path, tmp_path: Path) -> None:
    settings = SyntheticSettings(scenes=5, resolution=RES, views=VIEWS, seed=3, test_fraction=0.4)
    again = generate_dataset(tmp_path / "again", settings, workers=2, progress=False)
    for split in ("train", "test"):
        assert load_index(again, split) == load_index(dataset, split)
        for key in load_index(dataset, split):
            a, b = read_scene(dataset, split, key), read_scene(again, split, key)
            assert torch.equal(a["image"], b["image"]) and torch.equal(a["depth"], b["depth"])
            assert torch.equal(a["extrinsics"], b["extrinsics"])


def test_train_and_test_scenes_use_distinct_seeds() -> None:
    settings = SyntheticSettings(scenes=4, resolution=16, views=4, seed=0)
    train, test = generate_scene("train", 0, settings), generate_scene("test", 0, settings)
    assert train["key"] != test["key"]
    assert not np.allclose(train["cameras"], test["cameras"])
    other_seed = generate_scene("train", 0, SyntheticSettings(resolution=16, views=4, seed=1))
    assert not np.allclose(train["cameras"], other_seed["cameras"])


def test_round_trip_cameras_and_intrinsics(dataset: Path) -> None:
    key = next(iter(load_index(dataset, "train")))
    scene = read_scene(dataset, "train", key)
    chunk = load_chunk(dataset / "train" / load_index(dataset, "train")[key])
    rows = next(s for s in chunk if s["key"] == key)["cameras"]
    assert scene["image"].shape == (VIEWS, 3, RES, RES)
    assert 0 <= scene["image"].min() and scene["image"].max() <= 1
    assert scene["image"].std() > 0.05  # textured, not blank

    # camera-to-world is the inverse of the stored world-to-camera row
    w2c = torch.eye(4).repeat(VIEWS, 1, 1)
    w2c[:, :3, :4] = rows[:, 6:].reshape(VIEWS, 3, 4)
    assert torch.allclose(scene["extrinsics"] @ w2c, torch.eye(4).expand(VIEWS, 4, 4), atol=1e-5)
    rotation = scene["extrinsics"][:, :3, :3]
    assert torch.allclose(rotation @ rotation.mT, torch.eye(3).expand(VIEWS, 3, 3), atol=1e-5)

    # normalised <-> pixel intrinsics; fields of view 50-90 degrees, square pixels
    k = scene["intrinsics"]
    assert torch.allclose(k[:, 0, 0], rows[:, 0]) and torch.allclose(k[:, 1, 2], rows[:, 3])
    pixels = intrinsics_to_pixels(k, (RES, RES))
    assert torch.allclose(pixels[:, 0, 0], k[:, 0, 0] * RES)
    assert torch.allclose(intrinsics_to_normalized(pixels, (RES, RES)), k)
    fov = torch.rad2deg(2 * torch.atan(0.5 / k[:, 0, 0]))
    assert ((fov >= 50) & (fov <= 90)).all()
    assert (scene["depth"] > 0).all() and scene["depth"].shape == (VIEWS, RES, RES)


def test_depth_is_multi_view_consistent(dataset: Path) -> None:
    key = next(iter(load_index(dataset, "test")))
    scene = read_scene(dataset, "test", key)
    for a, b in [(0, 8), (5, 19), (23, 12)]:
        error, agree, color = consistency(scene, a, b)
        assert error < 2e-3 and agree > 0.6, (a, b, error, agree)  # the rest: edges, occlusion
        assert color < 0.06, (a, b, color)
    # the check can fail: a camera turned by 3 degrees breaks it
    angle = torch.tensor(3.0).deg2rad()
    turn = torch.eye(3)
    turn[0, 0] = turn[2, 2] = angle.cos()
    turn[0, 2], turn[2, 0] = angle.sin(), -angle.sin()
    moved = dict(scene, extrinsics=scene["extrinsics"].clone())
    moved["extrinsics"][8, :3, :3] = scene["extrinsics"][8, :3, :3] @ turn
    error, agree, _ = consistency(moved, 0, 8)
    assert error > 1e-2 and agree < 0.5


def test_depth_range_guarantee(dataset: Path) -> None:
    for split in ("train", "test"):
        for key in load_index(dataset, split):
            scene = read_scene(dataset, split, key)
            assert depth_fits(scene["extrinsics"].double().numpy(), scene["depth"].numpy())
            centers = scene["extrinsics"][:, :3, 3]
            for i in range(VIEWS - 8):
                scaled = scene["depth"][[i, i + 8]] / (centers[i] - centers[i + 8]).norm()
                assert SCENE_DEPTH_RANGE[0] <= scaled.min() and scaled.max() <= SCENE_DEPTH_RANGE[1]


def test_object_scenes_orbit_a_ground_plane() -> None:
    settings = SyntheticSettings(resolution=24, views=12, kind="object", seed=2, supersample=1)
    scene = generate_scene("train", 0, settings)
    spec = sample_scene([2, 0, 0], "object", 12)
    assert 3 <= len(spec.primitives) <= 8
    centers = spec.extrinsics[:, :3, 3]
    radius = np.hypot(centers[:, 0], centers[:, 2])
    assert radius.min() > 3.0 and radius.max() < 5.1 and (centers[:, 1] > 0).all()
    forward = spec.extrinsics[:, :3, 2]
    to_origin = -centers / np.linalg.norm(centers, axis=1, keepdims=True)
    assert ((forward * to_origin).sum(1) > 0.9).all()  # looking at the objects
    assert len(scene["images"]) == 12 and scene["depth_scale"] * 65534 < 40  # inside the dome


def test_room_camera_walk_is_smooth() -> None:
    spec = sample_scene([0, 0, 7], "room", 24)
    centers = spec.extrinsics[:, :3, 3]
    steps = np.linalg.norm(np.diff(centers, axis=0), axis=1)
    assert steps.min() > 0.02 and steps.max() < 1.5 * steps.min() + 0.02
    forward = spec.extrinsics[:, :3, 2]
    turn = np.degrees(np.arccos(np.clip((forward[:-1] * forward[1:]).sum(1), -1, 1)))
    assert turn.max() < 5.0  # small rotations per frame
    low, high = spec.bounds
    assert ((centers > low + 0.5) & (centers < high - 0.5)).all()


def test_bad_output_folder_is_refused(tmp_path: Path, capsys) -> None:
    (tmp_path / "keep.txt").write_text("mine")
    code = main(
        ["--out", str(tmp_path), "--scenes", "2", "--resolution", "16", "--views", "4", "--quiet"]
    )
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(tmp_path) in err
    assert (tmp_path / "keep.txt").read_text() == "mine"
    assert main(["--out", str(tmp_path / "x"), "--scenes", "1", "--quiet"]) == 2
    assert not (tmp_path / "x").exists()
