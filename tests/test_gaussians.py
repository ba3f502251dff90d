import numpy as np
import pytest
import torch
from plyfile import PlyData

from models import Gaussians


def random_gaussians(b=2, n=50, degree=2, mask=False, seed=0) -> Gaussians:
    g = torch.Generator().manual_seed(seed)
    k = (degree + 1) ** 2
    rot = torch.randn(b, n, 4, generator=g)
    return Gaussians(
        means=torch.randn(b, n, 3, generator=g),
        scales=torch.rand(b, n, 3, generator=g) * 0.1 + 0.01,
        rotations=rot / rot.norm(dim=-1, keepdim=True),
        opacities=torch.rand(b, n, generator=g) * 0.98 + 0.01,
        harmonics=torch.randn(b, n, 3, k, generator=g),
        mask=(torch.rand(b, n, generator=g) > 0.3) if mask else None,
    )


def test_count_and_mask():
    g = random_gaussians(mask=True)
    assert torch.equal(g.count(), g.mask.sum(1))
    assert torch.equal(random_gaussians().count(), torch.tensor([50, 50]))


def test_prune_keeps_most_opaque():
    g = random_gaussians(mask=True)
    pruned = g.prune(max_count=10)
    for b in range(2):
        valid_opacities = g.opacities[b][g.mask[b]]
        expected = torch.sort(valid_opacities, descending=True).values[:10]
        kept = pruned.opacities[b][pruned.valid_mask()[b]]
        assert torch.equal(kept, expected)
    assert pruned.count().tolist() == [10, 10]


def test_prune_min_opacity_gives_masked_batch():
    g = random_gaussians()
    g.opacities[0, :] = 0.9
    g.opacities[1, :] = 0.1
    g.opacities[1, :5] = 0.95
    pruned = g.prune(min_opacity=0.5)
    assert pruned.count().tolist() == [50, 5]
    assert pruned.mask is not None and pruned.num_slots == 50
    assert (pruned.opacities[pruned.mask] >= 0.5).all()


def test_prune_rejects_negative():
    with pytest.raises(ValueError, match="max_count"):
        random_gaussians().prune(max_count=-1)


def test_cat_two_sets():
    a, b = random_gaussians(n=5), random_gaussians(n=7, mask=True, seed=1)
    c = Gaussians.cat([a, b])
    assert c.num_slots == 12
    assert torch.equal(c.count(), 5 + b.count())
    assert torch.equal(c.means[:, :5], a.means)
    with pytest.raises(ValueError, match="SH"):
        Gaussians.cat([a, random_gaussians(degree=1)])


def test_to_detach_and_compact():
    g = random_gaussians(mask=True)
    g.means.requires_grad_(True)
    d = g.detach().to(torch.float64)
    assert not d.means.requires_grad and d.means.dtype == torch.float64
    assert d.mask.dtype == torch.bool
    c = g.compact()
    assert torch.equal(c.count(), g.count())
    assert torch.equal(c.means[0][c.valid_mask()[0]], g.means[0][g.mask[0]])


def test_validate_names_the_field():
    g = random_gaussians()
    g.scales[0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="scales"):
        g.validate()
    bad = random_gaussians()
    bad.opacities = bad.opacities[:, :-1]
    with pytest.raises(ValueError, match="opacities"):
        bad.validate()


@pytest.mark.parametrize("degree", [0, 1, 3])
def test_ply_round_trip_exact(tmp_path, degree):
    g = random_gaussians(degree=degree, mask=True)
    path = tmp_path / "g.ply"
    g.save_ply(path, index=1)
    loaded = Gaussians.load_ply(path)
    ref = g[1]
    valid = ref.mask[0]
    assert loaded.num_slots == int(valid.sum())
    assert torch.equal(loaded.means[0], ref.means[0][valid])
    assert torch.equal(loaded.rotations[0], ref.rotations[0][valid])
    assert torch.equal(loaded.harmonics[0], ref.harmonics[0][valid])
    # logit/log encodings are stored as float32: exact up to a few float32 ulps
    ulp = torch.finfo(torch.float32).eps
    torch.testing.assert_close(loaded.opacities[0], ref.opacities[0][valid], rtol=4 * ulp, atol=ulp)
    torch.testing.assert_close(loaded.scales[0], ref.scales[0][valid], rtol=4 * ulp, atol=0)


def test_ply_property_names_with_plyfile(tmp_path):
    g = random_gaussians(b=1, n=4, degree=1)
    g.save_ply(tmp_path / "g.ply")
    ply = PlyData.read(str(tmp_path / "g.ply"))
    names = [p.name for p in ply["vertex"].properties]
    expected = (
        ["x", "y", "z", "nx", "ny", "nz", "f_dc_0", "f_dc_1", "f_dc_2"]
        + [f"f_rest_{i}" for i in range(9)]
        + ["opacity", "scale_0", "scale_1", "scale_2", "rot_0", "rot_1", "rot_2", "rot_3"]
    )
    assert names == expected
    vertex = ply["vertex"]
    # opacity is a logit, scale a log, f_rest channel-major
    np.testing.assert_allclose(
        1 / (1 + np.exp(-vertex["opacity"])), g.opacities[0].numpy(), rtol=1e-6
    )
    np.testing.assert_allclose(np.exp(vertex["scale_0"]), g.scales[0, :, 0].numpy(), rtol=1e-6)
    np.testing.assert_array_equal(vertex["f_rest_0"], g.harmonics[0, :, 0, 1].numpy())
    np.testing.assert_array_equal(vertex["f_rest_3"], g.harmonics[0, :, 1, 1].numpy())


def test_ply_missing_properties_named(tmp_path):
    from plyfile import PlyElement

    vertex = np.zeros(3, dtype=[("x", "f4"), ("y", "f4"), ("z", "f4"), ("opacity", "f4")])
    path = tmp_path / "bad.ply"
    PlyData([PlyElement.describe(vertex, "vertex")]).write(str(path))
    with pytest.raises(ValueError, match="f_dc_0.*scale_0.*rot_0"):
        Gaussians.load_ply(path)
