"""The install keeps the torch that is already there (a CPU-only build, README's Set up)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(
    importlib.util.find_spec("setuptools") is None,
    reason="pip's resolver check builds the project's metadata with the installed setuptools",
)
def test_install_keeps_the_installed_torch(tmp_path: Path) -> None:
    """``pip install -e ".[dev]"`` again, as a dry run without an index: every dependency, torch
    and torchvision included (whatever their build: +cpu, +cu130), is already satisfied, so pip
    would install the project alone and download nothing."""
    report = tmp_path / "report.json"
    command = [sys.executable, "-m", "pip", "install", "--dry-run", "--no-index"]
    command += ["--no-build-isolation", "--quiet", "--report", str(report), "-e", ".[dev]"]
    result = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    would_install = [item["metadata"]["name"] for item in json.loads(report.read_text())["install"]]
    assert would_install == ["splatzoo"], would_install
