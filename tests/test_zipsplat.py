"""ZipSplat: token clustering, Gaussian budget, views, camera prior, schedule, Chamfer loss."""

from __future__ import annotations

import pytest
import torch

import models.families.zipsplat as zipsplat_module
from models import create_model, list_models
from models.core.gaussians import sh_to_rgb
from models.families.zipsplat import ZipSplat, chamfer_distance, compression_schedule
from models.layers.kmeans import cluster_count, kmeans_select
from models.training.recipes import ZipSplatTrainingRecipe

SIZE = 32  # 4 x 4 patches per view at patch size 8: fast, and still clusters


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def model() -> ZipSplat:
    torch.manual_seed(0)
    return create_model("zipsplat_tiny", image_size=SIZE).eval()


def _context(b: int = 2, v: int = 2, size: int = SIZE, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    extrinsics = torch.eye(4).repeat(b, v, 1, 1)
    extrinsics[:, :, 0, 3] = torch.linspace(0, 1, v)
    intrinsics = torch.tensor([[0.9, 0.0, 0.5], [0.0, 0.9, 0.5], [0.0, 0.0, 1.0]])
    return {
        "image": torch.rand(b, v, 3, size, size, generator=g),
        "extrinsics": extrinsics,
        "intrinsics": intrinsics.repeat(b, v, 1, 1),
        "near": torch.full((b, v), 0.5),
        "far": torch.full((b, v), 20.0),
    }


# ---------------------------------------------------------------------- k-means
def test_kmeans_selects_k_distinct_real_tokens_deterministically():
    tokens = torch.randn(3, 200, 16)
    for k in (1, 17, 100, 199):
        index = kmeans_select(tokens, k)
        assert index.shape == (3, k) and index.dtype == torch.long
        assert ((index >= 0) & (index < 200)).all()
        for row in index:
            assert row.unique().numel() == k
        torch.manual_seed(123)  # the global generator plays no part
        again = kmeans_select(tokens, k)
        assert torch.equal(index, again)
    # Chunking the distances changes nothing.
    assert torch.equal(kmeans_select(tokens, 40, chunk_size=7), kmeans_select(tokens, 40))


def test_kmeans_finds_separated_clusters_and_snaps_to_members():
    g = torch.Generator().manual_seed(1)
    centres = torch.randn(6, 8, generator=g) * 20
    # Spatially coherent regions (as patches of one surface are), 20 tokens each.
    labels = torch.randperm(6, generator=g)[torch.arange(120) // 20]
    tokens = (centres[labels] + 0.1 * torch.randn(120, 8, generator=g))[None]
    index, assignment = kmeans_select(tokens, 6, return_assignment=True)
    # One representative per true cluster.
    assert sorted(labels[index[0]].tolist()) == list(range(6))
    # Each representative belongs to its own cluster, and clusters follow the true labels.
    assert torch.equal(assignment[0, index[0]], torch.arange(6))
    for c in range(6):
        members = assignment[0][labels == c]
        assert (members == members[0]).all()


def test_kmeans_iterations_reduce_the_quantisation_error():
    tokens = torch.randn(1, 300, 16, generator=torch.Generator().manual_seed(2))

    def inertia(index: torch.Tensor) -> float:
        return torch.cdist(tokens[0], tokens[0, index[0]]).amin(dim=1).square().sum().item()

    stride_only = inertia(kmeans_select(tokens, 30, iterations=0))
    assert inertia(kmeans_select(tokens, 30, iterations=5)) < 0.95 * stride_only


def test_kmeans_duplicate_tokens_still_give_distinct_indices():
    tokens = torch.zeros(2, 40, 4)
    tokens[:, 20:] = 1.0  # only two distinct values: most clusters end up empty
    index = kmeans_select(tokens, 10)
    for row in index:
        assert row.unique().numel() == 10


def test_cluster_count_rounds_and_validates():
    assert cluster_count(128, 1.0) == 128
    assert cluster_count(128, 0.5) == 64
    assert cluster_count(128, 0.1) == 13
    assert cluster_count(128, 1e-6) == 1
    for bad in (0.0, -0.5, 1.5):
        with pytest.raises(ValueError, match="compression"):
            cluster_count(128, bad)


# ---------------------------------------------------------------------- budget
def test_ratio_one_skips_clustering(model, monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("k-means must not run at r = 1")

    monkeypatch.setattr(zipsplat_module, "kmeans_select", fail)
    with torch.no_grad():
        pred = model(_context())
    n = 2 * (SIZE // 8) ** 2
    assert torch.equal(pred.extras["scene_token_index"], torch.arange(n).expand(2, n))
    assert (pred.extras["cluster_size"] == 1).all()


@pytest.mark.parametrize("r", [1.0, 0.5, 0.25, 0.1])
def test_gaussian_count_is_k_times_g(model, r):
    with torch.no_grad():
        pred = model(_context(), compression=r)
    n = 2 * (SIZE // 8) ** 2
    k = cluster_count(n, r)
    g = model.gaussians_per_token
    assert pred.extras["num_scene_tokens"] == k
    assert pred.gaussians.means.shape == (2, k * g, 3)
    assert pred.gaussians.count().tolist() == [k * g, k * g]
    assert pred.extras["cluster_size"].sum(dim=1).tolist() == [n, n]  # clusters cover the tokens
    pred.gaussians.validate()


def test_tiny_has_6x_fewer_gaussians_than_pixels_at_r1():
    model = create_model("zipsplat_tiny")
    with torch.no_grad():
        pred = model(_context(b=1, size=64))
    pixels = 2 * 64 * 64
    assert pred.gaussians.count().item() * 6 <= pixels


def test_ratio_alias_max_gaussians_and_determinism(model):
    context = _context()
    with torch.no_grad():
        a = model(context, compression=0.5)
        b = model(context, ratio=0.5)
        pruned = model(context, compression=0.5, max_gaussians=100)
    assert torch.equal(a.gaussians.means, b.gaussians.means)
    assert pruned.gaussians.count().tolist() == [100, 100]
    with pytest.raises(ValueError, match="disagree"):
        model(context, compression=0.5, ratio=0.25)
    with pytest.raises(ValueError, match="compression"):
        model(context, compression=0.0)


# ---------------------------------------------------------------------- views, gradients
@pytest.mark.parametrize("views", [1, 2, 4])
def test_forward_backward_any_number_of_views(views):
    torch.manual_seed(0)
    model = create_model("zipsplat_tiny", image_size=SIZE).train()
    context = _context(b=2, v=views)
    pred = model(context, compression=0.5 if views > 1 else 1.0)
    n = views * (SIZE // 8) ** 2
    k = cluster_count(n, 0.5 if views > 1 else 1.0)
    assert pred.gaussians.means.shape == (2, k * model.gaussians_per_token, 3)
    g = pred.gaussians
    loss = (
        g.means.square().mean() + g.harmonics.square().mean() + g.scales.mean() + g.opacities.mean()
    )
    loss.backward()
    grads = {name: p.grad for name, p in model.named_parameters() if p.grad is not None}
    # Every parameter is in the graph (the unused camera prior as a zero term), as DDP needs.
    assert set(grads) == {name for name, _ in model.named_parameters()}
    assert all(torch.isfinite(v).all() for v in grads.values())
    for part in ("backbone.blocks.0", "refine.0", "color_refine", "color_embed", "gaussian_head"):
        assert any(name.startswith(part) and v.abs().sum() > 0 for name, v in grads.items()), part


def test_non_multiple_image_size_and_no_intrinsics(model):
    context = {"image": torch.rand(1, 2, 3, 30, 37)}
    with torch.no_grad():
        pred = model(context, compression=0.5)
    pred.gaussians.validate()


# ---------------------------------------------------------------------- camera prior
def test_camera_prior_changes_output_only_when_enabled(model):
    context = _context()
    moved = dict(context, extrinsics=context["extrinsics"].clone())
    moved["extrinsics"][:, 1, :3, 3] = torch.tensor([0.3, -0.4, 1.0])
    with torch.no_grad():
        plain = model({"image": context["image"], "intrinsics": context["intrinsics"]}).gaussians
        off = model(context).gaussians  # pose-free: extrinsics are ignored
        off_moved = model(moved).gaussians
        on = model(context, camera_prior=True).gaussians
        on_moved = model(moved, camera_prior=True).gaussians
        half = model(context, camera_prior=torch.tensor([True, False])).gaussians
    assert torch.equal(plain.means, off.means) and torch.equal(off.means, off_moved.means)
    assert not torch.allclose(on.means, off.means)
    assert not torch.allclose(on.means, on_moved.means)
    assert torch.equal(half.means[1], off.means[1])  # scene without the prior: untouched
    assert torch.allclose(half.means[0], on.means[0], atol=1e-5)

    without = create_model("zipsplat_tiny", image_size=SIZE, use_camera_prior=False).eval()
    with torch.no_grad():
        a = without(context).gaussians
        b = without(moved, camera_prior=True).gaussians
    assert torch.equal(a.means, b.means)


# ---------------------------------------------------------------------- training schedule
def test_train_kwargs_anneal_and_sample(model):
    assert compression_schedule(0, 1000, 0.5, 0.5, 2) == 1.0
    assert compression_schedule(250, 1000, 0.5, 0.5, 2) == pytest.approx(0.75)
    assert compression_schedule(500, 1000, 0.5, 0.5, 2) == pytest.approx(0.5)
    assert compression_schedule(900, 1000, 0.5, 0.5, 2) == pytest.approx(0.5)
    assert compression_schedule(900, 1000, 0.5, 0.5, 8) == pytest.approx(0.25)

    recipe = ZipSplatTrainingRecipe()
    assert recipe.train_kwargs(model, 0, 1000)["compression"] == 1.0
    torch.manual_seed(5)
    late = [recipe.train_kwargs(model, 800, 1000) for _ in range(200)]
    rs = torch.tensor([kw["compression"] for kw in late])
    assert rs.min() >= 0.5 and rs.max() <= 1.0 and rs.std() > 0.1
    assert all(kw["camera_prior"] == pytest.approx(0.2) for kw in late)
    assert all(kw["chamfer_points"] == 2048 for kw in late)
    torch.manual_seed(5)
    assert recipe.train_kwargs(model, 800, 1000) == late[0]  # seeded runs repeat
    pred = model(_context(), **late[0])  # the kwargs are valid forward keywords
    assert pred.diagnostics["compression"] == late[0]["compression"]
    assert "chamfer_points" not in ZipSplatTrainingRecipe(chamfer_weight=0.0).train_kwargs(
        model, 0, 10
    )
    with pytest.raises(ValueError, match="camera_prior_prob"):
        ZipSplatTrainingRecipe(camera_prior_prob=1.5)


# ---------------------------------------------------------------------- Chamfer loss
def test_chamfer_distance_matches_dense_reference():
    x = torch.randn(2, 70, 3, requires_grad=True)
    y = torch.randn(2, 90, 3)
    d = torch.cdist(x, y)
    reference = d.amin(dim=2).mean(dim=1) + d.amin(dim=1).mean(dim=1)
    value = chamfer_distance(x, y, chunk_size=16)
    assert torch.allclose(value, reference, atol=1e-5)
    value.sum().backward()
    assert torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    assert chamfer_distance(y[:, :5], y[:, :5]).abs().max() < 1e-5


def test_chamfer_loss_from_context_depth():
    torch.manual_seed(0)
    model = create_model("zipsplat_tiny", image_size=SIZE).train()
    context = _context(b=1)
    context["depth"] = torch.full((1, 2, SIZE, SIZE), 3.0)
    pred = model(context, chamfer_points=2048)
    loss = pred.losses["chamfer"]  # unweighted: the recipe weighs it
    assert loss.ndim == 0 and loss > 0
    assert pred.extras["loss/chamfer"] is loss  # the same term in the extras view
    weighted = ZipSplatTrainingRecipe(chamfer_weight=0.1).weigh(pred.losses)
    torch.testing.assert_close(weighted["chamfer"], 0.1 * loss)
    assert ZipSplatTrainingRecipe(chamfer_weight=0.0).weigh(pred.losses) == {}
    loss.backward()
    assert model.gaussian_head.proj[-1].weight.grad.abs().sum() > 0
    with torch.no_grad():
        assert "chamfer" not in model(context, chamfer_points=2048).losses  # evaluation: none
    assert "chamfer" not in model(context).losses  # not asked for
    no_depth = {k: v for k, v in context.items() if k != "depth"}
    assert "chamfer" not in model(no_depth, chamfer_points=2048).losses


def test_registry_and_round_trip(tmp_path, model):
    assert {"zipsplat_tiny", "zipsplat_small", "zipsplat_base", "zipsplat_large"} <= set(
        list_models("zipsplat*")
    )
    model.save_pretrained(tmp_path)
    loaded = ZipSplat.from_pretrained(tmp_path).eval()
    context = _context(b=1)
    with torch.no_grad():
        assert torch.equal(model(context).gaussians.means, loaded(context).gaussians.means)


def test_gaussian_sites_start_each_gaussian_on_its_own_pixel_and_colour():
    torch.manual_seed(0)
    model = create_model("zipsplat_tiny", image_size=SIZE, gaussian_sites=True).eval()
    g = model.gaussians_per_token
    head = model.gaussian_head.proj
    last = head[-1] if isinstance(head, torch.nn.Sequential) else head
    raw_dim = last.out_features // g
    with torch.no_grad():  # zero the mean and colour residuals: every Gaussian sits at its start
        w = last.weight.view(g, raw_dim, -1)
        b = last.bias.view(g, raw_dim)
        for block in (
            slice(0, 3),
            slice(raw_dim - 3 * model.gaussian_head.num_sh_coefficients, None),
        ):
            w[:, block] = 0.0
            b[:, block] = 0.0
    # A linear ramp in x: the 3x3 box filter keeps it, so a site's colour is its x coordinate.
    x = (torch.arange(SIZE) + 0.5) / SIZE
    image = x.expand(SIZE, SIZE).expand(1, 2, 3, SIZE, SIZE).clone()
    context = _context(b=1)
    context["image"] = image
    with torch.no_grad():
        pred = model(context)
    gaussians = pred.gaussians
    n = (SIZE // 8) ** 2
    assert gaussians.means.shape == (1, 2 * n * g, 3)
    means = gaussians.means[0].reshape(2, n, g, 3)
    f = context["intrinsics"][0, 0, 0, 0]
    # Every view's Gaussians start on their site rays at the anchor depth, in that view's camera.
    torch.testing.assert_close(means[..., 2], torch.full_like(means[..., 2], 6.0))
    u = means[..., 0] / means[..., 2] * f + 0.5  # normalised image x of each start
    sites = model._site_coords((SIZE // 8, SIZE // 8), image)  # [n, G, 2]
    torch.testing.assert_close(u, sites[None, ..., 0].expand_as(u))
    assert len({tuple(s) for s in sites.reshape(-1, 2).tolist()}) == n * g  # all distinct
    inner = (sites[..., 0] > 1.5 / SIZE) & (sites[..., 0] < 1 - 1.5 / SIZE)
    rgb = sh_to_rgb(gaussians.harmonics[0, :, :, 0]).reshape(2, n, g, 3)
    torch.testing.assert_close(rgb[0][inner], sites[..., 0][inner][:, None].expand(-1, 3))
    # Clustered tokens keep the count K * G and take their representative's sites.
    with torch.no_grad():
        assert model(context, compression=0.5).gaussians.means.shape[1] == round(0.5 * 2 * n) * g
    with pytest.raises(ValueError, match="ray_anchor_depth"):
        create_model("zipsplat_tiny", gaussian_sites=True, ray_anchor_depth=None)
