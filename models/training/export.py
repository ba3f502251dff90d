"""Export a Lightning checkpoint to the ``save_pretrained`` layout (and optionally to the Hub).

    python -m models.training.export ckpt=PATH out=DIR [push_to_hub=org/repo] [name=MODEL]
        [metrics=metrics.json] [data="..."] [overwrite=true] [private=true]

(An authors' release file converts with ``python -m models.weights.convert``.)

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from models.core.base import INIT_ONLY_ARGS
from models.core.command_line import (
    MISSING,
    parse_key_values,
    run_key_value_command,
    setting,
    stopped_cleanly,
)
from models.core.output_folder import OutputFolder, OutputFolderError
from models.weights.builder import build_from_recorded, load_state_dict_strict
from models.weights.hub import load_checkpoint_state_dict
from models.weights.hub import save_pretrained as save_with_metadata
from models.weights.publish import ExportError, model_card, push_folder
from models.weights.registry import is_model

__all__ = ["checkpoint_metrics", "export_checkpoint", "main"]

USAGE = (
    "usage: python -m models.training.export ckpt=PATH out=DIR [push_to_hub=org/repo] [name=MODEL] "
    "[metrics=JSON] [metric.NAME=VALUE ...] [data=TEXT] [overwrite=true] [private=true] "
    "(a release file: python -m models.weights.convert release=FILE model=ARCH[.TAG] out=DIR)"
)


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
    resolution = _find(flat, "resolution", "image_size")
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


# --------------------------------------------------------------------------- export


def _build_model(checkpoint: dict, name: str | None, path: Path) -> tuple[nn.Module, str]:
    """Rebuild the network from the hyper-parameters the LightningModule recorded.

    ``SplatLitModule`` records ``model_name`` (registry name), ``model_class`` and
    ``model_config`` (every constructor argument); ``model_kwargs`` (overrides of the entry point)
    is accepted too.
    """
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
    for key in INIT_ONLY_ARGS:  # the checkpoint holds every weight (ReSplat's stage-1 file
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


def _output_folder(out: Path, source: Path, overwrite: bool) -> OutputFolder:
    try:
        return OutputFolder(out, "models.training.export", inputs=[source], overwrite=overwrite)
    except OutputFolderError as error:
        raise ExportError(error.path, error.message) from None


# --------------------------------------------------------------------------- command line


PROGRAM = "python -m models.training.export"


@dataclass
class ExportSettings:
    """``python -m models.training.export key=value ...`` (and ``metric.NAME=VALUE``)."""

    ckpt: str = setting(MISSING, path=True)  # the Lightning checkpoint
    out: str = setting(MISSING, path=True)  # the save_pretrained folder
    push_to_hub: str | None = None  # org/repo
    name: str | None = None  # the registry model (default: the checkpoint's)
    metrics: str | None = setting(None, path=True)  # a metrics JSON (eval.py's)
    data: str | None = None  # the training data, as the card says it
    overwrite: bool = False
    private: bool = False


def _parse(argv: list[str]) -> tuple[dict[str, Any], dict[str, float]]:
    """The settings and the ``metric.NAME=VALUE`` ones (numbers)."""
    rest: list[str] = []
    metrics: dict[str, float] = {}
    for item in argv:
        key, sep, value = item.partition("=")
        key = key.lstrip("+")
        if sep and key.startswith("metric."):
            try:
                metrics[key[len("metric.") :]] = float(value)
            except ValueError as error:
                raise ExportError(item, "metric values must be numbers") from error
        else:
            rest.append(item)
    paths, args = parse_key_values(rest, ExportSettings, PROGRAM, hint=USAGE)
    if paths:
        raise ExportError(paths[0], f"not a setting (settings are key=value). {USAGE}")
    return args, metrics


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


def _export(argv: list[str]) -> None:
    args, metrics = _parse(argv)
    if args["metrics"]:
        metrics = {**_read_metrics(args["metrics"]), **metrics}
    repo_id = args["push_to_hub"] or None
    out = export_checkpoint(
        args["ckpt"],
        args["out"],
        name=args["name"],
        metrics=metrics,
        data=args["data"],
        overwrite=args["overwrite"],
        repo_id=repo_id,
    )
    print(f"exported {args['ckpt']} -> {out}")
    if repo_id:
        url = push_folder(out, repo_id, private=args["private"])
        print(f"pushed {out} -> {url}")


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit status (2 on bad input)."""
    return run_key_value_command(argv, __doc__, _export)


if __name__ == "__main__":
    with stopped_cleanly(PROGRAM):
        sys.exit(main())
