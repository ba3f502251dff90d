"""The browser viewer (view.py, models.view.server) and the knob re-runner (models.weights.knobs).

The browser test opens the viewer in Debian's headless Chromium (SwiftShader WebGL) through
selenium and chromedriver; it is skipped, saying why, where those are missing (CI installs them).
"""

from __future__ import annotations

import inspect
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch
from browser import chromium_or_skip, start_chromium

import view
from models import Gaussians, create_model, list_models
from models.geometry.rotations import matrix_to_quaternion, quaternion_to_matrix
from models.view import live
from models.view.server import (
    SplatViewer,
    ViewerError,
    ViewScene,
    gaussians_to_viser,
    load_view_scene,
    opencv_to_viser_pose,
    viser_camera_to_opencv,
)
from models.weights.knobs import MAX_GAUSSIANS, KnobRunner, inference_knobs, knob_free_modules

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "synthetic_room"


def _random_gaussians(n: int = 500, seed: int = 0) -> Gaussians:
    g = torch.Generator().manual_seed(seed)
    rotations = torch.randn(1, n, 4, generator=g)
    return Gaussians(
        means=torch.randn(1, n, 3, generator=g) * 0.3 + torch.tensor([0.0, 0.0, 2.0]),
        scales=torch.rand(1, n, 3, generator=g) * 0.05 + 0.01,
        rotations=rotations / rotations.norm(dim=-1, keepdim=True),
        opacities=torch.rand(1, n, generator=g) * 0.8 + 0.1,
        harmonics=torch.randn(1, n, 3, 4, generator=g),
    )


@pytest.fixture(scope="module")
def context() -> dict[str, torch.Tensor]:
    from datamodules.readers.image_folder import load_images

    images = load_images(EXAMPLE, image_size=(64, 64), num_views=2, poses="auto")
    return images.context()


# --------------------------------------------------------------------------- conversions


def test_gaussians_to_viser_covariance_colour_opacity():
    g = _random_gaussians(200)
    g.mask = torch.ones(1, 200, dtype=torch.bool)
    g.mask[0, :50] = False  # masked entries are left out
    out = gaussians_to_viser(g)
    assert out["centers"].shape == (150, 3) and out["covariances"].shape == (150, 3, 3)
    assert out["rgbs"].shape == (150, 3) and out["opacities"].shape == (150, 1)
    rotations = quaternion_to_matrix(g.rotations[0, 50:].double()).numpy()
    scales = g.scales[0, 50:].double().numpy()
    cov = out["covariances"].astype(np.float64)
    # each local axis is an eigenvector with eigenvalue scale^2
    for axis in range(3):
        v = rotations[:, :, axis]
        np.testing.assert_allclose(
            np.einsum("nij,nj->ni", cov, v), v * scales[:, axis : axis + 1] ** 2, atol=1e-7
        )
    rgb = (0.28209479177387814 * g.harmonics[0, 50:, :, 0] + 0.5).clamp(0, 1).numpy()
    np.testing.assert_allclose(out["rgbs"], rgb, atol=1e-6)
    assert (out["rgbs"].min() >= 0) and (out["rgbs"].max() <= 1) and (rgb == 0).any()
    np.testing.assert_allclose(out["opacities"][:, 0], g.opacities[0, 50:].numpy(), atol=1e-7)


def test_camera_conversion_round_trip_and_field_of_view():
    rng = np.random.default_rng(1)
    for _ in range(20):
        q = rng.normal(size=4)
        q /= np.linalg.norm(q)
        q = -q if q[0] < 0 else q
        rotation = quaternion_to_matrix(torch.from_numpy(q))
        np.testing.assert_allclose(matrix_to_quaternion(rotation).numpy(), q, atol=1e-9)
        pose = np.eye(4)
        pose[:3, :3], pose[:3, 3] = rotation.numpy(), rng.normal(size=3)
        wxyz, position = opencv_to_viser_pose(pose)
        fov, aspect = 0.9, 16 / 9
        extrinsics, k = viser_camera_to_opencv(wxyz, position, fov, aspect)
        np.testing.assert_allclose(extrinsics, pose, atol=1e-9)
        # a point on the top edge of the vertical field of view projects to y = 0, a point on
        # the right edge of the horizontal one (tan(h/2) = aspect tan(v/2)) to x = 1
        top = np.array([0.0, -math.tan(fov / 2), 1.0])
        right = np.array([aspect * math.tan(fov / 2), 0.0, 1.0])
        assert abs((k @ top)[1]) < 1e-12 and abs((k @ right)[0] - 1) < 1e-12


