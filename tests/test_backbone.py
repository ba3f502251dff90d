"""The multi-view ViT backbone and the DPT head."""

from __future__ import annotations

import pytest
import timm
import torch
from safetensors.torch import save_file

from models.layers.backbones import DPTHead, MultiViewTransformer, default_out_layers
from models.layers.backbones.dpt import release_dpt_key
from models.layers.backbones.multiview_vit import VIT_SIZES

# A small but non-trivial configuration: 3 blocks (frame, global, frame), all three returned.
SMALL_CFG = dict(vit_size="tiny", embed_dim=32, depth=3, num_heads=2, out_layers=[0, 1, 2])


def _cameras(b: int, v: int) -> tuple[torch.Tensor, torch.Tensor]:
    extrinsics = torch.eye(4).repeat(b, v, 1, 1)
    extrinsics[:, :, 0, 3] = torch.arange(v, dtype=torch.float32) * 0.5
    intrinsics = torch.tensor([[1.0, 0.0, 0.5], [0.0, 1.0, 0.5], [0.0, 0.0, 1.0]])
    return extrinsics, intrinsics.repeat(b, v, 1, 1)


def _randomize_(module: torch.nn.Module) -> None:
    """Give every parameter (LayerScale, norms, zero-initialised ones) non-trivial values."""
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn_like(p) * 0.1 + (1.0 if p.ndim == 1 else 0.0))


@pytest.mark.parametrize("views", [1, 2, 4])
def test_output_shapes_for_any_view_count(views: int) -> None:
    model = MultiViewTransformer(**SMALL_CFG, use_camera_tokens=True).eval()
    extrinsics, intrinsics = _cameras(2, views)
    out = model(torch.rand(2, views, 3, 64, 64), extrinsics, intrinsics)
    assert out.grid_size == (8, 8)
    assert out.input_size == (64, 64)
    assert len(out.features) == 3 and len(out.cls_tokens) == 3
    for features, cls in zip(out.features, out.cls_tokens):
        assert features.shape == (2, views, 64, 32)
        assert cls.shape == (2, views, 32)
        assert torch.isfinite(features).all()


def test_other_resolutions_resample_positions_and_round_to_patches() -> None:
    model = MultiViewTransformer(**SMALL_CFG).eval()
    out = model(torch.rand(1, 2, 3, 48, 80))  # 6 x 10 patches, pos_embed stored for 8 x 8
    assert out.grid_size == (6, 10)
    assert out.features[0].shape == (1, 2, 60, 32)
    out = model(torch.rand(1, 2, 3, 50, 61))  # sides not multiples of 8: rounded
    assert out.grid_size == (6, 8) and out.input_size == (48, 64)


def test_frame_blocks_do_not_mix_views_and_global_blocks_do() -> None:
    model = MultiViewTransformer(**SMALL_CFG).eval()
    assert model.global_layers == [1]  # frame, global, frame
    images = torch.rand(1, 3, 3, 64, 64)
    perturbed = images.clone()
    perturbed[:, 1] = torch.rand_like(perturbed[:, 1])
    with torch.no_grad():
        a = model(images).features
        b = model(perturbed).features
    # Layer 0 (frame attention only): views 0 and 2 are untouched by view 1's change.
    torch.testing.assert_close(a[0][:, 0], b[0][:, 0], rtol=0, atol=1e-6)
    torch.testing.assert_close(a[0][:, 2], b[0][:, 2], rtol=0, atol=1e-6)
    assert not torch.allclose(a[0][:, 1], b[0][:, 1])
    # After the global block, every view depends on view 1.
    for layer in (1, 2):
        assert (a[layer][:, 0] - b[layer][:, 0]).abs().max() > 1e-4
        assert (a[layer][:, 2] - b[layer][:, 2]).abs().max() > 1e-4


def test_frame_only_model_keeps_views_independent() -> None:
    model = MultiViewTransformer(**{**SMALL_CFG, "global_layers": []}).eval()
    images = torch.rand(1, 2, 3, 64, 64)
    alone = torch.cat([images[:, :1], torch.rand(1, 1, 3, 64, 64)], dim=1)
    with torch.no_grad():
        a = model(images).features[-1]
        b = model(alone).features[-1]
    torch.testing.assert_close(a[:, 0], b[:, 0], rtol=0, atol=1e-6)


