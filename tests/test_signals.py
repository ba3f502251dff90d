"""Ctrl-C and SIGTERM, as real signals to real processes: one line, prompt exit, nothing left.

Structure-from-motion (pycolmap) runs in a child process (``datamodules/tools/sfm_worker.py``):
pycolmap's own SIGTERM handler (glog's stack dump, once in seven tries a hang) never runs in the
command, the child is killed at once, and its work folder is removed; folders of a run killed
outright (SIGKILL) are removed by the next run. The 8 drone frames take ~6 s of SIFT on this CPU,
long enough to interrupt each stage reliably.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import pytest
from data_fixtures import SHARED_DATA

REPO_ROOT = Path(__file__).resolve().parents[1]
FRAMES = SHARED_DATA / "examples" / "drone_frames"
needs_frames = pytest.mark.skipif(not FRAMES.is_dir(), reason=f"no drone frames at {FRAMES}")


class Command:
    """A command started in its own session (as a shell job), its stderr read line by line."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.process = subprocess.Popen(
            [sys.executable, *args],
            cwd=REPO_ROOT,
            env={**os.environ, "OMP_NUM_THREADS": "1", **env},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stderr:
            self.lines.put(line)
        self.lines.put(None)

    def wait_for(self, text: str, timeout: float = 300.0) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                line = self.lines.get(timeout=0.2)
            except queue.Empty:
                continue
            if line is None:
                raise AssertionError(f"exited before {text!r}: {''.join(self.seen)}")
            self.seen.append(line)
            if text in line:
                return
        raise AssertionError(f"no {text!r} within {timeout} s: {''.join(self.seen)}")

    def signal(self, signum: int, group: bool = False) -> tuple[int, float, list[str]]:
        """Send ``signum`` (to the whole process group: what the terminal's Ctrl-C does);
        returns (exit status, seconds to exit, stderr lines after the signal)."""
        start = time.monotonic()
        if group:
            os.killpg(self.process.pid, signum)
        else:
            self.process.send_signal(signum)
        status = self.process.wait(timeout=30)
        seconds = time.monotonic() - start
        after = []
        while (line := self.lines.get(timeout=10)) is not None:
            after.append(line)
        return status, seconds, after


