"""kNN search (models/layers/knn.py) and point attention (models/layers/point_transformer.py)."""

from __future__ import annotations

import pytest
import torch

from models.layers.knn import knn
from models.layers.point_transformer import (
    GlobalAttention,
    KNNAttention,
    PointTransformer,
    ViewGridAttention,
    gather_neighbors,
)

pytestmark = pytest.mark.usefixtures("one_thread")


def _brute_force(queries: torch.Tensor, points: torch.Tensor, k: int) -> torch.Tensor:
    dist = ((queries[:, :, None, :] - points[:, None, :, :]) ** 2).sum(-1)  # [B, M, N]
    return dist.argsort(dim=-1)[..., :k]


@pytest.mark.parametrize("max_elements", [97, 7 * 97, 1 << 24])  # 1, 7, all queries a block
def test_knn_matches_brute_force(max_elements: int) -> None:
    points = torch.randn(2, 97, 3, dtype=torch.float64)
    index = knn(points, 16, method="cdist", max_elements=max_elements)
    assert index.shape == (2, 97, 16) and index.dtype == torch.long
    assert torch.equal(index, _brute_force(points, points, 16))
    # Each point is its own nearest neighbour.
    assert torch.equal(index[..., 0], torch.arange(97).expand(2, 97))


def test_knn_separate_queries_and_mask() -> None:
    points = torch.randn(3, 50, 3, dtype=torch.float64)
    queries = torch.randn(3, 20, 3, dtype=torch.float64)
    assert torch.equal(
        knn(points, 5, queries=queries, method="cdist", max_elements=300),
        _brute_force(queries, points, 5),
    )

    mask = torch.rand(3, 50) > 0.4
    mask[:, :8] = True  # at least k valid points per scene
    index = knn(points, 8, mask=mask)
    assert bool(torch.gather(mask, 1, index.flatten(1)).all()), "a masked point was returned"
    far = points.masked_fill(~mask[..., None], 1e6)  # invalid points moved far away
    assert torch.equal(index, _brute_force(points, far, 8))
    with pytest.raises(ValueError, match="takes no mask"):
        knn(points, 8, mask=mask, method="kdtree")


