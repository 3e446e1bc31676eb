"""Shard listing (expand_urls), _info.json counts and the distributed arithmetic."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loopdata import expand_urls, shard_counts
from loopdata.distributed import (
    derive_seed,
    eval_plan,
    resolve_rank,
    slot_range,
    split_evenly,
    train_steps_per_epoch,
    worker_role,
)
from loopdata.shards import count_samples, read_info


@pytest.fixture
def four_shards(make_shards):
    return make_shards([3, 2, 4, 1], prefix="d")


def test_expand_urls_braces_globs_lists_and_directories(four_shards):
    directory = Path(four_shards[0]).parent
    assert expand_urls(str(directory / "d{0..3}-000000.tar")) == four_shards
    assert expand_urls(str(directory / "d*-000000.tar")) == four_shards
    assert expand_urls(str(directory)) == four_shards
    assert expand_urls(f"{four_shards[2]},{four_shards[0]} {four_shards[1]}") == [
        four_shards[i] for i in (2, 0, 1)
    ]
    assert expand_urls([Path(four_shards[3]), four_shards[1]]) == [four_shards[3], four_shards[1]]
    # Commas inside braces are alternatives, not separators.
    assert expand_urls(str(directory / "d{1,3}-000000.tar")) == [four_shards[1], four_shards[3]]
    assert expand_urls("pipe:cat x.tar") == ["pipe:cat x.tar"]


def test_paths_with_spaces_and_commas_are_readable_quoted_as_paths_or_whole(four_shards, tmp_path):
    import shutil

    odd = tmp_path / "my data, 2026"
    odd.mkdir()
    first = odd / "shard one,a.tar"
    second = odd / "shard two.tar"
    shutil.copy(four_shards[0], first)
    shutil.copy(four_shards[1], second)
    assert expand_urls(f'"{first}", "{second}"') == [str(first), str(second)]  # quoted
    assert expand_urls(f"'{first}' {four_shards[2]}") == [str(first), four_shards[2]]
    assert expand_urls([first, second]) == [str(first), str(second)]  # Path items are never split
    assert expand_urls(str(first)) == [str(first)]  # an existing path is taken whole
    assert expand_urls(str(odd)) == [str(first), str(second)]  # a folder with a comma in its name
    assert shard_counts(expand_urls(f'"{first}"')) == [3]
    with pytest.raises(ValueError, match="unbalanced"):
        expand_urls(f'"{first}')


def test_expand_urls_errors(four_shards, tmp_path):
    with pytest.raises(ValueError, match="matched no files"):
        expand_urls(str(tmp_path / "nothing-*.tar"))
    with pytest.raises(ValueError, match="shard not found"):
        expand_urls(str(tmp_path / "d9-000000.tar"))
    with pytest.raises(ValueError, match="listed twice"):
        expand_urls([four_shards[0], four_shards[0]])
    with pytest.raises(ValueError, match="no shards"):
        expand_urls("")


def test_counts_from_info_json_and_by_counting(four_shards):
    info = read_info(Path(four_shards[0]).parent)
    assert info["splits"]["d"]["shard_lengths"] == [3, 2, 4, 1]
    assert shard_counts(four_shards) == [3, 2, 4, 1]
    assert [count_samples(u) for u in four_shards] == [3, 2, 4, 1]
    (Path(four_shards[0]).parent / "_info.json").unlink()
    assert shard_counts(four_shards) == [3, 2, 4, 1]


def test_malformed_info_json_is_reported_with_its_path(four_shards):
    path = Path(four_shards[0]).parent / "_info.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match="_info.json: invalid JSON"):
        shard_counts(four_shards)
    path.write_text(json.dumps({"splits": {"d": {"filenames": ["a.tar", "b.tar"], "shard_lengths": [1]}}}))
    with pytest.raises(ValueError, match="2 filenames but 1 shard_lengths"):
        shard_counts(four_shards)


@pytest.mark.parametrize(
    ("total", "world", "workers"), [(800, 2, 2), (21, 3, 2), (2, 4, 1), (0, 2, 3), (17, 1, 0)]
)
def test_eval_slots_partition_the_samples(total, world, workers):
    slots = world * max(workers, 1)
    ranges = [slot_range(total, slots, s) for s in range(slots)]
    assert ranges[0][0] == 0 and ranges[-1][1] == total
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    plan = eval_plan(total, world, workers, batch_size=4)
    assert sum(share.num_samples for share in plan) == total


def test_training_arithmetic():
    assert train_steps_per_epoch(800, 3, 64) == 4  # floor: never more samples than the split
    with pytest.raises(ValueError, match="fewer than world_size"):
        train_steps_per_epoch(10, 2, 8)
    assert [split_evenly(7, 3, i) for i in range(3)] == [3, 2, 2]
    # Resuming at batch 5 of 3 workers: DataLoader worker 0 plays the role that produced batch 5.
    assert [worker_role(w, 3, 5) for w in range(3)] == [2, 0, 1]


def test_derive_seed_is_stable_and_separates_nearby_tuples():
    assert derive_seed(0, 1, 2) == derive_seed(0, 1, 2)
    seeds = {derive_seed(0, epoch, rank) for epoch in range(5) for rank in range(5)}
    assert len(seeds) == 25 and all(0 <= s < 2**63 for s in seeds)


def test_resolve_rank(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert resolve_rank(None, None) == (0, 1)
    assert resolve_rank(2, 4) == (2, 4)
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "8")
    assert resolve_rank(None, None) == (3, 8)
    with pytest.raises(ValueError, match="world_size must be"):
        resolve_rank(0, 0)
    with pytest.raises(ValueError, match="rank must be"):
        resolve_rank(4, 4)


def test_a_quote_inside_a_name_is_a_character(four_shards, tmp_path):
    import shutil

    folder = tmp_path / "O'Brien"
    folder.mkdir()
    shutil.copy(four_shards[0], folder / "a.tar")
    assert expand_urls(str(folder / "*.tar")) == [str(folder / "a.tar")]
    assert expand_urls(f"{folder / 'a.tar'},{four_shards[1]}") == [str(folder / "a.tar"), four_shards[1]]
