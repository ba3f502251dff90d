"""Model registry in the style of timm: ``@register_model`` entry points, ``create_model``,
``list_models``. Architecture lives in one file per family; pretrained weight locations live in
``models/pretrained.py``, apart from the architecture.
"""

from __future__ import annotations

import fnmatch
import re
import warnings
from collections.abc import Callable

from torch import nn

from .pretrained_cfg import PretrainedCfg, list_pretrained, split_model_name
from .pretrained_cfg import get_pretrained_cfg as _get_pretrained_cfg

__all__ = [
    "get_pretrained_cfg",
    "register_model",
    "create_model",
    "list_models",
    "model_entrypoint",
    "is_model",
    "to_plain",
]

_model_entrypoints: dict[str, Callable[..., nn.Module]] = {}
_model_family: dict[str, str] = {}


def register_model(fn: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
    """Register a model entry point ``fn(**kwargs) -> nn.Module`` under its function name."""
    name = fn.__name__
    if name in _model_entrypoints:
        raise ValueError(f"model {name!r} is registered twice")
    _model_entrypoints[name] = fn
    _model_family[name] = fn.__module__.split(".")[-1]
    return fn


def _ensure_families_imported() -> None:
    # Importing the family modules runs their @register_model decorators.
    from . import families  # noqa: F401


def list_models(
    pattern: str | None = None, family: str | None = None, pretrained: bool = False
) -> list[str]:
    """Sorted names of the registered models, optionally filtered by a glob ``pattern`` or by
    ``family`` (the family module's name, e.g. ``"zipsplat"``).

    With ``pretrained=True``, the ``architecture.tag`` names of every registered set of weights
    (timm's convention) instead of the architectures.
    """
    _ensure_families_imported()
    if pretrained:
        names = [n for n in list_pretrained() if split_model_name(n)[0] in _model_entrypoints]
    else:
        names = sorted(_model_entrypoints)
    if pattern is not None:
        names = [n for n in names if fnmatch.fnmatch(n, pattern)]
    if family is not None:
        names = [n for n in names if _model_family[split_model_name(n)[0]] == family]
    return names


def get_pretrained_cfg(name: str) -> PretrainedCfg | None:
    """What is known about the weights ``"architecture.tag"`` (or the architecture's default
    tag): location, licence, source, training data, input size, views, pose-free, reported
    metrics. ``None`` when none are registered."""
    _ensure_families_imported()
    return _get_pretrained_cfg(name)


def is_model(name: str) -> bool:
    """Whether ``name`` (an architecture, or ``architecture.tag`` of registered weights) exists."""
    _ensure_families_imported()
    architecture, tag = split_model_name(name)
    if tag is not None:
        return _get_pretrained_cfg(name) is not None and architecture in _model_entrypoints
    return name in _model_entrypoints


def model_entrypoint(name: str) -> Callable[..., nn.Module]:
    _ensure_families_imported()
    if name not in _model_entrypoints:
        valid = ", ".join(sorted(_model_entrypoints))
        raise ValueError(f"unknown model {name!r}; valid names: {valid}")
    return _model_entrypoints[name]


def to_plain(value):
    """OmegaConf containers (what Hydra passes) to plain lists/dicts, so configs stay JSON."""
    if type(value).__module__.startswith("omegaconf"):
        from omegaconf import OmegaConf

        return OmegaConf.to_container(value, resolve=True)
    return value


def _build_with_recorded(entrypoint, name: str, recorded: dict, overrides: dict):
    """Build with the arguments recorded with some weights (explicit overrides win).

    Recorded arguments this version's constructor no longer takes (an option removed since the
    weights were saved) are left out with a warning; if the option changed the architecture, the
    strict weight loading that follows says so. Returns ``None`` when the arguments do not suit
    this entry point at all.
    """
    arguments = {**recorded, **overrides}
    dropped = []
    while True:
        try:
            model = entrypoint(**arguments)
            break
        except TypeError as error:
            match = re.search(r"unexpected keyword argument '(\w+)'", str(error))
            key = match.group(1) if match else None
            if key is None or key not in recorded or key in overrides:
                return None
            dropped.append(f"{key}={arguments.pop(key)!r}")
    if dropped:
        warnings.warn(
            f"weights of {name!r} were saved with constructor argument(s) this version does not "
            f"have: {', '.join(dropped)}; left out",
            stacklevel=3,
        )
    return model


def create_model(name: str, pretrained: bool | str = False, **overrides) -> nn.Module:
    """Build a registered model.

    Args:
        name: a name from ``list_models()``.
        pretrained: ``False`` for random weights; ``True`` for the registry's default weights;
            or a weights location string: ``"hf-hub:org/repo"`` or ``"local-dir:/path"``
            (a ``save_pretrained`` folder).
        **overrides: constructor keyword arguments replacing the entry point's defaults (and,
            with ``pretrained``, the arguments recorded with the weights).

    Returns:
        The model (an ``nn.Module``), in eval mode when weights were loaded.

    With ``pretrained``, the constructor arguments saved with the weights (``config.json`` or a
    Lightning checkpoint's ``model_config``) build the model, as ``from_pretrained`` does, so
    weights trained with non-default arguments (e.g. SplatWeaver's ``posed=True``) load by name.
    """
    entrypoint = model_entrypoint(name)
    overrides = {key: to_plain(value) for key, value in overrides.items()}
    if pretrained:
        from .pretrained import recorded_arguments

        recorded = recorded_arguments(name, pretrained)
        model = _build_with_recorded(entrypoint, name, recorded, overrides) if recorded else None
        if model is None:  # not this entry point's arguments: load_pretrained explains
            model = entrypoint(**overrides)
    else:
        model = entrypoint(**overrides)
    model.registry_name = name  # checkpoints and exports record which entry built the model
    if not pretrained:
        return model
    from .pretrained import load_pretrained

    return load_pretrained(model, name, pretrained)