def test_reference_view_embedding_marks_view_zero() -> None:
    model = MultiViewTransformer(**SMALL_CFG).eval()
    image = torch.rand(1, 1, 3, 64, 64)
    with torch.no_grad():
        # The same image as view 0 and as view 1 (frame layer 0 sees only its own view).
        out = model(torch.cat([image, image], dim=1)).features[0]
        assert (out[:, 0] - out[:, 1]).abs().max() > 1e-3
        model.ref_embed.zero_()
        out = model(torch.cat([image, image], dim=1)).features[0]
    torch.testing.assert_close(out[:, 0], out[:, 1], rtol=0, atol=1e-6)


def test_camera_conditioning_changes_output_only_when_enabled() -> None:
    images = torch.rand(1, 2, 3, 64, 64)
    ext_a, intr = _cameras(1, 2)
    ext_b = ext_a.clone()
    ext_b[:, 1, :3, 3] += torch.tensor([0.3, -0.2, 0.1])
    torch.manual_seed(1)
    with_cams = MultiViewTransformer(**SMALL_CFG, use_camera_tokens=True).eval()
    torch.manual_seed(1)
    without = MultiViewTransformer(**SMALL_CFG, use_camera_tokens=False).eval()
    with torch.no_grad():
        a = with_cams(images, ext_a, intr).features[-1]
        b = with_cams(images, ext_b, intr).features[-1]
        assert (a - b).abs().max() > 1e-4
        c = without(images, ext_a, intr).features[-1]
        d = without(images, ext_b, intr).features[-1]
        e = without(images).features[-1]
    torch.testing.assert_close(c, d, rtol=0, atol=0)
    torch.testing.assert_close(c, e, rtol=0, atol=0)
    with pytest.raises(ValueError, match="extrinsics and intrinsics"):
        with_cams(images)


def test_default_out_layers() -> None:
    assert default_out_layers(12) == [2, 5, 8, 11]
    assert default_out_layers(6) == [0, 2, 3, 5]
    assert default_out_layers(2) == [0, 1]
    model = MultiViewTransformer(**{**SMALL_CFG, "out_layers": [2, 0, 0]})
    assert model.out_layers == [0, 2]  # deduplicated and sorted
    with pytest.raises(ValueError, match="out of range"):
        MultiViewTransformer(**{**SMALL_CFG, "out_layers": [3]})


@pytest.mark.parametrize("size", ["small", "base", "large"])
def test_names_and_shapes_match_timm_dinov2(size: str) -> None:
    spec = VIT_SIZES[size]
    with torch.device("meta"):
        ours = MultiViewTransformer(size)
        reference = timm.create_model(spec["timm_name"], pretrained=False, **ours.timm_kwargs())
    theirs = {k: tuple(v.shape) for k, v in reference.state_dict().items()}
    mine = {k: tuple(v.shape) for k, v in ours.state_dict().items() if k in set(ours.vit_keys())}
    assert mine == theirs
    assert {"blocks.0.attn.qkv.weight", "blocks.0.ls1.gamma", "patch_embed.proj.weight"} <= set(
        mine
    )


def _tiny_timm_vit(img_size: int, **overrides) -> torch.nn.Module:
    kwargs = dict(embed_dim=32, depth=3, num_heads=2, patch_size=8, init_values=1e-5)
    kwargs.update(overrides)
    model = timm.create_model(
        "vit_small_patch14_dinov2", pretrained=False, img_size=img_size, num_classes=0, **kwargs
    )
    _randomize_(model)
    return model


def test_pretrained_file_loads_through_timm_strictly(tmp_path) -> None:
    reference = _tiny_timm_vit(64)
    path = tmp_path / "tiny_vit.safetensors"
    save_file({k: v.contiguous() for k, v in reference.state_dict().items()}, str(path))

    model = MultiViewTransformer(
        **SMALL_CFG, init_values=1e-5, use_camera_tokens=True, pretrained_backbone=f"file:{path}"
    )
    loaded = model.state_dict()
    for key, value in reference.state_dict().items():
        torch.testing.assert_close(loaded[key], value, rtol=0, atol=0, msg=key)
    assert model.ref_embed.abs().max() == 0 and model.camera_embed.weight.abs().max() == 0

    # With the new embeddings at zero, one view through our model is the timm ViT.
    image = torch.rand(1, 1, 3, 64, 64)
    model.eval()
    reference.eval()
    with torch.no_grad():
        ours = model(image, *_cameras(1, 1)).features[-1][0, 0]
        normalised = (image[0] - model.image_mean) / model.image_std
        theirs = reference.forward_features(normalised)[0, 1:]
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)