# --------------------------------------------------------------------------- knobs


def test_every_model_declares_knobs_its_forward_takes():
    assert [k.name for k in inference_knobs("zipsplat_tiny")] == ["compression", "max_gaussians"]
    assert [k.name for k in inference_knobs("resplat_tiny")] == ["iterations", "max_gaussians"]
    names = [k.name for k in inference_knobs("splatweaver_tiny")]
    assert names == ["gaussians_per_pixel", "max_gaussians"]
    for name in list_models():
        with torch.device("meta"):
            model = create_model(name)
        accepted = inspect.signature(model.forward).parameters
        for knob in inference_knobs(name):
            assert knob.name in accepted, (name, knob.name)
        assert MAX_GAUSSIANS.name in [k.name for k in inference_knobs(name)], name
        for module in knob_free_modules(name):
            assert isinstance(getattr(model, module), torch.nn.Module), (name, module)


def test_knob_check_messages():
    (compression, _) = inference_knobs("zipsplat_tiny")
    assert compression.check("0.5") == 0.5
    with pytest.raises(ValueError, match=r"compression=0: must be in \(0, 1\]"):
        compression.check(0)
    with pytest.raises(ValueError, match="not a number"):
        compression.check("abc")
    with pytest.raises(ValueError, match="must be an integer"):
        MAX_GAUSSIANS.check(2.5)


@pytest.mark.parametrize(
    "name, knob, values, reused",
    [
        ("zipsplat_tiny", "compression", [1.0, 0.5, 0.25], "backbone"),
        ("resplat_tiny", "iterations", [1, 0, 2], "init_model"),
        ("splatweaver_tiny", "gaussians_per_pixel", [None, 1.0, 0.25], "backbone"),
    ],
)
def test_runner_matches_a_fresh_forward_and_reuses(context, name, knob, values, reused):
    torch.manual_seed(0)
    model = create_model(name).eval()
    runner = KnobRunner(model, context)
    assert reused in runner.reused
    counts = []
    for value in values:
        got = runner.run(**{knob: value})
        with torch.inference_mode():
            want = model(context, **({} if value is None else {knob: value})).gaussians
        for field in ("means", "scales", "rotations", "opacities", "harmonics"):
            torch.testing.assert_close(getattr(got, field), getattr(want, field), rtol=0, atol=0)
        counts.append(int(got.count()[0]))
    assert runner.computed[reused] == 1  # ran once for three settings
    assert runner.forwards == len(values)
    if knob != "iterations":  # iterations refine the same set
        assert len(set(counts)) == len(values), counts
    # max_gaussians prunes the cached result: no forward, same as the forward's own prune
    pruned = runner.run(**{knob: values[-1], "max_gaussians": 50})
    assert runner.forwards == len(values) and int(pruned.count()[0]) == 50
    with torch.inference_mode():
        kwargs = {} if values[-1] is None else {knob: values[-1]}
        want = model(context, max_gaussians=50, **kwargs).gaussians
    torch.testing.assert_close(pruned.means, want.means, rtol=0, atol=0)
    with pytest.raises(ValueError, match="not a knob of this model"):
        runner.run(nonsense=1)


# --------------------------------------------------------------------------- loading, CLI


def test_load_view_scene_and_bad_input(tmp_path):
    g = _random_gaussians(100)
    g.save_ply(tmp_path / "set.ply")
    scene = load_view_scene(tmp_path / "set.ply")
    torch.testing.assert_close(scene.gaussians.means, g.means)
    assert scene.cameras == [] and scene.path is None

    from plyfile import PlyData, PlyElement

    points = np.zeros(4, dtype=[("x", "f4"), ("y", "f4"), ("z", "f4")])
    PlyData([PlyElement.describe(points, "vertex")]).write(tmp_path / "points.ply")
    (tmp_path / "junk.ply").write_bytes(b"not a ply at all")
    for bad in ("points.ply", "junk.ply"):
        with pytest.raises(ViewerError, match=r"not a 3DGS \.ply") as error:
            load_view_scene(tmp_path / bad)
        assert "\n" not in str(error.value) and bad in str(error.value)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ViewerError, match="nothing to show"):
        load_view_scene(tmp_path / "empty")


