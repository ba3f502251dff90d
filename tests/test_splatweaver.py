"""SplatWeaver: the router, its experts, the wavelet prior and the regulariser."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from models import create_model, list_models, render
from models.families.splatweaver import SplatWeaver
from models.layers.cardinality_router import (
    quantile_targets,
    straight_through_gumbel,
    target_usage_distribution,
)
from models.training.recipes import SplatWeaverTrainingRecipe

SIZE = 32  # small images keep the tests fast; the tiny backbone works at any size


def small_model(**overrides) -> SplatWeaver:
    return create_model("splatweaver_tiny", image_size=SIZE, **overrides)


def make_context(b: int = 2, v: int = 2, size: int = SIZE, image: torch.Tensor | None = None):
    if image is None:
        image = torch.rand(b, v, 3, size, size)
    b, v = image.shape[:2]
    return {
        "image": image,
        "near": torch.full((b, v), 0.5),
        "far": torch.full((b, v), 20.0),
    }


def force_route(model: SplatWeaver, cardinality: int) -> None:
    """Make the router pick ``cardinality`` at every pixel."""
    last = model.router.net[-1]
    with torch.no_grad():
        last.weight.zero_()
        last.bias.fill_(-1e4)
        last.bias[cardinality] = 1e4


def checkerboard(size: int) -> torch.Tensor:
    index = torch.arange(size)
    return (index[:, None] + index[None, :]).remainder(2).float()


def cameras(b: int, v: int) -> tuple[torch.Tensor, torch.Tensor]:
    extrinsics = torch.eye(4).repeat(b, v, 1, 1)
    extrinsics[:, :, 0, 3] = torch.linspace(0.0, 0.5, v)
    intrinsics = torch.tensor([[1.0, 0.0, 0.5], [0.0, 1.0, 0.5], [0.0, 0.0, 1.0]])
    return extrinsics, intrinsics.repeat(b, v, 1, 1)


class PatternRouter(torch.nn.Module):
    """The model's router plus a fixed random per-pixel pattern, so that every expert is used
    on random images (whose wavelet energy is high everywhere)."""

    def __init__(self, router: torch.nn.Module, size: int) -> None:
        super().__init__()
        self.router = router
        self.register_buffer("pattern", torch.randn(1, 4, size, size) * 3.0)

    def forward(self, x: torch.Tensor, energy: torch.Tensor) -> torch.Tensor:
        return self.router(x, energy) + self.pattern


@pytest.fixture(scope="module")
def model() -> SplatWeaver:
    torch.manual_seed(0)
    model = small_model()
    model.router = PatternRouter(model.router, SIZE)
    return model


def test_registered() -> None:
    names = list_models(family="splatweaver")  # the family's own sizes and its release port
    assert names == list_models("splatweaver_*")
    assert {"splatweaver_base", "splatweaver_small", "splatweaver_tiny", "splatweaver_vggt"} <= set(
        names
    )
    assert SplatWeaver.pose_free and SplatWeaver.family == "splatweaver"


def test_target_usage_distribution() -> None:
    for mean in (0.3, 0.5, 1.0, 2.2):
        usage = torch.tensor(target_usage_distribution(mean, 3))
        assert usage.shape == (4,)
        assert torch.isclose(usage.sum(), torch.tensor(1.0))
        assert torch.isclose((usage * torch.arange(4)).sum(), torch.tensor(mean), atol=1e-5)
    few = target_usage_distribution(0.5, 3)
    assert few == sorted(few, reverse=True)  # favours few Gaussians
    with pytest.raises(ValueError, match="target_gaussians_per_pixel"):
        target_usage_distribution(3.0, 3)
    with pytest.raises(ValueError, match="target_usage"):
        small_model(target_usage=[0.5, 0.5])


def natural_images(b: int = 2, v: int = 2, size: int = SIZE) -> torch.Tensor:
    """Smooth shading with a few sharp edges and a textured patch (``[B, V, 3, H, W]``)."""
    y, x = torch.meshgrid(torch.linspace(0, 1, size), torch.linspace(0, 1, size), indexing="ij")
    base = 0.3 + 0.1 * x  # a smooth gradient: flat for the wavelet
    base = torch.where((x > 0.3) & (x < 0.6) & (y > 0.2) & (y < 0.5), base * 0.2, base)  # a box
    texture = checkerboard(size) * 0.5 + 0.25
    base = torch.where((y > 0.7) & (x > 0.6), texture, base)  # a textured patch
    images = base.expand(b, v, 3, size, size).clone()
    return images + 0.002 * torch.rand_like(images)


def graded_images(b: int = 2, v: int = 2, size: int = SIZE) -> torch.Tensor:
    """Smooth colours plus noise whose amplitude grows along x: a continuum of wavelet energies."""
    smooth = torch.nn.functional.interpolate(
        torch.rand(b * v, 3, 4, 4), size=(size, size), mode="bilinear", align_corners=False
    )
    amplitude = torch.linspace(0.0, 0.4, size) ** 2 / 0.4
    images = smooth + amplitude * (torch.rand(b * v, 3, size, size) - 0.5)
    return images.clamp(0, 1).reshape(b, v, 3, size, size)


@pytest.mark.parametrize("ladder", [True, False])
def test_router_starts_near_the_target_usage(ladder: bool) -> None:
    model = small_model(energy_ladder=ladder)
    target = torch.tensor(target_usage_distribution(0.5, 3))
    context = make_context(image=graded_images(b=2))
    model.train()  # sampled routing
    with torch.no_grad():
        pred = model(context)
    usage = pred.extras["expert_usage"]
    assert (usage - target).abs().max() < 0.1, usage
    assert abs(float(pred.extras["gaussians_per_pixel"]) - 0.5) < 0.1
    model.eval()  # deterministic (frozen Gumbel) routing follows the same distribution
    with torch.no_grad():
        pred = model(context)
        argmax = model(context, routing="argmax").extras["expert_usage"]
    usage = pred.extras["expert_usage"]
    assert (usage - target).abs().max() < 0.15, usage
    assert abs(float(pred.extras["gaussians_per_pixel"]) - 0.5) < 0.1
    if ladder:  # the ladder was calibrated on the first training batch: argmax follows it too
        assert bool(model.router.calibrated)
        assert (argmax - target).abs().max() < 0.15, argmax
    else:  # argmax of an untrained feature-only router: the most likely expert, 0, everywhere
        assert argmax[0] > 0.9


def test_energy_ladder_routes_texture_to_more_gaussians() -> None:
    model = small_model().eval()  # uncalibrated: the default thresholds
    images = natural_images(b=1)
    with torch.no_grad():
        pred = model(make_context(image=images))
    routed = pred.extras["routing_map"].float()  # [B, V, H, W]
    energy = pred.extras["hf_energy"]
    flat, textured = energy <= 0.01, energy >= 0.1
    assert flat.any() and textured.any()
    assert routed[flat].mean() < 0.05
    assert routed[textured].mean() > 1.5
    thresholds = model.router.thresholds.detach().clone()
    model.train()
    with torch.no_grad():
        model(make_context(image=images))  # first training batch: calibration
        assert not torch.equal(model.router.thresholds, thresholds)
        calibrated = model.router.thresholds.detach().clone()
        model(make_context(image=natural_images(b=1) * 0.5))  # only once
    assert torch.equal(model.router.thresholds, calibrated)
    assert (calibrated.diff() > 0).all()


def test_expert_zero_contributes_no_gaussians() -> None:
    model = small_model().eval()
    force_route(model, 0)
    with torch.no_grad():
        pred = model(make_context())
    assert pred.gaussians.count().tolist() == [0, 0]
    assert (pred.extras["routing_map"] == 0).all()
    force_route(model, 2)
    with torch.no_grad():
        pred = model(make_context())
    assert pred.gaussians.count().tolist() == [2 * 2 * SIZE * SIZE] * 2


@pytest.mark.parametrize("training", [False, True])
def test_count_equals_sum_of_routed_cardinalities(model: SplatWeaver, training: bool) -> None:
    model.train(training)
    with torch.no_grad():
        pred = model(make_context(b=3))
    routed = pred.extras["routing_map"]  # [B, V, H, W]
    assert routed.shape == (3, 2, SIZE, SIZE)
    assert len(routed.unique()) == 4  # every expert is used somewhere
    assert 0 <= routed.min() and routed.max() <= 3
    expected = routed.sum(dim=(1, 2, 3))
    assert torch.equal(pred.gaussians.count(), expected)
    assert pred.gaussians.num_slots == int(expected.max())
    if len(set(expected.tolist())) > 1:  # different counts: padded with a mask
        assert pred.gaussians.mask is not None
    pred.gaussians.validate()
    usage = pred.extras["expert_usage"]
    assert torch.isclose(usage.sum(), torch.tensor(1.0))
    assert torch.isclose(
        pred.extras["gaussians_per_pixel"], expected.sum().float() / routed.numel()
    )
    model.eval()


def test_gaussians_sit_at_their_pixel_points() -> None:
    model = small_model(offset_bound=1.0).eval()
    force_route(model, 1)
    context = make_context(b=1)
    with torch.no_grad():
        pred = model(context)
    points = pred.extras["points"].reshape(1, -1, 3)  # pixel order == slot order for expert 1
    depth = pred.extras["depth"].reshape(1, -1)
    footprint = depth / SIZE  # default focal 1: one pixel at depth z is z / W wide
    distance = (pred.gaussians.means - points).abs().amax(dim=-1)
    assert (distance <= footprint * 1.0001).all()
    assert pred.gaussians.means.shape == (1, 2 * SIZE * SIZE, 3)


def test_inference_is_deterministic(model: SplatWeaver) -> None:
    model.eval()
    context = make_context(b=1)
    with torch.no_grad():
        first = model(context)
        second = model(context)
    assert torch.equal(first.extras["routing_map"], second.extras["routing_map"])
    assert first.gaussians.count().min() > 0
    for name in ("means", "scales", "rotations", "opacities", "harmonics"):
        assert torch.equal(getattr(first.gaussians, name), getattr(second.gaussians, name))
    # Training mode samples Gumbel noise: the routing changes between calls.
    model.train()
    with torch.no_grad():
        noisy = [model(context).extras["routing_map"] for _ in range(2)]
    model.eval()
    assert not torch.equal(noisy[0], noisy[1])
    # ... and so does routing="gumbel" in eval mode (the public release's behaviour).
    with torch.no_grad():
        sampled = model(context, routing="gumbel").extras["routing_map"]
    assert not torch.equal(sampled, first.extras["routing_map"])


def test_inference_budget_follows_gaussians_per_pixel(model: SplatWeaver) -> None:
    model.eval()
    context = make_context(b=2)
    pixels = 2 * SIZE * SIZE  # per scene
    counts = []
    with torch.no_grad():
        free = model(context)
        for budget in (0.0, 0.25, 0.5, 1.0, 2.0, 3.0):
            pred = model(context, gaussians_per_pixel=budget)
            per_pixel = pred.gaussians.count().float() / pixels  # [B]
            assert (per_pixel <= budget + 1e-6).all()
            assert (per_pixel >= budget - 0.05).all(), (budget, per_pixel)  # as close as it can
            assert pred.extras["budget_shift"].shape == (2,)
            counts.append(pred.gaussians.count())
    assert all((a <= b).all() for a, b in zip(counts, counts[1:]))
    assert "budget_shift" not in free.extras
    with pytest.raises(ValueError, match="gaussians_per_pixel"):
        model(context, gaussians_per_pixel=3.5)
    with pytest.raises(ValueError, match="deterministic"):
        model(context, gaussians_per_pixel=1.0, routing="gumbel")
    for routing in ("argmax", "frozen_gumbel"):
        pred = model(context, gaussians_per_pixel=0.5, routing=routing)
        assert (pred.gaussians.count() <= 0.5 * pixels).all()


def test_frozen_gumbel_routing_is_fixed_and_distributed_like_training() -> None:
    model = small_model().eval()
    torch.manual_seed(1)
    bias = torch.tensor([1.0, 0.5, 0.0, -0.5])[None, :, None, None]
    logits = torch.randn(4, 4, SIZE, SIZE) * 0.5 + bias  # [B*V, M + 1, H, W] with B = V = 2
    noise = model._frozen_noise(logits, v=2)
    assert torch.equal(noise, model._frozen_noise(logits, v=2))  # fixed
    assert torch.equal(noise[:2], noise[2:])  # the same field for every scene of the batch
    _, frozen = model._route(logits, "frozen_gumbel", noise)
    _, argmax = model._route(logits, "argmax", None)
    assert torch.equal(frozen, (logits + noise).argmax(dim=1))
    assert not torch.equal(frozen, argmax)
    # Gumbel-max: each expert is chosen with its softmax probability, as the training samples.
    usage = torch.nn.functional.one_hot(frozen, 4).float().mean(dim=(0, 1, 2))
    expected = logits.softmax(dim=1).mean(dim=(0, 2, 3))
    torch.testing.assert_close(usage, expected, atol=0.03, rtol=0.0)
    argmax_usage = torch.nn.functional.one_hot(argmax, 4).float().mean(dim=(0, 1, 2))
    assert (argmax_usage - expected).abs().max() > 0.2  # argmax does not follow it
    # A whole model: a scene scores the same alone or second in a batch.
    context = make_context(b=1)
    pair = {k: torch.cat([torch.rand_like(t), t]) for k, t in context.items()}
    with torch.no_grad():
        alone = model(context).extras["routing_map"]
        second = model(pair).extras["routing_map"][1:]
    assert torch.equal(alone, second)


def test_straight_through_gumbel() -> None:
    logits = torch.randn(5, 4, 3, 3, requires_grad=True)
    gates, index = straight_through_gumbel(logits, tau=0.5, dim=1)
    assert index.shape == (5, 3, 3)
    torch.testing.assert_close(gates.detach().sum(dim=1), torch.ones(5, 3, 3))
    chosen = gates.detach().gather(1, index[:, None]).squeeze(1)
    torch.testing.assert_close(chosen, torch.ones_like(chosen))  # one-hot forward
    (gates * torch.randn_like(gates)).sum().backward()
    assert logits.grad is not None and logits.grad.abs().sum() > 0


@pytest.mark.parametrize("ladder", [True, False])
def test_straight_through_gate_passes_gradients_to_the_router(ladder: bool) -> None:
    # No regulariser: the only path from the loss to the router is the gate on the opacities.
    model = small_model(energy_ladder=ladder).train()
    pred = model(make_context(b=1))
    assert SplatWeaverTrainingRecipe(routing_weight=0.0).weigh(pred.losses) == {}
    extrinsics, intrinsics = cameras(1, 2)
    out = render(pred.gaussians, extrinsics, intrinsics, (SIZE, SIZE), backend="torch")
    loss = (out.color - 0.3).square().mean()
    loss.backward()
    for name, param in model.router.named_parameters():
        assert param.grad is not None, name
        assert torch.isfinite(param.grad).all(), name
    assert model.router.net[-1].bias.grad.abs().sum() > 0
    assert model.prior.net[-1].weight.grad.abs().sum() > 0  # through the router's input
    if ladder:
        assert model.router.thresholds.grad.abs().sum() > 0


def test_wavelet_prior_flat_zero_checkerboard_high() -> None:
    model = small_model().eval()
    flat = torch.full((1, 2, 3, SIZE, SIZE), 0.4)
    board = checkerboard(SIZE).expand(1, 2, 3, SIZE, SIZE).clone()
    half = flat.clone()
    half[..., SIZE // 2 :] = board[..., SIZE // 2 :]
    with torch.no_grad():
        energy_flat = model(make_context(b=1, image=flat)).extras["hf_energy"]
        energy_board = model(make_context(b=1, image=board)).extras["hf_energy"]
        energy_half = model(make_context(b=1, image=half)).extras["hf_energy"]
    assert energy_flat.shape == (1, 2, SIZE, SIZE)
    assert energy_flat.abs().max() < 1e-6
    assert energy_board.min() > 0.9
    # The routing targets: flat pixels want expert 0, checkerboard pixels more Gaussians.
    usage = model.target_usage
    assert (quantile_targets(energy_flat, usage, model.energy_floor) == 0).all()
    targets = quantile_targets(energy_half, usage, model.energy_floor)
    assert (targets[..., : SIZE // 2] == 0).all()
    assert (targets[..., SIZE // 2 :] >= 1).all()


def test_quantile_targets_follow_the_usage() -> None:
    usage = torch.tensor(target_usage_distribution(0.5, 3))
    energy = torch.rand(4, 50, 50) + 0.1
    targets = quantile_targets(energy, usage)
    fractions = torch.bincount(targets.flatten(), minlength=4).float() / targets.numel()
    torch.testing.assert_close(fractions, usage, atol=1e-3, rtol=0)
    # Higher energy never gets a lower class.
    order = energy.flatten().argsort()
    assert (targets.flatten()[order].diff() >= 0).all()


def test_routing_regulariser(model: SplatWeaver) -> None:
    """The model returns the regulariser's terms unweighted and the recipe weighs them; its mix of
    the two cross-entropies is exactly torch's label-smoothed cross-entropy."""
    model.train()
    pred = model(make_context())
    model.eval()
    assert set(pred.losses) == {"routing_ce", "routing_smoothing", "routing_usage"}
    ce, smoothing = pred.losses["routing_ce"], pred.losses["routing_smoothing"]
    penalty = pred.losses["routing_usage"]
    assert ce > 0 and smoothing > 0 and penalty >= 0
    recipe = SplatWeaverTrainingRecipe(routing_weight=0.02, usage_weight=0.5, label_smoothing=0.1)
    loss = recipe.weigh(pred.losses)["routing"]
    assert loss.requires_grad and torch.isfinite(loss)
    torch.testing.assert_close(loss, 0.02 * (0.9 * ce + 0.1 * smoothing + 0.5 * penalty))
    # The split is exact: F.cross_entropy(label_smoothing=0.1) on the same logits and targets.
    torch.manual_seed(3)
    logits = torch.randn(2, model.num_experts + 1, 6, 6)
    energy = torch.rand(2, 6, 6)
    terms = model._routing_losses(logits, energy)
    targets = quantile_targets(energy, model.target_usage, model.energy_floor)
    torch.testing.assert_close(
        0.9 * terms["routing_ce"] + 0.1 * terms["routing_smoothing"],
        F.cross_entropy(logits, targets, label_smoothing=0.1),
    )


