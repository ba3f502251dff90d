"""Readers for COLMAP sparse models (text and binary), COLMAP 3.x and 4.x.

COLMAP 4 adds ``rigs`` and ``frames`` files next to the usual ``cameras``, ``images`` and
``points3D``; its ``images`` files keep the classic layout and hold each registered image's
composed ``cam_from_world`` pose, so the camera/image readers here are all a converter needs.
``read_rigs_text``/``read_frames_text`` are provided for completeness.

Conventions: ``Image.qvec`` is the world-to-camera rotation as a wxyz quaternion and
``Image.tvec`` the world-to-camera translation (COLMAP's ``cam_from_world``); 2D observations are
in pixels with the top-left image corner at (0, 0), so the centre of the first pixel is
(0.5, 0.5) -- the same convention as splatzoo's normalised coordinates times (W, H).

Files are validated as they are read, and anything wrong is a ``ColmapError`` (a ``ValueError``)
of one line naming the file and the line number (text) or byte offset (binary): counts in binary
files are bounded by the bytes left before anything is allocated, names must be UTF-8, camera
models known with the right number of finite parameters, positive image sizes and focal lengths,
quaternions non-zero (non-unit ones are normalised), numbers finite, ids unique, and nothing may
follow the last record. The records (``Camera``, ``Image``, ``Point3D``), the errors and the
checks both formats share are in ``datamodules.readers.colmap_records``.
"""

from __future__ import annotations

import functools
import math
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from datamodules.readers.colmap_records import (
    CAMERA_MODEL_IDS,
    CAMERA_MODELS,
    MAX_NAME_BYTES,
    SUPPORTED_MODELS,
    Camera,
    ColmapError,
    Image,
    Point3D,
    UnsupportedCameraError,
    check_camera,
    check_image,
    unit_qvec,
)
from models.geometry.cameras import intrinsics_to_normalized
from models.geometry.rotations import quaternion_to_matrix

__all__ = [
    "read_cameras_text",
    "read_colmap_points",
    "read_images_text",
    "read_points3d_text",
    "read_rigs_text",
    "read_frames_text",
    "read_cameras_binary",
    "read_images_binary",
    "read_points3d_binary",
    "read_model",
    "find_model_dir",
    "camera_pinhole",
    "camera_distortion",
    "camera_intrinsics",
    "camera_intrinsics_pixels",
    "image_world_to_camera",
    "image_pose",
]


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    """``(line number, stripped text)`` of every line of a text file, comments included.

    Raises:
        ColmapError: unreadable file, or a line that is not UTF-8 (naming the line and byte).
    """
    try:
        handle = open(path, "rb")
    except OSError as error:
        raise ColmapError(f"{path}: cannot read ({error.strerror or error})") from error
    with handle:
        for number, raw in enumerate(handle, start=1):
            try:
                text = raw.decode("utf-8-sig" if number == 1 else "utf-8")  # a BOM is allowed
            except UnicodeDecodeError as error:
                raise ColmapError(
                    f"{path}, line {number}: not UTF-8 text (byte {error.start + 1} of the line "
                    f"is 0x{raw[error.start]:02x})"
                ) from error
            yield number, text.strip()


def _int(text: str, what: str, lowest: int | None = None) -> int:
    """``text`` as an integer; ``ValueError`` naming ``what`` otherwise."""
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{what} {text[:40]!r} is not an integer") from None
    if lowest is not None and value < lowest:
        raise ValueError(f"{what} is {value}, must be at least {lowest}")
    return value


def _floats(texts: list[str], what: str) -> np.ndarray:
    """``texts`` as finite float64 numbers; ``ValueError`` naming ``what`` otherwise."""
    try:
        array = np.array(texts, dtype=np.float64)
    except ValueError:
        bad = next(t for t in texts if not _parses(float, t))
        raise ValueError(f"{what}: {bad[:40]!r} is not a number") from None
    if not np.isfinite(array).all():
        raise ValueError(f"{what} {' '.join(texts)[:80]} is not finite")
    return array