def test_infer_output_folder_scene(tmp_path):
    import infer

    out = tmp_path / "out"
    cfg = infer.compose([f"input={EXAMPLE}", f"output={out}", "orbit_frames=4", "views=2"])
    assert cfg.view is False
    assert infer.run_cli(cfg) == 0
    scene = load_view_scene(out)
    assert len(scene.cameras) == 2 and scene.path.shape == (4, 4, 4)
    first = scene.cameras[0]
    given = {  # the capture's frame, by photo (views=2 picks neighbours around the middle one)
        Path(f["file"]).stem: f["camera_to_world"]
        for f in json.loads((EXAMPLE / "cameras.json").read_text())["frames"]
    }
    np.testing.assert_allclose(first.extrinsics, given[Path(first.name).stem], atol=1e-5)
    assert first.image is not None and first.image.shape == (128, 128, 3)  # the input photo
    assert 0 < first.fov < math.pi

    # the folder's viewer is live (re-run from summary.json), also where Hydra is initialised
    # (as in infer.py view=true); live=false shows the saved set only
    from hydra import initialize_config_dir

    with initialize_config_dir(version_base="1.3", config_dir=str(REPO / "configs")):
        viewer = live.build(*view.parse_args([str(out)]))
    try:
        assert viewer.runner is not None and "compression" in viewer.knobs
        assert viewer.count == scene.gaussians.num_slots
        torch.testing.assert_close(viewer.gaussians.means, scene.gaussians.means)
        assert len(viewer.scene.cameras) == 2
    finally:
        viewer.stop()
    viewer = live.build(*view.parse_args([str(out), "live=false"]))
    try:
        assert viewer.runner is None and list(viewer.knobs) == ["max_gaussians"]
    finally:
        viewer.stop()

    # infer.py view=true hands its output folder to the viewer
    calls = []
    monkey = pytest.MonkeyPatch()
    monkey.setattr(view, "serve_cli", lambda argv: calls.append(argv) or 0)
    try:
        cfg = infer.compose(
            [f"input={EXAMPLE}", f"output={out}", "orbit_frames=2", "overwrite=true", "view=true"]
        )
        assert infer.run_cli(cfg) == 0
    finally:
        monkey.undo()
    assert calls and calls[0][0] == str(out)


def test_cli_bad_input_is_one_line_exit_2(tmp_path, capsys):
    (tmp_path / "junk.ply").write_bytes(b"ply\nformat ascii 1.0\nend_header\n")
    (tmp_path / "nothing").mkdir()
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    port = busy.getsockname()[1]
    g = _random_gaussians(10)
    g.save_ply(tmp_path / "ok.ply")
    cases = [
        ([str(tmp_path / "junk.ply")], "not a 3DGS .ply"),
        ([str(tmp_path / "nothing")], "nothing to show"),
        ([str(tmp_path / "missing.ply")], "not found"),
        ([str(tmp_path / "ok.ply"), f"port={port}"], f"port={port}: busy"),
        ([str(tmp_path / "ok.ply"), "colour=red"], "unknown setting"),
        ([str(tmp_path / "ok.ply"), "host=203.0.113.7"], "host=203.0.113.7: cannot listen"),
        ([str(tmp_path / "ok.ply"), "port=70000"], "must be in [0, 65535]"),
        ([str(tmp_path / "ok.ply"), "compression=0.5"], "needs a model"),
        ([str(EXAMPLE), "model=zipsplat_tiny", "compression=2", "port=0"], "compression=2"),
        ([str(EXAMPLE), "model=zipsplat_tiny", "iterations=2"], "no 'iterations' knob"),
        ([], "usage"),
    ]
    try:
        for argv, expected in cases:
            assert view.serve_cli(argv) == 2, argv
            err = capsys.readouterr().err.strip()
            assert err.count("\n") == 0 and expected in err, (argv, err)
    finally:
        busy.close()


