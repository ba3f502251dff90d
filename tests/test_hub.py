"""Hugging Face Hub integration: save_pretrained/load round trips for every registered model,
strict loading errors, hf-hub: resolution from a local cache, and models.training.export (release
files: tests/test_pretrained_loading.py)."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from models import create_model, list_models, load_model
from models.core.output_folder import MARKER_NAME
from models.weights.builder import load_pretrained
from models.weights.hub import (
    CONFIG_NAME,
    METADATA_KEY,
    WEIGHTS_NAME,
    PretrainedError,
    default_weights,
    discover_local_weights,
    model_config,
    parse_location,
    save_pretrained,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
TINY = "noposplat_tiny" if "noposplat_tiny" in list_models() else list_models("*_tiny")[0]


@functools.cache
def _family(name: str) -> str:
    with torch.device("meta"):  # no memory, no initialisation: just the class
        return create_model(name).family


def _scramble(model: torch.nn.Module) -> None:
    """Overwrite every parameter and buffer so a load must restore them all."""
    with torch.no_grad():
        for tensor in model.state_dict().values():
            if tensor.is_floating_point():
                tensor.copy_(torch.randn_like(tensor) * 3 + 1)
            elif tensor.dtype == torch.bool:
                tensor.copy_(~tensor)
            else:
                tensor.add_(1)


def _assert_same_state(a: torch.nn.Module, b: torch.nn.Module | dict) -> None:
    sa = a.state_dict()
    sb = b if isinstance(b, dict) else b.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        assert sa[key].dtype == sb[key].dtype, key
        assert torch.equal(sa[key], sb[key]), f"{key} differs after the round trip"


def _params(names: list[str]) -> list:
    """Tiny variants run by default; the larger sizes (seconds each to build) are ``slow``."""
    return [
        pytest.param(n) if n.endswith("_tiny") else pytest.param(n, marks=pytest.mark.slow)
        for n in names
    ]


# --------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("name", _params(list_models()))
def test_round_trip_every_model(name: str, tmp_path: Path) -> None:
    """save_pretrained -> load is bit-exact and strict; config.json has every constructor arg."""
    with torch.device("meta"):  # counted without memory
        count = sum(p.numel() for p in create_model(name).parameters())
    if count > 600_000_000:
        pytest.skip(
            f"{name}: {count / 1e9:.2f} B parameters, a round trip holds three copies (> 14 GB); "
            "its loading is covered by the port's parity tests"
        )
    model = create_model(name)
    reference = {k: v.clone() for k, v in model.state_dict().items()}
    save_pretrained(model, tmp_path, name=name)
    config = json.loads((tmp_path / CONFIG_NAME).read_text())
    assert config[METADATA_KEY] == {
        "family": model.family,
        "model_name": name,
        "class": type(model).__name__,
    }
    assert set(model_config(model)) <= set(config)  # every constructor argument
    _scramble(model)
    loaded = load_pretrained(model, name, f"local-dir:{tmp_path}")
    assert loaded is model and not model.training
    for key, value in model.state_dict().items():
        assert value.dtype == reference[key].dtype, key
        assert torch.equal(value, reference[key]), f"{key} differs after the round trip"
    if name.endswith("_tiny"):
        # The Hub mixin's own loader reads the same folder (config.json -> constructor arguments).
        again = type(model).from_pretrained(tmp_path)
        _assert_same_state(again, model)


def test_create_model_local_dir(tmp_path: Path) -> None:
    model = create_model(TINY)
    model.save_pretrained(tmp_path)  # the plain mixin layout (no metadata) loads too
    loaded = create_model(TINY, pretrained=f"local-dir:{tmp_path}")
    _assert_same_state(model, loaded)
    assert not loaded.training
    # The weights file itself is accepted as well (and a bare folder path: see infer tests).
    _assert_same_state(model, create_model(TINY, pretrained=str(tmp_path / WEIGHTS_NAME)))


def test_forward_identical_after_load(tmp_path: Path) -> None:
    model = create_model(TINY)
    save_pretrained(model, tmp_path)
    loaded = create_model(TINY, pretrained=f"local-dir:{tmp_path}")
    model.eval()
    context = {"image": torch.rand(1, 2, 3, 32, 32)}
    if not getattr(model, "pose_free", False):
        context["extrinsics"] = torch.eye(4).expand(1, 2, 4, 4).clone()
        context["extrinsics"][:, 1, 0, 3] = 1.0
        context["intrinsics"] = torch.tensor([[1.0, 0, 0.5], [0, 1.0, 0.5], [0, 0, 1]]).expand(
            1, 2, 3, 3
        )
    with torch.no_grad():
        a, b = model(context).gaussians, loaded(context).gaussians
    assert torch.equal(a.means, b.means) and torch.equal(a.harmonics, b.harmonics)


# --------------------------------------------------------------------------- errors


def test_strict_key_error_lists_keys(tmp_path: Path) -> None:
    model = create_model(TINY)
    save_pretrained(model, tmp_path)
    state = load_file(str(tmp_path / WEIGHTS_NAME))
    dropped = sorted(state)[0]
    del state[dropped]
    state["extra.weight"] = torch.zeros(3)
    reshaped = sorted(state)[1]
    state[reshaped] = torch.zeros(7, 7)
    save_file(state, str(tmp_path / WEIGHTS_NAME))
    with pytest.raises(PretrainedError) as info:
        create_model(TINY, pretrained=f"local-dir:{tmp_path}")
    message = str(info.value)
    assert str(tmp_path / WEIGHTS_NAME) in message
    assert "1 missing key(s): " + dropped in message
    assert "1 unexpected key(s): extra.weight" in message
    assert f"{reshaped} (7, 7) vs" in message
    assert "\n" not in message


def test_different_model_refused_by_name(tmp_path: Path) -> None:
    names = [n for n in list_models("*_tiny") if n != TINY]
    other = names[0]
    save_pretrained(create_model(other), tmp_path, name=other)
    with pytest.raises(PretrainedError) as info:
        create_model(TINY, pretrained=f"local-dir:{tmp_path}")
    message = str(info.value)
    assert other in message and TINY in message and CONFIG_NAME in message


def _two_families() -> list[tuple[str, str]]:
    first: dict[str, str] = {}
    for name in list_models("*_tiny"):
        first.setdefault(_family(name), name)
    names = list(first.values())
    return [(a, b) for a in names for b in names if a != b][:1]


@pytest.mark.skipif(len({_family(n) for n in list_models("*_tiny")}) < 2, reason="one family")
@pytest.mark.parametrize("source, target", _two_families())
def test_wrong_family_refused(source: str, target: str, tmp_path: Path) -> None:
    """Weights of another family: refused naming both families, with or without metadata."""
    source_model = create_model(source)
    save_pretrained(source_model, tmp_path / "meta", name=source)
    with pytest.raises(PretrainedError) as info:
        create_model(target, pretrained=f"local-dir:{tmp_path / 'meta'}")
    message = str(info.value)
    assert source_model.family in message and _family(target) in message
    source_model.save_pretrained(tmp_path / "plain")  # no metadata: recognised by its arguments
    with pytest.raises(PretrainedError) as info:
        create_model(target, pretrained=f"local-dir:{tmp_path / 'plain'}")
    assert str(tmp_path / "plain") in str(info.value)


def test_foreign_config_arguments_refused(tmp_path: Path) -> None:
    model = create_model(TINY)
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / CONFIG_NAME).read_text())
    config["num_clusters"] = 64
    (tmp_path / CONFIG_NAME).write_text(json.dumps(config))
    with pytest.raises(PretrainedError, match="num_clusters are not constructor arguments"):
        create_model(TINY, pretrained=f"local-dir:{tmp_path}")


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty"])
def test_corrupt_safetensors(damage: str, tmp_path: Path) -> None:
    save_pretrained(create_model(TINY), tmp_path)
    weights = tmp_path / WEIGHTS_NAME
    data = weights.read_bytes()
    if damage == "truncate":
        weights.write_bytes(data[: len(data) // 2])
    elif damage == "garbage":
        weights.write_bytes(b"\x00\x01not a safetensors file" * 10)
    else:
        weights.write_bytes(b"")
    with pytest.raises(PretrainedError) as info:
        create_model(TINY, pretrained=f"local-dir:{tmp_path}")
    assert str(weights) in str(info.value) and "corrupt" in str(info.value)


def test_missing_folder_and_file(tmp_path: Path) -> None:
    with pytest.raises(PretrainedError, match="does not exist"):
        create_model(TINY, pretrained=f"local-dir:{tmp_path / 'nope'}")
    for missing in ("nope.safetensors", "nope.ckpt", "nope.pth"):  # a file by its suffix
        with pytest.raises(PretrainedError, match="weights file does not exist"):
            create_model(TINY, pretrained=str(tmp_path / missing))
    (tmp_path / "empty").mkdir()
    with pytest.raises(PretrainedError, match=f"no {WEIGHTS_NAME}"):
        create_model(TINY, pretrained=f"local-dir:{tmp_path / 'empty'}")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / WEIGHTS_NAME).write_bytes(b"")
    (tmp_path / "bad" / CONFIG_NAME).write_text("{not json")
    with pytest.raises(PretrainedError, match="not valid JSON"):
        create_model(TINY, pretrained=f"local-dir:{tmp_path / 'bad'}")


def test_parse_location() -> None:
    assert parse_location("hf-hub:org/repo") == ("hf-hub", "org/repo", None)
    assert parse_location("hf-hub:org/repo@v1.0") == ("hf-hub", "org/repo", "v1.0")
    assert parse_location("local-dir:/a/b") == ("local-dir", "/a/b", None)
    for bad in ("hf-hub:repo", "hf-hub:org/repo@", "hf-hub:a/b/c"):
        with pytest.raises(PretrainedError):
            parse_location(bad)


# --------------------------------------------------------------------------- defaults


def test_default_weights_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from models.weights import hub

    root = tmp_path / "checkpoints"
    save_pretrained(create_model(TINY), root / TINY)
    (root / "hub").mkdir()  # the download cache is not a model
    (root / "not_a_model").mkdir()
    (root / "not_a_model" / WEIGHTS_NAME).write_bytes(b"")
    (root / "not_a_model" / CONFIG_NAME).write_text("{}")
    assert discover_local_weights(root) == {TINY: f"local-dir:{root / TINY}"}

    monkeypatch.setattr(hub, "CHECKPOINTS_DIR", root)
    monkeypatch.setattr(hub, "HUB_WEIGHTS", {})
    assert default_weights(TINY) == f"local-dir:{root / TINY}"
    model = create_model(TINY, pretrained=True)
    _assert_same_state(model, load_file(str(root / TINY / WEIGHTS_NAME)))
    other = next(n for n in list_models() if n != TINY)
    with pytest.raises(PretrainedError) as info:
        default_weights(other)
    assert f"no default weights for model {other!r} (available: {TINY})" in str(info.value)


# --------------------------------------------------------------------------- hf-hub


def _populate_hub_cache(cache: Path, repo_id: str, folder: Path, refs: dict[str, str]) -> None:
    """Lay out a Hugging Face cache snapshot: models--org--repo/{refs,snapshots}."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    for ref, commit in refs.items():
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / ref).write_text(commit)
        snapshot = repo / "snapshots" / commit
        snapshot.mkdir(parents=True, exist_ok=True)
        for file in folder.iterdir():
            (snapshot / file.name).write_bytes(file.read_bytes())


