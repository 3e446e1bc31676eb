"""The fair-comparison study's planning and page (benchmarks/study_fair.py, study_fair_report.py) on synthetic
result files: equal CPU budgets from the cost probe, the search's pick, the two main budgets, the pre-registered
Holm family, the null rows, the diagnosis of a diverging seed and the listing of missing runs."""

import json
import random
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import study_fair as sf  # noqa: E402
import study_fair_report as report  # noqa: E402

IPS = {"shape-w32": 26.0, "shape-w24": 29.0, "shape-d2": 31.0, "shape-w32-attn": 25.0, "loopvae": 16.0,
       "loopvae-sc": 14.0, "dcae": 50.0}


@pytest.fixture
def study(tmp_path, monkeypatch) -> Path:
    docs = tmp_path / "study_fair"
    (docs / "runs").mkdir(parents=True)
    (docs / "probe.json").write_text(json.dumps({"images_per_second": IPS}))
    monkeypatch.setattr(sf, "DOCS", docs)
    monkeypatch.setattr(sf, "RESULTS", docs / "runs")
    monkeypatch.setattr(sf, "STEP_SCALE", 1.0)
    return docs


def curve(final: float, seconds: float, steps: int = 300) -> list[dict]:
    return [{"step": steps * k // 3, "images_seen": 8 * steps * k // 3, "train_seconds": seconds * k / 3,
             "psnr": final - (3 - k) * 0.5} for k in (1, 2, 3)]


def write(name: str, **record) -> None:
    sf.write_result(name, {"name": name, "status": "finished", **record})


def test_every_family_searches_nine_arms_at_the_same_cpu_budget(study: Path) -> None:
    for key, family in sf.FAMILIES.items():
        arms = sf.search_arms(family)
        assert len(arms) == 9, key
        assert arms[-1].name == ("mod1" if family.recurrent else "noise0")
        assert {"lr4e-3", "lr4e-3+mse"} <= {a.name for a in arms}  # above the old search's 2e-3 edge
    costs = json.loads((study / "probe.json").read_text())
    # 500 steps of loopvae-sc; the others get the same CPU-seconds at their own speed
    assert sf.base_steps("loopvae-sc", costs) == 500
    assert sf.base_steps("dcae", costs) == round(500 * 50 / 14)
    planned = sf.plan_search(costs, ["dcae", "loopvae-sc"])
    names = [p.arm.name for p in planned]
    # nine pre-registered arms plus the review's lr-5e-4 arm (docs/study_fair/corrections.md)
    assert "search-dcae-b4-c96-s0" in names and len([n for n in names if "dcae" in n]) == 10
    assert "search-dcae-lr5e-4+mse-s0" in names
    # loopvae-sc reruns only the arms its earlier search did not have
    assert sorted(n for n in names if "loopvae-sc" in n) == ["search-loopvae-sc-lr4e-3+mse-s0",
                                                             "search-loopvae-sc-lr4e-3-s0"]
    b4 = next(p for p in planned if p.arm.name == "search-dcae-b4-c96-s0")
    assert b4.record["steps"] == round(sf.base_steps("dcae", costs) * 8 * 64 * 64 / (4 * 96 * 96))
    # the AutoencoderKL search waits for the shape sweep
    assert sf.plan_search(costs, ["klvae"]) == []


def test_shape_winner_and_pick_at_matched_cpu_time(study: Path) -> None:
    for label, final in (("w32", 20.8), ("w24", 20.9), ("d2", 20.85), ("w32-attn", 22.3)):
        write(f"shape-{label}-s0", phase="shapes", curve=curve(final, 300.0), steps=900)
    assert sf.shape_winner()[0] == "w32-attn"
    assert sf.family_model(sf.FAMILIES["klvae"]) == ("klvae-tiny-w32", "{mid_block_add_attention: true}")
    assert sf.pick_recipe("dcae") is None  # arms missing: no pick yet
    for i, arm in enumerate(sf.search_arms(sf.FAMILIES["dcae"])):
        final = 24.0 + 0.01 * i if arm.name != "lr4e-3" else 30.0
        status = "failed" if arm.name == "lr2e-3" else "finished"
        write(f"search-dcae-{arm.name}-s0", phase="search", status=status, curve=curve(final, 300.0 + i))
    pick = sf.pick_recipe("dcae")
    assert pick["arm"] == "lr4e-3" and pick["matched_seconds"] == pytest.approx(300.0)
    assert pick["runner_up"] == "noise0"  # the failed arm is never picked


