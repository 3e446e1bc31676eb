"""The LoopVAE study's reading is computed from its numbers: change the numbers, the sentences change
(``studies/vae.py``, ``studies/_loopvae_pages.py``); the release page and the bundled model's card read the
committed result files (``studies/release_vae.py``), and both specs plan the runs their result files hold."""

import json
import sys
from pathlib import Path

import pytest

from looprun.study import ResultStore, load_study
from looprun.study.page import render

ROOT = Path(__file__).resolve().parents[2]
STUDY, RELEASE = load_study("vae", ROOT), load_study("release-vae", ROOT)
sys.path.insert(0, str(ROOT / "studies"))  # load_study put it there too; said here for the imports below
from _loopvae_pages import anytime_reading, interventions_table, per_image_criteria, references  # noqa: E402
from release_vae import psnr_at, references_lines, view, write_card  # noqa: E402
from vae import reading  # noqa: E402

GROUPS = {"global": ["global-s0", "global-s1"], "reference": ["flux-vae-tiny-s0", "flux-vae-tiny-s1"],
          "scale": ["scale-s0"], "none": ["none-s0"], "shortcuts": ["shortcuts-s0"],
          "deep-supervision": ["global-ds-s0"]}
N = 4  # images of the fake intervention results; image i is offset by 0.01 * i


def _row(value: float) -> dict:
    return {"psnr": [value + 0.01 * i for i in range(N)]}


def _stage(branch: str, scale: str, prefix: list[float], bypass: list[float]) -> dict:
    return {"branch": branch, "scale": scale, "passes": len(prefix),
            "prefix": [{"passes": k + 1, "psnr": v, "raw_psnr": v - 1, "out_of_range": 0.1 / (k + 1),
                        "clip_displacement": 0.01, "per_image": _row(v)} for k, v in enumerate(prefix)],
            "bypass": [{"pass": t, "psnr": v, "per_image": _row(v)} for t, v in enumerate(bypass)]}


def _interventions(dec2x: list[float], bypass2x: list[float]) -> dict:
    full = dec2x[-1]
    return {"num_images": N, "baseline": {"psnr": full, "raw_psnr": full, "out_of_range": 0.01,
                                           "clip_displacement": 0.001, "per_image": _row(full)},
            "stages": [_stage("encoder", "2x", [full], [full - 0.1]),
                       _stage("encoder", "4x", [full - 0.3, full], [full - 0.1, full - 0.2]),
                       _stage("decoder", "2x", dec2x, bypass2x)]}


def result(global_psnr: float = 24.0, reference_psnr: float = 23.0, dec2x=(18.0, 20.0, 22.0, 24.0),
           bypass2x=(23.0, 22.0, 20.0, 23.5), reference_seeds=(0.0, 0.05)) -> dict:
    ev = {}
    for group, names in GROUPS.items():
        base = {"global": global_psnr, "reference": reference_psnr}.get(group, global_psnr - 0.5)
        offsets = reference_seeds if group == "reference" else (0.0, 0.05)
        for i, name in enumerate(names):
            ev[name] = {split: {"psnr": base + offsets[i], "baseline": {"psnr": 25.0}}
                        for split in ("kodak", "imagenet")}
    return {"eval": ev, "groups": GROUPS, "num_holdout": 40,
            "preset": {"max_steps": 2200, "batch_size": 8, "resolution": 64},
            "timings": {"train": {"global-s0": 1700.0, "global-s1": 1800.0, "flux-vae-tiny-s0": 700.0,
                                  "flux-vae-tiny-s1": 740.0}},
            "params": {"global": 350_535, "reference": 1_031_401, "scale": 650_000, "none": 1_250_000},
            "gmacs": {"global": 7.23, "reference": 5.63}, "bundled": {"name": "global-s0"},
            "interventions": {"global-s0": _interventions(list(dec2x), list(bypass2x)),
                              "global-ds-s0": _interventions([22.0, 22.5, 23.0, 23.8], list(bypass2x))}}


def _line(lines: list[str], start: str) -> str:
    return next(line for line in lines if line.lstrip().startswith(start))


def test_weights_vs_quality_is_a_paired_verdict_and_never_holds_by_default() -> None:
    line = _line(reading(result(24.0, 23.0)), "- **Weights vs quality (kodim21-24)")
    # two seeds, both exactly +1.00 dB: zero spread is degenerate (no interval, no p = 0), never "better"
    assert ("paired by seed: +1.00 dB (no interval: zero spread between seeds, degenerate); 2/2 higher: "
            "**inconclusive**") in line
    assert "holds" not in line
    line = _line(reading(result(24.0, 23.0, reference_seeds=(0.0, 0.1))), "- **Weights vs quality (kodim21-24)")
    # +1.00 and +0.95: a narrow interval above 0
    assert "**better**" in line and "holds" not in line
    line = _line(reading(result(24.0, 23.0, reference_seeds=(0.0, 2.0))), "- **Weights vs quality (kodim21-24)")
    # +1.00 and -0.95: the interval spans 0, and the disagreeing reference seeds are flagged
    assert "**inconclusive**" in line and "seeds differ by 2.00 dB" in line
    # -1.00 and -1.05: a narrow interval below 0
    line = _line(reading(result(22.0, 23.0, reference_seeds=(0.0, 0.1))), "- **Weights vs quality (kodim21-24)")
    assert "**worse**" in line and "holds" not in line


