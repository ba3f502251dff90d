"""Where pretrained weights live and how they load: registry defaults, ``hf-hub:`` repositories,
``local-dir:`` folders (the ``save_pretrained`` layout) and Lightning checkpoints.

Kept apart from the architecture: ``models/factory.py::create_model(name, pretrained=...)`` builds
the network from its entry point and calls :func:`load_pretrained` here. Weights are read from
safetensors (Lightning checkpoints with ``torch.load(weights_only=True)``); nothing is unpickled as
arbitrary code. Loading is strict: any missing, unexpected or mis-shaped key is an error that lists
them, and a folder whose ``config.json`` describes another family or model is refused by name.

Locations (the ``pretrained`` argument):

- ``True``: the registry default, :func:`default_weights` (weights shipped in
  ``checkpoints/<name>/`` plus published Hub repositories in :data:`HUB_WEIGHTS`).
- ``"hf-hub:org/repo"`` or ``"hf-hub:org/repo@revision"``: downloaded with
  ``huggingface_hub.snapshot_download`` into ``checkpoints/hub/`` (or the Hugging Face cache when
  ``HF_HUB_CACHE``/``HF_HOME`` is set); ``HF_HUB_OFFLINE=1`` uses the cache only.
- ``"local-dir:/path"`` (or a plain folder path): a ``save_pretrained`` folder.
- a path to a ``.safetensors`` file, or to a Lightning ``.ckpt`` file.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from models.base import INIT_ONLY_ARGS, constructor_arguments, renamed
from models.errors import PathError
from models.registry import get_pretrained_cfg, is_model, model_entrypoint, to_plain
from models.weights.pretrained_cfg import PretrainedCfg, list_pretrained, split_model_name

__all__ = [
    "CHECKPOINTS_DIR",
    "CONFIG_NAME",
    "HUB_WEIGHTS",
    "METADATA_KEY",
    "WEIGHTS_NAME",
    "PretrainedError",
    "default_weights",
    "discover_local_weights",
    "hub_cache_dir",
    "load_checkpoint_state_dict",
    "load_pretrained",
    "load_state_dict_strict",
    "parse_location",
    "read_config",
    "read_safetensors",
    "read_weights",
    "sub_state_dict",
    "check_mapped_state",
    "save_pretrained",
]

REPO_ROOT = Path(__file__).resolve().parents[2]
CHECKPOINTS_DIR = REPO_ROOT / "checkpoints"
CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
# config.json key holding what the weights are (family, registry name, class); written by
# ``save_pretrained`` below and by ``models.training.export``. Constructor arguments sit beside it.
METADATA_KEY = "splatzoo"
# Constructor arguments that only fetch initial weights (see models.base.INIT_ONLY_ARGS).
_INIT_ONLY_ARGS = INIT_ONLY_ARGS

# Published Hub repositories: registry name -> "hf-hub:org/repo[@revision]". Only weights that exist.
HUB_WEIGHTS: dict[str, str] = {}


class PretrainedError(PathError):
    """Weights cannot be found, read, or loaded into the requested model.

    Attributes:
        path: the file, folder or location the error is about.
    """


# --------------------------------------------------------------------------- default table


def discover_local_weights(root: str | os.PathLike = CHECKPOINTS_DIR) -> dict[str, str]:
    """Weights shipped under ``root``: every ``root/<name>/`` holding ``model.safetensors`` and
    ``config.json`` whose ``<name>`` is a registered model.

    Returns:
        ``{name: "local-dir:<root>/<name>"}``, sorted by name.
    """
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
            "(python -m models.training.export ckpt=... out=checkpoints/<name>)",
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


OFFICIAL_SUFFIXES = (".pth", ".pt", ".tar", ".bin")


def _location_of(name: str, pretrained: bool | str) -> tuple[str, PretrainedCfg | None]:
    """The location string a ``pretrained`` argument names, and the pretrained config behind it."""
    architecture, tag = split_model_name(name)
    cfg = get_pretrained_cfg(name) if (tag is not None or pretrained is True) else None
    if tag is not None and cfg is None:
        known = ", ".join(list_pretrained(f"{architecture}.*")) or "none"
        raise PretrainedError(name, f"no pretrained weights tagged {tag!r} (known: {known})")
    if pretrained is True:
        if cfg is None:
            return default_weights(architecture), None
        if cfg.local_dir is not None:
            local = Path(cfg.local_dir)
            local = local if local.is_absolute() else REPO_ROOT / local
            return f"local-dir:{local}", cfg
        if cfg.hf_hub_filename is not None:
            return f"hf-file:{cfg.hf_hub_id}/{cfg.hf_hub_filename}", cfg
        revision = f"@{cfg.hf_hub_revision}" if cfg.hf_hub_revision else ""
        return f"hf-hub:{cfg.hf_hub_id}{revision}", cfg
    if isinstance(pretrained, (str, os.PathLike)) and os.fspath(pretrained):
        return os.fspath(pretrained), cfg
    raise PretrainedError(
        str(pretrained), "pretrained must be True, 'hf-hub:org/repo', 'local-dir:/path' or a path"
    )


def _download_file(cfg: PretrainedCfg) -> Path:
    """``hf_hub_download`` of a pretrained config's single file; failures become one line."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
    )

    shown = f"hf-hub:{cfg.hf_hub_id}/{cfg.hf_hub_filename}"
    cache = hub_cache_dir()
    try:
        path = hf_hub_download(
            cfg.hf_hub_id,
            cfg.hf_hub_filename,
            revision=cfg.hf_hub_revision,
            cache_dir=cache,
            local_files_only=_offline(),
            library_name="splatzoo",
        )
    except (LocalEntryNotFoundError, OfflineModeIsEnabled) as error:
        reason = "HF_HUB_OFFLINE is set" if _offline() else "the Hub cannot be reached"
        raise PretrainedError(
            shown,
            f"not downloaded yet and {reason}: with network access run "
            f"`huggingface-cli download {cfg.hf_hub_id} {cfg.hf_hub_filename}"
            f"{' --cache-dir ' + str(cache) if cache else ''}`, or download the file yourself "
            f"and pass pretrained='/path/to/{cfg.hf_hub_filename}'",
        ) from error
    except (RepositoryNotFoundError, EntryNotFoundError) as error:
        raise PretrainedError(shown, "not found on the Hub (repository or file)") from error
    except (HfHubHTTPError, OSError) as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise PretrainedError(
            shown, f"download failed: {type(error).__name__}: {first_line}"
        ) from error
    return Path(path)


