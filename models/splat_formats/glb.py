"""glTF binary (``.glb``) with ``KHR_gaussian_splatting``, written from the Khronos extension's
specification (KhronosGroup/glTF, extensions/2.0/Khronos/KHR_gaussian_splatting).

One point primitive (mode 0) whose attributes are ``POSITION`` (float), ``COLOR_0`` (the point
fallback: RGBA8 of the DC colour and opacity), ``KHR_gaussian_splatting:ROTATION`` (xyzw float),
``:SCALE`` (linear float), ``:OPACITY`` (float in [0, 1]), ``:SH_DEGREE_0_COEF_0`` (the DC
coefficients) and ``:SH_DEGREE_l_COEF_n`` (one RGB VEC3 per higher coefficient, gsplat's basis
order). Floats throughout: nothing is lost but float64 -> float32.

Axes: glTF is right-handed with +Y up and the asset facing +Z (x left, y up, z forward), the
OpenCV axes turned 180 degrees about Z, so writing and reading turn the scene by that rotation
(positions ``(-x, -y, z)``, quaternions and SH coefficients with it).
"""

from __future__ import annotations

import json
import os
import struct

import numpy as np

from datamodules.errors import InputError

from .common import SH_C0, SplatArrays, flip_axes, read_bytes

__all__ = ["read_glb", "write_glb"]

EXTENSION = "KHR_gaussian_splatting"
PREFIX = EXTENSION + ":"
GLTF_AXES = (-1, -1, 1)  # OpenCV -> glTF, a rotation by 180 degrees about Z (its own inverse)
_MAGIC, _JSON, _BIN = 0x46546C67, 0x4E4F534A, 0x004E4942
_FLOAT, _UBYTE = 5126, 5121
_COMPONENTS = {5120: "i1", 5121: "u1", 5122: "<i2", 5123: "<u2", 5125: "<u4", 5126: "<f4"}
_NORMALISE = {5120: 127.0, 5121: 255.0, 5122: 32767.0, 5123: 65535.0}
_WIDTH = {"SCALAR": 1, "VEC2": 2, "VEC3": 3, "VEC4": 4}
_SH_PER_DEGREE = (1, 3, 5, 7)


def _attributes(splats: SplatArrays) -> list[tuple[str, np.ndarray]]:
    g = flip_axes(splats, GLTF_AXES)
    dc = g.harmonics[:, :, 0]
    colour = np.concatenate([dc * SH_C0 + 0.5, g.opacities[:, None]], axis=1)
    out = [
        ("POSITION", g.means.astype("<f4")),
        ("COLOR_0", np.clip(np.round(colour * 255.0), 0, 255).astype(np.uint8)),
        (PREFIX + "ROTATION", g.rotations[:, [1, 2, 3, 0]].astype("<f4")),
        (PREFIX + "SCALE", g.scales.astype("<f4")),
        (PREFIX + "OPACITY", g.opacities.astype("<f4")),
        (PREFIX + "SH_DEGREE_0_COEF_0", dc.astype("<f4")),
    ]
    k = 1
    for degree in range(1, g.sh_degree + 1):
        for n in range(_SH_PER_DEGREE[degree]):
            out.append((f"{PREFIX}SH_DEGREE_{degree}_COEF_{n}", g.harmonics[:, :, k].astype("<f4")))
            k += 1
    return out