def test_hf_hub_from_local_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = create_model(TINY)
    save_pretrained(model, tmp_path / "export")
    reference = {k: v.clone() for k, v in model.state_dict().items()}
    _scramble(model)  # a second revision with other weights
    save_pretrained(model, tmp_path / "export_v2")
    other = {k: v.clone() for k, v in model.state_dict().items()}
    cache = tmp_path / "hf_cache"
    _populate_hub_cache(cache, "splatzoo/tiny", tmp_path / "export", {"main": "a" * 40})
    _populate_hub_cache(cache, "splatzoo/tiny", tmp_path / "export_v2", {"v2": "b" * 40})
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _assert_same_state(create_model(TINY, pretrained="hf-hub:splatzoo/tiny"), reference)
    _assert_same_state(load_pretrained(model, TINY, "hf-hub:splatzoo/tiny@v2"), other)
    _assert_same_state(load_pretrained(model, TINY, "hf-hub:splatzoo/tiny@main"), reference)
    with pytest.raises(PretrainedError) as info:
        create_model(TINY, pretrained="hf-hub:splatzoo/missing")
    assert "hf-hub:splatzoo/missing" in str(info.value)
    assert "HF_HUB_OFFLINE" in str(info.value)


# --------------------------------------------------------------------------- export


@pytest.fixture(scope="module")
def lightning_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    """A real Lightning checkpoint of ``SplatLitModule`` (hparams through OmegaConf, as Hydra
    passes them) with a best-score callback state."""
    lightning = pytest.importorskip("lightning")
    from omegaconf import OmegaConf

    from models.training.module import SplatLitModule

    net = create_model(TINY)
    module = SplatLitModule(net, betas=OmegaConf.create([0.9, 0.95]), eval_kwargs={})
    trainer = lightning.Trainer(
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
    )
    trainer.strategy.connect(module)
    path = tmp_path_factory.mktemp("ckpt") / "last.ckpt"
    trainer.save_checkpoint(path)
    checkpoint = torch.load(path, weights_only=False)  # test-only: add a monitored best score
    checkpoint["callbacks"] = {
        "ModelCheckpoint{'monitor': 'val/psnr'}": {
            "monitor": "val/psnr",
            "best_model_score": torch.tensor(21.5),
        }
    }
    checkpoint["hyper_parameters"]["data_name"] = "synthetic rooms"
    checkpoint["hyper_parameters"]["resolution"] = 64
    torch.save(checkpoint, path)
    return path, net


