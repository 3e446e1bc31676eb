"""srvit training and evaluation end to end: resume, the CLI, torchrun, and accuracy on real CIFAR-10."""

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import srvit
from looprun.checkpoint import CheckpointManager
from looprun.config import ConfigError
from srvit.train_config import list_presets, load_train_config
from srvit.trainer import Trainer, classification_loss, train

# A tiny SR-ViT on 32x32 crops of the labelled Kodak shards, DeiT augmentation (RandAugment, erasing, Mixup/CutMix).
KODAK = [
    "protocol=imagenet", "num_classes=2", "resolution=32", "batch_size=4", "num_workers=0", "progress_bar=false",
    "model=srvit-ti", "model_overrides={depth: 2, embed_dim: 24, num_heads: 2, patch_size: 8, recursion: 2}",
    "lr=1e-3", "warmup_epochs=0.2", "ema_decay=0.9", "log_every=1",
]


def test_presets_resolve_and_bad_keys_are_named() -> None:
    assert {"imagenet-deit-s", "imagenet-srvit-s", "cifar10-vit-ti", "cifar10-bvit-ti", "cifar10-srvit-ti"} <= set(
        list_presets()
    )
    for name in list_presets():
        config = load_train_config(name)
        with torch.device("meta"):
            model = srvit.create_model(config.model, **config.model_kwargs())
        assert model.config.num_classes == config.num_classes and model.config.img_size == config.resolution
    deit = load_train_config("imagenet-deit-s")
    assert deit.learning_rate(world_size=8) == pytest.approx(1e-3)  # 5e-4 * 1024 / 512
    with pytest.raises(ConfigError, match="num_classes"):
        load_train_config("cifar10-vit-ti", ["model_overrides={num_classes: 3}"])
    with pytest.raises(ConfigError, match="unknown config key 'lr_rate'"):
        load_train_config("cifar10-vit-ti", ["lr_rate=1"])
    with pytest.raises(ConfigError, match="protocol"):
        load_train_config("cifar10-vit-ti", ["protocol=svhn"])


def test_soft_target_loss_matches_torch_cross_entropy() -> None:
    logits = torch.randn(5, 4)
    target = torch.softmax(torch.randn(5, 4), dim=-1)
    # soft (Mixup / CutMix) targets: the mean over the batch of -sum_k target_k log softmax(logits)_k
    by_definition = torch.sum(-target * F.log_softmax(logits, dim=-1), dim=-1).mean()
    torch.testing.assert_close(classification_loss(logits, target, 0.1), by_definition)
    labels = torch.tensor([0, 3, 1, 2, 2])
    torch.testing.assert_close(classification_loss(logits, labels, 0.1), F.cross_entropy(logits, labels,
                                                                                          label_smoothing=0.1))


def test_resumed_run_ends_with_the_weights_of_an_uninterrupted_one(kodak_labelled, tmp_path: Path) -> None:
    config = load_train_config("cifar10-srvit-ti", [*KODAK, "max_steps=6", "checkpoint_every=3"])
    straight = train(config, kodak_labelled, tmp_path / "straight")
    assert straight.step == 6 and straight.stopped_by is None and straight.resumed_from is None
    assert all(torch.isfinite(torch.tensor(h["loss"])) for h in straight.history)
    # Interrupt after step 3: keep only the step-3 checkpoint, as a run killed during step 4 would leave.
    resumed_dir = tmp_path / "resumed"
    train(config, kodak_labelled, resumed_dir)
    manager = CheckpointManager(resumed_dir / "checkpoints")
    for path in manager.list_checkpoints()[1:]:
        for f in path.iterdir():
            f.unlink()
        path.rmdir()
    assert [p.name for p in manager.list_checkpoints()] == ["step-00000003"]
    resumed = train(config, kodak_labelled, resumed_dir)
    assert resumed.resumed_from.name == "step-00000003" and resumed.step == 6
    assert [h["step"] for h in resumed.history] == [4, 5, 6]
    a = CheckpointManager(tmp_path / "straight" / "checkpoints").load_latest().state
    b = manager.load_latest().state
    for part in ("model", "ema"):
        for name, tensor in a[part].items():
            assert torch.equal(tensor, b[part][name]), (part, name)
    for h_straight, h_resumed in zip(straight.history[3:], resumed.history):
        assert h_straight["loss"] == h_resumed["loss"]
    events = EventAccumulator(str(tmp_path / "straight" / "tb")).Reload()
    assert {"train/loss", "train/lr", "train/train_top1", "train/images_per_s"} <= set(events.Tags()["scalars"])
    # SoftMoR router entropy per block is logged at every logging step (log_every=1 here), within [0, ln R]
    assert {"train/fusion_entropy", "train/fusion_entropy/block00", "train/fusion_entropy/block01"} <= set(
        events.Tags()["scalars"])
    for h in straight.history:
        blocks = [h["fusion_entropy/block00"], h["fusion_entropy/block01"]]
        assert all(0.0 <= e <= math.log(2) + 1e-6 for e in blocks)
        assert h["fusion_entropy"] == pytest.approx(sum(blocks) / 2)