def test_cli_serves_and_stops_on_ctrl_c_and_models_leaves_viser_out(tmp_path):
    g = _random_gaussians(50)
    g.save_ply(tmp_path / "set.ply")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # one interpreter (imports are slow): `import models` leaves viser out, then view.py runs
    code = (
        "import runpy, sys; import models, models.weights.knobs; "
        "assert 'viser' not in sys.modules, 'import models imported viser'; "
        f"sys.argv = ['view.py', {str(tmp_path / 'set.ply')!r}]; "
        f"runpy.run_path({str(REPO / 'view.py')!r}, run_name='__main__')"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=REPO,  # this checkout's models (not an installed copy)
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        line = process.stdout.readline()
        match = re.search(r"(http://127\.0\.0\.1:\d+/)", line)
        assert match, (line, process.stderr.read() if process.poll() is not None else "")
        with urllib.request.urlopen(match.group(1), timeout=10) as response:
            assert response.status == 200 and b"<html" in response.read(2000).lower()
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=20)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, err
    assert "viewer stopped" in out and "Traceback" not in err


def test_given_port_and_non_loopback_warning(capsys):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    viewer = SplatViewer(ViewScene(_random_gaussians(20)), host="127.0.0.1", port=port)
    try:
        assert viewer.port == port and viewer.url == f"http://127.0.0.1:{port}/"
        assert "warning" not in capsys.readouterr().err
    finally:
        viewer.stop()
    viewer = SplatViewer(ViewScene(_random_gaussians(20)), host="0.0.0.0", port=0)
    try:
        err = capsys.readouterr().err
        assert "warning: host=0.0.0.0 is not a loopback address" in err
    finally:
        viewer.stop()


def test_viewer_without_model_prunes_and_saves(tmp_path):
    g = _random_gaussians(300)
    viewer = SplatViewer(ViewScene(g), host="127.0.0.1", port=0, save_path=tmp_path / "a.ply")
    try:
        assert viewer.url.startswith("http://127.0.0.1:") and viewer.count == 300
        assert list(viewer.knobs) == ["max_gaussians"]
        assert viewer.set_knob("max_gaussians", 120) == 120
        assert viewer._count_text.content == "**Gaussians:** 120"
        saved = Gaussians.load_ply(viewer.save())
        assert saved.num_slots == 120
        kept = g.prune(max_count=120)
        torch.testing.assert_close(saved.means, kept.means)
        assert viewer.set_knob("max_gaussians", None) == 300
        # framed on the Gaussians: their centre straight ahead of the initial camera
        camera = viewer.initial_camera
        forward = camera["look_at"] - camera["position"]
        assert forward[2] > 0 and np.linalg.norm(forward[:2]) < 1e-9
    finally:
        viewer.stop()


# --------------------------------------------------------------------------- in a real browser


def _screenshot(driver) -> np.ndarray:
    import io

    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(driver.get_screenshot_as_png())).convert("RGB"))


def _shown_count(driver) -> int | None:
    from selenium.webdriver.common.by import By

    match = re.search(r"Gaussians:\s*([\d,]+)", driver.find_element(By.TAG_NAME, "body").text)
    return int(match.group(1).replace(",", "")) if match else None


def _wait(predicate, seconds: float = 30.0, step: float = 0.5):
    end = time.time() + seconds
    while time.time() < end:
        value = predicate()
        if value is not None and value is not False:
            return value
        time.sleep(step)
    value = predicate()
    return None if value is False else value