def test_export_checkpoint(lightning_checkpoint, tmp_path: Path) -> None:
    from models.training.export import export_checkpoint

    ckpt, net = lightning_checkpoint
    out = export_checkpoint(ckpt, tmp_path / "export", metrics={"test/psnr": 20.25})
    assert sorted(p.name for p in out.iterdir()) == [
        MARKER_NAME,
        "README.md",
        CONFIG_NAME,
        WEIGHTS_NAME,
    ]
    loaded = create_model(TINY, pretrained=f"local-dir:{out}")
    _assert_same_state(net, loaded)
    card = (out / "README.md").read_text()
    for text in (TINY, net.family, "synthetic rooms", "64x64", "val/psnr (best) | 21.5", "20.25"):
        assert text in card, text
    assert "library_name: splatzoo" in card
    config = json.loads((out / CONFIG_NAME).read_text())
    assert config[METADATA_KEY]["model_name"] == TINY
    assert config["pretrained_backbone"] is False
    # Refuses a non-empty output unless overwrite.
    from models.weights.publish import ExportError

    with pytest.raises(ExportError, match="already holds files"):
        export_checkpoint(ckpt, out)
    export_checkpoint(ckpt, out, overwrite=True)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left


def test_load_lightning_checkpoint_directly(lightning_checkpoint) -> None:
    ckpt, net = lightning_checkpoint
    _assert_same_state(net, create_model(TINY, pretrained=str(ckpt)))


