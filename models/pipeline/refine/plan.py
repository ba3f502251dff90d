"""What a fit will cost, decided before it starts.

- :func:`plan_fit`: before any work (the pipeline calls it before the forward pass): the
  arguments' types and ranges, the fitted image size, the memory (and the densification cap that
  keeps the fit inside it) and whether the time budget can buy any steps at all. Raises one
  :class:`~models.pipeline.refine.settings.RefineSettingsError` naming the argument and, when the machine
  is what limits it, the largest value that fits.
- :func:`screen_radii` / :func:`cap_screen_size` / :func:`importance`: each Gaussian's footprint
  in the training views, the screen-size cap applied to a start, and the pruning order
  (opacity x footprint).
- :func:`budget_fit`: with the step time measured on the start (:func:`measure_step_time`), the
  working count, the densification cap and the planned steps that a time budget buys.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from models.core.budget import fit_estimate
from models.core.gaussians import Gaussians
from models.pipeline.refine import ops
from models.pipeline.refine.loss import photometric_loss
from models.pipeline.refine.settings import DEFAULT_MAX_SIZE, RefineSettings, RefineSettingsError
from models.render import render

__all__ = [
    "FitBudget",
    "FitPlan",
    "StepTime",
    "budget_fit",
    "cap_screen_size",
    "fit_shape",
    "importance",
    "measure_step_time",
    "peak_count",
    "plan_fit",
    "replan",
    "screen_limit",
    "screen_radii",
]

#: A step costs at least this (render + SSIM + backward of an empty set at 240 px on this
#: project's 2 loaded cores: about 15 ms); :func:`plan_fit` refuses a time budget below
#: ``min_steps`` of it.
MIN_STEP_SECONDS = 0.01
#: The fit stops at this multiple of ``time`` even before its planned steps (a machine much
#: slower than measured); otherwise it does the planned steps.
TIME_GUARD = 2.0
#: A time budget never prunes the start below this many Gaussians (when even that many cannot buy
#: ``min_steps``, the fit plans the steps the budget buys, fewer, and says so).
MIN_WORKING = 1000
#: The screen-size cap never goes below this radius in pixels (a 16 px splat covers ~800 pixels,
#: which costs little; on small photos the fraction alone would reshape ordinary Gaussians).
MIN_SCREEN_RADIUS = 16.0


def fit_shape(image_size: tuple[int, int], size: int | None) -> tuple[int, int]:
    """``(H, W)`` with the long side ``size`` (``None``: the photo's, capped at
    :data:`~models.pipeline.refine.settings.DEFAULT_MAX_SIZE`), the aspect ratio kept."""
    height, width = image_size
    long_side = max(height, width)
    target = min(long_side, DEFAULT_MAX_SIZE) if size is None else int(size)
    scale = target / long_side
    return max(1, round(height * scale)), max(1, round(width * scale))


@dataclass(frozen=True)
class FitPlan:
    """What :func:`plan_fit` decided.

    Attributes:
        image_size: ``(H, W)`` the photos are fitted at.
        max_count: the largest count the memory allows (the densification cap unless
            ``max_gaussians`` or the time budget sets a lower one).
        peak_bytes: the estimated peak with ``max_count`` (or ``max_gaussians``) Gaussians.
        available: the bytes the fit may use.
    """

    image_size: tuple[int, int]
    max_count: int
    peak_bytes: int
    available: int


def _largest_size(settings, views, image_size, degree, count, device) -> int:
    """The largest long side at which ``count`` Gaussians fit in memory (0: none)."""
    low, high = 0, max(image_size)
    while low < high:
        middle = (low + high + 1) // 2
        shape = fit_shape(image_size, middle)
        memory = fit_estimate(
            count, views, shape, degree, settings.backend, device, settings.memory_limit
        )
        low, high = (middle, high) if memory.fits else (low, middle - 1)
    return low


def plan_fit(
    settings: RefineSettings,
    views: int,
    image_size: tuple[int, int],
    start_count: int = 1,
    sh_degree: int = 3,
    device: str = "cpu",
) -> FitPlan:
    """Check a fit before any work: types and ranges (:meth:`RefineSettings.check`), the memory
    at the fitted size with ``start_count`` (or ``max_gaussians``) Gaussians, and a time budget
    that buys at least ``min_steps`` steps of the cheapest possible step.

    Args:
        settings: the fit's settings.
        views: training photos; image_size: ``(H, W)`` of the photos as given.
        start_count: Gaussians at the start (an estimate is fine before the forward pass).
        sh_degree: the start's SH degree (``settings.sh_degree`` wins when set).

    Raises:
        RefineSettingsError: naming ``size``, ``max_gaussians`` or ``time`` with the largest
            (for ``time``: the smallest) value that fits, or the argument out of range.
    """
    settings.check()
    if int(views) < 1:
        raise RefineSettingsError("images", "the fit needs at least one photo")
    shape = fit_shape(tuple(image_size), settings.size)
    degree = sh_degree if settings.sh_degree is None else int(settings.sh_degree)
    count = int(settings.max_gaussians or max(int(start_count), 1))
    memory = fit_estimate(
        count, views, shape, degree, settings.backend, device, settings.memory_limit
    )
    if not memory.fits:
        need = f"about {memory.peak_bytes / 2**30:.2f} GiB at {shape[1]}x{shape[0]} with {count}"
        have = f"{memory.available / 2**30:.2f} GiB is available"
        if memory.max_count >= 1 and settings.max_gaussians:
            raise RefineSettingsError(
                "max_gaussians",
                f"the fit needs {need} Gaussians, {have}: at most {memory.max_count} fit",
                memory.max_count,
            )
        largest = _largest_size(settings, views, image_size, degree, count, device)
        raise RefineSettingsError(
            "size",
            f"the fit needs {need} Gaussians, {have}: lower size (at most {largest} px fits) "
            "or max_gaussians",
            largest,
        )
    if settings.time is not None and settings.steps is None:
        shortest = settings.min_steps * MIN_STEP_SECONDS
        if settings.time < shortest:
            raise RefineSettingsError(
                "time",
                f"{settings.time:g} s cannot buy {settings.min_steps} steps (min_steps): give at "
                f"least {shortest:g} s, or steps",
                shortest,
            )
    cap = min(memory.max_count, int(settings.max_gaussians or memory.max_count))
    peak = fit_estimate(cap, views, shape, degree, settings.backend, device, memory.available)
    return FitPlan(shape, cap, peak.peak_bytes, memory.available)


@torch.no_grad()
def screen_radii(
    means: Tensor, scales: Tensor, extrinsics: Tensor, intrinsics: Tensor, shape: tuple[int, int]
) -> Tensor:
    """``[V, N]`` each Gaussian's radius in pixels (3 x its largest scale, projected at its
    depth; 0 behind a camera or outside the image) in each view; means ``[N, 3]``, scales
    ``[N, 3]``, extrinsics ``[V, 4, 4]`` camera-to-world, intrinsics ``[V, 3, 3]`` normalised."""
    height, width = shape
    world_to_camera = torch.linalg.inv(extrinsics.double()).float()  # [V, 4, 4]
    points = means @ world_to_camera[:, :3, :3].transpose(-1, -2) + world_to_camera[:, None, :3, 3]
    depth = points[..., 2]  # [V, N]
    focal = intrinsics[:, 0, 0] * width  # [V]
    radius = 3.0 * scales.amax(-1)[None] * focal[:, None] / depth.clamp_min(1e-6)  # [V, N]
    x = (
        intrinsics[:, None, 0, 0] * points[..., 0] / depth.clamp_min(1e-6)
        + intrinsics[:, None, 0, 2]
    )
    y = (
        intrinsics[:, None, 1, 1] * points[..., 1] / depth.clamp_min(1e-6)
        + intrinsics[:, None, 1, 2]
    )
    margin_x, margin_y = radius / width, radius / height
    inside = (depth > 0.01) & (x > -margin_x) & (x < 1 + margin_x)
    inside &= (y > -margin_y) & (y < 1 + margin_y)
    return torch.where(inside, radius, torch.zeros_like(radius))


def screen_limit(fraction: float | None, shape: tuple[int, int]) -> float | None:
    """The screen-size cap in pixels: ``fraction`` of the long side, never below
    :data:`MIN_SCREEN_RADIUS` (``None``: no cap)."""
    return None if fraction is None else max(fraction * max(shape), MIN_SCREEN_RADIUS)


def cap_screen_size(radii: Tensor, gaussians: Gaussians, limit: float) -> tuple[Gaussians, int]:
    """``gaussians`` (a batch of one, no mask) with every Gaussian whose largest radius over
    ``radii`` ``[V, N]`` exceeds ``limit`` pixels shrunk to it; and how many were."""
    largest = radii.amax(0)  # [N]
    large = largest > limit
    if not bool(large.any()):
        return gaussians, 0
    factor = torch.where(large, limit / largest.clamp_min(1e-12), torch.ones_like(largest))
    return gaussians.replace(scales=gaussians.scales * factor[None, :, None]), int(large.sum())


def importance(radii: Tensor, opacities: Tensor, shape: tuple[int, int]) -> Tensor:
    """``[N]`` opacity x screen footprint: the pixels (``pi r^2``, at most the image) each
    Gaussian covers summed over the views, times its opacity ``[N]``."""
    area = (math.pi * radii.square()).clamp(max=float(shape[0] * shape[1]))
    return opacities * area.sum(0)


@dataclass(frozen=True)
class StepTime:
    """Seconds of one step with ``n`` Gaussians: ``fixed + per_gaussian * n`` (measured)."""

    fixed: float
    per_gaussian: float

    def __call__(self, n: int) -> float:
        return self.fixed + self.per_gaussian * n

    def scaled(self, factor: float) -> StepTime:
        """Both parts times ``factor`` (the machine ``factor`` times slower than measured)."""
        return StepTime(self.fixed * factor, self.per_gaussian * factor)

    @staticmethod
    def through(low: tuple[int, float], high: tuple[int, float]) -> StepTime:
        """The line through two ``(count, seconds)`` measurements; its per-Gaussian part at
        least a tenth of the larger set's mean share (two close timings on a loaded machine
        can put the slope anywhere, and densification needs a cost to grow against)."""
        (n0, t0), (n1, t1) = sorted([low, high])
        slope = (t1 - t0) / (n1 - n0) if n1 > n0 else 0.0
        per_gaussian = max(slope, 0.1 * t1 / max(n1, 1))
        return StepTime(max(t1 - per_gaussian * n1, 0.0), per_gaussian)


#: Untimed steps before each timing (the first steps allocate, fill caches, warm the threads).
MEASURE_WARMUP = 2
#: Timed steps of each timing (their mean: what a budget spends is the mean, not the median).
MEASURE_STEPS = 5
#: The MCMC noise, the regularisation and the densification rounds add to a timed
#: render + loss + backward + Adam step about this much (``timings`` of the drone runs).
STEP_OVERHEAD = 1.05


def _time_steps(gaussians: Gaussians, images, extrinsics, intrinsics, shape, settings) -> float:
    """Mean seconds of a step (render + loss + backward + Adam) on ``gaussians`` at its full SH
    degree, over :data:`MEASURE_STEPS` steps after :data:`MEASURE_WARMUP` untimed ones, the
    views spread over the photos."""
    leaves = gaussians.map(lambda t: t.detach().clone().requires_grad_(t.is_floating_point()))
    tensors = [leaves.means, leaves.scales, leaves.rotations, leaves.opacities, leaves.harmonics]
    optimizer = ops.adam(tensors, 0.0)
    background = torch.tensor(settings.background, dtype=torch.float32, device=images.device)
    total, runs = 0.0, MEASURE_WARMUP + MEASURE_STEPS
    for i in range(runs):
        view = (i * images.shape[0]) // runs
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        out = render(
            leaves, extrinsics[view][None, None], intrinsics[view][None, None], shape,
            background=background, backend=settings.backend,
        )  # fmt: skip
        photometric_loss(out.color[0], images[view][None], settings.ssim_weight).backward()
        optimizer.step()
        if i >= MEASURE_WARMUP:
            total += time.perf_counter() - start
    return total / MEASURE_STEPS * STEP_OVERHEAD


def _at_count(gaussians: Gaussians, order: Tensor, count: int) -> Gaussians:
    """The set at ``count`` Gaussians: its ``count`` most important (``order`` ``[N]``, most
    important first), or, above ``N``, grown by copies of Gaussians drawn in proportion to
    their opacity (as densification adds them: same places, same footprints)."""
    n = int(order.numel())
    if count <= n:
        index = order[:count]
    else:
        generator = torch.Generator().manual_seed(0)
        weights = gaussians.opacities[0].detach().float().cpu().clamp_min(1e-6)
        extra = torch.multinomial(weights, count - n, replacement=True, generator=generator)
        index = torch.cat([torch.arange(n), extra]).to(gaussians.means.device)
    index = index[ops.spatial_order(gaussians.means[0, index])]  # stored as the fit stores them
    return gaussians.map(lambda t: t[:, index])


def measure_step_time(
    gaussians: Gaussians,
    order: Tensor,
    images: Tensor,
    extrinsics: Tensor,
    intrinsics: Tensor,
    shape: tuple[int, int],
    settings: RefineSettings,
    counts: tuple[int, int] | None = None,
) -> StepTime:
    """The step time as a line in the count, through timings (:func:`_time_steps`) of the set
    at two ``counts`` (default: all of it and its most important quarter; the fit measures
    again at the working count and at the count densification leads to, :func:`_at_count`).
    ``order`` ``[N]`` sorts the set most important first."""
    total = int(order.numel())
    low, high = counts if counts is not None else (max(1, total // 4), total)
    timed = [
        (n, _time_steps(_at_count(gaussians, order, n), images, extrinsics, intrinsics, shape,
                        settings))
        for n in sorted({max(1, int(low)), max(1, int(high))})
    ]  # fmt: skip
    if len(timed) == 1:  # one count: half fixed, half per Gaussian (conservative for growth)
        n, seconds = timed[0]
        return StepTime(seconds / 2, seconds / 2 / n)
    return StepTime.through(timed[0], timed[1])


@dataclass(frozen=True)
class FitBudget:
    """What :func:`budget_fit` decided: ``working`` Gaussians to start with (the most important
    ones), the densification ``cap``, the ``steps`` to do and the ``seconds`` they should take."""

    working: int
    cap: int
    steps: int
    seconds: float


def _seconds(step_time: StepTime, counts: list[tuple[int, int]], steps: int) -> float:
    """Expected seconds of ``steps`` steps along a count schedule ``[(from_step, count)]``."""
    total, marks = 0.0, [*counts, (steps, 0)]
    for (begin, n), (end, _) in zip(marks, marks[1:]):
        total += max(0, min(end, steps) - begin) * step_time(n)
    return total


def _largest(low: int, high: int, fits: Callable[[int], bool]) -> int:
    """The largest ``n`` in ``[low, high]`` with ``fits(n)`` (``fits`` monotone; ``low`` if none)."""
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if fits(middle) else (low, middle - 1)
    return low


def budget_fit(
    step_time: StepTime | None,
    start: int,
    max_count: int,
    settings: RefineSettings,
    expected_counts: Callable[[int, int, int], list[tuple[int, int]]],
    keep: int = 0,
) -> FitBudget:
    """The working count, cap and steps a budget buys.

    Without ``time`` (``step_time`` may then be ``None``): the start (at most ``max_count``),
    cap ``max_count``, ``steps``. With
    ``time``: ``target`` = ``steps`` or ``min_steps``; the working count is the largest (at most
    the start, at least :data:`MIN_WORKING` and ``keep``, e.g. the SfM points of the start)
    whose steps ``target`` fit in ``time`` (when even
    that many cannot buy them, pruning stops where the per-Gaussian part of the step time equals
    its fixed part: below that a step gets at most twice as fast); the cap the largest whose expected count
    schedule (``expected_counts(working, steps, cap)``) still fits; the steps, when not given,
    the most the time buys along that schedule (at least ``target``).
    """
    ceiling = max(1, min(int(max_count), int(settings.max_gaussians or max_count)))
    working = max(1, min(int(start), ceiling))
    if settings.time is None or step_time is None:
        steps = int(settings.steps)
        seconds = 0.0 if step_time is None else _seconds(step_time, [(0, working)], steps)
        return FitBudget(working, ceiling, steps, seconds)
    seconds = float(settings.time)
    target = int(settings.steps or settings.min_steps)
    floor = min(working, max(MIN_WORKING, int(keep)))
    if target * step_time(floor) > seconds:  # out of reach: prune only what costs more than
        worth = step_time.fixed / step_time.per_gaussian if step_time.per_gaussian > 0 else working
        floor = min(working, max(floor, int(worth)))
    working = _largest(floor, working, lambda n: target * step_time(n) <= seconds)
    cap = ceiling
    if not settings.max_gaussians:
        cap = _largest(
            working,
            ceiling,
            lambda c: _seconds(step_time, expected_counts(working, target, c), target) <= seconds,
        )
    steps = settings.steps
    if steps is None:
        bought = max(1, int(seconds / step_time(working)))
        steps = _largest(
            min(target, bought),
            max(target, bought),
            lambda s: _seconds(step_time, expected_counts(working, s, cap), s) <= seconds,
        )
    schedule = expected_counts(working, steps, cap)
    if not settings.max_gaussians:  # a cap above where the schedule leads says nothing
        cap = max(working, min(cap, max(n for _, n in schedule)))
    expected = _seconds(step_time, schedule, steps)
    return FitBudget(working, cap, int(steps), expected)


def peak_count(
    budget: FitBudget, expected_counts: Callable[[int, int, int], list[tuple[int, int]]]
) -> int:
    """The most Gaussians the fit is expected to hold (where densification leads)."""
    return max(n for _, n in expected_counts(budget.working, budget.steps, budget.cap))


#: The fit re-measures its step time from the steps it did after this many steps (or
#: :data:`REPLAN_FRACTION` of the time budget, whichever comes first), and again after each
#: such stretch.
REPLAN_STEPS = 50
REPLAN_FRACTION = 0.1
#: The step time of the latest steps (``replan``'s ``recent``) weighs each stretch before the
#: latest by this factor once more (a half-life of about three stretches): the cost of a step
#: grows with the count faster than the line measured on the start says. At 0.5 it ran from
#: 0.99 to 1.40 on the drone capture (MCMC's rounds every 100 steps make 50-step stretches
#: alternate dear and cheap) and the steps moved back and forth. The count and the cap follow
#: all the steps alike.
REPLAN_MEMORY = 0.8
#: A re-plan moves the count and the cap only when it prunes or moves the cap by more than
#: this fraction plus one round of the strategy's schedule (its steps:
#: :data:`REPLAN_TIME_TOLERANCE`).
REPLAN_TOLERANCE = 0.05
#: A plan that would miss the budget by more than this fraction of it, either way, has its
#: steps corrected (:func:`replan`). (A 5% move of the steps, the rule before, is minutes late
#: in a long fit: the 1,800 s drone fit ran 1,920 s.)
REPLAN_TIME_TOLERANCE = 0.02


def replan(
    step_time: StepTime,
    done: int,
    seconds: float,
    count: int,
    budget: FitBudget,
    ceiling: int,
    settings: RefineSettings,
    expected_counts: Callable[..., list[tuple[int, int]]],
    keep: int = 0,
    recent: StepTime | None = None,
    round_growth: float = 0.0,
) -> FitBudget | None:
    """The plan again from step ``done`` after ``seconds`` of fitting with ``count`` Gaussians.

    The count and the cap: the rule of :func:`budget_fit` on what is left, by ``step_time``
    (re-measured from all the real steps; ``expected_counts(start, steps, cap, done)``: the
    strategy's schedule from step ``done``): the remaining time, the steps still owed (``steps``
    or ``min_steps`` less those done), the count pruned to buy them (never below ``keep`` nor
    :data:`MIN_WORKING`, and not at all once the owed steps are done), taken when it prunes or
    moves the cap by more than :data:`REPLAN_TOLERANCE` plus ``round_growth`` (one round of the
    strategy's schedule, on which the cap lands: a step time that wavers by a few percent would
    move it up and down by one round at every re-plan). The steps (unless ``steps`` is set):
    what the remaining time buys by ``recent`` (the latest steps' time; default ``step_time``),
    set after such a change or when the plan would end more than
    :data:`REPLAN_TIME_TOLERANCE` of the budget away from it (:func:`_on_time`). Expressed for
    the whole fit (``steps`` and ``seconds`` from step 0); ``None`` when nothing moves (or
    without a time budget).
    """
    if settings.time is None:
        return None
    left = max(float(settings.time) - float(seconds), 1e-6)
    owed = int(settings.steps or settings.min_steps) - int(done)
    if owed <= 0:
        # The steps owed are done: pruning now would throw away fitted Gaussians to buy steps
        # nobody asked for (it did, at the last step of a real run: 87,448 -> 24,790, -9 dB);
        # only the steps may still move.
        keep = max(int(keep), int(count))
    rest = RefineSettings(
        time=left,
        steps=None if settings.steps is None else max(1, int(settings.steps) - int(done)),
        min_steps=max(1, owed),
        max_gaussians=budget.cap if settings.max_gaussians else None,
    )

    def schedule(working: int, steps: int, cap: int) -> list[tuple[int, int]]:
        return expected_counts(working, int(done) + steps, cap, int(done))  # from step done

    remaining = budget_fit(step_time, count, ceiling, rest, schedule, keep)
    cap_moved = abs(remaining.cap - budget.cap) > (REPLAN_TOLERANCE + round_growth) * budget.cap
    structural = remaining.working < count or cap_moved
    base = dataclasses.replace(budget, working=int(count))  # the count now, not at the plan
    if structural:
        steps = int(done) + max(1, remaining.steps)
        base = FitBudget(
            remaining.working, remaining.cap, steps, float(seconds) + remaining.seconds
        )
    if settings.steps is not None:
        return base if structural else None
    timed = _on_time(recent or step_time, int(done), float(seconds), base, settings, schedule,
                     always=structural)  # fmt: skip
    return timed if timed is not None else (base if structural else None)


def _on_time(
    step_time: StepTime,
    done: int,
    seconds: float,
    budget: FitBudget,
    settings: RefineSettings,
    schedule: Callable[[int, int, int], list[tuple[int, int]]],
    always: bool = False,
) -> FitBudget | None:
    """``budget`` with its steps set to end on the time budget by ``step_time`` (its count
    ``working`` and cap kept; the ``min_steps`` still owed at least, where the time buys them;
    as :func:`budget_fit`), or ``None`` when
    it ends within :data:`REPLAN_TIME_TOLERANCE` of it (unless ``always``) or nothing moves."""
    budget_s = float(settings.time)
    left = max(budget_s - seconds, 1e-6)
    working, cap = budget.working, budget.cap
    cost = lambda steps: _seconds(step_time, schedule(working, steps, cap), steps)  # noqa: E731
    end = seconds + cost(max(0, budget.steps - done))
    if not always and abs(end - budget_s) <= REPLAN_TIME_TOLERANCE * budget_s:
        return None
    owed, bought = max(1, int(settings.min_steps) - done), max(1, int(left / step_time(working)))
    steps = _largest(min(owed, bought), max(owed, bought + 1), lambda s: cost(s) <= left)
    if done + steps == budget.steps and not always:
        return None
    return FitBudget(working, cap, done + steps, seconds + cost(steps))
