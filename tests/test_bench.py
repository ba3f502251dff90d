"""The benchmark helpers: widened evaluation indices and the zoo's report."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

import common  # noqa: E402
import refine_start  # noqa: E402
import zoo  # noqa: E402


def test_widen_index_keeps_outer_frames_and_targets(tmp_path: Path) -> None:
    index = {
        "a": {"context": [10, 20], "target": [12, 15, 18]},
        "b": {"context": [0, 3], "target": [1, 2]},  # no free frame between the context views
        "c": None,
    }
    source = tmp_path / "index.json"
    source.write_text(json.dumps(index))
    kept, skipped = common.widen_index(source, 4, tmp_path / "wide.json")
    wide = json.loads((tmp_path / "wide.json").read_text())
    assert (kept, skipped) == (1, 1)
    assert wide["b"] is None and wide["c"] is None
    context = wide["a"]["context"]
    assert len(context) == 4 and context[0] == 10 and context[-1] == 20
    assert context == sorted(set(context))
    assert not set(context) & {12, 15, 18}
    assert wide["a"]["target"] == [12, 15, 18]
    kept, _ = common.widen_index(source, 2, tmp_path / "same.json")
    assert json.loads((tmp_path / "same.json").read_text())["a"] == index["a"]
    with pytest.raises(ValueError, match="views"):
        common.widen_index(source, 1, tmp_path / "bad.json")


def _row(family: str, variant: str, seed: int, psnr: float, gaussians: float) -> dict:
    return {
        "family": family,
        "model": f"{family}_tiny",
        "variant": variant,
        "knob": None,
        "views": 2,
        "seed": seed,
        "scenes": 3,
        "psnr": psnr,
        "ssim": 0.5,
        "gaussians": gaussians,
        "parameters": 1000,
        "recon_ms": 10.0,
        "render_ms": 5.0,
        "peak_mb": 100.0,
    }


def test_zoo_aggregate_means_over_seeds_and_markdown(tmp_path: Path) -> None:
    rows = [
        _row("zipsplat", "r=1", 0, 20.0, 1280),
        _row("zipsplat", "r=1", 1, 22.0, 1280),
        _row("pixel_aligned", "1 Gaussian/pixel", 0, 21.0, 8192),
        {"family": "baseline", "model": "nearest view", "variant": "-", "views": 2, "psnr": 18.0},
    ]
    merged = zoo.aggregate(rows)
    assert [r["family"] for r in merged] == ["baseline", "pixel_aligned", "zipsplat"]
    zipsplat = merged[-1]
    assert zipsplat["seeds"] == 2
    assert zipsplat["psnr"] == pytest.approx(21.0)
    assert zipsplat["psnr_std"] == pytest.approx(2**0.5)
    assert merged[1]["psnr_std"] is None  # one seed: no spread
    table = zoo.markdown(merged, "header")
    assert "21.00 ± 1.41" in table and "| 2 | nearest view | - | 18.00 |" in table
    assert "LPIPS" not in table  # no row has it
    zoo.plot(merged, tmp_path / "plot.png", "title", 2)
    assert (tmp_path / "plot.png").stat().st_size > 10_000


def test_zoo_budget_split_and_arguments() -> None:
    resplat = zoo.FAMILIES["resplat"]
    assert sum(stage.share for stage in resplat.stages) == pytest.approx(1.0)
    assert resplat.stages[1].init_from == resplat.stages[0].task_name
    for family in zoo.FAMILIES.values():
        assert sum(stage.share for stage in family.stages) == pytest.approx(1.0)
        assert (
            (Path(zoo.REPO_ROOT) / "configs" / "experiment")
            .joinpath(f"{family.stages[-1].experiment}.yaml")
            .is_file()
        )
    assert zoo._clock(30) == "00:00:30:00" and zoo._clock(0.5) == "00:00:00:30"
    quick = zoo.parse_args(["--quick"])
    assert (
        quick.minutes == 1.0
        and quick.max_scenes == 6
        and "data.generator.scenes=60" in (quick.data_overrides)
    )
    with pytest.raises(SystemExit):
        zoo.parse_args(["--views", "1"])


def test_gpu_check_family_timing_runs_on_cpu() -> None:
    """The GPU script's per-family timing hook (run for real only on a lent GPU) works anywhere."""
    import gpu_check
    import torch

    names = ["zipsplat_tiny", "resplat_tiny", "no_such_model"]
    rows = gpu_check.reconstruction_timing(names, torch.device("cpu"), resolution=32, repeats=1)
    assert [r["model"] for r in rows] == names
    assert rows[0]["Gaussians"] > 0 and rows[0]["forward ms"] > 0 and rows[1]["render ms"] > 0
    assert str(rows[2]["forward ms"]).startswith("error")  # reported in its row, not raised
    assert set(gpu_check.FAMILY_MODELS) >= {"pixel_aligned_tiny", "splatweaver_tiny"}


