"""make_loader: exact distributed evaluation, equal training epochs, determinism, resume, errors."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch

from loopdata import ShardCountError, eval_plan, make_loader


def eval_keys(urls, world_size, num_workers, batch_size=3, **kwargs):
    """Keys yielded by every rank of an evaluation loader, checking each rank against its plan."""
    per_rank = []
    for rank in range(world_size):
        loader = make_loader(
            urls,
            train=False,
            batch_size=batch_size,
            num_workers=num_workers,
            resolution=16,
            rank=rank,
            world_size=world_size,
            **kwargs,
        )
        batches = list(loader)
        keys = [key for batch in batches for key in batch["key"]]
        assert len(batches) == len(loader) == loader.num_batches
        assert len(keys) == loader.num_samples
        per_rank.append(keys)
    return per_rank


@pytest.mark.parametrize(
    ("counts", "world_size", "num_workers"),
    [
        ([7, 3, 5, 6, 4], 2, 2),  # more shards than slots, uneven shards
        ([13, 8], 3, 0),  # 3 ranks over 2 shards, main-process loading
        ([13, 8], 3, 2),  # 3 ranks x 2 workers over 2 shards
        ([5, 0, 4], 2, 2),  # an empty shard in the middle
        ([2, 1], 4, 1),  # more ranks than samples: some ranks get nothing
    ],
)
def test_evaluation_yields_every_sample_exactly_once(make_shards, counts, world_size, num_workers):
    urls = make_shards(counts)
    per_rank = eval_keys(urls, world_size, num_workers)
    all_keys = Counter(key for keys in per_rank for key in keys)
    expected = {f"s{i}_{j:03d}" for i, n in enumerate(counts) for j in range(n)}
    assert set(all_keys) == expected and max(all_keys.values()) == 1
    sizes = [len(keys) for keys in per_rank]
    assert max(sizes) - min(sizes) <= max(num_workers, 1)  # contiguous ranges differ by <= 1 per slot


def test_evaluation_without_info_json_counts_the_tars(make_shards):
    urls = make_shards([6, 5], info=False)
    assert not (Path(urls[0]).parent / "_info.json").exists()
    per_rank = eval_keys(urls, world_size=3, num_workers=1)
    assert sorted(k for keys in per_rank for k in keys) == sorted(
        f"s{i}_{j:03d}" for i, n in enumerate([6, 5]) for j in range(n)
    )


def test_eval_plan_matches_the_loader_for_800_images_on_2_ranks_x_2_workers():
    plan = eval_plan(800, world_size=2, num_workers=2, batch_size=16)
    assert [share.num_samples for share in plan] == [400, 400]
    assert [share.worker_samples for share in plan] == [(200, 200), (200, 200)]
    assert [share.num_batches for share in plan] == [26, 26]  # 2 x ceil(200 / 16)
    uneven = eval_plan(10, world_size=3, num_workers=1, batch_size=4)
    assert [s.num_samples for s in uneven] == [3, 3, 4] and [s.num_batches for s in uneven] == [1, 1, 1]


def test_stale_info_json_is_an_error_not_a_silent_duplicate(make_shards):
    urls = make_shards([6, 5])
    info_path = Path(urls[0]).parent / "_info.json"
    info = json.loads(info_path.read_text())
    info["splits"]["s"]["shard_lengths"] = [7, 5]  # the first shard really holds 6
    info_path.write_text(json.dumps(info))
    with pytest.raises(ShardCountError, match="holds only 6 samples"):
        eval_keys(urls, world_size=1, num_workers=0)
    info["splits"]["s"]["shard_lengths"] = [5, 5]  # both shards really hold more
    info_path.write_text(json.dumps(info))
    with pytest.raises(ShardCountError, match="holds more than the 5 samples"):
        eval_keys(urls, world_size=2, num_workers=2)


def train_batches(urls, rank, world_size, num_workers=2, batch_size=2, seed=0, **kwargs):
    loader = make_loader(
        urls,
        "classification",
        train=True,
        batch_size=batch_size,
        num_workers=num_workers,
        resolution=16,
        rank=rank,
        world_size=world_size,
        seed=seed,
        num_classes=5,
        **kwargs,
    )
    return loader, list(loader)


@pytest.mark.parametrize("resampled", [False, True])
def test_training_gives_every_rank_the_same_number_of_full_batches(make_shards, resampled):
    urls = make_shards([13, 8])  # 21 samples, 2 shards < 3 ranks x 2 workers
    lengths = set()
    for rank in range(3):
        loader, batches = train_batches(urls, rank, 3, resampled=resampled)
        assert len(batches) == len(loader) == 21 // (3 * 2)
        assert all(batch["image"].shape == (2, 3, 16, 16) for batch in batches)
        assert all(batch["label"].shape == (2, 5) for batch in batches)  # Mixup/CutMix soft targets
        lengths.add(len(batches))
    assert lengths == {3}


def test_training_epoch_covers_distinct_samples_across_ranks(make_shards):
    urls = make_shards([8, 8, 8, 8])  # 4 shards: split at shard level for 2 ranks x 2 workers
    keys = []
    for rank in range(2):
        loader = make_loader(
            urls, train=True, batch_size=4, num_workers=2, resolution=16, rank=rank, world_size=2
        )
        keys += [key for batch in loader for key in batch["key"]]
    assert len(keys) == 32 and len(set(keys)) == 32  # floor(32 / 8) = 4 batches per rank, no repeats


def test_same_seed_same_batches_other_seed_or_epoch_differs(make_shards):
    urls = make_shards([9, 7])
    _, first = train_batches(urls, 1, 2, seed=7)
    _, again = train_batches(urls, 1, 2, seed=7)
    _, other_seed = train_batches(urls, 1, 2, seed=8)
    _, next_epoch = train_batches(urls, 1, 2, seed=7, epoch=1)
    for a, b in zip(first, again, strict=True):
        assert a["key"] == b["key"]
        assert torch.equal(a["image"], b["image"]) and torch.equal(a["label"], b["label"])
    flat = [torch.cat([b["image"] for b in run]) for run in (first, other_seed, next_epoch)]
    assert not torch.equal(flat[0], flat[1]) and not torch.equal(flat[0], flat[2])


def test_resume_from_start_batch_reproduces_the_rest_of_the_epoch(make_shards):
    urls = make_shards([20, 17])
    _, full = train_batches(urls, 0, 1, num_workers=2, seed=3, epoch=2)
    assert len(full) == 18
    for start in (1, 5):
        loader = make_loader(
            urls,
            "classification",
            train=True,
            batch_size=2,
            num_workers=2,
            resolution=16,
            seed=3,
            num_classes=5,
            epoch=2,
            start_batch=start,
        )
        assert len(loader) == len(full) - start
        resumed = list(loader)
        assert len(resumed) == len(full) - start
        assert loader.epoch == 3 and len(loader) == len(full)  # the next iteration is a full epoch 3
        for a, b in zip(full[start:], resumed, strict=True):
            assert (
                a["key"] == b["key"]
                and torch.equal(a["image"], b["image"])
                and torch.equal(a["label"], b["label"])
            )


def test_state_dict_round_trip_and_epoch_advance(make_shards):
    urls = make_shards([10])
    loader = make_loader(urls, train=True, batch_size=2, num_workers=0, resolution=16, seed=5)
    assert loader.state_dict() == {"epoch": 0, "batch": 0, "seed": 5, "corrupt": 0, "excluded": 0}
    iterator = iter(loader)
    head = [next(iterator) for _ in range(2)]
    state = loader.state_dict()
    assert state == {"epoch": 0, "batch": 2, "seed": 5, "corrupt": 0, "excluded": 0}
    rest = list(iterator)
    assert loader.epoch == 1 and loader.state_dict()["batch"] == 0
    resumed = make_loader(urls, train=True, batch_size=2, num_workers=0, resolution=16, seed=5)
    resumed.load_state_dict(state)
    assert [b["key"] for b in resumed] == [b["key"] for b in rest]
    assert len(head) + len(rest) == 5
    with pytest.raises(ValueError, match="seed"):
        resumed.load_state_dict({"epoch": 0, "batch": 0, "seed": 6})


def test_rank_and_world_size_default_to_the_environment(make_shards, monkeypatch):
    urls = make_shards([6])
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    loader = make_loader(urls, train=False, batch_size=4, num_workers=0, resolution=16)
    assert (loader.dataset.rank, loader.dataset.world_size) == (1, 3)
    assert [k for b in loader for k in b["key"]] == ["s0_002", "s0_003"]


def test_configurations_that_cannot_work_raise_clear_errors(make_shards, tmp_path):
    urls = make_shards([5])
    with pytest.raises(ValueError, match="fewer than world_size"):
        make_loader(urls, train=True, batch_size=4, num_workers=0, rank=0, world_size=2)
    with pytest.raises(ValueError, match="rank must be"):
        make_loader(urls, train=False, batch_size=4, num_workers=0, rank=2, world_size=2)
    with pytest.raises(ValueError, match="unknown task"):
        make_loader(urls, task="segmentation")
    with pytest.raises(TypeError, match="valid options"):
        make_loader(urls, task="reconstruction", mixup_alpha=0.2)
    with pytest.raises(ValueError, match="shard not found"):
        make_loader(str(tmp_path / "missing-000000.tar"))
    with pytest.raises(ValueError, match="start_batch"):
        make_loader(urls, train=True, batch_size=1, num_workers=0, start_batch=6)


def test_label_outside_num_classes_names_the_sample(make_shards):
    urls = make_shards([6])  # labels 0..4
    loader = make_loader(
        urls, "classification", train=False, batch_size=2, num_workers=0, resolution=16, num_classes=3
    )
    with pytest.raises(ValueError, match=r"'s0_003' has label 3, outside \[0, num_classes=3\)"):
        list(loader)


def test_imagenet_sample_evaluation_2_ranks_x_2_workers_each_key_once(imagenet_urls):
    keys = Counter()
    for rank in range(2):
        loader = make_loader(
            imagenet_urls, train=False, batch_size=50, num_workers=2, resolution=16, rank=rank, world_size=2
        )
        rank_keys = [key for batch in loader for key in batch["key"]]
        assert len(rank_keys) == loader.num_samples == 400
        keys.update(rank_keys)
    assert len(keys) == 800 and set(keys.values()) == {1}


def test_imagenet_sample_evaluation_3_ranks_over_2_shards(imagenet_urls):
    keys = Counter()
    for rank in range(3):
        loader = make_loader(
            imagenet_urls,
            "classification",
            train=False,
            batch_size=64,
            num_workers=1,
            resolution=16,
            rank=rank,
            world_size=3,
        )
        for batch in loader:
            keys.update(batch["key"])
            assert batch["label"].dtype == torch.int64
    assert len(keys) == 800 and set(keys.values()) == {1}


def test_imagenet_sample_training_steps_equal_across_ranks(imagenet_urls):
    lengths = []
    for rank in range(3):
        loader = make_loader(
            imagenet_urls,
            train=True,
            batch_size=64,
            num_workers=2,
            resolution=16,
            rank=rank,
            world_size=3,
            shuffle_buffer=100,
        )
        lengths.append(sum(1 for _ in loader))
    assert lengths == [800 // (3 * 64)] * 3


def test_iterating_leaves_the_callers_rng_untouched(make_shards):
    urls = make_shards([8])
    loader = make_loader(
        urls, "classification", train=True, batch_size=2, num_workers=0, resolution=16, num_classes=5
    )
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    assert len(list(loader)) == 4
    assert torch.equal(torch.rand(3), expected)
