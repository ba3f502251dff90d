"""Where pretrained weights live and how they load: registry defaults, ``hf-hub:`` repositories,
``local-dir:`` folders (the ``save_pretrained`` layout) and Lightning checkpoints.

Kept apart from the architecture: ``models/registry.py::create_model(name, pretrained=...)`` builds
the network from its entry point and calls :func:`load_pretrained` here. Weights are read from
safetensors (Lightning checkpoints with ``torch.load(weights_only=True)``); nothing is unpickled as
arbitrary code. Loading is strict: any missing, unexpected or mis-shaped key is an error that lists
them, and a folder whose ``config.json`` describes another family or model is refused by name.

Locations (the ``pretrained`` argument):

- ``True``: the registry default, :data:`DEFAULT_WEIGHTS` (weights shipped in ``checkpoints/<name>/``
  plus published Hub repositories in :data:`HUB_WEIGHTS`).
- ``"hf-hub:org/repo"`` or ``"hf-hub:org/repo@revision"``: downloaded with
  ``huggingface_hub.snapshot_download`` into ``checkpoints/hub/`` (or the Hugging Face cache when
  ``HF_HUB_CACHE``/``HF_HOME`` is set); ``HF_HUB_OFFLINE=1`` uses the cache only.
- ``"local-dir:/path"`` (or a plain folder path): a ``save_pretrained`` folder.
- a path to a ``.safetensors`` file, or to a Lightning ``.ckpt`` file.
"""

from __future__ import annotations

import inspect
import json
import os
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from .base import INIT_ONLY_ARGS

__all__ = [
    "CHECKPOINTS_DIR",
    "CONFIG_NAME",
    "DEFAULT_WEIGHTS",
    "HUB_WEIGHTS",
    "METADATA_KEY",
    "WEIGHTS_NAME",
    "PretrainedError",
    "available_pretrained",
    "default_weights",
    "discover_local_weights",
    "hub_cache_dir",
    "load_checkpoint_state_dict",
    "load_model",
    "load_pretrained",
    "load_state_dict_strict",
    "parse_location",
    "read_config",
    "read_safetensors",
    "read_weights",
    "sub_state_dict",
    "recorded_arguments",
    "resolve_weights",
    "save_pretrained",
]

REPO_ROOT = Path(__file__).resolve().parents[1]
CHECKPOINTS_DIR = REPO_ROOT / "checkpoints"
CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
# config.json key holding what the weights are (family, registry name, class); written by
# ``save_pretrained`` below and by ``models.export``. Constructor arguments sit beside it.
METADATA_KEY = "splatzoo"
# Constructor arguments that only fetch initial weights (see models.base.INIT_ONLY_ARGS).
_INIT_ONLY_ARGS = INIT_ONLY_ARGS

# Published Hub repositories: registry name -> "hf-hub:org/repo[@revision]". Only weights that exist.
HUB_WEIGHTS: dict[str, str] = {}


class PretrainedError(ValueError):
    """Weights cannot be found, read, or loaded into the requested model.

    Attributes:
        path: the file, folder or location the error is about.
    """

    def __init__(self, path: str | os.PathLike, message: str) -> None:
        self.path = os.fspath(path)
        self.message = message
        super().__init__(f"{self.path}: {message}")


# --------------------------------------------------------------------------- default table


def discover_local_weights(root: str | os.PathLike = CHECKPOINTS_DIR) -> dict[str, str]:
    """Weights shipped under ``root``: every ``root/<name>/`` holding ``model.safetensors`` and
    ``config.json`` whose ``<name>`` is a registered model.

    Returns:
        ``{name: "local-dir:<root>/<name>"}``, sorted by name.
    """
    from .registry import is_model

    root = Path(root)
    if not root.is_dir():
        return {}
    found = {}
    for folder in sorted(root.iterdir()):
        if (
            folder.is_dir()
            and (folder / WEIGHTS_NAME).is_file()
            and (folder / CONFIG_NAME).is_file()
            and is_model(folder.name)
        ):
            found[folder.name] = f"local-dir:{folder}"
    return found


def _default_table() -> dict[str, str]:
    return {**discover_local_weights(CHECKPOINTS_DIR), **HUB_WEIGHTS}


