"""Messages that tell a user what to do name options that exist for the command that printed them."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from loopvae.cli import main as loopvae_main

ROOT = Path(__file__).resolve().parents[2]
KODAK_VAL = str(ROOT / "assets" / "kodak" / "kodak-val-000000.tar")


def test_a_hub_id_as_checkpoint_says_how_to_download_and_leaves_nothing(tmp_path: Path, capsys) -> None:
    out = tmp_path / "eval"
    assert loopvae_main(["eval", "--checkpoint", "stabilityai/sd-vae-ft-mse", "--data", KODAK_VAL,
                         "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "looks like a Hugging Face Hub id" in err and "hf download stabilityai/sd-vae-ft-mse" in err
    assert "diffusers model folder" in err
    assert not out.exists()  # no eval.log or record left behind
    # a plain missing path is just that
    assert loopvae_main(["eval", "--checkpoint", str(tmp_path / "nope"), "--data", KODAK_VAL, "--out", str(out)]) == 2
    assert "does not exist; pass" in capsys.readouterr().err and not out.exists()


def test_autoencoderkl_on_a_loopvae_folder_warns() -> None:
    from diffusers import AutoencoderKL

    import loopvae  # noqa: F401  (the warning is installed with the diffusers registration)

    folder = ROOT / "assets" / "models"
    with pytest.warns(UserWarning, match="holds a LoopVAE: AutoencoderKL.from_pretrained builds an AutoencoderKL "
                                         "with random weights"):
        AutoencoderKL.from_pretrained(folder / "loopvae-cnn-tiny")
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*holds a LoopVAE.*")
        model = AutoencoderKL.from_pretrained(folder / "klvae-tiny-w32-attn")  # a real AutoencoderKL: silent
    assert type(model).__name__ == "AutoencoderKL"
