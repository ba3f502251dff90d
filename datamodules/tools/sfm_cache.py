"""The structure-from-motion cache's folders: where it lives, entry keys, stale work, staging.

An entry is ``<cache>/<key>`` (``cache_key``: the images' names and bytes, the settings, the
pycolmap version); runs work in ``.sfm-<key>-*`` folders beside it that ``remove_stale`` clears
after a killed run, and a finished entry is renamed into place (``store_entry``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from models.core.output_folder import remove_stale_folders

__all__ = [
    "CACHE_VERSION",
    "cache_key",
    "default_cache_dir",
    "remove_stale",
    "staged_folder",
    "store_entry",
]

CACHE_VERSION = 1


def default_cache_dir() -> Path:
    """``$SPLATZOO_SFM_CACHE``, else ``$XDG_CACHE_HOME/splatzoo/sfm``, else
    ``~/.cache/splatzoo/sfm``."""
    if os.environ.get("SPLATZOO_SFM_CACHE"):
        return Path(os.environ["SPLATZOO_SFM_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "splatzoo" / "sfm"


def cache_key(folder: Path, names: list[str], settings: Any, version: str) -> str:
    digest = hashlib.sha256()
    meta = {"v": CACHE_VERSION, "pycolmap": version, "settings": asdict(settings)}
    digest.update(json.dumps(meta, sort_keys=True).encode())
    for name in names:
        digest.update(name.encode() + b"\0")
        with open(folder / name, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        digest.update(b"\1")
    return digest.hexdigest()[:24]


_CLEANED_TEMP: list[bool] = []  # the temporary folder's stale work was removed in this process


def remove_stale(root: Path | None) -> None:
    """Work folders of killed runs (in the cache and the temporary folder). The temporary folder
    once per process: later, what is there of this process's marked folders is in use (a
    video's frames when the cache is off)."""
    if not _CLEANED_TEMP:
        temp = Path(tempfile.gettempdir())
        remove_stale_folders(temp, (".sfm-*", "splatzoo-sfm-frames-*", "splatzoo-sfm-*"))
        _CLEANED_TEMP.append(True)
    if root is not None:
        remove_stale_folders(root, (".sfm-*",))
        remove_stale_folders(root / "frames", (".*.tmp-*",))


def store_entry(entry: Path, final: Path) -> bool:
    """Move a finished entry into the cache; ``False``, with a warning, when the cache cannot
    take it any more (its folder was removed or made read-only during the run)."""
    try:
        if final.exists():  # another process finished the same input (or a corrupt entry)
            shutil.rmtree(final, ignore_errors=True)
        entry.rename(final)
    except OSError as error:
        reason = getattr(error, "strerror", None) or str(error)
        warnings.warn(
            f"{final.parent}: the structure-from-motion cache cannot be written ({reason}); "
            "running without it (set SPLATZOO_SFM_CACHE to a writable folder)",
            stacklevel=5,  # estimate_poses' caller's caller, as before the split
        )
        return False
    return True


@contextlib.contextmanager
def staged_folder(target: Path) -> Iterator[Path]:
    """A staging folder beside ``target`` (``.<name>.tmp-*``) that replaces ``target`` when the
    block succeeds; removed, and ``target`` left as it was, when the block fails."""
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        yield staging
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
