"""python -m models.convert_splats IN OUT: any readable format to any writable one, atomically,
with one-line errors (exit status 2) on bad input."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from data_fixtures import REPO_ROOT
from splat_format_fixtures import assert_within, small_scene

from models.convert_splats import main
from models.core.gaussians import Gaussians


@pytest.fixture(scope="module")
def scene():
    return small_scene(count=500, degree=2)[0]


def test_a_chain_of_conversions_keeps_the_scene(scene, tmp_path, capsys) -> None:
    source = tmp_path / "scene.ply"
    scene.save(source)
    chain = ["a.spz", "b.compressed.ply", "c.glb", "d.ply"]
    previous = source
    for name in chain:
        assert main([str(previous), str(tmp_path / name)]) == 0
        previous = tmp_path / name
    assert "converted" in capsys.readouterr().out
    assert_within("spz", scene, Gaussians.load(tmp_path / "a.spz"))
    # .glb and .ply are lossless (float32): the last two steps keep the compressed PLY's scene
    compressed, last = Gaussians.load(tmp_path / "b.compressed.ply"), Gaussians.load(previous)
    assert torch.allclose(compressed.means, last.means, rtol=0, atol=1e-6)
    assert torch.allclose(compressed.harmonics, last.harmonics, rtol=0, atol=1e-6)
    assert main([str(source), str(tmp_path / "e.spz"), "spz_version=3"]) == 0
    assert (tmp_path / "e.spz").read_bytes()[:2] == b"\x1f\x8b"
    out = tmp_path / "sog" / "meta.json"
    assert main([str(tmp_path / "a.spz"), str(out)]) == 0
    assert torch.equal(Gaussians.load(out.parent).means, Gaussians.load(out).means)


def test_bad_input_is_one_line_and_writes_nothing(scene, tmp_path) -> None:
    broken = tmp_path / "broken.spz"
    broken.write_bytes(b"NGSP" + b"\0" * 7)
    target = tmp_path / "out.sog"
    result = subprocess.run(
        [sys.executable, "-m", "models.convert_splats", str(broken), str(target)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and str(broken) in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken.spz"]


def test_refusals(scene, tmp_path, capsys) -> None:
    source = tmp_path / "scene.spz"
    scene.save(source)
    existing = tmp_path / "taken.glb"
    existing.write_bytes(b"mine")
    assert main([str(source), str(existing)]) == 2
    assert existing.read_bytes() == b"mine"
    assert main([str(source), str(existing), "overwrite=true"]) == 0
    assert main([str(source), str(source), "overwrite=true"]) == 2
    assert main([str(source), str(tmp_path / "x.spz"), "spz_version=5"]) == 2
    assert main([str(source), str(tmp_path / "x.obj")]) == 2
    assert main([str(source)]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line]
    assert len(errors) == 5 and all(line.startswith("error: ") for line in errors)
