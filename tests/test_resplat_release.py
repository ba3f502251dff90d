"""ReSplat release port: key manifests of every released file, parity with the official encoder
and recurrent loop on recorded outputs (fixtures/resplat_release/README.md), loading, bad input."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
from pathlib import Path

import pytest
import resplat_release_fixtures as fx
import torch

from models import create_model, get_pretrained_cfg, list_models
from models.families.resplat_release import ReSplatRelease, checkpoint_filter_fn
from models.families.resplat_release_weights import official_key_to_ours, split_fused_qkv
from models.layers.knn import knn
from models.layers.point_transformer import KNNAttention
from models.weights.hub import PretrainedError
from models.weights.knobs import inference_knobs

CONFIGS = fx.list_configs()
INIT_TOLERANCE = 1e-4
ITERATION_TOLERANCE = 1e-3
REDUCED = ("small_64x64_v2", "small_64x64_v4")  # released small architecture, 64x64 inputs


def _meta_model(config: str) -> ReSplatRelease:
    arch, kwargs = fx.arch_of(config)
    with torch.device("meta"):
        return create_model(arch, **kwargs)


def _meta_checkpoint(config: str) -> dict:
    return fx.meta_checkpoint(fx.load_manifest(config))


@functools.cache
def _weights(config: str) -> dict:
    return fx.manifest_weights(fx.load_manifest(config))


def test_every_released_file_is_a_tag() -> None:
    assert len(CONFIGS) == 8
    tags = {".".join((fx.arch_of(c)[0], "")) for c in CONFIGS}
    assert tags == {"resplat_small.", "resplat_base.", "resplat_large."}
    names = set(list_models("resplat_*", pretrained=True)) - {"resplat_tiny.synthetic64"}
    assert len(names) == 8
    for name in names:
        cfg = get_pretrained_cfg(name)
        assert cfg.file_format == "official" and cfg.hf_hub_id == "haofeixu/resplat"
        assert cfg.hf_hub_filename.endswith(f"-{cfg.sha256_prefix}.pth")
        assert "MIT" in cfg.license and "ResNet-18" in cfg.license
        assert ("CC-BY-NC-4.0" in cfg.license) == (not name.startswith("resplat_small")), name
        assert cfg.metrics and "not verified" in cfg.metrics_source
    assert get_pretrained_cfg("resplat_small.dl3dv_256x448_view8").metrics["dl3dv/psnr@4it"] == (
        29.065
    )
    assert [k.name for k in inference_knobs("resplat_small")] == ["iterations", "max_gaussians"]


@pytest.mark.parametrize("config", CONFIGS)
def test_manifest_fully_consumed(config: str) -> None:
    """Every official key maps to distinct tensors of ours with its shape (a kNN attention's
    fused qkv projection to our q and kv rows), and every tensor of ours is filled exactly once
    (meta tensors: no memory)."""
    model = _meta_model(config)
    checkpoint = _meta_checkpoint(config)
    official = checkpoint["state_dict"]
    mapped = checkpoint_filter_fn(checkpoint, model)
    ours = model.state_dict()
    assert set(mapped) == set(ours)
    assert len(official) == fx.load_manifest(config)["num_keys"]
    filled = []
    for key, value in official.items():
        parts = split_fused_qkv(official_key_to_ours(key[len("encoder.") :]), value)
        for name, part in parts.items():
            assert tuple(mapped[name].shape) == tuple(part.shape) == tuple(ours[name].shape)
        rows = sum(part.shape[0] for part in parts.values()) if value.dim() else 0
        assert rows == (value.shape[0] if value.dim() else 0), key
        filled += parts
    assert len(filled) == len(set(filled)) == len(ours)
    knn_layers = sum(isinstance(m, KNNAttention) for m in model.modules())
    assert knn_layers > 0 and len(filled) - len(official) == knn_layers  # one split per layer
    floats = sum(math.prod(t.shape) for t in ours.values() if t.dtype.is_floating_point)
    assert floats == fx.load_manifest(config)["num_parameters"]


def test_filter_rejects_other_sizes_and_other_files() -> None:
    small = _meta_checkpoint("small_dl3dv_256x448_view8")
    with pytest.raises(ValueError, match="shape mismatch"):
        checkpoint_filter_fn(small, _meta_model("base_dl3dv_256x448_view8"))
    with pytest.raises(ValueError, match="recurrent_update=False"):
        checkpoint_filter_fn(_meta_checkpoint("large_dl3dv_256x448_view8"),
                             _meta_model("base_dl3dv_256x448_view8"))  # fmt: skip
    inner = dict(small["state_dict"])
    inner.pop("encoder.update_head.6.bias")
    with pytest.raises(ValueError, match="missing from the file"):
        checkpoint_filter_fn({"state_dict": inner}, _meta_model("small_dl3dv_256x448_view8"))
    depthsplat = {"state_dict": {"encoder.depth_predictor.x": torch.zeros(1),
                                 "encoder.feature_upsampler.y": torch.zeros(1)}}  # fmt: skip
    with pytest.raises(ValueError, match="not a ReSplat"):
        checkpoint_filter_fn(depthsplat, _meta_model("small_dl3dv_256x448_view8"))
    with pytest.raises(ValueError, match="outside 'encoder.'"):
        checkpoint_filter_fn({"state_dict": {**small["state_dict"], "decoder.x": torch.zeros(1)}},
                             _meta_model("small_dl3dv_256x448_view8"))  # fmt: skip


# --------------------------------------------------------------------------- parity
@functools.cache
def _loaded(config: str) -> ReSplatRelease:
    arch, kwargs = fx.arch_of(config)
    model = create_model(arch, **kwargs)
    model.load_state_dict(checkpoint_filter_fn(_weights(config), model), strict=True)
    return model.eval()


def _tag_params(tags):
    return [
        pytest.param(t) if t in REDUCED else pytest.param(t, marks=pytest.mark.slow) for t in tags
    ]


@pytest.mark.parametrize("tag", _tag_params(fx.list_official_samples()))
def test_parity_with_official_encoder_and_loop(tag: str) -> None:
    """Initial Gaussians to 1e-4 and each recurrent iteration to 1e-3 on every field, against
    the official code run on the same weights and inputs (its renders through models.render)."""
    meta, _ = fx.load_official_sample(tag)
    errors = fx.parity_errors(tag, _loaded(meta["config"]))
    assert len(errors) == 1 + meta["iterations"]
    for i, e in enumerate(errors):
        limit = INIT_TOLERANCE if i == 0 else ITERATION_TOLERANCE
        bad = {k: v for k, v in e.items() if not v <= limit}
        assert not bad, f"{tag} iteration {i}: {e}"


def test_reduced_fixtures_exist() -> None:
    samples = set(fx.list_official_samples())
    assert set(REDUCED) <= samples
    assert "re10k_256x256_v2" in samples  # a released configuration at its released size


@pytest.mark.slow
def test_parity_detects_a_changed_update_weight() -> None:
    """The comparison can fail: a perturbed update-head layer leaves the initial set alone and
    moves the iterations far beyond the tolerance."""
    config = "small_dl3dv_256x448_view8"
    model = create_model(*[fx.arch_of(config)[0]], **fx.arch_of(config)[1])
    model.load_state_dict(checkpoint_filter_fn(_weights(config), model))
    with torch.no_grad():
        model.update_head[-1].bias.add_(0.01)
    errors = fx.parity_errors("small_64x64_v2", model)
    assert max(errors[0].values()) <= INIT_TOLERANCE
    assert errors[1]["means"] > 5e-3


# --------------------------------------------------------------------------- loading files
@pytest.fixture(scope="module")
def small_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("resplat_files") / "small.pth"
    torch.save(_weights("small_dl3dv_256x448_view8"), path)
    return path


def test_create_model_from_official_file(small_file: Path) -> None:
    model = create_model("resplat_small", pretrained=str(small_file))
    official = _weights("small_dl3dv_256x448_view8")["state_dict"]
    reference = checkpoint_filter_fn({"state_dict": official}, model)
    state = model.state_dict()
    for key, value in state.items():
        assert torch.equal(value, reference[key]), key
    # the fused kNN projection's rows: queries, then keys and values
    for fused in ("pt.blocks.2", "update_module.1.blocks.3"):
        qkv = official[f"encoder.{fused.replace('pt.blocks.2', 'pt.blocks.1')}.attn.qkv.weight"]
        rows = torch.cat([state[f"{fused}.attn.q.weight"], state[f"{fused}.attn.kv.weight"]])
        assert torch.equal(rows, qkv), fused
    assert not model.training


def test_tag_path_downloads_checks_sha_and_loads(small_file: Path, tmp_path: Path,
                                                 monkeypatch) -> None:  # fmt: skip
    """``create_model('resplat_small.dl3dv_256x448_view8', pretrained=True)`` through the Hub
    cache (offline), with the tag's sha256 prefix pointed at our generated file."""
    import models.weights.registry as cfg_module

    name = "resplat_small.dl3dv_256x448_view8"
    cfg = get_pretrained_cfg(name)
    data = small_file.read_bytes()
    sha = hashlib.sha256(data).hexdigest()[:8]
    monkeypatch.setitem(cfg_module._pretrained_cfgs, name,
                        dataclasses.replace(cfg, sha256_prefix=sha))  # fmt: skip
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "cache" / "models--haofeixu--resplat"
    revision = "0" * 40
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(revision)
    (folder / "snapshots" / revision).mkdir(parents=True)
    (folder / "snapshots" / revision / cfg.hf_hub_filename).write_bytes(data)
    model = create_model(name, pretrained=True)
    assert model.pretrained_cfg.name == name and model.iterations == 2
    torch.testing.assert_close(
        model.update_head[-1].bias, _weights("small_dl3dv_256x448_view8")["state_dict"][
            "encoder.update_head.6.bias"]
    )  # fmt: skip


