"""Analytic ray casting of the synthetic scenes with NumPy (all pixels of all views at once, never
the Gaussian renderer): intersections, shadows, Lambertian shading and adaptive anti-aliasing
(``render_scene``)."""

from __future__ import annotations

import numpy as np

from datamodules.synthetic_scenes import EPS, ROOM_FACES, SceneSpec, dot, fractal_noise, mul, rowdot

__all__ = ["render_scene"]


# ----------------------------------------------------------------------------- ray casting


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
            b = rowdot(origins, dirs)
            a = rowdot(dirs, dirs)
            c = rowdot(origins, origins) - np.float32(spec.dome_radius**2)
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
        distance = np.sqrt(rowdot(from_light, from_light)).clip(1e-6)
        unit = from_light / distance[:, None]
    else:
        sun = spec.light.astype(np.float32)
        e1 = np.cross(sun, [0.0, 0.0, 1.0] if abs(sun[2]) < 0.9 else [1.0, 0.0, 0.0])
        e1 = (e1 / np.linalg.norm(e1)).astype(np.float32)
        e2 = np.cross(sun, e1).astype(np.float32)
        plane = np.stack([dot(points, e1), dot(points, e2)], axis=1)  # [M, 2]
        height = dot(points, sun)
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
                inside = dot(unit, offset / reach) >= cos_cone - 1e-4
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
        distance = np.sqrt(rowdot(to_light, to_light)).clip(1e-6)
        lambert = rowdot(normals, to_light) / distance
        falloff = 1.0 / (1.0 + (distance / spec.light_range) ** 2)
        lit = np.nonzero(lambert > 0)[0]
        start = points[lit] + 1e-3 * normals[lit]
        visible = ~_occluded(spec, start, spec.light.astype(np.float32) - start, point_light=True)
        shading[lit] += spec.intensity * 1.6 * lambert[lit] * falloff[lit] * visible
    else:
        lambert = dot(normals, spec.light)
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
        dirs[first:last] = mul(d_cam[first:last], spec.extrinsics[view, :3, :3].T)
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
