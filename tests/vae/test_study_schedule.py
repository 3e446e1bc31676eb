"""The schedule study (``studies/schedule.py``): arms that the trainer accepts, the plan, verdicts and dominance
computed from the numbers, per-image intervention summaries, the committed page's results read by ``loopvae profile
--quality``, and (slow) every run through the engine at a tiny budget."""

import json
import sys
from pathlib import Path

import pytest

import loopvae
from looprun.study import load_study
from loopvae.cli import main as loopvae_main
from loopvae.profile import load_quality, pareto_front
from loopvae.train_config import load_train_config

ROOT = Path(__file__).resolve().parents[2]
STUDY = load_study(ROOT / "studies" / "schedule.py")
spec = sys.modules[STUDY.run.__module__]
REFERENCE = spec.REFERENCE
compare, dominance, intervention_summary, pareto_set, reading, same_configuration_pairs, trained_at_exit_lines = (
    spec.compare, spec.dominance, spec.intervention_summary, spec.pareto_set, spec.reading,
    spec.same_configuration_pairs, spec.trained_at_exit_lines)

N = 6  # images of the fake evaluations


def test_every_arm_is_a_valid_training_config_with_its_schedule() -> None:
    planned = spec.plan_main(STUDY, {})
    names = {p.arm for p in planned}
    assert {"paper", "dec-1-2-1", "dec-1-2-2", "dec-4-2-1", "dec-2-2-2", REFERENCE} <= names
    for p in planned:
        assert p.id == f"{p.arm}-s{p.seed}" and p.settings["steps"] == 1500
        cfg = load_train_config("release-tiny", spec.overrides(p.settings, p.seed, 1500))
        assert cfg.max_steps == 1500 and cfg.seed == p.seed and cfg.model == p.settings["model"]
        model = loopvae.create_model(cfg.model, **cfg.model_overrides)
        passes = p.settings["model_overrides"]
        if passes:
            assert list(model.config.decoder_passes) == passes["decoder_passes"]
            assert list(model.config.encoder_passes) == passes["encoder_passes"]
            assert model.config.shortcuts is True
        else:
            assert p.arm == REFERENCE and cfg.model == REFERENCE
    # the arms the dominance question rests on carry >= 2 seeds
    seeds = {arm: [p.seed for p in planned if p.arm == arm] for arm in names}
    assert all(len(seeds[a]) >= 2 for a in ("paper", "dec-1-2-1", "dec-1-2-2", REFERENCE))
    assert len(planned) == 15


def test_the_measure_run_waits_for_every_main_run() -> None:
    main = spec.plan_main(STUDY, {})
    finished = {p.id: {"status": "finished"} for p in main}
    assert spec.plan_measure(STUDY, {}) == []
    assert spec.plan_measure(STUDY, {**finished, main[-1].id: {"status": "failed"}}) == []
    (measure,) = spec.plan_measure(STUDY, finished)
    arms = measure.settings["arms"]
    assert measure.id == "measure" and list(arms) == [a.name for a in STUDY.arms]  # spec order: the page's rows
    assert arms["paper"] == ["paper-s0", "paper-s1", "paper-s2"] and arms["paper-ds"] == ["paper-ds-s0"]


def _wobble(seed: int, i: int) -> int:
    """-1, 0 or +1 for image ``i`` of ``seed``: zero-mean over the N = 6 images of every seed, and over seeds 0, 1,
    2 for every image, and different between any two of those seeds."""
    return (i + seed) % 3 - 1


def _quality(seed_offsets: dict[int, float], base: float = 25.0, wobble: float = 0.0) -> dict:
    """Per-image PSNR ``base + offset + 0.1 i``; ``wobble`` adds ``wobble * _wobble(seed, i)`` per image (the seed
    means stay as without it), so two seeds differ by a different amount on each image."""
    seeds = {}
    for seed, off in seed_offsets.items():
        per = [base + off + 0.1 * i + wobble * _wobble(seed, i) for i in range(N)]
        seeds[seed] = {"psnr": sum(per) / N, "ssim": 0.8 + off / 100, "keys": [f"k{i}" for i in range(N)],
                       "per_image_psnr": per, "per_image_ssim": [0.8 + off / 100] * N}
    vals = [s["psnr"] for s in seeds.values()]
    return {"seeds": seeds, "psnr": sum(vals) / len(vals), "psnr_sd": None, "ssim": 0.8}


