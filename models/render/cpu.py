"""The compiled CPU rasteriser: ``render(..., backend="cpu")``.

A C++ tile rasteriser (``models/render/csrc/``, OpenMP over 16x16 tiles) with the numerics of the
torch backend and of gsplat 1.5 (see :mod:`models.render`): per-tile lists of Gaussians sorted by
depth, front-to-back compositing, and a backward pass that walks each tile's list back to front the
way gsplat's CUDA kernel does, recovering each transmittance from the final one. The projection
and SH colours are compiled too (:func:`project_cpu`: one pass per Gaussian over its views, with
the backward written out, as gsplat's fully fused projection; differentiable in the poses too),
except when the intrinsics need a gradient: then PyTorch's projection (the reference the tests
compare against) runs. The background is added in PyTorch. The rasteriser takes the projected
means, conics, colours, opacities and depths of each image and returns colour, expected depth and
alpha with their backward pass.

The extension is built on first use with ``torch.utils.cpp_extension.load`` (needs a C++17/20
compiler and ninja; about ``BUILD_SECONDS``, said on stderr before it starts) into torch's
extension directory (``TORCH_EXTENSIONS_DIR``, by default ``~/.cache/torch_extensions``), under a
name that carries a hash of the sources and of the build environment (compiler and ninja with
their versions, torch, Python, flags). The sources are compiled from a copy in that build's folder, so every
checkout and virtual environment with the same sources and environment reuses one build (torch
rebuilds when the source paths change), and another environment gets a build of its own instead
of loading a binary made for another torch. Build failures are cached for the process:
:func:`cpu_rasterizer_error` says why it is not usable.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from models.core.sh import eval_sh
from models.geometry.cameras import intrinsics_to_pixels, world_to_camera
from models.render.output import RenderOutput
from models.render.projection import EPS2D, _per_view, project_views

__all__ = [
    "CpuRasterizerUnavailable",
    "SUPPORTED_DTYPES",
    "cpu_library_loaded",
    "cpu_rasterizer_error",
    "project_cpu",
    "rasterize_cpu",
    "render_cpu",
]

CSRC = Path(__file__).resolve().parent / "csrc"
SOURCES = (
    "rasterize_cpu_kernel.cpp",
    "rasterize_cpu_ops.cpp",
    "project_cpu_kernel.cpp",
    "project_cpu_ops.cpp",
    "mcmc_cpu_ops.cpp",
)
HEADERS = ("rasterize_cpu.h", "project_cpu.h", "ops_checks.h")
SUPPORTED_DTYPES = (torch.float32, torch.float64)
_LDFLAGS = ["-fopenmp"]
# Measured: 21 s on an idle 2-core machine, 25-45 s on a busy one (the project's CPU).
BUILD_SECONDS = 30


def _has_avx2() -> bool:
    """Whether this x86-64 CPU has AVX2 (the kernel's 8-lane vectors then use it)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as info:
            return any(line.startswith("flags") and " avx2" in line for line in info)
    except OSError:
        return False


# No fused multiply-adds: the kernel's arithmetic then matches the torch backend's op by op.
_CFLAGS = ["-O3", "-fopenmp", "-ffp-contract=off", "-fno-math-errno"] + (
    ["-mavx2"] if _has_avx2() else []
)


class CpuRasterizerUnavailable(RuntimeError):
    """The compiled CPU rasteriser cannot be built or loaded here."""


def _tool_identity(tool: str) -> str:
    """A build tool's (the compiler's, ninja's) resolved path and the first line of its
    ``--version``."""
    path = shutil.which(tool) or tool
    try:
        version = subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=30
        ).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        version = []
    return f"{os.path.realpath(path)} {version[0] if version else '?'}"


def _build_key(compiler: str) -> str:
    """Hash of the sources and of what else decides the build: compiler, ninja, torch, Python,
    flags. Ninja is in it because two ninja versions sharing a folder (a virtual environment's
    ``ninja`` on ``PATH`` in one shell, the system's in another) each discard the other's build
    log and rebuild everything."""
    digest = hashlib.sha256()
    for name in (*SOURCES, *HEADERS):
        digest.update(name.encode())
        digest.update((CSRC / name).read_bytes())
    tools = [_tool_identity(compiler), _tool_identity("ninja")]
    environment = [*tools, torch.__version__, sys.version, *_CFLAGS]
    digest.update(" ".join(environment + _LDFLAGS).encode())
    return digest.hexdigest()[:12]


