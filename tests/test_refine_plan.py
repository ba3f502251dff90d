"""The fit's surgery, strategies and plan: ops keep the Adam moments of kept rows and zero those of
new rows; both strategies share one hook signature; plan_fit refuses bad arguments naming them
(with the largest value that fits); a time budget buys its planned steps, pruning the start by
opacity x footprint (announced), and the fit never does fewer steps than planned."""

from __future__ import annotations

import inspect
import math

import pytest
import torch
import torch.nn.functional as F

from models.core.budget import fit_estimate
from models.core.gaussians import Gaussians, rgb_to_sh
from models.geometry.camera_paths import orbit_cameras
from models.pipeline.refine import (
    ADCStrategy,
    MCMCStrategy,
    RefineSettings,
    RefineSettingsError,
    Strategy,
    budget_fit,
    ops,
    plan_fit,
    refine_gaussians,
    settings_from_config,
)
from models.pipeline.refine.fit import _working_start as fit_working_start
from models.pipeline.refine.plan import (
    MIN_WORKING,
    StepTime,
    _seconds,
    cap_screen_size,
    importance,
    replan,
    screen_radii,
)
from models.render import render


def _set(n: int, seed: int = 0, scale: float = 0.05) -> Gaussians:
    generator = torch.Generator().manual_seed(seed)
    means = torch.randn(n, 3, generator=generator) * 0.5 + torch.tensor([0.0, 0.0, 3.0])
    return Gaussians(
        means=means[None],
        scales=torch.full((1, n, 3), scale),
        rotations=F.normalize(torch.randn(n, 4, generator=generator), dim=-1)[None],
        opacities=(torch.rand(n, generator=generator) * 0.5 + 0.4)[None],
        harmonics=rgb_to_sh(torch.rand(n, 3, generator=generator))[None, :, :, None],
    )


def _stepped(n: int = 20):
    """Parameters after one Adam step (non-zero moments)."""
    lrs = dict.fromkeys(ops.NAMES, 0.01)
    params, optimizers = ops.parameters_from_gaussians(_set(n), 0, lrs)
    loss = sum(p.square().sum() for p in params.values())
    loss.backward()
    for optimizer in optimizers.values():
        optimizer.step()
    return params, optimizers


def _moment(params, optimizers, name="means"):
    return optimizers[name].state[params[name]]["exp_avg"]


def test_ops_keep_moments_of_kept_rows_and_zero_new_rows():
    params, optimizers = _stepped()
    before = _moment(params, optimizers).clone()
    state = {"grad_sum": torch.arange(20.0), "counts": {}}
    mask = torch.zeros(20, dtype=torch.bool)
    mask[[3, 7]] = True
    ops.duplicate(params, optimizers, state, mask)
    assert ops.count(params) == 22 and state["grad_sum"].shape == (22,)
    after = _moment(params, optimizers)
    assert torch.equal(after[:20], before) and not after[20:].any()
    assert torch.equal(params["means"][20:], params["means"][[3, 7]])
    ops.remove(params, optimizers, state, torch.arange(22) < 2)
    assert ops.count(params) == 20 and torch.equal(_moment(params, optimizers)[:18], before[2:])
    assert torch.equal(state["grad_sum"][:18], torch.arange(2.0, 20.0))
    split = torch.zeros(20, dtype=torch.bool)
    split[0] = True
    ops.split(params, optimizers, state, split, torch.Generator().manual_seed(0))
    assert ops.count(params) == 21
    assert torch.allclose(params["scales"][-1], params["scales"][-2])
    ops.reset_opacity(params, optimizers, 0.01)
    assert float(torch.sigmoid(params["opacities"].detach()).max()) <= 0.01 + 1e-6
    assert not optimizers["opacities"].state[params["opacities"]]["exp_avg"].any()


def test_relocate_keeps_the_count_and_moves_the_dead():
    params, optimizers = _stepped()
    with torch.no_grad():
        params["opacities"][:5] = -10.0  # dead
    dead = torch.sigmoid(params["opacities"].detach()) <= 0.005
    moved = ops.relocate(params, optimizers, dead, 0.005, torch.Generator().manual_seed(0))
    assert moved == 5 and ops.count(params) == 20
    assert bool((torch.sigmoid(params["opacities"]) > 0.005).all())
    assert not _moment(params, optimizers)[:5].any()


