"""Tests of the renderer (``models.render``) and spherical harmonics (``models.core.sh``)."""

from __future__ import annotations

import math
import shutil
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from data_fixtures import garden_scene

from models.core.gaussians import Gaussians, rgb_to_sh
from models.core.sh import eval_sh
from models.geometry.cameras import invert_extrinsics
from models.render.core import render
from models.render.output import RenderOutput
from models.render.projection import project_gaussians

ALPHA_MIN = 1.0 / 255.0


def toolchain_present() -> bool:
    """A C++ compiler and ninja: what building the CPU rasteriser needs."""
    return shutil.which("c++") is not None and shutil.which("ninja") is not None


def cpu_backend_or_skip(dtype: torch.dtype = torch.float64) -> None:
    """Fail when ``backend="cpu"`` should build here but does not; skip only without a toolchain."""
    from models.render.cpu import cpu_rasterizer_error

    error = cpu_rasterizer_error(dtype)
    if error is not None:
        if toolchain_present():
            pytest.fail(f"a C++ compiler and ninja are here but backend='cpu' is not: {error}")
        pytest.skip(f"backend='cpu' is not available: {error}")


@pytest.fixture(params=["torch", "cpu"])
def backend(request) -> str:
    """The renderer tests run against the torch backend and the compiled CPU one."""
    if request.param == "cpu":
        cpu_backend_or_skip()
    return request.param


# ------------------------------------------------------------------------------ helpers
def random_gaussians(
    batch: int,
    num: int,
    degree: int = 0,
    dtype: torch.dtype = torch.float32,
    depth: tuple[float, float] = (2.0, 5.0),
    spread: float = 1.0,
    scale: tuple[float, float] = (0.03, 0.3),
    generator: torch.Generator | None = None,
) -> Gaussians:
    """Random anisotropic Gaussians in front of an identity camera."""
    g = generator if generator is not None else torch.Generator().manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return torch.rand(*shape, generator=g, dtype=dtype)

    z = depth[0] + (depth[1] - depth[0]) * rand(batch, num)
    xy = (rand(batch, num, 2) - 0.5) * 2 * spread * z[..., None] * 0.5
    means = torch.cat([xy, z[..., None]], dim=-1)
    log_lo, log_hi = math.log(scale[0]), math.log(scale[1])
    scales = torch.exp(log_lo + (log_hi - log_lo) * rand(batch, num, 3))
    rotations = F.normalize(torch.randn(batch, num, 4, generator=g, dtype=dtype), dim=-1)
    opacities = 0.05 + 0.9 * rand(batch, num)
    harmonics = 0.4 * torch.randn(batch, num, 3, (degree + 1) ** 2, generator=g, dtype=dtype)
    harmonics[..., 0] = rgb_to_sh(rand(batch, num, 3))
    return Gaussians(means, scales, rotations, opacities, harmonics)