def _workers(marker: Path) -> list[str]:
    """Running ``sfm_worker.py`` processes whose command line names ``marker``'s folder."""
    out = subprocess.run(["pgrep", "-af", "sfm_worker.py"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if str(marker) in line]


def _convert(tmp_path: Path, cache: Path | str) -> Command:
    env = {"TMPDIR": str(tmp_path / "tmp"), "SPLATZOO_SFM_CACHE": str(cache)}
    (tmp_path / "tmp").mkdir(exist_ok=True)
    args = ["-m", "datamodules.tools.convert", str(FRAMES), f"out={tmp_path / 'out'}"]
    return Command([*args, "split=test", "poses=auto"], env)


def _sfm_folders(*roots: Path) -> list[Path]:
    found = []
    for root in roots:
        if root.is_dir():
            found += [p for p in root.iterdir() if p.name.startswith((".sfm-", "splatzoo-sfm"))]
    return found


@needs_frames
def test_sfm_killed_terminated_interrupted(tmp_path: Path) -> None:
    cache, temp = tmp_path / "cache", tmp_path / "tmp"
    # SIGKILL (nothing can clean up): the pycolmap child dies with its parent; the work folder
    # it leaves is removed by the next run.
    command = _convert(tmp_path, cache)
    command.wait_for("sfm: features")
    command.process.kill()
    command.process.wait(timeout=30)
    end = time.monotonic() + 10
    while _workers(cache) and time.monotonic() < end:
        time.sleep(0.2)
    assert not _workers(cache)
    (stale,) = _sfm_folders(cache)

    # SIGTERM: one line, exit 143 within seconds, no C++ stack dump, nothing left behind.
    command = _convert(tmp_path, cache)
    command.wait_for("sfm: features")
    assert not stale.exists()  # the killed run's folder, removed before this run started SfM
    time.sleep(0.5)
    status, seconds, after = command.signal(signal.SIGTERM)
    assert status == 143 and seconds < 10, (status, seconds, after)
    assert after == ["datamodules.tools.convert: stopped by SIGTERM\n"], after
    assert not _sfm_folders(cache, temp) and not _workers(cache)
    assert not (tmp_path / "out").exists()

    # Ctrl-C (SIGINT to the process group), with an unwritable cache: a warning, the run goes on
    # without the cache (in the temporary folder), and Ctrl-C leaves that clean too.
    command = _convert(tmp_path, "/proc/splatzoo-sfm-cache")
    command.wait_for("cache cannot be written")
    command.wait_for("sfm: features")
    time.sleep(0.5)
    status, seconds, after = command.signal(signal.SIGINT, group=True)
    assert status == 130 and seconds < 10, (status, seconds, after)
    assert after == ["datamodules.tools.convert: stopped by Ctrl-C\n"], after
    assert not _sfm_folders(temp) and not _workers(temp)


@pytest.mark.parametrize("script", ["infer.py", "view.py"])
def test_ctrl_c_is_one_line(tmp_path: Path, script: str) -> None:
    """Ctrl-C while the command loads (imports, model, input): one line, exit 130."""
    example = REPO_ROOT / "examples" / "synthetic_room"
    args = [f"input={example}", f"output={tmp_path / 'out'}", "model=zipsplat_tiny"]
    if script == "view.py":
        args = [str(example), "model=zipsplat_tiny", "port=0"]
    command = Command([script, *args], {"TMPDIR": str(tmp_path)})
    time.sleep(1.5)  # inside the imports and the model load on an idle or a loaded machine
    status, _, after = command.signal(signal.SIGINT, group=True)
    lines = command.seen + after
    assert status == 130, lines
    assert lines == [f"{script}: stopped by Ctrl-C\n"], lines
    assert not (tmp_path / "out").exists()


_GENERATE = """
import signal, sys
from datamodules.synthetic import SyntheticSettings, generate_dataset
from models.core.command_line import stopped_cleanly
signal.signal(signal.SIGTERM, lambda *_: None)  # like Lightning's SIGTERM "bypass": only returns
settings = SyntheticSettings(scenes=int(sys.argv[2]), resolution=16, views=4, supersample=1)
with stopped_cleanly("gen"):
    for i in range(int(sys.argv[3])):
        generate_dataset(f"{sys.argv[1]}/d{i}", settings, workers=2, progress=False)
        print("done", i, flush=True)
"""


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def test_generator_pool_ends_under_inherited_handlers(tmp_path: Path) -> None:
    """Workers forked under handlers that turn SIGTERM into an exception (or ignore it) still end:
    the pool closes by itself, and never waits on a worker that a handler kept alive."""
    result = subprocess.run(
        [sys.executable, "-c", _GENERATE, str(tmp_path), "6", "5"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n").count("done 4") == 1


def test_sigterm_to_generator_ends_its_workers(tmp_path: Path) -> None:
    process = subprocess.Popen(
        [
            sys.executable,
            "-c",
            _GENERATE.replace("lambda *_: None", "signal.SIG_DFL"),
            str(tmp_path),
            "400",
            "1",
        ],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 300
    workers: list[int] = []
    while len(workers) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
        workers = _children(process.pid)
    assert len(workers) == 2
    time.sleep(1.0)
    process.send_signal(signal.SIGTERM)
    try:
        _, err = process.communicate(timeout=30)
    finally:
        process.kill()
    assert process.returncode == 143
    assert err.strip().splitlines() == ["gen: stopped by SIGTERM"]
    for pid in workers:
        assert (
            not Path(f"/proc/{pid}").exists()
            or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
        )
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left


def test_sigterm_to_the_generator_command(tmp_path: Path) -> None:
    """``python -m datamodules.synthetic`` under SIGTERM: one line, exit 143, no output folder and
    no staging folder left."""
    out = tmp_path / "synthetic"
    process = subprocess.Popen(
        [sys.executable, "-m", "datamodules.synthetic", "--out", str(out), "--scenes", "2000",
         "--resolution", "32", "--quiet"],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and process.poll() is None:
        if [p for p in tmp_path.iterdir() if p.name.startswith(".")]:  # the staging folder
            break
        time.sleep(0.1)
    time.sleep(0.5)
    process.send_signal(signal.SIGTERM)
    try:
        _, err = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 143, err[-2000:]
    assert err.strip().splitlines() == ["datamodules.synthetic: stopped by SIGTERM"]
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------- train.py, eval.py

_SYNTHETIC = {"scenes": 40, "resolution": 32, "views": 24, "test_fraction": 0.5, "supersample": 1}


@pytest.fixture(scope="module")
def synthetic_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """40 synthetic scenes at 32² (20 of them test scenes), generated in about a second."""
    root = tmp_path_factory.mktemp("synthetic")
    flags = [f"--{key.replace('_', '-')}={value}" for key, value in _SYNTHETIC.items()]
    subprocess.run(
        [sys.executable, "-m", "datamodules.synthetic", "--out", str(root), *flags, "--quiet"],
        cwd=REPO_ROOT, check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    return root


def _lightning_command(script: str, root: Path, run: Path, *args: str) -> Command:
    data = [f"data.generator.{key}={value}" for key, value in _SYNTHETIC.items() if key != "views"]
    common = [
        f"data.root={root}", *data, "data.num_workers=0", "data.persistent_workers=false",
        "trainer.accelerator=cpu", "trainer.enable_progress_bar=false", f"hydra.run.dir={run}",
    ]  # fmt: skip
    return Command([script, *common, *args], {"PROJECT_ROOT": str(REPO_ROOT)})


def _wait_until(found, what: str, command: Command, timeout: float = 600.0) -> None:
    end = time.monotonic() + timeout
    while not found():
        if command.process.poll() is not None or time.monotonic() > end:
            command.process.kill()
            raise AssertionError(f"no {what}: {command.process.wait()} {''.join(command.seen)}")
        time.sleep(0.2)


def _assert_stopped(status: int, lines: list[str], script: str, signum: int) -> None:
    """Exit status 130 / 143, and the stop is one line: no traceback, no Lightning notice."""
    term = signum == signal.SIGTERM
    assert status == (143 if term else 130), (status, lines)
    assert lines[-1] == f"{script}: stopped by {'SIGTERM' if term else 'Ctrl-C'}\n", lines
    said = [line for line in lines if any(w in line for w in ("SIGTERM", "Interrupt", "stopped"))]
    assert said == lines[-1:] and not [line for line in lines if "Traceback" in line], lines


@pytest.mark.parametrize("workers", [pytest.param(0, marks=pytest.mark.slow), 2])  # 2: the harder
def test_train_sigterm_mid_run(synthetic_root: Path, tmp_path: Path, workers: int) -> None:
    """SIGTERM once a checkpoint is written: one line, exit 143, the checkpoints whole. With
    loader workers it goes to the whole process group (as ``timeout`` or a scheduler sends it):
    the workers end quietly, and the parent does not report them as killed."""
    run = tmp_path / "run"
    command = _lightning_command(
        "train.py", synthetic_root, run, "model=pixel_aligned", "data.image_size=[32,32]",
        "data.batch_size=1", "data.num_target_views=2", "data.val_scenes=1",
        f"data.num_workers={workers}", f"data.persistent_workers={str(workers > 0).lower()}",
        "trainer.max_steps=1000000", "trainer.val_check_interval=2", "trainer.limit_val_batches=1",
        "callbacks.model_checkpoint.every_n_train_steps=2", "callbacks.model_summary=null",
        "logger=csv",
    )  # fmt: skip
    last = run / "checkpoints" / "last.ckpt"
    _wait_until(last.is_file, "checkpoint", command)
    time.sleep(1.0)  # training on
    children = _children(command.process.pid)
    assert len(children) >= 2 * workers  # persistent train and validation workers
    status, seconds, after = command.signal(signal.SIGTERM, group=workers > 0)
    _assert_stopped(status, command.seen + after, "train.py", signal.SIGTERM)
    assert seconds < 20, seconds
    with zipfile.ZipFile(last) as archive:  # torch's format: a whole zip, every member intact
        assert archive.testzip() is None
    assert not [p.name for p in (run / "checkpoints").iterdir() if p.name.startswith(".")]
    assert not [pid for pid in children if Path(f"/proc/{pid}").exists()]


class _HandlerProbe:
    """A dataset whose items say which SIGINT / SIGTERM handlers its worker runs."""

    def __len__(self) -> int:
        return 2

    def __getitem__(self, index: int) -> tuple[bool, bool]:
        interrupt, term = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
        return interrupt is signal.default_int_handler, term is not _parent_handler


def _parent_handler(signum, frame) -> None:  # noqa: ARG001
    print("the parent's handler ran", file=sys.stderr)


def test_loader_workers_do_not_run_the_parents_handlers(monkeypatch) -> None:
    """The data module's loaders start workers with Ctrl-C as PyTorch's worker loop expects and
    their own SIGTERM handling, not the handlers of the process that forked them."""
    from datamodules.training.datamodule import SplatDataModule

    module = SplatDataModule.__new__(SplatDataModule)
    module.num_workers, module.persistent_workers, module.pin_memory = 1, False, False
    previous = {s: signal.signal(s, _parent_handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        loader = module._loader(_HandlerProbe(), batch_size=1, train=False)
        seen = [tuple(bool(v) for v in batch) for batch in loader]
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    assert seen == [(True, True), (True, True)]


@pytest.mark.parametrize(
    "signum", [signal.SIGTERM, pytest.param(signal.SIGINT, marks=pytest.mark.slow)]
)
def test_eval_stopped_mid_run(synthetic_root: Path, tmp_path: Path, signum: int) -> None:
    """Ctrl-C / SIGTERM while eval.py scores the test scenes: one line, exit 130 / 143, and no
    metrics files (nor their staging folder)."""
    run = tmp_path / "run"
    command = _lightning_command(
        "eval.py", synthetic_root, run, "model=pixel_aligned",
        f"ckpt_path={REPO_ROOT / 'checkpoints' / 'pixel_aligned_tiny'}",
        "data.image_size=[256,256]", "num_renders=0",
    )  # fmt: skip
    _wait_until((run / "csv").is_dir, "test loop", command)  # the logger starts with the test
    time.sleep(1.0)
    status, seconds, after = command.signal(signum, group=signum == signal.SIGINT)
    _assert_stopped(status, command.seen + after, "eval.py", signum)
    assert seconds < 20, seconds
    left = sorted(p.name for p in run.iterdir())
    assert not {"metrics.json", "scenes.csv", "renders"} & set(left), left
    assert not [name for name in left if name.startswith(".eval")], left


def test_eval_outputs_are_whole_or_absent(tmp_path: Path, monkeypatch) -> None:
    """An interruption while eval.py writes its results leaves the earlier set as it was."""
    import torch
    import torchvision.utils

    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    import eval as eval_script

    records = [{"scene": "a", "psnr": 20.0}, {"scene": "b", "psnr": 22.0}]
    image = torch.zeros(3, 4, 4)
    samples = [{"scene": s, "context": [image], "target": [image], "render": [image]} for s in "ab"]
    eval_script.write_outputs(str(tmp_path), records, samples, {"model": "first"})
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    assert set(before) == {"metrics.json", "scenes.csv"}
    saved = torchvision.utils.save_image

    def second_save(tensor, path, *args, **kwargs):
        if path.endswith("01_b.png"):
            raise KeyboardInterrupt
        saved(tensor, path, *args, **kwargs)

    monkeypatch.setattr(torchvision.utils, "save_image", second_save)
    with pytest.raises(KeyboardInterrupt):
        eval_script.write_outputs(str(tmp_path), records[::-1], samples, {"model": "second"})
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json", "renders", "scenes.csv"]
    assert sorted(p.name for p in (tmp_path / "renders").iterdir()) == ["00_a.png", "01_b.png"]


def test_a_batch_lost_to_the_group_sigterm_is_the_stop() -> None:
    """SIGTERM to the process group ends the loader workers too; a batch then fails to arrive
    (multiprocessing's resource_sharer: ``ConnectionRefusedError``). After Lightning saw the
    SIGTERM that is the stop (one line, exit 143); before it, the error it is."""
    from types import SimpleNamespace

    from models.core.command_line import Terminated, stopped_by_signal

    stopping = SimpleNamespace(interrupted=False, received_sigterm=True)
    with pytest.raises(Terminated):
        with stopped_by_signal(stopping):
            raise ConnectionRefusedError(111, "Connection refused")
    running = SimpleNamespace(interrupted=False, received_sigterm=False)
    with pytest.raises(ConnectionRefusedError):
        with stopped_by_signal(running):
            raise ConnectionRefusedError(111, "Connection refused")


def test_the_resource_sharer_thread_is_quiet_after_the_sigterm() -> None:
    """The group's SIGTERM also ends a loader worker that multiprocessing's resource_sharer
    thread was handing a batch to; that thread's error is the stop, reported by no one. Before
    the SIGTERM, or from any other thread, an error goes to the previous hook as usual."""
    import threading
    from multiprocessing import resource_sharer
    from types import SimpleNamespace

    from models.core.command_line import stopped_by_signal

    def fail_in(filename: str) -> None:
        code = compile("raise ConnectionResetError(104, 'reset by peer')", filename, "exec")
        thread = threading.Thread(target=exec, args=(code, {}))
        thread.start()
        thread.join()

    original = threading.excepthook
    try:
        for received, filename, reported in (
            (True, resource_sharer.__file__, False),
            (False, resource_sharer.__file__, True),
            (True, "elsewhere.py", True),
        ):
            seen = []
            threading.excepthook = lambda args, seen=seen: seen.append(args.exc_type)
            with stopped_by_signal(SimpleNamespace(interrupted=False, received_sigterm=received)):
                fail_in(filename)
            assert (seen == [ConnectionResetError]) == reported, (received, filename, seen)
    finally:
        threading.excepthook = original