def test_forward_backward_on_cpu() -> None:
    model = small_model().train()
    context = make_context()
    context["extrinsics"], context["intrinsics"] = cameras(2, 2)  # ignored (pose-free)
    pred = model(context)
    extrinsics, intrinsics = cameras(2, 1)
    out = render(pred.gaussians, extrinsics, intrinsics, (SIZE, SIZE), backend="torch")
    assert out.color.shape == (2, 1, 3, SIZE, SIZE)
    loss = out.color.square().mean() + SplatWeaverTrainingRecipe().weigh(pred.losses)["routing"]
    loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert all(torch.isfinite(g).all() for g in grads.values())
    for prefix in ("backbone.", "dpt.", "depth_head.", "router.", "prior.", "experts.0."):
        assert any(n.startswith(prefix) and g.abs().sum() > 0 for n, g in grads.items()), prefix
    extras = pred.extras
    assert extras["depth"].shape == (2, 2, SIZE, SIZE)
    assert extras["points"].shape == (2, 2, SIZE, SIZE, 3)
    assert extras["extrinsics"].shape == (2, 2, 4, 4)
    torch.testing.assert_close(extras["extrinsics"][:, 0], torch.eye(4).expand(2, 4, 4))
    assert extras["intrinsics"].shape == (2, 2, 3, 3)
    assert extras["expert_usage"].shape == (4,)


