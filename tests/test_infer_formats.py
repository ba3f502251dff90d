"""``infer.py formats=[spz,sog]``: the extra files of the Gaussians beside gaussians.ply, in the
same atomic folder, listed in its marker and in summary.json with their sizes; a bad name is one
line before anything runs; view.py's loader and refine take the other formats."""

from __future__ import annotations

import json

from config_fixtures import infer_in_process
from data_fixtures import REPO_ROOT

from models.core.gaussians import Gaussians
from models.core.output_folder import MARKER_NAME
from models.view.server import load_view_scene


def test_infer_writes_the_formats(capsys, tmp_path) -> None:
    out = tmp_path / "out"
    status, _, err = infer_in_process(
        capsys,
        f"input={REPO_ROOT / 'examples' / 'synthetic_room'}",
        f"output={out}",
        "model=pixel_aligned_tiny",
        "formats=[spz,sog,compressed.ply]",
        "orbit_frames=2",
        "backend=torch",
        "device=cpu",
    )
    assert status == 0, err
    summary = json.loads((out / "summary.json").read_text())
    marker = json.loads((out / MARKER_NAME).read_text())
    ply = Gaussians.load(out / "gaussians.ply")
    for name, suffix in (("spz", ".spz"), ("sog", ".sog"), ("compressed.ply", ".compressed.ply")):
        file = out / ("gaussians" + suffix)
        assert summary["formats"][name] == {"file": file.name, "bytes": file.stat().st_size}
        assert file.name in marker["files"]
        assert Gaussians.load(file).means.shape == ply.means.shape
    assert summary["formats"]["ply"]["bytes"] == (out / "gaussians.ply").stat().st_size
    assert load_view_scene(out / "gaussians.spz").gaussians.means.shape == ply.means.shape


def test_an_unknown_format_is_one_line(capsys, tmp_path) -> None:
    out = tmp_path / "out"
    status, _, err = infer_in_process(
        capsys,
        f"input={REPO_ROOT / 'examples' / 'synthetic_room'}",
        f"output={out}",
        "model=pixel_aligned_tiny",
        "formats=[spz,obj]",
    )
    assert status == 2 and "formats: unknown format 'obj'" in err, err
    assert len(err.strip().splitlines()) == 1 and not out.exists()