# The registry defaults: shipped local weights first, published Hub repositories over them.
# Recomputed on every lookup (see ``default_weights``) so weights shipped after import are found.
DEFAULT_WEIGHTS: dict[str, str] = _default_table()


def available_pretrained() -> list[str]:
    """Registry names that have default weights (``create_model(name, pretrained=True)`` works)."""
    return sorted(_default_table())


def default_weights(name: str) -> str:
    """The default weights location of registry model ``name``.

    Raises:
        PretrainedError: when ``name`` has no default weights; the message lists those that do.
    """
    table = _default_table()
    if name not in table:
        available = ", ".join(sorted(table)) or "none yet"
        raise PretrainedError(
            CHECKPOINTS_DIR / name,
            f"no default weights for model {name!r} (available: {available}); pass "
            "pretrained='hf-hub:org/repo' or 'local-dir:/path', or train and export one "
            "(python -m models.export ckpt=... out=checkpoints/<name>)",
        )
    return table[name]


# --------------------------------------------------------------------------- locations


def parse_location(location: str) -> tuple[str, str, str | None]:
    """Split a weights location into ``(kind, target, revision)``.

    ``kind`` is ``"hf-hub"`` (target ``org/repo``), ``"local-dir"`` (a folder), or ``"file"`` (a
    ``.safetensors`` or Lightning ``.ckpt`` file); ``revision`` is set only for ``hf-hub``.
    A bare path is a folder or a file depending on what it names.
    """
    if location.startswith("hf-hub:"):
        target = location[len("hf-hub:") :]
        revision = None
        if "@" in target:
            target, revision = target.split("@", 1)
            if not revision:
                raise PretrainedError(location, "empty revision after '@'")
        parts = target.split("/")
        if len(parts) != 2 or not all(parts):
            raise PretrainedError(location, "expected 'hf-hub:org/repo' or 'hf-hub:org/repo@rev'")
        return "hf-hub", target, revision
    if location.startswith("local-dir:"):
        return "local-dir", os.path.expanduser(location[len("local-dir:") :]), None
    path = os.path.expanduser(location)
    if os.path.isfile(path):
        return "file", path, None
    return "local-dir", path, None


def hub_cache_dir() -> Path | None:
    """Where ``hf-hub:`` snapshots are cached: ``HF_HUB_CACHE`` when set, the Hugging Face default
    cache when ``HF_HOME`` is set (``None``), else ``checkpoints/hub`` in the repository."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HF_HOME"):
        return None
    return CHECKPOINTS_DIR / "hub"


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _download(repo_id: str, revision: str | None, location: str) -> Path:
    """``snapshot_download`` of a weights repository; every failure becomes a ``PretrainedError``."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        HfHubHTTPError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        folder = snapshot_download(
            repo_id,
            revision=revision,
            cache_dir=hub_cache_dir(),
            local_files_only=_offline(),
            allow_patterns=[CONFIG_NAME, WEIGHTS_NAME, "README.md"],
            library_name="splatzoo",
        )
    except RevisionNotFoundError as error:
        raise PretrainedError(location, f"revision {revision!r} not found on the Hub") from error
    except RepositoryNotFoundError as error:
        raise PretrainedError(location, "repository not found on the Hub (or private)") from error
    except (LocalEntryNotFoundError, OfflineModeIsEnabled) as error:
        reason = "HF_HUB_OFFLINE is set" if _offline() else "the Hub cannot be reached"
        raise PretrainedError(
            location, f"not in the local cache ({hub_cache_dir() or 'HF cache'}) and {reason}"
        ) from error
    except (HfHubHTTPError, OSError) as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise PretrainedError(
            location, f"download failed: {type(error).__name__}: {first_line}"
        ) from error
    return Path(folder)