_SHA_IN_NAME = re.compile(r"-([0-9a-f]{8,64})\.[A-Za-z0-9]+$")


def check_sha256(path: Path, prefix: str | None = None) -> None:
    """Check a file's sha256 against ``prefix`` (or the ``-<hex>.`` suffix of its name, the
    release convention torch.hub checks too); nothing to check passes.

    Raises:
        PretrainedError: the digest does not start with the expected hex digits.
    """
    if prefix is None:
        match = _SHA_IN_NAME.search(path.name)
        prefix = match.group(1) if match else None
    if not prefix:
        return
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    if not digest.hexdigest().startswith(prefix.lower()):
        raise PretrainedError(
            path,
            f"sha256 {digest.hexdigest()[:12]}... does not start with {prefix} (an incomplete "
            "or altered download: download it again)",
        )


@dataclass
class WeightsSource:
    """A weights location resolved once: what it is, where it is, what it says about itself.

    Attributes:
        location: the location as given (or the registry default it stands for).
        path: the local file or ``save_pretrained`` folder.
        format: ``"folder"`` (ours: ``config.json`` + ``model.safetensors``), ``"safetensors"``
            (ours, a bare file), ``"lightning"`` (a training ``.ckpt``) or ``"official"`` (a
            release file read by the family's ``checkpoint_filter_fn``).
        pretrained_cfg: the registered config these weights are, if any.
        config: the folder's ``config.json`` (ours) or ``None``.
        owner: the registry name the weights record, if any.
        arguments: the constructor arguments they record (init-only arguments left out).
    """

    location: str
    path: Path
    format: str
    pretrained_cfg: PretrainedCfg | None = None
    config: dict[str, Any] | None = None
    owner: str | None = None
    arguments: dict[str, Any] = field(default_factory=dict)
    checkpoint: dict[str, Any] | None = None
    _state: dict[str, Tensor] | None = None

    @property
    def weights_file(self) -> Path:
        return self.path / WEIGHTS_NAME if self.path.is_dir() else self.path

    def state_dict(self) -> dict[str, Tensor]:
        """This project's state dict (read once; not for official files)."""
        if self._state is None:
            if self.format == "lightning":
                self._state, self.checkpoint = load_checkpoint_state_dict(self.path)
            else:
                self._state = read_safetensors(self.weights_file)
        return self._state


