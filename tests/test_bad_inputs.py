"""Corrupt and degenerate inputs: COLMAP binary and text models, cameras.json, tiny and strip images.

Every case is made here (random bytes, crafted headers, hand-written lines) and must end in one
line naming the file (an ``InputError`` from the readers, e.g. ``ColmapError``; exit status 2 and one
``error:`` line from ``infer.py`` and ``datamodules.tools.convert``), or, for inputs that still work but
will give a poor result, in one ``warning:`` line naming the file.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from data_fixtures import SHARED_DATA
from PIL import Image as PILImage
from test_infer import (  # what `python infer.py ARGS` runs, in-process
    Result,
    assert_bad_input,
    infer_here,
)

from datamodules.errors import InputError
from datamodules.readers.cameras_json import read_cameras_json
from datamodules.readers.colmap import (
    read_cameras_binary,
    read_cameras_text,
    read_frames_text,
    read_images_binary,
    read_images_text,
    read_model,
    read_points3d_binary,
    read_points3d_text,
    read_rigs_text,
)
from datamodules.readers.colmap_records import ColmapError, UnsupportedCameraError
from datamodules.readers.image_folder import load_images
from datamodules.tools import convert

REPO_ROOT = Path(__file__).resolve().parents[1]
POSED = "pixel_aligned_tiny"
SIZE = "image_size=32"
IDENTITY = [[1.0, 0, 0, 0], [0, 1.0, 0, 0], [0, 0, 1.0, 0], [0, 0, 0, 1.0]]


# --------------------------------------------------------------------------- helpers


def _camera_record(camera_id=1, model_id=1, width=40, height=30, params=(50.0, 50.0, 20.0, 15.0)):
    return struct.pack("<IiQQ", camera_id, model_id, width, height) + struct.pack(
        f"<{len(params)}d", *params
    )


def _image_record(image_id=1, qvec=(1.0, 0, 0, 0), tvec=(0, 0, 0), camera_id=1, name=b"a.png",
                  points=(), num_points=None):  # fmt: skip
    out = struct.pack("<I7dI", image_id, *qvec, *tvec, camera_id) + name + b"\x00"
    out += struct.pack("<Q", len(points) if num_points is None else num_points)
    for x, y, point_id in points:
        out += struct.pack("<ddq", x, y, point_id)
    return out


def _point_record(point_id=1, xyz=(0.0, 0, 1), error=0.5, track=((1, 0),), track_length=None):
    out = struct.pack("<Q3d3Bd", point_id, *xyz, 10, 20, 30, error)
    out += struct.pack("<Q", len(track) if track_length is None else track_length)
    for image_id, idx in track:
        out += struct.pack("<II", image_id, idx)
    return out


def _binary_file(*records: bytes, count: int | None = None) -> bytes:
    return struct.pack("<Q", len(records) if count is None else count) + b"".join(records)


def _binary_scene(root: Path, images_bin: bytes, cameras_bin: bytes | None = None) -> Path:
    """A scene folder: two 40x30 PNGs, ``sparse/0/{cameras,images}.bin``."""
    model = root / "sparse" / "0"
    model.mkdir(parents=True)
    (model / "cameras.bin").write_bytes(cameras_bin or _binary_file(_camera_record()))
    (model / "images.bin").write_bytes(images_bin)
    rng = np.random.default_rng(0)
    for name in ("a.png", "b.png"):
        PILImage.fromarray(rng.integers(0, 255, (30, 40, 3), dtype=np.uint8)).save(root / name)
    return root


def _good_images() -> bytes:
    return _binary_file(
        _image_record(1, name=b"a.png", points=[(1.5, 2.5, -1)]),
        _image_record(2, tvec=(-1.0, 0, 0), name=b"b.png"),
    )


# Four corruptions of a chunk file, each with the text its message must contain.
CORRUPT_IMAGES = {
    "random_bytes": (np.random.default_rng(0).bytes(4096), "image count is"),
    "num_points_2_62": (
        _binary_file(_image_record(num_points=2**62)),
        "2D point count of image 1 (a.png) is 4611686018427387904",
    ),
    "non_utf8_name": (
        _binary_file(_image_record(name=b"caf\xe9.png")),
        "the name of image 1 is not UTF-8",
    ),
    "zero_quaternion": (
        _binary_file(_image_record(qvec=(0.0, 0, 0, 0))),
        "image 1 (a.png): rotation quaternion (0, 0, 0, 0) is not a rotation",
    ),
}


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Random weights of the posed tiny model, saved as a user's folder would be."""
    from models import create_model
    from models.weights.hub import save_pretrained

    return save_pretrained(
        create_model(POSED), tmp_path_factory.mktemp("weights") / POSED, name=POSED
    )


def _warning_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("warning: ")]


# --------------------------------------------------------------------------- COLMAP binary