def _rows(arm_offsets: dict[str, tuple[dict[int, float], int, float]], wobble: float = 0.0) -> dict:
    ref_q = _quality({0: 0.0, 1: 0.05, 2: -0.05}, wobble=wobble)
    rows = {REFERENCE: {"params": 1_000_000, "gmacs": 5.0, "cpu_ms": {"median": 100.0}, "quality": ref_q,
                        "vs_reference": None, "encoder_passes": None, "decoder_passes": None}}
    for name, (offsets, params, gmacs) in arm_offsets.items():
        q = _quality(offsets, wobble=wobble)
        rows[name] = {"params": params, "gmacs": gmacs, "cpu_ms": {"median": 200.0}, "quality": q,
                      "vs_reference": compare(q, ref_q), "encoder_passes": (1, 2, 4), "decoder_passes": (1, 2, 4)}
    return rows


def test_dominance_needs_all_three_criteria_and_a_seed_paired_win() -> None:
    rows = _rows({
        "paper": ({0: 1.0, 1: 1.1, 2: 0.9}, 340_000, 7.0),        # better, but more MACs
        "dec-1-2-1": ({0: 0.8, 1: 0.9, 2: 0.85}, 330_000, 4.9),   # better, cheaper, lighter: dominates
        "dec-1-2-2": ({0: 0.8, 1: 0.9}, 340_000, 4.9),            # better, cheaper, but 0.34x the weights
        "dec-2-2-2": ({0: 2.0}, 330_000, 4.0),                    # one seed: no interval, cannot be credited
        "dec-4-2-1": ({0: 0.5, 1: -0.5, 2: 0.1}, 330_000, 4.0),   # seeds disagree: inconclusive
    })
    dom = dominance(rows, REFERENCE)
    assert dom["dec-1-2-1"]["dominates"]
    assert not dom["paper"]["dominates"] and not dom["paper"]["macs_ok"] and dom["paper"]["psnr_ok"]
    assert not dom["dec-1-2-2"]["dominates"] and dom["dec-1-2-2"]["dominates_but_weights"]
    assert dom["dec-2-2-2"]["psnr_by_seed"] == "inconclusive" and not dom["dec-2-2-2"]["dominates"]
    assert dom["dec-4-2-1"]["psnr_by_seed"] == "inconclusive"
    text = "\n".join(reading({"rows": {**rows, "paper": {**rows["paper"]}}, "reference": REFERENCE,
                              "dominance": dom, "pareto": pareto_set(rows), "dcae_tiny_gmacs": 3.64}))
    assert "Dominance reached" in text and "dec-1-2-1" in text.split("\n")[0]

    dom["dec-1-2-1"].update(dominates=False, weights_ok=False)  # the same numbers without the weight cap met
    text = "\n".join(reading({"rows": rows, "reference": REFERENCE, "dominance": dom, "pareto": [],
                              "dcae_tiny_gmacs": 3.5}))
    assert "No arm dominates" in text and "misses by the weight cap alone" not in text
    # the two-axis line names its reference as untuned and sets the arm's MACs against the tuned dcae-tiny
    assert "an untuned reference at LoopVAE's recipe" in text and "the tuned `dcae-tiny`" in text
    assert "does 3.50 GMACs, so against it these arms cost dec-1-2-1 1.40×, dec-1-2-2 1.40× its MACs" in text


def _read(rows: dict) -> list[str]:
    return reading({"rows": rows, "reference": REFERENCE, "dominance": dominance(rows, REFERENCE),
                    "pareto": pareto_set(rows), "dcae_tiny_gmacs": 3.64})


