"""Evaluation under faults and hostile input: escaping keys, reruns, keys shared by shard sets, corrupt
samples, FID and a failing rank under torchrun; and one-line errors from every CLI."""

import io
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
from loopdata_helpers import jpeg, write_shard

from loopvae.cli import main as loopvae_main
from loopvae.metrics import INCEPTION_FILE
from lv_testing import data_urls


def _eval_cli(checkpoint: Path, data: str, out: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "loopvae", "eval", "--checkpoint", str(checkpoint), "--data", data, "--out",
           str(out), "--resolution", "32", "--lpips-net", "none", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=600)


def _one_line_error(proc: subprocess.CompletedProcess, *fragments: str) -> None:
    _assert_one_line_error(proc.returncode, proc.stderr, *fragments)


def _assert_one_line_error(returncode: int, stderr: str, *fragments: str) -> None:
    assert returncode == 2, stderr[-2000:]
    errors = [line for line in stderr.splitlines() if ": error: " in line]
    assert len(errors) == 1 and "Traceback" not in stderr, stderr[-2000:]
    for fragment in fragments:
        assert fragment in errors[0], errors[0]


def _cli_in_process(capsys, *argv: str) -> tuple[int, str]:
    """``loopvae ARGV`` in this process (the same ``main`` and error handling as ``python -m loopvae``, without an
    interpreter start): (exit code, stderr). Errors raised in DataLoader workers or at process level keep their
    subprocess tests."""
    capsys.readouterr()
    try:
        code = loopvae_main(list(argv))
    except SystemExit as exit_:  # argparse's own errors
        code = exit_.code
    return code, capsys.readouterr().err


def test_save_images_never_writes_outside_out(tiny_run, tmp_path: Path) -> None:
    evil = tmp_path / "shards" / "evil-000000.tar"
    evil.parent.mkdir()
    with tarfile.open(evil, "w") as tar:
        for name in ("good.jpg", "../../escape.jpg"):
            data = jpeg(40, 40)
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    out = tmp_path / "a" / "b" / "out"
    proc = _eval_cli(tiny_run[0], str(evil), out, "--save-images", "--num-workers", "0")
    _one_line_error(proc, "unsafe sample key '../../escape'", "evil-000000.tar")
    assert not list(tmp_path.rglob("escape*.png"))


def test_a_rerun_replaces_the_whole_output_set_and_shard_sets_may_share_keys(tiny_run, tmp_path: Path) -> None:
    out = tmp_path / "eval"
    both = f"{data_urls('val')},{data_urls('full')}"  # kodim23 and kodim24 are in both
    assert loopvae_main(["eval", "--checkpoint", str(tiny_run[0]), "--data", both, "--out", str(out), "--resolution",
                         "32", "--lpips-net", "none", "--save-images", "--num-workers", "0"]) == 0
    rows = json.loads((out / "per_image.json").read_text())
    assert len(rows) == 6 and len({(r["shard"], r["key"]) for r in rows}) == 6
    assert (out / "images" / "reconstruction" / "kodak-full-000000" / "kodim23.png").is_file()
    assert (out / "images" / "reconstruction" / "kodak-val-000000" / "kodim23.png").is_file()
    assert loopvae_main(["eval", "--checkpoint", str(tiny_run[0]), "--data", data_urls("val"), "--out", str(out),
                         "--resolution", "32", "--lpips-net", "none", "--num-workers", "0"]) == 0
    assert not (out / "images").exists()  # not a mix of two runs
    assert json.loads((out / "metrics.json").read_text())["num_images"] == 4
    assert not [p for p in out.iterdir() if ".tmp" in p.name]


def _shard_with_a_corrupt_last_sample(tmp_path: Path, count: int = 6) -> str:
    samples = [(f"img{i}", {"jpg": jpeg(40, 40, seed=i)}) for i in range(count - 1)]
    samples.append(("broken", {"jpg": jpeg(40, 40)[:200]}))
    return write_shard(tmp_path / "mixed" / "mixed-000000.tar", samples)


def test_a_corrupt_eval_sample_is_one_named_line_or_skipped_with_skip_corrupt(tiny_run, tmp_path: Path) -> None:
    shard = _shard_with_a_corrupt_last_sample(tmp_path)
    proc = _eval_cli(tiny_run[0], shard, tmp_path / "strict", "--num-workers", "2")
    _one_line_error(proc, "sample 'broken'", "mixed-000000.tar", "--skip-corrupt")
    proc = _eval_cli(tiny_run[0], shard, tmp_path / "lenient", "--num-workers", "2", "--skip-corrupt")
    assert proc.returncode == 0, proc.stderr[-2000:]
    metrics = json.loads((tmp_path / "lenient" / "metrics.json").read_text())
    assert metrics["num_images"] == 5 and metrics["skipped_corrupt"] == 1
    assert [(e["key"], Path(e["shard"]).name) for e in metrics["skipped"]] == [("broken", "mixed-000000.tar")]
    assert "`broken`" in (tmp_path / "lenient" / "report.md").read_text()