def test_resumed_run_reports_cumulative_train_seconds(kodak_labelled, tmp_path: Path) -> None:
    """``train_seconds`` (train_summary.json) is the CPU of the whole run's optimisation loop: it is checkpointed,
    so a run resumed after a kill reports its checkpoint's seconds plus the resumed steps', not the resumed
    segment's alone (what a study timing only the resumed process would record)."""
    config = load_train_config("cifar10-srvit-ti", [*KODAK, "max_steps=4", "checkpoint_every=2"])
    out = tmp_path / "run"
    train(config, kodak_labelled, out)
    manager = CheckpointManager(out / "checkpoints")
    for path in manager.list_checkpoints()[1:]:  # a kill during step 3 leaves the step-2 checkpoint only
        for f in path.iterdir():
            f.unlink()
        path.rmdir()
    before = manager.load_latest().state["trainer"]["train_seconds"]
    assert before > 0
    trainer = Trainer(config, kodak_labelled, out)
    assert trainer.step == 2 and trainer.train_seconds == before  # restored from the checkpoint
    start = time.process_time()
    result = trainer.run()
    around = time.process_time() - start  # this process's CPU over the whole resumed segment
    segment = trainer.train_seconds - before  # the resumed steps 3-4 as the counter saw them
    summary = json.loads((out / "train_summary.json").read_text())
    assert result.step == 4 and result.resumed_from.name == "step-00000002"
    assert 0 < segment <= around
    assert summary["train_seconds"] > segment and summary["train_seconds"] == pytest.approx(before + segment, abs=0.01)
    assert manager.load_latest().state["trainer"]["train_seconds"] == trainer.train_seconds  # in the final state


def test_a_stop_during_the_last_step_still_ends_the_run_with_its_final_validation(kodak_labelled,
                                                                                  tmp_path: Path) -> None:
    """SIGTERM (a session ending) that lands in the last step: the run is complete, so it finishes as one that
    was not stopped, with the final validation in its summary and checkpoint (a stop recorded there instead left
    the final validation out for good: the resumed run had no step left to take it)."""
    import signal

    config = load_train_config("cifar10-srvit-ti", [*KODAK, "max_steps=3", "checkpoint_every=100"])
    trainer = Trainer(config, kodak_labelled, tmp_path / "run", val_data=kodak_labelled)
    plain_step = trainer.train_step

    def step_then_signal(batch):
        logs = plain_step(batch)
        if trainer.step == 2:  # train_step of the third and last step (the counter moves after it)
            os.kill(os.getpid(), signal.SIGTERM)
        return logs

    trainer.train_step = step_then_signal
    result = trainer.run()
    summary = json.loads((tmp_path / "run/train_summary.json").read_text())
    assert result.stopped_by is None and summary["stopped_by"] is None and result.release_dir is not None
    assert [v["step"] for v in summary["validation"]] == [3]
    latest = CheckpointManager(tmp_path / "run/checkpoints").load_latest()
    assert latest.step == 3 and latest.metadata["reason"] == "periodic"