def _ints(texts: list[str], what: str, lowest: int) -> np.ndarray:
    """``texts`` as int64 numbers of at least ``lowest``; ``ValueError`` naming ``what``."""
    try:
        array = np.array(texts, dtype=np.int64)
    except (ValueError, OverflowError):
        bad = next(t for t in texts if not _parses(int, t) or abs(int(t)) >= 1 << 63)
        raise ValueError(f"{what} {bad[:40]!r} is not a 64-bit integer") from None
    if len(array) and array.min() < lowest:
        raise ValueError(f"{what} is {array.min()}, must be at least {lowest}")
    return array


def _parses(kind: type, text: str) -> bool:
    try:
        kind(text)
    except ValueError:
        return False
    return True


class _LaterLine(ValueError):
    """A record's error found on its ``offset``-th following line (``images.txt``' points)."""

    def __init__(self, offset: int, message: str) -> None:
        super().__init__(message)
        self.offset = offset


def _read_text_records(
    path: Path, what: str, parse: Callable[..., tuple[int, Any]], extra_lines: int = 0
) -> dict[int, Any]:
    """The loop of every text reader: records by id.

    A record starts at a line that is neither empty nor a comment and takes the ``extra_lines``
    lines after it as they are (``images.txt``: the points line, possibly empty).
    ``parse(line, *extra)`` returns ``(id, record)`` and raises ``ValueError`` (``IndexError``:
    the line ends early) for a bad record.

    Raises:
        ColmapError: naming the file and the line (``UnsupportedCameraError`` for a camera model
            this project cannot use), also for an id that appears twice.
    """
    records: dict[int, Any] = {}
    lines = _lines(path)
    for number, line in lines:
        if not line or line.startswith("#"):
            continue
        numbers, extra = [number], []
        for _ in range(extra_lines):
            after, text = next(lines, (numbers[-1] + 1, ""))
            numbers.append(after)
            extra.append(text)
        try:
            key, record = parse(line, *extra)
            if key in records:
                raise ValueError(f"{what} id {key} appears twice")
        except (IndexError, ValueError) as error:
            at = numbers[error.offset] if isinstance(error, _LaterLine) else numbers[0]
            reason = "line ends early" if isinstance(error, IndexError) else error
            kind = (
                UnsupportedCameraError if isinstance(error, UnsupportedCameraError) else ColmapError
            )
            raise kind(f"{path}, line {at}: {reason}") from error
        records[key] = record
    return records


def _camera_record(line: str) -> tuple[int, Camera]:
    elems = line.split()
    if len(elems) < 4:
        raise ValueError("expected CAMERA_ID MODEL WIDTH HEIGHT PARAMS[]")
    camera = Camera(
        _int(elems[0], "camera id", 0),
        elems[1],
        _int(elems[2], "width"),
        _int(elems[3], "height"),
        _floats(elems[4:], "parameter"),
    )
    check_camera(camera)
    return camera.id, camera


def read_cameras_text(path: str | Path) -> dict[int, Camera]:
    """Read ``cameras.txt`` (``CAMERA_ID MODEL WIDTH HEIGHT PARAMS[]`` per line).

    Args:
        path: the file.

    Returns:
        Cameras by id.

    Raises:
        ColmapError: a malformed or invalid line (one line naming the file and line number).
    """
    return _read_text_records(Path(path), "camera", _camera_record)


def _image_record(line: str, points_line: str) -> tuple[int, Image]:
    elems = line.split(maxsplit=9)
    if len(elems) < 10:
        raise ValueError("expected IMAGE_ID QW QX QY QZ TX TY TZ CAMERA_ID NAME")
    image_id = _int(elems[0], "image id", 0)
    qvec = unit_qvec(_floats(elems[1:5], "quaternion"))
    tvec = _floats(elems[5:8], "translation")
    camera_id = _int(elems[8], "camera id", 0)
    name = elems[9]
    points_elems = points_line.split()
    try:
        if len(points_elems) % 3 != 0:
            raise ValueError(
                f"the POINTS2D line of image {image_id} has {len(points_elems)} numbers, "
                "not triples X Y POINT3D_ID"
            )
        points = _floats(points_elems, "2D point").reshape(-1, 3)  # [P, 3]
        if (points[:, 2] != np.round(points[:, 2])).any():
            raise ValueError(f"image {image_id} has a POINT3D_ID that is not an integer")
        image = check_image(
            Image(
                image_id,
                qvec,
                tvec,
                camera_id,
                name,
                points[:, :2].copy(),
                points[:, 2].astype(np.int64),
            )
        )
    except ValueError as error:
        raise _LaterLine(1, str(error)) from error
    return image_id, image


