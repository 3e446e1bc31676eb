"""What ``loopvae eval`` / ``compare`` / ``intervene`` do to their ``--out``: eval removes only what an earlier
evaluation recorded as its own (``eval-outputs.json``), never a user's files; a read-only ``--out`` is one line
(exit status 2); intervene checks the checkpoint before it creates ``--out``."""

import json
from pathlib import Path

import numpy as np
from PIL import Image

from loopvae.cli import main as loopvae_main
from loopvae.demo import bundled_model_dir
from loopvae.evaluate import OUTPUTS_RECORD
from lv_testing import data_urls, read_only_filesystem

EVAL = ["--resolution", "32", "--limit", "2", "--lpips-net", "none", "--num-workers", "0", "--no-progress"]


def _photos(folder: Path, count: int = 2) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(count):
        pixels = np.random.default_rng(i).integers(0, 256, (40, 48, 3), dtype=np.uint8)
        paths.append(folder / f"photo{i}.png")
        Image.fromarray(pixels).save(paths[-1])
    return paths


def _eval(capsys, checkpoint: Path | str, data: str, out: Path, *extra: str) -> tuple[int, str]:
    capsys.readouterr()
    code = loopvae_main(["eval", "--checkpoint", str(checkpoint), "--data", data, "--out", str(out), *EVAL, *extra])
    return code, capsys.readouterr().err


def _one_line(err: str, *fragments: str) -> str:
    lines = [line for line in err.splitlines() if ": error: " in line]
    assert len(lines) == 1 and "Traceback" not in err, err[-2000:]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def test_eval_never_removes_what_it_did_not_write(tmp_path: Path, capsys) -> None:
    model = bundled_model_dir()
    # --out is a project folder with the user's own images/ (and report.md): refused, nothing touched
    project = tmp_path / "project"
    photos = _photos(project / "images")
    (project / "report.md").write_text("my notes")
    code, err = _eval(capsys, model, data_urls("val"), project)
    assert code == 2
    _one_line(err, f"--out {project} already holds report.md, images/", "choose another --out")
    assert all(p.is_file() for p in photos) and (project / "report.md").read_text() == "my notes"
    assert sorted(p.name for p in project.iterdir()) == ["images", "report.md"]  # no eval.log, no record
    # --data and --out the same image folder, whose images live in images/: refused before anything is read
    same = tmp_path / "photos"
    photos = _photos(same / "images")
    code, err = _eval(capsys, model, str(same), same)
    assert code == 2 and all(p.is_file() for p in photos)
    _one_line(err, "already holds images/")


def test_a_rerun_replaces_only_the_recorded_outputs(tmp_path: Path, capsys) -> None:
    model, out = bundled_model_dir(), tmp_path / "eval"
    assert _eval(capsys, model, data_urls("val"), out, "--save-images")[0] == 0
    record = json.loads((out / OUTPUTS_RECORD).read_text())
    assert record["outputs"] == ["metrics.json", "per_image.json", "report.md", "grid.png", "images", "eval.log"]
    (out / "notes.txt").write_text("mine")  # not an eval output name: never looked at
    assert _eval(capsys, model, data_urls("val"), out)[0] == 0  # without --save-images: the old images go
    assert not (out / "images").exists() and (out / "notes.txt").read_text() == "mine"
    assert "images" not in json.loads((out / OUTPUTS_RECORD).read_text())["outputs"]
    # images/ made by the user after that evaluation (which wrote none) is theirs
    photos = _photos(out / "images")
    code, err = _eval(capsys, model, data_urls("val"), out, "--save-images")
    assert code == 2 and all(p.is_file() for p in photos)
    _one_line(err, "already holds images/")
    photos[0].parent.rename(tmp_path / "moved")
    # an evaluation by an older loopvae kept no record: its metrics.json identifies its files
    (out / OUTPUTS_RECORD).unlink()
    assert _eval(capsys, model, data_urls("val"), out)[0] == 0
    assert json.loads((out / "metrics.json").read_text())["num_images"] == 2 and (out / OUTPUTS_RECORD).is_file()
    # ... but not a folder of other files under one of its names
    (out / OUTPUTS_RECORD).unlink()
    _photos(out / "images")
    code, err = _eval(capsys, model, data_urls("val"), out)
    assert code == 2 and (out / "images" / "photo0.png").is_file() and (out / "metrics.json").is_file()
    _one_line(err, "already holds images/")


def test_a_read_only_out_is_one_line_in_eval_compare_and_intervene(tmp_path: Path, capsys) -> None:
    model = str(bundled_model_dir())
    with read_only_filesystem(tmp_path / "ro") as ro:
        for name in ("new", "old"):  # a folder to create, and an existing one to write in
            out = ro / name
            commands = {
                "eval": ["eval", "--checkpoint", model, "--data", data_urls("val"), "--out", str(out), *EVAL],
                "compare": ["compare", "--arm", f"a={model}", "--data", data_urls("val"), "--out", str(out),
                            "--resolution", "32", "--limit", "1", "--num-workers", "0", "--no-progress"],
                "intervene": ["intervene", "--checkpoint", model, "--data", data_urls("val"), "--out", str(out),
                              "--resolution", "32", "--limit", "1", "--no-progress"],
            }
            for command, argv in commands.items():
                capsys.readouterr()
                assert loopvae_main(argv) == 2, command
                _one_line(capsys.readouterr().err, f"loopvae {command}: error: --out {out}: cannot",
                          "Read-only file system")


def test_intervene_refuses_a_non_loopvae_before_creating_out(tmp_path: Path, capsys) -> None:
    dcae = bundled_model_dir().parent / "dcae-tiny"
    out = tmp_path / "interventions"
    code = loopvae_main(["intervene", "--checkpoint", str(dcae), "--data", data_urls("val"), "--out", str(out),
                         "--resolution", "32", "--limit", "1", "--no-progress"])
    assert code == 2
    _one_line(capsys.readouterr().err, "interventions need a LoopVAE", "AutoencoderDC")
    assert not out.exists()


def test_a_second_eval_or_compare_into_a_busy_out_fails_at_once(tmp_path: Path, capsys) -> None:
    """eval and compare hold the run lock of their --out: a second one is told what holds it, and nothing of the
    first one's folder changes."""
    from looprun.run_lock import RunLock
    from loopvae.cli import main

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "busy"
    holder = RunLock(out, "loopvae eval")
    try:
        before = sorted(p.name for p in out.iterdir())
        assert main(["eval", "--checkpoint", str(root / "assets/models/loopvae-cnn-tiny"), "--data",
                     str(root / "assets/kodak/kodak-val-000000.tar"), "--out", str(out)]) == 2
        assert "in use by another loopvae eval" in capsys.readouterr().err
        assert main(["compare", "--arm", f"a={root / 'assets/models/loopvae-cnn-tiny'}", "--data",
                     str(root / "assets/kodak/kodak-val-000000.tar"), "--out", str(out)]) == 2
        assert "in use by another loopvae eval" in capsys.readouterr().err
        assert sorted(p.name for p in out.iterdir()) == before
    finally:
        holder.release()
