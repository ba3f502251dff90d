"""GPU check: the PyTorch renderer against gsplat on CUDA, and the timing of both.

Meant for a lent GPU machine (run through ``bench/gpu_check.sh``, which installs the carried gsplat
wheel first). It

1. builds (JIT) and loads gsplat's CUDA extension, timing the build;
2. renders random scenes (batches of scenes and views, SH degrees 0 and 3, a mask, backgrounds),
   a synthetic 150k-point "garden-like" scene with 3 cameras at 648x420 and, when the file is
   found, the real garden scene, with ``backend="torch"`` and ``backend="gsplat"``, and prints
   their differences (colour, depth, alpha, radii) and the agreement of their gradients;
3. times forward and forward+backward of both backends;
4. times ``create_model(name)`` + ``render`` for the models named with ``--models`` (the hook
   :func:`reconstruction_timing`, for per-family reconstruction timing);
5. times a per-scene refinement step (``models.pipeline.refine.refine_gaussians``) with
   ``backend="gsplat"`` and ``backend="torch"`` on CUDA and the compiled ``"cpu"`` backend on the
   CPU (:func:`refine_timing`: 50k Gaussians, 8 photos at 240x136, MCMC densification), split
   into forward / backward / densify / optimizer. A backend that fails or whose loss does not
   fall counts as a failed check (exit status 1), never silently.

Everything prints Markdown tables. The run is sized for a few minutes of one GPU, most of it
gsplat's first build.

    python bench/gpu_check.py [--garden PATH] [--models NAME ...] [--quick]
        [--refine-steps N] [--refine-backends gsplat torch cpu]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from data_fixtures import GARDEN, garden_scene  # noqa: E402

from models.core.gaussians import Gaussians, rgb_to_sh  # noqa: E402
from models.geometry.cameras import intrinsics_to_normalized  # noqa: E402
from models.render.core import render  # noqa: E402
from models.render.output import RenderOutput  # noqa: E402

GARDEN_CANDIDATES = [
    GARDEN,
    REPO / "shared" / "data" / "gsplat_test_garden.npz",
    REPO / ".data" / "gsplat_test_garden.npz",
]


# ------------------------------------------------------------------------------------ scenes
def random_scene(
    batch: int, num: int, degree: int, device: torch.device, seed: int = 0
) -> tuple[Gaussians, torch.Tensor, torch.Tensor]:
    """Random anisotropic Gaussians in front of ``views = 3`` cameras per scene, with a mask."""
    g = torch.Generator().manual_seed(seed)
    z = 2.0 + 6.0 * torch.rand(batch, num, generator=g)
    xy = (torch.rand(batch, num, 2, generator=g) - 0.5) * 1.2 * z[..., None]
    means = torch.cat([xy, z[..., None]], dim=-1)
    scales = torch.exp(math.log(0.005) + math.log(20.0) * torch.rand(batch, num, 3, generator=g))
    rotations = torch.nn.functional.normalize(torch.randn(batch, num, 4, generator=g), dim=-1)
    opacities = 0.05 + 0.9 * torch.rand(batch, num, generator=g)
    harmonics = 0.3 * torch.randn(batch, num, 3, (degree + 1) ** 2, generator=g)
    harmonics[..., 0] = rgb_to_sh(torch.rand(batch, num, 3, generator=g))
    mask = torch.rand(batch, num, generator=g) > 0.1
    gaussians = Gaussians(means, scales, rotations, opacities, harmonics, mask)
    extrinsics = torch.eye(4).repeat(batch, 3, 1, 1)
    for v in range(3):
        angle = torch.tensor(0.1 * (v - 1))
        c, s = torch.cos(angle), torch.sin(angle)
        extrinsics[:, v, :3, :3] = torch.tensor([[c, 0, s], [0, 1, 0], [-s, 0, c]])
        extrinsics[:, v, :3, 3] = torch.tensor([0.3 * (v - 1), 0.05 * v, -0.1 * v])
    intrinsics = torch.tensor([[0.9, 0.0, 0.5], [0.0, 0.95, 0.47], [0.0, 0.0, 1.0]])
    intrinsics = intrinsics.repeat(batch, 3, 1, 1)
    return gaussians.to(device), extrinsics.to(device), intrinsics.to(device)


def look_at(eye: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Camera-to-world 4x4 (OpenCV axes) of a camera at ``eye`` looking at ``target``, -y up."""
    forward = torch.nn.functional.normalize(target - eye, dim=0)
    right = torch.nn.functional.normalize(
        torch.linalg.cross(forward, torch.tensor([0.0, -1, 0])), dim=0
    )
    down = torch.linalg.cross(forward, right)
    pose = torch.eye(4)
    pose[:3, :3] = torch.stack([right, down, forward], dim=1)
    pose[:3, 3] = eye
    return pose