def test_matched_budget_states_images_seen_and_wall_time() -> None:
    line = _line(reading(result()), "- **Matched budget")
    assert "17,600 crops of 64²" in line and "1750 s" in line and "720 s" in line and "not in time" in line


def test_single_seed_arms_are_inconclusive() -> None:
    lines = reading(result())
    assert "**inconclusive** (one pair, no interval)" in _line(lines, "- **Sharing")
    assert "**inconclusive**" in _line(lines, "- **Shortcuts")


def test_bicubic_and_truncation_targets_are_decided_by_the_numbers() -> None:
    lines = reading(result(24.0))
    assert "target is ≥ +1.0 dB: not met" in _line(lines, "- **Against bicubic")
    assert "target is ≥ +1.0 dB: met" in _line(reading(result(26.5)), "- **Against bicubic")
    assert "costs 6.00 dB (target ≥ 5 dB: met" in _line(lines, "- **Truncation")
    assert "≥ 5 dB: not met" in _line(reading(result(dec2x=(23.5, 24.1, 23.9, 24.0))), "- **Truncation")


def test_per_image_counts_follow_the_images() -> None:
    r = result(24.0, dec2x=(18.0, 20.0, 22.0, 24.0), bypass2x=(23.0, 24.2, 20.0, 23.5))
    iv = r["interventions"]["global-s0"]
    dec = iv["stages"][-1]
    c = per_image_criteria(iv, dec)
    assert c == {"n": N, "monotone": N, "bypass_hurts": [N, 0, N, N], "worst": [0, 0, N, 0]}
    # one image whose third pass lowers PSNR: monotone on 3 of 4
    dec["prefix"][2]["per_image"]["psnr"][1] = 25.0
    assert per_image_criteria(iv, dec)["monotone"] == N - 1
    row = _line(interventions_table(iv), "| decoder | 2x")
    assert "| 3/4 | 4/4, 0/4, 4/4, 4/4 | pass 3: 4 |" in row
    # the worst bypass: the last pass in encoder 4x (its second bypass loses more), not in decoder 2x (pass 3)
    line = _line(reading(r), "- **Interventions, per image")
    assert "the worst bypass is the last pass in 1 of the 2 looped stages (encoder 4x)" in line


@pytest.mark.parametrize("prefix,expect", [
    ((22.0, 22.5, 23.0, 23.8), "one pass costs 1.80 dB (≥ 1.0 dB): a usable early exit does not appear"),
    ((23.96, 23.97, 23.98, 23.98), "pass(es) 2, 3, 4 add at most 0.05 dB each"),
    ((23.5, 23.7, 23.9, 24.1), "an any-time decoder."),
])
def test_anytime_needs_rising_quality_and_a_cheap_exit(prefix: tuple, expect: str) -> None:
    text = anytime_reading(_interventions(list(prefix), [23.0, 22.0, 20.0, 23.5]))
    assert expect in text
    if "stopped" in text:
        # core work here: encoder 2x 1, encoder 4x 2/4, decoder 2x 4 -> three idle passes are 3 / 5.5 of it
        assert "55% of the cores' work idle" in text and "Not an any-time decoder" in text


VERDICT_WORDS = ("better", "worse", "inconclusive")


def test_deep_supervision_is_compared_per_image_with_the_plain_run() -> None:
    line = _line(reading(result()), "- **Deep supervision")
    assert "k=1: +4.00 dB" in line and "Not an any-time decoder" not in line
    # one run per model, paired by image: descriptive, no verdict word (the seed is the unit of every verdict)
    assert "one run per model: descriptive" in line and not any(w in line for w in VERDICT_WORDS)


