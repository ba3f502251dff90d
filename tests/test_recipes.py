"""Training settings live in recipes, not in the architecture.

Constructors take architecture arguments only; a ``config.json`` that records a training setting
(or an argument under an old name) does not load, and the one-line error names the key; the
LightningModule weighs the model's unweighted loss terms with the injected recipe.
"""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest
import torch
from data_fixtures import random_context

from models import create_model
from models.core.base import constructor_arguments
from models.training import (
    ReSplatTrainingRecipe,
    SplatLitModule,
    SplatWeaverTrainingRecipe,
    TrainingRecipe,
    ZipSplatTrainingRecipe,
    default_recipe,
)
from models.weights.factory import load_model
from models.weights.hub import PretrainedError
from models.weights.registry import model_class

CHECKPOINTS = Path(__file__).resolve().parents[1] / "checkpoints"

# Training settings of each family (recipe fields, never constructor arguments), one per family.
TRAINING_KEYS = {
    "zipsplat_tiny": {"chamfer_weight": 0.1},
    "resplat_tiny": {"loss_decay": 0.9},
    "splatweaver_tiny": {"routing_weight": 0.01},
}


def test_shipped_configs_hold_constructor_arguments_only() -> None:
    for folder in sorted(p for p in CHECKPOINTS.iterdir() if (p / "config.json").is_file()):
        config = json.loads((folder / "config.json").read_text())
        config.pop("splatzoo")
        named, _ = constructor_arguments(model_class(folder.name))
        assert set(config) <= named, (folder.name, sorted(set(config) - named))


@pytest.mark.parametrize("name", sorted(TRAINING_KEYS))
def test_config_with_a_training_key_fails_naming_it(name: str, tmp_path: Path) -> None:
    """A save_pretrained folder whose config.json records a training setting fails to load by
    name and by folder, one line naming the key."""
    old = tmp_path / name
    shutil.copytree(CHECKPOINTS / name, old)
    config = json.loads((old / "config.json").read_text())
    config.update(TRAINING_KEYS[name])
    (old / "config.json").write_text(json.dumps(config, sort_keys=True, indent=2))
    (key, value), *_ = TRAINING_KEYS[name].items()
    for load in (lambda: create_model(name, pretrained=str(old)), lambda: load_model(old)):
        with pytest.raises(PretrainedError, match=f"{key}={value!r}") as error:
            load()
        assert "\n" not in str(error.value)


def test_config_with_an_old_spelling_names_the_new_key(tmp_path: Path) -> None:
    old = tmp_path / "zipsplat_tiny"
    shutil.copytree(CHECKPOINTS / "zipsplat_tiny", old)
    config = json.loads((old / "config.json").read_text())
    config["img_size"] = config.pop("image_size")
    (old / "config.json").write_text(json.dumps(config, sort_keys=True, indent=2))
    with pytest.raises(PretrainedError, match=r"img_size=64 \(now image_size\)"):
        create_model("zipsplat_tiny", pretrained=str(old))
    weaver = tmp_path / "splatweaver_tiny"
    shutil.copytree(CHECKPOINTS / "splatweaver_tiny", weaver)
    config = json.loads((weaver / "config.json").read_text())
    config["posed"] = not config.pop("pose_free")
    (weaver / "config.json").write_text(json.dumps(config, sort_keys=True, indent=2))
    with pytest.raises(PretrainedError, match=r"posed=True \(now pose_free \(inverted\)\)"):
        load_model(weaver)


def test_constructors_refuse_training_arguments() -> None:
    for name, keys in TRAINING_KEYS.items():
        key, value = next(iter(keys.items()))
        with pytest.raises(TypeError, match=key):
            create_model(name, **{key: value})


def test_default_recipes_by_family() -> None:
    assert (
        type(default_recipe(create_model("zipsplat_tiny", image_size=32))) is ZipSplatTrainingRecipe
    )
    assert (
        type(default_recipe(create_model("resplat_tiny", image_size=32))) is ReSplatTrainingRecipe
    )
    assert (
        type(default_recipe(create_model("splatweaver_tiny", image_size=32)))
        is SplatWeaverTrainingRecipe
    )
    assert type(default_recipe(create_model("pixel_aligned_tiny"))) is TrainingRecipe
    plain = TrainingRecipe(loss_weights={"a": 2.0, "b": 0.0})
    weighted = plain.weigh({"a": torch.tensor(1.5), "b": torch.tensor(3.0), "c": torch.tensor(1.0)})
    assert set(weighted) == {"a", "c"} and float(weighted["a"]) == 3.0