def test_score_targets_one_render_for_every_metric() -> None:
    import torch

    from models import Gaussians

    class FakeLpips(torch.nn.Module):  # stands in for torchmetrics' VGG LPIPS (offline here)
        def __init__(self) -> None:
            super().__init__()
            self.net = lambda p, t: (p - t).abs().mean(dim=(1, 2, 3))

    b, t, size = 2, 3, 16
    gaussians = Gaussians(
        means=torch.randn(b, 50, 3) * 0.3 + torch.tensor([0.0, 0.0, 3.0]),
        scales=torch.full((b, 50, 3), 0.2),
        rotations=torch.tensor([1.0, 0.0, 0.0, 0.0]).expand(b, 50, 4),
        opacities=torch.full((b, 50), 0.8),
        harmonics=torch.rand(b, 50, 3, 1),
    )
    target = {
        "image": torch.rand(b, t, 3, size, size),
        "extrinsics": torch.eye(4).expand(b, t, 4, 4),
        "intrinsics": torch.tensor([[1.0, 0, 0.5], [0, 1.0, 0.5], [0, 0, 1]]).expand(b, t, 3, 3),
    }
    plain = common.score_targets(gaussians, target)
    scored = common.score_targets(gaussians, target, lpips=FakeLpips())
    assert "lpips" not in plain and scored["lpips"].shape == (b,)
    torch.testing.assert_close(scored["psnr"], plain["psnr"])
    assert (scored["lpips"] > 0).all()


@pytest.mark.parametrize("name", sorted(p.stem for p in BENCH.glob("*.py")))
def test_every_benchmark_imports(name: str) -> None:
    """A benchmark that no longer imports is found here, not in a later session's run (one did:
    a name moved out of ``models.pipeline.refine``)."""
    module = importlib.import_module(f"bench.{name}")
    assert module.__file__ is not None and Path(module.__file__).parent == BENCH


GARDEN = Path(__file__).resolve().parents[2] / "shared" / "data" / "gsplat_test_garden.npz"


@pytest.mark.skipif(not GARDEN.is_file(), reason="needs ../shared/data/gsplat_test_garden.npz")
def test_refine_start_scores_a_runs_cameras_against_the_garden_orbit(tmp_path: Path) -> None:
    """The garden rows' camera errors: zero for the orbit's own cameras in another frame and
    scale, the turn of one camera for a camera turned."""
    import torch

    from models.pipeline.pose_fit import se3_delta

    poses = refine_start.garden_orbit(GARDEN, 12)[1]  # [12, 4, 4]
    reference = {refine_start.garden_name(i): pose for i, pose in enumerate(poses)}
    frame = se3_delta(torch.tensor([0.3, -0.2, 0.5]), torch.tensor([1.0, 2.0, -3.0]))
    moved = frame @ poses
    moved[:, :3, 3] *= 2.5  # another frame, another scale: the same cameras
    turned = moved.clone()
    turned[4] = turned[4] @ se3_delta(torch.tensor([0.0, 0.0, 0.2]), torch.zeros(3))  # 11.46 deg

    def errors(cameras):
        frames = [
            {"file": refine_start.garden_name(i), "camera_to_world": c.tolist()}
            for i, c in enumerate(cameras)
        ]
        path = tmp_path / "cameras.json"
        path.write_text(json.dumps({"frames": frames}))
        return refine_start.camera_errors(path, reference)

    same = errors(moved)
    assert same["views"] == 12
    assert same["rotation_max_deg"] < 0.1 and same["relative_rotation_max_deg"] < 0.1  # float32
    assert same["center_max"] < 1e-3 and same["scale"] == pytest.approx(1 / 2.5, rel=1e-3)
    wrong = errors(turned)
    assert wrong["relative_rotation_max_deg"] == pytest.approx(11.46, abs=0.05)
    row = {"cameras": wrong, "model": "m", "start": "auto", "budget_s": 1, "psnr": 1.0}
    assert refine_start._camera_cell(row).endswith(f"{wrong['relative_rotation_median_deg']:.2f}")
    assert refine_start._camera_cell({}) == ""
