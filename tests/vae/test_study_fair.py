"""The fair-comparison study's planning and page (studies/fair.py, studies/_fair.py) on synthetic result files:
equal CPU budgets from the cost probe, the search's pick, the two main budgets, the pre-registered Holm family and
its extra-seed rule, the null rows, the diagnosis of a diverging seed and the listing of missing runs."""

import dataclasses
import json
import random
import re
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from looprun.study import load_study
from looprun.study.page import planned_runs, render

ROOT = Path(__file__).resolve().parents[2]
STUDY = load_study(ROOT / "studies/fair.py")  # puts studies/ on sys.path
fair = sys.modules["loopvision_studies.fair"]
import _fair as sf  # noqa: E402

IPS = {"shape-w32": 26.0, "shape-w24": 29.0, "shape-d2": 31.0, "shape-w32-attn": 25.0, "loopvae": 16.0,
       "loopvae-sc": 14.0, "dcae": 50.0}


@pytest.fixture
def study(tmp_path, monkeypatch) -> Path:
    """A copy of the study's docs folder with the probe, the pre-registration and no result file yet."""
    docs = tmp_path / "docs" / "study_fair"
    (docs / "runs").mkdir(parents=True)
    (docs / "probe.json").write_text(json.dumps({"images_per_second": IPS}))
    shutil.copy(ROOT / "docs/study_fair/preregistration.md", docs)
    (tmp_path / "docs/study_loopvae").mkdir()  # loopvae-sc's earlier search (its reused arms), as committed
    (tmp_path / "docs/study_loopvae/recipe_search.json").write_text(json.dumps(
        {"arms": sf.earlier_search(ROOT / "docs/study_fair")}))
    monkeypatch.setattr(fair, "DOCS", docs)
    return docs


def records(docs: Path) -> dict:
    return sf.load_records(docs)


def page(docs: Path) -> tuple[str, dict]:
    """The page and results.json rendered from ``docs`` (nothing written)."""
    return render(dataclasses.replace(STUDY, docs=str(docs), page=str(docs.parent / "study_fair.md")),
                  docs.parent.parent, write=False)


def curve(final: float, seconds: float, steps: int = 300) -> list[dict]:
    return [{"step": steps * k // 3, "images_seen": 8 * steps * k // 3, "train_seconds": seconds * k / 3,
             "psnr": final - (3 - k) * 0.5} for k in (1, 2, 3)]


def write(name: str, **record) -> None:
    (fair.DOCS / "runs" / f"{name}.json").write_text(json.dumps({"name": name, "status": "finished", **record}))


def test_every_family_searches_nine_arms_at_the_same_cpu_budget(study: Path) -> None:
    for key in sf.FAMILIES:
        arms = sf.search_arms(key)
        assert len(arms) == 9, key
        assert arms[-1].name == ("mod1" if key.startswith("loopvae") else "noise0")
        assert {"lr4e-3", "lr4e-3+mse"} <= {a.name for a in arms}  # above the old search's 2e-3 edge
    # 500 steps of loopvae-sc; the others get the same CPU-seconds at their own speed
    assert sf.base_steps("loopvae-sc", IPS) == 500
    assert sf.base_steps("dcae", IPS) == round(500 * 50 / 14)
    planned = sf.plan_search({}, IPS)
    names = [p.id for p in planned]
    # nine pre-registered arms plus the review's lr-5e-4 arm (docs/study_fair/corrections.md)
    assert "search-dcae-b4-c96-s0" in names and len([n for n in names if "dcae" in n]) == 10
    assert "search-dcae-lr5e-4+mse-s0" in names
    # loopvae-sc reruns only the arms its earlier search did not have
    assert sorted(n for n in names if "loopvae-sc" in n) == ["search-loopvae-sc-lr4e-3+mse-s0",
                                                             "search-loopvae-sc-lr4e-3-s0"]
    b4 = next(p for p in planned if p.id == "search-dcae-b4-c96-s0")
    assert b4.settings["steps"] == round(sf.base_steps("dcae", IPS) * 8 * 64 * 64 / (4 * 96 * 96))
    # the AutoencoderKL search waits for the shape sweep
    assert not [n for n in names if "klvae" in n]


