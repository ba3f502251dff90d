"""Nothing but our own output is ever replaced: ``models.core.output_folder`` and every command that
writes a folder (infer.py, models.training.export, datamodules.synthetic, datamodules.tools.convert).

The first test is the reported data loss: ``input=shoot/photos output=shoot overwrite=true``
deleted the photos and an unrelated ``notes.txt``.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from test_infer import infer_here

from models import create_model
from models.core.output_folder import (
    MARKER_NAME,
    OutputFolder,
    OutputFolderError,
    check_output_folder,
    remove_stale_staging,
)
from models.weights.hub import save_pretrained

REPO_ROOT = Path(__file__).resolve().parents[1]


def _photos(folder: Path, count: int = 2, size: int = 24) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(count):
        array = rng.integers(0, 255, (size, size, 3), dtype=np.uint8)
        Image.fromarray(array).save(folder / f"photo_{i}.png")
    return folder


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


def _infer(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str]:
    result = infer_here(capsys, *args)
    return result.returncode, result.stderr


@pytest.fixture(scope="module")
def zipsplat_weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("weights")
    return save_pretrained(create_model("zipsplat_tiny"), root / "zs", name="zipsplat_tiny")


# --------------------------------------------------------------------------- infer.py


def test_reported_case_input_inside_output_is_refused(capsys, tmp_path, zipsplat_weights) -> None:
    shoot = tmp_path / "shoot"
    photos = _photos(shoot / "photos")
    (shoot / "notes.txt").write_text("my notes", encoding="utf-8")
    before = _snapshot(shoot)
    status, err = _infer(
        capsys,
        f"input={photos}",
        f"output={shoot}",
        "overwrite=true",
        "model=zipsplat_tiny",
        f"weights={zipsplat_weights}",
        "image_size=32",
    )
    assert status == 2
    assert f"{shoot}: holds the input" in err and len(err.strip().splitlines()) == 1
    assert _snapshot(shoot) == before  # the photos and notes.txt are intact


def test_infer_replaces_only_its_own_output(capsys, tmp_path, zipsplat_weights) -> None:
    photos = _photos(tmp_path / "photos")
    out = tmp_path / "out"
    args = [f"input={photos}", "model=zipsplat_tiny", f"weights={zipsplat_weights}"]
    args += ["image_size=32", "orbit_frames=2"]
    assert _infer(capsys, *args, f"output={out}")[0] == 0
    marker = json.loads((out / MARKER_NAME).read_text())
    assert marker["program"] == "infer.py" and "gaussians.ply" in marker["files"]
    assert any(name.startswith("renders/") for name in marker["files"])  # every depth
    # A previous output is replaced with overwrite=true, and keeps the user's normal mode.
    assert _infer(capsys, *args, f"output={out}", "overwrite=true")[0] == 0
    assert stat.S_IMODE(out.stat().st_mode) == 0o777 & ~_umask()
    # A file the user added to an output is never deleted: the replacement is refused.
    (out / "my_edit.txt").write_text("keep me", encoding="utf-8")
    before = _snapshot(out)
    status, err = _infer(capsys, *args, f"output={out}", "overwrite=true")
    assert status == 2 and "my_edit.txt" in err and "did not write" in err
    assert _snapshot(out) == before
    # A non-empty folder that is not an infer.py output is refused, whatever overwrite says.
    other = tmp_path / "other"
    other.mkdir()
    (other / "thesis.tex").write_text("...", encoding="utf-8")
    status, err = _infer(capsys, *args, f"output={other}", "overwrite=true")
    assert status == 2 and "not an output of infer.py" in err
    assert (other / "thesis.tex").read_text() == "..."
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_infer_refuses_dangerous_outputs(capsys, tmp_path, monkeypatch, zipsplat_weights) -> None:
    photos = _photos(tmp_path / "a" / "work" / "photos")
    work = tmp_path / "a" / "work"
    monkeypatch.chdir(work)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "file").write_text("x")
    args = [
        f"input={photos}",
        "model=zipsplat_tiny",
        f"weights={zipsplat_weights}",
        "overwrite=true",
    ]
    cases = {
        ".": "current directory",
        "..": "current directory or a parent",
        str(tmp_path / "home"): "home directory",
        str(tmp_path): "home directory or holds it",
        "/": "filesystem root",
        str(photos): "holds the input",
        str(photos / "sub"): "inside the input",
    }
    before = _snapshot(tmp_path)
    for output, message in cases.items():
        status, err = _infer(capsys, *args, f"output={output}")
        assert status == 2, output
        assert message in err, (output, err)
    assert _snapshot(tmp_path) == before


def test_user_file_deep_inside_an_output_survives(capsys, tmp_path, zipsplat_weights) -> None:
    """The reported loss: ``echo notes > o1/renders/my_notes.txt`` then ``overwrite=true``."""
    photos = _photos(tmp_path / "photos")
    out = tmp_path / "o1"
    args = [f"input={photos}", "model=zipsplat_tiny", f"weights={zipsplat_weights}"]
    args += ["image_size=32", "orbit_frames=2", f"output={out}"]
    assert _infer(capsys, *args)[0] == 0
    (out / "renders" / "my_notes.txt").write_text("notes\n", encoding="utf-8")
    before = _snapshot(out)
    status, err = _infer(capsys, *args, "overwrite=true")
    assert status == 2 and len(err.strip().splitlines()) == 1
    assert "renders/my_notes.txt" in err and "did not write" in err
    assert _snapshot(out) == before  # byte-identical, nothing replaced


def test_marker_covers_every_depth(tmp_path) -> None:
    out = tmp_path / "out"
    with OutputFolder(out, "prog") as staging:
        (staging / "a" / "b").mkdir(parents=True)
        (staging / "a" / "b" / "deep.txt").write_text("ours")
        (staging / "top.txt").write_text("ours")
    # Our own output (nested files included) is replaced.
    with OutputFolder(out, "prog", overwrite=True) as staging:
        (staging / "a" / "b").mkdir(parents=True)
        (staging / "a" / "b" / "deep.txt").write_text("ours again")
    assert (out / "a" / "b" / "deep.txt").read_text() == "ours again"
    # A user's file, an empty folder or a link anywhere inside: refused, naming it.
    for name, make in (
        ("a/b/mine.txt", lambda p: p.write_text("mine")),
        ("a/b/empty", lambda p: p.mkdir()),
        ("a/link", lambda p: p.symlink_to(tmp_path)),
    ):
        target = out / name
        make(target)
        before = _snapshot(out)
        with pytest.raises(OutputFolderError, match=f"did not write \\({name}\\)"):
            check_output_folder(out, "prog", overwrite=True)
        assert _snapshot(out) == before
        target.unlink() if target.is_symlink() or target.is_file() else target.rmdir()
    # A file we wrote that the user edited since is theirs now: refused.
    deep = out / "a" / "b" / "deep.txt"
    deep.write_text("edited by the user, longer")
    with pytest.raises(OutputFolderError, match="changed since prog wrote them \\(a/b/deep.txt"):
        check_output_folder(out, "prog", overwrite=True)
    assert deep.read_text() == "edited by the user, longer"


def test_output_without_marker_is_never_replaced(tmp_path) -> None:
    """No reader of older outputs: a folder without the marker is not ours."""
    out = tmp_path / "old"
    (out / "renders").mkdir(parents=True)
    (out / "gaussians.ply").write_bytes(b"ply")
    summary = {"model": "zipsplat_tiny", "gaussians": 3, "timings_s": {}}
    (out / "summary.json").write_text(json.dumps(summary), encoding="utf-8")
    before = _snapshot(out)
    with pytest.raises(OutputFolderError, match="not an output of infer.py"):
        check_output_folder(out, "infer.py", overwrite=True)
    assert _snapshot(out) == before
    # The first marker format listed top-level entries only: it cannot vouch for subfolders.
    (out / MARKER_NAME).write_text(json.dumps({"program": "infer.py", "entries": ["renders"]}))
    before = _snapshot(out)
    with pytest.raises(OutputFolderError, match="older or unreadable .* remove the folder"):
        check_output_folder(out, "infer.py", overwrite=True)
    assert _snapshot(out) == before


def test_unwritable_output_is_one_line(capsys, tmp_path, zipsplat_weights) -> None:
    """A folder that cannot be created (read-only location; as root, /sys refuses too)."""
    photos = _photos(tmp_path / "photos")
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    target = locked / "out" if os.geteuid() != 0 else Path("/sys/splatzoo-test-out")
    try:
        status, err = _infer(
            capsys, f"input={photos}", f"output={target}", "model=zipsplat_tiny",
            f"weights={zipsplat_weights}", "image_size=32",
        )  # fmt: skip
    finally:
        locked.chmod(0o700)
    assert status == 2 and f"{target}: cannot be written" in err, err


def test_sigterm_cleans_staging(tmp_path, zipsplat_weights) -> None:
    """SIGTERM mid-run removes the staging folder; a stale one of a killed run is removed next."""
    photos = _photos(tmp_path / "photos", count=2, size=32)
    out = tmp_path / "out"
    command = [
        sys.executable, str(REPO_ROOT / "infer.py"), f"input={photos}", f"output={out}",
        "model=zipsplat_tiny", f"weights={zipsplat_weights}", "image_size=32",
        "orbit_frames=400",
    ]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stderr=subprocess.PIPE)
    deadline = time.time() + 240
    while time.time() < deadline and not list(tmp_path.glob(".out.tmp-*")):
        time.sleep(0.1)
    assert list(tmp_path.glob(".out.tmp-*")), "the run never started writing"
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=120)
    assert process.returncode != 0
    assert not list(tmp_path.glob(".out.*")) and not out.exists()


def test_sigterm_while_the_staging_folder_is_made_leaves_nothing(tmp_path, monkeypatch) -> None:
    """The race the subprocess test above can hit on a busy machine: SIGTERM right after the
    staging folder appears (before it is marked and handed to the ``with`` block)."""
    make = os.mkdir

    def made_then_terminated(path, *args, **kwargs):
        make(path, *args, **kwargs)
        if Path(path).name.startswith(".out.tmp-"):
            os.kill(os.getpid(), signal.SIGTERM)  # lands now, or at once in the main thread
            time.sleep(0.2)

    monkeypatch.setattr(os, "mkdir", made_then_terminated)
    busy = threading.Thread(target=time.sleep, args=(2.0,))  # may take the signal (as in infer)
    busy.start()
    previous = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as stopped:
        with OutputFolder(tmp_path / "out", "prog"):
            pytest.fail("the block must not run after SIGTERM")
    assert stopped.value.code == 143
    assert not list(tmp_path.iterdir())
    assert signal.getsignal(signal.SIGTERM) == previous
    busy.join()


def test_stale_staging_of_dead_process_is_removed(tmp_path) -> None:
    out = tmp_path / "out"
    stale = tmp_path / ".out.tmp-abc"
    stale.mkdir()
    (stale / ".splatzoo-staging").write_text("999999999")  # no such process
    alive = tmp_path / ".out.tmp-def"
    alive.mkdir()
    (alive / ".splatzoo-staging").write_text(str(os.getppid()))  # a running process
    foreign = tmp_path / ".out.tmp-user"
    foreign.mkdir()  # not ours (no staging marker): never touched
    assert remove_stale_staging(out) == [stale]
    assert alive.is_dir() and foreign.is_dir() and not stale.exists()


# --------------------------------------------------------------------------- the helper itself


def test_output_folder_error_keeps_old_output(tmp_path) -> None:
    out = tmp_path / "out"
    with OutputFolder(out, "prog") as staging:
        (staging / "a.txt").write_text("first")
    with pytest.raises(RuntimeError):
        with OutputFolder(out, "prog", overwrite=True) as staging:
            (staging / "a.txt").write_text("second")
            raise RuntimeError("boom")
    assert (out / "a.txt").read_text() == "first"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    # Another program's output is never replaced.
    with pytest.raises(OutputFolderError, match="is an output of prog, not of other"):
        check_output_folder(out, "other", overwrite=True)


def test_output_appearing_meanwhile_is_not_replaced(tmp_path) -> None:
    out = tmp_path / "out"
    with pytest.raises(OutputFolderError, match="already holds files"):
        with OutputFolder(out, "prog") as staging:
            (staging / "a.txt").write_text("mine")
            out.mkdir()
            (out / "theirs.txt").write_text("theirs")
    assert (out / "theirs.txt").read_text() == "theirs"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


# --------------------------------------------------------------------------- other commands


def test_export_refuses_a_foreign_folder(tmp_path) -> None:
    from models.training.export import export_checkpoint
    from models.weights.publish import ExportError

    out = tmp_path / "mine"
    out.mkdir()
    (out / "paper.pdf").write_bytes(b"%PDF")
    with pytest.raises(ExportError, match="not an output of models.training.export"):
        export_checkpoint(tmp_path / "missing.ckpt", out, overwrite=True)
    assert (out / "paper.pdf").read_bytes() == b"%PDF"


def test_synthetic_refuses_a_foreign_folder(tmp_path) -> None:
    from datamodules.errors import InputError
    from datamodules.synthetic import SyntheticSettings, generate_dataset

    out = tmp_path / "data"
    out.mkdir()
    (out / "notes.txt").write_text("keep")
    settings = SyntheticSettings(scenes=2, resolution=16, views=2, test_fraction=0.5)
    with pytest.raises(InputError, match="not an output of datamodules.synthetic"):
        generate_dataset(out, settings, progress=False, overwrite=True)
    assert (out / "notes.txt").read_text() == "keep"
    # Its own output is replaced with overwrite.
    fresh = generate_dataset(tmp_path / "fresh", settings, progress=False)
    generate_dataset(fresh, settings, progress=False, overwrite=True)
    assert (fresh / MARKER_NAME).is_file()


def test_convert_refuses_roots_that_are_not_datasets(tmp_path, monkeypatch) -> None:
    from datamodules.errors import InputError
    from datamodules.tools.convert import convert

    photos = _photos(tmp_path / "photos")
    foreign = tmp_path / "documents"
    foreign.mkdir()
    (foreign / "cv.docx").write_bytes(b"x")
    with pytest.raises(InputError, match="not an output of datamodules.tools.convert"):
        convert(photos, foreign, "test", quiet=True)
    with pytest.raises(InputError, match="holds the input"):
        convert(photos, tmp_path, "test", quiet=True)
    monkeypatch.chdir(tmp_path / "photos")
    with pytest.raises(InputError, match="current directory"):
        convert(photos, ".", "test", quiet=True)
    assert sorted(p.name for p in foreign.iterdir()) == ["cv.docx"]


# --------------------------------------------------------------------------- the viewer's Save


def _ply(path: Path, count: int = 40) -> Path:
    import torch

    from models import Gaussians

    torch.manual_seed(0)
    g = Gaussians(
        means=torch.randn(1, count, 3),
        scales=torch.rand(1, count, 3) * 0.1 + 0.01,
        rotations=torch.nn.functional.normalize(torch.randn(1, count, 4), dim=-1),
        opacities=torch.rand(1, count) * 0.9 + 0.05,
        harmonics=torch.randn(1, count, 3, 1) * 0.2,
    )
    g.save_ply(path)
    return path


def test_view_save_never_replaces_the_input_or_a_users_file(tmp_path, capsys, monkeypatch) -> None:
    import view
    from models.view import live

    scene = _ply(tmp_path / "scene.ply")
    notes = tmp_path / "notes.ply"
    notes.write_bytes(b"my own notes, not a ply")
    before = _snapshot(tmp_path)
    for save, message in (
        (scene, "is the input: refusing to replace it"),
        (notes, "exists and view.py did not write it"),
        (tmp_path / "notes.txt", "must be a .ply file name"),
    ):
        assert view.serve_cli([str(scene), f"save={save}"]) == 2
        err = capsys.readouterr().err
        assert message in err and str(save) in err and len(err.strip().splitlines()) == 1
    assert _snapshot(tmp_path) == before  # byte-identical, nothing added
    # The default name never replaces an earlier run's file: the next free name is taken.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "gaussians_view.ply").write_bytes(b"an earlier save")
    assert live._save_path(None) == Path("gaussians_view-1.ply")


def test_viewer_save_button_replaces_only_its_own_file(tmp_path, capsys) -> None:
    from models import Gaussians
    from models.view.server import SplatViewer, ViewScene

    scene = _ply(tmp_path / "scene.ply")
    target = tmp_path / "saved.ply"
    viewer = SplatViewer(
        ViewScene(Gaussians.load_ply(scene)), port=0, save_path=target, inputs=(scene,)
    )
    try:
        viewer._on_save(None)
        viewer.set_knob("max_gaussians", 10)
        viewer._on_save(None)  # a second Save replaces the first one (ours, unchanged)
        assert Gaussians.load_ply(target).num_slots == 10
        target.write_bytes(b"edited by the user")  # now it is theirs
        capsys.readouterr()
        viewer._on_save(None)
        err = capsys.readouterr().err
        assert "not saved" in err and "did not write it" in err
        assert target.read_bytes() == b"edited by the user"
        assert "not saved" in viewer._status.content
    finally:
        viewer.stop()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["saved.ply", "scene.ply"]  # no staging
