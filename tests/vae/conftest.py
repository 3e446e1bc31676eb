"""A tiny LoopVAE trained once per test session on the bundled Kodak images, shared by the VAE tests."""

from pathlib import Path

import pytest

from loopvae.train_config import load_train_config
from loopvae.trainer import train
from lv_testing import FAST, data_urls


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory) -> tuple[Path, object]:
    """``(run_dir, TrainResult)`` of 40 ``tiny-stage1`` steps (checkpoints at 20 and 40, release)."""
    out = tmp_path_factory.mktemp("tiny-stage1") / "run"
    config = load_train_config(
        "tiny-stage1", [*FAST, "max_steps=40", "checkpoint_every=20", "log_every=5", "image_every=20"]
    )
    return out, train(config, data_urls(), out)
