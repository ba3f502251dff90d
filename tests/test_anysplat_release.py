"""AnySplat's released architecture (``anysplat_vggt*``): key manifests, checkpoint mapping (with
and without the distillation copies), numerical parity with the official code (recorded
fixtures) at four voxel sizes, the voxel merge, the scene frame, the release file's loading and
its refusal of bad files.

Fixtures (``tests/fixtures/anysplat/``, see its README): key manifests of the official model at
the released and tiny configurations, and the official outputs of the tiny configuration on
deterministic weights (``splatweaver_release_weights.deterministic_state``, a hash of key and
element index).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from splatweaver_release_weights import deterministic_state

from models import create_model, render
from models.core.sh import eval_sh, sh_rotation
from models.families.anysplat import (
    DISTILL_PREFIXES,
    DROPPED_KEYS,
    AnySplatRelease,
    checkpoint_filter_fn,
    voxel_merge,
)
from models.geometry.rotations import quaternion_to_matrix
from models.weights.hub import PretrainedError
from models.weights.knobs import inference_knobs
from models.weights.registry import get_pretrained_cfg

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "anysplat"
TINY = "anysplat_vggt_tiny"
RELEASED = "anysplat_vggt"
TOLERANCE = 1e-4
# fixture tag -> voxel size (0: the release's voxelize=false path, one Gaussian per pixel)
VOXELS = {"v0p002": 0.002, "v0p02": 0.02, "v0p05": 0.05, "v0": 0.0}


def load_manifest(name: str) -> dict:
    return json.loads((FIXTURES / f"manifest_{name}.json").read_text())


def _without_distill(state: dict) -> dict:
    return {k: v for k, v in state.items() if not k.startswith(DISTILL_PREFIXES)}


@pytest.fixture(scope="module")
def tiny_state() -> dict[str, torch.Tensor]:
    """The tiny release file's tensors, distillation copies included (as the training config
    saves them)."""
    return deterministic_state(load_manifest("tiny"))


@pytest.fixture(scope="module")
def official() -> dict[str, torch.Tensor]:
    return load_file(FIXTURES / "official_outputs_tiny.safetensors")


@pytest.fixture(scope="module")
def tiny_model(tiny_state) -> AnySplatRelease:
    model = create_model(TINY).eval()
    model.load_state_dict(checkpoint_filter_fn(tiny_state, model))
    return model


# --------------------------------------------------------------------------- manifests
@pytest.mark.parametrize("distill", [True, False], ids=["with_distill", "without_distill"])
@pytest.mark.parametrize("config, name", [("tiny", TINY), ("released", RELEASED)])
def test_filter_consumes_every_key(config: str, name: str, distill: bool) -> None:
    """Every official key is consumed (``DROPPED_KEYS`` and the distillation copies dropped) and
    every parameter of ours is filled with the right shape (meta device: no memory)."""
    manifest = load_manifest(config)
    with torch.device("meta"):
        model = create_model(name)
        state = {
            k: torch.empty(e["shape"], dtype=getattr(torch, e["dtype"]))
            for k, e in manifest["tensors"].items()
        }
    if not distill:
        state = _without_distill(state)
    mapped = checkpoint_filter_fn(state, model)
    targets = model.state_dict()
    assert set(mapped) == set(targets)
    for key, value in mapped.items():
        assert tuple(value.shape) == tuple(targets[key].shape), key
    copies = [k for k in manifest["tensors"] if k.startswith(DISTILL_PREFIXES)]
    assert len(mapped) + len(DROPPED_KEYS) + len(copies) == manifest["num_tensors"]
    ours = sum(t.numel() for t in targets.values())
    others = [*DROPPED_KEYS, *copies]
    dropped = sum(torch.Size(manifest["tensors"][k]["shape"]).numel() for k in others)
    assert ours + dropped == manifest["num_parameters"]


def test_released_manifest_facts() -> None:
    """The official module at the released configuration: 1.19 B parameters without the
    distillation copies, the aggregator's 1,210 tensors bfloat16, the heads float32; the copies
    mirror the aggregator, camera and depth heads."""
    manifest = load_manifest("released")
    assert manifest["commit"] == "57937e4"
    dtypes = {k: e["dtype"] for k, e in manifest["tensors"].items()}
    copies = [k for k in dtypes if k.startswith(DISTILL_PREFIXES)]
    kept = [k for k in dtypes if k not in copies]
    shapes = {k: e["shape"] for k, e in manifest["tensors"].items()}
    assert round(sum(torch.Size(shapes[k]).numel() for k in kept) / 1e9, 2) == 1.19
    aggregator = [k for k in kept if k.startswith("encoder.aggregator.")]
    assert len(aggregator) == 1210 and all(dtypes[k] == "bfloat16" for k in aggregator)
    heads = ("encoder.camera_head.", "encoder.depth_head.", "encoder.gaussian_param_head.")
    rest = [k for k in kept if k not in aggregator]
    assert rest and all(k.startswith(heads) and dtypes[k] == "float32" for k in rest)
    for key in copies:
        original = key.replace("encoder.distill_", "encoder.", 1)
        assert shapes[original] == shapes[key] and dtypes[original] == dtypes[key]


def test_filter_rejects_other_files(tiny_state) -> None:
    model = create_model(TINY)
    with pytest.raises(ValueError, match="not an AnySplat release checkpoint"):
        checkpoint_filter_fn({"backbone.weight": torch.zeros(1)}, model)
    with pytest.raises(ValueError, match="expected a dict of tensors"):
        checkpoint_filter_fn({"state_dict": {"a": 1}}, model)
    released = load_manifest("released")
    with torch.device("meta"):
        big = {k: torch.empty(e["shape"]) for k, e in released["tensors"].items()}
    with pytest.raises(ValueError, match="does not have") as info:
        checkpoint_filter_fn(big, model)  # the released file into the tiny model
    assert "\n" not in str(info.value)
    partial = dict(tiny_state)
    partial.pop("encoder.depth_head.norm.weight")
    with pytest.raises(ValueError, match="1 weight"):
        checkpoint_filter_fn(partial, model)
    for extra in ("encoder.gaussian_param_head.unknown.weight", "encoder.distill_other.weight"):
        with pytest.raises(ValueError, match="does not have"):
            checkpoint_filter_fn({**tiny_state, extra: torch.zeros(2)}, model)
    wrapped = checkpoint_filter_fn({"state_dict": tiny_state}, model)
    assert wrapped.keys() == model.state_dict().keys()


# --------------------------------------------------------------------------- parity
def test_parity_cameras_and_depth(tiny_model, official) -> None:
    with torch.no_grad():
        out = tiny_model({"image": official["image"]}, frame="release")
    for key in ("extrinsics", "intrinsics", "pose_encoding", "depth"):
        error = (out.extras[key] - official[key]).abs().max().item()
        assert error <= TOLERANCE, f"{key}: max abs error {error:.3g}"


# A pixel whose point lies within this fraction of a voxel side from a voxel boundary may land in
# either voxel: the points agree to ~1e-7 (float32), i.e. up to 6e-5 voxel sides at 0.002.
AMBIGUOUS = 1e-3


def _voxel_rows(points: torch.Tensor, voxel: float) -> tuple[torch.Tensor, dict]:
    """Voxel keys of per-pixel points ``[N, 3]`` (as the release computes them, float32) and
    ``{key: row}`` in the merged output's order (keys sorted)."""
    keys = torch.round(points / voxel).int()
    rows = {tuple(k): i for i, k in enumerate(torch.unique(keys, dim=0).tolist())}
    return keys, rows