def synthetic_garden(
    device: torch.device, num: int = 150_000, seed: int = 0
) -> tuple[Gaussians, torch.Tensor, torch.Tensor, tuple[int, int]]:
    """A garden-like point cloud: a textured ground, bushes (spheres) and a back wall, 3 cameras.

    Points are small isotropic Gaussians (scale 0.01, opacity 0.8), as the garden test uses, so
    this stands in for ``gsplat_test_garden.npz`` when that file is not on the machine.
    """
    g = torch.Generator().manual_seed(seed)
    n_ground, n_wall = num // 2, num // 6
    n_bush = num - n_ground - n_wall
    ground = torch.stack(
        [
            (torch.rand(n_ground, generator=g) - 0.5) * 6,
            torch.full((n_ground,), 1.0),
            (torch.rand(n_ground, generator=g) - 0.5) * 6,
        ],
        dim=1,
    )
    wall = torch.stack(
        [
            (torch.rand(n_wall, generator=g) - 0.5) * 6,
            1.0 - 2.5 * torch.rand(n_wall, generator=g),
            torch.full((n_wall,), 3.0),
        ],
        dim=1,
    )
    centres = torch.tensor([[-1.0, 0.5, 0.5], [0.8, 0.4, 1.2], [0.0, 0.3, -0.6], [1.5, 0.6, -1.0]])
    radii = torch.tensor([0.5, 0.6, 0.7, 0.4])
    which = torch.randint(0, 4, (n_bush,), generator=g)
    directions = torch.nn.functional.normalize(torch.randn(n_bush, 3, generator=g), dim=1)
    bush = centres[which] + directions * radii[which, None]
    means = torch.cat([ground, wall, bush])
    phase = means @ torch.tensor([3.1, 1.7, 2.3])
    rgb = torch.stack(
        [
            0.5 + 0.4 * torch.sin(phase),
            0.6 + 0.3 * torch.cos(1.3 * phase),
            0.4 + 0.3 * torch.sin(0.7 * phase + 1),
        ],
        1,
    )
    count = means.shape[0]
    gaussians = Gaussians(
        means=means[None],
        scales=torch.full((1, count, 3), 0.01),
        rotations=torch.tensor([1.0, 0.0, 0.0, 0.0]).repeat(1, count, 1),
        opacities=torch.full((1, count), 0.8),
        harmonics=rgb_to_sh(rgb.clamp(0, 1))[None, ..., None],
    )
    target = torch.tensor([0.0, 0.5, 0.5])
    eyes = [
        torch.tensor([-1.5, -0.8, -3.5]),
        torch.tensor([0.0, -1.0, -3.8]),
        torch.tensor([1.6, -0.7, -3.4]),
    ]
    extrinsics = torch.stack([look_at(eye, target) for eye in eyes])[None]
    height, width = 420, 648
    ks = torch.tensor([[480.6, 0.0, 324.2], [0.0, 481.5, 210.1], [0.0, 0.0, 1.0]])
    intrinsics = intrinsics_to_normalized(ks, (height, width)).repeat(1, 3, 1, 1)
    return gaussians.to(device), extrinsics.to(device), intrinsics.to(device), (height, width)


