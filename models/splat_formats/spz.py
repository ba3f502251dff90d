"""Niantic's ``.spz``, written from its specification (github.com/nianticlabs/spz, README "File
Format" and ``load-spz.cc``).

Version 4 (the default): a 32-byte plaintext header, optional extension records, a table of
contents and one ZSTD stream per attribute; version 3: the 16-byte header and the attributes in one
gzip stream. Reading takes versions 2 to 4. Quantisation as the reference packer does it: positions
24-bit fixed point (12 fractional bits, fewer when a coordinate would not fit), log-scales
``(log s + 10) * 16`` in 8 bits, opacity 8 bits, DC colour ``dc * 0.15 + 0.5`` in 8 bits, rotations
smallest-three (2 + 3 x 10 bits), SH 8 bits with 5 significant bits for degree 1 and 4 for higher.

Axes: the data are stored as given, the INRIA ``.ply``'s axes, as splat-transform and Niantic's
``ply_to_spz`` write them (their pack option ``from`` is ``UNSPECIFIED``). A file carrying the
``SPZ_ADOBE_coordinate_system`` extension (``0xADBE0003``) is read from the system it names.
"""

from __future__ import annotations

import gzip
import io
import os
import struct
import warnings
import zlib

import numpy as np

from datamodules.errors import InputError

from .common import (
    SplatArrays,
    flip_axes,
    logit,
    pack_smallest_three,
    read_bytes,
    sigmoid,
    unpack_smallest_three,
)

__all__ = ["read_spz", "write_spz"]

MAGIC = 0x5053474E  # "NGSP"
COLOR_SCALE = 0.15
FLAG_ANTIALIASED = 0x1
FLAG_EXTENSIONS = 0x2
COORDINATE_SYSTEM_EXTENSION = 0xADBE0003
SAFE_ORBIT_CAMERA_EXTENSION = 0xADBE0002
_SH_COUNTS = (0, 3, 8, 15, 24)  # coefficients beyond DC per channel, by degree
# Sign-only coordinate systems of the spec's enum (1..8; L/R, D/U, B/F) as flips to RDF (ours).
_AXIS_SIGNS = {
    1: (-1, 1, -1), 2: (1, 1, -1), 3: (-1, -1, -1), 4: (1, -1, -1),
    5: (-1, 1, 1), 6: (1, 1, 1), 7: (-1, -1, 1), 8: (1, -1, 1),
}  # fmt: skip


