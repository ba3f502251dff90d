"""Output folders that are written atomically and never replace anything but our own output.

Every command that writes a folder (``infer.py``, ``python -m models.refine``,
``models.training.export``, ``models.weights.convert``, ``datamodules.synthetic``) goes through
:class:`OutputFolder` (``datamodules.tools.convert`` through its checks,
:func:`check_output_folder`, and its marker):

- the output is refused outright (whatever ``overwrite`` says) when it is a filesystem root, the
  home directory or a parent of it, the current directory or a parent of it, the same as an input,
  inside an input, or holds an input;
- an existing non-empty folder is replaced only with ``overwrite`` and only when it carries this
  program's marker (:data:`MARKER_NAME`, written into every folder published here, listing every
  file and folder written, at any depth, with its size and modification time) and holds nothing
  the marker does not list and nothing changed since — so user files are never deleted;
- the new content is written into a hidden staging folder beside the output and moved into place
  when complete (never half-written); the staging folder is removed on any error, on Ctrl-C and
  on SIGTERM, and stale staging folders of a killed run are removed by the next one;
- published folders get the user's normal permissions (``mkdtemp`` makes them 0700).

:class:`OutputFile` is the same for one file (the viewer's Save): written atomically, never the
input, never replacing a file it did not write.

This module imports only the bad-input error and the SIGTERM handling of
:mod:`models.core.command_line` (any layer may use it).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

from datamodules.errors import InputError
from models.core.command_line import sigterm_raises

__all__ = [
    "MARKER_NAME",
    "OutputFile",
    "OutputFolder",
    "OutputFolderError",
    "check_output_folder",
    "free_file_name",
    "mark_staging",
    "remove_stale_folders",
    "read_marker",
    "remove_stale_staging",
    "write_marker",
]

MARKER_NAME = ".splatzoo-output.json"
_STAGING_MARKER = ".splatzoo-staging"


class OutputFolderError(InputError):
    """The output folder may not be written or replaced (one line naming it)."""


def _resolve(path: str | os.PathLike) -> Path:
    return Path(path).expanduser().resolve(strict=False)


def _contains(parent: Path, child: Path) -> bool:
    """``child`` is ``parent`` or lies inside it (both resolved)."""
    return child == parent or parent in child.parents


def read_marker(folder: str | os.PathLike) -> dict | None:
    """The marker of a folder published by :class:`OutputFolder`, or ``None``.

    The marker is ``{"program": NAME, "files": {relative path: [size, mtime_ns]}, "folders":
    [relative path, ...]}``: every file and folder written, at any depth (paths with ``/``).
    """
    path = Path(folder) / MARKER_NAME
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("program"), str):
        return None
    if not isinstance(data.get("files"), dict) or not isinstance(data.get("folders"), list):
        return None
    return data


def _tree(folder: Path) -> tuple[dict[str, list[int]], list[str]]:
    """Every file (``{relative path: [size, mtime_ns]}``; symbolic links count as files, never
    followed) and every folder below ``folder``, our own marker files left out."""
    files: dict[str, list[int]] = {}
    folders: list[str] = []
    for root, dirs, names in os.walk(folder, followlinks=False):
        base = Path(root)
        for name in list(dirs):
            path = base / name
            if path.is_symlink():  # os.walk lists links to folders as folders
                dirs.remove(name)
                names.append(name)
            else:
                folders.append(path.relative_to(folder).as_posix())
        for name in names:
            path = base / name
            relative = path.relative_to(folder).as_posix()
            if relative in (MARKER_NAME, _STAGING_MARKER):
                continue
            info = path.lstat()
            files[relative] = [info.st_size, info.st_mtime_ns]
    return files, sorted(folders)


def write_marker(folder: str | os.PathLike, program: str) -> None:
    """Mark ``folder`` as ``program``'s output, listing every file and folder in it now."""
    folder = Path(folder)
    files, folders = _tree(folder)
    marker = {"program": program, "files": dict(sorted(files.items())), "folders": folders}
    (folder / MARKER_NAME).write_text(json.dumps(marker, indent=1), encoding="utf-8")


