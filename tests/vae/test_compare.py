"""``loopvae compare``: arms of several checkpoints (an AutoencoderDC among them) evaluated on the same images,
seed-level verdicts (paired when the runs share their data order, Welch otherwise), the contract of compare.json,
and errors that name the bad argument."""

import json
from pathlib import Path

import pytest
import torch
from loopdata_helpers import write_shard

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
    # one picture of every arm on the same images: a row per image (4), a column per arm plus the reference, each
    # cell the centre crop of the evaluated reconstruction
    from PIL import Image

    from loopvae.side_by_side import LABEL_HEIGHT

    sheet = Image.open(tmp_path / "cmp" / "side_by_side.png")
    assert sheet.size == (32 * 4, LABEL_HEIGHT + 32 * 4) and "side_by_side.png" in md


def test_side_by_side_cells_are_the_evaluated_reconstructions(checkpoints: dict[str, list[str]],
                                                             tmp_path: Path) -> None:
    """The strip's cells are the same uint8 reconstructions eval measures (reference column = eval's reference)."""
    import numpy as np
    import torch
    from PIL import Image

    import loopdata
    from loopvae.autoencoders import reconstruct_mode
    from loopvae.loading import load_tokenizer
    from loopvae.side_by_side import LABEL_HEIGHT, side_by_side

    out = side_by_side({"loop": checkpoints["loop"][0]}, data_urls("val"), tmp_path / "s.png", resolution=32,
                       max_images=2, crop=16)
    sheet = np.asarray(Image.open(out))
    batch = next(iter(loopdata.make_loader(data_urls("val"), task="reconstruction", train=False, batch_size=2,
                                           num_workers=0, resolution=32, rank=0, world_size=1)))
    with torch.no_grad():
        rec = reconstruct_mode(load_tokenizer(checkpoints["loop"][0]).model.eval(), batch["image"])
    u8 = lambda t: t.clamp(-1, 1).add(1).mul(127.5).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()  # noqa: E731
    for row in range(2):
        cells = sheet[LABEL_HEIGHT + 16 * row:LABEL_HEIGHT + 16 * (row + 1)]
        assert np.array_equal(cells[:, :16], u8(batch["image"])[row, 8:24, 8:24])
        assert np.array_equal(cells[:, 16:32], u8(rec)[row, 8:24, 8:24])


def test_single_checkpoints_show_no_test_and_warnings_print_once(tmp_path: Path, capfd) -> None:
    """One checkpoint per arm: no interval, so the table's test column says "–"; the evaluations' repeated
    console warnings (no rFID weights here) are printed once for the whole comparison."""
    bundled = Path(__file__).resolve().parents[2] / "assets" / "models"
    assert loopvae_main(["compare", "--arm", f"loop={bundled / 'loopvae-cnn-tiny'}", "--arm",
                         f"dc={bundled / 'dcae-tiny'}", "--data", data_urls("val"), "--out", str(tmp_path / "c"),
                         "--resolution", "32", "--num-workers", "0", "--no-progress",
                         "--fid-weights", str(tmp_path / "absent.pth")]) == 0
    err = capfd.readouterr().err
    assert err.count("rFID unavailable") == 1
    md = (tmp_path / "c" / "compare.md").read_text()
    row = next(line for line in md.splitlines() if line.startswith("| loop − dc | psnr"))
    assert row.split("|")[5].strip() == "–" and "Welch" not in row
    # each evaluation's own log still has its warning
    assert all("rFID unavailable" in log.read_text() for log in (tmp_path / "c" / "evals").glob("*/*/eval.log"))


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


def _compare_argv(arms: dict[str, list[str]], data: str, out: Path, *extra: str) -> list[str]:
    specs = [a for name, paths in arms.items() for a in ("--arm", f"{name}={','.join(paths)}")]
    return ["compare", *specs, "--data", data, "--out", str(out), "--resolution", "32", "--num-workers", "0",
            "--no-progress", *extra]


def _refused(capsys, argv: list[str], *fragments: str) -> None:
    capsys.readouterr()
    assert loopvae_main(argv) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if ": error: " in line]
    assert len(lines) == 1 and "Traceback" not in err, err[-2000:]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def _two_image_shard(path: Path, noisy: bool) -> str:
    from loopdata_helpers import encode, noise_image
    from PIL import Image

    images = [noise_image(64, 64, seed=i) if noisy else Image.new("RGB", (64, 64), (100 + 40 * i,) * 3)
              for i in range(2)]
    return write_shard(path, [(f"img{i}", {"png": encode(im, "PNG")}) for i, im in enumerate(images)])


def _eval_psnr(checkpoint: str, data: str, out: Path, *extra: str) -> float:
    """``loopvae eval``'s PSNR as compare measures it (contiguous tensors: eval's default channels_last differs by
    float rounding)."""
    assert loopvae_main(["eval", "--checkpoint", checkpoint, "--data", data, "--out", str(out), "--resolution", "32",
                         "--lpips-net", "none", "--num-workers", "0", "--no-progress", "--memory-format",
                         "contiguous", *extra]) == 0
    return json.loads((out / "metrics.json").read_text())["psnr"]


