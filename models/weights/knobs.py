"""Inference knobs: what each family declares, and a re-runner that reuses what they leave alone.

A family module (``models/families/<name>.py``) declares, at module level and readable without
building a model:

- ``INFERENCE_KNOBS``: a tuple of :class:`Knob` (name, type, range, help), the forward keywords a
  user may turn at inference time (ZipSplat ``compression``, ReSplat ``iterations``, SplatWeaver
  ``gaussians_per_pixel``, every family ``max_gaussians``);
- ``KNOB_FREE_MODULES``: names of submodules whose output the knobs do not change for a fixed
  context (the backbone, ...), so a viewer or a sweep may compute them once.

A family that declares nothing gets ``max_gaussians`` (every family's forward takes it: it keeps
the most opaque Gaussians of the result, :meth:`Gaussians.prune`) and no reuse.

:class:`KnobRunner` re-runs a model on one context as knobs change: ``max_gaussians`` prunes the
cached unpruned result (no forward at all); the other knobs run the forward with the declared
submodules memoised (a call whose arguments equal the cached call's returns the cached output).
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import import_module
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import Tensor, nn

from models.core.gaussians import Gaussians
from models.weights.registry import list_models, model_entrypoint

if TYPE_CHECKING:
    from models.core.base import ModelOutput

__all__ = [
    "Knob",
    "MAX_GAUSSIANS",
    "KnobRunner",
    "inference_knobs",
    "knob_free_modules",
]


@dataclass(frozen=True)
class Knob:
    """One inference-time forward keyword of a family.

    Attributes:
        name: the forward keyword.
        kind: ``"float"`` or ``"int"``.
        low: smallest value (inclusive unless ``low_open``).
        high: largest value (inclusive); ``None``: unbounded (or ``high_attr``).
        step: a sensible slider step.
        help: one line saying what the knob does.
        default_attr: model attribute holding the value used when the knob is not given
            (``None``: not given means "off", e.g. no budget).
        high_attr: model attribute giving ``high`` (e.g. SplatWeaver's ``num_experts``).
        low_open: ``low`` itself is not allowed (ZipSplat's ratio is in ``(0, 1]``).
        on_output: the knob only edits the forward's result (``max_gaussians``: a prune), so a
            re-runner applies it to a cached result instead of running the model.
        sweep: values a benchmark scores the family at (a curve across the knob; ``bench/zoo.py``
            reads them); empty: not swept.
    """

    name: str
    kind: Literal["float", "int"]
    low: float
    high: float | None
    step: float
    help: str
    default_attr: str | None = None
    high_attr: str | None = None
    low_open: bool = False
    on_output: bool = False
    sweep: tuple[float, ...] = ()

    def bounds(self, model: nn.Module | None = None) -> tuple[float, float | None]:
        """``(low, high)`` for ``model`` (``high_attr`` read from it when given)."""
        high = self.high
        if self.high_attr is not None and model is not None:
            value = getattr(model, self.high_attr, None)
            if value is not None:
                high = float(value)
        return self.low, high

    def default(self, model: nn.Module | None = None) -> float | int | None:
        """The model's value when the knob is not given (``None``: off)."""
        if self.default_attr is None or model is None:
            return None
        value = getattr(model, self.default_attr, None)
        if value is None:
            return None
        return int(value) if self.kind == "int" else float(value)

    def check(self, value: Any, model: nn.Module | None = None) -> float | int | None:
        """``value`` converted to the knob's type.

        Raises:
            ValueError: ``"<name>=<value>: must be ..."`` when out of range or not a number.
        """
        if value is None:
            return None
        try:
            number = float(value)
        except (TypeError, ValueError) as error:
            raise ValueError(f"{self.name}={value}: not a number") from error
        if self.kind == "int":
            if not math.isfinite(number) or number != int(number):
                raise ValueError(f"{self.name}={value}: must be an integer")
            number = int(number)
        low, high = self.bounds(model)
        too_low = number <= low if self.low_open else number < low
        if too_low or (high is not None and number > high) or not math.isfinite(number):
            left = "(" if self.low_open else "["
            right = f"{high:g}]" if high is not None else "inf)"
            raise ValueError(f"{self.name}={value}: must be in {left}{low:g}, {right}")
        return number


MAX_GAUSSIANS = Knob(
    "max_gaussians",
    "int",
    low=0,
    high=None,
    step=1,
    help="keep at most this many Gaussians, the most opaque ones (off: keep all)",
    on_output=True,
)


def _family_module(model: str | nn.Module):
    if isinstance(model, str):
        return import_module(model_entrypoint(model).__module__)
    name = getattr(model, "registry_name", None)
    if isinstance(name, str):
        return import_module(model_entrypoint(name).__module__)
    return import_module(type(model).__module__)


def inference_knobs(model: str | nn.Module) -> tuple[Knob, ...]:
    """The knobs a registered model name (or a built model) declares; without building it.

    Raises:
        ValueError: for an unknown model name (listing the valid ones).
    """
    declared = getattr(_family_module(model), "INFERENCE_KNOBS", None)
    return tuple(declared) if declared is not None else (MAX_GAUSSIANS,)


def declared_knob_names() -> tuple[str, ...]:
    """Every knob name any registered model declares (sorted): the settings ``infer.py`` and
    ``view.py`` accept as knobs, read from the families' declarations."""
    return tuple(sorted({knob.name for arch in list_models() for knob in inference_knobs(arch)}))


def knob_free_modules(model: str | nn.Module) -> tuple[str, ...]:
    """Submodule names whose output the knobs do not change (the family's declaration)."""
    return tuple(getattr(_family_module(model), "KNOB_FREE_MODULES", ()))


# --------------------------------------------------------------------------- re-running


def _same(a: Any, b: Any) -> bool:
    """Whether two call arguments are equal (tensors by value, containers element-wise)."""
    if a is b:
        return True
    if isinstance(a, Tensor) or isinstance(b, Tensor):
        return (
            isinstance(a, Tensor)
            and isinstance(b, Tensor)
            and a.shape == b.shape
            and a.dtype == b.dtype
            and a.device == b.device
            and bool(torch.equal(a, b))
        )
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    try:
        return bool(a == b)
    except Exception:  # objects without a usable ==
        return False


class KnobRunner:
    """Re-run ``model`` on one fixed ``context`` as knobs change.

    ``max_gaussians`` (an output knob) prunes the cached result of the other knobs' values; a
    change of another knob runs the forward with the family's ``KNOB_FREE_MODULES`` memoised, so
    e.g. ZipSplat's and SplatWeaver's backbone and ReSplat's initial model run once.

    Attributes:
        knobs: the model's declared knobs, by name.
        reused: the memoised submodule names present on this model.
        computed: how often each memoised submodule actually ran (a cache miss).
        forwards: how many forward passes ran.
        output: the last forward's ``ModelOutput`` (None before the first forward).
    """

    def __init__(
        self,
        model: nn.Module,
        context: dict[str, Tensor],
        max_cached: int = 8,
        transform: Callable[[Gaussians], Gaussians] | None = None,
        **forward_kwargs,
    ) -> None:
        self.model = model
        self.transform = transform  # e.g. back to the capture's frame (SceneFrame)
        self.context = context
        self.forward_kwargs = forward_kwargs  # fixed extra forward keywords
        self.knobs = {knob.name: knob for knob in inference_knobs(model)}
        self.reused = tuple(
            name
            for name in knob_free_modules(model)
            if isinstance(getattr(model, name, None), nn.Module)
        )
        self.computed: Counter[str] = Counter()
        self.forwards = 0
        self.output: ModelOutput | None = None
        self._memo: dict[str, tuple[tuple, dict, Any]] = {}
        self._results: OrderedDict[tuple, Gaussians] = OrderedDict()
        self._max_cached = max_cached

    def defaults(self) -> dict[str, float | int | None]:
        """Every knob's value when not given (the model's configured values; ``None``: off)."""
        return {name: knob.default(self.model) for name, knob in self.knobs.items()}

    @contextlib.contextmanager
    def _reusing(self) -> Iterator[None]:
        patched = []
        for name in self.reused:
            module = getattr(self.model, name)
            if "forward" in vars(module):  # already patched (re-entrant call): leave it
                continue
            module.forward = self._memoised(name, module.forward)
            patched.append(module)
        try:
            yield
        finally:
            for module in patched:
                del module.forward

    def _memoised(self, name: str, forward):
        @functools.wraps(forward)
        def call(*args, **kwargs):
            cached = self._memo.get(name)
            if cached is not None and _same(cached[0], args) and _same(cached[1], kwargs):
                return cached[2]
            output = forward(*args, **kwargs)
            self.computed[name] += 1
            self._memo[name] = (args, kwargs, output)
            return output

        return call

    def run(self, **values: float | int | None) -> Gaussians:
        """The Gaussians for these knob values (``None`` or absent: the model's default).

        Raises:
            ValueError: for a knob the model does not declare, or a value out of range.
        """
        unknown = sorted(set(values) - set(self.knobs))
        if unknown:
            raise ValueError(
                f"{unknown[0]}: not a knob of this model (knobs: {', '.join(self.knobs)})"
            )
        checked = {k: self.knobs[k].check(v, self.model) for k, v in values.items()}
        for name, knob in self.knobs.items():  # explicit defaults: one cache key per setting
            if checked.get(name) is None and not knob.on_output:
                checked[name] = knob.default(self.model)
        forward = {
            k: v for k, v in checked.items() if v is not None and not self.knobs[k].on_output
        }
        key = tuple(sorted(forward.items()))
        gaussians = self._results.get(key)
        if gaussians is None:
            with torch.inference_mode(), self._reusing():
                pred = self.model(self.context, **self.forward_kwargs, **forward)
            self.forwards += 1
            self.output = pred
            gaussians = pred.gaussians.detach()
            if self.transform is not None:
                gaussians = self.transform(gaussians)
            self._results[key] = gaussians
            while len(self._results) > self._max_cached:
                self._results.popitem(last=False)
        self._results.move_to_end(key)
        limit = checked.get("max_gaussians")
        if limit is not None:
            gaussians = gaussians.prune(max_count=int(limit))
        return gaussians
