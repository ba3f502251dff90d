"""Synthetic scene generator writing the chunk format (so every loader path is the real one).

Usage::

    python -m datamodules.synthetic --out DIR --scenes N --resolution R --views V --seed S \\
        [--kind room|object] [--workers W] [--test-fraction 0.1] [--supersample 2]

Scenes are ray-cast analytically with NumPy (all pixels of all views at once), never with the
Gaussian renderer:

- ``room``: a box room (floor, walls, ceiling) holding 3-8 random primitives (spheres, boxes,
  cylinders), lit by a point light under the ceiling with shadows; the camera walks like RE10K
  footage (forward, sideways or diagonal, with a gentle bend, small yaw/pitch/roll drift). The walk
  speed is 0.9-1.6 % of the distance to the facing wall per frame, so a context gap of 8-20 frames
  overlaps strongly and has a baseline of roughly 7-32 % of the scene depth.
- ``object``: primitives on a ground plane under a sky dome, lit by the sun with shadows; the camera
  orbits them at 2.3-3.7 degrees per frame.

Depth range: a scene is resampled (deterministically) until, for any two frames 6-20 apart
(``GUARANTEED_GAPS``), every GT depth divided by their distance lies in ``SCENE_DEPTH_RANGE`` =
[0.25, 50]: after normalisation to the scene frame (unit context baseline) GT depth is inside the
near/far planes of ``configs/data/synthetic.yaml`` for the gaps it samples.

Surfaces carry procedural solid textures (checker, stripes, smooth value noise summed over several
frequencies) with Lambertian shading. Fields of view are 50-90 degrees, square pixels, principal
point within 2 % of the centre. Anti-aliasing is adaptive: pixels on silhouettes or colour edges get
``--supersample``^2 rays; depth is the exact z-depth of the pixel-centre ray.

Output (``DIR``): ``train/`` and ``test/`` chunk splits (see ``datamodules.readers.chunks``; every scene
stores ``depths``, 16-bit PNG z-depth with ``depth_scale``), ``evaluation_index.json`` for the test
split (2 context views ``0.4-0.7 x (V - 1)`` frames apart, 3 targets between them, like the RE10K
index) and ``metadata.json`` with the settings. Scene ``i`` of a split is generated from
``SeedSequence([seed, split_code, i])`` (train 0, test 1), so output is deterministic for a seed,
independent of the worker count, and train and test scenes never share a seed. The folder is
written under a temporary name and renamed when complete.
"""

from __future__ import annotations

import argparse
import colorsys
import io
import json
import logging
import multiprocessing
import multiprocessing.pool
import os
import signal
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

from datamodules.errors import InputError
from datamodules.readers.chunks import encode_depths
from models.output_folder import OutputFolder, OutputFolderError

__all__ = [
    "SyntheticSettings",
    "SceneSpec",
    "sample_scene",
    "render_scene",
    "generate_scene",
    "depth_fits",
    "GUARANTEED_GAPS",
    "SCENE_DEPTH_RANGE",
    "generate_dataset",
    "ensure_synthetic",
    "is_complete",
    "main",
]

log = logging.getLogger(__name__)

SPLIT_CODES = {"train": 0, "test": 1}
EPS = 1e-4
ROOM_FACES = 6  # surface ids 0..5: x-, x+, floor, ceiling, z-, z+ (object kind: 0 ground, 1 sky)
FORMAT_VERSION = 1
# For any two frames 6-20 apart used as context views, GT depth in scene-frame units (divided by
# their distance) lies in SCENE_DEPTH_RANGE: the synthetic data config uses it as near/far.
GUARANTEED_GAPS = (6, 20)
SCENE_DEPTH_RANGE = (0.25, 50.0)
MAX_ATTEMPTS = 50


@dataclass
class SyntheticSettings:
    """What a synthetic dataset was generated with (stored in ``metadata.json``)."""

    scenes: int = 1000
    resolution: int = 64
    views: int = 24
    seed: int = 0
    kind: str = "room"
    test_fraction: float = 0.1
    supersample: int = 2
    version: int = FORMAT_VERSION

    def split_sizes(self) -> dict[str, int]:
        """Scenes per split."""
        test = 0 if self.test_fraction <= 0 else max(1, round(self.scenes * self.test_fraction))
        return {"train": self.scenes - test, "test": test}

    def validate(self) -> None:
        """Raise ``InputError`` for settings that cannot be generated."""
        if self.kind not in ("room", "object"):
            raise InputError(f"kind must be 'room' or 'object', got {self.kind!r}")
        if self.resolution < 8 or self.views < 2 or self.supersample < 1:
            raise InputError("need resolution >= 8, views >= 2, supersample >= 1")
        if not 0 <= self.test_fraction < 1:
            raise InputError(f"test_fraction must be in [0, 1), got {self.test_fraction}")
        if self.split_sizes()["train"] < 1:
            raise InputError(f"{self.scenes} scenes leave no training scene")


# ----------------------------------------------------------------------------- textures


def _hash(ix: np.ndarray, iy: np.ndarray, iz: np.ndarray, seed: int) -> np.ndarray:
    """Pseudo-random floats in [0, 1) for integer lattice points (uint32 arithmetic)."""
    h = ix * np.uint32(0x8DA6B343) ^ iy * np.uint32(0xD8163841) ^ iz * np.uint32(0xCB1AB31F)
    h ^= np.uint32(seed & 0xFFFFFFFF)
    h ^= h >> np.uint32(13)
    h *= np.uint32(0x5BD1E995)
    h ^= h >> np.uint32(15)
    return h.astype(np.float32) * np.float32(2.0**-32)


def value_noise(points: np.ndarray, seed: int) -> np.ndarray:
    """Smooth 3D value noise in [0, 1] (trilinear, smoothstep-weighted), ``[M, 3] -> [M]``."""
    base = np.floor(points)
    frac = (points - base).astype(np.float32)
    w = frac * frac * (3.0 - 2.0 * frac)  # [M, 3]
    cell = base.astype(np.int64).astype(np.uint32)
    x0, y0, z0 = cell[:, 0], cell[:, 1], cell[:, 2]
    x1, y1, z1 = x0 + np.uint32(1), y0 + np.uint32(1), z0 + np.uint32(1)
    wx, wy, wz = w[:, 0], w[:, 1], w[:, 2]

    def lerp(a: np.ndarray, b: np.ndarray, t: np.ndarray) -> np.ndarray:
        return a + (b - a) * t

    c00 = lerp(_hash(x0, y0, z0, seed), _hash(x1, y0, z0, seed), wx)
    c10 = lerp(_hash(x0, y1, z0, seed), _hash(x1, y1, z0, seed), wx)
    c01 = lerp(_hash(x0, y0, z1, seed), _hash(x1, y0, z1, seed), wx)
    c11 = lerp(_hash(x0, y1, z1, seed), _hash(x1, y1, z1, seed), wx)
    return lerp(lerp(c00, c10, wy), lerp(c01, c11, wy), wz)


