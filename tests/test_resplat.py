"""ReSplat (models/families/resplat.py) and its frozen feature extractor
(models/layers/feature_extractor.py)."""

from __future__ import annotations

import logging

import pytest
import timm
import torch
from safetensors.torch import save_file

from models import create_model, list_models, render
from models.families.resplat import ReSplat, decode_gaussians, encode_gaussians
from models.layers.feature_extractor import FrozenFeatureExtractor
from models.training.recipes import ReSplatTrainingRecipe
from models.weights.hub import PretrainedError, model_config

SIZE = 32  # images of the tests: 32x32 -> an 8x8 latent grid per view


pytestmark = pytest.mark.usefixtures("one_thread")


def _context(batch: int = 1, views: int = 2, size: int = SIZE) -> dict[str, torch.Tensor]:
    extrinsics = torch.eye(4).repeat(batch, views, 1, 1)
    extrinsics[:, :, 0, 3] = torch.linspace(0.0, 1.0, views)  # a sideways baseline of 1
    intrinsics = torch.tensor([[1.0, 0.0, 0.5], [0.0, 1.0, 0.5], [0.0, 0.0, 1.0]])
    return {
        "image": torch.rand(batch, views, 3, size, size),
        "extrinsics": extrinsics,
        "intrinsics": intrinsics.repeat(batch, views, 1, 1),
        "near": torch.full((batch, views), 0.5),
        "far": torch.full((batch, views), 20.0),
    }


def _model(**overrides) -> ReSplat:
    return create_model("resplat_tiny", image_size=SIZE, **overrides)


@pytest.fixture(scope="module")
def fresh() -> ReSplat:
    """A freshly initialised model (its update is the zero-initialised one); tests don't mutate it."""
    torch.manual_seed(0)
    return _model()


@pytest.fixture(scope="module")
def trained_like() -> ReSplat:
    """A model whose update is non-zero, like one after some training."""
    torch.manual_seed(1)
    model = _model()
    _perturb_update(model, std=0.02)
    return model


def _perturb_update(model: ReSplat, std: float = 0.05) -> None:
    """Give the zero-initialised delta layer non-zero weights (a model after some training)."""
    with torch.no_grad():
        model.updater.delta[-1].weight.normal_(0.0, std)
        model.updater.delta[-1].bias.normal_(0.0, std)


def _render_loss(gaussians, context) -> torch.Tensor:
    out = render(gaussians, context["extrinsics"], context["intrinsics"], (SIZE, SIZE))
    return (out.color - context["image"]).square().mean()


def test_registry(fresh: ReSplat) -> None:
    assert {"resplat_tiny", "resplat_vit_small", "resplat_vit_base"} <= set(
        list_models(family="resplat")
    )
    assert fresh.family == "resplat" and not fresh.pose_free
    config = model_config(fresh, "resplat_tiny")
    assert config["init_checkpoint"] is None and config["iterations"] == 2


def test_encode_decode_round_trip(fresh: ReSplat) -> None:
    model = fresh
    with torch.no_grad():
        g = model(_context(), iterations=0).gaussians
    back = decode_gaussians(encode_gaussians(g), model.sh_degree)
    for key in ("means", "scales", "rotations", "opacities", "harmonics"):
        torch.testing.assert_close(getattr(back, key), getattr(g, key), rtol=1e-5, atol=1e-6)


def test_zero_initialised_update_leaves_gaussians_unchanged(fresh: ReSplat) -> None:
    model = fresh
    model.zero_grad(set_to_none=True)
    context = _context()
    pred = model(context, iterations=3)
    per_iteration = pred.extras["gaussians_per_iteration"]
    assert len(per_iteration) == 4
    init = per_iteration[0]
    for g in per_iteration[1:]:
        for key in ("means", "scales", "rotations", "opacities", "harmonics"):
            torch.testing.assert_close(getattr(g, key), getattr(init, key), rtol=1e-5, atol=1e-6)
    # ...but the update can learn: its zero-initialised last layer receives a gradient.
    _render_loss(pred.gaussians, context).backward()
    grad = model.updater.delta[-1].weight.grad
    assert grad is not None and grad.abs().sum() > 0
    model.zero_grad(set_to_none=True)