def test_strategies_share_one_hook_signature():
    expected = ["params", "optimizers", "state", "step", "info"]
    for cls in (Strategy, MCMCStrategy, ADCStrategy):
        for hook in ("step_pre_backward", "step_post_backward"):
            assert list(inspect.signature(getattr(cls, hook)).parameters)[1:] == expected


def test_screen_size_cap_shrinks_huge_gaussians():
    g = _set(50)
    g.scales[0, :5] = 2.0  # covers the whole image
    k = torch.tensor([[1.0, 0.0, 0.5], [0.0, 1.0, 0.5], [0.0, 0.0, 1.0]])
    extrinsics, intrinsics = orbit_cameras(torch.eye(4), 3.0, k, 4, 1.0)
    radii = screen_radii(g.means[0], g.scales[0], extrinsics, intrinsics, (64, 64))
    capped, shrunk = cap_screen_size(radii, g, 16.0)
    assert shrunk >= 5
    after = screen_radii(capped.means[0], capped.scales[0], extrinsics, intrinsics, (64, 64))
    assert float(after.max()) <= 16.0 + 1e-3
    order = torch.argsort(importance(after, capped.opacities[0], (64, 64)), descending=True)
    assert order.numel() == 50


def test_plan_fit_names_the_argument_and_the_largest_value_that_fits():
    for bad, argument in (
        (RefineSettings(steps=1.5), "steps"),
        (RefineSettings(time=math.nan), "time"),
        (RefineSettings(steps=10, size=4), "size"),
        (RefineSettings(steps=10, max_gaussians=0), "max_gaussians"),
        (RefineSettings(time=1.0), "time"),  # cannot buy min_steps
    ):
        with pytest.raises(RefineSettingsError) as error:
            plan_fit(bad, 10, (480, 848), 1000)
        assert error.value.argument == argument and "\n" not in str(error.value)
    need = fit_estimate(10_000, 10, (136, 240), 3, "auto").peak_bytes
    limited = RefineSettings(steps=10, size=480, memory_limit=need)
    with pytest.raises(RefineSettingsError) as error:
        plan_fit(limited, 10, (480, 848), 10_000)
    assert error.value.argument == "size" and 240 <= error.value.largest < 480
    with pytest.raises(RefineSettingsError) as error:
        plan_fit(RefineSettings(steps=10, size=240, max_gaussians=10**9), 10, (480, 848))
    assert error.value.argument == "max_gaussians" and error.value.largest < 10**9
    plan = plan_fit(RefineSettings(time=60.0, size=240), 10, (480, 848), 10_000)
    assert plan.image_size == (136, 240) and plan.max_count > 10_000
    with pytest.raises(ValueError, match="refine_size"):
        settings_from_config(refine=10, refine_size=4)


def test_budget_buys_the_minimum_steps_by_pruning_and_caps_growth():
    step_time = StepTime(fixed=0.02, per_gaussian=1e-5)  # 100k Gaussians: 1.02 s a step
    settings = RefineSettings(time=120.0, min_steps=1000)
    strategy = MCMCStrategy(settings.mcmc, 1, 1.0, None, None)
    budget = budget_fit(step_time, 100_000, 10**7, settings, strategy.expected_counts)
    assert abs(budget.working - 10_000) <= 1  # 1000 x (0.02 + 1e-5 n) <= 120
    assert budget.steps >= 1000 and budget.seconds <= 120.0 + 1e-6
    assert budget.cap >= budget.working
    small = budget_fit(step_time, 1000, 10**7, settings, strategy.expected_counts)
    assert small.working == 1000 and small.steps > 1000  # the spare time buys more steps
    slow = StepTime(fixed=1.0, per_gaussian=1e-4)  # 1000 steps cannot fit in 120 s at all
    unreachable = budget_fit(slow, 100_000, 10**7, settings, strategy.expected_counts)
    assert unreachable.working == 10_000 and 0 < unreachable.steps < 1000  # pruned to 2x fixed
    fixed = budget_fit(step_time, 100_000, 10**7, RefineSettings(steps=50), None)
    assert (fixed.working, fixed.steps) == (100_000, 50)