def fractal_noise(points: np.ndarray, seed: int, octaves: int = 3) -> np.ndarray:
    """Value noise summed over ``octaves`` frequencies (x2, amplitude x0.5), in [0, 1]."""
    total = np.zeros(len(points), dtype=np.float32)
    amplitude, norm = 1.0, 0.0
    for octave in range(octaves):
        total += amplitude * value_noise(points * (2.0**octave), seed + 7919 * octave)
        norm += amplitude
        amplitude *= 0.5
    return total / norm


@dataclass
class Texture:
    """A procedural solid texture: two colours mixed by a checker, stripe or noise pattern."""

    kind: str  # checker | stripes | noise
    colors: np.ndarray  # [2, 3]
    frequency: float  # pattern cycles per world unit
    offset: np.ndarray  # [3]
    direction: np.ndarray  # [3] unit, stripes only
    seed: int
    detail: float  # amplitude of a fine noise modulation

    def __call__(self, points: np.ndarray) -> np.ndarray:
        """Albedo ``[M, 3]`` at ``points [M, 3]`` (texture-space coordinates)."""
        q = points * np.float32(self.frequency) + self.offset.astype(np.float32)
        if self.kind == "checker":
            weight = (np.floor(q).sum(axis=1) % 2).astype(np.float32)
        elif self.kind == "stripes":
            wave = np.sin(2 * np.pi * _dot(q, self.direction))
            weight = np.clip(0.5 + 1.5 * wave, 0.0, 1.0)
        else:
            weight = np.clip((fractal_noise(q, self.seed) - 0.5) * 2.2 + 0.5, 0.0, 1.0)
        c0, c1 = self.colors.astype(np.float32)
        albedo = c0 + (c1 - c0) * weight[:, None]
        if self.detail > 0 and self.kind != "noise":
            fine = value_noise(q * 4.0 + 17.0, self.seed + 1)
            albedo = albedo * (1.0 - self.detail + 2.0 * self.detail * fine)[:, None]
        return albedo


def _random_color(rng: np.random.Generator) -> np.ndarray:
    hue, sat, val = rng.random(), rng.uniform(0.15, 0.8), rng.uniform(0.3, 0.95)
    return np.array(colorsys.hsv_to_rgb(hue, sat, val), dtype=np.float32)


def _random_texture(rng: np.random.Generator, frequency_range: tuple[float, float]) -> Texture:
    kind = str(rng.choice(["checker", "stripes", "noise"]))
    first = _random_color(rng)
    if rng.random() < 0.5:  # a tonal variation of the first colour, else an unrelated colour
        second = np.clip(first * rng.uniform(0.35, 0.7) + rng.uniform(0, 0.15), 0, 1)
    else:
        second = _random_color(rng)
    direction = rng.normal(size=3)
    frequency = rng.uniform(*frequency_range) * (0.6 if kind == "noise" else 1.0)
    return Texture(
        kind=kind,
        colors=np.stack([first, second]).astype(np.float32),
        frequency=float(frequency),
        offset=rng.uniform(0.1, 0.9, size=3).astype(np.float32) + rng.integers(0, 64, size=3),
        direction=(direction / np.linalg.norm(direction)).astype(np.float32),
        seed=int(rng.integers(0, 2**31)),
        detail=float(rng.uniform(0.05, 0.2)),
    )


# ----------------------------------------------------------------------------- geometry


def _mul(vectors: np.ndarray, matrix: np.ndarray) -> np.ndarray:
    """``vectors [M, 3] @ matrix [3, 3]`` without BLAS (much faster for tall, thin arrays)."""
    m = matrix.astype(vectors.dtype)
    return vectors[:, 0:1] * m[0] + vectors[:, 1:2] * m[1] + vectors[:, 2:3] * m[2]


def _dot(vectors: np.ndarray, vector: np.ndarray) -> np.ndarray:
    """``vectors [M, 3] @ vector [3]`` without BLAS."""
    v = vector.astype(vectors.dtype)
    return vectors[:, 0] * v[0] + vectors[:, 1] * v[1] + vectors[:, 2] * v[2]


def _rot_y(angle: float) -> np.ndarray:
    c, s = np.cos(angle), np.sin(angle)
    return np.array([[c, 0, s], [0, 1, 0], [-s, 0, c]], dtype=np.float32)


@dataclass
class Primitive:
    """A sphere, a y-rotated box or a vertical cylinder.

    ``size``: sphere ``(r, -, -)``; box half extents ``(hx, hy, hz)``; cylinder ``(r, half height,
    -)``. ``center`` is the geometric centre.
    """

    kind: str
    center: np.ndarray
    size: np.ndarray
    yaw: float
    texture: Texture | None

    @property
    def bounding_radius(self) -> float:
        """Radius of a sphere around ``center`` enclosing the primitive."""
        if self.kind == "sphere":
            return float(self.size[0])
        if self.kind == "box":
            return float(np.linalg.norm(self.size))
        return float(np.hypot(self.size[0], self.size[1]))

    @property
    def footprint(self) -> float:
        """Radius of the primitive's footprint on the floor (xz)."""
        if self.kind == "box":
            return float(np.hypot(self.size[0], self.size[2]))
        return float(self.size[0])

    def hit(self, origins: np.ndarray, dirs: np.ndarray) -> np.ndarray:
        """Ray parameter of the first hit beyond ``EPS`` (inf on a miss), ``[N]``."""
        oc = origins - self.center
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            if self.kind == "sphere":
                a = _rowdot(dirs, dirs)
                b = _rowdot(oc, dirs)
                c = _rowdot(oc, oc) - np.float32(self.size[0] ** 2)
                disc = b * b - a * c
                t = (-b - np.sqrt(np.maximum(disc, 0))) / a
                return np.where((disc > 0) & (t > EPS), t, np.inf)
            if self.kind == "box":
                rotation = _rot_y(self.yaw)
                o_local, d_local = _mul(oc, rotation), _mul(dirs, rotation)
                inverse = 1.0 / d_local
                half = self.size
                t1, t2 = (-half - o_local) * inverse, (half - o_local) * inverse
                low, high = np.minimum(t1, t2), np.maximum(t1, t2)
                t_near = np.maximum(np.maximum(low[:, 0], low[:, 1]), low[:, 2])
                t_far = np.minimum(np.minimum(high[:, 0], high[:, 1]), high[:, 2])
                return np.where((t_far >= t_near) & (t_near > EPS), t_near, np.inf)
            radius, half = np.float32(self.size[0]), np.float32(self.size[1])
            ox, oy, oz = oc[:, 0], oc[:, 1], oc[:, 2]
            dx, dy, dz = dirs[:, 0], dirs[:, 1], dirs[:, 2]
            a = dx * dx + dz * dz
            b = ox * dx + oz * dz
            c = ox * ox + oz * oz - radius * radius
            disc = b * b - a * c
            t_side = (-b - np.sqrt(np.maximum(disc, 0))) / a
            ok = (disc > 0) & (t_side > EPS) & (np.abs(oy + t_side * dy) <= half)
            best = np.where(ok, t_side, np.inf)
            for cap in (half, -half):
                t_cap = (cap - oy) / dy
                px, pz = ox + t_cap * dx, oz + t_cap * dz
                ok = (t_cap > EPS) & (px * px + pz * pz <= radius * radius)
                best = np.minimum(best, np.where(ok, t_cap, np.inf))
            return best

    def normals(self, points: np.ndarray) -> np.ndarray:
        """Outward unit normals ``[M, 3]`` at surface points ``[M, 3]``."""
        local = points - self.center
        if self.kind == "sphere":
            return local / np.linalg.norm(local, axis=1, keepdims=True).clip(1e-8)
        if self.kind == "box":
            rotation = _rot_y(self.yaw)
            p = _mul(local, rotation)
            axis = np.abs(p / self.size).argmax(axis=1)
            n_local = np.zeros_like(p)
            rows = np.arange(len(p))
            n_local[rows, axis] = np.sign(p[rows, axis])
            return _mul(n_local, rotation.T)
        radial = np.hypot(local[:, 0], local[:, 2])
        on_cap = np.abs(np.abs(local[:, 1]) - self.size[1]) < np.abs(radial - self.size[0])
        side = np.stack([local[:, 0], np.zeros_like(radial), local[:, 2]], axis=1)
        side /= radial.clip(1e-8)[:, None]
        cap = np.zeros_like(local)
        cap[:, 1] = np.sign(local[:, 1])
        return np.where(on_cap[:, None], cap, side)

    def texture_coords(self, points: np.ndarray) -> np.ndarray:
        """Object-space coordinates (rotating with the object) of surface points."""
        local = points - self.center
        return _mul(local, _rot_y(self.yaw)) if self.kind == "box" else local


