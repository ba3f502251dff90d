"""Interoperability with PlayCanvas' splat-transform (npm ``@playcanvas/splat-transform``, installed
into ``.node/`` by ``.ci/run``): it reads every file we write and converts it back to ``.ply``, and
we read what it writes from the same scene; the Gaussians that come back match within each
format's quantisation and their renders match the original's (PSNR printed per format).

splat-transform reads no ``.glb`` and writes no ``.splat``, so those two go one way only.
"""

from __future__ import annotations

import pytest
import torch
from splat_format_fixtures import (
    BOUNDS,
    FILE_NAMES,
    assert_within,
    render_psnr,
    run_splat_transform,
    small_scene,
    splat_transform,
)

from models.core.gaussians import Gaussians

pytestmark = pytest.mark.skipif(
    splat_transform() is None,
    reason="splat-transform is not installed (node and `npm install --prefix .node "
    "@playcanvas/splat-transform`, as .ci/run does)",
)

READ_BY_IT = ["spz", "spz3", "sog", "sog_folder", "splat", "compressed.ply"]
WRITTEN_BY_IT = ["spz", "spz3", "sog", "sog_folder", "glb", "compressed.ply"]


@pytest.fixture(scope="module")
def scene():
    gaussians, extrinsics, intrinsics, size = small_scene(count=2000)
    return gaussians, extrinsics[:, :1], intrinsics[:, :1], size


def check(name: str, scene, decoded: Gaussians, direction: str) -> None:
    gaussians, extrinsics, intrinsics, size = scene
    found = assert_within(name, gaussians, decoded)
    psnr = render_psnr(gaussians, decoded, extrinsics, intrinsics, size)
    print(
        f"\n{direction} {name}: render PSNR {psnr:.2f} dB; largest errors "
        + ", ".join(f"{k} {v:.3g}" for k, v in found.items() if k != "coefficients")
    )
    assert psnr >= BOUNDS[name].psnr


@pytest.mark.parametrize("name", READ_BY_IT)
def test_splat_transform_reads_what_we_write(scene, tmp_path, name) -> None:
    path = tmp_path / FILE_NAMES[name]
    scene[0].save(path, spz_version=3 if name == "spz3" else 4)
    back = tmp_path / "back.ply"
    run_splat_transform(path, back)
    check(name, scene, Gaussians.load_ply(back), "ours -> splat-transform")


@pytest.mark.parametrize("name", WRITTEN_BY_IT)
def test_we_read_what_splat_transform_writes(scene, tmp_path, name) -> None:
    source = tmp_path / "source.ply"
    scene[0].save(source)
    path = tmp_path / FILE_NAMES[name]
    options = {"spz3": ["--spz-version", "3"], "sog": ["-g", "cpu", "-i", "2"]}
    options["sog_folder"] = options["sog"]
    run_splat_transform(*options.get(name, []), source, path)
    decoded = Gaussians.load(path)
    assert decoded.harmonics.dtype == torch.float32
    check(name, scene, decoded, "splat-transform -> ours")
