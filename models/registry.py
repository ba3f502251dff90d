"""Model registry in the style of timm's ``_registry``: ``@register_model`` entry points,
``list_models``, and the pretrained configs (``architecture.tag``) families declare. Architecture
lives in one file per family (``models/families/``, imported by ``models/__init__`` after this
module, as timm's ``models/__init__`` imports its model files: the registry imports no family);
reading weights in ``models/weights/``; ``create_model`` in ``models/factory.py`` (above both).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch import nn

from models.weights.pretrained_cfg import PretrainedCfg, list_pretrained, split_model_name
from models.weights.pretrained_cfg import get_pretrained_cfg as _get_pretrained_cfg

__all__ = [
    "get_pretrained_cfg",
    "register_model",
    "list_models",
    "model_entrypoint",
    "is_model",
    "to_plain",
    "pose_free_models",
]

_REPO_ROOT = Path(__file__).resolve().parents[1]  # shipped weights' local_dir is relative to it
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


def list_models(
    pattern: str | None = None, family: str | None = None, pretrained: bool = False
) -> list[str]:
    """Sorted names of the registered models, optionally filtered by a glob ``pattern`` or by
    ``family`` (the family module's name, e.g. ``"zipsplat"``).

    With ``pretrained=True``, the ``architecture.tag`` names of every registered set of weights
    (timm's convention) instead of the architectures.
    """
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
    return _get_pretrained_cfg(name)


def is_model(name: str) -> bool:
    """Whether ``name`` (an architecture, or ``architecture.tag`` of registered weights) exists."""
    architecture, tag = split_model_name(name)
    if tag is not None:
        return _get_pretrained_cfg(name) is not None and architecture in _model_entrypoints
    return name in _model_entrypoints


def model_entrypoint(name: str) -> Callable[..., nn.Module]:
    if name not in _model_entrypoints:
        valid = ", ".join(sorted(_model_entrypoints))
        raise ValueError(f"unknown model {name!r}; valid names: {valid}")
    return _model_entrypoints[name]


def to_plain(value: Any, resolve: bool = True) -> Any:
    """OmegaConf containers (what Hydra passes), also nested in dicts, lists and tuples, as
    plain dicts and lists, so that configs stay JSON and checkpoints load with
    ``weights_only=True``. The project's one converter (no OmegaConf import unless one is there).

    Args:
        value: anything; non-container values come back unchanged.
        resolve: resolve ``${...}`` interpolations (``False`` for stored hyper-parameters, whose
            interpolations may point at a config that is gone).
    """
    if type(value).__module__.startswith("omegaconf"):
        from omegaconf import Container, OmegaConf

        if isinstance(value, Container):
            return OmegaConf.to_container(value, resolve=resolve)
        return value
    if isinstance(value, dict):
        return {k: to_plain(v, resolve) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(to_plain(v, resolve) for v in value)
    return value


def pose_free_models() -> list[str]:
    """Pose-free models that load by name (no weights given): weights shipped in this checkout
    first, then released weights (downloaded on first use). Read from the pretrained configs:
    nothing is built."""
    shipped, released = [], []
    for tag in list_models(pretrained=True):
        cfg = get_pretrained_cfg(tag)
        if not cfg.pose_free:
            continue
        name = cfg.architecture if get_pretrained_cfg(cfg.architecture) == cfg else cfg.name
        if cfg.local_dir is not None:
            if (_REPO_ROOT / cfg.local_dir).is_dir():
                shipped.append(name)
        else:
            released.append(f"{name} (downloads its weights)")
    return shipped + released
