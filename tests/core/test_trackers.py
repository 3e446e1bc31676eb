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
    # a resume continues the same W&B run id (derived from the run folder)
    assert _train(out, "tracker=wandb", "max_steps=3") == 0
    assert len({p.name.rsplit("-", 1)[-1] for p in (out / "wandb").glob("offline-run-*")}) == 1


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
