"""What every model of the zoo shares: the output type and the base class."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from huggingface_hub import PyTorchModelHubMixin
from torch import Tensor, nn

from .gaussians import Gaussians

__all__ = ["ModelOutput", "SplatModel", "check_context"]


@dataclass
class ModelOutput:
    """What a model's forward returns.

    Attributes:
        gaussians: the predicted Gaussians, in the scene frame of the first context view.
        extras: auxiliary losses under ``"loss/<name>"`` (scalars, already weighted, added to the
            training loss by the LightningModule) and diagnostics (routing maps, per-iteration
            Gaussians, predicted depth ``"depth"`` ``[B, V, H, W]``, predicted cameras for
            pose-free models ``"extrinsics"``/``"intrinsics"``, ...).
    """

    gaussians: Gaussians
    extras: dict[str, Any] = field(default_factory=dict)


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