def test_time_budget_fit_prunes_announces_and_does_its_planned_steps(capsys):
    truth = _set(3000, seed=1, scale=0.03)
    k = torch.tensor([[1.0, 0.0, 0.5], [0.0, 1.0, 0.5], [0.0, 0.0, 1.0]])
    extrinsics, intrinsics = orbit_cameras(torch.eye(4), 3.0, k, 4, 1.0)
    with torch.no_grad():
        images = render(truth, extrinsics[None], intrinsics[None], (24, 24)).color[0]
    settings = RefineSettings(time=5.0, min_steps=30, max_screen_fraction=None)
    result = refine_gaussians(truth, images, extrinsics, intrinsics, settings, progress=False)
    plan = result.plan
    assert result.stopped == "steps" and result.steps == plan["steps"] >= 30
    assert plan["working"] + plan["pruned"] == 3000
    line = capsys.readouterr().err
    assert f"refine: {plan['initial_steps']} steps" in line  # the first plan, then re-plans
    # the steps last announced (the first plan or the last announced re-plan), or more after
    # corrections upwards that were not announced
    replans = plan.get("replans", [])
    said = [plan["initial_steps"]] + [r["steps"] for r in replans if r["announced"]]
    assert f"{said[-1]} steps" in line.strip().splitlines()[-1]
    last_said = max([i for i, r in enumerate(replans) if r["announced"]], default=-1)
    unsaid = replans[last_said + 1 :]
    assert all(r["steps"] > said[-1] for r in unsaid)
    assert plan["steps"] == (unsaid[-1]["steps"] if unsaid else said[-1])
    if plan["pruned"]:
        assert "pruned from 3000 by opacity x footprint" in line


def test_merged_start_adds_feed_forward_gaussians_only_in_the_gaps_of_the_sfm_cloud():
    from models.pipeline.refine import gaussians_from_points
    from models.pipeline.refine.start import merged_start

    generator = torch.Generator().manual_seed(0)
    xyz = torch.rand(200, 3, generator=generator) * torch.tensor([1.0, 1.0, 0.1])
    xyz = xyz + torch.tensor([-1.0, -0.5, 3.0])  # the left half of a slab in front of the cameras
    points = gaussians_from_points(xyz, torch.rand(200, 3, generator=generator), sh_degree=1)
    ff = _set(400, seed=2, scale=0.02)
    ff.means[0, :, 1] = torch.rand(400, generator=generator) * 0.8 - 0.4
    ff.means[0, :, 2] = 3.05
    ff.means[0, :, 0] = torch.linspace(-1.0, 1.0, 400)  # half on the cloud, half right of it
    k = torch.tensor([[1.0, 0.0, 0.5], [0.0, 1.0, 0.5], [0.0, 0.0, 1.0]])
    extrinsics, intrinsics = orbit_cameras(torch.eye(4), 3.0, k, 4, 0.3)
    start, counts = merged_start(ff, points, extrinsics, intrinsics, (32, 32))
    assert counts["sfm"] == 200 and 0 < counts["feed_forward"] <= 200
    added = start.means[0, 200:]
    assert bool((added[:, 0] > -0.1).all())  # none where the SfM cloud already is
    assert start.sh_degree == 1 and start.count().item() == 200 + counts["feed_forward"]
    alone, only = merged_start(ff, None, extrinsics, intrinsics, (32, 32))
    assert only == {"sfm": 0, "feed_forward": 400} and alone.count().item() == 400
    # those right of the cloud share a cell with no point in any view: nothing confirms them
    assert counts["off_depth"] > 0 and "off_depth" not in only


