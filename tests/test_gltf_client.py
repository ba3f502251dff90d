"""Our ``.glb`` read by a real glTF client: three.js' ``GLTFLoader`` with its
``GLTFGaussianSplatLoaderExtension`` (``KHR_gaussian_splatting``; three 0.187.0 from npm, installed
into ``.node/`` by ``.ci/run``), run headless in Node. The loader turns each splat into what its
renderer draws (centre, covariance, RGBA bytes, SH bytes) without a GPU; those must be our
Gaussians in glTF's axes (the OpenCV scene turned 180 degrees about Z) within the loader's own
8-bit colour and SH packing. Skipped, saying why, without Node or the npm package."""

from __future__ import annotations

import json
import shutil
import subprocess

import numpy as np
import pytest
from data_fixtures import REPO_ROOT
from splat_format_fixtures import small_scene

from models.geometry.rotations import quaternion_to_matrix
from models.splat_formats.common import SH_C0, sh_parity_signs

THREE = REPO_ROOT / ".node" / "node_modules" / "three"
EXTENSION = THREE / "examples" / "jsm" / "loaders" / "GLTFGaussianSplatLoaderExtension.js"
SH_BAND_WORDS = (0, 3, 4, 6)  # uint32 words a splat per SH band in three's packing

# Loads a .glb with GLTFLoader + the KHR_gaussian_splatting plugin, prints every splat mesh's
# decoded arrays as JSON (bytes for the packed SH bands).
READER = """
import { readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";
const [jsm, file] = process.argv.slice(2);
const load = (name) => import(pathToFileURL(`${jsm}/loaders/${name}.js`));
const { GLTFLoader } = await load("GLTFLoader");
const { GLTFGaussianSplatLoaderExtension } = await load("GLTFGaussianSplatLoaderExtension");
const loader = new GLTFLoader();
loader.register((parser) => new GLTFGaussianSplatLoaderExtension(parser));
const bytes = readFileSync(file);
const gltf = await loader.parseAsync(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength), "");
const found = [];
gltf.scene.traverse((object) => { if (object.isGaussianSplat) found.push(object); });
process.stdout.write(JSON.stringify(found.map((object) => {
  const out = { extension: object.userData.gltfExtensions.KHR_gaussian_splatting };
  for (const [name, attribute] of Object.entries(object.splatGeometry.attributes)) {
    const array = attribute.array;
    out[name] = name.startsWith("sphericalHarmonics")
      ? Array.from(new Uint8Array(array.buffer, array.byteOffset, array.byteLength))
      : Array.from(array);
  }
  return out;
})));
"""


def _read_with_three(tmp_path, glb) -> list[dict]:
    node = shutil.which("node")
    if node is None or not EXTENSION.is_file():
        pytest.skip(
            "Node or three.js' GLTFGaussianSplatLoaderExtension absent "
            "(`npm install --prefix .node three@0.187.0`, as .ci/run does)"
        )
    script = tmp_path / "read_glb.mjs"
    script.write_text(READER)
    result = subprocess.run(
        [node, str(script), str(THREE / "examples" / "jsm"), str(glb)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout)


def _bytes(values: np.ndarray, scale: float, offset: float) -> np.ndarray:
    return np.clip(np.round(values * scale + offset), 0, 255)


def test_three_reads_our_glb(tmp_path) -> None:
    gaussians, *_ = small_scene(count=300)
    glb = tmp_path / "scene.glb"
    gaussians.save(glb)
    meshes = _read_with_three(tmp_path, glb)
    assert len(meshes) == 1, f"three.js found {len(meshes)} Gaussian-splat meshes"
    mesh = meshes[0]
    assert mesh["extension"]["kernel"] == "ellipse"
    n = gaussians.num_slots
    flip = np.array([-1.0, -1.0, 1.0])  # OpenCV -> glTF: 180 degrees about Z
    means = gaussians.means[0].double().numpy() * flip
    centres = np.asarray(mesh["position"]).reshape(n, 3)
    np.testing.assert_allclose(centres, means, rtol=0, atol=1e-6)

    rotation = quaternion_to_matrix(gaussians.rotations[0].double()).numpy()  # [N, 3, 3]
    variances = gaussians.scales[0].double().numpy() ** 2
    covariance = np.einsum("nij,nj,nkj->nik", rotation, variances, rotation)
    covariance = covariance * flip[:, None] * flip[None, :]  # F C F
    upper = covariance[:, [0, 0, 0, 1, 1, 2], [0, 1, 2, 1, 2, 2]]  # xx xy xz yy yz zz
    theirs = np.asarray(mesh["covariance"]).reshape(n, 6)
    np.testing.assert_allclose(theirs, upper, rtol=1e-4, atol=1e-10)

    harmonics = gaussians.harmonics[0].double().numpy()  # [N, 3, 16]
    colours = np.asarray(mesh["color"]).reshape(n, 4)
    expected = _bytes(harmonics[:, :, 0] * SH_C0 + 0.5, 255.0, 0.0)
    assert np.abs(colours[:, :3] - expected).max() <= 1, "DC colours differ"
    opacity = _bytes(gaussians.opacities[0].double().numpy(), 255.0, 0.0)
    assert np.abs(colours[:, 3] - opacity).max() <= 1, "opacities differ"

    gltf_sh = harmonics * sh_parity_signs((-1, -1, 1), 16)  # the coefficients in glTF axes
    for degree in (1, 2, 3):
        packed = np.asarray(mesh[f"sphericalHarmonics{degree}"]).reshape(n, -1)
        assert packed.shape[1] == SH_BAND_WORDS[degree] * 4
        count = 2 * degree + 1
        got = packed[:, : 3 * count].reshape(n, count, 3)  # [N, coefficient, RGB]
        band = gltf_sh[:, :, degree**2 : degree**2 + count].transpose(0, 2, 1)
        assert np.abs(got - _bytes(band, 128.0, 128.0)).max() <= 1, f"SH degree {degree}"
    print(f"\nthree.js 0.187 GLTFLoader read {n} Gaussians of our GLB (degree 3)")
