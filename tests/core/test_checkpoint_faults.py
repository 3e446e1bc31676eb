"""Checkpoints under faults: malformed metadata, crashes during a save, a full disk, two runs on one folder."""

import errno
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import looprun.checkpoint as checkpoint_module
from looprun.checkpoint import CheckpointManager, CheckpointSaveError, CorruptCheckpointError
from looprun.run_lock import RunLock, RunLockedError


def _state(step: int) -> dict:
    return {"model": {"w": torch.full((3,), float(step))}, "trainer": {"step": step}}


@pytest.mark.parametrize("metadata", ["{}", '{"step": 3}', "[]", '{"format": 1, "step": 3, "files": {}}',
                                      '{"format": 1, "step": 2, "files": {"model.pt": "00"}}', "not json"])
def test_malformed_metadata_is_corrupt_and_the_previous_checkpoint_is_used(tmp_path: Path, metadata: str,
                                                                          caplog) -> None:
    manager = CheckpointManager(tmp_path, keep_last=3, required=["model", "trainer"])
    manager.save(2, _state(2))
    newest = manager.save(3, _state(3))
    (newest / "metadata.json").write_text(metadata)
    with pytest.raises(CorruptCheckpointError, match=str(newest)):
        manager.load(newest)
    with caplog.at_level("ERROR"):
        loaded = manager.load_latest()
    assert loaded.step == 2 and "falling back to the previous checkpoint" in caplog.text


def test_a_checkpoint_without_a_required_entry_is_corrupt(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, required=["model", "trainer"])
    manager.save(1, _state(1))
    manager.save(2, {"model": {"w": torch.zeros(3)}})  # no trainer state
    assert manager.load_latest().step == 1
    with pytest.raises(CorruptCheckpointError, match=r"required state \['trainer'\]"):
        manager.load(manager.step_dir(2))


def test_a_crash_while_resaving_a_step_keeps_a_complete_copy(tmp_path: Path, monkeypatch) -> None:
    manager = CheckpointManager(tmp_path, keep_last=1)
    manager.save(5, _state(5))
    real_replace = os.replace
    calls = []

    def crash_on_install(src, dst):
        calls.append((Path(src).name, Path(dst).name))
        if Path(src).name.startswith(".tmp-"):
            raise OSError(errno.EIO, "simulated crash while installing the new copy")
        return real_replace(src, dst)

    monkeypatch.setattr(checkpoint_module.os, "replace", crash_on_install)
    with pytest.raises(CheckpointSaveError, match="step-00000005"):
        manager.save(5, {"model": {"w": torch.full((3,), 99.0)}, "trainer": {"step": 5}})
    monkeypatch.setattr(checkpoint_module.os, "replace", real_replace)
    assert calls[0][1].startswith(".old-step-00000005")  # the old copy was moved aside, not deleted
    loaded = manager.load_latest()  # and put back
    assert loaded.step == 5 and torch.equal(loaded.state["model"]["w"], torch.full((3,), 5.0))
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_recover_restores_a_moved_aside_copy_and_removes_stale_temporaries(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path)
    saved = manager.save(7, _state(7))
    os.replace(saved, tmp_path / ".old-step-00000007-4242")  # a crash between the two renames
    (tmp_path / ".tmp-step-00000008-4243").mkdir()  # a killed save
    (tmp_path / ".tmp-step-00000008-4243" / "model.pt").write_bytes(b"partial")
    manager.save(6, _state(6))
    manager.save(8, _state(8))
    (tmp_path / ".old-step-00000008-4244").mkdir()  # stale: step 8 exists
    done = manager.recover()
    assert any("restored" in line and "step-00000007" in line for line in done)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000006", "step-00000007", "step-00000008"]
    assert manager.load(tmp_path / "step-00000007").step == 7


def test_a_full_disk_raises_a_clear_error_and_leaves_earlier_checkpoints(tmp_path: Path, monkeypatch) -> None:
    manager = CheckpointManager(tmp_path)
    manager.save(1, _state(1))
    real_save = torch.save

    def disk_full(obj, f, *args, **kwargs):
        real_save(obj, f, *args, **kwargs)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(checkpoint_module.torch, "save", disk_full)
    with pytest.raises(CheckpointSaveError, match=r"No space left on device .*step-00000001\); free disk space"):
        manager.save(2, _state(2))
    monkeypatch.undo()
    assert [p.name for p in tmp_path.iterdir()] == ["step-00000001"]
    assert manager.load_latest().step == 1


def test_metadata_is_written_durably_and_lists_format_step_and_files(tmp_path: Path) -> None:
    saved = CheckpointManager(tmp_path).save(3, _state(3), {"note": "x"})
    meta = json.loads((saved / "metadata.json").read_text())
    assert meta["format"] == 1 and meta["step"] == 3 and set(meta["files"]) == {"model.pt", "trainer.pt"}


def test_a_second_process_cannot_take_the_run_lock_and_a_killed_holder_releases_it(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from looprun.run_lock import RunLock; "
         f"lock = RunLock({str(tmp_path)!r}); print('locked', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True,
    )
    assert holder.stdout.readline().strip() == "locked"
    with pytest.raises(RunLockedError, match=rf"in use by another training run \(pid {holder.pid}\)"):
        RunLock(tmp_path)
    holder.kill()
    holder.wait()
    deadline = time.time() + 10
    while True:  # the kernel drops the lock with the process, however it died
        try:
            RunLock(tmp_path).release()
            break
        except RunLockedError:
            assert time.time() < deadline
            time.sleep(0.05)