def garden(
    path: Path, device: torch.device
) -> tuple[Gaussians, torch.Tensor, torch.Tensor, tuple[int, int]]:
    """The real garden points (gsplat's test asset) as Gaussians of scale 0.01, opacity 0.8."""
    gaussians, extrinsics, intrinsics, shape = garden_scene(path)
    return gaussians.to(device), extrinsics.to(device), intrinsics.to(device), shape


# ------------------------------------------------------------------------------------ checks
def timed(fn: Callable[[], object], repeats: int) -> float:
    """Median wall time in ms of ``fn`` after one warm-up call, synchronising CUDA."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    fn()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append(1e3 * (time.perf_counter() - start))
    return statistics.median(times)


def compare(ours: RenderOutput, ref: RenderOutput) -> dict[str, float]:
    """Differences between two renders (torch backend first, gsplat second)."""
    color = (ours.color - ref.color).abs()
    alpha = (ours.alpha - ref.alpha).abs()
    depth_scale = ref.depth.abs().max().clamp_min(1e-6)
    depth = (ours.depth - ref.depth).abs() / depth_scale
    visible = (ref.radii > 0).all(-1)
    return {
        "color max": color.max().item(),
        "color mean": color.mean().item(),
        "color >1e-4": (color > 1e-4).float().mean().item(),
        "alpha max": alpha.max().item(),
        "depth max (rel)": depth.max().item(),
        "radii equal": (ours.radii == ref.radii).all(-1).float().mean().item(),
        "means2d max": (ours.means2d - ref.means2d)[visible].abs().max().item()
        if visible.any()
        else 0.0,
    }


def gradient_agreement(
    gaussians: Gaussians, extrinsics: torch.Tensor, intrinsics: torch.Tensor, shape: tuple[int, int]
) -> dict[str, float]:
    """Cosine similarity of the two backends' gradients of one loss, per parameter."""
    names = ("means", "scales", "rotations", "opacities", "harmonics")
    grads = []
    weight = None
    for backend in ("torch", "gsplat"):
        params = {k: getattr(gaussians, k).detach().clone().requires_grad_(True) for k in names}
        scene = Gaussians(**params, mask=gaussians.mask)
        out = render(scene, extrinsics, intrinsics, shape, backend=backend)
        if weight is None:
            generator = torch.Generator(out.color.device).manual_seed(0)
            weight = torch.rand(out.color.shape, generator=generator, device=out.color.device)
        loss = (weight * out.color).sum() + 0.1 * out.depth.sum() + out.alpha.sum()
        grads.append(torch.autograd.grad(loss, list(params.values())))
    return {
        name: torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0).item()
        for name, a, b in zip(names, *grads)
    }


def print_table(title: str, rows: list[dict[str, object]]) -> None:
    print(f"\n### {title}\n")
    if not rows:
        print("(nothing)")
        return
    keys = list(rows[0])
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for row in rows:
        cells = [f"{v:.3g}" if isinstance(v, float) else str(v) for v in (row[k] for k in keys)]
        print("| " + " | ".join(cells) + " |")
    sys.stdout.flush()


def time_backends(
    gaussians: Gaussians,
    extrinsics: torch.Tensor,
    intrinsics: torch.Tensor,
    shape: tuple[int, int],
    background: torch.Tensor | None,
    repeats: int,
) -> dict[str, float]:
    """Forward and forward+backward times and peak memory of both backends on one scene."""
    params = [gaussians.means, gaussians.scales, gaussians.opacities, gaussians.harmonics]
    row: dict[str, float] = {}
    for backend in ("gsplat", "torch"):

        def forward(backend: str = backend) -> None:
            with torch.no_grad():
                render(gaussians, extrinsics, intrinsics, shape, background, backend=backend)

        def forward_backward(backend: str = backend) -> None:
            for p in params:
                p.requires_grad_(True)
                p.grad = None
            out = render(gaussians, extrinsics, intrinsics, shape, background, backend=backend)
            (out.color.square().sum() + out.depth.sum()).backward()
            for p in params:
                p.requires_grad_(False)

        count = repeats if backend == "gsplat" else min(repeats, 3)  # the slow one: fewer
        torch.cuda.reset_peak_memory_stats()
        row[f"{backend} fwd ms"] = timed(forward, count)
        row[f"{backend} fwd+bwd ms"] = timed(forward_backward, count)
        row[f"{backend} peak GB (scene incl.)"] = torch.cuda.max_memory_allocated() / 2**30
    return row


