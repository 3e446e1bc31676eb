"""``loopvae compare``: arms of several checkpoints (an AutoencoderDC among them) evaluated on the same images,
seed-level verdicts (paired when the runs share their data order, Welch otherwise), the contract of compare.json,
and errors that name the bad argument."""

import json
from pathlib import Path

import pytest
import torch

from loopvae import create_model
from loopvae.cli import main as loopvae_main
from loopvae.compare import parse_arm
from lv_testing import data_urls, randomize_


def save(model: torch.nn.Module, folder: Path, seed: int, order: dict | None = None) -> str:
    randomize_(model, std=0.02, seed=seed)
    model.save_pretrained(folder)
    if order is not None:  # what a loopvae train release records about its data order
        (folder / "release.json").write_text(json.dumps({"step": 10, "weights": "ema", **order}))
    return str(folder)


ORDER = {"data": "shards", "resolution": 64, "batch_size": 8, "grad_accum_steps": 1, "world_size": 1,
         "scale_jitter": [3.0, 4.0], "hflip": 0.5}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, list[str]]:
    root = tmp_path_factory.mktemp("compare")
    return {
        "dc": [save(create_model("dcae-tiny"), root / f"dc{s}", s, dict(ORDER, seed=s)) for s in (0, 1, 2)],
        "loop": [save(create_model("loopvae-cnn-tiny"), root / f"loop{s}", 10 + s, dict(ORDER, seed=s))
                 for s in (0, 1, 2)],
        "kl": [save(create_model("klvae-tiny-w24"), root / f"kl{s}", 20 + s) for s in (0, 1)],
    }


def run(checkpoints: dict[str, list[str]], out: Path, *extra: str) -> dict:
    arms = [a for name, paths in checkpoints.items() for a in ("--arm", f"{name}={','.join(paths)}")]
    assert loopvae_main(["compare", *arms, "--data", data_urls("val"), "--out", str(out), "--resolution", "32",
                         "--num-workers", "0", "--no-progress", *extra]) == 0
    return json.loads((out / "compare.json").read_text())


def test_compare_end_to_end(checkpoints: dict[str, list[str]], tmp_path: Path) -> None:
    result = run(checkpoints, tmp_path / "cmp")
    arms = {a["name"]: a for a in result["arms"]}
    assert list(arms) == ["dc", "loop", "kl"]
    assert arms["dc"]["class"] == "AutoencoderDC" and arms["kl"]["class"] == "AutoencoderKL"
    assert arms["dc"]["params"] == 1234491 and arms["loop"]["params"] == 350535
    for name, arm in arms.items():
        assert arm["checkpoints"] == checkpoints[name]
        # an arm's value is the mean over its seeds of each seed's per-image mean, which is loopvae eval's number
        for i, seed in enumerate(arm["per_seed"]):
            evaluated = json.loads(next((tmp_path / "cmp" / "evals" / name).glob(f"{i}-*/metrics.json")).read_text())
            assert seed["psnr"] == pytest.approx(evaluated["psnr"]) and seed["ssim"] == pytest.approx(evaluated["ssim"])
        assert arm["psnr"] == pytest.approx(sum(s["psnr"] for s in arm["per_seed"]) / len(arm["per_seed"]))
        assert arm["gmacs"] > 0
    assert result["bicubic"]["values_per_pixel"] == 0.25 and result["num_images"] == 4
    comps = {(c["a"], c["b"], c["metric"]): c for c in result["comparisons"]}
    assert set(comps) == {(a, b, m) for a, b in (("dc", "loop"), ("dc", "kl"), ("loop", "kl")) for m in ("psnr",
                                                                                                        "ssim")}
    # dc and loop recorded the same seeds, data and crops: paired by seed; kl recorded nothing: Welch
    assert comps[("dc", "loop", "psnr")]["test"] == "paired t" and comps[("dc", "loop", "psnr")]["n"] == 3
    assert comps[("dc", "kl", "psnr")]["test"] == "Welch t"
    for c in result["comparisons"]:
        assert c["verdict"] in ("better", "worse", "inconclusive") and c["family_size"] == 3
        assert c["p_holm"] >= c["p"]
        low, high = c["ci"]
        assert low <= c["diff"] <= high
    dc, loop = arms["dc"]["per_seed"], arms["loop"]["per_seed"]
    assert comps[("dc", "loop", "psnr")]["diff"] == pytest.approx(sum(a["psnr"] - b["psnr"]
                                                                      for a, b in zip(dc, loop)) / 3)
    assert len(result["null_rows"]) == 3 + 3 + 1  # every pair of seeds within each arm
    assert all(d["note"].startswith("by image") for d in result["per_image_differences"])
    md = (tmp_path / "cmp" / "compare.md").read_text()
    assert "Seed-level comparisons" in md and "descriptive" in md and "AutoencoderDC" in md
    assert (tmp_path / "cmp" / "compare.png").is_file()
    assert set(result["protocol"]) >= {"resolution", "pairing", "multiplicity", "unit_of_verdict"}


def test_a_chosen_family_and_reused_evaluations(checkpoints: dict[str, list[str]], tmp_path: Path) -> None:
    out = tmp_path / "cmp"
    first = run({"dc": checkpoints["dc"], "loop": checkpoints["loop"]}, out, "--compare", "loop:dc",
                "--pairing", "welch")
    assert [(c["a"], c["b"], c["test"]) for c in first["comparisons"]] == [("loop", "dc", "Welch t")] * 2
    stamp = next((out / "evals" / "dc").glob("0-*/metrics.json")).stat().st_mtime_ns
    again = run({"dc": checkpoints["dc"], "loop": checkpoints["loop"]}, out, "--compare", "loop:dc")
    assert next((out / "evals" / "dc").glob("0-*/metrics.json")).stat().st_mtime_ns == stamp  # not re-evaluated
    assert again["arms"] == first["arms"]


def test_errors_name_what_is_wrong(checkpoints: dict[str, list[str]], tmp_path: Path, capsys) -> None:
    with pytest.raises(ValueError, match="NAME=PATH"):
        parse_arm("just-a-path")
    mixed = {"mixed": [checkpoints["dc"][0], checkpoints["kl"][0]]}
    arms = ["--arm", f"mixed={','.join(mixed['mixed'])}"]
    code = loopvae_main(["compare", *arms, "--data", data_urls("val"), "--out", str(tmp_path / "x"),
                         "--resolution", "32", "--num-workers", "0", "--no-progress"])
    assert code != 0
    assert "another architecture" in capsys.readouterr().err
    code = loopvae_main(["compare", "--arm", f"dc={checkpoints['dc'][0]}", "--data", data_urls("val"), "--out",
                         str(tmp_path / "y"), "--compare", "dc:nope", "--num-workers", "0", "--no-progress"])
    assert code != 0
    assert "no arm named 'nope'" in capsys.readouterr().err