def test_skipped_images_are_named_and_counted_only_before_the_limit(tiny_run, tmp_path: Path) -> None:
    """Corrupt samples at positions 2, 6 and 8 of 10 (sorted order), --limit 5: the 5 evaluated images are the
    first 6 minus the skipped one, so only that one is counted and named; the report counts what it says."""
    good = {i: jpeg(40, 40, seed=i) for i in range(10)}
    samples = [(f"img{i:02d}", {"jpg": good[i][:200] if i in (2, 6, 8) else good[i]}) for i in range(10)]
    shard = write_shard(tmp_path / "m" / "m-000000.tar", samples)
    # one worker reads in order; two workers read halves 0-4 and 5-9 and the loader alternates their batches of
    # 2 (00 01 | 05 07 | 03 04 ...): the limit keeps 00 01 05 07 03, met after skipping 06 and 02, not 08
    expected = {"0": (["img00", "img01", "img03", "img04", "img05"], ["img02"]),
                "2": (["img00", "img01", "img03", "img05", "img07"], ["img02", "img06"])}
    for workers, (evaluated, named) in expected.items():
        out = tmp_path / f"e{workers}"
        proc = _eval_cli(tiny_run[0], shard, out, "--num-workers", workers, "--skip-corrupt", "--limit", "5",
                         "--batch-size", "2")
        assert proc.returncode == 0, proc.stderr[-2000:]
        metrics = json.loads((out / "metrics.json").read_text())
        rows = json.loads((out / "per_image.json").read_text())
        assert metrics["num_images"] == 5 and sorted(r["key"] for r in rows) == evaluated, workers
        assert metrics["skipped_corrupt"] == len(named) and [e["key"] for e in metrics["skipped"]] == named, workers
        assert f"5 images evaluated, {len(named)} skipped" in (out / "report.md").read_text()
    out = tmp_path / "all"
    assert _eval_cli(tiny_run[0], shard, out, "--num-workers", "2", "--skip-corrupt").returncode == 0
    assert [e["key"] for e in json.loads((out / "metrics.json").read_text())["skipped"]] == ["img02", "img06", "img08"]


def test_a_constant_image_keeps_every_metric_finite_and_the_json_strict(tiny_run, tmp_path: Path) -> None:
    """A solid-colour image (and a 1x1 one): the bicubic baseline reproduces it exactly, which is infinite PSNR
    without the cap; metrics.json must parse with a strict JSON parser."""
    from PIL import Image

    def png(size: tuple[int, int]) -> bytes:
        buf = io.BytesIO()
        Image.new("RGB", size, (90, 140, 200)).save(buf, format="PNG")
        return buf.getvalue()

    shard = write_shard(tmp_path / "c" / "c-000000.tar", [("solid", {"png": png((48, 40))}),
                                                           ("pixel", {"png": png((1, 1))})])
    out = tmp_path / "e"
    proc = _eval_cli(tiny_run[0], shard, out, "--num-workers", "0")
    assert proc.returncode == 0, proc.stderr[-2000:]

    def strict(value: str):
        raise ValueError(f"non-standard JSON constant {value}")

    for name in ("metrics.json", "per_image.json"):
        json.loads((out / name).read_text(), parse_constant=strict)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["baseline"]["psnr"] == 120.0  # the cap, stated in the protocol


def _torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "loopvae",
            *args]


def test_fid_under_torchrun_when_one_rank_holds_a_single_image(tiny_run, tmp_path: Path) -> None:
    from test_evaluation import _random_inception_file

    weights = _random_inception_file(tmp_path / INCEPTION_FILE)
    cmd = _torchrun("eval", "--checkpoint", str(tiny_run[0]), "--data", data_urls("val"), "--out", str(tmp_path / "e"),
                    "--resolution", "32", "--lpips-net", "none", "--fid-weights", str(weights), "--limit", "3",
                    "--num-workers", "0", "--device", "cpu")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = json.loads((tmp_path / "e" / "metrics.json").read_text())
    assert metrics["num_images"] == 3 and metrics["rfid"] is not None  # ranks held 2 and 1 images


