"""What a user types reaches the program: paths with any characters, settings checked in one line,
``--help`` that explains, hints that name models which load."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from PIL import Image

from models import create_model
from models.core.command_line import quote_path_arguments
from models.weights.hub import save_pretrained
from models.weights.registry import pose_free_models

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

NAMES = ["café", "目录/写真", "photos (1)", "it's here", "a=b,c", "tab\there", "back\\slash"]


@pytest.mark.parametrize("name", NAMES)
def test_quoted_paths_parse_back_to_themselves(name: str) -> None:
    parser = OverridesParser.create()
    for key in ("input", "output", "cameras", "weights", "ckpt_path", "+data.root"):
        (argument,) = quote_path_arguments([f"{key}=/tmp/{name}"])
        assert parser.parse_override(argument).value() == f"/tmp/{name}"
    assert quote_path_arguments(["views=3", "model=zipsplat_tiny"]) == [
        "views=3",
        "model=zipsplat_tiny",
    ]
    assert quote_path_arguments(["input='already quoted'"]) == ["input='already quoted'"]


def _photos(folder: Path) -> Path:
    folder.mkdir(parents=True)
    rng = np.random.default_rng(1)
    for i in range(2):
        Image.fromarray(rng.integers(0, 255, (24, 24, 3), dtype=np.uint8)).save(folder / f"{i}.jpg")
    return folder


def test_infer_accepts_any_path(tmp_path: Path) -> None:
    weights = save_pretrained(
        create_model("zipsplat_tiny"), tmp_path / "w (ü)", name="zipsplat_tiny"
    )
    photos = _photos(tmp_path / "café (1)" / "目录")
    out = tmp_path / "résultat (2)"
    command = [
        sys.executable, str(REPO_ROOT / "infer.py"), f"input={photos}", f"output={out}",
        "model=zipsplat_tiny", f"weights={weights}", "image_size=32", "orbit_frames=2",
    ]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert (out / "gaussians.ply").is_file()


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("views=0", "views=0: must be at least 1"),
        ("views=-3", "views=-3: must be a whole number >= 1"),
        ("views=abc", "views=abc: must be a whole number >= 1"),
        ("orbit_frames=0", "orbit_frames=0: must be at least 1"),
        ("iterations=-1", "iterations=-1: must be a whole number >= 0"),
    ],
)
def test_bad_counts_are_one_line(capsys, tmp_path: Path, setting: str, message: str) -> None:
    import infer

    photos = _photos(tmp_path / "photos")
    capsys.readouterr()
    status = infer.run_cli(infer.compose([f"input={photos}", f"output={tmp_path / 'o'}", setting]))
    err = capsys.readouterr().err.strip()
    assert status == 2 and err == f"error: {message}"


def test_help_explains_every_setting() -> None:
    import infer

    text = infer.help_text()
    for line in (
        "image_size=null",
        "the shipped tiny models use 64",
        "overwrite=false",
        "only an earlier infer.py output",
        "views=null",
        "frames sampled from a video",
    ):
        assert line in text, line
    result = subprocess.run(
        [sys.executable, str(REPO_ROOT / "infer.py"), "--help"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0 and result.stdout.strip() == text.strip()


def test_pose_free_hint_names_models_that_load() -> None:

    hint = pose_free_models()
    assert "zipsplat_tiny" in hint
    assert "noposplat_tiny" not in hint  # registered, but no weights ship: it would not load
    for name in hint:
        if "(downloads" not in name:
            create_model(name, pretrained=True)  # every shipped suggestion loads