def test_by_image_differences_carry_no_verdict_and_stand_beside_null_rows() -> None:
    # every image moves by its seed's offset, give or take 0.01 dB: each by-image interval is narrow, excludes 0
    # and would read "better"
    rows = _rows({"paper": ({0: 1.0, 1: 1.1, 2: 0.9}, 340_000, 7.0), "dec-2-4-1": ({0: 1.2}, 340_000, 5.0)},
                 wobble=0.01)
    rows["dec-2-4-1"]["vs_paper"] = compare(rows["dec-2-4-1"]["quality"], rows["paper"]["quality"])
    assert rows["dec-2-4-1"]["vs_paper"]["by_image_psnr"]["verdict"] == "better"
    lines = _read(rows)
    vs_paper = next(line for line in lines if line.startswith("- dec-2-4-1 vs paper"))
    by_seed, by_image = vs_paper.split("; by image ")
    assert "(n = 1, no interval): inconclusive" in by_seed  # one seed: the verdict, by seed, is inconclusive
    # image differences +0.19, +0.20, +0.21 (twice): t(5) interval +0.20 ± 0.009
    assert by_image.startswith("+0.20 [+0.19, +0.21] (n = 6; 6/6 higher), descriptive")
    assert not any(word in by_image for word in ("better", "worse", "inconclusive"))
    for line in lines:
        if line.startswith("  - dec-2-4-1: weights"):
            assert line.endswith("by image +1.20 dB (descriptive).") and "by image better" not in line
    # two seeds of one configuration, paired by image: the same narrow intervals excluding 0, counted as null rows
    null = next(line for line in lines if line.startswith("- **By image, one run per model: descriptive.**"))
    assert "excludes 0 in 3 of 3 LoopVAE seed pairs (6 of 6 with the reference's)" in null
    # paper s1 − s2: +0.20 plus 0.01 × (-1, +2, -1, -1, +2, -1) over the images: t(5) interval +0.20 ± 0.016
    assert "paper s1 − s2, is +0.20 [+0.18, +0.22] (n = 6; 6/6 higher)" in null
    assert "verdicts are paired by seed" in null

    # every image moves by exactly its seed's offset: a seed pair differs by the same amount on every image (zero
    # spread), which is degenerate: no interval, no p, inconclusive, and not counted as excluding 0
    rows = _rows({"paper": ({0: 1.0, 1: 1.1, 2: 0.9}, 340_000, 7.0), "dec-2-4-1": ({0: 1.2}, 340_000, 5.0)})
    pairs = same_configuration_pairs(rows)
    assert len(pairs) == 6
    assert all(p["diff"]["low"] is None and p["diff"]["high"] is None and p["diff"]["p"] is None
               and p["diff"]["verdict"] == "inconclusive" for p in pairs)
    null = next(line for line in _read(rows) if line.startswith("- **By image, one run per model: descriptive.**"))
    assert "excludes 0 in 0 of 3 LoopVAE seed pairs (0 of 6 with the reference's)" in null
    assert "paper s1 − s2, is +0.20 dB (n = 6, no interval)" in null
    assert not any(word in null for word in ("better", "worse", "inconclusive"))


