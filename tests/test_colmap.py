"""COLMAP model readers: the real drone model (COLMAP 4 text), a binary round trip, camera models."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from data_fixtures import SHARED_DATA

from datamodules.readers.colmap import (
    camera_distortion,
    camera_intrinsics,
    camera_intrinsics_pixels,
    find_model_dir,
    image_world_to_camera,
    read_cameras_text,
    read_colmap_points,
    read_frames_text,
    read_images_text,
    read_model,
    read_rigs_text,
)
from datamodules.readers.colmap_records import (
    CAMERA_MODELS,
    Camera,
    ColmapError,
    UnsupportedCameraError,
)
from models.geometry.cameras import invert_extrinsics, project
from models.geometry.rotations import matrix_to_quaternion, quaternion_to_matrix

DRONE = SHARED_DATA / "real" / "drone_colmap"


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def drone_model():
    if not (DRONE / "sparse" / "images.txt").is_file():
        pytest.skip(f"real drone COLMAP model not found at {DRONE} (../shared/data)")
    return read_model(DRONE / "sparse")


def test_drone_text_model(drone_model):
    cameras, images, points = drone_model
    assert list(cameras) == [1]
    camera = cameras[1]
    assert (camera.model, camera.width, camera.height) == ("PINHOLE", 848, 480)
    np.testing.assert_allclose(camera.params, [595, 595, 424, 240])
    assert len(images) == 41
    assert sorted(image.name for image in images.values()) == [
        f"f{i:04d}.jpg" for i in range(0, 321, 8)
    ]
    assert len(points) == 13433  # the header's "Number of points"
    for image in images.values():
        assert image.xys.shape == (len(image.point3d_ids), 2)
        observed = image.point3d_ids[image.point3d_ids >= 0]
        assert len(observed) > 100
        assert all(int(i) in points for i in observed)
    # Tracks point back at observations of the same point.
    point = points[next(iter(points))]
    for image_id, idx in zip(point.image_ids, point.point2d_idxs):
        assert images[int(image_id)].point3d_ids[idx] == point.id


def test_drone_colmap4_frames_match_images(drone_model):
    """COLMAP 4: a one-camera rig's frame pose (rig_from_world) is the image's cam_from_world."""
    _, images, _ = drone_model
    rigs = read_rigs_text(DRONE / "sparse" / "rigs.txt")
    frames = read_frames_text(DRONE / "sparse" / "frames.txt")
    assert rigs == {1: {"ref_sensor": ("CAMERA", 1), "sensors": []}}
    assert len(frames) == 41
    for frame in frames.values():
        (sensor_type, sensor_id, image_id) = frame["data_ids"][0]
        assert (sensor_type, sensor_id) == ("CAMERA", 1)
        np.testing.assert_allclose(frame["qvec"], images[image_id].qvec)
        np.testing.assert_allclose(frame["tvec"], images[image_id].tvec)


def test_drone_reprojection_with_helpers(drone_model):
    """camera_intrinsics + image_world_to_camera + models.geometry.cameras.project land on the keypoints."""
    cameras, images, points = drone_model
    errors = []
    for image in images.values():
        mask = image.point3d_ids >= 0
        xyz = torch.tensor(np.stack([points[int(i)].xyz for i in image.point3d_ids[mask]]))
        camera = cameras[image.camera_id]
        extrinsics = invert_extrinsics(image_world_to_camera(image))
        uv, depth = project(xyz, extrinsics, camera_intrinsics(camera))
        assert (depth > 0).all()
        pixels = uv * torch.tensor([camera.width, camera.height], dtype=torch.float64)
        errors.append((pixels - torch.from_numpy(image.xys[mask])).norm(dim=-1))
    assert torch.cat(errors).median() < 1.0


def _write_binary_model(folder: Path, cameras, images, points) -> None:
    """COLMAP's binary layout, written independently of the reader under test."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "cameras.bin", "wb") as f:
        f.write(struct.pack("<Q", len(cameras)))
        for cam in cameras.values():
            f.write(
                struct.pack("<IiQQ", cam.id, CAMERA_MODELS[cam.model][0], cam.width, cam.height)
            )
            f.write(struct.pack(f"<{len(cam.params)}d", *cam.params))
    with open(folder / "images.bin", "wb") as f:
        f.write(struct.pack("<Q", len(images)))
        for img in images.values():
            f.write(struct.pack("<I7dI", img.id, *img.qvec, *img.tvec, img.camera_id))
            f.write(img.name.encode() + b"\x00")
            f.write(struct.pack("<Q", len(img.xys)))
            for (x, y), pid in zip(img.xys, img.point3d_ids):
                f.write(struct.pack("<ddq", x, y, pid))
    with open(folder / "points3D.bin", "wb") as f:
        f.write(struct.pack("<Q", len(points)))
        for p in points.values():
            f.write(struct.pack("<Q3d3Bd", p.id, *p.xyz, *p.rgb, p.error))
            f.write(struct.pack("<Q", len(p.image_ids)))
            for image_id, idx in zip(p.image_ids, p.point2d_idxs):
                f.write(struct.pack("<II", image_id, idx))


