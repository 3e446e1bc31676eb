"""``loopvae encode`` and the latent reader: encode -> read -> decode reproduces ``vae.decode`` of the posterior
mean; exactly once under torchrun x2; resumable; seeded samples; corrupt images named."""

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import loopdata
from loopdata.latents import LatentDataset, denormalize, make_latent_loader, read_metadata
from loopdata.shards import iter_samples
from loopdata.writer import TarShardWriter
from loopvae import LoopVAE
from loopvae.cli import main as loopvae_main
from loopvae.demo import bundled_model_dir
from lv_testing import data_urls

RES = 32


@pytest.fixture(scope="module")
def vae() -> LoopVAE:
    return LoopVAE.from_pretrained(bundled_model_dir()).eval()


def _encode(out: Path, data: str, *extra: str) -> dict:
    assert loopvae_main(["encode", "--checkpoint", str(bundled_model_dir()), "--data", data, "--out", str(out),
                         "--resolution", str(RES), "--batch-size", "3", "--device", "cpu", *extra]) == 0
    return read_metadata(out)


def _split_shards(folder: Path, per_shard: int) -> str:
    """The 24 bundled Kodak images (train then val) re-sharded ``per_shard`` per shard."""
    with TarShardWriter(folder, "kodak", max_count=per_shard) as writer:
        for url in (data_urls("train"), data_urls("val")):
            for sample in iter_samples(url):
                writer.add(sample["__key__"], {k: v for k, v in sample.items() if not k.startswith("__")})
    return ",".join(str(r.path) for r in writer.records)


@torch.no_grad()
def test_encode_read_decode_reproduces_decode_of_the_mean(vae: LoopVAE, tmp_path: Path) -> None:
    meta = _encode(tmp_path / "lat", data_urls("val"), "--flip")
    assert meta["num_samples"] == 4 and meta["flip"] and meta["posterior"] == "mean"
    assert meta["scaling_factor"] == vae.config.scaling_factor and meta["shift_factor"] == vae.config.shift_factor
    loader = loopdata.make_loader(data_urls("val"), task="reconstruction", train=False, batch_size=4, num_workers=0,
                                  resolution=RES)
    batch = next(iter(loader))
    mean = vae.encode(batch["image"]).latent_dist.mode()
    items = list(LatentDataset(tmp_path / "lat", train=False))
    assert [i["key"] for i in items] == batch["key"]
    z_model = torch.stack([i["latent"] for i in items])
    # normalised as diffusion models train on it ...
    assert torch.allclose(z_model, (mean - vae.config.shift_factor) * vae.config.scaling_factor, atol=1e-5)
    # ... and back: the decode of the stored latent is the decode of the mean
    assert torch.allclose(vae.decode(denormalize(z_model, meta)).sample, vae.decode(mean).sample, atol=1e-4)
    flipped = vae.encode(torch.flip(batch["image"], dims=[-1])).latent_dist.mode()
    raw = [s for s in iter_samples(str(tmp_path / "lat" / meta["shards"][0]))]
    from loopdata.latents import load_npy

    assert torch.allclose(torch.from_numpy(load_npy(raw[0]["latent_flip.npy"], "t")), flipped[0], atol=1e-5)
    source = {s["__key__"]: s for s in iter_samples(data_urls("val"))}
    for s in raw:  # the other members are carried over byte for byte; the image is not
        assert s["json"] == source[s["__key__"]]["json"] and "png" not in s and "jpg" not in s


