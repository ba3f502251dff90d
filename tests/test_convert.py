"""`python -m datamodules.tools.convert` and `python -m datamodules.tools.make_index`."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from data_fixtures import SHARED_DATA
from PIL import Image

from datamodules.readers.chunk_writer import ChunkWriter, camera_row, encode_bytes
from datamodules.readers.colmap import image_world_to_camera, read_model
from datamodules.tools.convert import main as convert_main
from datamodules.tools.make_index import main as index_main
from models.geometry.cameras import invert_extrinsics, project

DRONE = SHARED_DATA / "real" / "drone_colmap"


pytestmark = pytest.mark.usefixtures("one_thread")


# ---------------------------------------------------------------------------------------------
# helpers


def load_split(root: Path, split: str) -> dict[str, dict]:
    """Every scene of a converted split, loaded the way the loaders must (weights_only)."""
    index = json.loads((root / split / "index.json").read_text())
    scenes = {}
    for chunk in sorted(set(index.values())):
        for example in torch.load(root / split / chunk, weights_only=True):
            assert index[example["key"]] == chunk
            scenes[example["key"]] = example
    assert scenes.keys() == index.keys()
    return scenes


def parse_rows(cameras: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """World-to-camera [N,4,4] and normalised intrinsics [N,3,3] (float64) from camera rows."""
    rows = cameras.double()
    n = rows.shape[0]
    intrinsics = torch.zeros(n, 3, 3, dtype=torch.float64)
    intrinsics[:, 0, 0], intrinsics[:, 1, 1] = rows[:, 0], rows[:, 1]
    intrinsics[:, 0, 2], intrinsics[:, 1, 2] = rows[:, 2], rows[:, 3]
    intrinsics[:, 2, 2] = 1
    w2c = torch.eye(4, dtype=torch.float64).repeat(n, 1, 1)
    w2c[:, :3, :] = rows[:, 6:].reshape(n, 3, 4)
    return w2c, intrinsics


def decode(data: torch.Tensor) -> Image.Image:
    image = Image.open(io.BytesIO(data.numpy().tobytes()))
    assert image.format == "JPEG"
    return image


def run_convert(*args: object) -> int:
    return convert_main([str(a) for a in args] + ["quiet=true"])


def report_of(root: Path) -> dict:
    return json.loads((root / "convert_report.json").read_text())


def save_noise(path: Path, size: tuple[int, int], seed: int, mode: str = "RGB") -> None:
    """A small random image of ``size = (W, H)``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    channels = len(mode)
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (size[1], size[0], channels), dtype=np.uint8)
    if mode == "RGBA":
        pixels[..., 3] = 255
    Image.fromarray(pixels, mode).save(path)


