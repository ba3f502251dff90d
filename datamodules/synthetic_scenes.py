"""The synthetic scenes of ``datamodules.synthetic``: procedural solid textures, the primitives and
the random room/object scenes with their camera paths (``sample_scene``)."""

from __future__ import annotations

import colorsys
from dataclasses import dataclass, field

import numpy as np

__all__ = ["Primitive", "SceneSpec", "Texture", "sample_scene"]

EPS = 1e-4
ROOM_FACES = 6  # surface ids 0..5: x-, x+, floor, ceiling, z-, z+ (object kind: 0 ground, 1 sky)


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
            wave = np.sin(2 * np.pi * dot(q, self.direction))
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


def mul(vectors: np.ndarray, matrix: np.ndarray) -> np.ndarray:
    """``vectors [M, 3] @ matrix [3, 3]`` without BLAS (much faster for tall, thin arrays)."""
    m = matrix.astype(vectors.dtype)
    return vectors[:, 0:1] * m[0] + vectors[:, 1:2] * m[1] + vectors[:, 2:3] * m[2]


def dot(vectors: np.ndarray, vector: np.ndarray) -> np.ndarray:
    """``vectors [M, 3] @ vector [3]`` without BLAS."""
    v = vector.astype(vectors.dtype)
    return vectors[:, 0] * v[0] + vectors[:, 1] * v[1] + vectors[:, 2] * v[2]


def rowdot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise dot products of ``[M, 3]`` arrays."""
    return a[:, 0] * b[:, 0] + a[:, 1] * b[:, 1] + a[:, 2] * b[:, 2]


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
                a = rowdot(dirs, dirs)
                b = rowdot(oc, dirs)
                c = rowdot(oc, oc) - np.float32(self.size[0] ** 2)
                disc = b * b - a * c
                t = (-b - np.sqrt(np.maximum(disc, 0))) / a
                return np.where((disc > 0) & (t > EPS), t, np.inf)
            if self.kind == "box":
                rotation = _rot_y(self.yaw)
                o_local, d_local = mul(oc, rotation), mul(dirs, rotation)
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
            p = mul(local, rotation)
            axis = np.abs(p / self.size).argmax(axis=1)
            n_local = np.zeros_like(p)
            rows = np.arange(len(p))
            n_local[rows, axis] = np.sign(p[rows, axis])
            return mul(n_local, rotation.T)
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
        return mul(local, _rot_y(self.yaw)) if self.kind == "box" else local


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
