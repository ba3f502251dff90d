"""Shared pytest fixtures and markers."""

from __future__ import annotations

import os

# OpenMP's default busy-wait makes torch's CPU kernels crawl on an oversubscribed machine (e.g.
# several pytest or training processes on 2 cores); passive waiting costs little when idle.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from data_fixtures import SHARED_DATA  # noqa: E402


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture
def shared_data() -> Path:
    """``../shared/data`` beside the repository (never copied into it)."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data not found at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture
def one_thread():
    """Small tensor ops are much faster single-threaded on a shared, loaded CPU."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def capture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small synthetic capture: 12 ray-cast 64x64 photos of one room with their cameras
    (``cameras.json``), for the whole-capture and refinement tests."""
    from PIL import Image

    from datamodules.readers.cameras_json import write_cameras_json
    from datamodules.synthetic import render_scene, sample_scene

    photos = 12
    root = tmp_path_factory.mktemp("capture")
    spec = sample_scene(3, "room", num_views=photos)
    pixels, _ = render_scene(spec, 64)
    names = [f"photo_{i:02d}.png" for i in range(photos)]
    for name, array in zip(names, pixels):
        Image.fromarray(array).save(root / name)
    k = torch.from_numpy(spec.intrinsics).float().expand(photos, 3, 3)
    write_cameras_json(
        root / "cameras.json", names, torch.from_numpy(spec.extrinsics).float(), k, (64, 64)
    )
    return root
