"""The inference library (``models.pipeline.inference``): reconstruct on the shipped tiny models with given
cameras and pose-free, knob checks against the families' declarations, and write_reconstruction's
atomic output (the ``models.core.output_folder`` rules the exporter follows too)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from models import Gaussians, create_model
from models.core.output_folder import MARKER_NAME, OutputFolderError
from models.geometry.cameras import normalize_scene
from models.pipeline.inference import (
    InferenceError,
    KnobError,
    Reconstruction,
    check_knobs,
    reconstruct,
    write_reconstruction,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = REPO_ROOT / "examples" / "synthetic_room"


def _turn(angle: float, x: float) -> torch.Tensor:
    pose = torch.eye(4)
    c, s = torch.cos(torch.tensor(angle)), torch.sin(torch.tensor(angle))
    pose[0, 0], pose[0, 2], pose[2, 0], pose[2, 2] = c, s, -s, c
    pose[:3, 3] = torch.tensor([x, 0.1, 0.0])
    return pose


@pytest.fixture(scope="module")
def views() -> dict[str, torch.Tensor]:
    """Two 64x64 views of the shipped example room with two cameras in an arbitrary world frame."""
    from datamodules.readers.image_folder import load_images

    images = load_images(EXAMPLE, image_size=(64, 64), num_views=2)
    extrinsics = torch.stack([_turn(0.1, 2.0), _turn(-0.2, 2.7)])  # not the scene frame
    return {"image": images.images, "extrinsics": extrinsics, "intrinsics": images.intrinsics}


_BLOCKED = ("lightning", "pytorch_lightning", "hydra", "omegaconf", "wandb")
_WITHOUT = f"""
import sys, importlib.abc

class Block(importlib.abc.MetaPathFinder):  # as if these were not installed
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {_BLOCKED!r}:
            raise ImportError("blocked: " + name)

sys.meta_path.insert(0, Block())
import torch
from models import create_model
from models.pipeline.inference import reconstruct, write_reconstruction

model = create_model("zipsplat_tiny").eval()
result = reconstruct(model, torch.rand(2, 3, 32, 32), pose_fit_steps=0, compression=0.5)
write_reconstruction(result, sys.argv[1], frames=2, backend="torch")
shared = ("datamodules", "datamodules.errors")  # the bad-input error class, and its package
print(sorted(m for m in sys.modules if m.split(".")[0] in {_BLOCKED!r} + shared[:1]
             and m not in shared))
