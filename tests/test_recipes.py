"""Training settings live in recipes, not in the architecture (issue 16 item 2).

Constructors take architecture arguments only; weights saved by an older version, whose
``config.json`` still records the training settings, load unchanged (those keys left out with a
warning); the LightningModule weighs the model's unweighted loss terms with the injected recipe.
"""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest
import torch

from models import create_model, list_models
from models.base import SplatModel
from models.factory import load_model
from models.registry import model_class
from models.training import (
    Recipe,
    ReSplatRecipe,
    SplatLitModule,
    SplatWeaverRecipe,
    ZipSplatRecipe,
    default_recipe,
)

CHECKPOINTS = Path(__file__).resolve().parents[1] / "checkpoints"

# The training settings the shipped config.json files recorded before the recipes (their values
# in the files as committed before the re-export, git history of checkpoints/*/config.json).
OLD_TRAINING_KEYS = {
    "zipsplat_tiny": {
        "anneal_fraction": 0.5,
        "camera_prior_prob": 0.2,
        "chamfer_points": 2048,
        "chamfer_weight": 0.1,
        "r_min_final": 0.5,
        "train_views": 2,
    },
    "resplat_tiny": {"train_iterations": 3, "loss_decay": 0.9, "freeze_init": True},
    "splatweaver_tiny": {"routing_weight": 0.01, "usage_weight": 1.0, "label_smoothing": 0.1},
}


def _context(model, size: int = 32) -> dict[str, torch.Tensor]:
    context = {"image": torch.rand(1, 2, 3, size, size)}
    if not getattr(model, "pose_free", False):
        context["extrinsics"] = torch.eye(4).expand(1, 2, 4, 4).clone()
        context["extrinsics"][:, 1, 0, 3] = 1.0
        intrinsics = torch.tensor([[1.0, 0, 0.5], [0, 1.0, 0.5], [0, 0, 1]])
        context["intrinsics"] = intrinsics.expand(1, 2, 3, 3)
    return context


def test_shipped_configs_hold_architecture_arguments_only() -> None:
    for folder in sorted(p for p in CHECKPOINTS.iterdir() if (p / "config.json").is_file()):
        config = json.loads((folder / "config.json").read_text())
        cls = model_class(config["splatzoo"]["model_name"])
        assert not set(config) & set(cls.retired_args), folder.name
        assert not set(config) & {"train_kwargs", "loss_weights"}


@pytest.mark.parametrize("name", sorted(OLD_TRAINING_KEYS))
def test_old_config_with_training_keys_loads_bit_exact(name: str, tmp_path: Path) -> None:
    """A save_pretrained folder whose config.json still has the removed training keys loads
    through every path (create_model, load_model, the Hub mixin) into the same weights and
    predicts exactly what the re-exported folder predicts."""
    old = tmp_path / name
    shutil.copytree(CHECKPOINTS / name, old)
    config = json.loads((old / "config.json").read_text())
    assert not set(config) & set(OLD_TRAINING_KEYS[name])  # the shipped file is re-exported
    config.update(OLD_TRAINING_KEYS[name])
    (old / "config.json").write_text(json.dumps(config, sort_keys=True, indent=2))

    shipped = create_model(name, pretrained=f"local-dir:{CHECKPOINTS / name}")
    with pytest.warns(UserWarning, match=r"training setting.*recipes\.py") as record:
        via_create = create_model(name, pretrained=str(old))
    assert all(key in str(record[0].message) for key in OLD_TRAINING_KEYS[name])
    with pytest.warns(UserWarning, match="training setting"):
        via_load = load_model(old)
    via_hub = model_class(name).from_pretrained(old)  # the mixin passes known arguments only
    context = _context(shipped)
    with torch.no_grad():
        reference = shipped.eval()(context).gaussians
        for model in (via_create, via_load, via_hub.eval()):
            for key, value in shipped.state_dict().items():
                assert torch.equal(value, model.state_dict()[key]), key
            assert torch.equal(model(context).gaussians.means, reference.means)


def test_constructors_refuse_training_arguments() -> None:
    for name, keys in OLD_TRAINING_KEYS.items():
        key, value = next(iter(keys.items()))
        with pytest.raises(TypeError, match=key):
            create_model(name, **{key: value})


def test_every_family_declares_retired_arguments_it_no_longer_takes() -> None:
    import inspect

    list_models()
    stack, seen = list(SplatModel.__subclasses__()), set()
    while stack:
        cls = stack.pop()
        stack.extend(cls.__subclasses__())
        seen.add(cls)
        accepted = set(inspect.signature(cls.__init__).parameters)
        assert not accepted & set(cls.retired_args), cls.__name__
    families = {getattr(c, "family", None) for c in seen}
    assert {"zipsplat", "resplat", "splatweaver"} <= families


