"""The command lines build their argument tree without torch: --help answers before any heavy import, every
option says what it does, the presets come from the configs folders, one --device default; and the lazy
packages still register with diffusers and timm on import."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "diffusers", "timm", "webdataset", "loopdata", "PIL")


def _fresh(code: str) -> str:
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout


@pytest.mark.parametrize("package", ["loopvae", "srvit"])
def test_help_imports_nothing_heavy(package: str) -> None:
    out = _fresh(f"import sys\nfrom {package}.cli import build_parser\nbuild_parser().format_help()\n"
                 f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))")
    assert out.strip() == "[]"
    # and the real entry point answers --help (exit 0) through the same path
    run = subprocess.run([sys.executable, "-m", package, "--help"], capture_output=True, text=True, check=False)
    assert run.returncode == 0 and "usage:" in run.stdout


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


@pytest.mark.parametrize("package", ["loopvae", "srvit"])
def test_every_option_has_help_and_one_device_default(package: str) -> None:
    build = __import__(f"{package}.cli", fromlist=["build_parser"]).build_parser
    missing, devices = [], set()
    for name, sub in _subparsers(build()).items():
        for action in sub._actions:
            if not action.option_strings or action.help == argparse.SUPPRESS:
                continue
            if not action.help:
                missing.append(f"{name} {action.option_strings[0]}")
            if "--device" in action.option_strings:
                devices.add(action.default)
    assert missing == [] and devices == {"auto"}


def test_presets_are_listed_from_the_configs_folders() -> None:
    from loopvae.cli import PRESETS as VAE_PRESETS
    from loopvae.cli import build_parser
    from srvit.cli import DEFAULT_STEPS_TEXT
    from srvit.cli import PRESETS as SRVIT_PRESETS

    assert VAE_PRESETS == sorted(p.stem for p in (ROOT / "packages/vae/loopvae/configs").glob("*.yaml"))
    assert len(VAE_PRESETS) >= 7 and "release-tiny" in VAE_PRESETS
    assert SRVIT_PRESETS == sorted(p.stem for p in (ROOT / "packages/classifier/srvit/configs").glob("*.yaml"))
    train_help = _subparsers(build_parser())["train"].format_help()
    assert all(p in train_help.replace("\n", " ").replace("- ", "-") for p in VAE_PRESETS)
    import srvit.evaluate

    assert tuple(int(v) for v in DEFAULT_STEPS_TEXT.split(",")) == srvit.evaluate.DEFAULT_STEPS


def test_lazy_packages_reach_their_submodules_as_attributes() -> None:
    assert _fresh("import loopvae\nprint(loopvae.loading.load_tokenizer.__name__, loopvae.autoencoders.__name__)"
                  ).split() == ["load_tokenizer", "loopvae.autoencoders"]
    assert _fresh("import srvit\nprint(srvit.evaluate.DEFAULT_STEPS)").strip() == "(3, 6, 12, 24, 48)"
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        __import__("loopvae").nope  # noqa: B018


def test_lazy_packages_still_register_with_diffusers_and_timm() -> None:
    folder = ROOT / "assets/models/loopvae-cnn-tiny"
    # loopvae first, diffusers after: the registration happens when diffusers loads
    assert _fresh(f"import loopvae\nfrom diffusers import AutoModel\n"
                  f"print(type(AutoModel.from_pretrained({str(folder)!r})).__name__)").strip() == "LoopVAE"
    # diffusers first: the registration happens on import loopvae
    assert _fresh("import diffusers, loopvae\nprint(diffusers.LoopVAE.__module__)").strip() == "loopvae.model"
    # srvit's models imported first (timm loads underneath them), then timm's generic create_model
    assert _fresh("import srvit\nsrvit.create_model('vit-ti')\nimport timm\n"
                  "print(type(timm.create_model('srvit_ti')).__name__)").strip() == "RecursiveViT"
    assert _fresh("import timm, srvit\nprint(type(timm.create_model('bvit_ti')).__name__)").strip() == "RecursiveViT"
