"""Big work is announced and bounded before it starts (``models.core.budget``)."""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

import pytest
import torch
from data_fixtures import SHARED_DATA

from datamodules.tools.sfm_worker import Stages
from models import create_model
from models.core import budget

REPO_ROOT = Path(__file__).resolve().parents[1]
DRONE = SHARED_DATA / "examples" / "drone_frames"


def _context(views: int, side: int) -> dict[str, torch.Tensor]:
    extrinsics = torch.eye(4).expand(1, views, 4, 4).clone()
    extrinsics[0, 1:, 0, 3] = 0.3
    k = torch.tensor([[1.0, 0, 0.5], [0, 1.0, 0.5], [0, 0, 1]])
    return {
        "image": torch.rand(1, views, 3, side, side),
        "extrinsics": extrinsics,
        "intrinsics": k.expand(1, views, 3, 3).clone(),
        "near": torch.full((1, views), 0.5),
        "far": torch.full((1, views), 10.0),
    }


def test_forward_estimate_grows_and_matches_a_measurement() -> None:
    model = create_model("zipsplat_tiny").eval()
    small = budget.forward_estimate(model, 2, (64, 64), name="zipsplat_tiny")
    large = budget.forward_estimate(model, 2, (512, 512))
    more = budget.forward_estimate(model, 4, (64, 64))
    assert small.seconds < more.seconds < large.seconds
    assert small.peak_bytes < more.peak_bytes < large.peak_bytes
    assert small.what.startswith("zipsplat_tiny forward pass, 2 view(s) of 64x64")
    with torch.inference_mode():
        model(_context(2, 128))  # warm
        start = time.perf_counter()
        model(_context(2, 128))
        seconds = time.perf_counter() - start
    estimate = budget.forward_estimate(model, 2, (128, 128))
    assert estimate.seconds / 30 < seconds < estimate.seconds * 30  # order of magnitude


def test_work_that_cannot_fit_is_refused_in_one_line(monkeypatch) -> None:
    model = create_model("zipsplat_tiny")
    estimate = budget.forward_estimate(model, 2, (4096, 4096), name="zipsplat_tiny")
    assert estimate.peak_bytes > 20e9  # the reported image_size=4096 case
    monkeypatch.setattr(budget, "available_memory", lambda device="cpu": 8 * 10**9)
    with pytest.raises(budget.BudgetError) as caught:
        budget.check(estimate)
    message = str(caught.value)
    assert message.startswith("image_size: zipsplat_tiny forward pass, 2 view(s) of 4096x4096")
    assert "8.0 GB available on this machine: lower image_size" in message and "\n" not in message
    budget.check(budget.forward_estimate(model, 2, (64, 64)))  # small work passes


def test_infer_refuses_before_the_forward_pass(monkeypatch, tmp_path, capsys) -> None:
    from test_infer import infer_here

    monkeypatch.setattr(budget, "available_memory", lambda device="cpu": 50 * 10**6)
    out = tmp_path / "out"
    example = REPO_ROOT / "examples" / "synthetic_room"
    result = infer_here(capsys, f"input={example}", f"output={out}", "image_size=256")
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and "lower image_size" in lines[-1], result.stderr
    assert not out.exists()


def test_announce_and_progress_bar(capsys) -> None:
    estimate = budget.Estimate("test work", seconds=120.0, peak_bytes=10**6)
    assert estimate.big and budget.announce(estimate)
    assert "test work: about 2 min, peak about 1 MB" in capsys.readouterr().err
    with budget.running(estimate, enabled=True):
        time.sleep(1.2)
    assert "test work" in capsys.readouterr().err  # the bar
    quiet = budget.Estimate("tiny", seconds=0.01, peak_bytes=10**3)
    assert not budget.announce(quiet) and capsys.readouterr().err == ""
    both = estimate + quiet
    assert both.seconds == pytest.approx(120.01) and both.peak_bytes == 10**6
    assert (estimate * 3).seconds == 360.0