def test_pareto_membership_on_margins_within_seed_noise_is_flagged() -> None:
    # dec-1-2-1 is cheaper on both costs and 0.03 dB higher on average, but its seeds cross paper's
    rows = _rows({"paper": ({0: 1.0, 1: 1.1, 2: 0.9}, 340_000, 7.0),
                  "dec-1-2-1": ({0: 1.05, 1: 0.95, 2: 1.1}, 330_000, 4.9)})
    assert pareto_set(rows) == ["dec-1-2-1"]
    text = "\n".join(_read(rows))
    assert "paper off it by +0.03 dB (behind dec-1-2-1)" in text
    assert "Pareto membership differences are within seed noise" in text
    assert "On it by cost alone (no arm is as cheap on both params and GMACs): dec-1-2-1." in text
    assert "flux-vae-tiny off it (behind dec-1-2-1, better paired by seed)" in text
    # +0.50, +0.55, +0.45 dB over paper's seeds: the same membership, now resolved by seed
    rows = _rows({"paper": ({0: 1.0, 1: 1.1, 2: 0.9}, 340_000, 7.0),
                  "dec-1-2-1": ({0: 1.5, 1: 1.65, 2: 1.35}, 330_000, 4.9)})
    text = "\n".join(_read(rows))
    resolved = next(line for line in text.splitlines() if line.startswith("  - Resolved by seed:"))
    assert "paper off it (behind dec-1-2-1, better paired by seed)" in resolved
    assert "within seed noise" not in text


def test_an_early_exit_is_set_against_the_arm_trained_at_its_schedule() -> None:
    rows = _rows({"dec-1-2-1": ({0: 0.8, 1: 0.9, 2: 0.85}, 330_000, 4.9)})  # seeds 26.05, 26.15, 26.10 dB
    rows["dec-1-2-1"]["decoder_passes"] = (1, 2, 1)
    rows["dec-1-2-1"]["quality"]["psnr_sd"] = 0.05

    def anytime(exit_psnr: float) -> dict:
        return {"paper-ds-s0": [{"decoder_passes": [1, 2, 4], "psnr": 26.5},
                                {"decoder_passes": [1, 2, 1], "psnr": exit_psnr}]}

    (line,) = trained_at_exit_lines({"rows": rows, "anytime": anytime(25.5)})
    assert "dec-1-2-1 (3 seeds, s.d. 0.05) reaches 26.10 dB with the same decoder schedule" in line
    assert "paper-ds-s0 25.50 dB (-0.60)" in line
    assert "scores below every seed of the model trained at it" in line and "no seed-paired interval" in line
    (line,) = trained_at_exit_lines({"rows": rows, "anytime": anytime(26.1)})
    assert "Below every seed of the model trained at [1, 2, 1]: none" in line and "scores higher" not in line
    # the full-depth row of an any-time model is no early exit
    rows["dec-1-2-1"]["decoder_passes"] = (1, 2, 4)
    assert trained_at_exit_lines({"rows": rows, "anytime": anytime(25.5)}) == []


def test_a_runs_quality_pools_both_held_out_sets_kodak_first() -> None:
    row = lambda key, psnr: {"key": key, "shard": "s.tar", "psnr": psnr, "ssim": psnr / 100, "bicubic_psnr": psnr - 2}
    evaluation = {"imagenet": [row("n1", 30.0), row("n2", 32.0), row("n3", 34.0)], "kodak": [row("kodim21", 20.0)]}
    q = spec.seed_quality(evaluation)
    assert q["keys"] == ["kodak/kodim21", "imagenet/n1", "imagenet/n2", "imagenet/n3"]
    assert q["per_image_psnr"] == [20.0, 30.0, 32.0, 34.0] and q["per_image_ssim"] == [0.2, 0.3, 0.32, 0.34]
    assert q["psnr"] == 29.0 and q["psnr_kodak"] == 20.0 and q["psnr_imagenet"] == 32.0  # pooled over images
    assert q["bicubic_psnr"] == 27.0 and q["ssim"] == pytest.approx(0.29)


