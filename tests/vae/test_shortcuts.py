"""The ``shortcuts`` config key: the paper's models have none, old configs keep theirs, and without them
nothing reaches the output except through the convolutions and the looped cores."""

import json
from pathlib import Path

import pytest
import torch

import loopvae
from loopcore.flops import count_macs, count_parameters
from loopvae import LoopVAE
from loopvae.loading import load_artifact

# Exact counted figures (meta device, 256^2, batch 1, encode -> mode -> decode); the paper's are
# 29.07M / 700.92 GMACs for f8d16, so ours are +0.77% / +0.87%.
COUNTED = {
    "loopvae-cnn-f8d16": (29_293_863, 707_053_486_080),
    "loopvae-vit-f8d16": (32_688_423, 917_708_734_464),
    "loopvae-multi": (220_424_105, 2_561_270_611_968),
    "loopvae-cnn-tiny": (350_535, 7_234_480_128),
    "flux-vae-tiny": (1_031_401, 5_630_263_296),
}


def _counts(name: str, **overrides) -> tuple[int, int]:
    with torch.device("meta"):
        model = loopvae.create_model(name, **overrides)
        x = torch.empty(1, 3, 256, 256)
    return count_parameters(model), count_macs(lambda: model.decode(model.encode(x).latent_dist.mode()))


@pytest.mark.parametrize("name", sorted(COUNTED))
def test_counted_figures_are_pinned_and_do_not_depend_on_shortcuts(name: str) -> None:
    assert _counts(name) == COUNTED[name]
    if name.startswith("loopvae-"):
        with torch.device("meta"):
            assert loopvae.create_model(name).config.shortcuts is False
        assert _counts(name, shortcuts=True) == COUNTED[name]  # parameter- and MAC-free paths


def test_the_reference_is_about_three_times_the_tiny_loopvae_like_the_papers_84m_to_29m() -> None:
    ratio = COUNTED["flux-vae-tiny"][0] / COUNTED["loopvae-cnn-tiny"][0]
    paper = 83.82 / 29.07
    assert abs(ratio - paper) < 0.1, (ratio, paper)


def _zero_every_conv(model: torch.nn.Module) -> torch.nn.Module:
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.Conv2d):
                module.weight.zero_()
                if module.bias is not None:
                    module.bias.zero_()
    return model


def test_without_shortcuts_no_information_bypasses_the_convolutions() -> None:
    torch.manual_seed(0)
    x1, x2 = torch.rand(2, 1, 3, 64, 64) * 2 - 1
    for shortcuts in (False, True):
        model = _zero_every_conv(loopvae.create_model("loopvae-cnn-tiny", shortcuts=shortcuts)).eval()
        with torch.no_grad():
            y1, y2 = model(x1).sample, model(x2).sample
        if shortcuts:  # the parameter-free path alone reconstructs: box down- and up-sampling
            assert not torch.equal(y1, y2)
            box = torch.nn.functional.interpolate(torch.nn.functional.avg_pool2d(x1, 8), scale_factor=8.0)
            assert (y1 - x1).pow(2).mean() < 1.5 * (box - x1).pow(2).mean()
        else:  # the cores are the identity at init and every conv is zero: the output ignores the input
            assert torch.equal(y1, y2)


def _drop_shortcuts_key(folder: Path) -> None:
    config_file = folder / "config.json"
    config = json.loads(config_file.read_text())
    del config["shortcuts"]
    config_file.write_text(json.dumps(config))


@pytest.mark.parametrize("layout", ["diffusers", "release"])
def test_a_config_without_the_key_loads_with_its_old_shortcuts(tmp_path: Path, layout: str) -> None:
    from looprun.release import save_release

    torch.manual_seed(0)
    old = loopvae.create_model("loopvae-cnn-tiny", shortcuts=True).eval()
    if layout == "diffusers":
        old.save_pretrained(tmp_path)
    else:
        save_release(old, tmp_path)
    _drop_shortcuts_key(tmp_path)
    loaded = LoopVAE.from_pretrained(tmp_path)
    assert loaded.config.shortcuts is True
    x = torch.rand(1, 3, 64, 64) * 2 - 1
    with torch.no_grad():
        assert torch.equal(loaded(x).sample, old(x).sample)
    assert load_artifact(tmp_path).config.shortcuts is True


def test_a_saved_model_records_shortcuts_false_and_reloads_it(tmp_path: Path) -> None:
    model = loopvae.create_model("loopvae-cnn-tiny")
    model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["shortcuts"] is False
    assert LoopVAE.from_pretrained(tmp_path).config.shortcuts is False
