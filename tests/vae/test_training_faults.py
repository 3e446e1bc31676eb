"""Training under faults: NaN gradients, SIGTERM to the process group with workers, resuming with another
config or data, a full disk, two runs on one folder, corrupt samples, a failed start (real paths)."""

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from loopdata_helpers import jpeg, write_shard

import looprun.checkpoint as checkpoint_module
from looprun.checkpoint import CheckpointManager, CheckpointSaveError, CorruptCheckpointError
from looprun.config import ConfigError
from looprun.run_lock import RunLockedError
from loopvae.train_config import load_train_config
from loopvae.trainer import NonFiniteLossError, Trainer, train
from lv_testing import FAST, data_urls


def _config(*overrides: str):
    return load_train_config("tiny-stage1", [*FAST, *overrides])


def test_nan_gradients_with_a_finite_loss_stop_before_the_weights_change(tmp_path: Path) -> None:
    trainer = Trainer(_config("max_steps=20", "checkpoint_every=5", "log_every=5"), data_urls(), tmp_path / "run")
    weight = trainer.vae.decoder.head.conv_out.weight
    weight.register_hook(lambda grad: grad * float("nan") if trainer.step == 7 else grad)
    before = {}

    def remember(module, inputs, output):
        if trainer.step == 7 and not before:
            before.update({k: v.detach().clone() for k, v in trainer.vae.state_dict().items()})
        return output

    trainer.vae.decoder.head.register_forward_hook(remember)
    expected = r"non-finite gradient norm at step 7; stopped without saving.*step-00000005 is untouched"
    with pytest.raises(NonFiniteLossError, match=expected):
        trainer.run()
    for name, tensor in trainer.vae.state_dict().items():  # no optimizer step was taken with NaN gradients
        assert torch.equal(tensor, before[name]), name
    manager = CheckpointManager(tmp_path / "run" / "checkpoints")
    assert [p.name for p in manager.list_checkpoints()] == ["step-00000005"]


def test_a_non_finite_state_is_never_saved(tmp_path: Path) -> None:
    trainer = Trainer(_config("max_steps=4", "checkpoint_every=2"), data_urls(), tmp_path / "run")
    with torch.no_grad():
        trainer.ema.module.decoder.head.conv_out.bias.fill_(float("inf"))
    with pytest.raises(NonFiniteLossError, match=r"non-finite values in ema\..*refusing to save"):
        trainer.run()
    assert CheckpointManager(tmp_path / "run" / "checkpoints").list_checkpoints() == []


def _cli(out: Path, *overrides: str) -> list[str]:
    return [sys.executable, "-m", "loopvae", "train", "--config", "tiny-stage1", "--data", data_urls(), "--out",
            str(out), "--set", *FAST, *overrides]


