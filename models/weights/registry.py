"""Model registry in the style of timm's ``_registry``: ``@register_model`` entry points,
``list_models``, the families, and the pretrained configs (``architecture.tag``) families declare.

The bottom of the weights line: ``models.weights.pretrained_cfg`` (what is known about a set of
weights) → this module → ``models.weights.hub`` (locations, downloads, files) →
``models.weights.builder`` (build, ``checkpoint_filter_fn``, strict load) → ``models.weights.factory``
(``create_model``, ``load_model``). Architecture lives in one file per family
(``models/families/``, imported by ``models/__init__`` after this module, as timm's
``models/__init__`` imports its model files: the registry imports no family).

A *family* is a method: ``pixel_aligned`` (pixelSplat/MVSplat/DepthSplat/NoPoSplat),
``zipsplat``, ``resplat``, ``splatweaver``. Each family's own architectures and its port of the
authors' release register under the same family: the ``family`` of the class an entry point
returns (``SplatModel.family``).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch import nn

from models.weights.pretrained_cfg import PretrainedCfg

__all__ = [
    "get_pretrained_cfg",
    "register_model",
    "list_families",
    "list_models",
    "model_class",
    "model_entrypoint",
    "model_family",
    "is_model",
    "to_plain",
    "pose_free_models",
    "split_model_name",
    "register_pretrained_cfgs",
    "list_pretrained",
]

_REPO_ROOT = Path(__file__).resolve().parents[2]  # shipped weights' local_dir is relative to it
_model_entrypoints: dict[str, Callable[..., nn.Module]] = {}
_model_classes: dict[str, type[nn.Module]] = {}
_model_family: dict[str, str] = {}

_pretrained_cfgs: dict[str, PretrainedCfg] = {}  # "arch.tag" -> cfg
_default_tags: dict[str, str] = {}  # arch -> tag


def split_model_name(name: str) -> tuple[str, str | None]:
    """``"arch.tag"`` → ``("arch", "tag")``; ``"arch"`` → ``("arch", None)``."""
    architecture, _, tag = name.partition(".")
    return architecture, (tag or None)


def register_pretrained_cfgs(cfgs: dict[str, PretrainedCfg]) -> dict[str, PretrainedCfg]:
    """Register ``{"arch.tag": PretrainedCfg(...)}``; an architecture's first tag is its default.

    Returns:
        The registered configs (with ``architecture`` and ``tag`` filled in).
    """
    registered = {}
    for name, cfg in cfgs.items():
        architecture, tag = split_model_name(name)
        if tag is None:
            raise ValueError(f"pretrained config {name!r} must be named 'architecture.tag'")
        if name in _pretrained_cfgs:
            raise ValueError(f"pretrained config {name!r} is registered twice")
        cfg = dataclasses.replace(cfg, architecture=architecture, tag=tag)
        _pretrained_cfgs[name] = cfg
        _default_tags.setdefault(architecture, tag)
        registered[name] = cfg
    return registered


def list_pretrained(pattern: str | None = None) -> list[str]:
    """Sorted ``architecture.tag`` names of every registered pretrained config."""
    names = sorted(_pretrained_cfgs)
    return [n for n in names if pattern is None or fnmatch.fnmatch(n, pattern)]


def _returned_class(fn: Callable[..., nn.Module]) -> type[nn.Module]:
    """The class an entry point builds: its return annotation (``-> ZipSplat``)."""
    try:
        cls = typing.get_type_hints(fn).get("return")
    except Exception as error:  # an annotation that does not resolve
        raise ValueError(f"entry point {fn.__name__!r}: return annotation: {error}") from error
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise ValueError(
            f"entry point {fn.__name__!r} must annotate the model class it returns "
            f"(def {fn.__name__}(**kwargs) -> ModelClass)"
        )
    return cls


def register_model(fn: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
    """Register a model entry point ``fn(**kwargs) -> ModelClass`` under its function name, in
    the family its class declares (``ModelClass.family``)."""
    name = fn.__name__
    if name in _model_entrypoints:
        raise ValueError(f"model {name!r} is registered twice")
    cls = _returned_class(fn)
    family = getattr(cls, "family", None)
    if not isinstance(family, str) or family in ("", "base"):
        raise ValueError(f"{cls.__name__} (entry point {name!r}) declares no family")
    _model_entrypoints[name] = fn
    _model_classes[name] = cls
    _model_family[name] = family
    return fn


def list_models(
    pattern: str | None = None, family: str | None = None, pretrained: bool = False
) -> list[str]:
    """Sorted names of the registered models, optionally filtered by a glob ``pattern`` or by
    ``family`` (the method, e.g. ``"zipsplat"``: its own architectures and its release port).

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


def list_families() -> list[str]:
    """The families of the registered models, sorted (``pixel_aligned``, ``resplat``, ...)."""
    return sorted(set(_model_family.values()))


def model_family(name: str) -> str:
    """The family of architecture ``name`` (or of ``architecture.tag``)."""
    return _model_family[_architecture(name)]


def model_class(name: str) -> type[nn.Module]:
    """The class the entry point of ``name`` (``arch`` or ``arch.tag``) builds."""
    return _model_classes[_architecture(name)]


def _architecture(name: str) -> str:
    """The architecture of ``name``, which must be registered.

    Raises:
        ValueError: unknown architecture, listing the valid ones.
    """
    architecture = split_model_name(name)[0]
    model_entrypoint(architecture)
    return architecture


def get_pretrained_cfg(name: str) -> PretrainedCfg | None:
    """What is known about the weights ``"architecture.tag"`` (or the architecture's default
    tag): location, licence, source, training data, input size, views, pose-free, reported
    metrics. ``None`` when none are registered."""
    architecture, tag = split_model_name(name)
    tag = tag or _default_tags.get(architecture)
    return None if tag is None else _pretrained_cfgs.get(f"{architecture}.{tag}")


def is_model(name: str) -> bool:
    """Whether ``name`` (an architecture, or ``architecture.tag`` of registered weights) exists."""
    architecture, tag = split_model_name(name)
    if tag is not None:
        return get_pretrained_cfg(name) is not None and architecture in _model_entrypoints
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