def test_knn_float32_agrees_on_distances() -> None:
    points = torch.rand(1, 300, 3) * 10
    index = knn(points, 16, method="cdist", max_elements=64 * 300)
    reference = _brute_force(points.double(), points.double(), 16)
    d = lambda i: (gather_neighbors(points.double(), i) - points.double()[:, :, None]).norm(dim=-1)  # noqa: E731
    torch.testing.assert_close(d(index), d(reference), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("max_elements", [64, 1 << 24])
def test_knn_breaks_distance_ties_by_index(max_elements: int) -> None:
    # A regular grid: most k-th neighbours are tied with others at the same distance, to the bit;
    # topk alone picks among them differently per CPU kernel set (AVX-512, AVX2, scalar).
    axis = torch.arange(4, dtype=torch.float32) * 0.5
    points = torch.cartesian_prod(axis, axis, axis)[None]  # [1, 64, 3]
    index = knn(points, 9, method="cdist", max_elements=max_elements)
    dist = ((points[0, :, None] - points[0, None]) ** 2).sum(-1).double()  # [64, 64]
    key = dist * 1000 + torch.arange(64, dtype=torch.float64)  # (distance, index) order
    assert torch.equal(index[0], key.argsort(dim=1)[:, :9])


def test_knn_rejects_bad_k() -> None:
    points = torch.randn(1, 10, 3)
    with pytest.raises(ValueError, match=r"k=11 must be in \[1, 10\]"):
        knn(points, 11)
    with pytest.raises(ValueError, match="k=0 must be"):
        knn(points, 0)


def test_gather_neighbors() -> None:
    values = torch.arange(2 * 5 * 3).reshape(2, 5, 3)
    index = torch.tensor([[[4, 0]], [[1, 1]]])  # [B=2, M=1, k=2]
    out = gather_neighbors(values, index)
    assert out.shape == (2, 1, 2, 3)
    assert torch.equal(out[0, 0, 0], values[0, 4]) and torch.equal(out[1, 0, 1], values[1, 1])


def test_knn_attention_is_local() -> None:
    """A point's output depends only on the features of its k nearest neighbours."""
    attention = KNNAttention(32, heads=4, k=8).eval()
    points = torch.randn(1, 60, 3)
    x = torch.randn(1, 60, 32)
    index = knn(points, 8)
    out = attention(x, points)
    outside = torch.ones(60, dtype=torch.bool)
    outside[index[0, 0]] = False
    changed = x.clone()
    changed[0, outside] += torch.randn(int(outside.sum()), 32)
    out_changed = attention(changed, points)
    torch.testing.assert_close(out_changed[0, 0], out[0, 0])
    assert not torch.allclose(out_changed, out), "points that have changed neighbours must change"


def test_knn_attention_similarity_invariance_and_equivariance() -> None:
    """Relative positions normalised by the neighbourhood radius: translating and scaling the cloud
    changes nothing; permuting the points permutes the output."""
    attention = KNNAttention(32, heads=4, k=8).double().eval()
    points = torch.randn(2, 40, 3, dtype=torch.float64)
    x = torch.randn(2, 40, 32, dtype=torch.float64)
    out = attention(x, points)
    moved = attention(x, points * 3.5 + torch.tensor([1.0, -2.0, 5.0], dtype=torch.float64))
    torch.testing.assert_close(moved, out)
    perm = torch.randperm(40)
    torch.testing.assert_close(attention(x[:, perm], points[:, perm]), out[:, perm])


def test_global_attention_mask_hides_keys() -> None:
    attention = GlobalAttention(16, heads=2).eval()
    x = torch.randn(1, 10, 16)
    mask = torch.ones(1, 10, dtype=torch.bool)
    mask[0, 6:] = False
    out = attention(x, mask)
    changed = x.clone()
    changed[0, 6:] = torch.randn(4, 16)
    torch.testing.assert_close(attention(changed, mask)[0, :6], out[0, :6])


def test_point_transformer_forward_backward() -> None:
    model = PointTransformer(32, depth=3, heads=4, k=16)
    assert [b.mode for b in model.blocks] == ["knn", "global", "knn"]
    only_knn = PointTransformer(32, depth=2, global_attention=None)
    assert [b.mode for b in only_knn.blocks] == ["knn", "knn"]
    x = torch.randn(2, 12, 32, requires_grad=True)  # fewer points than k: k is clipped
    points = torch.randn(2, 12, 3, requires_grad=True)
    out = model(x, points)
    assert out.shape == (2, 12, 32)
    out.square().mean().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    assert points.grad is not None and torch.isfinite(points.grad).all()
    for name, param in model.named_parameters():
        assert param.grad is not None and torch.isfinite(param.grad).all(), name


def _copy(source: KNNAttention, **options) -> KNNAttention:
    attention = KNNAttention(source.dim, source.heads, source.k, **options)
    attention.load_state_dict(source.state_dict())
    return attention.double().eval()


@pytest.mark.parametrize("relative_position", [True, False])
def test_knn_attention_arithmetics_and_chunks_agree(relative_position: bool) -> None:
    """The matmul arithmetic and any chunking compute the elementwise attention (float64: only
    rounding differs), with an inner width other than ``dim`` and no biases."""
    torch.manual_seed(0)
    options = dict(inner_dim=24, qkv_bias=False, relative_position=relative_position)
    reference = KNNAttention(16, heads=3, k=8, **options)
    points = torch.randn(2, 50, 3, dtype=torch.float64)
    x = torch.randn(2, 50, 16, dtype=torch.float64)
    out = _copy(reference, **options)(x, points)
    assert out.shape == (2, 50, 16)
    assert reference.q.bias is None and (reference.pos is None) != relative_position
    for variant in (dict(matmul=True), dict(chunk=7), dict(matmul=True, chunk=33)):
        got = _copy(reference, **options, **variant)(x, points)
        torch.testing.assert_close(got, out, rtol=1e-12, atol=1e-12, msg=str(variant))


def test_knn_attention_without_positions_sees_only_features() -> None:
    """Without the relative-position encoding, moving the points while keeping every neighbour
    set changes nothing."""
    attention = KNNAttention(16, heads=2, k=6, relative_position=False).double().eval()
    points = torch.randn(1, 40, 3, dtype=torch.float64)
    x = torch.randn(1, 40, 16, dtype=torch.float64)
    index = knn(points, 6)
    torch.testing.assert_close(attention(x, points * 2.0 + 1.0, index), attention(x, points))
    with pytest.raises(ValueError, match="not divisible by heads 3"):
        KNNAttention(16, heads=3)


def test_view_grid_attention_is_global_across_views() -> None:
    """Every token of every view sees a change in one cell of another view; the output keeps the
    input's shape."""
    torch.manual_seed(0)
    attention = ViewGridAttention(16, heads=2, down=2).eval()
    v, h, w = 3, 4, 6
    x = torch.randn(2, v * h * w, 16)
    out = attention(x, (v, h, w))
    assert out.shape == x.shape
    changed = x.clone()
    changed[:, -1] += 1.0  # the last cell of the last view
    moved = (attention(changed, (v, h, w)) - out).abs().amax(dim=-1)  # [B, V*h*w]
    assert bool((moved[:, : h * w] > 0).all()), "the first view must see the last one"


def test_point_transformer_view_attention_and_no_final_norm() -> None:
    """``global_attention="views"`` interleaves ViewGridAttention, needs the grid, and without
    ``final_norm`` the output is not normalised; bad kinds are refused in one line."""
    torch.manual_seed(0)
    model = PointTransformer(16, depth=4, heads=1, k=4, global_attention="views",
                             global_heads=2, view_down=2, final_norm=False)  # fmt: skip
    kinds = [type(block).__name__ for block in model.blocks]
    assert kinds == ["PointTransformerBlock", "ViewGridAttention"] * 2 and model.norm is None
    assert not any(k.startswith("norm.") for k in model.state_dict())
    x, points = torch.randn(1, 2 * 4 * 4, 16) * 5, torch.randn(1, 2 * 4 * 4, 3)
    out = model(x, points, grid=(2, 4, 4))
    assert out.shape == x.shape and out.std() > 2  # residual stream, not LayerNorm'd
    with pytest.raises(ValueError, match="needs the views' grid"):
        model(x, points)
    with pytest.raises(ValueError, match="global_attention must be one of") as info:
        PointTransformer(16, global_attention=True)
    assert "\n" not in str(info.value)
