"""PlayCanvas' SOG (version 2), written from its specification (PlayCanvas' "SOG format" page and
splat-transform's reader): lossless WebP images plus ``meta.json``, either bundled in one ``.sog``
(a zip archive of stored entries) or unbundled in a folder (``meta.json`` beside the images).

Quantisation as the format fixes it: positions 16 bits per axis of ``sign(x) log(|x| + 1)`` between
per-axis bounds (two images, low and high byte); rotations smallest-three in 3 x 8 bits with the
largest component's index as 252..255 in alpha; log-scales and DC colours as indices into one
256-entry codebook each; opacity 8 bits; higher SH bands as a palette of at most 64K centroids
(k-means over each Gaussian's coefficients) whose entries index a 256-entry codebook. The images are
in Morton order of the positions, so the order of the Gaussians changes on the way.

Axes: as the INRIA ``.ply`` (splat-transform writes SOG in "PLY space").
"""

from __future__ import annotations

import io
import json
import math
import os
import zipfile

import numpy as np

from datamodules.errors import InputError

from .common import (
    SplatArrays,
    kmeans_1d,
    morton_order,
    pack_smallest_three,
    read_bytes,
    unpack_smallest_three,
)

__all__ = ["read_sog", "sog_palette_size", "write_sog", "write_sog_folder"]

_SH_COUNTS = (0, 3, 8, 15)
_FILES = {
    "means": ["means_l.webp", "means_u.webp"],
    "scales": ["scales.webp"],
    "quats": ["quats.webp"],
    "sh0": ["sh0.webp"],
    "shN": ["shN_centroids.webp", "shN_labels.webp"],
}


def _webp(rgba: np.ndarray) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    # exact: keep the RGB of transparent texels (alpha is opacity in sh0.webp)
    Image.fromarray(rgba, "RGBA").save(buffer, "WEBP", lossless=True, quality=100, method=4,
                                       exact=True)  # fmt: skip
    return buffer.getvalue()


def _short(codebook: np.ndarray) -> list[float]:
    """float32 values as the shortest decimals that read back to them (a smaller meta.json)."""
    return [float(str(v)) for v in codebook.astype(np.float32)]


def _log_transform(x: np.ndarray) -> np.ndarray:
    return np.sign(x) * np.log1p(np.abs(x))


def sog_palette_size(count: int, device: str = "cpu") -> int:
    """Centroids of the higher-SH palette: splat-transform's rule (1K..64K by powers of two, a
    thousand and more Gaussians a centroid); on the CPU at most 4K, so that a million Gaussians
    take about a minute."""
    if count < 2048:
        size = max(1, min(count, 1024))
    else:
        size = min(64, 2 ** int(math.floor(math.log2(count / 1024)))) * 1024
    return size if device == "cuda" else min(size, 4096)


