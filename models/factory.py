"""Building models: ``create_model`` and ``load_model`` (timm's ``_factory`` over ``_builder``).

The layers: ``registry`` (entry points, pretrained configs) → ``pretrained`` (where weights are,
reading them, loading them strictly) → this module. A weights location is resolved **once** into
a :class:`~models.weights.pretrained.WeightsSource` (path, format, config, recorded identity), which both
builds the model (with the constructor arguments recorded with the weights) and loads it.
"""

from __future__ import annotations

import os
import typing
from typing import Any

from torch import nn

from models.base import constructor_arguments, describe_unknown_arguments
from models.registry import get_pretrained_cfg, model_entrypoint, to_plain
from models.weights.pretrained import PretrainedError, load_source, resolve_source, source_arguments
from models.weights.pretrained_cfg import split_model_name

__all__ = ["build_from_recorded", "create_model", "load_model", "model_class"]


def model_class(name: str) -> type[nn.Module] | None:
    """The class an entry point builds (its return annotation), or ``None`` if it does not say."""
    entrypoint = model_entrypoint(split_model_name(name)[0])
    try:
        hints = typing.get_type_hints(entrypoint)
    except Exception:  # an annotation that does not resolve
        return None
    cls = hints.get("return")
    return cls if isinstance(cls, type) and issubclass(cls, nn.Module) else None


def _accepted_arguments(name: str) -> set[str] | None:
    """The constructor's keyword arguments (``None``: it takes any, ``**kwargs``)."""
    cls = model_class(name)
    if cls is None:
        return None
    named, any_keyword = constructor_arguments(cls)
    return None if any_keyword else named


def build_from_recorded(
    name: str, recorded: dict[str, Any], overrides: dict[str, Any] | None = None
) -> nn.Module:
    """Build ``name`` with the arguments recorded with some weights (explicit overrides win).

    Raises:
        PretrainedError: the weights record an argument the constructor does not take (an option
            removed or renamed since they were saved; a renamed one is named).
    """
    accepted = _accepted_arguments(name)
    unknown = sorted(set(recorded) - accepted) if accepted is not None else []
    if unknown:
        shown = describe_unknown_arguments({key: recorded[key] for key in unknown})
        raise PretrainedError(
            f"weights of {name!r} record constructor argument(s) that {name!r} does not take: "
            f"{shown}"
        )
    return model_entrypoint(name)(**{**recorded, **(overrides or {})})


def create_model(name: str, pretrained: bool | str | os.PathLike = False, **overrides) -> nn.Module:
    """Build a registered model, optionally with weights.

    Args:
        name: an architecture from ``list_models()``, or ``"architecture.tag"`` from
            ``list_models(pretrained=True)`` (timm's convention).
        pretrained: ``False`` for random weights; ``True`` for the tag's (or the architecture's
            default tag's) weights; or a location: ``"hf-hub:org/repo[@rev]"``,
            ``"local-dir:/path"``, a ``save_pretrained`` folder, a ``.safetensors`` file, a
            Lightning ``.ckpt``, or a release file of the authors (``.pth``/``.pt``/``.tar``/a
            release's safetensors), read by the family's ``checkpoint_filter_fn``.
        **overrides: constructor keyword arguments replacing the entry point's defaults (and,
            with ``pretrained``, the arguments recorded with the weights).

    Returns:
        The model (an ``nn.Module``), in eval mode when weights were loaded. Its
        ``pretrained_cfg`` attribute is the tag's :class:`~models.PretrainedCfg` (or ``None``).

    Raises:
        ValueError: unknown architecture.
        PretrainedError: weights that cannot be found, read or loaded (one line naming them).
    """
    architecture, tag = split_model_name(name)
    model_entrypoint(architecture)  # unknown names fail here, listing the valid ones
    overrides = {key: to_plain(value) for key, value in overrides.items()}
    if pretrained is False or pretrained is None:
        cfg = get_pretrained_cfg(name) if tag is not None else None
        if tag is not None and cfg is None:
            raise PretrainedError(name, f"no pretrained weights tagged {tag!r}")
        recorded = dict(cfg.arch_kwargs) if cfg is not None else {}
        model = model_entrypoint(architecture)(**{**recorded, **overrides})
        source_cfg = cfg
    else:
        source = resolve_source(name, pretrained)
        model = build_from_recorded(architecture, source_arguments(source, architecture), overrides)
        load_source(model, architecture, source)
        source_cfg = source.pretrained_cfg
    model.registry_name = architecture  # checkpoints and exports record which entry built it
    model.pretrained_cfg = source_cfg
    return model


def load_model(location: str | os.PathLike, **overrides: Any) -> nn.Module:
    """Build the registry model that some weights describe and load them (strict).

    The weights say what they are: a Lightning ``.ckpt`` records ``model_name`` and
    ``model_config`` in its hyper-parameters, a ``save_pretrained`` folder (or ``hf-hub:`` repo)
    its ``config.json``. The location is read once.

    Args:
        location: a ``.ckpt`` file, a ``save_pretrained`` folder or ``.safetensors`` file beside
            its ``config.json``, ``local-dir:/path`` or ``hf-hub:org/repo[@rev]``.
        **overrides: constructor arguments to change (e.g. ``iterations=4``).

    Raises:
        PretrainedError: the weights do not say which model they belong to, or do not load.
    """
    source = resolve_source("unknown", os.fspath(location))
    if not source.owner:
        raise PretrainedError(
            source.path, "the weights do not record which registry model they are"
        )
    overrides = {key: to_plain(value) for key, value in overrides.items()}
    model = build_from_recorded(source.owner, source.arguments, overrides)
    load_source(model, source.owner, source)
    model.registry_name = source.owner
    model.pretrained_cfg = source.pretrained_cfg
    return model.eval()