def test_max_gaussians_prunes(model: SplatWeaver) -> None:
    model.eval()
    with torch.no_grad():
        full = model(make_context())
        pred = model(make_context(), max_gaussians=50)
    assert (full.gaussians.count() > 50).all()
    assert (pred.gaussians.count() == 50).all()
    assert pred.gaussians.num_slots <= 50


def test_use_intrinsics_keeps_view_zero_on_its_rays() -> None:
    model = small_model(use_intrinsics=True).eval()
    with torch.no_grad():  # make the point correction non-zero
        model.point_head[-1].bias.fill_(0.3)
    context = make_context(b=1)
    intrinsics = torch.tensor([[1.4, 0.0, 0.45], [0.0, 1.2, 0.55], [0.0, 0.0, 1.0]])
    context["intrinsics"] = intrinsics.repeat(1, 2, 1, 1)
    with torch.no_grad():
        pred = model(context)
    points = pred.extras["points"][0, 0]  # [H, W, 3] of view 0
    u = points[..., 0] / points[..., 2] * 1.4 + 0.45
    v = points[..., 1] / points[..., 2] * 1.2 + 0.55
    centres = (torch.arange(SIZE) + 0.5) / SIZE
    torch.testing.assert_close(u, centres[None].expand(SIZE, SIZE))
    torch.testing.assert_close(v, centres[:, None].expand(SIZE, SIZE))
    assert not torch.allclose(pred.extras["points"][0, 1][..., 2], pred.extras["depth"][0, 1])


