"""SplatDataModule: generation on first use, batch format, loaders, Lightning fit, Hydra configs."""

from __future__ import annotations

import json
import pathlib
import shutil
from pathlib import Path

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from datamodules import InputError
from datamodules.readers.chunks import load_chunk
from datamodules.training.chunk_dataset import ChunkDataset
from datamodules.training.datamodule import SplatDataModule
from datamodules.training.samplers import BoundedViewSampler

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
GENERATOR = {"scenes": 6, "resolution": 32, "views": 24, "seed": 1, "test_fraction": 0.34}


def make(root: Path, **kwargs) -> SplatDataModule:
    settings = {
        "image_size": (32, 32),
        "num_target_views": 3,
        "min_context_gap": 8,
        "max_context_gap": 20,
        "near": 0.25,
        "far": 50.0,
        "batch_size": 2,
        "val_batch_size": 1,
        "num_workers": 0,
        "eval_index": root / "evaluation_index.json",
        "val_scenes": 1,
        "generate_if_missing": True,
        "generator": GENERATOR,
        "generator_workers": 1,
    }
    return SplatDataModule(root, **{**settings, **kwargs})


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("dm") / "synthetic_32"
    make(root).prepare_data()  # generates on first use
    return root


def test_generates_on_first_use_once(root: Path) -> None:
    assert (root / "train" / "index.json").is_file() and (root / "metadata.json").is_file()
    stamp = (root / "metadata.json").stat().st_mtime_ns
    make(root).prepare_data()
    assert (root / "metadata.json").stat().st_mtime_ns == stamp  # not regenerated
    with pytest.raises(InputError, match="other settings") as error:
        make(root, generator={**GENERATOR, "kind": "object"}).prepare_data()
    assert str(root) in str(error.value)


def test_batch_format(root: Path) -> None:
    dm = make(root)
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    assert set(batch) == {"context", "target", "scene"}
    assert isinstance(batch["scene"], list) and len(batch["scene"]) == 2
    for role, views in (("context", 2), ("target", 3)):
        part = batch[role]
        assert set(part) == {"image", "extrinsics", "intrinsics", "near", "far", "index", "depth"}
        assert part["image"].shape == (2, views, 3, 32, 32) and part["image"].dtype == torch.float32
        assert part["extrinsics"].shape == (2, views, 4, 4)
        assert part["intrinsics"].shape == (2, views, 3, 3)
        assert part["near"].shape == part["far"].shape == part["index"].shape == (2, views)
        assert part["depth"].shape == (2, views, 32, 32)
        assert 0.25 <= part["depth"].min() and part["depth"].max() <= 50.0
    eye = torch.eye(4).expand(2, 4, 4)
    assert torch.allclose(batch["context"]["extrinsics"][:, 0], eye, atol=1e-5)


def test_validation_and_test_follow_the_evaluation_index(root: Path) -> None:
    dm = make(root)
    dm.setup("validate")
    index = json.loads((root / "evaluation_index.json").read_text())
    first = next(iter(index))
    val = list(dm.val_dataloader())
    assert len(val) == 1 and val[0]["scene"] == [first]
    assert val[0]["context"]["index"][0].tolist() == index[first]["context"]
    again = list(dm.val_dataloader())
    assert torch.equal(again[0]["target"]["image"], val[0]["target"]["image"])  # deterministic
    dm.setup("test")
    scenes = [s for batch in dm.test_dataloader() for s in batch["scene"]]
    assert sorted(scenes) == sorted(index)


class _Probe(L.LightningModule):
    """Checks every training batch and records the gap ranges it saw."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(()))
        self.gaps: list[int] = []

    def training_step(self, batch, batch_idx):
        assert batch["context"]["image"].shape[1:] == (2, 3, 32, 32)
        index = batch["context"]["index"]
        self.gaps += (index[:, 1] - index[:, 0]).tolist()
        return (self.weight - batch["target"]["image"].mean()) ** 2

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_lightning_fit_publishes_the_step(root: Path) -> None:
    dm = make(root, initial_min_context_gap=6, initial_max_context_gap=6, warm_up_steps=1000)
    probe = _Probe()
    trainer = L.Trainer(
        max_steps=3, accelerator="cpu", logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
    )  # fmt: skip
    trainer.fit(probe, datamodule=dm)
    assert dm.step_tracker.get() == 2  # set before the last batch
    assert len(probe.gaps) == 6 and all(6 <= gap <= 7 for gap in probe.gaps)


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return pathlib.Path.touch, (self.marker,)


def test_worker_errors_keep_their_one_line_message(root: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(root / "train", copy / "train")
    chunk = next((copy / "train").glob("*.torch"))
    torch.save([{**s, "url": _Payload(tmp_path / "x")} for s in load_chunk(chunk)], chunk)
    dataset = ChunkDataset(copy, "train", BoundedViewSampler(2, 1, 8, 20))
    with pytest.raises(InputError) as error:
        list(DataLoader(dataset, batch_size=None, num_workers=1))
    message = str(error.value)
    assert (
        message.startswith(str(chunk)) and "refused" in message and len(message.splitlines()) == 1
    )


@pytest.mark.parametrize(
    ("name", "shape", "context", "near"),
    [
        ("synthetic", (64, 64), 2, 0.25),
        ("re10k", (256, 256), 2, 1.0),
        ("acid", (256, 256), 2, 1.0),
        ("dl3dv", (256, 448), 6, 0.5),
    ],
)
def test_hydra_configs(tmp_path: Path, name, shape, context, near) -> None:
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = compose(overrides=[f"+data={name}", "+paths=default", f"paths.data_dir={tmp_path}"])
    dm = instantiate(cfg.data)
    assert isinstance(dm, SplatDataModule)
    assert dm.image_size == shape and dm.num_context_views == context and dm.near == near
    assert dm.root.parent == tmp_path and dm.eval_index is not None
    if name == "synthetic":
        assert dm.root.name == "synthetic_64" and dm.generate_if_missing
        assert dm.eval_index == dm.root / "evaluation_index.json"
        assert dm.generator["views"] == 24 and dm.generator["kind"] == "room"
        assert (
            dm.gaps["min_gap"] >= 6 and dm.gaps["max_gap"] <= 20
        )  # the generator's depth guarantee
        assert dm.gaps["initial_min_gap"] >= 6
    else:
        assert not dm.generate_if_missing
        with pytest.raises(InputError, match="dataset root not found") as error:
            dm.setup("fit")
        assert str(tmp_path / name) in str(error.value)
