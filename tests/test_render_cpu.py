"""The compiled CPU rasteriser (``models.render.cpu``): parity with the torch backend, the build,
``auto``'s choice and its fallback.

The renderer tests of ``test_render.py`` (reference renderer, closed form, garden scene, empty
sets, masks, Gaussians behind the camera, gradcheck) also run against ``backend="cpu"``.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from test_render import cameras, cpu_backend_or_skip, garden_inputs, random_gaussians

from models.core.gaussians import Gaussians
from models.render import cpu as render_cpu
from models.render.core import render

NAMES = ("means", "scales", "rotations", "opacities", "harmonics")
render_module = importlib.import_module("models.render.core")  # models.render is also the function
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def cpu_backend():
    cpu_backend_or_skip(torch.float32)


@pytest.fixture
def fresh_build_state(monkeypatch):
    """Forget the cached build result and warnings; the real build is found again afterwards."""
    render_cpu._build_error.cache_clear()
    monkeypatch.setattr(render_module, "_CPU_FALLBACK_WARNED", set())
    yield
    render_cpu._build_error.cache_clear()


@pytest.fixture
def failed_build(monkeypatch, fresh_build_state):
    """A build that fails."""

    def broken() -> None:
        raise render_cpu.CpuRasterizerUnavailable("its build failed (simulated)")

    monkeypatch.setattr(render_cpu, "_build", broken)


def render_with_grads(
    gaussians,
    extrinsics,
    intrinsics,
    shape,
    background,
    backend,
    rasterize_mode="classic",
    pose_grad=True,
):
    """Render and differentiate a loss of colour, depth and alpha w.r.t. every field and, with
    ``pose_grad``, the poses."""
    params = {k: getattr(gaussians, k).clone().requires_grad_(True) for k in NAMES}
    poses = extrinsics.clone().requires_grad_(pose_grad)
    out = render(
        Gaussians(**params, mask=gaussians.mask),
        poses,
        intrinsics,
        shape,
        background=background,
        backend=backend,
        rasterize_mode=rasterize_mode,
    )
    weight = torch.linspace(0.5, 1.5, out.color.numel(), dtype=out.color.dtype)
    loss = (weight.reshape(out.color.shape) * out.color).sum()
    loss = loss + 0.3 * out.depth.sum() + 2.0 * out.alpha.sum()
    inputs = [*params.values(), *([poses] if pose_grad else [])]
    grads = torch.autograd.grad(loss, inputs)
    return out, dict(zip([*NAMES, "extrinsics"], grads))


def _assert_same_render(ours, ours_grads: dict, ref, ref_grads: dict, dtype) -> float:
    """The cpu backend's render and gradients match the torch backend's (every gradient
    non-zero); returns the relative gradient tolerance of ``dtype``."""
    forward_tol = 1e-5 if dtype == torch.float32 else 1e-12
    for name in ("color", "depth", "alpha"):
        a, b = getattr(ours, name), getattr(ref, name)
        scale = b.abs().max().item() if name == "depth" else 1.0
        assert (a - b).abs().max().item() <= forward_tol * scale, name
    assert torch.equal(ours.radii, ref.radii)
    grad_tol = 1e-4 if dtype == torch.float32 else 1e-10
    for name, ref_grad in ref_grads.items():
        error = (ours_grads[name] - ref_grad).abs().max().item()
        assert ref_grad.abs().max() > 0, name
        assert error <= grad_tol * ref_grad.abs().max().item(), (name, error)
    return grad_tol


@pytest.mark.parametrize("pose_grad", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cpu_matches_torch_backend_forward_and_gradients(cpu_backend, dtype, pose_grad):
    g = random_gaussians(2, 600, degree=3, dtype=dtype, spread=0.9)
    g.mask = torch.rand(2, 600, generator=torch.Generator().manual_seed(4)) > 0.2
    g.means[~g.mask] = float("nan")  # masked entries may hold anything
    extrinsics, intrinsics = cameras(2, 3, dtype)
    bg = torch.rand(2, 3, 3, generator=torch.Generator().manual_seed(5), dtype=dtype)
    shape = (53, 75)
    args = (g, extrinsics, intrinsics, shape, bg)
    ours, ours_grads = render_with_grads(*args, "cpu", pose_grad=pose_grad)
    ref, ref_grads = render_with_grads(*args, "torch", pose_grad=pose_grad)
    assert ref.alpha.max() > 0.9 and (ref.alpha < 0.1).any()  # opaque and empty pixels
    _assert_same_render(ours, ours_grads, ref, ref_grads, dtype)
    assert (ours_grads["means"][~g.mask] == 0).all()


@pytest.mark.parametrize("pose_grad", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cpu_matches_torch_backend_antialiased(cpu_backend, dtype, pose_grad):
    # The cpu backend compensates the opacities in PyTorch before the kernel: its gradients
    # (autograd through the compensation, then the kernel's backward) must match the torch
    # backend's (autograd throughout).
    g = random_gaussians(2, 500, degree=2, dtype=dtype, spread=0.9, scale=(0.005, 0.3))
    g.mask = torch.rand(2, 500, generator=torch.Generator().manual_seed(6)) > 0.2
    g.means[~g.mask] = float("nan")
    extrinsics, intrinsics = cameras(2, 3, dtype)
    bg = torch.rand(2, 3, 3, generator=torch.Generator().manual_seed(7), dtype=dtype)
    shape = (41, 57)
    args = (g, extrinsics, intrinsics, shape, bg)
    mode = {"rasterize_mode": "antialiased", "pose_grad": pose_grad}
    ours, ours_grads = render_with_grads(*args, "cpu", **mode)
    ref, ref_grads = render_with_grads(*args, "torch", **mode)
    classic, classic_grads = render_with_grads(*args, "cpu", pose_grad=pose_grad)
    assert (classic.color - ours.color).abs().max() > 0.05  # the mode matters here
    grad_tol = _assert_same_render(ours, ours_grads, ref, ref_grads, dtype)
    # The compensation's own gradient is part of it (it changes the scales' gradient).
    change = (classic_grads["scales"] - ref_grads["scales"]).abs().max().item()
    assert change > 100 * grad_tol * ref_grads["scales"].abs().max().item()
    assert (ours_grads["means"][~g.mask] == 0).all()


def test_cpu_matches_torch_backend_on_garden(cpu_backend, shared_data):
    # 138,766 real points: independent float32 implementations may differ at a pixel where an
    # alpha sits within rounding of 1/255 or T of 1e-4 (different exp implementations), so bound
    # the share of such pixels and the mean error, as the torch/gsplat parity test does.
    g, extrinsics, intrinsics, shape = garden_inputs(shared_data, scale_down=4)
    ours = render(g, extrinsics, intrinsics, shape, backend="cpu")
    ref = render(g, extrinsics, intrinsics, shape, backend="torch")
    off = ((ours.color - ref.color).abs() > 1e-5).float().mean().item()
    assert off < 1e-3
    assert (ours.color - ref.color).abs().mean() < 1e-6
    assert ((ours.alpha - ref.alpha).abs() > 1e-5).float().mean() < 1e-3
    assert torch.equal(ours.radii, ref.radii)


@pytest.mark.parametrize("pose_grad", [True, False])
def test_result_does_not_depend_on_threads(cpu_backend, pose_grad):
    g = random_gaussians(2, 400, degree=1, spread=0.5, scale=(0.1, 0.4))
    extrinsics, intrinsics = cameras(2, 2)
    threads = torch.get_num_threads()
    results = []
    args = (g, extrinsics, intrinsics, (40, 56), None, "cpu")
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            results.append(render_with_grads(*args, pose_grad=pose_grad))
    finally:
        torch.set_num_threads(threads)
    (a, a_grads), (b, b_grads) = results
    assert torch.equal(a.color, b.color) and torch.equal(a.depth, b.depth)
    for name in a_grads:
        assert torch.equal(a_grads[name], b_grads[name]), name


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_one_image_binning_does_not_depend_on_threads(cpu_backend, dtype):
    """One image with enough Gaussians for the binning to split across threads (overlapping,
    many depth ties, some culled): the same tile lists, render and gradients on 1 and 2 threads,
    each tile's list in depth order with ties by slot index."""
    gen = torch.Generator().manual_seed(0)
    num, height, width, tile = 20000, 48, 80, 16
    means2d = torch.rand(1, num, 2, generator=gen) * torch.tensor([width + 8.0, height + 8.0]) - 4
    sigma = 0.5 + 4.0 * torch.rand(1, num, 2, generator=gen)
    angle = torch.rand(1, num, generator=gen) * torch.pi
    cos, sin = torch.cos(angle), torch.sin(angle)
    xx = (cos * sigma[..., 0]) ** 2 + (sin * sigma[..., 1]) ** 2
    yy = (sin * sigma[..., 0]) ** 2 + (cos * sigma[..., 1]) ** 2
    xy = cos * sin * (sigma[..., 0] ** 2 - sigma[..., 1] ** 2)
    det = xx * yy - xy**2
    conics = torch.stack([yy / det, -xy / det, xx / det], dim=-1)
    radii = torch.ceil(3 * torch.stack([xx, yy], dim=-1).sqrt()).to(torch.int32)
    radii[:, ::7] = 0
    colors = torch.rand(1, num, 3, generator=gen)
    opacities = 0.01 + 0.99 * torch.rand(1, num, generator=gen)
    depths = torch.randint(1, 30, (1, num), generator=gen).float()
    floats = [t.to(dtype) for t in (means2d, conics, colors, opacities, depths)]
    inputs = (*floats, radii, height, width, tile)
    grad_out = torch.rand(1, 5, height, width, generator=gen, dtype=dtype)
    threads = torch.get_num_threads()
    results = []
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            out, t_final, last, offsets, ids = torch.ops.splatzoo_cpu.forward(*inputs)
            grads = torch.ops.splatzoo_cpu.backward(*inputs, offsets, ids, t_final, last, grad_out)
            results.append((out, t_final, last, offsets, ids, grads))
    finally:
        torch.set_num_threads(threads)
    for a, b in zip(*results):
        assert torch.equal(a, b)
    offsets, ids = results[0][3], results[0][4]
    assert ids.numel() > 2 * num and (radii[0, ids.long()] > 0).any(-1).all()
    ties = 0
    for start, end in zip(offsets[:-1].tolist(), offsets[1:].tolist()):
        slots = ids[start:end].long()
        d = depths[0, slots]
        assert ((d[1:] > d[:-1]) | ((d[1:] == d[:-1]) & (slots[1:] > slots[:-1]))).all()
        ties += int((d[1:] == d[:-1]).sum())
    assert ties > 1000
    assert results[0][5].abs().sum() > 0