def write_glb(path: str | os.PathLike, splats: SplatArrays) -> bytes:
    """The bytes of ``splats`` as a GLB with one ``KHR_gaussian_splatting`` point primitive."""
    views, accessors, attributes, blobs, offset = [], [], {}, [], 0
    for index, (name, values) in enumerate(_attributes(splats)):
        data = np.ascontiguousarray(values).tobytes()
        views.append({"buffer": 0, "byteOffset": offset, "byteLength": len(data), "target": 34962})
        accessor = {
            "bufferView": index,
            "componentType": _UBYTE if values.dtype == np.uint8 else _FLOAT,
            "count": splats.count,
            "type": "SCALAR" if values.ndim == 1 else f"VEC{values.shape[1]}",
        }
        if values.dtype == np.uint8:
            accessor["normalized"] = True
        if name == "POSITION" and splats.count:
            accessor["min"] = values.min(axis=0).tolist()
            accessor["max"] = values.max(axis=0).tolist()
        accessors.append(accessor)
        attributes[name] = index
        blobs.append(data + b"\0" * (-len(data) % 4))
        offset += len(blobs[-1])
    primitive = {
        "attributes": attributes,
        "mode": 0,
        "extensions": {
            EXTENSION: {
                "kernel": "ellipse",
                "colorSpace": "srgb_rec709_display",
                "projection": "perspective",
                "sortingMethod": "cameraDistance",
            }
        },
    }
    gltf = {
        "asset": {"version": "2.0", "generator": "splatzoo"},
        "extensionsUsed": [EXTENSION],
        "scene": 0,
        "scenes": [{"nodes": [0]}],
        "nodes": [{"mesh": 0}],
        "meshes": [{"primitives": [primitive]}],
        "buffers": [{"byteLength": offset}],
        "bufferViews": views,
        "accessors": accessors,
    }
    text = json.dumps(gltf, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 4)
    total = 12 + 8 + len(text) + 8 + offset
    return b"".join(
        [
            struct.pack("<III", _MAGIC, 2, total),
            struct.pack("<II", len(text), _JSON),
            text,
            struct.pack("<II", offset, _BIN),
            *blobs,
        ]
    )


def _chunks(path, data: bytes) -> tuple[dict, bytes]:
    if len(data) < 20:
        raise InputError(path, f"truncated GLB file ({len(data)} bytes)")
    magic, version, length = struct.unpack_from("<III", data)
    if magic != _MAGIC:
        raise InputError(path, f"not a GLB file (magic {magic:#010x}, expected 'glTF')")
    if version != 2:
        raise InputError(path, f"unsupported glTF container version {version} (2)")
    if length > len(data):
        raise InputError(path, f"truncated GLB file ({len(data)} of {length} bytes)")
    offset, gltf, binary = 12, None, b""
    while offset + 8 <= length:
        size, kind = struct.unpack_from("<II", data, offset)
        if offset + 8 + size > length:
            raise InputError(path, "truncated GLB file (a chunk runs past the end)")
        chunk = data[offset + 8 : offset + 8 + size]
        if kind == _JSON and gltf is None:
            try:
                gltf = json.loads(chunk)
            except (ValueError, UnicodeDecodeError) as error:
                raise InputError(path, f"GLB JSON chunk is not JSON ({error})") from error
        elif kind == _BIN and not binary:
            binary = chunk
        offset += 8 + size
    if not isinstance(gltf, dict):
        raise InputError(path, "GLB has no JSON chunk")
    return gltf, binary


def _accessor(path, gltf: dict, binary: bytes, index, want: tuple[str, ...]) -> np.ndarray:
    try:
        accessor = gltf["accessors"][index]
        kind, component, count = accessor["type"], accessor["componentType"], accessor["count"]
    except (KeyError, IndexError, TypeError) as error:
        raise InputError(path, f"glTF accessor {index} is missing or malformed") from error
    if kind not in want or component not in _COMPONENTS or "sparse" in accessor:
        raise InputError(path, f"glTF accessor {index} has an unsupported type {kind}/{component}")
    width, dtype = _WIDTH[kind], np.dtype(_COMPONENTS[component])
    if "bufferView" not in accessor:
        return np.zeros((count, width))
    try:
        view = gltf["bufferViews"][accessor["bufferView"]]
        if view.get("buffer", 0) != 0 or "uri" in gltf["buffers"][0]:
            raise InputError(path, "glTF data outside the GLB's binary chunk is not supported")
        start = view.get("byteOffset", 0) + accessor.get("byteOffset", 0)
        stride = view.get("byteStride") or width * dtype.itemsize
        end = view.get("byteOffset", 0) + view["byteLength"]
    except (KeyError, IndexError, TypeError) as error:
        raise InputError(path, f"glTF accessor {index} has a malformed buffer view") from error
    needed = start + stride * max(count - 1, 0) + width * dtype.itemsize
    if count and (needed > min(end, len(binary)) or start < 0):
        raise InputError(path, f"truncated GLB file (accessor {index} runs past its buffer)")
    rows = np.lib.stride_tricks.as_strided(
        np.frombuffer(binary, dtype=np.uint8, count=needed - start if count else 0, offset=start),
        shape=(count, width * dtype.itemsize),
        strides=(stride, 1),
    )
    values = np.ascontiguousarray(rows).view(dtype).reshape(count, width).astype(np.float64)
    if accessor.get("normalized") and component in _NORMALISE:
        values = np.maximum(values / _NORMALISE[component], -1.0)
    return values


