"""`loopdata write` / `check` / `info`: byte-exact round trips, reported skips, damaged shards fail."""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from loopdata_helpers import encode, jpeg, noise_image, write_shard
from PIL import Image

from loopdata import check_shards, expand_urls, make_loader, write_shards
from loopdata.cli import main, parse_size
from loopdata.shards import iter_samples, read_info

CLASSES = ("n01440764", "n01443537", "n02099601")


def read_members(urls: list[str]) -> dict[str, dict[str, bytes]]:
    return {s["__key__"]: s for url in urls for s in iter_samples(url)}


@pytest.fixture
def class_tree(tmp_path: Path) -> dict[str, tuple[bytes, int]]:
    """ImageNet-style tree: 3 wnid folders made in unsorted order, 12 images; key -> (bytes, label)."""
    root = tmp_path / "train"
    expected = {}
    for label, wnid in sorted(enumerate(CLASSES), key=lambda item: item[1][::-1]):
        (root / wnid).mkdir(parents=True)
        for j in range(3 + label % 2):
            data = jpeg(30 + j, 20 + label, seed=10 * label + j)
            (root / wnid / f"{wnid}_{j}.JPEG").write_bytes(data)
            expected[f"{wnid}_{j}"] = (data, label)
    # ImageNet holds a PNG and CMYK JPEGs named .JPEG: their bytes are kept and the member named by content.
    png = encode(noise_image(12, 12, 1), "PNG")
    (root / CLASSES[1] / f"{CLASSES[1]}_png.JPEG").write_bytes(png)
    expected[f"{CLASSES[1]}_png"] = (png, 1)
    cmyk = encode(Image.new("CMYK", (10, 10), (10, 20, 30, 40)), "JPEG")
    (root / CLASSES[2] / f"{CLASSES[2]}_cmyk.JPEG").write_bytes(cmyk)
    expected[f"{CLASSES[2]}_cmyk"] = (cmyk, 2)
    return expected


def test_write_then_check_round_trips_bytes_and_labels(tmp_path, class_tree):
    report = write_shards(tmp_path / "train", tmp_path / "out", prefix="imagenet-train", max_count=4)
    assert report.layout == "classes" and report.class_names == list(CLASSES)
    assert len(class_tree) == 12 and report.counts == [4, 4, 4] and not report.skipped
    members = read_members(report.shards)
    assert set(members) == set(class_tree)
    for key, (data, label) in class_tree.items():
        sample = members[key]
        ext = "png" if key.endswith("_png") else "jpg"
        assert sample[ext] == data  # original bytes, never re-encoded
        assert int(sample["cls"]) == label
        assert json.loads(sample["json"])["label"] == label
    keys = [k for url in report.shards for k in (s["__key__"] for s in iter_samples(url))]
    assert keys == sorted(keys, key=lambda k: (k.split("_")[0], k))  # sorted class, then file order
    check = check_shards(expand_urls(str(tmp_path / "out" / "imagenet-train-{000000..000002}.tar")))
    assert check.ok, check.format_text()
    assert check.num_samples == len(class_tree) and check.coverage()["distinct_labels"] == 3
    info = read_info(tmp_path / "out")
    assert info["splits"]["imagenet-train"]["shard_lengths"] == [4, 4, 4]


def test_writing_is_deterministic(tmp_path, class_tree):
    first = write_shards(tmp_path / "train", tmp_path / "a", prefix="x", max_count=5)
    second = write_shards(tmp_path / "train", tmp_path / "b", prefix="x", max_count=5)
    digests = [[hashlib.sha256(Path(p).read_bytes()).hexdigest() for p in r.shards] for r in (first, second)]
    assert digests[0] == digests[1]
    with tarfile.open(first.shards[0]) as tar:
        member = tar.getmembers()[0]
        assert (member.mtime, member.uid, member.gid, member.uname) == (946684800, 0, 0, "")


