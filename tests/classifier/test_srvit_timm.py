"""srvit's timm surface: create_model(pretrained, checkpoint_path), the classifier API, and the DeiT weight recipe."""

import warnings
from pathlib import Path

import pytest
import timm
import torch
from safetensors.torch import save_file
from timm.layers import resample_abs_pos_embed
from torch import nn

import srvit
from loopcore.flops import count_parameters

TINY = dict(img_size=16, patch_size=4, num_classes=7, embed_dim=24, num_heads=2, depth=2)


def tiny(name: str = "vit-s", **overrides) -> srvit.RecursiveViT:
    return srvit.create_model(name, **{**TINY, **overrides}).eval()


def randomize_(model: nn.Module, std: float = 0.05) -> nn.Module:
    """Perturb every parameter (LayerNorm weights away from 1, biases away from 0): a swapped mapping then shows."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * std)
    return model


def timm_vit(**kwargs) -> timm.models.vision_transformer.VisionTransformer:
    """A timm VisionTransformer in DeiT's layout at a tiny size (class token, qkv bias, LayerNorm 1e-6)."""
    args = dict(img_size=16, patch_size=4, num_classes=7, embed_dim=24, depth=2, num_heads=2)
    return timm.models.vision_transformer.VisionTransformer(**{**args, **kwargs}).eval()


# -- create_model(pretrained=..., checkpoint_path=...) -------------------------------------------------------------
def test_pretrained_true_refuses_to_download_and_names_checkpoint_path() -> None:
    with pytest.raises(ValueError, match="downloads no weights.*checkpoint_path"):
        srvit.create_model("vit-s", pretrained=True)
    assert isinstance(srvit.create_model("vit-ti", pretrained=False, **TINY), srvit.RecursiveViT)


def test_checkpoint_path_loads_safetensors_and_nested_pth_files(tmp_path: Path) -> None:
    source = randomize_(tiny("srvit-s", recursion=2))
    ema = randomize_(tiny("srvit-s", recursion=2))
    x = torch.randn(2, 3, 16, 16)
    save_file({k: v.contiguous() for k, v in source.state_dict().items()}, tmp_path / "w.safetensors")
    torch.save({"state_dict": {f"module.{k}": v for k, v in source.state_dict().items()}}, tmp_path / "ddp.pth")
    # timm's load_checkpoint semantics: EMA weights win when the file has them
    torch.save({"model": source.state_dict(), "model_ema": ema.state_dict(), "epoch": 3}, tmp_path / "train.pt")
    for name, expected in (("w.safetensors", source), ("ddp.pth", source), ("train.pt", ema)):
        loaded = srvit.create_model("srvit-s", checkpoint_path=tmp_path / name, **{**TINY, "recursion": 2}).eval()
        assert torch.equal(loaded(x), expected(x)), name
    plain = srvit.create_model("srvit-s", **{**TINY, "recursion": 2}).eval()
    srvit.load_checkpoint(plain, tmp_path / "train.pt", use_ema=False)
    assert torch.equal(plain(x), source(x))


