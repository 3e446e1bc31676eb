"""Tracker choice in training runs: TensorBoard (default), Weights & Biases offline (the same scalars and images),
or none; a missing optional package is a clear error before any file is written."""

from pathlib import Path

import pytest

from loopvae.cli import main as loopvae_main
from lv_testing import FAST, data_urls


def _train(out: Path, *extra: str) -> int:
    return loopvae_main(["train", "--config", "tiny-stage1", "--data", data_urls(), "--out", str(out), "--set", *FAST,
                         "max_steps=2", "checkpoint_every=2", "log_every=1", "image_every=2", "num_workers=0", *extra])


def test_wandb_offline_run_logs_the_same_scalars_and_images(tmp_path: Path, monkeypatch) -> None:
    pytest.importorskip("wandb", reason="the wandb extra is not installed (pip install 'loopvision[wandb]')")
    for key in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_PROJECT"):
        monkeypatch.delenv(key, raising=False)  # no login: must run offline by itself
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = tmp_path / "run"
    assert _train(out, "tracker=wandb") == 0
    runs = list((out / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and not (out / "tb").exists()
    # an offline run is W&B's record log (what `wandb sync` uploads): the scalar keys TensorBoard gets are in it,
    # the image grid is a media file, and the run's settings are recorded
    records = next(runs[0].glob("run-*.wandb")).read_bytes()
    for key in ("train/total", "train/l1", "train/kl", "train/images_per_s", "max_steps", "tracker"):
        assert key.encode() in records, key
    assert list((runs[0] / "files" / "media" / "images" / "reconstruction").glob("top_input_bottom_output_2_*.png"))
    # a resume continues the same W&B run id (stored in the run folder when the run started)
    run_id = (out / "wandb_run_id").read_text().strip()
    assert _train(out, "tracker=wandb", "max_steps=3") == 0
    assert {p.name.rsplit("-", 1)[-1] for p in (out / "wandb").glob("offline-run-*")} == {run_id}


def test_tracker_none_writes_no_events_and_a_bad_tracker_is_refused_early(tmp_path: Path, capsys) -> None:
    out = tmp_path / "quiet"
    assert _train(out, "tracker=none") == 0
    assert not (out / "tb").exists() and not (out / "wandb").exists() and (out / "release").is_dir()
    bad = tmp_path / "bad"
    assert _train(bad, "tracker=mlflow") == 2
    assert "tracker must be one of tensorboard, wandb, none, got 'mlflow'" in capsys.readouterr().err
    assert not bad.exists()


def test_a_missing_wandb_package_is_named(tmp_path: Path, monkeypatch, capsys) -> None:
    import builtins

    real_import = builtins.__import__

    def no_wandb(name, *args, **kwargs):
        if name == "wandb":
            raise ImportError("No module named 'wandb'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_wandb)
    assert _train(tmp_path / "run", "tracker=wandb") == 2
    assert "pip install 'loopvision[wandb]'" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_a_new_run_in_a_reused_folder_gets_its_own_wandb_run_id(tmp_path: Path) -> None:
    """The W&B id is drawn when a run starts from step 0 and stored in the folder; a resume reads it back. It used
    to be the hash of the folder path, so an unrelated run at the same path continued the old W&B run."""
    import hashlib

    from looprun.trackers import WANDB_ID_FILE, wandb_run_id

    run = tmp_path / "run"
    run.mkdir()
    first = wandb_run_id(run, resumed=False)
    assert (run / WANDB_ID_FILE).read_text().strip() == first
    assert wandb_run_id(run, resumed=True) == first  # a resume continues it
    second = wandb_run_id(run, resumed=False)  # a fresh run in the same folder (its old checkpoints deleted)
    assert second != first and wandb_run_id(run, resumed=True) == second
    (run / WANDB_ID_FILE).unlink()  # a run started before ids were stored resumes with the id it had then
    assert wandb_run_id(run, resumed=True) == hashlib.sha1(str(run.resolve()).encode()).hexdigest()[:16]
