"""Hostile shards: member names that escape a folder, and decompression bombs."""

import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from loopdata_helpers import jpeg, write_shard
from PIL import Image

import loopdata
from loopdata.checker import check_shards
from loopdata.decode import DEFAULT_MAX_PIXELS, DecodeError, decode_image
from loopdata.keys import UnsafeKeyError, key_problem, path_for_key


def _raw_shard(path: Path, members: dict[str, bytes]) -> str:
    """A tar written by hand, with member names the project's writer would refuse."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return str(path)


@pytest.mark.parametrize("key,problem", [("../../x", "'..'"), ("/abs/x", "absolute"), ("a//b", "empty"),
                                         ("a\\b", "backslash"), ("ok\x01", "control")])
def test_unsafe_keys_are_named(key: str, problem: str) -> None:
    assert problem in key_problem(key)
    with pytest.raises(UnsafeKeyError, match="unsafe sample key"):
        path_for_key("/tmp/out", key, ".png")


def test_safe_keys_stay_inside_their_folder(tmp_path: Path) -> None:
    assert key_problem("n01440764") is None and key_problem("train/0001") is None
    assert path_for_key(tmp_path, "train/0001", ".png") == (tmp_path / "train" / "0001.png").resolve()


@pytest.mark.parametrize("name", ["../../escape.jpg", "/abs/escape.jpg"])
def test_loaders_and_the_checker_refuse_a_shard_with_escaping_member_names(tmp_path: Path, name: str) -> None:
    shard = _raw_shard(tmp_path / "evil-000000.tar", {"good.jpg": jpeg(32, 32), name: jpeg(32, 32, seed=1)})
    for train in (False, True):
        loader = loopdata.make_loader(shard, train=train, batch_size=1, num_workers=0, resolution=16)
        with pytest.raises(UnsafeKeyError, match=r"evil-000000\.tar: unsafe sample key"):
            list(loader)
    report = check_shards([shard])
    assert not report.ok
    assert any("unsafe sample key" in p for p in report.shards[0].problems)


def _bomb_png(side: int = 9500) -> bytes:
    out = io.BytesIO()
    Image.new("1", (side, side)).save(out, "PNG", optimize=True)  # ~10 KiB that decode to side^2 pixels
    return out.getvalue()


def test_a_decompression_bomb_is_refused_from_its_header(tmp_path: Path) -> None:
    bomb = _bomb_png()
    assert len(bomb) < 500_000 and 9500 * 9500 > DEFAULT_MAX_PIXELS
    with pytest.raises(DecodeError, match=r"9500x9500 = 90,250,000 pixels exceeds the limit of 67,108,864"):
        decode_image(bomb)
    assert decode_image(_bomb_png(64), max_pixels=64 * 64).shape == (3, 64, 64)
    with pytest.raises(DecodeError, match="exceeds the limit of 4,095"):
        decode_image(_bomb_png(64), max_pixels=4095)


def test_bombs_are_counted_in_training_named_in_evaluation_and_reported_by_the_checker(tmp_path: Path) -> None:
    samples = [(f"img{i}", {"jpg": jpeg(32, 32, seed=i)}) for i in range(4)] + [("bomb", {"png": _bomb_png()})]
    shard = write_shard(tmp_path / "bombs-000000.tar", samples)
    train = loopdata.make_loader(shard, train=True, batch_size=1, num_workers=0, resolution=16)  # needs all 5
    keys = [k for batch in train for k in batch["key"]]
    assert "bomb" not in keys and train.corrupt_count >= 1
    with pytest.raises(loopdata.CorruptSampleError, match=r"sample 'bomb': PNG image of 9500x9500"):
        list(loopdata.make_loader(shard, train=False, batch_size=2, num_workers=0, resolution=16))
    skipped = loopdata.make_loader(shard, train=False, batch_size=2, num_workers=0, resolution=16, skip_corrupt=True)
    assert [k for b in skipped for k in b["key"]] == [f"img{i}" for i in range(4)] and skipped.corrupt_count == 1
    report = check_shards([shard], decode=False)
    assert not report.ok and report.shards[0].decode_failures[0]["key"] == "bomb"
    assert check_shards([shard], decode=False, max_pixels=10**8).ok


def test_the_pixel_limit_follows_the_environment(monkeypatch) -> None:
    monkeypatch.setenv("LOOPDATA_MAX_PIXELS", "100")
    with pytest.raises(DecodeError, match="exceeds the limit of 100 "):
        decode_image(jpeg(16, 16))
    monkeypatch.setenv("LOOPDATA_MAX_PIXELS", "256")
    assert decode_image(jpeg(16, 16)).shape == (3, 16, 16)
    monkeypatch.setenv("LOOPDATA_MAX_PIXELS", "lots")
    with pytest.raises(ValueError, match="LOOPDATA_MAX_PIXELS='lots' is not a positive integer"):
        decode_image(jpeg(8, 8))


_ABANDON = """
import sys
import loopdata
loader = loopdata.make_loader(sys.argv[1], batch_size=2, num_workers=2, resolution=32)
for batch in loader:
    raise RuntimeError("consumer failed")  # the loader is left suspended, its workers alive
