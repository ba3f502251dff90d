"""The loading path every port uses: pretrained configs (``architecture.tag``), release files read
by a family's ``checkpoint_filter_fn``, Hub downloads with the sha256 check, the provenance of a
file (the release only when it claims to be one and its sha256 matches), release conversion
(``python -m models.weights.convert``), the families, and one-line errors.

A throwaway family is written to a temporary module and registered, as a contributor's new family
file would be; it has a "release" in its own container format (``{'state_dict': ...}`` with
``encoder.``-prefixed keys), like DepthSplat's. The provenance cases also run on DepthSplat-small
files in the real release format, built from its key manifest (tests/depthsplat_fixtures.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import sys
from pathlib import Path

import pytest
import torch

from models import create_model, families, get_pretrained_cfg, list_models
from models.weights import registry
from models.weights.hub import PretrainedError, save_pretrained

TOY_MODULE = '''
"""A throwaway family (test only)."""
import torch
from torch import nn

from models import (
    Gaussians,
    ModelOutput,
    PretrainedCfg,
    SplatModel,
    register_model,
    register_pretrained_cfgs,
)


class Toy(SplatModel):
    family = "toy"
    pose_free = True

    def __init__(self, width: int = 4) -> None:
        super().__init__()
        self.width = width
        self.proj = nn.Linear(3, width)
        self.out = nn.Linear(width, 14)

    def forward(self, context, **kwargs):
        image = context["image"]  # [B, V, 3, H, W]
        b = image.shape[0]
        pixels = image.flatten(3).transpose(2, 3).reshape(b, -1, 3)  # [B, N, 3]
        raw = self.out(torch.tanh(self.proj(pixels)))  # [B, N, 14]
        gaussians = Gaussians(
            means=raw[..., :3],
            scales=raw[..., 3:6].exp() * 0.01,
            rotations=torch.nn.functional.normalize(raw[..., 6:10] + 1, dim=-1),
            opacities=raw[..., 10].sigmoid(),
            harmonics=raw[..., 11:14, None],
        )
        return ModelOutput(gaussians=gaussians)


@register_model
def toy_tiny(**kwargs) -> Toy:
    return Toy(**{"width": 4, **kwargs})


def checkpoint_filter_fn(checkpoint, model):
    state = checkpoint.get("state_dict", checkpoint) if isinstance(checkpoint, dict) else None
    if not isinstance(state, dict) or not all(k.startswith("encoder.") for k in state):
        raise ValueError("expected {'state_dict': {'encoder.*': ...}} or a bare state dict")
    renamed = {"encoder.input_proj.": "proj.", "encoder.output_proj.": "out."}
    out = {}
    for key, value in state.items():
        for old, new in renamed.items():
            if key.startswith(old):
                out[new + key[len(old):]] = value
                break
        else:
            raise ValueError(f"unknown key {key}")
    return out


register_pretrained_cfgs({
    "toy_tiny.release": PretrainedCfg(
        hf_hub_id="toyorg/toy", hf_hub_filename="toy-release-{sha}.pth", sha256_prefix="{sha}",
        file_format="official", license="MIT", views=2, pose_free=True,
        metrics={{"toy/psnr": 1.0}}, metrics_source="made up for a test",
    ),
    "toy_tiny.wide": PretrainedCfg(
        hf_hub_id="toyorg/toy", hf_hub_filename="toy-wide.pth", file_format="official",
        arch_kwargs={{"width": 8}},
    ),
}})
'''


def _official_state(width: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(width)
    return {
        "encoder.input_proj.weight": torch.randn(width, 3, generator=generator),
        "encoder.input_proj.bias": torch.randn(width, generator=generator),
        "encoder.output_proj.weight": torch.randn(14, width, generator=generator),
        "encoder.output_proj.bias": torch.randn(14, generator=generator),
    }


def _release_bytes(tmp: Path, width: int = 4) -> bytes:
    path = tmp / "release.bin"
    torch.save({"state_dict": _official_state(width)}, path)
    return path.read_bytes()


@pytest.fixture
def toy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Registers the throwaway family as a contributor adds one: a file in ``models/families/``
    (here a temporary folder added to that package's path), found by the families' discovery;
    unregistered afterwards."""
    data = _release_bytes(tmp_path)
    sha = hashlib.sha256(data).hexdigest()[:8]
    folder = tmp_path / "toy_pkg"
    folder.mkdir()
    (folder / "toy_family.py").write_text(
        TOY_MODULE.replace("{sha}", sha).replace("{{", "{").replace("}}", "}")
    )
    monkeypatch.setattr(registry, "_model_entrypoints", dict(registry._model_entrypoints))
    monkeypatch.setattr(registry, "_model_family", dict(registry._model_family))
    monkeypatch.setattr(registry, "_model_classes", dict(registry._model_classes))
    monkeypatch.setattr(registry, "_pretrained_cfgs", dict(registry._pretrained_cfgs))
    monkeypatch.setattr(registry, "_default_tags", dict(registry._default_tags))
    monkeypatch.setattr(families, "__path__", [*families.__path__, str(folder)])
    assert families.import_families() == ["toy_family"]  # discovered, nothing else to edit
    yield sys.modules["models.families.toy_family"], data, sha
    sys.modules.pop("models.families.toy_family", None)


