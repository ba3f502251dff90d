"""The one-level wavelet transform behind SplatWeaver's high-frequency prior."""

from __future__ import annotations

import pytest
import torch

from models.layers.wavelet import (
    detail_bands,
    dwt2,
    high_frequency_energy,
    luminance_dwt,
    rgb_to_luminance,
)

WAVELETS = ("haar", "db2")


def checkerboard(size: int = 16) -> torch.Tensor:
    """A one-pixel black/white checkerboard ``[1, 3, size, size]``."""
    index = torch.arange(size)
    board = (index[:, None] + index[None, :]).remainder(2).float()
    return board.expand(1, 3, size, size).clone()


@pytest.mark.parametrize("wavelet", WAVELETS)
def test_flat_image_has_zero_detail(wavelet: str) -> None:
    image = torch.full((2, 3, 16, 12), 0.37)
    energy = high_frequency_energy(image, wavelet)
    assert energy.shape == (2, 8, 6)
    assert energy.abs().max() < 1e-6
    assert detail_bands(image, wavelet).abs().max() < 1e-6


@pytest.mark.parametrize("wavelet", WAVELETS)
def test_checkerboard_has_high_detail(wavelet: str) -> None:
    energy = high_frequency_energy(checkerboard(), wavelet)
    assert energy.mean() > 0.8
    # Haar: every 2x2 block is [[0, 1], [1, 0]] -> HH = 1, LH = HL = 0: the maximum for [0, 1].
    if wavelet == "haar":
        torch.testing.assert_close(energy, torch.ones_like(energy))


def test_edge_orientation_picks_the_right_band() -> None:
    # A horizontal edge (rows change, columns do not) at an odd row, inside a 2x2 block.
    image = torch.zeros(1, 3, 8, 8)
    image[..., 3:, :] = 1.0
    _, lh, hl, hh = luminance_dwt(image, "haar")
    assert lh.abs().max() > 0.5
    assert hl.abs().max() < 1e-6 and hh.abs().max() < 1e-6
    _, lh, hl, hh = luminance_dwt(image.transpose(-1, -2), "haar")
    assert hl.abs().max() > 0.5
    assert lh.abs().max() < 1e-6 and hh.abs().max() < 1e-6


def test_haar_approximation_is_twice_the_block_mean() -> None:
    x = torch.rand(2, 4, 6, 10)
    ll, *_ = dwt2(x, "haar")
    block_mean = torch.nn.functional.avg_pool2d(x, 2)
    torch.testing.assert_close(ll, 2 * block_mean)


@pytest.mark.parametrize("wavelet", WAVELETS)
def test_periodic_transform_is_orthonormal(wavelet: str) -> None:
    x = torch.rand(3, 2, 8, 12, dtype=torch.float64)
    bands = dwt2(x, wavelet, mode="periodic")
    energy = sum(band.square().sum() for band in bands)
    torch.testing.assert_close(energy, x.square().sum())


@pytest.mark.parametrize("wavelet", WAVELETS)
def test_shapes_odd_sizes_and_leading_dims(wavelet: str) -> None:
    x = torch.rand(2, 3, 5, 7, 9)  # [B, V, C, H, W]
    for band in dwt2(x, wavelet):
        assert band.shape == (2, 3, 5, 4, 5)
    energy = high_frequency_energy(x[:, :, :3], wavelet, full_resolution=True)
    assert energy.shape == (2, 3, 7, 9)


def test_luminance_weights() -> None:
    image = torch.zeros(1, 3, 2, 2)
    image[:, 1] = 1.0
    torch.testing.assert_close(rgb_to_luminance(image), torch.full((1, 1, 2, 2), 0.587))
    torch.testing.assert_close(
        rgb_to_luminance(torch.ones(1, 3, 2, 2)), torch.ones(1, 1, 2, 2), atol=1e-6, rtol=0
    )


@pytest.mark.parametrize("wavelet", WAVELETS)
def test_differentiable(wavelet: str) -> None:
    image = torch.rand(1, 3, 8, 8, requires_grad=True)
    detail_bands(image, wavelet).square().sum().backward()
    assert image.grad is not None and image.grad.abs().sum() > 0
    flat = torch.full((1, 3, 4, 4), 0.5, requires_grad=True)
    high_frequency_energy(flat, wavelet).sum().backward()
    assert torch.isfinite(flat.grad).all()


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="wavelet"):
        dwt2(torch.rand(1, 1, 4, 4), "sym5")
    with pytest.raises(ValueError, match="mode"):
        dwt2(torch.rand(1, 1, 4, 4), "haar", mode="zero")
    with pytest.raises(ValueError, match="even"):
        dwt2(torch.rand(1, 1, 5, 4), "haar", mode="periodic")
    with pytest.raises(ValueError, match="3, H, W"):
        rgb_to_luminance(torch.rand(1, 4, 4, 4))