def _kmeans(points: np.ndarray, iterations: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """Lloyd's k-means of ``points [N, D]`` into :func:`sog_palette_size` centroids, fitted on at
    most 32 points a centroid and then assigning every point (torch; CUDA when present)."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    k = sog_palette_size(points.shape[0], device)
    everything = torch.from_numpy(points.astype(np.float32)).to(device)
    generator = torch.Generator().manual_seed(0)
    order = torch.randperm(everything.shape[0], generator=generator).to(device)
    x = everything[order[: 32 * k]]
    centroids = x[:k].clone()

    def assign(x: torch.Tensor) -> torch.Tensor:
        labels = torch.empty(x.shape[0], dtype=torch.long, device=device)
        c_norm = (centroids * centroids).sum(1)
        step = max(1, (1 << 25) // k)
        for start in range(0, x.shape[0], step):
            distance = c_norm[None, :] - 2.0 * x[start : start + step] @ centroids.T
            labels[start : start + step] = distance.argmin(1)
        return labels

    for _ in range(iterations):
        labels = assign(x)
        sums = torch.zeros_like(centroids).index_add_(0, labels, x)
        counts = torch.bincount(labels, minlength=k).to(x.dtype)
        filled = counts > 0
        centroids[filled] = sums[filled] / counts[filled, None]
    return centroids.cpu().numpy(), assign(everything).cpu().numpy()


def _images(splats: SplatArrays) -> tuple[dict, dict[str, bytes]]:
    n = splats.count
    width = max(4, math.ceil(math.sqrt(n) / 4) * 4)
    height = max(4, math.ceil(n / width / 4) * 4)
    splats = splats.take(morton_order(splats.means))

    def image(channels: list[np.ndarray], alpha=None) -> bytes:
        rgba = np.zeros((width * height, 4), dtype=np.uint8)
        rgba[:, 3] = 255
        for i, values in enumerate(channels):
            rgba[:n, i] = values
        if alpha is not None:
            rgba[:n, 3] = alpha
        return _webp(rgba.reshape(height, width, 4))

    logged = _log_transform(splats.means.astype(np.float64))
    low, high = logged.min(axis=0), logged.max(axis=0)
    span = np.where(high > low, high - low, 1.0)
    means16 = np.clip(np.round((logged - low) / span * 65535.0), 0, 65535).astype(np.uint16)
    files = {
        "means_l.webp": image([means16[:, a] & 0xFF for a in range(3)]),
        "means_u.webp": image([means16[:, a] >> 8 for a in range(3)]),
    }
    largest, others = pack_smallest_three(splats.rotations.astype(np.float64))
    packed = np.clip(np.round((others * math.sqrt(2) * 0.5 + 0.5) * 255.0), 0, 255)
    files["quats.webp"] = image([packed[:, i] for i in range(3)], 252 + largest)
    scale_book, scale_labels = kmeans_1d(np.log(splats.scales.astype(np.float64)))
    files["scales.webp"] = image([scale_labels[:, i] for i in range(3)])
    colour_book, colour_labels = kmeans_1d(splats.harmonics[:, :, 0])
    opacity = np.clip(np.round(splats.opacities * 255.0), 0, 255)
    files["sh0.webp"] = image([colour_labels[:, i] for i in range(3)], opacity)
    meta = {
        "version": 2,
        "asset": {"generator": "splatzoo"},
        "count": n,
        "means": {"mins": low.tolist(), "maxs": high.tolist(), "files": _FILES["means"]},
        "scales": {"codebook": _short(scale_book), "files": _FILES["scales"]},
        "quats": {"files": _FILES["quats"]},
        "sh0": {"codebook": _short(colour_book), "files": _FILES["sh0"]},
    }
    if splats.sh_degree > 0 and n > 0:
        meta["shN"], shn_files = _palette(splats, width, height, image)
        files.update(shn_files)
    return meta, files


def _palette(splats: SplatArrays, width: int, height: int, image) -> tuple[dict, dict]:
    coefficients = _SH_COUNTS[splats.sh_degree]
    rest = splats.harmonics[:, :, 1:].reshape(splats.count, -1)  # channel-major, [N, 3 * C]
    centroids, labels = _kmeans(rest)
    book, entries = kmeans_1d(centroids)  # entries [P, 3 * C]
    k = centroids.shape[0]
    rows = math.ceil(k / 64)
    texels = np.zeros((rows * 64 * coefficients, 4), dtype=np.uint8)
    texels[:, 3] = 255
    per_channel = entries.reshape(k, 3, coefficients)
    for channel in range(3):
        texels[: k * coefficients, channel] = per_channel[:, channel, :].reshape(-1)
    files = {
        "shN_centroids.webp": _webp(texels.reshape(rows, 64 * coefficients, 4)),
        "shN_labels.webp": image([labels & 0xFF, (labels >> 8) & 0xFF]),
    }
    meta = {
        "count": k,
        "bands": splats.sh_degree,
        "codebook": _short(book),
        "files": _FILES["shN"],
    }
    return meta, files


def write_sog(path: str | os.PathLike, splats: SplatArrays) -> bytes:
    """The bytes of a bundled ``.sog``: a zip archive (stored entries) of meta.json and images."""
    meta, files = _images(splats)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED) as archive:
        archive.writestr("meta.json", json.dumps(meta))
        for name, data in files.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def write_sog_folder(path: str | os.PathLike, splats: SplatArrays) -> dict[str, bytes]:
    """The unbundled form: ``{file name: bytes}`` for meta.json and the images beside it."""
    meta, files = _images(splats)
    return {**files, os.path.basename(os.fspath(path)): json.dumps(meta).encode()}


def _open(path) -> tuple[dict, object, str]:
    """(meta, load(name) -> bytes, the meta file's name) of a bundled ``.sog``, a meta.json or a folder holding one."""
    path = os.fspath(path)
    if os.path.isdir(path):
        path = os.path.join(path, "meta.json")
    if path.lower().endswith(".json"):
        folder = os.path.dirname(path)
        raw = read_bytes(path)

        def load(name: str) -> bytes:
            if os.path.basename(name) != name:
                raise InputError(path, f"SOG image name {name!r} is not a plain file name")
            return read_bytes(os.path.join(folder, name))
    else:
        data = read_bytes(path)
        try:
            archive = zipfile.ZipFile(io.BytesIO(data))
            raw = archive.read("meta.json")
        except (zipfile.BadZipFile, KeyError, EOFError, OSError, zipfile.LargeZipFile) as error:
            raise InputError(path, f"not a SOG archive ({error})") from error

        def load(name: str) -> bytes:
            try:
                return archive.read(name)
            except KeyError as error:
                raise InputError(path, f"SOG archive has no {name}") from error
            except (zipfile.BadZipFile, EOFError, OSError, ValueError) as error:
                raise InputError(path, f"corrupt SOG archive entry {name} ({error})") from error

    try:
        meta = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as error:
        raise InputError(path, f"meta.json is not JSON ({error})") from error
    if not isinstance(meta, dict):
        raise InputError(path, "meta.json is not a JSON object")
    if meta.get("version") != 2:
        raise InputError(path, f"unsupported SOG version {meta.get('version')!r} (2 is read)")
    return meta, load, path


def _decode(path, data: bytes, count: int | None, name: str) -> np.ndarray:
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as image:
            if image.format != "WEBP":
                raise InputError(path, f"SOG image {name} is {image.format}, not WebP")
            rgba = np.asarray(image.convert("RGBA")).reshape(-1, 4)
    except InputError:
        raise
    except Image.UnidentifiedImageError as error:
        raise InputError(path, f"SOG image {name} is not an image Pillow can identify") from error
    except Exception as error:  # Pillow raises many types for a corrupt image
        raise InputError(path, f"SOG image {name} cannot be decoded ({error})") from error
    if count is not None and rgba.shape[0] < count:
        raise InputError(path, f"SOG image {name} holds {rgba.shape[0]} texels for {count}")
    return rgba[: count if count is not None else rgba.shape[0]].astype(np.int64)


def read_sog(path: str | os.PathLike) -> SplatArrays:
    """Read a bundled ``.sog``, a ``meta.json`` or a folder holding one (version 2)."""
    meta, load, shown = _open(path)
    try:
        n = int(meta["count"])
        images = {k: meta[k]["files"] for k in ("means", "scales", "quats", "sh0")}
        mins, maxs = (
            np.asarray(meta["means"]["mins"], float),
            np.asarray(meta["means"]["maxs"], float),
        )
        scale_book = np.asarray(meta["scales"]["codebook"], dtype=np.float64)
        colour_book = np.asarray(meta["sh0"]["codebook"], dtype=np.float64)
    except (KeyError, TypeError, ValueError) as error:
        raise InputError(shown, f"meta.json lacks or mangles {error}") from error
    if n < 0 or mins.shape != (3,) or maxs.shape != (3,) or scale_book.size != 256:
        raise InputError(shown, "meta.json has a bad count, means bounds or scales codebook")
    if colour_book.size != 256:
        raise InputError(shown, "meta.json's sh0 codebook must have 256 entries")
    for book in (mins, maxs, scale_book, colour_book):
        if not np.isfinite(book).all():
            raise InputError(shown, "meta.json holds non-finite numbers")
    low = _decode(shown, load(images["means"][0]), n, images["means"][0])
    high = _decode(shown, load(images["means"][1]), n, images["means"][1])
    t = (low[:, :3] | (high[:, :3] << 8)) / 65535.0
    span = np.where(maxs > mins, maxs - mins, 1.0)
    logged = mins + span * t
    means = np.sign(logged) * np.expm1(np.abs(logged))
    quats = _decode(shown, load(images["quats"][0]), n, images["quats"][0])
    if ((quats[:, 3] < 252) | (quats[:, 3] > 255)).any():
        raise InputError(shown, "SOG quats.webp has a texel whose alpha is not 252..255")
    others = (quats[:, :3] / 255.0 * 2.0 - 1.0) / math.sqrt(2)
    rotations = unpack_smallest_three(quats[:, 3] - 252, others)
    scales = np.exp(scale_book[_decode(shown, load(images["scales"][0]), n, "scales")[:, :3]])
    sh0 = _decode(shown, load(images["sh0"][0]), n, images["sh0"][0])
    harmonics = colour_book[sh0[:, :3]][:, :, None]
    if meta.get("shN"):
        harmonics = np.concatenate([harmonics, _read_palette(shown, meta["shN"], load, n)], 2)
    return SplatArrays(
        means=means,
        scales=scales,
        rotations=rotations,
        opacities=sh0[:, 3] / 255.0,
        harmonics=harmonics,
    )


def _read_palette(shown, meta: dict, load, n: int) -> np.ndarray:
    try:
        bands, k = int(meta["bands"]), int(meta["count"])
        book = np.asarray(meta["codebook"], dtype=np.float64)
        files = meta["files"]
    except (KeyError, TypeError, ValueError) as error:
        raise InputError(shown, f"meta.json's shN lacks or mangles {error}") from error
    if bands not in (1, 2, 3) or book.size != 256 or not np.isfinite(book).all():
        raise InputError(shown, "meta.json's shN needs bands 1..3 and a 256-entry codebook")
    coefficients = _SH_COUNTS[bands]
    centroids = _decode(shown, load(files[0]), None, files[0])
    if centroids.shape[0] < k * coefficients:
        raise InputError(shown, f"SOG {files[0]} is too small for {k} centroids")
    labels = _decode(shown, load(files[1]), n, files[1])
    label = labels[:, 0] | (labels[:, 1] << 8)
    if (label >= k).any():
        raise InputError(shown, f"SOG {files[1]} names a centroid beyond {k}")
    # centroid c, coefficient j at texel c * C + j (64 centroids a row of 64 * C texels)
    table = centroids[: k * coefficients, :3].reshape(k, coefficients, 3)
    values = book[table]  # [k, C, 3]
    return np.transpose(values[label], (0, 2, 1))  # [N, 3, C]