def test_shape_winner_and_pick_at_matched_cpu_time(study: Path) -> None:
    for label, final in (("w32", 20.8), ("w24", 20.9), ("d2", 20.85), ("w32-attn", 22.3)):
        write(f"shape-{label}-s0", phase="shapes", curve=curve(final, 300.0), steps=900)
    assert sf.shape_winner(records(study))[0] == "w32-attn"
    assert sf.family_model("klvae", records(study)) == ("klvae-tiny-w32", "{mid_block_add_attention: true}")
    assert sf.pick(records(study), "dcae", study) is None  # arms missing: no pick yet
    for i, arm in enumerate(sf.search_arms("dcae")):
        final = 24.0 + 0.01 * i if arm.name != "lr4e-3" else 30.0
        status = "failed" if arm.name == "lr2e-3" else "finished"
        write(f"search-dcae-{arm.name}-s0", phase="search", status=status, curve=curve(final, 300.0 + i))
    pick = sf.pick_recipe("dcae", docs=study)
    assert pick["arm"] == "lr4e-3" and pick["matched_seconds"] == pytest.approx(300.0)
    assert pick["runner_up"] == "noise0"  # the failed arm is never picked
    assert pick["overrides"] == ["lr=4.0e-3"]  # what a sibling study trains dcae-tiny with
    assert sf.pick_recipe("dcae", corrected=True, docs=study) is None  # the correction arm has not run


def finish_searches() -> None:
    for key in sf.FAMILIES:
        for i, arm in enumerate(sf.search_arms(key)):
            if key == "loopvae-sc" and arm.name in sf.REUSED:
                continue  # from the earlier search's committed results
            write(f"search-{key}-{arm.name}-s0", phase="search", steps=500,
                  curve=curve(24.0 + (1.0 if arm.name == "lr2e-3+mse" else 0.01 * i), 300.0))
    for label in ("w32", "w24", "d2", "w32-attn"):
        write(f"shape-{label}-s0", phase="shapes", curve=curve(22.0 if label == "w24" else 21.0, 300.0), steps=900,
              train_seconds=300.0)


def test_main_runs_cover_both_budgets(study: Path) -> None:
    finish_searches()
    runs = {p.id: p.settings for p in sf.main_runs(records(study), IPS, study)}
    assert "main-loopvae-sc-img-s0" in runs and "main-loopvae-sc-cpu-s0" not in runs
    assert runs["main-loopvae-sc-img-s0"]["budget"] == ["images", "cpu"]
    assert runs["main-loopvae-img-s2"]["steps"] == sf.MAIN_STEPS
    budget_seconds = sf.MAIN_STEPS * 8 / IPS["loopvae-sc"]
    assert runs["main-dcae-cpu-s1"]["steps"] == round(budget_seconds * IPS["dcae"] / 8)
    assert runs["main-klvae-cpu-s0"]["model"] == "klvae-tiny-w24"  # the sweep's pick
    assert runs["main-klvae-cpu-s0"]["steps"] == round(budget_seconds * IPS["shape-w24"] / 8)
    assert all(s["recipe_arm"] == "lr2e-3+mse" for s in runs.values() if s["family"] != "loopvae-sc")
    assert runs["main-loopvae-sc-img-s0"]["recipe_arm"] == "lr2e-3+mse"  # the earlier search's best (26.07)
    assert len(runs) == 3 * 7  # 4 families at equal images + 3 faster ones at equal CPU-seconds, 3 seeds each


def test_the_main_phase_is_registered_and_sized_by_the_probe_on_its_commit(study: Path) -> None:
    """The engine pins the main phase's commit (plan.json) and refuses other training code; the equal-CPU step
    counts come from the probe plan.json recorded on that commit, the searches' from probe.json."""
    assert {p.name: p.registered for p in STUDY.plan_phases()} == {"shapes": False, "search": False, "main": True}
    finish_searches()
    main_ips = dict(IPS, **{"loopvae-sc": 20.0})
    (study / "plan.json").write_text(json.dumps({"main_commit": "a" * 40, "probe": {"images_per_second": main_ips}}))
    assert sf.costs(study) == IPS and sf.costs(study, main=True) == main_ips
    planned = {p.id: p.settings for p in planned_runs(STUDY, records(study))}
    assert planned["main-dcae-cpu-s0"]["steps"] == round(sf.MAIN_STEPS * 8 / 20.0 * IPS["dcae"] / 8)
    assert planned["search-dcae-base-s0"]["steps"] == round(500 * 50 / 14)
    committed = json.loads((ROOT / "docs/study_fair/plan.json").read_text())
    assert sf.costs(ROOT / "docs/study_fair", main=True) == committed["probe"]["images_per_second"]


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


LEVELS = {"loopvae": 27.0, "loopvae-sc": 28.0, "klvae": 24.0, "dcae": 27.95}