def test_unreadable_files_are_listed_and_left_out(tmp_path, class_tree):
    bad_dir = tmp_path / "train" / CLASSES[0]
    (bad_dir / "empty.JPEG").write_bytes(b"")
    (bad_dir / "notes.JPEG").write_text("not an image")
    full = jpeg(64, 64, seed=99)
    (bad_dir / "cut.JPEG").write_bytes(full[: len(full) // 2])
    (tmp_path / "train" / "README.txt").write_text("loose file")
    report = write_shards(tmp_path / "train", tmp_path / "out", layout="classes")
    listed = dict(line.split("\t") for line in report.skipped_file.read_text().splitlines())
    assert set(listed) == {
        "README.txt",
        f"{CLASSES[0]}/empty.JPEG",
        f"{CLASSES[0]}/notes.JPEG",
        f"{CLASSES[0]}/cut.JPEG",
    }
    assert "empty" in listed[f"{CLASSES[0]}/empty.JPEG"] and "truncated" in listed[f"{CLASSES[0]}/cut.JPEG"]
    assert report.num_samples == len(class_tree)
    assert check_shards(report.shards).ok


def test_flat_folder_and_labels_file(tmp_path):
    flat = tmp_path / "flat"
    flat.mkdir()
    for i in range(3):
        (flat / f"img.{i}.jpg").write_bytes(jpeg(seed=i))
    report = write_shards(flat, tmp_path / "out", prefix="flat")
    assert report.layout == "flat"
    samples = read_members(report.shards)
    assert sorted(samples) == ["img_0", "img_1", "img_2"] and all("cls" not in s for s in samples.values())

    labels = tmp_path / "val.txt"
    labels.write_text("# filename label\nimg.0.jpg n02099601\nimg.2.jpg n01440764\nmissing.jpg n01440764\n")
    names = tmp_path / "classes.txt"
    names.write_text("\n".join(CLASSES) + "\n")
    report = write_shards(flat, tmp_path / "out", labels_file=labels, class_names=names, prefix="val")
    samples = read_members(report.shards)
    assert {k: int(s["cls"]) for k, s in samples.items()} == {"img_0": 2, "img_2": 0}
    reasons = {s.path: s.reason for s in report.skipped}
    assert reasons == {
        "img.1.jpg": "not in the labels file",
        "missing.jpg": "listed in the labels file but missing",
    }
    with pytest.raises(ValueError, match="not an integer; pass --class-names"):
        write_shards(flat, tmp_path / "out2", labels_file=labels)


def test_generic_class_trees_get_class_prefixed_keys_and_existing_shards_are_protected(tmp_path):
    for name in ("cat", "dog"):
        (tmp_path / "pets" / name).mkdir(parents=True)
        (tmp_path / "pets" / name / "001.jpg").write_bytes(jpeg(seed=len(name)))
    report = write_shards(tmp_path / "pets", tmp_path / "out")
    assert sorted(read_members(report.shards)) == ["cat_001", "dog_001"]
    with pytest.raises(FileExistsError, match="--overwrite"):
        write_shards(tmp_path / "pets", tmp_path / "out")
    assert write_shards(tmp_path / "pets", tmp_path / "out", overwrite=True).num_samples == 2
    (tmp_path / "pets" / "loose.jpg").write_bytes(jpeg())
    with pytest.raises(ValueError, match="--layout"):
        write_shards(tmp_path / "pets", tmp_path / "out3")


def test_max_size_starts_new_shards(tmp_path, class_tree):
    report = write_shards(tmp_path / "train", tmp_path / "out", max_size=6000)
    assert len(report.shards) > 2
    assert all(Path(p).stat().st_size <= 6000 + 10240 for p in report.shards)  # tar pads to 10 KiB records
    assert sum(report.counts) == len(class_tree)


def test_check_fails_on_damaged_shards(tmp_path, class_tree, capsys):
    report = write_shards(tmp_path / "train", tmp_path / "out", prefix="d", max_count=5)
    shard = Path(report.shards[0])
    original = shard.read_bytes()
    assert main(["check", str(tmp_path / "out")]) == 0

    # One flipped byte inside the first image: sha256 no longer matches _info.json.
    data = bytearray(original)
    data[2000] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert main(["check", str(shard)]) == 1
    assert "differs from _info.json" in capsys.readouterr().out

    # Truncated tar: read error and wrong count.
    shard.write_bytes(original[: len(original) // 3])
    assert main(["check", "--json", str(shard)]) == 1
    result = json.loads(capsys.readouterr().out)
    assert not result["ok"] and any(
        "damaged tar" in p or "samples, found" in p for p in result["shards"][0]["problems"]
    )

    # A non-integer label is a problem even with intact bytes (no _info.json entry to compare).
    bad = tmp_path / "bad" / "bad-000000.tar"
    bad.parent.mkdir()
    with tarfile.open(bad, "w") as tar:
        for name, payload in (("a.jpg", jpeg()), ("a.cls", b"cat")):
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    assert main(["check", str(bad)]) == 1
    assert ".cls is not an integer" in capsys.readouterr().out


def test_check_reports_decode_failures_and_duplicate_keys(make_shards, tmp_path):
    urls = make_shards([3, 2])
    copy = Path(urls[0]).with_name("copy-000000.tar")
    copy.write_bytes(Path(urls[0]).read_bytes())
    report = check_shards([urls[0], str(copy)])
    assert not report.ok and "appear in several shards" in report.problems[0]

    broken = write_shard(
        tmp_path / "broken-000000.tar", [("good", {"jpg": jpeg()}), ("text", {"jpg": b"hello"})]
    )
    report = check_shards([broken])
    failures = report.shards[0].decode_failures
    assert not report.ok and [f["key"] for f in failures] == ["text"]
    assert "not a recognised image" in failures[0]["reason"]


def test_cli_write_info_and_module_entry_point(tmp_path, class_tree, capsys):
    assert (
        main(
            [
                "write",
                str(tmp_path / "train"),
                str(tmp_path / "out"),
                "--prefix",
                "t",
                "--max-count",
                "3",
                "--max-size",
                "1MB",
            ]
        )
        == 0
    )
    written = capsys.readouterr()
    assert "wrote 12 samples in 4 shard(s)" in written.out
    assert "write: 100%" in written.err and "12/12" in written.err  # the progress bar, on stderr
    assert main(["check", str(tmp_path / "out")]) == 0
    checked = capsys.readouterr()
    assert "check: 100%" in checked.err and "4/4" in checked.err
    (tmp_path / "out" / "_info.json").unlink()
    assert main(["info", str(tmp_path / "out"), "--write", "--split", "t"]) == 0
    assert "total\t12" in capsys.readouterr().out
    assert read_info(tmp_path / "out")["splits"]["t"]["num_samples"] == 12
    assert main(["check", str(tmp_path / "missing-*.tar")]) == 2
    loader = make_loader(
        str(tmp_path / "out"), "classification", batch_size=12, num_workers=0, resolution=8, num_classes=3
    )
    assert sorted(int(x) for x in next(iter(loader))["label"]) == sorted(
        label for _, label in class_tree.values()
    )
    result = subprocess.run(
        [sys.executable, "-m", "loopdata", "check", "--no-decode", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0 and result.stdout.rstrip().endswith("OK")


def test_parse_size():
    assert parse_size("1000") == 1000 and parse_size("500MB") == 500 * 10**6
    assert parse_size("1.5G") == 1_500_000_000 and parse_size("64MiB") == 64 * 2**20


def test_benchmark_script_runs_and_reports_the_ratio(tmp_path, monkeypatch):
    import importlib.util

    from loopdata import bundled_kodak_urls

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_data.py"
    monkeypatch.syspath_prepend(str(path.parent))  # as when the script runs: its folder is on sys.path
    spec = importlib.util.spec_from_file_location("bench_data", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "bench.md"
    shards = ",".join(bundled_kodak_urls("train"))
    assert (
        bench.main(["--shards", shards, "--limit", "3", "--repeats", "1", "--size", "64", "--out", str(out)])
        == 0
    )
    text = out.read_text()
    assert "Decode throughput ratio" in text and "| baseline: PIL" in text


def test_a_failed_overwrite_keeps_the_old_shards_and_a_good_one_replaces_them(tmp_path):
    """`write --overwrite` stages the new shards and replaces the old set only once the write succeeded: a source
    with no usable image leaves the old shards, _info.json and the check as they were."""
    src, bad, out = tmp_path / "src", tmp_path / "bad", tmp_path / "out"
    src.mkdir()
    bad.mkdir()
    for i in range(3):
        (src / f"im{i}.jpg").write_bytes(jpeg(seed=i))
    (bad / "x.png").write_bytes(b"not an image")
    first = write_shards(src, out, prefix="p", max_count=2)
    assert [Path(p).name for p in first.shards] == ["p-000000.tar", "p-000001.tar"]
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    kept = r"no usable images under .*bad .*the 2 existing p-\*\.tar shard\(s\) .* are kept"
    with pytest.raises(ValueError, match=kept):
        write_shards(bad, out, prefix="p", overwrite=True)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # shards, _info.json: untouched, no leftovers
    assert check_shards(expand_urls(str(out))).ok
    # a successful overwrite with fewer shards removes the old extra one and rewrites _info.json
    (src / "im2.jpg").unlink()
    (src / "im1.jpg").unlink()
    again = write_shards(src, out, prefix="p", max_count=2, overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == ["_info.json", "p-000000.tar"] and again.num_samples == 1
    assert read_info(out)["splits"]["p"]["filenames"] == ["p-000000.tar"]
    assert sorted(read_members(again.shards)) == ["im0"]
    assert check_shards(expand_urls(str(out))).ok


def test_a_latent_set_cannot_point_outside_its_folder(tmp_path):
    from loopdata.latents import read_metadata

    folder = tmp_path / "latents"
    folder.mkdir()
    meta = {"shards": ["latents-000000.tar"], "shard_counts": [1], "latent_shape": [4, 2, 2]}
    (folder / "latents.json").write_text(json.dumps(meta))
    assert read_metadata(folder)["shards"] == ["latents-000000.tar"]
    for name in ("../elsewhere/latents-000000.tar", "/etc/latents-000000.tar", "sub/latents-000000.tar", ".."):
        (folder / "latents.json").write_text(json.dumps({**meta, "shards": [name]}))
        with pytest.raises(ValueError, match=r"latents\.json: shards lists .* not a plain file name in the folder"):
            read_metadata(folder)
    assert main(["check", str(folder)]) != 0