def test_checkpoint_path_errors_name_the_file_and_the_keys(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nope.pth"):
        srvit.create_model("vit-s", checkpoint_path=tmp_path / "nope.pth", **TINY)
    save_file(tiny("srvit-s", recursion=2).state_dict(), tmp_path / "sr.safetensors")
    with pytest.raises(srvit.CheckpointLoadError, match=r"sr\.safetensors.*unexpected keys: fusions\.0\."):
        srvit.create_model("vit-s", checkpoint_path=tmp_path / "sr.safetensors", **TINY)
    with pytest.raises(srvit.CheckpointLoadError, match=r"sr\.safetensors.*missing keys: blocks\.2\."):
        srvit.create_model("srvit-s", checkpoint_path=tmp_path / "sr.safetensors", **{**TINY, "recursion": 2,
                                                                                        "depth": 3})
    with pytest.raises(srvit.CheckpointLoadError, match=r"shape mismatches: head\.bias: file \(7,\) vs model \(3,\)"):
        srvit.create_model("srvit-s", checkpoint_path=tmp_path / "sr.safetensors", **{**TINY, "recursion": 2,
                                                                                        "num_classes": 3})
    (tmp_path / "junk.pth").write_bytes(b"not a checkpoint")
    with pytest.raises(srvit.CheckpointLoadError, match="junk.pth: cannot read a state dict"):
        srvit.create_model("vit-s", checkpoint_path=tmp_path / "junk.pth", **TINY)
    torch.save({"model": {"head.weight": torch.zeros(1), "step": 3}}, tmp_path / "mixed.pth")
    with pytest.raises(srvit.CheckpointLoadError, match="non-tensor entries step"):
        srvit.read_checkpoint(tmp_path / "mixed.pth")


# -- get_classifier / reset_classifier / num_classes=0 ---------------------------------------------------------------
def test_num_classes_zero_is_an_identity_head_returning_pooled_features() -> None:
    model = tiny(num_classes=0)
    assert isinstance(model.get_classifier(), nn.Identity) and model.num_classes == 0 == model.config.num_classes
    x = torch.randn(3, 3, 16, 16)
    features = model(x)
    assert features.shape == (3, 24) == (3, model.num_features)
    torch.testing.assert_close(features, model.forward_features(x)[:, 0])  # the final-normed class token
    with torch.device("meta"):
        assert count_parameters(srvit.create_model("vit-s")) - count_parameters(
            srvit.create_model("vit-s", num_classes=0)) == 384 * 1000 + 1000
    with pytest.raises(ValueError, match="num_classes must be >= 0"):
        tiny(num_classes=-1)


def test_reset_classifier_follows_timm_and_keeps_the_config_in_step(tmp_path: Path) -> None:
    model = randomize_(tiny("srvit-s", recursion=2))
    x = torch.randn(2, 3, 16, 16)
    pooled = model.forward_head(model.forward_features(x), pre_logits=True)
    assert model.get_classifier() is model.head and model.get_classifier().out_features == 7

    model.reset_classifier(0)
    assert isinstance(model.get_classifier(), nn.Identity) and model.num_classes == 0 == model.config.num_classes
    torch.testing.assert_close(model(x), pooled)  # the same trunk: the features the old head read

    model.reset_classifier(5, global_pool="token")
    head = model.get_classifier()
    assert isinstance(head, nn.Linear) and (head.in_features, head.out_features) == (24, 5)
    assert torch.count_nonzero(head.bias) == 0 and 0.005 < head.weight.std() < 0.05  # constructor's init
    assert model(x).shape == (2, 5) and model.num_classes == 5 == model.config.num_classes
    model.save_pretrained(tmp_path / "reset")
    loaded = srvit.RecursiveViT.from_pretrained(tmp_path / "reset").eval()
    assert loaded.num_classes == 5 and torch.equal(loaded(x), model(x))

    model.reset_classifier(0)
    model.save_pretrained(tmp_path / "features")
    loaded = srvit.RecursiveViT.from_pretrained(tmp_path / "features").eval()
    assert isinstance(loaded.head, nn.Identity) and torch.equal(loaded(x), model(x))

    with pytest.raises(ValueError, match="global_pool='avg'"):
        model.reset_classifier(3, global_pool="avg")
    with pytest.raises(ValueError, match="num_classes must be an integer >= 0"):
        model.reset_classifier(-2)
    double = tiny().to(torch.float64)
    double.reset_classifier(4)
    assert double.head.weight.dtype == torch.float64


# -- the DeiT state-dict recipe --------------------------------------------------------------------------------------
def test_deit_small_weights_through_the_recipe_give_timms_logits() -> None:
    """The real deit_small_patch16_224 at full size (random init, no download), fp32 eval, to 1e-5."""
    ref = randomize_(timm.create_model("deit_small_patch16_224", pretrained=False), std=0.02).eval()
    ours = srvit.create_model("vit-s").eval()
    assert srvit.load_timm_vit_state_dict(ours, ref.state_dict()) == []
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        expected = ref(x)
        assert expected.std() > 0.1  # not a degenerate comparison
        torch.testing.assert_close(ours(x), expected, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ours.forward_features(x), ref.forward_features(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("timm_name", "srvit_name"), [("deit_tiny_patch16_224", "vit-ti"),
                                                       ("deit_small_patch16_224", "vit-s"),
                                                       ("deit_base_patch16_224", "vit-b")])
def test_every_deit_maps_key_for_key_and_shape_for_shape_on_meta(timm_name: str, srvit_name: str) -> None:
    with torch.device("meta"):
        ref = timm.create_model(timm_name, pretrained=False)
        ours = srvit.create_model(srvit_name)
        converted = srvit.convert_timm_vit_state_dict(ref.state_dict(), ours)
    own = ours.state_dict()
    assert set(converted) == set(own) and len(own) == 152
    assert all(converted[k].shape == own[k].shape for k in own)


def test_deit_warm_starts_srvit_leaving_only_the_routers_at_init() -> None:
    with torch.device("meta"):
        ref = timm.create_model("deit_small_patch16_224", pretrained=False)
        sr = srvit.create_model("srvit-s", recursion=4)
        left = srvit.load_timm_vit_state_dict(sr, ref.state_dict())
    assert left and all(k.startswith("fusions.") for k in left)
    assert len(left) == sum(1 for k in sr.state_dict() if k.startswith("fusions."))
    small = randomize_(timm_vit())
    sr_small = tiny("srvit-s", recursion=1)  # R = 1: no routers, exactly the ViT
    assert srvit.load_timm_vit_state_dict(sr_small, small.state_dict()) == []
    x = torch.randn(2, 3, 16, 16)
    torch.testing.assert_close(sr_small(x), small(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("timm_name", "message"), [
    ("deit_small_distilled_patch16_224", "distillation token.*dist_token"),
    ("deit3_small_patch16_224", "LayerScale.*ls1.gamma"),
    ("vit_small_patch16_224.augreg_in21k", None),  # same layout: loads
])
def test_timm_features_srvit_lacks_are_refused_by_name(timm_name: str, message: str | None) -> None:
    with torch.device("meta"):
        ref = timm.create_model(timm_name, pretrained=False, num_classes=1000)
        ours = srvit.create_model("vit-s")
        if message is None:
            assert srvit.load_timm_vit_state_dict(ours, ref.state_dict()) == []
            return
        with pytest.raises(srvit.CheckpointLoadError, match=message):
            srvit.load_timm_vit_state_dict(ours, ref.state_dict())


def test_recipe_mismatches_say_what_to_pass() -> None:
    ref = randomize_(timm_vit())
    with pytest.raises(srvit.CheckpointLoadError, match=r"srvit parameters timm lacks: blocks\.2\..*depth"):
        srvit.load_timm_vit_state_dict(tiny(depth=3), ref.state_dict())
    with pytest.raises(srvit.CheckpointLoadError, match="keys outside the timm DeiT/ViT layout: extra.weight"):
        srvit.load_timm_vit_state_dict(tiny(), {**ref.state_dict(), "extra.weight": torch.zeros(1)})

    with pytest.raises(srvit.CheckpointLoadError, match=r"head\.weight: timm \(7, 24\) vs srvit \(3, 24\).*load_head"):
        srvit.load_timm_vit_state_dict(tiny(num_classes=3), ref.state_dict())
    other = tiny(num_classes=3)
    head_before = other.head.weight.clone()
    assert srvit.load_timm_vit_state_dict(other, ref.state_dict(), load_head=False) == ["head.bias", "head.weight"]
    assert torch.equal(other.head.weight, head_before) and torch.equal(other.blocks[1].mlp.fc2.weight,
                                                                       ref.blocks[1].mlp.fc2.weight)

    bigger = tiny(img_size=32)
    with pytest.raises(srvit.CheckpointLoadError, match=r"pos_embed: timm \(1, 17, 24\) vs srvit \(1, 65, 24\)"
                                                        r".*resample_pos_embed=True"):
        srvit.load_timm_vit_state_dict(bigger, ref.state_dict())
    assert srvit.load_timm_vit_state_dict(bigger, ref.state_dict(), resample_pos_embed=True) == []
    expected = resample_abs_pos_embed(ref.pos_embed.detach(), new_size=[8, 8], num_prefix_tokens=1)
    assert torch.equal(bigger.pos_embed.detach(), expected)
    assert torch.equal(bigger.pos_embed[:, 0], ref.pos_embed[:, 0])  # the class token's position is carried over
    assert torch.isfinite(bigger(torch.randn(1, 3, 32, 32))).all()


# -- timm's registry, pretrained_cfg and forward_intermediates ------------------------------------------------------
def test_timm_finds_and_builds_our_classifiers_under_timm_style_names(tmp_path: Path) -> None:
    assert {"srvit_s", "srvit_s_cifar", "bvit_ti", "loopvision_vit_ti_cifar", "loopvision_vit_b"} <= set(
        timm.list_models("*vit*"))
    assert timm.list_models("*srvit*") == sorted(n for n in srvit.TIMM_NAMES if n.startswith("srvit"))
    with torch.device("meta"):
        model = timm.create_model("srvit_s", recursion=2)
    assert model.config.embed_dim == 384 and model.config.recursion == 2 and model.config.img_size == 224
    cifar = timm.create_model("loopvision_vit_ti_cifar", num_classes=7)
    assert (cifar.config.img_size, cifar.config.patch_size, cifar.config.num_classes) == (32, 4, 7)
    with pytest.raises(ValueError, match="checkpoint_path"):
        timm.create_model("loopvision_vit_ti_cifar", pretrained=True)
    save_file(cifar.state_dict(), str(tmp_path / "w.safetensors"))
    again = timm.create_model("loopvision_vit_ti_cifar", num_classes=7,
                              checkpoint_path=str(tmp_path / "w.safetensors")).eval()
    x = torch.rand(2, 3, 32, 32)
    assert torch.equal(again(x), cifar.eval()(x))


def test_resolve_data_config_gives_each_model_its_own_normalisation() -> None:
    from loopdata.transforms import CIFAR10_MEAN, CIFAR10_STD, IMAGENET_MEAN, IMAGENET_STD

    with torch.device("meta"):
        imagenet = timm.data.resolve_data_config(model=timm.create_model("srvit_s"))
    cifar = timm.data.resolve_data_config(model=timm.create_model("bvit_ti_cifar"))
    assert imagenet["input_size"] == (3, 224, 224) and imagenet["mean"] == IMAGENET_MEAN
    assert imagenet["std"] == IMAGENET_STD and imagenet["crop_pct"] == 0.875
    assert cifar["input_size"] == (3, 32, 32) and cifar["mean"] == CIFAR10_MEAN and cifar["std"] == CIFAR10_STD
    assert cifar["crop_pct"] == 1.0
    from srvit.train_config import load_train_config

    # what srvit train builds for a CIFAR run
    trained = srvit.create_model("vit-ti", **load_train_config("cifar10-vit-ti").model_kwargs())
    assert timm.data.resolve_data_config(model=trained)["mean"] == CIFAR10_MEAN


@torch.no_grad()
def test_forward_intermediates_has_timms_signature_and_meaning() -> None:
    model = randomize_(tiny("srvit-s", recursion=2))
    x = torch.rand(2, 3, 16, 16)
    final, inter = model.forward_intermediates(x)
    assert torch.allclose(final, model.forward_features(x), atol=1e-6)
    assert [t.shape for t in inter] == [(2, 24, 4, 4)] * 2  # one NCHW map per stored block
    # timm's ViT gives the same layout: compare against a timm VisionTransformer with the same weights
    vit = randomize_(tiny("vit-s"))
    ref = timm_vit()
    ref.load_state_dict(vit.state_dict())
    ours = vit.forward_intermediates(x, indices=[0, -1], norm=True, intermediates_only=True)
    theirs = ref.forward_intermediates(x, indices=[0, -1], norm=True, intermediates_only=True)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(ours, theirs, strict=True))
    nlc = vit.forward_intermediates(x, indices=1, output_fmt="NLC", return_prefix_tokens=True,
                                    intermediates_only=True)
    assert nlc[0][0].shape == (2, 16, 24) and nlc[0][1].shape == (2, 1, 24)
    bvit = tiny("bvit-s", recursion=5, depth=1)
    assert len(bvit.forward_intermediates(x, intermediates_only=True)) == 5  # one per step of the single block
    assert len(bvit.forward_intermediates(x, indices=2, stop_early=True, intermediates_only=True)) == 2
    with pytest.raises(ValueError, match="out of range"):
        vit.forward_intermediates(x, indices=[5])
    steps = model.forward_steps(x)  # the per-step logits that used to carry this name
    assert len(steps) == 2 and steps[-1].shape == (2, 7) and torch.allclose(steps[-1], model(x), atol=1e-5)


@torch.no_grad()
def test_forward_intermediates_stop_early_returns_the_last_selected_state() -> None:
    bvit = tiny("bvit-s", recursion=5, depth=1)
    x = torch.rand(1, 3, 16, 16)
    final, (last_selected,) = bvit.forward_intermediates(x, indices=[1], stop_early=True, output_fmt="NLC")
    assert torch.allclose(final[:, 1:], bvit.norm(bvit.forward_trace(x).trajectory[1])[:, 1:], atol=1e-6)
    assert torch.allclose(last_selected, bvit.forward_trace(x).trajectory[1][:, 1:], atol=1e-6)
    with pytest.raises(ValueError, match="at least one"):
        bvit.forward_intermediates(x, indices=[])


# -- timm's builder: features_only, in_chans, pretrained cfgs, prefixed names only ----------------------------------
def test_features_only_is_timms_getter_over_forward_intermediates() -> None:
    from timm.models._features import FeatureGetterNet

    args = {**TINY, "depth": 3, "recursion": 2}
    ref = randomize_(timm.create_model("srvit_s", **args)).eval()
    feats = timm.create_model("srvit_s", features_only=True, out_indices=(0, -1), **args).eval()
    assert isinstance(feats, FeatureGetterNet)
    assert feats.feature_info.channels() == [24, 24] and feats.feature_info.reduction() == [4, 4]
    # timm's features_only drops the classifier; the trunk's weights are the full model's
    assert isinstance(feats.model.head, nn.Identity) and "num_classes" not in feats.pretrained_cfg
    feats.model.load_state_dict({k: v for k, v in ref.state_dict().items() if not k.startswith("head.")})
    x = torch.rand(2, 3, 16, 16)
    with torch.no_grad():
        out = feats(x)
        expected = ref.forward_intermediates(x, indices=[0, -1], intermediates_only=True)
    assert [o.shape for o in out] == [(2, 24, 4, 4)] * 2
    assert all(torch.equal(a, b) for a, b in zip(out, expected, strict=True))
    # timm's ViT default: the last 3 states; bViT's states are its steps
    assert len(timm.create_model("srvit_s", features_only=True, **args).feature_info.channels()) == 3
    bvit = timm.create_model("bvit_s", features_only=True, out_indices=2, **{**args, "depth": 1, "recursion": 4})
    assert bvit.feature_info.channels() == [24, 24] and len(bvit.model.feature_info) == 4
    assert [o.shape for o in bvit(x)] == [(2, 24, 4, 4)] * 2


def test_in_chans_one_and_num_classes_zero_build_as_in_timm() -> None:
    gray = timm.create_model("loopvision_vit_s", in_chans=1, **TINY).eval()
    assert gray.patch_embed.proj.weight.shape == (24, 1, 4, 4) and gray.in_chans == 1 == gray.config.in_channels
    assert gray(torch.rand(2, 1, 16, 16)).shape == (2, 7)
    assert timm.data.resolve_data_config(model=gray)["input_size"] == (1, 16, 16)
    assert timm.create_model("srvit_s", in_channels=1, **TINY).config.in_channels == 1  # srvit's spelling
    pooled = timm.create_model("bvit_ti_cifar", **{**TINY, "depth": 1, "num_classes": 0}).eval()
    assert isinstance(pooled.get_classifier(), nn.Identity) and pooled(torch.rand(2, 3, 16, 16)).shape == (2, 24)


def test_get_pretrained_cfg_states_what_each_name_builds() -> None:
    from loopdata.transforms import CIFAR10_MEAN, CIFAR10_STD, IMAGENET_MEAN, IMAGENET_STD

    for name in srvit.TIMM_NAMES:
        cfg = timm.get_pretrained_cfg(name)
        assert cfg is not None and cfg.architecture == name and not cfg.has_weights, name  # nothing downloadable
        cifar = name.endswith("_cifar")
        assert cfg.input_size == ((3, 32, 32) if cifar else (3, 224, 224))
        assert cfg.num_classes == (10 if cifar else 1000)
        assert (cfg.mean, cfg.std) == ((CIFAR10_MEAN, CIFAR10_STD) if cifar else (IMAGENET_MEAN, IMAGENET_STD))
        assert cfg.crop_pct == (1.0 if cifar else 0.875)
    assert not set(srvit.TIMM_NAMES) & set(timm.list_pretrained())
    with torch.device("meta"):
        for name in ("srvit_s", "loopvision_vit_ti_cifar"):
            model, cfg = timm.create_model(name), timm.get_pretrained_cfg(name)
            c = model.config
            assert (c.in_channels, c.img_size, c.img_size) == cfg.input_size and c.num_classes == cfg.num_classes
            assert (tuple(c.data_mean), tuple(c.data_std), c.crop_pct) == (cfg.mean, cfg.std, cfg.crop_pct)
            assert model.pretrained_cfg == cfg.to_dict() and model.default_cfg is model.pretrained_cfg


def test_pretrained_cfg_overlay_is_reflected_in_the_model(tmp_path: Path) -> None:
    overlay = dict(mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25), crop_pct=0.9, description="mine")
    model = timm.create_model("srvit_s_cifar", pretrained_cfg_overlay=overlay, **TINY)
    cfg = model.pretrained_cfg
    assert (cfg["mean"], cfg["std"], cfg["crop_pct"], cfg["description"]) == ((0.5,) * 3, (0.25,) * 3, 0.9, "mine")
    assert cfg["input_size"] == (3, 16, 16) and cfg["num_classes"] == 7  # explicit arguments describe the model
    assert timm.data.resolve_data_config(model=model)["mean"] == (0.5,) * 3
    assert tuple(model.config.data_mean) == (0.5,) * 3 and model.config.crop_pct == 0.9  # kept by save_pretrained
    model.save_pretrained(tmp_path / "m")
    assert srvit.RecursiveViT.from_pretrained(tmp_path / "m").pretrained_cfg["mean"] == (0.5,) * 3
    assert timm.get_pretrained_cfg("srvit_s_cifar").mean != (0.5,) * 3  # the registered cfg is untouched
    with pytest.raises(ValueError, match="data_mean.*pretrained_cfg_overlay mean.*disagree"):
        timm.create_model("srvit_s", pretrained_cfg_overlay=overlay, data_mean=(0.1, 0.1, 0.1), **TINY)


def test_only_prefixed_names_are_registered_with_timm() -> None:
    ours = timm.list_models(module="timm_registration")
    assert sorted(ours) == sorted(srvit.TIMM_NAMES) and len(ours) == 18
    assert all(n.startswith(("srvit_", "bvit_", "loopvision_")) for n in ours)
    for generic in ("vit_ti", "vit_s", "vit_b", "vit_ti_cifar", "vit_s_cifar", "vit_b_cifar"):
        assert generic not in ours
        if timm.is_model(generic):  # a user's or a future timm model: never ours
            assert not timm.models.model_entrypoint(generic).__module__.startswith("srvit")
    entrypoints = [timm.models.model_entrypoint(n) for n in ours]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # timm warns when a name is registered again
        assert srvit.register_with_timm() == srvit.TIMM_NAMES
    assert [timm.models.model_entrypoint(n) for n in ours] == entrypoints


def test_former_timm_names_still_build_in_srvit_create_model_with_a_warning() -> None:
    with pytest.warns(FutureWarning, match="'vit_s' is deprecated.*'loopvision_vit_s'"):
        old = srvit.create_model("vit_s", **TINY)
    assert old.config == srvit.create_model("vit-s", **TINY).config
    with pytest.warns(FutureWarning, match="loopvision_vit_ti_cifar"):
        cifar = srvit.create_model("vit_ti_cifar", embed_dim=24, num_heads=2, depth=1, num_classes=3)
    c = cifar.config
    assert (c.img_size, c.patch_size, c.num_classes, c.family, c.crop_pct) == (32, 4, 3, "vit", 1.0)
    assert tuple(c.data_mean) == srvit.timm_registration.CIFAR10_MEAN
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        srvit.create_model("vit-s", **TINY)  # the srvit names are unchanged and do not warn
    assert not [n for n in srvit.list_models() if "_" in n]
