"""The refinement fit: Gaussians optimised against posed photos with the project's renderer.

:func:`refine_gaussians` follows 3DGS's recipe (Kerbl et al. 2023): one photo per step in a
shuffled order, Adam with per-parameter learning rates (means scaled by the scene extent and
decayed exponentially), loss ``(1 - lambda) L1 + lambda (1 - SSIM)``, SH bands switched on one at a
time. Densification is a strategy (:mod:`models.pipeline.refine.strategy`: 3DGS-MCMC by default, or 3DGS's
adaptive density control) whose two hooks the loop calls; the surgery is :mod:`models.pipeline.refine.ops`.

Cost: before the first step the fit checks its memory (:func:`~models.pipeline.refine.plan.plan_fit`),
shrinks the Gaussians larger than the screen-size cap, and with a time budget measures its step
time on the start and plans the working count, the densification cap and the steps the budget
buys (:func:`~models.pipeline.refine.plan.budget_fit`), announced in one line; it re-plans from
its real steps as it goes (:func:`~models.pipeline.refine.plan.replan`) and never does fewer steps
than it last announced.

Robustness: a non-finite loss stops the fit and returns the last state that rendered finitely
(``stopped="nan"``); Ctrl-C returns what the fit has (``stopped="interrupted"``); with a checkpoint
path the whole state (parameters, Adam moments, step, the strategy's state, the plan, RNG) is
saved every ``checkpoint_every`` steps and a later call resumes from it.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from tqdm.auto import tqdm

from datamodules.errors import InputError
from models.core.command_line import Terminated
from models.core.gaussians import Gaussians
from models.pipeline.pose_fit import se3_delta
from models.pipeline.refine import ops
from models.pipeline.refine.loss import photometric_loss
from models.pipeline.refine.plan import (
    REPLAN_FRACTION,
    REPLAN_MEMORY,
    REPLAN_STEPS,
    REPLAN_TOLERANCE,
    TIME_GUARD,
    FitBudget,
    StepTime,
    budget_fit,
    cap_screen_size,
    importance,
    measure_step_time,
    peak_count,
    plan_fit,
    replan,
    screen_limit,
    screen_radii,
)
from models.pipeline.refine.settings import RefineSettings
from models.pipeline.refine.strategy import make_strategy
from models.render import render

__all__ = ["RefineResult", "refine_gaussians", "scene_extent"]

Evaluate = Callable[[Gaussians, Tensor], dict[str, float]]
#: The fit's clock (seconds); a test replaces it to give the steps a known duration.
clock = time.perf_counter
#: Steps between putting the Gaussians back in spatial order (:func:`ops.spatial_order`):
#: densification appends rows and the noise moves means, so the order decays. In 480 s drone
#: fits the ~54 reorders added 2.5-3.5 s (counted under ``densify``); a step at 128k Gaussians
#: is several milliseconds cheaper in that order.
REORDER_EVERY = 100


@dataclass
class RefineResult:
    """What :func:`refine_gaussians` returns.

    Attributes:
        gaussians: the refined set (a batch of one, detached, on the input's device).
        extrinsics: ``[V, 4, 4]`` the cameras (refined when ``optimize_cameras``).
        steps: steps taken (counting steps of a resumed checkpoint).
        seconds: time spent fitting (evaluation and planning excluded; a resumed fit adds its
            earlier time).
        count_before: Gaussians given; count_after: at the end.
        curve: ``[{"step", "loss", "count"}]`` the mean loss of each stretch of steps.
        evaluations: ``[{"step", "seconds", **evaluate(...)}]`` at step 0, every ``eval_every``
            steps (default: at each quarter of the planned steps) and at the end.
        stopped: ``"steps"`` (the planned steps), ``"time"`` (twice the time budget passed
            first), ``"nan"`` (a non-finite loss; the last finite state is returned) or
            ``"interrupted"`` (Ctrl-C or SIGTERM).
        interrupted_by: ``"Ctrl-C"`` or ``"SIGTERM"`` when ``stopped == "interrupted"``, else ``""``.
        image_size: ``(H, W)`` the photos were fitted at.
        densify: the strategy's counts (``relocated``/``added`` or ``cloned``/``split``/
            ``pruned``/``resets``; ``shrunk`` by the screen-size cap).
        timings: seconds spent in ``forward`` (render + loss), ``backward``, ``densify`` (the
            strategy's post-backward hook and the spatial reorder) and ``optimizer`` over the
            whole fit.
        plan: ``working`` (Gaussians the fit started with), ``cap`` (the densification cap),
            ``steps`` (planned), ``seconds`` (expected), ``step_seconds`` (measured on the start,
            ``None`` without a time budget), ``pruned`` (by the budget), ``shrunk`` (by the
            screen-size cap at the start).
        message: one line saying how it ended (printed by the commands).
    """

    gaussians: Gaussians
    extrinsics: Tensor
    steps: int
    seconds: float
    count_before: int
    count_after: int
    curve: list[dict[str, float]] = field(default_factory=list)
    evaluations: list[dict[str, float]] = field(default_factory=list)
    stopped: str = "steps"
    interrupted_by: str = ""
    image_size: tuple[int, int] = (0, 0)
    densify: dict[str, int] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    plan: dict[str, Any] = field(default_factory=dict)
    message: str = ""

    def summary(self) -> dict[str, Any]:
        """``summary.json``'s ``refine`` entry (plain Python)."""
        return {
            "steps": self.steps,
            "seconds": round(self.seconds, 2),
            "stopped": self.stopped,
            "image_size": list(self.image_size),
            "count_before": self.count_before,
            "count_after": self.count_after,
            "plan": dict(self.plan),
            "densify": dict(self.densify),
            "curve": self.curve,
            "evaluations": self.evaluations,
            "timings": {k: round(v, 3) for k, v in self.timings.items()},
        }


def scene_extent(extrinsics: Tensor, means: Tensor | None = None) -> float:
    """3DGS's ``cameras_extent``: 1.1 x the largest distance of a camera centre from their mean
    (one camera, or all at one place: the spread of ``means`` around it, else 1)."""
    centres = extrinsics[:, :3, 3].double()
    radius = float((centres - centres.mean(0)).norm(dim=-1).max()) if len(centres) > 1 else 0.0
    if radius <= 1e-8 and means is not None and means.numel():
        radius = float((means.double() - centres.mean(0)).norm(dim=-1).median())
    return 1.1 * radius if radius > 1e-8 else 1.0


def _check_inputs(gaussians: Gaussians, images: Tensor, extrinsics: Tensor, intrinsics: Tensor):
    if gaussians.batch_size != 1:
        raise ValueError(f"refine one scene at a time, got a batch of {gaussians.batch_size}")
    if images.ndim != 4 or images.shape[1] != 3:
        raise ValueError(f"images must be [V, 3, H, W], got {tuple(images.shape)}")
    views = images.shape[0]
    if tuple(extrinsics.shape) != (views, 4, 4):
        raise ValueError(f"extrinsics must be [{views}, 4, 4], got {tuple(extrinsics.shape)}")
    if tuple(intrinsics.shape) != (views, 3, 3):
        raise ValueError(f"intrinsics must be [{views}, 3, 3], got {tuple(intrinsics.shape)}")
    if views < 1:
        raise ValueError("refinement needs at least one photo")


class _Fit:
    """The mutable state of one fit (what a checkpoint holds)."""

    def __init__(self, start: Gaussians, photos, settings, budget, optimize_cameras: bool):
        # a model's predicted cameras are made under inference_mode, which autograd cannot
        # save for backward: ordinary copies of those
        images, extrinsics, intrinsics = (t.clone() if t.is_inference() else t for t in photos)
        self.settings, self.budget = settings, budget
        self.images, self.base_extrinsics, self.intrinsics = images, extrinsics, intrinsics
        self.shape = tuple(images.shape[-2:])
        coarse = (max(1, self.shape[0] // 2), max(1, self.shape[1] // 2))
        self.coarse = (
            F.interpolate(images, size=coarse, mode="area") if settings.coarse_fraction else None
        )
        self.views = images.shape[0]
        s = settings
        degree = start.sh_degree if s.sh_degree is None else int(s.sh_degree)
        self.extent = scene_extent(extrinsics, start.means[0])
        self.lrs = {
            "means": s.lr_means * self.extent,
            "scales": s.lr_scales,
            "rotations": s.lr_rotations,
            "opacities": s.lr_opacities,
            "sh_dc": s.lr_sh,
            "sh_rest": s.lr_sh / 20.0,
        }
        self.params, self.optimizers = ops.parameters_from_gaussians(start, degree, self.lrs)
        ops.sort_spatially(self.params, self.optimizers, {})
        self.sh_degree = degree
        self.generator = torch.Generator(device="cpu").manual_seed(int(s.seed))
        limit = screen_limit(s.max_screen_fraction, self.shape)
        self.strategy = make_strategy(
            s.densify, s.mcmc, s.adc, budget.cap, self.extent, limit, self.generator
        )
        self.state = self.strategy.initialize_state()
        self.camera_delta: Tensor | None = None
        self.camera_optimizer = None
        if optimize_cameras and self.views > 1:
            self.camera_delta = torch.zeros(self.views - 1, 6, device=images.device)
            self.camera_delta.requires_grad_(True)
            self.camera_optimizer = torch.optim.Adam([self.camera_delta], lr=s.lr_cameras)
        self.step, self.seconds = 0, 0.0
        self.order: list[int] = []
        self.curve: list[dict[str, float]] = []
        self.evaluations: list[dict[str, float]] = []
        self.timings = {"forward": 0.0, "backward": 0.0, "densify": 0.0, "optimizer": 0.0}
        self.last_good: tuple[Gaussians, Tensor] | None = None
        self.plan: dict[str, Any] = {}
        self.count_before = 0
        # re-planning from the real steps (``_replan``): the step-time line measured on the
        # start, the floor of the working count, the memory's ceiling, the real and predicted
        # (by the measured line) seconds of every step but the first (earlier stretches weighed
        # down at each re-plan), and the steps and real seconds since the last re-plan
        self.step_time: StepTime | None = None
        self.keep, self.ceiling = 0, budget.cap
        self.quarter = 0  # the last quarter of the planned steps evaluated (a re-plan that adds
        # steps moves the progress back: the quarter is not evaluated twice)
        self.window = {"real": 0.0, "predicted": 0.0, "since": 0, "since_real": 0.0,
                       "recent_real": 0.0, "recent_predicted": 0.0}  # fmt: skip

    def gaussians(self) -> Gaussians:
        """The activated set with the SH bands switched on so far (differentiable)."""
        degree = min(self.sh_degree, self.step // self.settings.sh_degree_every)
        return ops.gaussians_from_parameters(self.params, degree)

    def extrinsics(self) -> Tensor:
        """``[V, 4, 4]`` the cameras, with the refined deltas (view 0 fixed)."""
        if self.camera_delta is None:
            return self.base_extrinsics
        delta = se3_delta(self.camera_delta[:, :3], self.camera_delta[:, 3:] * self.extent)
        moved = self.base_extrinsics[1:] @ delta  # [V-1, 4, 4] (in each camera's frame)
        return torch.cat([self.base_extrinsics[:1], moved])

    def level(self) -> tuple[Tensor, tuple[int, int]]:
        """``(photos, (H, W))`` of this step: half size during the coarse fraction."""
        if self.coarse is not None and self.progress() < self.settings.coarse_fraction:
            return self.coarse, tuple(self.coarse.shape[-2:])
        return self.images, self.shape

    def progress(self) -> float:
        """The fraction of the planned steps done (drives the decay and the strategy's window)."""
        return min(1.0, self.step / self.budget.steps)

    def decay(self) -> float:
        """The means' (and cameras') learning-rate factor now, exponential to the final rate."""
        s = self.settings
        return (s.lr_means_final / s.lr_means) ** self.progress()

    def next_view(self) -> int:
        if not self.order:
            self.order = torch.randperm(self.views, generator=self.generator).tolist()
        return self.order.pop()

    def state_dict(self) -> dict:
        return {
            "params": ops.parameters_state(self.params, self.optimizers),
            "strategy": self.state,
            "budget": asdict(self.budget),
            "camera_delta": None if self.camera_delta is None else self.camera_delta.detach(),
            "camera_optimizer": None
            if self.camera_optimizer is None
            else self.camera_optimizer.state_dict(),
            **{k: getattr(self, k) for k in ("step", "seconds", "order", "curve", "timings")},
            "evaluations": self.evaluations,
            "plan": self.plan,
            "count_before": self.count_before,
            "step_time": None if self.step_time is None else asdict(self.step_time),
            "window": dict(self.window),
            "quarter": self.quarter,
            "generator": self.generator.get_state(),
            "views": self.views,
        }

    def load_state_dict(self, state: dict) -> None:
        if int(state["views"]) != self.views:
            raise ValueError(f"checkpoint has {state['views']} views, the fit has {self.views}")
        ops.load_parameters_state(self.params, self.optimizers, state["params"])
        self.state = state["strategy"]
        self.budget = dataclasses.replace(FitBudget(**state["budget"]), steps=self.budget.steps)
        self.strategy.cap = self.budget.cap
        if self.camera_delta is not None and state["camera_delta"] is not None:
            with torch.no_grad():
                self.camera_delta.copy_(state["camera_delta"])
            self.camera_optimizer.load_state_dict(state["camera_optimizer"])
        self.step, self.seconds = int(state["step"]), float(state["seconds"])
        self.order, self.curve = list(state["order"]), list(state["curve"])
        self.evaluations, self.timings = list(state["evaluations"]), dict(state["timings"])
        self.generator.set_state(state["generator"])
        if state.get("step_time") is not None:
            self.step_time = StepTime(**state["step_time"])
        self.window = {**self.window, **state.get("window", {})}
        self.quarter = int(state.get("quarter", math.floor(self.progress() * 4)))


def _save_checkpoint(fit: _Fit, path: Path) -> None:
    """Write the fit's state atomically (a temporary file beside it, then a rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    torch.save(fit.state_dict(), partial)
    os.replace(partial, path)


def _evaluate(fit: _Fit, evaluate: Evaluate | None, gaussians: Gaussians) -> None:
    if evaluate is None or (fit.evaluations and fit.evaluations[-1]["step"] == fit.step):
        return
    with torch.no_grad():
        scores = evaluate(gaussians, fit.extrinsics().detach())
    fit.evaluations.append(
        {
            "step": fit.step,
            "seconds": round(fit.seconds, 2),
            **{k: float(v) for k, v in scores.items()},
        }
    )


def _due_evaluation(fit: _Fit, eval_every: int | None) -> bool:
    """Every ``eval_every`` steps, or else once at each quarter of the planned steps."""
    if eval_every:
        return fit.step % eval_every == 0
    quarter = math.floor(fit.progress() * 4)
    if fit.quarter < quarter < 4:
        fit.quarter = quarter
        return True
    return False


def _step(fit: _Fit, background: Tensor) -> float | None:
    """One step: render a view, the strategy's hooks around backward and Adam; the loss, or
    ``None`` when it is not finite (nothing changed then)."""
    s, timer = fit.settings, clock
    t0 = timer()
    view = fit.next_view()
    current, cameras = fit.gaussians(), fit.extrinsics()
    images, shape = fit.level()
    out = render(
        current, cameras[view][None, None], fit.intrinsics[view][None, None], shape,
        background=background, backend=s.backend,
    )  # fmt: skip
    info = {"render": out, "image_size": shape, "progress": fit.progress()}
    info["lr_means"] = fit.lrs["means"] * fit.decay()
    fit.strategy.step_pre_backward(fit.params, fit.optimizers, fit.state, fit.step, info)
    loss = photometric_loss(out.color[0], images[view][None], s.ssim_weight)
    loss = loss + fit.strategy.regularisation(fit.params)
    t1 = timer()
    if not torch.isfinite(loss):
        return None
    fit.last_good = (current.detach().replace(means=current.means.detach().clone()), cameras)
    for optimizer in (*fit.optimizers.values(), fit.camera_optimizer):
        if optimizer is not None:
            optimizer.zero_grad(set_to_none=True)
    loss.backward()
    t2 = timer()
    ops.set_lr(fit.optimizers, "means", info["lr_means"])
    for optimizer in fit.optimizers.values():
        optimizer.step()
    if fit.camera_optimizer is not None:
        fit.camera_optimizer.param_groups[0]["lr"] = s.lr_cameras * fit.decay()
        fit.camera_optimizer.step()
    t3 = timer()
    fit.step += 1
    info["progress"] = fit.progress()
    fit.strategy.step_post_backward(fit.params, fit.optimizers, fit.state, fit.step, info)
    if fit.step % REORDER_EVERY == 0:
        ops.sort_spatially(fit.params, fit.optimizers, fit.state)
    t4 = timer()
    fit.seconds += t4 - t0
    if fit.step > 1 and fit.step_time is not None:  # the first step warms up: not counted
        fit.window["since"] += 1
        predicted = fit.step_time(current.means.shape[1])
        for key in ("real", "since_real", "recent_real"):
            fit.window[key] += t4 - t0
        fit.window["predicted"] += predicted
        fit.window["recent_predicted"] += predicted
    for name, seconds in zip(fit.timings, (t1 - t0, t2 - t1, t4 - t3, t3 - t2)):
        fit.timings[name] += seconds
    return loss.item()


def _record(fit: _Fit, window: list[float]) -> None:
    """Append the mean loss of ``window`` to the curve and empty it."""
    if window:
        loss = round(sum(window) / len(window), 5)
        fit.curve.append({"step": fit.step, "loss": loss, "count": ops.count(fit.params)})
        window.clear()


def _run(fit: _Fit, evaluate, eval_every, checkpoint: Path | None, progress: bool) -> str:
    """The loop: steps until the plan (or twice the time budget) is done; how it stopped."""
    s = fit.settings
    background = torch.tensor(s.background, dtype=torch.float32, device=fit.images.device)
    if fit.step == 0:
        _evaluate(fit, evaluate, fit.gaussians().detach())
    bar = tqdm(total=fit.budget.steps, initial=fit.step, desc="refine", unit="step",
               disable=not progress, dynamic_ncols=True)  # fmt: skip
    window: list[float] = []
    every = max(1, fit.budget.steps // 50)
    try:
        while fit.step < fit.budget.steps:
            if s.time and fit.seconds >= TIME_GUARD * max(s.time, fit.budget.seconds):
                return "time"
            loss = _step(fit, background)
            if loss is None:
                return "nan"
            window.append(loss)
            if fit.step % every == 0:
                _record(fit, window)
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.4f}", gaussians=ops.count(fit.params), refresh=False)
            if _replan_due(fit):
                _replan(fit, bar)
            if _due_evaluation(fit, eval_every):
                _evaluate(fit, evaluate, fit.gaussians().detach())
            if checkpoint is not None and fit.step % s.checkpoint_every == 0:
                _save_checkpoint(fit, checkpoint)
        return "steps"
    except KeyboardInterrupt as error:
        return "SIGTERM" if isinstance(error, Terminated) else "Ctrl-C"
    finally:
        _record(fit, window)
        bar.close()


def _replan_due(fit: _Fit) -> bool:
    """Time to re-measure the step time from the real steps: :data:`REPLAN_STEPS` steps (or
    :data:`REPLAN_FRACTION` of the budget, at least 3 steps) since the last re-plan, with steps
    still to come."""
    window, s = fit.window, fit.settings
    if fit.step_time is None or not s.time or fit.step >= fit.budget.steps - 1:
        return False
    enough_time = window["since_real"] >= REPLAN_FRACTION * s.time and window["since"] >= 3
    return window["since"] >= REPLAN_STEPS or enough_time


def _prune(fit: _Fit, working: int) -> None:
    """Keep the ``working`` most important Gaussians (opacity x footprint in the training
    views), with their Adam moments and the strategy's per-Gaussian state."""
    current = ops.gaussians_from_parameters(fit.params, 0).detach()
    radii = screen_radii(
        current.means[0], current.scales[0], fit.extrinsics().detach(), fit.intrinsics, fit.shape
    )
    order = torch.argsort(importance(radii, current.opacities[0], fit.shape), descending=True)
    kept = torch.sort(order[:working]).values
    with torch.no_grad():
        ops.keep(fit.params, fit.optimizers, fit.state, kept)


def _replan(fit: _Fit, bar) -> None:
    """Re-measure the step time from the steps done (all but the first: their real seconds
    against the measured line's prediction at their counts; for the end time also from the
    latest steps, earlier stretches weighed down by
    :data:`~models.pipeline.refine.plan.REPLAN_MEMORY`) and, when the plan moves, re-plan the rest
    (:func:`~models.pipeline.refine.plan.replan`): prune, move the cap and the steps; one line
    says what changed and why."""
    window, old = fit.window, fit.budget
    factor = window["real"] / max(window["predicted"], 1e-12)
    recent = window["recent_real"] / max(window["recent_predicted"], 1e-12)
    window["since"], window["since_real"] = 0, 0.0
    window["recent_real"] *= REPLAN_MEMORY
    window["recent_predicted"] *= REPLAN_MEMORY
    step_time = fit.step_time.scaled(factor)
    count = ops.count(fit.params)
    planner = fit.strategy.expected_counts
    new = replan(step_time, fit.step, fit.seconds, count, old, fit.ceiling, fit.settings,
                 planner, fit.keep, fit.step_time.scaled(recent),
                 fit.strategy.round_growth)  # fmt: skip
    if new is None:
        return
    if new.working < count:
        _prune(fit, new.working)
    fit.budget, fit.strategy.cap = new, new.cap
    bar.total = new.steps
    bar.refresh()
    record = {"step": fit.step, "factor": round(factor, 3), "recent_factor": round(recent, 3),
              "steps": new.steps, "working": ops.count(fit.params),
              "pruned": count - ops.count(fit.params), "cap": new.cap,
              "step_seconds": round(step_time(new.working), 4)}  # fmt: skip
    # a small correction upwards (the budget buys a few more steps) is not announced: the fit
    # never does fewer steps than it last said
    # (a cap that moves at all moved by more than a round: replan's rule)
    big = abs(new.steps - old.steps) > REPLAN_TOLERANCE * old.steps or new.cap != old.cap
    record["announced"] = bool(record["pruned"]) or new.steps < old.steps or big
    fit.plan.setdefault("replans", []).append(record)
    fit.plan.update(steps=new.steps, cap=new.cap, seconds=round(new.seconds, 2))
    if record["announced"]:
        _announce_replan(fit, record, old, count, factor)


def _announce_replan(fit: _Fit, record: dict, old: FitBudget, count: int, factor: float) -> None:
    """One line above the progress bar: what the re-plan changed and why."""
    new = fit.budget
    pruned = ""
    if record["pruned"]:
        pruned = f", pruned from {count} to {record['working']} by opacity x footprint"
    short = ""
    if not fit.settings.steps and new.steps < fit.settings.min_steps:
        short = f" (the budget buys fewer than min_steps={fit.settings.min_steps} here)"
    tqdm.write(  # its own line, above the progress bar
        f"refine: re-planned at step {fit.step} from the steps done ({fit.seconds / fit.step:.3f} "
        f"s a step so far, {factor:.2f}x the measured time): {new.steps} steps (was {old.steps})"
        f"{short}{pruned}, densification cap {new.cap}"
        f"{f' (was {old.cap})' if new.cap != old.cap else ''}, about {new.seconds:.0f} s",
        file=sys.stderr,
    )


def _measured_budget(start, order, photos, settings, plan, strategy_counts, keep: int):
    """The step time and the budget it buys: a first line through the whole start and its most
    important quarter; then, when the budget prunes or densifies, measured again where the fit
    will run (the working count and the count densification leads to) and budgeted again."""
    images, extrinsics, intrinsics = photos
    shape, count = tuple(images.shape[-2:]), int(order.numel())
    if settings.time is None:
        return None, budget_fit(None, count, plan.max_count, settings, strategy_counts, keep)
    measure = lambda counts: measure_step_time(  # noqa: E731
        start, order, images, extrinsics, intrinsics, shape, settings, counts
    )
    step_time = measure(None)
    budget = budget_fit(step_time, count, plan.max_count, settings, strategy_counts, keep)
    peak = max(peak_count(budget, strategy_counts), budget.working + budget.working // 2)
    step_time = measure((budget.working, peak))
    budget = budget_fit(step_time, count, plan.max_count, settings, strategy_counts, keep)
    return step_time, budget


def _working_start(start: Gaussians, photos, settings: RefineSettings, plan, strategy_counts,
                   keep: int = 0):  # fmt: skip
    """The start after the screen-size cap and, with a time budget, pruned to the working count
    the measured step time allows (never below ``keep``); its :class:`FitBudget`, the plan's
    record and the measured :class:`StepTime` (``None`` without a time budget)."""
    images, extrinsics, intrinsics = photos
    shape = tuple(images.shape[-2:])
    radii = screen_radii(start.means[0], start.scales[0], extrinsics, intrinsics, shape)
    shrunk = 0
    limit = screen_limit(settings.max_screen_fraction, shape)
    if limit is not None:
        start, shrunk = cap_screen_size(radii, start, limit)
        radii = radii.clamp(max=limit)
    count = int(start.count()[0])
    order = torch.argsort(importance(radii, start.opacities[0], shape), descending=True)
    start, capped = cap_start_opacity(start, settings.start_opacity)
    step_time, budget = _measured_budget(
        start, order, photos, settings, plan, strategy_counts, keep
    )
    if budget.working < count:
        start = start.map(lambda t: t[:, order[: budget.working]])
    record = {**asdict(budget), "pruned": count - budget.working, "shrunk": shrunk}
    record["opacity_capped"] = capped
    record["step_seconds"] = None if step_time is None else round(step_time(budget.working), 4)
    record["mean_step_seconds"] = (
        None if step_time is None else round(budget.seconds / max(budget.steps, 1), 4)
    )
    record["initial_steps"], record["keep"] = budget.steps, int(keep)
    return start, budget, record, step_time


def cap_start_opacity(start: Gaussians, opacity: float | None) -> tuple[Gaussians, int]:
    """``start`` with every opacity capped at ``opacity`` (``None``: as it is) and how many were
    above it (:attr:`RefineSettings.start_opacity`)."""
    if opacity is None:
        return start, 0
    above = int((start.opacities > opacity).sum())
    return start.replace(opacities=start.opacities.clamp(max=float(opacity))), above


def _announce(record: dict, count: int, settings: RefineSettings) -> None:
    """One line on stderr: the plan (always when the budget pruned the start)."""
    pruned = f", pruned from {count} by opacity x footprint" if record["pruned"] else ""
    seconds = "" if record["step_seconds"] is None else f", {record['step_seconds']:.3f} s a step"
    budget = f" in about {record['seconds']:.0f} s" if settings.time else ""
    if settings.time and not settings.steps and record["steps"] < settings.min_steps:
        budget += f" (the budget buys fewer than min_steps={settings.min_steps} here)"
    if record.get("opacity_capped"):
        pruned += f" ({record['opacity_capped']} opacities capped at {settings.start_opacity})"
    print(
        f"refine: {record['steps']} steps{budget} from {record['working']} Gaussians{pruned}"
        f"{seconds}, densification cap {record['cap']}",
        file=sys.stderr,
        flush=True,
    )


def refine_gaussians(
    gaussians: Gaussians,
    images: Tensor,
    extrinsics: Tensor,
    intrinsics: Tensor,
    settings: RefineSettings,
    *,
    optimize_cameras: bool = False,
    evaluate: Evaluate | None = None,
    eval_every: int | None = None,
    checkpoint_path: str | os.PathLike | None = None,
    progress: bool = True,
    keep: int = 0,
) -> RefineResult:
    """Optimise ``gaussians`` against posed photos.

    Args:
        gaussians: the start (a batch of one; feed-forward output, a ``.ply``, or
            :func:`~models.pipeline.refine.start.gaussians_from_points`).
        images: ``[V, 3, H, W]`` the training photos in [0, 1] (any size: resized here to
            ``settings.size`` on the long side).
        extrinsics: ``[V, 4, 4]`` camera-to-world, OpenCV axes, in the Gaussians' frame.
        intrinsics: ``[V, 3, 3]`` normalised.
        settings: budget, size, rates, densification (:class:`RefineSettings`).
        optimize_cameras: refine the cameras jointly (pose-free inputs: the predicted ones);
            view 0 stays fixed, the others get an se(3) delta each.
        evaluate: ``evaluate(gaussians, extrinsics) -> {name: value}``, the caller's held-out
            scorer (the held-out photos never enter the fit), called at step 0, every
            ``eval_every`` steps (default: at each quarter of the planned steps) and at the end.
        eval_every: steps between evaluations.
        checkpoint_path: a file for the fit's state, saved every ``settings.checkpoint_every``
            steps and at the end; when it exists, the fit resumes from it (and its plan).
        progress: show a tqdm bar (loss and Gaussian count).
        keep: a time budget never prunes below this many Gaussians (the SfM points a start
            holds: pruning below them costs more than the steps it buys), nor below
            :data:`~models.pipeline.refine.plan.MIN_WORKING`.

    Raises:
        RefineSettingsError: an argument of the wrong type or out of range, or a fit too large
            for the memory (naming ``size`` / ``max_gaussians`` and the largest that fits).
        InputError: an unusable checkpoint.
        ValueError: inputs of the wrong shape.
    """
    _check_inputs(gaussians, images, extrinsics, intrinsics)
    device = gaussians.device
    start = gaussians.compact() if gaussians.mask is not None else gaussians
    plan = plan_fit(
        settings, images.shape[0], tuple(images.shape[-2:]), int(start.count()[0]),
        start.sh_degree, str(device),
    )  # fmt: skip
    fitted = images.to(device=device, dtype=torch.float32)
    if tuple(fitted.shape[-2:]) != plan.image_size:
        fitted = F.interpolate(fitted, size=plan.image_size, mode="area")
    photos = (
        fitted.contiguous(),
        extrinsics.to(device=device, dtype=torch.float32),
        intrinsics.to(device=device, dtype=torch.float32),
    )
    checkpoint = Path(checkpoint_path) if checkpoint_path is not None else None
    state = _load_checkpoint(checkpoint, device)
    count = int(start.count()[0])
    if state is None:
        planner = make_strategy(settings.densify, settings.mcmc, settings.adc, 1, 1.0, None, None)
        start, budget, record, step_time = _working_start(
            start, photos, settings, plan, planner.expected_counts, keep
        )
        _announce(record, count, settings)
    else:
        budget, record = FitBudget(**state["budget"]), dict(state["plan"])
        if settings.steps is not None:  # a rerun with refine=N continues to step N
            budget = dataclasses.replace(budget, steps=int(settings.steps))
            record["steps"] = int(settings.steps)
    fit = _Fit(start, photos, settings, budget, optimize_cameras)
    fit.keep, fit.ceiling = int(keep), plan.max_count
    if state is None:
        fit.step_time = step_time
    else:
        fit.load_state_dict(state)
    fit.plan, fit.count_before = record, count if state is None else int(state["count_before"])
    stopped = _run(fit, evaluate, eval_every, checkpoint, progress)
    return _finish(fit, stopped, evaluate, checkpoint)


def _load_checkpoint(path: Path | None, device) -> dict | None:
    if path is None or not path.is_file():
        return None
    try:
        state = torch.load(path, map_location=device, weights_only=False)
        for key in ("params", "strategy", "budget", "plan", "step", "views"):
            state[key]  # noqa: B018  (a KeyError: not a checkpoint of this fit)
    except (OSError, RuntimeError, KeyError, ValueError, TypeError) as error:
        raise InputError(path, f"not a usable refinement checkpoint ({error})") from error
    return state


def _finish(fit: _Fit, stopped: str, evaluate, checkpoint: Path | None) -> RefineResult:
    """The result: the final (or last finite) state, the last evaluation and checkpoint."""
    interrupted_by = stopped if stopped in ("Ctrl-C", "SIGTERM") else ""
    stopped = "interrupted" if interrupted_by else stopped
    if stopped == "nan" and fit.last_good is not None:
        final, cameras = fit.last_good
    else:
        final, cameras = fit.gaussians().detach(), fit.extrinsics().detach()
    final = final.map(lambda t: t.detach().clone())
    coefficients = (fit.sh_degree + 1) ** 2
    if final.harmonics.shape[-1] < coefficients:
        final.harmonics = F.pad(final.harmonics, (0, coefficients - final.harmonics.shape[-1]))
    if stopped != "interrupted":
        _evaluate(fit, evaluate, final)
    if checkpoint is not None and stopped != "nan":
        _save_checkpoint(fit, checkpoint)
    if fit.step:
        fit.plan["real_step_seconds"] = round(fit.seconds / fit.step, 4)
    messages = {
        "steps": f"refined {fit.step} steps in {fit.seconds:.0f} s",
        "time": f"refined {fit.step} of {fit.budget.steps} planned steps in {fit.seconds:.0f} s: "
        "twice the time budget passed (the machine is slower than measured)",
        "nan": f"refinement stopped at step {fit.step}: the loss is not finite; the last finite "
        "state is kept",
        "interrupted": f"refinement interrupted at step {fit.step} ({interrupted_by}); what it "
        "has is kept",
    }
    return RefineResult(
        gaussians=final,
        extrinsics=cameras.detach().clone(),
        steps=fit.step,
        seconds=fit.seconds,
        count_before=fit.count_before,
        count_after=int(final.count()[0]),
        curve=fit.curve,
        evaluations=fit.evaluations,
        stopped=stopped,
        interrupted_by=interrupted_by,
        image_size=fit.shape,
        densify=dict(fit.state["counts"]),
        timings=dict(fit.timings),
        plan=dict(fit.plan),
        message=messages[stopped],
    )