@pytest.mark.skipif(not DRONE.is_dir(), reason=f"no drone frames at {DRONE}")
def test_sfm_is_announced_and_refused_before_pycolmap(tmp_path, monkeypatch, capsys) -> None:
    from datamodules.tools.sfm import SfmError, estimate_poses

    estimate = budget.sfm_estimate(300, (4000, 3000), "sequential")
    assert estimate.seconds > 600  # the reported 300-photo case: minutes, said up front
    assert budget.sfm_estimate(41, (848, 480), "exhaustive").seconds > 60
    photos = tmp_path / "photos"
    photos.mkdir()
    for name in ("frame_00.jpg", "frame_01.jpg"):
        shutil.copy(DRONE / name, photos / name)
    monkeypatch.setattr(budget, "available_memory", lambda device="cpu": 10**8)
    with pytest.raises(
        SfmError,
        match="needs about .* of memory, 0.1 GB available on this machine: lower the number of photos",
    ):
        estimate_poses(photos, cache=False, verbose=1)
    assert "sfm: features" not in capsys.readouterr().err  # refused before the first stage


class ThreadClock:
    """Each thread's own seconds, ``step`` more at each call (any interleaving of threads reads
    the same passes)."""

    def __init__(self, step: float) -> None:
        self.step, self.local = step, threading.local()

    def __call__(self) -> float:
        self.local.now = getattr(self.local, "now", 0.0) + self.step
        return self.local.now


@pytest.mark.parametrize("threads", [1, 2])
def test_machine_slowdown_is_the_probe_against_its_idle_time(threads) -> None:
    """A probe pass 3x its idle time reads 3x slower (each thread's passes, any thread count);
    the reading stays within SLOWDOWN_RANGE, and a real probe is cheap."""
    idle = budget.PROBE_IDLE_SECONDS
    assert budget.machine_slowdown(threads, clock=ThreadClock(3 * idle)) == pytest.approx(3.0)
    assert budget.machine_slowdown(threads, clock=ThreadClock(idle / 2)) == pytest.approx(0.5)
    low, high = budget.SLOWDOWN_RANGE
    assert budget.machine_slowdown(threads, clock=ThreadClock(1e-9)) == low
    assert budget.machine_slowdown(threads, clock=ThreadClock(1e3)) == high
    start = time.perf_counter()
    measured = budget.machine_slowdown(threads)
    elapsed = time.perf_counter() - start
    assert low <= measured <= high
    # the passes (about PROBE_PASSES x the median) and the set-up, on any load the range allows
    assert elapsed < 3 * budget.PROBE_PASSES * idle * max(measured, 1.0) + 0.5


def test_sfm_estimate_follows_the_measured_slowdown() -> None:
    """The stages' times scale with the slowdown (memory does not), and the line says it."""
    base = budget.sfm_estimate(8, (848, 480), "exhaustive")
    slow = budget.sfm_estimate(8, (848, 480), "exhaustive", slowdown=2.5)
    assert slow.seconds == pytest.approx(2.5 * base.seconds)
    assert slow.peak_bytes == base.peak_bytes
    assert "2.5x the idle time (the machine's speed now, measured)" in slow.line()
    assert "idle time" not in base.line()
    stages = budget.sfm_stage_seconds(8, (848, 480), "exhaustive", slowdown=2.5)
    assert sum(stages.values()) == pytest.approx(slow.seconds)
    # the 8 drone frames on an idle machine took 2.0, 1.1 and 2.4 s (docs/budget.md)
    idle = budget.sfm_stage_seconds(8, (848, 480), "exhaustive")
    for stage, seconds in {"features": 2.0, "matching": 1.1, "mapping": 2.4}.items():
        assert seconds / 1.25 <= idle[stage] <= seconds * 1.25


@pytest.mark.skipif(not DRONE.is_dir(), reason=f"no drone frames at {DRONE}")
def test_sfm_measures_the_machine_before_its_estimate(tmp_path, monkeypatch, capsys) -> None:
    """``estimate_poses`` probes the machine once before it says the estimate, and hands the
    same scaled stage estimates to the SfM child; silent runs do not probe."""
    from datamodules.tools import sfm

    photos = tmp_path / "photos"
    photos.mkdir()
    for name in ("frame_00.jpg", "frame_01.jpg", "frame_02.jpg"):
        shutil.copy(DRONE / name, photos / name)
    probes: list[int] = []
    monkeypatch.setattr(budget, "machine_slowdown", lambda threads: probes.append(threads) or 3.0)
    handed: list[dict[str, float]] = []

    def stop_before_colmap(*args) -> None:
        handed.append(args[-1])
        raise sfm.SfmError("stopped before COLMAP")

    monkeypatch.setattr(sfm, "_run_colmap", stop_before_colmap)
    with pytest.raises(sfm.SfmError, match="stopped before COLMAP"):
        sfm.estimate_poses(photos, cache=False, verbose=1, num_threads=2)
    expected = budget.sfm_estimate(3, (848, 480), "exhaustive", slowdown=3.0)
    assert probes == [2]
    assert handed == [budget.sfm_stage_seconds(3, (848, 480), "exhaustive", slowdown=3.0)]
    said = capsys.readouterr().err.splitlines()[0]  # the memory available moves: up to it
    assert said.split(", peak")[0] == expected.line().split(", peak")[0]
    with pytest.raises(sfm.SfmError, match="stopped before COLMAP"):
        sfm.estimate_poses(photos, cache=False, verbose=0, num_threads=2)
    assert probes == [2] and handed[-1] == budget.sfm_stage_seconds(3, (848, 480), "exhaustive")


