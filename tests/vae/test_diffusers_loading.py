"""Loading LoopVAE folders through diffusers' generic entry points, and the config fields diffusers reads.

``diffusers.AutoModel.from_pretrained(folder)`` returns a LoopVAE once ``loopvae`` is imported (the import
registers the class where AutoModel looks a ``config.json``'s ``_class_name`` up); without the import it
raises, naming the class. ``AutoencoderKL.from_pretrained`` on a LoopVAE folder builds a randomly initialised
AutoencoderKL (diffusers only logs the unused weights): pinned here so the warning in the docs stays true.
"""

import json
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from diffusers import AutoencoderKL, AutoModel

import looprun.release
import loopvae
from loopvae import LoopVAE
from loopvae.demo import bundled_model_dir
from lv_testing import randomize_


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@torch.no_grad()
def test_automodel_loads_the_bundled_release_as_the_loopvae_it_is(monkeypatch) -> None:
    folder = bundled_model_dir()
    calls = []
    load_release = looprun.release.load_release
    monkeypatch.setattr(looprun.release, "load_release", lambda *a, **k: calls.append(a[1]) or load_release(*a, **k))
    model = AutoModel.from_pretrained(str(folder))  # AutoModel takes str paths (a Path fails in its load-id join)
    assert calls == [folder]  # the release loader (sha256 and layout checks), as LoopVAE.from_pretrained takes
    expected = LoopVAE.from_pretrained(folder)
    assert type(model) is LoopVAE and not model.training
    assert _same_weights(model, expected) and dict(model.config) == dict(expected.config)
    x = torch.rand(1, 3, 32, 32) * 2 - 1
    assert torch.equal(model(x).sample, expected.eval()(x).sample)
    assert AutoModel.from_pretrained(str(folder), torch_dtype=torch.bfloat16).dtype == torch.bfloat16


def test_automodel_loads_a_save_pretrained_folder(tmp_path: Path) -> None:
    torch.manual_seed(0)
    vae = randomize_(loopvae.create_model("loopvae-cnn-tiny"))
    vae.save_pretrained(tmp_path / "vae")
    assert "auto_map" not in json.loads((tmp_path / "vae" / "config.json").read_text())  # no remote-code key
    loaded = AutoModel.from_pretrained(str(tmp_path / "vae"))
    assert type(loaded) is LoopVAE and _same_weights(loaded, vae)


IMPORT_ORDER_SCRIPT = """
import sys
from diffusers import AutoModel
try:
    AutoModel.from_pretrained(sys.argv[1])
except ValueError as err:
    print("ERROR:", err)
import loopvae
print("LOADED:", type(AutoModel.from_pretrained(sys.argv[1])).__name__)
"""


def test_without_import_loopvae_automodel_raises_naming_the_class() -> None:
    """The failure the docs describe, and its fix: ``import loopvae`` before ``AutoModel.from_pretrained``."""
    out = subprocess.run([sys.executable, "-c", IMPORT_ORDER_SCRIPT, str(bundled_model_dir())], capture_output=True,
                         text=True, check=True).stdout
    assert "ERROR: `diffusers` has no class `LoopVAE`" in out, out
    assert out.strip().endswith("LOADED: LoopVAE"), out