def _matched(ours_points, official_points, voxel: float) -> tuple[dict, dict, int]:
    """Rows of the voxels that no near-boundary pixel touches, on both sides (``{key: row}``),
    and how many pixels are near a boundary."""
    if voxel == 0:
        rows = {(i,): i for i in range(len(official_points))}
        return rows, rows, 0
    near = torch.zeros(len(official_points), dtype=torch.bool)
    for points in (ours_points, official_points):
        x = points.double() / voxel
        near |= ((x - x.floor() - 0.5).abs() < AMBIGUOUS).any(dim=-1)
    keys_ours, rows_ours = _voxel_rows(ours_points, voxel)
    keys_official, rows_official = _voxel_rows(official_points, voxel)
    excluded = {tuple(k) for k in keys_ours[near].tolist() + keys_official[near].tolist()}
    ours = {k: r for k, r in rows_ours.items() if k not in excluded}
    official = {k: r for k, r in rows_official.items() if k not in excluded}
    return ours, official, int(near.sum())


@pytest.fixture(scope="module")
def pixel_points(tiny_model, official) -> torch.Tensor:
    """Our per-pixel points ``[N, 3]`` (release frame, pixel order)."""
    with torch.no_grad():
        out = tiny_model({"image": official["image"]}, voxel_size=0.0, frame="release")
    return out.extras["points"].reshape(-1, 3)


