"""The refinement fit: Gaussians optimised against posed photos with the project's renderer.

:func:`refine_gaussians` follows 3DGS's recipe (Kerbl et al. 2023): one photo per step in a
shuffled order, Adam with per-parameter learning rates (means scaled by the scene extent and
decayed exponentially), loss ``(1 - lambda) L1 + lambda (1 - SSIM)``, SH bands switched on one at a
time, and a densification rule (:mod:`models.refine.densify`: 3DGS-MCMC by default, which caps the
count, or 3DGS's adaptive density control with its opacity reset). The photos are fitted at
``settings.size`` pixels on the long side; normalised intrinsics hold for any resize of the whole
photo.

Robustness: the memory of the fit is estimated before the first step and a fit that cannot fit is
refused in one line naming ``refine_size=`` / ``max_gaussians=``; a non-finite loss stops the fit
and returns the last state that rendered finitely (``stopped="nan"``); Ctrl-C returns what the fit
has (``stopped="interrupted"``); with a checkpoint path the whole state (parameters, Adam moments,
step, densification statistics, RNG) is saved every ``checkpoint_every`` steps and a later call
resumes from it.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from datamodules.errors import InputError
from models.budget import available_memory
from models.command_line import Terminated
from models.gaussians import Gaussians
from models.refine.densify import ADC, MCMC
from models.refine.loss import photometric_loss
from models.refine.params import GaussianParameters
from models.refine.settings import DEFAULT_MAX_SIZE, RefineSettings
from models.render import render

__all__ = [
    "RefineMemoryError",
    "RefineResult",
    "estimate_memory",
    "fit_shape",
    "refine_gaussians",
    "scene_extent",
]

Evaluate = Callable[[Gaussians, Tensor], dict[str, float]]


class RefineMemoryError(InputError):
    """The fit would not fit in memory (one line naming ``refine_size=`` / ``max_gaussians=``)."""


@dataclass
class RefineResult:
    """What :func:`refine_gaussians` returns.

    Attributes:
        gaussians: the refined set (a batch of one, detached, on the input's device).
        extrinsics: ``[V, 4, 4]`` the cameras (refined when ``optimize_cameras``).
        steps: steps taken (counting steps of a resumed checkpoint).
        seconds: time spent fitting (evaluation excluded; a resumed fit adds its earlier time).
        count_before: Gaussians at the start; count_after: at the end.
        curve: ``[{"step", "loss", "count"}]`` the mean loss of each stretch of steps.
        evaluations: ``[{"step", "seconds", **evaluate(...)}]`` at step 0, every ``eval_every``
            steps (default: 4 times over the budget) and at the end.
        stopped: ``"steps"``, ``"time"``, ``"nan"`` (a non-finite loss; the last finite state is
            returned) or ``"interrupted"`` (Ctrl-C or SIGTERM).
        interrupted_by: ``"Ctrl-C"`` or ``"SIGTERM"`` when ``stopped == "interrupted"``, else ``""``.
        image_size: ``(H, W)`` the photos were fitted at.
        densify: the rule's counts (``relocated``/``added`` or ``cloned``/``split``/``pruned``/
            ``resets``).
        timings: seconds spent in ``forward`` (render + loss), ``backward``, ``densify`` and
            ``optimizer`` (Adam, noise, schedules) over the whole fit.
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
            "densify": dict(self.densify),
            "curve": self.curve,
            "evaluations": self.evaluations,
            "timings": {k: round(v, 3) for k, v in self.timings.items()},
        }


def fit_shape(image_size: tuple[int, int], size: int | None) -> tuple[int, int]:
    """``(H, W)`` with the long side ``size`` (``None``: the photo's, capped at
    :data:`~models.refine.settings.DEFAULT_MAX_SIZE`), the aspect ratio kept."""
    height, width = image_size
    long_side = max(height, width)
    target = min(long_side, DEFAULT_MAX_SIZE) if size is None else int(size)
    scale = target / long_side
    return max(1, round(height * scale)), max(1, round(width * scale))


