"""README.md's commands run as written, and the documentation's links resolve.

Every command in README.md's ``bash`` blocks is classified below: run here (quick), run as a
``slow`` test, or skipped for a stated reason. A command in neither list fails the test, so a
command added to the README without being checked cannot pass unnoticed. Commands run from the
repository root exactly as written, except that ``python`` is this interpreter and every
``output=DIR`` is moved into a temporary folder. The quick ones run side by side, in one fixture.

README.md's ``python`` blocks run too, each in a temporary folder.

Every relative link (and image) in README.md and docs/ must name a file of the repository, and
its ``#anchor``, when it has one, a heading of that file. Every ``python -m MODULE`` and
``python FILE.py`` in a ``bash`` block, and every ``from MODULE import NAME`` in a ``python``
block, of README.md and docs/ must name something that exists.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").rglob("*.md"))

# Commands that run in the quick suite, with the files each must write (relative to its output=).
QUICK: dict[str, tuple[str, ...]] = {
    "python infer.py input=examples/synthetic_room output=outputs/demo overwrite=true": (
        "gaussians.ply",
        "cameras.json",
        "summary.json",
        "path.mp4",
    ),
    "python infer.py input=examples/synthetic_room output=outputs/quarter model=zipsplat_tiny "
    "compression=0.25 overwrite=true": ("gaussians.ply", "summary.json"),
    "python infer.py --help": (),
    "python view.py --help": (),
    "python -m datamodules.tools.convert --help": (),
    "python -m datamodules.tools.make_index --help": (),
    "python -m models.training.export --help": (),
    "python -m models.weights.convert --help": (),
}
# Commands that take minutes: run with ``-m slow``, with PROJECT_ROOT (data, logs) in a tmp folder.
SLOW: set[str] = {
    "python eval.py model=pixel_aligned ckpt_path=checkpoints/pixel_aligned_tiny",
}
# Commands not run by this test, and why.
NOT_RUN: dict[str, str] = {
    "python -m venv .venv": "creates a virtual environment; this test already runs inside one",
    ". .venv/bin/activate": "activates that environment (a shell builtin)",
    'python -m pip install -e ".[dev]"': "installs the package; .ci/run runs it before the tests",
    "python -m pip install torch==2.14.1 torchvision==0.29.1 --index-url "
    "https://download.pytorch.org/whl/cpu": "installs the CPU-only torch (the PyTorch index is "
    "not reachable offline); tests/test_install.py checks that the install then keeps it",
    "python -m pytest": "the test suite itself, which holds this test",
    "python view.py outputs/demo": "serves until Ctrl-C; tests/test_viewer.py runs the viewer",
    "python infer.py input=path/to/photos output=out/ds model=depthsplat_small "
    "weights=my-finetune.pth views=2": "needs the user's photos and release-format weights; "
    "tests/test_input_recipe.py runs DepthSplat-small on real drone frames with a generated file",
    "python infer.py input=path/to/photos output=out/all model=pixel_aligned_tiny views=all "
    "holdout=8": "needs the user's photos; tests/test_capture.py runs views=all holdout= on a "
    "synthetic capture",
    "python infer.py input=path/to/photos output=out/refined model=pixel_aligned_tiny views=all "
    "holdout=8 refine_time=480 refine_size=240": "needs the user's photos and 8 minutes; "
    "tests/test_refine*.py refine synthetic captures",
    "python train.py experiment=synthetic_zipsplat": "trains for hours on a CPU; "
    "tests/test_train.py trains every model config a step",
}
ENV = {"HF_HUB_OFFLINE": "1", "MPLBACKEND": "Agg", "WANDB_MODE": "disabled"}


def bash_commands(path: Path) -> list[str]:
    """Every command of a markdown file's ``bash`` blocks: continuations joined, comments and
    ``&&`` chains split off, whitespace normalised."""
    blocks = re.findall(r"^```bash\n(.*?)^```", path.read_text(encoding="utf-8"), re.M | re.S)
    commands = []
    for block in blocks:
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"(^|\s)#.*$", "", line).strip()  # a comment, or a trailing one
            commands += [" ".join(part.split()) for part in line.split(" && ") if part.strip()]
    return commands


def python_blocks(path: Path) -> list[str]:
    """The ``python`` blocks of a markdown file."""
    return re.findall(r"^```python\n(.*?)^```", path.read_text(encoding="utf-8"), re.M | re.S)


README_COMMANDS = bash_commands(README)
README_PYTHON = python_blocks(README)


def _argv(command: str, out: Path) -> list[str]:
    """The command as an argument list: this interpreter, outputs moved under ``out``."""
    argv = shlex.split(command)
    assert argv[0] == "python", command
    argv[0] = sys.executable
    return [f"output={out / a[len('output=') :]}" if a.startswith("output=") else a for a in argv]


def _run(
    command: str, out: Path, env: dict[str, str], timeout: float, cwd: Path = ROOT
) -> subprocess.CompletedProcess:
    return subprocess.run(
        _argv(command, out),
        cwd=cwd,
        env={**os.environ, **ENV, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def quick_runs(tmp_path_factory) -> dict[str, subprocess.CompletedProcess]:
    """Runs every quick command of the README once, up to four at a time."""
    out = tmp_path_factory.mktemp("readme")
    commands = [c for c in README_COMMANDS if c in QUICK]
    env = {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    snippets = [f"python -c {shlex.quote(code)}" for code in README_PYTHON]
    (out / "python").mkdir()
    env_python = {**env, "PYTHONPATH": str(ROOT)}  # the snippets run in a folder of their own

    def run(command: str) -> subprocess.CompletedProcess:
        if command in snippets:
            return _run(command, out, env_python, timeout=300, cwd=out / "python")
        return _run(command, out, env, timeout=300)

    with ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:
        results = pool.map(run, [*commands, *snippets])
        return {"__out__": out, **dict(zip([*commands, *README_PYTHON], results))}


def test_readme_has_commands_and_every_one_is_classified():
    assert README_COMMANDS, "README.md has no bash block"
    unknown = [c for c in README_COMMANDS if c not in QUICK and c not in SLOW and c not in NOT_RUN]
    assert not unknown, (
        f"README.md commands not classified in tests/test_readme.py (add each to QUICK, SLOW or "
        f"NOT_RUN): {unknown}"
    )
    stale = [c for c in [*QUICK, *SLOW, *NOT_RUN] if c not in README_COMMANDS]
    assert not stale, f"tests/test_readme.py lists commands the README no longer has: {stale}"


def test_ci_runs_the_readme_setup_commands():
    """``.ci/run`` installs, runs the demo and tests exactly as the README says."""
    ci = [" ".join(line.split()) for line in (ROOT / ".ci/run").read_text().splitlines()]
    ci = [re.sub(r"\s*\|\|.*$", "", line).replace(" -q ", " ") for line in ci]
    for command in (
        "python -m venv .venv",
        ". .venv/bin/activate",
        'python -m pip install -e ".[dev]"',
        "python infer.py input=examples/synthetic_room output=outputs/demo overwrite=true",
        "python -m pytest",
    ):
        assert command in README_COMMANDS, f"README.md no longer says {command!r}"
        assert command in ci, f".ci/run does not run the README's {command!r}"


@pytest.mark.parametrize("command", [c for c in README_COMMANDS if c in QUICK])
def test_quick_command_runs_as_written(command, quick_runs):
    result = quick_runs[command]
    assert result.returncode == 0, f"{command}\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
    if command.endswith("--help"):
        assert "usage" in (result.stdout + result.stderr).lower() or len(result.stdout) > 200
    outputs = [a[len("output=") :] for a in shlex.split(command) if a.startswith("output=")]
    for name in QUICK[command]:
        written = quick_runs["__out__"] / outputs[0] / name
        assert written.is_file() and written.stat().st_size > 0, f"{command}: no {name}"


@pytest.mark.parametrize("index", range(len(README_PYTHON)))
def test_readme_python_runs_as_written(index, quick_runs):
    result = quick_runs[README_PYTHON[index]]
    assert result.returncode == 0, f"{README_PYTHON[index]}\n{result.stderr[-4000:]}"


@pytest.mark.slow
@pytest.mark.parametrize("command", [c for c in README_COMMANDS if c in SLOW])
def test_slow_command_runs_as_written(command, tmp_path):
    result = _run(command, tmp_path, {"PROJECT_ROOT": str(tmp_path)}, timeout=3600)
    assert result.returncode == 0, f"{command}\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}"


@pytest.mark.parametrize("command", sorted(NOT_RUN))
def test_command_not_run_here(command):
    pytest.skip(f"{command!r}: {NOT_RUN[command]}")


def _slug(heading: str) -> str:
    """GitHub's anchor of a markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.M | re.S)
    return {_slug(h) for h in re.findall(r"^#{1,6} (.+)$", text, re.M)}


