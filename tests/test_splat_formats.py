"""Splat file formats (models.splat_formats) through Gaussians.save/load: round trips within each
format's quantisation, the axis conventions, and one-line errors on bad files."""

from __future__ import annotations

import json
import math
import struct
import zipfile

import numpy as np
import pytest
import torch
from splat_format_fixtures import BOUNDS, FILE_NAMES, assert_within, small_scene

from datamodules.errors import InputError
from models.core.gaussians import Gaussians
from models.core.sh import eval_sh_bases
from models.splat_formats.common import (
    SplatArrays,
    flip_axes,
    kd_chunk_order,
    morton_order,
    sh_parity_signs,
)

FORMATS = list(FILE_NAMES)


@pytest.fixture(scope="module")
def scene():
    return small_scene(count=2000)[0]


def save(scene: Gaussians, folder, name: str):
    path = folder / FILE_NAMES[name]
    scene.save(path, spz_version=3 if name == "spz3" else 4)
    return path


@pytest.mark.parametrize("name", FORMATS)
def test_round_trip_within_the_quantisation(scene, tmp_path, name) -> None:
    path = save(scene, tmp_path, name)
    decoded = Gaussians.load(path)
    assert_within(name, scene, decoded)
    assert decoded.harmonics.dtype == torch.float32
    if name == "sog_folder":
        assert Gaussians.load(tmp_path).means.shape == decoded.means.shape  # the folder itself
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".part")]


def test_spz_versions_and_compression(scene, tmp_path) -> None:
    v4, v3 = tmp_path / "a.spz", tmp_path / "b.spz"
    scene.save(v4)
    scene.save(v3, spz_version=3)
    head4, head3 = v4.read_bytes()[:32], v3.read_bytes()[:2]
    assert struct.unpack_from("<II", head4) == (0x5053474E, 4) and head3 == b"\x1f\x8b"
    assert v4.stat().st_size < 0.2 * (scene.num_slots * 248)  # a tenth-ish of the INRIA .ply
    a, b = Gaussians.load(v4), Gaussians.load(v3)
    assert torch.equal(a.means, b.means) and torch.equal(a.harmonics, b.harmonics)


def test_sh_parity_signs_follow_the_basis() -> None:
    """Flipping axes multiplies each basis function by the sign the table says."""
    directions = torch.nn.functional.normalize(torch.randn(100, 3, dtype=torch.float64), dim=-1)
    for signs in [(-1, -1, 1), (1, -1, -1), (-1, 1, 1), (1, 1, -1)]:
        flipped = directions * torch.tensor(signs, dtype=torch.float64)
        expected = eval_sh_bases(3, flipped) / eval_sh_bases(3, directions)
        table = torch.from_numpy(sh_parity_signs(signs, 16))
        assert torch.allclose(expected, table.expand_as(expected), atol=1e-6)


def test_flip_axes_conjugates_the_covariance() -> None:
    from models.geometry.rotations import quaternion_to_matrix

    rng = np.random.default_rng(1)
    q = rng.normal(size=(20, 4))
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    splats = SplatArrays(
        rng.normal(size=(20, 3)), np.ones((20, 3)), q, np.ones(20), np.zeros((20, 3, 1))
    )
    for signs in [(-1, -1, 1), (1, -1, 1)]:
        s = torch.diag(torch.tensor(signs, dtype=torch.float64))
        out = flip_axes(splats, signs)
        r = quaternion_to_matrix(torch.from_numpy(q))
        r2 = quaternion_to_matrix(torch.from_numpy(out.rotations))
        assert torch.allclose(r2, s @ r @ s, atol=1e-12)
        assert np.allclose(out.means, splats.means * np.array(signs))


def test_kd_chunks_are_tighter_than_morton_chunks() -> None:
    """The compressed PLY's chunk order: a permutation, runs of 256 with every chunk full but the
    last, the same for the same points, and smaller per-chunk quantisation steps than Morton's."""
    generator = np.random.default_rng(1)
    centres = generator.normal(size=(40, 3)) * [8.0, 2.0, 5.0]
    points = centres[generator.integers(0, 40, 5000)] + generator.normal(size=(5000, 3)) * 0.3
    points[:50] = points[50]  # ties
    order = kd_chunk_order(points, 256)
    assert np.array_equal(np.sort(order), np.arange(5000))
    assert np.array_equal(order, kd_chunk_order(points.copy(), 256))

    def mean_step(order: np.ndarray) -> float:
        chunks = [points[order[i : i + 256]] for i in range(0, 5000, 256)]
        extents = np.stack([c.max(axis=0) - c.min(axis=0) for c in chunks])
        return float((extents / [2047.0, 1023.0, 2047.0]).mean())

    assert mean_step(order) < 0.8 * mean_step(morton_order(points))


def test_glb_is_in_gltf_axes(scene, tmp_path) -> None:
    """glTF is +Y up, +Z forward: the OpenCV scene turned 180 degrees about Z."""
    path = save(scene, tmp_path, "glb")
    data = path.read_bytes()
    (length,) = struct.unpack_from("<I", data, 12)
    gltf = json.loads(data[20 : 20 + length])
    assert gltf["extensionsUsed"] == ["KHR_gaussian_splatting"]
    attributes = gltf["meshes"][0]["primitives"][0]["attributes"]
    assert "KHR_gaussian_splatting:SH_DEGREE_3_COEF_6" in attributes
    view = gltf["bufferViews"][gltf["accessors"][attributes["POSITION"]]["bufferView"]]
    start = 20 + length + 8 + view.get("byteOffset", 0)
    positions = np.frombuffer(data, "<f4", count=3 * scene.num_slots, offset=start).reshape(-1, 3)
    assert np.allclose(positions, scene.means[0].numpy() * [-1, -1, 1])