def test_posed_points_lie_on_the_given_cameras_rays() -> None:
    model = small_model(pose_free=False).eval()
    assert not model.pose_free and model.point_head is None
    assert SplatWeaver.pose_free  # the class default stays pose-free
    context = make_context(b=1)
    with pytest.raises(ValueError, match="extrinsics"):
        model(context)
    extrinsics, intrinsics = cameras(1, 2)
    extrinsics[0, 1, :3, :3] = torch.tensor(  # rotate view 1 by 90 degrees about y
        [[0.0, 0.0, 1.0], [0.0, 1.0, 0.0], [-1.0, 0.0, 0.0]]
    )
    context.update(extrinsics=extrinsics, intrinsics=intrinsics)
    with torch.no_grad():
        pred = model(context)
    torch.testing.assert_close(pred.extras["extrinsics"], extrinsics)
    for view in range(2):  # world points map back onto their own pixels at the predicted depth
        world = pred.extras["points"][0, view].reshape(-1, 3)  # [P, 3]
        c2w = extrinsics[0, view]
        local = (world - c2w[:3, 3]) @ c2w[:3, :3]  # world -> camera
        torch.testing.assert_close(local[:, 2], pred.extras["depth"][0, view].reshape(-1))
        centres = (torch.arange(SIZE) + 0.5) / SIZE
        u = (local[:, 0] / local[:, 2]).reshape(SIZE, SIZE) + 0.5
        torch.testing.assert_close(u, centres[None].expand(SIZE, SIZE))


