"""SplatWeaver's released architecture (``splatweaver_vggt*``): key manifests, checkpoint mapping,
numerical parity with the official code (recorded fixtures), routing modes, budget, scene frame.

Fixtures (``tests/fixtures/splatweaver_release/``, see its README): key manifests of the official
model at the released and tiny configurations, and the official outputs of the tiny configuration
on deterministic weights (``splatweaver_release_weights``) with argmax routing.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from splatweaver_release_weights import FIXTURES, deterministic_state, load_manifest

from models import create_model, render
from models.families.splatweaver_release import (
    DROPPED_KEYS,
    SplatWeaverRelease,
    checkpoint_filter_fn,
    exact_knn,
    pywt_detail_bands,
)
from models.weights.registry import get_pretrained_cfg

TINY = "splatweaver_vggt_tiny"
RELEASED = "splatweaver_vggt"
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def tiny_state() -> dict[str, torch.Tensor]:
    return deterministic_state(load_manifest("tiny"))


@pytest.fixture(scope="module")
def official() -> dict[str, torch.Tensor]:
    return load_file(FIXTURES / "official_outputs_tiny.safetensors")


@pytest.fixture(scope="module")
def tiny_model(tiny_state) -> SplatWeaverRelease:
    model = create_model(TINY).eval()
    model.load_state_dict(checkpoint_filter_fn(tiny_state, model))
    return model


@pytest.fixture(scope="module")
def tiny_outputs(tiny_model, official):
    with torch.no_grad():
        return tiny_model({"image": official["image"]}, routing="argmax", frame="release")


# --------------------------------------------------------------------------- manifests
@pytest.mark.parametrize("config, name", [("tiny", TINY), ("released", RELEASED)])
def test_filter_consumes_every_key_and_fills_every_parameter(config: str, name: str) -> None:
    """Every official key is consumed (``DROPPED_KEYS`` justified) and every parameter of ours is
    filled with the right shape (meta device: no memory)."""
    manifest = load_manifest(config)
    with torch.device("meta"):
        model = create_model(name)
        state = {
            k: torch.empty(e["shape"], dtype=getattr(torch, e["dtype"]))
            for k, e in manifest["tensors"].items()
        }
    mapped = checkpoint_filter_fn(state, model)
    targets = model.state_dict()
    assert set(mapped) == set(targets)
    for key, value in mapped.items():
        assert tuple(value.shape) == tuple(targets[key].shape), key
    assert len(mapped) + len(DROPPED_KEYS) == len(manifest["tensors"]) == manifest["num_tensors"]
    ours = sum(t.numel() for t in targets.values())
    dropped = sum(torch.Size(manifest["tensors"][k]["shape"]).numel() for k in DROPPED_KEYS)
    assert ours + dropped == manifest["num_parameters"]


def test_released_manifest_facts() -> None:
    """The Hub format as released: 1.19 B parameters, the aggregator's 1,210 tensors bfloat16,
    the heads float32."""
    manifest = load_manifest("released")
    assert manifest["commit"] == "6a157ce"
    assert round(manifest["num_parameters"] / 1e9, 2) == 1.19
    dtypes = {k: e["dtype"] for k, e in manifest["tensors"].items()}
    aggregator = [k for k in dtypes if k.startswith("encoder.aggregator.")]
    assert len(aggregator) == 1210 and all(dtypes[k] == "bfloat16" for k in aggregator)
    heads = ("encoder.camera_head.", "encoder.depth_head.", "encoder.gaussian_param_head.")
    rest = [k for k in dtypes if k not in aggregator]
    assert rest and all(k.startswith(heads) and dtypes[k] == "float32" for k in rest)


def test_filter_rejects_other_files(tiny_state) -> None:
    model = create_model(TINY)
    with pytest.raises(ValueError, match="not a SplatWeaver release checkpoint"):
        checkpoint_filter_fn({"backbone.weight": torch.zeros(1)}, model)
    with pytest.raises(ValueError, match="expected a dict of tensors"):
        checkpoint_filter_fn({"state_dict": {"a": 1}}, model)
    released = load_manifest("released")
    with torch.device("meta"):
        big = {k: torch.empty(e["shape"]) for k, e in released["tensors"].items()}
    with pytest.raises(ValueError, match="does not have") as info:
        checkpoint_filter_fn(big, model)  # the released file into the tiny model
    assert "\n" not in str(info.value)
    reshaped = {**tiny_state, "encoder.camera_head.embed_pose.bias": torch.zeros(7)}
    with pytest.raises(ValueError, match=r"camera_head.embed_pose.bias: shape \(7,\)"):
        checkpoint_filter_fn(reshaped, model)
    partial = dict(tiny_state)
    partial.pop("encoder.depth_head.norm.weight")
    with pytest.raises(ValueError, match="lacks 1 weight"):
        checkpoint_filter_fn(partial, model)
    extra = {**tiny_state, "encoder.gaussian_param_head.unknown.weight": torch.zeros(2)}
    with pytest.raises(ValueError, match="does not have"):
        checkpoint_filter_fn(extra, model)
    # a torch.load-style container is unwrapped
    assert (
        checkpoint_filter_fn({"state_dict": tiny_state}, model).keys() == model.state_dict().keys()
    )


# --------------------------------------------------------------------------- parity
def test_parity_cameras_depth_and_cardinality(tiny_outputs, official) -> None:
    """Predicted cameras (camera-to-world, normalised intrinsics) and depth match the official
    code; the cardinality is identical at every pixel and every expert is used."""
    extras = tiny_outputs.extras
    for key in ("extrinsics", "intrinsics", "pose_encoding", "depth"):
        error = (extras[key] - official[key]).abs().max().item()
        assert error <= TOLERANCE, f"{key}: max abs error {error:.3g}"
    cardinality = extras["routing_map"].to(torch.int32)
    assert torch.equal(cardinality, official["cardinality"])
    assert torch.bincount(cardinality.flatten(), minlength=4).min() > 100


def _gaussian_errors(gaussians, official, keep=None) -> dict[str, float]:
    ours = {
        "means": gaussians.means,
        "scales": gaussians.scales,
        "rotations": gaussians.rotations[..., [1, 2, 3, 0]],  # ours wxyz, release xyzw
        "harmonics": gaussians.harmonics,
        "opacities": gaussians.opacities,
    }
    theirs = dict(official, rotations=official["rotations_xyzw"])
    errors = {}
    for key, value in ours.items():
        diff = (value - theirs[key]).abs()[0]
        if keep is not None:
            diff = diff[keep]
        errors[key] = diff.max().item()
    return errors


def test_parity_gaussians_with_official_neighbours(tiny_model, official, monkeypatch) -> None:
    """Given the official run's neighbour sets, every Gaussian field of every Gaussian matches
    (same count and order) within 1e-4."""
    import models.families.splatweaver_release as module

    recorded = official["knn_index"].long()
    monkeypatch.setattr(module, "exact_knn", lambda points, k: recorded)
    with torch.no_grad():
        out = tiny_model({"image": official["image"]}, routing="argmax", frame="release")
    assert out.gaussians.means.shape == official["means"].shape
    for key, error in _gaussian_errors(out.gaussians, official).items():
        assert error <= TOLERANCE, f"{key}: max abs error {error:.3g}"


def test_parity_gaussians_with_our_exact_knn(tiny_outputs, official) -> None:
    """With our own exact kNN: neighbour sets equal the official exact ones except at near-ties
    (the 9th and 10th distances within 1e-5, where float rounding decides); every Gaussian away
    from such ties matches within 1e-4, the means everywhere."""
    gaussians = tiny_outputs.gaussians
    ours = exact_knn(gaussians.means[0], 9).sort(dim=1).values
    theirs = official["knn_index"].long().sort(dim=1).values
    differs = (ours != theirs).any(dim=1)
    points = official["means"][0].double()
    distances = torch.cdist(points, points).topk(10, largest=False).values
    near_tie = (distances[:, 9] - distances[:, 8]) < 1e-5
    assert not (differs & ~near_tie).any()
    assert differs.sum() <= 0.01 * len(differs)
    errors = _gaussian_errors(gaussians, official, keep=~differs)
    for key, error in errors.items():
        assert error <= TOLERANCE, f"{key}: max abs error {error:.3g}"
    assert _gaussian_errors(gaussians, official)["means"] <= TOLERANCE


def test_exact_knn() -> None:
    """k-d tree (large N) and brute force agree; fewer points than neighbours: self-filled."""
    points = torch.rand(5000, 3, generator=torch.Generator().manual_seed(1))
    tree = exact_knn(points, 9).sort(dim=1).values
    brute = torch.cdist(points.double(), points.double()).topk(9, largest=False).indices
    assert torch.equal(tree, brute.sort(dim=1).values)
    few = exact_knn(torch.rand(3, 3), 9)
    assert few.shape == (3, 9) and torch.equal(few[:, 3:], torch.arange(3)[:, None].expand(3, 6))
    assert exact_knn(torch.zeros(0, 3), 9).shape == (0, 9)


def test_wavelet_matches_pywavelets_layout() -> None:
    """db2 detail bands: PyWavelets' symmetric border and output size (225 for 448 pixels), zero
    on a constant image, and exactly the 2D separable filter bank on an interior sample."""
    image = torch.rand(2, 3, 448, 30, dtype=torch.float64)
    bands = pywt_detail_bands(image)
    assert bands.shape == (2, 3, 225, 16)
    assert pywt_detail_bands(torch.full((1, 3, 20, 20), 0.3)).abs().max() < 1e-6
    lo = torch.tensor(
        [0.48296291314469025, 0.836516303737469, 0.22414386804185735, -0.12940952255092145],
        dtype=torch.float64,
    )
    hi = torch.stack([lo[3], -lo[2], lo[1], -lo[0]])
    gray = 0.299 * image[0, 0] + 0.587 * image[0, 1] + 0.114 * image[0, 2]
    # output (i, j) covers padded rows 2i..2i+3: input rows 2i-2..2i+1 (2 samples of padding)
    i, j = 50, 6
    patch = gray[2 * i - 2 : 2 * i + 2, 2 * j - 2 : 2 * j + 2]
    assert torch.isclose(bands[0, 0, i, j], hi @ patch @ lo)  # LH: high along y, low along x
    assert torch.isclose(bands[0, 1, i, j], lo @ patch @ hi)
    assert torch.isclose(bands[0, 2, i, j], hi @ patch @ hi)


# --------------------------------------------------------------------------- behaviour
def test_routing_modes_and_budget(tiny_model, official) -> None:
    context = {"image": official["image"][..., :28, :28]}  # a smaller crop: six forwards
    with torch.no_grad():
        frozen = tiny_model(context)  # default: frozen_gumbel
        again = tiny_model(context, routing="frozen_gumbel")
        argmax = tiny_model(context, routing="argmax")
        first = tiny_model(context, routing="gumbel")
        second = tiny_model(context, routing="gumbel")
        budget = tiny_model(context, gaussians_per_pixel=0.5)
    assert torch.equal(frozen.gaussians.means, again.gaussians.means)  # deterministic
    assert not torch.equal(frozen.extras["routing_map"], argmax.extras["routing_map"])
    assert not torch.equal(first.extras["routing_map"], second.extras["routing_map"])  # random
    pixels = context["image"][0, :, 0].numel()
    for out in (frozen, argmax, first, budget):
        assert int(out.gaussians.count()[0]) == int(out.extras["routing_map"].sum())
    assert int(budget.gaussians.count()[0]) <= 0.5 * pixels
    assert int(budget.gaussians.count()[0]) >= 0.45 * pixels
    with pytest.raises(ValueError, match="deterministic routing"):
        tiny_model(context, routing="gumbel", gaussians_per_pixel=0.5)
    with pytest.raises(ValueError, match="routing must be"):
        tiny_model(context, routing="softmax")
    with pytest.raises(ValueError, match="multiples of 14"):
        tiny_model({"image": torch.rand(1, 2, 3, 40, 56)})


def test_scene_frame_renders_the_same(tiny_model, official) -> None:
    """``frame="scene"``: view 0 is the identity, the largest camera distance 1, and the scene
    renders the same from the moved cameras as the release-frame scene from the released ones
    (so means, scales, rotations and SH were moved consistently)."""
    context = {"image": official["image"]}
    with torch.no_grad():
        scene = tiny_model(context, routing="argmax")
        release = tiny_model(context, routing="argmax", frame="release")
    c2w = scene.extras["extrinsics"]
    assert torch.allclose(c2w[:, 0], torch.eye(4), atol=1e-5)
    centres = c2w[0, :, :3, 3]
    assert torch.isclose(torch.cdist(centres, centres).max(), torch.tensor(1.0), atol=1e-5)
    size = tuple(official["image"].shape[-2:])
    a = render(scene.gaussians, c2w, scene.extras["intrinsics"], size, backend="torch")
    b = render(
        release.gaussians,
        release.extras["extrinsics"],
        release.extras["intrinsics"],
        size,
        backend="torch",
    )
    assert (a.color - b.color).abs().max() < 1e-3
    assert a.alpha.mean() > 0.05  # the views do see the Gaussians


def test_pretrained_cfg_registered() -> None:
    cfg = get_pretrained_cfg(RELEASED)
    assert cfg is not None and cfg.name == "splatweaver_vggt.official_448"
    assert cfg.file_format == "official" and cfg.hf_hub_id == "Jeasco/SplatWeaver"
    assert cfg.hf_hub_filename == "model.safetensors" and cfg.pose_free
    assert "Apache-2.0" in cfg.license and "not verified here" in cfg.metrics_source


@pytest.fixture(scope="module")
def release_folder(tmp_path_factory, tiny_state) -> Path:
    """The release's Hub layout at the tiny size: model.safetensors (aggregator in bfloat16)
    and its config.json."""
    folder = tmp_path_factory.mktemp("release")
    save_file(tiny_state, folder / "model.safetensors")
    config = {"encoder_cfg": {"name": "splatweaver", "pose_free": True}, "decoder_cfg": {}}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_filter_fn_loads_the_release_file(release_folder, tiny_model) -> None:
    """The pre-loader path: ``load_state_dict(checkpoint_filter_fn(file, model))``."""
    model = create_model(TINY)
    model.load_state_dict(
        checkpoint_filter_fn(load_file(release_folder / "model.safetensors"), model)
    )
    for key, value in model.state_dict().items():
        assert torch.equal(value, tiny_model.state_dict()[key]), key


@pytest.mark.parametrize("which", ["folder", "file"])
def test_create_model_reads_the_release_format(which, release_folder, tiny_model, official) -> None:
    """``create_model(arch, pretrained=<release folder or its model.safetensors>)`` maps the
    release through ``checkpoint_filter_fn``: same weights, same outputs."""
    location = release_folder if which == "folder" else release_folder / "model.safetensors"
    model = create_model(TINY, pretrained=str(location))
    assert not model.training
    for key, value in model.state_dict().items():
        assert torch.equal(value, tiny_model.state_dict()[key]), key
    context = {"image": official["image"][..., :28, :28]}
    with torch.no_grad():
        a = model(context, routing="argmax")
        b = tiny_model(context, routing="argmax")
    assert torch.equal(a.gaussians.means, b.gaussians.means)


def test_create_model_refuses_another_size(release_folder) -> None:
    """The tiny release file for a model of another configuration: one line naming the file."""
    from models.weights.hub import PretrainedError

    with pytest.raises(PretrainedError) as info:
        create_model(TINY, pretrained=str(release_folder), depth=2, out_layers=[0, 1, 1, 1])
    message = str(info.value)
    assert str(release_folder) in message and "\n" not in message


# --------------------------------------------------------------------------- released size
@pytest.mark.slow
def test_parity_released_size() -> None:
    """The released configuration (1.19 B parameters) on deterministic weights, 2 views at 56x70
    (the fixture README says why not 448): cameras, cardinality and Gaussians as above. Peak
    memory ~8 GB: weights are generated once, mapped, and assigned into a meta-built model."""
    path = FIXTURES / "official_outputs_released.safetensors"
    assert path.is_file(), f"{path}: the released-size fixture is committed; it must be there"
    official = load_file(path)
    state = deterministic_state(load_manifest("released"))
    with torch.device("meta"):
        model = create_model(RELEASED)
    mapped = checkpoint_filter_fn(state, model)
    del state
    mapped = {k: v.float() for k, v in mapped.items()}  # assign keeps dtypes: float32 model
    model.load_state_dict(mapped, assign=True)
    del mapped
    reference = create_model(TINY)  # the non-persistent buffers (constants) of the same kind
    buffers = dict(reference.named_buffers())
    for name, buffer in list(model.named_buffers()):
        if buffer.is_meta:
            module_name, _, leaf = name.rpartition(".")
            source = buffers.get(name)
            assert source is not None and source.shape == buffer.shape, name
            model.get_submodule(module_name).register_buffer(leaf, source.clone(), persistent=False)
    model.eval()
    recorded = official["knn_index"].long()
    import models.families.splatweaver_release as module

    original = module.exact_knn
    module.exact_knn = lambda points, k: recorded
    try:
        with torch.no_grad():
            out = model({"image": official["image"]}, routing="argmax", frame="release")
    finally:
        module.exact_knn = original
    for key in ("extrinsics", "intrinsics", "pose_encoding", "depth"):
        assert (out.extras[key] - official[key]).abs().max() <= TOLERANCE, key
    assert torch.equal(out.extras["routing_map"].to(torch.int32), official["cardinality"])
    for key, error in _gaussian_errors(out.gaussians, official).items():
        assert error <= TOLERANCE, f"{key}: max abs error {error:.3g}"


def test_knob_runner_reuses_the_trunk(tiny_model) -> None:
    """The budget knob (models.weights.knobs) re-runs only the experts: the trunk runs once for three
    settings, and each result equals a fresh forward."""
    from models.weights.knobs import KnobRunner

    context = {"image": torch.rand(1, 2, 3, 28, 28, generator=torch.Generator().manual_seed(0))}
    runner = KnobRunner(tiny_model, context)
    assert "aggregator" in runner.reused
    for value in (None, 1.0, 0.25):
        got = runner.run(gaussians_per_pixel=value)
        kwargs = {} if value is None else {"gaussians_per_pixel": value}
        with torch.inference_mode():
            want = tiny_model(context, **kwargs).gaussians
        assert torch.equal(got.means, want.means) and torch.equal(got.harmonics, want.harmonics)
    assert runner.computed["aggregator"] == 1 and runner.forwards == 3