def test_auto_uses_the_compiled_rasteriser_on_cpu(cpu_backend):
    g = random_gaussians(1, 200, degree=1)
    extrinsics, intrinsics = cameras(1, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback warning when it works
        auto = render(g, extrinsics, intrinsics, (30, 40))
    assert torch.equal(auto.color, render(g, extrinsics, intrinsics, (30, 40), backend="cpu").color)
    torch_color = render(g, extrinsics, intrinsics, (30, 40), backend="torch").color
    assert not torch.equal(auto.color, torch_color)  # really another implementation
    assert (auto.color - torch_color).abs().max() < 1e-5


def test_failed_build_falls_back_to_torch_with_one_warning(failed_build):
    g = random_gaussians(1, 100, degree=1)
    extrinsics, intrinsics = cameras(1, 1)
    with pytest.warns(RuntimeWarning, match=r"compiled CPU rasteriser is not used") as record:
        first = render(g, extrinsics, intrinsics, (24, 24))
        second = render(g.to(torch.float64), extrinsics, intrinsics, (24, 24))
    messages = [str(w.message) for w in record if issubclass(w.category, RuntimeWarning)]
    assert len(messages) == 1 and "its build failed (simulated)" in messages[0]
    assert torch.equal(
        first.color, render(g, extrinsics, intrinsics, (24, 24), backend="torch").color
    )
    assert second.color.dtype == torch.float64
    with pytest.raises(RuntimeError, match=r"^backend='cpu' is not available: its build failed"):
        render(g, extrinsics, intrinsics, (24, 24), backend="cpu")


def test_antialiased_falls_back_to_torch_when_the_build_fails(failed_build):
    g = random_gaussians(1, 100, degree=1, scale=(0.005, 0.2))
    extrinsics, intrinsics = cameras(1, 2)
    with pytest.warns(RuntimeWarning, match=r"compiled CPU rasteriser is not used"):
        auto = render(g, extrinsics, intrinsics, (24, 24), rasterize_mode="antialiased")
    torch_aa = render(
        g, extrinsics, intrinsics, (24, 24), backend="torch", rasterize_mode="antialiased"
    )
    assert torch.equal(auto.color, torch_aa.color) and torch.equal(auto.radii, torch_aa.radii)
    classic = render(g, extrinsics, intrinsics, (24, 24), backend="torch")
    assert (classic.color - auto.color).abs().max() > 0.01


def test_missing_compiler_is_reported(tmp_path):
    # A fresh process (the library is not loaded yet) and an empty extension cache.
    script = (
        "import json, warnings\n"
        "from models.render import render\n"
        "from test_render import cameras, random_gaussians\n"
        "g = random_gaussians(1, 20)\n"
        "e, k = cameras(1, 1)\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    render(g, e, k, (16, 16)); render(g, e, k, (16, 16))\n"
        "print(json.dumps([str(w.message) for w in caught if 'rasteriser' in str(w.message)]))\n"
        "try:\n"
        "    render(g, e, k, (16, 16), backend='cpu')\n"
        "except RuntimeError as error:\n"
        "    print(error)\n"
    )
    env = {
        **os.environ,
        "CXX": "no-such-compiler-xyz",
        "TORCH_EXTENSIONS_DIR": str(tmp_path),
        "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")]),
    }
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
    warned, raised = result.stdout.strip().splitlines()[-2:]
    reason = "no C++ compiler ('no-such-compiler-xyz' is not on PATH)"
    assert json.loads(warned) == [  # one warning for two renders
        f"the compiled CPU rasteriser is not used ({reason}); rendering with the PyTorch one"
    ]
    assert raised == f"backend='cpu' is not available: {reason}"
    assert not any(tmp_path.iterdir())  # nothing was built