def _context() -> dict[str, torch.Tensor]:
    return {"image": torch.rand(1, 2, 3, 4, 4, generator=torch.Generator().manual_seed(0))}


def test_throwaway_family_is_registered_everywhere(toy, tmp_path: Path) -> None:
    assert "toy_tiny" in list_models() and list_models(family="toy") == ["toy_tiny"]
    assert {"toy_tiny.release", "toy_tiny.wide"} <= set(list_models(pretrained=True))
    cfg = get_pretrained_cfg("toy_tiny")  # the default tag is the first registered
    assert (
        cfg.name == "toy_tiny.release" and cfg.license == "MIT" and cfg.metrics == {"toy/psnr": 1.0}
    )
    model = create_model("toy_tiny")
    saved = save_pretrained(model, tmp_path / "saved")
    loaded = create_model("toy_tiny", pretrained=str(saved))
    torch.testing.assert_close(
        loaded(_context()).gaussians.means, model(_context()).gaussians.means
    )
    # A tag's architecture arguments apply without weights too.
    assert create_model("toy_tiny.wide").width == 8


def test_release_file_loads_through_filter_fn(toy, tmp_path: Path) -> None:
    _, data, _ = toy
    path = tmp_path / "toy-release.pth"
    path.write_bytes(data)
    model = create_model("toy_tiny", pretrained=str(path))
    torch.testing.assert_close(model.proj.weight, _official_state(4)["encoder.input_proj.weight"])
    assert not model.training
    # A bare state dict is accepted too.
    bare = tmp_path / "bare.pt"
    torch.save(_official_state(4), bare)
    model = create_model("toy_tiny", pretrained=str(bare))
    torch.testing.assert_close(model.out.bias, _official_state(4)["encoder.output_proj.bias"])


def _hub_cache(root: Path, repo: str, filename: str, data: bytes) -> None:
    """A file placed in the Hugging Face cache layout, as a download leaves it."""
    folder = root / f"models--{repo.replace('/', '--')}"
    revision = "0" * 40
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(revision)
    (folder / "snapshots" / revision).mkdir(parents=True)
    (folder / "snapshots" / revision / filename).write_bytes(data)


def test_tag_downloads_checks_sha_and_loads(toy, tmp_path: Path, monkeypatch) -> None:
    _, data, sha = toy
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    # Not downloaded: one line saying what to download and how to pass it instead.
    with pytest.raises(PretrainedError) as error:
        create_model("toy_tiny.release", pretrained=True)
    message = str(error.value)
    assert "`hf download toyorg/toy toy-release-" in message and "\n" not in message
    assert "weights=/path/to/toy-release-" in message  # the command-line setting
    # In the cache: hf_hub_download finds it, the sha256 prefix matches, it loads.
    _hub_cache(tmp_path / "cache", "toyorg/toy", f"toy-release-{sha}.pth", data)
    model = create_model("toy_tiny", pretrained=True)
    assert model.pretrained_cfg.name == "toy_tiny.release"
    torch.testing.assert_close(model.proj.bias, _official_state(4)["encoder.input_proj.bias"])


def test_tag_with_altered_file_fails_sha(toy, tmp_path: Path, monkeypatch) -> None:
    _, data, sha = toy
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    _hub_cache(tmp_path / "cache", "toyorg/toy", f"toy-release-{sha}.pth", data + b"x")
    with pytest.raises(PretrainedError, match=f"does not start with {sha}"):
        create_model("toy_tiny.release", pretrained=True)