def finish_searches() -> None:
    for key, family in sf.FAMILIES.items():
        for i, arm in enumerate(sf.search_arms(family)):
            if key == "loopvae-sc" and arm.name in sf.REUSED:
                continue  # from the earlier search's committed results
            write(f"search-{key}-{arm.name}-s0", phase="search", steps=500,
                  curve=curve(24.0 + (1.0 if arm.name == "lr2e-3+mse" else 0.01 * i), 300.0))
    for label in ("w32", "w24", "d2", "w32-attn"):
        write(f"shape-{label}-s0", phase="shapes", curve=curve(22.0 if label == "w24" else 21.0, 300.0), steps=900,
              train_seconds=300.0)


def test_main_runs_cover_both_budgets(study: Path) -> None:
    finish_searches()
    costs = json.loads((study / "probe.json").read_text())
    runs = {p.arm.name: p for p in sf.main_runs(costs)}
    assert "main-loopvae-sc-img-s0" in runs and "main-loopvae-sc-cpu-s0" not in runs
    assert runs["main-loopvae-sc-img-s0"].record["budget"] == ["images", "cpu"]
    assert runs["main-loopvae-img-s2"].record["steps"] == sf.MAIN_STEPS
    budget_seconds = sf.MAIN_STEPS * 8 / IPS["loopvae-sc"]
    assert runs["main-dcae-cpu-s1"].record["steps"] == round(budget_seconds * IPS["dcae"] / 8)
    assert runs["main-klvae-cpu-s0"].record["model"] == "klvae-tiny-w24"  # the sweep's pick
    assert runs["main-klvae-cpu-s0"].record["steps"] == round(budget_seconds * IPS["shape-w24"] / 8)
    assert all(p.record["recipe_arm"] == "lr2e-3+mse" for p in runs.values() if p.record["family"] != "loopvae-sc")
    assert runs["main-loopvae-sc-img-s0"].record["recipe_arm"] == "lr2e-3+mse"  # the earlier search's best (26.07)
    assert len(runs) == 3 * 7  # 4 families at equal images + 3 faster ones at equal CPU-seconds, 3 seeds each


def main_record(name: str, family: str, budget: list[str], seed: int, level: float, rng: random.Random,
                diverge: bool = False) -> dict:
    rows = []
    level += rng.gauss(0, 0.2)  # seed-to-seed variation: what the seed-level verdicts must see through
    for i in range(40):
        psnr = level + 0.3 * (i % 7) + rng.gauss(0, 0.05) - (2.5 if diverge and i != 3 else 0.0)
        rows.append({"key": f"img{i:02d}", "shard": "imagenet-holdout-000000.tar", "psnr": psnr, "ssim": 0.7,
                     "bicubic_psnr": 25.0, "bicubic_ssim": 0.73, "colour_error": 0.04 if diverge else 0.01,
                     "low_freq_rmse": 0.05 if diverge else 0.02, "high_freq_rmse": 0.03, "out_of_range": 0.0,
                     "saturated_ref": 0.1})
    kodak = [dict(r, key=f"kodim{21 + i}", shard="kodak-val-000000.tar") for i, r in enumerate(rows[:4])]
    order = {"seed": seed, "data": "train", "resolution": 64, "batch_size": 8, "grad_accum_steps": 1,
             "world_size": 1, "scale_jitter": [3.0, 4.0], "hflip": 0.5}
    arch = {"class": "LoopVAE" if family.startswith("loopvae") else "AutoencoderKL", "params": 350535,
            "gmacs": 7.2, "values_per_pixel": 0.25, "order": order, "step": 1500}
    return {"name": name, "phase": "main", "status": "finished", "family": family, "budget": budget, "seed": seed,
            "model": family, "model_overrides": "{}", "steps": 1500, "train_seconds": 800.0,
            "curve": curve(level + 1, 800.0), "evaluation": {"arch": arch, "imagenet": rows, "kodak": kodak,
                                                             "imagenet_low_resolution": [74, 74]}}


