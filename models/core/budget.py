"""Time and peak-memory estimates of big work, announced and bounded before it starts.

    from models.core import budget
    estimate = budget.forward_estimate(model, views=4, size=(512, 512), setting="image_size")
    budget.check(estimate)            # BudgetError (one line naming the setting) if it cannot fit
    budget.announce(estimate)         # one line on stderr when the work is big
    with budget.running(estimate):    # a progress bar (elapsed / estimated) while it runs
        pred = model(context)

``sfm_estimate(photos, size, matching)`` does the same for structure-from-motion, and
``fit_estimate(count, views, image_size, sh_degree, backend)`` for the per-scene fit, with the
largest Gaussian count (the densification cap) that keeps the fit inside the available memory. Callers with
their own loops (whole-capture windows, refinement) add estimates with ``+`` (``a + b`` sums the
seconds, keeps the larger peak) or scale them (``estimate * windows``: the time only). Loops of
like units whose time no formula predicts (a capture's windows, a pose fit's steps) say the rest
from the units' measured times instead: :class:`Countdown` (after three units, revised when off by
more than 2x), :func:`announce_rest`.

How the constants were measured (this project's CPU, 2 cores shared by 8 sessions, load ~7.5,
one thread, so an idle machine is faster; see ``docs/budget.md``):

- forward pass, ``zipsplat_tiny`` (2.1 M parameters) and ``pixel_aligned_tiny`` (2.0 M), 2 views
  at 128² and 512² (the second, warm forward timed; the first one's peak resident memory above
  the resident memory before it, via ``/proc/self/clear_refs``): seconds ≈ params x pixels x
  (3.9e-12 + 1.45e-17 x pixels) (attention makes it grow faster than the pixel count), with
  ``pixels`` = views x H x W; peak ≈ 64 MiB + 8 bytes x params + 900 bytes x pixels (linear fit:
  65 MB at 128², 436 MB at 512² for the pixel-aligned model, the larger of the two);
- SfM (``datamodules.tools.sfm``, the 848x480 drone frames, 2 threads, an idle machine):
  ~0.6 s of SIFT per megapixel-image, 0.04 s per matched pair, 0.037 s x images² of mapping
  (8 frames: 2.0, 1.1 and 2.4 s), times the machine's slowdown measured just before
  (:func:`machine_slowdown`: a short blur pyramid in as many threads, against its idle time);
  the pycolmap process peaked at 715 MB resident.

Memory available is ``MemAvailable`` of ``/proc/meminfo`` (and the cgroup limit when lower), or
the free memory of the CUDA device. This module imports nothing of the project but its errors.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np

from datamodules.errors import InputError

__all__ = [
    "BIG_SECONDS",
    "BudgetError",
    "Countdown",
    "Estimate",
    "FitEstimate",
    "announce",
    "announce_rest",
    "available_memory",
    "check",
    "fit_estimate",
    "forward_estimate",
    "machine_slowdown",
    "running",
    "sfm_estimate",
    "sfm_stage_seconds",
]

# Forward pass: seconds per parameter per input pixel (+ per pixel squared), bytes per pixel.
FORWARD_SECONDS = (3.9e-12, 1.45e-17)
FORWARD_BASE_BYTES = 64 * 2**20
FORWARD_BYTES_PER_PIXEL = 900
# SfM on an idle machine (2 threads; docs/budget.md): SIFT seconds per megapixel-image, seconds
# per matched pair, mapping seconds per image squared (incremental mapping's bundle adjustments
# grow faster than the images). The 8 drone frames at 848x480 took 2.0, 1.1 and 2.4 s with
# nothing else running (probe at 1.0x idle). Scaled by the machine's speed measured just before
# (machine_slowdown); the SfM child scales the stages left by the stages done.
SFM_FEATURE_SECONDS = 0.6
SFM_PAIR_SECONDS = 0.04
SFM_MAP_SECONDS = 0.037
SFM_BASE_BYTES = 720 * 2**20
SFM_BYTES_PER_IMAGE = 2 * 2**20  # keypoints, descriptors and matches kept in memory
# The machine's speed now (machine_slowdown): a blur pyramid (SIFT's kind of work) on a
# PROBE_SIDE² float32 image in each SfM thread, PROBE_PASSES passes; the median pass against
# PROBE_IDLE_SECONDS: the median of 19 probes' medians (13.3-15.3 ms) on this project's 2-core
# AVX2 CPU with nothing else running (under the heavy-job lock, 5 Dec 2026 02:09 UTC, numpy 2.4).
PROBE_SIDE = 512
PROBE_BLURS = 32
PROBE_PASSES = 6
PROBE_IDLE_SECONDS = 0.014
SLOWDOWN_RANGE = (0.25, 20.0)  # a probe's bounds (one pass's hiccup, a far faster machine)
# Work announced (a line and a progress bar) from this many estimated seconds or this share of
# the available memory on.
BIG_SECONDS = 5.0
BIG_MEMORY_SHARE = 0.25


class BudgetError(InputError):
    """The work cannot fit this machine's memory (one line naming the setting to change)."""


