"""Publishing weights: an exported model's card (its README.md) and the upload to the Hub.

``python -m models.training.export`` and ``python -m models.weights.convert`` write a folder with
``models.weights.hub.save_pretrained`` and a card from ``model_card``, then ``push_folder``
uploads it; ``ExportError`` is their one-line error.
"""

from __future__ import annotations

import os

from torch import nn

from datamodules.errors import InputError
from models.core.output_folder import MARKER_NAME
from models.weights.registry import get_pretrained_cfg

__all__ = ["ExportError", "model_card", "push_folder"]


class ExportError(InputError):
    """An export or a conversion cannot proceed (its output folder, the push to the Hub);
    ``path`` names the file or location at fault."""


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
    recipe = getattr(getattr(model, "pretrained_cfg", None), "recipe", None)
    if recipe is None:
        cfg = get_pretrained_cfg(name)
        recipe = cfg.recipe if cfg is not None else None
    recipe_text = (
        recipe.card()
        if recipe is not None
        else "No input recipe is recorded for this architecture."
    )
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

## Input recipe

How inputs must be prepared for these weights (`get_pretrained_cfg(name).recipe`; `infer.py`
applies it by default):

{recipe_text}

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