def test_default_recipes_by_family() -> None:
    assert type(default_recipe(create_model("zipsplat_tiny", img_size=32))) is ZipSplatRecipe
    assert type(default_recipe(create_model("resplat_tiny", img_size=32))) is ReSplatRecipe
    assert type(default_recipe(create_model("splatweaver_tiny", img_size=32))) is SplatWeaverRecipe
    assert type(default_recipe(create_model("pixel_aligned_tiny"))) is Recipe
    plain = Recipe(loss_weights={"a": 2.0, "b": 0.0})
    weighted = plain.weigh({"a": torch.tensor(1.5), "b": torch.tensor(3.0), "c": torch.tensor(1.0)})
    assert set(weighted) == {"a", "c"} and float(weighted["a"]) == 3.0


def test_lightning_module_weighs_losses_with_the_injected_recipe() -> None:
    """compute_loss adds the recipe's weighted terms: the logged routing term scales with the
    recipe's weight, and the recipe (not the model) goes into the hyper-parameters."""
    torch.manual_seed(0)
    net = create_model("splatweaver_tiny", img_size=32, posed=True)
    scene = _context(net)
    batch = {"context": scene, "target": {k: v[:, :1] for k, v in scene.items()}}
    terms = {}
    for weight in (0.01, 0.04):
        module = SplatLitModule(net, recipe=SplatWeaverRecipe(routing_weight=weight))
        torch.manual_seed(1)  # the same Gumbel sample of the routing
        _, terms[weight] = module.compute_loss(batch, 0)
        assert module.hparams["recipe"]["routing_weight"] == weight
        assert module.hparams["recipe"]["class"].endswith("SplatWeaverRecipe")
    torch.testing.assert_close(terms[0.04]["loss/routing"], 4 * terms[0.01]["loss/routing"])
    torch.testing.assert_close(terms[0.04]["loss/photometric"], terms[0.01]["loss/photometric"])


def test_resplat_recipe_freezes_and_samples_iterations_in_the_module() -> None:
    net = create_model("resplat_tiny", img_size=32)
    module = SplatLitModule(net, recipe=ReSplatRecipe(train_iterations=2, freeze_init=True))
    assert net.freeze_init and not any(p.requires_grad for p in net.init_model.parameters())
    assert all(p.requires_grad for p in net.updater.parameters())
    scene = _context(net)
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
            "_target_": "models.training.recipes.ZipSplatRecipe",
            "chamfer_weight": 0.2,
            "loss_weights": {"extra": 0.5},
        }
    )
    recipe = instantiate(cfg)
    assert recipe.loss_weights == {"chamfer": 0.2, "extra": 0.5}
    module = SplatLitModule(create_model("zipsplat_tiny", img_size=32), recipe=recipe)
    record = module.hparams["recipe"]
    assert type(record["loss_weights"]) is dict and record["chamfer_weight"] == 0.2
    json.dumps(record)  # plain: checkpoints load with weights_only=True


def test_pose_free_test_step_refines_target_poses() -> None:
    """The module's test step (moved to models/training/) still refines a pose-free model's
    target poses and records both scores."""
    torch.manual_seed(0)
    net = create_model("zipsplat_tiny", img_size=32)
    module = SplatLitModule(net, pose_refinement_steps=2, compute_baselines=False)
    module.eval()
    scene = _context(create_model("pixel_aligned_tiny"))  # posed: targets need cameras
    batch = {"context": scene, "target": {k: v[:, :1] for k, v in scene.items()}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # self.log without a trainer
        with torch.no_grad():
            module.test_step(batch, 0)
    (record,) = module.test_records
    assert {"psnr", "refined_psnr", "ssim", "refined_ssim"} <= set(record)


def test_old_lightning_checkpoint_with_training_keys_loads_and_exports(tmp_path: Path) -> None:
    """A training checkpoint of an older version records the training settings in its
    ``model_config``: load_model and export_checkpoint leave them out and keep every weight."""
    from models.training.export import export_checkpoint
    from models.weights.hub import model_config

    name = "resplat_tiny"
    shipped = create_model(name, pretrained=f"local-dir:{CHECKPOINTS / name}")
    config = {k: v for k, v in model_config(shipped, name).items() if k != "splatzoo"}
    ckpt = tmp_path / "old.ckpt"
    hparams = {
        "model_name": name,
        "model_class": "models.families.resplat.ReSplat",
        "model_config": {**config, **OLD_TRAINING_KEYS[name]},
    }
    state = {f"net.{k}": v for k, v in shipped.state_dict().items()}
    torch.save({"state_dict": state, "hyper_parameters": hparams}, ckpt)
    with pytest.warns(UserWarning, match="training setting"):
        loaded = load_model(ckpt)
    exported = export_checkpoint(ckpt, tmp_path / "export")
    written = json.loads((exported / "config.json").read_text())
    assert not set(written) & set(OLD_TRAINING_KEYS[name])
    again = create_model(name, pretrained=str(exported))
    for model in (loaded, again):
        for key, value in shipped.state_dict().items():
            assert torch.equal(value, model.state_dict()[key]), key