def test_depth_agreement_drops_gaussians_in_front_of_or_behind_the_sfm_surface():
    """A gap-filler on the SfM points' surface is kept; one floating in front of that surface or
    hidden behind it in some training view is not, nor one that no point confirms in any view."""
    from models.pipeline.refine.start import depth_agreement

    generator = torch.Generator().manual_seed(0)
    xyz = torch.rand(400, 3, generator=generator) * torch.tensor([1.0, 1.0, 0.0])
    points = xyz + torch.tensor([-1.0, -0.5, 3.0])  # the left half of a plane at z = 3
    k = torch.tensor([[1.0, 0.0, 0.5], [0.0, 1.0, 0.5], [0.0, 0.0, 1.0]])
    extrinsics = torch.eye(4).repeat(3, 1, 1)
    extrinsics[:, 0, 3] = torch.tensor([-0.2, 0.0, 0.2])  # three cameras looking down +z
    means = torch.tensor(
        [
            [-0.5, 0.0, 3.0],  # on the surface, between points
            [-0.5, 0.1, 2.0],  # in front of it (a floater)
            [-0.5, -0.1, 4.5],  # behind it
            [1.2, 0.0, 3.0],  # right of the cloud: no point in its cell in any view
        ]
    )
    agree = depth_agreement(means, points, extrinsics, k.expand(3, 3, 3), (64, 64))
    assert agree.tolist() == [True, False, False, False]


def _scene(n: int = 300):
    truth = _set(n, seed=1, scale=0.03)
    k = torch.tensor([[1.0, 0.0, 0.5], [0.0, 1.0, 0.5], [0.0, 0.0, 1.0]])
    extrinsics, intrinsics = orbit_cameras(torch.eye(4), 3.0, k, 4, 1.0)
    with torch.no_grad():
        images = render(truth, extrinsics[None], intrinsics[None], (16, 16)).color[0]
    return truth, images, extrinsics, intrinsics


class _FakeClock:
    """Each step of the fit reads the clock 5 times: 4 ticks of ``step / 4`` make a step last
    ``step`` seconds."""

    def __init__(self, step: float) -> None:
        self.now, self.tick = 0.0, step / 4

    def __call__(self) -> float:
        self.now += self.tick
        return self.now


def test_an_optimistic_plan_is_replanned_from_the_real_steps(monkeypatch, capsys):
    from models.pipeline.refine import fit as fit_module

    truth, images, extrinsics, intrinsics = _scene()
    # the start's measurement says 2.5 ms a step; the real steps take 10 ms (4x slower)
    monkeypatch.setattr(fit_module, "measure_step_time", lambda *a, **k: StepTime(0.0025, 0.0))
    monkeypatch.setattr(fit_module, "clock", _FakeClock(0.01))
    settings = RefineSettings(time=2.0, min_steps=100, max_screen_fraction=None, densify="none")
    result = refine_gaussians(truth, images, extrinsics, intrinsics, settings, progress=False)
    plan = result.plan
    assert plan["initial_steps"] == 800  # 2 s / 2.5 ms
    first = plan["replans"][0]
    # re-measured after a tenth of the budget (0.2 s: 20 steps after the first), before the
    # 50 steps of REPLAN_STEPS
    assert 21 <= first["step"] <= 22 and first["factor"] == pytest.approx(4.0)
    assert 195 <= plan["steps"] <= 200  # ~21 done in 0.21 s, 1.79 s left at 10 ms a step
    assert result.stopped == "steps" and result.steps == plan["steps"]
    assert result.seconds == pytest.approx(plan["steps"] * 0.01, rel=1e-6)
    assert plan["real_step_seconds"] == pytest.approx(0.01)
    err = capsys.readouterr().err
    assert "refine: 800 steps" in err
    assert (
        f"re-planned at step {first['step']} from the steps done (0.010 s a step so far, 4.00x"
        in err
    )
    assert f"{first['steps']} steps (was 800)" in err


class _RisingClock(_FakeClock):
    """A step lasts ``step`` seconds until ``reads`` clock reads, then ``later`` seconds (a fit
    whose steps grow dearer than the start's line says, as densification adds overlap)."""

    def __init__(self, step: float, later: float, reads: int) -> None:
        super().__init__(step)
        self.later, self.reads = later / 4, reads

    def __call__(self) -> float:
        self.reads -= 1
        if self.reads == 0:
            self.tick = self.later
        return super().__call__()


