"""``make release-vae-gpu``'s script on CPU at a few steps: prepare -> run -> bundle, end to end on the bundled
Kodak shards (the device call runs the same code with ``--device cuda`` and the real sizes)."""

import json
import subprocess
import sys
from pathlib import Path

from loopvae import LoopVAE
from lv_testing import data_urls

SCRIPT = str(Path(__file__).resolve().parents[2] / "studies" / "_release_vae_gpu.py")


def test_prepare_run_bundle_on_cpu(tmp_path: Path) -> None:
    data = tmp_path / "gpu-data"
    subprocess.run([sys.executable, SCRIPT, "prepare", "--train", data_urls("train"), "--holdout", data_urls("val"),
                    "--out", str(data)], check=True, capture_output=True)
    info = json.loads((data / "prepared.json").read_text())
    assert info["counts"] == {"train": 20, "holdout": 4}
    assert info["bytes"]["train-000000.tar"] < 40 * 2**20
    out = tmp_path / "out"
    subprocess.run([sys.executable, SCRIPT, "run", "--data", str(data), "--out", str(out), "--work",
                    str(tmp_path / "work"), "--device", "cpu", "--steps", "2", "--eval-resolution", "64",
                    "--intervention-images", "2", "--set", "resolution=32", "batch_size=2", "num_workers=0",
                    "scale_jitter=[1.0,1.0]", "--loopvae-set", "model_overrides={width: 48, num_blocks: 1}",
                    "--reference-set",
                    "model_overrides={block_out_channels: [8, 8, 8, 8], norm_num_groups: 4, layers_per_block: 1}"],
                   check=True, capture_output=True)
    results = json.loads((out / "results.json").read_text())
    assert results["steps"] == 2 and set(results["models"]) == {"loopvae", "reference"}
    for role in ("loopvae", "reference"):
        entry = results["models"][role]
        assert entry["images_seen"] == 4
        assert len(entry["eval"]["kodak"]["per_image"]) == 4 and len(entry["eval"]["imagenet"]["per_image"]) == 4
        assert all(p.stat().st_size <= 15 * 10**6 for p in (out / role).glob("*.safetensors"))
    assert results["comparisons"]["kodak"]["n"] == 4
    assert results["models"]["loopvae"]["interventions"]["num_images"] == 2
    target, docs = tmp_path / "bundle", tmp_path / "docs"
    subprocess.run([sys.executable, SCRIPT, "bundle", "--source", str(out), "--target", str(target), "--docs",
                    str(docs)], check=True, capture_output=True)
    model = LoopVAE.from_pretrained(target)
    assert model.config.width == 48 and model.config.shortcuts is True
    assert "loopvae-cnn-small" in (target / "README.md").read_text()
    slim = json.loads((docs / "release_gpu.json").read_text())
    # per-image evaluation rows stay behind; the interventions keep theirs (the per-image criteria need them)
    assert "per_image" not in slim["models"]["loopvae"]["eval"]["kodak"]
    assert "per_image" in slim["models"]["loopvae"]["interventions"]["baseline"]