"""


def test_runs_without_lightning_hydra_wandb(tmp_path: Path) -> None:
    """Import, reconstruct and write with Lightning, Hydra, OmegaConf and wandb unimportable; the
    library loads nothing of ``datamodules`` but the bad-input error class (``InputError``)."""
    result = subprocess.run(
        [sys.executable, "-c", _WITHOUT, str(tmp_path / "out")],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "[]"
    assert (tmp_path / "out" / "gaussians.ply").is_file()


def test_posed_model_with_given_cameras(views, one_thread) -> None:
    """The library adds nothing to the forward: the Gaussians are the model's on the normalised
    context, and the given cameras come back in the scene frame, marked given."""
    model = create_model("pixel_aligned_tiny", pretrained=True).eval()
    cameras = {"extrinsics": views["extrinsics"], "intrinsics": views["intrinsics"]}
    result = reconstruct(model, views["image"], cameras, backend="torch", max_gaussians=3000)
    assert isinstance(result, Reconstruction)
    assert result.placement == ["given", "given"] and result.poses == "input (given)"
    assert result.model == "pixel_aligned_tiny" and not result.pose_free
    assert result.knobs == {"max_gaussians": 3000} and 0 < result.count <= 3000
    assert result.image_size == (64, 64) and result.timings["inference"] >= 0
    expected, _, _ = normalize_scene(views["extrinsics"][None])
    assert torch.allclose(result.extrinsics, expected[0], atol=1e-6)
    assert torch.allclose(result.extrinsics[0], torch.eye(4), atol=1e-6)
    context = {
        "image": views["image"][None],
        "extrinsics": result.extrinsics[None],  # what it ran on (allclose to expected above)
        "intrinsics": views["intrinsics"][None],
        "near": torch.full((1, 2), 0.25),  # the input recipe (configs/data/synthetic.yaml)
        "far": torch.full((1, 2), 50.0),
    }
    with torch.inference_mode():
        direct = model(context, max_gaussians=3000).gaussians
    assert torch.equal(direct.means, result.gaussians.means)
    assert torch.equal(direct.harmonics, result.gaussians.harmonics)
    # A posed model without extrinsics is one line naming the model.
    with pytest.raises(InferenceError, match="model=pixel_aligned_tiny: needs camera poses"):
        reconstruct(model, views["image"])


def test_pose_free_model_places_views(views, one_thread) -> None:
    """ZipSplat (shipped, pose-free, predicts no cameras): given cameras place its views; without
    them test-time pose fit does, or they stay unknown. The compression knob counts."""
    model = create_model("zipsplat_tiny", pretrained=True).eval()
    given = reconstruct(model, views["image"], {"extrinsics": views["extrinsics"]}, compression=1.0)
    assert given.pose_free and given.placement == ["given", "given"]
    assert "does not predict cameras" in given.poses
    unknown = reconstruct(model, views["image"], pose_fit_steps=0, compression=1.0)
    assert unknown.placement == ["identity", "unknown"] and unknown.known == [0]
    # The model never saw the poses: the same Gaussians either way.
    assert torch.equal(given.gaussians.means, unknown.gaussians.means)
    refined = reconstruct(model, views["image"], pose_fit_steps=2, backend="torch")
    assert refined.placement == ["identity", "refined"] and "pose fit" in refined.poses
    assert torch.allclose(refined.extrinsics[0], torch.eye(4))
    assert not torch.allclose(refined.extrinsics[1], torch.eye(4))  # moved by the fit
    fewer = reconstruct(model, views["image"], pose_fit_steps=0, compression=0.25)
    assert 0 < fewer.count < unknown.count


def test_reconstruct_is_its_window_stages(views, one_thread) -> None:
    """The stages of one window (what view.py runs around its knob runner), called alone, give
    what reconstruct gives: the same Gaussians, cameras, placement and frame."""
    from models.pipeline.inference import (
        place_views,
        run_forward,
        window_input,
        window_reconstruction,
    )

    model = create_model("pixel_aligned_tiny", pretrained=True).eval()
    cameras = {"extrinsics": views["extrinsics"], "intrinsics": views["intrinsics"]}
    whole = reconstruct(model, views["image"], cameras, backend="torch", max_gaussians=2000)
    window = window_input(model, views["image"], cameras, knobs={"max_gaussians": 2000})
    assert "extrinsics" in window.context and window.knobs == {"max_gaussians": 2000}
    pred = run_forward(model, window)
    placed = place_views(window, pred)
    assert placed.placement == ["given", "given"]
    staged = window_reconstruction(model, window, pred, placed)
    assert torch.equal(staged.gaussians.means, whole.gaussians.means)
    assert torch.equal(staged.extrinsics, whole.extrinsics)
    assert staged.placement == whole.placement and staged.poses == whole.poses
    assert staged.frame.scale == whole.frame.scale and staged.knobs == whole.knobs
    with pytest.raises(KnobError, match="no 'compression' setting"):
        window_input(model, views["image"], cameras, knobs={"compression": 0.5})


def test_knobs_are_checked_against_the_declarations() -> None:
    """One line naming the knob, its type and range; works on names without building."""
    assert check_knobs("zipsplat_tiny", {"compression": "0.5", "max_gaussians": None}) == {
        "compression": 0.5
    }
    with pytest.raises(KnobError, match=r"^compression=2: must be a number in \(0, 1\]$"):
        check_knobs("zipsplat_tiny", {"compression": 2})
    with pytest.raises(KnobError, match=r"^max_gaussians=1.5: must be an integer in \[0, inf\)$"):
        check_knobs("zipsplat_tiny", {"max_gaussians": 1.5})
    with pytest.raises(KnobError, match=r"iterations=3: model zipsplat_tiny has no 'iterations'"):
        check_knobs("zipsplat_tiny", {"iterations": 3})
    with pytest.raises(KnobError, match=r"^iterations=17: must be an integer in \[0, 16\]$"):
        check_knobs("resplat_tiny", {"iterations": 17})
    # The range that depends on the built model (SplatWeaver's largest expert).
    weaver = create_model("splatweaver_tiny")
    with pytest.raises(KnobError, match=r"gaussians_per_pixel=3.5: must be a number in \[0, 3\]"):
        check_knobs(weaver, {"gaussians_per_pixel": 3.5})
    with pytest.raises(KnobError, match="has no 'compression'"):
        reconstruct(weaver, torch.rand(2, 3, 32, 32), compression=0.5)


def _small_result(count: int = 200) -> Reconstruction:
    """A reconstruction of random Gaussians in front of two cameras (no model needed)."""
    generator = torch.Generator().manual_seed(0)
    means = torch.rand(1, count, 3, generator=generator) - 0.5
    means[..., 2] += 2.0
    gaussians = Gaussians(
        means=means,
        scales=torch.full((1, count, 3), 0.05),
        rotations=torch.tensor([1.0, 0, 0, 0]).expand(1, count, 4).clone(),
        opacities=torch.full((1, count), 0.8),
        harmonics=torch.rand(1, count, 3, 1, generator=generator) - 0.5,
    )
    k = torch.tensor([[1.0, 0, 0.5], [0, 1.0, 0.5], [0, 0, 1]]).expand(2, 3, 3).clone()
    return Reconstruction(
        gaussians=gaussians,
        extrinsics=torch.stack([torch.eye(4), _turn(0.1, 0.3)]),
        intrinsics=k,
        placement=["given", "unknown"],
        poses="test",
        images=torch.rand(2, 3, 16, 16, generator=generator),
        names=["a.png", "b.png"],
        model="none",
        maps={"cardinality": torch.randint(0, 4, (2, 16, 16), generator=generator)},
    )


def test_write_reconstruction_files(tmp_path: Path) -> None:
    result = _small_result()
    out = write_reconstruction(result, tmp_path / "out", frames=3, fps=5, backend="torch")
    assert out == (tmp_path / "out").resolve()
    summary = json.loads((out / "summary.json").read_text())
    cameras = json.loads((out / "cameras.json").read_text())
    assert summary["gaussians"] == 200 == int(Gaussians.load_ply(out / "gaussians.ply").count()[0])
    assert summary["placement"] == ["given", "unknown"] and cameras["unknown_poses"] == ["b.png"]
    assert [f["pose"] for f in cameras["frames"]] == ["input"]  # cameras.json's vocabulary
    assert cameras["frames"][0]["fx"] == pytest.approx(16.0)  # model pixels: no ImageSet
    assert "orbit" in summary["camera_path"] and len(cameras["path"]) == 3
    assert sorted(p.name for p in (out / "renders").iterdir()) == ["00_a.png"]
    assert len(list((out / "path").glob("frame_*.png"))) == 3 and (out / "path.mp4").is_file()
    assert summary["cardinality"]["gaussians_per_pixel"] == pytest.approx(
        float(result.maps["cardinality"].float().mean()), abs=1e-4
    )
    assert json.loads((out / MARKER_NAME).read_text())["program"] == "infer.py"
    for key in ("save_ply", "render_inputs", "render_path", "write_video", "total"):
        assert summary["timings_s"][key] >= 0


def test_write_reconstruction_is_atomic(tmp_path: Path, monkeypatch) -> None:
    """The output_folder rules: a failure leaves nothing (no staging folder either), a user's
    folder is never replaced, an earlier output only with overwrite."""
    import models.pipeline.inference_outputs as inference

    result = _small_result()
    out = tmp_path / "out"

    def broken(*args, **kwargs):
        raise OSError("disk full")

    with monkeypatch.context() as patch:
        patch.setattr(inference, "_write_video", broken)
        with pytest.raises(OSError, match="disk full"):
            write_reconstruction(result, out, frames=2, backend="torch")
    assert not out.exists() and list(tmp_path.iterdir()) == []

    write_reconstruction(result, out, frames=2, backend="torch")
    before = (out / "summary.json").read_text()
    with pytest.raises(OutputFolderError, match="overwrite=true"):
        write_reconstruction(result, out, frames=2, backend="torch")
    with monkeypatch.context() as patch:  # a failed overwrite keeps the old output as it was
        patch.setattr(inference, "_write_video", broken)
        with pytest.raises(OSError):
            write_reconstruction(result, out, frames=2, backend="torch", overwrite=True)
    assert (out / "summary.json").read_text() == before
    write_reconstruction(result, out, frames=4, backend="torch", overwrite=True)
    assert len(list((out / "path").glob("*.png"))) == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    with pytest.raises(OutputFolderError, match="not an output of infer.py"):
        write_reconstruction(result, mine, frames=2, backend="torch", overwrite=True)
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]
    with pytest.raises(OutputFolderError, match="holds the input"):
        write_reconstruction(result, tmp_path / "w", inputs=[tmp_path / "w" / "x"], frames=2)


def test_infer_model_setting_is_not_the_training_group() -> None:
    """``model=NAME`` is a plain setting of infer.py, even where ``configs/model/NAME.yaml`` (a
    training config) exists; no other training group leaks in."""
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    import infer

    assert (REPO_ROOT / "configs" / "model" / "zipsplat.yaml").is_file()
    for name in ("zipsplat", "noposplat_tiny"):
        cfg = infer.compose(["input=a", "output=b", f"model={name}", "compression=0.5"])
        assert cfg.model == name and cfg.compression == 0.5
        assert "net" not in cfg and "recipe" not in cfg


def test_zoo_sweeps_the_declared_knobs() -> None:
    """bench/zoo.py's scored points are the families' ``Knob.sweep`` declarations."""
    sys.path.insert(0, str(REPO_ROOT / "bench"))
    import zoo

    from models.weights.knobs import inference_knobs

    for family in zoo.FAMILIES.values():
        swept = [k for k in inference_knobs(family.model) if k.sweep]
        points = [v.kwargs for v in family.variants if v.kwargs]
        if not swept:
            assert family.knob == "-" and points == []
            continue
        knob = swept[0]
        assert family.knob == knob.name
        assert points == [{knob.name: value} for value in knob.sweep]
        for value in knob.sweep:
            check_knobs(family.model, {knob.name: value})  # every point is in range
    assert zoo.FAMILIES["splatweaver"].variants[0].kwargs == {}  # as routed, then the budgets