def test_bad_release_files_are_one_line(toy, tmp_path: Path) -> None:
    _, data, sha = toy
    cases = {}
    wrong_sha = tmp_path / f"toy-release-{sha}.pth"  # the release's name, other bytes
    torch.save({"state_dict": _official_state(5)}, wrong_sha)
    cases[wrong_sha] = f"does not start with {sha}, the digest of the release toy_tiny.release"
    truncated = tmp_path / "truncated.pth"
    truncated.write_bytes(data[: len(data) // 2])
    cases[truncated] = "truncated or corrupt"
    empty = tmp_path / "empty.pth"
    empty.write_bytes(b"")
    cases[empty] = "empty file"
    other_size = tmp_path / "wide.pth"
    torch.save({"state_dict": _official_state(8)}, other_size)
    cases[other_size] = "shape mismatch"
    not_release = tmp_path / "other.pth"
    torch.save({"state_dict": {"backbone.weight": torch.zeros(2)}}, not_release)
    cases[not_release] = "not a release file of 'toy_tiny'"
    code = tmp_path / "code.pth"
    torch.save({"state_dict": _Payload()}, code)
    cases[code] = "would run code"
    missing = tmp_path / "missing.pth"
    cases[missing] = "does not exist"
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    cases[text] = "not a weights file"
    for path, expected in cases.items():
        with pytest.raises(PretrainedError) as error:
            create_model("toy_tiny", pretrained=str(path))
        message = str(error.value)
        assert message.startswith(f"{path}:") or message.startswith(os.fspath(path)), message
        assert expected in message, (path.name, message)
        assert "\n" not in message
    assert not (tmp_path / "pwned").exists()  # the payload never ran


class _Payload:
    def __reduce__(self):
        return (os.system, (f"touch {Path(os.getcwd()) / 'pwned'}",))


def test_family_without_filter_fn_refuses_release_files(tmp_path: Path) -> None:
    path = tmp_path / "x.pth"
    torch.save({"state_dict": {}}, path)
    with pytest.raises(PretrainedError, match="reads no release files"):
        create_model("zipsplat_tiny", pretrained=str(path))


def test_shipped_weights_have_tags() -> None:
    shipped = list_models(pretrained=True)
    for name in ("zipsplat_tiny", "pixel_aligned_tiny", "resplat_tiny", "splatweaver_tiny"):
        assert f"{name}.synthetic64" in shipped
        cfg = get_pretrained_cfg(name)
        assert cfg.local_dir == f"checkpoints/{name}" and cfg.input_size == (64, 64)
    assert get_pretrained_cfg("zipsplat_tiny").pose_free is True
    assert get_pretrained_cfg("pixel_aligned_tiny").pose_free is False
    with pytest.raises(PretrainedError, match="no pretrained weights tagged 'nope'"):
        create_model("zipsplat_tiny.nope", pretrained=True)


def test_convert_release_to_our_folder(toy, tmp_path: Path) -> None:
    from models.weights.convert import main

    _, data, sha = toy
    release = tmp_path / f"toy-release-{sha}.pth"
    release.write_bytes(data)
    out = tmp_path / "exported"
    assert main([f"release={release}", "model=toy_tiny", f"out={out}"]) == 0
    card = (out / "README.md").read_text()
    assert "license: mit" in card and "made up for a test" in card and "toy_tiny.release" in card
    assert f"the release `{release.name}` (sha256 matched)" in card
    loaded = create_model("toy_tiny", pretrained=str(out))
    torch.testing.assert_close(loaded.proj.weight, _official_state(4)["encoder.input_proj.weight"])
    assert (
        main([f"release={tmp_path / 'nope.pth'}", "model=toy_tiny", f"out={tmp_path / 'x'}"]) == 2
    )


def test_convert_command_line(toy, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """``python -m models.weights.convert``: bad arguments are one line and status 2; this
    project's own weights are not a release to convert; a fine-tune converts with a warning."""
    from models.weights.convert import main

    _, data, _ = toy
    bad = {
        ("model=toy_tiny", f"out={tmp_path / 'o'}"): "missing release=",
        ("release=x.pth", "model=toy_tiny", f"out={tmp_path / 'o'}", "bogus=1"): "unknown setting",
        ("release=x.pth", "model=nope_tiny", f"out={tmp_path / 'o'}"): "unknown architecture",
    }
    ours = save_pretrained(create_model("toy_tiny"), tmp_path / "ours")
    bad[(f"release={ours}", "model=toy_tiny", f"out={tmp_path / 'o'}")] = "not in a release's"
    for argv, expected in bad.items():
        assert main(list(argv)) == 2
        err = capsys.readouterr().err
        assert expected in err and err.count("\n") == 1, err
    assert not (tmp_path / "o").exists()
    finetune = tmp_path / "finetune.pth"
    finetune.write_bytes(data)
    assert main([f"release={finetune}", "model=toy_tiny.release", f"out={tmp_path / 'o'}"]) == 0
    err = capsys.readouterr().err
    assert "warning:" in err and "not the release file" in err and err.count("\n") == 1, err


# --------------------------------------------------------------------------- families


def test_every_model_is_in_one_of_the_four_families() -> None:
    """A family is the method: each family's own architectures and its release port."""
    assert registry.list_families() == ["pixel_aligned", "resplat", "splatweaver", "zipsplat"]
    expected = {
        "pixel_aligned": ("pixel_aligned_*", "noposplat_*", "depthsplat_*", "anysplat_*"),
        "zipsplat": ("zipsplat_*",),
        "resplat": ("resplat_*",),
        "splatweaver": ("splatweaver_*",),
    }
    for family, patterns in expected.items():
        names = sorted({n for p in patterns for n in list_models(p)})
        assert list_models(family=family) == names, family
        for name in names:  # one spelling: the registry's family is the class's
            assert registry.model_family(name) == family
            assert registry.model_class(name).family == family
    assert {"zipsplat_da3g", "zipsplat_tiny"} <= set(list_models(family="zipsplat"))
    assert {"depthsplat_small", "noposplat_tiny"} <= set(list_models(family="pixel_aligned"))
    assert {"resplat_small", "resplat_release_tiny"} <= set(list_models(family="resplat"))
    assert "splatweaver_vggt" in list_models(family="splatweaver")
    tags = list_models(pretrained=True, family="zipsplat")
    assert "zipsplat_da3g.re10k_dl3dv_252px" in tags and "zipsplat_tiny.synthetic64" in tags


def test_an_entry_point_must_name_its_family() -> None:
    def no_annotation(**kwargs):
        return torch.nn.Linear(1, 1)

    def no_family(**kwargs) -> torch.nn.Linear:
        return torch.nn.Linear(1, 1)

    with pytest.raises(ValueError, match="must annotate the model class"):
        registry.register_model(no_annotation)
    with pytest.raises(ValueError, match="declares no family"):
        registry.register_model(no_family)
    assert "no_annotation" not in list_models() and "no_family" not in list_models()


# --------------------------------------------------------------------------- provenance
DEPTHSPLAT_TAG = "depthsplat_small.re10k_256x256_view2"


@pytest.fixture(scope="module")
def depthsplat_file(tmp_path_factory) -> Path:
    """DepthSplat-small weights in the release's own container, from its key manifest (a
    "fine-tune": the file's bytes are not the release's)."""
    import depthsplat_fixtures as fx

    path = tmp_path_factory.mktemp("depthsplat_provenance") / "my_finetune.pth"
    torch.save(fx.manifest_weights(fx.load_manifest("small_re10k_256x256_view2")), path)
    return path


def _release_named(depthsplat_file: Path, folder: Path) -> Path:
    path = folder / get_pretrained_cfg(DEPTHSPLAT_TAG).hf_hub_filename
    path.write_bytes(depthsplat_file.read_bytes())
    return path


def test_renamed_release_file_loads_under_the_tag_without_sha_check(depthsplat_file) -> None:
    """``create_model(tag, pretrained=file)``, the file under another name: the tag's
    architecture and recipe, no sha256 check, a warning that it is not the release."""
    from models.families.depthsplat import checkpoint_filter_fn

    with pytest.warns(UserWarning, match="not the release file depthsplat-gs-small-re10k") as seen:
        model = create_model(DEPTHSPLAT_TAG, pretrained=str(depthsplat_file))
    assert any(str(depthsplat_file) in str(w.message) for w in seen)
    assert model.pretrained_cfg.name == DEPTHSPLAT_TAG  # its recipe applies
    assert model.pretrained_cfg.recipe == get_pretrained_cfg(DEPTHSPLAT_TAG).recipe
    reference = checkpoint_filter_fn(torch.load(depthsplat_file, weights_only=True), model)
    for key, value in model.state_dict().items():
        assert torch.equal(value, reference[key]), key
    # what infer.py prints and records in summary.json (model=<tag> weights=<file>)
    from models.pipeline.inference import load_for_inference

    loaded = load_for_inference(DEPTHSPLAT_TAG, str(depthsplat_file))
    assert any("not the release file" in note for note in loaded.notes), loaded.notes
    assert loaded.model.pretrained_cfg.name == DEPTHSPLAT_TAG


def test_file_named_as_the_release_with_another_sha_is_refused(depthsplat_file, tmp_path) -> None:
    named = _release_named(depthsplat_file, tmp_path)
    for name in (DEPTHSPLAT_TAG, "depthsplat_small"):  # the name claims it, tag or not
        with pytest.raises(PretrainedError) as info:
            create_model(name, pretrained=str(named))
        message = str(info.value)
        assert message.startswith(f"{named}: sha256 ") and "\n" not in message, message
        assert f"does not start with {get_pretrained_cfg(DEPTHSPLAT_TAG).sha256_prefix}" in message
        assert "a file of your own needs another name" in message


def test_file_named_as_the_release_with_its_sha_is_the_release(
    depthsplat_file, tmp_path, monkeypatch
) -> None:
    """The release's name and digest (the tag's prefix pointed at the generated file): the file
    is the release; without a tag, its name says which tag it is."""
    import warnings

    from models.weights.hub import resolve_source

    named = _release_named(depthsplat_file, tmp_path)
    sha = hashlib.sha256(named.read_bytes()).hexdigest()[:8]
    cfg = dataclasses.replace(get_pretrained_cfg(DEPTHSPLAT_TAG), sha256_prefix=sha)
    monkeypatch.setitem(registry._pretrained_cfgs, DEPTHSPLAT_TAG, cfg)
    source = resolve_source("depthsplat_small", str(named))
    assert source.is_release and source.pretrained_cfg.name == DEPTHSPLAT_TAG
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the release: no provenance warning
        model = create_model("depthsplat_small", pretrained=str(named))
    assert model.pretrained_cfg.name == DEPTHSPLAT_TAG
    assert not resolve_source(DEPTHSPLAT_TAG, str(depthsplat_file)).is_release


def test_convert_card_says_release_only_when_the_sha_matched(
    depthsplat_file, tmp_path, monkeypatch
) -> None:
    """Converting the renamed file works under the tag (no sha256 check against it) and its
    card calls it a file in the release's format; the release-named file whose digest matches
    is "converted from the release"."""
    from models.weights.convert import convert_release

    with pytest.warns(UserWarning, match="not the release file"):
        out = convert_release(depthsplat_file, DEPTHSPLAT_TAG, tmp_path / "finetune")
    card = (out / "README.md").read_text()
    assert (
        "`my_finetune.pth`, a file in the release's format (not the authors' release file)" in card
    )
    assert "(sha256 matched)" not in card and "authors' release file)" in card
    assert "No metrics were recorded" in card  # the release's facts are not this file's
    assert "| training data |" not in card
    assert f'create_model("{DEPTHSPLAT_TAG}"' in card  # loads back under the tag's recipe
    converted = create_model(DEPTHSPLAT_TAG, pretrained=str(out))
    with pytest.warns(UserWarning, match="not the release file"):
        original = create_model(DEPTHSPLAT_TAG, pretrained=str(depthsplat_file))
    for key, value in converted.state_dict().items():
        assert torch.equal(value, original.state_dict()[key]), key

    named = _release_named(depthsplat_file, tmp_path)
    sha = hashlib.sha256(named.read_bytes()).hexdigest()[:8]
    cfg = dataclasses.replace(get_pretrained_cfg(DEPTHSPLAT_TAG), sha256_prefix=sha)
    monkeypatch.setitem(registry._pretrained_cfgs, DEPTHSPLAT_TAG, cfg)
    out = convert_release(named, "depthsplat_small", tmp_path / "release")
    card = (out / "README.md").read_text()
    assert f"the release `{named.name}` (sha256 matched)" in card
    assert "not the authors' release file" not in card
    assert f"| training data | {cfg.train_data} |" in card  # the release's facts are its own