@dataclass(frozen=True)
class Estimate:
    """What a piece of work will cost.

    Attributes:
        what: the work, for messages (``"zipsplat_tiny forward, 2 views of 512x512"``).
        seconds: estimated wall time on this project's CPU (order of magnitude).
        peak_bytes: estimated peak memory of the work.
        setting: the setting that makes it smaller (``image_size``, ``views``, ...), for the
            refusal message.
        device: ``"cpu"`` or ``"cuda"``: whose memory it needs.
        fitting_views: the most views of the same size whose peak fits the memory available
            when estimated (models with their own memory model, ``forward_memory``), named in
            the refusal; ``None``: not known.
        view_size: ``(H, W)`` of those views.
    """

    what: str
    seconds: float
    peak_bytes: int
    setting: str = ""
    device: str = "cpu"
    fitting_views: int | None = None
    view_size: tuple[int, int] | None = None

    def __add__(self, other: Estimate) -> Estimate:
        return replace(
            self,
            what=f"{self.what}; {other.what}",
            seconds=self.seconds + other.seconds,
            peak_bytes=max(self.peak_bytes, other.peak_bytes),
        )

    def __mul__(self, times: float) -> Estimate:
        return replace(self, seconds=self.seconds * times)

    @property
    def big(self) -> bool:
        """Worth a line and a progress bar."""
        share = self.peak_bytes / max(available_memory(self.device), 1)
        return self.seconds >= BIG_SECONDS or share >= BIG_MEMORY_SHARE

    def line(self) -> str:
        """``zipsplat_tiny forward, ...: about 2 min, peak about 1.2 GB (of 60 GB available)``."""
        return (
            f"{self.what}: about {_duration(self.seconds)}, peak about "
            f"{_gigabytes(self.peak_bytes)} (of {_gigabytes(available_memory(self.device))} "
            "available)"
        )


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{max(seconds, 0.1):.1f} s" if seconds < 10 else f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _gigabytes(count: int) -> str:
    return f"{count / 1e9:.1f} GB" if count >= 1e8 else f"{count / 1e6:.0f} MB"


def available_memory(device: str = "cpu") -> int:
    """Bytes the work may use now: ``MemAvailable`` (or the cgroup's limit minus its usage,
    when lower) for the CPU, the free device memory for CUDA."""
    if str(device).startswith("cuda"):
        import torch

        if torch.cuda.is_available():
            return int(torch.cuda.mem_get_info()[0])
    available = None
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
    except OSError:
        pass
    if available is None:
        try:
            available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            available = 2**40  # unknown: never refuse
    try:  # a container's limit (cgroup v2)
        limit = open("/sys/fs/cgroup/memory.max", encoding="ascii").read().strip()
        used = int(open("/sys/fs/cgroup/memory.current", encoding="ascii").read())
        if limit != "max":
            available = min(available, int(limit) - used)
    except (OSError, ValueError):
        pass
    return max(int(available), 0)


def forward_estimate(
    model,
    views: int,
    size: tuple[int, int],
    setting: str = "image_size",
    device: str = "cpu",
    name: str | None = None,
) -> Estimate:
    """Time and peak memory of one forward pass of ``model`` (an ``nn.Module``) on ``views``
    images of ``size`` ``(H, W)``: from its parameter count and the input pixels (activations),
    with the constants measured as the module docstring says; ``name`` (the registry name) is
    for messages.

    A model with its own time model (``forward_seconds(views, H, W)``, e.g. AnySplat's and
    NoPoSplat's) is timed by it. A model with its own memory model (``forward_memory(views, H,
    W)`` bytes and ``max_views_within(bytes, H, W)``, e.g. AnySplat's) is estimated by it: the
    setting becomes ``views`` and the estimate carries the view count that fits
    (``fitting_views``)."""
    params = sum(p.numel() for p in model.parameters())
    height, width = int(size[0]), int(size[1])
    pixels = int(views) * height * width
    a, b = FORWARD_SECONDS
    seconds = params * pixels * (a + b * pixels)
    peak = FORWARD_BASE_BYTES + 8 * params + FORWARD_BYTES_PER_PIXEL * pixels
    kind = "cuda" if "cuda" in str(device) else "cpu"
    fitting = None
    if callable(getattr(model, "forward_memory", None)):
        peak = model.forward_memory(int(views), height, width)
        fitting = model.max_views_within(available_memory(kind), height, width)
        setting = "views"
    if callable(getattr(model, "forward_seconds", None)):
        seconds = model.forward_seconds(int(views), height, width)
    if kind == "cuda":
        seconds /= 50.0  # order of magnitude only: the constants are CPU measurements
    name = name or type(model).__name__
    what = f"{name} forward pass, {views} view(s) of {height}x{width}"
    return Estimate(what, seconds, int(peak), setting, kind, fitting, (height, width))