def test_intrinsics_free_focal_estimate() -> None:
    model = small_model(default_focal=1.3).eval()
    with torch.no_grad():
        pred = model(make_context(b=1))
    # Zero-initialised correction: view 0's points lie on the canonical rays.
    torch.testing.assert_close(
        pred.extras["intrinsics"][0, :, 0, 0], torch.full((2,), 1.3), atol=1e-4, rtol=0
    )


def test_neighbour_aggregation_and_db2() -> None:
    model = create_model(
        "splatweaver_tiny", image_size=16, neighbour_aggregation=True, neighbour_k=8, wavelet="db2"
    ).train()
    pred = model(make_context(b=1, size=16))
    routing = SplatWeaverTrainingRecipe().weigh(pred.losses)["routing"]
    loss = pred.gaussians.opacities.sum() + pred.gaussians.means.sum() + routing
    loss.backward()
    assert model.neighbour.attn.q.weight.grad.abs().sum() > 0
    assert torch.equal(pred.gaussians.count(), pred.extras["routing_map"].sum(dim=(1, 2, 3)))


def test_bad_arguments(model: SplatWeaver) -> None:
    with pytest.raises(ValueError, match="routing"):
        model(make_context(), routing="soft")
    with pytest.raises(ValueError, match="image"):
        model({"image": torch.rand(1, 2, 4, SIZE, SIZE)})
    with pytest.raises(ValueError, match="gumbel_tau"):
        small_model(gumbel_tau=0.0)