def _compare(
    out, official: dict, tag: str, voxel: float, pixel_points: torch.Tensor
) -> dict[str, float]:
    """The same voxels in the same order (voxel index) and every field within 1e-4: all
    Gaussians' means and opacities, the fixture's fixed subset of 256 for scales, rotations and
    SH (degree 4). Voxels touched by a pixel within ``AMBIGUOUS`` of a voxel boundary are left
    out (float rounding may put it on either side on another CPU); they are few. Returns the
    max abs error per field."""
    g = out.gaussians
    official_points = official["v0.means"][0]  # the release's per-pixel points (no merge)
    assert (pixel_points - official_points).abs().max() <= TOLERANCE
    ours, theirs, near = _matched(pixel_points, official_points, voxel)
    assert ours.keys() == theirs.keys() and len(ours) >= 0.9 * g.num_slots
    assert abs(g.num_slots - official[f"{tag}.means"].shape[1]) <= near
    keys = sorted(ours)
    mine = torch.tensor([ours[k] for k in keys])
    other = torch.tensor([theirs[k] for k in keys])
    sampled = {int(r): i for i, r in enumerate(official[f"{tag}.index"])}
    subset = [(ours[k], sampled[theirs[k]]) for k in keys if theirs[k] in sampled]
    assert len(subset) >= 200
    a, b = (torch.tensor(s) for s in zip(*subset))
    pairs = {
        "means": (g.means[0, mine], official[f"{tag}.means"][0, other]),
        "opacities": (g.opacities[0, mine], official[f"{tag}.opacities"][0, other]),
        "scales": (g.scales[0, a], official[f"{tag}.scales"][0, b]),
        "rotations": (
            g.rotations[0, a][..., [1, 2, 3, 0]],
            official[f"{tag}.rotations_xyzw"][0, b],
        ),
        "harmonics": (g.harmonics[0, a], official[f"{tag}.harmonics"][0, b]),
    }
    errors = {}
    for key, (mine_values, theirs_values) in pairs.items():
        errors[key] = (mine_values - theirs_values).abs().max().item()
        assert errors[key] <= TOLERANCE, f"{key}: max abs error {errors[key]:.3g}"
    expected = g.num_slots / official["image"][0, :, 0].numel()
    assert out.extras["voxel_ratio"].item() == pytest.approx(expected)
    return errors


@pytest.mark.parametrize("tag", list(VOXELS))
def test_parity_gaussians(tiny_model, official, pixel_points, tag: str) -> None:
    with torch.no_grad():
        out = tiny_model({"image": official["image"]}, voxel_size=VOXELS[tag], frame="release")
    _compare(out, official, tag, VOXELS[tag], pixel_points)


@pytest.mark.slow
def test_parity_released_size() -> None:
    """The released configuration (1.19 B parameters) on deterministic weights, 2 views at 56x70
    (the fixture README says why not 448): cameras, depth and Gaussians at voxel sizes 0.002,
    0.05 and 0 as above. Weights generated without the distillation copies, mapped, and assigned
    into a meta-built model (peak ~6 GB)."""
    official = load_file(FIXTURES / "official_outputs_released.safetensors")
    manifest = load_manifest("released")
    tensors = {k: e for k, e in manifest["tensors"].items() if not k.startswith(DISTILL_PREFIXES)}
    state = deterministic_state({"tensors": tensors})
    with torch.device("meta"):
        model = create_model(RELEASED)
    mapped = checkpoint_filter_fn(state, model)
    del state
    model.load_state_dict({k: v.float() for k, v in mapped.items()}, assign=True)
    del mapped
    buffers = dict(create_model(TINY).named_buffers())  # non-persistent constants, same kind
    for name, buffer in list(model.named_buffers()):
        if buffer.is_meta:
            module_name, _, leaf = name.rpartition(".")
            assert name in buffers and buffers[name].shape == buffer.shape, name
            module = model.get_submodule(module_name)
            module.register_buffer(leaf, buffers[name].clone(), persistent=False)
    model.eval()
    context = {"image": official["image"]}
    with torch.no_grad():
        per_pixel = model(context, voxel_size=0.0, frame="release")
    for key in ("extrinsics", "intrinsics", "pose_encoding", "depth"):
        error = (per_pixel.extras[key] - official[key]).abs().max().item()
        print(f"released size, {key}: max abs error {error:.2g}")  # shown with -s
        assert error <= TOLERANCE, f"{key}: max abs error {error:.3g}"
    points = per_pixel.extras["points"].reshape(-1, 3)
    for tag, voxel in (("v0p002", 0.002), ("v0p05", 0.05), ("v0", 0.0)):
        with torch.no_grad():
            out = model(context, voxel_size=voxel, frame="release")
        errors = _compare(out, official, tag, voxel, points)
        count = (out.gaussians.num_slots, official[f"{tag}.means"].shape[1])
        print(f"released size, voxel {voxel:g}, Gaussians {count}:", errors)