def write_main_runs(rng: random.Random, families: tuple[str, ...] = tuple(LEVELS), seeds: tuple[int, ...] = (0, 1, 2),
                    diverging: str = "main-klvae-img-s1") -> None:
    """The main runs of ``families`` at ``seeds`` at every budget they train for; ``diverging`` has a colour and
    low-frequency error on all but one image."""
    for family in families:
        for budget in (["images", "cpu"],) if family == "loopvae-sc" else (["images"], ["cpu"]):
            for seed in seeds:
                name = f"main-{family}-{'img' if 'images' in budget else 'cpu'}-s{seed}"
                (fair.DOCS / "runs" / f"{name}.json").write_text(json.dumps(main_record(
                    name, family, budget, seed, LEVELS[family] + 0.02 * seed, rng, name == diverging)))


def test_page_reads_the_pre_registered_family_with_holm(study: Path) -> None:
    finish_searches()
    write_main_runs(random.Random(0))
    text, results = page(study)
    assert "## Pre-registration" in text and "Not yet run" not in text
    computed = results["computed"]
    primary = {(c["a"], c["b"]): c for c in computed["primary"]["comparisons"] if c["metric"] == "psnr"}
    assert set(primary) == {(a, b) for _, _, a, b in sf.PRIMARY}
    assert all(c["family_size"] == 4 and c["test"] == "paired t" for c in primary.values())
    assert primary[("loopvae@cpu", "klvae@cpu")]["verdict"] == "better"  # +3 dB over three seeds
    assert primary[("loopvae-sc@img", "dcae@img")]["verdict"] == "inconclusive"  # +0.05 dB within noise
    assert "(exploratory)" in text and "P1" in text and "S2" in text
    assert "Diverging seed: `main-klvae-img-s1`" in text and "colour shift 0.0400 vs 0.0100" in text
    assert re.search(r"lower on (39|40) of 40 images", text)
    assert "Null rows" in text
    assert {r["name"] for r in results["runs"]} == {f"main-{k}-s{s}" for s in (0, 1, 2) for k in (
        "loopvae-img", "loopvae-cpu", "loopvae-sc-img", "klvae-img", "klvae-cpu", "dcae-img", "dcae-cpu")}


def test_page_lists_missing_runs_instead_of_filling_them_in(study: Path) -> None:
    finish_searches()
    name = "main-loopvae-img-s0"
    (study / "runs" / f"{name}.json").write_text(json.dumps(main_record(name, "loopvae", ["images"], 0, 27.0,
                                                                        random.Random(1))))
    text, _ = page(study)
    assert "Not yet run" in text and "`main-dcae-cpu-s2`" in text
    assert "| P1 | recurrence without shortcuts, equal images | loopvae@img − klvae@img | *not run yet*" in text
    # the engine's count: 4 shapes, 32 search arms (the 3 correction arms missing), 21 main runs
    assert "Runs with a result file: 34 of 57 planned; still to run: 23." in text


