"""Every refinement setting is checked in one place (``models.pipeline.settings`` and
``models.pipeline.refinement``) before any work, the same way in ``infer.py``, ``view.py`` and
``python -m models.refine`` (issue 40): one line naming the setting, exit status 2, no output
folder; ``configs/infer.yaml`` declares exactly the typed settings of ``InferConfig``."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from config_fixtures import infer_in_process
from PIL import Image

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))


def _photos(folder: Path, count: int = 3, posed: bool = False) -> Path:
    """``count`` 24x32 photos (with ``cameras.json`` when ``posed``)."""
    from datamodules.readers.cameras_json import write_cameras_json

    folder.mkdir(parents=True)
    names = [f"p{i}.png" for i in range(count)]
    for i, name in enumerate(names):
        Image.new("RGB", (32, 24), (40 * i, 90, 160)).save(folder / name)
    if posed:
        extrinsics = torch.eye(4).repeat(count, 1, 1)
        extrinsics[:, 0, 3] = torch.arange(count) * 0.2
        intrinsics = torch.tensor([[1.0, 0, 0.5], [0, 1.0, 0.5], [0, 0, 1]]).repeat(count, 1, 1)
        write_cameras_json(folder / "cameras.json", names, extrinsics, intrinsics, (24, 32))
    return folder


def _one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


def test_infer_yaml_declares_the_typed_settings() -> None:
    from models.core.command_line import declared
    from models.pipeline.settings import InferConfig, refinement_fields

    raw = yaml.safe_load((REPO_ROOT / "configs" / "infer.yaml").read_text())
    plain = {k: v for k, v in raw.items() if k not in ("defaults", "hydra")}

    def flat(node: dict, prefix: str = "") -> dict:
        out = {}
        for key, value in node.items():
            if isinstance(value, dict):
                out.update(flat(value, f"{prefix}{key}."))
            else:
                out[f"{prefix}{key}"] = value
        return out

    values = flat(plain)
    typed = declared(InferConfig)
    top = {k: v for k, v in values.items() if not k.startswith("refinement.")}
    assert set(top) == set(typed) - {"refinement"}
    for key, value in top.items():
        assert typed[key].default == value, key
    fields = refinement_fields()
    for key in values.keys() - top.keys():  # the refinement: node names RefineSettings fields
        assert key in fields or key.rsplit(".", 1)[0] in fields, key


@pytest.mark.parametrize(
    ("arg", "expected"),
    [
        ("refine_size=nan", "refine_size=nan: must be a whole number"),
        ("refine_time=inf", "refine_time=inf: must be a finite number"),
        ("refine=abc", "refine=abc: must be a whole number"),
        ("refinement.mcmc.strt=3", "did you mean refinement.mcmc.start?"),
        ("output=" + "x" * 300, "one folder or file name in the path is 300 bytes long"),
        ("output=" + "/a" * 2100, "longer than the system's 4095"),
    ],
)
def test_infer_refuses_before_hydra(arg: str, expected: str) -> None:
    import infer
    from models.core.command_line import SettingError

    with pytest.raises(SettingError) as caught:
        infer.arguments(["input=photos", "output=out", arg])
    assert expected in str(caught.value) and "\n" not in str(caught.value)
    assert len(str(caught.value)) < 400  # a long path is shown by its start


@pytest.mark.parametrize("arg", ["refine_size=nan", "output=" + "y" * 300])
def test_infer_process_says_one_line(tmp_path: Path, arg: str) -> None:
    """A real process: Hydra's multi-line error or traceback never shows; exit status 2."""
    photos = _photos(tmp_path / "photos")
    argv = [sys.executable, "infer.py", f"input={photos}", f"output={tmp_path / 'o'}", arg]
    done = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and arg.split("=")[0] in _one_error_line(done.stderr)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["photos"]


def test_infer_refuses_a_fit_that_cannot_fit_before_any_work(tmp_path: Path, capsys) -> None:
    """``refine=5 refine_size=100000``: the memory check names the largest size that fits,
    before the model loads, structure-from-motion or the forward pass."""
    photos = _photos(tmp_path / "photos")
    started = time.perf_counter()
    status, _, err = infer_in_process(
        capsys, f"input={photos}", f"output={tmp_path / 'o'}", "refine=5",
        "refine_size=100000", "cameras=auto", "model=pixel_aligned_tiny",
    )  # fmt: skip
    line = _one_error_line(err)
    assert status == 2 and line.startswith("error: refine_size=100000: the fit needs about")
    largest = int(line.rsplit("at most refine_size=", 1)[1].split()[0])
    assert 8 <= largest < 100000
    assert time.perf_counter() - started < 30 and not (tmp_path / "o").exists()