def test_anytime_table_scores_and_times_every_decoder_schedule(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from loopvae.metrics import psnr_per_image, to_uint8

    # one timing round of one call and three schedules: the protocol, at a unit test's cost
    monkeypatch.setattr(spec, "ROUNDS", 1)
    monkeypatch.setattr(spec, "ITERS", 1)
    monkeypatch.setattr(spec, "ANYTIME", ([1, 2, 4], [1, 2, 2], [1, 1, 1]))
    torch.manual_seed(0)
    model = loopvae.create_model("loopvae-cnn-tiny", shortcuts=True).eval()
    images = torch.rand(3, 3, 32, 32) * 2 - 1
    with torch.no_grad():
        rows = spec.anytime_table({"m": model}, images)["m"]
        full = psnr_per_image(to_uint8(model.decode(model.encode(images).latent_dist.mode()).sample),
                              to_uint8(images))
    assert [r["decoder_passes"] for r in rows] == [list(s) for s in spec.ANYTIME]
    assert rows[0]["per_image_psnr"] == pytest.approx(full.tolist())  # the first row is the trained schedule
    assert all(len(r["per_image_psnr"]) == 3 and r["psnr"] == pytest.approx(sum(r["per_image_psnr"]) / 3)
               for r in rows)
    assert all(r["decode_ms"]["min"] <= r["decode_ms"]["median"] <= r["decode_ms"]["max"] for r in rows)
    gmacs = [r["decode_gmacs"] for r in rows]  # [1, 2, 4] > [1, 2, 2] > [1, 1, 1]
    assert gmacs == sorted(gmacs, reverse=True) and len(set(gmacs)) == len(gmacs) and gmacs[-1] > 0


def test_pareto_front_keeps_only_non_dominated_points() -> None:
    points = {"a": (1.0, 5.0, 30.0), "b": (1.0, 6.0, 29.0), "c": (3.0, 4.0, 29.5), "d": (1.0, 5.0, 30.0)}
    assert pareto_front(points) == ["a", "c", "d"]  # b is beaten by a on every axis; a and d tie: both stay


def _stage(branch: str, scale: str, prefix: list[list[float]], bypass: list[list[float]]) -> dict:
    mean = lambda v: sum(v) / len(v)
    return {"branch": branch, "scale": scale, "passes": len(prefix),
            "prefix": [{"passes": k + 1, "psnr": mean(v), "raw_psnr": mean(v) - 1, "out_of_range": 0.5,
                        "per_image": {"psnr": v}} for k, v in enumerate(prefix)],
            "bypass": [{"pass": t, "psnr": mean(v), "per_image": {"psnr": v}} for t, v in enumerate(bypass)]}


def test_intervention_summary_counts_images_not_means() -> None:
    base = [30.0, 30.0, 30.0]
    result = {"baseline": {"psnr": 30.0, "per_image": {"psnr": base}}, "stages": [
        _stage("encoder", "4x", [[29, 29, 29], base], [[28, 28, 28], [29, 29, 31]]),
        # image 2 does not rise at pass 3 -> 2 of 3 images rise at every pass
        _stage("decoder", "2x", [[20, 20, 20], [25, 25, 26], [28, 28, 25], base], [[29, 29, 29]] * 4),
    ]}
    s = intervention_summary(result)
    assert s["images_rising_at_every_fine_pass"] == 2
    assert s["images_hurt_by_every_bypass"] == 2  # image 2 gains from the encoder 4x pass-2 bypass
    assert s["worst_bypass"] == {"stage": "encoder 4x", "pass": 1, "psnr_loss": 2.0}
    assert s["last_pass_is_worst"] is False and s["fine_prefix_psnr"][0] == 20.0


def test_profile_puts_measured_quality_next_to_cost(tmp_path: Path) -> None:
    results = {"rows": {
        "paper": {"model": "loopvae-cnn-tiny", "model_overrides": {"shortcuts": True, "decoder_passes": [1, 2, 4]},
                  "quality": {"psnr": 27.0, "psnr_sd": 0.1, "ssim": 0.8}},
        "dec-1-2-1": {"model": "loopvae-cnn-tiny", "model_overrides": {"shortcuts": True, "decoder_passes": [1, 2, 1]},
                      "quality": {"psnr": 26.5, "psnr_sd": 0.1, "ssim": 0.79}},
        "dec-worse": {"model": "loopvae-cnn-tiny", "model_overrides": {"shortcuts": True, "decoder_passes": [1, 2, 2]},
                      "quality": {"psnr": 26.0, "psnr_sd": None, "ssim": 0.7}},
        REFERENCE: {"model": REFERENCE, "model_overrides": {}, "quality": {"psnr": 26.8, "psnr_sd": 0.2, "ssim": 0.75}},
    }}
    path = tmp_path / "results.json"
    path.write_text(json.dumps(results))
    assert loopvae_main(["profile", "--quality", str(path), "--macs-only", "--resolution", "64",
                         "--out", str(tmp_path / "p")]) == 0
    rows = {r["model"]: r for r in json.loads((tmp_path / "p" / "profile.json").read_text())}
    assert rows["dec-1-2-1"]["gmacs"] < rows["dec-worse"]["gmacs"] < rows["paper"]["gmacs"]
    assert rows["dec-1-2-1"]["overrides"]["decoder_passes"] == [1, 2, 1] and rows["paper"]["psnr"] == 27.0
    md = (tmp_path / "p" / "profile.md").read_text()
    quality = md.split("## Quality next to cost")[1]
    pareto = {line.split("|")[1].strip() for line in quality.splitlines() if line.rstrip().endswith("| yes |")}
    # dec-worse has more MACs and less PSNR than dec-1-2-1 with the same weights: off the front
    assert pareto == {"paper", "dec-1-2-1", REFERENCE}
    assert (tmp_path / "p" / "quality.png").is_file()


def test_profile_quality_file_errors_name_the_file(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(FileNotFoundError, match="make study-schedule"):
        load_quality(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"rows": {"x": {"model": "loopvae-cnn-tiny"}}}))
    with pytest.raises(ValueError, match=str(bad)):
        load_quality(bad)
    assert loopvae_main(["profile", "--out", str(tmp_path / "p")]) == 2
    assert "--models" in capsys.readouterr().err
    assert loopvae_main(["profile", "--quality", str(bad), "--out", str(tmp_path / "p")]) == 2
    assert str(bad) in capsys.readouterr().err