def write_main_runs(rng: random.Random) -> None:
    """Every planned main run at 3 seeds; klvae's equal-images seed 1 diverges (colour, low frequencies)."""
    levels = {"loopvae": 27.0, "loopvae-sc": 28.0, "klvae": 24.0, "dcae": 27.95}
    for family, level in levels.items():
        for budget in (["images", "cpu"],) if family == "loopvae-sc" else (["images"], ["cpu"]):
            tag = "img" if "images" in budget else "cpu"
            for seed in (0, 1, 2):
                name = f"main-{family}-{tag}-s{seed}"
                diverge = family == "klvae" and tag == "img" and seed == 1
                sf.write_result(name, main_record(name, family, budget, seed, level + 0.02 * seed, rng, diverge))


def write_extra_runs(rng: random.Random, families: list[str]) -> None:
    """Seeds 3 and 4 of ``families`` at every budget they train for."""
    levels = {"loopvae": 27.0, "loopvae-sc": 28.0, "klvae": 24.0, "dcae": 27.95}
    for family in families:
        for budget in (["images", "cpu"],) if family == "loopvae-sc" else (["images"], ["cpu"]):
            tag = "img" if "images" in budget else "cpu"
            for seed in (3, 4):
                name = f"main-{family}-{tag}-s{seed}"
                sf.write_result(name, main_record(name, family, budget, seed, levels[family] + 0.02 * seed, rng))


def test_page_reads_the_pre_registered_family_with_holm(study: Path) -> None:
    finish_searches()
    write_main_runs(random.Random(0))
    page = report.render()
    assert "## Pre-registration" in page and "Not yet run" not in page
    computed = json.loads((study / "results.json").read_text())["computed"]
    primary = {(c["a"], c["b"]): c for c in computed["primary"]["comparisons"] if c["metric"] == "psnr"}
    assert set(primary) == {(a, b) for _, _, a, b in report.PRIMARY}
    assert all(c["family_size"] == 4 and c["test"] == "paired t" for c in primary.values())
    assert primary[("loopvae@cpu", "klvae@cpu")]["verdict"] == "better"  # +3 dB over three seeds
    assert primary[("loopvae-sc@img", "dcae@img")]["verdict"] == "inconclusive"  # +0.05 dB within noise
    assert "(exploratory)" in page and "P1" in page and "S2" in page
    assert "Diverging seed: `main-klvae-img-s1`" in page and "colour shift 0.0400 vs 0.0100" in page
    assert re.search(r"lower on (39|40) of 40 images", page)
    assert "Null rows" in page


def test_page_lists_missing_runs_instead_of_filling_them_in(study: Path) -> None:
    finish_searches()
    name = "main-loopvae-img-s0"
    sf.write_result(name, main_record(name, "loopvae", ["images"], 0, 27.0, random.Random(1)))
    page = report.render()
    assert "Not yet run" in page and "`main-dcae-cpu-s2`" in page
    assert "| P1 | recurrence without shortcuts, equal images | loopvae@img − klvae@img | *not run yet*" in page


def test_the_main_phase_probes_its_own_commit_once(study: Path, monkeypatch) -> None:
    finish_searches()
    assert sf.main_cost_labels() == {"loopvae": ("loopvae-cnn-tiny", "{}"),
                                     "loopvae-sc": ("loopvae-cnn-tiny", "{shortcuts: true}"),
                                     "shape-w24": ("klvae-tiny-w24", "{}"), "dcae": ("dcae-tiny", "{}")}
    probes = []
    monkeypatch.setattr(sf, "code_version", lambda: {"commit": "abc123", "dirty": False})
    monkeypatch.setattr(sf, "main_probe", lambda: probes.append(1) or {"images_per_second": {"loopvae-sc": 20.0}})
    plan = sf.check_main_code(study / "plan.json")
    assert plan["main_commit"] == "abc123" and plan["probe"]["images_per_second"] == {"loopvae-sc": 20.0}
    assert json.loads((study / "plan.json").read_text())["probe"] == plan["probe"]
    monkeypatch.setattr(sf.subprocess, "run", lambda *a, **k: type("R", (), {"returncode": 0})())
    assert sf.check_main_code(study / "plan.json")["probe"] == plan["probe"] and probes == [1]  # measured once
    monkeypatch.setattr(sf, "code_version", lambda: {"commit": "abc123", "dirty": True})
    with pytest.raises(SystemExit, match="needs a clean checkout"):
        sf.check_main_code(study / "plan.json")


