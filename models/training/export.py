"""Export a Lightning checkpoint, or an authors' release file, to the ``save_pretrained`` layout
(and optionally to the Hub).

    python -m models.training.export ckpt=PATH out=DIR [push_to_hub=org/repo] [name=MODEL]
        [metrics=metrics.json] [data="..."] [overwrite=true] [private=true]
    python -m models.training.export release=depthsplat-gs-small-...-cfeab6b1.pth \
        model=depthsplat_small.re10k_256x256_view2 out=DIR

A release file is mapped by its family's ``checkpoint_filter_fn``; the tag's pretrained config
(licence, source, training data, the authors' reported metrics, labelled as theirs) goes into the
model card.

Writes ``DIR/config.json`` (every constructor argument plus the ``splatzoo`` metadata entry),
``DIR/model.safetensors`` and a generated model card ``DIR/README.md`` naming the family, the
training data, the resolution, the training steps and the metrics (taken from the checkpoint's
hyper-parameters and callback states, from ``metrics=`` — e.g. the JSON written by ``eval.py`` —
or from ``metric.NAME=VALUE`` arguments). The checkpoint is read with
``torch.load(weights_only=True)``; the folder is written next to ``DIR`` and renamed into place, so
a failure never leaves half an export. Errors are one line on stderr and exit status 2.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any

from torch import nn

from models.errors import PathError
from models.output_folder import MARKER_NAME, OutputFolder, OutputFolderError
from models.weights.pretrained import (
    _INIT_ONLY_ARGS,
    METADATA_KEY,
    PretrainedError,
    load_checkpoint_state_dict,
    load_state_dict_strict,
)
from models.weights.pretrained import save_pretrained as save_with_metadata

__all__ = ["ExportError", "export_checkpoint", "model_card", "push_folder", "main"]

USAGE = (
    "usage: python -m models.training.export ckpt=PATH out=DIR [push_to_hub=org/repo] [name=MODEL] "
    "[metrics=JSON] [metric.NAME=VALUE ...] [data=TEXT] [overwrite=true] [private=true]; "
    "or python -m models.training.export release=FILE model=ARCH[.TAG] out=DIR"
)


class ExportError(PathError):
    """An export cannot proceed; ``path`` names the file or location at fault."""


# --------------------------------------------------------------------------- card


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (lists and scalars are leaves)."""
    if isinstance(tree, dict):
        out: dict[str, Any] = {}
        for key, value in tree.items():
            out.update(_flatten(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: tree}


def _find(flat: dict[str, Any], *suffixes: str) -> Any:
    """The first value whose dotted key ends with one of ``suffixes`` (in that priority)."""
    for suffix in suffixes:
        for key, value in flat.items():
            if (key == suffix or key.endswith("." + suffix)) and value not in (None, ""):
                return value
    return None


def _number(value: Any) -> float | None:
    if hasattr(value, "item") and getattr(value, "numel", lambda: 0)() == 1:
        value = value.item()
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def checkpoint_metrics(checkpoint: dict) -> dict[str, float]:
    """Metrics recorded in a Lightning checkpoint: ``hyper_parameters["metrics"]`` when the
    LightningModule stores them, and each ``ModelCheckpoint``'s best monitored score."""
    metrics: dict[str, float] = {}
    hparams = checkpoint.get("hyper_parameters") or {}
    for key, value in (hparams.get("metrics") or {}).items() if isinstance(hparams, dict) else ():
        if (number := _number(value)) is not None:
            metrics[str(key)] = number
    for state in (checkpoint.get("callbacks") or {}).values():
        if isinstance(state, dict) and state.get("monitor") and "best_model_score" in state:
            score = _number(state["best_model_score"])
            if score is not None:
                metrics.setdefault(f"{state['monitor']} (best)", score)
    return metrics


def _training_facts(checkpoint: dict, data: str | None) -> dict[str, str]:
    """Training data, resolution and steps for the card, from the hyper-parameters."""
    hparams = checkpoint.get("hyper_parameters") or {}
    dm_hparams = checkpoint.get("datamodule_hyper_parameters") or {}
    flat = {
        **_flatten(dm_hparams if isinstance(dm_hparams, dict) else {}),
        **_flatten(hparams if isinstance(hparams, dict) else {}),
    }
    facts: dict[str, str] = {}
    dataset = data or _find(
        flat, "data_name", "dataset", "data.name", "data._target_", "data.root", "root"
    )
    facts["training data"] = (
        str(dataset) if dataset is not None else "not recorded in the checkpoint"
    )
    resolution = _find(flat, "resolution", "image_size", "image_shape")
    if isinstance(resolution, (list, tuple)):
        resolution = "x".join(str(int(r)) for r in resolution)
    elif isinstance(resolution, (int, float)):
        resolution = f"{int(resolution)}x{int(resolution)}"
    facts["resolution"] = str(resolution) if resolution is not None else "not recorded"
    views = _find(flat, "num_context_views", "context_views", "num_context")
    if views is not None:
        facts["context views"] = str(views)
    steps = checkpoint.get("global_step")
    max_steps = _find(flat, "max_steps")
    if steps is not None:
        facts["training steps"] = str(steps) + (f" (of {max_steps})" if max_steps else "")
    return facts


def model_card(
    model: nn.Module,
    name: str,
    facts: dict[str, str],
    metrics: dict[str, float],
    repo_id: str | None = None,
    license: str = "apache-2.0",
    metrics_note: str = "",
) -> str:
    """The README.md of an exported model: YAML metadata, what it is, how it was trained, its
    metrics and how to use it. ``license`` is the weights' Hub licence identifier (a released
    model's licence travels with its weights); ``metrics_note`` says who measured the metrics."""
    from huggingface_hub import ModelCard, ModelCardData

    family = getattr(model, "family", "unknown")
    pose = (
        "pose-free (no input cameras needed)"
        if getattr(model, "pose_free", False)
        else "posed (needs input cameras)"
    )
    params = sum(p.numel() for p in model.parameters())
    card_data = ModelCardData(
        library_name="splatzoo",
        license=license,
        pipeline_tag="image-to-3d",
        tags=sorted({"gaussian-splatting", "3d-reconstruction", "splatzoo", family}),
    )
    rows = [
        ("model", f"`{name}`"),
        ("family", f"`{family}` ({type(model).__name__})"),
        ("inputs", pose),
    ]
    rows += [("minimum views", str(getattr(model, "min_views", 1))), ("parameters", f"{params:,}")]
    rows += list(facts.items())
    table = "\n".join(f"| {k} | {v} |" for k, v in rows)
    if metrics:
        metric_table = "| metric | value |\n|---|---|\n" + "\n".join(
            f"| {k} | {v:.4g} |" for k, v in sorted(metrics.items())
        )
        if metrics_note:
            metric_table += f"\n\n{metrics_note}"
    else:
        metric_table = "No metrics were recorded with this checkpoint."
    location = f"hf-hub:{repo_id}" if repo_id else "local-dir:/path/to/this/folder"
    content = f"""---
{card_data.to_yaml()}
---

# {name}

A feed-forward 3D Gaussian Splatting model from [splatzoo](https://github.com/splatzoo/splatzoo):
images in, a set of 3D Gaussians out in one forward pass.

| | |
|---|---|
{table}

## Metrics

{metric_table}

## Usage

```python
from models import create_model
model = create_model("{name}", pretrained="{location}")
```

```bash
python infer.py input=my_images/ output=outputs/my_scene model={name} weights={location}
```

Weights are stored as safetensors; `config.json` holds every constructor argument.
"""
    return str(ModelCard(content))


# --------------------------------------------------------------------------- export


def _build_model(checkpoint: dict, name: str | None, path: Path) -> tuple[nn.Module, str]:
    """Rebuild the network from the hyper-parameters the LightningModule recorded.

    ``SplatLitModule`` records ``model_name`` (registry name), ``model_class`` and
    ``model_config`` (every constructor argument); ``model_kwargs`` (overrides of the entry point)
    is accepted too.
    """
    from models.factory import build_from_recorded
    from models.registry import is_model

    hparams = checkpoint.get("hyper_parameters") or {}
    name = name or hparams.get("model_name")
    if not name:
        recorded = hparams.get("model_class") or "unknown class"
        raise ExportError(
            path, f"checkpoint hyper-parameters have no 'model_name' ({recorded}); pass name=MODEL"
        )
    if not is_model(name):
        raise ExportError(path, f"model {name!r} from the checkpoint is not registered")
    kwargs = dict(hparams.get("model_config") or hparams.get("model_kwargs") or {})
    for key in _INIT_ONLY_ARGS:  # the checkpoint holds every weight (ReSplat's stage-1 file
        kwargs.pop(key, None)  # may be gone)
    try:  # the factory's rebuild: an argument the constructor does not take fails, named
        model = build_from_recorded(name, kwargs)
    except (TypeError, ValueError) as error:
        raise ExportError(
            path, f"cannot build {name!r} from its recorded config: {error}"
        ) from error
    return model, name


def export_checkpoint(
    ckpt: str | os.PathLike,
    out: str | os.PathLike,
    name: str | None = None,
    metrics: dict[str, float] | None = None,
    data: str | None = None,
    overwrite: bool = False,
    repo_id: str | None = None,
) -> Path:
    """Convert a Lightning checkpoint into a ``save_pretrained`` folder.

    Args:
        ckpt: the ``.ckpt`` file (LightningModule with the network under ``net`` and hparams
            ``model_name``/``model_kwargs``).
        out: the output folder; must not exist or be empty unless ``overwrite``.
        name: registry name, overriding the checkpoint's ``model_name``.
        metrics: extra metrics for the card (override the checkpoint's).
        data: training-data description for the card (overrides the hyper-parameters').
        overwrite: replace an existing non-empty ``out``.
        repo_id: the Hub repository the card's usage snippet should name.

    Returns:
        The output folder.

    Raises:
        ExportError, PretrainedError: one line naming the path.
    """
    ckpt, out = Path(ckpt), Path(out)
    folder = _output_folder(out, ckpt, overwrite)
    state, checkpoint = load_checkpoint_state_dict(ckpt)
    model, name = _build_model(checkpoint, name, ckpt)
    load_state_dict_strict(model, state, ckpt, name)
    model.eval()
    all_metrics = {**checkpoint_metrics(checkpoint), **(metrics or {})}
    card = model_card(model, name, _training_facts(checkpoint, data), all_metrics, repo_id)
    with folder as staging:
        save_with_metadata(model, staging, name=name, model_card=card)
    return out


def _hub_license(text: str | None) -> str:
    """The Hub licence identifier of a pretrained config's licence text (``other`` if unclear)."""
    known = ("apache-2.0", "mit", "cc-by-nc-4.0", "cc-by-4.0", "bsd-3-clause")
    lowered = (text or "").lower()
    found = [k for k in known if k in lowered.replace(" ", "-")]
    return found[0] if len(found) == 1 else "other"


def export_release(
    release: str | os.PathLike,
    name: str,
    out: str | os.PathLike,
    overwrite: bool = False,
    repo_id: str | None = None,
) -> Path:
    """Convert an authors' release file into this project's ``save_pretrained`` folder.

    Args:
        release: the downloaded release file (read with ``weights_only=True`` and mapped by the
            family's ``checkpoint_filter_fn``).
        name: ``architecture`` or ``architecture.tag``; the tag's pretrained config (licence,
            source, training data, the authors' reported metrics) goes into the model card.
        out: the output folder (same rules as :func:`export_checkpoint`).

    Raises:
        ExportError, PretrainedError: one line naming the path.
    """
    from models.factory import create_model
    from models.registry import get_pretrained_cfg
    from models.weights.pretrained_cfg import split_model_name

    release, out = Path(release), Path(out)
    folder = _output_folder(out, release, overwrite)
    architecture, tag = split_model_name(name)
    cfg = get_pretrained_cfg(name)
    if tag is None:  # the file says which tag it is when its name is a registered file name
        for candidate in list_models_pretrained(architecture):
            if candidate.hf_hub_filename == release.name:
                cfg = candidate
    model = create_model(cfg.name if cfg is not None else architecture, pretrained=str(release))
    facts = {"converted from": f"`{release.name}` (the authors' release file)"}
    if cfg is not None:
        facts.update(
            {
                "weights": f"`{cfg.name}`",
                "licence": cfg.license or "see the source",
                "source": cfg.source or "",
                "training data": cfg.train_data or "",
                "input size": "x".join(map(str, cfg.input_size or ())) or "",
                "context views": str(cfg.views or ""),
            }
        )
    facts = {k: v for k, v in facts.items() if v}
    note = f"Reported by {cfg.metrics_source}." if cfg is not None and cfg.metrics_source else ""
    card = model_card(
        model,
        architecture,
        facts,
        dict(cfg.metrics) if cfg is not None else {},
        repo_id,
        license=_hub_license(cfg.license if cfg is not None else None),
        metrics_note=note,
    )
    with folder as staging:
        save_with_metadata(model, staging, name=architecture, model_card=card)
    return out


def list_models_pretrained(architecture: str) -> list:
    """The pretrained configs of ``architecture``."""
    from models.registry import get_pretrained_cfg, list_models

    return [
        get_pretrained_cfg(n)
        for n in list_models(pretrained=True)
        if n.startswith(f"{architecture}.")
    ]


# What an export folder written before the output marker existed holds.
_EXPORT_ENTRIES = ("config.json", "model.safetensors", "README.md")


def _legacy_export(folder: Path) -> tuple[str, ...] | None:
    """The entries of an older export (a ``config.json`` with our metadata), else ``None``."""
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return _EXPORT_ENTRIES if isinstance(config, dict) and METADATA_KEY in config else None


def _output_folder(out: Path, source: Path, overwrite: bool) -> OutputFolder:
    try:
        return OutputFolder(
            out,
            "models.training.export",
            inputs=[source],
            overwrite=overwrite,
            legacy=_legacy_export,
        )
    except OutputFolderError as error:
        raise ExportError(error.path, error.message) from None


def push_folder(folder: str | os.PathLike, repo_id: str, private: bool = False) -> str:
    """Upload an exported folder to the Hub as model repository ``repo_id``.

    Returns:
        The commit URL.

    Raises:
        ExportError: offline (``HF_HUB_OFFLINE=1``), no network, no token, refused by the Hub.
    """
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    location = f"hf-hub:{repo_id}"
    later = f"the export in {os.fspath(folder)} is complete; push it again with network access"
    try:
        api = HfApi()
        repo_id = api.create_repo(repo_id=repo_id, private=private, exist_ok=True).repo_id
        info = api.upload_folder(
            repo_id=repo_id,
            folder_path=os.fspath(folder),
            repo_type="model",
            commit_message="Upload splatzoo weights",
            ignore_patterns=[MARKER_NAME],  # local bookkeeping, not part of the weights
        )
    except OfflineModeIsEnabled as error:
        raise ExportError(
            location, f"cannot push: offline mode is enabled (HF_HUB_OFFLINE); {later}"
        ) from error
    except (HfHubHTTPError, OSError, ValueError) as error:
        detail = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise ExportError(
            location, f"cannot push: {type(error).__name__}: {detail}; {later}"
        ) from error
    return str(getattr(info, "commit_url", info))


# --------------------------------------------------------------------------- command line


def _parse(argv: list[str]) -> tuple[dict[str, str], dict[str, float]]:
    args: dict[str, str] = {}
    metrics: dict[str, float] = {}
    for item in argv:
        key, sep, value = item.partition("=")
        key = key.lstrip("+")
        if not sep or not key:
            raise ExportError(item, f"expected key=value. {USAGE}")
        if key.startswith("metric."):
            try:
                metrics[key[len("metric.") :]] = float(value)
            except ValueError as error:
                raise ExportError(item, "metric values must be numbers") from error
        elif key in (
            "ckpt",
            "release",
            "model",
            "out",
            "push_to_hub",
            "name",
            "metrics",
            "data",
            "overwrite",
            "private",
        ):
            args[key] = value
        else:
            raise ExportError(item, f"unknown argument {key!r}. {USAGE}")
    sources = [k for k in ("ckpt", "release") if args.get(k)]
    if len(sources) != 1:
        raise ExportError("ckpt", f"give exactly one of ckpt=... or release=... {USAGE}")
    if args.get("release") and not args.get("model"):
        raise ExportError("model", f"release=... needs model=ARCH[.TAG]. {USAGE}")
    for required in ("out",):
        if not args.get(required):
            raise ExportError(required, f"missing {required}=... {USAGE}")
    return args, metrics


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def _read_metrics(path: str) -> dict[str, float]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ExportError(path, f"cannot read metrics JSON ({error})") from error
    if isinstance(data, dict) and isinstance(data.get("metrics"), dict):
        data = {"test": data["metrics"]}  # eval.py's layout: the rest is run metadata
    flat = _flatten(data) if isinstance(data, dict) else {}
    metrics = {k: n for k, v in flat.items() if (n := _number(v)) is not None}
    if not metrics:
        raise ExportError(path, "no numeric metrics in this JSON")
    return metrics


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit status (2 on bad input)."""
    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__)
        return 0
    try:
        args, metrics = _parse(argv)
        if args.get("metrics"):
            metrics = {**_read_metrics(args["metrics"]), **metrics}
        repo_id = args.get("push_to_hub") or None
        if args.get("release"):
            out = export_release(
                args["release"],
                args["model"],
                args["out"],
                overwrite=_truthy(args.get("overwrite")),
                repo_id=repo_id,
            )
        else:
            out = export_checkpoint(
                args["ckpt"],
                args["out"],
                name=args.get("name"),
                metrics=metrics,
                data=args.get("data"),
                overwrite=_truthy(args.get("overwrite")),
                repo_id=repo_id,
            )
        print(f"exported {args.get('ckpt') or args['release']} -> {out}")
        if repo_id:
            url = push_folder(out, repo_id, private=_truthy(args.get("private")))
            print(f"pushed {out} -> {url}")
    except (ExportError, PretrainedError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
