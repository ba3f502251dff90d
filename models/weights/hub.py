"""Where weights are and how their files are read and written (timm's ``_hub``): locations,
downloads, the sha256 check of release files, safetensors, ``config.json``, Lightning
checkpoints, the authors' release containers, model cards and pushing to the Hub.

It sits above the registry (it asks which models and tags exist) and below the builder, which
builds a model and loads a :class:`WeightsSource` resolved here into it. Files are read from
safetensors or with ``torch.load(weights_only=True)``; nothing is unpickled as arbitrary code.

Locations (the ``pretrained`` argument of ``create_model``; ``weights=`` on the command line):

- ``True``: the tag's (or the architecture's default tag's) weights: a folder shipped in
  ``checkpoints/<name>/`` or a release file on the Hub (downloaded on first use, sha256-checked);
  architectures without a tag fall back to :func:`default_weights`.
- ``"hf-hub:org/repo"`` or ``"hf-hub:org/repo@revision"``: a ``save_pretrained`` repository,
  downloaded with ``huggingface_hub.snapshot_download`` into ``checkpoints/hub/`` (or the Hugging
  Face cache when ``HF_HUB_CACHE``/``HF_HOME`` is set); ``HF_HUB_OFFLINE=1`` uses the cache only.
- ``"local-dir:/path"`` (or a plain folder path): a ``save_pretrained`` folder.
- a path to a ``.safetensors`` file, a Lightning ``.ckpt``, or a file in a release's format.

Provenance: a file *claims* to be an authors' release when it comes from the Hub for a tag or
carries a release's file name (``PretrainedCfg.hf_hub_filename``); only then is its sha256 checked
against the release's. Any other file in a release's format (a fine-tune saved the authors' way)
loads under the architecture and recipe it is asked for, unchecked, and is never called the
release.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from datamodules.errors import InputError
from models.core.base import INIT_ONLY_ARGS, constructor_arguments
from models.weights.pretrained_cfg import PretrainedCfg
from models.weights.registry import (
    get_pretrained_cfg,
    is_model,
    list_pretrained,
    split_model_name,
    to_plain,
)

__all__ = [
    "CHECKPOINTS_DIR",
    "CONFIG_NAME",
    "HUB_WEIGHTS",
    "METADATA_KEY",
    "OFFICIAL_SUFFIXES",
    "WEIGHTS_NAME",
    "PretrainedError",
    "WeightsSource",
    "check_sha256",
    "checkpoint_safe_globals",
    "claimed_release",
    "default_weights",
    "discover_local_weights",
    "hub_cache_dir",
    "load_checkpoint_state_dict",
    "model_config",
    "parse_location",
    "read_config",
    "read_official_file",
    "read_safetensors",
    "read_weights",
    "resolve_source",
    "save_pretrained",
    "weights_location",
]

REPO_ROOT = Path(__file__).resolve().parents[2]
CHECKPOINTS_DIR = REPO_ROOT / "checkpoints"
CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
# config.json key holding what the weights are (family, registry name, class); written by
# ``save_pretrained`` below. Constructor arguments sit beside it.
METADATA_KEY = "splatzoo"

# Published Hub repositories: registry name -> "hf-hub:org/repo[@revision]". Only weights that exist.
HUB_WEIGHTS: dict[str, str] = {}


class PretrainedError(InputError):
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
            "weights=hf-hub:org/repo or weights=local-dir:/path on the command line "
            "(pretrained=... in Python), or train and export one "
            "(python -m models.training.export ckpt=... out=checkpoints/<name>)",
        )
    return table[name]


# --------------------------------------------------------------------------- locations


def parse_location(location: str) -> tuple[str, str, str | None]:
    """Split a weights location into ``(kind, target, revision)``.

    ``kind`` is ``"hf-hub"`` (target ``org/repo``), ``"local-dir"`` (a folder), or ``"file"`` (a
    ``.safetensors``, Lightning ``.ckpt`` or release file); ``revision`` is set only for
    ``hf-hub``. A bare path is a folder or a file depending on what it names (a missing path
    with a weights file's suffix is a file).
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
    if os.path.isfile(path) or (not os.path.isdir(path) and path.endswith(WEIGHTS_SUFFIXES)):
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
WEIGHTS_SUFFIXES = (".safetensors", ".ckpt", *OFFICIAL_SUFFIXES)


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
            f"`hf download {cfg.hf_hub_id} {cfg.hf_hub_filename}"
            f"{' --cache-dir ' + str(cache) if cache else ''}`, or download the file yourself "
            f"and pass weights=/path/to/{cfg.hf_hub_filename} on the command line "
            f"(pretrained='/path/to/{cfg.hf_hub_filename}' in Python)",
        ) from error
    except (RepositoryNotFoundError, EntryNotFoundError) as error:
        raise PretrainedError(shown, "not found on the Hub (repository or file)") from error
    except (HfHubHTTPError, OSError) as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise PretrainedError(
            shown, f"download failed: {type(error).__name__}: {first_line}"
        ) from error
    return Path(path)