def test_viewer_in_headless_chromium(tmp_path):
    chromium_or_skip()
    from selenium.webdriver.common.by import By

    saved = tmp_path / "saved.ply"
    path, settings = view.parse_args(
        [str(EXAMPLE), "model=zipsplat_tiny", "views=2", f"save={saved}"]
    )
    viewer = live.build(path, settings)
    driver = start_chromium(tmp_path / "chromium", 960, 640)
    try:
        driver.get(viewer.url)
        assert _wait(lambda: _shown_count(driver) == viewer.count), _shown_count(driver)
        start = viewer.count
        client = _wait(lambda: next(iter(viewer.server.get_clients().values()), None))
        assert client is not None
        for button in driver.find_elements(
            By.CSS_SELECTOR, "button.mantine-Notification-closeButton"
        ):
            button.click()  # the "software WebGL" notice

        # where the splats are: the Gaussians' centres projected with the browser's camera
        extrinsics, intrinsics, _ = viewer.client_camera(client)
        means = viewer.gaussians.means[0].double().numpy()
        local = (means - extrinsics[:3, 3]) @ extrinsics[:3, :3]
        local = local[local[:, 2] > 0.05]
        shot = _screenshot(driver)
        h, w = shot.shape[:2]
        uv = (local[:, :2] / local[:, 2:]) * np.array([intrinsics[0, 0], intrinsics[1, 1]])
        uv = (uv + 0.5) * np.array([w, h])
        x0, y0 = np.clip(np.quantile(uv, 0.15, axis=0), 0, [w - 1, h - 1]).astype(int)
        x1, y1 = np.clip(np.quantile(uv, 0.85, axis=0), 0, [w - 1, h - 1]).astype(int)
        assert x1 - x0 > 50 and y1 - y0 > 50, (x0, y0, x1, y1)

        def region(image):
            return image[y0:y1, x0:x1].astype(np.float32)

        def drawn():  # viser's background is white: drawn splats are not
            image = _screenshot(driver)
            painted = (np.abs(region(image) - 255).max(axis=2) > 40).mean()
            return image if painted > 0.5 else None

        viewer.set_cameras_visible(False)  # the splats alone (frustums show images too)
        shot = _wait(drawn)
        assert shot is not None, "the splats were not drawn within 30 s"
        viewer.set_splats_visible(False)

        def emptied():
            image = _screenshot(driver)
            painted = (np.abs(region(image) - 255).max(axis=2) > 40).mean()
            return image if painted < 0.3 else None

        empty = _wait(emptied, 15)
        assert empty is not None, "hiding the splats did not empty their region"
        assert np.abs(region(shot) - region(empty)).mean() > 30
        viewer.set_splats_visible(True)
        assert _wait(drawn, 15) is not None
        viewer.set_cameras_visible(True)
        if os.environ.get("SPLATZOO_VIEWER_SCREENSHOT"):  # the README's picture
            from PIL import Image

            time.sleep(2)
            picture = Image.fromarray(_screenshot(driver))
            palette = picture.quantize(256)  # a dithered 256-colour PNG, ~100 kB
            picture = picture.quantize(palette=palette, dither=Image.Dither.FLOYDSTEINBERG)
            picture.save(os.environ["SPLATZOO_VIEWER_SCREENSHOT"], optimize=True)

        # our renderer on the browser's camera agrees with the browser's own picture
        ours, browser = viewer.render_client(client)
        assert browser is not None and browser.shape == ours.shape
        difference = np.abs(ours.astype(np.float32) - browser.astype(np.float32)).mean()
        correlation = np.corrcoef(ours.mean(axis=2).ravel(), browser.mean(axis=2).ravel())[0, 1]
        print(f"splatzoo vs browser render: mean |diff| {difference:.1f}/255, r {correlation:.3f}")
        assert difference < 10 and correlation > 0.95, (difference, correlation)

        # the panel's buttons, clicked in the page: render this view, save
        def click(label):
            driver.find_element(By.XPATH, f"//button[contains(., '{label}')]").click()

        click("Render this view with splatzoo")
        assert _wait(lambda: viewer._render_image.visible and viewer._browser_image.visible, 20)
        assert _wait(lambda: "mean |splatzoo - browser|" in viewer._status.content, 5)
        assert viewer._render_image.image.shape == ours.shape
        click("Save .ply")
        assert _wait(lambda: saved.is_file(), 15)
        assert Gaussians.load_ply(saved).num_slots == start

        # a knob change through the viewer's API changes the count the browser shows
        assert viewer.set_knob("compression", 0.25) == start // 4
        assert _wait(lambda: _shown_count(driver) == start // 4, 15), _shown_count(driver)
        assert viewer.runner.computed["backbone"] == 1
        assert viewer.set_knob("max_gaussians", 100) == 100
        assert _wait(lambda: _shown_count(driver) == 100, 15), _shown_count(driver)
    finally:
        driver.quit()
        viewer.stop()
        shutil.rmtree(tmp_path / "chromium", ignore_errors=True)