def test_the_largest_size_named_fits_and_one_more_does_not() -> None:
    from models.core.budget import available_memory
    from models.core.command_line import SettingError
    from models.pipeline.refine import RefineSettings, fit_shape
    from models.pipeline.refinement import check_fit_memory, fit_memory

    settings = RefineSettings(steps=5, size=100000)
    with pytest.raises(SettingError) as caught:
        check_fit_memory(settings, (24, 32), 3, "cpu")
    largest = int(str(caught.value).rsplit("refine_size=", 1)[1].split()[0])
    limit = available_memory("cpu")
    assert fit_memory(0, 3, fit_shape((24, 32), largest), 3, "auto") <= limit
    # one more does not fit, or the largest is the photos' own long side (the planner never
    # suggests fitting above the photos' size)
    assert largest == 32 or fit_memory(0, 3, fit_shape((24, 32), largest + 1), 3, "auto") > (
        limit * 0.99
    )
    check_fit_memory(dataclasses.replace(settings, size=largest // 2), (24, 32), 3, "cpu")


@pytest.mark.parametrize(
    ("arg", "expected"),
    [
        ("refine=abc", "refine=abc: must be a whole number"),
        ("refine_time=inf", "refine_time=inf: must be a finite number"),
        ("refine_size=100000", "at most refine_size="),
        ("holdout=1", "holdout=1: every K-th photo needs K >= 2"),
        ("max_gaussians=5", "did you mean refine_max_gaussians?"),
    ],
)
def test_refine_command_checks_like_infer(tmp_path: Path, capsys, arg: str, expected: str):
    from models.refine.cli import main

    photos = _photos(tmp_path / "photos", posed=True)
    ply = tmp_path / "start.ply"
    _gaussians().save_ply(ply)
    capsys.readouterr()
    status = main([str(ply), str(photos), f"output={tmp_path / 'o'}", "refine=3", arg])
    line = _one_error_line(capsys.readouterr().err)
    assert status == 2 and expected in line
    assert not (tmp_path / "o").exists()


def _gaussians(bad: float | None = None):
    from models.core.gaussians import Gaussians

    n = 20
    g = torch.Generator().manual_seed(0)
    means = torch.randn(1, n, 3, generator=g) + torch.tensor([0.0, 0.0, 3.0])
    if bad is not None:
        means[0, 4, 1] = bad
    return Gaussians(
        means=means,
        scales=torch.full((1, n, 3), 0.05),
        rotations=torch.tensor([1.0, 0, 0, 0]).repeat(1, n, 1),
        opacities=torch.full((1, n), 0.5),
        harmonics=torch.rand(1, n, 3, 1, generator=g) - 0.5,
    )


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_refine_command_refuses_a_ply_with_nan_or_inf(tmp_path: Path, capsys, bad: float):
    from models.refine.cli import main

    photos = _photos(tmp_path / "photos", posed=True)
    ply = tmp_path / "bad.ply"
    _gaussians(bad).save_ply(ply)
    capsys.readouterr()
    status = main([str(ply), str(photos), f"output={tmp_path / 'o'}", "refine=3"])
    line = _one_error_line(capsys.readouterr().err)
    assert status == 2 and "bad.ply: means has non-finite values" in line
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    ("arg", "expected"),
    [
        ("refine=abc", "refine=abc: must be a whole number"),
        ("refine_time=inf", "refine_time=inf: must be a finite number"),
        ("refine_size=nan", "refine_size=nan: must be a whole number"),
        ("refine_size=100000", "at most refine_size="),
    ],
)
def test_view_checks_its_live_refinement_the_same_way(tmp_path: Path, arg: str, expected: str):
    import view
    from datamodules.errors import InputError

    photos = _photos(tmp_path / "photos")
    with pytest.raises(InputError) as caught:
        view.parse_args([str(photos), "model=pixel_aligned_tiny", "refine=3", arg])
    assert expected in str(caught.value) and "\n" not in str(caught.value)


def test_library_errors_are_mapped_to_the_commands_keys() -> None:
    """``RefineSettings`` names its own fields; every command reports its own keys."""
    from models.core.command_line import SettingError
    from models.pipeline.refinement import refine_settings

    with pytest.raises(SettingError, match=r"^refinement\.densify: must be one of"):
        refine_settings({"refine": 5, "refinement": {"densify": "bogus"}}, "auto", 0)
    with pytest.raises(SettingError, match=r"^refinement\.bogus: unknown setting"):
        refine_settings({"refine": 5, "refinement": {"bogus": 1}}, "auto", 0)
    assert refine_settings({"refine": 0, "refine_time": None}, "auto", 0) is None
    made = refine_settings({"refine": 5, "refine_max_gaussians": 300}, "torch", 2)
    assert (made.steps, made.max_gaussians, made.backend, made.seed) == (5, 300, "torch", 2)


def test_library_field_names_become_command_keys() -> None:
    from models.pipeline.refinement import command_key

    assert [command_key(k) for k in ("steps", "time", "size", "max_gaussians")] == [
        "refine", "refine_time", "refine_size", "refine_max_gaussians",
    ]  # fmt: skip
    assert command_key("densify") == "refinement.densify"
    assert command_key("refinement.mcmc") == "refinement.mcmc"
    assert command_key("refine_size") == "refine_size"
