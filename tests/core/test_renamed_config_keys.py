"""Renamed configuration keys keep loading: old releases, diffusers folders, run configs and overrides are read
under the new names (stage / pass / ``fusion_mode`` / ``memory_format``) with a warning that names the key,
and build exactly the model the new names build."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
import yaml

import loopvae
import srvit
from looprun.config import ConfigError, RenamedKey, upgrade_renamed_keys
from lv_testing import randomize_


def _rewrite_config(folder: Path, edit) -> None:
    path = folder / "config.json"
    config = json.loads(path.read_text())
    edit(config)
    path.write_text(json.dumps(config))


def test_upgrade_renames_converts_warns_and_refuses_disagreeing_duplicates() -> None:
    renamed = {"channels_last": RenamedKey("memory_format", lambda on: "channels_last" if on else "contiguous")}
    with pytest.warns(FutureWarning, match=r"run.yaml: config key 'channels_last' is deprecated.*memory_format"):
        assert upgrade_renamed_keys({"channels_last": False, "lr": 1}, renamed, "run.yaml") == {
            "memory_format": "contiguous", "lr": 1}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing to upgrade: no warning
        assert upgrade_renamed_keys({"memory_format": "contiguous"}, renamed, "x") == {"memory_format": "contiguous"}
    with pytest.raises(ConfigError, match="'channels_last'.*memory_format='channels_last'.*disagree"):
        upgrade_renamed_keys({"channels_last": False, "memory_format": "channels_last"}, renamed, "x")


@pytest.mark.parametrize("old_fusion,expected_mode", [("softmor", "query"), ("none", "last")])
def test_a_loopvae_release_with_the_old_keys_loads_as_the_same_model(tmp_path: Path, old_fusion, expected_mode):
    model = randomize_(loopvae.create_model(
        "loopvae-cnn-tiny", num_blocks=1, encoder_passes=[1, 2, 1], decoder_passes=[1, 3, 1],
        fusion_mode=expected_mode, sharing="scale"), std=0.05).eval()
    model.save_pretrained(tmp_path)

    def to_old_keys(config: dict) -> None:  # what config.json looked like before the rename
        config["encoder_loops"] = config.pop("encoder_passes")
        config["decoder_loops"] = config.pop("decoder_passes")
        config.pop("fusion_mode")
        config["fusion"] = old_fusion  # an old softmor config without fusion_mode meant the default, query

    _rewrite_config(tmp_path, to_old_keys)
    with pytest.warns(FutureWarning) as caught:
        loaded = loopvae.LoopVAE.from_pretrained(tmp_path).eval()
    messages = " ".join(str(w.message) for w in caught)
    assert "'encoder_loops' is deprecated" in messages and "'decoder_loops' is deprecated" in messages
    assert f"fusion_mode={expected_mode!r}" in messages and str(tmp_path) in messages
    assert list(loaded.config.encoder_passes) == [1, 2, 1] and list(loaded.config.decoder_passes) == [1, 3, 1]
    assert loaded.config.fusion_mode == expected_mode and "fusion" not in loaded.config
    x = torch.rand(1, 3, 32, 32) * 2 - 1
    with torch.no_grad():
        assert torch.equal(loaded(x).sample, model(x).sample)
    loaded.save_pretrained(tmp_path / "resaved")  # what it writes back uses the new names only
    resaved = json.loads((tmp_path / "resaved" / "config.json").read_text())
    assert {"encoder_passes", "decoder_passes", "fusion_mode"} <= set(resaved)
    assert not {"encoder_loops", "decoder_loops", "fusion"} & set(resaved)


def test_a_bad_old_fusion_value_names_the_file(tmp_path: Path) -> None:
    loopvae.create_model("loopvae-cnn-tiny").save_pretrained(tmp_path)
    _rewrite_config(tmp_path, lambda c: c.update(fusion="max"))
    with pytest.raises(ConfigError, match=r"config.json: the deprecated key 'fusion' must be one of"):
        loopvae.LoopVAE.from_pretrained(tmp_path)


def test_old_model_overrides_build_the_same_models() -> None:
    with pytest.warns(FutureWarning) as caught:
        old = loopvae.create_model("loopvae-cnn-tiny", encoder_loops=[1, 1, 2], fusion="softmor", fusion_mode="token")
    messages = " ".join(str(w.message) for w in caught)
    assert "'encoder_loops' is deprecated" in messages and "read as fusion_mode='token'" in messages
    assert list(old.config.encoder_passes) == [1, 1, 2] and old.config.fusion_mode == "token"
    with pytest.warns(FutureWarning, match=r"'fusion' is deprecated and was read as fusion_mode='token'"):
        sr = srvit.create_model("srvit-ti", depth=2, recursion=2, fusion="token")
    assert sr.config.fusion_mode == "token"
    assert [n for n, _ in sr.named_parameters()] == [
        n for n, _ in srvit.create_model("srvit-ti", depth=2, recursion=2, fusion_mode="token").named_parameters()]


def test_an_srvit_release_with_fusion_loads(tmp_path: Path) -> None:
    model = randomize_(srvit.create_model("srvit-ti", depth=2, recursion=2, fusion_mode="token", img_size=32,
                                          patch_size=8, num_classes=3), std=0.02).eval()
    model.save_pretrained(tmp_path)
    _rewrite_config(tmp_path, lambda c: c.update(fusion=c.pop("fusion_mode")))
    with pytest.warns(FutureWarning, match="'fusion' is deprecated"):
        loaded = srvit.RecursiveViT.from_pretrained(tmp_path).eval()
    assert loaded.config.fusion_mode == "token"
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x))


def test_a_loopvae_train_config_with_channels_last_loads(tmp_path: Path) -> None:
    from loopvae.train_config import load_train_config

    old = tmp_path / "old.yaml"
    old.write_text(yaml.safe_dump({"model": "loopvae-cnn-tiny", "channels_last": False}))
    with pytest.warns(FutureWarning, match=rf"{old}: config key 'channels_last' is deprecated"):
        config = load_train_config(str(old))
    assert config.memory_format == "contiguous" and not hasattr(config, "channels_last")
    with pytest.warns(FutureWarning):
        assert load_train_config("tiny-stage1", ["channels_last=true"]).memory_format == "channels_last"
    with pytest.raises(ConfigError, match="memory_format must be one of contiguous, channels_last, got 'nhwc'"):
        load_train_config("tiny-stage1", ["memory_format=nhwc"])