@pytest.mark.parametrize("densify", ["none", "mcmc"])
def test_a_fit_whose_steps_grow_dearer_ends_on_its_budget(monkeypatch, densify):
    """The re-plans correct the steps of a plan that would miss the budget by more than
    REPLAN_TIME_TOLERANCE by the latest steps' time (REPLAN_MEMORY), even when fewer than
    REPLAN_TOLERANCE's steps move."""
    from models.pipeline.refine import fit as fit_module

    truth, images, extrinsics, intrinsics = _scene()
    monkeypatch.setattr(fit_module, "measure_step_time", lambda *a, **k: StepTime(0.01, 0.0))
    # 10 ms a step as measured for the first 100 steps (5 clock reads a step), then 13 ms
    monkeypatch.setattr(fit_module, "clock", _RisingClock(0.01, 0.013, 500))
    settings = RefineSettings(time=4.0, min_steps=50, max_screen_fraction=None, densify=densify)
    result = refine_gaussians(truth, images, extrinsics, intrinsics, settings, progress=False)
    assert result.plan["initial_steps"] == 400
    assert all(r["pruned"] == 0 for r in result.plan["replans"])  # corrections never prune
    assert result.stopped == "steps" and result.steps == result.plan["steps"]
    assert 3.9 <= result.seconds <= 4.0 * 1.03  # 100 x 10 ms, then ~230 x 13 ms
    replans = result.plan["replans"]
    assert 1.2 < replans[-1]["recent_factor"] <= 1.3 + 1e-6  # the latest steps: near 1.3
    assert replans[-1]["factor"] < replans[-1]["recent_factor"]  # all the steps: 1.0 and 1.3
    # every re-plan that cut steps was announced: the fit never does fewer than it said
    announced = [r["steps"] for r in replans if r["announced"]]
    assert announced and result.steps >= announced[-1]
    assert all(r["announced"] for a, r in zip(replans, replans[1:]) if r["steps"] < a["steps"])


def test_each_quarter_is_evaluated_once_when_a_replan_adds_steps(monkeypatch):
    """A re-plan that adds steps moves the progress back below a quarter already evaluated;
    the quarter is not evaluated again (the drone capture's runs evaluated one up to 5 times)."""
    from models.pipeline.refine import fit as fit_module

    truth, images, extrinsics, intrinsics = _scene()
    monkeypatch.setattr(fit_module, "measure_step_time", lambda *a, **k: StepTime(0.01, 0.0))
    # 10 ms a step as measured for 60 steps (past the first quarter of 200), then 5 ms
    monkeypatch.setattr(fit_module, "clock", _RisingClock(0.01, 0.005, 300))
    settings = RefineSettings(time=2.0, min_steps=50, max_screen_fraction=None, densify="none")
    result = refine_gaussians(truth, images, extrinsics, intrinsics, settings, progress=False,
                              evaluate=lambda g, e: {"psnr": 0.0})  # fmt: skip
    assert result.plan["initial_steps"] == 200 and result.steps > 250  # steps were added
    steps = [e["step"] for e in result.evaluations]
    assert steps[0] == 0 and steps[-1] == result.steps
    inner = steps[1:-1]  # one per quarter: the first at the plan of 200, the rest later
    assert len(inner) == 3 and inner == sorted(inner) and 50 <= inner[0] <= 60


def test_replan_remakes_a_plan_that_would_miss_the_budget():
    settings = RefineSettings(time=100.0, min_steps=100)
    strategy = Strategy(1, None, None)
    planned = budget_fit(StepTime(0.1, 0.0), 1000, 10**6, settings, strategy.expected_counts)
    assert planned.steps == 1000
    # 500 steps in 50 s, the rest 6% dearer: the old plan ends at 103 s, 3% of 100 s too late
    dearer = replan(StepTime(0.106, 0.0), 500, 50.0, 1000, planned, 10**6, settings,
                    strategy.expected_counts)  # fmt: skip
    assert dearer is not None and dearer.steps == 500 + int(50.0 / 0.106)  # 971: a 3% move
    assert dearer.seconds <= 100.0 + 1e-6
    near = replan(StepTime(0.101, 0.0), 500, 50.0, 1000, planned, 10**6, settings,
                  strategy.expected_counts)  # fmt: skip
    assert near is None  # 100.5 s: within REPLAN_TIME_TOLERANCE, nothing moves
    # all the steps say on time; the latest say 6% dearer: only the steps are corrected
    late = replan(StepTime(0.1, 0.0), 500, 50.0, 1000, planned, 10**6, settings,
                  strategy.expected_counts, recent=StepTime(0.106, 0.0))  # fmt: skip
    assert late is not None
    assert (late.steps, late.cap, late.working) == (dearer.steps, planned.cap, 1000)
    # densification grew the set since the plan: a correction keeps what is there (pruning it
    # back to the plan's count cut a real drone fit's cap from 115,981 to 24,334)
    grown = replan(StepTime(0.1, 0.0), 500, 50.0, 1040, planned, 10**6, settings,
                   strategy.expected_counts, recent=StepTime(0.106, 0.0))  # fmt: skip
    assert grown is not None and (grown.working, grown.cap) == (1040, planned.cap)
    fixed = RefineSettings(time=100.0, steps=1000)
    assert replan(StepTime(0.1, 0.0), 500, 50.0, 1000, planned, 10**6, fixed,
                  strategy.expected_counts, recent=StepTime(0.106, 0.0)) is None  # fmt: skip