def test_pretrained_file_with_other_grid_is_resampled(tmp_path) -> None:
    path = tmp_path / "tiny_vit_32.safetensors"
    save_file(_tiny_timm_vit(32).state_dict(), str(path))
    model = MultiViewTransformer(**SMALL_CFG, init_values=1e-5, pretrained_backbone=str(path))
    assert model.pos_embed.shape == (1, 1 + 64, 32)
    assert model(torch.rand(1, 2, 3, 64, 64)).features[0].shape == (1, 2, 64, 32)


def test_pretrained_loading_is_strict(tmp_path) -> None:
    model = MultiViewTransformer(**SMALL_CFG, init_values=1e-5)
    state = _tiny_timm_vit(64).state_dict()
    model.load_vit_state_dict(state)  # the exact names load
    with pytest.raises(ValueError, match="missing"):
        model.load_vit_state_dict(
            {k: v for k, v in state.items() if k != "blocks.1.attn.qkv.weight"}
        )
    with pytest.raises(ValueError, match="unexpected"):
        model.load_vit_state_dict({**state, "reg_token": torch.zeros(1, 4, 32)})
    with pytest.raises(ValueError, match="shape"):
        model.load_vit_state_dict({**state, "norm.weight": torch.zeros(33)})
    # A file of a different architecture (LayerScale, which tiny lacks) fails in timm's strict
    # load; without LayerScale on both sides it loads.
    path = tmp_path / "layerscale.safetensors"
    save_file(state, str(path))
    with pytest.raises(RuntimeError, match="ls1"):
        MultiViewTransformer(**SMALL_CFG, pretrained_backbone=f"file:{path}")
    save_file(_tiny_timm_vit(64, init_values=0.0).state_dict(), str(path))
    model = MultiViewTransformer(**SMALL_CFG, pretrained_backbone=f"file:{path}")
    assert model.init_values is None and isinstance(model.blocks[0].ls1, torch.nn.Identity)
    with pytest.raises(ValueError, match="no public pretrained weights"):
        MultiViewTransformer(**SMALL_CFG, pretrained_backbone=True)
    with pytest.raises(FileNotFoundError):
        MultiViewTransformer(**SMALL_CFG, pretrained_backbone=f"file:{tmp_path}/absent.safetensors")


def test_gradient_checkpointing_gives_the_same_gradients() -> None:
    model = MultiViewTransformer(**SMALL_CFG)
    images = torch.rand(1, 2, 3, 64, 64)
    model(images).features[-1].square().mean().backward()
    plain = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad()
    model.set_grad_checkpointing(True)
    model(images).features[-1].square().mean().backward()
    again = [p.grad for p in model.parameters() if p.grad is not None]
    for a, b in zip(plain, again):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("size", [(64, 64), (48, 80)])
def test_dpt_outputs_full_resolution(size: tuple[int, int]) -> None:
    backbone = MultiViewTransformer(**{**SMALL_CFG, "depth": 4, "out_layers": [0, 1, 2, 3]})
    head = DPTHead(32, num_layers=4, features=16, out_dim=12, shallow_dim=8)
    images = torch.rand(2, 2, 3, *size)
    out = backbone(images)
    features = head(out.features, out.grid_size, size, images)
    assert features.shape == (4, 12, *size)
    features.mean().backward()
    assert backbone.blocks[0].attn.qkv.weight.grad.abs().sum() > 0
    assert head.shallow[0].weight.grad.abs().sum() > 0