def cameras(
    batch: int, views: int, dtype: torch.dtype = torch.float32, focal: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Camera-to-world poses near the identity, looking down +z, and normalised intrinsics."""
    extrinsics = torch.eye(4, dtype=dtype).repeat(batch, views, 1, 1)
    for v in range(views):
        angle = torch.tensor(0.08 * v, dtype=dtype)
        c, s = torch.cos(angle), torch.sin(angle)
        extrinsics[:, v, :3, :3] = torch.tensor([[c, 0, s], [0, 1, 0], [-s, 0, c]], dtype=dtype)
        extrinsics[:, v, :3, 3] = torch.tensor([0.15 * v, -0.05 * v, 0.1 * v], dtype=dtype)
    intrinsics = torch.tensor(
        [[focal, 0.0, 0.5], [0.0, focal * 1.1, 0.48], [0.0, 0.0, 1.0]], dtype=dtype
    )
    return extrinsics, intrinsics.repeat(batch, views, 1, 1)


def reference_render(
    gaussians: Gaussians,
    extrinsics: torch.Tensor,
    intrinsics: torch.Tensor,
    image_size: tuple[int, int],
    background: torch.Tensor | None = None,
    near: float = 0.01,
    far: float = 1e10,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Slow per-pixel reference: every pixel against every Gaussian, one Gaussian at a time.

    Written independently of ``models.render`` from gsplat's rules (classic mode). SH bases come
    from gsplat's own PyTorch implementation. Returns color [B,V,3,H,W], depth, alpha and
    stopped [B,V,H,W] (pixels that hit the transmittance stop).
    """
    from gsplat.cuda._torch_impl import _spherical_harmonics

    height, width = image_size
    batch, views = extrinsics.shape[:2]
    dtype = gaussians.means.dtype
    ys, xs = torch.meshgrid(
        torch.arange(height, dtype=dtype) + 0.5,
        torch.arange(width, dtype=dtype) + 0.5,
        indexing="ij",
    )
    px, py = xs.reshape(-1), ys.reshape(-1)  # [H*W]
    colors_out = torch.zeros(batch, views, 3, height, width, dtype=dtype)
    depth_out = torch.zeros(batch, views, height, width, dtype=dtype)
    alpha_out = torch.zeros(batch, views, height, width, dtype=dtype)
    stopped = torch.zeros(batch, views, height, width, dtype=torch.bool)
    degree = math.isqrt(gaussians.harmonics.shape[-1]) - 1
    for b in range(batch):
        valid_entries = gaussians.valid_mask()[b]
        for v in range(views):
            view = torch.linalg.inv(extrinsics[b, v])
            fx = intrinsics[b, v, 0, 0].item() * width
            fy = intrinsics[b, v, 1, 1].item() * height
            cx = intrinsics[b, v, 0, 2].item() * width
            cy = intrinsics[b, v, 1, 2].item() * height
            bg = torch.zeros(3, dtype=dtype) if background is None else background[b, v]
            records = []
            for i in range(gaussians.means.shape[1]):
                if not valid_entries[i]:
                    continue
                mean = gaussians.means[b, i]
                x, y, z = view[:3, :3] @ mean + view[:3, 3]
                if z < near or z > far:
                    continue
                opacity = gaussians.opacities[b, i]
                if opacity < ALPHA_MIN:
                    continue
                w, qx, qy, qz = gaussians.rotations[b, i] / gaussians.rotations[b, i].norm()
                rot = torch.stack(
                    [
                        torch.stack([1 - 2 * (qy**2 + qz**2), 2 * (qx * qy - w * qz), 2 * (qx * qz + w * qy)]),
                        torch.stack([2 * (qx * qy + w * qz), 1 - 2 * (qx**2 + qz**2), 2 * (qy * qz - w * qx)]),
                        torch.stack([2 * (qx * qz - w * qy), 2 * (qy * qz + w * qx), 1 - 2 * (qx**2 + qy**2)]),
                    ]
                )  # fmt: skip
                cov = rot @ torch.diag(gaussians.scales[b, i] ** 2) @ rot.T
                cov_cam = view[:3, :3] @ cov @ view[:3, :3].T
                tan_x, tan_y = 0.5 * width / fx, 0.5 * height / fy
                lim_x = (cx / fx + 0.3 * tan_x, (width - cx) / fx + 0.3 * tan_x)
                lim_y = (cy / fy + 0.3 * tan_y, (height - cy) / fy + 0.3 * tan_y)
                tx = z * torch.clamp(x / z, -lim_x[0], lim_x[1])
                ty = z * torch.clamp(y / z, -lim_y[0], lim_y[1])
                zero = torch.zeros((), dtype=dtype)
                jac = torch.stack(
                    [
                        torch.stack([fx / z, zero, -fx * tx / z**2]),
                        torch.stack([zero, fy / z, -fy * ty / z**2]),
                    ]
                )
                cov2d = jac @ cov_cam @ jac.T + 0.3 * torch.eye(2, dtype=dtype)
                conic = torch.linalg.inv(cov2d)
                centre = torch.stack([fx * x / z + cx, fy * y / z + cy])
                direction = mean - extrinsics[b, v, :3, 3]
                sh = _spherical_harmonics(degree, direction, gaussians.harmonics[b, i].T)
                color = torch.clamp_min(sh + 0.5, 0.0)
                records.append((z, i, centre, conic, opacity, color))
            records.sort(key=lambda r: (r[0].item(), r[1]))
            trans = torch.ones(height * width, dtype=dtype)
            done = torch.zeros(height * width, dtype=torch.bool)
            acc = torch.zeros(height * width, 4, dtype=dtype)
            for z, _, centre, conic, opacity, color in records:
                dx, dy = centre[0] - px, centre[1] - py
                sigma = (
                    0.5 * (conic[0, 0] * dx * dx + conic[1, 1] * dy * dy) + conic[0, 1] * dx * dy
                )
                alpha = torch.clamp_max(opacity * torch.exp(-sigma), 0.999)
                skip = (sigma < 0) | (alpha < ALPHA_MIN) | done
                next_trans = trans * (1 - alpha)
                stop = ~skip & (next_trans <= 1e-4)
                done = done | stop
                use = ~skip & ~stop
                weight = torch.where(use, alpha * trans, 0.0)
                acc = acc + weight[:, None] * torch.cat([color, z[None]])
                trans = torch.where(use, next_trans, trans)
            colors_out[b, v] = (acc[:, :3] + trans[:, None] * bg).T.reshape(3, height, width)
            depth_out[b, v] = acc[:, 3].reshape(height, width)
            alpha_out[b, v] = (1 - trans).reshape(height, width)
            stopped[b, v] = done.reshape(height, width)
    return colors_out, depth_out, alpha_out, stopped


def max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


# ------------------------------------------------------------------------------ SH
@pytest.mark.parametrize("degree", [0, 1, 2, 3, 4])
def test_sh_matches_gsplat(degree: int):
    from gsplat.cuda._torch_impl import _spherical_harmonics

    coeffs = torch.randn(50, 3, (degree + 1) ** 2, dtype=torch.float64)
    dirs = torch.randn(50, 3, dtype=torch.float64) * 3.0
    expected = _spherical_harmonics(degree, dirs, coeffs.transpose(-1, -2))
    assert max_abs(eval_sh(coeffs, dirs), expected) < 1e-12


def test_sh_sign_convention():
    # Y_1 = -C1 y, Y_2 = C1 z, Y_3 = -C1 x (gsplat / INRIA 3DGS).
    coeffs = torch.zeros(3, 4)
    coeffs[0, 1], coeffs[1, 2], coeffs[2, 3] = 1.0, 1.0, 1.0
    c1 = 0.48860251190292
    assert torch.allclose(eval_sh(coeffs, torch.tensor([0.0, 2.0, 0.0])), torch.tensor([-c1, 0, 0]))
    assert torch.allclose(eval_sh(coeffs, torch.tensor([0.0, 0.0, 5.0])), torch.tensor([0, c1, 0]))
    assert torch.allclose(eval_sh(coeffs, torch.tensor([1.0, 0.0, 0.0])), torch.tensor([0, 0, -c1]))
    with pytest.raises(ValueError, match="harmonics"):
        eval_sh(torch.zeros(3, 5), torch.ones(3))


# ------------------------------------------------------------------------------ (a) closed form
def single_gaussian(mean, scale, opacity, rgb, dtype=torch.float64) -> Gaussians:
    return Gaussians(
        means=torch.tensor([[mean]], dtype=dtype),
        scales=torch.full((1, 1, 3), scale, dtype=dtype),
        rotations=torch.tensor([[[1.0, 0.0, 0.0, 0.0]]], dtype=dtype),
        opacities=torch.tensor([[opacity]], dtype=dtype),
        harmonics=rgb_to_sh(torch.tensor(rgb, dtype=dtype))[None, None, :, None],
    )


@pytest.mark.parametrize(
    ("eps2d", "mode"), [(0.3, "classic"), (0.1, "classic"), (0.1, "antialiased"), (0.0, "classic")]
)
def test_single_isotropic_gaussian_closed_form(backend, eps2d: float, mode: str):
    height, width, f, z, s, o = 24, 40, 30.0, 2.0, 0.1, 0.7
    g = single_gaussian([0.0, 0.0, z], s, o, [0.9, 0.2, 0.4])
    extrinsics = torch.eye(4, dtype=torch.float64)[None, None]
    # Principal point at pixel (17.3, 9.6), focal length f pixels.
    intrinsics = torch.tensor(
        [[[[f / width, 0, 17.3 / width], [0, f / height, 9.6 / height], [0, 0, 1]]]],
        dtype=torch.float64,
    )
    bg = torch.tensor([0.1, 0.3, 0.5], dtype=torch.float64)
    kwargs = {} if (eps2d, mode) == (0.3, "classic") else {"eps2d": eps2d, "rasterize_mode": mode}
    out = render(g, extrinsics, intrinsics, (height, width), bg, backend, **kwargs)
    variance = (f * s / z) ** 2 + eps2d  # isotropic 2D covariance with gsplat's blur
    if mode == "antialiased":  # opacity times sqrt(det(S) / det(S + eps2d I))
        o = o * (f * s / z) ** 2 / variance
    for row, col in [(9, 17), (10, 18), (9, 20), (5, 12), (12, 23), (0, 0), (20, 35)]:
        d2 = (col + 0.5 - 17.3) ** 2 + (row + 0.5 - 9.6) ** 2
        alpha = o * math.exp(-0.5 * d2 / variance)
        alpha = alpha if alpha >= 1 / 255 else 0.0
        assert out.alpha[0, 0, row, col].item() == pytest.approx(alpha, abs=1e-12)
        assert out.depth[0, 0, row, col].item() == pytest.approx(alpha * z, abs=1e-12)
        expected = alpha * torch.tensor([0.9, 0.2, 0.4], dtype=torch.float64) + (1 - alpha) * bg
        assert max_abs(out.color[0, 0, :, row, col], expected) < 1e-12
    assert out.alpha[0, 0, 0, 0] == 0 and out.alpha[0, 0, 9, 17] > 0.6
    # gsplat's opacity-aware box: half-size ceil(sqrt(2 ln(255 o)) * sqrt(var)).
    radius = math.ceil(math.sqrt(2 * math.log(255 * o)) * math.sqrt(variance))
    assert out.radii[0, 0, 0].tolist() == [radius, radius]
    assert out.means2d[0, 0, 0].tolist() == pytest.approx([17.3, 9.6])


def test_alpha_clamp_and_transmittance_stop(backend):
    # Two nearly opaque Gaussians centred on pixel (15, 15): alpha clamps at 0.999; the second
    # would take T to 1e-6 <= 1e-4, so it is not composited and the pixel stops (gsplat's
    # exclusive rule). Pixels far from the centre composite both.
    front = single_gaussian([0.0, 0.0, 2.0], 0.2, 0.99995, [1.0, 0.0, 0.0])
    back = single_gaussian([0.0, 0.0, 3.0], 0.3, 0.99995, [0.0, 1.0, 0.0])
    g = front + back
    extrinsics = torch.eye(4, dtype=torch.float64)[None, None]
    c = 15.5 / 32
    intrinsics = torch.tensor([[[[1.0, 0, c], [0, 1.0, c], [0, 0, 1]]]], dtype=torch.float64)
    bg = torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64)
    out = render(g, extrinsics, intrinsics, (32, 32), background=bg, backend=backend)
    assert out.alpha[0, 0, 15, 15].item() == pytest.approx(0.999, abs=1e-12)
    expected = torch.tensor([0.999, 0.0, 0.001], dtype=torch.float64)
    assert max_abs(out.color[0, 0, :, 15, 15], expected) < 1e-12
    assert out.depth[0, 0, 15, 15].item() == pytest.approx(0.999 * 2.0, abs=1e-12)
    # Pixel (15, 25): 10 px off-centre, both Gaussians composite (T stays above 1e-4).
    var_front, var_back = (32 * 0.2 / 2) ** 2 + 0.3, (32 * 0.3 / 3) ** 2 + 0.3
    a1 = 0.99995 * math.exp(-0.5 * 100 / var_front)
    a2 = 0.99995 * math.exp(-0.5 * 100 / var_back)
    assert (1 - a1) * (1 - a2) > 1e-4
    expected = torch.tensor([a1, (1 - a1) * a2, (1 - a1) * (1 - a2)], dtype=torch.float64)
    assert max_abs(out.color[0, 0, :, 15, 25], expected) < 1e-12
    assert out.alpha[0, 0, 15, 25].item() == pytest.approx(1 - (1 - a1) * (1 - a2), abs=1e-12)


