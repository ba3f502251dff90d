"""A compressed file in a real web viewer: Spark (``@sparkjsdev/spark`` with three.js, from npm,
installed into ``.node/`` by ``.ci/run``) opens a SOG (our default writer) and a version-3 SPZ
written by splatzoo in headless Chromium (software WebGL), served on 127.0.0.1; the screenshot
shows the scene where splatzoo's own render of it does. Spark 2.2.0 reads SOG (its "pcsogszip")
and gzip SPZ (v2, v3) but not the ZSTD SPZ v4 ("Invalid gzip header"). Skipped, saying why,
without Chromium, chromedriver, selenium or the npm packages."""

from __future__ import annotations

import functools
import http.server
import io
import json
import math
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from browser import chromium_or_skip, start_chromium
from data_fixtures import REPO_ROOT
from splat_format_fixtures import small_scene

from models.render import render

MODULES = REPO_ROOT / ".node" / "node_modules"
FILES = {
    "three.module.js": MODULES / "three" / "build" / "three.module.js",
    "three.core.js": MODULES / "three" / "build" / "three.core.js",
    "spark.module.js": MODULES / "@sparkjsdev" / "spark" / "dist" / "spark.module.js",
    "addons/postprocessing/Pass.js": MODULES
    / "three"
    / "examples"
    / "jsm"
    / "postprocessing"
    / "Pass.js",
}
WIDTH, HEIGHT = 324, 210

PAGE = """<!doctype html><html><head><style>html,body{margin:0;background:#000;overflow:hidden}
</style><script type="importmap">{"imports": {"three": "./three.module.js",
"three/addons/": "./addons/", "@sparkjsdev/spark": "./spark.module.js"}}</script></head><body><script type="module">
import * as THREE from "three";
import { SparkRenderer, SplatMesh } from "@sparkjsdev/spark";
const view = VIEW;
const renderer = new THREE.WebGLRenderer({ antialias: false, preserveDrawingBuffer: true });
renderer.setPixelRatio(1);
renderer.setSize(view.width, view.height);
document.body.appendChild(renderer.domElement);
const scene = new THREE.Scene();
scene.background = new THREE.Color(0, 0, 0);
scene.add(new SparkRenderer({ renderer }));
const camera = new THREE.PerspectiveCamera(view.fovy, view.width / view.height, 0.01, 1000);
new THREE.Matrix4().fromArray(view.matrix).decompose(camera.position, camera.quaternion, camera.scale);
camera.updateMatrixWorld(true);
const splats = new SplatMesh({ url: "SCENE_FILE" });
scene.add(splats);
window.frames_drawn = 0;
window.addEventListener("error", (event) => { window.load_error = String(event.message); });
splats.initialized.then(() => renderer.setAnimationLoop(() => {
  renderer.render(scene, camera); window.frames_drawn += 1;
})).catch((error) => { window.load_error = String(error); });
</script></body></html>"""


def _spark_or_skip() -> None:
    chromium_or_skip()
    absent = [str(p) for p in FILES.values() if not p.is_file()]
    if absent:
        pytest.skip(f"Spark/three.js not installed ({absent[0]}): see .ci/run's npm install")


def _serve(folder: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

    handler = functools.partial(Quiet, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/index.html"


@pytest.mark.parametrize(
    ("file", "options"), [("scene.sog", {}), ("scene.spz", {"spz_version": 3})], ids=["sog", "spz3"]
)
def test_spark_shows_our_file(tmp_path, file, options) -> None:
    _spark_or_skip()
    from PIL import Image

    gaussians, extrinsics, intrinsics, _ = small_scene(count=3000)
    gaussians = gaussians.replace(scales=gaussians.scales * 3)  # visible at this size
    gaussians.save(tmp_path / file, **options)  # Spark 2.2 reads no SPZ v4 (ZSTD)
    for name, source in FILES.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source, tmp_path / name)
    c2w = extrinsics[0, 0].double() @ torch.diag(torch.tensor([1.0, -1.0, -1.0, 1.0]).double())
    fy = float(intrinsics[0, 0, 1, 1]) * HEIGHT  # normalised -> pixels
    view = {
        "width": WIDTH,
        "height": HEIGHT,
        "fovy": math.degrees(2 * math.atan(HEIGHT / (2 * fy))),
        "matrix": c2w.T.reshape(-1).tolist(),  # column-major, OpenCV -> three.js camera axes
    }
    page = PAGE.replace("VIEW", json.dumps(view)).replace("SCENE_FILE", file)
    (tmp_path / "index.html").write_text(page)
    with torch.no_grad():
        ours = render(
            gaussians, extrinsics[:, :1], intrinsics[:, :1], (HEIGHT, WIDTH), backend="torch"
        )
    reference = ours.color[0, 0].permute(1, 2, 0).clamp(0, 1).numpy()  # [H, W, 3]

    server, url = _serve(tmp_path)
    driver = start_chromium(tmp_path / "chromium", WIDTH, HEIGHT + 200)
    try:
        driver.get(url)
        end = time.time() + 120
        while time.time() < end and not driver.execute_script(
            "return window.load_error || window.frames_drawn > 20"
        ):
            time.sleep(0.5)
        error = driver.execute_script("return window.load_error")
        assert not error, error
        drawn = driver.execute_script("return window.frames_drawn")
        assert drawn is not None, "the page's module did not run (an import failed)"
        assert drawn > 20, f"Spark drew {drawn} frames"
        canvas = driver.find_element("tag name", "canvas")
        shot = np.asarray(Image.open(io.BytesIO(canvas.screenshot_as_png)).convert("RGB"))
    finally:
        driver.quit()
        server.shutdown()
    shot = shot[:HEIGHT, :WIDTH].astype(np.float64) / 255.0
    assert shot.shape == reference.shape, shot.shape
    covered_here, covered_there = shot.max(-1) > 0.05, reference.max(-1) > 0.05
    print(
        f"\nSpark ({file}): {covered_here.mean():.1%} of the pixels lit, "
        f"splatzoo {covered_there.mean():.1%}"
    )
    assert covered_here.mean() > 0.2 * covered_there.mean(), "the screenshot is (nearly) blank"
    overlap = (covered_here & covered_there).sum() / max(1, (covered_here | covered_there).sum())
    grey_here, grey_there = shot.mean(-1).ravel(), reference.mean(-1).ravel()
    correlation = float(np.corrcoef(grey_here, grey_there)[0, 1])
    print(f"lit-pixel overlap {overlap:.2f}, brightness correlation {correlation:.2f}")
    assert overlap > 0.3 and correlation > 0.3, "the screenshot does not show the scene where we do"
