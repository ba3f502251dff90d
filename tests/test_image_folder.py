"""Image folder / video input: formats, EXIF, transparency, poses (cameras.json, COLMAP), errors."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from datamodules import InputError
from datamodules.readers.cameras_json import read_cameras_json, write_cameras_json
from datamodules.readers.image_folder import load_images, open_image
from models.geometry.cameras import project, transform_points
from models.geometry.rotations import quaternion_to_matrix


def save(path: Path, array: np.ndarray, **kwargs) -> Path:
    Image.fromarray(array).save(path, **kwargs)
    return path


def test_drone_frames(shared_data: Path) -> None:
    images = load_images(
        shared_data / "examples" / "drone_frames", image_size=(64, 96), num_views=4
    )
    assert images.images.shape == (4, 3, 64, 96) and images.images.dtype == torch.float32
    assert images.names == ["frame_00.jpg", "frame_02.jpg", "frame_05.jpg", "frame_07.jpg"]
    assert images.original_sizes == [(480, 848)] * 4
    assert images.extrinsics is None and images.intrinsics is None and images.pose_source is None
    context = images.context(near=0.5, far=50.0, default_fov=60.0)
    assert context["image"].shape == (1, 4, 3, 64, 96) and "extrinsics" not in context
    assert context["intrinsics"][0, 0, 0, 0].item() == pytest.approx(0.5 / np.tan(np.deg2rad(30)))
    assert torch.equal(context["near"], torch.full((1, 4), 0.5))
    with pytest.raises(InputError, match="only 8 readable image") as error:
        load_images(shared_data / "examples" / "drone_frames", min_views=9)
    assert "drone_frames" in str(error.value) and len(str(error.value).splitlines()) == 1


def test_drone_video(shared_data: Path) -> None:
    video = load_images(shared_data / "examples" / "drone.mp4", image_size=(48, 48), num_views=3)
    assert video.images.shape == (3, 3, 48, 48)
    assert video.names == ["drone_frame00000", "drone_frame00326", "drone_frame00651"]
    assert video.original_sizes == [(480, 848)] * 3
    assert (video.images[0] - video.images[2]).abs().mean() > 0.02  # different frames


def test_bad_inputs(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="input not found"):
        load_images(tmp_path / "missing")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InputError, match="no images found") as error:
        load_images(empty)
    assert str(empty) in str(error.value)
    broken = tmp_path / "broken.mp4"
    broken.write_bytes(b"not a video at all")
    with pytest.raises(InputError, match="broken.mp4"):
        load_images(broken)
    notes = tmp_path / "notes.txt"
    notes.write_text("x")
    with pytest.raises(InputError, match="unsupported input"):
        load_images(notes)


def test_formats_transparency_and_skipping(tmp_path: Path) -> None:
    folder = tmp_path / "mixed"
    folder.mkdir()
    rgba = np.zeros((20, 30, 4), dtype=np.uint8)
    rgba[..., 0] = 255
    rgba[:, :15, 3] = 255  # left half opaque red, right half fully transparent
    save(folder / "a.png", rgba)
    save(folder / "b.webp", np.full((20, 30, 3), 128, np.uint8), lossless=True)
    save(folder / "c.bmp", np.full((20, 30, 3), 64, np.uint8))
    save(folder / "d.jpeg", np.full((20, 30), 200, np.uint8))  # grayscale
    save(folder / "e.png", np.full((20, 30), 40000, np.uint16))  # 16-bit grayscale
    (folder / "notes.txt").write_text("not an image")
    (folder / "f.jpg").write_bytes(b"\xff\xd8 truncated")
    with pytest.warns(UserWarning) as record:
        white = load_images(folder)
    messages = " ".join(str(w.message) for w in record)
    assert "notes.txt" in messages and "f.jpg" in messages
    assert white.names == ["a.png", "b.webp", "c.bmp", "d.jpeg", "e.png"]
    images = white.images
    assert torch.allclose(images[0, :, :, :15], torch.tensor([1.0, 0, 0])[:, None, None])
    assert torch.allclose(images[0, :, :, 15:], torch.ones(3, 20, 15))  # composited on white
    assert torch.allclose(images[1], torch.full((3, 20, 30), 128 / 255))
    assert torch.allclose(images[2], torch.full((3, 20, 30), 64 / 255))
    assert (images[3] - 200 / 255).abs().max() < 3 / 255
    assert (images[4] - 40000 / 65535).abs().max() < 2 / 255
    with pytest.warns(UserWarning):
        black = load_images(folder, background="black")
    assert torch.allclose(black.images[0, :, :, 15:], torch.zeros(3, 20, 15))


def test_exif_orientation(tmp_path: Path) -> None:
    array = np.zeros((20, 40, 3), dtype=np.uint8)
    array[:, :10] = 255  # stored: white band on the left
    image = Image.fromarray(array)
    exif = image.getexif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise for display
    path = tmp_path / "rotated.jpg"
    image.save(path, exif=exif, quality=100)
    opened = open_image(path)
    assert opened.size == (20, 40)  # width 20, height 40 after rotation
    top = np.asarray(opened)[:8].mean()
    assert top > 200  # the white band is now on top
    loaded = load_images(path)
    assert loaded.images.shape == (1, 3, 40, 20)


def test_cameras_json_round_trip(shared_data: Path, tmp_path: Path) -> None:
    folder = tmp_path / "posed"
    shutil.copytree(shared_data / "examples" / "drone_frames", folder)
    names = sorted(p.name for p in folder.glob("*.jpg"))
    angles = torch.linspace(0, 0.5, len(names))
    poses = torch.eye(4).repeat(len(names), 1, 1)
    poses[:, 0, 0] = poses[:, 2, 2] = angles.cos()
    poses[:, 0, 2], poses[:, 2, 0] = angles.sin(), -angles.sin()
    poses[:, :3, 3] = torch.stack([angles * 2, torch.zeros_like(angles), angles], dim=-1)
    k = torch.tensor([[0.7, 0.0, 0.52], [0.0, 1.24, 0.48], [0.0, 0.0, 1.0]]).expand(
        len(names), 3, 3
    )
    write_cameras_json(folder / "cameras.json", names, poses, k, (480, 848))
    table = read_cameras_json(folder / "cameras.json")
    assert table["frame_03.jpg"]["fx"] == pytest.approx(0.7 * 848)
    loaded = load_images(folder, image_size=(240, 424))  # exact half size: intrinsics unchanged
    assert loaded.pose_source == "cameras.json" and len(loaded) == len(names)
    assert torch.allclose(loaded.extrinsics, poses, atol=1e-6)
    assert torch.allclose(loaded.intrinsics, k, atol=1e-6)
    context = loaded.context()
    assert torch.allclose(context["extrinsics"][0, 0], torch.eye(4), atol=1e-6)
    centers = context["extrinsics"][0, :, :3, 3]
    assert torch.cdist(centers, centers).max().item() == pytest.approx(1.0, abs=1e-5)

    (folder / "cameras.json").write_text('{"frames": [{"file": "frame_00.jpg"}]}')
    with pytest.raises(InputError, match="cameras.json: frame 0 is malformed"):
        load_images(folder)


def test_colmap_poses_reproject_points(shared_data: Path) -> None:
    from datamodules.readers import colmap

    scene = shared_data / "real" / "drone_colmap"
    loaded = load_images(scene, image_size=(240, 424), num_views=5)
    assert loaded.pose_source == "colmap" and loaded.images.shape == (5, 3, 240, 424)
    rotation = loaded.extrinsics[:, :3, :3]
    assert torch.allclose(rotation @ rotation.mT, torch.eye(3).expand(5, 3, 3), atol=1e-5)
    _, images, points = colmap.read_model(scene, points=True)
    by_name = {im.name: im for im in images.values()}
    for view, name in enumerate(loaded.names):
        image = by_name[name]
        keep = image.point3d_ids >= 0
        xyz = torch.tensor(
            np.stack([points[i].xyz for i in image.point3d_ids[keep]]), dtype=torch.float32
        )
        uv, z = project(xyz, loaded.extrinsics[view], loaded.intrinsics[view])
        observed = torch.tensor(image.xys[keep], dtype=torch.float32) / torch.tensor([848.0, 480.0])
        residual = ((uv - observed) * torch.tensor([848.0, 480.0])).norm(dim=-1)
        # SfM keypoints: 0.88 px mean reprojection error over the model
        assert (z > 0).all() and residual.median() < 1.5, residual.median()
    # camera centres follow from the world-to-camera poses
    first = by_name[loaded.names[0]]
    center = -quaternion_to_matrix(torch.tensor(first.qvec)).T @ torch.tensor(first.tvec)
    assert torch.allclose(loaded.extrinsics[0, :3, 3].double(), center, atol=1e-5)
    origin = transform_points(
        torch.linalg.inv(loaded.extrinsics[0]), loaded.extrinsics[0, None, :3, 3]
    )
    assert origin.abs().max() < 1e-4


def test_a_second_size_from_the_same_read(shared_data: Path) -> None:
    """``fit_shape_of``: the views read once and resized to two sizes are, at the second size,
    exactly what a second read at that size gives (pixels and intrinsics through its crop)."""
    scene = shared_data / "real" / "drone_colmap"
    seen = []

    def fit_shape_of(images) -> tuple[int, int]:
        seen.append(tuple(images.images.shape[-2:]))
        return (60, 120)  # another aspect ratio than (64, 96): another crop

    once = load_images(scene, image_size=(64, 96), num_views=4, fit_shape_of=fit_shape_of)
    again = load_images(scene, image_size=(60, 120), num_views=4)
    plain = load_images(scene, image_size=(64, 96), num_views=4)
    assert seen == [(64, 96)] and plain.fit is None and once.fit.fit is None
    assert torch.equal(once.images, plain.images) and torch.equal(once.intrinsics, plain.intrinsics)
    assert once.fit.names == again.names == once.names
    assert torch.equal(once.fit.images, again.images)
    assert torch.equal(once.fit.intrinsics, again.intrinsics)
    assert torch.equal(once.fit.extrinsics, again.extrinsics)
    video = shared_data / "examples" / "drone.mp4"
    frames = load_images(video, (48, 48), 3, fit_shape_of=lambda images: (32, 56))
    assert torch.equal(frames.fit.images, load_images(video, (32, 56), 3).images)
