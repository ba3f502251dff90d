"""Building a model from what some weights record and loading them into it, strictly (timm's
``_builder``).

Above the hub (which resolves a location into a :class:`~models.weights.hub.WeightsSource`) and
below the families (whose ``checkpoint_filter_fn`` finish with :func:`check_mapped_state`) and
the factory (``create_model``, ``load_model``). A release file goes through its family's
``checkpoint_filter_fn`` (found in the module of the architecture's entry point, which is
imported by then: this module imports no family); this project's files load key by key. Any
missing, unexpected or mis-shaped key is an error listing them, and a ``config.json`` describing
another family or model is refused by name.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from models.core.base import (
    INIT_ONLY_ARGS,
    SplatModel,
    constructor_arguments,
    describe_unknown_arguments,
    renamed,
)
from models.weights.hub import (
    CONFIG_NAME,
    METADATA_KEY,
    PretrainedError,
    WeightsSource,
    read_official_file,
    resolve_source,
)
from models.weights.registry import model_class, model_entrypoint, split_model_name

__all__ = [
    "build_from_recorded",
    "build_model",
    "check_mapped_state",
    "filter_fn",
    "is_release_format",
    "load_pretrained",
    "load_source",
    "load_state_dict_strict",
    "source_arguments",
    "sub_state_dict",
]


# --------------------------------------------------------------------------- building


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


def source_arguments(source: WeightsSource, architecture: str) -> dict[str, Any]:
    """The constructor arguments a resolved source asks of ``architecture``."""
    arguments = dict(source.pretrained_cfg.arch_kwargs) if source.pretrained_cfg else {}
    if source.owner == architecture:
        arguments.update(source.arguments)
    return arguments


def build_model(
    name: str, source: WeightsSource, overrides: dict[str, Any] | None = None
) -> nn.Module:
    """Build ``name`` (``arch`` or ``arch.tag``) with the arguments ``source`` records and load
    it, strictly: what ``create_model(name, pretrained=...)`` does once the location is resolved.

    Returns:
        The model in eval mode, with ``registry_name`` (the architecture) and ``pretrained_cfg``
        (the tag the weights load under, or ``None``) set.
    """
    architecture = split_model_name(name)[0]
    model = build_from_recorded(architecture, source_arguments(source, architecture), overrides)
    load_source(model, architecture, source)
    model.registry_name = architecture  # checkpoints and exports record which entry built it
    model.pretrained_cfg = source.pretrained_cfg
    return model


# --------------------------------------------------------------------------- loading


def load_pretrained(model: nn.Module, name: str, pretrained: bool | str) -> nn.Module:
    """Load weights into a freshly built registry model (see :func:`load_source`)."""
    return load_source(model, name, resolve_source(name, pretrained))


def load_source(model: nn.Module, name: str, source: WeightsSource) -> nn.Module:
    """Load a resolved source into ``model`` (built by ``name``'s entry point), strictly.

    A file in a release's format that is not that release (another file name, not from the Hub)
    loads with a warning saying so: a fine-tune saved the authors' way, unchecked.

    Returns:
        ``model`` with the weights loaded, in eval mode.

    Raises:
        PretrainedError: one line naming the path and the problem.
    """
    name = split_model_name(name)[0]
    if is_release_format(model, name, source):
        _note_provenance(source)
        if source.format == "official":
            if filter_fn(name) is None:
                raise PretrainedError(
                    source.path,
                    f"model {name!r} reads no release files (only this project's weights)",
                )
            checkpoint = read_official_file(source.path)
        else:
            checkpoint = source.state_dict()
            if source.format == "folder" and source.config is not None:
                checkpoint = {"state_dict": checkpoint, "config": source.config}
        return _load_filtered(model, name, source.weights_file, checkpoint)
    differences: list[str] = []
    if source.format == "lightning":
        state = source.state_dict()
        if source.owner is not None and source.owner != name:
            raise PretrainedError(
                source.path, f"checkpoint holds model {source.owner!r}, but {name!r} was asked for"
            )
    else:
        if source.config is not None:
            differences = _check_config(model, name, source.config, source.path)
        state = source.state_dict()
    path = source.weights_file
    try:
        load_state_dict_strict(model, state, path, name)
    except PretrainedError as error:
        if not differences:
            raise
        hint = f" (its config.json differs: {'; '.join(differences)})"
        raise PretrainedError(error.path, error.message + hint) from error
    if differences:
        warnings.warn(
            f"{path.parent / CONFIG_NAME}: constructor arguments differ from model {name!r}: "
            + "; ".join(differences),
            stacklevel=4,  # create_model's caller
        )
    return model.eval()


def _note_provenance(source: WeightsSource) -> None:
    """Warn when a file in a release's format is loaded under a tag it is not the release of."""
    cfg = source.pretrained_cfg
    if cfg is None or cfg.hf_hub_filename is None or source.claimed == cfg:
        return
    if source.claimed is not None:
        what = f"the release file of {source.claimed.name}"
    else:
        what = f"not the release file {cfg.hf_hub_filename}"
    warnings.warn(
        f"{source.weights_file}: {what}; loaded under {cfg.name}'s architecture and input "
        "recipe, without the release's sha256 check",
        stacklevel=5,  # create_model's caller
    )


def filter_fn(name: str):
    """The family's ``checkpoint_filter_fn`` (official keys → ours) of architecture ``name``, or
    ``None`` when the family reads no release files."""
    module = sys.modules[model_entrypoint(name).__module__]
    return getattr(module, "checkpoint_filter_fn", None)


def is_release_format(model: nn.Module, name: str, source: WeightsSource) -> bool:
    """Whether ``source`` is read by the family's ``checkpoint_filter_fn``: a file in a release
    container (``.pth``, ...), or a safetensors file or folder without this project's metadata
    whose keys are not the model's (the authors' Hub format)."""
    if source.format == "official":
        return True
    if source.format not in ("folder", "safetensors") or filter_fn(name) is None:
        return False
    if source.config is not None and METADATA_KEY in source.config:
        return False
    return set(source.state_dict()) != set(model.state_dict())


def _load_filtered(model: nn.Module, name: str, path: Path, checkpoint: Any) -> nn.Module:
    try:
        state = filter_fn(name)(checkpoint, model)
    except (ValueError, KeyError, TypeError) as error:
        detail = " ".join(str(error).split()) or type(error).__name__
        raise PretrainedError(path, f"not a release file of {name!r}: {detail}") from error
    load_state_dict_strict(model, state, path, name)
    return model.eval()


# --------------------------------------------------------------------------- checking


def _constructor_args(cls: type) -> set[str]:
    return constructor_arguments(cls)[0]


def _family_classes() -> list[type]:
    """Every family class imported so far (subclasses of ``SplatModel``)."""
    classes, stack = [], list(SplatModel.__subclasses__())
    while stack:
        cls = stack.pop()
        classes.append(cls)
        stack.extend(cls.__subclasses__())
    return classes


def _describe(model: nn.Module, name: str) -> str:
    family = getattr(model, "family", type(model).__name__)
    return f"{name!r} (family {family!r}, class {type(model).__name__})"


def _check_config(model: nn.Module, name: str, config: dict[str, Any], path: Path) -> list[str]:
    """Refuse a config.json describing another family or model.

    Returns:
        The constructor arguments whose values differ between the folder and ``model``
        (``"key=folder value (weights) vs model value (model)"``).
    """
    config_path = path / CONFIG_NAME
    meta = config.get(METADATA_KEY)
    family = getattr(model, "family", None)
    if isinstance(meta, dict):
        their_family, their_name = meta.get("family"), meta.get("model_name")
        if their_family is not None and family is not None and their_family != family:
            raise PretrainedError(
                config_path,
                f"weights of model {their_name!r} (family {their_family!r}) cannot load into "
                f"model {_describe(model, name)}",
            )
        if their_name is not None and their_name != name:
            raise PretrainedError(
                config_path,
                f"weights of model {their_name!r} cannot load into model {name!r}; "
                f"use create_model({their_name!r}, pretrained=...)",
            )
    args = {k: v for k, v in config.items() if k != METADATA_KEY}
    accepted = _constructor_args(type(model))
    foreign = sorted(set(args) - accepted)
    if foreign:
        matches = [
            cls
            for cls in _family_classes()
            if cls is not type(model) and set(args) <= _constructor_args(cls)
        ]
        if matches:
            owner = matches[0]
            guess = f" (they look like weights of family {getattr(owner, 'family', '?')!r}, class {owner.__name__})"
        else:
            guess = ""
        raise PretrainedError(
            config_path,
            f"arguments {', '.join(renamed(k) for k in foreign)} are not constructor arguments "
            "of model "
            f"{_describe(model, name)}{guess}",
        )
    # Through JSON, like the folder's values (tuples become lists).
    ours = json.loads(json.dumps(getattr(model, "_hub_mixin_config", None) or {}, default=str))
    differences = [
        f"{key}={args[key]!r} (weights) vs {ours[key]!r} (model)"
        for key in sorted(args)
        if key in ours and key not in INIT_ONLY_ARGS and args[key] != ours[key]
    ]
    return differences


def _shared_groups(model: nn.Module) -> list[set[str]]:
    """Groups of state-dict keys that share storage (tied weights; safetensors saves one)."""
    by_storage: dict[tuple, set[str]] = {}
    for key, tensor in model.state_dict(keep_vars=False).items():
        if tensor.device.type == "meta" or tensor.numel() == 0:
            continue
        identity = (tensor.data_ptr(), tensor.numel() * tensor.element_size(), tuple(tensor.shape))
        by_storage.setdefault(identity, set()).add(key)
    return [keys for keys in by_storage.values() if len(keys) > 1]


def _listing(keys: list[str], limit: int = 8) -> str:
    shown = ", ".join(keys[:limit])
    return shown + (f", ... ({len(keys) - limit} more)" if len(keys) > limit else "")


def load_state_dict_strict(
    model: nn.Module, state: dict[str, Tensor], path: str | os.PathLike, name: str = ""
) -> nn.Module:
    """Load ``state`` into ``model``, requiring exactly the model's keys and shapes.

    Raises:
        PretrainedError: listing missing, unexpected and mis-shaped keys.
    """
    expected = model.state_dict()
    missing = [k for k in expected if k not in state]
    # A tied weight saved under one of its names covers the others.
    for group in _shared_groups(model):
        if group & set(state):
            missing = [k for k in missing if k not in group]
    unexpected = [k for k in state if k not in expected]
    mismatched = [
        f"{k} {tuple(state[k].shape)} vs {tuple(expected[k].shape)}"
        for k in state
        if k in expected and tuple(state[k].shape) != tuple(expected[k].shape)
    ]
    if missing or unexpected or mismatched:
        problems = []
        if missing:
            problems.append(f"{len(missing)} missing key(s): {_listing(missing)}")
        if unexpected:
            problems.append(f"{len(unexpected)} unexpected key(s): {_listing(unexpected)}")
        if mismatched:
            problems.append(
                f"{len(mismatched)} shape mismatch(es) (file vs model): {_listing(mismatched)}"
            )
        target = f"model {name!r}" if name else f"model {type(model).__name__}"
        raise PretrainedError(path, f"weights do not match {target}: " + "; ".join(problems))
    model.load_state_dict(state, strict=False)  # keys checked above; tied copies are covered
    return model


# --------------------------------------------------------------------------- for checkpoint_filter_fn


def encoder_state_dict(checkpoint: object, release: str) -> dict[str, Tensor]:
    """The encoder's weights of a pixelSplat-lineage release file (DepthSplat, ReSplat), keys
    without the ``encoder.`` prefix.

    Accepts ``{'state_dict': {'encoder.…': …}}`` (a Lightning checkpoint's state dict), the inner
    dict, or the encoder's own state dict without the prefix.

    Raises:
        ValueError: one line (not a dict of tensors, or keys outside ``encoder.``), naming
            ``release``.
    """
    if not isinstance(checkpoint, dict):
        raise ValueError(f"expected a dict checkpoint, got {type(checkpoint).__name__}")
    state = checkpoint.get("state_dict", checkpoint)
    if not isinstance(state, dict) or not state:
        raise ValueError("no state dict in the checkpoint (expected {'state_dict': {...}})")
    if not all(isinstance(v, Tensor) for v in state.values()):
        raise ValueError(f"the state dict holds non-tensor values: not a {release} checkpoint")
    prefix = "encoder."
    prefixed = [k for k in state if k.startswith(prefix)]
    if prefixed and len(prefixed) != len(state):
        others = sorted(k for k in state if not k.startswith(prefix))
        raise ValueError(
            f"{len(others)} key(s) outside 'encoder.' (e.g. {others[0]!r}): "
            f"not a {release} release file"
        )
    return {k[len(prefix) :] if k.startswith(prefix) else k: v for k, v in state.items()}


def check_mapped_state(
    mapped: dict[str, Tensor],
    unknown: list[str],
    target: dict[str, Tensor],
    release: str,
    pick: str,
) -> dict[str, Tensor]:
    """The last step of a port's ``checkpoint_filter_fn``: official keys mapped to ours
    (``mapped``), official keys with no place here (``unknown``), the model's state (``target``).
    Returns the mapped weights in the model's dtypes.

    Raises:
        ValueError: one line, for keys this architecture lacks, shape mismatches or weights the
            file lacks (``release`` names the release, ``pick`` what to choose instead).
    """
    if unknown:
        raise ValueError(
            f"{len(unknown)} key(s) this architecture does not have (e.g. {unknown[0]!r}): "
            f"a file of another {release} size or layout?"
        )
    wrong = [
        f"{k} {tuple(v.shape)} vs {tuple(target[k].shape)}"
        for k, v in mapped.items()
        if tuple(v.shape) != tuple(target[k].shape)
    ]
    if wrong:
        raise ValueError(
            f"{len(wrong)} shape mismatch(es), file vs model, e.g. {wrong[0]}: weights of "
            f"another {release} size or resolution (pick the matching {pick})"
        )
    missing = sorted(set(target) - set(mapped))
    if missing:
        raise ValueError(
            f"{len(missing)} weight(s) missing from the file (e.g. {missing[0]!r}): "
            f"a truncated file, or one of another {release} layout?"
        )
    return {k: v.to(target[k].dtype) for k, v in mapped.items()}


def sub_state_dict(state: dict[str, Tensor], prefix: str) -> dict[str, Tensor]:
    """The entries of ``state`` under ``prefix`` (e.g. ``"backbone."``), with it removed."""
    return {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
