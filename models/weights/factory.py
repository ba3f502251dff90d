"""Building models: ``create_model`` and ``load_model`` (timm's ``_factory``), the top of the
weights line: ``registry`` (entry points, pretrained configs) → ``weights.hub`` (where weights
are, downloads, the sha256 check, reading files) → ``weights.builder`` (build from the recorded
arguments, the family's ``checkpoint_filter_fn``, strict loading) → this module.

A weights location is resolved **once** into a :class:`~models.weights.hub.WeightsSource` (path,
format, config, recorded identity, provenance), which both builds the model (with the
constructor arguments recorded with the weights) and loads it.
"""

from __future__ import annotations

import os
from typing import Any

from torch import nn

from models.weights.builder import build_model
from models.weights.hub import PretrainedError, resolve_source
from models.weights.registry import get_pretrained_cfg, model_entrypoint, split_model_name, to_plain

__all__ = ["create_model", "load_model"]


def create_model(name: str, pretrained: bool | str | os.PathLike = False, **overrides) -> nn.Module:
    """Build a registered model, optionally with weights.

    Args:
        name: an architecture from ``list_models()``, or ``"architecture.tag"`` from
            ``list_models(pretrained=True)`` (timm's convention).
        pretrained: ``False`` for random weights; ``True`` for the tag's (or the architecture's
            default tag's) weights; or a location: ``"hf-hub:org/repo[@rev]"``,
            ``"local-dir:/path"``, a ``save_pretrained`` folder, a ``.safetensors`` file, a
            Lightning ``.ckpt``, or a file in a release's format (``.pth``/``.pt``/``.tar``/a
            release's safetensors), read by the family's ``checkpoint_filter_fn``. A file is
            sha256-checked only when it carries a release's file name (or came from the Hub); with
            a tag, any other file in the release's format loads under the tag's architecture and
            recipe (a fine-tune), with a warning that it is not the release.
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
    if pretrained is not False and pretrained is not None:
        return build_model(name, resolve_source(name, pretrained), overrides)
    cfg = get_pretrained_cfg(name) if tag is not None else None
    if tag is not None and cfg is None:
        raise PretrainedError(name, f"no pretrained weights tagged {tag!r}")
    recorded = dict(cfg.arch_kwargs) if cfg is not None else {}
    model = model_entrypoint(architecture)(**{**recorded, **overrides})
    model.registry_name = architecture  # checkpoints and exports record which entry built it
    model.pretrained_cfg = cfg
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
    return build_model(source.owner, source, overrides).eval()