def sfm_stage_seconds(
    photos: int,
    size: tuple[int, int],
    matching: str,
    overlap: int = 10,
    max_image_size: int = 1600,
    threads: int = 2,
    slowdown: float = 1.0,
) -> dict[str, float]:
    """Estimated seconds of each stage of structure-from-motion (``features``, ``matching``,
    ``mapping``) on ``photos`` images of ``size`` ``(W, H)`` (the largest), ``matching``
    ``"exhaustive"`` or ``"sequential"`` (with ``overlap``), on a machine ``slowdown`` times
    slower than idle (:func:`machine_slowdown`, measured just before). The SfM child says the
    rest again after each stage, scaled by how long the stages so far took against these."""
    megapixels = _sfm_megapixels(size, max_image_size)
    speed = float(slowdown) * 2.0 / max(min(threads, os.cpu_count() or 1), 1)
    return {
        "features": speed * SFM_FEATURE_SECONDS * photos * megapixels,
        "matching": speed * SFM_PAIR_SECONDS * _sfm_pairs(photos, matching, overlap),
        "mapping": speed * SFM_MAP_SECONDS * photos**2,
    }


def _sfm_megapixels(size: tuple[int, int], max_image_size: int) -> float:
    """Megapixels of an image of ``size`` ``(W, H)`` once SfM scales it to ``max_image_size``."""
    width, height = int(size[0]), int(size[1])
    scale = min(1.0, max_image_size / max(width, height, 1))
    return width * height * scale**2 / 1e6


def _sfm_pairs(photos: int, matching: str, overlap: int) -> int:
    if matching == "exhaustive":
        return photos * (photos - 1) // 2
    return photos * min(overlap, max(photos - 1, 0))