def corrupt_variants(name: str, path):
    """(label, bytes) of broken versions of a good file."""
    data = path.read_bytes()
    yield "truncated", data[: len(data) // 2 - 3]
    yield "empty", b""
    if name in ("spz", "glb", "compressed.ply", "sog"):
        yield "wrong magic", b"XXXX" + data[4:]
    if name == "spz":
        yield "unknown version", data[:4] + struct.pack("<I", 9) + data[8:]
        yield "corrupt stream", data[:200] + bytes(b ^ 0x5A for b in data[200:400]) + data[400:]
    if name == "spz3":
        yield "corrupt gzip", data[:10] + bytes(b ^ 0x5A for b in data[10:60]) + data[60:]


@pytest.mark.parametrize("name", ["spz", "spz3", "sog", "glb", "splat", "compressed.ply"])
def test_broken_files_raise_one_input_error(scene, tmp_path, name) -> None:
    good = save(scene[0].map(lambda t: t[:, :300]), tmp_path, name)
    for label, data in corrupt_variants(name, good):
        bad = tmp_path / ("bad_" + good.name)
        bad.write_bytes(data)
        with pytest.raises(InputError) as caught:
            Gaussians.load(bad)
        assert str(bad) in str(caught.value) and "\n" not in str(caught.value), label


def test_non_finite_values_are_refused(scene, tmp_path) -> None:
    g = scene[0].map(lambda t: t[:, :50].clone())
    g.means[0, 3, 1] = float("nan")
    for name in ("spz", "sog", "glb", "splat", "compressed.ply"):
        path = tmp_path / FILE_NAMES[name]
        with pytest.raises(InputError, match="non-finite means"):
            g.save(path)
        assert not path.exists() and not list(tmp_path.iterdir())
    # a .splat (float32 positions) holding an Inf is refused on reading
    good = tmp_path / "inf.splat"
    scene[0].map(lambda t: t[:, :10]).save(good)
    data = bytearray(good.read_bytes())
    data[0:4] = struct.pack("<f", math.inf)
    good.write_bytes(bytes(data))
    with pytest.raises(InputError, match="non-finite means"):
        Gaussians.load(good)


def test_glb_without_the_extension(scene, tmp_path) -> None:
    path = save(scene[0].map(lambda t: t[:, :20]), tmp_path, "glb")
    data = path.read_bytes()
    (length,) = struct.unpack_from("<I", data, 12)
    gltf = json.loads(data[20 : 20 + length])
    del gltf["meshes"][0]["primitives"][0]["extensions"]
    text = json.dumps(gltf).encode()
    text += b" " * (-len(text) % 4)
    rest = data[20 + length :]
    path.write_bytes(
        struct.pack("<III", 0x46546C67, 2, 20 + len(text) + len(rest))
        + struct.pack("<II", len(text), 0x4E4F534A)
        + text
        + rest
    )
    with pytest.raises(InputError, match="no primitive with the KHR_gaussian_splatting"):
        Gaussians.load(path)


def test_spz_extensions(scene, tmp_path) -> None:
    """A coordinate-system record (Adobe's, RUB) is honoured; an unknown one is skipped."""
    path = tmp_path / "a.spz"
    g = scene[0].map(lambda t: t[:, :100])
    g.save(path)
    data = path.read_bytes()
    header, rest = bytearray(data[:32]), data[32:]
    records = struct.pack("<III", 0xADBE0003, 4, 4) + struct.pack("<II", 0x12340001, 2) + b"\0\0"
    header[14] |= 0x2
    header[16:20] = struct.pack("<I", 32 + len(records))
    path.write_bytes(bytes(header) + records + rest)
    with pytest.warns(UserWarning, match="unknown SPZ extension 0x12340001"):
        rub = Gaussians.load(path)
    g.save(tmp_path / "b.spz")
    plain = Gaussians.load(tmp_path / "b.spz")
    assert torch.allclose(rub.means, plain.means * torch.tensor([1.0, -1.0, -1.0]))
    header[16:20] = struct.pack("<I", 32 + 12)
    records = struct.pack("<III", 0xADBE0003, 4, 13)
    path.write_bytes(bytes(header) + records + rest)
    with pytest.raises(InputError, match="coordinate system 13"):
        Gaussians.load(path)


def test_unknown_suffix_and_sog_without_meta(tmp_path) -> None:
    with pytest.raises(InputError, match="unknown splat file suffix"):
        Gaussians.load(tmp_path / "scene.xyz")
    archive = tmp_path / "scene.sog"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("other.txt", "x")
    with pytest.raises(InputError, match="not a SOG archive"):
        Gaussians.load(archive)
    meta = tmp_path / "meta.json"
    meta.write_text(json.dumps({"version": 1}))
    with pytest.raises(InputError, match="unsupported SOG version 1"):
        Gaussians.load(meta)


def test_bounds_cover_every_format() -> None:
    assert set(BOUNDS) == set(FILE_NAMES)
