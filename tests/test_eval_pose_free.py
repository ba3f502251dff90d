"""eval.py on a pose-free release architecture: target poses aligned into the model's frame.

Runs ``eval.evaluate`` in-process on a tiny synthetic chunk dataset with ``zipsplat_da3_tiny``
(ZipSplat's released architecture at test size, untrained weights saved with
``save_pretrained``) at compression 1 and 0.25. The untrained model's scores mean nothing; what is
checked is that the whole path runs and that the outputs say how the targets were placed.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from config_fixtures import compose_config

REPO = Path(__file__).resolve().parents[1]

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    """12 synthetic scenes of 24 views at 64² (one test scene with its evaluation index)."""
    root = tmp_path_factory.mktemp("synthetic")
    subprocess.run(
        [sys.executable, "-m", "datamodules.synthetic", "--out", str(root), "--scenes", "12"]
        + ["--resolution", "64", "--views", "24", "--seed", "0", "--workers", "1"],
        check=True,
        cwd=REPO,
        capture_output=True,
    )
    return root


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> Path:
    import torch

    from models import create_model

    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("zipsplat_da3_tiny")
    create_model("zipsplat_da3_tiny", pretrained=False).save_pretrained(folder)
    return folder


def _overrides(data_root: Path, weights: Path) -> list[str]:
    return [
        "model=zipsplat_da3",
        f"ckpt_path={weights}",
        f"data.root={data_root}",
        "data.num_workers=0",
        "data.persistent_workers=false",
        "trainer.accelerator=cpu",
        "trainer.enable_progress_bar=false",
        "logger=csv",
        "model.pose_fit_steps=10",
        "num_renders=1",
    ]


# ~80 s on 2 loaded cores (mostly the first evaluation's one-off start-up): slow.
@pytest.mark.slow
@pytest.mark.parametrize("compression", [1.0, 0.25])
def test_eval_aligns_targets_for_zipsplat_da3(data_root, weights, tmp_path, compression):
    import eval as eval_script

    overrides = [*_overrides(data_root, weights), f"+eval_kwargs.compression={compression}"]
    cfg = compose_config("eval.yaml", overrides, tmp_path)
    summary = eval_script.evaluate(cfg)
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert metrics["model"] == "zipsplat_da3_tiny"
    assert metrics["eval_kwargs"] == {"compression": compression}
    assert metrics["fit_target_poses"] is True
    assert metrics["target_pose_alignment"] == "similarity"
    placement = metrics["target_pose_placement"]
    assert "similarity" in placement and "context" in placement and "10 steps" in placement
    values = metrics["metrics"]
    assert values == pytest.approx(summary)
    for key in ("psnr", "aligned_psnr", "refined_psnr", "frame_scale", "frame_residual"):
        assert math.isfinite(values[key]), key
    assert values["frame_scale"] > 0
    # The refinement keeps each target's lowest-loss pose, the aligned start included.
    assert values["refined_psnr"] >= values["aligned_psnr"] - 1e-3
    # compression r keeps int(r * tokens) scene tokens: 64 tokens x 4 Gaussians per view pair.
    tokens = 2 * (64 // 8) ** 2
    assert values["gaussians"] == int(compression * tokens) * 4
    header = (tmp_path / "out" / "scenes.csv").read_text().splitlines()[0]
    assert "refined_psnr" in header and "frame_scale" in header
    assert any((tmp_path / "out" / "renders").glob("*.png"))


def test_eval_rejects_an_unknown_alignment(weights, tmp_path):
    import eval as eval_script
    from models.training.cli import UserError

    missing = tmp_path / "no_data"  # refused before the data is read
    overrides = [*_overrides(missing, weights), "target_pose_alignment=affine"]
    cfg = compose_config("eval.yaml", overrides, tmp_path)
    with pytest.raises(UserError, match="target_pose_alignment=affine: must be one of"):
        eval_script.evaluate(cfg)
    assert not (tmp_path / "out" / "metrics.json").exists()