def run_cli(*args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "srvit", *args], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_cli_train_then_eval_writes_top1_top5_and_by_steps(kodak_labelled, tmp_path: Path) -> None:
    out = tmp_path / "run"
    overrides = [o for o in KODAK if not o.startswith(("model=", "model_overrides="))]
    run_cli("train", "--config", "cifar10-bvit-ti", "--data", kodak_labelled, "--val-data", kodak_labelled,
            "--out", str(out), "--set", *overrides, "model_overrides={embed_dim: 24, num_heads: 2, patch_size: 8, "
            "steps: 3}", "deep_supervision_every=1", "max_steps=4")
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["step"] == 4 and summary["validation"][-1]["num_images"] == 20
    for checkpoint in (out, out / "release"):
        eval_dir = tmp_path / f"eval-{checkpoint.name}"
        proc = run_cli("eval", "--checkpoint", str(checkpoint), "--data", kodak_labelled, "--out", str(eval_dir),
                       "--steps", "1,3,6", "--resolution", "32", "--batch-size", "8")
        metrics = json.loads((eval_dir / "metrics.json").read_text())
        assert metrics["num_images"] == 20 and "top-1" in proc.stdout
        assert set(metrics["by_steps"]) == {"1", "3", "6"} and metrics["training_horizon"] == 3
        assert 0 <= metrics["top1"] <= metrics["top5"] <= 1
        assert metrics["by_steps"]["3"] == metrics["top1"]  # the trained horizon is the default
        assert (eval_dir / "accuracy_vs_steps.png").stat().st_size > 1000
    release_metrics = json.loads((tmp_path / "eval-release" / "metrics.json").read_text())
    assert release_metrics["top1"] == summary["validation"][-1]["top1"]  # release = the EMA weights validated
    # the Euler-trained bViT evaluated with Heun at equal integration time (3 steps of h = 1 -> 3 of h = 1 with 2
    # evaluations each; 6 steps of h = 0.5 spans the same time): a runtime swap, the config keeps the trained solver
    run_cli("eval", "--checkpoint", str(out / "release"), "--data", kodak_labelled, "--out", str(tmp_path / "heun"),
            "--steps", "3,6", "--resolution", "32", "--batch-size", "8", "--solver", "heun", "--step-size", "0.5")
    heun = json.loads((tmp_path / "heun" / "metrics.json").read_text())
    assert (heun["model"]["solver"], heun["model"]["eval_solver"], heun["model"]["eval_step_size"]) == \
        ("euler", "heun", 0.5)
    assert set(heun["by_steps"]) == {"3", "6"}


def test_eval_reports_a_missing_checkpoint_clearly(tmp_path: Path, kodak_labelled) -> None:
    proc = subprocess.run([sys.executable, "-m", "srvit", "eval", "--checkpoint", str(tmp_path), "--data",
                           kodak_labelled, "--out", str(tmp_path / "e")], capture_output=True, text=True)
    assert proc.returncode == 2 and "neither a srvit release artifact" in proc.stderr


def test_torchrun_two_ranks_hold_identical_weights(kodak_labelled, tmp_path: Path) -> None:
    out = tmp_path / "ddp"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "srvit",
           "train", "--config", "cifar10-srvit-ti", "--data", kodak_labelled, "--val-data", kodak_labelled,
           "--out", str(out), "--set", *KODAK, "batch_size=2", "max_steps=4", "checkpoint_every=2"]
    proc = subprocess.run(cmd, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["world_size"] == 2 and summary["step"] == 4
    assert len(set(summary["weights_sha256_per_rank"])) == 1
    assert summary["validation"][-1]["num_images"] == 20  # every validation image counted once over both ranks


def test_short_cifar10_srvit_run_is_clearly_above_chance(cifar10, tmp_path: Path) -> None:
    """A shrunken cifar10-srvit-ti (4 blocks, R=2) for 150 steps; chance is 10% on the 10,000 test images."""
    config = load_train_config("cifar10-srvit-ti", [
        "model_overrides={patch_size: 8, depth: 4, recursion: 2, fusion_mode: token}", "max_steps=150", "batch_size=32",
        "progress_bar=false", "checkpoint_every=150",
    ])
    result = train(config, cifar10["train"], tmp_path / "run", val_data=cifar10["test"])
    top1 = result.validation[-1]["top1"]
    assert result.validation[-1]["num_images"] == 10_000
    assert top1 > 0.25, top1