def _shown(paths: list[str]) -> str:
    return ", ".join(paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")


def _replaceable(output: Path, program: str, replace: bool) -> str | None:
    """Why the existing non-empty folder ``output`` must not be replaced (``replace``) or added
    to, or ``None`` if it may: it must carry ``program``'s marker and hold nothing the marker does
    not list, at any depth; a replaced folder's files must also be unchanged since written."""
    marker = read_marker(output)
    if marker is None and (output / MARKER_NAME).is_file():
        return (
            f"carries an older or unreadable {MARKER_NAME} that does not list every file "
            "written: refusing to replace it; remove the folder yourself or choose another"
        )
    if marker is None:
        return (
            f"holds files that are not an output of {program} (no {MARKER_NAME}): "
            "refusing to replace it; choose a new or empty folder"
        )
    if marker["program"] != program:
        return f"is an output of {marker['program']}, not of {program}: refusing to replace it"
    files, folders = _tree(output)
    written, written_folders = marker["files"], set(marker["folders"])
    extra = sorted(set(files) - set(written)) + sorted(set(folders) - written_folders)
    if extra:
        return (
            f"holds files {program} did not write ({_shown(extra)}): refusing to replace it; "
            "move them away or choose another folder"
        )
    changed = sorted(
        name for name, stat in files.items() if replace and list(written[name]) != stat
    )
    if changed:
        return (
            f"holds files changed since {program} wrote them ({_shown(changed)}): refusing to "
            "replace it; move them away or choose another folder"
        )
    return None


def check_output_folder(
    output: str | os.PathLike,
    program: str,
    inputs: Iterable[str | os.PathLike] = (),
    overwrite: bool = False,
    replace: bool = True,
) -> Path:
    """Check that ``output`` may be written (see the module docstring); returns it resolved.

    Args:
        output: the folder to write.
        program: the writing program's name, recorded in and checked against the marker.
        inputs: paths the program reads; the output may neither be, hold nor lie inside one.
        overwrite: whether an existing non-empty output of this program may be replaced.
        replace: ``False`` for programs that add to an existing output instead of replacing it
            (then only the location rules apply, plus the marker rule for non-empty folders).

    Raises:
        OutputFolderError: one line naming the folder and the reason.
    """
    shown = os.fspath(output)
    resolved = _resolve(output)
    if resolved.exists() and not resolved.is_dir():
        raise OutputFolderError(shown, "exists and is not a folder")
    if resolved == Path(resolved.anchor):
        raise OutputFolderError(shown, "is a filesystem root: refusing to write there")
    home = _resolve(Path.home())
    if _contains(resolved, home):
        raise OutputFolderError(shown, "is the home directory or holds it: refusing to write there")
    cwd = _resolve(Path.cwd())
    if _contains(resolved, cwd):
        raise OutputFolderError(
            shown, "is the current directory or a parent of it: choose a new folder"
        )
    _check_inputs(shown, resolved, inputs)
    ancestor = resolved
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise OutputFolderError(shown, f"cannot be written ({ancestor} is not writable)")
    if resolved.is_dir() and any(resolved.iterdir()):
        if replace and not overwrite:
            raise OutputFolderError(
                shown, "already holds files (pass overwrite=true to replace them)"
            )
        reason = _replaceable(resolved, program, replace)
        if reason is not None:
            raise OutputFolderError(shown, reason)
    return resolved


def _check_inputs(shown: str, resolved: Path, inputs: Iterable[str | os.PathLike]) -> None:
    for source in inputs:
        source_resolved = _resolve(source)
        if _contains(resolved, source_resolved):
            raise OutputFolderError(
                shown, f"holds the input {os.fspath(source)}: choose another folder"
            )
        if _contains(source_resolved, resolved):
            raise OutputFolderError(shown, f"lies inside the input {os.fspath(source)}")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def mark_staging(folder: str | os.PathLike) -> None:
    """Record this process in ``folder`` (a temporary folder of ours) so that, should the process
    be killed, :func:`remove_stale_folders` of a later run removes it."""
    (Path(folder) / _STAGING_MARKER).write_text(str(os.getpid()), encoding="utf-8")


def remove_stale_folders(parent: str | os.PathLike, patterns: Iterable[str]) -> list[Path]:
    """Remove folders in ``parent`` matching ``patterns`` (globs) that :func:`mark_staging`
    marked with a process id that no longer runs; folders without the mark are never touched.
    Returns what was removed."""
    parent = Path(parent)
    removed: list[Path] = []
    if not parent.is_dir():
        return removed
    for pattern in patterns:
        for candidate in parent.glob(pattern):
            try:
                pid = int((candidate / _STAGING_MARKER).read_text(encoding="utf-8").strip())
            except (OSError, ValueError):
                continue
            if pid != os.getpid() and _pid_alive(pid):
                continue
            shutil.rmtree(candidate, ignore_errors=True)
            removed.append(candidate)
    return removed


def remove_stale_staging(output: str | os.PathLike) -> list[Path]:
    """Remove staging and backup folders left beside ``output`` by killed runs of this module.

    Only folders named like ours that carry our staging marker with a process id that no longer
    runs are removed. Returns what was removed.
    """
    output = _resolve(output)
    return remove_stale_folders(output.parent, (f".{output.name}.tmp-*", f".{output.name}.old-*"))


def _user_mode() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return 0o777 & ~umask


class OutputFolder:
    """Write a folder atomically: ``with OutputFolder(out, "infer.py") as staging: ...``.

    ``__enter__`` checks the output (:func:`check_output_folder`), removes stale staging folders
    and returns a fresh staging folder beside it; a clean ``__exit__`` marks the staging folder,
    checks the output again (nothing appeared meanwhile) and swaps it into place; any exception
    (SIGTERM included) removes the staging folder and leaves the old output as it was.
    """

    def __init__(
        self,
        output: str | os.PathLike,
        program: str,
        inputs: Iterable[str | os.PathLike] = (),
        overwrite: bool = False,
    ) -> None:
        self.shown = os.fspath(output)
        self.program = program
        self.inputs = list(inputs)
        self.overwrite = overwrite
        self.output = self.check()
        self.staging: Path | None = None
        self._terminate = sigterm_raises()

    def check(self) -> Path:
        return check_output_folder(self.shown, self.program, self.inputs, self.overwrite)

    def __enter__(self) -> Path:
        self._terminate.__enter__()
        self.staging = None
        try:
            self.output.parent.mkdir(parents=True, exist_ok=True)
            remove_stale_staging(self.output)
            self._make_staging()
            (self.staging / _STAGING_MARKER).write_text(str(os.getpid()), encoding="utf-8")
        except BaseException as error:  # SIGTERM (Terminated) included, at any point here
            if self.staging is not None:
                shutil.rmtree(self.staging, ignore_errors=True)
                self.staging = None
            self._terminate.__exit__(None, None, None)
            if isinstance(error, OSError):
                reason = error.strerror or type(error).__name__
                raise OutputFolderError(self.shown, f"cannot be written ({reason})") from error
            raise
        return self.staging

    def _make_staging(self) -> None:
        """``mkdtemp`` with the name recorded before the folder exists: a SIGTERM landing just
        after it appears (any thread may take the signal) finds it in ``self.staging``."""
        for _ in range(100):
            self.staging = self.output.parent / f".{self.output.name}.tmp-{secrets.token_hex(4)}"
            try:
                os.mkdir(self.staging, 0o700)
                return
            except FileExistsError:
                continue
        self.staging = None
        raise FileExistsError(f"no free staging name beside {self.output}")

    def __exit__(self, exc_type, exc, tb) -> None:
        staging, self.staging = self.staging, None
        try:
            if exc_type is None and staging is not None:
                self._publish(staging)
                staging = None
        finally:
            if staging is not None and staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
            self._terminate.__exit__(None, None, None)

    def _publish(self, staging: Path) -> None:
        write_marker(staging, self.program)
        os.chmod(staging, _user_mode())
        self.check()  # nothing appeared there meanwhile
        output = self.output
        if output.exists():
            backup = output.with_name(f".{output.name}.old-{os.getpid()}")
            output.rename(backup)
            (backup / _STAGING_MARKER).write_text(str(os.getpid()), encoding="utf-8")
            try:
                staging.rename(output)
            except OSError:
                backup.rename(output)  # put the old output back
                (output / _STAGING_MARKER).unlink(missing_ok=True)
                raise
            shutil.rmtree(backup, ignore_errors=True)
        else:
            staging.rename(output)
        (output / _STAGING_MARKER).unlink(missing_ok=True)


class OutputFile:
    """One file written atomically that never replaces a file it did not write itself.

    ``OutputFile("scene.ply", "view.py", inputs=[source], suffix=".ply").write(save)`` calls
    ``save(staging_path)`` and moves the result into place. The target must not be, or lie
    inside, an input; an existing target is replaced only when this object wrote it and nobody
    changed it since (same size and modification time), so a second Save replaces the first one
    and nothing else: a user's file, the input ``.ply`` or a file of an earlier run is refused.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        program: str,
        inputs: Iterable[str | os.PathLike] = (),
        suffix: str | None = None,
    ) -> None:
        self.shown = os.fspath(path)
        self.program = program
        self.inputs = list(inputs)
        self.suffix = suffix
        self.path = _resolve(path)
        self._written: tuple[int, int] | None = None  # (size, mtime_ns) of our last write
        self.check()

    def _ours(self) -> bool:
        try:
            info = self.path.lstat()
        except OSError:
            return False
        return self._written == (info.st_size, info.st_mtime_ns)

    def check(self) -> Path:
        """The target, resolved, if it may be written now.

        Raises:
            OutputFolderError: one line naming the file and the reason.
        """
        if self.suffix is not None and self.path.suffix.lower() != self.suffix:
            raise OutputFolderError(self.shown, f"must be a {self.suffix} file name")
        for source in self.inputs:
            source_resolved = _resolve(source)
            if self.path == source_resolved:
                raise OutputFolderError(self.shown, "is the input: refusing to replace it")
            if _contains(source_resolved, self.path) and source_resolved.is_dir():
                raise OutputFolderError(self.shown, f"lies inside the input {os.fspath(source)}")
        if self.path.is_dir():
            raise OutputFolderError(self.shown, "is a folder")
        if (self.path.exists() or self.path.is_symlink()) and not self._ours():
            raise OutputFolderError(
                self.shown,
                f"exists and {self.program} did not write it (in this run): refusing to replace "
                "it; choose another file name",
            )
        ancestor = self.path.parent
        while not ancestor.exists() and ancestor != ancestor.parent:
            ancestor = ancestor.parent
        if not os.access(ancestor, os.W_OK | os.X_OK):
            raise OutputFolderError(self.shown, f"cannot be written ({ancestor} is not writable)")
        return self.path

    def write(self, save: Callable[[Path], None]) -> Path:
        """Write the file with ``save(staging path)``, then move it into place; returns the path.

        Raises:
            OutputFolderError: the target may not be written (see :meth:`check`), also when
                another process created it meanwhile.
        """
        target = self.check()
        with sigterm_raises():
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                handle, name = tempfile.mkstemp(
                    prefix=f".{target.name}.tmp-", suffix=target.suffix, dir=target.parent
                )
            except OSError as error:
                reason = error.strerror or type(error).__name__
                raise OutputFolderError(self.shown, f"cannot be written ({reason})") from error
            os.close(handle)
            staging = Path(name)
            try:
                save(staging)
                os.chmod(staging, 0o666 & _user_mode())
                if self._ours():
                    os.replace(staging, target)
                else:  # link: fails instead of replacing a file that appeared meanwhile
                    try:
                        os.link(staging, target)
                    except FileExistsError:
                        raise OutputFolderError(
                            self.shown, "appeared meanwhile: refusing to replace it"
                        ) from None
            finally:
                staging.unlink(missing_ok=True)
            info = target.lstat()
            self._written = (info.st_size, info.st_mtime_ns)
        return target


def free_file_name(path: str | os.PathLike) -> Path:
    """``path`` if nothing is there, else the first free ``stem-1.suffix``, ``stem-2.suffix``..."""
    path = Path(path)
    candidate, n = path, 0
    while candidate.exists() or candidate.is_symlink():
        n += 1
        candidate = path.with_name(f"{path.stem}-{n}{path.suffix}")
    return candidate