def random_cameras(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """OpenCV camera-to-world poses looking at the origin, and pixel intrinsics [n,3,3]."""
    rng = np.random.default_rng(seed)
    c2w = np.tile(np.eye(4), (n, 1, 1))
    k = np.tile(np.eye(3), (n, 1, 1))
    for i in range(n):
        center = rng.normal(size=3)
        center = 3 * center / np.linalg.norm(center)
        forward = -center / np.linalg.norm(center)
        right = np.cross(forward, rng.normal(size=3))
        right /= np.linalg.norm(right)
        down = np.cross(forward, right)
        c2w[i, :3, :3] = np.stack([right, down, forward], axis=1)
        c2w[i, :3, 3] = center
        k[i, 0, 0], k[i, 1, 1] = rng.uniform(30, 60, size=2)
        k[i, 0, 2], k[i, 1, 2] = rng.uniform(15, 25), rng.uniform(12, 18)
    return c2w, k


def write_colmap_scene(
    folder: Path,
    model: str,
    params: list[float],
    size: tuple[int, int],
    names: list[str],
    make_images: bool = True,
) -> np.ndarray:
    """A text COLMAP scene with identity-ish poses; returns the world-to-camera matrices."""
    sparse = folder / "sparse" / "0"
    sparse.mkdir(parents=True)
    (sparse / "cameras.txt").write_text(
        f"1 {model} {size[0]} {size[1]} {' '.join(repr(float(p)) for p in params)}\n"
    )
    lines, poses = [], []
    for i, name in enumerate(names):
        angle = 0.1 * i
        qvec = [math.cos(angle / 2), 0.0, math.sin(angle / 2), 0.0]
        tvec = [0.1 * i, -0.2, 0.3]
        lines += [f"{i + 1} {' '.join(map(repr, qvec + tvec))} 1 {name}", ""]
        w2c = np.eye(4)
        c, s = math.cos(angle), math.sin(angle)
        w2c[:3, :3] = [[c, 0, s], [0, 1, 0], [-s, 0, c]]
        w2c[:3, 3] = tvec
        poses.append(w2c)
        if make_images:
            save_noise(folder / "images" / name, size, seed=i)
    (sparse / "images.txt").write_text("\n".join(lines) + "\n")
    (sparse / "points3D.txt").write_text("")
    return np.stack(poses)


# ---------------------------------------------------------------------------------------------
# the real drone COLMAP model


@pytest.fixture(scope="module")
def drone():
    """Per image (sorted by name): observed 3D points, their 2D keypoints, and the model's pose."""
    if not (DRONE / "sparse" / "images.txt").is_file():
        pytest.skip(f"real drone COLMAP model not found at {DRONE} (../shared/data)")
    cameras, images, points = read_model(DRONE / "sparse")
    assert [(c.model, c.width, c.height) for c in cameras.values()] == [("PINHOLE", 848, 480)]
    xyz_by_id = {point_id: point.xyz for point_id, point in points.items()}
    views = []
    for image in sorted(images.values(), key=lambda image: image.name):
        mask = image.point3d_ids >= 0
        xyz = torch.tensor(np.stack([xyz_by_id[int(p)] for p in image.point3d_ids[mask]]))
        views.append((xyz, torch.from_numpy(image.xys[mask]), image_world_to_camera(image)))
    return views


@pytest.mark.parametrize(
    ("resolution", "shape", "scale", "offset"),
    [
        (None, (480, 848), 1.0, (0, 0)),
        ([240, 320], (240, 320), 0.5, (52, 0)),  # 848x480 -> 424x240, centre crop of 320
    ],
)
def test_drone_colmap_reprojects(drone, tmp_path, resolution, shape, scale, offset):
    """Projecting the model's 3D points with the written rows lands on its 2D observations."""
    extra = [f"resolution={','.join(map(str, resolution))}"] if resolution else []
    out = tmp_path / "out"
    assert convert_main([str(DRONE), f"out={out}", "split=test", *extra]) == 0
    scenes = load_split(out, "test")
    assert list(scenes) == ["drone_colmap"]
    scene = scenes["drone_colmap"]
    assert scene["cameras"].dtype == torch.float32 and scene["cameras"].shape == (41, 18)
    assert scene["timestamps"].dtype == torch.int64
    assert scene["timestamps"].tolist() == list(range(41))
    assert torch.all(scene["cameras"][:, 4:6] == 0)
    assert len(scene["images"]) == 41
    for data in scene["images"][::10]:
        assert decode(data).size == (shape[1], shape[0])
    if resolution is None:  # untouched JPEGs are stored byte for byte
        original = (DRONE / "images" / "f0000.jpg").read_bytes()
        assert scene["images"][0].numpy().tobytes() == original

    w2c, intrinsics = parse_rows(scene["cameras"])
    size = torch.tensor([shape[1], shape[0]], dtype=torch.float64)
    shift = torch.tensor(offset, dtype=torch.float64)
    # The model's own float64 camera (PINHOLE f=595, c=(424, 240) in 848x480).
    k_model = torch.tensor(
        [[595 / 848, 0, 0.5], [0, 595 / 480, 0.5], [0, 0, 1]], dtype=torch.float64
    )
    errors, drift = [], []
    for i, (xyz, xys, model_w2c) in enumerate(drone):
        uv, depth = project(xyz, invert_extrinsics(w2c[i]), intrinsics[i])
        assert (depth > 0).all()
        pixels = uv * size
        errors.append((pixels - (xys * scale - shift)).norm(dim=-1))
        uv_model, _ = project(xyz, invert_extrinsics(model_w2c), k_model)
        expected = uv_model * torch.tensor([848.0, 480.0], dtype=torch.float64) * scale - shift
        drift.append((pixels - expected).norm(dim=-1))
    median = torch.cat(errors).median().item()
    print(f"drone reprojection median at {shape}: {median:.4f} px")
    assert median < 1.0 * scale
    assert torch.cat(drift).max() < 0.01 * scale  # float32 rows lose nothing that matters
    report = report_of(out)
    assert report["converted"][0]["views"] == 41 and report["skipped"] == []


# ---------------------------------------------------------------------------------------------
# transforms.json (NeRF / instant-ngp / nerfstudio / DL3DV)


@pytest.mark.parametrize("variant", ["per_frame", "shared", "camera_angle_x"])
def test_transforms_json_round_trip(tmp_path, variant):
    """A transforms.json written from known OpenCV cameras converts back to those cameras."""
    n, width, height = 5, 40, 30
    c2w, k = random_cameras(n, seed=1)
    if variant != "per_frame":
        k[:] = k[0]
    if variant == "camera_angle_x":
        k[:, 1, 1] = k[:, 0, 0]
        k[:, 0, 2], k[:, 1, 2] = width / 2, height / 2
    scene = tmp_path / "scene"
    frames = []
    for i in range(n):
        c2w_gl = c2w[i] @ np.diag([1.0, -1.0, -1.0, 1.0])  # OpenCV -> OpenGL camera axes
        stem = f"frames/r_{i}"
        frame = {"file_path": f"./{stem}", "transform_matrix": c2w_gl.tolist()}
        if variant == "per_frame":
            frame.update(fl_x=k[i, 0, 0], fl_y=k[i, 1, 1], cx=k[i, 0, 2], cy=k[i, 1, 2])
            frame.update(w=width, h=height)
        frames.append(frame)
        save_noise(scene / f"{stem}.png", (width, height), seed=i, mode="RGBA")
    meta: dict = {"frames": frames[::-1]}  # order in the file does not matter
    if variant == "shared":
        meta.update(
            fl_x=k[0, 0, 0], fl_y=k[0, 1, 1], cx=k[0, 0, 2], cy=k[0, 1, 2], w=width, h=height
        )
    if variant == "camera_angle_x":
        meta["camera_angle_x"] = 2 * math.atan(0.5 * width / k[0, 0, 0])
    (scene / "transforms.json").write_text(json.dumps(meta))

    out = tmp_path / "out"
    assert run_convert(scene, f"out={out}", "split=train") == 0
    example = load_split(out, "train")["scene"]
    w2c, intrinsics = parse_rows(example["cameras"])
    expected_k = k / np.array([[width], [height], [1.0]])
    np.testing.assert_allclose(intrinsics.numpy(), expected_k, atol=1e-6)
    np.testing.assert_allclose(w2c.numpy(), np.linalg.inv(c2w), atol=1e-5)
    assert decode(example["images"][0]).size == (width, height)


def test_dl3dv_folder_of_scenes(tmp_path):
    """DL3DV layout: scene folders with transforms.json naming images/ but shipping images_4/."""
    root = tmp_path / "DL3DV-10K" / "1K"
    declared = (160, 120)
    for s, key in enumerate(["0a1b2c", "ff00ee"]):
        c2w, k = random_cameras(3, seed=10 + s)
        frames = []
        for i in range(3):
            name = f"frame_{i + 1:05d}.png"
            save_noise(root / key / "images_4" / name, (40, 30), seed=i)
            c2w_gl = c2w[i] @ np.diag([1.0, -1.0, -1.0, 1.0])
            frames.append({"file_path": f"images/{name}", "transform_matrix": c2w_gl.tolist()})
        meta = {
            "w": declared[0],
            "h": declared[1],
            "fl_x": 4 * k[0, 0, 0],
            "fl_y": 4 * k[0, 1, 1],
            "cx": 80.0,
            "cy": 60.0,
            "camera_model": "OPENCV",
            "k1": 0.0,
            "k2": 0.0,
            "p1": 0.0,
            "p2": 0.0,
            "frames": frames,
        }
        (root / key / "transforms.json").write_text(json.dumps(meta))
    out = tmp_path / "out"
    assert run_convert(tmp_path / "DL3DV-10K", f"out={out}", "split=test") == 0
    scenes = load_split(out, "test")
    assert sorted(scenes) == ["0a1b2c", "ff00ee"]
    _, intrinsics = parse_rows(scenes["0a1b2c"]["cameras"])
    _, k = random_cameras(3, seed=10)
    np.testing.assert_allclose(intrinsics[0, 0, 0].item(), 4 * k[0, 0, 0] / 160, rtol=1e-6)
    np.testing.assert_allclose(intrinsics[0, :2, 2].numpy(), [0.5, 0.5], atol=1e-7)
    assert decode(scenes["ff00ee"]["images"][2]).size == (40, 30)
    notes = report_of(out)["converted"][0]["notes"]
    assert any("40x30" in note and "160x120" in note for note in notes)


# ---------------------------------------------------------------------------------------------
# RealEstate10K raw metadata


def write_re10k(folder: Path, key: str, n: int, seed: int, frame_names: str = "timestamp"):
    """KEY.txt plus frames; returns (url, timestamps, float32 rows [n, 18])."""
    rng = np.random.default_rng(seed)
    c2w, k = random_cameras(n, seed)
    rows = np.zeros((n, 18), dtype=np.float32)
    rows[:, 0], rows[:, 1] = k[:, 0, 0] / 40, k[:, 1, 1] / 30
    rows[:, 2], rows[:, 3] = k[:, 0, 2] / 40, k[:, 1, 2] / 30
    rows[:, 6:] = np.linalg.inv(c2w)[:, :3, :].reshape(n, 12)
    timestamps = np.sort(rng.choice(10**8, size=n, replace=False)).astype(np.int64)
    url = f"https://www.youtube.com/watch?v={key}"
    lines = [url] + [
        " ".join([str(t)] + [repr(float(v)) for v in row]) for t, row in zip(timestamps, rows)
    ]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{key}.txt").write_text("\n".join(lines) + "\n")
    for i, t in enumerate(timestamps):
        name = f"{t}.png" if frame_names == "timestamp" else f"{i:05d}.jpg"
        save_noise(folder / key / name, (40, 30), seed=i)
    return url, timestamps, rows


def test_re10k_raw_converts_to_same_rows(tmp_path):
    root = tmp_path / "RealEstate10K"
    expected = {
        "aaaa1111": write_re10k(root / "test", "aaaa1111", 6, seed=3),
        "bbbb2222": write_re10k(root / "test", "bbbb2222", 4, seed=4, frame_names="index"),
    }
    write_re10k(root / "train", "cccc3333", 3, seed=5)  # other split: not picked up
    out = tmp_path / "out"
    assert run_convert(root, f"out={out}", "split=test") == 0
    scenes = load_split(out, "test")
    assert sorted(scenes) == sorted(expected)
    for key, (url, timestamps, rows) in expected.items():
        assert scenes[key]["url"] == url
        assert scenes[key]["timestamps"].tolist() == timestamps.tolist()
        torch.testing.assert_close(scenes[key]["cameras"], torch.from_numpy(rows), rtol=0, atol=0)
        assert len(scenes[key]["images"]) == len(rows)
    # A single .txt is one scene; key= renames it; resolution= keeps normalised intrinsics.
    out2 = tmp_path / "out2"
    args = [root / "test" / "aaaa1111.txt", f"out={out2}", "split=test", "key=mine"]
    assert run_convert(*args, "resolution=20") == 0
    mine = load_split(out2, "test")["mine"]
    assert decode(mine["images"][0]).size == (20, 15)
    torch.testing.assert_close(mine["cameras"], torch.from_numpy(expected["aaaa1111"][2]))


# ---------------------------------------------------------------------------------------------
# failures and the report


def test_failures_are_reported(tmp_path):
    src = tmp_path / "captures"
    write_colmap_scene(src / "good", "PINHOLE", [50, 50, 20, 15], (40, 30), ["a.png", "b.png"])
    write_colmap_scene(src / "missing", "PINHOLE", [50, 50, 20, 15], (40, 30), ["a.png", "b.png"])
    (src / "missing" / "images" / "b.png").unlink()
    write_colmap_scene(
        src / "fisheye", "OPENCV_FISHEYE", [50, 50, 20, 15, 0.1, 0, 0, 0], (40, 30), ["a.png"]
    )
    write_colmap_scene(src / "wrongsize", "PINHOLE", [50, 50, 20, 15], (40, 30), ["a.png"])
    save_noise(src / "wrongsize" / "images" / "a.png", (30, 30), seed=0)
    write_colmap_scene(
        src / "distorted", "OPENCV", [50, 50, 20, 15, -0.1, 0, 0, 0], (40, 30), ["a.png"]
    )
    _, _, rows = write_re10k(src, "nanpose", 3, seed=6)
    text = (src / "nanpose.txt").read_text().splitlines()
    text[2] = " ".join(text[2].split()[:10] + ["nan"] + text[2].split()[11:])
    (src / "nanpose.txt").write_text("\n".join(text) + "\n")
    skewed = src / "skewed"
    save_noise(skewed / "x.png", (40, 30), seed=0)
    matrix = np.diag([2.0, 2.0, 2.0, 1.0]).tolist()  # a scale is not a camera pose
    (skewed / "transforms.json").write_text(
        json.dumps(
            {"camera_angle_x": 1.0, "frames": [{"file_path": "x.png", "transform_matrix": matrix}]}
        )
    )

    out = tmp_path / "out"
    assert run_convert(src, f"out={out}", "split=train", "undistort=false") == 0
    report = report_of(out)
    assert [c["key"] for c in report["converted"]] == ["good"]
    reasons = {s["key"]: s["reason"] for s in report["skipped"]}
    assert sorted(reasons) == ["distorted", "fisheye", "missing", "nanpose", "skewed", "wrongsize"]
    assert "missing image" in reasons["missing"] and "b.png" in reasons["missing"]
    assert "unsupported camera model OPENCV_FISHEYE" in reasons["fisheye"]
    assert "30x30" in reasons["wrongsize"] and "40x30" in reasons["wrongsize"]
    assert "OPENCV" in reasons["distorted"] and "undistort=false" in reasons["distorted"]
    assert "non-finite" in reasons["nanpose"]
    assert "not a rigid transform" in reasons["skewed"]
    assert list(load_split(out, "train")) == ["good"]


def test_nothing_converted_exits_2(tmp_path, capsys):
    src = tmp_path / "one"
    write_colmap_scene(src, "PINHOLE", [50, 50, 20, 15], (40, 30), ["a.png"], make_images=False)
    (src / "images").mkdir()
    out = tmp_path / "out"
    assert run_convert(src, f"out={out}", "split=train") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "nothing converted" in err and "missing image" in err
    assert not (out / "train").exists()  # no half-written split
    assert report_of(out)["skipped"][0]["key"] == "one"

    (tmp_path / "empty").mkdir()
    assert run_convert(tmp_path / "empty", f"out={out}", "split=train") == 2
    assert "no scenes found" in capsys.readouterr().err
    assert run_convert(tmp_path / "nope", f"out={out}", "split=train") == 2
    assert "no such file" in capsys.readouterr().err


def test_undistortion_moves_pixels_to_the_pinhole_projection(tmp_path):
    """OPENCV distortion: blobs drawn at distorted positions end where the stored camera says."""
    width, height, f, cx, cy = 160, 120, 100.0, 80.0, 60.0
    coeffs = [-0.25, 0.05, 0.002, -0.001]
    points = np.array([[-0.6, -0.4], [0.55, -0.35], [-0.5, 0.4], [0.6, 0.45], [0.1, 0.05]])
    x, y = points[:, 0], points[:, 1]
    r2 = x * x + y * y
    radial = 1 + coeffs[0] * r2 + coeffs[1] * r2 * r2
    xd = x * radial + 2 * coeffs[2] * x * y + coeffs[3] * (r2 + 2 * x * x)
    yd = y * radial + coeffs[2] * (r2 + 2 * y * y) + 2 * coeffs[3] * x * y
    distorted = np.stack([f * xd + cx, f * yd + cy], axis=1)
    pinhole = np.stack([f * x + cx, f * y + cy], axis=1)
    assert np.linalg.norm(distorted - pinhole, axis=1)[:4].min() > 3  # the test can fail
    us, vs = np.meshgrid(np.arange(width) + 0.5, np.arange(height) + 0.5)
    canvas = np.zeros((height, width))
    for u, v in distorted:
        canvas += np.exp(-((us - u) ** 2 + (vs - v) ** 2) / (2 * 1.5**2))
    scene = tmp_path / "cam"
    write_colmap_scene(scene, "OPENCV", [f, f, cx, cy, *coeffs], (width, height), ["a.png"])
    pixels = (np.clip(canvas, 0, 1) * 255).round().astype(np.uint8)
    Image.fromarray(np.repeat(pixels[..., None], 3, axis=2)).save(scene / "images" / "a.png")

    out = tmp_path / "out"
    assert run_convert(scene, f"out={out}", "split=test") == 0
    example = load_split(out, "test")["cam"]
    _, intrinsics = parse_rows(example["cameras"])
    np.testing.assert_allclose(
        intrinsics[0].numpy(),
        [[f / width, 0, cx / width], [0, f / height, cy / height], [0, 0, 1]],
        atol=1e-6,
    )
    result = np.asarray(decode(example["images"][0]).convert("L"), dtype=np.float64)
    for u, v in pinhole:
        r, c = int(v), int(u)
        window = result[r - 5 : r + 6, c - 5 : c + 6]
        weights = np.clip(window - 20, 0, None)
        centroid_u = (weights * us[r - 5 : r + 6, c - 5 : c + 6]).sum() / weights.sum()
        centroid_v = (weights * vs[r - 5 : r + 6, c - 5 : c + 6]).sum() / weights.sum()
        assert math.hypot(centroid_u - u, centroid_v - v) < 0.3
    assert "undistorted to a pinhole camera" in report_of(out)["converted"][0]["notes"]


def test_chunk_size_and_append(tmp_path):
    src = tmp_path / "re10k"
    for i in range(3):
        write_re10k(src, f"scene{i}", 4, seed=20 + i)
    out = tmp_path / "out"
    assert run_convert(src, f"out={out}", "split=train", "chunk_mb=0.004") == 0
    index = json.loads((out / "train" / "index.json").read_text())
    assert sorted(index) == ["scene0", "scene1", "scene2"]
    assert len(set(index.values())) > 1
    first = load_split(out, "train")
    # A second run appends: numbering continues, the index is merged, duplicates are refused.
    more = tmp_path / "more"
    write_re10k(more, "scene9", 2, seed=30)
    write_re10k(more, "scene0", 2, seed=31)
    assert run_convert(more, f"out={out}", "split=train") == 0
    index2 = json.loads((out / "train" / "index.json").read_text())
    assert sorted(index2) == ["scene0", "scene1", "scene2", "scene9"]
    assert index2["scene9"] not in index.values()
    assert "duplicate key" in report_of(out)["skipped"][0]["reason"]
    second = load_split(out, "train")
    torch.testing.assert_close(second["scene0"]["cameras"], first["scene0"]["cameras"])
    assert run_convert(more / "scene0.txt", f"out={out}", "split=train") == 2


# ---------------------------------------------------------------------------------------------
# make_index


def write_lengths(root: Path, lengths: dict[str, int]) -> None:
    writer = ChunkWriter(root, "test", chunk_mb=0.0001)
    row = camera_row(torch.eye(3), torch.eye(4))
    for key, n in lengths.items():
        writer.add(
            {
                "key": key,
                "url": "",
                "timestamps": torch.arange(n),
                "cameras": row.repeat(n, 1),
                "images": [encode_bytes(b"\xff") for _ in range(n)],
            }
        )
    writer.close()


def test_make_index(tmp_path):
    lengths = {"short": 8, "mid": 40, "long": 300, "huge": 1000}
    write_lengths(tmp_path / "a", lengths)
    args = ["context=2", "gap=10,60", "targets=3", "seed=7"]
    assert index_main([str(tmp_path / "a"), *args]) == 0
    index = json.loads((tmp_path / "a" / "evaluation_index_test.json").read_text())
    assert list(index) == list(lengths) and index["short"] is None
    for key in ("mid", "long", "huge"):
        (start, end), targets = index[key]["context"], index[key]["target"]
        assert 10 <= end - start <= min(60, lengths[key] - 1) and 0 <= start and end < lengths[key]
        assert len(targets) == 3 and targets == sorted(set(targets))
        assert all(start <= t <= end for t in targets)
    # Deterministic, independent of the other scenes, and the seed matters.
    write_lengths(tmp_path / "b", {"long": 300})
    out_b = tmp_path / "b.json"
    assert index_main([str(tmp_path / "b"), *args, f"out={out_b}"]) == 0
    assert json.loads(out_b.read_text())["long"] == index["long"]
    seeds = []
    for seed in range(4):
        args_s = ["gap=10,60", f"seed={seed}", f"out={out_b}"]
        assert index_main([str(tmp_path / "a"), *args_s]) == 0
        seeds.append(json.loads(out_b.read_text())["huge"])
    assert len({json.dumps(s) for s in seeds}) > 1
    # More context views are spread over the window; exclude_context keeps targets apart.
    args3 = ["context=3", "gap=20,20", "targets=5", "exclude_context=true"]
    assert index_main([str(tmp_path / "a"), *args3, f"out={out_b}"]) == 0
    entry = json.loads(out_b.read_text())["mid"]
    start = entry["context"][0]
    assert entry["context"] == [start, start + 10, start + 20]
    assert not set(entry["target"]) & set(entry["context"])
    assert index_main([str(tmp_path / "missing"), "gap=1,2"]) == 2


def test_make_index_arguments_are_checked(tmp_path, capsys):
    """The one parser's checks (models.core.command_line): one line, exit 2, nothing written."""
    write_lengths(tmp_path / "a", {"long": 300})
    for argv, expected in (
        (["gap=1,2,3"], "gap=1,2,3: must be 2 items"),
        (["gap=a,2"], "gap=a,2: must be a whole number"),
        (["gap=0,2"], "must be at least 1"),
        (["--gap", "1", "2"], "--gap: not a setting"),
        ([], "gap: missing gap=..."),
        (["gap=1,2", "contxt=2"], "did you mean context?"),
    ):
        capsys.readouterr()
        assert index_main([str(tmp_path / "a"), *argv]) == 2, argv
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and expected in lines[0], (argv, lines)
    assert not (tmp_path / "a" / "evaluation_index_test.json").exists()