def test_the_release_by_image_comparisons_are_descriptive(tmp_path: Path) -> None:
    """The bundled model against its reference and bicubic: one run each, so the page and the card give the
    by-image intervals without a verdict and point to the seed-level comparison."""
    release = view(ResultStore(ROOT, RELEASE.docs).all())
    assert release["comparisons"]["imagenet"]["vs_reference_psnr"]["verdict"] == "better"  # stored, not shown
    lines = render(RELEASE, ROOT, write=False)[0].splitlines()
    by_image = [line for line in lines if line.startswith(("- kodim21–24:", "- 40 held-out ImageNet images:"))]
    assert len(by_image) == 2 and "LoopVAE − reference PSNR +2.64 dB [+2.36, +2.92]" in by_image[1]
    assert not any(w in line for line in by_image for w in VERDICT_WORDS)
    intro = next(line for line in lines if line.startswith("Paired by image"))
    assert "one run per model" in intro and "descriptive" in intro and "[study_fair.md](study_fair.md)" in intro
    write_card(tmp_path, release)
    card = (tmp_path / "README.md").read_text()
    table = card.split("## Measured")[1].split("Decoder finest stage")[0]
    # the card compares with the tuned references bundled beside it (one run each: numbers, no verdict), not with
    # the untuned flux-vae-tiny
    dcae = references(ROOT)["dcae-tiny"]["eval"]["imagenet"]
    assert f"{dcae['psnr']:.2f} / {dcae['ssim']:.3f}" in table and "`dcae-tiny` (AutoencoderDC" in table
    assert "flux-vae-tiny" not in table and "+2.64" not in table and "docs/study_fair.md" in table
    assert not any(w in table for w in VERDICT_WORDS)


def _reference(psnr: float, bicubic: float, bundled: bool) -> dict:
    split = {"psnr": psnr, "ssim": 0.8, "baseline": {"psnr": bicubic}}
    r = {"class": "AutoencoderKL", "params": 1_049_603, "gmacs": 8.11, "images_seen": 60_000, "train_seconds": 3600.0,
         "recipe_arm": "mse10", "date": "2026-12-07 10:00", "eval": {"kodak": split, "imagenet": split},
         "bundled": bundled, "curve": [{"step": 750 * k, "psnr": psnr - 2.0 + 0.2 * k} for k in range(1, 11)]}
    if not bundled:
        r["refused"] = f"klvae: {psnr:.2f} dB on the held-out images is not above bicubic ({bicubic:.2f} dB)"
    return r


def test_the_references_section_says_which_reference_was_refused_and_why() -> None:
    refs = {"klvae-tiny-w32-attn": _reference(24.9, 25.3, False), "dcae-tiny": _reference(30.1, 25.3, True)}
    text = "\n".join(references_lines(refs, None))
    rows = {line.split(" | ")[0]: line for line in text.splitlines() if line.startswith("| `")}
    assert rows["| `dcae-tiny`"].endswith("| 25.30 | yes |") and "30.10 / 0.8000" in rows["| `dcae-tiny`"]
    assert "| no: klvae: 24.90 dB on the held-out images is not above bicubic (25.30 dB) |" in rows[
        "| `klvae-tiny-w32-attn`"]
    assert "carry no verdict" in text and "1.00 |" in rows["| `dcae-tiny`"]  # CPU-hours from train_seconds
    assert "Produced by `make release-references` on 2026-12-07:" in text  # the runs' date, without the time
    # the last fifth of the steps (6,000 -> 7,500) added 2 x 0.2 dB: still rising, said with the numbers
    assert ("- `dcae-tiny`: 29.70 → 29.90 → 30.10 dB at steps 6,000, 6,750, 7,500; steps 6,000 → 7,500: +0.40 dB."
            in text)


def test_the_specs_plan_exactly_the_runs_of_the_migrated_result_files() -> None:
    """The split result files (docs/study_loopvae/migration.json) are the runs the specs plan, with the settings
    they ran with: a rerun trains nothing that is committed, and a missing file is planned again."""
    for study, count in ((STUDY, 9), (RELEASE, 14)):
        records = ResultStore(ROOT, study.docs).all()
        planned = [p for phase in study.plan_phases() for p in phase.plan(study, records)]
        assert sorted(p.id for p in planned) == sorted(records) and len(planned) == count
        for p in planned:
            # the search's width96 arm renamed a key since (norm_num_groups)
            if p.phase in ("study", "release", "references"):
                assert records[p.id]["settings"] == dict(p.settings), p.id
    without = {k: r for k, r in ResultStore(ROOT, RELEASE.docs).all().items() if k != "flux-vae-tiny-s0"}
    assert [p.id for p in RELEASE.plan_phases()[2].plan(RELEASE, without)] == []  # the bundle waits for both runs


def test_the_search_reading_recomputes_the_committed_picks() -> None:
    """The PSNR at matched CPU time is recomputed from the curves: it equals what the search committed."""
    runs = {r["arm"]: r for r in ResultStore(ROOT, RELEASE.docs).all().values() if r["phase"] == "search"}
    invocation = json.loads((ROOT / "docs/study_loopvae/invocations.json").read_text())["recipe-search"]
    seconds = min(r["curve"][-1]["train_seconds"] for r in runs.values())
    assert seconds == invocation["matched_seconds"]
    assert all(psnr_at(r["curve"], seconds) == r["at_matched"] for r in runs.values())
    assert max(runs, key=lambda n: runs[n]["at_matched"]) == invocation["best"] == "lr2e-3+mse"
    assert "Best at matched CPU time: **lr2e-3+mse**." in render(RELEASE, ROOT, write=False)[0]
