"""Repeated augmentation (DeiT's RASampler, streaming form: loopdata.repeated) through the real loader and trainer."""

import logging
from collections import Counter, defaultdict
from pathlib import Path

import pytest
import torch
from loopdata_helpers import jpeg, write_shard

import loopdata
from loopdata.repeated import RepeatedAugDataset, repeat_each
from looprun.config import ConfigError
from srvit.train_config import list_presets, load_train_config
from srvit.trainer import Trainer

N, SHARDS, BATCH, BUFFER = 96, 4, 8, 8
# DeiT's augmentation minus the batch-level mixing, so every image of a batch is one sample's own view.
OPTIONS = dict(protocol="imagenet", num_classes=5, mixup_alpha=0.0, cutmix_alpha=0.0, random_erasing=0.0)


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> list[str]:
    """N noise JPEGs (24x20) with labels in SHARDS shards; keys ``s{i}_{j}`` are unique over the set."""
    root = tmp_path_factory.mktemp("repeated")
    per = N // SHARDS
    return [write_shard(root / f"s{i}-000000.tar",
                        [(f"s{i}_{j:03d}", {"jpg": jpeg(24, 20, seed=100 * i + j), "cls": str(j % 5).encode()})
                         for j in range(per)])
            for i in range(SHARDS)]


def loader(urls: list[str], repeats: int, **kwargs) -> loopdata.ShardLoader:
    args = dict(task="classification", train=True, batch_size=BATCH, num_workers=0, resolution=16,
                shuffle_buffer=BUFFER, repeated_aug=repeats, **OPTIONS)
    return loopdata.make_loader(urls, **{**args, **kwargs})


def epoch(data: loopdata.ShardLoader) -> list[dict]:
    return list(data)


def views(batches: list[dict]) -> dict[str, list[tuple[int, torch.Tensor]]]:
    """key -> [(batch index, image (3, R, R))] over an epoch."""
    out: dict[str, list[tuple[int, torch.Tensor]]] = defaultdict(list)
    for b, batch in enumerate(batches):
        for key, image in zip(batch["key"], batch["image"]):
            out[key].append((b, image))
    return out


def test_repeat_each_yields_every_item_r_times_in_order() -> None:
    assert list(repeat_each(iter("abc"), 3)) == list("aaabbbccc")


def test_each_sample_is_seen_r_times_with_independent_views_and_the_epoch_keeps_its_length(shards) -> None:
    once = loader(shards, 1)
    thrice = loader(shards, 3)
    assert isinstance(thrice.dataset, RepeatedAugDataset) and not isinstance(once.dataset, RepeatedAugDataset)
    assert thrice.num_batches == once.num_batches == N // BATCH and thrice.num_samples == N

    base = Counter(k for b in epoch(once) for k in b["key"])
    assert len(base) == N and set(base.values()) == {1}  # without repeats: every sample once

    batches = epoch(thrice)
    assert len(batches) == N // BATCH and sum(len(b["key"]) for b in batches) == N
    seen = views(batches)
    counts = Counter({k: len(v) for k, v in seen.items()})
    assert max(counts.values()) == 3
    partial = [k for k, c in counts.items() if c < 3]
    # only the copies still in the shuffle buffer when the epoch fills up can be missing (see loopdata.repeated)
    assert len(partial) <= BUFFER + 1
    assert N // 3 <= len(counts) <= N // 3 + BUFFER + 1 and len(counts) < N // 2
    assert sum(c == 3 for c in counts.values()) >= N // 3 - BUFFER
    for key, copies in seen.items():  # every copy is an independent draw of the augmentation
        images = [img for _, img in copies]
        assert all(not torch.equal(images[i], images[j]) for i in range(len(images)) for j in range(i)), key
    # the shuffle buffer spreads the copies: most images' views span more than one batch
    spread = sum(len({b for b, _ in copies}) > 1 for copies in seen.values() if len(copies) == 3)
    assert spread > 0.5 * sum(c == 3 for c in counts.values())


def test_resume_and_the_next_epoch_follow_the_documented_stream(shards) -> None:
    full = loader(shards, 3)
    first = epoch(full)
    resumed = loader(shards, 3, start_batch=5)
    rest = epoch(resumed)
    assert len(rest) == len(first) - 5
    for a, b in zip(first[5:], rest):
        assert a["key"] == b["key"] and torch.equal(a["image"], b["image"]) and torch.equal(a["label"], b["label"])
    second = epoch(full)  # epoch 1: a new shard order, so (mostly) other images
    keys0, keys1 = {k for b in first for k in b["key"]}, {k for b in second for k in b["key"]}
    assert keys0 != keys1 and len(keys0 | keys1) > len(keys0)