def test_a_failing_rank_stops_every_rank_promptly_with_its_message(tiny_run, tmp_path: Path) -> None:
    shard = _shard_with_a_corrupt_last_sample(tmp_path, count=40)  # the broken sample is in rank 1's half
    cmd = _torchrun("eval", "--checkpoint", str(tiny_run[0]), "--data", shard, "--out", str(tmp_path / "e"),
                    "--resolution", "32", "--lpips-net", "none", "--batch-size", "1", "--num-workers", "0",
                    "--device", "cpu")
    start = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=300)
    assert proc.returncode != 0 and time.time() - start < 240
    assert "sample 'broken'" in proc.stderr
    assert not (tmp_path / "e" / "metrics.json").exists()


def _release_with(tmp_path: Path, tiny_run, edit) -> Path:
    import shutil

    folder = tmp_path / "release"
    shutil.copytree(tiny_run[0] / "release", folder)
    edit(folder)
    return folder


def _as_legacy_garbage(folder: Path) -> None:
    """A release of the old layout (``model.safetensors``) whose weights file is damaged."""
    (folder / "diffusion_pytorch_model.safetensors").unlink()
    (folder / "model.safetensors").write_bytes(b"\x00garbage" * 10)


def _set_width(folder: Path, value) -> None:
    config = json.loads((folder / "config.json").read_text())
    config["width"] = value
    (folder / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("case,edit,fragments", [
    ("garbage safetensors", lambda f: (f / "diffusion_pytorch_model.safetensors").write_bytes(b"\x00garbage" * 10),
     ["diffusion_pytorch_model.safetensors is not a readable safetensors file"]),
    ("garbage legacy safetensors", _as_legacy_garbage, ["model.safetensors is not a readable safetensors"]),
    ("malformed config.json", lambda f: (f / "config.json").write_text("{not json"), ["config.json"]),
    ("wrongly-typed config.json", lambda f: _set_width(f, "wide"),
     ["config.json: key 'width' must be an integer, got 'wide'"]),
])
def test_bad_release_files_are_named_in_one_line(tiny_run, tmp_path: Path, case: str, edit, fragments,
                                                capsys) -> None:
    folder = _release_with(tmp_path, tiny_run, edit)
    _assert_one_line_error(*_cli_in_process(capsys, "eval", "--checkpoint", str(folder), "--data", data_urls("val"),
                                            "--out", str(tmp_path / "out"), "--resolution", "32", "--lpips-net",
                                            "none", "--num-workers", "0"), *fragments)


def test_clear_one_line_errors_for_bad_data_and_arguments(tmp_path: Path, capsys) -> None:
    truncated = tmp_path / "cut" / "cut-000000.tar"
    truncated.parent.mkdir()
    truncated.write_bytes(Path(data_urls("val")).read_bytes()[:70_000])  # no _info.json next to it
    train = ["train", "--config", "tiny-stage1", "--out"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    # data errors surface in the loader (DataLoader workers in the default config): the real process, end to end
    run = lambda *a: subprocess.run([sys.executable, "-m", "loopvae", *a], capture_output=True, text=True,  # noqa: E731
                                    env=env, timeout=300)
    _one_line_error(run(*train, str(tmp_path / "t1"), "--data", str(truncated)), "cut-000000.tar")
    corrupt = write_shard(tmp_path / "bad" / "bad-000000.tar",
                          [(f"b{i}", {"jpg": b"\xff\xd8 nope"}) for i in range(8)])
    _one_line_error(run(*train, str(tmp_path / "t4"), "--data", corrupt, "--set", "resolution=32", "batch_size=4"),
                    "failed to decode")
    # configuration and argument errors are raised before any worker exists: the same main, in this process
    _assert_one_line_error(*_cli_in_process(capsys, *train, str(tmp_path / "t2"), "--data", data_urls(), "--set",
                                            "betas=[0.9]"), "config key 'betas' needs 2 values, got 1")
    _assert_one_line_error(*_cli_in_process(capsys, *train, str(tmp_path / "t3"), "--data", data_urls(), "--set",
                                            "model=nope"), "unknown model 'nope'")
    code, err = _cli_in_process(capsys, "eval", "--checkpoint", "x", "--data", "y", "--out", str(tmp_path / "e"),
                                "--limit", "-3")
    assert code == 2 and "expected a positive integer, got -3" in err
    for folder in ("t1", "t2", "t3"):  # failed before training started: nothing left behind
        assert not (tmp_path / folder).exists()