def test_conclusion_extra_seeds_and_the_check_without_a_diverging_seed(study: Path) -> None:
    finish_searches()
    write_main_runs(random.Random(3))
    text, results = page(study)
    computed = results["computed"]
    # at seeds 0-2, P2 / P4 (+0.05 dB) are inconclusive: their arms get the pre-registered seeds 3 and 4, and the
    # conclusion waits for them
    rule = computed["extra_seed_rule"]
    # (P1 too: the diverging klvae seed widens its interval)
    assert rule["extended"] == ["P1", "P2", "P4"] and rule["stage1"]["P3"]["verdict"] == "better"
    extra = {f"main-{f}-s{s}" for s in (3, 4) for f in ("loopvae-img", "klvae-img", "loopvae-sc-img", "dcae-img",
                                                        "dcae-cpu")}  # not loopvae / klvae at cpu (P3)
    assert set(rule["missing"]) == extra
    assert extra <= {p.id for p in planned_runs(STUDY, records(study))}  # the engine plans (and runs) them
    assert "### Extra seeds (pre-registered rule, decided at seeds 0–2)" in text
    assert ("`loopvae-sc@img` and `dcae@img` get seeds 3 and 4 (once; `main-loopvae-sc-img-s3`, "
            "`main-loopvae-sc-img-s4`, `main-dcae-img-s3`, `main-dcae-img-s4`), 4 of 4 runs to go: "
            "`loopvae study fair --phase main` plans them") in text
    assert "- P3 at seeds 0–2: better" in text and "no extra seeds" in text
    assert not computed["conclusion"]["complete"] and "## 4. Conclusion" in text
    # every family's seeds 3 and 4 (cpu s3/s4 of loopvae / klvae too: unused)
    write_main_runs(random.Random(4), ("loopvae-sc", "dcae", "loopvae", "klvae"), (3, 4), diverging="")
    text, results = page(study)
    computed = results["computed"]
    assert "done: the verdict above uses seeds 0–4" in text and not computed["extra_seed_rule"]["missing"]
    primary = {(c["a"], c["b"]): c for c in computed["primary"]["comparisons"] if c["metric"] == "psnr"}
    assert (primary[("loopvae-sc@img", "dcae@img")]["n_a"], primary[("loopvae@cpu", "klvae@cpu")]["n_a"]) == (5, 3)
    # the conclusion: computed from the verdicts, with the cost ratios
    assert computed["conclusion"]["complete"]
    assert "**LoopVAE against AutoencoderKL (neither with shortcuts)** (`loopvae` − `klvae`, primary, Holm)" in text
    assert "These contrasts compare model families" in text
    assert "stores 1.00× the weights" in text  # the synthetic records share params / GMACs
    summary = computed["conclusion"]["summary"]
    # P1: inconclusive at 3 seeds (the diverging reference seed), better at 5; P3: better; P2 / P4: +-0.1 dB
    assert "LoopVAE against the AutoencoderKL reference buys quality at both budgets" in summary
    assert "is not resolved by these seeds at either budget" in summary
    assert "adding shortcuts to LoopVAE buys quality at equal images" in summary
    # the diverging klvae seed: the comparisons recomputed without it
    assert "Without seed 1 (the reported verdicts keep it): P1 (primary) without seed 1:" in text
    # the synthetic curves gain 0.5 dB in their last interval: not flat
    assert computed["flattening"]["dcae@img"] == {"last_interval_db": pytest.approx(0.5), "run_gain_db":
                                                  pytest.approx(1.0), "last_interval_crops": 800, "flat": False}
    assert "have not flattened, so a longer run would raise them further" in text
    # every arm against bicubic, by seed
    assert computed["vs_bicubic"]["loopvae@img"]["verdict"] == "better"
    assert "The bicubic row keeps a 74×74 RGB image per 256² image (0.251 values per pixel" in text


def test_extra_seeds_count_only_in_the_comparisons_the_rule_extends(study: Path) -> None:
    finish_searches()
    write_main_runs(random.Random(3))
    write_main_runs(random.Random(4), ("loopvae-sc", "dcae", "loopvae", "klvae"), (3, 4), diverging="")
    arms, rule, planned = sf.extra_seed_rule(records(study), IPS, study)
    seeds = {k: [r["seed"] for r in v] for k, v in arms.items()}
    assert seeds["loopvae-sc@img"] == seeds["dcae@cpu"] == [0, 1, 2, 3, 4]
    # P3 was decided at seeds 0-2: its arms keep them although seeds 3 and 4 exist, and the plan has no more runs
    assert "P3" not in rule["extended"] and seeds["loopvae@cpu"] == seeds["klvae@cpu"] == [0, 1, 2]
    assert not {"main-loopvae-cpu-s3", "main-klvae-cpu-s4"} & {p.id for p in planned}
    # P4's extra seeds: loopvae-sc's equal-images runs are its equal-CPU runs; P1's stay at equal images
    assert sorted(rule["extra_runs"]["P4"]) == ["main-dcae-cpu-s3", "main-dcae-cpu-s4", "main-loopvae-sc-img-s3",
                                                "main-loopvae-sc-img-s4"]
    assert "main-klvae-img-s3" in rule["extra_runs"]["P1"] and not any("-cpu-" in n for n in rule["extra_runs"]["P1"])
    # before stage 1 is complete only seeds 0-2 count, nothing is extended and no extra run is planned
    early = {k: v for k, v in records(study).items() if k != "main-dcae-cpu-s2"}
    first, rule, planned = sf.extra_seed_rule(early, IPS, study)
    assert all(r["seed"] < 3 for v in first.values() for r in v) and rule["extended"] == []
    assert not [p for p in planned if p.seed > 2]