# ------------------------------------------------------------------------------ (b) reference
@pytest.mark.parametrize(
    ("batch", "views", "num", "degree", "shape", "masked"),
    [
        (1, 1, 40, 0, (37, 53), False),
        (2, 2, 60, 3, (40, 36), True),
    ],
)
def test_tiled_matches_per_pixel_reference(batch, views, num, degree, shape, masked, backend):
    g = random_gaussians(batch, num, degree=degree, dtype=torch.float64, spread=0.9)
    if masked:
        g.mask = torch.rand(batch, num, generator=torch.Generator().manual_seed(3)) > 0.3
        g.means[~g.mask] = float("nan")  # invalid entries may hold anything
        g.harmonics[~g.mask] = float("nan")
    extrinsics, intrinsics = cameras(batch, views, torch.float64)
    bg = torch.rand(batch, views, 3, dtype=torch.float64)
    out = render(g, extrinsics, intrinsics, shape, background=bg, backend=backend, chunk=8)
    color, depth, alpha, _ = reference_render(g, extrinsics, intrinsics, shape, background=bg)
    assert alpha.max() > 0.9  # overlapping Gaussians: some pixels are nearly opaque
    assert max_abs(out.color, color) <= 1e-5
    assert max_abs(out.depth, depth) <= 1e-5
    assert max_abs(out.alpha, alpha) <= 1e-5


def test_tiled_matches_reference_float32_with_saturation(backend):
    # Many overlapping opaque Gaussians: pixels saturate, so early termination and the
    # transmittance stop are exercised across chunks; float32 as in training.
    g = random_gaussians(1, 150, degree=1, spread=0.3, scale=(0.2, 0.5))
    g.opacities = 0.6 + 0.39 * g.opacities
    extrinsics, intrinsics = cameras(1, 1)
    out = render(g, extrinsics, intrinsics, (48, 40), backend=backend, chunk=4)
    color, depth, alpha, stopped = reference_render(g, extrinsics, intrinsics, (48, 40))
    assert stopped.float().mean() > 0.25  # a good share of pixels hit the transmittance stop
    assert max_abs(out.color, color) <= 1e-5
    assert max_abs(out.depth, depth) <= 1e-5 * depth.abs().max().item()
    assert max_abs(out.alpha, alpha) <= 1e-5