def test_unsupported_dtype_falls_back_with_a_warning(monkeypatch):
    monkeypatch.setattr(render_module, "_CPU_FALLBACK_WARNED", set())
    g = random_gaussians(1, 30, dtype=torch.float16)
    extrinsics, intrinsics = cameras(1, 1, torch.float16)
    assert "float32 and float64, not torch.float16" in render_cpu.cpu_rasterizer_error(torch.half)
    with pytest.warns(RuntimeWarning, match="not torch.float16"):
        out = render(g, extrinsics, intrinsics, (16, 16))
    assert out.color.dtype == torch.float16
    with pytest.raises(RuntimeError, match="not torch.float16"):
        render(g, extrinsics, intrinsics, (16, 16), backend="cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cpu_backend_rejects_cuda_tensors():
    g = random_gaussians(1, 10).to("cuda")
    extrinsics, intrinsics = (t.cuda() for t in cameras(1, 1))
    with pytest.raises(ValueError, match="backend='cpu' needs CPU tensors"):
        render(g, extrinsics, intrinsics, (16, 16), backend="cpu")


def test_build_key_covers_the_build_environment(monkeypatch, tmp_path):
    """Another torch, Python, compiler or ninja gets a build of its own; another checkout with the same
    sources shares one (its sources are compiled from a copy inside the build folder)."""
    key = render_cpu._build_key("c++")
    assert render_cpu._build_key("c++") == key
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    for name in (*render_cpu.SOURCES, *render_cpu.HEADERS):
        (checkout / name).write_bytes((render_cpu.CSRC / name).read_bytes())
    monkeypatch.setattr(render_cpu, "CSRC", checkout)
    assert render_cpu._build_key("c++") == key  # same sources elsewhere: same build
    build = tmp_path / "build"
    assert render_cpu._copy_sources(build) == build / "src"
    assert (build / "src" / render_cpu.SOURCES[0]).read_bytes() == (
        checkout / render_cpu.SOURCES[0]
    ).read_bytes()
    with monkeypatch.context() as patch:
        patch.setattr(torch, "__version__", "2.13.0+cpu")
        assert render_cpu._build_key("c++") != key
    with monkeypatch.context() as patch:
        patch.setattr(sys, "version", "3.12.0 (other)")
        assert render_cpu._build_key("c++") != key
    identity = render_cpu._tool_identity
    for tool, other in (("c++", "/usr/bin/clang++ 18"), ("ninja", "/opt/other/bin/ninja 0.1")):
        with monkeypatch.context() as patch:  # another compiler, another ninja on PATH
            patch.setattr(
                render_cpu,
                "_tool_identity",
                lambda name, t=tool, o=other: o if name == t else identity(name),
            )
            assert render_cpu._build_key("c++") != key, tool
    (checkout / render_cpu.SOURCES[0]).write_text("// changed\n")
    assert render_cpu._build_key("c++") != key


@pytest.mark.slow
def test_first_build_is_announced_once_and_reused_from_another_checkout(tmp_path):
    """A fresh extension folder: the first process says it compiles (with its estimate), the
    second, from another checkout of the same sources, loads that build silently."""
    script = (
        "from models.render import render\n"
        "from test_render import cameras, random_gaussians\n"
        "g = random_gaussians(1, 20)\n"
        "e, k = cameras(1, 1)\n"
        "render(g, e, k, (16, 16), backend='cpu')\n"
    )
    copy = tmp_path / "checkout"
    shutil.copytree(REPO / "models", copy / "models", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "datamodules", copy / "datamodules")
    runs = []
    for root in (REPO, copy):
        env = {
            **os.environ,
            "TORCH_EXTENSIONS_DIR": str(tmp_path / "extensions"),
            "PYTHONPATH": os.pathsep.join([str(root), str(REPO / "tests")]),
        }
        runs.append(
            subprocess.run(
                [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600
            )
        )
    assert all(run.returncode == 0 for run in runs), runs[-1].stderr[-2000:]
    announced = [line for line in runs[0].stderr.splitlines() if "compiling" in line]
    assert len(announced) == 1 and f"about {render_cpu.BUILD_SECONDS} s" in announced[0]
    assert "compiling" not in runs[1].stderr, runs[1].stderr
    assert len(list((tmp_path / "extensions").glob("*/*.so"))) == 1


def test_a_stale_build_lock_does_not_hang_the_next_process(cpu_backend):
    """A build killed half-way leaves torch's ``lock`` file; torch 2.13's builder (its
    ``FileBaton``) waits on it without end. The next process clears it (no live builder holds
    the build folder's flock) and loads the extension. (torch 2.14 locks the file with an
    advisory lock instead and keeps it.)"""
    from torch.utils import cpp_extension

    name = f"splatzoo_rasterize_cpu_{render_cpu._build_key(os.environ.get('CXX', 'c++'))}"
    stale = Path(cpp_extension._get_build_directory(name, verbose=False)) / "lock"
    stale.touch()
    script = (
        "import sys\n"
        "from models.render.cpu import cpu_rasterizer_error\n"
        "sys.exit(cpu_rasterizer_error() is not None)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300
    )  # a hang is a TimeoutExpired
    assert run.returncode == 0, run.stderr[-2000:]


def _projection_scene(dtype, degree: int) -> tuple[Gaussians, torch.Tensor, torch.Tensor]:
    """Gaussians in front of, behind and far beside three cameras, some masked, some flat."""
    g = random_gaussians(2, 700, degree=degree, dtype=dtype, spread=1.5, scale=(1e-3, 0.5))
    generator = torch.Generator().manual_seed(11)
    g.means[:, :60, 2] = -torch.rand(2, 60, generator=generator, dtype=dtype)  # behind
    g.means[:, 60:120, :2] *= 8.0  # far outside the image: the Jacobian's slope is limited
    g.scales[:, 120:160, 2] = 1e-5  # flat
    g.mask = torch.rand(2, 700, generator=generator) > 0.1
    extrinsics, intrinsics = cameras(2, 3, dtype)
    return g, extrinsics, intrinsics


def _projection_and_grads(project, g, extrinsics, intrinsics, mode, seen):
    """The projection and the gradients of a random weighting of its outputs, where ``seen``
    ``[B, V, N]`` (None: everywhere), to the Gaussians' fields and the poses."""
    leaves = [getattr(g, k).clone().requires_grad_(True) for k in NAMES]
    poses = extrinsics.clone().requires_grad_(True)
    outputs = project(
        Gaussians(*leaves, mask=g.mask), poses, intrinsics, (45, 61), 0.05, 6.0, mode, 0.3
    )
    generator = torch.Generator().manual_seed(3)
    loss = 0.0
    for output in outputs[:5]:
        weight = torch.randn(output.shape, generator=generator, dtype=output.dtype)
        if seen is not None:
            weight = weight * seen.reshape(*seen.shape, *[1] * (output.ndim - 3))
        loss = loss + (output * weight).sum()
    return outputs, torch.autograd.grad(loss, [*leaves, poses])


@pytest.mark.parametrize("mode", ["classic", "antialiased"])
@pytest.mark.parametrize("degree", [0, 1, 3, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_compiled_projection_matches_the_reference(cpu_backend, dtype, degree, mode):
    # project_cpu (one C++ pass per Gaussian, its backward written out) against the PyTorch
    # projection and SH colours under autograd, with a gradient on every output, to every field
    # and to the poses. In float64 on
    # every entry, culled ones too; in float32 on the pairs the rasteriser draws (a culled
    # Gaussian far beside the image or seen edge-on has an ill-conditioned footprint, where
    # float32 rounding alone moves its conic by 1e-4).
    g, extrinsics, intrinsics = _projection_scene(dtype, degree)
    with torch.no_grad():
        radii = render_cpu._project_torch(
            g, extrinsics, intrinsics, (45, 61), 0.05, 6.0, mode, 0.3
        )[5]
    visible = radii.any(-1)  # [B, V, N]
    assert 0.2 < visible.float().mean() < 0.8
    seen = visible if dtype == torch.float32 else None
    args = (g, extrinsics, intrinsics, mode, seen)
    ours, ours_grads = _projection_and_grads(render_cpu.project_cpu, *args)
    ref, ref_grads = _projection_and_grads(render_cpu._project_torch, *args)
    assert torch.equal(ours[5], radii)
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    compared = visible if seen is not None else torch.ones_like(visible)
    for name, a, b in zip(("means2d", "conics", "colors", "opacities", "depths"), ours, ref):
        a, b = a[compared], b[compared]
        # the compensation's det(S) cancels for needles: float32 rounding moves it more
        loose = name == "opacities" and mode == "antialiased" and dtype == torch.float32
        scale = b.abs().max().item()  # relative to the largest, or to the entry itself
        assert ((a - b).abs() <= (1e-3 if loose else tol) * (b.abs() + scale)).all(), name
    for name, a, b in zip((*NAMES, "extrinsics"), ours_grads, ref_grads):
        assert b.abs().max() > 0, name
        assert (a - b).abs().max().item() <= 10 * tol * b.abs().max().item(), name


def test_intrinsics_gradient_comes_from_the_pytorch_projection(cpu_backend):
    # The compiled projection does not differentiate the intrinsics: with intrinsics that need a
    # gradient the cpu backend projects in PyTorch, and matches the torch backend.
    g = random_gaussians(1, 300, degree=1, dtype=torch.float64, spread=0.8)
    extrinsics, intrinsics = cameras(1, 2, torch.float64)
    grads = []
    for backend in ("cpu", "torch"):
        focal = intrinsics.clone().requires_grad_(True)
        out = render(g, extrinsics, focal, (37, 49), backend=backend)
        (grad,) = torch.autograd.grad((out.color * out.color).sum() + out.alpha.sum(), focal)
        grads.append(grad)
    assert grads[1].abs().max() > 0
    assert (grads[0] - grads[1]).abs().max() <= 1e-10 * grads[1].abs().max()
