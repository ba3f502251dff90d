"""``infer.py ... refine=N`` on a small synthetic capture: 12 ray-cast 64x64 photos of a
room with cameras.json, every 4th held out. The refined output holds held-out scores before and
after refinement (at one size, with the nearest-view baseline), the ``refine`` summary and the
plot; refinement raises the held-out PSNR; ``refine_init=sfm`` without points is one line; Ctrl-C
(SIGINT to a real process) during the fit writes a complete output and says so, and a rerun
resumes from ``refine_checkpoint_every``'s checkpoint; view.py's refine path builds a scene."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from config_fixtures import infer_in_process

REPO_ROOT = Path(__file__).resolve().parents[1]
PHOTOS = 12
COMMON = ("model=pixel_aligned_tiny", "orbit_frames=2", "backend=torch", "device=cpu")


def test_views_all_holdout_refine_scores_before_and_after(capture, tmp_path, capsys) -> None:
    from PIL import Image

    output = tmp_path / "out"
    status, out, err = infer_in_process(
        capsys, f"input={capture}", f"output={output}", "views=all", "holdout=4", "refine=150",
        "refine_size=48", "image_size=32", *COMMON,
    )  # fmt: skip
    assert status == 0, err
    assert "before refinement ->" in out and "nearest view" in out
    summary = json.loads((output / "summary.json").read_text())
    held = summary["holdout"]
    assert held["image_size"] == [48, 48]  # before, after and nearest all at the fit size
    assert held["views"] == ["photo_00.png", "photo_04.png", "photo_08.png"]
    for name in held["views"]:
        entry = held["metrics"][name]
        assert {"psnr", "ssim", "psnr_before_refine", "ssim_before_refine"} <= entry.keys()
        assert "nearest_view_psnr" in entry
        after = Image.open(output / "renders" / "holdout" / f"{Path(name).stem}.png")
        before = Image.open(output / "renders" / "holdout_before" / f"{Path(name).stem}.png")
        assert after.size == before.size == (48, 48)  # the feed-forward scene's render too
        assert before.tobytes() != after.tobytes()
    refine = summary["refine"]
    assert refine["steps"] == 150 and refine["stopped"] == "steps"
    assert refine["image_size"] == [48, 48] and refine["init"] == "auto"  # the default
    assert refine["count_before"] > 0 and refine["curve"] and len(refine["evaluations"]) >= 2
    assert refine["evaluations"][0]["step"] == 0 and refine["evaluations"][-1]["step"] == 150
    # the refinement helps the held-out photos (a real gain, not noise)
    mean = held["mean"]
    assert mean["psnr"] > mean["psnr_before_refine"] + 0.5, mean
    assert abs(refine["evaluations"][-1]["psnr"] - mean["psnr"]) < 0.05
    assert refine["curve"][-1]["loss"] < refine["curve"][0]["loss"]
    assert (output / "refine_psnr.png").is_file() and (output / "holdout_sheet.png").is_file()
    assert not list(tmp_path.glob(".*refine-checkpoint*"))


def test_single_window_refine(capture, tmp_path, capsys) -> None:
    output = tmp_path / "one"
    status, _, err = infer_in_process(
        capsys, f"input={capture}", f"output={output}", "refine=20", "refine_size=32",
        "image_size=32", *COMMON,
    )  # fmt: skip
    assert status == 0, err
    summary = json.loads((output / "summary.json").read_text())
    assert summary["refine"]["steps"] == 20 and "holdout" not in summary
    assert summary["timings_s"]["refine"] > 0


def test_sfm_start_without_points_is_one_line(capture, tmp_path, capsys) -> None:
    output = tmp_path / "sfm"
    status, _, err = infer_in_process(
        capsys, f"input={capture}", f"output={output}", "views=all", "holdout=4", "refine=5",
        "refine_init=sfm", *COMMON,
    )  # fmt: skip
    assert status == 2
    lines = err.strip().splitlines()
    assert lines[-1].startswith("error:") and "refine_init=sfm" in lines[-1], err
    assert not output.exists()


def test_bad_refine_init_is_one_line(capture, tmp_path, capsys) -> None:
    status, _, err = infer_in_process(
        capsys, f"input={capture}", f"output={tmp_path / 'x'}", "refine=5", "refine_init=colmap",
        *COMMON,
    )  # fmt: skip
    assert status == 2 and "refine_init=colmap" in err.strip().splitlines()[-1]


@pytest.mark.parametrize("init", ["sfm", "colmap"])
def test_refine_init_without_a_budget_is_one_line(capture, tmp_path, init, capsys) -> None:
    """Set but unused (no refine= nor refine_time=), or misspelt: refused, not ignored."""
    output = tmp_path / "x"
    status, _, err = infer_in_process(
        capsys, f"input={capture}", f"output={output}", f"refine_init={init}", *COMMON
    )
    lines = err.strip().splitlines()
    assert status == 2 and len(lines) == 1 and f"refine_init={init}" in lines[0], err
    assert not output.exists()


@pytest.mark.parametrize(
    "signum",
    [pytest.param(signal.SIGINT, marks=pytest.mark.slow), signal.SIGTERM],  # one signal path
    ids=["ctrl_c", "sigterm"],
)
def test_stop_writes_the_output_then_a_rerun_resumes(capture, tmp_path, signum) -> None:
    output = tmp_path / "stopped"
    args = [
        sys.executable, str(REPO_ROOT / "infer.py"), f"input={capture}", f"output={output}",
        "views=all", "holdout=4", "refine=100000", "refine_size=32",
        "refine_checkpoint_every=10", *COMMON,
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(
        args, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    checkpoint = tmp_path / ".stopped.refine-checkpoint.pt"
    deadline = time.monotonic() + 600  # waits for an event: generous for a loaded machine
    while not checkpoint.exists() and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.2)
    assert checkpoint.exists(), process.communicate(timeout=30)
    time.sleep(0.5)
    process.send_signal(signum)
    out, err = process.communicate(timeout=120)
    term = signum == signal.SIGTERM
    assert process.returncode == (143 if term else 130), err[-2000:]
    assert f"interrupted by {'SIGTERM' if term else 'Ctrl-C'}" in err and "wrote what it had" in err
    assert "Traceback" not in err
    summary = json.loads((output / "summary.json").read_text())
    stopped_at = summary["refine"]["steps"]
    assert summary["refine"]["stopped"] == "interrupted" and 10 <= stopped_at < 100000
    assert summary["refine"]["checkpoint"] == str(checkpoint.resolve())
    assert "psnr_before_refine" in summary["holdout"]["mean"]
    hidden = [p.name for p in output.glob(".*")]
    assert (output / "gaussians.ply").is_file() and hidden == [".splatzoo-output.json"]
    assert checkpoint.is_file()  # beside the output, never inside it

    # the rerun (same output, overwrite=true) continues from the checkpoint's step
    target = stopped_at + 5
    args = [a for a in args if not a.startswith("refine=")] + [f"refine={target}"]
    done = subprocess.run(
        args + ["overwrite=true"], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
        timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    again = json.loads((output / "summary.json").read_text())["refine"]
    assert again["steps"] == target and again["stopped"] == "steps"
    assert (
        again["evaluations"][0]["step"] == 0 and again["curve"][0] == summary["refine"]["curve"][0]
    )
    assert not checkpoint.exists()  # a finished fit removes it


def test_view_refine_builds_a_scene(capture, capsys) -> None:
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    import view
    from models.view import live

    path, settings = view.parse_args(
        [str(capture), "model=pixel_aligned_tiny", "refine=10", "device=cpu", "backend=torch",
         "image_size=32"]
    )  # fmt: skip
    refined, _, _ = live.live_scene(Path(path), settings)
    settings["refine"] = None
    plain, _, _ = live.live_scene(Path(path), settings)
    assert "re-runs the feed-forward pass only" in capsys.readouterr().err
    assert refined.gaussians.count()[0] == plain.gaussians.count()[0]
    assert not torch.equal(refined.gaussians.means, plain.gaussians.means)


def test_gpu_check_refine_timing_runs_on_the_cpu_backend() -> None:
    """bench/gpu_check.py imports and parses its arguments without a GPU, and its refinement
    timing works (the CPU backend row; CUDA rows run on a lent GPU)."""
    done = subprocess.run(
        [sys.executable, str(REPO_ROOT / "bench" / "gpu_check.py"), "--refine-steps", "-1"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2 and "--refine-steps must be >= 0" in done.stderr
    sys.path.insert(0, str(REPO_ROOT / "bench"))
    try:
        import gpu_check
    finally:
        sys.path.remove(str(REPO_ROOT / "bench"))
    rows, failures = gpu_check.refine_timing(["cpu"], steps=12, count=2000, views=3)
    assert failures == 0 and rows[0]["ok"] == "yes", rows
    assert {"forward ms", "backward ms", "densify ms", "optimizer ms"} <= rows[0].keys()


def test_pose_free_model_on_posed_photos_keeps_their_cameras(capture, tmp_path, capsys) -> None:
    """A pose-free model on photos with cameras: the fit keeps those cameras, which the held-out
    photos' cameras share; only cameras a pose-free model placed are refined jointly."""
    output = tmp_path / "posed"
    status, _, err = infer_in_process(
        capsys, f"input={capture}", f"output={output}", "model=zipsplat_tiny", "views=all",
        "holdout=4", "refine=10", "refine_size=48", "image_size=32", "orbit_frames=2",
        "backend=torch", "device=cpu",
    )  # fmt: skip
    assert status == 0, err
    summary = json.loads((output / "summary.json").read_text())
    assert summary["pose_free"] and set(summary["placement"]) == {"given"}, summary["placement"]
    given = {f["file"]: f["camera_to_world"] for f in json.loads((capture / "cameras.json").read_text())["frames"]}  # fmt: skip
    written = json.loads((output / "cameras.json").read_text())["frames"]
    assert len(written) == 9  # the 12 photos less 3 held out
    for frame in written:  # the capture's own frame: the given cameras, unchanged by the fit
        torch.testing.assert_close(
            torch.tensor(frame["camera_to_world"]), torch.tensor(given[frame["file"]]),
            atol=1e-5, rtol=0,
        )  # fmt: skip


def test_pose_free_photos_without_any_camera_is_one_line(capture, tmp_path, capsys) -> None:
    """A pose-free model that predicts no cameras, photos without poses, no pose fit:
    refinement has no camera to fit the photos at (one line, exit status 2, nothing written)."""
    import shutil

    photos = tmp_path / "photos"
    photos.mkdir()
    for path in sorted(capture.glob("photo_0[0-3].png")):
        shutil.copy(path, photos / path.name)
    output = tmp_path / "free"
    status, _, err = infer_in_process(
        capsys, f"input={photos}", f"output={output}", "model=zipsplat_tiny", "pose_fit_steps=0",
        "refine=5", "image_size=32", "orbit_frames=2", "backend=torch", "device=cpu",
    )  # fmt: skip
    assert status == 2, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: refine:") and "predicts no cameras" in last, err
    assert not output.exists()