def test_fixture_merges_at_coarse_voxels(official) -> None:
    """The fixtures exercise the merge: 0.02 and 0.05 merge pixels, 0.002 and 0 do not."""
    pixels = official["image"][0, :, 0].numel()
    counts = {tag: official[f"{tag}.means"].shape[1] for tag in VOXELS}
    assert counts["v0"] == counts["v0p002"] == pixels
    assert pixels > counts["v0p02"] > counts["v0p05"] > 0


# --------------------------------------------------------------------------- the merge
def test_voxel_merge_against_a_loop() -> None:
    """Softmax-weighted averages per voxel (the release's ``exp(c - max) / (sum + 1e-6)``),
    voxels in lexicographic order of their index, gradients reaching points, features and
    weights."""
    g = torch.Generator().manual_seed(3)
    points = (torch.rand(300, 3, generator=g, dtype=torch.float64) * 0.1).requires_grad_()
    features = torch.randn(300, 5, generator=g, dtype=torch.float64, requires_grad=True)
    weights = torch.randn(300, generator=g, dtype=torch.float64, requires_grad=True)
    merged_points, merged = voxel_merge(points, features, weights, 0.03)
    keys = torch.round(points.detach() / 0.03).int()
    voxels = sorted({tuple(k) for k in keys.tolist()})
    assert merged.shape == (len(voxels), 5)
    for row, voxel in enumerate(voxels):
        inside = (keys == torch.tensor(voxel, dtype=torch.int32)).all(dim=1)
        w = torch.exp(weights[inside] - weights[inside].max())
        w = w / (w.sum() + 1e-6)
        assert torch.allclose(merged_points[row], (points[inside] * w[:, None]).sum(0))
        assert torch.allclose(merged[row], (features[inside] * w[:, None]).sum(0))
    (merged_points.sum() + merged.sum()).backward()
    for tensor in (points, features, weights):
        assert tensor.grad is not None and tensor.grad.abs().sum() > 0


def test_voxel_size_knob(tiny_model) -> None:
    """Declared as an inference knob with the release's default; larger voxels, fewer
    Gaussians; the trunk is knob-free; a negative size is refused."""
    knobs = {k.name: k for k in inference_knobs(tiny_model)}
    assert set(knobs) == {"voxel_size", "max_gaussians"}
    assert knobs["voxel_size"].default(tiny_model) == 0.002
    context = {"image": torch.rand(1, 2, 3, 28, 28, generator=torch.Generator().manual_seed(0))}
    counts = []
    with torch.no_grad():
        for size in (0.0, 0.01, 0.05, 0.2):
            counts.append(int(tiny_model(context, voxel_size=size).gaussians.count()[0]))
        pruned = tiny_model(context, voxel_size=0.0, max_gaussians=100)
    assert counts[0] == 2 * 28 * 28 and counts == sorted(counts, reverse=True)
    assert counts[-1] < counts[0]
    assert int(pruned.gaussians.count()[0]) == 100
    with pytest.raises(ValueError, match="voxel_size"):
        tiny_model(context, voxel_size=-1.0)
    with pytest.raises(ValueError, match="multiples of 14"):
        tiny_model({"image": torch.rand(1, 2, 3, 40, 56)})


def test_scene_frame_renders_the_same(tiny_model, official) -> None:
    """``frame="scene"``: view 0 the identity, the largest camera distance 1, and the same
    rendering from the moved cameras as the release-frame scene from the released ones (SH
    degree 4 rotated too)."""
    context = {"image": official["image"]}
    with torch.no_grad():
        scene = tiny_model(context, voxel_size=0.0)
        release = tiny_model(context, voxel_size=0.0, frame="release")
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
    assert (a.color - b.color).abs().max() < 1e-4  # observed 3e-6
    assert a.alpha.mean() > 0.05