def _links(path: Path) -> list[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.M | re.S)
    text = re.sub(r"`[^`\n]*`", "", text)  # inline code is not a link
    return re.findall(r"\]\(([^)\s]+)\)", text)


@pytest.mark.parametrize("page", [README, *DOCS], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    broken = []
    for link in _links(page):
        if re.match(r"^[a-z]+:", link):  # https:, mailto: ...
            continue
        file, _, anchor = link.partition("#")
        target = (page.parent / file).resolve() if file else page
        name = target.relative_to(ROOT).as_posix() if target.is_relative_to(ROOT) else None
        if name is None:
            broken.append(f"{link} (outside the repository)")
        elif not target.exists():
            broken.append(f"{link} (no such file)")
        elif anchor and target.suffix == ".md" and anchor not in _anchors(target):
            broken.append(f"{link} (no heading #{anchor} in {name})")
    assert not broken, f"{page.relative_to(ROOT)}: broken links: {broken}"


@pytest.mark.parametrize("page", [README, *DOCS], ids=lambda p: str(p.relative_to(ROOT)))
def test_documented_programs_exist(page):
    """Each ``python -m MODULE`` names a module and each ``python FILE.py`` a file."""
    missing = []
    for command in bash_commands(page):
        argv = shlex.split(re.sub(r"^(\w+=\S+ )+", "", command))  # leading VAR=value settings
        if not argv or argv[0] != "python" or len(argv) < 2:
            continue
        if argv[1] == "-m":
            if importlib.util.find_spec(argv[2]) is None:
                missing.append(command)
        elif argv[1].endswith(".py") and not (ROOT / argv[1]).is_file():
            missing.append(command)
    assert not missing, f"{page.relative_to(ROOT)}: commands naming nothing that exists: {missing}"


@pytest.mark.parametrize("page", [README, *DOCS], ids=lambda p: str(p.relative_to(ROOT)))
def test_documented_imports_exist(page):
    """Each ``from MODULE import NAME`` line of the ``python`` blocks names something real (an
    attribute or a submodule)."""
    missing = []
    for block in python_blocks(page):
        for module, names in re.findall(r"^from ([\w.]+) import ([\w, ]+)$", block, re.M):
            imported = importlib.import_module(module)
            missing += [
                f"{module}.{n.strip()}"
                for n in names.split(",")
                if not hasattr(imported, n.strip())
                and importlib.util.find_spec(f"{module}.{n.strip()}") is None  # a submodule
            ]
    assert not missing, f"{page.relative_to(ROOT)}: imports of names that do not exist: {missing}"


def test_nothing_points_at_a_design_file_outside_the_repository():
    """The contract is docs/design.md; no file sends a reader to a copy beside the repository."""
    files = subprocess.run(
        ["git", "ls-files", "*.py", "*.md", "*.yaml", "*.toml"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    this = Path(__file__).relative_to(ROOT).as_posix()
    outside = [
        f for f in files if f != this and "shared/DESIGN" in (ROOT / f).read_text(encoding="utf-8")
    ]
    assert not outside, f"files pointing at a DESIGN.md outside the repository: {outside}"


@pytest.mark.parametrize("page", [README, *DOCS], ids=lambda p: str(p.relative_to(ROOT)))
def test_code_blocks_are_closed(page):
    fences = re.findall(r"^```", page.read_text(encoding="utf-8"), re.M)
    assert len(fences) % 2 == 0, f"{page.relative_to(ROOT)}: a code block is not closed"