@pytest.mark.parametrize("case", sorted(CORRUPT_IMAGES))
def test_corrupt_images_bin_is_one_colmap_error(tmp_path: Path, case: str) -> None:
    data, expected = CORRUPT_IMAGES[case]
    path = tmp_path / "images.bin"
    path.write_bytes(data)
    with pytest.raises(ColmapError) as caught:
        read_images_binary(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: ") and expected in message, message
    assert "\n" not in message and "at byte" in message


def test_binary_byte_offsets_and_normalisation(tmp_path: Path) -> None:
    path = tmp_path / "images.bin"
    # The name starts after the count (8 bytes) and the pose record (4 + 56 + 4 bytes); the bad
    # byte is its fourth.
    path.write_bytes(_binary_file(_image_record(name=b"caf\xe9.png")))
    with pytest.raises(ColmapError, match=r"at byte 75 of"):
        read_images_binary(path)
    # Non-unit quaternions are normalised; a good file reads back exactly.
    path.write_bytes(_binary_file(_image_record(qvec=(2.0, 0, 0, 0), points=[(1.5, 2.5, 7)])))
    image = read_images_binary(path)[1]
    np.testing.assert_array_equal(image.qvec, [1, 0, 0, 0])
    np.testing.assert_array_equal(image.xys, [[1.5, 2.5]])
    np.testing.assert_array_equal(image.point3d_ids, [7])
    assert image.name == "a.png"


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (_binary_file(count=2**62), "camera count is 4611686018427387904"),
        (_binary_file(_camera_record(model_id=99)), "unknown model id 99"),
        (_binary_file(_camera_record(width=0)), "invalid image size 0x30"),
        (_binary_file(_camera_record(params=(-50.0, 50, 20, 15))), "non-positive focal length"),
        (_binary_file(_camera_record(params=(50.0, 50, float("nan"), 15))), "non-finite"),
        (_binary_file(_camera_record(), _camera_record()), "camera id 1 appears twice"),
        (_binary_file(_camera_record()) + b"\x00" * 5, "5 unexpected bytes after the last record"),
        (_binary_file(_camera_record())[:-3], "file is truncated"),
    ],
    ids=["count", "model_id", "width", "focal", "nan", "duplicate", "trailing", "truncated"],
)
def test_corrupt_cameras_bin(tmp_path: Path, data: bytes, expected: str) -> None:
    path = tmp_path / "cameras.bin"
    path.write_bytes(data)
    with pytest.raises(ColmapError, match=expected.replace("(", r"\(")) as caught:
        read_cameras_binary(path)
    assert str(caught.value).startswith(f"{path}: ")


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (np.random.default_rng(1).bytes(4096), "point count is"),
        (_binary_file(_point_record(track_length=2**62)), "track length of point 1 is"),
        (_binary_file(_point_record(xyz=(0.0, float("inf"), 1))), "non-finite position"),
    ],
    ids=["random", "track_length", "inf"],
)
def test_corrupt_points3d_bin(tmp_path: Path, data: bytes, expected: str) -> None:
    path = tmp_path / "points3D.bin"
    path.write_bytes(data)
    with pytest.raises(ColmapError, match=expected):
        read_points3d_binary(path)
    path.write_bytes(_binary_file(_point_record(track=((3, 4), (5, 6)))))
    point = read_points3d_binary(path)[1]
    assert point.image_ids.tolist() == [3, 5] and point.point2d_idxs.tolist() == [4, 6]


def test_image_with_missing_camera(tmp_path: Path) -> None:
    _binary_scene(tmp_path, _binary_file(_image_record(camera_id=7)))
    with pytest.raises(ColmapError, match="image 1 \\(a.png\\) refers to camera 7"):
        read_model(tmp_path)


# --------------------------------------------------------------------------- COLMAP text

GOOD_CAMERA = "1 PINHOLE 40 30 50 50 20 15"
GOOD_IMAGE = "1 1 0 0 0 0 0 0 1 a.png"