def check_sha256(path: Path, prefix: str, release: str) -> None:
    """Check that the sha256 of a file claiming to be ``release`` starts with ``prefix``.

    Raises:
        PretrainedError: one line: the digests, and what to do (download again, or give a file of
            one's own another name).
    """
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    if not digest.hexdigest().startswith(prefix.lower()):
        raise PretrainedError(
            path,
            f"sha256 {digest.hexdigest()[:12]}... does not start with {prefix}, the digest of "
            f"the release {release} whose file name this file carries: an incomplete or altered "
            "download (download it again); a file of your own needs another name",
        )


def claimed_release(
    architecture: str, filename: str, cfg: PretrainedCfg | None = None
) -> PretrainedCfg | None:
    """The release a file claims to be by its name: the pretrained config (``cfg`` first, then
    the architecture's tags) whose ``hf_hub_filename`` is ``filename``; ``None`` if none."""
    candidates = [cfg] if cfg is not None else []
    candidates += [get_pretrained_cfg(n) for n in list_pretrained(f"{architecture}.*")]
    for candidate in candidates:
        if candidate.hf_hub_filename is not None and candidate.hf_hub_filename == filename:
            return candidate
    return None


@dataclass
class WeightsSource:
    """A weights location resolved once: what it is, where it is, what it says about itself.

    Attributes:
        location: the location as given (or the registry default it stands for).
        path: the local file or ``save_pretrained`` folder.
        format: ``"folder"`` (ours: ``config.json`` + ``model.safetensors``), ``"safetensors"``
            (ours, a bare file), ``"lightning"`` (a training ``.ckpt``) or ``"official"`` (a
            file in a release's format, read by the family's ``checkpoint_filter_fn``).
        pretrained_cfg: the registered config the weights are loaded under (the tag asked for,
            or the release the file's name claims), if any.
        config: the folder's ``config.json`` (ours) or ``None``.
        owner: the registry name the weights record, if any.
        arguments: the constructor arguments they record (init-only arguments left out).
        claimed: the release the file claims to be (downloaded for that tag, or carrying its
            file name), if any.
        sha256_matched: the claimed release records a sha256 prefix and the file's matched it.
    """

    location: str
    path: Path
    format: str
    pretrained_cfg: PretrainedCfg | None = None
    config: dict[str, Any] | None = None
    owner: str | None = None
    arguments: dict[str, Any] = field(default_factory=dict)
    claimed: PretrainedCfg | None = None
    sha256_matched: bool = False
    checkpoint: dict[str, Any] | None = None
    _state: dict[str, Tensor] | None = None

    @property
    def weights_file(self) -> Path:
        return self.path / WEIGHTS_NAME if self.path.is_dir() else self.path

    @property
    def is_release(self) -> bool:
        """The authors' release file: it claims to be one and its sha256 matched the release's."""
        return self.claimed is not None and self.sha256_matched

    def state_dict(self) -> dict[str, Tensor]:
        """This project's state dict (read once; not for official files)."""
        if self._state is None:
            if self.format == "lightning":
                self._state, self.checkpoint = load_checkpoint_state_dict(self.path)
            else:
                self._state = read_safetensors(self.weights_file)
        return self._state


def _check_claim(source: WeightsSource, architecture: str) -> WeightsSource:
    """A file carrying a release's name is sha256-checked against it; with no tag asked for,
    the release it names is the tag it loads under (its architecture arguments and recipe)."""
    path = source.weights_file
    claimed = claimed_release(architecture, path.name, source.pretrained_cfg)
    if claimed is None:
        return source
    source.claimed = claimed
    if claimed.sha256_prefix:
        check_sha256(path, claimed.sha256_prefix, claimed.name)
        source.sha256_matched = True
    if source.pretrained_cfg is None:
        source.pretrained_cfg = claimed
    return source