def test_binary_model_matches_text(drone_model, tmp_path):
    cameras, images, points = drone_model
    some_points = dict(list(points.items())[:500])
    _write_binary_model(tmp_path / "sparse" / "0", cameras, images, some_points)
    # Both formats present: binary wins by default; the scene folder is searched for sparse/0.
    (tmp_path / "sparse" / "0" / "cameras.txt").write_text("1 PINHOLE 1 1 1 1 0 0\n")
    assert find_model_dir(tmp_path) == tmp_path / "sparse" / "0"
    cams_b, imgs_b, pts_b = read_model(tmp_path)
    assert cams_b.keys() == cameras.keys()
    np.testing.assert_array_equal(cams_b[1].params, cameras[1].params)
    assert (cams_b[1].model, cams_b[1].width, cams_b[1].height) == ("PINHOLE", 848, 480)
    assert imgs_b.keys() == images.keys()
    for image_id, image in images.items():
        other = imgs_b[image_id]
        assert (other.name, other.camera_id) == (image.name, image.camera_id)
        np.testing.assert_array_equal(other.qvec, image.qvec)
        np.testing.assert_array_equal(other.tvec, image.tvec)
        np.testing.assert_array_equal(other.xys, image.xys)
        np.testing.assert_array_equal(other.point3d_ids, image.point3d_ids)
    assert pts_b.keys() == some_points.keys()
    for point_id, point in some_points.items():
        np.testing.assert_array_equal(pts_b[point_id].xyz, point.xyz)
        np.testing.assert_array_equal(pts_b[point_id].rgb, point.rgb)
        np.testing.assert_array_equal(pts_b[point_id].image_ids, point.image_ids)
        np.testing.assert_array_equal(pts_b[point_id].point2d_idxs, point.point2d_idxs)


def test_read_colmap_points_from_a_scene_folder(drone_model, tmp_path):
    cameras, images, points = drone_model
    some = dict(list(points.items())[:40])
    _write_binary_model(tmp_path / "sparse" / "0", cameras, images, some)
    xyz, rgb = read_colmap_points(tmp_path, min_points=2)
    assert xyz.dtype == torch.float64 and rgb.dtype == torch.float32
    np.testing.assert_array_equal(xyz.numpy(), np.stack([p.xyz for p in some.values()]))
    np.testing.assert_allclose(rgb.numpy() * 255, np.stack([p.rgb for p in some.values()]))
    with pytest.raises(ColmapError, match="fewer than 41 points"):
        read_colmap_points(tmp_path, min_points=41)
    with pytest.raises(ColmapError, match="no COLMAP model"):
        read_colmap_points(tmp_path / "nowhere")
    _write_binary_model(tmp_path / "empty", cameras, images, {})
    (tmp_path / "empty" / "points3D.bin").unlink()
    assert read_colmap_points(tmp_path / "empty")[0].shape == (0, 3)
    with pytest.raises(ColmapError, match="has no points3D file"):
        read_colmap_points(tmp_path / "empty", min_points=2)