@pytest.mark.parametrize(
    ("file", "lines", "expected"),
    [
        ("cameras.txt", ["# header", GOOD_CAMERA, "2 PINHOLE abc 30 50 50 20 15"], "line 3: width"),
        (
            "cameras.txt",
            ["2 PINHOLE 40 30 50 50 20"],
            "line 1: camera 2 (PINHOLE) has 3 parameters",
        ),
        ("cameras.txt", ["2 PINHOLE 40 30 0 50 20 15"], "line 1: camera 2 (PINHOLE) has a non-po"),
        ("cameras.txt", ["2 PINHOLE 40 -30 50 50 20 15"], "line 1: camera 2 has an invalid image"),
        ("cameras.txt", ["2 PINHOLE 40 30 50 nan 20 15"], "line 1: parameter"),
        ("cameras.txt", ["1 PINHOLE"], "line 1: expected CAMERA_ID MODEL"),
        ("cameras.txt", ["\x00\x01garbage PINHOLE 40 30 1 1 1 1"], "line 1: camera id"),
        ("images.txt", ["1 1 0 0 0 0 0 0 1"], "line 1: expected IMAGE_ID"),
        ("images.txt", ["1 1 zero 0 0 0 0 0 1 a.png", ""], "line 1: quaternion: 'zero'"),
        ("images.txt", ["1 0 0 0 0 0 0 0 1 a.png", ""], "line 1: rotation quaternion (0, 0, 0, 0)"),
        ("images.txt", [GOOD_IMAGE, "1.0 2.0"], "line 2: the POINTS2D line of image 1 has 2"),
        ("images.txt", [GOOD_IMAGE, "1.0 2.0 x"], "line 2: 2D point: 'x'"),
        ("images.txt", [GOOD_IMAGE, "", GOOD_IMAGE, ""], "line 3: image id 1 appears twice"),
        ("points3D.txt", ["1 0 0 1 300 0 0 0.5 1 0"], "line 1: colour 300 0 0 is not 0..255"),
        ("points3D.txt", ["1 0 0 1 3 0 0 0.5 1"], "line 1: expected POINT3D_ID"),
        ("points3D.txt", ["1 0 0 inf 3 0 0 0.5 1 0"], "line 1: position"),
        ("rigs.txt", ["1 2 CAMERA 1 CAMERA"], "line 1: line ends early"),
        ("frames.txt", ["1 1 0 0 0 0 0 0 0 1 CAMERA 1 1"], "line 1: rotation quaternion"),
    ],
)
def test_text_model_garbage(tmp_path: Path, file: str, lines: list[str], expected: str) -> None:
    path = tmp_path / file
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    reader = {
        "cameras.txt": read_cameras_text,
        "images.txt": read_images_text,
        "points3D.txt": read_points3d_text,
        "rigs.txt": read_rigs_text,
        "frames.txt": read_frames_text,
    }[file]
    with pytest.raises(ColmapError) as caught:
        reader(path)
    message = str(caught.value)
    assert message.startswith(f"{path}, line ") and expected in message, message
    assert "\n" not in message


def test_text_model_not_utf8_and_unknown_model(tmp_path: Path) -> None:
    path = tmp_path / "images.txt"
    path.write_bytes(b"# header\n1 1 0 0 0 0 0 0 1 caf\xe9.png\n\n")
    with pytest.raises(ColmapError, match=r"images.txt, line 2: not UTF-8 text \(byte 22"):
        read_images_text(path)
    # A byte-order mark (Windows editors) is not garbage.
    path.write_bytes(b"\xef\xbb\xbf# header\n1 1 0 0 0 0 0 0 1 a.png\n\n")
    assert read_images_text(path)[1].name == "a.png"
    path = tmp_path / "cameras.txt"
    path.write_text("1 NOT_A_MODEL 40 30 1\n")
    with pytest.raises(UnsupportedCameraError, match="line 1: camera 1 has unknown model"):
        read_cameras_text(path)


# --------------------------------------------------------------------------- end to end


@pytest.mark.parametrize("case", sorted(CORRUPT_IMAGES))
def test_infer_corrupt_colmap_binary(weights: Path, tmp_path: Path, capsys, case: str) -> None:
    data, expected = CORRUPT_IMAGES[case]
    scene = _binary_scene(tmp_path / "scene", data)
    output = tmp_path / "out"
    result = infer_here(
        capsys, f"input={scene}", f"output={output}", f"model={POSED}", f"weights={weights}", SIZE
    )
    images_bin = scene / "sparse" / "0" / "images.bin"
    line = assert_bad_input(result, f"{images_bin}: ", expected)
    assert line.count(str(images_bin.parent)) == 1  # the folder is not named twice
    assert not output.exists()


def test_infer_colmap_text_garbage(weights: Path, tmp_path: Path, capsys) -> None:
    scene = _binary_scene(tmp_path / "scene", _good_images())
    model = scene / "sparse" / "0"
    for name in ("cameras.bin", "images.bin"):
        (model / name).unlink()
    (model / "cameras.txt").write_text(GOOD_CAMERA + "\n")
    (model / "images.txt").write_text("# header\n1 1 0 0 0 0 0 0 1 a.png\n1 2\n")
    result = infer_here(
        capsys, f"input={scene}", f"output={tmp_path / 'out'}", f"model={POSED}",
        f"weights={weights}", SIZE,
    )  # fmt: skip
    assert_bad_input(result, f"{model / 'images.txt'}, line 3: the POINTS2D line")