def test_workers_and_ranks_keep_the_copies_of_an_image_together(shards) -> None:
    workers = epoch(loader(shards, 3, num_workers=2))
    assert len(workers) == N // BATCH
    seen = views(workers)
    assert max(len(v) for v in seen.values()) == 3 and len(seen) <= N // 3 + 2 * (BUFFER + 1)
    # batch j comes from worker j % 2: all views of an image come from the worker that read it
    assert all(len({b % 2 for b, _ in copies}) == 1 for copies in seen.values())

    per_rank = [epoch(loader(shards, 3, rank=r, world_size=2, batch_size=4)) for r in range(2)]
    keys = [Counter(k for b in batches for k in b["key"]) for batches in per_rank]
    assert all(len(batches) == N // (2 * 4) for batches in per_rank)
    assert not set(keys[0]) & set(keys[1])  # unlike RASampler, the copies never cross ranks
    assert all(max(k.values()) == 3 for k in keys)


def test_evaluation_never_repeats_and_bad_settings_are_named(shards, caplog) -> None:
    evaluation = loopdata.make_loader(shards, task="classification", train=False, batch_size=BATCH, num_workers=0,
                                      resolution=16, repeated_aug=3, **OPTIONS)
    assert Counter(k for b in evaluation for k in b["key"]) == Counter({k: 1 for k in
                                                                       {k for b in evaluation for k in b["key"]}})
    assert evaluation.num_samples == N and sum(len(b["key"]) for b in evaluation) == N
    with pytest.raises(ValueError, match="shuffle_buffer=1"):
        loader(shards, 3, shuffle_buffer=1)
    with pytest.raises(ValueError, match="repeated_aug must be an integer >= 1"):
        loader(shards, 0)
    with caplog.at_level(logging.WARNING, logger="loopdata"):
        loader(shards, 3, shuffle_buffer=64)  # 64 >= the ~32 distinct samples of the one slot
    assert "repeated_aug=3 with shuffle_buffer=64" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="loopdata"):
        loader(shards, 3)
    assert "repeated_aug" not in caplog.text


def test_presets_use_repeated_aug_3_on_imagenet_and_1_on_cifar_and_the_key_is_checked() -> None:
    for name in list_presets():
        config = load_train_config(name)
        expected = 3 if name.startswith("imagenet") else 1
        assert config.repeated_aug == expected and config.data_options()["repeated_aug"] == expected, name
    options = loopdata.make_options("classification", **load_train_config("imagenet-deit-s").data_options())
    assert options.repeated_aug == 3 and options.randaugment_magnitude == 9
    with pytest.raises(ConfigError, match="repeated_aug must be >= 1"):
        load_train_config("cifar10-vit-ti", ["repeated_aug=0"])
    with pytest.raises(ConfigError, match="repeated_aug=3 needs shuffle_buffer > 1"):
        load_train_config("imagenet-deit-s", ["shuffle_buffer=1"])
    rand = load_train_config("cifar10-vit-ti", ["randaugment_config=rand-m5-mstd0.5-inc1"])
    assert rand.data_options()["randaugment_config"] == "rand-m5-mstd0.5-inc1"


def test_training_with_repeated_augmentation_runs(kodak_labelled, tmp_path: Path) -> None:
    config = load_train_config("cifar10-srvit-ti", [
        "protocol=imagenet", "num_classes=2", "resolution=32", "batch_size=4", "num_workers=0", "progress_bar=false",
        "model=srvit-ti", "model_overrides={depth: 1, embed_dim: 24, num_heads: 2, patch_size: 8, recursion: 2}",
        "lr=1e-3", "warmup_epochs=0", "log_every=1", "max_steps=3", "repeated_aug=3", "shuffle_buffer=4",
        "checkpoint_every=100",
    ])
    trainer = Trainer(config, kodak_labelled, tmp_path / "run")
    assert isinstance(trainer.loader.dataset, RepeatedAugDataset) and trainer.loader.dataset.repeats == 3
    assert trainer.val_loader is None
    result = trainer.run()
    assert result.step == 3 and all(torch.isfinite(torch.tensor(h["loss"])) for h in result.history)