def read_images_text(path: str | Path) -> dict[int, Image]:
    """Read ``images.txt`` (two lines per image: pose line, then 2D points, possibly empty).

    Args:
        path: the file.

    Returns:
        Registered images by id (quaternions normalised).

    Raises:
        ColmapError: a malformed or invalid line (one line naming the file and line number).
    """
    return _read_text_records(Path(path), "image", _image_record, extra_lines=1)


def _point_record(line: str) -> tuple[int, Point3D]:
    elems = line.split()
    if len(elems) < 8 or len(elems) % 2 != 0:
        raise ValueError("expected POINT3D_ID X Y Z R G B ERROR and (IMAGE_ID, POINT2D_IDX) pairs")
    point_id = _int(elems[0], "point id", 0)
    xyz = _floats(elems[1:4], "position")
    rgb = [_int(x, "colour", 0) for x in elems[4:7]]
    if max(rgb) > 255:
        raise ValueError(f"colour {' '.join(elems[4:7])} is not 0..255")
    error = float(_floats(elems[7:8], "error")[0])
    track = _ints(elems[8:], "track entry", 0).reshape(-1, 2)  # [T, 2] image id, 2D index
    rgb = np.array(rgb, dtype=np.uint8)
    return point_id, Point3D(point_id, xyz, rgb, error, track[:, 0], track[:, 1])


def read_points3d_text(path: str | Path) -> dict[int, Point3D]:
    """Read ``points3D.txt`` (``POINT3D_ID X Y Z R G B ERROR TRACK[] as (IMAGE_ID, POINT2D_IDX)``).

    Args:
        path: the file.

    Returns:
        Points by id.

    Raises:
        ColmapError: a malformed or invalid line (one line naming the file and line number).
    """
    return _read_text_records(Path(path), "point", _point_record)


def _rig_record(line: str) -> tuple[int, dict]:
    elems = line.split()
    rig_id, num_sensors = _int(elems[0], "rig id", 0), _int(elems[1], "sensor count", 0)
    rig: dict = {"ref_sensor": None, "sensors": []}
    pos = 2
    if num_sensors > 0:
        rig["ref_sensor"] = (elems[2], _int(elems[3], "sensor id", 0))
        pos = 4
    for _ in range(max(num_sensors - 1, 0)):
        sensor = (elems[pos], _int(elems[pos + 1], "sensor id", 0))
        has_pose = elems[pos + 2] == "1"
        pos += 3
        pose = None
        if has_pose:
            values = _floats(elems[pos : pos + 7], "sensor_from_rig")
            if len(values) != 7:
                raise ValueError("sensor_from_rig needs 7 numbers")
            pose = (unit_qvec(values[:4]), values[4:])
            pos += 7
        rig["sensors"].append({"sensor": sensor, "sensor_from_rig": pose})
    return rig_id, rig


def read_rigs_text(path: str | Path) -> dict[int, dict]:
    """Read a COLMAP 4 ``rigs.txt``.

    Args:
        path: the file.

    Returns:
        Rigs by id: ``{"ref_sensor": (type, id), "sensors": [{"sensor": (type, id),
        "sensor_from_rig": (qvec wxyz, tvec) | None}, ...]}``.

    Raises:
        ColmapError: a malformed line (naming the file and line number).
    """
    return _read_text_records(Path(path), "rig", _rig_record)