def test_chunking_does_not_change_the_result():
    g = random_gaussians(1, 300, degree=2)
    extrinsics, intrinsics = cameras(1, 2)
    a = render(g, extrinsics, intrinsics, (50, 70), backend="torch", chunk=64)
    b = render(g, extrinsics, intrinsics, (50, 70), backend="torch", chunk=3, max_elements=3000)
    assert max_abs(a.color, b.color) < 1e-6 and max_abs(a.alpha, b.alpha) < 1e-6


@pytest.mark.parametrize("tile_size", [8, 5])
def test_tile_size_does_not_change_the_result(backend, tile_size):
    g = random_gaussians(1, 200, degree=1)
    extrinsics, intrinsics = cameras(1, 1)
    a = render(g, extrinsics, intrinsics, (45, 61), backend=backend)
    b = render(g, extrinsics, intrinsics, (45, 61), backend=backend, tile_size=tile_size)
    assert max_abs(a.color, b.color) < 1e-6 and max_abs(a.depth, b.depth) < 1e-5


def test_near_and_far_planes_per_view(backend):
    g = random_gaussians(1, 100, depth=(1.0, 6.0))
    extrinsics, intrinsics = cameras(1, 2)
    near = torch.tensor([[0.01, 3.0]])
    far = torch.tensor([[4.0, 1e10]])
    both = render(g, extrinsics, intrinsics, (24, 24), near=near, far=far, backend=backend)
    for v in range(2):
        one = render(
            g,
            extrinsics[:, v : v + 1],
            intrinsics[:, v : v + 1],
            (24, 24),
            near=float(near[0, v]),
            far=float(far[0, v]),
            backend=backend,
        )
        assert max_abs(both.color[:, v : v + 1], one.color) < 1e-6
    full = render(g, extrinsics, intrinsics, (24, 24), backend=backend)
    assert max_abs(both.color, full.color) > 0.05  # the planes did cull something
    assert (
        both.depth[0, 1][both.alpha[0, 1] > 0.5] / both.alpha[0, 1][both.alpha[0, 1] > 0.5]
    ).min() > 2.5


def test_batch_equals_separate_scenes(backend):
    g = random_gaussians(2, 80, degree=1)
    extrinsics, intrinsics = cameras(2, 2)
    both = render(g, extrinsics, intrinsics, (30, 34), backend=backend)
    for b in range(2):
        one = render(g[b], extrinsics[b : b + 1], intrinsics[b : b + 1], (30, 34), backend=backend)
        assert max_abs(both.color[b : b + 1], one.color) < 1e-6
        assert max_abs(both.depth[b : b + 1], one.depth) < 1e-5


def test_masked_entries_never_render(backend):
    g = random_gaussians(1, 50, degree=1)
    g.mask = torch.arange(50)[None] % 3 != 0
    extrinsics, intrinsics = cameras(1, 1)
    masked = render(g, extrinsics, intrinsics, (32, 32), backend=backend)
    keep = g.mask[0]
    compact = Gaussians(
        g.means[:, keep], g.scales[:, keep], g.rotations[:, keep], g.opacities[:, keep],
        g.harmonics[:, keep],
    )  # fmt: skip
    reference = render(compact, extrinsics, intrinsics, (32, 32), backend=backend)
    assert max_abs(masked.color, reference.color) < 1e-6
    assert (masked.radii[0, 0, ~keep] == 0).all()


# ------------------------------------------------------------------------------ (c) gradients
def test_gradcheck_float64(backend):
    g = random_gaussians(1, 4, degree=1, dtype=torch.float64, spread=0.5, scale=(0.1, 0.25))
    g.opacities = 0.3 + 0.5 * g.opacities  # away from the 0.999 clamp
    extrinsics, intrinsics = cameras(1, 1, torch.float64, focal=0.8)
    bg = torch.tensor([0.2, 0.4, 0.6], dtype=torch.float64)

    def fn(means, scales, rotations, opacities, harmonics):
        out = render(
            Gaussians(means, scales, rotations, opacities, harmonics),
            extrinsics,
            intrinsics,
            (18, 20),
            background=bg,
            backend=backend,
            chunk=2,
        )
        return out.color, out.depth, out.alpha

    inputs = tuple(
        t.clone().requires_grad_(True)
        for t in (g.means, g.scales, g.rotations, g.opacities, g.harmonics)
    )
    color = fn(*inputs)[0]
    assert color.requires_grad
    # fast_mode checks a random projection of the full Jacobian (analytical vs finite
    # differences). The cpu backend's autograd.Function returns every gradient (no undefined
    # ones), so the undefined-grad check adds nothing either.
    assert torch.autograd.gradcheck(
        fn, inputs, eps=1e-6, atol=1e-6, rtol=1e-4, fast_mode=True, check_undefined_grad=False
    )


FIELDS = ("means", "scales", "rotations", "opacities", "harmonics")


def field_gradients(
    g: Gaussians, render_fn: Callable[[Gaussians], tuple[torch.Tensor, ...]]
) -> tuple[torch.Tensor, ...]:
    """Gradients w.r.t. each of ``FIELDS`` of ``sum(w * color) + sum(depth) + sum(alpha)`` (``w``
    a ramp over the colour's elements) of ``render_fn(g)``'s ``(color, depth, alpha)``."""
    params = {k: getattr(g, k).clone().requires_grad_(True) for k in FIELDS}
    color, depth, alpha = render_fn(Gaussians(**params))
    weight = torch.linspace(0.5, 1.5, color.numel(), dtype=color.dtype).reshape(color.shape)
    loss = (weight * color).sum() + depth.sum() + alpha.sum()
    return torch.autograd.grad(loss, list(params.values()))


