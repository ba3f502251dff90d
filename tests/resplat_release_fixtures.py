"""Deterministic ReSplat-release weights and inputs for the official-parity fixtures.

The recipe is DepthSplat's (``tests/depthsplat_fixtures.py``: an integer hash of key name and
element index, scaled like an initialisation) applied to the ReSplat manifests
(``fixtures/resplat_release/manifest_*.json``), with one addition: the last layers of the initial
head, of the update head and of the depth refiner are scaled by ``HEAD_SCALE`` so that the
random Gaussians, their updates and the depths stay of sensible size (the release
zero-initialises most of them).
"""

from __future__ import annotations

import functools
from pathlib import Path

import depthsplat_fixtures
from depthsplat_fixtures import (
    GAUSSIAN_FIELDS,
    deterministic_tensor,
    gaussian_errors,
    make_context,
    meta_checkpoint,
    recorded_threads,
    sample_index,
)

__all__ = [
    "FIXTURES",
    "arch_of",
    "build_loaded",
    "list_configs",
    "load_manifest",
    "make_context",
    "manifest_weights",
    "meta_checkpoint",
    "sample_index",
]

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "resplat_release"
HEAD_SCALE = {
    "encoder.gaussian_head.2.": 0.1,
    "encoder.update_head.6.": 0.01,
    # the depth refiner's residual (zero-initialised in the release): small, so that no depth
    # clamps at near/far, where lifted points coincide and kNN sets tie
    "encoder.depth_predictor.upsampler.scratch.output_conv.4.": 0.01,
}


load_manifest = functools.partial(depthsplat_fixtures.load_manifest, folder=FIXTURES)
list_official_samples = functools.partial(
    depthsplat_fixtures.list_official_samples, folder=FIXTURES
)
load_official_sample = functools.partial(depthsplat_fixtures.load_official_sample, folder=FIXTURES)


def manifest_weights(manifest: dict) -> dict:
    """The release container ``{'state_dict': {key: tensor}}`` of a manifest's recipe weights."""
    state = {}
    for key, spec in manifest["keys"].items():
        t = deterministic_tensor(key, spec["shape"], spec["dtype"])
        for prefix, scale in HEAD_SCALE.items():
            if key.startswith(prefix):
                t = t * scale
        state[key] = t
    return {manifest["container"]["state_dict_key"]: state}


def list_configs() -> list[str]:
    return sorted(p.stem[len("manifest_") :] for p in FIXTURES.glob("manifest_*.json"))


def arch_of(config: str) -> tuple[str, dict]:
    """``(architecture, kwargs)`` of the registered tag whose file the manifest describes."""
    from models import get_pretrained_cfg, list_models

    filename = load_manifest(config)["file"]
    for name in list_models("resplat_*", pretrained=True):
        cfg = get_pretrained_cfg(name)
        if cfg.hf_hub_filename == filename:
            return name.split(".")[0], dict(cfg.arch_kwargs)
    raise LookupError(f"no pretrained config names {filename}")


def build_loaded(config: str, **overrides):
    """Our model of ``config`` with the recipe weights loaded through ``checkpoint_filter_fn``."""
    from models import create_model
    from models.families.resplat_release import checkpoint_filter_fn

    arch, kwargs = arch_of(config)
    model = create_model(arch, **{**kwargs, **overrides})
    state = checkpoint_filter_fn(manifest_weights(load_manifest(config)), model)
    model.load_state_dict(state, strict=True)
    return model.eval()


# --------------------------------------------------------------------------- parity comparison
FIELDS = GAUSSIAN_FIELDS


def parity_errors(tag: str, model) -> list[dict[str, float]]:
    """Max abs error of ``model`` (weights loaded) against ``official_<tag>.npz``, one dict per
    Gaussian set (the initial set, then each recorded iteration). The forward runs with the
    recording's thread count, render backend, near and far. Rotations are compared as
    world-frame rotation matrices (the release keeps camera-frame xyzw quaternions next to world
    covariances; sign-free); covariances are rebuilt from our scales and rotations."""
    meta, ref = load_official_sample(tag)
    h, w, v, k = meta["height"], meta["width"], meta["views"], meta["iterations"]
    context = make_context(h, w, v, near=meta["near"], far=meta["far"])
    backend = model.render_backend
    model.render_backend = meta["render_backend"]
    try:
        with recorded_threads(meta["threads"]):
            out = model.eval()(context, iterations=k)
    finally:
        model.render_backend = backend
    idx = ref["index"]
    per_view = meta["count"] // v
    c2w = context["extrinsics"][0, idx // per_view, :3, :3]
    errors = []
    for i, g in enumerate(out.extras["gaussians_per_iteration"]):
        e = gaussian_errors(g, idx, c2w, ref, prefix="" if i == 0 else f"it{i}_")
        if i == 0:
            depth = out.extras["depth"][0].reshape(-1)[ref["depth_index"]]
            e["depth"] = float((depth - ref["depth"]).abs().max())
        errors.append(e)
    return errors