def _frame_record(line: str) -> tuple[int, dict]:
    elems = line.split()
    if len(elems) < 10:
        raise IndexError
    values = _floats(elems[2:9], "rig_from_world")
    count = _int(elems[9], "data count", 0)
    if len(elems) != 10 + 3 * count:
        raise ValueError(f"{count} data ids need {10 + 3 * count} fields, found {len(elems)}")
    data = [
        (
            elems[10 + 3 * i],
            _int(elems[11 + 3 * i], "sensor id", 0),
            _int(elems[12 + 3 * i], "data id", 0),
        )
        for i in range(count)
    ]
    frame_id, rig_id = _int(elems[0], "frame id", 0), _int(elems[1], "rig id", 0)
    qvec = unit_qvec(values[:4])
    return frame_id, {"rig_id": rig_id, "qvec": qvec, "tvec": values[4:], "data_ids": data}


def read_frames_text(path: str | Path) -> dict[int, dict]:
    """Read a COLMAP 4 ``frames.txt``.

    Args:
        path: the file.

    Returns:
        Frames by id: ``{"rig_id": int, "qvec": rig_from_world wxyz, "tvec": rig_from_world
        translation, "data_ids": [(sensor_type, sensor_id, data_id), ...]}``.

    Raises:
        ColmapError: a malformed line (naming the file and line number).
    """
    return _read_text_records(Path(path), "frame", _frame_record)


class _BinaryFile:
    """A COLMAP binary file in memory, read with every count checked against the bytes left
    before anything is allocated, and errors naming the file and the byte offset."""

    def __init__(self, path: Path, data: bytes) -> None:
        self.path, self.data, self.size, self.offset = path, data, len(data), 0

    def error(self, message: str, offset: int | None = None) -> ColmapError:
        at = self.offset if offset is None else offset
        return ColmapError(f"{self.path}: {message} (at byte {at} of {self.size})")

    def read(self, fmt: str) -> tuple:
        layout = _struct("<" + fmt)
        if self.offset + layout.size > self.size:
            raise self.error("file is truncated")
        values = layout.unpack_from(self.data, self.offset)
        self.offset += layout.size
        return values

    def count(self, what: str, min_record: int) -> int:
        """A uint64 count of records of at least ``min_record`` bytes each, bounded by the bytes
        left in the file."""
        start = self.offset
        (count,) = self.read("Q")
        left = self.size - self.offset
        if count * min_record > left:
            raise self.error(
                f"{what} is {count}, which needs at least {count * min_record} bytes, but only "
                f"{left} are left (a corrupt file or not a COLMAP binary model)",
                start,
            )
        return count

    def name(self, what: str) -> str:
        """A NUL-terminated UTF-8 string."""
        start = self.offset
        end = self.data.find(b"\x00", start, start + MAX_NAME_BYTES + 1)
        if end < 0:
            if self.size - start <= MAX_NAME_BYTES:
                raise self.error(f"file is truncated in the name of {what}")
            raise self.error(f"the name of {what} is longer than {MAX_NAME_BYTES} bytes")
        raw = self.data[start:end]
        self.offset = end + 1
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise self.error(
                f"the name of {what} is not UTF-8 ({raw[:60]!r}; byte 0x{raw[error.start]:02x})",
                start + error.start,
            ) from error

    def array(self, dtype: np.dtype, count: int) -> np.ndarray:
        size = count * dtype.itemsize
        if self.offset + size > self.size:
            raise self.error("file is truncated")
        array = np.frombuffer(self.data, dtype=dtype, count=count, offset=self.offset)
        self.offset += size
        return array

    def records(
        self, what: str, min_record: int, parse: Callable[[_BinaryFile], tuple[int, Any]]
    ) -> dict[int, Any]:
        """The loop of every binary reader: a count of records of at least ``min_record`` bytes,
        then the records by id. ``parse(self)`` reads one at the current offset and returns
        ``(id, record)``; a ``ValueError`` it raises (or an id that appears twice) becomes this
        file's error at the record's first byte."""
        records: dict[int, Any] = {}
        for _ in range(self.count(f"{what} count", min_record)):
            start = self.offset
            try:
                key, record = parse(self)
                if key in records:
                    raise ValueError(f"{what} id {key} appears twice")
            except ColmapError:
                raise  # already names the file and the byte
            except ValueError as error:
                raise self.error(str(error), start) from error
            records[key] = record
        return records

    def end(self) -> None:
        left = self.size - self.offset
        if left:
            raise self.error(f"{left} unexpected bytes after the last record (a corrupt file?)")