def resolve_weights(name: str, pretrained: bool | str) -> tuple[str, Path]:
    """Resolve a ``pretrained`` argument to ``(location string, local path)``.

    The path is a ``save_pretrained`` folder, or a ``.safetensors``/``.ckpt`` file.

    Raises:
        PretrainedError: unknown default, malformed location, missing folder, failed download.
    """
    if pretrained is True:
        location = default_weights(name)
    elif isinstance(pretrained, (str, os.PathLike)) and os.fspath(pretrained):
        location = os.fspath(pretrained)
    else:
        raise PretrainedError(
            str(pretrained),
            "pretrained must be True, 'hf-hub:org/repo', 'local-dir:/path' or a path",
        )
    kind, target, revision = parse_location(location)
    if kind == "hf-hub":
        return location, _download(target, revision, location)
    path = Path(target)
    if kind == "file":
        return location, path
    if not path.exists():
        raise PretrainedError(path, "weights folder does not exist")
    if not path.is_dir():
        raise PretrainedError(path, "not a folder (expected a save_pretrained folder)")
    if not (path / WEIGHTS_NAME).is_file():
        present = ", ".join(sorted(p.name for p in path.iterdir())) or "empty"
        raise PretrainedError(path, f"no {WEIGHTS_NAME} in this folder (found: {present})")
    return location, path


# --------------------------------------------------------------------------- reading