@pytest.mark.parametrize(
    ("backend_name", "recompute"), [("torch", True), ("torch", False), ("cpu", True)]
)
def test_gradients_match_reference_with_saturation(backend_name: str, recompute: bool):
    if backend_name == "cpu":
        cpu_backend_or_skip()
    # Autograd through the masks (alpha skip, transmittance stop, early termination) must give
    # the gradient of what was composited: compare with autograd through the sequential reference.
    g = random_gaussians(1, 60, degree=1, dtype=torch.float64, spread=0.3, scale=(0.2, 0.5))
    g.opacities = 0.6 + 0.39 * g.opacities
    extrinsics, intrinsics = cameras(1, 1, torch.float64)

    def tiled(scene: Gaussians) -> tuple[torch.Tensor, ...]:
        out = render(
            scene, extrinsics, intrinsics, (24, 20), backend=backend_name, chunk=4,
            recompute=recompute,
        )  # fmt: skip
        return out.color, out.depth, out.alpha

    def reference(scene: Gaussians) -> tuple[torch.Tensor, ...]:
        color, depth, alpha, stopped = reference_render(scene, extrinsics, intrinsics, (24, 20))
        assert stopped.float().mean() > 0.15
        return color, depth, alpha

    grads = [field_gradients(g, tiled), field_gradients(g, reference)]
    for name, ours, ref in zip(FIELDS, *grads):
        assert torch.allclose(ours, ref, rtol=1e-6, atol=1e-9), name


def test_gradients_reach_every_parameter_and_are_finite(backend):
    g = random_gaussians(2, 60, degree=2, spread=0.6)
    g.mask = torch.ones(2, 60, dtype=torch.bool)
    g.mask[1, 40:] = False
    g.means[1, 50] = torch.tensor([0.0, 0.0, -3.0])  # behind the camera, masked or not
    g.means[0, 5] = torch.tensor([0.1, 0.0, -1.0])
    params = [g.means, g.scales, g.rotations, g.opacities, g.harmonics]
    for p in params:
        p.requires_grad_(True)
    extrinsics, intrinsics = cameras(2, 2)
    out = render(g, extrinsics, intrinsics, (40, 40), backend=backend)
    (out.color.sum() + out.depth.sum() + out.alpha.sum()).backward()
    for p in params:
        assert p.grad is not None and torch.isfinite(p.grad).all()
        assert p.grad.abs().sum() > 0
    assert (g.means.grad[1, 40:] == 0).all()  # masked entries get no gradient
    assert (g.means.grad[0, 5] == 0).all()


# ------------------------------------------------------------------------------ (d) projection
def test_projection_matches_gsplat_torch_impl():
    from gsplat.cuda._torch_impl import _fully_fused_projection, _quat_scale_to_covar_preci

    g = random_gaussians(2, 300, dtype=torch.float64, spread=1.6, depth=(-1.0, 6.0))
    extrinsics, intrinsics = cameras(2, 3, torch.float64)
    height, width = 45, 61
    ks = intrinsics.clone()
    ks[..., 0, :] *= width
    ks[..., 1, :] *= height
    views = invert_extrinsics(extrinsics)
    ours = project_gaussians(g.means, g.scales, g.rotations, views, ks, (height, width))
    covars, _ = _quat_scale_to_covar_preci(g.rotations, g.scales, compute_preci=False)
    radii, means2d, depths, conics, _ = _fully_fused_projection(
        g.means, covars, views, ks, width, height, eps2d=0.3, near_plane=0.01, far_plane=1e10
    )
    visible = (radii > 0).all(-1)
    assert visible.any() and (~visible).any()  # some culled: behind, too near, outside
    assert torch.equal(ours.valid, visible)
    assert torch.equal(ours.radii, radii)
    assert max_abs(ours.means2d[visible], means2d[visible]) < 1e-9
    assert max_abs(ours.conics[visible], conics[visible]) < 1e-9
    assert max_abs(ours.depths, depths) < 1e-12


