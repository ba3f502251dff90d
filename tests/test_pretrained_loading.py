"""The loading path every port uses: pretrained configs (``architecture.tag``), release files read
by a family's ``checkpoint_filter_fn``, Hub downloads with the sha256 check, and one-line errors.

A throwaway family is written to a temporary module and registered, as a contributor's new family
file would be; it has a "release" in its own container format (``{'state_dict': ...}`` with
``encoder.``-prefixed keys), like DepthSplat's.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import sys
from pathlib import Path

import pytest
import torch

from models import create_model, get_pretrained_cfg, list_models, registry
from models.weights import pretrained_cfg as cfg_module
from models.weights.pretrained import PretrainedError, save_pretrained

TOY_MODULE = '''
"""A throwaway family (test only)."""
import torch
from torch import nn

from models.base import ModelOutput, SplatModel
from models.gaussians import Gaussians
from models.pretrained_cfg import PretrainedCfg, register_pretrained_cfgs
from models.registry import register_model


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
    """Registers the throwaway family from a temporary module; unregistered afterwards."""
    data = _release_bytes(tmp_path)
    sha = hashlib.sha256(data).hexdigest()[:8]
    folder = tmp_path / "toy_pkg"
    folder.mkdir()
    (folder / "toy_family.py").write_text(
        TOY_MODULE.replace("{sha}", sha).replace("{{", "{").replace("}}", "}")
    )
    monkeypatch.setattr(registry, "_model_entrypoints", dict(registry._model_entrypoints))
    monkeypatch.setattr(registry, "_model_family", dict(registry._model_family))
    monkeypatch.setattr(cfg_module, "_pretrained_cfgs", dict(cfg_module._pretrained_cfgs))
    monkeypatch.setattr(cfg_module, "_default_tags", dict(cfg_module._default_tags))
    monkeypatch.syspath_prepend(str(folder))
    module = importlib.import_module("toy_family")
    yield module, data, sha
    sys.modules.pop("toy_family", None)


def _context() -> dict[str, torch.Tensor]:
    return {"image": torch.rand(1, 2, 3, 4, 4, generator=torch.Generator().manual_seed(0))}


def test_throwaway_family_is_registered_everywhere(toy, tmp_path: Path) -> None:
    assert "toy_tiny" in list_models() and "toy_tiny" in list_models(family="toy_family")
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
    assert "huggingface-cli download toyorg/toy" in message and "\n" not in message
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
    wrong_sha = tmp_path / "toy-release-0badc0de.pth"  # a name that carries another hash
    wrong_sha.write_bytes(data)
    cases[wrong_sha] = "does not start with 0badc0de"
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


def test_export_release_to_our_folder(toy, tmp_path: Path) -> None:
    from models.training.export import main

    _, data, sha = toy
    release = tmp_path / f"toy-release-{sha}.pth"
    release.write_bytes(data)
    out = tmp_path / "exported"
    assert main([f"release={release}", "model=toy_tiny", f"out={out}"]) == 0
    card = (out / "README.md").read_text()
    assert "license: mit" in card and "made up for a test" in card and "toy_tiny.release" in card
    loaded = create_model("toy_tiny", pretrained=str(out))
    torch.testing.assert_close(loaded.proj.weight, _official_state(4)["encoder.input_proj.weight"])
    assert (
        main([f"release={tmp_path / 'nope.pth'}", "model=toy_tiny", f"out={tmp_path / 'x'}"]) == 2
    )