def test_the_committed_results_feed_loopvae_profile() -> None:
    """``loopvae profile --quality docs/study_schedule/results.json`` reads the rows the page's render writes."""
    entries = {e["label"]: e for e in load_quality(ROOT / "docs/study_schedule/results.json")}
    assert list(entries) == [a.name for a in STUDY.arms]
    assert entries["dec-1-2-1"]["overrides"]["decoder_passes"] == [1, 2, 1] and entries[REFERENCE]["overrides"] == {}
    assert round(entries["paper"]["psnr"], 2) == 27.46 and round(entries["paper"]["psnr_sd"], 2) == 0.06


@pytest.mark.slow
def test_every_run_through_the_engine_at_a_tiny_budget(tmp_path: Path) -> None:
    """Three arms' runs (train, evaluate, intervene), the measure run and the page, through the engine's local pool
    at 2 steps and 2 intervention / any-time images (~10 min)."""
    from dataclasses import replace

    from loopdata import find_shared_data
    from looprun.study.engine import run_study
    from looprun.study.executors import LocalPool
    from looprun.study.page import render

    if find_shared_data() is None:
        pytest.skip("the schedule study needs ../shared/data (the ImageNet sample)")
    study = replace(STUDY, arms=[STUDY.arm(a) for a in ("paper", "dec-1-2-1", REFERENCE)])
    runs = tmp_path / "runs"
    counts = run_study(study, LocalPool(2, runs), docs_root=tmp_path, code_root=ROOT, workdir=runs,
                       options={"steps": 2, "eval_limit": 2, "data_dir": str(tmp_path / "data")})
    assert counts == {"planned": 10, "ran": 10, "failed": 0}
    text, results = render(study, tmp_path)
    assert "dec-1-2-1" in text and "Pareto set" in text and "decoder_passes" in text
    assert set(results["rows"]) == {"paper", "dec-1-2-1", REFERENCE}
    docs = tmp_path / "docs" / "study_schedule"
    assert (docs / "frontier.png").is_file() and (docs / "anytime.png").is_file()
