"""infer.py end to end on the shared drone frames and video, on posed inputs, and on every kind of
bad input.

The drone runs and one bad input run the script as a user does (``python infer.py ...`` in a
subprocess: exit status, stderr). The other cases call the same code in-process
(``infer.compose`` + ``infer.run_cli``, what the script's Hydra entry point runs), which spares a
Python + torch start-up per case.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from config_fixtures import infer_in_process
from data_fixtures import SHARED_DATA

from models import create_model, list_models
from models.weights.hub import WEIGHTS_NAME, save_pretrained

REPO_ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = SHARED_DATA / "examples"
SIZE = "image_size=32"  # 32x32 inputs keep every run to seconds on a CPU


def _first(names: list[str]) -> str:
    return names[0] if names else ""


POSE_FREE_CAMERAS = _first([n for n in ("noposplat_tiny",) if n in list_models()])
POSE_FREE_UNKNOWN = _first([n for n in ("zipsplat_tiny", "splatweaver_tiny") if n in list_models()])
POSED = _first([n for n in ("pixel_aligned_tiny",) if n in list_models()])
needs_shared = pytest.mark.skipif(not EXAMPLES.is_dir(), reason=f"no shared data at {EXAMPLES}")


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Random weights of the tiny models the tests run, saved as users' folders would be."""
    root = tmp_path_factory.mktemp("weights")
    out = {}
    for name in {POSE_FREE_CAMERAS, POSE_FREE_UNKNOWN, POSED} - {""}:
        out[name] = save_pretrained(create_model(name), root / name, name=name)
    return out


def run_infer(*args: str) -> subprocess.CompletedProcess:
    """``python infer.py ARGS`` in a subprocess."""
    command = [sys.executable, str(REPO_ROOT / "infer.py"), *args]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore::DeprecationWarning"}
    return subprocess.run(
        command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600
    )


class Result:
    """Exit status and stderr of an in-process run."""

    def __init__(self, returncode: int, stderr: str) -> None:
        self.returncode, self.stderr = returncode, stderr


def infer_here(capsys: pytest.CaptureFixture, *args: str) -> Result:
    """What ``python infer.py ARGS`` runs, in this process."""
    status, _, err = infer_in_process(capsys, *args)
    return Result(status, err)