# ------------------------------------------------------------------------------------ refine
def refine_capture(
    count: int = 50_000, views: int = 8, shape: tuple[int, int] = (136, 240), seed: int = 0
) -> tuple[Gaussians, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A synthetic capture for the refinement timing (CPU tensors): ``count`` Gaussians in front
    of ``views`` orbit cameras, their renders ``[V, 3, H, W]`` (torch backend) as the photos, and
    a start: the same means jittered, grey, half as many."""
    from models.geometry.camera_paths import orbit_cameras
    from models.pipeline.refine import gaussians_from_points

    g = torch.Generator().manual_seed(seed)
    means = torch.randn(count, 3, generator=g) * 0.6 + torch.tensor([0.0, 0.0, 3.0])
    truth = Gaussians(
        means=means[None],
        scales=(torch.rand(count, 3, generator=g) * 0.03 + 0.005)[None],
        rotations=torch.nn.functional.normalize(torch.randn(count, 4, generator=g), dim=-1)[None],
        opacities=(torch.rand(count, generator=g) * 0.5 + 0.5)[None],
        harmonics=rgb_to_sh(torch.rand(count, 3, generator=g))[None, :, :, None],
    )
    k = torch.tensor([[1.0, 0.0, 0.5], [0.0, 16 / 9, 0.5], [0.0, 0.0, 1.0]])
    extrinsics, intrinsics = orbit_cameras(torch.eye(4), 3.0, k, views, 1.0)
    with torch.no_grad():
        photos = render(truth, extrinsics[None], intrinsics[None], shape, backend="torch").color[0]
    half = means[::2] + 0.02 * torch.randn(count // 2 + count % 2, 3, generator=g)
    start = gaussians_from_points(half, torch.full_like(half, 0.5), sh_degree=1)
    return start, photos.clamp(0, 1), extrinsics, intrinsics


def refine_timing(
    backends: list[str], steps: int = 60, count: int = 50_000, views: int = 8
) -> tuple[list[dict[str, object]], int]:
    """Rows of the refinement step timing per backend (``"gsplat"``/``"torch"`` on CUDA,
    ``"cpu"`` on the CPU) and the number of failed checks: a backend that raises, or whose loss
    does not fall over ``steps`` steps, fails (reported in its row with the error)."""
    from models.pipeline.refine import RefineSettings, refine_gaussians

    start, photos, extrinsics, intrinsics = refine_capture(count, views)
    rows: list[dict[str, object]] = []
    failures = 0
    for backend in backends:
        device = torch.device("cpu" if backend == "cpu" else "cuda")
        settings = RefineSettings(steps=steps, size=photos.shape[-1], backend=backend)
        settings.mcmc.start = settings.mcmc.every = max(1, steps // 3)
        try:
            if device.type == "cuda":
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            begin = time.perf_counter()
            result = refine_gaussians(
                start.to(device),
                photos.to(device),
                extrinsics.to(device),
                intrinsics.to(device),
                settings,
                progress=False,
            )
            if device.type == "cuda":
                torch.cuda.synchronize()
            wall = time.perf_counter() - begin
            first, last = result.curve[0]["loss"], result.curve[-1]["loss"]
            ok = result.steps == steps and result.stopped == "steps" and last < first
            split = {k: f"{1000 * v / steps:.1f}" for k, v in result.timings.items()}
            rows.append({
                "backend": backend, "device": device.type, "steps": result.steps,
                "ms/step": f"{1000 * wall / steps:.1f}",
                **{f"{k} ms": v for k, v in split.items()},
                "Gaussians": f"{result.count_before}->{result.count_after}",
                "loss": f"{first:.4f}->{last:.4f}",
                "peak GB": f"{torch.cuda.max_memory_allocated() / 2**30:.2f}"
                if device.type == "cuda" else "-",
                "ok": "yes" if ok else "NO",
            })  # fmt: skip
            failures += not ok
        except Exception as error:  # a failed backend is a failed check, shown in its row
            traceback.print_exc()
            rows.append({"backend": backend, "device": device.type,
                         "ms/step": f"error: {error}"[:100], "ok": "NO"})  # fmt: skip
            failures += 1
    return rows, failures


# ------------------------------------------------------------------------------------ hook
def reconstruction_timing(
    model_names: list[str],
    device: torch.device,
    resolution: int = 256,
    context_views: int = 2,
    repeats: int = 5,
) -> list[dict[str, object]]:
    """HOOK for per-family reconstruction timing: ``create_model(name)`` forward + ``render``.

    For each name: random weights, a batch of one scene with ``context_views`` random images at
    ``resolution``, one forward pass (``pred = model(context)``) and one render of the predicted
    Gaussians into the context views with the auto backend; median times over ``repeats``.
    Families that need more (their own budget knobs, e.g. ``compression=`` or ``iterations=``)
    extend this function; a model that fails is reported in its row, not raised.
    """
    rows: list[dict[str, object]] = []
    for name in model_names:
        try:
            rows.append(_time_model(name, device, resolution, context_views, repeats))
        except Exception as error:  # report and go on with the next model
            rows.append({"model": name, "Gaussians": "-", "forward ms": f"error: {error}"[:80],
                         "render ms": "-", "peak GB": "-"})  # fmt: skip
    return rows


def _time_model(
    name: str, device: torch.device, resolution: int, context_views: int, repeats: int
) -> dict[str, object]:
    """One row of :func:`reconstruction_timing`."""
    from models import create_model

    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    model = create_model(name, pretrained=False).to(device).eval()
    images = torch.rand(1, context_views, 3, resolution, resolution, device=device)
    extrinsics = torch.eye(4, device=device).repeat(1, context_views, 1, 1)
    extrinsics[0, 1:, 0, 3] = 0.2 * torch.arange(1, context_views, device=device)
    intrinsics = torch.tensor(
        [[0.9, 0.0, 0.5], [0.0, 0.9, 0.5], [0.0, 0.0, 1.0]], device=device
    ).repeat(1, context_views, 1, 1)
    context = {
        "image": images,
        "extrinsics": extrinsics,
        "intrinsics": intrinsics,
        "near": torch.full((1, context_views), 0.5, device=device),
        "far": torch.full((1, context_views), 100.0, device=device),
    }
    with torch.no_grad():
        pred = model(context)
        forward_ms = timed(lambda: model(context), repeats)
        render_ms = timed(
            lambda: render(pred.gaussians, extrinsics, intrinsics, (resolution, resolution)),
            repeats,
        )
    return {
        "model": name,
        "Gaussians": int(pred.gaussians.count().max()),
        "forward ms": forward_ms,
        "render ms": render_ms,
        "peak GB": torch.cuda.max_memory_allocated() / 2**30 if cuda else float("nan"),
    }


# one model per family (the zoo's tiny models): their reconstruction + render time at 256^2
FAMILY_MODELS = (
    "pixel_aligned_tiny",
    "noposplat_tiny",
    "zipsplat_tiny",
    "resplat_tiny",
    "splatweaver_tiny",
)


# ------------------------------------------------------------------------------------ main
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--garden", type=Path, default=None, help="gsplat_test_garden.npz")
    parser.add_argument(
        "--models",
        nargs="*",
        default=list(FAMILY_MODELS),
        help="models to time at 256x256 with 2 views (default: the tiny model of each family)",
    )
    parser.add_argument("--quick", action="store_true", help="fewer scenes and repeats")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--refine-steps", type=int, default=60, help="refinement steps timed per backend (0: none)"
    )
    parser.add_argument(
        "--refine-backends",
        nargs="*",
        default=["gsplat", "torch", "cpu"],
        choices=["gsplat", "torch", "cpu"],
        help="backends of the refinement step timing",
    )
    args = parser.parse_args()
    if args.refine_steps < 0:
        parser.error("--refine-steps must be >= 0")
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to check")
        return 2
    device = torch.device("cuda")
    print(
        f"torch {torch.__version__}, {torch.cuda.get_device_name(device)}, Python {sys.version.split()[0]}"
    )

    start = time.perf_counter()
    try:
        import gsplat
        from gsplat.cuda._backend import _C  # triggers the JIT build on the first import
    except Exception:
        traceback.print_exc()
        print("gsplat could not be imported or built")
        return 1
    print(f"gsplat {gsplat.__version__}: extension ready in {time.perf_counter() - start:.1f} s "
          f"({'loaded' if _C is not None else 'MISSING'})")  # fmt: skip
    if _C is None:
        return 1
    failures = 0

    # -- parity
    rows = []
    cases = [(2, 4000, 0, (120, 136)), (2, 20000, 3, (256, 256))]
    if not args.quick:
        cases.append((1, 65536, 1, (384, 512)))
    scenes = []
    for batch, num, degree, shape in cases:
        gaussians, extrinsics, intrinsics = random_scene(batch, num, degree, device)
        background = torch.rand(batch, 3, 3, device=device)
        scenes.append((f"random B={batch} V=3 N={num} d={degree} {shape[1]}x{shape[0]}",
                       gaussians, extrinsics, intrinsics, shape, background))  # fmt: skip
    synthetic = synthetic_garden(device)
    scenes.append(("synthetic garden 150k, 3 cams 648x420", *synthetic, None))
    garden_path = args.garden or next((p for p in GARDEN_CANDIDATES if p.is_file()), None)
    if garden_path is not None and garden_path.is_file():
        scenes.append(("garden 138,766, 3 cams 648x420", *garden(garden_path, device), None))
    else:
        print("real garden scene not found (pass --garden PATH); synthetic scene only")
    for label, gaussians, extrinsics, intrinsics, shape, background in scenes:
        with torch.no_grad():
            ours = render(gaussians, extrinsics, intrinsics, shape, background, backend="torch")
            ref = render(gaussians, extrinsics, intrinsics, shape, background, backend="gsplat")
        row = {"scene": label, **compare(ours, ref)}
        ok = row["color >1e-4"] < 1e-3 and row["color mean"] < 1e-5 and row["alpha max"] < 0.05
        row["ok"] = "yes" if ok else "NO"
        failures += not ok
        rows.append(row)
    print_table("parity: torch backend vs gsplat (differences)", rows)

    small, extrinsics, intrinsics = random_scene(1, 3000, 2, device, seed=1)
    agreement = gradient_agreement(small, extrinsics, intrinsics, (96, 128))
    print_table("gradients: cosine similarity torch vs gsplat (1x3 views, 3000 Gaussians)",
                [{k: v for k, v in agreement.items()}])  # fmt: skip
    failures += any(v < 0.99 for v in agreement.values())

    # -- timing
    repeats = 3 if args.quick else args.repeats
    rows = [{"scene": scene[0], **time_backends(*scene[1:], repeats)} for scene in scenes]
    print_table(
        f"timing (median of {repeats} gsplat / {min(repeats, 3)} torch calls, CUDA synchronised)",
        rows,
    )

    # -- hook: per-family reconstruction timing
    if args.models:
        print_table("reconstruction: create_model(name) forward + render",
                    reconstruction_timing(args.models, device))  # fmt: skip

    # -- per-scene refinement step
    if args.refine_steps:
        steps = max(10, args.refine_steps // 2) if args.quick else args.refine_steps
        rows, failed = refine_timing(args.refine_backends, steps)
        print_table(
            f"refinement: {steps} steps of refine_gaussians, 50k Gaussians, 8 photos 240x136, "
            "MCMC (ms per step; forward = render + loss)",
            rows,
        )
        failures += failed

    print(f"\ntotal {time.perf_counter() - start:.0f} s, {failures} failed check(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