def test_load_model_builds_what_the_weights_describe(lightning_checkpoint, tmp_path: Path) -> None:
    ckpt, net = lightning_checkpoint
    from_ckpt = load_model(ckpt)  # no registry name given: the checkpoint's hparams tell it
    assert from_ckpt.registry_name == TINY and not from_ckpt.training
    _assert_same_state(net, from_ckpt)
    folder = tmp_path / "saved"
    save_pretrained(net, folder, name=TINY)
    from_folder = load_model(f"local-dir:{folder}")
    assert from_folder.registry_name == TINY
    _assert_same_state(net, from_folder)
    (folder / CONFIG_NAME).write_text("{}")  # a config that does not say what it is
    with pytest.raises(PretrainedError, match="which registry model"):
        load_model(folder)


def _run_export(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "models.training.export", *args],
        cwd=REPO_ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_export_cli_push_offline_fails_cleanly(lightning_checkpoint, tmp_path: Path) -> None:
    ckpt, _ = lightning_checkpoint
    out = tmp_path / "export"
    result = _run_export(
        f"ckpt={ckpt}", f"out={out}", "push_to_hub=splatzoo/test-repo", HF_HUB_OFFLINE="1"
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr
    assert "hf-hub:splatzoo/test-repo" in lines[0] and "offline" in lines[0]
    assert (out / WEIGHTS_NAME).is_file()  # the local export itself completed


def test_export_cli_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """``models.training.export.main`` (what ``python -m models.training.export`` runs): one line, status 2."""
    from models.training.export import main

    bad = tmp_path / "bad.ckpt"
    bad.write_bytes(b"this is not a checkpoint")
    cases = [
        ([f"ckpt={bad}", f"out={tmp_path / 'out'}"], str(bad)),
        ([f"ckpt={tmp_path / 'missing.ckpt'}", f"out={tmp_path / 'out'}"], "missing.ckpt"),
        ([f"out={tmp_path / 'out'}"], "missing ckpt=..."),
        # release files convert with the weights' own command, which the usage names
        (["release=x.pth", f"out={tmp_path / 'out'}"], "python -m models.weights.convert"),
        ([f"ckpt={bad}", f"out={tmp_path / 'out'}", "colour=red"], "unknown setting"),
    ]
    for argv, expected in cases:
        capsys.readouterr()
        assert main(argv) == 2, argv
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and expected in lines[0], (argv, lines)
    assert not (tmp_path / "out").exists()


def test_checkpoint_with_code_is_refused(tmp_path: Path) -> None:
    """weights_only: a checkpoint that pickles an arbitrary callable is not executed."""
    path = tmp_path / "evil.ckpt"
    torch.save({"state_dict": {"net.w": torch.zeros(1)}, "hook": os.getcwd}, path)
    with pytest.raises(PretrainedError, match="weights_only=True"):
        create_model(TINY, pretrained=str(path))


def test_pretrained_builds_with_the_recorded_arguments(tmp_path: Path) -> None:
    """Weights trained with non-default constructor arguments load by registry name alone."""
    trained = create_model("splatweaver_tiny", pose_free=False, num_experts=2)
    save_pretrained(trained, tmp_path / "weaver", name="splatweaver_tiny")
    loaded = create_model("splatweaver_tiny", pretrained=f"local-dir:{tmp_path / 'weaver'}")
    assert not loaded.pose_free and loaded.num_experts == 2
    _assert_same_state(trained, loaded)
    # Explicit arguments still win over the recorded ones.
    budget = create_model(
        "splatweaver_tiny", pretrained=str(tmp_path / "weaver"), target_gaussians_per_pixel=0.8
    )
    assert not budget.pose_free and budget.target_usage.mul(torch.arange(3)).sum() == pytest.approx(
        0.8
    )
    # Weights of another model are still refused by name, not built with its arguments.
    with pytest.raises(PretrainedError, match="splatweaver_tiny"):
        create_model("zipsplat_tiny", pretrained=str(tmp_path / "weaver"))


def test_recorded_arguments_this_version_does_not_take_are_refused(tmp_path: Path) -> None:
    """A training checkpoint saved with an option this version does not have fails to load, one
    line naming the option (nothing is dropped silently)."""
    trained = create_model("splatweaver_tiny", pose_free=False)
    arguments = {"pose_free": False, "option_removed_since": False}
    checkpoint = {
        "state_dict": {f"net.{k}": v for k, v in trained.state_dict().items()},
        "hyper_parameters": {"model_name": "splatweaver_tiny", "model_config": arguments},
    }
    torch.save(checkpoint, tmp_path / "last.ckpt")
    with pytest.raises(PretrainedError, match="option_removed_since=False") as error:
        create_model("splatweaver_tiny", pretrained=str(tmp_path / "last.ckpt"))
    assert "\n" not in str(error.value)
