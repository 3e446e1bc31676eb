"""The speed switches of looprun.speed: torch.compile agrees with eager, the retained CPU allocator really stops
page-faulting on reused memory, and the command lines expose the flags."""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
import textwrap

import pytest
import torch

import loopvae
import srvit
from looprun.speed import MEMORY_FORMATS, compile_in_place, memory_format, prepare_for_speed, to_memory_format
from loopvae import cli as loopvae_cli
from lv_testing import randomize_
from srvit import cli as srvit_cli


def test_compiled_tiny_tokenizer_equals_eager() -> None:
    # A LoopVAE small enough to compile in seconds on 2 cores, with every block doing work.
    model = randomize_(loopvae.create_model(
        "loopvae-cnn-tiny", num_blocks=1, encoder_passes=[1, 2, 1], decoder_passes=[1, 2, 1]).eval(), std=0.05)
    x = to_memory_format(torch.rand(2, 3, 32, 32) * 2 - 1, "channels_last")
    prepare_for_speed(model, "channels_last")
    names = [n for n, _ in model.named_parameters()]
    with torch.no_grad():
        eager = model.decode(model.encode(x).latent_dist.mode()).sample
        compile_in_place(model)
        compiled = model.decode(model.encode(x).latent_dist.mode()).sample
    assert model.encoder._compiled_call_impl is not None and model.decoder._compiled_call_impl is not None
    assert [n for n, _ in model.named_parameters()] == names  # checkpoints and releases see no wrapper
    torch.testing.assert_close(compiled, eager, rtol=0, atol=1e-5)
    assert eager.std() > 0.01  # not a constant image (random weights of std 0.05 give an output std ~0.03)


def test_compiled_classifier_equals_eager() -> None:
    model = randomize_(srvit.create_model("srvit-ti", depth=2, recursion=2, img_size=32, patch_size=8,
                                          num_classes=10).eval(), std=0.02)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        eager = model(x)
        compiled = compile_in_place(model)(x)
    assert model._compiled_call_impl is not None
    torch.testing.assert_close(compiled, eager, rtol=0, atol=1e-5)


def test_memory_format_names_are_checked() -> None:
    assert set(MEMORY_FORMATS) == {"contiguous", "channels_last"}
    with pytest.raises(ValueError, match="unknown memory format 'nhwc'.*channels_last"):
        memory_format("nhwc")
    x = torch.randn(2, 3, 4, 5)
    assert to_memory_format(x, "channels_last").is_contiguous(memory_format=torch.channels_last)
    assert to_memory_format(torch.randn(3, 4, 5), "channels_last").is_contiguous()  # not an image batch: unchanged


_FAULTS = textwrap.dedent("""
    import resource, sys, torch
    from looprun.speed import apply_cpu_allocator
    print(apply_cpu_allocator(sys.argv[1]))
    def faults():
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    # 64 MiB blocks allocated and freed before counting, until the heap reaches its steady state. torch asks
    # posix_memalign for 64-byte alignment, and glibc serves that by carving size + alignment + a minimum chunk,
    # so an exactly sized freed block cannot hold the next one: the heap creeps by one block per allocation
    # until freed neighbours have coalesced into a big enough hole. Measured over 42 processes, the last
    # block that faulted was the 5th to the 11th; 20 blocks of warm-up are about twice the worst seen.
    for _ in range(20):
        torch.empty(16 * 2**20).fill_(1)
    before = faults()
    for _ in range(20):
        torch.empty(16 * 2**20).fill_(1)
    print(faults() - before)
""")


def test_retained_allocator_reuses_freed_memory_without_page_faults() -> None:
    counts = {}
    for choice in ("system", "retain"):
        out = subprocess.run([sys.executable, "-c", _FAULTS, choice], capture_output=True, text=True, check=True)
        applied, faults = out.stdout.split()
        counts[choice] = int(faults)
        assert applied == str(choice == "retain")
    # glibc's default serves each 64 MiB block by a fresh mmap: ~16k zero-filled pages per block, 20 blocks;
    # retained, once the heap has reached its steady state the blocks reuse its pages: measured 0 faults.
    # One block's worth (16,384 pages) is allowed for a warm-up that runs longer than any seen so far.
    assert counts["system"] > 20 * 10_000, counts
    assert counts["retain"] <= 16_384, counts


@pytest.mark.parametrize("cli,command", [(loopvae_cli, "eval"), (loopvae_cli, "profile"), (srvit_cli, "eval")])
def test_command_lines_offer_compile_and_the_allocator(cli, command: str) -> None:
    sub = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    options = {opt for action in sub.choices[command]._actions for opt in action.option_strings}
    assert {"--compile", "--cpu-allocator"} <= options


@pytest.mark.parametrize("cli,trainer", [(loopvae_cli, "loopvae.trainer"), (srvit_cli, "srvit.trainer")])
def test_train_compile_flag_reaches_the_trainer_with_the_other_overrides(cli, trainer: str, monkeypatch, tmp_path):
    seen = {}

    def fake_train(config, *args, **kwargs):
        seen["config"] = config
        raise ValueError("stopped by the test")  # before any work; the CLI reports it and returns 2

    monkeypatch.setattr(importlib.import_module(trainer), "train", fake_train)
    preset = "tiny-stage1" if cli is loopvae_cli else "cifar10-vit-ti"
    code = cli.main(["train", "--config", preset, "--data", "x", "--out", str(tmp_path), "--compile",
                     "--cpu-allocator", "system", "--set", "lr=2e-4"])
    assert code == 2
    assert seen["config"].compile is True and seen["config"].lr == 2e-4