def test_infer_corrupt_colmap_binary_as_a_user_runs_it(weights: Path, tmp_path: Path) -> None:
    """``python infer.py`` in a subprocess: exit status 2 and one line, no traceback."""
    data, expected = CORRUPT_IMAGES["random_bytes"]
    scene = _binary_scene(tmp_path / "scene", data)
    command = [
        sys.executable, str(REPO_ROOT / "infer.py"), f"input={scene}", f"output={tmp_path / 'o'}",
        f"model={POSED}", f"weights={weights}", SIZE,
    ]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore::DeprecationWarning"}
    result = subprocess.run(
        command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert_bad_input(result, "images.bin", expected)


@pytest.mark.parametrize("case", sorted(CORRUPT_IMAGES))
def test_convert_corrupt_colmap_binary(tmp_path: Path, capsys, case: str) -> None:
    data, expected = CORRUPT_IMAGES[case]
    scene = _binary_scene(tmp_path / "scene", data)
    (scene / "images").mkdir()
    for name in ("a.png", "b.png"):
        (scene / name).rename(scene / "images" / name)
    capsys.readouterr()
    status = convert.main([str(scene), f"out={tmp_path / 'chunks'}", "split=train", "quiet=true"])
    line = assert_bad_input(Result(status, capsys.readouterr().err), "nothing converted")
    assert f"{scene / 'sparse' / '0' / 'images.bin'}: " in line and expected in line
    assert not list((tmp_path / "chunks").rglob("*.torch"))


def test_good_binary_model_still_converts_and_loads(tmp_path: Path) -> None:
    scene = _binary_scene(tmp_path / "scene", _good_images())
    loaded = load_images(scene, image_size=(32, 32))
    assert loaded.pose_source == "colmap" and loaded.names == ["a.png", "b.png"]
    assert loaded.extrinsics[1, 0, 3] == pytest.approx(1.0)  # camera centre of t = (-1, 0, 0)


# --------------------------------------------------------------------------- cameras.json


def _frame(name: str, pose=None, **intrinsics) -> dict:
    return {
        "file": name,
        "camera_to_world": pose or IDENTITY,
        **{"fx": 50.0, "fy": 50.0, "cx": 20.0, "cy": 15.0, **intrinsics},
    }


def _posed_folder(root: Path, frames: list[dict], sizes=None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for name in ["a.png", "b.png"] if sizes is None else list(sizes):
        width, height = (40, 30) if sizes is None else sizes[name]
        pixels = rng.integers(0, 255, (height, width, 3), dtype=np.uint8)
        PILImage.fromarray(pixels).save(root / name)
    (root / "cameras.json").write_text(json.dumps({"frames": frames}))
    return root


def _translated(x: float) -> list[list[float]]:
    pose = [row[:] for row in IDENTITY]
    pose[0][3] = x
    return pose


def _rotation_with(**entries: float) -> list[list[float]]:
    pose = [row[:] for row in IDENTITY]
    for key, value in entries.items():
        pose[int(key[1])][int(key[2])] = value
    return pose


@pytest.mark.parametrize(
    ("bad", "expected"),
    [
        (_frame("b.png", [[0.0] * 4, [0.0] * 4, [0.0] * 4, [0, 0, 0, 1.0]]), "not orthonormal"),
        (_frame("b.png", _rotation_with(r00=50.0)), "not orthonormal (max |R^T R - I| = 2.5e+03"),
        (_frame("b.png", _rotation_with(r00=-1.0)), "determinant -1"),
        (_frame("b.png", [IDENTITY[0], IDENTITY[1], IDENTITY[2], [0, 0, 1.0, 1.0]]), "last row"),
        (_frame("b.png", _translated(1.0), fx=-500.0), "fx=-500 must be a positive focal length"),
        (_frame("b.png", _translated(1.0), fy=0.0), "fy=0 must be a positive focal length"),
        (_frame("b.png", _translated(1.0), cy=float("nan")), "cy=nan must be a finite principal"),
        (_frame("a.png", _translated(1.0)), "frame 1 lists a.png a second time"),
    ],
    ids=["zero", "r00_50", "det_minus_1", "last_row", "fx", "fy", "cy", "duplicate"],
)
def test_cameras_json_bad_frame(tmp_path: Path, bad: dict, expected: str) -> None:
    folder = _posed_folder(tmp_path / "photos", [_frame("a.png"), bad])
    path = folder / "cameras.json"
    with pytest.raises(InputError) as caught:
        read_cameras_json(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: frame 1") and expected in message, message
    if bad["file"] == "b.png":
        assert "frame 1 (b.png)" in message
    with pytest.raises(InputError, match="frame 1"):
        load_images(folder, image_size=(32, 32))


def test_cameras_json_rigid_poses_pass(tmp_path: Path) -> None:
    """A real rotation in float32 precision (as other tools write it) is accepted."""
    angle = 0.3
    c, s = np.float32(np.cos(angle)), np.float32(np.sin(angle))
    pose = [[float(c), 0.0, float(s), 0.5], [0.0, 1.0, 0.0, 0], [float(-s), 0, float(c), 0],
            [0, 0, 0, 1.0]]  # fmt: skip
    folder = _posed_folder(tmp_path / "photos", [_frame("a.png"), _frame("b.png", pose)])
    loaded = load_images(folder, image_size=(32, 32))
    assert loaded.pose_source == "cameras.json" and len(loaded) == 2
    # A byte-order mark (Windows editors) is accepted.
    path = folder / "cameras.json"
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    assert set(read_cameras_json(path)) == {"a.png", "b.png"}


def test_cameras_json_listing_only_missing_files(tmp_path: Path) -> None:
    frames = [_frame(f"frame_{i:02d}.jpg", _translated(i)) for i in range(3)]
    folder = _posed_folder(tmp_path / "photos", frames)
    with pytest.raises(InputError) as caught:
        load_images(folder, image_size=(32, 32))
    message = str(caught.value)
    assert message.startswith(f"{folder / 'cameras.json'}: none of the 3 files it lists exists")
    assert "frame_00.jpg, frame_01.jpg and 1 more" in message
    assert "the folder has a.png, b.png" in message
    assert "no images found" not in message


def test_cameras_json_paths_relative_to_the_input(tmp_path: Path) -> None:
    """``file`` may be a path relative to the input folder (``images/a.png``)."""
    root = tmp_path / "scene"
    _posed_folder(
        root / "images", [_frame("images/a.png"), _frame("./images/b.png", _translated(1.0))]
    )
    (root / "images" / "cameras.json").rename(root / "cameras.json")
    loaded = load_images(root, image_size=(32, 32))
    assert loaded.names == ["a.png", "b.png"] and loaded.pose_source == "cameras.json"


def test_pose_files_without_frames(tmp_path: Path) -> None:
    folder = _posed_folder(tmp_path / "photos", [])
    with pytest.raises(InputError, match="cameras.json: lists no frames"):
        load_images(folder, image_size=(32, 32))
    (folder / "cameras.json").unlink()
    _binary_scene(tmp_path / "scene", _binary_file())
    with pytest.raises(InputError, match="sparse/0: has no registered images"):
        load_images(tmp_path / "scene", image_size=(32, 32))


def test_identical_cameras_warn(tmp_path: Path) -> None:
    folder = _posed_folder(tmp_path / "photos", [_frame("a.png"), _frame("b.png")])
    with pytest.warns(UserWarning, match="all 2 views have identical cameras") as caught:
        load_images(folder, image_size=(32, 32))
    assert any(str(folder / "cameras.json") in str(w.message) for w in caught)
    # Same centre, different rotation (a panorama): no baseline either.
    turned = _rotation_with(r00=0.0, r02=1.0, r20=-1.0, r22=0.0)
    _posed_folder(folder, [_frame("a.png"), _frame("b.png", turned)])
    with pytest.warns(UserWarning, match="cameras at the same position"):
        load_images(folder, image_size=(32, 32))


def test_infer_identical_cameras_warning_and_bad_rotation(
    weights: Path, tmp_path: Path, capsys
) -> None:
    folder = _posed_folder(tmp_path / "photos", [_frame("a.png"), _frame("b.png")])
    args = [f"model={POSED}", f"weights={weights}", SIZE, "orbit_frames=2"]
    result = infer_here(capsys, f"input={folder}", f"output={tmp_path / 'out'}", *args)
    assert result.returncode == 0, result.stderr
    lines = _warning_lines(result.stderr)
    assert [w for w in lines if "identical cameras" in w and "cameras.json" in w], lines
    _posed_folder(folder, [_frame("a.png"), _frame("b.png", _rotation_with(r00=50.0))])
    result = infer_here(capsys, f"input={folder}", f"output={tmp_path / 'out2'}", *args)
    assert_bad_input(result, f"{folder / 'cameras.json'}: frame 1 (b.png)", "orthonormal")
    assert not (tmp_path / "out2").exists()


# --------------------------------------------------------------------------- sizes


def test_tiny_and_strip_images_warn(tmp_path: Path) -> None:
    folder = tmp_path / "photos"
    folder.mkdir()
    sizes = {
        "edge.png": (16, 16),  # shorter side exactly half the input: no warning
        "fine.png": (40, 30),
        "strip.png": (4000, 50),
        "tall.png": (20, 100),
        "tiny_a.png": (1, 1),
        "tiny_b.png": (1, 1),
    }
    for name, size in sizes.items():
        PILImage.new("RGB", size, (120, 50, 10)).save(folder / name)
    with pytest.warns(UserWarning) as caught:
        loaded = load_images(folder, image_size=(32, 32))
    assert len(loaded) == 6 and tuple(loaded.images.shape[-2:]) == (32, 32)
    messages = sorted(str(w.message) for w in caught)
    assert messages == [
        f"{folder / 'strip.png'}: 4000x50 has an extreme aspect ratio (80:1); the centre crop to "
        "the model's 32x32 input keeps 1% of it",
        f"{folder / 'tall.png'}: 20x100 has an extreme aspect ratio (5:1); the centre crop to the "
        "model's 32x32 input keeps 20% of it",
        f"{folder / 'tiny_a.png'}, {folder / 'tiny_b.png'}: 1x1 pixels is far smaller than the "
        "model's 32x32 input (upsampled 32x; expect a blurry result)",
    ]
    # The aspect ratio is judged against the model input's: 4000x50 suits a 16x1280 input.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_images(folder / "strip.png", image_size=(16, 1280))
    assert not caught, [str(w.message) for w in caught]


def test_infer_warns_about_tiny_and_strip_inputs(weights: Path, tmp_path: Path, capsys) -> None:
    sizes = {"strip.png": (4000, 50), "tiny.png": (1, 1)}
    frames = [_frame("strip.png"), _frame("tiny.png", _translated(1.0))]
    folder = _posed_folder(tmp_path / "photos", frames, sizes)
    result = infer_here(
        capsys, f"input={folder}", f"output={tmp_path / 'out'}", f"model={POSED}",
        f"weights={weights}", SIZE, "orbit_frames=2",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = "\n".join(_warning_lines(result.stderr))
    assert f"warning: {folder / 'strip.png'}: 4000x50 has an extreme aspect ratio" in lines
    assert f"warning: {folder / 'tiny.png'}: 1x1 pixels is far smaller" in lines


# --------------------------------------------------------------------------- installation, first run


def test_torchvision_built_for_another_torch_is_one_line(tmp_path: Path) -> None:
    """A torchvision whose operators do not load (built for another torch), as a real import."""
    fake = tmp_path / "site" / "torchvision"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(
        'raise RuntimeError("operator torchvision::nms does not exist")\n', encoding="utf-8"
    )
    env = {**os.environ, "PYTHONPATH": f"{fake.parent}{os.pathsep}{REPO_ROOT}"}
    result = subprocess.run(
        [sys.executable, "-c", "import models"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert (
        "does not match torch" in lines[0]
        and "pip install torch==2.14.1 torchvision==0.29.1" in lines[0]
    )


def test_pyproject_ranges_hold_compatible_pairs() -> None:
    import tomllib
    from packaging.requirements import Requirement

    from models.layers._timm_import import PINNED

    dependencies = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"][
        "dependencies"
    ]
    specifiers = {r.name: r.specifier for r in map(Requirement, dependencies)}
    # torch 2.N pairs with torchvision 0.(N+15): every torch minor of the range has its pair in
    # torchvision's range, and the suggested pair is the newest (a CPU build's "+cpu" matches).
    for minor in range(10, 20):
        torch_in = specifiers["torch"].contains(f"2.{minor}.0+cpu")
        assert torch_in == specifiers["torchvision"].contains(f"0.{minor + 15}.0+cpu"), minor
    assert specifiers["torch"].contains(PINNED[0]) and specifiers["torchvision"].contains(PINNED[1])
    assert not specifiers["torch"].contains("2.14.2") and not specifiers["torch"].contains("2.15.0")
    minor = int(PINNED[0].split(".")[1])
    assert PINNED[1].startswith(f"0.{minor + 15}.")


def test_pytest_runs_from_the_repository_without_python_m(tmp_path: Path) -> None:
    """``pytest tests/test_viewer.py`` (the README's screenshot command) imports view.py."""
    probe = REPO_ROOT / "tests" / f"test_probe_import_{os.getpid()}.py"
    probe.write_text("import infer\nimport view\n\n\ndef test_imports():\n    assert view.USAGE\n")
    try:
        pytest_bin = Path(sys.executable).with_name("pytest")
        result = subprocess.run(
            [str(pytest_bin), "-q", "-p", "no:cacheprovider", str(probe.relative_to(REPO_ROOT))],
            cwd=REPO_ROOT,
            env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        probe.unlink()
    assert result.returncode == 0, result.stdout[-2000:]


def test_synthetic_generation_estimate_follows_the_benchmark(monkeypatch) -> None:
    """The default set (1,000 scenes, 2 workers) took 99.9 s on an idle 2-core machine and 696 s
    at load 11-12 (docs/benchmarks.md): the announced estimate is within a factor of two."""
    from datamodules import synthetic

    monkeypatch.setattr(synthetic.os, "cpu_count", lambda: 2)
    for load, measured in ((0.4, 99.9), (11.5, 695.7)):
        monkeypatch.setattr(synthetic.os, "getloadavg", lambda load=load: (load, load, load))
        estimate = synthetic.generation_seconds(synthetic.SyntheticSettings(), workers=2)
        assert measured / 2 <= estimate <= measured * 2, (load, estimate)


def test_first_training_run_says_it_generates_data(tmp_path: Path, capsys) -> None:
    from datamodules.synthetic import SyntheticSettings, ensure_synthetic

    settings = SyntheticSettings(scenes=2, resolution=16, views=2, test_fraction=0.5)
    ensure_synthetic(tmp_path / "data", settings, progress=False)
    err = capsys.readouterr().err
    assert "generating the synthetic dataset into" in err and "2 room scenes" in err
    assert "about 0 s" in err or "about 1 s" in err
    ensure_synthetic(tmp_path / "data", settings, progress=False)  # reused: says nothing
    assert "generating" not in capsys.readouterr().err
    # train.py generates before the trainer (and its step bar) exists.
    source = (REPO_ROOT / "train.py").read_text()
    assert source.index("datamodule.prepare_data()") < source.index("cfg.trainer, callbacks")


# --------------------------------------------------------------------------- settings


@pytest.mark.parametrize(
    ("arg", "expected"),
    [
        ("bogus=1", "unknown setting of infer.py (settings: "),
        ("sfm.bogus_key=1", "(settings: sfm.cache, sfm.camera_model"),
        ("orbit_frame=4", "did you mean orbit_frames?"),
        ("sfm.matchng=auto", "did you mean sfm.matching?"),
        ("fov=abc", "must be an angle in degrees"),
        ("fov=400", "between 0 and 180"),
        ("pose_fit_steps=abc", "must be a whole number"),
        ("overwrite=maybe", "must be true or false"),
    ],
)
def test_infer_settings_are_checked_against_the_config(arg: str, expected: str) -> None:
    sys.path.insert(0, str(REPO_ROOT))
    import infer
    from models.core.command_line import SettingError

    with pytest.raises(SettingError) as caught:
        infer.arguments(["input=photos", "output=out", arg])
    message = str(caught.value)
    assert message.startswith(f"{arg}: ") and expected in message and "\n" not in message


def test_settings_declared_later_are_checked_too() -> None:
    """The check reads the config's keys and default types, not a list of today's keys."""
    from dataclasses import field, make_dataclass
    from typing import Any

    from models.core.command_line import SettingError
    from models.core.command_line import check_arguments as check_settings

    x = make_dataclass("X", [("y", bool, True)])
    config = make_dataclass(
        "Config",
        [("views", Any, None), ("holdout", int, 0), ("refine_time", float, 1.5),
         ("center_view", str, ""), ("x", x, field(default_factory=x))],
    )  # fmt: skip
    check_settings(["views=all", "holdout=3", "refine_time=2", "center_view=a.png", "x.y=false"],
                   config, "prog")  # fmt: skip
    for arg, expected in (
        ("holdout=abc", "whole number"),
        ("refine_time=fast", "must be a number"),
        ("x.y=2", "true or false"),
        ("refine_tme=2", "did you mean refine_time?"),
    ):
        with pytest.raises(SettingError, match=expected):
            check_settings([arg], config, "prog")


def test_paths_are_taken_literally(tmp_path: Path, monkeypatch) -> None:
    sys.path.insert(0, str(REPO_ROOT))
    import infer

    monkeypatch.setenv("HOME", str(tmp_path))
    cfg = infer.compose(["input=~/photos", "output=~/x", "image_size=64,96"])
    assert cfg.input == f"{tmp_path}/photos" and cfg.output == f"{tmp_path}/x"
    assert list(cfg.image_size) == [64, 96]  # H,W read as one (H, W) setting, not a sweep
    assert infer.compose(["input=a", "output=~"]).output == str(tmp_path)
    cfg = infer.compose(["input=a", "output=out/${oc.env:HOME}"])
    assert cfg.output == "out/${oc.env:HOME}"


def test_bad_settings_as_a_user_runs_them(tmp_path: Path) -> None:
    """Real processes: Hydra never prints its multi-line message, ~ is the home folder."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "keep.txt").write_text("mine")
    env = {**os.environ, "HOME": str(home), "OMP_NUM_THREADS": "1"}
    photos = tmp_path / "photos"
    photos.mkdir()
    PILImage.new("RGB", (32, 32)).save(photos / "a.png")
    for args, expected in (
        (
            ["orbit_frame=4"],
            "orbit_frame=4: unknown setting of infer.py (did you mean orbit_frames?",
        ),
        (["output=~"], f"{home}: is the home directory"),
    ):
        argv = [sys.executable, "infer.py", f"input={photos}", "output=out", *args]
        if args == ["output=~"]:
            argv.remove("output=out")
        result = subprocess.run(
            argv, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300
        )
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1 and expected in lines[0], result.stderr
    assert sorted(p.name for p in home.iterdir()) == ["keep.txt"]


@pytest.mark.parametrize(
    ("arg", "expected"),
    [
        ("max_gaussians=-5", "max_gaussians=-5: must be in"),
        ("max_gaussians=abc", "max_gaussians=abc: not a number"),
        ("views=abc", "views=abc: must be a whole number"),
        ("fov=abc", "fov=abc: must be an angle"),
        ("maxgaussians=4", "did you mean max_gaussians?"),
    ],
)
def test_view_settings(tmp_path: Path, capsys, arg: str, expected: str) -> None:
    sys.path.insert(0, str(REPO_ROOT))
    import view

    assert view.serve_cli([str(tmp_path / "scene.ply"), arg]) == 2
    err = capsys.readouterr().err
    assert expected in err and len(err.strip().splitlines()) == 1


# --------------------------------------------------------------------------- SfM inputs and cache

DRONE = SHARED_DATA / "examples" / "drone_frames"


@pytest.mark.skipif(not DRONE.is_dir(), reason=f"no drone frames at {DRONE}")
def test_sfm_skips_bad_photos_and_survives_its_cache(tmp_path: Path, monkeypatch) -> None:
    from datamodules.tools.sfm import estimate_poses

    photos = tmp_path / "photos"
    photos.mkdir()
    for name in ("frame_00.jpg", "frame_01.jpg", "frame_02.jpg"):
        (photos / name).write_bytes((DRONE / name).read_bytes())
    (photos / "frame_01b.jpg").write_bytes(b"\xff\xd8 not really a jpeg")  # corrupt, among good
    # Over Pillow's size limit (lowered here: 1500² = 2.25 M pixels > 2 x 1 M raises when opened).
    monkeypatch.setattr(PILImage, "MAX_IMAGE_PIXELS", 1000 * 1000)
    PILImage.fromarray(np.zeros((1500, 1500, 3), np.uint8)).save(photos / "huge.png")
    with pytest.warns(UserWarning) as caught:
        result = estimate_poses(photos, cache="/proc/splatzoo-cache", verbose=0)
    messages = [str(w.message) for w in caught]
    assert any("frame_01b.jpg: not a readable image" in m and "(skipped)" in m for m in messages)
    assert any("huge.png: not a readable image" in m for m in messages)
    assert any("cache cannot be written" in m for m in messages)
    assert "frame_01b.jpg" not in result.registered + result.missing
    assert "huge.png" not in result.registered + result.missing
    # A corrupt cache entry is computed again, not a crash.
    for name in ("huge.png", "frame_01b.jpg"):
        (photos / name).unlink()
    cache = tmp_path / "cache"
    first = estimate_poses(photos, cache=cache, verbose=0)
    (first.model_dir / "images.txt").write_text("1 garbage\n")
    again = estimate_poses(photos, cache=cache, verbose=0)
    assert not again.cached and again.registered == first.registered
    assert estimate_poses(photos, cache=cache, verbose=0).cached


# --------------------------------------------------------------------------- checks before SfM


def _unposed_photos(root: Path, count: int = 3) -> Path:
    """A folder of photos without cameras: ``infer.py`` poses it by structure-from-motion."""
    rng = np.random.default_rng(0)
    root.mkdir()
    for i in range(count):
        pixels = rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)
        PILImage.fromarray(pixels).save(root / f"photo_{i}.png")
    return root


@pytest.fixture
def fake_sfm(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> list[str]:
    """Structure-from-motion replaced by a stand-in that records the stderr printed before it
    started (one entry per call) and stops the run with a one-line SfM error."""
    from datamodules.tools import sfm

    calls: list[str] = []

    def poses_for_input(*args, **kwargs):
        calls.append(capsys.readouterr().err)
        raise sfm.SfmError("fake structure-from-motion: stopped here")

    monkeypatch.setattr(sfm, "poses_for_input", poses_for_input)
    return calls


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ([], ("image_size:", "needs about", "lower image_size")),  # forward pass over memory
        (["holdout=1"], ("holdout=1: every K-th photo needs K >= 2",)),
        (["holdout=nope.png"], ("holdout",)),
        (["center_view=nope.png"], ("center_view=nope.png: not a photo of this capture",)),
        (["holdout=photo_1", "center_view=photo_1"], ("center_view=photo_1: that photo is held",)),
        (["sfm.matching=sideways"], ("sfm",)),
    ],
)
def test_infer_refuses_before_structure_from_motion(
    weights: Path, tmp_path: Path, capsys, monkeypatch, fake_sfm: list[str], args, expected
) -> None:
    """What does not need the poses is refused before SfM's minutes, not after them."""
    from models.core import budget

    if not args:  # the forward pass of 3 photos cannot fit 1 MB; SfM's own estimate is later
        monkeypatch.setattr(budget, "available_memory", lambda device="cpu": 10**6)
    photos = _unposed_photos(tmp_path / "photos")
    out = tmp_path / "out"
    result = infer_here(
        capsys, f"input={photos}", f"output={out}", f"model={POSED}", f"weights={weights}", *args
    )
    assert_bad_input(result, *expected)
    assert fake_sfm == [] and not out.exists()


def test_infer_sfm_cache_warning_comes_before_sfm(
    weights: Path, tmp_path: Path, capsys, monkeypatch, fake_sfm: list[str]
) -> None:
    monkeypatch.setenv("SPLATZOO_SFM_CACHE", "/proc/splatzoo-sfm-cache")
    photos = _unposed_photos(tmp_path / "photos")
    result = infer_here(
        capsys, f"input={photos}", f"output={tmp_path / 'out'}", f"model={POSED}",
        f"weights={weights}",
    )  # fmt: skip
    (before,) = fake_sfm
    assert [line for line in before.splitlines() if "cache cannot be written" in line]
    assert_bad_input(result, "fake structure-from-motion: stopped here")


VIDEO = DRONE.parent / "drone.mp4"


@pytest.mark.skipif(not VIDEO.is_file(), reason=f"no drone video at {VIDEO}")
def test_infer_video_refused_before_structure_from_motion(
    weights: Path, tmp_path: Path, capsys, monkeypatch, fake_sfm: list[str]
) -> None:
    """A video's sampled frames (``views=N``) are counted before any frame is extracted."""
    from models.core import budget

    monkeypatch.setattr(budget, "available_memory", lambda device="cpu": 10**6)
    out = tmp_path / "out"
    result = infer_here(
        capsys, f"input={VIDEO}", f"output={out}", f"model={POSED}", f"weights={weights}",
        "views=6",
    )  # fmt: skip
    assert_bad_input(result, "image_size:", "6 view(s)")
    assert fake_sfm == [] and not out.exists()


def test_view_refuses_before_structure_from_motion(
    weights: Path, tmp_path: Path, capsys, monkeypatch, fake_sfm: list[str]
) -> None:
    """``view.py PHOTOS``: the forward pass's memory is checked before SfM, as in infer.py."""
    from models.core import budget

    sys.path.insert(0, str(REPO_ROOT))
    import view

    monkeypatch.setattr(budget, "available_memory", lambda device="cpu": 10**6)
    photos = _unposed_photos(tmp_path / "photos")
    capsys.readouterr()
    status = view.serve_cli([str(photos), f"model={POSED}", f"weights={weights}", "port=0"])
    err = capsys.readouterr().err
    assert status == 2 and fake_sfm == [], err
    assert len(err.strip().splitlines()) == 1 and "lower image_size" in err, err