def test_replan_moves_the_cap_by_more_than_one_round_of_the_schedule_only():
    """MCMC's plan puts the cap on its schedule's rounds (5% each): a step time that wavers
    by a few percent moved the cap one round up and down at every re-plan of a real drone fit
    (11 announced lines in 8 minutes); the steps absorb such a move instead."""
    from models.pipeline.refine import MCMCSettings

    settings = RefineSettings(time=100.0, min_steps=1000)
    strategy = MCMCStrategy(MCMCSettings(), 10**6, 1.0, None, torch.Generator())
    assert strategy.round_growth == MCMCSettings().growth == 0.05
    line = StepTime(0.005, 2e-7)
    planned = budget_fit(line, 10_000, 10**6, settings, strategy.expected_counts)
    schedule = strategy.expected_counts(planned.working, planned.steps, planned.cap)
    count = max(n for step, n in schedule if step <= 1000)

    def again(factor: float, round_growth: float):
        seconds = _seconds(line.scaled(factor), schedule, 1000)  # the first 1000 steps
        return replan(line.scaled(factor), 1000, seconds, count, planned, 10**6, settings,
                      strategy.expected_counts, round_growth=round_growth)  # fmt: skip

    # 4% cheaper than measured: without the rounds the cap moved one round up
    assert again(0.96, 0.0).cap == pytest.approx(1.05 * planned.cap, rel=1e-3)
    kept = again(0.96, strategy.round_growth)
    assert kept.cap == planned.cap and kept.working == count
    assert kept.steps > planned.steps and 98.0 <= kept.seconds <= 100.0  # the steps took it
    # 9% cheaper: two rounds up, taken either way
    assert again(0.91, strategy.round_growth).cap == pytest.approx(1.1025 * planned.cap, rel=1e-3)


def test_replan_prunes_to_buy_the_owed_steps_but_never_below_keep():
    settings = RefineSettings(time=100.0, min_steps=1000)
    strategy = Strategy(1, None, None)
    planned = budget_fit(StepTime(0.01, 1e-5), 10_000, 10**6, settings, strategy.expected_counts)
    assert planned.working == 9_000 and planned.steps == 1000  # 1000 x (0.01 + 0.09)
    slower = StepTime(0.01, 4e-5)  # the real steps: the per-Gaussian part is 4x the measured
    # after 100 steps in 40 s: 900 steps owed in 60 s -> 0.0667 s a step -> 1416 Gaussians
    new = replan(slower, 100, 40.0, 9_000, planned, 10**6, settings, strategy.expected_counts)
    assert new.steps >= 1000 and new.working == pytest.approx(1416, abs=2)
    assert new.seconds <= 100.0 + 1e-6
    kept = replan(
        slower, 100, 40.0, 9_000, planned, 10**6, settings, strategy.expected_counts, 5000
    )
    assert kept.working == 5000 and 100 < kept.steps < 1000  # what 60 s buys at 5000: 285 more
    assert kept.steps == 100 + int(60.0 / slower(5000))
    same = replan(StepTime(0.01, 1e-5), 100, 10.0, 9_000, planned, 10**6, settings,
                  strategy.expected_counts)  # fmt: skip
    assert same is None  # on schedule: nothing moves