def _check_nodes(path, gltf: dict) -> None:
    for node in gltf.get("nodes", []):
        moved = any(
            key in node and node[key] != default
            for key, default in (
                ("matrix", [1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1]),
                ("translation", [0, 0, 0]),
                ("rotation", [0, 0, 0, 1]),
                ("scale", [1, 1, 1]),
            )
        )
        if moved:
            raise InputError(path, "glTF node transforms are not supported (bake them first)")


def read_glb(path: str | os.PathLike) -> SplatArrays:
    """Read every ``KHR_gaussian_splatting`` primitive of a GLB into one scene."""
    gltf, binary = _chunks(path, read_bytes(path))
    primitives = [
        p
        for mesh in gltf.get("meshes", [])
        for p in mesh.get("primitives", [])
        if EXTENSION in (p.get("extensions") or {})
    ]
    if not primitives:
        raise InputError(path, f"GLB has no primitive with the {EXTENSION} extension")
    _check_nodes(path, gltf)
    parts = [_primitive(path, gltf, binary, p) for p in primitives]
    if len({p.harmonics.shape[-1] for p in parts}) != 1:
        raise InputError(path, "GLB splat primitives have different SH degrees")
    merged = SplatArrays(
        *(np.concatenate([getattr(p, k) for p in parts]) for k in SplatArrays.__annotations__)
    )
    return flip_axes(merged, GLTF_AXES)


def _primitive(path, gltf: dict, binary: bytes, primitive: dict) -> SplatArrays:
    attributes = primitive.get("attributes", {})
    required = ("POSITION", "ROTATION", "SCALE", "OPACITY", "SH_DEGREE_0_COEF_0")
    names = {r: r if r == "POSITION" else PREFIX + r for r in required}
    missing = [names[r] for r in required if names[r] not in attributes]
    if missing:
        raise InputError(path, f"GLB splat primitive lacks {', '.join(missing)}")

    def read(name: str, kind: str) -> np.ndarray:
        return _accessor(path, gltf, binary, attributes[name], (kind,))

    count = read("POSITION", "VEC3").shape[0]
    for name in attributes:
        if name.startswith(PREFIX) or name == "POSITION":
            entry = attributes[name]
            if not isinstance(entry, int) or not 0 <= entry < len(gltf.get("accessors", [])):
                raise InputError(path, f"GLB attribute {name} names no accessor")
            if gltf["accessors"][entry].get("count") != count:
                raise InputError(path, f"GLB attribute {name} has another count than POSITION")
    coefficients = [read(names["SH_DEGREE_0_COEF_0"], "VEC3")]
    for degree in (1, 2, 3):
        names_of_degree = [f"{PREFIX}SH_DEGREE_{degree}_COEF_{n}" for n in range(2 * degree + 1)]
        if not all(n in attributes for n in names_of_degree):
            break
        coefficients += [read(n, "VEC3") for n in names_of_degree]
    rotations = read(names["ROTATION"], "VEC4")[:, [3, 0, 1, 2]]
    return SplatArrays(
        means=read("POSITION", "VEC3"),
        scales=read(names["SCALE"], "VEC3"),
        rotations=rotations,
        opacities=read(names["OPACITY"], "SCALAR")[:, 0],
        harmonics=np.stack(coefficients, axis=2),
    )