def _is_release_checkpoint(path: Path, architecture: str) -> bool:
    """Whether the ``.ckpt`` at ``path`` is a release's Lightning file (an architecture whose
    releases are ``.ckpt`` files, e.g. NoPoSplat's; no ``net.*`` weights of this project's
    LightningModule). Peeked with ``weights_only=True`` and ``mmap`` (no tensor is read); an
    unreadable file is left to the Lightning path, which says what is wrong."""
    releases = [get_pretrained_cfg(n) for n in list_pretrained(f"{architecture}.*")]
    if not any(
        c.file_format == "official" and str(c.hf_hub_filename or "").endswith(".ckpt")
        for c in releases
    ):
        return False
    try:
        checkpoint = torch.load(os.fspath(path), map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # noqa: BLE001 - any unreadable file: the Lightning path reports it
        return False
    state = checkpoint.get("state_dict") if isinstance(checkpoint, dict) else None
    return isinstance(state, dict) and not any(str(k).startswith("net.") for k in state)


def resolve_source(name: str, pretrained: bool | str) -> WeightsSource:
    """Resolve a ``pretrained`` argument of model ``name`` (``arch`` or ``arch.tag``) once.

    Raises:
        PretrainedError: unknown default or tag, malformed location, missing folder or file,
            failed download, a file claiming to be a release whose sha256 does not match.
    """
    architecture = split_model_name(name)[0]
    location, cfg = _location_of(name, pretrained)
    if location.startswith("hf-file:"):
        path = _download_file(cfg)
        source = WeightsSource(location, path, "official", cfg, claimed=cfg)
        if cfg.sha256_prefix:
            check_sha256(path, cfg.sha256_prefix, cfg.name)
            source.sha256_matched = True
        return source
    kind, target, revision = parse_location(location)
    path = _download(target, revision, location) if kind == "hf-hub" else Path(target)
    if kind == "file":
        if not path.is_file():
            raise PretrainedError(path, "weights file does not exist")
        if path.suffix == ".ckpt" and _is_release_checkpoint(path, architecture):
            return _check_claim(WeightsSource(location, path, "official", cfg), architecture)
        if path.suffix == ".ckpt":
            source = WeightsSource(location, path, "lightning", cfg)
            source._state, source.checkpoint = load_checkpoint_state_dict(path)  # read once
            hparams = source.checkpoint.get("hyper_parameters") or {}
            source.owner = hparams.get("model_name")
            source.arguments = _without_init_only(hparams.get("model_config") or {})
            return source
        if path.suffix == ".safetensors":
            source = _folder_source(location, path.parent, cfg, bare_file=path)
            ours = source.owner is not None or METADATA_KEY in (source.config or {})
            return source if ours else _check_claim(source, architecture)
        if path.suffix in OFFICIAL_SUFFIXES:
            return _check_claim(WeightsSource(location, path, "official", cfg), architecture)
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


def weights_location(name: str) -> str:
    """Where ``create_model(name, pretrained=True)`` reads from, as a user names it
    (``local-dir:...``, ``hf-hub:org/repo[@rev]``, or ``hf-hub:org/repo/FILE`` for a release)."""
    location, cfg = _location_of(name, True)
    if location.startswith("hf-file:"):
        return f"hf-hub:{cfg.hf_hub_id}/{cfg.hf_hub_filename}"
    return location


def _without_init_only(arguments: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in dict(arguments).items() if k not in INIT_ONLY_ARGS}


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


def model_config(model: nn.Module, name: str | None = None) -> dict[str, Any]:
    """``config.json`` content for ``model``: every constructor argument plus the metadata entry.

    Raises:
        ValueError: a constructor argument is missing (not JSON-serialisable, so the Hub mixin
            dropped it).
    """
    config = dict(getattr(model, "_hub_mixin_config", None) or {})
    missing = sorted(constructor_arguments(type(model))[0] - set(config))
    if missing:
        raise ValueError(
            f"{type(model).__name__}: constructor arguments {', '.join(missing)} are not in its "
            "config (they must be plain JSON-serialisable keyword arguments)"
        )
    for key, value in INIT_ONLY_ARGS.items():
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