@dataclass
class SceneSpec:
    """Everything needed to render one scene.

    Attributes:
        kind: ``room`` or ``object``.
        bounds: room ``[2, 3]`` (min, max corner); unused for ``object``.
        dome_radius: sky dome radius (``object``).
        surfaces: textures of surface ids 0..5 (room faces; object kind: ground, sky colours).
        primitives: the objects.
        light: room: point-light position; object: unit direction towards the sun.
        ambient: ambient shading term.
        intensity: diffuse light strength.
        light_range: distance at which the point light's falloff halves.
        extrinsics: ``[V, 4, 4]`` camera-to-world (OpenCV axes, world y up).
        intrinsics: ``[3, 3]`` normalised (shared by all views).
    """

    kind: str
    bounds: np.ndarray
    dome_radius: float
    surfaces: list[Texture]
    primitives: list[Primitive]
    light: np.ndarray
    ambient: float
    intensity: float
    light_range: float
    extrinsics: np.ndarray
    intrinsics: np.ndarray
    sky: np.ndarray = field(default_factory=lambda: np.zeros((2, 3), dtype=np.float32))


def _extrinsics(positions: np.ndarray, yaws, pitches, rolls) -> np.ndarray:
    """Camera-to-world poses ``[V, 4, 4]``: rotation columns (right, down, forward), y-up world."""
    yaws, pitches, rolls = (
        np.broadcast_to(np.asarray(a, float), len(positions)) for a in (yaws, pitches, rolls)
    )
    forward = np.stack(
        [np.cos(pitches) * np.sin(yaws), np.sin(pitches), np.cos(pitches) * np.cos(yaws)], axis=1
    )  # [V, 3]
    right = np.stack([-forward[:, 2], np.zeros(len(forward)), forward[:, 0]], axis=1)  # f x up
    right /= np.linalg.norm(right, axis=1, keepdims=True)
    down = np.cross(forward, right)
    c, s = np.cos(rolls)[:, None], np.sin(rolls)[:, None]
    right, down = c * right + s * down, -s * right + c * down
    poses = np.tile(np.eye(4), (len(positions), 1, 1))
    poses[:, :3, :3] = np.stack([right, down, forward], axis=2)
    poses[:, :3, 3] = positions
    return poses


def _random_intrinsics(rng: np.random.Generator) -> tuple[np.ndarray, float]:
    hfov = np.deg2rad(rng.uniform(50.0, 90.0))
    focal = 0.5 / np.tan(hfov / 2)
    cx, cy = 0.5 + rng.uniform(-0.02, 0.02, size=2)
    k = np.array([[focal, 0, cx], [0, focal, cy], [0, 0, 1]], dtype=np.float64)
    return k, hfov


def _smooth(rng: np.random.Generator, ts: np.ndarray, amplitude: float) -> np.ndarray:
    """A small smooth wiggle along the sequence (one random low-frequency sine)."""
    frequency, phase = rng.uniform(0.5, 1.5), rng.uniform(0, 2 * np.pi)
    return amplitude * np.sin(2 * np.pi * frequency * ts + phase)


def _random_primitive(rng: np.random.Generator, ceiling: float) -> Primitive:
    kind = str(rng.choice(["sphere", "box", "cylinder"]))
    texture = None  # drawn once the primitive is placed (most candidates are rejected)
    if kind == "sphere":
        radius = rng.uniform(0.25, 0.6)
        lift = rng.uniform(0.3, 1.0) if rng.random() < 0.3 else 0.0
        height = min(radius + lift, ceiling - radius - 0.2)
        return Primitive(kind, np.array([0, height, 0.0]), np.array([radius, 0, 0]), 0.0, texture)
    if kind == "box":
        half = np.array([rng.uniform(0.2, 0.6), rng.uniform(0.15, 0.8), rng.uniform(0.2, 0.6)])
        half[1] = min(half[1], ceiling / 2 - 0.1)
        return Primitive(
            kind, np.array([0, half[1], 0.0]), half, rng.uniform(0, np.pi / 2), texture
        )
    radius = rng.uniform(0.15, 0.45)
    half = ceiling / 2 if rng.random() < 0.15 else min(rng.uniform(0.2, 1.0), ceiling / 2 - 0.1)
    return Primitive(kind, np.array([0, half, 0.0]), np.array([radius, half, 0]), 0.0, texture)


def _place(rng: np.random.Generator, prim: Primitive, xz: np.ndarray) -> Primitive:
    prim.center = np.array([xz[0], prim.center[1], xz[1]], dtype=np.float32)
    prim.size = prim.size.astype(np.float32)
    prim.texture = _random_texture(rng, (2.0, 6.0))
    return prim


def _free(xz: np.ndarray, radius: float, cameras: np.ndarray, placed: list[Primitive]) -> bool:
    """Whether a footprint keeps clear of the cameras (0.9 m) and other primitives (0.1 m)."""
    if len(cameras) and np.min(np.linalg.norm(cameras[:, [0, 2]] - xz, axis=1)) < radius + 0.9:
        return False
    for other in placed:
        if np.linalg.norm(other.center[[0, 2]] - xz) < radius + other.footprint + 0.1:
            return False
    return True