def test_conclusion_extra_seeds_and_the_check_without_a_diverging_seed(study: Path) -> None:
    finish_searches()
    write_main_runs(random.Random(3))
    page = report.render()
    computed = json.loads((study / "results.json").read_text())["computed"]
    # at seeds 0-2, P2 / P4 (+0.05 dB) are inconclusive: their arms get the pre-registered seeds 3 and 4, and the
    # conclusion waits for them
    rule = computed["extra_seed_rule"]
    # (P1 too: the diverging klvae seed widens its interval)
    assert rule["extended"] == ["P1", "P2", "P4"] and rule["stage1"]["P3"]["verdict"] == "better"
    assert set(rule["missing"]) == {f"main-{f}-s{s}" for s in (3, 4) for f in (
        "loopvae-img", "klvae-img", "loopvae-sc-img", "dcae-img", "dcae-cpu")}  # not loopvae / klvae at cpu (P3)
    assert "### Extra seeds (pre-registered rule, decided at seeds 0–2)" in page
    assert ("`loopvae-sc@img` and `dcae@img` get seeds 3 and 4 (once; `main-loopvae-sc-img-s3`, "
            "`main-loopvae-sc-img-s4`, `main-dcae-img-s3`, `main-dcae-img-s4`), 4 of 4 runs to go, from a worktree of "
            "`study-fair-extra-seeds` ([development.md](development.md#studies-across-sittings) says how): "
            "`python <worktree>/benchmarks/study_fair.py --phase main --seeds 3 4 --families dcae loopvae-sc "
            "--budgets img`") in page
    assert "- P3 at seeds 0–2: better" in page and "no extra seeds" in page
    assert not computed["conclusion"]["complete"] and "## 4. Conclusion" in page
    write_extra_runs(random.Random(4), ["loopvae-sc", "dcae", "loopvae", "klvae"])  # cpu s3/s4 too: unused
    page = report.render()
    computed = json.loads((study / "results.json").read_text())["computed"]
    assert "done: the verdict above uses seeds 0–4" in page and not computed["extra_seed_rule"]["missing"]
    primary = {(c["a"], c["b"]): c for c in computed["primary"]["comparisons"] if c["metric"] == "psnr"}
    assert (primary[("loopvae-sc@img", "dcae@img")]["n_a"], primary[("loopvae@cpu", "klvae@cpu")]["n_a"]) == (5, 3)
    # the conclusion: computed from the verdicts, with the cost ratios
    assert computed["conclusion"]["complete"]
    assert "**LoopVAE against AutoencoderKL (neither with shortcuts)** (`loopvae` − `klvae`, primary, Holm)" in page
    assert "These contrasts compare model families" in page
    assert "stores 1.00× the weights" in page  # the synthetic records share params / GMACs
    summary = computed["conclusion"]["summary"]
    # P1: inconclusive at 3 seeds (the diverging reference seed), better at 5; P3: better; P2 / P4: +-0.1 dB
    assert "LoopVAE against the AutoencoderKL reference buys quality at both budgets" in summary
    assert "is not resolved by these seeds at either budget" in summary
    assert "adding shortcuts to LoopVAE buys quality at equal images" in summary
    # the diverging klvae seed: the comparisons recomputed without it
    assert "Without seed 1 (the reported verdicts keep it): P1 (primary) without seed 1:" in page
    # the synthetic curves gain 0.5 dB in their last interval: not flat
    assert computed["flattening"]["dcae@img"] == {"last_interval_db": pytest.approx(0.5), "run_gain_db":
                                                  pytest.approx(1.0), "last_interval_crops": 800, "flat": False}
    assert "have not flattened, so a longer run would raise them further" in page
    # every arm against bicubic, by seed
    assert computed["vs_bicubic"]["loopvae@img"]["verdict"] == "better"
    assert "The bicubic row keeps a 74×74 RGB image per 256² image (0.251 values per pixel" in page


