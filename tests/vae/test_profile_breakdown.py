"""loopvae profile --breakdown: both steps of each model, attributed by op class, MACs consistent with profile."""

import json
from pathlib import Path

import pytest

from loopvae.cli import main as loopvae_main


def test_breakdown_of_loopvae_and_its_reference(tmp_path: Path) -> None:
    out = tmp_path / "p"
    assert loopvae_main(["profile", "--models", "loopvae-cnn-tiny,flux-vae-tiny", "--breakdown", "--resolution", "32",
                         "--train-batch", "2", "--train-resolution", "32", "--warmup", "0", "--iters", "1",
                         "--out", str(out)]) == 0
    data = json.loads((out / "breakdown.json").read_text())
    rows = {r["model"]: r for r in json.loads((out / "profile.json").read_text())}
    parts = {m["model"]: m for m in data["models"]}
    assert set(parts) == {"loopvae-cnn-tiny", "flux-vae-tiny"}
    assert data["peaks"]["flops_per_s"] > 0 and data["peaks"]["bytes_per_s"] > 0
    for name, part in parts.items():
        forward, train = part["forward"], part["train"]
        # the recorded forward does what profile counted on the meta device: the same MACs
        assert forward["gmacs"] == pytest.approx(rows[name]["gmacs"], rel=1e-9)
        assert train["gmacs"] > forward["gmacs"] * (2 * 32**2) / (1 * 32**2)  # 2 crops, plus the backward
        for step in (forward, train):
            assert sum(r["share"] for r in step["rows"]) == pytest.approx(1.0)
            assert step["op_ms"] + step["outside_ops_ms"] == pytest.approx(step["instrumented_ms"])
        classes = {r["class"] for r in train["rows"]}
        assert "optimizer" in classes and "optimizer" not in {r["class"] for r in forward["rows"]}
    # what each architecture is made of
    loop = {r["class"] for r in parts["loopvae-cnn-tiny"]["train"]["rows"]}
    ref = {r["class"] for r in parts["flux-vae-tiny"]["train"]["rows"]}
    assert "depthwise convolution" in loop and "depthwise convolution" not in ref
    assert "attention" in ref and "attention" not in loop  # the reference's mid-block attention
    text = (out / "profile.md").read_text()
    assert "## Where the time goes, by op class" in text and "| depthwise convolution |" in text
    assert (out / "breakdown.png").is_file()


def test_breakdown_refuses_a_gpu_device(tmp_path: Path, capsys) -> None:
    assert loopvae_main(["profile", "--models", "flux-vae-tiny", "--breakdown", "--device", "cuda", "--out",
                         str(tmp_path / "p")]) == 2
    assert "--breakdown times every op on the CPU; run it with --device cpu" in capsys.readouterr().err
    assert not (tmp_path / "p").exists()  # refused before anything is written