def test_truncated_binary_raises(drone_model, tmp_path):
    cameras, images, _ = drone_model
    _write_binary_model(tmp_path, cameras, images, {})
    data = (tmp_path / "images.bin").read_bytes()
    (tmp_path / "images.bin").write_bytes(data[: len(data) // 2])
    with pytest.raises(ColmapError, match="truncated"):
        read_model(tmp_path)


def test_images_text_with_empty_points_line(tmp_path):
    path = tmp_path / "images.txt"
    path.write_text(
        "# Image list with two lines of data per image:\n"
        "1 1 0 0 0 0.5 0 0 1 a.png\n"
        "\n"
        "2 0.7071067811865476 0 0.7071067811865476 0 1 2 3 1 sub dir/b 2.png\n"
        "10.5 20.25 7 30 40 -1\n"
    )
    images = read_images_text(path)
    assert sorted(images) == [1, 2]
    assert images[1].xys.shape == (0, 2) and images[1].name == "a.png"
    assert images[2].name == "sub dir/b 2.png"  # names may contain spaces
    np.testing.assert_array_equal(images[2].xys, [[10.5, 20.25], [30, 40]])
    np.testing.assert_array_equal(images[2].point3d_ids, [7, -1])
    w2c = image_world_to_camera(images[2]).numpy()
    # 90 degrees about y: camera x axis = world -z.
    np.testing.assert_allclose(w2c[:3, :3], [[0, 0, 1], [0, 1, 0], [-1, 0, 0]], atol=1e-12)
    np.testing.assert_allclose(w2c[:3, 3], [1, 2, 3])


@pytest.mark.parametrize(
    ("model", "params", "pinhole", "coeffs"),
    [
        ("SIMPLE_PINHOLE", [500, 320, 240], [500, 500, 320, 240], [0] * 8),
        ("PINHOLE", [500, 510, 321, 239], [500, 510, 321, 239], [0] * 8),
        ("SIMPLE_RADIAL", [500, 320, 240, 0.1], [500, 500, 320, 240], [0.1] + [0] * 7),
        ("RADIAL", [500, 320, 240, 0.1, -0.02], [500, 500, 320, 240], [0.1, -0.02] + [0] * 6),
        (
            "OPENCV",
            [500, 510, 320, 240, 0.1, -0.02, 0.001, 0.002],
            [500, 510, 320, 240],
            [0.1, -0.02, 0.001, 0.002, 0, 0, 0, 0],
        ),
    ],
)
def test_camera_models(tmp_path, model, params, pinhole, coeffs):
    path = tmp_path / "cameras.txt"
    path.write_text(f"# comment\n3 {model} 640 480 {' '.join(map(str, params))}\n")
    camera = read_cameras_text(path)[3]
    fx, fy, cx, cy = pinhole
    np.testing.assert_allclose(
        camera_intrinsics_pixels(camera).numpy(), [[fx, 0, cx], [0, fy, cy], [0, 0, 1]]
    )
    np.testing.assert_allclose(
        camera_intrinsics(camera).numpy(),
        [[fx / 640, 0, cx / 640], [0, fy / 480, cy / 480], [0, 0, 1]],
    )
    np.testing.assert_allclose(camera_distortion(camera), coeffs)


def test_unsupported_and_malformed_cameras(tmp_path):
    fisheye = Camera(1, "OPENCV_FISHEYE", 640, 480, np.array([500, 500, 320, 240, 0.1, 0, 0, 0]))
    with pytest.raises(UnsupportedCameraError, match="OPENCV_FISHEYE"):
        camera_intrinsics(fisheye)
    with pytest.raises(UnsupportedCameraError, match="OPENCV_FISHEYE"):
        camera_distortion(fisheye)
    path = tmp_path / "cameras.txt"
    path.write_text("1 PINHOLE 640 480 500 500 320\n")
    with pytest.raises(ColmapError, match="3 parameters, expected 4"):
        read_cameras_text(path)
    path.write_text("1 NOT_A_MODEL 640 480 500\n")
    with pytest.raises(UnsupportedCameraError, match="NOT_A_MODEL"):
        read_cameras_text(path)
    with pytest.raises(ColmapError, match="no COLMAP model"):
        read_model(tmp_path / "nowhere")


def test_quaternion_round_trip():
    rng = np.random.default_rng(0)
    for _ in range(20):
        q = rng.normal(size=4)
        q = q / np.linalg.norm(q) * np.sign(q[0])
        rotation = quaternion_to_matrix(torch.from_numpy(q)).numpy()
        np.testing.assert_allclose(rotation @ rotation.T, np.eye(3), atol=1e-12)
        assert np.linalg.det(rotation) == pytest.approx(1.0)
        np.testing.assert_allclose(
            matrix_to_quaternion(torch.from_numpy(rotation)).numpy(), q, atol=1e-10
        )
