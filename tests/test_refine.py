"""Per-scene refinement (``models.pipeline.refine``) on a small synthetic capture: 400 Gaussians rendered
into 10 views at 32x32 on a ring (8 fitted, 2 held out), fitted from a sparse, miscoloured start.

The fit's loss falls and the held-out PSNR rises; MCMC keeps the count at the cap and relocates
dead Gaussians; ADC clones, splits and prunes with counts that add up; a checkpointed fit resumes
at its step with the state of an uninterrupted one; a non-finite loss stops with the last finite
state; the memory estimate refuses in one line; the command line round-trips a ``.ply``."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from models.core.gaussians import Gaussians, rgb_to_sh
from models.geometry.camera_paths import orbit_cameras
from models.pipeline.metrics import psnr, ssim_per_image
from models.pipeline.refine import (
    ADCSettings,
    MCMCSettings,
    RefineSettings,
    RefineSettingsError,
    gaussians_from_points,
    refine_gaussians,
    settings_from_config,
)
from models.pipeline.refine import fit as fit_module
from models.pipeline.refine.loss import ssim
from models.pipeline.refine.ops import relocation
from models.pipeline.settings import refinement_fields
from models.render import render

REPO_ROOT = Path(__file__).resolve().parents[1]

SIZE = 32
HELD = [2, 7]
TRAIN = [i for i in range(10) if i not in HELD]


@pytest.fixture(scope="module")
def capture():
    """Ground-truth Gaussians, 10 cameras and their renders ``[10, 3, 32, 32]``."""
    generator = torch.Generator().manual_seed(0)
    n = 400
    means = torch.randn(n, 3, generator=generator) * 0.5 + torch.tensor([0.0, 0.0, 3.0])
    truth = Gaussians(
        means=means[None],
        scales=(torch.rand(n, 3, generator=generator) * 0.08 + 0.02)[None],
        rotations=F.normalize(torch.randn(n, 4, generator=generator), dim=-1)[None],
        opacities=(torch.rand(n, generator=generator) * 0.5 + 0.5)[None],
        harmonics=rgb_to_sh(torch.rand(n, 3, generator=generator))[None, :, :, None],
    )
    k = torch.tensor([[1.0, 0.0, 0.5], [0.0, 1.0, 0.5], [0.0, 0.0, 1.0]])
    extrinsics, intrinsics = orbit_cameras(torch.eye(4), 3.0, k, 10, 1.0)
    with torch.no_grad():
        images = render(truth, extrinsics[None], intrinsics[None], (SIZE, SIZE)).color[0]
    start_xyz = means[::4] + 0.05 * torch.randn(100, 3, generator=generator)
    start = gaussians_from_points(start_xyz, torch.full((100, 3), 0.5), sh_degree=1)
    return {
        "images": images,
        "extrinsics": extrinsics,
        "intrinsics": intrinsics,
        "start": start,
        "truth": truth,
    }


def _scorer(capture):
    def evaluate(gaussians, _extrinsics):
        out = render(
            gaussians,
            capture["extrinsics"][HELD][None],
            capture["intrinsics"][HELD][None],
            (SIZE, SIZE),
        )
        return {"psnr": psnr(out.color[0], capture["images"][HELD])}

    return evaluate


def _fit(capture, settings, start=None, **kwargs):
    return refine_gaussians(
        capture["start"] if start is None else start,
        capture["images"][TRAIN],
        capture["extrinsics"][TRAIN],
        capture["intrinsics"][TRAIN],
        settings,
        progress=False,
        **kwargs,
    )


@pytest.fixture(scope="module")
def mcmc_fit(capture):
    settings = RefineSettings(steps=300, max_gaussians=150, mcmc=MCMCSettings(start=50, every=50))
    return _fit(capture, settings, evaluate=_scorer(capture), eval_every=100)


def test_loss_falls_and_held_out_psnr_rises(mcmc_fit):
    curve = [point["loss"] for point in mcmc_fit.curve]
    assert sum(curve[-5:]) / 5 < 0.8 * sum(curve[:5]) / 5
    scores = [e["psnr"] for e in mcmc_fit.evaluations]
    assert [e["step"] for e in mcmc_fit.evaluations] == [0, 100, 200, 300]
    assert scores[-1] > scores[0] + 1.0
    assert mcmc_fit.stopped == "steps" and mcmc_fit.steps == 300
    assert mcmc_fit.image_size == (SIZE, SIZE)
    assert set(mcmc_fit.timings) == {"forward", "backward", "densify", "optimizer"}
    assert mcmc_fit.gaussians.sh_degree == 1
    summary = json.loads(json.dumps(mcmc_fit.summary()))
    assert summary["count_before"] == 100 and summary["evaluations"][-1]["step"] == 300


def test_mcmc_grows_to_the_cap_and_never_beyond(mcmc_fit):
    assert mcmc_fit.count_after <= 150
    assert mcmc_fit.densify["added"] == mcmc_fit.count_after - mcmc_fit.count_before > 0
    assert max(point["count"] for point in mcmc_fit.curve) <= 150


def _half_transparent(start: Gaussians) -> Gaussians:
    """``start`` with every other Gaussian at opacity 1e-3 (dead to MCMC, moved by its noise)."""
    dead = torch.zeros(start.means.shape[1], dtype=torch.bool)
    dead[::2] = True
    opacities = torch.where(dead, torch.tensor(1e-3), start.opacities[0])[None]
    return start.replace(opacities=opacities)


def test_mcmc_relocates_dead_gaussians(capture):
    settings = RefineSettings(
        steps=11,
        max_gaussians=100,
        mcmc=MCMCSettings(start=10, every=10, stop_fraction=1.0),
    )
    result = _fit(capture, settings, start=_half_transparent(capture["start"]))
    assert result.densify["relocated"] >= 50 and result.densify["added"] == 0
    assert result.count_after == 100
    assert bool((result.gaussians.opacities > 0.005).all())


def _scaled(capture, factor: float):
    """The capture and its half-transparent start in a frame ``factor`` times larger (poses'
    translations, means and scales; the photos unchanged)."""
    extrinsics = capture["extrinsics"].clone()
    extrinsics[:, :3, 3] *= factor
    start = capture["start"]
    start = start.replace(means=start.means * factor, scales=start.scales * factor)
    return {**capture, "extrinsics": extrinsics}, _half_transparent(start)


def test_mcmc_fit_is_the_same_in_a_larger_frame(capture):
    """The noise, the learning rates and the regularisation follow the frame's scale, so a
    capture posed in a frame 8x larger (another SfM's choice) fits to the same scene, 8x larger."""
    # a gentler noise than the default: the default flings a few transparent Gaussians far off
    # the scene, some behind the cameras, and there the two frames' float rounding drifts apart
    mcmc = MCMCSettings(start=10, every=10, stop_fraction=1.0, noise_lr=5e5)
    settings = RefineSettings(steps=40, max_gaussians=120, mcmc=mcmc)
    fits = {}
    for factor in (1.0, 8.0):
        scaled, start = _scaled(capture, factor)
        fits[factor] = _fit(scaled, settings, start=start).gaussians
    small, large = fits[1.0], fits[8.0]
    assert small.means.shape == large.means.shape and small.means.shape[1] > 100
    torch.testing.assert_close(large.means / 8.0, small.means, atol=2e-3, rtol=0)
    torch.testing.assert_close(large.scales / 8.0, small.scales, atol=2e-3, rtol=0)
    torch.testing.assert_close(large.opacities, small.opacities, atol=2e-3, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_compiled_mcmc_noise_equals_the_reference(dtype):
    """``inject_noise`` on a CPU runs one compiled pass; it moves the means as the PyTorch
    reference does (the same sample drawn), Gaussians below the gate not at all."""
    from test_render import cpu_backend_or_skip

    from models.pipeline.refine.ops import inject_noise, inject_noise_reference

    cpu_backend_or_skip(dtype)  # fails where a toolchain is and the library does not build
    g = torch.Generator().manual_seed(3)
    n = 5000
    params = {
        "means": torch.randn(n, 3, generator=g, dtype=dtype),
        # logits from -8 (transparent: moved most) to 4 (opaque: gate below 1e-6, not moved)
        "opacities": torch.linspace(-8.0, 4.0, n, dtype=dtype),
        "rotations": torch.randn(n, 4, generator=g, dtype=dtype),
        "scales": torch.randn(n, 3, generator=g, dtype=dtype) - 2.0,
    }
    params["rotations"][0] = 0.0  # a zero quaternion: normalised to zero as F.normalize does
    compiled = {k: v.clone() for k, v in params.items()}
    inject_noise(compiled, 0.3, torch.Generator().manual_seed(7))
    reference = {k: v.clone() for k, v in params.items()}
    sample = torch.randn((n, 3), generator=torch.Generator().manual_seed(7)).to(dtype)
    inject_noise_reference(reference, sample, 0.3)
    moved = reference["means"] - params["means"]
    assert (moved.abs().sum(-1) > 0).sum() > n // 2 and (moved[-n // 4 :] == 0).all()
    tol = {torch.float32: 1e-5, torch.float64: 1e-12}[dtype]
    torch.testing.assert_close(compiled["means"] - params["means"], moved, atol=tol, rtol=tol)
    for name in ("opacities", "rotations", "scales"):  # only the means move
        assert torch.equal(compiled[name], params[name])


def test_inject_noise_never_builds_the_compiled_library(tmp_path):
    """A fit rendering with ``backend="torch"`` must not compile anything: ``inject_noise``
    uses the compiled pass only where the library is already loaded, else the reference."""
    script = (
        "import torch\n"
        "from models.pipeline.refine.ops import inject_noise, inject_noise_reference\n"
        "from models.render.cpu import cpu_library_loaded\n"
        "p = {'means': torch.zeros(4, 3), 'opacities': torch.full((4,), -6.0),\n"
        "     'rotations': torch.tensor([[1.0, 0.0, 0.0, 0.0]] * 4), 'scales': torch.zeros(4, 3)}\n"
        "q = {k: v.clone() for k, v in p.items()}\n"
        "inject_noise(p, 0.1, torch.Generator().manual_seed(0))\n"
        "sample = torch.randn((4, 3), generator=torch.Generator().manual_seed(0))\n"
        "inject_noise_reference(q, sample, 0.1)\n"
        "assert not cpu_library_loaded()\n"
        "assert torch.equal(p['means'], q['means']) and bool(p['means'].abs().sum() > 0)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT),
           "TORCH_EXTENSIONS_DIR": str(tmp_path)}  # fmt: skip
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert not any(tmp_path.iterdir())  # nothing was built


def test_spatial_order_puts_neighbours_next_to_each_other():
    """A shuffled 16^3 grid in Z-order: a permutation whose consecutive points are near each
    other, an outlier in the last cell."""
    from models.pipeline.refine.ops import spatial_order

    axis = torch.arange(16.0)
    grid = torch.cartesian_prod(axis, axis, axis)  # [4096, 3]
    shuffled = grid[torch.randperm(len(grid), generator=torch.Generator().manual_seed(0))]
    shuffled[5] = torch.tensor([1e6, 1e6, 1e6])  # an outlier shares the last cell
    order = spatial_order(shuffled)
    assert torch.equal(order.sort().values, torch.arange(len(grid)))
    steps = (shuffled[order][1:] - shuffled[order][:-1]).norm(dim=-1)
    random_steps = (shuffled[1:] - shuffled[:-1]).norm(dim=-1)
    # Z-order: mostly unit and diagonal steps (1.46 on average here; 10.6 shuffled)
    assert steps[steps < 1e5].mean() < 2.0 and random_steps.mean() > 8.0
    assert 5 in order[-2:].tolist()  # in the last cell, with the grid point (15, 15, 15)
    assert spatial_order(torch.zeros(1, 3)).tolist() == [0]


def test_reordering_the_fit_moves_rows_with_their_moments_and_renders_the_same(capture):
    """``ops.sort_spatially`` (what the fit does every ``REORDER_EVERY`` steps) changes the
    storage order only: the render, each row's Adam moments and statistics follow."""
    from models.pipeline.refine import ops

    cameras, intrinsics = capture["extrinsics"], capture["intrinsics"]
    params, optimizers = ops.parameters_from_gaussians(
        capture["truth"], 1, dict.fromkeys(ops.NAMES, 0.01)
    )
    loss = sum((p * p).sum() for p in params.values())
    loss.backward()
    for optimizer in optimizers.values():
        optimizer.step()
    state = {"max_radii": torch.arange(float(ops.count(params)))}
    before = {k: v.detach().clone() for k, v in params.items()}
    moments = optimizers["means"].state[params["means"]]["exp_avg"].clone()
    order = ops.spatial_order(params["means"])
    assert not torch.equal(order, torch.arange(len(order)))
    ops.sort_spatially(params, optimizers, state)
    assert torch.equal(params["scales"].detach(), before["scales"][order])
    assert torch.equal(optimizers["means"].state[params["means"]]["exp_avg"], moments[order])
    assert torch.equal(state["max_radii"], order.float())
    views = [render(g, cameras[None, :2], intrinsics[None, :2], (SIZE, SIZE)).color
             for g in (ops.gaussians_from_parameters(before), ops.gaussians_from_parameters(params))]  # fmt: skip
    torch.testing.assert_close(views[1], views[0], atol=1e-6, rtol=0)


def test_unit_quaternions_are_f_normalize_with_its_gradient():
    """The fit's quaternion normalisation is ``F.normalize``: values, gradients (a zero
    quaternion included) and torch's gradcheck in float64."""
    from models.pipeline.refine.ops import _UnitQuaternions

    q = torch.randn(64, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    q[0] = 0.0
    grad = torch.randn(64, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    outputs = []
    for fn in (_UnitQuaternions.apply, lambda t: F.normalize(t, dim=-1)):
        leaf = q.clone().requires_grad_(True)
        value = fn(leaf)
        value.backward(grad)
        outputs.append((value.detach(), leaf.grad))
    for ours, theirs in zip(*outputs):
        torch.testing.assert_close(ours, theirs, atol=1e-12, rtol=1e-12)
    assert torch.autograd.gradcheck(_UnitQuaternions.apply, (q[1:9].clone().requires_grad_(True),))


def test_relocation_keeps_the_opacity_of_one_gaussian():
    opacity, scale = relocation(torch.tensor([0.6]), torch.ones(1, 3), torch.tensor([1]))
    assert torch.allclose(opacity, torch.tensor([0.6])) and torch.allclose(scale, torch.ones(1, 3))
    opacity, _ = relocation(torch.tensor([0.75]), torch.ones(1, 3), torch.tensor([2]))
    assert torch.allclose(1 - (1 - opacity) ** 2, torch.tensor([0.75]))  # two copies, same alpha


def test_adc_clones_splits_and_prunes(capture):
    start = capture["start"]
    scales = start.scales.clone()
    scales[0, :50] = 0.001  # small: cloned
    scales[0, 50:] = 0.2  # large: split
    opacities = start.opacities.clone()
    opacities[0, 90:] = 0.001  # pruned
    settings = RefineSettings(
        steps=21,
        densify="adc",
        max_gaussians=1000,
        adc=ADCSettings(start=20, every=20, grad_threshold=1e-7, stop_fraction=1.0),
    )
    result = _fit(capture, settings, start=start.replace(scales=scales, opacities=opacities))
    counts = result.densify
    assert counts["cloned"] > 0 and counts["split"] > 0 and counts["pruned"] >= 10
    assert result.count_after == 100 + counts["cloned"] + counts["split"] - counts["pruned"]


def test_adc_opacity_reset(capture):
    settings = RefineSettings(
        steps=11, densify="adc", adc=ADCSettings(start=100, reset_every=5, stop_fraction=1.0)
    )
    result = _fit(capture, settings)
    assert result.densify["resets"] == 2


def test_resume_from_checkpoint_continues_with_the_same_state(capture, tmp_path):
    settings = RefineSettings(steps=30, max_gaussians=120, mcmc=MCMCSettings(start=10, every=10))
    reference = _fit(capture, settings)

    def stop_at_15(_gaussians, _extrinsics):
        if stop_at_15.calls == 1:
            raise KeyboardInterrupt
        stop_at_15.calls += 1
        return {}

    stop_at_15.calls = 0
    path = tmp_path / "fit.pt"
    first = _fit(capture, settings, checkpoint_path=path, evaluate=stop_at_15, eval_every=15)
    assert first.stopped == "interrupted" and first.steps == 15 and path.is_file()
    assert torch.load(path, weights_only=False)["step"] == 15
    resumed = _fit(capture, settings, checkpoint_path=path)
    assert resumed.stopped == "steps" and resumed.steps == 30
    assert resumed.count_after == reference.count_after
    for name in ("means", "scales", "opacities", "harmonics"):
        a, b = getattr(resumed.gaussians, name), getattr(reference.gaussians, name)
        assert torch.allclose(a, b, atol=1e-5), name


def test_nan_loss_stops_with_the_last_finite_state(capture, monkeypatch):
    real = fit_module.photometric_loss
    calls = {"n": 0}

    def poisoned(prediction, target, weight):
        calls["n"] += 1
        loss = real(prediction, target, weight)
        return loss * float("nan") if calls["n"] == 6 else loss

    monkeypatch.setattr(fit_module, "photometric_loss", poisoned)
    result = _fit(capture, RefineSettings(steps=20))
    assert result.stopped == "nan" and result.steps == 5
    assert "not finite" in result.message
    result.gaussians.validate()


def test_memory_refusal_names_the_arguments(capture):
    with pytest.raises(RefineSettingsError) as error:
        _fit(capture, RefineSettings(steps=5, memory_limit=10_000))
    line = str(error.value)
    assert "\n" not in line and line.startswith("size:") and "max_gaussians" in line
    assert error.value.argument == "size" and error.value.largest == 0


def test_start_opacity_caps_the_start_and_none_keeps_it(capture):
    """A start's opacities are capped before the first step (a feed-forward set's wrong-depth
    Gaussians then fade instead of occluding); ``None`` keeps a finished scene as it is."""
    truth = capture["truth"]  # opacities in [0.5, 1]
    settings = RefineSettings(steps=1, densify="none", start_opacity=0.1)
    capped = _fit(capture, settings, start=truth)
    assert capped.plan["opacity_capped"] == truth.means.shape[1]
    assert float(capped.gaussians.opacities.max()) < 0.11  # one Adam step from 0.1 at most
    kept = _fit(capture, dataclasses.replace(settings, start_opacity=None), start=truth)
    assert kept.plan["opacity_capped"] == 0 and float(kept.gaussians.opacities.max()) > 0.9
    for bad in (0, 1.5, math.nan, "0.1"):
        with pytest.raises(RefineSettingsError) as error:
            RefineSettings(steps=1, start_opacity=bad).check()
        assert error.value.argument == "start_opacity"


def test_settings_from_config_maps_the_infer_keys():
    settings = settings_from_config(
        refine=100,
        refine_time=60,
        refine_size=240,
        refine_max_gaussians=5000,
        refinement={"densify": "adc", "adc": {"grad_threshold": 1e-3}},
    )
    assert (settings.steps, settings.time, settings.size, settings.max_gaussians) == (
        100,
        60.0,
        240,
        5000,
    )
    assert settings.densify == "adc" and settings.adc.grad_threshold == 1e-3
    with pytest.raises(ValueError, match="refinement.mcmc.nope"):
        settings_from_config(refine=1, refinement={"mcmc": {"nope": 1}})
    with pytest.raises(ValueError, match="refine"):
        settings_from_config()


def test_ssim_loss_matches_the_metric():
    a = torch.rand(2, 3, 24, 30)
    b = (a + 0.1 * torch.randn_like(a)).clamp(0, 1)
    assert torch.allclose(ssim(a, b), ssim_per_image(a, b), atol=1e-5)


def test_sfm_start_scales_by_neighbour_distance():
    xyz = torch.tensor([[0.0, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1], [5, 5, 5]])
    g = gaussians_from_points(xyz, torch.rand(5, 3))
    assert g.count().item() == 5 and torch.allclose(g.opacities, torch.full((1, 5), 0.1))
    assert torch.allclose(g.scales[0, 1], torch.full((3,), ((1 + 2 + 2) / 3) ** 0.5))
    assert g.harmonics.shape == (1, 5, 3, 16)


def _command_line_inputs(capture, tmp_path: Path) -> tuple[Path, Path]:
    """The capture as the command reads it: ``start.ply`` and a photo folder with cameras.json."""
    from PIL import Image

    from datamodules.readers.cameras_json import write_cameras_json

    photos = tmp_path / "photos"
    photos.mkdir()
    names = [f"view{i:02d}.png" for i in range(10)]
    for name, image in zip(names, capture["images"]):
        array = (image.clamp(0, 1) * 255 + 0.5).to(torch.uint8).permute(1, 2, 0).numpy()
        Image.fromarray(array).save(photos / name)
    write_cameras_json(
        photos / "cameras.json",
        names,
        capture["extrinsics"],
        capture["intrinsics"],
        (SIZE, SIZE),
    )
    ply = tmp_path / "start.ply"
    capture["start"].save_ply(ply)
    return ply, photos


def test_command_line_round_trip(capture, tmp_path, capsys):
    from models.refine.cli import main

    ply, photos = _command_line_inputs(capture, tmp_path)
    out = tmp_path / "out"
    status = main([str(ply), str(photos), f"output={out}", "refine=40", "holdout=5"])
    assert status == 0
    refined = Gaussians.load_ply(out / "gaussians.ply")
    assert refined.num_slots == capture["start"].num_slots  # MCMC starts at step 100
    summary = json.loads((out / "summary.json").read_text())
    assert summary["refine"]["steps"] == 40
    assert summary["holdout"]["views"] == ["view00.png", "view05.png"]
    for entry in summary["holdout"]["metrics"].values():
        assert {"psnr", "ssim", "nearest_view_psnr", "psnr_before_refine"} <= set(entry)
        assert entry["psnr"] > entry["psnr_before_refine"]
    assert (out / "renders" / "holdout" / "view05.png").is_file()
    capsys.readouterr()
    assert main([str(tmp_path / "missing.ply"), str(photos), f"output={tmp_path / 'o2'}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "missing.ply" in err[0]
    assert not (tmp_path / "o2").exists()


def test_command_line_sigterm_keeps_what_the_fit_has(capture, tmp_path):
    """SIGTERM mid-fit: the output is written with what the fit had, one line says so, exit 143
    (no traceback), and the checkpoint stays beside the output for a resume."""
    ply, photos = _command_line_inputs(capture, tmp_path)
    out = tmp_path / "out"
    args = [str(ply), str(photos), f"output={out}", "refine=1000000", "refine_checkpoint_every=5"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(
        [sys.executable, "-m", "models.refine", *args], cwd=REPO_ROOT, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    checkpoint = tmp_path / ".out.refine-checkpoint.pt"
    deadline = time.monotonic() + 600  # waits for an event: generous for a loaded machine
    while not checkpoint.exists() and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.2)
    assert checkpoint.exists(), process.communicate(timeout=30)
    time.sleep(0.5)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 143, err[-2000:]
    assert "Traceback" not in err
    assert [line for line in err.splitlines() if "SIGTERM" in line] == [
        line for line in err.splitlines() if "interrupted at step" in line and "(SIGTERM)" in line
    ]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["refine"]["stopped"] == "interrupted" and summary["refine"]["steps"] >= 5
    assert (out / "gaussians.ply").is_file() and checkpoint.is_file()


def test_infer_yaml_refinement_node_holds_the_defaults():
    import yaml

    root = Path(__file__).resolve().parents[1]
    config = yaml.safe_load((root / "configs" / "infer.yaml").read_text())
    assert {"refine", "refine_time", "refine_size", "refine_init"} <= set(config)
    settings = settings_from_config(refine=1, refinement=config["refinement"])
    assert settings == RefineSettings(steps=1)

    def flat(node, prefix="refinement"):
        for key, value in node.items():
            yield from (
                flat(value, f"{prefix}.{key}") if isinstance(value, dict) else [f"{prefix}.{key}"]
            )

    # every refinement.KEY the commands accept is in the YAML, so Hydra takes it too (it refused
    # refinement.coarse_fraction=0.3 with its multi-line error when the YAML lacked it)
    assert set(flat(config["refinement"])) == set(refinement_fields())


def test_optimize_cameras_reduces_the_pose_error(capture):
    from models.pipeline.pose_fit import pose_error, se3_delta

    generator = torch.Generator().manual_seed(1)
    views = len(TRAIN)
    delta = se3_delta(
        0.03 * torch.randn(views, 3, generator=generator),
        0.05 * torch.randn(views, 3, generator=generator),
    )
    delta[0] = torch.eye(4)
    truth = capture["extrinsics"][TRAIN]
    noisy = truth @ delta
    frozen = {f"lr_{name}": 1e-5 for name in ("means", "scales", "rotations", "opacities", "sh")}
    settings = RefineSettings(steps=160, densify="none", **frozen)
    result = refine_gaussians(
        capture["truth"],
        capture["images"][TRAIN],
        noisy,
        capture["intrinsics"][TRAIN],
        settings,
        optimize_cameras=True,
        progress=False,
    )
    before, _ = pose_error(noisy, truth)
    after, _ = pose_error(result.extrinsics, truth)
    assert torch.equal(result.extrinsics[0], noisy[0])  # view 0 stays fixed
    assert after[1:].mean() < 0.7 * before[1:].mean()
