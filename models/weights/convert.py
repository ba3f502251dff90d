"""Convert a file in an authors' release format into this project's ``save_pretrained`` folder
(and optionally push it to the Hub).

    python -m models.weights.convert release=FILE model=ARCH[.TAG] out=DIR [overwrite=true]
        [push_to_hub=org/repo] [private=true]

The file is read with ``torch.load(weights_only=True)`` (or as safetensors) and mapped by the
family's ``checkpoint_filter_fn``, exactly as ``create_model(model, pretrained=FILE)`` loads it.
Its provenance decides what the model card says:

- a file carrying a release's file name is sha256-checked against that release (a mismatch is
  refused); when it matches, the card says "converted from the release FILE (sha256 matched)"
  and carries the tag's licence, source, training data and the authors' reported metrics
  (labelled as theirs);
- any other file (a fine-tune saved the authors' way) converts under ``model``'s architecture and
  recipe, unchecked; its card calls it "a file in the release's format (not the authors' release
  file)" and quotes none of the release's metrics.

Writes ``DIR/config.json``, ``DIR/model.safetensors`` and ``DIR/README.md`` (staged beside
``DIR`` and renamed into place). Errors are one line on stderr and exit status 2.
"""

from __future__ import annotations

import os
import re
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from models.core.command_line import (
    MISSING,
    parse_key_values,
    run_key_value_command,
    setting,
    stopped_cleanly,
)
from models.core.output_folder import OutputFolder, OutputFolderError
from models.weights.builder import build_model, is_release_format
from models.weights.hub import WeightsSource, resolve_source, save_pretrained
from models.weights.publish import ExportError, model_card, push_folder
from models.weights.registry import is_model, split_model_name

__all__ = ["convert_release", "main", "provenance"]

PROGRAM = "models.weights.convert"
USAGE = (
    f"usage: python -m {PROGRAM} release=FILE model=ARCH[.TAG] out=DIR [overwrite=true] "
    "[push_to_hub=org/repo] [private=true]"
)


@dataclass
class ConvertReleaseSettings:
    """``python -m models.weights.convert key=value ...``."""

    release: str = setting(MISSING, path=True)  # the authors' release file
    model: str = MISSING  # the architecture or tag it converts to
    out: str = setting(MISSING, path=True)  # the save_pretrained folder
    overwrite: bool = False
    push_to_hub: str | None = None  # org/repo
    private: bool = False


def provenance(source: WeightsSource) -> str:
    """What a converted file is, for its model card: the release only when its sha256 matched."""
    name = f"`{source.weights_file.name}`"
    if source.is_release:
        return f"the release {name} (sha256 matched)"
    if source.claimed is not None:
        return (
            f"{name}, a file in the release's format (named as the release of "
            f"{source.claimed.name}, which records no sha256 to verify it by: not verified as the "
            "authors' release file)"
        )
    return f"{name}, a file in the release's format (not the authors' release file)"


def _hub_license(text: str | None) -> str:
    """The Hub licence identifier of a pretrained config's licence text (``other`` if unclear)."""
    known = ("apache-2.0", "mit", "cc-by-nc-4.0", "cc-by-nc-sa-4.0", "cc-by-4.0", "bsd-3-clause")
    lowered = (text or "").lower().replace(" ", "-")
    found = [k for k in known if re.search(rf"(?<![a-z0-9]){re.escape(k)}(?![a-z0-9])", lowered)]
    return found[0] if len(found) == 1 else "other"  # whole names only ("mit" not in "submit")


def _card(model: nn.Module, source: WeightsSource, repo_id: str | None) -> str:
    cfg = source.pretrained_cfg
    facts = {"converted from": provenance(source)}
    metrics: dict[str, float] = {}
    note = ""
    if cfg is not None:
        release = source.is_release and source.claimed == cfg
        facts["weights" if release else "architecture and input recipe of"] = f"`{cfg.name}`"
        facts["licence" if release else "licence of the release"] = cfg.license or ""
        facts["source"] = cfg.source or ""
        if release:
            facts["training data"] = cfg.train_data or ""
            metrics = dict(cfg.metrics)
            note = f"Reported by {cfg.metrics_source}." if cfg.metrics_source else ""
        facts["input size"] = "x".join(map(str, cfg.input_size or ())) or ""
        facts["context views"] = str(cfg.views or "")
    facts = {k: v for k, v in facts.items() if v}
    name = cfg.name if cfg is not None else model.registry_name
    license = _hub_license(cfg.license if cfg is not None else None)
    return model_card(model, name, facts, metrics, repo_id, license=license, metrics_note=note)


def convert_release(
    release: str | os.PathLike,
    name: str,
    out: str | os.PathLike,
    overwrite: bool = False,
    repo_id: str | None = None,
) -> Path:
    """Convert a file in a release's format into a ``save_pretrained`` folder.

    Args:
        release: the file (a release's container, or its safetensors).
        name: ``architecture`` or ``architecture.tag``: the architecture (and recipe) the file is
            loaded under. Without a tag, a file carrying a release's name is that release's tag.
        out: the output folder; must not exist or be empty unless ``overwrite``.
        overwrite: replace an earlier output of this command.
        repo_id: the Hub repository the card's usage snippet should name.

    Returns:
        The output folder.

    Raises:
        ExportError, PretrainedError: one line naming the path.
    """
    release, out = Path(release), Path(out)
    try:
        folder = OutputFolder(out, PROGRAM, inputs=[release], overwrite=overwrite)
    except OutputFolderError as error:
        raise ExportError(error.path, error.message) from None
    architecture = split_model_name(name)[0]
    source = resolve_source(name, os.fspath(release))
    model = build_model(name, source)
    if not is_release_format(model, architecture, source):
        raise ExportError(
            release,
            "not in a release's format: this project's weights load as they are "
            "(a Lightning checkpoint exports with python -m models.training.export ckpt=...)",
        )
    card = _card(model, source, repo_id)
    with folder as staging:
        save_pretrained(model, staging, name=architecture, model_card=card)
    return out


def _parse(argv: list[str]) -> dict[str, Any]:
    paths, args = parse_key_values(argv, ConvertReleaseSettings, f"python -m {PROGRAM}", hint=USAGE)
    if paths:
        raise ExportError(paths[0], f"not a setting (settings are key=value). {USAGE}")
    if not is_model(args["model"]):
        raise ExportError(
            f"model={args['model']}",
            "unknown architecture or tag (list them with models.list_models(pretrained=True))",
        )
    return args


def _convert(argv: list[str]) -> None:
    args = _parse(argv)
    repo_id = args["push_to_hub"] or None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = convert_release(
            args["release"], args["model"], args["out"], args["overwrite"], repo_id=repo_id
        )
    for warning in caught:
        if issubclass(warning.category, UserWarning):
            print(f"warning: {' '.join(str(warning.message).split())}", file=sys.stderr)
    print(f"converted {args['release']} -> {out}")
    if repo_id:
        url = push_folder(out, repo_id, private=args["private"])
        print(f"pushed {out} -> {url}")


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit status (2 on bad input)."""
    return run_key_value_command(argv, __doc__, _convert)


if __name__ == "__main__":
    with stopped_cleanly("python -m models.weights.convert"):
        sys.exit(main())
