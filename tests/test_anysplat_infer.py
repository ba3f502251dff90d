"""``infer.py`` with AnySplat's released architecture at the tiny size (``anysplat_vggt_tiny``),
on deterministic weights saved in the release's Hub format (``config.json`` +
``model.safetensors``, distillation copies included): a photo folder with ``views=all``
(windows), ``holdout=K``, ``refine=N`` and ``formats=[spz,sog]``; a video with ``views=N`` and
``voxel_size=0``; a view count whose forward pass cannot fit refused in one line naming the count
that fits. 28x28 inputs keep each run to seconds.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from config_fixtures import infer_in_process
from data_fixtures import SHARED_DATA
from safetensors.torch import save_file
from splatweaver_release_weights import deterministic_state

from models import Gaussians, create_model
from models.core import budget

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "anysplat"
EXAMPLES = SHARED_DATA / "examples"
TINY = "anysplat_vggt_tiny"
SIZE = "image_size=28"
needs_shared = pytest.mark.skipif(
    not (EXAMPLES / "drone_frames").is_dir(), reason=f"no shared data at {EXAMPLES}"
)


@pytest.fixture(scope="module")
def release_folder(tmp_path_factory) -> Path:
    manifest = json.loads((FIXTURES / "manifest_tiny.json").read_text())
    folder = tmp_path_factory.mktemp("anysplat_tiny")
    save_file(deterministic_state(manifest), folder / "model.safetensors")
    config = {"encoder_cfg": {"name": "anysplat", "voxel_size": 0.002}, "decoder_cfg": {}}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture
def photos(tmp_path: Path) -> Path:
    """Four of the drone frames."""
    folder = tmp_path / "photos"
    folder.mkdir()
    for path in sorted((EXAMPLES / "drone_frames").glob("*.jpg"))[:4]:
        shutil.copy(path, folder / path.name)
    return folder


def _run(capsys, *args: str) -> tuple[int, str]:
    status, _, err = infer_in_process(capsys, *args)
    return status, err


@needs_shared
def test_folder_windows_holdout_refine_formats(release_folder, photos, tmp_path, capsys) -> None:
    out = tmp_path / "out"
    status, err = _run(
        capsys, f"input={photos}", f"output={out}", f"model={TINY}", f"weights={release_folder}",
        SIZE, "views=all", "holdout=4", "refine=2", "formats=[spz,sog]", "orbit_frames=2",
    )  # fmt: skip
    assert status == 0, err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["model"] == TINY and summary["pose_free"]
    # holdout=4: frame_00 held out; the other three in windows of the recipe's 2 views
    assert summary["holdout"]["views"] == ["frame_00.jpg"]
    windows = summary["scene"]["windows"]
    assert len(windows) >= 2 and all(len(w) == 2 for w in windows)
    assert {n for w in windows for n in w} == {"frame_01.jpg", "frame_02.jpg", "frame_03.jpg"}
    assert summary["refine"]["steps"] == 2
    assert "psnr_before_refine" in summary["holdout"]["mean"]
    # every format holds the same Gaussians; SPZ and SOG stop at SH degree 3 (AnySplat's is 4)
    ply = Gaussians.load_ply(out / "gaussians.ply")
    assert ply.sh_degree == 4 and int(ply.count()[0]) == summary["gaussians"]
    for suffix in ("spz", "sog"):
        other = Gaussians.load(out / f"gaussians.{suffix}")
        assert int(other.count()[0]) == summary["gaussians"], suffix
        assert other.sh_degree == 3, suffix
        assert summary["formats"][suffix]["bytes"] > 0


@needs_shared
def test_video_views_and_voxel_size(release_folder, tmp_path, capsys) -> None:
    """``views=3`` frames of the video; ``voxel_size=0``: one Gaussian per input pixel."""
    out = tmp_path / "out"
    status, err = _run(
        capsys, f"input={EXAMPLES / 'drone.mp4'}", f"output={out}", f"model={TINY}",
        f"weights={release_folder}", SIZE, "views=3", "voxel_size=0", "orbit_frames=2",
    )  # fmt: skip
    assert status == 0, err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["views"] == 3 and summary["forward_kwargs"] == {"voxel_size": 0.0}
    assert summary["gaussians"] == 3 * 28 * 28
    cameras = json.loads((out / "cameras.json").read_text())
    assert len(cameras["frames"]) == 3


def test_memory_estimate_grows_with_views_and_pixels() -> None:
    model = create_model(TINY)
    small = model.forward_memory(2, 28, 28)
    assert model.forward_memory(4, 28, 28) > small
    assert model.forward_memory(2, 56, 56) > small
    assert model.max_views_within(small, 28, 28) == 2
    assert model.max_views_within(small - 1, 28, 28) == 1
    estimate = budget.forward_estimate(model, 2, (28, 28))
    assert estimate.peak_bytes == small and estimate.fitting_views is not None


@needs_shared
def test_too_many_views_refused_naming_the_count_that_fits(
    release_folder, photos, tmp_path, capsys, monkeypatch
) -> None:
    """Memory for 3 views but not 4: one line, exit status 2, nothing written, naming 3 (28x42:
    the photos' aspect, so that no crop warning precedes the error)."""
    model = create_model(TINY)
    available = (model.forward_memory(3, 28, 42) + model.forward_memory(4, 28, 42)) // 2
    monkeypatch.setattr(budget, "available_memory", lambda device="cpu": available)
    out = tmp_path / "out"
    status, err = _run(
        capsys, f"input={photos}", f"output={out}", f"model={TINY}", f"weights={release_folder}",
        "image_size=28,42",
    )  # fmt: skip
    assert status == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: views:"), err
    assert "4 view(s)" in lines[0] and "at most 3 view(s) of 28x42 fit" in lines[0], err
    assert not out.exists()