@functools.cache
def _struct(fmt: str) -> struct.Struct:
    return struct.Struct(fmt)


def _read_binary(
    path: Path, what: str, min_record: int, parse: Callable[[_BinaryFile], tuple[int, Any]]
) -> dict[int, Any]:
    """The records of the binary file ``path`` by id (:meth:`_BinaryFile.records`); every byte
    must belong to one. ``ColmapError`` for unreadable files."""
    try:
        data = path.read_bytes()
    except OSError as error:
        raise ColmapError(f"{path}: cannot read ({error.strerror or error})") from error
    file = _BinaryFile(path, data)
    out = file.records(what, min_record, parse)
    file.end()
    return out


def read_cameras_binary(path: str | Path) -> dict[int, Camera]:
    """Read ``cameras.bin``.

    Args:
        path: the file.

    Returns:
        Cameras by id.

    Raises:
        ColmapError: a corrupt or invalid file (naming the byte offset).
    """

    def record(file: _BinaryFile) -> tuple[int, Camera]:
        start = file.offset
        camera_id, model_id, width, height = file.read("IiQQ")
        if model_id not in CAMERA_MODEL_IDS:
            raise UnsupportedCameraError(
                f"{file.path}: camera {camera_id} has unknown model id {model_id} "
                f"(at byte {start} of {file.size})"
            )
        model = CAMERA_MODEL_IDS[model_id]
        params = np.array(file.read("d" * CAMERA_MODELS[model][1]), dtype=np.float64)
        camera = Camera(camera_id, model, width, height, params)
        check_camera(camera)
        return camera_id, camera

    # Smallest record: ids, size and a 3-parameter model.
    return _read_binary(Path(path), "camera", 24 + 3 * 8, record)


def read_images_binary(path: str | Path) -> dict[int, Image]:
    """Read ``images.bin``.

    Args:
        path: the file.

    Returns:
        Registered images by id (quaternions normalised).

    Raises:
        ColmapError: a corrupt or invalid file (naming the image and the byte offset).
    """
    point_dtype = np.dtype([("x", "<f8"), ("y", "<f8"), ("id", "<i8")])

    def record(file: _BinaryFile) -> tuple[int, Image]:
        values = file.read("I7dI")
        image_id, camera_id = values[0], values[8]
        name = file.name(f"image {image_id}")
        num_points = file.count(f"2D point count of image {image_id} ({name})", 24)
        points = file.array(point_dtype, num_points)
        image = Image(
            image_id,
            np.array(values[1:5], dtype=np.float64),
            np.array(values[5:8], dtype=np.float64),
            camera_id,
            name,
            np.stack([points["x"], points["y"]], axis=-1).astype(np.float64).reshape(-1, 2),
            points["id"].astype(np.int64),
        )
        try:
            check_image(image)
        except ValueError as error:
            raise ValueError(f"image {image_id} ({name}): {error}") from error
        return image_id, image

    # Smallest record: id, pose, camera id, a one-byte name + NUL, a zero point count.
    return _read_binary(Path(path), "image", 4 + 56 + 4 + 2 + 8, record)


def read_points3d_binary(path: str | Path) -> dict[int, Point3D]:
    """Read ``points3D.bin``.

    Args:
        path: the file.

    Returns:
        Points by id.

    Raises:
        ColmapError: a corrupt or invalid file (naming the byte offset).
    """
    track_dtype = np.dtype("<u4")

    def record(file: _BinaryFile) -> tuple[int, Point3D]:
        point_id, x, y, z, r, g, b, error = file.read("Q3d3Bd")
        if not all(map(math.isfinite, (x, y, z, error))):
            raise ValueError(f"point {point_id} has a non-finite position or error")
        length = file.count(f"track length of point {point_id}", 8)
        track = file.array(track_dtype, 2 * length).astype(np.int64).reshape(-1, 2)
        point = Point3D(
            point_id,
            np.array((x, y, z), dtype=np.float64),
            np.array((r, g, b), dtype=np.uint8),
            error,
            track[:, 0],
            track[:, 1],
        )
        return point_id, point

    # Smallest record: id, position, colour, error and a zero track length.
    return _read_binary(Path(path), "point", 8 + 24 + 3 + 8 + 8, record)