def machine_slowdown(threads: int = 2, clock=time.perf_counter) -> float:
    """How many times slower than idle this machine runs structure-from-motion's kind of work
    now (its other work shares the cores): a blur pyramid of a ``PROBE_SIDE``² float32 image,
    ``PROBE_PASSES`` times over, in each of ``threads`` threads at once (as many as SfM runs, at
    most the cores); the median pass, each thread's first left out (a thread that just woke is
    scheduled ahead of the machine's running work), against :data:`PROBE_IDLE_SECONDS`, within
    :data:`SLOWDOWN_RANGE`. About 0.1 s on an idle machine, ``slowdown`` x that on a busy one.
    ``clock``: seconds (a test's fake clock)."""
    count = max(min(int(threads), os.cpu_count() or 1), 1)
    images = np.random.default_rng(0).random((count, PROBE_SIDE**2), dtype=np.float32)
    scratch = np.empty_like(images)
    passes: list[list[float]] = [[] for _ in range(count)]

    def run(index: int) -> None:
        start = clock()
        for _ in range(PROBE_PASSES):
            _blur_pyramid(images[index], scratch[index])
            end = clock()
            passes[index].append(end - start)
            start = end

    workers = [threading.Thread(target=run, args=(index,)) for index in range(count)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    timed = sorted(seconds for thread in passes for seconds in thread[1:])
    ratio = timed[len(timed) // 2] / PROBE_IDLE_SECONDS
    return min(max(ratio, SLOWDOWN_RANGE[0]), SLOWDOWN_RANGE[1])


def _blur_pyramid(image: np.ndarray, scratch: np.ndarray) -> None:
    """``PROBE_BLURS`` separable [1 4 6 4 1] / 16 blurs (a row pass and a column pass each) of a
    flattened ``[PROBE_SIDE²]`` image in place: a shift of 1 is a row neighbour, of
    ``PROBE_SIDE`` a column neighbour (contiguous 1-D operations: numpy releases the GIL, so the
    threads run at once, as SIFT's do)."""
    for step in [1, PROBE_SIDE] * PROBE_BLURS:
        count = image.size - 4 * step
        out = scratch[:count]
        np.multiply(image[2 * step : 2 * step + count], 6.0, out=out)
        out += 4.0 * (image[step : step + count] + image[3 * step : 3 * step + count])
        out += image[:count]
        out += image[4 * step : 4 * step + count]
        np.multiply(out, 1.0 / 16.0, out=image[2 * step : 2 * step + count])


def sfm_estimate(
    photos: int,
    size: tuple[int, int],
    matching: str,
    overlap: int = 10,
    max_image_size: int = 1600,
    threads: int = 2,
    slowdown: float = 1.0,
) -> Estimate:
    """Time (:func:`sfm_stage_seconds`, summed) and peak memory of structure-from-motion on
    ``photos`` images of ``size`` ``(W, H)`` (the largest), ``matching`` ``"exhaustive"`` or
    ``"sequential"`` (with ``overlap``), on a machine ``slowdown`` times slower than idle."""
    width, height = int(size[0]), int(size[1])
    megapixels = _sfm_megapixels(size, max_image_size)
    stages = sfm_stage_seconds(photos, size, matching, overlap, max_image_size, threads, slowdown)
    pairs = _sfm_pairs(photos, matching, overlap)
    peak = SFM_BASE_BYTES + SFM_BYTES_PER_IMAGE * photos + int(40e6 * megapixels)
    what = f"sfm: {photos} photos of {width}x{height}, {matching} matching ({pairs} pairs)"
    if round(slowdown, 1) != 1.0:
        what = f"{what}; {slowdown:.1f}x the idle time (the machine's speed now, measured)"
    return Estimate(what, sum(stages.values()), int(peak), "the number of photos")


@dataclass(frozen=True)
class FitEstimate:
    """Memory of a per-scene fit (:func:`fit_estimate`).

    Attributes:
        peak_bytes: the fit's peak with ``count`` Gaussians.
        available: bytes it may use (the limit given, else the device's available memory).
        max_count: the largest count whose peak fits in ``available`` (0: not even one: the
            per-pixel buffers alone do not fit).
    """

    peak_bytes: int
    available: int
    max_count: int

    @property
    def fits(self) -> bool:
        return self.peak_bytes <= self.available


def fit_estimate(
    count: int,
    views: int,
    image_size: tuple[int, int],
    sh_degree: int,
    backend: str,
    device: str = "cpu",
    memory_limit: int | None = None,
) -> FitEstimate:
    """Peak memory of the per-scene fit (``models.pipeline.refine``) and the largest count that fits.

    A documented estimate, within about 2x of measurements. Per Gaussian: the raw parameters,
    their gradients and two Adam moments (``4 x (14 + 3 (d+1)^2)`` floats), the activated set and
    the projection of one view (about 80 floats), and its tile entries in the rasteriser (about 8
    tiles, 3 words each). Per photo: the fitted image. Per pixel of the view being fitted: the
    loss's SSIM maps and the renderer's buffers (about 60 floats; the torch backend composites up
    to ``2^20`` tile-pixel-Gaussian entries at a time, about 24 floats each).
    """
    height, width = int(image_size[0]), int(image_size[1])
    per_gaussian = 4 * (4 * (14 + 3 * (int(sh_degree) + 1) ** 2) + 80 + 24)
    pixels = height * width
    fixed = int(views) * 3 * pixels * 4 + 4 * 60 * pixels
    if backend == "torch":
        fixed += 4 * 24 * (1 << 20)
    available = int(memory_limit) if memory_limit else available_memory(device)
    peak = int(count) * per_gaussian + fixed
    return FitEstimate(peak, available, max(0, (available - fixed) // per_gaussian))


def check(estimate: Estimate) -> None:
    """Refuse work whose peak memory exceeds what is available now.

    Raises:
        BudgetError: ``<setting>: <work> needs about X GB, Y GB available: lower <setting>``
            (with ``at most N view(s) of HxW fit`` when the estimate knows ``fitting_views``).
    """
    available = available_memory(estimate.device)
    if estimate.peak_bytes > available:
        where = "on the GPU" if estimate.device == "cuda" else "on this machine"
        lower = f"lower {estimate.setting or 'the input'}"
        if estimate.fitting_views is not None:
            size = "x".join(str(side) for side in estimate.view_size or ())
            fit = estimate.fitting_views
            lower = (
                f"at most {fit} view(s) of {size} fit; {lower}"
                if fit
                else f"not even one view of {size} fits; lower image_size"
            )
        raise BudgetError(
            estimate.setting or "input",
            f"{estimate.what} needs about {_gigabytes(estimate.peak_bytes)} of memory, "
            f"{_gigabytes(available)} available {where}: {lower}",
        )


def announce(estimate: Estimate, force: bool = False) -> bool:
    """Print ``estimate.line()`` on stderr when the work is big (or ``force``); returns whether
    it printed."""
    if not (force or estimate.big):
        return False
    print(estimate.line(), file=sys.stderr, flush=True)
    return True


def announce_rest(
    what: str, unit_seconds: float, remaining: int, unit: str, more: float = 0.0
) -> float:
    """Say how long the rest of a loop takes, calibrated on a measured unit (for work whose cost
    no formula predicts well: it depends on the scene and on the machine's load): ``remaining``
    units at ``unit_seconds`` each, plus ``more`` seconds. Prints ``<what>: about 2 min more
    (39 windows at 2.9 s each, measured)`` on stderr when that is :data:`BIG_SECONDS` or more;
    returns the estimate in seconds."""
    rest = float(unit_seconds) * max(int(remaining), 0) + float(more)
    if rest >= BIG_SECONDS:
        print(
            f"{what}: about {_duration(rest)} more ({remaining} {unit}(s) at "
            f"{_duration(unit_seconds)} each, measured)",
            file=sys.stderr,
            flush=True,
        )
    return rest


class Countdown:
    """Says how long the rest of a loop of like units (a capture's windows, a pose fit's steps)
    takes, from their measured times (:meth:`unit_seconds`): after the first three (after two
    when the loop has three, or when the two took :data:`BIG_SECONDS` x 2 or more: slow units
    are not waited for), and again, marked ``revised``, when the rest at the median of the last
    five is off by more than 2x from what was said (the first units of a model can be slower
    than the rest many times over, or faster; on a shared machine one unit's time swings several
    times with the other work)."""

    def __init__(self, what: str, total: int, unit: str, said: float | None = None) -> None:
        """``said``: the whole loop's time, when it was said up front from a formula (then only
        its revisions are said, measured as above)."""
        self.what, self.total, self.unit = what, int(total), unit
        self.times: list[float] = []
        self.expected: float | None = said  # the rest said, less the units done since

    def unit_seconds(self) -> float:
        """The time of one unit to come: the median of the last five (one unit off, the first's
        warm-up or a spike of the machine's other work, moves it little); of two, the faster
        (the first one's warm-up is the likelier outlier)."""
        if len(self.times) == 2:
            return min(self.times)
        recent = sorted(self.times[-5:])
        middle = len(recent) // 2
        return recent[middle] if len(recent) % 2 else (recent[middle - 1] + recent[middle]) / 2

    def _ready(self) -> bool:
        """Whether the first line is due: three units, or two that are slow or all but one."""
        count = len(self.times)
        if count >= 3:
            return True
        return count == 2 and (self.total <= 3 or sum(self.times) >= 2 * BIG_SECONDS)

    def done(self, seconds: float) -> None:
        """One more unit took ``seconds``."""
        self.times.append(float(seconds))
        if self.expected is not None:
            self.expected = max(self.expected - self.times[-1], 0.0)
        remaining = self.total - len(self.times)
        if remaining <= 0 or (self.expected is None and not self._ready()) or len(self.times) < 2:
            return
        unit = self.unit_seconds()
        rest = unit * remaining
        if self.expected is not None and (
            self.expected / 2 <= rest <= 2 * self.expected + BIG_SECONDS / 2
        ):
            return
        what = self.what if self.expected is None else f"{self.what} (revised)"
        self.expected = announce_rest(what, unit, remaining, self.unit)


@contextlib.contextmanager
def running(estimate: Estimate, enabled: bool | None = None) -> Iterator[None]:
    """A tqdm bar of elapsed against estimated seconds while the block runs (one opaque call,
    such as a forward pass, has no steps to count); by default only for big work."""
    if enabled is None:
        enabled = estimate.big
    if not enabled:
        yield
        return
    from tqdm.auto import tqdm

    total = max(math.ceil(estimate.seconds), 1)
    bar = tqdm(total=total, desc=estimate.what, unit="s", leave=False, dynamic_ncols=True)
    done = threading.Event()

    def tick() -> None:
        start = time.monotonic()
        while not done.wait(0.5):
            bar.n = min(int(time.monotonic() - start), total - 1)
            bar.refresh()

    thread = threading.Thread(target=tick, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        bar.close()
