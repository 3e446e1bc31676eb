"""Gradient accumulation: k micro-batches of b are one optimizer step on k b images."""

from pathlib import Path

import pytest
import torch

import loopvae.trainer as trainer_module
from looprun.checkpoint import CheckpointManager
from loopvae.train_config import load_train_config
from loopvae.trainer import train
from lv_testing import FAST, data_urls


def _weights(run: Path) -> dict[str, torch.Tensor]:
    return CheckpointManager(run / "checkpoints").load_latest().state["model"]


def test_k_micro_batches_of_b_equal_one_batch_of_k_b(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The posterior sample draws random numbers per call, and k calls draw them in another order than one call: the
    # posterior mean makes the two runs see the same latents (LoopVAE has no batch-coupled layers: GroupNorm only).
    monkeypatch.setattr(trainer_module, "noisy_posterior_sample",
                        lambda posterior, std, generator=None: posterior.mode())
    common = [*FAST, "max_steps=3", "checkpoint_every=3", "log_every=1", "deep_supervision_weight=0.5",
              "warmup_steps=1", "lr=1e-3", "ema_decay=0.5"]
    whole = train(load_train_config("tiny-stage1", [*common, "batch_size=4"]), data_urls(), tmp_path / "whole")
    accum = train(load_train_config("tiny-stage1", [*common, "batch_size=2", "grad_accum_steps=2"]), data_urls(),
                  tmp_path / "accum")
    assert whole.step == accum.step == 3
    a, b = _weights(tmp_path / "whole"), _weights(tmp_path / "accum")
    diffs = {k: float((a[k] - b[k]).abs().max()) for k in a}
    # float summation order differs; Adam magnifies it where gradients are near zero (the zero-initialised modulation)
    assert max(diffs.values()) < 1e-4, sorted(diffs.items(), key=lambda kv: -kv[1])[:3]
    # not a comparison of two untouched models: the weights did move away from their initialisation
    init = load_train_config("tiny-stage1", common)
    fresh = trainer_module.build_vae(init).state_dict()
    assert max(float((a[k] - fresh[k]).abs().max()) for k in fresh) > 1e-3


def test_accumulation_validates_and_counts_optimizer_steps_in_stage2(tiny_run, tmp_path: Path) -> None:
    from loopvae.train_config import ConfigError

    with pytest.raises(ConfigError, match="grad_accum_steps"):
        load_train_config("tiny-stage1", ["grad_accum_steps=0"]).validate()
    stage1_dir = tiny_run[0] / "release"
    config = load_train_config("tiny-stage2", [*FAST, f"init_from={stage1_dir}", "max_steps=4", "gan_start_step=2",
                                               "checkpoint_every=4", "log_every=1", "r1_every=2", "batch_size=2",
                                               "grad_accum_steps=2"])
    result = train(config, data_urls(), tmp_path / "stage2")
    assert result.step == 4
    # one discriminator step per optimizer step (not per micro-batch), R1 every r1_every of them
    assert sum("d_loss" in h for h in result.history) == 4 and sum("r1" in h for h in result.history) == 2
    state = CheckpointManager(tmp_path / "stage2" / "checkpoints").load_latest().state
    # 4 hinge + 2 R1 Adam steps (parameters R1 gives no gradient, such as the last bias, only take the 4 hinge ones)
    assert max(float(v["step"]) for v in state["d_optimizer"]["state"].values()) == 6.0
    assert {float(v["step"]) for v in state["optimizer"]["state"].values()} == {4.0}


def test_a_checkpoint_from_before_grad_accum_steps_existed_resumes(tmp_path: Path) -> None:
    import json

    config = [*FAST, "max_steps=2", "checkpoint_every=2"]
    train(load_train_config("tiny-stage1", config), data_urls(), tmp_path / "run")
    (meta_path,) = (tmp_path / "run" / "checkpoints").glob("step-*/metadata.json")
    meta = json.loads(meta_path.read_text())
    del meta["config"]["grad_accum_steps"]  # as written before the key existed (it was 1 then)
    meta_path.write_text(json.dumps(meta))
    result = train(load_train_config("tiny-stage1", [*FAST, "max_steps=3", "checkpoint_every=2"]), data_urls(),
                   tmp_path / "run")
    assert result.step == 3 and result.resumed_from is not None