def test_the_rest_of_a_loop_is_announced_from_a_measured_unit(capsys) -> None:
    """Work no formula predicts (windows of a capture, fusion): the rest at the measured unit's
    time, said when big, silent when not."""
    rest = budget.announce_rest("whole capture (m): 40 windows", 2.5, 38, "window", more=10.0)
    assert rest == pytest.approx(2.5 * 38 + 10.0)
    err = capsys.readouterr().err
    assert (
        err
        == "whole capture (m): 40 windows: about 2 min more (38 window(s) at 2.5 s each, measured)\n"
    )
    assert budget.announce_rest("small", 0.1, 3, "window") == pytest.approx(0.3)
    assert capsys.readouterr().err == ""  # under BIG_SECONDS: nothing said


# Window times (s) of `infer.py input=drone_colmap model=pixel_aligned_tiny views=all`, 40
# windows, measured on the shared 2-core machine (docs/budget.md, "Waits").
DRONE_WINDOWS = [1.93, 1.331, 2.502, 3.087, 3.199, 3.151, 2.94, 3.171, 3.128, 1.992, 3.1, 3.151]
DRONE_WINDOWS += [3.275, 3.162, 3.136, 3.107, 3.023, 3.148, 3.087, 2.474, 3.203, 3.07, 2.651]
DRONE_WINDOWS += [2.488, 1.752, 1.744, 1.293, 1.368, 1.344, 0.676, 1.272, 1.599, 0.716, 1.699]
DRONE_WINDOWS += [0.993, 1.801, 1.311, 1.313, 1.926, 1.506]


@pytest.mark.parametrize("first", [None, 20.0])
def test_countdown_says_the_rest_within_2x_and_revises_it(capsys, first) -> None:
    """A capture's windows: the rest is said after two windows and revised when off by more
    than 2x; every line said is within 2x of the time that was actually left (a slow first
    window, ``first``, is taken for the warm-up it is: the first line is said from the second)."""
    times = list(DRONE_WINDOWS) if first is None else [first, *DRONE_WINDOWS[1:]]
    countdown = budget.Countdown("whole capture (m): 40 windows", len(times), "window")
    said = []
    for index, seconds in enumerate(times):
        countdown.done(seconds)
        line = capsys.readouterr().err
        if line:
            said.append((line, countdown.expected, sum(times[index + 1 :])))
    assert said and said[0][0].startswith("whole capture (m): 40 windows: about")
    assert len(said) > 1 and all("(revised)" in line for line, _, _ in said[1:])
    assert all(left / 2 <= expected <= 2 * left for _, expected, left in said), said


def test_countdown_unit_leaves_out_the_warm_up_and_spikes() -> None:
    """The unit time said: of two units the faster (the first warms up), then the median of the
    last five (one warm-up or one spike of the machine's other work moves it little)."""
    countdown = budget.Countdown("loop", 100, "step")
    countdown.done(3.0)  # warm-up
    countdown.done(0.5)
    assert countdown.unit_seconds() == pytest.approx(0.5)
    for seconds in (0.6, 9.0, 0.4):  # one spike
        countdown.done(seconds)
    assert countdown.unit_seconds() == pytest.approx(0.6)  # of 3.0, 0.5, 0.6, 9.0, 0.4
    for seconds in (1.0, 1.1, 1.2, 1.3, 1.4):  # the machine slowed down
        countdown.done(seconds)
    assert countdown.unit_seconds() == pytest.approx(1.2)