def test_sigterm_to_the_process_group_with_dataloader_workers_saves_and_exits_0(tmp_path: Path) -> None:
    out = tmp_path / "term"
    proc = subprocess.Popen(_cli(out, "max_steps=100000", "checkpoint_every=3", "log_every=3", "num_workers=2"),
                            env=dict(os.environ, OMP_NUM_THREADS="1"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.time() + 300
    while not (out / "checkpoints" / "step-00000003").exists() and time.time() < deadline:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGTERM)  # as torchrun's agent does: the whole group, workers included
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr[-2000:]
    assert "killed by signal" not in stderr and "stopped at step" in stdout
    latest = CheckpointManager(out / "checkpoints").load_latest()
    assert latest.metadata["reason"] == "signal" and latest.step >= 3


def test_resuming_with_another_config_or_data_is_refused_and_config_yaml_kept(tmp_path: Path) -> None:
    out = tmp_path / "run"
    train(_config("max_steps=4", "checkpoint_every=2"), data_urls(), out)
    saved_yaml = (out / "config.yaml").read_text()
    for overrides, data, message in (
        (["batch_size=2"], data_urls(), r"batch_size: 4 in the checkpoint, 2 now"),
        (["lr=0.5"], data_urls(), r"lr: 0\.001 in the checkpoint, 0\.5 now"),
        (["model_overrides={width: 32}"], data_urls(), r"model_overrides: \{\} in the checkpoint"),
        ([], data_urls("val"), r"data: 1 shard\(s\) .*kodak-train.* in the checkpoint"),
    ):
        with pytest.raises(ConfigError, match=message):
            Trainer(_config("max_steps=6", "checkpoint_every=2", *overrides), data, out)
        assert (out / "config.yaml").read_text() == saved_yaml
    # the keys that only decide when to stop, save and log may change
    resumed = train(_config("max_steps=6", "checkpoint_every=3", "log_every=1"), data_urls(), out)
    assert resumed.step == 6 and resumed.resumed_from.name == "step-00000004"
    assert yaml.safe_load((out / "config.yaml").read_text())["max_steps"] == 6


def test_a_run_checkpointed_before_keys_were_renamed_resumes(tmp_path: Path) -> None:
    out = tmp_path / "run"
    new = ["model_overrides={fusion_mode: query}", "checkpoint_every=2"]
    train(_config("max_steps=4", *new), data_urls(), out)
    metadata_files = sorted((out / "checkpoints").glob("step-*/metadata.json"))
    assert metadata_files

    def write_old_keys(channels_last: bool) -> None:  # what a checkpoint written before the renames holds
        for path in metadata_files:
            meta = json.loads(path.read_text())
            config = meta["config"]
            config.pop("memory_format", None)
            config["channels_last"] = channels_last
            config["model_overrides"] = {"fusion": "softmor", "fusion_mode": "query"}
            path.write_text(json.dumps(meta))

    write_old_keys(channels_last=False)  # contiguous then, channels_last now: a real difference, still refused
    with pytest.raises(ConfigError, match=r"memory_format: 'contiguous' in the checkpoint, 'channels_last' now"):
        Trainer(_config("max_steps=6", *new), data_urls(), out)
    write_old_keys(channels_last=True)  # the same run under the old names: resumes
    resumed = train(_config("max_steps=6", *new), data_urls(), out)
    assert resumed.step == 6 and resumed.resumed_from.name == "step-00000004"


def test_a_full_disk_during_training_stops_with_a_clear_error(tmp_path: Path, monkeypatch) -> None:
    trainer = Trainer(_config("max_steps=6", "checkpoint_every=2"), data_urls(), tmp_path / "run")
    real_save = torch.save
    state = {"saves": 0}

    def fill_up(obj, f, *args, **kwargs):
        state["saves"] += 1
        if trainer.step >= 4:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(checkpoint_module.torch, "save", fill_up)
    with pytest.raises(CheckpointSaveError, match=r"No space left on device.*step-00000002\)"):
        trainer.run()
    monkeypatch.undo()
    assert CheckpointManager(tmp_path / "run" / "checkpoints").load_latest().step == 2


def test_two_runs_on_one_folder_the_second_fails_clearly(tmp_path: Path) -> None:
    out = tmp_path / "run"
    first = subprocess.Popen(_cli(out, "max_steps=100000", "checkpoint_every=1000"),
                             env=dict(os.environ, OMP_NUM_THREADS="1"), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while not (out / "config.yaml").exists() and time.time() < deadline:
            time.sleep(0.05)
        with pytest.raises(RunLockedError, match=rf"{out} is in use by another training run \(pid {first.pid}\)"):
            Trainer(_config("max_steps=2"), data_urls(), out)
        second = subprocess.run(_cli(out, "max_steps=2"), capture_output=True, text=True,
                                env=dict(os.environ, OMP_NUM_THREADS="1"))
        assert second.returncode == 2 and "in use by another training run" in second.stderr
        assert "Traceback" not in second.stderr
    finally:
        first.kill()
        first.wait()


def test_epochs_advance_once_and_corrupt_samples_are_counted_saved_logged_and_left_out(tmp_path: Path) -> None:
    from loopdata.shards import split_entry, update_info

    samples = [(f"good{i:02d}", {"jpg": jpeg(48, 48, seed=i)}) for i in range(14)]
    samples += [(f"bad{i}", {"jpg": b"\xff\xd8 not a jpeg"}) for i in range(2)]
    shard = write_shard(tmp_path / "shards" / "mixed-000000.tar", samples)
    update_info(tmp_path / "shards", split_entry("mixed", [shard], [16]))
    out = tmp_path / "run"
    config = _config("max_steps=8", "checkpoint_every=4", "batch_size=4")  # 16 planned samples: 4 batches
    result = train(config, shard, out)
    data = CheckpointManager(out / "checkpoints").load_latest().state["trainer"]["data"]
    assert (data["epoch"], data["batch"]) == (2, 1)  # 4 + 3 batches, then 1: one epoch per epoch, not two
    assert data["corrupt"] >= 2 and data["excluded"] == 2  # 14 usable samples: 3 batches of 4 from epoch 1 on
    assert "skipped corrupt sample" in (out / "train.log").read_text()
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["ranks"][0]["samples_per_epoch"] == 12 and summary["ranks"][0]["corrupt_samples"] >= 2
    resumed = Trainer(_config("max_steps=10", "checkpoint_every=4", "batch_size=4"), shard, out)
    assert resumed.loader.corrupt_count == data["corrupt"] and resumed.loader.excluded_samples == 2
    resumed.abandon()
    assert result.step == 8


def test_a_run_that_fails_to_start_leaves_no_files_in_a_new_folder(tmp_path: Path) -> None:
    out = tmp_path / "new-run"
    bad = subprocess.run(_cli(out, "model=loopvae-huge"), capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown model 'loopvae-huge'" in bad.stderr and "Traceback" not in bad.stderr
    assert not out.exists()
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    subprocess.run(_cli(out, "model=loopvae-huge"), capture_output=True, text=True)
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]  # an existing folder keeps only its own files


@pytest.mark.parametrize("override, message", [
    ("resolution=36", "resolution=36: loopvae-cnn-tiny cannot reconstruct 36² crops"),
    ("keep_checkpoints=0", "keep_checkpoints must be >= 1, got 0"),
    ("model_overrides={width: abc}", "model_overrides.width: 'abc' is not an integer"),
    # sizes that build on the meta device only in theory: overflowing storage, or crops no image can fill
    ("model_overrides.width=1000000000", "model_overrides {'width': 1000000000} do not build loopvae-cnn-tiny: "
                                         "Storage size calculation overflowed"),
    ("resolution=1000000", "resolution=1000000: a 1000000x1000000 crop is 1,000,000,000,000 pixels, over "
                           "loopdata's limit of 67,108,864 pixels per image (LOOPDATA_MAX_PIXELS)"),
    (("model=klvae-tiny-w32-attn", "resolution=36"), "resolution=36: klvae-tiny-w32-attn cannot reconstruct 36² crops "
                                                "(image size (36, 36) is not divisible by the AutoencoderKL's latent "
                                                "factor 8"),
])
def test_bad_settings_are_refused_before_any_file_is_written(tmp_path: Path, override: str | tuple, message: str,
                                                              capsys) -> None:
    """Checked on the meta device before the run folder, .lock, config.yaml, tb/ or train.log exist."""
    from loopvae.cli import main as loopvae_main

    out = tmp_path / "run"
    assert loopvae_main(["train", "--config", "tiny-stage1", "--data", data_urls(), "--out", str(out),
                         "--set", *FAST, *([override] if isinstance(override, str) else override)]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err
    assert not out.exists()


def test_resuming_on_a_folder_whose_files_were_swapped_is_refused_naming_the_change(tmp_path: Path, capsys) -> None:
    """Same folder, same count: a rewritten or renamed image is other data, and the resume says which."""
    from loopvae.cli import main as loopvae_main

    folder = tmp_path / "images"
    folder.mkdir()
    for i in range(6):
        (folder / f"img{i}.jpg").write_bytes(jpeg(40, 40, seed=i))
    args = ["train", "--config", "tiny-stage1", "--data", str(folder), "--out", str(tmp_path / "run"), "--set", *FAST,
            "max_steps=2", "checkpoint_every=1", "num_workers=0"]
    assert loopvae_main([*args[:-3], "max_steps=1", "checkpoint_every=1", "num_workers=0"]) == 0
    (folder / "img3.jpg").write_bytes(jpeg(48, 40, seed=99))  # rewritten in place
    assert loopvae_main(args) == 2
    err = capsys.readouterr().err
    assert "'img3.jpg' changed (size" in err and "other data" in err, err[-1500:]
    (folder / "img3.jpg").unlink()
    (folder / "img9.jpg").write_bytes(jpeg(40, 40, seed=3))  # same count, another name
    assert loopvae_main(args) == 2
    assert "file 4 was 'img3.jpg', now 'img4.jpg'" in capsys.readouterr().err


def _digests(folder: Path) -> dict[str, str]:
    import hashlib

    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name not in ("train.log", ".lock")}


def test_a_folder_whose_checkpoints_none_loads_is_refused_and_left_unchanged(tmp_path: Path, capsys) -> None:
    """Checkpoints present, none usable: restarting from step 0 would overwrite them and the release. (a) a
    stage-2 config on a stage-1 run (its checkpoints lack the discriminator): the config difference is named;
    (b) every checkpoint damaged: each one is named with what is wrong. Nothing in the folder changes."""
    from loopvae.cli import main as loopvae_main

    out = tmp_path / "run"
    train(_config("max_steps=4", "checkpoint_every=2"), data_urls(), out)
    before = _digests(out)
    assert "checkpoints/step-00000004/model.pt" in before and "release/diffusion_pytorch_model.safetensors" in before
    stage2 = load_train_config("tiny-stage2", [*FAST, "max_steps=4", "checkpoint_every=2",
                                               f"init_from={out / 'release'}"])
    with pytest.raises(ConfigError, match=r"(?s)holds a run with another configuration.*stage: 1 in the checkpoint, 2"):
        Trainer(stage2, data_urls(), out)
    assert _digests(out) == before
    for step in (2, 4):  # ema.pt cut short in every checkpoint; model.pt intact
        ema = out / "checkpoints" / f"step-{step:08d}" / "ema.pt"
        ema.write_bytes(ema.read_bytes()[:1000])
    before = _digests(out)
    named = (r"holds 2 checkpoint\(s\) \(step-00000002, step-00000004\) but none can be resumed: .*step-00000004: "
             r"ema\.pt fails its sha256 check.*step-00000002: ema\.pt fails its sha256 check.*nothing was changed")
    with pytest.raises(CorruptCheckpointError, match=named):
        Trainer(_config("max_steps=6", "checkpoint_every=2"), data_urls(), out)
    assert _digests(out) == before
    capsys.readouterr()
    assert loopvae_main(["train", "--config", "tiny-stage1", "--data", data_urls(), "--out", str(out), "--set", *FAST,
                         "max_steps=6", "checkpoint_every=2"]) == 2
    err = capsys.readouterr().err
    assert "none can be resumed" in err and "Traceback" not in err
    assert _digests(out) == before


def test_a_touched_shard_is_not_called_other_data_and_accept_data_mtime_resumes(tmp_path: Path, capsys) -> None:
    """A copy without -p or a `touch` moves the shard's time, not its content: the resume is refused with that
    reason and the override to use; with accept_data_mtime=true it resumes and records the new time."""
    import json
    import os
    import shutil

    from loopvae.cli import main as loopvae_main

    shard = tmp_path / "d.tar"
    shutil.copy(data_urls(), shard)
    out = tmp_path / "run"
    args = ["train", "--config", "tiny-stage1", "--data", str(shard), "--out", str(out), "--set", *FAST,
            "checkpoint_every=2", "num_workers=0"]
    assert loopvae_main([*args, "max_steps=2"]) == 0
    stat = shard.stat()
    os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    capsys.readouterr()
    assert loopvae_main([*args, "max_steps=4"]) == 2
    err = capsys.readouterr().err
    assert "its modification time moved" in err and "its size did not" in err and "other data" not in err, err
    assert "--set accept_data_mtime=true" in err
    assert loopvae_main([*args, "max_steps=4", "accept_data_mtime=true"]) == 0
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["step"] == 4 and summary["resumed_from"].endswith("step-00000002")
    assert json.loads((out / "data_identity.json").read_text())[0]["mtime_ns"] == shard.stat().st_mtime_ns
    # a changed size is other data, override or not
    with open(shard, "ab") as f:
        f.write(b"\0" * 512)
    assert loopvae_main([*args, "max_steps=6", "accept_data_mtime=true"]) == 2
    assert "the shard changed (size" in capsys.readouterr().err


def test_a_read_only_out_is_one_line_naming_it(tmp_path: Path, capsys) -> None:
    from loopvae.cli import main as loopvae_main
    from lv_testing import read_only_filesystem

    with read_only_filesystem(tmp_path / "ro") as ro:
        for folder, reason in (("new", "cannot create the folder"), ("old", "cannot write in this folder")):
            capsys.readouterr()
            assert loopvae_main(["train", "--config", "tiny-stage1", "--data", data_urls(), "--out",
                                 str(ro / folder), "--set", *FAST, "max_steps=1"]) == 2
            err = capsys.readouterr().err
            assert f"--out {ro / folder}: {reason}: Read-only file system" in err and "Traceback" not in err, err