def test_sh_rotation_convention() -> None:
    """``D = sh_rotation(R, 4)`` (what moves the releases' Gaussians into the scene frame): coefficients ``D c`` (rows: ``c @ D.T``) seen along
    ``d`` equal ``c`` along ``R^T d``; ``D`` is orthogonal and block-diagonal by band."""
    g = torch.Generator().manual_seed(5)
    q = torch.nn.functional.normalize(torch.randn(4, generator=g, dtype=torch.float64), dim=0)
    rotation = quaternion_to_matrix(q)
    d = sh_rotation(rotation, 4)
    coefficients = torch.randn(7, 3, 25, generator=g, dtype=torch.float64)
    directions = torch.nn.functional.normalize(
        torch.randn(7, 3, generator=g, dtype=torch.float64), dim=-1
    )
    moved = eval_sh(coefficients @ d.T, directions)
    assert torch.allclose(moved, eval_sh(coefficients, directions @ rotation), atol=1e-10)
    assert torch.allclose(d @ d.T, torch.eye(25, dtype=torch.float64), atol=1e-10)
    assert d[16:, :16].abs().max() < 1e-10 and d[:16, 16:].abs().max() < 1e-10


def test_batch_of_two_scenes_pads(tiny_model, official) -> None:
    """Two scenes with different voxel counts: padded with a mask, each equal to its own run."""
    image = official["image"][..., :28, :28]
    other = image.flip(-1)
    with torch.no_grad():
        both = tiny_model({"image": torch.cat([image, other])}, voxel_size=0.05, frame="release")
        one = tiny_model({"image": image}, voxel_size=0.05, frame="release")
    counts = both.gaussians.count()
    assert int(counts[0]) == int(one.gaussians.count()[0])
    n = int(counts[0])
    assert torch.allclose(both.gaussians.means[0, :n], one.gaussians.means[0], atol=1e-5)


# --------------------------------------------------------------------------- the release file
def test_pretrained_cfg_registered() -> None:
    cfg = get_pretrained_cfg(RELEASED)
    assert cfg is not None and cfg.name == "anysplat_vggt.official_448"
    assert cfg.file_format == "official" and cfg.hf_hub_id == "lhjiang/anysplat"
    assert cfg.hf_hub_filename == "model.safetensors" and cfg.pose_free
    assert "MIT" in cfg.license and "non-commercial" in cfg.license
    assert cfg.recipe.image_size == (448, 448) and cfg.recipe.multiple == 14
    assert "57937e4" in cfg.recipe.source


@pytest.fixture(scope="module", params=["with_distill", "without_distill"])
def release_folder(request, tmp_path_factory, tiny_state) -> Path:
    """The release's Hub layout at the tiny size: model.safetensors (aggregator bfloat16), with
    or without the distillation copies, and its config.json."""
    folder = tmp_path_factory.mktemp(request.param)
    state = tiny_state if request.param == "with_distill" else _without_distill(tiny_state)
    save_file(state, folder / "model.safetensors")
    config = {"encoder_cfg": {"name": "anysplat", "voxel_size": 0.002}, "decoder_cfg": {}}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("which", ["folder", "file"])
def test_create_model_reads_the_release_format(which, release_folder, tiny_model) -> None:
    location = release_folder if which == "folder" else release_folder / "model.safetensors"
    model = create_model(TINY, pretrained=str(location))
    assert not model.training
    for key, value in model.state_dict().items():
        assert torch.equal(value, tiny_model.state_dict()[key]), key


def _refused(path: Path) -> str:
    with pytest.raises(PretrainedError) as info:
        create_model(TINY, pretrained=str(path))
    message = str(info.value)
    assert str(path) in message and "\n" not in message
    return message


def test_create_model_refuses_bad_files(tmp_path: Path, tiny_state) -> None:
    """Another format, a truncated file, another architecture's file, an unknown key, a pickle
    payload: one line naming the file, nothing executed."""
    text = tmp_path / "notes.safetensors"
    text.write_text("not a tensor file")
    _refused(text)
    whole = tmp_path / "whole.safetensors"
    save_file(tiny_state, whole)
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(whole.read_bytes()[:5000])
    _refused(cut)
    other = tmp_path / "other.safetensors"
    save_file({"encoder.depth_predictor.weight": torch.zeros(2)}, other)
    _refused(other)
    unknown = tmp_path / "unknown.safetensors"
    save_file({**tiny_state, "encoder.point_head.norm.weight": torch.zeros(2)}, unknown)
    assert "does not have" in _refused(unknown)
    evil = tmp_path / "evil.pth"
    marker = tmp_path / "executed"
    torch.save({"state_dict": {}, "hook": functools.partial(marker.write_text, "x")}, evil)
    _refused(evil)
    assert not marker.exists()