def test_bad_files_are_one_line(small_file: Path, tmp_path: Path) -> None:
    with pytest.raises(PretrainedError) as info:  # the small file into another size
        create_model("resplat_release_tiny", pretrained=str(small_file))
    assert str(small_file) in str(info.value) and "\n" not in str(info.value)
    assert "another ReSplat size" in str(info.value)
    cut = tmp_path / "cut.pth"
    cut.write_bytes(small_file.read_bytes()[:100_000])
    with pytest.raises(PretrainedError) as info:
        create_model("resplat_small", pretrained=str(cut))
    assert str(cut) in str(info.value) and "\n" not in str(info.value)
    wrong = tmp_path / "wrong.pth"
    torch.save({"state_dict": {"encoder.proj.weight": torch.zeros(2, 2)}}, wrong)
    with pytest.raises(PretrainedError) as info:
        create_model("resplat_small", pretrained=str(wrong))
    assert "not a ReSplat" in str(info.value) and "\n" not in str(info.value)


# --------------------------------------------------------------------------- knobs, budget, kNN
def _tiny_context(v: int = 2, size: int = 64) -> dict:
    return fx.make_context(size, size, v, near=0.01, far=200.0)


def test_tiny_iterations_knob_and_every_iteration() -> None:
    torch.manual_seed(0)
    model = create_model("resplat_release_tiny").eval()
    with torch.no_grad():
        torch.nn.init.normal_(model.update_head[-1].weight, std=1e-3)
        out0 = model(_tiny_context(), iterations=0)
        out2 = model(_tiny_context(), iterations=2)
    assert len(out0.extras["gaussians_per_iteration"]) == 1
    sets = out2.extras["gaussians_per_iteration"]
    assert len(sets) == 3 and out2.extras["iterations"] == 2
    torch.testing.assert_close(sets[0].means, out0.gaussians.means)
    assert sets[0].means.shape == (1, 2 * 16 * 16, 3) and sets[0].harmonics.shape[-1] == 16
    assert not torch.equal(sets[1].means, sets[2].means)
    assert out2.gaussians is sets[2]
    with pytest.raises(ValueError, match="iterations"):
        model(_tiny_context(), iterations=-1)


