"""A full disk or a file-size limit, on the real write paths (a real tmpfs where mounting is permitted, RLIMIT_FSIZE
everywhere): one clear error naming the path and the free space, the writer's partial files removed, the previous
good state intact (training resumes from its last checkpoint)."""

import json
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

from looprun.checkpoint import CheckpointManager
from loopvae.demo import bundled_model_dir
from lv_testing import FAST, data_urls, small_filesystem


def _run(args: list[str], fsize: int | None = None) -> subprocess.CompletedProcess:
    def limit() -> None:
        if fsize is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

    return subprocess.run([sys.executable, "-m", "loopvae", *args], capture_output=True, text=True,
                          env=dict(os.environ, OMP_NUM_THREADS="1"), preexec_fn=limit, timeout=600)


def _one_line(proc: subprocess.CompletedProcess, *fragments: str) -> str:
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    line = next(x for x in proc.stderr.splitlines() if ": error: " in x)
    for fragment in fragments:
        assert fragment in line, line
    return line


def _train_args(out: Path, steps: int) -> list[str]:
    return ["train", "--config", "tiny-stage1", "--data", data_urls(), "--out", str(out), "--set", *FAST,
            f"max_steps={steps}", "checkpoint_every=2", "num_workers=0", "keep_checkpoints=3"]


def test_a_full_disk_while_saving_a_checkpoint(tmp_path: Path) -> None:
    """8 MiB: the step-2 checkpoint (5.6 MB) fits, step 4's does not."""
    with small_filesystem(tmp_path / "disk", 8 * 1024) as disk:
        out = disk / "run"
        proc = _run(_train_args(out, 6))
        _one_line(proc, "checkpoint: could not write", "step-00000004", "free there", "Earlier checkpoints are intact")
        names = sorted(p.name for p in (out / "checkpoints").iterdir())
        assert names == ["step-00000002"], names  # no .tmp-step-... keeps the disk full
        CheckpointManager(out / "checkpoints").load_latest()  # the previous checkpoint verifies
        shutil.copytree(out, tmp_path / "moved")  # where there is space, the same command resumes
    resumed = _run(_train_args(tmp_path / "moved", 6))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    summary = json.loads((tmp_path / "moved" / "train_summary.json").read_text())
    assert summary["step"] == 6


def _encode_args(out: Path) -> list[str]:
    return ["encode", "--checkpoint", str(bundled_model_dir()), "--data", data_urls("val"), "--out", str(out),
            "--resolution", "256", "--device", "cpu", "--batch-size", "2"]


def test_encode_on_a_full_disk_and_past_a_file_size_limit(tmp_path: Path) -> None:
    with small_filesystem(tmp_path / "disk", 128) as disk:  # 4 latents of 64 KiB do not fit in 128 KiB
        proc = _run(_encode_args(disk / "latents"))
        _one_line(proc, "could not write", "latents-000000.tar", "free there")
        # no partial file is left; the run lock (.lock, one encode per --out) is not one
        assert not [p.name for p in (disk / "latents").iterdir() if p.name.startswith(".") and p.name != ".lock"]
    limited = tmp_path / "limited"
    proc = _run(_encode_args(limited), fsize=100 * 1024)  # EFBIG: the shard may not grow past 100 KiB
    _one_line(proc, "could not write", "File too large")
    assert not [p.name for p in limited.iterdir() if p.name.startswith(".") and p.name != ".lock"]


def test_eval_save_images_on_a_full_disk_leaves_no_partial_set(tmp_path: Path) -> None:
    with small_filesystem(tmp_path / "disk", 192) as disk:
        out = disk / "eval"
        proc = _run(["eval", "--checkpoint", str(bundled_model_dir()), "--data", data_urls("val"), "--out", str(out),
                     "--resolution", "256", "--lpips-net", "none", "--num-workers", "0", "--save-images",
                     "--no-progress"])
        _one_line(proc, "could not write", "free there")
        assert not (out / "images").exists() and not (out / "metrics.json").exists()