def test_dpt_shallow_features_carry_full_resolution_detail() -> None:
    head = DPTHead(16, num_layers=2, features=8, out_dim=8, shallow_dim=8).eval()
    tokens = [torch.randn(1, 1, 16, 16), torch.randn(1, 1, 16, 16)]  # a 4 x 4 grid
    image = torch.rand(1, 3, 32, 32)
    changed = image.clone()
    changed[:, :, 10, 10] += 0.5  # one pixel
    with torch.no_grad():
        a = head(tokens, (4, 4), (32, 32), image)
        b = head(tokens, (4, 4), (32, 32), changed)
    diff = (a - b).abs().amax(dim=1)[0]  # [H, W]
    # Three 3x3 convolutions at full resolution: the change stays within 3 pixels.
    assert diff[7:14, 7:14].max() > 0
    diff[7:14, 7:14] = 0
    assert diff.max() == 0
    with pytest.raises(ValueError, match="raw image"):
        head(tokens, (4, 4), (32, 32))
    head_no_cnn = DPTHead(16, num_layers=2, features=8, out_dim=4, shallow_dim=0)
    assert head_no_cnn(tokens, (4, 4), (32, 32)).shape == (1, 4, 32, 32)


def test_dpt_release_options_shapes_and_names() -> None:
    """The released wirings: prefix tokens skipped, the fused map at 8x the grid with
    ``upsample_last``, extra maps merged by ``fuse``, no output stage with ``head_dim=0``; the
    released DPT names land on this head's parameters, one to one."""
    vggt = DPTHead(
        16, layer_dims=[8, 8, 16, 16], features=16, token_norm=True, uv_embed=True,
        align_corners=True, rectify=True, upsample_last=True, out_dim=2, out_hidden=4,
        shallow_dim=0,
    )  # fmt: skip
    tokens = [torch.randn(1, 2, 3 + 12, 16) for _ in range(4)]  # 3 prefix tokens, a 3 x 4 grid
    assert vggt(tokens, (3, 4), (42, 56), prefix_tokens=3).shape == (2, 2, 42, 56)
    assert vggt.fuse_maps(vggt.token_maps(tokens, (3, 4), 3)).shape == (2, 8, 24, 32)
    with pytest.raises(ValueError, match="token layers"):
        vggt(tokens[:3], (3, 4), (42, 56), prefix_tokens=3)

    fused = DPTHead(
        16, layer_dims=[8, 8, 16, 16], features=16, align_corners=True, upsample_last=True,
        extra_dims=[5, 0], head_dim=0, out_dim=0, shallow_dim=0,
    )  # fmt: skip
    maps = [torch.randn(2, 16, 3, 4) for _ in range(4)]
    extras = [([torch.randn(2, 2, 12, 16)], [torch.randn(2, 3, 12, 16)]), ([], [])]
    assert fused.fuse_maps(maps, extras).shape == (2, 16, 24, 32)
    with pytest.raises(ValueError, match="extra maps"):
        fused.fuse_maps(maps)
    with pytest.raises(ValueError, match="without an output stage"):
        fused.output_stage(torch.randn(2, 16, 24, 32), (24, 32))
    with pytest.raises(ValueError, match="head_dim=0"):
        DPTHead(16, head_dim=0, out_dim=4, shallow_dim=0)

    released = [
        "norm.weight", "projects.0.weight", "projects.2.bias", "resize_layers.3.weight",
        "concat_projects.1.weight", "scratch.layer4_rn.weight",
        "scratch.refinenet1.resConfUnit1.conv2.bias", "scratch.refinenet4.resConfUnit2.conv1.weight",
        "scratch.refinenet2.out_conv.weight", "scratch.output_conv1.bias",
        "scratch.output_conv2.2.weight",
    ]  # fmt: skip
    ours = [release_dpt_key(name) for name in released]
    assert ours == [
        "norm.weight", "reassemble.0.0.weight", "reassemble.2.bias", "reassemble.3.1.weight",
        "fuse.1.weight", "layer_rn.3.weight", "fusion.0.skip_unit.conv2.bias",
        "fusion.3.unit.conv1.weight", "fusion.1.out_conv.weight", "head_in.bias",
        "head_out.2.weight",
    ]  # fmt: skip
    both = {**vggt.state_dict(), **fused.state_dict()}
    assert all(name in both for name in ours)
    assert release_dpt_key("scratch.output_conv.0.weight") is None  # DepthSplat's refiner head
