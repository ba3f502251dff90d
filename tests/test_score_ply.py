"""``bench/score_ply.py``: a scene file scored on a posed capture's held-out photos as
``infer.py`` scores its own (the photos rendered from known Gaussians, so the truth scores high
and a moved copy of it low)."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from datamodules.readers.cameras_json import write_cameras_json
from models.core.gaussians import Gaussians, rgb_to_sh
from models.geometry.camera_paths import orbit_cameras
from models.render import render

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import score_ply  # noqa: E402

SIZE = 32
VIEWS = 10


def _truth(count: int = 400) -> Gaussians:
    generator = torch.Generator().manual_seed(0)
    means = torch.randn(count, 3, generator=generator) * 0.5 + torch.tensor([0.0, 0.0, 3.0])
    return Gaussians(
        means=means[None],
        scales=(torch.rand(count, 3, generator=generator) * 0.08 + 0.02)[None],
        rotations=F.normalize(torch.randn(count, 4, generator=generator), dim=-1)[None],
        opacities=(torch.rand(count, generator=generator) * 0.5 + 0.5)[None],
        harmonics=rgb_to_sh(torch.rand(count, 3, generator=generator))[None, :, :, None],
    )


@pytest.fixture(scope="module")
def posed_capture(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """Photos of known Gaussians with ``cameras.json``, the truth's ``.ply`` and a moved copy."""
    root = tmp_path_factory.mktemp("score_ply")
    truth = _truth()
    k = torch.tensor([[1.0, 0.0, 0.5], [0.0, 1.0, 0.5], [0.0, 0.0, 1.0]])
    extrinsics, intrinsics = orbit_cameras(torch.eye(4), 3.0, k, VIEWS, 1.0)
    with torch.no_grad():
        images = render(truth, extrinsics[None], intrinsics[None], (SIZE, SIZE)).color[0]
    photos = root / "photos"
    photos.mkdir()
    names = [f"view{i:02d}.png" for i in range(VIEWS)]
    for name, image in zip(names, images):
        array = (image.clamp(0, 1) * 255 + 0.5).to(torch.uint8).permute(1, 2, 0).numpy()
        Image.fromarray(array).save(photos / name)
    write_cameras_json(photos / "cameras.json", names, extrinsics, intrinsics, (SIZE, SIZE))
    truth.save_ply(root / "truth.ply")
    moved = dataclasses.replace(truth, means=truth.means + torch.tensor([0.3, 0.0, 0.0]))
    moved.save_ply(root / "moved.ply")
    return photos, root / "truth.ply", root / "moved.ply"


def test_truth_scores_high_and_a_moved_copy_low(posed_capture, capsys):
    photos, truth, moved = posed_capture
    score_ply.main([str(photos), str(truth), str(moved), "--holdout", "4", "--size", str(SIZE)])
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [Path(row["file"]).name for row in rows] == ["truth.ply", "moved.ply"]
    good, bad = rows
    assert list(good["per_photo_psnr"]) == ["view00.png", "view04.png", "view08.png"]
    assert good["psnr"] > 40 and good["train_psnr"] > 40  # 8-bit photos of the same render
    assert good["psnr"] > good["nearest_view_psnr"] + 5
    assert bad["psnr"] < good["psnr"] - 15 and bad["train_psnr"] < good["train_psnr"] - 15
    assert good["gaussians"] == bad["gaussians"] == 400
    assert good["nearest_view_psnr"] == bad["nearest_view_psnr"]


def test_bad_input_is_one_line(posed_capture, tmp_path):
    photos, truth, _ = posed_capture
    with pytest.raises(SystemExit, match="file not found"):
        score_ply.main([str(photos), str(tmp_path / "missing.ply")])
    unposed = tmp_path / "unposed"
    unposed.mkdir()
    for name in ("a.png", "b.png"):
        Image.new("RGB", (SIZE, SIZE)).save(unposed / name)
    with pytest.raises(SystemExit, match="photos need poses"):
        score_ply.main([str(unposed), str(truth)])
    with pytest.raises(SystemExit, match="missing_photos: input not found"):
        score_ply.main([str(tmp_path / "missing_photos"), str(truth)])