@pytest.mark.parametrize("first", [4.0, 0.2])
def test_countdown_first_line_after_three_units_is_within_2x(capsys, first) -> None:
    """A first window several times slower (zipsplat_tiny's first drone windows) or faster
    (pixel_aligned_tiny's at 256 px) than the rest: the first line waits for a third and holds
    within 2x of the time left."""
    times = [first] + [0.5] * 39
    countdown = budget.Countdown("whole capture (m): 40 windows", len(times), "window")
    for seconds in times[:2]:
        countdown.done(seconds)
    assert capsys.readouterr().err == ""  # two fast units: not yet
    countdown.done(times[2])
    line = capsys.readouterr().err
    assert line == (
        "whole capture (m): 40 windows: about 18 s more (37 window(s) at 0.5 s each, measured)\n"
    )
    left = sum(times[3:])
    assert left / 2 <= countdown.expected <= 2 * left
    for seconds in times[3:]:
        countdown.done(seconds)
    assert "revised" not in capsys.readouterr().err  # it held: never said again


def test_countdown_says_slow_units_after_two(capsys) -> None:
    """Units slow enough that waiting for a third would leave a long wait unsaid: the first
    line after two, from the faster."""
    countdown = budget.Countdown("pose fit: 10 steps", 10, "step")
    countdown.done(9.0)
    countdown.done(6.0)
    assert capsys.readouterr().err.startswith("pose fit: 10 steps: about 48 s more (8 step(s)")
    assert countdown.expected == pytest.approx(48.0)


class FakeClock:
    """Seconds that move only when the test says."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_sfm_says_the_rest_after_each_stage_from_its_measured_speed(capsys) -> None:
    """The SfM child scales the stages left by how long the stages done took against their
    estimate (a machine twice as slow as the constants: the rest said twice as long)."""
    estimates = budget.sfm_stage_seconds(20, (848, 480), "exhaustive")
    assert sum(estimates.values()) == pytest.approx(
        budget.sfm_estimate(20, (848, 480), "exhaustive").seconds
    )
    clock = FakeClock()
    stages = Stages(True, estimates, clock=clock)
    with stages("features", "SIFT on 20 images"):
        clock.now += 2 * estimates["features"]  # twice the estimate
    err = capsys.readouterr().err.splitlines()
    rest = 2 * (estimates["matching"] + estimates["mapping"])
    assert err[0] == "sfm: features: SIFT on 20 images ..."
    assert err[1] == (
        f"sfm: features: done in {2 * estimates['features']:.1f} s; matching and mapping: about "
        f"{rest:.0f} s more (the stages so far took 2.0x their estimate)"
    )
    with stages("matching", "exhaustive, 190 pairs"):
        clock.now += estimates["matching"]  # the two stages together: (2f + m) / (f + m)
    factor = (2 * estimates["features"] + estimates["matching"]) / (
        estimates["features"] + estimates["matching"]
    )
    assert (
        capsys.readouterr()
        .err.splitlines()[1]
        .endswith(
            f"mapping: about {factor * estimates['mapping']:.0f} s more (the stages so far took "
            f"{factor:.1f}x their estimate)"
        )
    )
    with stages("mapping", "incremental mapping"):
        clock.now += 1.0
    assert capsys.readouterr().err.splitlines()[1] == "sfm: mapping: done in 1.0 s"  # none left
    quiet = Stages(True, None, clock=clock)  # no estimates (an older parent): the plain line
    with quiet("features", "SIFT"):
        clock.now += 3.0
    assert capsys.readouterr().err.splitlines()[1] == "sfm: features: done in 3.0 s"


def test_countdown_after_a_time_said_up_front_only_revises(capsys) -> None:
    """A wait said up front from a formula (the synthetic set's generation): nothing more while
    the measured units hold it within 2x, one ``revised`` line when the machine turns out slower."""
    steady = budget.Countdown("generating the synthetic dataset: 50 scenes", 50, "scene", said=50.0)
    for number in range(50):
        steady.done(0.9 if number % 2 else 1.1)  # 50 s as said, each scene off by 10%
    assert capsys.readouterr().err == ""
    slow = budget.Countdown("generating the synthetic dataset: 50 scenes", 50, "scene", said=50.0)
    for _ in range(4):
        slow.done(3.5)  # 175 s in all against 50 said
    err = capsys.readouterr().err
    assert err.startswith("generating the synthetic dataset: 50 scenes (revised): about")
    left = 3.5 * 46
    assert left / 2 <= slow.expected <= 2 * left