def scene_extent(extrinsics: Tensor, means: Tensor | None = None) -> float:
    """3DGS's ``cameras_extent``: 1.1 x the largest distance of a camera centre from their mean
    (one camera, or all at one place: the spread of ``means`` around it, else 1)."""
    centres = extrinsics[:, :3, 3].double()
    radius = float((centres - centres.mean(0)).norm(dim=-1).max()) if len(centres) > 1 else 0.0
    if radius <= 1e-8 and means is not None and means.numel():
        radius = float((means.double() - centres.mean(0)).norm(dim=-1).median())
    return 1.1 * radius if radius > 1e-8 else 1.0


def estimate_memory(
    count: int, views: int, image_size: tuple[int, int], sh_degree: int, backend: str
) -> int:
    """Bytes the fit needs at its peak (documented estimate, within about 2x of measurements).

    Per Gaussian: the raw parameters, their gradients and two Adam moments
    (``4 x (14 + 3 (d+1)^2)`` floats), the activated set and the projection of one view (about 80
    floats), and its tile entries in the rasteriser (about 8 tiles, 3 words each). Per photo: the
    fitted image. Per pixel of the view being fitted: the loss's SSIM maps and the renderer's
    buffers (about 60 floats; the torch backend composites up to ``2^20`` tile-pixel-Gaussian
    entries at a time, about 24 floats each).
    """
    height, width = image_size
    per_gaussian = 4 * (4 * (14 + 3 * (sh_degree + 1) ** 2) + 80 + 24)
    pixels = height * width
    working = 4 * 60 * pixels
    if backend == "torch":
        working += 4 * 24 * (1 << 20)
    return int(count * per_gaussian + views * 3 * pixels * 4 + working)


