"""What every model of the zoo shares: the output type and the base class."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, ClassVar

from huggingface_hub import PyTorchModelHubMixin
from torch import Tensor, nn

from models.core.gaussians import Gaussians

__all__ = [
    "RENAMED_ARGS",
    "ModelOutput",
    "SplatModel",
    "check_context",
    "constructor_arguments",
    "describe_unknown_arguments",
    "renamed",
]


# The typed fields that ``ModelOutput.extras`` lists under their own names.
_TYPED_KEYS = ("depth", "extrinsics", "intrinsics", "gaussians_per_iteration", "render_targets")


@dataclass(init=False, eq=False)
class ModelOutput:
    """What a model's forward returns.

    Attributes:
        gaussians: the predicted Gaussians, in the scene frame of the first context view.
        depth: predicted z-depth of the context views, ``[B, V, H, W]``, or None.
        extrinsics: predicted camera-to-world context cameras (pose-free models), ``[B, V, 4, 4]``.
        intrinsics: the intrinsics those cameras go with (normalised), ``[B, V, 3, 3]``.
        gaussians_per_iteration: each iteration's Gaussians (recurrent families), or None.
        render_targets: ``(weight, Gaussians)`` sets that training renders instead of the single
            ``gaussians`` (ReSplat supervises every iteration), or None.
        losses: name -> **unweighted** scalar auxiliary loss term (no ``"loss/"`` prefix); the
            family's training recipe weighs and schedules them.
        diagnostics: anything else (``routing_map``, ``hf_energy``, ``expert_usage``,
            ``scene_token_index``, ...).
        extras: (read-only property) all of the above but ``gaussians`` in one dict, losses
            under ``"loss/<name>"``.
    """

    gaussians: Gaussians
    depth: Tensor | None
    extrinsics: Tensor | None
    intrinsics: Tensor | None
    gaussians_per_iteration: list[Gaussians] | None
    render_targets: list[tuple[float, Gaussians]] | None
    losses: dict[str, Tensor]
    diagnostics: dict[str, Any]

    def __init__(
        self,
        gaussians: Gaussians,
        *,
        depth: Tensor | None = None,  # [B, V, H, W]
        extrinsics: Tensor | None = None,  # [B, V, 4, 4]
        intrinsics: Tensor | None = None,  # [B, V, 3, 3]
        gaussians_per_iteration: list[Gaussians] | None = None,
        render_targets: list[tuple[float, Gaussians]] | None = None,
        losses: dict[str, Tensor] | None = None,
        diagnostics: dict[str, Any] | None = None,
    ) -> None:
        self.gaussians = gaussians
        self.depth = depth
        self.extrinsics = extrinsics
        self.intrinsics = intrinsics
        self.gaussians_per_iteration = gaussians_per_iteration
        self.render_targets = render_targets
        self.losses = dict(losses or {})
        self.diagnostics = dict(diagnostics or {})

    @property
    def extras(self) -> Mapping[str, Any]:
        """Everything besides ``gaussians`` in one read-only dict (DESIGN's ``pred.extras``): the
        auxiliary losses as ``"loss/<name>"``, the diagnostics, and the typed fields that are set
        under their own names (``"depth"``, ``"extrinsics"``, ``"gaussians_per_iteration"``, ...).

        A view built on each access: to add a loss or a diagnostic, write to ``losses`` or
        ``diagnostics``."""
        view: dict[str, Any] = dict(self.diagnostics)
        for key in _TYPED_KEYS:
            value = getattr(self, key)
            if value is not None:
                view[key] = value
        view.update({f"loss/{name}": value for name, value in self.losses.items()})
        return MappingProxyType(view)


def check_context(context: dict[str, Tensor], require_poses: bool) -> tuple[int, int, int, int]:
    """Validate a context dict; return ``(B, V, H, W)``.

    Raises:
        ValueError: naming the offending key when shapes or values are wrong.
    """
    if "image" not in context:
        raise ValueError("context must contain 'image' [B, V, 3, H, W]")
    image = context["image"]
    if image.ndim != 5 or image.shape[2] != 3:
        raise ValueError(f"context['image'] must be [B, V, 3, H, W], got {tuple(image.shape)}")
    b, v, _, h, w = image.shape
    keys = ("extrinsics", "intrinsics") if require_poses else ()
    for key in keys:
        if key not in context:
            raise ValueError(f"this model is posed: context must contain {key!r}")
    shapes = {"extrinsics": (b, v, 4, 4), "intrinsics": (b, v, 3, 3), "near": (b, v), "far": (b, v)}
    for key, shape in shapes.items():
        if key in context and context[key] is not None and tuple(context[key].shape) != shape:
            raise ValueError(
                f"context[{key!r}] must be {list(shape)} to match image, "
                f"got {tuple(context[key].shape)}"
            )
    if "intrinsics" in context and context["intrinsics"] is not None:
        if context["intrinsics"][..., :2, :].abs().amax() > 50:
            raise ValueError(
                "context['intrinsics'] must be normalised (row 0 / width, row 1 / height); "
                "got values > 50, which look like pixel units"
            )
    return b, v, h, w


# Constructor arguments that only fetch initial weights, and the value that fetches nothing. Saved
# weights hold every weight, so rebuilding a model from them sets these to that value (the
# requested value stays in config.json): nothing is downloaded or read twice, and ReSplat's
# stage-1 file may be gone.
INIT_ONLY_ARGS: dict[str, Any] = {"pretrained_backbone": False, "init_checkpoint": None}


class SplatModel(
    nn.Module,
    PyTorchModelHubMixin,
    library_name="splatzoo",
    tags=["gaussian-splatting", "3d-reconstruction", "splatzoo"],
    repo_url="https://github.com/splatzoo/splatzoo",
):
    """Base class of every family.

    Subclasses take plain keyword arguments (all JSON-serialisable, so ``config.json`` written by
    ``save_pretrained`` holds every constructor argument) and implement ``forward(context, ...)``
    returning a ``ModelOutput``. Class attributes say what the model needs.
    """

    family: ClassVar[str] = "base"
    pose_free: ClassVar[bool] = False
    min_views: ClassVar[int] = 1

    @classmethod
    def _from_pretrained(cls, **kwargs):  # type: ignore[override]
        """Build without fetching initial weights (``INIT_ONLY_ARGS``): the saved weights hold
        every weight. The requested values are kept in the model's config."""
        requested = {key: kwargs[key] for key in INIT_ONLY_ARGS if key in kwargs}
        kwargs.update({key: INIT_ONLY_ARGS[key] for key in requested})
        model = super()._from_pretrained(**kwargs)
        if isinstance(getattr(model, "_hub_mixin_config", None), dict):
            model._hub_mixin_config.update(requested)
        return model

    def forward(self, context: dict[str, Tensor], **kwargs) -> ModelOutput:  # pragma: no cover
        raise NotImplementedError  # abstract: every family overrides it


def constructor_arguments(cls: type) -> tuple[set[str], bool]:
    """The keyword arguments ``cls.__init__`` names, and whether it also takes ``**kwargs``: the
    one reader of a model's signature (rebuilding from recorded arguments, config checks)."""
    parameters = inspect.signature(cls.__init__).parameters.values()
    named = {
        p.name
        for p in parameters
        if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    }
    return named, any(p.kind is p.VAR_KEYWORD for p in parameters)


# Constructor arguments that were renamed (old name -> new name). Weights whose config records an
# old name do not load: the error names the new one (nothing is translated silently).
RENAMED_ARGS: dict[str, str] = {
    "img_size": "image_size",
    "num_candidates": "num_depth_candidates",
    "posed": "pose_free (inverted)",
    "size": "vit_size",
    "vit": "vit_size",
    "backbone_size": "vit_size",
}


def renamed(key: str) -> str:
    """``key``, with its new name if it was renamed: ``"img_size (now image_size)"``."""
    return f"{key} (now {RENAMED_ARGS[key]})" if key in RENAMED_ARGS else key


def describe_unknown_arguments(unknown: Mapping[str, Any]) -> str:
    """``key=value`` for each argument a constructor does not take, with the new name of a
    renamed one: ``img_size=64 (now image_size), chamfer_weight=0.1``."""
    return ", ".join(
        f"{key}={value!r}" + renamed(key)[len(key) :] for key, value in sorted(unknown.items())
    )
