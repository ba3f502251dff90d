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
from models.pipeline.refine.plan import StepTime, cap_screen_size, importance, screen_radii
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
    strategy = MCMCStrategy(settings.mcmc, 1, None, None)
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
    assert f"refine: {plan['steps']} steps" in line
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
