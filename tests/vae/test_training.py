"""End-to-end training on the bundled Kodak shards: loss, resume after SIGKILL, torchrun, stage 2, NaN, corruption."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from looprun.checkpoint import CheckpointManager
from loopvae import LoopVAE
from loopvae import create_model as loopvae_create
from loopvae.loading import load_artifact
from loopvae.train_config import load_train_config
from loopvae.trainer import NonFiniteLossError, Trainer, discriminator_optimizer, lazy_regularization_ratio, train
from lv_testing import FAST, data_urls


def cli(out: Path, *overrides: str, config: str = "tiny-stage1") -> list[str]:
    return [sys.executable, "-m", "loopvae", "train", "--config", config, "--data", data_urls(), "--out", str(out),
            "--set", *FAST, *overrides]


def test_tiny_stage1_lowers_loss_and_leaves_checkpoints_and_a_release(tiny_run) -> None:
    out, result = tiny_run
    totals = [h["total"] for h in result.history]
    assert len(totals) == 40 and result.step == 40
    assert sum(totals[-5:]) / 5 < 0.8 * sum(totals[:5]) / 5, totals
    ckpts = CheckpointManager(out / "checkpoints").list_checkpoints()
    assert [p.name for p in ckpts] == ["step-00000020", "step-00000040"]
    release = LoopVAE.from_pretrained(out / "release")
    ema = CheckpointManager(out / "checkpoints").load_latest().state["ema"]
    for name, tensor in release.state_dict().items():
        assert torch.equal(tensor, ema[f"module.{name}"]), name
    assert (out / "config.yaml").is_file() and (out / "train.log").is_file()
    events = EventAccumulator(str(out / "tb"), size_guidance={"images": 0}).Reload()
    assert {"train/total", "train/l1", "train/kl", "train/lr", "train/images_per_s"} <= set(events.Tags()["scalars"])
    assert "reconstruction/top_input_bottom_output" in events.Tags()["images"]
    assert len(events.Scalars("train/total")) == 8


def test_sigkill_mid_run_then_same_command_resumes_to_identical_weights(tmp_path: Path) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    args = ("max_steps=60", "checkpoint_every=10", "log_every=10")
    subprocess.run(cli(tmp_path / "straight", *args), check=True, env=env, capture_output=True)
    killed = tmp_path / "killed"
    proc = subprocess.Popen(cli(killed, *args), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while not (killed / "checkpoints" / "step-00000020").exists() and time.time() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "run ended before the kill"
    assert not (killed / "train_summary.json").exists()
    subprocess.run(cli(killed, *args), check=True, env=env, capture_output=True)
    summary = json.loads((killed / "train_summary.json").read_text())
    assert summary["resumed_from"].endswith(tuple(f"step-{s:08d}" for s in range(20, 60, 10)))
    a = CheckpointManager(tmp_path / "straight" / "checkpoints").load_latest()
    b = CheckpointManager(killed / "checkpoints").load_latest()
    assert a.step == b.step == 60
    for part in ("model", "ema"):
        for name, tensor in a.state[part].items():
            assert (tensor.float() - b.state[part][name].float()).abs().max() <= 1e-6, (part, name)


def test_torchrun_two_ranks_hold_identical_weights(tmp_path: Path) -> None:
    out = tmp_path / "ddp"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "loopvae",
           "train", "--config", "tiny-stage1", "--data", data_urls(), "--out", str(out), "--set", *FAST,
           "max_steps=6", "checkpoint_every=3", "log_every=3"]
    proc = subprocess.run(cmd, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["world_size"] == 2 and summary["step"] == 6
    assert len(set(summary["weights_sha256_per_rank"])) == 1
    ranks = summary["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert ranks[0]["batches_per_epoch"] == ranks[1]["batches_per_epoch"] >= 1
    assert LoopVAE.from_pretrained(out / "release") is not None


def test_stage2_from_stage1_artifact_gates_gan_and_logs_adaptive_weight_and_r1(tiny_run, tmp_path: Path) -> None:
    stage1_dir, _ = tiny_run
    config = load_train_config("tiny-stage2", [*FAST, f"init_from={stage1_dir}", "max_steps=8", "gan_start_step=4",
                                               "r1_every=2", "checkpoint_every=8", "log_every=1"])
    result = train(config, data_urls(), tmp_path / "stage2")
    start = LoopVAE.from_pretrained(stage1_dir / "release")
    assert result.step == 8
    for h in result.history:
        step = h["step"] - 1  # history records the step after it ran
        assert h["gan_factor"] == (1.0 if step >= 4 else 0.0)
        assert (h["adaptive_weight"] > 0) == (step >= 4)
        assert ("r1" in h) == (step % 2 == 0)
        assert "d_loss" in h and "g_loss" in h
    state = CheckpointManager(tmp_path / "stage2" / "checkpoints").load_latest().state
    assert state["discriminator"]
    # the trainer's D optimizer carries the lazy-R1 correction c = k/(k+1) = 2/3 for r1_every=2
    (group,) = state["d_optimizer"]["param_groups"]
    assert group["lr"] == pytest.approx(config.disc_lr * 2 / 3)
    assert group["betas"] == pytest.approx((0.5 ** (2 / 3), 0.9 ** (2 / 3)))
    # R1 is its own optimizer step (what the correction compensates for): 8 hinge steps + 4 R1 steps
    d_steps = sum("d_loss" in h for h in result.history)
    r1_steps = sum("r1" in h for h in result.history)
    assert (d_steps, r1_steps) == (8, 4)
    adam_steps = {float(v["step"]) for v in state["d_optimizer"]["state"].values()}
    # weights the input gradient depends on take every step; e.g. the last bias gets no R1 gradient
    assert max(adam_steps) == d_steps + r1_steps and min(adam_steps) == d_steps
    assert start.config.width == 48  # started from the stage-1 architecture


@pytest.mark.parametrize(("r1_gamma", "r1_every", "c"), [(10.0, 16, 16 / 17), (10.0, 4, 0.8), (10.0, 1, 1.0),
                                                          (0.0, 16, 1.0)])
def test_lazy_r1_scales_the_discriminator_adam_lr_and_betas(r1_gamma: float, r1_every: int, c: float) -> None:
    """StyleGAN2 Appendix B: R1 every k D steps -> lr * c, betas ** c with c = k/(k+1); none when R1 is off
    (gamma 0) or not lazy (k = 1)."""
    config = load_train_config("tiny-stage2", [f"r1_gamma={r1_gamma}", f"r1_every={r1_every}"])
    assert lazy_regularization_ratio(config) == pytest.approx(c)
    optimizer = discriminator_optimizer([torch.nn.Parameter(torch.zeros(3))], config)
    assert isinstance(optimizer, torch.optim.AdamW)
    (group,) = optimizer.param_groups
    assert (config.disc_lr, tuple(config.disc_betas)) == (1e-4, (0.5, 0.9))  # the tiny-stage2 preset's values
    assert group["lr"] == pytest.approx(1e-4 * c)
    assert group["betas"] == pytest.approx((0.5**c, 0.9**c))


def test_injected_nan_stops_cleanly_with_the_last_good_checkpoint_intact(tmp_path: Path) -> None:
    config = load_train_config("tiny-stage1", [*FAST, "max_steps=20", "checkpoint_every=5", "log_every=5"])
    trainer = Trainer(config, data_urls(), tmp_path / "nan")
    trainer.vae.decoder.head.register_forward_hook(
        lambda module, inputs, output: output * float("nan") if trainer.step == 7 else output
    )
    with pytest.raises(NonFiniteLossError, match=r"non-finite loss at step 7 .*step-00000005 is untouched"):
        trainer.run()
    manager = CheckpointManager(tmp_path / "nan" / "checkpoints")
    assert [p.name for p in manager.list_checkpoints()] == ["step-00000005"]
    good = manager.load_latest()
    assert good.step == 5 and all(torch.isfinite(t).all() for t in good.state["model"].values())


def test_corrupt_newest_checkpoint_is_detected_and_the_previous_one_resumed(tmp_path: Path, caplog) -> None:
    out = tmp_path / "run"
    config = load_train_config("tiny-stage1", [*FAST, "max_steps=10", "checkpoint_every=5", "log_every=5"])
    train(config, data_urls(), out)
    newest = out / "checkpoints" / "step-00000010" / "optimizer.pt"
    newest.write_bytes(newest.read_bytes()[:-100])
    with caplog.at_level("ERROR"):
        trainer = Trainer(load_train_config("tiny-stage1", [*FAST, "max_steps=12", "checkpoint_every=5"]),
                          data_urls(), out)
    assert "optimizer.pt fails its sha256 check" in caplog.text
    assert trainer.step == 5 and trainer.resumed_from.name == "step-00000005"


def test_sigterm_checkpoints_and_exits_cleanly(tmp_path: Path) -> None:
    out = tmp_path / "term"
    proc = subprocess.Popen(cli(out, "max_steps=100000", "checkpoint_every=5", "log_every=5"),
                            env=dict(os.environ, OMP_NUM_THREADS="1"), stdout=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while not (out / "checkpoints" / "step-00000005").exists() and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    stdout, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0 and "stopped at step" in stdout and "SIGTERM" in stdout
    latest = CheckpointManager(out / "checkpoints").load_latest()
    assert latest.metadata["reason"] == "signal" and latest.step > 5
    assert not (out / "release").exists()  # an interrupted run is not released


@pytest.mark.parametrize("preset", ["paper-stage1", "paper-stage2", "tiny-stage1", "tiny-stage2"])
def test_presets_resolve_and_validate(preset: str) -> None:
    config = load_train_config(preset)
    assert config.stage == (2 if preset.endswith("2") else 1)
    if preset.startswith("paper"):
        assert (config.model, config.resolution, config.batch_size) == ("loopvae-cnn-f8d16", 256, 4)
        assert config.kl_weight == 1e-6 and config.latent_noise_std == 0.05 and config.grad_clip == 1.0
    if preset == "paper-stage2":
        gan = (config.lr, config.gan_start_step, config.gan_weight, config.adaptive_weight_max)
        assert gan == (5e-5, 5000, 0.5, 1e4)
        assert (config.discriminator, config.r1_gamma, config.r1_every, config.diffaug_cutout) == ("dino", 10, 16, 0.2)


def test_the_tiny_reference_autoencoderkl_trains_with_the_same_recipe_and_its_release_loads(tmp_path: Path) -> None:
    from diffusers import AutoencoderKL

    from loopvae.evaluate import EvalOptions, evaluate

    model = loopvae_create("flux-vae-tiny")
    logvar_bias = model.encoder.conv_out.bias[model.encoder.conv_out.out_channels // 2:]
    assert torch.equal(logvar_bias, torch.full_like(logvar_bias, -6.0))  # the posterior scale LoopVAE starts at
    config = load_train_config("tiny-stage1", [*FAST, "model=flux-vae-tiny", "max_steps=20", "checkpoint_every=10"])
    result = train(config, data_urls(), tmp_path / "ref")
    totals = [h["total"] for h in result.history]
    assert sum(totals[-3:]) < sum(totals[:3]), totals
    metrics = evaluate(tmp_path / "ref", data_urls("val"), tmp_path / "eval",
                       EvalOptions(resolution=64, batch_size=4, num_workers=0, lpips_net="none", device="cpu"))
    assert metrics["model"]["class"] == "AutoencoderKL" and metrics["model"]["kind"] == "run-checkpoint"
    released = evaluate(result.release_dir, data_urls("val"), tmp_path / "eval-release",
                        EvalOptions(resolution=64, batch_size=4, num_workers=0, lpips_net="none", device="cpu"))
    assert released["model"]["kind"] == "release" and released["num_images"] == 4
    assert isinstance(load_artifact(result.release_dir), AutoencoderKL)
    with pytest.raises(ValueError, match="deep_supervision_weight=0.5 needs a LoopVAE"):
        Trainer(load_train_config("tiny-stage1", [*FAST, "model=flux-vae-tiny", "deep_supervision_weight=0.5"]),
                data_urls(), tmp_path / "bad")


def test_modulation_lr_scale_puts_the_conditioning_path_in_its_own_group() -> None:
    from loopvae.trainer import conditioning_parameters, parameter_groups

    vae = loopvae_create("loopvae-cnn-tiny")
    conditioning = conditioning_parameters(vae)
    names = {n for n, p in vae.named_parameters() if any(p is q for q in conditioning)}
    assert names and all(".embedding." in n or ".modulation." in n for n in names)
    assert {"encoder.core.embedding.loop.weight", "decoder.core.blocks.1.modulation.1.bias"} <= names
    assert len(parameter_groups(vae, 1e-3, 1.0)) == 1  # old single-group optimizer state still resumes
    rest, cond = parameter_groups(vae, 1e-3, 10.0)
    assert cond["lr"] == pytest.approx(1e-2) and rest["lr"] == pytest.approx(1e-3)
    assert len(rest["params"]) + len(cond["params"]) == len(list(vae.parameters()))
    assert parameter_groups(loopvae_create("flux-vae-tiny"), 1e-3, 10.0)[0]["lr"] == pytest.approx(1e-3)


def test_fine_tuning_a_diffusers_autoencoderkl_decoder_only(tmp_path: Path) -> None:
    """init_from a saved diffusers AutoencoderKL folder (the SD ft-MSE recipe: decoder only): the run starts from
    the folder's weights, the encoder stays bit-identical, the decoder moves; trainable=all moves both."""
    from diffusers import AutoencoderKL

    from lv_testing import randomize_

    folder = tmp_path / "sd-like"
    source = randomize_(loopvae_create("klvae-tiny-w24"), std=0.02, seed=3)
    source.save_pretrained(folder)
    runs = {}
    for trainable in ("decoder", "all"):
        out = tmp_path / trainable
        config = load_train_config("tiny-stage1", [*FAST, f"init_from={folder}", f"trainable={trainable}",
                                                   "max_steps=3", "checkpoint_every=3", "num_workers=0",
                                                   "ema_decay=0.0", "lr=1e-3", "mse_weight=1.0"])
        train(config, data_urls(), out)
        runs[trainable] = AutoencoderKL.from_pretrained(out / "release")
    start = source.state_dict()
    tuned = runs["decoder"].state_dict()
    for name, tensor in start.items():
        moved = not torch.equal(tensor, tuned[name])
        if name.startswith(("encoder.", "quant_conv.")):
            assert not moved, f"{name} changed in decoder-only fine-tuning"
    assert any(not torch.equal(start[n], tuned[n]) for n in start if n.startswith("decoder."))
    everything = runs["all"].state_dict()
    assert any(not torch.equal(start[n], everything[n]) for n in start if n.startswith("encoder."))
    # the run records and logs what it trained: the AutoencoderKL it started from, not the preset's model name
    log = (tmp_path / "all" / "train.log").read_text()
    assert f"training AutoencoderKL from {folder} stage 1" in log and "training loopvae-cnn" not in log