@pytest.fixture
def needs_two_views(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every model class needs at least two views (``min_views = 2``)."""
    from models.core.base import SplatModel

    def patch(cls: type) -> None:
        monkeypatch.setattr(cls, "min_views", 2)
        for sub in cls.__subclasses__():
            patch(sub)

    list_models()  # the family classes are imported
    patch(SplatModel)


def assert_bad_input(result: subprocess.CompletedProcess | Result, *expected: str) -> str:
    """Exit status 2, exactly one stderr line starting with ``error:`` containing ``expected``."""
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ") and "Traceback" not in result.stderr
    for text in expected:
        assert text in lines[0], (text, lines[0])
    return lines[0]


def assert_no_output(parent: Path, output: Path) -> None:
    assert not output.exists()
    assert not [p.name for p in parent.iterdir() if p.name.startswith(f".{output.name}")]


def check_outputs(output: Path, orbit_frames: int) -> dict:
    """Every output file exists and agrees with summary.json; returns the summary."""
    import imageio.v2 as imageio

    from datamodules.readers.cameras_json import read_cameras_json
    from models import Gaussians

    for name in ("gaussians.ply", "cameras.json", "summary.json", "path.mp4"):
        assert (output / name).is_file(), name
    summary = json.loads((output / "summary.json").read_text())
    cameras = json.loads((output / "cameras.json").read_text())
    # Gaussians: the PLY loads back with the count in summary.json.
    gaussians = Gaussians.load_ply(output / "gaussians.ply")
    assert int(gaussians.count()[0]) == summary["gaussians"] > 0
    # Renders of the input views with known cameras, and the camera path.
    assert len(cameras["frames"]) >= 1
    for frame in cameras["frames"]:
        assert (output / frame["render"]).is_file()
    renders = sorted((output / "renders").iterdir())
    assert len(renders) == len(cameras["frames"])
    assert len(sorted((output / "path").glob("frame_*.png"))) == orbit_frames
    assert len(cameras["path"]) == orbit_frames
    reader = imageio.get_reader(output / "path.mp4")
    frames = [frame for frame in reader]
    reader.close()
    assert len(frames) == orbit_frames
    assert frames[0].shape[:2] == tuple(summary["image_size"])
    # cameras.json is this project's format (usable as input poses).
    table = read_cameras_json(output / "cameras.json")
    assert set(table) == {f["file"] for f in cameras["frames"]}
    for key in ("load_model", "load_inputs", "inference", "render_inputs", "render_path", "total"):
        assert summary["timings_s"][key] >= 0
    assert summary["device"] == "cpu" or summary["device"].startswith("cuda")
    # Nothing left behind by the staging folder.
    assert not [p.name for p in output.parent.iterdir() if p.name.startswith(f".{output.name}")]
    return summary


# --------------------------------------------------------------------------- end to end


@needs_shared
@pytest.mark.skipif(not POSE_FREE_CAMERAS, reason="no pose-free model predicting cameras")
def test_drone_frames(weights, tmp_path: Path, capsys) -> None:
    name = POSE_FREE_CAMERAS
    output = tmp_path / "out"
    result = run_infer(
        f"input={EXAMPLES / 'drone_frames'}",
        f"output={output}",
        f"model={name}",
        f"weights=local-dir:{weights[name]}",
        SIZE,
        "views=4",
        "orbit_frames=6",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = check_outputs(output, 6)
    assert summary["model"] == name and summary["views"] == 4
    # views=4 of a pose-free model: the 4 most similar photos around the middle one
    names = summary["view_names"]
    assert len(names) == 4 and "frame_04.jpg" in names and names == sorted(names)
    assert summary["center_view"] == "frame_04.jpg" and summary["scene"]["windows"] == [names]
    assert summary["poses"].startswith("predicted")
    cameras = json.loads((output / "cameras.json").read_text())
    assert [f["pose"] for f in cameras["frames"]] == ["identity"] + ["predicted"] * 3
    # Original image pixels: the drone frames are 848x480.
    assert {(f["width"], f["height"]) for f in cameras["frames"]} == {(848, 480)}
    assert cameras["frames"][0]["camera_to_world"] == [
        [1.0, 0.0, 0.0, 0.0],
        [0.0, 1.0, 0.0, 0.0],
        [0.0, 0.0, 1.0, 0.0],
        [0.0, 0.0, 0.0, 1.0],
    ]

    # An existing output is refused (and left as it was) unless overwrite=true.
    before = sorted(p.name for p in output.iterdir())
    again = infer_here(capsys, f"input={EXAMPLES / 'drone_frames'}", f"output={output}")
    assert_bad_input(again, str(output), "overwrite=true")
    assert sorted(p.name for p in output.iterdir()) == before


@needs_shared
@pytest.mark.skipif(not POSE_FREE_UNKNOWN, reason="no pose-free model without predicted cameras")
def test_drone_video(weights, tmp_path: Path) -> None:
    name = POSE_FREE_UNKNOWN
    output = tmp_path / "video_out"
    result = run_infer(
        f"input={EXAMPLES / 'drone.mp4'}",
        f"output={output}",
        f"model={name}",
        f"weights={weights[name]}",
        SIZE,
        "views=8",
        "orbit_frames=5",
        "max_gaussians=2000",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = check_outputs(output, 5)
    assert summary["views"] == 8 and len(summary["view_names"]) == 8
    assert 0 < summary["gaussians"] <= 2000
    cameras = json.loads((output / "cameras.json").read_text())
    if summary["poses"].startswith("unknown"):  # pose-free without predicted cameras
        assert len(cameras["unknown_poses"]) == 7 and len(cameras["frames"]) == 1
        assert "orbit" in summary["camera_path"]


@pytest.mark.skipif(not POSED, reason="no posed model")
def test_posed_with_cameras_json(weights, tmp_path: Path, capsys) -> None:
    """A posed model reads cameras.json (the shipped demo example) and writes the same
    intrinsics back, in the input images' pixels."""
    from datamodules.readers.cameras_json import read_cameras_json

    example = REPO_ROOT / "examples" / "synthetic_room"
    output = tmp_path / "posed"
    result = infer_here(
        capsys,
        f"input={example}",
        f"output={output}",
        f"model={POSED}",
        f"weights={weights[POSED] / WEIGHTS_NAME}",
        SIZE,
        "orbit_frames=3",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stderr.strip() == ""
    summary = check_outputs(output, 3)
    assert summary["poses"] == "input (cameras.json)" and summary["views"] == 4
    given = read_cameras_json(example / "cameras.json")
    written = read_cameras_json(output / "cameras.json")
    for name, camera in given.items():
        for key in ("fx", "fy", "cx", "cy", "width", "height"):
            assert written[name][key] == pytest.approx(camera[key], rel=1e-4), (name, key)


@pytest.mark.skipif(not POSE_FREE_UNKNOWN, reason="no pose-free model without predicted cameras")
def test_pose_free_renders_given_cameras(weights, tmp_path: Path, capsys) -> None:
    """A pose-free model that predicts no cameras is rendered from the input's cameras.json."""
    output = tmp_path / "pose_free"
    result = infer_here(
        capsys,
        f"input={REPO_ROOT / 'examples' / 'synthetic_room'}",
        f"output={output}",
        f"model={POSE_FREE_UNKNOWN}",
        f"weights={weights[POSE_FREE_UNKNOWN]}",
        SIZE,
        "orbit_frames=2",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = check_outputs(output, 2)
    assert summary["poses"].startswith("input (cameras.json)")
    assert len(list((output / "renders").iterdir())) == 4


def test_camera_paths() -> None:
    """The interpolated path starts and ends at the input cameras; the orbit looks at its
    target from a circle around the centre camera."""
    import torch

    from models.geometry.camera_paths import interpolate_cameras, orbit_cameras

    angle = torch.tensor(0.4)
    second = torch.eye(4)
    second[0, 0], second[0, 2], second[2, 0], second[2, 2] = (
        angle.cos(),
        angle.sin(),
        -angle.sin(),
        angle.cos(),
    )
    second[:3, 3] = torch.tensor([1.0, 0.2, -0.3])
    poses = torch.stack([torch.eye(4), second, torch.eye(4)])
    k = torch.tensor([[1.0, 0, 0.5], [0, 1.0, 0.5], [0, 0, 1]]).expand(3, 3, 3)
    path, ks = interpolate_cameras(poses, k, 9)
    assert path.shape == (9, 4, 4) and ks.shape == (9, 3, 3)
    assert torch.allclose(path[0], poses[0], atol=1e-6)
    assert torch.allclose(path[4], poses[1], atol=1e-6)  # the middle input camera
    assert torch.allclose(path[-1], poses[2], atol=1e-6)
    rotations = path[:, :3, :3]
    eye = torch.eye(3).expand_as(rotations)
    assert torch.allclose(rotations @ rotations.transpose(1, 2), eye, atol=1e-5)
    orbit, _ = orbit_cameras(torch.eye(4), 2.0, k[0], 8, radius=0.1)
    target = torch.tensor([0.0, 0.0, 2.0])
    for pose in orbit:
        forward = pose[:3, 2]
        to_target = target - pose[:3, 3]
        assert torch.allclose(forward, to_target / to_target.norm(), atol=1e-5)
        assert pose[:3, 3].norm() == pytest.approx(0.1, rel=1e-4)
        assert torch.linalg.det(pose[:3, :3]) == pytest.approx(1.0, rel=1e-5)


@pytest.mark.slow
@needs_shared
@pytest.mark.skipif(not POSED, reason="no posed model")
def test_posed_with_colmap(weights, tmp_path: Path) -> None:
    """COLMAP sparse/ found inside the input folder: the written fx is COLMAP's 595 px."""
    output = tmp_path / "colmap"
    result = run_infer(
        f"input={SHARED_DATA / 'real' / 'drone_colmap'}",
        f"output={output}",
        f"model={POSED}",
        f"weights={weights[POSED]}",
        SIZE,
        "views=2",
        "orbit_frames=2",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = check_outputs(output, 2)
    assert summary["poses"] == "input (colmap)"
    cameras = json.loads((output / "cameras.json").read_text())
    assert all(f["fx"] == pytest.approx(595.0, rel=1e-4) for f in cameras["frames"])


# --------------------------------------------------------------------------- bad input


def _images(folder: Path, good: int, truncated: int = 0) -> Path:
    """A folder with ``good`` drone frames and ``truncated`` cut-off JPEGs."""
    folder.mkdir()
    frames = sorted((EXAMPLES / "drone_frames").glob("*.jpg"))
    for frame in frames[:good]:
        shutil.copy(frame, folder / frame.name)
    for i in range(truncated):
        data = frames[-1].read_bytes()
        (folder / f"broken_{i}.jpg").write_bytes(data[: len(data) // 8])
    return folder


def _pose_free_args(weights: dict[str, Path], output: Path) -> tuple[str, ...]:
    """``output=``, ``model=``, ``weights=`` and the size of the pose-free model that the
    bad-photo tests run."""
    name = POSE_FREE_CAMERAS or POSE_FREE_UNKNOWN
    return (f"output={output}", f"model={name}", f"weights={weights[name]}", SIZE)


def test_empty_folder(weights, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    output = tmp_path / "out"
    result = run_infer(f"input={empty}", *_pose_free_args(weights, output))
    assert_bad_input(result, str(empty), "no images")
    assert_no_output(tmp_path, output)


@needs_shared
def test_one_image_for_a_model_that_needs_two(
    weights, tmp_path: Path, capsys, needs_two_views
) -> None:
    folder = _images(tmp_path / "one", good=1)
    output = tmp_path / "out"
    args = _pose_free_args(weights, output)
    result = infer_here(capsys, f"input={folder}", *args)
    assert_bad_input(result, str(folder), "at least 2 needed")
    single = folder / "frame_00.jpg"  # the image file itself as input
    result = infer_here(capsys, f"input={single}", *args)
    assert_bad_input(result, str(single), "at least 2 needed")
    assert_no_output(tmp_path, output)


@needs_shared
def test_truncated_images_too_few_remain(weights, tmp_path: Path, capsys, needs_two_views) -> None:
    folder = _images(tmp_path / "broken", good=1, truncated=2)
    output = tmp_path / "out"
    result = infer_here(capsys, f"input={folder}", *_pose_free_args(weights, output))
    line = assert_bad_input(result, str(folder), "only 1 readable image")
    assert "broken_0.jpg" in line and "broken_1.jpg" in line
    assert_no_output(tmp_path, output)


@needs_shared
def test_truncated_images_skipped_with_warning(
    weights, tmp_path: Path, capsys, needs_two_views
) -> None:
    folder = _images(tmp_path / "some_broken", good=2, truncated=1)
    output = tmp_path / "out"
    args = _pose_free_args(weights, output)
    result = infer_here(capsys, f"input={folder}", *args, "orbit_frames=2")
    assert result.returncode == 0, result.stderr[-3000:]
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning: ")]
    skipped = [line for line in warnings if "not a readable image" in line]
    # the only other warning allowed is the recipe's crop note (the test photos are not square)
    assert len(skipped) == 1 and "broken_0.jpg" in skipped[0], warnings
    assert all(line in skipped or "centre crop keeps" in line for line in warnings), warnings
    summary = check_outputs(output, 2)
    assert summary["views"] == 2
    assert any("broken_0.jpg" in line for line in summary["warnings"]), summary["warnings"]


@needs_shared
def test_weights_of_another_family(weights, tmp_path: Path, capsys) -> None:
    families = {create_model(n).family: n for n in weights}
    if len(families) < 2:
        pytest.skip("one family among the test models")
    (family_a, source), (family_b, target) = list(families.items())[:2]
    output = tmp_path / "out"
    result = infer_here(
        capsys,
        f"input={EXAMPLES / 'drone_frames'}",
        f"output={output}",
        f"model={target}",
        f"weights=local-dir:{weights[source]}",
        SIZE,
    )
    assert_bad_input(result, str(weights[source]), family_a, family_b)
    assert_no_output(tmp_path, output)


@needs_shared
def test_corrupt_safetensors(weights, tmp_path: Path, capsys) -> None:
    name = POSE_FREE_CAMERAS or POSE_FREE_UNKNOWN
    broken = tmp_path / "broken_weights"
    shutil.copytree(weights[name], broken)
    data = (broken / WEIGHTS_NAME).read_bytes()
    (broken / WEIGHTS_NAME).write_bytes(data[: len(data) // 3])
    output = tmp_path / "out"
    result = infer_here(
        capsys,
        f"input={EXAMPLES / 'drone_frames'}",
        f"output={output}",
        f"model={name}",
        f"weights=local-dir:{broken}",
        SIZE,
    )
    assert_bad_input(result, str(broken / WEIGHTS_NAME), "corrupt")
    assert_no_output(tmp_path, output)


@needs_shared
@pytest.mark.skipif(not POSED, reason="no posed model")
def test_posed_model_without_poses(weights, tmp_path: Path, capsys) -> None:
    """A single image cannot be posed (folders and videos get structure-from-motion poses:
    tests/test_sfm.py)."""
    output = tmp_path / "out"
    args = (f"output={output}", f"model={POSED}", f"weights={weights[POSED]}", SIZE)
    image = EXAMPLES / "drone_frames" / "frame_00.jpg"
    line = assert_bad_input(
        infer_here(capsys, f"input={image}", *args), str(image), "needs camera poses"
    )
    assert "pose-free model" in line
    line = assert_bad_input(
        infer_here(capsys, f"input={image}", *args, "cameras=auto"), str(image), "registered 0"
    )
    assert "model=zipsplat_tiny" in line
    assert_no_output(tmp_path, output)


def test_missing_input_and_unknown_model(tmp_path: Path, capsys) -> None:
    missing = tmp_path / "nowhere"
    output = tmp_path / "out"
    assert_bad_input(
        infer_here(capsys, f"input={missing}", f"output={output}"), str(missing), "not found"
    )
    folder = _images(tmp_path / "in", good=0)
    result = infer_here(capsys, f"input={folder}", f"output={output}", "model=no_such_model")
    assert_bad_input(result, "no_such_model", "unknown model")
    assert_no_output(tmp_path, output)


def test_forward_knobs_are_checked_against_the_model() -> None:
    import torch
    from omegaconf import OmegaConf

    from models import create_model
    from models.pipeline.inference import InferenceError
    from models.pipeline.run import forward_kwargs

    with torch.device("meta"):
        weaver = create_model("splatweaver_tiny")
        zipsplat = create_model("zipsplat_tiny")
    cfg = OmegaConf.create(
        {"model": "splatweaver_tiny", "compression": None, "iterations": None,
         "gaussians_per_pixel": 0.5, "max_gaussians": None}
    )  # fmt: skip
    assert forward_kwargs(weaver, cfg) == {"gaussians_per_pixel": 0.5}
    cfg.gaussians_per_pixel = 3.5  # above the largest expert (3)
    with pytest.raises(InferenceError, match=r"\[0, 3\]"):
        forward_kwargs(weaver, cfg)
    cfg.gaussians_per_pixel, cfg.model = 1.0, "zipsplat_tiny"
    with pytest.raises(InferenceError, match="no 'gaussians_per_pixel' setting"):
        forward_kwargs(zipsplat, cfg)
    cfg.gaussians_per_pixel, cfg.compression = None, 0.25
    assert forward_kwargs(zipsplat, cfg) == {"compression": 0.25}