def _distance_to_wall(point: np.ndarray, direction: np.ndarray, bounds: np.ndarray) -> float:
    with np.errstate(divide="ignore"):
        t = np.where(
            direction > 0, (bounds[1] - point) / direction, (bounds[0] - point) / direction
        )
    t = np.where(direction == 0, np.inf, t)
    return float(t[[0, 2]].min())


def _sample_room(rng: np.random.Generator, num_views: int) -> SceneSpec:
    intrinsics, hfov = _random_intrinsics(rng)
    ts = (np.arange(num_views) - (num_views - 1) / 2) / max(num_views - 1, 1)  # [-0.5, 0.5]
    for _ in range(500):
        sx, sz = rng.uniform(5.0, 9.0), rng.uniform(6.5, 12.0)
        if rng.random() < 0.5:
            sx, sz = sz, sx
        ceiling = rng.uniform(2.6, 3.6)
        bounds = np.array([[-sx / 2, 0.0, -sz / 2], [sx / 2, ceiling, sz / 2]])
        yaw0 = rng.uniform(-np.pi, np.pi)
        heading = np.array([np.sin(yaw0), 0.0, np.cos(yaw0)])
        center = np.array(
            [
                rng.uniform(bounds[0, 0] + 1.2, bounds[1, 0] - 1.2),
                rng.uniform(1.2, min(1.9, ceiling - 0.9)),
                rng.uniform(bounds[0, 2] + 1.2, bounds[1, 2] - 1.2),
            ]
        )
        front = _distance_to_wall(center, heading, bounds)
        if front < max(3.0, 0.45 * min(sx, sz)):
            continue
        speed = rng.uniform(0.009, 0.016) * front
        mode = rng.random()
        if mode < 0.35:
            motion = rng.uniform(-0.35, 0.35)  # forward
        elif mode < 0.8:
            motion = rng.choice([-1, 1]) * rng.uniform(1.2, 1.75)  # sideways
        else:
            motion = rng.choice([-1, 1]) * rng.uniform(0.35, 1.2)  # diagonal
        angles = yaw0 + motion + rng.uniform(-0.4, 0.4) * ts
        steps = speed * np.stack([np.sin(angles), np.zeros_like(angles), np.cos(angles)], axis=1)
        path = np.cumsum(steps, axis=0)
        positions = center + path - path[(num_views - 1) // 2]
        positions[:, 1] += _smooth(rng, ts, 0.02)
        inside = (positions[:, [0, 2]] > bounds[0, [0, 2]] + 0.8).all() and (
            positions[:, [0, 2]] < bounds[1, [0, 2]] - 0.8
        ).all()
        if not inside:
            continue
        yaws = yaw0 + rng.uniform(-0.3, 0.3) * ts + _smooth(rng, ts, 0.02)
        pitches = rng.uniform(-0.25, 0.08) + _smooth(rng, ts, 0.015)
        rolls = rng.uniform(-0.03, 0.03) + _smooth(rng, ts, 0.005)
        extrinsics = _extrinsics(positions, yaws, pitches, rolls)

        count = int(rng.integers(3, 9))
        placed: list[Primitive] = []
        for _ in range(40 * count):
            if len(placed) == count:
                break
            prim = _random_primitive(rng, ceiling)
            j = int(rng.integers(num_views))
            forward = extrinsics[j, :3, 2] * np.array([1, 0, 1])
            forward /= np.linalg.norm(forward)
            right = np.array([-forward[2], forward[0]])
            distance = rng.uniform(1.3, max(1.4, 0.8 * front))
            lateral = rng.uniform(-0.8, 0.8) * distance * np.tan(hfov / 2)
            xz = positions[j, [0, 2]] + distance * forward[[0, 2]] + lateral * right
            margin = prim.footprint + 0.05
            if (xz < bounds[0, [0, 2]] + margin).any() or (xz > bounds[1, [0, 2]] - margin).any():
                continue
            if _free(xz, prim.footprint, positions, placed):
                placed.append(_place(rng, prim, xz))
        if len(placed) < 3:
            continue
        floor = _random_texture(rng, (0.8, 2.5))
        walls = [_random_texture(rng, (0.5, 2.0)) for _ in range(2)]
        ceiling_texture = _random_texture(rng, (0.3, 1.0))
        ceiling_texture.kind = "noise"
        ceiling_texture.colors = np.clip(ceiling_texture.colors * 0.4 + 0.55, 0, 1)
        surfaces = [walls[0], walls[0], floor, ceiling_texture, walls[1], walls[1]]
        light = np.array(
            [
                rng.uniform(bounds[0, 0] + 1, bounds[1, 0] - 1),
                ceiling - 0.25,
                rng.uniform(bounds[0, 2] + 1, bounds[1, 2] - 1),
            ]
        )
        return SceneSpec(
            kind="room",
            bounds=bounds,
            dome_radius=0.0,
            surfaces=surfaces,
            primitives=placed,
            light=light,
            ambient=float(rng.uniform(0.3, 0.45)),
            intensity=float(rng.uniform(0.8, 1.1)),
            light_range=float(0.6 * max(sx, sz)),
            extrinsics=extrinsics,
            intrinsics=intrinsics,
        )
    raise RuntimeError("could not sample a room scene")  # pragma: no cover - 500 tries


def _sample_object(rng: np.random.Generator, num_views: int) -> SceneSpec:
    intrinsics, _ = _random_intrinsics(rng)
    ts = (np.arange(num_views) - (num_views - 1) / 2) / max(num_views - 1, 1)
    for _ in range(500):
        radius = rng.uniform(3.3, 4.8)
        elevation = rng.uniform(0.17, 0.6)
        target = np.array([rng.uniform(-0.3, 0.3), rng.uniform(0.2, 0.7), rng.uniform(-0.3, 0.3)])
        step = rng.choice([-1, 1]) * rng.uniform(0.04, 0.065)
        angles = rng.uniform(0, 2 * np.pi) + step * (np.arange(num_views) - (num_views - 1) / 2)
        radii = radius * (1 + _smooth(rng, ts, 0.04))
        heights = target[1] + radii * np.tan(elevation) + _smooth(rng, ts, 0.05)
        positions = np.stack([radii * np.cos(angles), heights, radii * np.sin(angles)], axis=1)
        look = target + rng.normal(scale=0.05, size=(num_views, 3)) - positions
        look /= np.linalg.norm(look, axis=1, keepdims=True)
        yaws, pitches = np.arctan2(look[:, 0], look[:, 2]), np.arcsin(look[:, 1])
        rolls = rng.uniform(-0.02, 0.02) + _smooth(rng, ts, 0.005)
        count = int(rng.integers(3, 9))
        placed: list[Primitive] = []
        for _ in range(40 * count):
            if len(placed) == count:
                break
            prim = _random_primitive(rng, ceiling=3.0)
            xz = rng.uniform(-1.5, 1.5, size=2)
            if np.linalg.norm(xz) <= 1.5 and _free(xz, prim.footprint, positions, placed):
                placed.append(_place(rng, prim, xz))
        if len(placed) < 3:
            continue
        sun_elevation, sun_azimuth = rng.uniform(0.5, 1.2), rng.uniform(0, 2 * np.pi)
        sun = np.array(
            [
                np.cos(sun_elevation) * np.sin(sun_azimuth),
                np.sin(sun_elevation),
                np.cos(sun_elevation) * np.cos(sun_azimuth),
            ]
        )
        clouds = _random_texture(rng, (0.05, 0.12))
        clouds.kind = "noise"
        horizon = np.array(colorsys.hsv_to_rgb(rng.uniform(0.5, 0.65), 0.15, 0.95))
        zenith = np.array(colorsys.hsv_to_rgb(rng.uniform(0.55, 0.65), rng.uniform(0.3, 0.6), 0.85))
        return SceneSpec(
            kind="object",
            bounds=np.zeros((2, 3)),
            dome_radius=30.0,
            surfaces=[_random_texture(rng, (0.5, 2.0)), clouds],
            primitives=placed,
            light=sun,
            ambient=float(rng.uniform(0.35, 0.5)),
            intensity=float(rng.uniform(0.6, 0.8)),
            light_range=0.0,
            extrinsics=_extrinsics(positions, yaws, pitches, rolls),
            intrinsics=intrinsics,
            sky=np.stack([horizon, zenith]).astype(np.float32),
        )
    raise RuntimeError("could not sample an object scene")  # pragma: no cover - 500 tries


def sample_scene(seed: int | list[int], kind: str = "room", num_views: int = 24) -> SceneSpec:
    """Sample a random scene (geometry, textures, light, camera path) from a seed."""
    rng = np.random.default_rng(np.random.SeedSequence(seed))
    if kind == "room":
        return _sample_room(rng, num_views)
    if kind == "object":
        return _sample_object(rng, num_views)
    raise ValueError(f"kind must be 'room' or 'object', got {kind!r}")


# ----------------------------------------------------------------------------- ray casting


def _rowdot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise dot products of ``[M, 3]`` arrays."""
    return a[:, 0] * b[:, 0] + a[:, 1] * b[:, 1] + a[:, 2] * b[:, 2]


def _screen_box(
    spec: SceneSpec, view: int, center: np.ndarray, radius: float
) -> tuple[float, float, float, float] | None:
    """Conservative normalised image rectangle ``(u0, u1, v0, v1)`` covering a sphere in one view
    (None if the sphere is behind the camera)."""
    pose = spec.extrinsics[view]
    x, y, z = pose[:3, :3].T @ (center - pose[:3, 3])
    if z + radius <= 0:
        return None
    if z - radius <= 0.05:
        return -np.inf, np.inf, -np.inf, np.inf
    k = spec.intrinsics
    box = []
    for value, focal, principal in ((x, k[0, 0], k[0, 2]), (y, k[1, 1], k[1, 2])):
        corners = [(value + a) / (z + b) for a in (-radius, radius) for b in (-radius, radius)]
        box += [focal * min(corners) + principal, focal * max(corners) + principal]
    return box[0], box[1], box[2], box[3]


def _cast(
    spec: SceneSpec, origins: np.ndarray, dirs: np.ndarray, views: np.ndarray, uv: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """First hit of every ray.

    Args:
        origins: ``[N, 3]`` ray origins (camera centres).
        dirs: ``[N, 3]`` directions.
        views: ``[N]`` view of each ray, sorted.
        uv: ``[N, 2]`` normalised image coordinates of each ray (for per-view culling).

    Returns:
        Ray parameter ``t [N]`` and surface id ``[N]`` (int16).
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        if spec.kind == "room":
            lo, hi = spec.bounds.astype(np.float32)
            t_axis = np.where(dirs > 0, hi - origins, lo - origins) / dirs
            t_axis = np.where(dirs == 0, np.inf, t_axis)  # [N, 3]
            tx, ty, tz = t_axis[:, 0], t_axis[:, 1], t_axis[:, 2]
            t = np.minimum(np.minimum(tx, ty), tz)
            positive = dirs > 0
            surface = np.where(
                t == tx, positive[:, 0], np.where(t == ty, 2 + positive[:, 1], 4 + positive[:, 2])
            ).astype(np.int16)
        else:
            b = _rowdot(origins, dirs)
            a = _rowdot(dirs, dirs)
            c = _rowdot(origins, origins) - np.float32(spec.dome_radius**2)
            t = (-b + np.sqrt(np.maximum(b * b - a * c, 0))) / a
            t_ground = -origins[:, 1] / dirs[:, 1]
            ground = (dirs[:, 1] < 0) & (t_ground > EPS) & (t_ground < t)
            t = np.where(ground, t_ground, t)
            surface = np.where(ground, 0, 1).astype(np.int16)
    t = t.astype(np.float32)
    starts = np.searchsorted(views, np.arange(len(spec.extrinsics) + 1))
    for i, prim in enumerate(spec.primitives):
        for view in range(len(spec.extrinsics)):
            first, last = starts[view], starts[view + 1]
            box = (
                None
                if first == last
                else _screen_box(spec, view, prim.center, prim.bounding_radius)
            )
            if box is None:
                continue
            u, v = uv[first:last, 0], uv[first:last, 1]
            inside = (u >= box[0]) & (u <= box[1]) & (v >= box[2]) & (v <= box[3])
            idx = first + np.nonzero(inside)[0]
            if not len(idx):
                continue
            t_prim = prim.hit(origins[idx], dirs[idx])
            closer = t_prim < t[idx]
            t[idx[closer]] = t_prim[closer]
            surface[idx[closer]] = ROOM_FACES + i
    return t, surface


def _occluded(
    spec: SceneSpec, points: np.ndarray, to_light: np.ndarray, point_light: bool
) -> np.ndarray:
    """Whether a primitive blocks the way from ``points [M, 3]`` to the light, ``[M]``.

    ``to_light`` is ``light - point`` for a point light (blocked for ray parameters in (EPS, 1)),
    or the unit sun direction (blocked for any positive parameter). Candidates are prefiltered with
    each primitive's bounding sphere (a cone from the point light, a cylinder along the sun).
    """
    blocked = np.zeros(len(points), dtype=bool)
    if not len(points):
        return blocked
    if point_light:
        light = spec.light.astype(np.float32)
        from_light = points - light
        distance = np.sqrt(_rowdot(from_light, from_light)).clip(1e-6)
        unit = from_light / distance[:, None]
    else:
        sun = spec.light.astype(np.float32)
        e1 = np.cross(sun, [0.0, 0.0, 1.0] if abs(sun[2]) < 0.9 else [1.0, 0.0, 0.0])
        e1 = (e1 / np.linalg.norm(e1)).astype(np.float32)
        e2 = np.cross(sun, e1).astype(np.float32)
        plane = np.stack([_dot(points, e1), _dot(points, e2)], axis=1)  # [M, 2]
        height = _dot(points, sun)
    for prim in spec.primitives:
        radius = prim.bounding_radius
        center = prim.center.astype(np.float32)
        if point_light:
            offset = center - light
            reach = float(np.linalg.norm(offset))
            if reach <= radius:
                candidates = np.arange(len(points))
            else:
                cos_cone = np.sqrt(1.0 - (radius / reach) ** 2)
                inside = _dot(unit, offset / reach) >= cos_cone - 1e-4
                candidates = np.nonzero(inside & (distance > reach - radius))[0]
            limit = 1.0
        else:
            a, b = float(center @ e1), float(center @ e2)
            near = (plane[:, 0] - a) ** 2 + (plane[:, 1] - b) ** 2 <= radius**2
            candidates = np.nonzero(near & (height < float(center @ sun) + radius))[0]
            limit = np.inf
        if len(candidates):
            dirs = (
                to_light[candidates] if point_light else np.broadcast_to(sun, (len(candidates), 3))
            )
            blocked[candidates] |= prim.hit(points[candidates], dirs) < limit
    return blocked


def _shade(spec: SceneSpec, origins, dirs, t, surface) -> np.ndarray:
    """Lambertian colour ``[N, 3]`` of the hit points (flat ``[N, 3]`` rays, ``[N]`` hits)."""
    points = origins + t[:, None] * dirs
    normals = np.zeros_like(points)
    albedo = np.zeros_like(points)
    emissive = np.zeros(len(points), dtype=bool)
    for sid in np.unique(surface).tolist():
        idx = np.nonzero(surface == sid)[0]
        p = points[idx]
        if sid >= ROOM_FACES:
            prim = spec.primitives[sid - ROOM_FACES]
            normals[idx] = prim.normals(p)
            albedo[idx] = prim.texture(prim.texture_coords(p))
        elif spec.kind == "room":
            axis, upper = divmod(sid, 2)
            normals[idx, axis] = -1.0 if upper else 1.0
            p = p.copy()
            p[:, axis] = spec.bounds[upper, axis]  # exactly on the face: no texture flicker
            albedo[idx] = spec.surfaces[sid](p)
        elif sid == 0:
            normals[idx, 1] = 1.0
            albedo[idx] = spec.surfaces[0](p)
        else:  # sky dome: gradient with clouds, emissive
            up = np.clip(p[:, 1] / spec.dome_radius, 0, 1)[:, None]
            sky = spec.sky[0] + (spec.sky[1] - spec.sky[0]) * np.sqrt(up)
            clouds = spec.surfaces[1]
            cloud = np.clip(fractal_noise(p * clouds.frequency, clouds.seed) * 2 - 0.9, 0, 1)
            albedo[idx] = sky + (1.0 - sky) * cloud[:, None] * 0.8
            emissive[idx] = True

    shading = np.full(len(points), spec.ambient, dtype=np.float32)
    if spec.kind == "room":
        to_light = spec.light.astype(np.float32) - points
        distance = np.sqrt(_rowdot(to_light, to_light)).clip(1e-6)
        lambert = _rowdot(normals, to_light) / distance
        falloff = 1.0 / (1.0 + (distance / spec.light_range) ** 2)
        lit = np.nonzero(lambert > 0)[0]
        start = points[lit] + 1e-3 * normals[lit]
        visible = ~_occluded(spec, start, spec.light.astype(np.float32) - start, point_light=True)
        shading[lit] += spec.intensity * 1.6 * lambert[lit] * falloff[lit] * visible
    else:
        lambert = _dot(normals, spec.light)
        lit = np.nonzero((lambert > 0) & ~emissive)[0]
        start = points[lit] + 1e-3 * normals[lit]
        visible = ~_occluded(spec, start, spec.light.astype(np.float32), point_light=False)
        shading[lit] += spec.intensity * lambert[lit] * visible
        shading[emissive] = 1.0
    return np.clip(albedo * shading[:, None], 0.0, 1.0)


def _rays(spec: SceneSpec, views: np.ndarray, uv: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """World rays through normalised image points ``uv [N, 2]`` of views ``views [N]``.

    Returns:
        Origins and directions ``[N, 3]``; directions have camera-frame z = 1, so the ray
        parameter of a hit is its z-depth.
    """
    k = spec.intrinsics
    d_cam = np.stack(
        [(uv[:, 0] - k[0, 2]) / k[0, 0], (uv[:, 1] - k[1, 2]) / k[1, 1], np.ones(len(uv))], axis=1
    ).astype(np.float32)  # [N, 3]
    dirs = np.empty_like(d_cam)
    starts = np.searchsorted(views, np.arange(len(spec.extrinsics) + 1))
    for view in range(len(spec.extrinsics)):
        first, last = starts[view], starts[view + 1]
        dirs[first:last] = _mul(d_cam[first:last], spec.extrinsics[view, :3, :3].T)
    origins = spec.extrinsics[:, :3, 3].astype(np.float32)[views]
    return origins, dirs


def _trace(spec: SceneSpec, views: np.ndarray, uv: np.ndarray) -> tuple[np.ndarray, ...]:
    """Cast and shade rays: colour ``[N, 3]``, depth ``[N]`` and surface id ``[N]``."""
    origins, dirs = _rays(spec, views, uv)
    t, surface = _cast(spec, origins, dirs, views, uv)
    return _shade(spec, origins, dirs, t, surface), t, surface


EDGE_CONTRAST = 0.06


def render_scene(
    spec: SceneSpec, resolution: int, supersample: int = 2
) -> tuple[np.ndarray, np.ndarray]:
    """Ray-cast all views of a scene.

    One ray per pixel centre gives the depth and the colour; pixels on a silhouette (a neighbour
    sees another surface) or at a colour edge (contrast above ``EDGE_CONTRAST``) are re-rendered
    with ``supersample x supersample`` rays and averaged (adaptive anti-aliasing).

    Returns:
        Images uint8 ``[V, R, R, 3]`` and pixel-centre z-depth float32 ``[V, R, R]``.
    """
    num_views, n = len(spec.extrinsics), resolution
    view_ids, rows, cols = np.meshgrid(
        np.arange(num_views), np.arange(n), np.arange(n), indexing="ij"
    )
    views = view_ids.reshape(-1)
    uv = np.stack([(cols.reshape(-1) + 0.5) / n, (rows.reshape(-1) + 0.5) / n], axis=1)
    color, depth, surface = _trace(spec, views, uv)
    color = color.reshape(num_views, n, n, 3)
    surface = surface.reshape(num_views, n, n)
    if supersample > 1:
        edge = np.zeros((num_views, n, n), dtype=bool)
        for axis in (1, 2):
            step = [slice(None)] * 3
            before, after = list(step), list(step)
            before[axis], after[axis] = slice(None, -1), slice(1, None)
            differs = surface[tuple(before)] != surface[tuple(after)]
            delta = np.abs(color[tuple(before)] - color[tuple(after)])
            contrast = np.maximum(np.maximum(delta[..., 0], delta[..., 1]), delta[..., 2])
            differs |= contrast > EDGE_CONTRAST
            edge[tuple(before)] |= differs
            edge[tuple(after)] |= differs
        v_idx, r_idx, c_idx = np.nonzero(edge)
        if len(v_idx):
            offsets = (np.arange(supersample) + 0.5) / supersample
            oy, ox = np.meshgrid(offsets, offsets, indexing="ij")
            count = supersample * supersample
            sub_views = np.repeat(v_idx, count)
            sub_uv = np.stack(
                [
                    (np.repeat(c_idx, count) + np.tile(ox.reshape(-1), len(c_idx))) / n,
                    (np.repeat(r_idx, count) + np.tile(oy.reshape(-1), len(r_idx))) / n,
                ],
                axis=1,
            )
            sub_color, _, _ = _trace(spec, sub_views, sub_uv)
            color[v_idx, r_idx, c_idx] = sub_color.reshape(-1, count, 3).mean(axis=1)
    images = np.round(color * 255).astype(np.uint8)  # [V, R, R, 3]
    return images, depth.reshape(num_views, n, n)


# ----------------------------------------------------------------------------- dataset


def scene_key(split: str, index: int) -> str:
    """Key of scene ``index`` of a split."""
    return f"syn_{split}_{index:06d}"


def depth_fits(
    extrinsics: np.ndarray,
    depth: np.ndarray,
    gaps: tuple[int, int] = GUARANTEED_GAPS,
    depth_range: tuple[float, float] = SCENE_DEPTH_RANGE,
) -> bool:
    """Whether every pixel's depth, divided by the distance between any two frames ``gaps``
    apart, lies in ``depth_range`` (so the scene-frame depth of any such context pair does).

    Args:
        extrinsics: ``[V, 4, 4]`` camera-to-world.
        depth: ``[V, H, W]`` z-depth.
        gaps: ``(min, max)`` frame gap; the minimum is lowered to ``V - 1`` for short scenes.
        depth_range: ``(near, far)`` in scene-frame units.
    """
    centers = extrinsics[:, :3, 3]
    views = len(centers)
    distances = np.linalg.norm(centers[:, None] - centers[None], axis=-1)  # [V, V]
    gap = np.abs(np.arange(views)[:, None] - np.arange(views)[None])
    low = min(gaps[0], views - 1)
    shortest = distances[(gap >= low) & (gap <= gaps[1])].min()
    longest = distances[(gap >= 1) & (gap <= gaps[1])].max()
    if shortest <= 0:
        return False
    return bool(
        depth.min() / longest >= depth_range[0] and depth.max() / shortest <= depth_range[1]
    )


def generate_scene(split: str, index: int, settings: SyntheticSettings) -> dict:
    """Generate one scene as a chunk-format dict of NumPy arrays and bytes.

    Returns:
        ``key, url, timestamps [V] int64, cameras [V, 18] float32, images (JPEG bytes),
        depths (16-bit PNG bytes), depth_scale``.
    """
    entropy = [settings.seed, SPLIT_CODES[split], index]
    for attempt in range(MAX_ATTEMPTS):  # resample (deterministically) until depths fit
        spec = sample_scene(entropy + ([attempt] if attempt else []), settings.kind, settings.views)
        images, depth = render_scene(spec, settings.resolution, settings.supersample)
        if depth_fits(spec.extrinsics, depth):
            break
    encoded = []
    for image in images:
        buffer = io.BytesIO()
        Image.fromarray(image).save(buffer, format="JPEG", quality=95, subsampling=0)
        encoded.append(buffer.getvalue())
    depths, depth_scale = encode_depths(depth)
    w2c = np.linalg.inv(spec.extrinsics)  # [V, 4, 4]
    k = spec.intrinsics
    head = np.array([k[0, 0], k[1, 1], k[0, 2], k[1, 2], 0.0, 0.0])
    cameras = np.concatenate(
        [np.tile(head, (settings.views, 1)), w2c[:, :3, :4].reshape(settings.views, 12)], axis=1
    )
    return {
        "key": scene_key(split, index),
        "url": f"synthetic://{settings.kind}/seed={settings.seed}/{split}/{index}",
        "timestamps": np.arange(settings.views, dtype=np.int64) * 33_333,
        "cameras": cameras.astype(np.float32),
        "images": encoded,
        "depths": depths,
        "depth_scale": float(depth_scale),
    }


def evaluation_entry(index: int, settings: SyntheticSettings) -> dict | None:
    """Evaluation views of test scene ``index``: 2 context views and up to 3 targets between."""
    views = settings.views
    if views < 3:
        return None
    rng = np.random.default_rng(
        np.random.SeedSequence([settings.seed, SPLIT_CODES["test"], index, 1])
    )
    low = max(2, round(0.4 * (views - 1)))
    high = max(low, round(0.7 * (views - 1)))
    gap = int(rng.integers(low, high + 1))
    start = int(rng.integers(0, views - gap))
    targets = rng.choice(np.arange(start + 1, start + gap), size=min(3, gap - 1), replace=False)
    return {"context": [start, start + gap], "target": sorted(int(i) for i in targets)}


def _task(args: tuple[str, int, SyntheticSettings]) -> dict:
    return generate_scene(*args)


_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def _worker_init() -> None:
    """Give a generator worker the default SIGTERM action and let Ctrl-C reach only the parent.

    A forked worker inherits the parent's handlers (``OutputFolder``'s SIGTERM-as-exit,
    ``stopped_cleanly``'s, Lightning's SIGTERM "bypass" that only logs); with those,
    ``Pool.terminate`` could not end a worker blocked on the task queue's lock, and the parent
    waited on it forever.
    """
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)


def _worker_pool(workers: int) -> multiprocessing.pool.Pool:
    """A pool whose workers start with SIGTERM/SIGINT blocked until :func:`_worker_init` has
    reset their handlers (no window in which an inherited handler runs in a worker)."""
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        return multiprocessing.get_context("fork").Pool(workers, initializer=_worker_init)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def _to_chunk_scene(scene: dict) -> dict:
    import torch

    from datamodules.readers.chunk_writer import encode_bytes

    return {
        "key": scene["key"],
        "url": scene["url"],
        "timestamps": torch.from_numpy(scene["timestamps"]),
        "cameras": torch.from_numpy(scene["cameras"]),
        "images": [encode_bytes(b) for b in scene["images"]],
        "depths": [encode_bytes(b) for b in scene["depths"]],
        "depth_scale": scene["depth_scale"],
    }


def is_complete(root: str | Path) -> bool:
    """Whether ``root`` holds a finished synthetic dataset."""
    root = Path(root)
    return (root / "metadata.json").is_file() and all(
        (root / split / "index.json").is_file() for split in ("train", "test")
    )


def generate_dataset(
    out: str | Path,
    settings: SyntheticSettings | None = None,
    workers: int = 1,
    chunk_mb: float = 2.0,
    progress: bool = True,
    overwrite: bool = False,
) -> Path:
    """Generate a synthetic chunk dataset into ``out`` (written under a temporary name first).

    Args:
        out: output folder; must not exist or be empty unless ``overwrite``.
        settings: what to generate.
        workers: processes generating scenes in parallel.
        chunk_mb: approximate chunk size (image bytes).
        progress: show a tqdm progress bar.
        overwrite: replace an existing non-empty ``out``.

    Returns:
        The output folder.
    """
    settings = settings or SyntheticSettings()
    settings.validate()
    out = Path(out)
    folder = OutputFolder(out, "datamodules.synthetic", overwrite=overwrite)
    sizes = settings.split_sizes()
    tasks = [(split, i, settings) for split in ("train", "test") for i in range(sizes[split])]
    try:
        with folder as tmp:
            _generate_into(tmp, settings, sizes, tasks, workers, chunk_mb, progress)
    except OutputFolderError:
        if not overwrite and is_complete(out):  # another process finished first
            return out
        raise
    return out


def _generate_into(
    tmp: Path,
    settings: SyntheticSettings,
    sizes: dict[str, int],
    tasks: list,
    workers: int,
    chunk_mb: float,
    progress: bool,
) -> None:
    from tqdm import tqdm

    from datamodules.readers.chunk_writer import ChunkWriter

    writers = {split: ChunkWriter(tmp, split, chunk_mb=chunk_mb) for split in sizes}
    pool = _worker_pool(workers) if workers > 1 else None  # forked before tqdm starts a thread
    bar = tqdm(
        total=len(tasks),
        desc=f"synthetic {settings.kind} scenes",
        unit="scene",
        disable=not progress,
        dynamic_ncols=True,
    )
    if pool is not None:
        try:
            for scene in pool.imap(_task, tasks, chunksize=4):
                writers[scene["key"].split("_")[1]].add(_to_chunk_scene(scene))
                bar.update()
            pool.close()  # workers take their end-of-work sentinel and exit by themselves
        except BaseException:
            pool.terminate()  # SIGTERM: the workers' default action ends them at once
            raise
        finally:
            pool.join()
    else:
        for task in tasks:
            scene = _task(task)
            writers[task[0]].add(_to_chunk_scene(scene))
            bar.update()
    bar.close()
    for split, writer in writers.items():
        writer.close()
        if sizes[split] == 0:  # an empty split still gets an (empty) index
            (tmp / split).mkdir(parents=True, exist_ok=True)
            (tmp / split / "index.json").write_text("{}", encoding="utf-8")
    index = {scene_key("test", i): evaluation_entry(i, settings) for i in range(sizes["test"])}
    (tmp / "evaluation_index.json").write_text(json.dumps(index), encoding="utf-8")
    (tmp / "metadata.json").write_text(json.dumps(asdict(settings), indent=2), encoding="utf-8")


def ensure_synthetic(
    root: str | Path, settings: SyntheticSettings, workers: int = 1, progress: bool = True
) -> Path:
    """Generate the dataset at ``root`` unless a complete one is there.

    An existing dataset generated with another kind, resolution, view count, seed, supersampling
    or format version is an error (use another root); other differences (scene count) only warn.
    """
    root = Path(root)
    if is_complete(root):
        try:
            stored = json.loads((root / "metadata.json").read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as error:
            raise InputError(f"{root / 'metadata.json'}: unreadable ({error})") from error
        wanted = asdict(settings)
        different = {k: (stored.get(k), v) for k, v in wanted.items() if stored.get(k) != v}
        essential = {"kind", "resolution", "views", "seed", "supersample", "version"}
        if essential & set(different):
            raise InputError(
                f"{root}: holds synthetic data generated with other settings "
                f"(stored, requested: {different}); choose another root"
            )
        if different:
            log.warning(
                "%s: generated with different settings (stored, requested): %s", root, different
            )
        return root
    seconds = generation_seconds(settings, workers)
    print(  # before any training or evaluation progress bar: say what the wait is for
        f"generating the synthetic dataset into {root}: {settings.scenes} {settings.kind} scenes "
        f"(train and test) of {settings.views} views at {settings.resolution}x"
        f"{settings.resolution} px, about {_duration(seconds)} (first use only; later runs, "
        "training and evaluation, reuse it)",
        file=sys.stderr,
        flush=True,
    )
    return generate_dataset(root, settings, workers=workers, progress=progress)


# CPU seconds per scene of 24 views at 64² with 2x2 rays per pixel on an idle machine
# (docs/benchmarks.md, "Synthetic data generation": 198 ms); the time grows with rays.
SCENE_SECONDS = 0.2


def generation_seconds(settings: SyntheticSettings, workers: int = 1) -> float:
    """Estimated wall seconds of ``generate_dataset``: the scenes' rays at the measured rate,
    shared by the workers, slowed by the other load of the machine (its load average)."""
    cpus = os.cpu_count() or 1
    rays = settings.views * settings.resolution**2 * settings.supersample**2
    per_scene = SCENE_SECONDS * rays / (24 * 64**2 * 4)
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = 0.0
    parallel = max(1, min(workers, cpus))
    return settings.scenes * per_scene / parallel * max(1.0, (load + parallel) / cpus)


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def main(argv: list[str] | None = None) -> int:
    """Command line entry point."""
    parser = argparse.ArgumentParser(
        prog="python -m datamodules.synthetic", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--scenes", type=int, default=1000, help="total scenes (train + test)")
    parser.add_argument("--resolution", type=int, default=64, help="image side in pixels")
    parser.add_argument("--views", type=int, default=24, help="frames per scene")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kind", choices=["room", "object"], default="room")
    parser.add_argument("--workers", type=int, default=1, help="parallel processes")
    parser.add_argument("--test-fraction", type=float, default=0.1, help="share of test scenes")
    parser.add_argument("--supersample", type=int, default=2, help="rays per pixel per axis")
    parser.add_argument("--chunk-mb", type=float, default=2.0, help="approximate chunk size")
    parser.add_argument("--overwrite", action="store_true", help="replace a non-empty --out")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    settings = SyntheticSettings(
        scenes=args.scenes,
        resolution=args.resolution,
        views=args.views,
        seed=args.seed,
        kind=args.kind,
        test_fraction=args.test_fraction,
        supersample=args.supersample,
    )
    start = time.perf_counter()
    try:
        settings.validate()
        out = generate_dataset(
            args.out,
            settings,
            workers=max(1, args.workers),
            chunk_mb=args.chunk_mb,
            progress=not args.quiet,
            overwrite=args.overwrite,
        )
    except (ValueError, OSError) as error:  # an InputError, or the chunk writer's chunk_mb
        print(f"error: {error}", file=sys.stderr)
        return 2
    sizes = settings.split_sizes()
    print(
        f"wrote {sizes['train']} train + {sizes['test']} test scenes to {out} "
        f"in {time.perf_counter() - start:.1f} s"
    )
    return 0


if __name__ == "__main__":
    from models.command_line import stopped_cleanly

    with stopped_cleanly("datamodules.synthetic"):
        sys.exit(main())