def resolve_source(name: str, pretrained: bool | str) -> WeightsSource:
    """Resolve a ``pretrained`` argument of model ``name`` (``arch`` or ``arch.tag``) once.

    Raises:
        PretrainedError: unknown default or tag, malformed location, missing folder or file,
            failed download, sha256 mismatch.
    """
    location, cfg = _location_of(name, pretrained)
    if location.startswith("hf-file:"):
        path = _download_file(cfg)
        check_sha256(path, cfg.sha256_prefix)
        return WeightsSource(location, path, "official", cfg)
    kind, target, revision = parse_location(location)
    path = _download(target, revision, location) if kind == "hf-hub" else Path(target)
    if kind == "file":
        if path.suffix == ".ckpt":
            source = WeightsSource(location, path, "lightning", cfg)
            source._state, source.checkpoint = load_checkpoint_state_dict(path)  # read once
            hparams = source.checkpoint.get("hyper_parameters") or {}
            source.owner = hparams.get("model_name")
            source.arguments = _without_init_only(hparams.get("model_config") or {})
            return source
        if path.suffix == ".safetensors":
            return _folder_source(location, path.parent, cfg, bare_file=path)
        if path.suffix in OFFICIAL_SUFFIXES:
            check_sha256(path, cfg.sha256_prefix if cfg else None)
            return WeightsSource(location, path, "official", cfg)
        raise PretrainedError(
            path,
            "not a weights file this project reads (.safetensors, a Lightning .ckpt, or a "
            f"release file: {', '.join(OFFICIAL_SUFFIXES)})",
        )
    if not path.exists():
        raise PretrainedError(path, "weights folder does not exist")
    if not path.is_dir():
        raise PretrainedError(path, "not a folder (expected a save_pretrained folder)")
    if not (path / WEIGHTS_NAME).is_file():
        present = ", ".join(sorted(p.name for p in path.iterdir())) or "empty"
        raise PretrainedError(path, f"no {WEIGHTS_NAME} in this folder (found: {present})")
    return _folder_source(location, path, cfg)


def _without_init_only(arguments: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in dict(arguments).items() if k not in _INIT_ONLY_ARGS}


def _folder_source(
    location: str, folder: Path, cfg: PretrainedCfg | None, bare_file: Path | None = None
) -> WeightsSource:
    try:
        config = read_config(folder)
    except PretrainedError:
        if bare_file is None:
            raise
        config = None  # a bare file beside some unrelated config.json
    arguments = dict(config or {})
    owner = (arguments.pop(METADATA_KEY, None) or {}).get("model_name")
    if bare_file is not None and bare_file.name != WEIGHTS_NAME:
        return WeightsSource(location, bare_file, "safetensors", cfg, None, owner, {})
    return WeightsSource(
        location, folder, "folder", cfg, config, owner, _without_init_only(arguments)
    )


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
        with torch.serialization.safe_globals(checkpoint_safe_globals()):
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
            checkpoint[key] = to_plain(checkpoint[key], resolve=False)
    return state, checkpoint


def checkpoint_safe_globals() -> list:
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


# --------------------------------------------------------------------------- checking


def _constructor_args(cls: type) -> set[str]:
    return constructor_arguments(cls)[0]


def _family_classes() -> list[type]:
    """Every registered family class (subclasses of ``SplatModel``, families imported)."""
    from models.base import SplatModel
    from models.registry import list_models

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
            f"arguments {', '.join(renamed(k) for k in foreign)} are not constructor arguments "
            "of model "
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
    """The network weights at ``location`` (a Lightning ``.ckpt``, a ``.safetensors`` file, a
    ``save_pretrained`` folder, or a ``local-dir:``/``hf-hub:`` location of one).

    Returns:
        ``(state_dict, path of the file read)``.

    Raises:
        PretrainedError: missing or unreadable weights, or a release file (those need a model:
            ``create_model(arch, pretrained=file)``).
    """
    source = resolve_source(name or "unknown", os.fspath(location))
    if source.format == "official":
        raise PretrainedError(
            source.path, "a release file: load it with create_model(arch, pretrained=file)"
        )
    return source.state_dict(), source.weights_file


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