def test_lightning_module_weighs_losses_with_the_injected_recipe() -> None:
    """compute_loss adds the recipe's weighted terms: the logged routing term scales with the
    recipe's weight, and the recipe (not the model) goes into the hyper-parameters."""
    torch.manual_seed(0)
    net = create_model("splatweaver_tiny", image_size=32, pose_free=False)
    scene = random_context(net)
    batch = {"context": scene, "target": {k: v[:, :1] for k, v in scene.items()}}
    terms = {}
    for weight in (0.01, 0.04):
        module = SplatLitModule(net, recipe=SplatWeaverTrainingRecipe(routing_weight=weight))
        torch.manual_seed(1)  # the same Gumbel sample of the routing
        _, terms[weight] = module.compute_loss(batch, 0)
        assert module.hparams["recipe"]["routing_weight"] == weight
        assert module.hparams["recipe"]["class"].endswith("SplatWeaverTrainingRecipe")
    torch.testing.assert_close(terms[0.04]["loss/routing"], 4 * terms[0.01]["loss/routing"])
    torch.testing.assert_close(terms[0.04]["loss/photometric"], terms[0.01]["loss/photometric"])


def test_resplat_recipe_freezes_and_samples_iterations_in_the_module() -> None:
    net = create_model("resplat_tiny", image_size=32)
    module = SplatLitModule(net, recipe=ReSplatTrainingRecipe(train_iterations=2, freeze_init=True))
    assert net.freeze_init and not any(p.requires_grad for p in net.init_model.parameters())
    assert all(p.requires_grad for p in net.updater.parameters())
    scene = random_context(net)
    batch = {"context": scene, "target": {k: v[:, :1] for k, v in scene.items()}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loss, terms = module.compute_loss(batch, 0)
    assert float(terms["train_kwargs/iterations"]) in (1.0, 2.0) and torch.isfinite(loss)


def test_zipsplat_recipe_from_hydra_config_is_plain_in_hparams() -> None:
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    cfg = OmegaConf.create(
        {
            "_target_": "models.training.recipes.ZipSplatTrainingRecipe",
            "chamfer_weight": 0.2,
            "loss_weights": {"extra": 0.5},
        }
    )
    recipe = instantiate(cfg)
    assert recipe.loss_weights == {"chamfer": 0.2, "extra": 0.5}
    module = SplatLitModule(create_model("zipsplat_tiny", image_size=32), recipe=recipe)
    record = module.hparams["recipe"]
    assert type(record["loss_weights"]) is dict and record["chamfer_weight"] == 0.2
    json.dumps(record)  # plain: checkpoints load with weights_only=True


def test_pose_free_test_step_refines_target_poses() -> None:
    """The LightningModule's test step refines a pose-free model's target poses and records both
    scores."""
    torch.manual_seed(0)
    net = create_model("zipsplat_tiny", image_size=32)
    module = SplatLitModule(net, pose_fit_steps=2, compute_baselines=False)
    module.eval()
    scene = random_context(create_model("pixel_aligned_tiny"))  # posed: targets need cameras
    batch = {"context": scene, "target": {k: v[:, :1] for k, v in scene.items()}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # self.log without a trainer
        with torch.no_grad():
            module.test_step(batch, 0)
    (record,) = module.test_records
    assert {"psnr", "refined_psnr", "ssim", "refined_ssim"} <= set(record)


def test_lightning_checkpoint_with_a_training_key_is_refused(tmp_path: Path) -> None:
    """A training checkpoint whose ``model_config`` records a training setting: load_model and
    export_checkpoint refuse it in one line naming the key."""
    from models.training.export import export_checkpoint
    from models.weights.hub import model_config
    from models.weights.publish import ExportError

    name = "resplat_tiny"
    shipped = create_model(name, pretrained=f"local-dir:{CHECKPOINTS / name}")
    config = {k: v for k, v in model_config(shipped, name).items() if k != "splatzoo"}
    ckpt = tmp_path / "old.ckpt"
    hparams = {
        "model_name": name,
        "model_class": "models.families.resplat.ReSplat",
        "model_config": {**config, **TRAINING_KEYS[name]},
    }
    state = {f"net.{k}": v for k, v in shipped.state_dict().items()}
    torch.save({"state_dict": state, "hyper_parameters": hparams}, ckpt)
    with pytest.raises(PretrainedError, match="loss_decay=0.9"):
        load_model(ckpt)
    with pytest.raises(ExportError, match="loss_decay=0.9"):
        export_checkpoint(ckpt, tmp_path / "export")
    assert not (tmp_path / "export").exists()