def read_safetensors(path: str | os.PathLike) -> dict[str, Tensor]:
    """Read a safetensors file into CPU tensors.

    Raises:
        PretrainedError: the file is missing, truncated or not safetensors.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    if not path.is_file():
        raise PretrainedError(path, "weights file does not exist")
    try:
        return load_file(os.fspath(path), device="cpu")
    except (SafetensorError, OSError, ValueError, RuntimeError) as error:
        detail = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise PretrainedError(path, f"corrupt or unreadable safetensors file ({detail})") from error


def read_config(folder: str | os.PathLike) -> dict[str, Any] | None:
    """The ``config.json`` of a ``save_pretrained`` folder, or ``None`` when there is none.

    Raises:
        PretrainedError: the file is not a JSON object.
    """
    path = Path(folder) / CONFIG_NAME
    if not path.is_file():
        return None
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise PretrainedError(path, f"not valid JSON ({error})") from error
    if not isinstance(config, dict):
        raise PretrainedError(path, "must hold a JSON object of constructor arguments")
    return config


def load_checkpoint_state_dict(path: str | os.PathLike) -> tuple[dict[str, Tensor], dict]:
    """The network weights of a Lightning checkpoint, loaded with ``weights_only=True``.

    The LightningModule stores the network under ``net``; its keys ``net.<key>`` become ``<key>``
    (a ``torch.compile`` wrapper's ``_orig_mod.`` is dropped too).

    Returns:
        ``(state_dict, checkpoint)``: the network's weights and the whole checkpoint dict.

    Raises:
        PretrainedError: unreadable file, objects ``weights_only`` refuses, no ``net.`` weights.
    """
    path = Path(path)
    if not path.is_file():
        raise PretrainedError(path, "checkpoint file does not exist")
    try:
        with torch.serialization.safe_globals(_checkpoint_safe_globals()):
            checkpoint = torch.load(os.fspath(path), map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises UnpicklingError, RuntimeError, EOFError, ...
        detail = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise PretrainedError(
            path, f"cannot load checkpoint with weights_only=True ({detail})"
        ) from error
    if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get("state_dict"), dict):
        raise PretrainedError(path, "not a Lightning checkpoint (no 'state_dict' entry)")
    state = {}
    for key, value in checkpoint["state_dict"].items():
        if key.startswith("net."):
            key = key[len("net.") :]
            key = key[len("_orig_mod.") :] if key.startswith("_orig_mod.") else key
            state[key] = value
    if not state:
        raise PretrainedError(path, "checkpoint holds no network weights (no 'net.*' keys)")
    for key in ("hyper_parameters", "datamodule_hyper_parameters"):
        if key in checkpoint:
            checkpoint[key] = _plain(checkpoint[key])
    return state, checkpoint


def _checkpoint_safe_globals() -> list:
    """Data-only classes that Lightning checkpoints hold besides tensors: OmegaConf containers
    (hyper-parameters passed through Hydra) and the builtins they pickle with. Allowlisted for
    ``weights_only=True`` loading; no other class or function can be unpickled."""
    import collections
    import typing

    allowed: list = [list, dict, int, float, str, bool, tuple, collections.defaultdict]
    allowed.append(typing.Any)
    try:
        from omegaconf import base, dictconfig, listconfig, nodes
    except ImportError:  # pragma: no cover - omegaconf comes with Hydra
        return allowed
    allowed += [
        dictconfig.DictConfig,
        listconfig.ListConfig,
        base.ContainerMetadata,
        base.Metadata,
        nodes.AnyNode,
        nodes.StringNode,
        nodes.IntegerNode,
        nodes.FloatNode,
        nodes.BooleanNode,
    ]
    return allowed


def _plain(value: Any) -> Any:
    """OmegaConf containers (and nested ones) as plain dicts and lists."""
    try:
        from omegaconf import Container, OmegaConf
    except ImportError:  # pragma: no cover
        return value
    if isinstance(value, Container):
        return OmegaConf.to_container(value, resolve=False)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    return value


# --------------------------------------------------------------------------- checking


def _constructor_args(cls: type) -> set[str]:
    parameters = inspect.signature(cls.__init__).parameters.values()
    return {
        p.name
        for p in parameters
        if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    }


def _family_classes() -> list[type]:
    """Every registered family class (subclasses of ``SplatModel``, families imported)."""
    from .base import SplatModel
    from .registry import list_models

    list_models()  # imports the family modules
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
            f"arguments {', '.join(foreign)} are not constructor arguments of model "
            f"{_describe(model, name)}{guess}",
        )
    # Through JSON, like the folder's values (tuples become lists).
    ours = json.loads(json.dumps(getattr(model, "_hub_mixin_config", None) or {}, default=str))
    differences = [
        f"{key}={args[key]!r} (weights) vs {ours[key]!r} (model)"
        for key in sorted(args)
        if key in ours and key not in _INIT_ONLY_ARGS and args[key] != ours[key]
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


def read_weights(location: str | os.PathLike, name: str = "") -> tuple[dict[str, Tensor], Path]:
    """The network weights at ``location``, whatever holds them.

    Args:
        location: a Lightning ``.ckpt``, a ``.safetensors`` file, a ``save_pretrained`` folder, or
            a ``local-dir:``/``hf-hub:`` location of one.
        name: registry name the location belongs to (only for ``True``-style defaults/errors).

    Returns:
        ``(state_dict, path of the file read)``.

    Raises:
        PretrainedError: missing or unreadable weights.
    """
    _, path = resolve_weights(name, os.fspath(location))
    if path.is_dir():
        path = path / WEIGHTS_NAME
    if path.suffix == ".ckpt":
        return load_checkpoint_state_dict(path)[0], path
    return read_safetensors(path), path


def sub_state_dict(state: dict[str, Tensor], prefix: str) -> dict[str, Tensor]:
    """The entries of ``state`` under ``prefix`` (e.g. ``"backbone."``), with it removed."""
    return {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}


def _recorded_identity(path: Path) -> tuple[str | None, dict[str, Any]]:
    """``(registry name, constructor arguments)`` saved with resolved weights ``path``: a
    Lightning checkpoint's ``model_name``/``model_config`` or a folder's ``config.json``; arguments
    that only fetch initial weights are left out."""
    if path.is_file() and path.suffix == ".ckpt":
        _, checkpoint = load_checkpoint_state_dict(path)
        hparams = checkpoint.get("hyper_parameters") or {}
        owner = hparams.get("model_name")
        arguments = dict(hparams.get("model_config") or {})
    else:
        folder = path.parent if path.is_file() else path
        arguments = dict(read_config(folder) or {})
        owner = (arguments.pop(METADATA_KEY, None) or {}).get("model_name")
    return owner, {k: v for k, v in arguments.items() if k not in _INIT_ONLY_ARGS}


def recorded_arguments(name: str, pretrained: bool | str) -> dict[str, Any]:
    """The constructor arguments saved with some weights of model ``name`` (``{}`` if none).

    Only when the weights say they belong to ``name`` (otherwise :func:`load_pretrained` refuses
    them by name). Arguments that only fetch initial weights are left out.
    """
    owner, arguments = _recorded_identity(resolve_weights(name, pretrained)[1])
    return arguments if owner == name else {}


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


# --------------------------------------------------------------------------- entry points


def load_pretrained(model: nn.Module, name: str, pretrained: bool | str) -> nn.Module:
    """Load weights into a freshly built registry model (called by ``create_model``).

    Args:
        model: the model built by ``name``'s entry point.
        name: its registry name.
        pretrained: ``True`` (registry default), ``"hf-hub:org/repo[@rev]"``, ``"local-dir:/path"``,
            a folder, a ``.safetensors`` file or a Lightning ``.ckpt`` file.

    Returns:
        ``model`` with the weights loaded, in eval mode.

    Raises:
        PretrainedError: one line naming the path and the problem.
    """
    _, path = resolve_weights(name, pretrained)
    differences: list[str] = []
    if path.is_file() and path.suffix == ".ckpt":
        state, checkpoint = load_checkpoint_state_dict(path)
        trained = checkpoint.get("hyper_parameters", {}).get("model_name")
        if trained is not None and trained != name:
            raise PretrainedError(
                path, f"checkpoint holds model {trained!r}, but {name!r} was asked for"
            )
    else:
        folder = path.parent if path.is_file() else path
        path = path if path.is_file() else path / WEIGHTS_NAME
        config = read_config(folder) if path.name == WEIGHTS_NAME else None
        if config is not None:
            differences = _check_config(model, name, config, folder)
        state = read_safetensors(path)
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
            stacklevel=3,
        )
    return model.eval()


def model_config(model: nn.Module, name: str | None = None) -> dict[str, Any]:
    """``config.json`` content for ``model``: every constructor argument plus the metadata entry.

    Raises:
        ValueError: a constructor argument is missing (not JSON-serialisable, so the Hub mixin
            dropped it).
    """
    config = dict(getattr(model, "_hub_mixin_config", None) or {})
    missing = sorted(_constructor_args(type(model)) - set(config))
    if missing:
        raise ValueError(
            f"{type(model).__name__}: constructor arguments {', '.join(missing)} are not in its "
            "config (they must be plain JSON-serialisable keyword arguments)"
        )
    for key, value in _INIT_ONLY_ARGS.items():
        if key in config:
            config[key] = value
    config[METADATA_KEY] = {
        "family": getattr(model, "family", None),
        "model_name": name,
        "class": type(model).__name__,
    }
    return config


def save_pretrained(
    model: nn.Module,
    directory: str | os.PathLike,
    name: str | None = None,
    model_card: str | None = None,
) -> Path:
    """``model.save_pretrained(directory)`` with the metadata entry (family, registry name) in
    ``config.json`` so that loading can refuse weights of another model by name.

    Args:
        model: a ``SplatModel``.
        directory: the output folder (created).
        name: the registry name recorded in config.json (default: ``model.registry_name``, set
            by ``create_model``).
        model_card: README.md text; the Hub mixin's default card when ``None``.

    Returns:
        The folder.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    name = name or getattr(model, "registry_name", None)
    if model_card is not None:
        (directory / "README.md").write_text(model_card, encoding="utf-8")
    model.save_pretrained(directory, config=model_config(model, name))
    return directory


def load_model(location: str | os.PathLike, **overrides: Any) -> nn.Module:
    """Build the registry model that some weights describe and load them (strict).

    The weights say what they are: a Lightning ``.ckpt`` records ``model_name`` and
    ``model_config`` in its hyper-parameters, a ``save_pretrained`` folder (or ``hf-hub:`` repo)
    its ``config.json``. Arguments that only fetch initial weights (``pretrained_backbone``,
    ``init_checkpoint``) are dropped, since the loaded weights replace them.

    Args:
        location: a ``.ckpt`` file, a ``save_pretrained`` folder or ``.safetensors`` file beside
            its ``config.json``, ``local-dir:/path`` or ``hf-hub:org/repo[@rev]``.
        **overrides: constructor arguments to change (e.g. ``iterations=4``).

    Returns:
        The model with the weights loaded, in eval mode.

    Raises:
        PretrainedError: the weights do not say which model they belong to, or do not load.
    """
    from .registry import create_model

    location = os.fspath(location)
    _, path = resolve_weights("unknown", location)
    name, _ = _recorded_identity(path)
    if not name:
        raise PretrainedError(path, "the weights do not record which registry model they are")
    # create_model builds with the recorded arguments (overrides win) and loads strictly.
    return create_model(name, pretrained=location, **overrides).eval()