def test_autoencoderkl_from_pretrained_on_a_loopvae_folder_is_not_the_loopvae() -> None:
    """diffusers raises nothing here: it builds an AutoencoderKL from the shared config keys, with random weights,
    and logs the unused LoopVAE tensors. The docs warn about it; this pins the behaviour they describe."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        wrong = AutoencoderKL.from_pretrained(bundled_model_dir())
    assert type(wrong) is AutoencoderKL
    assert not set(wrong.state_dict()) & set(LoopVAE.from_pretrained(bundled_model_dir()).state_dict())


def test_block_out_channels_are_the_widths_per_level_and_give_the_latent_factor() -> None:
    small = dict(num_blocks=1, norm_num_groups=4, latent_channels=4)
    for factor, passes, width in ((4, (1, 1), 16), (8, (1, 1, 1), 24), (16, (1, 1, 1, 1), 8)):
        vae = LoopVAE(width=width, latent_factor=factor, encoder_passes=passes, decoder_passes=passes, **small)
        assert list(vae.config.block_out_channels) == loopvae.model.level_widths(width, factor) == [width] * (
            len(passes) + 1)
        assert 2 ** (len(vae.config.block_out_channels) - 1) == factor  # diffusers pipelines' vae_scale_factor
    assert list(loopvae.create_model("loopvae-cnn-tiny").config.block_out_channels) == [48] * 4
    assert list(LoopVAE.from_pretrained(bundled_model_dir()).config.block_out_channels) == [48] * 4
    with pytest.raises(ValueError, match=r"are not this model's widths \[24, 24, 24\]"):
        LoopVAE(width=24, latent_factor=4, block_out_channels=(24, 48, 96), encoder_passes=(1, 1),
                decoder_passes=(1, 1), **small)
    with pytest.raises(ValueError, match="latent_factor 8 needs 4"):
        LoopVAE(width=24, block_out_channels=(24, 24), **small)


@pytest.mark.parametrize("stored", ["placeholder", "missing", "other values"])
def test_old_configs_load_with_the_real_widths(tmp_path: Path, stored: str) -> None:
    folder = tmp_path / "old"
    shutil.copytree(bundled_model_dir(), folder)
    config = json.loads((folder / "config.json").read_text())
    if stored == "missing":
        del config["block_out_channels"]
    elif stored == "other values":  # any list of the right length was accepted before the widths were checked
        config["block_out_channels"] = [128, 256, 512, 512]
    (folder / "config.json").write_text(json.dumps(config))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        vae = LoopVAE.from_pretrained(folder)
    notes = [str(w.message) for w in caught if "block_out_channels" in str(w.message)]
    assert list(vae.config.block_out_channels) == [48] * 4
    assert _same_weights(vae, LoopVAE.from_pretrained(bundled_model_dir()))
    if stored == "other values":
        assert len(notes) == 1 and "[128, 256, 512, 512] are not the model's widths" in notes[0]
        assert "config.json" in notes[0]
    else:
        assert not notes


MODELS = bundled_model_dir().parent


def _edited(tmp_path: Path, model: str, **changes) -> Path:
    folder = tmp_path / model
    shutil.copytree(MODELS / model, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **changes}))
    return folder


@pytest.mark.parametrize("model, key, value, want", [
    ("dcae-tiny", "encoder_block_out_channels", [], "a non-empty list"),
    ("klvae-tiny-w32-attn", "block_out_channels", [], "a non-empty list"),
    ("dcae-tiny", "latent_channels", "16", "an integer"),
    ("klvae-tiny-w32-attn", "force_upcast", "yes", "true or false"),
    ("loopvae-cnn-tiny", "_class_name", ["LoopVAE"], 'a string such as "LoopVAE"'),
])
def test_a_hand_edited_config_json_is_one_line_naming_file_and_key(tmp_path: Path, capsys, model: str, key: str,
                                                                   value, want: str) -> None:
    """The diffusers classes are type-checked like LoopVAE (they failed with an IndexError or a string-format
    error deep in __init__), and a non-string _class_name is named (it was an unhashable-list TypeError)."""
    from loopvae.cli import main as loopvae_main
    from loopvae.loading import load_tokenizer

    folder = _edited(tmp_path, model, **{key: value})
    with pytest.raises(ValueError, match=rf"{folder / 'config.json'}: key '{key}' must be {want}"):
        load_tokenizer(folder)
    capsys.readouterr()
    assert loopvae_main(["encode", "--checkpoint", str(folder), "--data", "unused.tar", "--out",
                         str(tmp_path / "out"), "--resolution", "32"]) == 2
    err = capsys.readouterr().err
    assert f"key '{key}'" in err and "config.json" in err and "Traceback" not in err, err
    # a union-typed key (a name, or one per stage) is left to the constructor: both forms load
    if model == "dcae-tiny":
        assert load_tokenizer(_edited(tmp_path / "ok", model, encoder_block_types=["ResBlock"] * 4)).model


def test_sizes_in_config_json_are_checked_against_the_weights_before_any_allocation(tmp_path: Path) -> None:
    """width=4096 next to the tiny model's weights would allocate and initialise 8.5 GiB before the weights were
    read; the model is built on the meta device and compared with the safetensors header first."""
    import resource
    import time

    from loopvae.loading import load_tokenizer

    folder = _edited(tmp_path, "loopvae-cnn-tiny", width=4096, block_out_channels=None)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    with pytest.raises(ValueError, match=r"diffusion_pytorch_model\.safetensors does not match its config\.json .*"
                                         r"shapes differ: .*\[48, .*\] in the file, \[4096, .*\] per config\.json"):
        load_tokenizer(folder)
    assert time.perf_counter() - start < 10
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before < 500_000  # KiB: nothing near 8.5 GiB
    wrong = _edited(tmp_path / "kl", "klvae-tiny-w32-attn", latent_channels=8)
    with pytest.raises(ValueError, match=r"does not match its config\.json .*shapes differ"):
        load_tokenizer(wrong)
