"""Weights files of the metrics and losses (FID Inception, LPIPS backbone, DINOv2 discriminator): read with
``weights_only=True`` so a crafted pickle never runs (``eval --fid-weights``, the default hub path, ``compare``,
``train --val-data``), the network built from them is torch-fidelity's, and a wrong file is one line naming it."""

import os
from pathlib import Path

import pytest
import torch

from loopvae.cli import main as loopvae_main
from loopvae.demo import bundled_model_dir
from loopvae.metrics import INCEPTION_FILE, build_fid
from lv_testing import data_urls

EVAL = ["--resolution", "32", "--limit", "2", "--num-workers", "0", "--no-progress"]


class _RunsCode:
    """Unpickling this runs ``touch <marker>`` (what a crafted weights file does under weights_only=False)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def _crafted(path: Path, marker: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"Conv2d_1a_3x3.conv.weight": _RunsCode(marker)}, path)
    return path


def _run(capsys, *argv: str) -> tuple[int, str]:
    capsys.readouterr()
    code = loopvae_main(list(argv))
    return code, capsys.readouterr().err


def _one_line(code: int, err: str, *fragments: str) -> None:
    lines = [line for line in err.splitlines() if ": error: " in line]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err[-2000:]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_a_crafted_inception_file_never_runs(tmp_path: Path, capsys, monkeypatch) -> None:
    marker = tmp_path / "PWNED"
    evil = _crafted(tmp_path / "evil.pth", marker)
    model = str(bundled_model_dir())
    refused = ("FID Inception weights", "not a torch file of plain tensors", "GLOBAL posix.system")
    _one_line(*_run(capsys, "eval", "--checkpoint", model, "--data", data_urls("val"), "--out", str(tmp_path / "e1"),
                    "--lpips-net", "none", "--fid-weights", str(evil), *EVAL), str(evil), *refused)
    assert not marker.exists()
    # no flag: the file at the default torch hub path is read the same way
    hub = tmp_path / "torch-home"
    default = _crafted(hub / "hub" / "checkpoints" / INCEPTION_FILE, marker)
    monkeypatch.setenv("TORCH_HOME", str(hub))
    _one_line(*_run(capsys, "eval", "--checkpoint", model, "--data", data_urls("val"), "--out", str(tmp_path / "e2"),
                    "--lpips-net", "none", *EVAL), str(default), *refused)
    assert not marker.exists()
    _one_line(*_run(capsys, "compare", "--arm", f"a={model}", "--data", data_urls("val"), "--out",
                    str(tmp_path / "c"), "--fid-weights", str(evil), *EVAL), str(evil), *refused)
    assert not marker.exists()
    _one_line(*_run(capsys, "train", "--config", "tiny-stage1", "--data", data_urls("train"), "--val-data",
                    data_urls("val"), "--out", str(tmp_path / "t"), "--set", "max_steps=1", "num_workers=0",
                    "progress_bar=false", "resolution=32", "batch_size=2", "eval_images=2", "eval_resolution=32",
                    f"fid_weights={evil}"), str(evil), *refused)
    assert not marker.exists()


def test_the_inception_network_is_torch_fidelitys_with_the_files_weights(tmp_path: Path) -> None:
    from test_evaluation import _random_inception_file
    from torchmetrics.image.fid import NoTrainInceptionV3

    weights = _random_inception_file(tmp_path / INCEPTION_FILE)
    fid, reason, path = build_fid(weights)
    assert reason is None and path == weights
    net = fid.inception
    assert isinstance(net, NoTrainInceptionV3) and net.features_list == ["2048"] and not net.use_antialias
    stored = torch.load(weights, weights_only=True)
    assert net.state_dict().keys() == stored.keys()
    assert all(torch.equal(v, stored[k]) for k, v in net.state_dict().items())
    assert not net.training and net.num_features == 2048  # (eval's rFID path runs it: test_evaluation)


def _other_keys(path: Path) -> Path:
    torch.save({"x": torch.zeros(1)}, path)  # a plain tensor file: loading it runs nothing
    return path


def _random_bytes(path: Path) -> Path:
    path.write_bytes(bytes(range(256)) * 16)
    return path


@pytest.mark.parametrize("make,fragment", [(_other_keys, "566 of its 566 tensors missing"),
                                           (_random_bytes, "not a torch file of plain tensors")])
def test_a_wrong_fid_or_lpips_file_is_one_named_line(tmp_path: Path, capsys, make, fragment) -> None:
    bad = make(tmp_path / "bad.pth")
    model = str(bundled_model_dir())
    _one_line(*_run(capsys, "eval", "--checkpoint", model, "--data", data_urls("val"), "--out", str(tmp_path / "f"),
                    "--lpips-net", "none", "--fid-weights", str(bad), *EVAL),
              f"FID Inception weights {bad}", fragment, INCEPTION_FILE)
    lpips_fragment = "features.0.weight is missing" if make is _other_keys else fragment
    _one_line(*_run(capsys, "eval", "--checkpoint", model, "--data", data_urls("val"), "--out", str(tmp_path / "l"),
                    "--lpips-net", "alex", "--lpips-weights", str(bad), *EVAL),
              f"LPIPS-alex backbone weights {bad}", lpips_fragment, "alexnet-owt-7be5be79.pth")


@pytest.mark.parametrize("make,fragment", [(_other_keys, "tensors missing (e.g. cls_token)"),
                                           (_random_bytes, "not DINOv2-small weights")])
def test_a_wrong_dino_file_is_one_named_line(tmp_path: Path, capsys, make, fragment) -> None:
    bad = make(tmp_path / "dino.pth")
    _one_line(*_run(capsys, "train", "--config", "tiny-stage2", "--data", data_urls("train"), "--out",
                    str(tmp_path / "t"), "--set", "max_steps=1", "num_workers=0", "progress_bar=false",
                    "resolution=32", "batch_size=2", f"init_from={bundled_model_dir()}", "discriminator=dino",
                    f"dino_weights={bad}"), f"dino_weights {bad}", fragment, "vit_small_patch14_dinov2")