def test_view_count_over_budget_fails_before_work() -> None:
    model = create_model("resplat_release_tiny", memory_budget_gb=1.5).eval()
    fit = model.max_views(64, 64)
    assert fit >= 2
    calls = []
    model.depth_predictor.register_forward_pre_hook(lambda *a: calls.append(1))
    with pytest.raises(ValueError, match=f"at most {fit} view") as info:
        model(_tiny_context(v=fit + 1))
    assert "\n" not in str(info.value) and not calls
    with pytest.raises(ValueError, match="multiples of"):
        model(_tiny_context(size=48))


def test_large_has_no_update() -> None:
    model = _meta_model("large_dl3dv_256x448_view8")
    assert not model.recurrent_update and model.iterations == 0


@pytest.mark.parametrize("method", ["cdist", "kdtree"])
def test_knn_exact_against_brute_force(method: str) -> None:
    g = torch.Generator().manual_seed(3)
    points = torch.randn(2, 500, 3, generator=g)
    ref = torch.cdist(points.double(), points.double()).topk(8, largest=False).indices
    got = knn(points, 8, method=method, max_elements=5000)  # many small blocks
    assert got.shape == (2, 500, 8)
    assert torch.equal(got.sort(-1).values, ref.sort(-1).values)
    assert torch.equal(got[..., 0], torch.arange(500).expand(2, 500))
    with pytest.raises(ValueError, match="k=501"):
        knn(points, 501)


def test_knob_runner_reuses_the_depth_trunk() -> None:
    from models.weights.knobs import KnobRunner

    model = create_model("resplat_release_tiny").eval()
    context = _tiny_context()
    calls = []
    model.depth_predictor.cnn.register_forward_hook(lambda *a: calls.append(1))
    runner = KnobRunner(model, context)
    runner.run(iterations=0)
    got = runner.run(iterations=2)
    assert len(calls) == 1  # the second run reused the trunk's output
    with torch.no_grad():
        reference = model(context, iterations=2)
    assert torch.equal(got.means, reference.gaussians.means)