"""


@pytest.mark.parametrize("case", ["consumer raises", "worker raises"])
def test_a_process_whose_loader_fails_exits_although_workers_ignore_sigterm(tmp_path: Path, case: str) -> None:
    # Workers ignore SIGTERM (so a signal to the process group reaches only the main process), and
    # multiprocessing's exit hook stops children with SIGTERM: the loader must stop its own workers.
    samples = [(f"img{i}", {"jpg": jpeg(40, 40, seed=i)}) for i in range(6)]
    if case == "worker raises":
        samples[0] = ("broken", {"jpg": jpeg(40, 40)[:200]})
    shard = write_shard(tmp_path / "s-000000.tar", samples)
    proc = subprocess.run([sys.executable, "-c", _ABANDON, shard], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 1
    expected = "consumer failed" if case == "consumer raises" else "sample 'broken'"
    assert expected in proc.stderr, proc.stderr[-2000:]


def _wide_png(width: int, height: int = 1) -> bytes:
    out = io.BytesIO()
    Image.new("L", (width, height)).save(out, "PNG", optimize=True)  # a few hundred bytes, width*height pixels
    return out.getvalue()


def test_an_image_whose_resize_would_exceed_the_pixel_limit_is_refused_like_a_bomb(tmp_path: Path) -> None:
    """A 1,000,000 x 1 PNG holds 1 Mpx (under the limit) but, resized to a shorter side of 256 before the crop,
    would be 256 x 256,000,000 pixels: refused from its header, counted in training, named in evaluation."""
    wide = _wide_png(1_000_000)
    assert len(wide) < 5_000 and decode_image(wide).shape == (3, 1, 1_000_000)  # no resize planned: 1 Mpx is fine
    with pytest.raises(DecodeError, match=r"1000000x1 \(aspect ratio 1,000,000:1\) would be resized to "
                                          r"256000000x256 = 65,536,000,000 pixels \(shorter side 256\)"):
        decode_image(wide, resize_side=256)
    # the loaders pass their resize target; a small limit keeps this test cheap even without the guard
    small = _wide_png(4000)  # at resolution 16 (train: shorter side 16) -> 64000x16 = 1,024,000 pixels
    samples = [(f"img{i}", {"jpg": jpeg(32, 32, seed=i)}) for i in range(4)] + [("wide", {"png": small})]
    shard = write_shard(tmp_path / "wide-000000.tar", samples)
    train = loopdata.make_loader(shard, train=True, batch_size=1, num_workers=0, resolution=16, max_pixels=500_000)
    keys = [k for batch in train for k in batch["key"]]
    assert "wide" not in keys and train.corrupt_count >= 1
    with pytest.raises(loopdata.CorruptSampleError, match=r"sample 'wide': PNG image of 4000x1 .* would be resized"):
        list(loopdata.make_loader(shard, train=False, batch_size=2, num_workers=0, resolution=16, max_pixels=500_000))
    skipped = loopdata.make_loader(shard, train=False, batch_size=2, num_workers=0, resolution=16,
                                   max_pixels=500_000, skip_corrupt=True)
    assert [k for b in skipped for k in b["key"]] == [f"img{i}" for i in range(4)] and skipped.corrupt_count == 1
    # the same image under a limit its resized size fits is read as before
    assert len([k for b in loopdata.make_loader(shard, train=False, batch_size=5, num_workers=0, resolution=16,
                                                max_pixels=2_000_000) for k in b["key"]]) == 5


def test_a_member_no_reader_sees_is_reported_by_the_checker(tmp_path: Path) -> None:
    """webdataset drops members without a key (``.hidden.png``: the key would be empty; ``README``: no extension);
    every reader silently ignores them, so `loopdata check` names them instead of saying OK."""
    shard = _raw_shard(tmp_path / "dots-000000.tar", {".hidden.png": jpeg(32, 32), "x.jpg": jpeg(32, 32, seed=1),
                                                      ".y.jpg": jpeg(32, 32, seed=2), "README": b"notes",
                                                      "__meta__": b"skipped by design"})
    loader = loopdata.make_loader(shard, train=False, batch_size=4, num_workers=0, resolution=16)
    assert [k for b in loader for k in b["key"]] == ["x"]  # what every reader sees
    report = check_shards([shard])
    assert not report.ok
    (problem,) = [p for p in report.shards[0].problems if "no reader sees" in p]
    assert "3 member(s)" in problem and all(n in problem for n in (".hidden.png", ".y.jpg", "README"))
    assert "__meta__" not in problem
    from loopdata.cli import main as loopdata_main

    assert loopdata_main(["check", shard, "--no-progress"]) != 0
    clean = _raw_shard(tmp_path / "clean-000000.tar", {"x.jpg": jpeg(32, 32, seed=1), "y.jpg": jpeg(32, 32)})
    assert check_shards([clean]).ok