def test_training_reader_splits_shards_over_ranks_and_flips(tmp_path: Path) -> None:
    data = _split_shards(tmp_path / "src", per_shard=6)  # 4 shards
    _encode(tmp_path / "lat", data, "--flip", "--latent-dtype", "float16")
    keys = []
    for rank in range(2):
        ds = LatentDataset(tmp_path / "lat", train=True, rank=rank, world_size=2, seed=3, flip_prob=0.5,
                           shuffle_buffer=4)
        items = list(ds)
        assert all(i["latent"].dtype == torch.float32 and i["latent"].shape == (16, RES // 8, RES // 8) for i in items)
        keys.append({i["key"] for i in items})
        flips = {i["flipped"] for i in items}
    assert not keys[0] & keys[1]  # disjoint
    # 4 shards of 6 over 2 ranks: balanced, every rank yields the smallest share (here all 12 each)
    assert len(keys[0]) == len(keys[1]) == 12 and len(keys[0] | keys[1]) == 24
    assert flips == {True, False}
    batches = list(make_latent_loader(tmp_path / "lat", batch_size=5, train=True, num_workers=2))
    assert sum(b["latent"].shape[0] for b in batches) <= 24 and batches[0]["latent"].shape == (5, 16, 4, 4)
    with pytest.raises(ValueError, match="cannot feed") as err:
        list(LatentDataset(tmp_path / "lat", train=True, world_size=8))
    # the message says what to do with options that exist (no `loopvae encode --max-count`)
    assert "num_workers=0" in str(err.value) and "loopdata write --max-count" in str(err.value)
    assert "encode --max-count" not in str(err.value)
    # unequal shares (3 shards over 2 ranks): both ranks still yield the same number, so DDP steps stay equal
    uneven = [len(list(LatentDataset(tmp_path / "lat", train=True, rank=r, world_size=3, seed=1))) for r in range(3)]
    assert len(set(uneven)) == 1


def test_a_rerun_resumes_finished_shards_and_redoes_interrupted_ones(tmp_path: Path) -> None:
    data = _split_shards(tmp_path / "src", per_shard=12)  # 2 shards
    first = _encode(tmp_path / "lat", data)
    done = tmp_path / "lat" / first["shards"][0]
    before = done.read_bytes()
    (tmp_path / "lat" / first["shards"][1]).unlink()  # as if killed before its rename
    (tmp_path / "lat" / ".tmp-latents-000001").mkdir()
    again = _encode(tmp_path / "lat", data)
    assert again["resumed_shards"] == [first["shards"][0]] and again["num_samples"] == 24
    assert done.read_bytes() == before and not (tmp_path / "lat" / ".tmp-latents-000001").exists()
    from loopvae.encode_latents import EncodeOptions, encode_dataset

    with pytest.raises(ValueError, match="other flip"):  # finished shards made with other options are not reused
        encode_dataset(bundled_model_dir(), data, tmp_path / "lat", EncodeOptions(resolution=RES, device="cpu",
                                                                                  flip=True))
    with pytest.raises(ValueError, match="--data changed"):
        encode_dataset(bundled_model_dir(), data_urls("val"), tmp_path / "lat", EncodeOptions(resolution=RES,
                                                                                              device="cpu"))


def test_posterior_samples_are_seeded_by_the_image_key(tmp_path: Path) -> None:
    a, b = _encode(tmp_path / "a", data_urls("val"), "--sample"), _encode(tmp_path / "b", data_urls("val"), "--sample")
    assert a["posterior"] == b["posterior"] == "sample"
    read = lambda d: torch.stack([i["latent"] for i in LatentDataset(d, train=False)])
    assert torch.equal(read(tmp_path / "a"), read(tmp_path / "b"))
    _encode(tmp_path / "m", data_urls("val"))
    assert not torch.allclose(read(tmp_path / "a"), read(tmp_path / "m"))


def test_a_corrupt_image_is_named_or_skipped_and_listed(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with TarShardWriter(tmp_path / "src", "mixed") as writer:
        for sample in iter_samples(data_urls("val")):
            writer.add(sample["__key__"], {k: v for k, v in sample.items() if not k.startswith("__")})
        writer.add("broken", {"jpg": b"\xff\xd8 not a jpeg", "cls": b"1"})
    shard = str(writer.records[0].path)
    assert loopvae_main(["encode", "--checkpoint", str(bundled_model_dir()), "--data", shard, "--out",
                         str(tmp_path / "x"), "--resolution", str(RES), "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "'broken'" in err and "--skip-corrupt" in err
    meta = _encode(tmp_path / "y", shard, "--skip-corrupt")
    assert meta["num_samples"] == 4 and meta["skipped"] == [f"{shard}#broken"]
    # a shard whose every image is skipped still gets its (empty) output, so the numbering stays one per input
    with TarShardWriter(tmp_path / "bad", "bad") as writer:
        writer.add("broken", {"jpg": b"\xff\xd8 not a jpeg"})
    both = f"{shard},{writer.records[0].path}"
    meta = _encode(tmp_path / "z", both, "--skip-corrupt")
    assert meta["shard_counts"] == [5 - 1, 0] and len(meta["skipped"]) == 2


def test_torchrun_two_ranks_encode_every_image_exactly_once(tmp_path: Path) -> None:
    data = _split_shards(tmp_path / "src", per_shard=7)  # 4 shards of 7, 7, 7, 3: ranks hold 14 and 10 images
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "loopvae",
           "encode", "--checkpoint", str(bundled_model_dir()), "--data", data, "--out", str(tmp_path / "lat"),
           "--resolution", str(RES), "--device", "cpu"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    meta = json.loads((tmp_path / "lat" / "latents.json").read_text())
    assert meta["shard_counts"] == [7, 7, 7, 3] and meta["num_samples"] == 24
    written = [s["__key__"] for name in meta["shards"] for s in iter_samples(str(tmp_path / "lat" / name))]
    source = [s["__key__"] for url in data.split(",") for s in iter_samples(url)]
    assert sorted(written) == sorted(source) and len(set(written)) == 24


def test_keys_that_collide_after_sanitising_are_refused_naming_both(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture) -> None:
    """A tar with ``a/b.png``, ``a_a.png``, ``a_b.png``: ``a/b`` and ``a_b`` both become ``a_b`` in the latent
    shard (not adjacent in the tar). The run must stop naming both, and leave no partial output behind."""
    import io
    import tarfile

    sample = next(iter_samples(data_urls("val")))
    ext = next(k for k in ("png", "jpg") if k in sample)
    image = sample[ext]
    shard = tmp_path / "src" / "collide-000000.tar"
    shard.parent.mkdir()
    with tarfile.open(shard, "w") as tar:
        for name in (f"a/b.{ext}", f"a_a.{ext}", f"a_b.{ext}"):
            info = tarfile.TarInfo(name)
            info.size = len(image)
            tar.addfile(info, io.BytesIO(image))
    out = tmp_path / "out"
    assert loopvae_main(["encode", "--checkpoint", str(bundled_model_dir()), "--data", str(shard), "--out", str(out),
                         "--resolution", str(RES), "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "'a/b'" in err and "'a_b'" in err and "collide-000000.tar" in err
    assert not [p for p in out.iterdir() if p.name.startswith(".tmp") or p.suffix == ".tar"]


def _copy_set(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def _edit_meta(folder: Path, **changes) -> Path:
    meta = json.loads((folder / "latents.json").read_text())
    meta.update(changes)
    for key, value in changes.items():
        if value is ...:
            del meta[key]
    (folder / "latents.json").write_text(json.dumps(meta))
    return folder


def test_latent_reader_refuses_bad_metadata_and_shards_naming_what_is_wrong(tmp_path: Path) -> None:
    import tarfile

    good = tmp_path / "good"
    meta = _encode(good, data_urls("val"))
    shard = good / meta["shards"][0]
    assert meta["shard_counts"] == [4] and set(meta["shard_sha256"]) == {shard.name}
    assert len(list(LatentDataset(good, train=False, verify=True))) == 4  # intact: counts and checksums pass

    bad = _copy_set(good, tmp_path / "json")
    (bad / "latents.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"latents.json: not valid JSON"):
        LatentDataset(bad, train=False)
    with pytest.raises(ValueError, match=r"no 'shards' entry"):
        LatentDataset(_edit_meta(_copy_set(good, tmp_path / "noshards"), shards=...), train=False)
    with pytest.raises(ValueError, match=r"scaling_factor is 'abc'"):
        LatentDataset(_edit_meta(_copy_set(good, tmp_path / "abc"), scaling_factor="abc"), train=False)
    c = meta["latent_shape"][0]
    with pytest.raises(ValueError, match=r"latents_std must be > 0 .* channel 0 is 0"):
        LatentDataset(_edit_meta(_copy_set(good, tmp_path / "std"), latents_mean=[0.0] * c, latents_std=[0.0] * c),
                      train=False)
    wrong = [c, meta["latent_shape"][1] * 2, meta["latent_shape"][2]]
    reader = LatentDataset(_edit_meta(_copy_set(good, tmp_path / "shape"), latent_shape=wrong), train=False)
    with pytest.raises(ValueError, match=rf"{shard.name}: sample '.*': .latent.npy has shape .* latent_shape"):
        next(iter(reader))

    # a shard cut at a sample boundary: 3 of the 4 recorded samples
    cut = _copy_set(good, tmp_path / "cut")
    with tarfile.open(shard) as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]
    last_key = members[-1][0].name.split(".")[0]
    with tarfile.open(cut / shard.name, "w") as tar:
        for m, data in members:
            if m.name.split(".")[0] != last_key:
                tar.addfile(m, io.BytesIO(data))
    with pytest.raises(ValueError, match=rf"{shard.name}: holds 3 samples but latents.json records 4"):
        LatentDataset(cut, train=False)

    # 600 bytes overwritten inside a latent: the count is intact, the checksum is not
    flipped = _copy_set(good, tmp_path / "flip")
    raw = bytearray((flipped / shard.name).read_bytes())
    raw[2000:2600] = bytes(600)
    (flipped / shard.name).write_bytes(bytes(raw))
    assert len(list(LatentDataset(flipped, train=False))) == 4  # without verify: counts only
    with pytest.raises(ValueError, match=rf"{shard.name}: sha256 .* differs from the recorded"):
        LatentDataset(flipped, train=False, verify=True)


def test_an_encode_where_every_image_fails_exits_with_an_error(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with TarShardWriter(tmp_path / "bad", "bad") as writer:
        writer.add("broken", {"jpg": b"\xff\xd8 not a jpeg"})
    out = tmp_path / "out"
    assert loopvae_main(["encode", "--checkpoint", str(bundled_model_dir()), "--data", str(writer.records[0].path),
                         "--out", str(out), "--resolution", str(RES), "--device", "cpu", "--skip-corrupt"]) == 2
    assert "no image of" in capsys.readouterr().err
    assert not (out / "latents.json").exists()


def test_a_failed_start_creates_no_output_and_a_killed_runs_temporaries_are_removed(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert loopvae_main(["encode", "--checkpoint", str(tmp_path / "no-such-release"), "--data", data_urls("val"),
                         "--out", str(out), "--resolution", str(RES), "--device", "cpu"]) == 2
    assert not out.exists()  # the checkpoint is checked before --out is made
    out.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = out / f".latents-000000.tar.json.tmp-{int(dead.stdout)}"  # what a SIGKILL during write_atomic leaves
    stale.write_text("{")
    live = out / f".other.tmp-{os.getpid()}"  # a running process's temporary file stays
    live.write_text("x")
    (out / ".tmp-latents-000000").mkdir()
    (out / ".tmp-latents-000000" / "part-000000.tar").write_bytes(b"partial")
    meta = _encode(out, data_urls("val"))
    assert meta["num_samples"] == 4
    assert not stale.exists() and not (out / ".tmp-latents-000000").exists() and live.exists()


def _folder_of(tmp_path: Path, names: list[str]) -> Path:
    """A folder of the bundled kodim21-24 images under the given file names (cycled)."""
    folder = tmp_path / "images"
    folder.mkdir(exist_ok=True)
    sources = [s for s in iter_samples(data_urls("val"))]
    for i, name in enumerate(names):
        sample = sources[i % len(sources)]
        ext = next(k for k in ("jpg", "png") if k in sample)
        (folder / f"{name}.{ext}").write_bytes(sample[ext])
    return folder


def test_a_changed_folder_is_encoded_again_never_reused(tmp_path: Path) -> None:
    """Encode 5 images, then rename one, add one and delete one (still 5): the rerun must hold exactly the current
    images, each once; growing past a chunk boundary re-encodes the shifted chunks and drops none."""
    folder = _folder_of(tmp_path, ["a", "b", "c", "d", "e"])
    out = tmp_path / "latents"
    meta = _encode(out, str(folder))
    keys = lambda: sorted(s["key"] for s in LatentDataset(out, train=False, normalize=False))  # noqa: E731
    assert meta["num_samples"] == 5 and keys() == ["a", "b", "c", "d", "e"]
    renamed = next(folder.glob("b.*"))
    renamed.rename(folder / f"bb{renamed.suffix}")
    next(folder.glob("e.*")).unlink()
    _folder_of(tmp_path, ["f"])
    meta = _encode(out, str(folder))
    assert meta["num_samples"] == 5 and meta["resumed_shards"] == [] and keys() == ["a", "bb", "c", "d", "f"]
    again = _encode(out, str(folder))  # unchanged input: the shard is reused
    assert again["resumed_shards"] == [meta["shards"][0]]


def test_a_folder_growing_past_a_chunk_boundary(tmp_path: Path, monkeypatch) -> None:
    import loopdata.folders as folders

    monkeypatch.setattr(folders, "CHUNK_SIZE", 3)
    folder = _folder_of(tmp_path, [f"img{i:02d}" for i in range(6)])
    out = tmp_path / "latents"
    assert _encode(out, str(folder))["shard_counts"] == [3, 3]
    _folder_of(tmp_path, ["aaa_new"])  # sorts first: every chunk shifts
    meta = _encode(out, str(folder))
    keys = [s["key"] for s in LatentDataset(out, train=False, normalize=False)]
    assert meta["shard_counts"] == [3, 3, 1] and sorted(keys) == ["aaa_new"] + [f"img{i:02d}" for i in range(6)]
    assert len(keys) == len(set(keys))
    next(folder.glob("aaa_new.*")).unlink()
    meta = _encode(out, str(folder))
    assert meta["shard_counts"] == [3, 3] and not (out / "latents-000002.tar").exists()


def test_loopdata_check_verifies_a_latent_shard_set(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from loopdata.cli import main as loopdata_main

    out = tmp_path / "latents"
    meta = _encode(out, data_urls("val"))
    capsys.readouterr()
    assert loopdata_main(["check", str(out)]) == 0
    text = capsys.readouterr().out
    assert "latent shard set, 4 samples in 1 shard(s); checked counts and sha256" in text and "OK" in text
    shard = out / meta["shards"][0]
    assert loopdata_main(["check", str(shard)]) == 0  # a shard of the set is checked as a latent shard
    assert "latent shard set" in capsys.readouterr().out
    raw = bytearray(shard.read_bytes())
    raw[2000:2600] = bytes(600)
    shard.write_bytes(bytes(raw))
    assert loopdata_main(["check", str(out), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert any("sha256" in p for p in report["problems"]) and report["num_samples"] == 4


def test_moments_round_trip_and_per_epoch_resampling(vae: LoopVAE, tmp_path: Path) -> None:
    """--moments stores [mean; log-variance]; the training reader draws z = mean + std * eps, reproducible per
    (seed, epoch, key) and new every epoch; the evaluation reader gives the mean, i.e. the plain encode's latent."""
    moments = _encode(tmp_path / "m", data_urls("val"), "--moments")
    means = _encode(tmp_path / "mean", data_urls("val"))
    assert moments["moments"] and moments["posterior"] == "moments" and moments["latent_shape"] == means["latent_shape"]
    plain = {s["key"]: s["latent"] for s in LatentDataset(tmp_path / "mean", train=False, normalize=False)}
    evaluated = {s["key"]: s["latent"] for s in LatentDataset(tmp_path / "m", train=False, normalize=False)}
    for key, z in plain.items():
        assert torch.allclose(evaluated[key], z, atol=1e-6)

    def draws(epoch: int) -> dict:
        ds = LatentDataset(tmp_path / "m", train=True, normalize=False, flip_prob=0.0, seed=7)
        ds.set_epoch(epoch)
        return {s["key"]: s["latent"] for s in ds}

    first, again, other = draws(0), draws(0), draws(1)
    images = next(iter(loopdata.make_loader(data_urls("val"), task="reconstruction", train=False, batch_size=4,
                                            num_workers=0, resolution=RES, rank=0, world_size=1)))
    with torch.no_grad():
        std = vae.encode(images["image"]).latent_dist.std
    for i, key in enumerate(images["key"]):
        assert torch.equal(first[key], again[key]) and not torch.equal(first[key], other[key])
        eps = (first[key] - plain[key]) / std[i]
        assert abs(float(eps.mean())) < 0.2 and 0.8 < float(eps.std()) < 1.2  # a standard-normal draw
    assert loopvae_main(["encode", "--checkpoint", str(bundled_model_dir()), "--data", data_urls("val"), "--out",
                         str(tmp_path / "bad"), "--resolution", str(RES), "--moments", "--sample"]) == 2


def test_a_folder_that_gains_an_image_is_encoded_again(tmp_path: Path) -> None:
    """The chunk URL holds the image count (folder:D#0-3, then #0-4): the same chunk of the same folder is encoded
    again, not refused as another --data."""
    folder = _folder_of(tmp_path, ["a", "b", "c"])
    out = tmp_path / "latents"
    assert _encode(out, str(folder))["num_samples"] == 3
    _folder_of(tmp_path, ["a", "b", "c", "d"])
    meta = _encode(out, str(folder))
    assert meta["num_samples"] == 4 and meta["resumed_shards"] == []
    assert sorted(s["key"] for s in LatentDataset(out, train=False, normalize=False)) == ["a", "b", "c", "d"]
    from loopvae.encode_latents import EncodeOptions, encode_dataset

    (tmp_path / "other").mkdir()
    other = _folder_of(tmp_path / "other", ["x", "y", "z"])  # another folder into the same --out is still refused
    with pytest.raises(ValueError, match="--data changed"):
        encode_dataset(bundled_model_dir(), str(other), out, EncodeOptions(resolution=RES, device="cpu"))


def test_a_rerun_verifies_finished_shards_and_their_records(tmp_path: Path, caplog) -> None:
    """A finished shard damaged after it was written (cut short), a record whose count was edited and an unreadable
    record: each is named in a warning and the shard encoded again; the set then checks."""
    from loopdata.latents import check_latent_set

    data = _split_shards(tmp_path / "src", per_shard=12)  # 2 shards
    out = tmp_path / "lat"
    first = _encode(out, data)
    shard, record = out / "latents-000000.tar", out / "latents-000000.tar.json"
    good = shard.read_bytes()
    with open(shard, "r+b") as f:
        f.truncate(5000)
    with caplog.at_level("WARNING", logger="loopvae"):
        again = _encode(out, data)
    assert "latents-000000.tar: its sha256 is" in caplog.text and again["resumed_shards"] == ["latents-000001.tar"]
    assert shard.read_bytes() == good and not check_latent_set(out)["problems"]
    edited = json.loads(record.read_text())
    record.write_text(json.dumps({**edited, "count": edited["count"] - 1}))
    caplog.clear()
    with caplog.at_level("WARNING", logger="loopvae"):
        again = _encode(out, data)
    assert "it holds 12 samples, its record latents-000000.tar.json says 11" in caplog.text
    assert again["shard_counts"] == first["shard_counts"] == [12, 12]
    record.write_text("{oops")
    caplog.clear()
    with caplog.at_level("WARNING", logger="loopvae"):
        again = _encode(out, data)
    assert f"{record} is unreadable" in caplog.text and again["num_samples"] == 24
    assert not check_latent_set(out)["problems"]


def test_a_second_encode_into_the_same_out_fails_at_once_and_keeps_the_first_ones_files(tmp_path: Path,
                                                                                          capsys) -> None:
    from looprun.run_lock import RunLock

    out = tmp_path / "lat"
    out.mkdir()
    (out / ".tmp-latents-000000").mkdir()  # the running encode's temporary shard
    (out / ".tmp-latents-000000" / "part-000000.tar").write_bytes(b"in progress")
    lock = RunLock(out, "loopvae encode")  # as the running encode holds it (a separate open file: flock conflicts)
    try:
        assert loopvae_main(["encode", "--checkpoint", str(bundled_model_dir()), "--data", data_urls("val"), "--out",
                             str(out), "--resolution", str(RES), "--device", "cpu"]) == 2
    finally:
        lock.release()
    err = capsys.readouterr().err
    assert f"{out} is in use by another loopvae encode (pid {os.getpid()})" in err and "Traceback" not in err
    assert (out / ".tmp-latents-000000" / "part-000000.tar").read_bytes() == b"in progress"
    assert not list(out.glob("latents-*"))
    assert _encode(out, data_urls("val"))["num_samples"] == 4  # the lock is released with its holder


def test_a_read_only_out_is_one_line_naming_it(tmp_path: Path, capsys) -> None:
    from lv_testing import read_only_filesystem

    with read_only_filesystem(tmp_path / "ro") as ro:
        for folder, reason in (("new", "cannot create the folder"), ("old", "cannot write in this folder")):
            capsys.readouterr()
            assert loopvae_main(["encode", "--checkpoint", str(bundled_model_dir()), "--data", data_urls("val"),
                                 "--out", str(ro / folder), "--resolution", str(RES), "--device", "cpu"]) == 2
            err = capsys.readouterr().err
            assert f"--out {ro / folder}: {reason}: Read-only file system" in err and "Traceback" not in err, err


def test_a_busy_out_is_refused_before_the_tokenizer_is_even_loaded(tmp_path: Path, capsys) -> None:
    """The command line locks an existing --out before its heavy imports and the checkpoint load, so a second
    encode is refused while the first is still working (a fast first encode used to finish before the second
    reached its lock). A checkpoint that does not exist proves the order: the lock error comes first."""
    from looprun.run_lock import RunLock
    from loopvae.cli import main

    out = tmp_path / "lat"
    holder = RunLock(out, "loopvae encode")
    try:
        assert main(["encode", "--checkpoint", str(tmp_path / "no-such-model"), "--data", str(tmp_path),
                     "--out", str(out)]) == 2
        assert "in use by another loopvae encode" in capsys.readouterr().err
    finally:
        holder.release()