def _quantise(splats: SplatArrays, version: int) -> tuple[int, list[bytes]]:
    """(fractional bits, the six attribute blocks: positions, alphas, colours, scales, rotations,
    SH)."""
    n = splats.count
    largest_coordinate = float(np.abs(splats.means).max()) if n else 0.0
    fractional_bits = 12
    while fractional_bits > 0 and largest_coordinate * (1 << fractional_bits) >= 2**23 - 1:
        fractional_bits -= 1
    if largest_coordinate * (1 << fractional_bits) >= 2**23 - 1:
        raise ValueError(f"a coordinate of {largest_coordinate:g} does not fit SPZ's 24 bits")
    fixed = np.round(splats.means.astype(np.float64) * (1 << fractional_bits)).astype(np.int32)
    positions = fixed.astype("<i4").view(np.uint8).reshape(n, 3, 4)[:, :, :3]
    alphas = np.clip(np.round(splats.opacities * 255.0), 0, 255).astype(np.uint8)
    dc = splats.harmonics[:, :, 0].astype(np.float64)
    colors = np.clip(np.round(dc * (COLOR_SCALE * 255.0) + 127.5), 0, 255).astype(np.uint8)
    log_scales = np.log(splats.scales.astype(np.float64))
    scales = np.clip(np.round((log_scales + 10.0) * 16.0), 0, 255).astype(np.uint8)
    if version >= 3:
        # xyzw order in the file; the largest one's index in the top 2 bits, then per other
        # component a sign bit and 9 bits of |q| / sqrt(1/2), first component highest.
        xyzw = splats.rotations.astype(np.float64)[:, [1, 2, 3, 0]]
        largest, others = pack_smallest_three(xyzw)
        magnitude = np.floor(511.0 * np.abs(others) / np.sqrt(0.5) + 0.5).astype(np.uint32)
        magnitude = np.minimum(magnitude, 511)
        comp = largest.astype(np.uint32)
        for i in range(3):
            field = ((others[:, i] < 0).astype(np.uint32) << 9) | magnitude[:, i]
            comp = (comp << 10) | field
        rotations = comp.astype("<u4").view(np.uint8)
    else:
        raise ValueError(f"SPZ version {version} cannot be written (3 or 4)")
    rest = splats.harmonics[:, :, 1:].astype(np.float64)  # [N, 3, K-1]
    rest = np.transpose(rest, (0, 2, 1))  # [N, K-1, 3]: colour channel fastest
    quantised = np.round(rest * 128.0) + 128.0
    bucket = np.where(np.arange(rest.shape[1]) < 3, 8, 16)[None, :, None]
    quantised = (quantised + bucket // 2) // bucket * bucket
    sh = np.clip(quantised, 0, 255).astype(np.uint8)
    blocks = [positions, alphas, colors, scales, rotations, sh]
    return fractional_bits, [np.ascontiguousarray(b).tobytes() for b in blocks]


def write_spz(path: str | os.PathLike, splats: SplatArrays, version: int = 4) -> bytes:
    """The bytes of ``splats`` as an SPZ file of ``version`` (3 or 4)."""
    if version not in (3, 4):
        raise InputError(path, f"spz_version must be 3 or 4, got {version}")
    degree = splats.sh_degree
    fractional_bits, blocks = _quantise(splats, version)
    if version == 3:
        header = struct.pack("<IIIBBBB", MAGIC, 3, splats.count, degree, fractional_bits, 0, 0)
        return gzip.compress(header + b"".join(blocks), compresslevel=9, mtime=0)
    import zstandard

    if degree == 0:
        blocks = blocks[:5]
    compressor = zstandard.ZstdCompressor(level=12)
    streams = [compressor.compress(b) for b in blocks]
    header = struct.pack(
        "<IIIBBBBI12x", MAGIC, 4, splats.count, degree, fractional_bits, 0, len(streams), 32
    )
    toc = b"".join(struct.pack("<QQ", len(s), len(b)) for s, b in zip(streams, blocks))
    return header + toc + b"".join(streams)


def _sizes(n: int, degree: int, version: int) -> list[int]:
    return [9 * n, n, 3 * n, 3 * n, (3 if version == 2 else 4) * n, 3 * _SH_COUNTS[degree] * n]


def _header(path, data: bytes) -> tuple[int, int, int, int, int]:
    if len(data) < 16:
        raise InputError(path, f"truncated SPZ file ({len(data)} bytes, the header needs 16)")
    magic, version, n, degree, fractional_bits, flags = struct.unpack_from("<IIIBBB", data)
    if magic != MAGIC:
        raise InputError(path, f"not an SPZ file (magic {magic:#010x}, expected 'NGSP')")
    if version not in (2, 3, 4):
        raise InputError(path, f"unsupported SPZ version {version} (2, 3 and 4 are read)")
    if degree > 3:
        raise InputError(path, f"SPZ SH degree {degree} is not supported (0..3)")
    if fractional_bits > 23:
        raise InputError(path, f"SPZ fractional bits {fractional_bits} out of range (0..23)")
    return version, n, degree, fractional_bits, flags


def _extensions(path, records: bytes) -> int | None:
    """The coordinate system an extension block names (``None`` when none does)."""
    system, offset = None, 0
    while offset < len(records):
        if offset + 8 > len(records):
            raise InputError(path, "truncated SPZ extension record")
        kind, length = struct.unpack_from("<II", records, offset)
        offset += 8
        if offset + length > len(records):
            raise InputError(path, f"SPZ extension {kind:#010x} runs past its block")
        if kind == COORDINATE_SYSTEM_EXTENSION:
            if length != 4:
                raise InputError(path, f"SPZ coordinate-system extension of {length} bytes (4)")
            (system,) = struct.unpack_from("<I", records, offset)
        elif kind != SAFE_ORBIT_CAMERA_EXTENSION:
            # Niantic's README and extensions/README.md: a reader skips an extension type it does
            # not know (by its length) and the load succeeds, with a warning naming the type.
            # Shown as one line naming the file (no source line: lineno 0).
            warnings.warn_explicit(
                f"unknown SPZ extension {kind:#010x} ({length} bytes) skipped, as the SPZ "
                "specification says (the scene may be read differently from its writer's intent)",
                UserWarning,
                os.fspath(path),
                0,
            )
        offset += length
    return system


def _streams_v4(path, data: bytes, n: int, degree: int, flags: int) -> tuple[list[bytes], int]:
    import zstandard

    if len(data) < 32:
        raise InputError(path, f"truncated SPZ file ({len(data)} bytes, the header needs 32)")
    count, toc_offset = struct.unpack_from("<BI", data, 15)
    sizes = _sizes(n, degree, 4)[: 6 if degree else 5]
    if count != len(sizes):
        raise InputError(path, f"SPZ has {count} streams, expected {len(sizes)}")
    if toc_offset < 32 or toc_offset + 16 * count > len(data):
        raise InputError(path, "truncated SPZ file (table of contents missing)")
    system = _extensions(path, data[32:toc_offset]) if flags & FLAG_EXTENSIONS else None
    offset, streams = toc_offset + 16 * count, []
    decompressor = zstandard.ZstdDecompressor()
    for i, expected in enumerate(sizes):
        compressed, size = struct.unpack_from("<QQ", data, toc_offset + 16 * i)
        if size != expected:
            raise InputError(path, f"SPZ stream {i} holds {size} bytes, expected {expected}")
        if offset + compressed > len(data):
            raise InputError(path, "truncated SPZ file (a stream ends past the end)")
        try:
            stream = decompressor.decompress(data[offset : offset + compressed], size)
        except zstandard.ZstdError as error:
            raise InputError(path, f"corrupt SPZ stream {i} ({error})") from error
        if len(stream) != size:
            raise InputError(path, f"corrupt SPZ stream {i} (wrong length)")
        streams.append(stream)
        offset += compressed
    return streams + [b""] * (6 - len(streams)), system


def _streams_legacy(path, data, version, n, degree, flags) -> tuple[list[bytes], int | None]:
    sizes = _sizes(n, degree, version)
    if len(data) < 16 + sum(sizes):
        raise InputError(path, f"truncated SPZ file ({len(data)} of {16 + sum(sizes)} bytes)")
    streams, offset = [], 16
    for size in sizes:
        streams.append(data[offset : offset + size])
        offset += size
    system = _extensions(path, data[offset:]) if flags & FLAG_EXTENSIONS else None
    return streams, system


def read_spz(path: str | os.PathLike) -> SplatArrays:
    """Read an SPZ file (versions 2-4)."""
    data = read_bytes(path)
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.GzipFile(fileobj=io.BytesIO(data)).read()
        except (OSError, EOFError, zlib.error) as error:
            raise InputError(path, f"corrupt or truncated gzip stream ({error})") from error
    version, n, degree, fractional_bits, flags = _header(path, data)
    if version == 4:
        streams, system = _streams_v4(path, data, n, degree, flags)
    else:
        streams, system = _streams_legacy(path, data, version, n, degree, flags)
    positions, alphas, colors, scales, rotations, sh = (
        np.frombuffer(s, dtype=np.uint8) for s in streams
    )
    raw = positions.reshape(n, 3, 3).astype(np.int32)
    fixed = raw[..., 0] | (raw[..., 1] << 8) | (raw[..., 2] << 16)
    fixed = np.where(fixed & 0x800000, fixed - (1 << 24), fixed)
    means = fixed.astype(np.float64) / (1 << fractional_bits)
    if version == 2:
        xyz = rotations.reshape(n, 3).astype(np.float64) / 127.5 - 1.0
        w = np.sqrt(np.clip(1.0 - (xyz**2).sum(axis=1), 0.0, None))
        quaternions = np.concatenate([w[:, None], xyz], axis=1)
    else:
        comp = rotations.view("<u4").astype(np.int64)
        largest = comp >> 30
        others = np.empty((n, 3), dtype=np.float64)
        for i in (2, 1, 0):
            value = np.sqrt(0.5) * (comp & 511) / 511.0
            others[:, i] = np.where((comp >> 9) & 1, -value, value)
            comp = comp >> 10
        quaternions = unpack_smallest_three(largest, others)[:, [3, 0, 1, 2]]
    dc = (colors.reshape(n, 3).astype(np.float64) / 255.0 - 0.5) / COLOR_SCALE
    rest = (sh.reshape(n, _SH_COUNTS[degree], 3).astype(np.float64) - 128.0) / 128.0
    harmonics = np.concatenate([dc[:, :, None], np.transpose(rest, (0, 2, 1))], axis=2)
    splats = SplatArrays(
        means=means,
        scales=np.exp(scales.reshape(n, 3).astype(np.float64) / 16.0 - 10.0),
        rotations=quaternions,
        opacities=sigmoid(logit(alphas.astype(np.float64) / 255.0)),
        harmonics=harmonics,
    )
    if system not in (None, 0, 6):
        if system not in _AXIS_SIGNS:
            raise InputError(path, f"SPZ coordinate system {system} is not supported (1..8)")
        splats = flip_axes(splats, _AXIS_SIGNS[system])
    return splats