def test_extra_seeds_count_only_in_the_comparisons_the_rule_extends(study: Path) -> None:
    finish_searches()
    write_main_runs(random.Random(3))
    write_extra_runs(random.Random(4), ["loopvae-sc", "dcae", "loopvae", "klvae"])
    rows = report.results()
    costs = json.loads((study / "probe.json").read_text())
    arms, rule = report.apply_extra_seed_rule(report.main_arms(rows), [], rows, costs)
    seeds = {k: [r["seed"] for r in v] for k, v in arms.items()}
    assert seeds["loopvae-sc@img"] == seeds["dcae@cpu"] == [0, 1, 2, 3, 4]
    # P3 was decided at seeds 0-2: its arms keep them although seeds 3 and 4 exist
    assert "P3" not in rule["extended"] and seeds["loopvae@cpu"] == seeds["klvae@cpu"] == [0, 1, 2]
    # before stage 1 is complete only seeds 0-2 count, and nothing is extended
    first, early = report.apply_extra_seed_rule(report.main_arms(rows), ["main-x"], rows, costs)
    assert all(r["seed"] < 3 for v in first.values() for r in v) and early["extended"] == []


def test_the_driver_filters_main_runs_by_budget(study: Path, monkeypatch) -> None:
    finish_searches()
    costs = json.loads((study / "probe.json").read_text())
    names = [p.arm.name for p in sf.select_main(sf.main_runs(costs, (3, 4)), list(sf.FAMILIES), ["img"])]
    assert "main-klvae-img-s3" in names and not any("-cpu-" in n for n in names)
    # P4's extra seeds: loopvae-sc's equal-images runs are its equal-CPU runs
    names = [p.arm.name for p in sf.select_main(sf.main_runs(costs, (3, 4)), ["loopvae-sc", "dcae"], ["cpu"])]
    assert sorted(names) == ["main-dcae-cpu-s3", "main-dcae-cpu-s4", "main-loopvae-sc-img-s3",
                             "main-loopvae-sc-img-s4"]


def test_the_page_names_main_runs_from_another_commit(study: Path) -> None:
    finish_searches()
    write_main_runs(random.Random(3))
    (study / "plan.json").write_text(json.dumps({"main_commit": "a" * 40}))
    name = "main-dcae-img-s1"
    record = json.loads((study / "runs" / f"{name}.json").read_text())
    record["code"] = {"commit": "b" * 40, "dirty": False}
    sf.write_result(name, record)
    page = report.render()
    assert f"Every main run trains on the training code of commit `{'a' * 10}`" in page
    assert f"`{name}` ran from commit `{'b' * 10}` (branch `study-fair-extra-seeds`" in page


def test_no_diverging_seed_is_stated_with_its_margin(study: Path) -> None:
    rng = random.Random(5)
    arms = {f"{family}@img": [main_record(f"main-{family}-img-s{seed}", family, ["images"], seed, level, rng)
                              for seed in (0, 1, 2)] for family, level in (("loopvae", 27.0), ("klvae", 24.0))}
    lines = report.divergence_lines(arms)
    assert lines[0] == "### Diverging seeds: none" and " dB between its seeds against a threshold of " in lines[2]
    # (a diverging seed's diagnosis: test_page_reads_the_pre_registered_family_with_holm)


def test_section_5_shows_the_bundled_references_from_their_release_file(tmp_path: Path) -> None:
    assert report.bundled_references_lines(tmp_path) == []  # no release of the references yet: no section
    committed = json.loads((Path(__file__).resolve().parents[2] / "docs/study_loopvae/references.json").read_text())
    (tmp_path / "references.json").write_text(json.dumps(committed))
    lines = report.bundled_references_lines(tmp_path)
    text = "\n".join(lines)
    assert lines[0].startswith("## 5. The references bundled with the repository")
    # one table of the bundled references, in study_loopvae.md: this section points at it and repeats no number
    assert "study_loopvae.md#the-tuned-references-bundled-next-to-it-make-release-references" in text
    for model, r in committed["references"].items():
        assert f"`{model}`" in text and f"{r['eval']['imagenet']['psnr']:.2f}" not in text
    assert "the seeds are sections 3 and 4" in text
    assert "bundled LoopVAE) |" not in text  # without the LoopVAE's release file there is no LoopVAE row