def _copy_sources(build_dir: Path) -> Path:
    """The sources copied into ``build_dir/src`` (atomically, once): the paths torch compiles
    are then the same for every checkout."""
    source_dir = build_dir / "src"
    source_dir.mkdir(parents=True, exist_ok=True)
    for name in (*SOURCES, *HEADERS):
        target = source_dir / name
        data = (CSRC / name).read_bytes()
        if not target.is_file() or target.read_bytes() != data:
            partial = source_dir / f".{name}.{os.getpid()}"
            partial.write_bytes(data)
            os.replace(partial, target)
    return source_dir


@contextlib.contextmanager
def _build_lock(build_dir: Path) -> Iterator[None]:
    """Hold the build folder's own lock for the build, and clear a stale torch lock first.

    torch's builder marks a build with a ``lock`` file and waits, without end, while one exists;
    a build killed half-way (Ctrl-C, SIGTERM, a time-out) leaves it behind, and every later
    process would hang on it. Every build of this extension runs under this ``flock``, so while
    it is held no other builder is alive and a ``lock`` file found is stale."""
    with open(build_dir / ".splatzoo-build.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # waits only for a live build (released on exit)
        stale = build_dir / "lock"
        if stale.exists():
            stale.unlink(missing_ok=True)
        yield


def _import_builder():
    """``torch.utils.cpp_extension``, which imports setuptools. When the standard library's
    distutils was imported first in this process (and setuptools' own copy is the one in use),
    setuptools refuses with a bare ``AssertionError`` naming ``distutils/core.py``; the stale
    modules are then dropped so that setuptools' copy is imported, and any other failure says
    why the CPU rasteriser is unavailable instead of escaping from a render."""
    for _ in range(2):  # once more after dropping a stale distutils
        try:
            from torch.utils import cpp_extension

            return cpp_extension
        except AssertionError as error:  # setuptools after the standard library's distutils
            failure = error
            for key in [k for k in sys.modules if k == "distutils" or k.startswith("distutils.")]:
                del sys.modules[key]
        except Exception as error:  # noqa: BLE001  (any import failure: the torch backend)
            failure = error
            break
    raise CpuRasterizerUnavailable(f"torch.utils.cpp_extension fails ({failure!r})") from None


def _build() -> None:
    """Compile (or reuse) the extension and load it into ``torch.ops.splatzoo_cpu``."""
    if _loaded():
        return  # a second load would register the operator namespace twice (abort)
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        raise CpuRasterizerUnavailable(f"no C++ compiler ({compiler!r} is not on PATH)")
    # Importing the builder logs a CUDA_HOME notice on machines without a GPU; it is not ours.
    builder_log = logging.getLogger("torch.utils.cpp_extension")
    level = builder_log.level
    builder_log.setLevel(logging.ERROR)
    try:
        cpp_extension = _import_builder()
    finally:
        builder_log.setLevel(level)
    try:
        cpp_extension.verify_ninja_availability()
    except RuntimeError as error:
        raise CpuRasterizerUnavailable(f"ninja is not available ({error})") from None
    name = f"splatzoo_rasterize_cpu_{_build_key(compiler)}"
    try:
        build_dir = Path(cpp_extension._get_build_directory(name, verbose=False))
        source_dir = _copy_sources(build_dir)
        if not (build_dir / f"{name}.so").is_file():
            print(
                f"compiling the CPU rasteriser (first use with this compiler, ninja, torch and Python; "
                f"about {BUILD_SECONDS} s, once) into {build_dir}",
                file=sys.stderr,
                flush=True,
            )
        with _build_lock(build_dir):
            cpp_extension.load(
                name=name,
                sources=[str(source_dir / s) for s in SOURCES],
                extra_cflags=_CFLAGS,
                extra_ldflags=_LDFLAGS,
                extra_include_paths=[str(source_dir)],
                is_python_module=False,
                verbose=False,
            )
    except Exception as error:  # compiler errors, a broken toolchain, a failed load
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        build_dir = Path(cpp_extension._get_build_directory(name, verbose=False))
        raise CpuRasterizerUnavailable(
            f"its build failed ({first}; the log is in {build_dir})"
        ) from None
    if not _loaded():
        raise CpuRasterizerUnavailable("the built library registers no splatzoo_cpu.forward")


def _loaded() -> bool:
    """Whether ``torch.ops.splatzoo_cpu`` is registered in this process."""
    try:
        torch.ops.splatzoo_cpu.forward  # noqa: B018
    except (AttributeError, RuntimeError):
        return False
    return True


@functools.cache
def _build_error() -> str | None:
    """``None`` once the extension is loaded, else why it cannot be (cached per process)."""
    try:
        _build()
    except CpuRasterizerUnavailable as error:
        return str(error)
    return None


def cpu_library_loaded(dtype: torch.dtype = torch.float32) -> bool:
    """Whether the compiled library is loaded in this process for ``dtype`` tensors; unlike
    :func:`cpu_rasterizer_error` it never builds it (for helpers such as the MCMC noise, which a
    fit rendering with ``backend="torch"`` should not make compile)."""
    return dtype in SUPPORTED_DTYPES and _loaded()


def cpu_rasterizer_error(dtype: torch.dtype = torch.float32) -> str | None:
    """Why ``backend="cpu"`` cannot render ``dtype`` tensors here, or ``None`` when it can.

    The first call builds the extension (tens of seconds; later processes reuse the build).
    """
    if dtype not in SUPPORTED_DTYPES:
        return f"it supports float32 and float64, not {dtype}"
    return _build_error()


class _Rasterize(torch.autograd.Function):
    """Differentiable wrapper around ``torch.ops.splatzoo_cpu.forward``/``backward``."""

    @staticmethod
    def forward(ctx, means2d, conics, colors, opacities, depths, radii, height, width, tile):
        inputs = [t.contiguous() for t in (means2d, conics, colors, opacities, depths)]
        radii = radii.to(torch.int32).contiguous()
        out, t_final, last, offsets, ids = torch.ops.splatzoo_cpu.forward(
            *inputs, radii, height, width, tile
        )
        ctx.save_for_backward(*inputs, radii, offsets, ids, t_final, last)
        ctx.shape = (height, width, tile)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        *inputs, radii, offsets, ids, t_final, last = ctx.saved_tensors
        height, width, tile = ctx.shape
        grads = torch.ops.splatzoo_cpu.backward(
            *inputs, radii, height, width, tile, offsets, ids, t_final, last,
            grad_out.contiguous(),
        )  # fmt: skip
        v_means2d, v_conics, v_colors, v_opacities, v_depths = grads.split([2, 3, 3, 1, 1], -1)
        return (
            v_means2d,
            v_conics,
            v_colors,
            v_opacities[..., 0],
            v_depths[..., 0],
            None,
            None,
            None,
            None,
        )


def rasterize_cpu(
    means2d: Tensor,
    conics: Tensor,
    colors: Tensor,
    opacities: Tensor,
    depths: Tensor,
    radii: Tensor,
    image_size: tuple[int, int],
    tile_size: int = 16,
) -> Tensor:
    """Composite projected Gaussians into each image (differentiable in the float inputs).

    Args:
        means2d: ``[I, N, 2]`` centres in pixels.
        conics: ``[I, N, 3]`` ``(a, b, c)`` of the inverse 2D covariance.
        colors: ``[I, N, 3]``.
        opacities: ``[I, N]`` (after any compensation).
        depths: ``[I, N]`` camera z.
        radii: ``[I, N, 2]`` integer bounding-box half-sizes, 0 for culled Gaussians.
        image_size: ``(H, W)``.
        tile_size: tile side in pixels.

    Returns:
        ``[I, 5, H, W]``: colour (no background), expected depth ``sum_i w_i z_i`` and alpha.
    """
    error = cpu_rasterizer_error(means2d.dtype)
    if error is not None:
        raise CpuRasterizerUnavailable(f"backend='cpu' is not available: {error}")
    height, width = image_size
    return _Rasterize.apply(
        means2d, conics, colors, opacities, depths, radii, int(height), int(width), int(tile_size)
    )


class _Project(torch.autograd.Function):
    """Differentiable wrapper around ``torch.ops.splatzoo_cpu.project_forward``/``backward``:
    projection and SH colours in one pass, differentiable in the Gaussians' fields and in the
    cameras' view matrices and centres (not in the intrinsics)."""

    @staticmethod
    def forward(ctx, means, scales, rotations, opacities, harmonics, *cameras):
        inputs = [t.contiguous() for t in (means, scales, rotations, opacities, harmonics)]
        *tensors, height, width, eps2d, antialiased = cameras
        tensors = [t.contiguous() for t in tensors]
        outputs = torch.ops.splatzoo_cpu.project_forward(
            *inputs, *tensors, height, width, eps2d, antialiased
        )
        ctx.save_for_backward(*inputs, *tensors)
        ctx.options = (height, width, eps2d, antialiased)
        ctx.mark_non_differentiable(outputs[-1])
        return outputs

    @staticmethod
    @once_differentiable
    def backward(ctx, v_means2d, v_conics, v_colors, v_opacities, v_depths, _v_radii):
        grads = [g.contiguous() for g in (v_means2d, v_conics, v_colors, v_opacities, v_depths)]
        camera_grads = ctx.needs_input_grad[6] or ctx.needs_input_grad[7]
        *fields, v_view, v_centres = torch.ops.splatzoo_cpu.project_backward(
            *ctx.saved_tensors, *ctx.options, *grads, camera_grads
        )
        cameras = (v_view, v_centres) if camera_grads else (None, None)
        return (*fields, None, *cameras, *([None] * 7))


def project_cpu(
    gaussians,
    extrinsics: Tensor,
    intrinsics: Tensor,
    image_size: tuple[int, int],
    near: float | Tensor,
    far: float | Tensor,
    rasterize_mode: str = "classic",
    eps2d: float = EPS2D,
) -> tuple[Tensor, ...]:
    """The compiled projection and SH colours of every scene's Gaussians in each of its views:
    what :func:`models.render.projection.project_views` and ``max(eval_sh(...) + 0.5, 0)``
    compute (the reference the tests compare against), differentiable in the Gaussians' fields and
    the poses (not in the intrinsics).

    Returns:
        ``means2d [B, V, N, 2]``, ``conics [B, V, N, 3]``, ``colors [B, V, N, 3]``,
        ``opacities [B, V, N]`` (compensated in ``"antialiased"`` mode), ``depths [B, V, N]`` and
        ``radii [B, V, N, 2]`` int32 (0 where culled or masked out).
    """
    error = cpu_rasterizer_error(gaussians.means.dtype)
    if error is not None:
        raise CpuRasterizerUnavailable(f"backend='cpu' is not available: {error}")
    batch, views = extrinsics.shape[:2]
    num = gaussians.num_slots
    height, width = image_size
    outputs = _Project.apply(
        gaussians.means,
        gaussians.scales,
        gaussians.rotations,
        gaussians.opacities,
        gaussians.harmonics,
        gaussians.valid_mask().contiguous(),
        world_to_camera(extrinsics),
        extrinsics[..., :3, 3],
        intrinsics_to_pixels(intrinsics, image_size),
        _per_view(near, extrinsics)[..., 0].contiguous(),  # [B, V]
        _per_view(far, extrinsics)[..., 0].contiguous(),
        int(height),
        int(width),
        float(eps2d),
        rasterize_mode == "antialiased",
    )
    return tuple(t.reshape(batch, views, num, *t.shape[2:]) for t in outputs)


def _project_torch(gaussians, extrinsics, intrinsics, image_size, near, far, rasterize_mode, eps2d):
    """:func:`project_cpu`'s outputs from the PyTorch reference (differentiable in the cameras
    too)."""
    views = extrinsics.shape[1]
    projection, valid = project_views(
        gaussians, extrinsics, intrinsics, image_size, near, far, rasterize_mode, eps2d
    )  # valid: [B, V, N]
    radii = projection.radii * valid[..., None]  # [B, V, N, 2]
    centres = extrinsics[..., :3, 3]  # [B, V, 3]
    directions = gaussians.means[:, None] - centres[:, :, None]  # [B, V, N, 3]
    harmonics = gaussians.harmonics[:, None].expand(-1, views, -1, -1, -1)  # [B, V, N, 3, K]
    colors = torch.clamp_min(eval_sh(harmonics, directions) + 0.5, 0.0)  # [B, V, N, 3]
    opacities = gaussians.opacities[:, None].expand(-1, views, -1)  # [B, V, N]
    if projection.compensations is not None:
        opacities = opacities * projection.compensations
    return projection.means2d, projection.conics, colors, opacities, projection.depths, radii


def render_cpu(
    gaussians,
    extrinsics: Tensor,
    intrinsics: Tensor,
    image_size: tuple[int, int],
    background: Tensor,
    near: float | Tensor,
    far: float | Tensor,
    tile_size: int,
    rasterize_mode: str = "classic",
    eps2d: float = EPS2D,
):
    """``render``'s ``"cpu"`` backend (inputs checked and sanitised by ``render``).

    The projection and SH colours are compiled too (:func:`project_cpu`, differentiable in the
    poses) unless the intrinsics need a gradient: then they are PyTorch's.
    """
    batch, views = extrinsics.shape[:2]
    num = gaussians.num_slots
    cameras = (extrinsics, intrinsics, image_size, near, far, rasterize_mode, eps2d)
    if intrinsics.requires_grad:
        projected = _project_torch(gaussians, *cameras)
    else:
        projected = project_cpu(gaussians, *cameras)
    means2d, conics, colors, opacities, depths, radii = projected
    images = batch * views
    out = rasterize_cpu(
        means2d.reshape(images, num, 2),
        conics.reshape(images, num, 3),
        colors.reshape(images, num, 3),
        opacities.reshape(images, num),
        depths.reshape(images, num),
        radii.reshape(images, num, 2),
        image_size,
        tile_size,
    ).reshape(batch, views, 5, *image_size)
    alpha = out[:, :, 4]
    color = out[:, :, :3] + background[..., None, None] * (1.0 - alpha[:, :, None])
    return RenderOutput(color=color, depth=out[:, :, 3], alpha=alpha, radii=radii, means2d=means2d)