def test_a_rerun_reevaluates_when_the_data_or_a_setting_changed(checkpoints: dict[str, list[str]],
                                                                tmp_path: Path) -> None:
    arms, out = {"dc": checkpoints["dc"][:1]}, tmp_path / "cmp"
    shard = _two_image_shard(tmp_path / "data" / "d-000000.tar", noisy=False)
    metrics = lambda: next((out / "evals" / "dc").glob("0-*/metrics.json"))  # noqa: E731
    assert loopvae_main(_compare_argv(arms, shard, out)) == 0
    smooth = json.loads((out / "compare.json").read_text())["arms"][0]["psnr"]
    recorded = json.loads(metrics().read_text())
    assert recorded["data"]["identity"][0]["size"] == Path(shard).stat().st_size
    assert recorded["settings"]["num_workers"] == 0 and recorded["settings"]["weights"] == "release"
    _two_image_shard(Path(shard), noisy=True)  # the same path, other images
    assert loopvae_main(_compare_argv(arms, shard, out)) == 0
    noisy = json.loads((out / "compare.json").read_text())["arms"][0]["psnr"]
    assert noisy == pytest.approx(_eval_psnr(arms["dc"][0], shard, tmp_path / "fresh"), abs=1e-12)
    assert abs(noisy - smooth) > 1  # the old images' number was not reused
    stamp = metrics().stat().st_mtime_ns
    assert loopvae_main(_compare_argv(arms, shard, out)) == 0
    assert metrics().stat().st_mtime_ns == stamp  # nothing changed: reused
    for extra, key, value in ((["--num-workers", "1"], "num_workers", 1), (["--skip-corrupt"], "skip_corrupt", True),
                              (["--batch-size", "1"], "batch_size", 1)):
        assert loopvae_main([*_compare_argv(arms, shard, out), *extra]) == 0
        assert metrics().stat().st_mtime_ns != stamp, extra  # another setting: evaluated again
        assert json.loads(metrics().read_text())["settings"][key] == value
        stamp = metrics().stat().st_mtime_ns


def test_weights_model_is_not_served_the_ema_evaluation(tiny_run, tmp_path: Path) -> None:
    run_dir, out = str(tiny_run[0]), tmp_path / "cmp"
    reported = {}
    for weights in ("ema", "model"):  # the same --out: the run's files (and their sha256) are the same
        assert loopvae_main(_compare_argv({"r": [run_dir]}, data_urls("val"), out, "--limit", "2", "--weights",
                                          weights)) == 0
        reported[weights] = json.loads((out / "compare.json").read_text())["arms"][0]["psnr"]
    direct = {w: _eval_psnr(run_dir, data_urls("val"), tmp_path / w, "--limit", "2", "--weights", w)
              for w in ("ema", "model")}
    assert direct["ema"] != direct["model"]
    assert reported == pytest.approx(direct, abs=1e-12)


def test_the_same_weights_twice_in_an_arm_are_refused(checkpoints: dict[str, list[str]], tmp_path: Path,
                                                      capsys) -> None:
    import shutil

    dc0, out = checkpoints["dc"][0], tmp_path / "cmp"
    _refused(capsys, _compare_argv({"dc": [dc0, dc0]}, data_urls("val"), out), f"--arm dc: {dc0} is listed twice",
             "list each checkpoint once")
    copy = shutil.copytree(dc0, tmp_path / "dc0-copy")
    _refused(capsys, _compare_argv({"dc": [dc0, str(copy)], "loop": checkpoints["loop"][:2]}, data_urls("val"), out),
             f"--arm dc: {copy} holds the same weights (sha256) as {dc0}")
    assert not out.exists()  # refused before anything was written


@pytest.mark.parametrize("name", ["/abs/victim", "../../escaped", "a/b", "..", ".hidden", "a:b", ""])
def test_arm_names_must_be_plain_folder_names(checkpoints: dict[str, list[str]], tmp_path: Path, capsys,
                                              name: str) -> None:
    from loopvae.compare import CompareOptions, compare

    victim = tmp_path / "victim" / "0-dc0" / "images"
    victim.mkdir(parents=True)
    (victim / "mine.txt").write_text("keep")
    arm = str(tmp_path / "victim") if name == "/abs/victim" else name
    out = tmp_path / "a" / "b" / "out"
    fragment = "expected NAME=PATH" if not name else f"the arm name {arm!r} becomes a folder under --out"
    _refused(capsys, _compare_argv({arm: checkpoints["dc"][:1]}, data_urls("val"), out), fragment)
    with pytest.raises(ValueError, match="becomes a folder under --out"):
        compare({arm: checkpoints["dc"][:1]}, data_urls("val"), out, CompareOptions(resolution=32, num_workers=0))
    assert (victim / "mine.txt").read_text() == "keep" and [p.name for p in victim.iterdir()] == ["mine.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["victim"]  # nothing made, inside --out or outside


def test_pairing_compares_num_workers_where_both_checkpoints_record_it() -> None:
    from loopvae.compare import _same_order

    def arch(**extra):
        return [{"order": dict(ORDER, seed=0, **extra)}]

    assert _same_order(arch(num_workers=2), arch(num_workers=2))
    assert not _same_order(arch(num_workers=2), arch(num_workers=4))  # other batches: Welch, not paired
    assert _same_order(arch(num_workers=0), arch(num_workers=1))  # one loader process either way
    assert _same_order(arch(num_workers=2), arch())  # a release.json that predates the key
    assert not _same_order(arch(), [{"order": {"seed": 0}}])  # too little recorded to pair