def test_replan_never_prunes_once_the_owed_steps_are_done():
    """Late in a fit, with the minimum steps done and the budget spent, a slower line cuts the
    steps; it never prunes the fitted set to buy more."""
    settings = RefineSettings(time=100.0, min_steps=1000)
    strategy = Strategy(1, None, None)
    planned = budget_fit(StepTime(0.01, 1e-5), 10_000, 10**6, settings, strategy.expected_counts)
    slower = StepTime(0.01, 4e-5)
    late = replan(slower, 3400, 99.9, 80_000, planned, 10**6, settings, strategy.expected_counts)
    assert late is not None and late.working == 80_000  # not pruned
    assert late.steps <= 3401  # what 0.1 s buys at 80,000 Gaussians: at most one more step
    owed = replan(slower, 100, 40.0, 9_000, planned, 10**6, settings, strategy.expected_counts)
    assert owed.working < 9_000  # while steps are still owed, pruning buys them


def test_budget_never_prunes_below_keep_nor_min_working():
    step_time = StepTime(fixed=0.02, per_gaussian=1e-5)
    settings = RefineSettings(time=120.0, min_steps=1000)
    counts = Strategy(1, None, None).expected_counts
    assert abs(budget_fit(step_time, 100_000, 10**7, settings, counts).working - 10_000) <= 1
    assert budget_fit(step_time, 100_000, 10**7, settings, counts, keep=40_000).working == 40_000
    tiny = StepTime(fixed=0.2, per_gaussian=1e-3)  # nothing buys 1000 steps
    assert budget_fit(tiny, 5_000, 10**7, settings, counts).working == MIN_WORKING


def test_the_start_is_measured_where_the_fit_runs(monkeypatch, capsys):
    from models.pipeline.refine import plan as plan_module

    truth, images, extrinsics, intrinsics = _scene(3000)
    timed: list[int] = []

    def fake_time(gaussians, *args):  # a step costs 1 ms + 0.1 ms a Gaussian
        timed.append(int(gaussians.means.shape[1]))
        return 0.001 + 1e-4 * gaussians.means.shape[1]

    monkeypatch.setattr(plan_module, "_time_steps", fake_time)
    # 100 steps at 2500 Gaussians take 25 s: the budget would prune further, keep stops it
    settings = RefineSettings(time=20.0, min_steps=100, max_screen_fraction=None)
    counts = MCMCStrategy(settings.mcmc, 1, 1.0, None, None).expected_counts
    plan = plan_fit(settings, 4, (16, 16), 3000)
    start, budget, record, step_time = fit_working_start(
        truth, (images, extrinsics, intrinsics), settings, plan, counts, keep=2500
    )
    assert timed[:2] == [750, 3000]  # the first line: the quarter and the whole start
    assert budget.working == 2500 and start.count().item() == 2500  # keep: the floor
    assert timed[2] == 2500 and timed[3] > 2500  # then where it runs: working and grown
    assert step_time.fixed == pytest.approx(0.001) and step_time.per_gaussian == pytest.approx(1e-4)
    assert record["pruned"] == 500 and record["keep"] == 2500
    peak = max(n for _, n in counts(budget.working, budget.steps, budget.cap))
    assert timed[3] >= max(peak, 3750)  # at least 1.5 x the working count
    assert record["mean_step_seconds"] >= round(step_time(2500), 4)


def test_a_grown_set_copies_gaussians():
    from models.pipeline.refine.ops import spatial_order
    from models.pipeline.refine.plan import _at_count

    g = _set(10)
    order = torch.arange(10).flip(0)
    small = _at_count(g, order, 4).means[0]
    # the 4 most important, stored in spatial order as the fit stores its Gaussians
    assert sorted(small.tolist()) == sorted(g.means[0, [9, 8, 7, 6]].tolist())
    assert torch.equal(spatial_order(small), torch.arange(4))
    grown = _at_count(g, order, 25)
    distances = torch.cdist(grown.means[0], g.means[0])  # [25, 10]
    assert grown.count().item() == 25
    assert bool((distances.min(0).values == 0).all())  # every Gaussian of the set is there
    assert bool((distances.min(1).values == 0).all())  # and the others are copies