def read_colmap_points(path: str | Path, min_points: int = 0) -> tuple[Tensor, Tensor]:
    """The triangulated points of a COLMAP model (or of a scene folder, as ``find_model_dir``).

    Args:
        path: a model folder or a scene folder.
        min_points: fewer points than this is an error.

    Returns:
        ``xyz [N, 3]`` float64 and ``rgb [N, 3]`` float32 in [0, 1].

    Raises:
        ColmapError: no model, a malformed one, or fewer than ``min_points`` points.
    """
    folder = find_model_dir(path)
    if folder is None:
        raise ColmapError(path, "no COLMAP model (sparse/0, sparse or the folder)")
    _, _, points = read_model(folder, points=True)
    if len(points) < min_points:
        names = [p.name for p in Path(folder).iterdir() if p.name.lower().startswith("points3d")]
        what = f"has fewer than {min_points} points" if names else "has no points3D file"
        raise ColmapError(folder, f"{what} (structure-from-motion points are needed)")
    xyz = np.array([p.xyz for p in points.values()], dtype=np.float64).reshape(-1, 3)
    rgb = np.array([p.rgb for p in points.values()], dtype=np.float32).reshape(-1, 3) / 255.0
    return torch.from_numpy(xyz), torch.from_numpy(rgb)


def find_model_dir(path: str | Path) -> Path | None:
    """Locate the sparse model folder of a COLMAP scene.

    Looks at ``path`` itself, then ``sparse/0``, ``sparse``, ``colmap/sparse/0`` and
    ``colmap/sparse`` below it.

    Args:
        path: a model folder or a scene folder.

    Returns:
        The folder holding ``cameras`` and ``images`` (``.txt`` or ``.bin``), or None.
    """
    path = Path(path)
    for candidate in (
        path,
        path / "sparse" / "0",
        path / "sparse",
        path / "colmap" / "sparse" / "0",
        path / "colmap" / "sparse",
    ):
        for ext in (".bin", ".txt"):
            if (candidate / f"cameras{ext}").is_file() and (candidate / f"images{ext}").is_file():
                return candidate
    return None


def read_model(
    path: str | Path, ext: str | None = None, points: bool = True
) -> tuple[dict[int, Camera], dict[int, Image], dict[int, Point3D]]:
    """Read a COLMAP model folder, auto-detecting text or binary.

    Args:
        path: the folder with ``cameras``, ``images`` and optionally ``points3D`` files (or a
            scene folder where ``find_model_dir`` finds one).
        ext: ``".txt"`` or ``".bin"`` to force a format; by default binary when both exist.
        points: read ``points3D`` too (an empty dict when False or when the file is absent).

    Returns:
        ``(cameras, images, points3d)``.

    Raises:
        ColmapError: no model found, or a malformed file.
    """
    folder = find_model_dir(path)
    if folder is None:
        raise ColmapError(f"{path}: no COLMAP model (cameras + images .txt/.bin) found")
    if ext is None:
        both = [e for e in (".bin", ".txt") if (folder / f"images{e}").is_file()]
        ext = next(e for e in both if (folder / f"cameras{e}").is_file())
    if ext not in (".bin", ".txt"):
        raise ValueError(f"ext must be '.txt' or '.bin', got {ext!r}")
    readers = {
        ".txt": (read_cameras_text, read_images_text, read_points3d_text),
        ".bin": (read_cameras_binary, read_images_binary, read_points3d_binary),
    }[ext]
    cameras = readers[0](folder / f"cameras{ext}")
    images = readers[1](folder / f"images{ext}")
    for image in images.values():
        if image.camera_id not in cameras:
            raise ColmapError(
                f"{folder / f'images{ext}'}: image {image.id} ({image.name}) refers to camera "
                f"{image.camera_id}, which {folder / f'cameras{ext}'} does not have"
            )
    points3d: dict[int, Point3D] = {}
    if points and (folder / f"points3D{ext}").is_file():
        points3d = readers[2](folder / f"points3D{ext}")
    return cameras, images, points3d