def test_init_checkpoint_starts_the_trunk_from_a_pixel_aligned_model(tmp_path) -> None:
    from models.weights.hub import PretrainedError, save_pretrained

    torch.manual_seed(0)
    teacher = create_model("pixel_aligned_tiny", image_size=SIZE)
    save_pretrained(teacher, tmp_path / "pa", "pixel_aligned_tiny")
    model = small_model(pose_free=False, init_checkpoint=str(tmp_path / "pa"))
    source = teacher.state_dict()
    loaded = {name: module for name, module in model.trunk_modules().items()}
    assert set(loaded) == {"backbone", "dpt", "depth_head", "depth_refine"}
    for name, module in loaded.items():
        for key, value in module.state_dict().items():
            torch.testing.assert_close(value, source[f"{name}.{key}"])
    fresh = small_model(pose_free=False)  # the router and experts are not taken from anywhere
    assert not torch.equal(
        fresh.backbone.patch_embed.proj.weight, model.backbone.patch_embed.proj.weight
    )
    # Same trunk output as the pixel-aligned model: identical depth maps on a posed scene.
    extrinsics, intrinsics = cameras(1, 2)
    context = {**make_context(b=1), "extrinsics": extrinsics, "intrinsics": intrinsics}
    with torch.no_grad():
        depth = model.eval()(context).extras["depth"]
        teacher_depth = teacher.eval()(context).extras["depth"]
    torch.testing.assert_close(depth, teacher_depth.reshape(depth.shape), rtol=1e-4, atol=1e-4)
    # A pose-free SplatWeaver has no camera tokens: the posed trunk does not fit, and says so.
    with pytest.raises(PretrainedError, match="camera_embed"):
        small_model(pose_free=True, init_checkpoint=str(tmp_path / "pa"))
    with pytest.raises(PretrainedError, match="does not exist"):
        small_model(pose_free=False, init_checkpoint=str(tmp_path / "missing"))
    # Weights saved from the initialised model rebuild without reading the init file again.
    save_pretrained(model, tmp_path / "sw", "splatweaver_tiny")
    (tmp_path / "pa" / "model.safetensors").unlink()
    again = create_model("splatweaver_tiny", pretrained=str(tmp_path / "sw"))
    torch.testing.assert_close(again.state_dict(), model.state_dict())
