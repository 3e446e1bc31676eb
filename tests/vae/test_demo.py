"""``loopvae demo`` end to end on the bundled images and the bundled trained model (short settings)."""

import json
from pathlib import Path

from looprun.checkpoint import sha256_file
from looprun.release import WEIGHTS_NAME
from loopvae.demo import TIMED_MODELS, bundled_model_dir, render_demo_report, run_demo, train_short_run


def test_demo_evaluates_intervenes_and_profiles_the_bundled_model(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    report = run_demo(out, ["progress_bar=false"], log=lambda *a: None, train_steps=3, profile_iters=1)
    text = report.read_text()
    bundled = bundled_model_dir()
    metrics = json.loads((out / "eval" / "metrics.json").read_text())
    assert metrics["model"]["source"] == str(bundled) and metrics["num_images"] == 4
    assert metrics["weights_sha256"]["model/diffusion_pytorch_model.safetensors"] == sha256_file(bundled / WEIGHTS_NAME)
    short = json.loads((out / "eval-short-run" / "metrics.json").read_text())
    assert short["model"]["kind"] == "run-checkpoint" and short["model"]["step"] == 3
    interventions = json.loads((out / "interventions" / "interventions.json").read_text())
    assert interventions["model"] == str(bundled) and len(interventions["stages"]) == 6
    rows = {r["model"]: r for r in json.loads((out / "profile" / "profile.json").read_text())}
    for name in TIMED_MODELS:  # timed side by side
        assert rows[name]["ms_per_image"] is not None and rows[name]["ms_per_image"] > 0
    assert rows["loopvae-cnn-f8d16"]["ms_per_image"] is None  # counted only
    for path in ("eval/grid.png", "interventions/psnr_vs_passes.png", "profile/profile.png"):
        assert (out / path).is_file(), path
    # the report names the model of every section and shows the bundled model's numbers
    assert "assets/models/loopvae-cnn-tiny" in text and "## Loop interventions (bundled model)" in text
    assert f"| bundled LoopVAE tiny (f8, 16 latent channels) | 0.250 | {metrics['psnr']:.2f} |" in text
    # the bundled model beside the tuned references bundled with it: compare's table and its picture
    comparison = json.loads((out / "compare" / "compare.json").read_text())
    assert [a["name"] for a in comparison["arms"]] == ["loopvae", "klvae-tiny-w32-attn", "dcae-tiny"]
    for arm in comparison["arms"]:
        assert f"| {arm['psnr']:.2f} | {arm['ssim']:.4f} |" in text
    assert (out / "compare" / "side_by_side.png").is_file() and "compare/side_by_side.png" in text
    assert "flux-vae-tiny" not in text  # the untuned reference is not the demo's yardstick any more
    decoder_2x = next(s for s in interventions["stages"] if s["branch"] == "decoder" and s["scale"] == "2x")
    assert " → ".join(f"{p['psnr']:.2f}" for p in decoder_2x["prefix"]) in text
    # rerunning reuses the finished training run (the demo's own train phase, called again; the other phases
    # do not depend on it, so the report is rendered from the files the first run wrote)
    again, config = train_short_run(out, ["progress_bar=false"], train_steps=3)
    assert not again.history and again.step == 3
    rows_list = json.loads((out / "profile" / "profile.json").read_text())
    text = render_demo_report(again, {"bundled": metrics, "short_run": short}, interventions, rows_list,
                              {"train": 0.0}, config, bundled)
    assert "Short run: reused the finished 3-step run." in text
