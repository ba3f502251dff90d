"""Deterministic NoPoSplat weights and inputs for the official-parity fixtures.

A closed-form function of a key manifest (``fixtures/noposplat/manifest_*.json``) and of integers,
so the tests rebuild exactly what was fed to the official encoder when the fixtures were recorded
(``fixtures/noposplat/README.md``). The tensors are DepthSplat's recipe
(``depthsplat_fixtures.deterministic_tensor``: an integer hash of key and index, scaled like an
initialisation), with one change that keeps the point maps well conditioned: the last convolution
of each point head (``downstream_head{1,2}.dpt.head.4``) is scaled by ``POINT_HEAD_GAIN``, so the
predicted points sit at distances ~1-5 (``exp`` activation, ``|p| = expm1(|x|)``) as in a real
scene rather than ~1e3, where float32 rounding alone would exceed the 1e-4 tolerance.

The release's DPTs register each of their four ``scratch.layer_rn.{i}`` convolutions a second
time as ``scratch.layer{i+1}_rn`` (one tensor, two keys in the file): the alias gets the value of
``layer_rn.{i}``, as in a real file.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import depthsplat_fixtures as dfx
import numpy as np
import torch
from torch import Tensor

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "noposplat"
POINT_HEAD_GAIN = 0.25
_POINT_HEAD_LAST = ("downstream_head1.dpt.head.4.", "downstream_head2.dpt.head.4.")
GAUSSIAN_FIELDS = ("means", "covariances", "scales", "rotations", "opacities", "harmonics")

make_context = dfx.make_context
sample_index = dfx.sample_index
recorded_threads = dfx.recorded_threads


def deterministic_tensor(key: str, shape: list[int], dtype: str = "float32") -> Tensor:
    """The tensor ``key`` of the recipe above."""
    value = dfx.deterministic_tensor(key, shape, dtype)
    if any(part in key for part in _POINT_HEAD_LAST):
        value = value * POINT_HEAD_GAIN
    return value


def load_manifest(config: str, folder: Path = FIXTURES) -> dict:
    """The key manifest ``folder/manifest_<config>.json``."""
    return json.loads((folder / f"manifest_{config}.json").read_text())


_ALIAS = re.compile(r"\.scratch\.layer(\d)_rn\.")


def canonical_key(key: str) -> str:
    """``...scratch.layer{i}_rn.*`` -> ``...scratch.layer_rn.{i-1}.*`` (the same tensor)."""
    return _ALIAS.sub(lambda m: f".scratch.layer_rn.{int(m.group(1)) - 1}.", key)


def manifest_weights(manifest: dict) -> dict:
    """The release container ``{'state_dict': {key: tensor}}`` for a manifest."""
    state = {
        key: deterministic_tensor(canonical_key(key), spec["shape"], spec["dtype"])
        for key, spec in manifest["keys"].items()
    }
    return {manifest["container"]["state_dict_key"]: state}


def meta_checkpoint(manifest: dict) -> dict:
    """A ``{'state_dict': ...}`` of meta tensors with a manifest's shapes and dtypes."""
    state = {
        k: torch.empty(spec["shape"], dtype=getattr(torch, spec["dtype"]), device="meta")
        for k, spec in manifest["keys"].items()
    }
    return {"state_dict": state}


def list_official_samples(folder: Path = FIXTURES) -> list[str]:
    """Tags of the recorded official outputs (``folder/official_<tag>.npz``)."""
    return sorted(p.stem[len("official_") :] for p in folder.glob("official_*.npz"))


def load_official_sample(tag: str, folder: Path = FIXTURES) -> tuple[dict, dict]:
    """``(meta, arrays)`` of ``folder/official_<tag>.npz``."""
    with np.load(folder / f"official_{tag}.npz") as data:
        arrays = {k: torch.from_numpy(data[k]) for k in data.files if k != "meta"}
        meta = json.loads(str(data["meta"]))
    return meta, arrays


def parity_errors(tag: str, model) -> dict[str, float]:
    """Max abs error of every Gaussian field against ``official_<tag>.npz`` (sampled Gaussians;
    covariances and scales relative to their largest recorded value, as they are ~1e-5..1e-2);
    rotations compared as quaternions (both sides normalise the same raw numbers)."""
    meta, ref = load_official_sample(tag)
    context = make_context(meta["height"], meta["width"], meta["views"])
    with recorded_threads(meta["threads"]):
        g = model.eval()(context).gaussians
    idx = ref["index"]
    q = g.rotations[0, idx]
    w, x, y, z = q.unbind(-1)
    rotation = torch.stack(
        [
            1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y),
            2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x),
            2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y),
        ],
        dim=-1,
    ).reshape(-1, 3, 3)  # fmt: skip
    scale = torch.diag_embed(g.scales[0, idx])
    ours = {
        "means": g.means[0, idx],
        "covariances": rotation @ scale @ scale @ rotation.transpose(-1, -2),
        "scales": g.scales[0, idx],
        "rotations": q,
        "opacities": g.opacities[0, idx],
        "harmonics": g.harmonics[0, idx],
    }
    q_ref = ref["rotations_xyzw"]
    theirs = {k: ref[k] for k in ours if k != "rotations"}
    theirs["rotations"] = torch.cat([q_ref[:, 3:], q_ref[:, :3]], dim=-1)
    errors = {}
    for key in ours:
        error = float((ours[key] - theirs[key]).abs().max())
        if key in ("covariances", "scales"):
            error /= max(float(theirs[key].abs().max()), 1e-12)
        errors[key] = error
    return errors