def test_error_features_zero_when_render_equals_input(fresh: ReSplat) -> None:
    model = fresh
    images = torch.rand(2, 3, 3, SIZE, SIZE)
    error = model.error_features(images.clone(), images)
    channels = model.extractor.out_channels + 48
    assert error.shape == (2, 3, channels, SIZE // 4, SIZE // 4)
    assert torch.count_nonzero(error) == 0
    other = model.error_features((images + 0.1).clamp(0, 1), images)
    assert other.abs().amax() > 1e-3
    # The RGB part is exactly the pixel-unshuffled difference: view 0, channel 0 = pixel (0, 0).
    diff = (images + 0.1).clamp(0, 1) - images
    torch.testing.assert_close(
        other[:, :, model.extractor.out_channels], diff[:, :, 0, ::4, ::4], rtol=0, atol=1e-7
    )


def test_detach_semantics(trained_like: ReSplat) -> None:
    """Iteration i+1 reaches iteration i's parameters only through the hidden state."""
    model = trained_like
    context = _context()
    pred = model(context, iterations=2)
    g0, g1, g2 = pred.extras["gaussians_per_iteration"]
    assert (g2.means - g1.means).abs().amax() > 0, "the perturbed update must move the Gaussians"
    loss = _render_loss(g2, context) + g2.means.square().mean()
    earlier = [getattr(g, key) for g in (g0, g1) for key in ("means", "scales", "opacities")]
    assert all(
        grad is None
        for grad in torch.autograd.grad(loss, earlier, retain_graph=True, allow_unused=True)
    )

    named = dict(model.named_parameters())
    head = [named[n] for n in named if n.startswith("init_model.head.")]
    state = [named[n] for n in named if n.startswith("init_model.points.blocks.0.")]
    grads = torch.autograd.grad(loss, head + state, allow_unused=True)
    # The head only makes iteration 0's parameters (detached): no gradient from iteration 2.
    assert all(g is None or g.abs().sum() == 0 for g in grads[: len(head)])
    # The point transformer makes the initial hidden state: gradient flows through the state.
    assert any(g is not None and g.abs().sum() > 0 for g in grads[len(head) :])


@pytest.mark.parametrize("views", [2, 4])
def test_forward_backward_cpu(trained_like: ReSplat, views: int) -> None:
    model = trained_like
    model.zero_grad(set_to_none=True)
    context = _context(batch=2, views=views)
    pred = model(context, iterations=2)
    count = views * (SIZE // 4) ** 2  # one Gaussian per 4x4 pixels per view
    assert pred.gaussians.means.shape == (2, count, 3)
    assert pred.depth.shape == (2, views, SIZE, SIZE)
    pred.gaussians.validate()
    targets = ReSplatTrainingRecipe().render_targets(pred)  # every iteration, decayed
    assert [w for w, _ in targets] == pytest.approx([0.81, 0.9, 1.0])
    assert [g for _, g in targets] == pred.gaussians_per_iteration
    loss = sum(w * _render_loss(g, context) for w, g in targets)
    loss.backward()
    missing = [
        n
        for n, p in model.named_parameters()
        if p.requires_grad and (p.grad is None or not p.grad.abs().sum() > 0)
    ]
    # Every trainable parameter is reached (the update's through the perturbed delta layer).
    assert missing == [], missing
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    assert not any(p.requires_grad for p in model.extractor.parameters())
    model.zero_grad(set_to_none=True)


def test_freeze_init_and_render_targets() -> None:
    model = _model()
    recipe = ReSplatTrainingRecipe(freeze_init=True, train_iterations=3)
    recipe.setup(model)  # what the LightningModule does
    assert not any(p.requires_grad for p in model.init_model.parameters())
    _perturb_update(model)
    context = _context()
    pred = model(context, iterations=2)
    # The frozen initial set carries no gradient, so it is not a render target.
    assert [w for w, _ in recipe.render_targets(pred)] == pytest.approx([0.9, 1.0])
    _render_loss(pred.gaussians, context).backward()
    assert all(p.grad is None for p in model.init_model.parameters())
    assert model.updater.delta[-1].weight.grad.abs().sum() > 0
    model.train()
    assert not model.init_model.training and model.updater.training
    with pytest.raises(ValueError, match="freeze_init"):
        ReSplatTrainingRecipe(freeze_init=True, train_iterations=0)
    # The initial-model stage: no refinement iterations in training.
    assert ReSplatTrainingRecipe(train_iterations=0).train_kwargs(model, 0, 100) == {
        "iterations": 0
    }


def test_train_kwargs_and_iterations_knob(fresh: ReSplat) -> None:
    model = fresh
    recipe = ReSplatTrainingRecipe()
    assert recipe.train_iterations == 4 and model.iterations == 2
    samples = {recipe.train_kwargs(model, step, 100)["iterations"] for step in range(300)}
    assert samples == {1, 2, 3, 4}
    with torch.no_grad():
        assert len(model(_context()).gaussians_per_iteration) == 3  # the default: 2
        pred = model(_context(), iterations=0, max_gaussians=50)
    assert pred.gaussians.means.shape[1] == 50
    assert recipe.render_targets(pred)[0][0] == 1.0 and len(recipe.render_targets(pred)) == 1
    with pytest.raises(ValueError, match="divisible by 4"):
        model(_context(size=30))


def test_init_checkpoint_loads_initial_model_strictly(fresh: ReSplat, tmp_path) -> None:
    # "Trained" weights: the fresh model's, shifted, so that they differ from any new model.
    state = {
        k: (v + 0.01 if v.is_floating_point() else v).contiguous()
        for k, v in fresh.state_dict().items()
    }
    save_file(state, str(tmp_path / "init.safetensors"))
    torch.save({"state_dict": {f"net.{k}": v for k, v in state.items()}}, tmp_path / "init.ckpt")
    init_state = {
        k.removeprefix("init_model."): v for k, v in state.items() if k.startswith("init_model.")
    }
    save_file(init_state, str(tmp_path / "bare.safetensors"))  # the initial model alone

    refined = _model(init_checkpoint=str(tmp_path / "init.safetensors"))
    refined.freeze_initial_model()
    for key, value in refined.init_model.state_dict().items():
        assert torch.equal(value, init_state[key]), key
    for name in ("init.ckpt", "bare.safetensors"):
        with torch.no_grad():
            for p in refined.init_model.parameters():
                p.zero_()
        refined.load_init_checkpoint(tmp_path / name)
        for key, value in refined.init_model.state_dict().items():
            assert torch.equal(value, init_state[key]), (name, key)
    # Only the initial model is loaded: the update keeps its own (zero-initialised) last layer.
    assert refined.updater.delta[-1].weight.abs().sum() == 0
    assert not any(p.requires_grad for p in refined.init_model.parameters())

    bad = dict(init_state)
    bad["head.proj.0.weight"] = torch.zeros(3, 3)
    del bad["depth_head.0.bias"]
    save_file(bad, str(tmp_path / "bad.safetensors"))
    with pytest.raises(PretrainedError, match="missing key.*depth_head.0.bias.*shape mismatch"):
        refined.load_init_checkpoint(tmp_path / "bad.safetensors")
    with pytest.raises(PretrainedError, match="does not exist"):
        refined.load_init_checkpoint(tmp_path / "none.ckpt")


def test_from_pretrained_needs_no_init_checkpoint(fresh: ReSplat, tmp_path) -> None:
    """A refined model's config names its init checkpoint; reloading the model never reads it."""
    init = tmp_path / "init.safetensors"
    save_file({k: v.contiguous() for k, v in fresh.state_dict().items()}, str(init))
    model = _model(init_checkpoint=str(init))
    model.save_pretrained(tmp_path / "refined")  # the Hub mixin's config keeps the path
    init.unlink()
    loaded = ReSplat.from_pretrained(tmp_path / "refined")
    assert loaded.iterations == model.iterations and not loaded.freeze_init  # not a config value
    for key, value in model.state_dict().items():
        assert torch.equal(value, loaded.state_dict()[key]), key


# ---------------------------------------------------------------------- feature extractor
def test_feature_extractor_seeded_is_deterministic_and_frozen() -> None:
    torch.manual_seed(123)
    a = FrozenFeatureExtractor("resnet18")
    torch.manual_seed(456)
    b = FrozenFeatureExtractor("resnet18")
    assert a.loaded_weights == "seeded"
    for key, value in a.state_dict().items():
        assert torch.equal(value, b.state_dict()[key]), key
    c = FrozenFeatureExtractor("resnet18", seed=1)
    assert not torch.equal(a.state_dict()["net.conv1.weight"], c.state_dict()["net.conv1.weight"])

    a.train()
    assert not a.training and not any(m.training for m in a.modules())
    images = torch.rand(2, 3, 3, 32, 32, requires_grad=True)
    out = a(images, (8, 8))
    assert out.shape == (2, 3, a.out_channels, 8, 8) and a.out_channels == 64 + 64 + 128
    out.sum().backward()
    assert images.grad is not None and images.grad.abs().sum() > 0
    assert all(p.grad is None and not p.requires_grad for p in a.parameters())


def test_feature_extractor_pretrained_from_local_file(tmp_path) -> None:
    reference = timm.create_model("test_resnet")
    with torch.no_grad():
        for p in reference.parameters():
            p.normal_()
    path = tmp_path / "test_resnet.safetensors"
    save_file({k: v.contiguous() for k, v in reference.state_dict().items()}, str(path))
    extractor = FrozenFeatureExtractor("test_resnet", weights="pretrained", weights_file=str(path))
    assert extractor.loaded_weights == "pretrained"
    source = reference.state_dict()
    loaded = {k.removeprefix("net."): v for k, v in extractor.state_dict().items()}
    assert len(loaded) > 10
    for key, value in loaded.items():
        assert torch.equal(value, source[key]), key


def test_feature_extractor_falls_back_offline(tmp_path, monkeypatch, caplog) -> None:
    from models.layers import feature_extractor as module

    real = module.timm.create_model

    def offline(name, pretrained=False, **kwargs):
        if pretrained:
            raise OSError("no network")
        return real(name, pretrained=False, **kwargs)

    monkeypatch.setattr(module.timm, "create_model", offline)
    with caplog.at_level(logging.WARNING, logger="models.layers.feature_extractor"):
        extractor = FrozenFeatureExtractor("test_resnet", weights="pretrained")
    assert extractor.loaded_weights == "seeded"
    assert "falling back" in caplog.text and "no network" in caplog.text
    seeded = FrozenFeatureExtractor("test_resnet")
    for key, value in extractor.state_dict().items():
        assert torch.equal(value, seeded.state_dict()[key]), key
    with pytest.raises(ValueError, match="weights must be one of"):
        FrozenFeatureExtractor(weights="imagenet")


def test_feature_extractor_filterbank() -> None:
    bank = FrozenFeatureExtractor(weights="filterbank", filter_scales=(1.0, 2.0))
    assert bank.out_channels == 24 and bank.loaded_weights == "filterbank"
    flat = torch.full((1, 3, 32, 32), 0.5)
    out = bank(flat, (8, 8))
    # A constant image: derivatives vanish, the smoothing filter returns the constant.
    derivatives = out.reshape(1, 2, 3, 4, 8, 8)[:, :, :, 1:]
    assert derivatives.abs().amax() < 1e-5
    torch.testing.assert_close(
        out.reshape(1, 2, 3, 4, 8, 8)[:, :, :, 0], torch.full((1, 2, 3, 8, 8), 0.5)
    )
    edge = flat.clone()
    edge[..., 16:] = 1.0
    assert bank(edge, (8, 8)).reshape(1, 2, 3, 4, 8, 8)[:, :, :, 1].abs().amax() > 0.05
