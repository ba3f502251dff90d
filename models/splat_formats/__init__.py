"""Gaussian-splat file formats besides the INRIA ``.ply``, one module each, chosen by suffix.

``write_splats(path, splats)`` / ``read_splats(path)`` move a :class:`SplatArrays` (NumPy, the
project's conventions) to and from ``.spz`` (Niantic, v4 ZSTD or v3 gzip), ``.sog`` (PlayCanvas,
bundled) or a SOG ``meta.json`` with its images (unbundled), ``.glb`` (``KHR_gaussian_splatting``),
``.splat`` and ``.compressed.ply`` (PlayCanvas). ``Gaussians.save``/``Gaussians.load`` call these;
the plain ``.ply`` stays with ``Gaussians.save_ply``/``load_ply``. This package imports nothing of
the project but the bad-input error (any layer above may use it). docs/formats.md describes the
formats, their quantisation and axes.
"""

from __future__ import annotations

import os

import numpy as np

from datamodules.errors import InputError

from .common import SplatArrays, atomic_write_bytes, read_bytes
from .compressed_ply import is_compressed_ply, read_compressed_ply, write_compressed_ply
from .glb import read_glb, write_glb
from .sog import read_sog, write_sog, write_sog_folder
from .splat import read_splat, write_splat
from .spz import read_spz, write_spz

__all__ = [
    "FORMATS",
    "SplatArrays",
    "format_of",
    "is_splat_file",
    "parse_formats",
    "read_splats",
    "suffix_of",
    "write_splats",
]

# name -> file suffix; "sog" also reads and writes the unbundled form through a meta.json
FORMATS = {
    "ply": ".ply",
    "spz": ".spz",
    "sog": ".sog",
    "glb": ".glb",
    "splat": ".splat",
    "compressed.ply": ".compressed.ply",
}


def suffix_of(name: str) -> str:
    """The file suffix of a format name (``"spz"`` -> ``".spz"``); InputError when unknown."""
    if name not in FORMATS:
        raise InputError(f"formats: unknown format {name!r} (known: {', '.join(FORMATS)})")
    return FORMATS[name]


def parse_formats(value) -> tuple[str, ...]:
    """The ``formats`` setting (``[spz,sog]``, ``spz,sog``, ``spz`` or empty) as format names
    besides ``ply``; InputError naming the setting for an unknown one."""
    if value is None or value == "":
        return ()
    items = value.split(",") if isinstance(value, str) else list(value)
    names = [str(item).strip().lower().lstrip(".") for item in items if str(item).strip()]
    for name in names:
        suffix_of(name)
    return tuple(dict.fromkeys(n for n in names if n != "ply"))


def is_splat_file(path: str | os.PathLike) -> bool:
    """Whether ``path`` names a splat file by its suffix (a SOG folder holding meta.json too)."""
    name = os.path.basename(os.fspath(path).rstrip("/\\")).lower()
    if os.path.isdir(path):
        return os.path.isfile(os.path.join(path, "meta.json"))
    return name.endswith((".ply", ".spz", ".sog", ".glb", ".splat")) or name == "meta.json"


def format_of(path: str | os.PathLike) -> str:
    """The format a path names by its suffix (a folder or ``*.json``: unbundled SOG)."""
    name = os.path.basename(os.fspath(path).rstrip("/\\")).lower()
    if name.endswith(".compressed.ply"):
        return "compressed.ply"
    for key, suffix in FORMATS.items():
        if name.endswith(suffix):
            return key
    if name.endswith(".json") or os.path.isdir(path):
        return "sog"
    raise InputError(
        path,
        "unknown splat file suffix (.ply, .compressed.ply, .spz, .sog, meta.json, .glb, .splat)",
    )


def write_splats(path: str | os.PathLike, splats: SplatArrays, spz_version: int = 4) -> None:
    """Write ``splats`` to ``path`` in the format its suffix names, atomically (a temporary file
    beside it, then renamed; the unbundled SOG writes its images first and ``meta.json`` last)."""
    splats.check(path)
    kind = format_of(path)
    name = os.path.basename(os.fspath(path)).lower()
    if kind == "sog" and name.endswith(".json"):
        folder = os.path.dirname(os.path.abspath(path))
        files = write_sog_folder(path, splats)
        meta_name = os.path.basename(os.fspath(path))
        for file_name, data in files.items():
            if file_name != meta_name:
                atomic_write_bytes(os.path.join(folder, file_name), data)
        atomic_write_bytes(path, files[meta_name])
        return
    atomic_write_bytes(path, _encode(path, kind, splats, spz_version))


def _encode(path, kind: str, splats: SplatArrays, spz_version: int) -> bytes:
    if kind == "spz":
        return write_spz(path, splats, version=spz_version)
    if kind == "sog":
        return write_sog(path, splats)
    if kind == "glb":
        return write_glb(path, splats)
    if kind == "splat":
        return write_splat(path, splats)
    if kind == "compressed.ply":
        return write_compressed_ply(path, splats)
    raise InputError(path, f"{kind} files are written by Gaussians.save_ply")


def read_splats(path: str | os.PathLike) -> SplatArrays:
    """Read the file (or SOG folder) at ``path``, checked: consistent shapes, finite values.

    A ``.ply`` is read here only when it has the compressed layout; an INRIA ``.ply`` raises
    :class:`InputError` (``Gaussians.load_ply`` reads it).
    """
    kind = format_of(path)
    if kind in ("ply", "compressed.ply"):
        data = read_bytes(path)
        if not is_compressed_ply(data):
            raise InputError(path, "not a compressed PLY (read it with Gaussians.load_ply)")
        splats = read_compressed_ply(path, data)
    elif kind == "spz":
        splats = read_spz(path)
    elif kind == "sog":
        splats = read_sog(path)
    elif kind == "glb":
        splats = read_glb(path)
    else:
        splats = read_splat(path)
    n = splats.count
    shapes = [
        splats.means.shape == (n, 3),
        splats.scales.shape == (n, 3),
        splats.rotations.shape == (n, 4),
        splats.opacities.shape == (n,),
        splats.harmonics.ndim == 3 and splats.harmonics.shape[:2] == (n, 3),
    ]
    if not all(shapes):
        raise InputError(path, "the Gaussians' attributes have inconsistent shapes")
    splats.check(path)
    splats.rotations = splats.rotations / np.linalg.norm(splats.rotations, axis=1, keepdims=True)
    return splats