def source_arguments(source: WeightsSource, architecture: str) -> dict[str, Any]:
    """The constructor arguments a resolved source asks of ``architecture``."""
    arguments = dict(source.pretrained_cfg.arch_kwargs) if source.pretrained_cfg else {}
    if source.owner == architecture:
        arguments.update(source.arguments)
    return arguments


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
    """Load weights into a freshly built registry model (see :func:`load_source`)."""
    return load_source(model, name, resolve_source(name, pretrained))


def load_source(model: nn.Module, name: str, source: WeightsSource) -> nn.Module:
    """Load a resolved source into ``model`` (built by ``name``'s entry point), strictly.

    Returns:
        ``model`` with the weights loaded, in eval mode.

    Raises:
        PretrainedError: one line naming the path and the problem.
    """
    name = split_model_name(name)[0]
    if source.format == "official":
        return load_official(model, name, source.path)
    if _is_release_safetensors(model, name, source):
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
            stacklevel=3,
        )
    return model.eval()


def read_official_file(path: str | os.PathLike) -> Any:
    """A release file as the object its authors saved, read without running code.

    ``.safetensors`` (or a folder holding ``model.safetensors``) → a dict of tensors (a folder's
    ``config.json`` under the key ``"config"`` beside ``"state_dict"``); anything else →
    ``torch.load(weights_only=True)``.

    Raises:
        PretrainedError: missing, empty, truncated or corrupt file, or a pickle that needs code.
    """
    path = Path(path)
    if path.is_dir():
        config = (
            json.loads((path / CONFIG_NAME).read_text(encoding="utf-8"))
            if (path / CONFIG_NAME).is_file()
            else None
        )
        state = read_safetensors(path / WEIGHTS_NAME)
        return {"state_dict": state, "config": config} if config is not None else state
    if not path.is_file():
        raise PretrainedError(path, "weights file does not exist")
    if path.stat().st_size == 0:
        raise PretrainedError(path, "empty file (an interrupted download?)")
    if path.suffix == ".safetensors":
        return read_safetensors(path)
    try:
        return torch.load(os.fspath(path), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        raise PretrainedError(
            path,
            "refused: reading it would run code beyond plain weights (only weights_only=True "
            "loading is allowed; a release file holds tensors and plain containers)",
        ) from error
    except Exception as error:  # RuntimeError (bad zip), EOFError, ValueError ...
        detail = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise PretrainedError(path, f"truncated or corrupt file ({detail[:160]})") from error


def load_official(model: nn.Module, name: str, path: str | os.PathLike) -> nn.Module:
    """Load a release file through the family's ``checkpoint_filter_fn``, strictly.

    Raises:
        PretrainedError: the family reads no release files, the file is not this release's
            format, or its weights do not fit ``model`` (e.g. another size).
    """
    path = Path(path)
    if _filter_fn(name) is None:
        raise PretrainedError(
            path, f"model {name!r} reads no release files (only this project's weights)"
        )
    return _load_filtered(model, name, path, read_official_file(path))


def _filter_fn(name: str):
    """The family's ``checkpoint_filter_fn`` (official keys → ours), or ``None``."""
    module = sys.modules[model_entrypoint(name).__module__]
    return getattr(module, "checkpoint_filter_fn", None)


def _is_release_safetensors(model: nn.Module, name: str, source: WeightsSource) -> bool:
    """A safetensors file or folder without this project's metadata whose keys are not the
    model's, for a family that reads release files: the authors' Hub format."""
    if source.format not in ("folder", "safetensors") or _filter_fn(name) is None:
        return False
    if source.config is not None and METADATA_KEY in source.config:
        return False
    return set(source.state_dict()) != set(model.state_dict())


def _load_filtered(model: nn.Module, name: str, path: Path, checkpoint: Any) -> nn.Module:
    filter_fn = _filter_fn(name)
    try:
        state = filter_fn(checkpoint, model)
    except (ValueError, KeyError, TypeError) as error:
        detail = " ".join(str(error).split()) or type(error).__name__
        raise PretrainedError(path, f"not a release file of {name!r}: {detail}") from error
    load_state_dict_strict(model, state, path, name)
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