# ------------------------------------------------------------------------------ (e) real scene
def garden_inputs(data_dir, scale_down: int):
    path = data_dir / "gsplat_test_garden.npz"
    if not path.is_file():
        pytest.skip(f"{path} not found")
    g, extrinsics, intrinsics, (height, width) = garden_scene(path)
    return g, extrinsics, intrinsics, (height // scale_down, width // scale_down)


def test_garden_scene_renders(shared_data, backend):
    g, extrinsics, intrinsics, shape = garden_inputs(shared_data, scale_down=4)
    out = render(g, extrinsics[:, :1], intrinsics[:, :1], shape, backend=backend)
    assert out.color.shape == (1, 1, 3, *shape)
    for t in (out.color, out.depth, out.alpha):
        assert torch.isfinite(t).all()
    assert (out.alpha > 0.5).float().mean() > 0.8
    assert out.color.std() > 0.05  # a textured image, not a flat colour
    assert (out.radii > 0).any(-1).sum() > 50_000


@pytest.mark.slow
def test_garden_scene_full_resolution(shared_data, backend):
    g, extrinsics, intrinsics, shape = garden_inputs(shared_data, scale_down=1)
    out = render(g, extrinsics, intrinsics, shape, backend=backend)
    assert out.color.shape == (1, 3, 3, 420, 648)
    assert torch.isfinite(out.color).all() and (out.alpha > 0.5).float().mean() > 0.8


# ------------------------------------------------------------------------------ (f) gsplat parity
def parity_fraction(a: torch.Tensor, b: torch.Tensor, tol: float) -> float:
    return ((a - b).abs() > tol).float().mean().item()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("degree", [0, 3])
def test_torch_matches_gsplat(degree: int):
    g = random_gaussians(2, 3000, degree=degree, spread=1.2).to("cuda")
    g.mask = (torch.rand(2, 3000, generator=torch.Generator().manual_seed(1)) > 0.2).cuda()
    extrinsics, intrinsics = (t.cuda() for t in cameras(2, 3))
    bg = torch.rand(2, 3, 3).cuda()
    ours = render(g, extrinsics, intrinsics, (120, 136), background=bg, backend="torch")
    ref = render(g, extrinsics, intrinsics, (120, 136), background=bg, backend="gsplat")
    # Independent float32 implementations: a pixel may differ when an alpha sits within rounding
    # of 1/255 or T of 1e-4, so bound the share of pixels off by more than 1e-4.
    assert parity_fraction(ours.color, ref.color, 1e-4) < 1e-3
    assert parity_fraction(ours.alpha, ref.alpha, 1e-4) < 1e-3
    assert parity_fraction(ours.depth, ref.depth, 1e-4 * ref.depth.abs().max().item()) < 1e-3
    assert (ours.color - ref.color).abs().mean() < 1e-5
    # Radii are ceil()s of float32 products (gsplat uses fast-math logs): rare off-by-one.
    assert (ours.radii - ref.radii).abs().max() <= 1
    assert (ours.radii == ref.radii).float().mean() > 0.999


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_torch_matches_gsplat_on_garden(shared_data):
    g, extrinsics, intrinsics, shape = garden_inputs(shared_data, scale_down=1)
    g, extrinsics, intrinsics = g.to("cuda"), extrinsics.cuda(), intrinsics.cuda()
    ours = render(g, extrinsics, intrinsics, shape, backend="torch")
    ref = render(g, extrinsics, intrinsics, shape, backend="gsplat")
    assert parity_fraction(ours.color, ref.color, 1e-4) < 1e-3
    assert (ours.color - ref.color).abs().mean() < 1e-5
    assert render(g, extrinsics, intrinsics, shape).color.shape == ours.color.shape  # auto


# ------------------------------------------------------------------------------ (g) bad input
def test_bad_inputs_raise_value_error_naming_the_argument():
    g = random_gaussians(2, 10)
    extrinsics, intrinsics = cameras(2, 1)
    shape = (16, 16)

    def bad(match: str, **changes):
        args = {
            "gaussians": g,
            "extrinsics": extrinsics,
            "intrinsics": intrinsics,
            "image_size": shape,
            "backend": "torch",
        }
        args.update(changes)
        with pytest.raises(ValueError, match=match):
            render(**args)

    nan_means = g.means.clone()
    nan_means[0, 3, 1] = float("nan")
    bad("means", gaussians=g.replace(means=nan_means))
    inf_scales = g.scales.clone()
    inf_scales[1, 0, 0] = float("inf")
    bad("scales", gaussians=g.replace(scales=inf_scales))
    bad("scales", gaussians=g.replace(scales=-g.scales))
    bad("rotations", gaussians=g.replace(rotations=g.rotations[..., :3]))
    bad("extrinsics", extrinsics=extrinsics[:, :, :3])
    bad("extrinsics", extrinsics=extrinsics[:1])
    bad("intrinsics", intrinsics=intrinsics[:1])
    bad("intrinsics", intrinsics=intrinsics.repeat(1, 2, 1, 1))
    pixel_k = intrinsics.clone()
    pixel_k[..., 0, :] *= 640
    pixel_k[..., 1, :] *= 480
    bad("intrinsics", intrinsics=pixel_k)
    bad("image_size", image_size=(16,))
    bad("image_size", image_size=(0, 16))
    bad("background", background=torch.zeros(4))
    bad("background", background=torch.zeros(3, 3))
    bad("backend", backend="opengl")
    bad("near", near=torch.zeros(3))
    bad("gaussians", gaussians=g.means)
    bad("gsplat", backend="gsplat")  # CPU tensors


# ------------------------------------------------------------------------------ (h) degenerate
def test_behind_camera_and_empty_sets_render_background(backend):
    extrinsics, intrinsics = cameras(1, 2)
    bg = torch.tensor([0.25, 0.5, 0.75])
    behind = random_gaussians(1, 30, depth=(-5.0, -0.5))
    too_near = random_gaussians(1, 30, depth=(0.0, 0.005))
    empty = Gaussians(
        torch.zeros(1, 0, 3), torch.ones(1, 0, 3), torch.zeros(1, 0, 4), torch.zeros(1, 0),
        torch.zeros(1, 0, 3, 1),
    )  # fmt: skip
    all_masked = random_gaussians(1, 30)
    all_masked.mask = torch.zeros(1, 30, dtype=torch.bool)
    for g in (behind, too_near, empty, all_masked):
        out = render(g, extrinsics, intrinsics, (20, 24), background=bg, backend=backend)
        assert isinstance(out, RenderOutput)
        assert out.color.shape == (1, 2, 3, 20, 24)
        assert torch.equal(out.color, bg[None, None, :, None, None].expand(1, 2, 3, 20, 24))
        assert (out.alpha == 0).all() and (out.depth == 0).all()
        assert (out.radii == 0).all()
    # Gradients flow (as zeros) even when nothing is visible, so a training step does not crash.
    means = behind.means.clone().requires_grad_(True)
    out = render(behind.replace(means=means), extrinsics, intrinsics, (20, 24), backend=backend)
    out.color.sum().backward()
    assert means.grad is not None and (means.grad == 0).all()


def test_default_background_is_black_and_backgrounds_broadcast(backend):
    g = random_gaussians(2, 20)
    extrinsics, intrinsics = cameras(2, 2)
    black = render(g, extrinsics, intrinsics, (16, 16), backend=backend)
    per_scene = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    red_green = render(g, extrinsics, intrinsics, (16, 16), background=per_scene, backend=backend)
    expected = black.color + per_scene[:, None, :, None, None] * (1 - black.alpha[:, :, None])
    assert max_abs(red_green.color, expected) < 1e-6
    # auto: the compiled CPU rasteriser for CPU tensors when it works, else torch.
    from models.render.cpu import cpu_rasterizer_error

    picked = "cpu" if cpu_rasterizer_error(torch.float32) is None else "torch"
    expected = render(g, extrinsics, intrinsics, (16, 16), backend=picked).color
    assert torch.equal(expected, render(g, extrinsics, intrinsics, (16, 16)).color)


# ------------------------------------------------------------------------------ (i) antialiased
def gsplat_reference_compensations(
    gaussians: Gaussians, extrinsics: torch.Tensor, intrinsics: torch.Tensor, shape
) -> torch.Tensor:
    """``[B, V, N]`` compensations from gsplat's own PyTorch reference (runs on the CPU)."""
    from gsplat.cuda._torch_impl import _fully_fused_projection, _quat_scale_to_covar_preci

    height, width = shape
    ks = intrinsics.clone()
    ks[..., 0, :] *= width
    ks[..., 1, :] *= height
    covars, _ = _quat_scale_to_covar_preci(gaussians.rotations, gaussians.scales, True, False)
    *_, compensations = _fully_fused_projection(
        gaussians.means, covars, invert_extrinsics(extrinsics), ks, width, height,
        eps2d=0.3, calc_compensations=True,
    )  # fmt: skip
    return compensations


def test_compensation_hand_computed_values():
    from models.render.projection import opacity_compensation

    cov2d = torch.tensor(
        [[[1.0, 0.0], [0.0, 4.0]], [[2.0, 1.0], [1.0, 2.0]], [[1.0, 1.0], [1.0, 1.0]]],
        dtype=torch.float64,
    )
    # det / det(S + 0.3 I): 4 / (1.3 * 4.3), 3 / (2.3^2 - 1), 0 / (1.3^2 - 1) (rank one).
    expected = torch.tensor([math.sqrt(4 / 5.59), math.sqrt(3 / 4.29), 0.0], dtype=torch.float64)
    assert torch.allclose(opacity_compensation(cov2d), expected, rtol=1e-14, atol=0)
    # Through the projection: an isotropic Gaussian on the optical axis of a camera with focal
    # lengths fx, fy (pixels) has S = diag((fx s / z)^2, (fy s / z)^2).
    s, z, fx, fy = 0.05, 2.0, 40.0, 30.0
    means = torch.tensor([[[0.0, 0.0, z]]], dtype=torch.float64)
    scales = torch.full((1, 1, 3), s, dtype=torch.float64)
    rotations = torch.tensor([[[1.0, 0.0, 0.0, 0.0]]], dtype=torch.float64)
    ks = torch.tensor([[[[fx, 0.0, 20.0], [0.0, fy, 15.0], [0.0, 0.0, 1.0]]]], dtype=torch.float64)
    views = torch.eye(4, dtype=torch.float64)[None, None]
    projection = project_gaussians(
        means, scales, rotations, views, ks, (30, 40), calc_compensations=True
    )
    vx, vy = (fx * s / z) ** 2, (fy * s / z) ** 2  # 1 and 0.5625 px^2
    expected = math.sqrt(vx * vy / ((vx + 0.3) * (vy + 0.3)))
    assert abs(projection.compensations.item() - expected) < 1e-14
    assert project_gaussians(means, scales, rotations, views, ks, (30, 40)).compensations is None


def test_compensation_matches_gsplat_at_most_one_and_tends_to_one():
    g = random_gaussians(2, 300, dtype=torch.float64, spread=1.6, depth=(-1.0, 6.0))
    g.scales = g.scales * torch.logspace(-2, 0, 300, dtype=torch.float64)[:, None]  # tiny too
    extrinsics, intrinsics = cameras(2, 3, torch.float64)
    shape = (45, 61)
    ks = intrinsics.clone()
    ks[..., 0, :] *= shape[1]
    ks[..., 1, :] *= shape[0]
    views = invert_extrinsics(extrinsics)
    ours = project_gaussians(
        g.means, g.scales, g.rotations, views, ks, shape, calc_compensations=True
    ).compensations
    reference = gsplat_reference_compensations(g, extrinsics, intrinsics, shape)
    visible = project_gaussians(g.means, g.scales, g.rotations, views, ks, shape).valid
    assert visible.sum() > 500
    assert max_abs(ours[visible], reference[visible]) < 1e-12
    assert (ours[visible] <= 1).all() and ours[visible].min() < 0.05  # tiny ones fade
    growing = []
    for factor in (1.0, 10.0, 100.0, 1e4, 1e6):
        comp = project_gaussians(
            g.means, g.scales * factor, g.rotations, views, ks, shape, calc_compensations=True
        ).compensations[visible]
        assert (comp <= 1).all()
        growing.append(comp)
    for smaller, larger in zip(growing, growing[1:]):
        assert (larger >= smaller - 1e-12).all()
    assert (1 - growing[-1]).max() < 1e-6


def render_per_view_with_compensated_opacities(
    g, extrinsics, intrinsics, shape, background=None, **kwargs
):
    """Classic renders, one view at a time, with opacities times gsplat's compensation."""
    compensations = gsplat_reference_compensations(g, extrinsics, intrinsics, shape)
    outputs = []
    for v in range(extrinsics.shape[1]):
        scene = g.replace(opacities=g.opacities * compensations[:, v])
        bg = None if background is None else background[:, v : v + 1]
        out = render(scene, extrinsics[:, v : v + 1], intrinsics[:, v : v + 1], shape, bg, **kwargs)
        outputs.append(out)
    return RenderOutput(
        *(torch.cat([getattr(o, k) for o in outputs], dim=1) for k in ("color", "depth", "alpha"))
    )


def test_antialiased_equals_classic_with_compensated_opacities(backend):
    g = random_gaussians(2, 400, degree=2, dtype=torch.float64, spread=1.2, scale=(0.005, 0.2))
    g.mask = torch.rand(2, 400, generator=torch.Generator().manual_seed(2)) > 0.2
    extrinsics, intrinsics = cameras(2, 3, torch.float64)
    bg = torch.rand(2, 3, 3, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    shape = (37, 50)
    kw = {"background": bg, "backend": backend}
    ours = render(g, extrinsics, intrinsics, shape, rasterize_mode="antialiased", **kw)
    ref = render_per_view_with_compensated_opacities(g, extrinsics, intrinsics, shape, **kw)
    classic = render(g, extrinsics, intrinsics, shape, rasterize_mode="classic", **kw)
    assert max_abs(classic.color, ours.color) > 0.05  # the mode changes the image
    assert torch.equal(classic.color, render(g, extrinsics, intrinsics, shape, **kw).color)
    for name in ("color", "depth", "alpha"):
        assert max_abs(getattr(ours, name), getattr(ref, name)) < 1e-10, name
    # Culling and the opacity-aware box use the compensated opacity (gsplat's CUDA rule).
    assert ((ours.radii == 0) & (classic.radii > 0)).any()
    assert (ours.radii <= classic.radii).all()


def test_antialiased_matches_per_pixel_reference():
    # Independent of models.render's compositing: the slow per-pixel reference with opacities
    # times gsplat's compensation.
    g = random_gaussians(1, 40, degree=1, dtype=torch.float64, spread=0.6, scale=(0.01, 0.2))
    extrinsics, intrinsics = cameras(1, 2, torch.float64)
    shape = (20, 24)
    ours = render(g, extrinsics, intrinsics, shape, backend="torch", rasterize_mode="antialiased")
    compensations = gsplat_reference_compensations(g, extrinsics, intrinsics, shape)
    for v in range(2):
        scene = g.replace(opacities=g.opacities * compensations[:, v])
        color, depth, alpha, _ = reference_render(
            scene, extrinsics[:, v : v + 1], intrinsics[:, v : v + 1], shape
        )
        assert max_abs(ours.color[:, v : v + 1], color) < 1e-10
        assert max_abs(ours.depth[:, v : v + 1], depth) < 1e-10
        assert max_abs(ours.alpha[:, v : v + 1], alpha) < 1e-10


def test_antialiased_gradcheck_float64(backend):
    g = random_gaussians(1, 4, degree=1, dtype=torch.float64, spread=0.5, scale=(0.1, 0.25))
    g.opacities = 0.3 + 0.5 * g.opacities
    extrinsics, intrinsics = cameras(1, 2, torch.float64, focal=0.8)
    bg = torch.tensor([0.2, 0.4, 0.6], dtype=torch.float64)

    def fn(means, scales, rotations, opacities):
        out = render(
            Gaussians(means, scales, rotations, opacities, g.harmonics),
            extrinsics,
            intrinsics,
            (18, 20),
            background=bg,
            backend=backend,
            chunk=2,
            rasterize_mode="antialiased",
        )
        return out.color, out.depth, out.alpha

    inputs = tuple(
        t.clone().requires_grad_(True) for t in (g.means, g.scales, g.rotations, g.opacities)
    )
    comp = gsplat_reference_compensations(g, extrinsics, intrinsics, (18, 20))
    assert 0.05 < comp.min() and comp.max() < 0.9  # the compensation matters here
    # gsplat's backward divides by compensation + 1e-6 (relative change below 2e-5 here).
    assert torch.autograd.gradcheck(
        fn, inputs, eps=1e-6, atol=1e-6, rtol=2e-4, fast_mode=True, check_undefined_grad=False
    )


def test_antialiased_gradients_match_reference(backend):
    # Gradients w.r.t. every field against autograd through gsplat's reference compensation and
    # the classic render of the pre-multiplied opacities.
    g = random_gaussians(1, 80, degree=1, dtype=torch.float64, spread=0.5, scale=(0.02, 0.3))
    g.opacities = 0.5 + 0.49 * g.opacities
    extrinsics, intrinsics = cameras(1, 2, torch.float64)
    shape = (24, 28)

    def antialiased(scene: Gaussians) -> tuple[torch.Tensor, ...]:
        out = render(
            scene, extrinsics, intrinsics, shape, backend=backend, rasterize_mode="antialiased"
        )
        return out.color, out.depth, out.alpha

    def reference(scene: Gaussians) -> tuple[torch.Tensor, ...]:
        out = render_per_view_with_compensated_opacities(
            scene, extrinsics, intrinsics, shape, backend=backend
        )
        return out.color, out.depth, out.alpha

    grads = [field_gradients(g, antialiased), field_gradients(g, reference)]
    for name, ours, ref in zip(FIELDS, *grads):
        assert ref.abs().max() > 0, name
        # Only gsplat's 1e-6 in the compensation's backward separates the two.
        assert (ours - ref).abs().max() <= 1e-5 * ref.abs().max(), name


def test_antialiased_gradients_finite_with_degenerate_gaussians(backend):
    g = random_gaussians(1, 50, degree=1, spread=0.6)
    g.scales[0, :5, 1:] = 1e-12  # needles: 2D covariance of rank one, compensation ~0
    g.scales[0, 5:10, 2] = 1e-12  # flat discs
    params = [g.means, g.scales, g.rotations, g.opacities]
    for p in params:
        p.requires_grad_(True)
    extrinsics, intrinsics = cameras(1, 2)
    out = render(g, extrinsics, intrinsics, (32, 32), backend=backend, rasterize_mode="antialiased")
    assert torch.isfinite(out.color).all()
    (out.color.sum() + out.alpha.sum()).backward()
    for p in params:
        assert torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0


def test_eps2d_bad_value():
    g = random_gaussians(1, 5)
    extrinsics, intrinsics = cameras(1, 1)
    for value in (-0.1, float("nan"), "0.3", None, True):
        with pytest.raises(ValueError, match=r"^eps2d must be a number >= 0"):
            render(g, extrinsics, intrinsics, (8, 8), eps2d=value)


def test_rasterize_mode_bad_value():
    g = random_gaussians(1, 5)
    extrinsics, intrinsics = cameras(1, 1)
    for value in ("antialias", "Classic", None):
        with pytest.raises(ValueError, match=r"^rasterize_mode must be one of \('classic', 'an"):
            render(g, extrinsics, intrinsics, (8, 8), rasterize_mode=value)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_torch_matches_gsplat_antialiased():
    g = random_gaussians(2, 3000, degree=3, spread=1.2, scale=(0.003, 0.3)).to("cuda")
    g.mask = (torch.rand(2, 3000, generator=torch.Generator().manual_seed(1)) > 0.2).cuda()
    extrinsics, intrinsics = (t.cuda() for t in cameras(2, 3))
    bg = torch.rand(2, 3, 3).cuda()
    names = ("means", "scales", "rotations", "opacities", "harmonics")
    outputs, grads = [], []
    for backend in ("torch", "gsplat"):
        params = {k: getattr(g, k).clone().requires_grad_(True) for k in names}
        out = render(
            Gaussians(**params, mask=g.mask), extrinsics, intrinsics, (120, 136), background=bg,
            backend=backend, rasterize_mode="antialiased",
        )  # fmt: skip
        weight = torch.linspace(0.5, 1.5, out.color.numel(), device="cuda")
        loss = (weight.reshape(out.color.shape) * out.color).sum() + out.alpha.sum()
        grads.append(torch.autograd.grad(loss, list(params.values())))
        outputs.append(out)
    ours, ref = outputs
    classic = render(g, extrinsics, intrinsics, (120, 136), background=bg, backend="gsplat")
    assert (classic.color - ref.color).abs().max() > 0.05  # gsplat did compensate
    assert parity_fraction(ours.color, ref.color, 1e-4) < 1e-3
    assert parity_fraction(ours.alpha, ref.alpha, 1e-4) < 1e-3
    assert (ours.color - ref.color).abs().mean() < 1e-5
    assert (ours.radii - ref.radii).abs().max() <= 1
    assert (ours.radii == ref.radii).float().mean() > 0.999
    for name, a, b in zip(names, *grads):
        cosine = F.cosine_similarity(a.flatten(), b.flatten(), dim=0).item()
        assert cosine > 0.99, (name, cosine)