def test_the_page_names_main_runs_from_another_commit(study: Path) -> None:
    finish_searches()
    write_main_runs(random.Random(3))
    (study / "plan.json").write_text(json.dumps({"main_commit": "a" * 40}))
    name = "main-dcae-img-s1"
    record = json.loads((study / "runs" / f"{name}.json").read_text())
    record["code"] = {"commit": "b" * 40, "dirty": False}
    (study / "runs" / f"{name}.json").write_text(json.dumps(record))
    text, _ = page(study)
    assert f"Every main run trains on the training code of commit `{'a' * 10}`" in text
    assert f"`{name}` ran from commit `{'b' * 10}` (branch `study-fair-extra-seeds`" in text


def test_no_diverging_seed_is_stated_with_its_margin(study: Path) -> None:
    rng = random.Random(5)
    arms = {f"{family}@img": [main_record(f"main-{family}-img-s{seed}", family, ["images"], seed, level, rng)
                              for seed in (0, 1, 2)] for family, level in (("loopvae", 27.0), ("klvae", 24.0))}
    lines = fair.divergence_lines(arms)
    assert lines[0] == "### Diverging seeds: none" and " dB between its seeds against a threshold of " in lines[2]
    # (a diverging seed's diagnosis: test_page_reads_the_pre_registered_family_with_holm)


def test_section_5_shows_the_bundled_references_from_their_release_files(tmp_path: Path) -> None:
    where = SimpleNamespace(store=SimpleNamespace(root=tmp_path))
    assert fair.bundled_references(where) == []  # no release of the references yet: no section
    runs = ROOT / "docs/study_loopvae/release/runs"
    (tmp_path / "docs/study_loopvae/release/runs").mkdir(parents=True)
    committed = {}
    for path in runs.glob("*.json"):
        if (r := json.loads(path.read_text()))["phase"] == "references":  # the release study's phase of them
            committed[r["model"]] = r
            shutil.copy(path, tmp_path / "docs/study_loopvae/release/runs" / path.name)
    lines = fair.bundled_references(where)
    text = "\n".join(lines)
    assert lines[0].startswith("## 5. The references bundled with the repository")
    assert "(`klvae-tiny-w32-attn`, `dcae-tiny`; 2026-12-07)" in text and len(committed) == 2
    # one table of the bundled references, in study_loopvae.md: this section points at it and repeats no number
    assert "study_loopvae.md#the-tuned-references-bundled-next-to-it-make-release-references" in text
    for model, r in committed.items():
        assert f"`{model}`" in text and f"{r['eval']['imagenet']['psnr']:.2f}" not in text
    assert "the seeds are sections 3 and 4" in text
    assert "bundled LoopVAE) |" not in text  # without the LoopVAE's release file there is no LoopVAE row


def test_the_committed_page_plans_every_run_it_has(monkeypatch) -> None:
    """The committed result files are exactly the plan (shapes 4, searches 32, main 21 + the 8 extra seeds of P2 and
    P3), the page reads them all, and the sibling study's pick is dcae-tiny's search pick with its --set items."""
    docs = ROOT / "docs/study_fair"
    monkeypatch.setattr(fair, "DOCS", docs)
    committed = sf.load_records(docs)
    assert sorted(p.id for p in planned_runs(STUDY, committed)) == sorted(committed) and len(committed) == 65
    picked = fair.pick_recipe("dcae", corrected=True, docs=docs)
    assert picked["arm"] == "l1+mse" and picked["overrides"] == ["mse_weight=10.0"]


def test_a_planned_run_trains_as_its_committed_result_file_did(monkeypatch, tmp_path: Path) -> None:
    """Every committed run, planned again, gets the same ``loopvae train --set`` items and records the same plan
    (model, steps, recipe, budgets); only main runs are evaluated per image."""
    from looprun.study import RunContext

    docs = ROOT / "docs/study_fair"
    monkeypatch.setattr(fair, "DOCS", docs)
    committed, calls = sf.load_records(docs), {}
    monkeypatch.setattr(fair, "train_and_evaluate", lambda name, out, data, preset, items, evaluate: calls.setdefault(
        name, (preset, items, evaluate)) and {"status": "finished"})
    data = {"train": "t.tar", "kodak_val": "k.tar", "imagenet_holdout": "h.tar", "num_train": 740, "num_holdout": 40}
    for p in planned_runs(STUDY, committed):
        record = fair.run(p, RunContext(ROOT, tmp_path, {"data": data}))
        assert calls[p.id] == (sf.PRESET, committed[p.id]["overrides"], p.phase == "main"), p.id
        keys = [k for k in p.settings if k != "evals" and (k, p.phase) != ("recipe", "shapes")]  # shapes: base only
        assert {k: record[k] for k in keys} == {k: committed[p.id][k] for k in keys}, p.id