def _check_inputs(images: Tensor, extrinsics: Tensor, intrinsics: Tensor) -> None:
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

    def __init__(
        self,
        gaussians: Gaussians,
        images: Tensor,
        extrinsics: Tensor,
        intrinsics: Tensor,
        settings: RefineSettings,
        optimize_cameras: bool,
    ) -> None:
        self.settings = settings
        self.device = gaussians.device
        self.images = images
        self.base_extrinsics = extrinsics
        self.intrinsics = intrinsics
        self.views = images.shape[0]
        degree = gaussians.sh_degree if settings.sh_degree is None else int(settings.sh_degree)
        self.extent = scene_extent(extrinsics, gaussians.means[0])
        s = settings
        self.lrs = {
            "means": s.lr_means * self.extent,
            "scales": s.lr_scales,
            "rotations": s.lr_rotations,
            "opacities": s.lr_opacities,
            "sh_dc": s.lr_sh,
            "sh_rest": s.lr_sh / 20.0,
        }
        start_count = int(gaussians.count()[0])
        self.cap = int(s.max_gaussians) if s.max_gaussians else max(2 * start_count, 1)
        if start_count > self.cap:
            gaussians = gaussians.prune(max_count=self.cap)
        self.params = GaussianParameters(gaussians, degree, self.lrs)
        self.generator = torch.Generator(device="cpu").manual_seed(int(s.seed))
        if s.densify == "mcmc":
            self.rule: MCMC | ADC | None = MCMC(s.mcmc, self.cap, self.generator)
        elif s.densify == "adc":
            self.rule = ADC(s.adc, self.cap, self.extent, self.generator)
        else:
            self.rule = None
        self.camera_delta: Tensor | None = None
        self.camera_optimizer = None
        if optimize_cameras and self.views > 1:
            self.camera_delta = torch.zeros(
                self.views - 1, 6, device=self.device, requires_grad=True
            )
            self.camera_optimizer = torch.optim.Adam([self.camera_delta], lr=s.lr_cameras)
        self.step = 0
        self.seconds = 0.0
        self.order: list[int] = []
        self.curve: list[dict[str, float]] = []
        self.evaluations: list[dict[str, float]] = []
        self.timings = {"forward": 0.0, "backward": 0.0, "densify": 0.0, "optimizer": 0.0}
        self.count_before = start_count

    # ------------------------------------------------------------------ cameras
    def extrinsics(self) -> Tensor:
        """``[V, 4, 4]`` the cameras, with the refined deltas (view 0 fixed)."""
        if self.camera_delta is None:
            return self.base_extrinsics
        from models.pose_fit import se3_delta

        delta = se3_delta(self.camera_delta[:, :3], self.camera_delta[:, 3:] * self.extent)
        moved = self.base_extrinsics[1:] @ delta  # [V-1, 4, 4] (in each camera's frame)
        return torch.cat([self.base_extrinsics[:1], moved])

    # ------------------------------------------------------------------ schedule
    def progress(self) -> float:
        s = self.settings
        parts = [0.0]
        if s.steps:
            parts.append(self.step / s.steps)
        if s.time:
            parts.append(self.seconds / s.time)
        return min(1.0, max(parts))

    def lr_means(self) -> float:
        s = self.settings
        ratio = s.lr_means_final / s.lr_means
        return self.lrs["means"] * ratio ** self.progress()

    def degree(self) -> int:
        return min(self.params.sh_degree, self.step // self.settings.sh_degree_every)

    def next_view(self) -> int:
        if not self.order:
            perm = torch.randperm(self.views, generator=self.generator).tolist()
            self.order = perm
        return self.order.pop()

    # ------------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict:
        return {
            "params": self.params.state_dict(),
            "rule": self.rule.state_dict() if self.rule is not None else None,
            "camera_delta": None if self.camera_delta is None else self.camera_delta.detach(),
            "camera_optimizer": None
            if self.camera_optimizer is None
            else self.camera_optimizer.state_dict(),
            "step": self.step,
            "seconds": self.seconds,
            "order": list(self.order),
            "curve": self.curve,
            "evaluations": self.evaluations,
            "timings": self.timings,
            "count_before": self.count_before,
            "generator": self.generator.get_state(),
            "views": self.views,
        }

    def load_state_dict(self, state: dict) -> None:
        if int(state["views"]) != self.views:
            raise ValueError(f"checkpoint has {state['views']} views, the fit has {self.views}")
        self.params.load_state_dict(state["params"])
        if self.rule is not None and state["rule"] is not None:
            self.rule.load_state_dict(state["rule"])
        if self.camera_delta is not None and state["camera_delta"] is not None:
            with torch.no_grad():
                self.camera_delta.copy_(state["camera_delta"])
            self.camera_optimizer.load_state_dict(state["camera_optimizer"])
        self.step = int(state["step"])
        self.seconds = float(state["seconds"])
        self.order = list(state["order"])
        self.curve = list(state["curve"])
        self.evaluations = list(state["evaluations"])
        self.timings = dict(state["timings"])
        self.count_before = int(state["count_before"])
        self.generator.set_state(state["generator"])


def _save_checkpoint(fit: _Fit, path: Path) -> None:
    """Write the fit's state atomically (a temporary file beside it, then a rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    torch.save(fit.state_dict(), partial)
    os.replace(partial, path)


def _evaluate(fit: _Fit, evaluate: Evaluate | None, gaussians: Gaussians) -> None:
    if evaluate is None:
        return
    if fit.evaluations and fit.evaluations[-1]["step"] == fit.step:
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


def _due_evaluation(fit: _Fit, eval_every: int | None, last_progress: float) -> bool:
    if eval_every:
        return fit.step % eval_every == 0
    quarters = math.floor(fit.progress() * 4)
    return quarters > math.floor(last_progress * 4) and quarters < 4


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
) -> RefineResult:
    """Optimise ``gaussians`` against posed photos.

    Args:
        gaussians: the start (a batch of one; feed-forward output, a ``.ply``, or
            :func:`~models.refine.start.gaussians_from_points`).
        images: ``[V, 3, H, W]`` the training photos in [0, 1] (any size: resized here to
            ``settings.size`` on the long side).
        extrinsics: ``[V, 4, 4]`` camera-to-world, OpenCV axes, in the Gaussians' frame.
        intrinsics: ``[V, 3, 3]`` normalised.
        settings: budget, size, rates, densification (:class:`RefineSettings`).
        optimize_cameras: refine the cameras jointly (pose-free inputs: the predicted ones);
            view 0 stays fixed, the others get an se(3) delta each.
        evaluate: ``evaluate(gaussians, extrinsics) -> {name: value}``, the caller's held-out
            scorer (the held-out photos never enter the fit), called at step 0, every
            ``eval_every`` steps (default: at each quarter of the budget) and at the end.
        eval_every: steps between evaluations.
        checkpoint_path: a file for the fit's state, saved every ``settings.checkpoint_every``
            steps and at the end; when it exists, the fit resumes from it.
        progress: show a tqdm bar (loss and Gaussian count).

    Raises:
        RefineMemoryError: the estimated memory exceeds what is available.
        RefineSettingsError: a setting out of range.
        ValueError: inputs of the wrong shape.
    """
    settings.check()
    _check_inputs(images, extrinsics, intrinsics)
    if gaussians.batch_size != 1:
        raise ValueError(f"refine one scene at a time, got a batch of {gaussians.batch_size}")
    device = gaussians.device
    shape = fit_shape(tuple(images.shape[-2:]), settings.size)
    degree = gaussians.sh_degree if settings.sh_degree is None else int(settings.sh_degree)
    start_count = int(gaussians.count()[0])
    cap = int(settings.max_gaussians) if settings.max_gaussians else max(2 * start_count, 1)
    backend = settings.backend
    need = estimate_memory(cap, images.shape[0], shape, degree, backend)
    limit = settings.memory_limit or available_memory(str(device))
    if need > limit:
        raise RefineMemoryError(
            "refine_size=",
            f"the fit needs about {need / 2**30:.2f} GiB at {shape[1]}x{shape[0]} with up to "
            f"{cap} Gaussians, {limit / 2**30:.2f} GiB is available: lower refine_size= or "
            "max_gaussians=",
        )
    fitted = images.to(device=device, dtype=torch.float32)
    if tuple(fitted.shape[-2:]) != shape:
        fitted = F.interpolate(fitted, size=shape, mode="area")
    fit = _Fit(
        gaussians,
        fitted.contiguous(),
        extrinsics.to(device=device, dtype=torch.float32),
        intrinsics.to(device=device, dtype=torch.float32),
        settings,
        optimize_cameras,
    )
    checkpoint = Path(checkpoint_path) if checkpoint_path is not None else None
    if checkpoint is not None and checkpoint.is_file():
        try:
            state = torch.load(checkpoint, map_location=device, weights_only=False)
            fit.load_state_dict(state)
        except (OSError, RuntimeError, KeyError, ValueError) as error:
            raise InputError(checkpoint, f"not a usable refinement checkpoint ({error})") from error
    background = torch.tensor(settings.background, dtype=torch.float32, device=device)
    if fit.step == 0:
        _evaluate(fit, evaluate, fit.params.gaussians(fit.degree()).detach())

    from tqdm.auto import tqdm

    total = settings.steps
    bar = tqdm(
        total=total,
        initial=fit.step,
        desc="refine",
        unit="step",
        disable=not progress,
        dynamic_ncols=True,
    )
    stopped = "steps"
    last_good = None
    window: list[float] = []
    curve_every = max(1, (settings.steps or 1000) // 50)
    timer = time.perf_counter
    interrupted_by = ""
    try:
        while True:
            if settings.steps and fit.step >= settings.steps:
                stopped = "steps"
                break
            if settings.time and fit.seconds >= settings.time:
                stopped = "time"
                break
            last_progress = fit.progress()
            t0 = timer()
            view = fit.next_view()
            current = fit.params.gaussians(fit.degree())
            cameras = fit.extrinsics()
            out = render(
                current,
                cameras[view][None, None],
                fit.intrinsics[view][None, None],
                shape,
                background=background,
                backend=backend,
            )
            if isinstance(fit.rule, ADC) and out.means2d is not None and out.means2d.requires_grad:
                out.means2d.retain_grad()
            rendered = out.color[0]  # [1, 3, H, W]
            target = fit.images[view][None]
            loss = photometric_loss(rendered, target, settings.ssim_weight)
            if fit.rule is not None:
                loss = loss + fit.rule.regulariser(fit.params)
            t1 = timer()
            if not torch.isfinite(loss):
                stopped = "nan"
                break
            last_good = (current.detach().map(torch.clone), cameras.detach().clone())
            fit.params.optimizer.zero_grad(set_to_none=True)
            if fit.camera_optimizer is not None:
                fit.camera_optimizer.zero_grad(set_to_none=True)
            loss.backward()
            t2 = timer()
            fit.params.set_lr("means", fit.lr_means())
            fit.params.optimizer.step()
            if fit.camera_optimizer is not None:
                for group in fit.camera_optimizer.param_groups:
                    group["lr"] = (
                        settings.lr_cameras
                        * (settings.lr_means_final / settings.lr_means) ** fit.progress()
                    )
                fit.camera_optimizer.step()
            if isinstance(fit.rule, MCMC):
                fit.rule.noise(fit.params, fit.lr_means())
            t3 = timer()
            fit.step += 1
            if isinstance(fit.rule, ADC):
                fit.rule.observe(out, shape)
            _densify(fit)
            t4 = timer()
            fit.seconds += t4 - t0
            fit.timings["forward"] += t1 - t0
            fit.timings["backward"] += t2 - t1
            fit.timings["optimizer"] += t3 - t2
            fit.timings["densify"] += t4 - t3
            value = loss.item()
            window.append(value)
            if fit.step % curve_every == 0:
                fit.curve.append(
                    {
                        "step": fit.step,
                        "loss": round(sum(window) / len(window), 5),
                        "count": fit.params.count,
                    }
                )
                window = []
            bar.update(1)
            bar.set_postfix(loss=f"{value:.4f}", gaussians=fit.params.count, refresh=False)
            if _due_evaluation(fit, eval_every, last_progress):
                _evaluate(fit, evaluate, fit.params.gaussians(fit.degree()).detach())
            if checkpoint is not None and fit.step % settings.checkpoint_every == 0:
                _save_checkpoint(fit, checkpoint)
    except KeyboardInterrupt as error:
        stopped = "interrupted"
        interrupted_by = "SIGTERM" if isinstance(error, Terminated) else "Ctrl-C"
    finally:
        bar.close()
    if stopped == "nan":
        if last_good is None:
            final, cameras = fit.params.gaussians(fit.degree()).detach(), fit.extrinsics().detach()
        else:
            final, cameras = last_good
    else:
        final, cameras = fit.params.gaussians(fit.degree()).detach(), fit.extrinsics().detach()
        if window:
            fit.curve.append(
                {
                    "step": fit.step,
                    "loss": round(sum(window) / len(window), 5),
                    "count": fit.params.count,
                }
            )
    final = final.map(lambda t: t.detach().clone())
    if final.harmonics.shape[-1] < (fit.params.sh_degree + 1) ** 2:
        final.harmonics = F.pad(
            final.harmonics, (0, (fit.params.sh_degree + 1) ** 2 - final.harmonics.shape[-1])
        )
    if stopped != "interrupted":
        _evaluate(fit, evaluate, final)
    if checkpoint is not None and stopped in ("steps", "time", "interrupted"):
        _save_checkpoint(fit, checkpoint)
    densify_counts = _rule_counts(fit)
    messages = {
        "steps": f"refined {fit.step} steps in {fit.seconds:.0f} s",
        "time": f"refined {fit.step} steps in {fit.seconds:.0f} s (the time budget)",
        "nan": f"refinement stopped at step {fit.step}: the loss is not finite; the last finite "
        "state is kept",
        "interrupted": f"refinement interrupted at step {fit.step} ({interrupted_by}); what it "
        "has is kept",
    }
    return RefineResult(
        interrupted_by=interrupted_by,
        gaussians=final,
        extrinsics=cameras,
        steps=fit.step,
        seconds=fit.seconds,
        count_before=fit.count_before,
        count_after=int(final.count()[0]),
        curve=fit.curve,
        evaluations=fit.evaluations,
        stopped=stopped,
        image_size=shape,
        densify=densify_counts,
        timings=dict(fit.timings),
        message=messages[stopped],
    )


def _rule_counts(fit: _Fit) -> dict[str, int]:
    if isinstance(fit.rule, MCMC):
        return {"relocated": fit.rule.relocated, "added": fit.rule.added}
    if isinstance(fit.rule, ADC):
        r = fit.rule
        return {"cloned": r.cloned, "split": r.split, "pruned": r.pruned, "resets": r.resets}
    return {}


def _densify(fit: _Fit) -> None:
    """Run the densification rule when it is due."""
    rule, step = fit.rule, fit.step
    if rule is None:
        return
    sub = rule.settings
    window = step >= sub.start and fit.progress() < sub.stop_fraction
    if isinstance(rule, MCMC):
        if window and step % sub.every == 0:
            rule.step(fit.params)
        return
    if window and step % sub.every == 0:
        rule.step(fit.params, after_reset=step > sub.reset_every)
    if fit.progress() < sub.stop_fraction and step % sub.reset_every == 0:
        rule.reset_opacity(fit.params)