def camera_pinhole(camera: Camera) -> tuple[float, float, float, float]:
    """Pinhole part ``(fx, fy, cx, cy)`` in pixels of a supported camera.

    Raises:
        UnsupportedCameraError: fisheye, FOV or thin-prism models (named in the message).
    """
    p = camera.params
    if camera.model in ("SIMPLE_PINHOLE", "SIMPLE_RADIAL", "RADIAL"):
        return float(p[0]), float(p[0]), float(p[1]), float(p[2])
    if camera.model in ("PINHOLE", "OPENCV", "FULL_OPENCV"):
        return float(p[0]), float(p[1]), float(p[2]), float(p[3])
    raise UnsupportedCameraError(
        f"camera {camera.id}: unsupported camera model {camera.model} "
        f"(supported: {', '.join(SUPPORTED_MODELS)}; undistort it with `colmap image_undistorter`)"
    )


def camera_distortion(camera: Camera) -> np.ndarray:
    """Distortion coefficients ``[k1, k2, p1, p2, k3, k4, k5, k6]`` (OpenCV order).

    Radial factor ``(1 + k1 r^2 + k2 r^4 + k3 r^6) / (1 + k4 r^2 + k5 r^4 + k6 r^6)`` plus the
    tangential terms ``p1, p2``; all zeros for pinhole models.

    Raises:
        UnsupportedCameraError: fisheye, FOV or thin-prism models.
    """
    camera_pinhole(camera)  # raises for unsupported models
    p = camera.params
    coeffs = np.zeros(8, dtype=np.float64)
    if camera.model == "SIMPLE_RADIAL":
        coeffs[0] = p[3]
    elif camera.model == "RADIAL":
        coeffs[0:2] = p[3:5]
    elif camera.model == "OPENCV":
        coeffs[0:4] = p[4:8]
    elif camera.model == "FULL_OPENCV":
        coeffs[:] = p[4:12]
    return coeffs


def camera_intrinsics_pixels(camera: Camera) -> Tensor:
    """Pixel intrinsics ``[3, 3]`` (float64) of the camera's pinhole part."""
    fx, fy, cx, cy = camera_pinhole(camera)
    return torch.tensor([[fx, 0.0, cx], [0.0, fy, cy], [0.0, 0.0, 1.0]], dtype=torch.float64)


def camera_intrinsics(camera: Camera) -> Tensor:
    """Normalised intrinsics ``[3, 3]`` (float64) of the camera's pinhole part.

    Row 0 is divided by the width and row 1 by the height (splatzoo's convention).
    """
    return intrinsics_to_normalized(camera_intrinsics_pixels(camera), (camera.height, camera.width))


def image_world_to_camera(image: Image) -> Tensor:
    """World-to-camera 4x4 (float64, OpenCV axes, as COLMAP) of an image's qvec/tvec."""
    matrix = torch.eye(4, dtype=torch.float64)
    matrix[:3, :3] = quaternion_to_matrix(torch.from_numpy(np.asarray(image.qvec, np.float64)))
    matrix[:3, 3] = torch.from_numpy(np.asarray(image.tvec, dtype=np.float64))
    return matrix


def image_pose(image: Image, camera: Camera) -> dict[str, Any]:
    """An image's pose in the ``cameras.json`` layout: ``camera_to_world`` ``[4, 4]`` (float64,
    COLMAP's world frame), the pinhole ``fx, fy, cx, cy`` in pixels, ``width`` and ``height``.

    Raises:
        UnsupportedCameraError: a camera model with no pinhole part.
    """
    fx, fy, cx, cy = camera_pinhole(camera)
    return {
        "camera_to_world": torch.linalg.inv(image_world_to_camera(image)),
        "fx": fx,
        "fy": fy,
        "cx": cx,
        "cy": cy,
        "width": camera.width,
        "height": camera.height,
    }
