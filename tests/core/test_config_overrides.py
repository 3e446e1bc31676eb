"""``--set`` overrides: repeatable in both CLIs, dotted keys merge into mapping fields."""

import dataclasses
from typing import Any

import pytest

from looprun.config import ConfigError, apply_updates, parse_overrides
from loopvae.cli import build_parser as loopvae_parser
from srvit.cli import build_parser as srvit_parser


@dataclasses.dataclass
class Schema:
    lr: float = 1e-3
    steps: int = 10
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@pytest.mark.parametrize("parser,argv", [
    (loopvae_parser, ["train", "--config", "tiny-stage1", "--data", "d", "--out", "o"]),
    (loopvae_parser, ["demo"]),
    (srvit_parser, ["train", "--config", "cifar10-vit-ti", "--data", "d", "--out", "o"]),
])
@pytest.mark.parametrize("sets", [
    ["--set", "lr=0.5", "--set", "max_steps=3"],
    ["--set", "lr=0.5", "max_steps=3"],
    ["--set", "lr=0.5", "--set", "max_steps=3", "--set"],  # a trailing bare --set is an argparse error
])
def test_every_set_group_is_kept(parser, argv: list[str], sets: list[str]) -> None:
    if sets[-1] == "--set":
        with pytest.raises(SystemExit):
            parser().parse_args([*argv, *sets])
        return
    assert parser().parse_args([*argv, *sets]).set == ["lr=0.5", "max_steps=3"]


def test_both_overrides_reach_the_loopvae_and_srvit_configs() -> None:
    from loopvae.train_config import load_train_config as vae_config
    from srvit.train_config import load_train_config as cls_config

    args = loopvae_parser().parse_args(["train", "--config", "tiny-stage1", "--data", "d", "--out", "o",
                                        "--set", "lr=0.5", "--set", "max_steps=3"])
    config = vae_config(args.config, args.set)
    assert (config.lr, config.max_steps) == (0.5, 3)
    args = srvit_parser().parse_args(["train", "--config", "cifar10-srvit-ti", "--data", "d", "--out", "o",
                                      "--set", "lr=0.5", "--set", "model_overrides.patch_size=4"])
    config = cls_config(args.config, args.set)
    # the dotted key changes one entry; the preset's other entries stay
    assert config.lr == 0.5
    assert config.model_overrides == {"patch_size": 4, "recursion": 4, "fusion_mode": "query"}


def test_dotted_keys_merge_nest_and_apply_in_order() -> None:
    base = Schema(extra={"a": 1, "nested": {"x": 1, "y": 2}})
    updated = apply_updates(base, parse_overrides(["extra.b=2", "extra.nested.y=5", "extra.nested.z=[1, 2]"]), "t")
    assert updated.extra == {"a": 1, "b": 2, "nested": {"x": 1, "y": 5, "z": [1, 2]}}
    assert base.extra == {"a": 1, "nested": {"x": 1, "y": 2}}  # the original is not mutated
    # a plain key replaces the whole mapping; later overrides win, in command-line order
    assert apply_updates(base, parse_overrides(["extra.b=2", "extra={c: 3}"]), "t").extra == {"c": 3}
    assert apply_updates(base, parse_overrides(["extra={c: 3}", "extra.b=2"]), "t").extra == {"c": 3, "b": 2}
    assert apply_updates(base, parse_overrides(["lr=1", "steps=2", "lr=3"]), "t").lr == 3.0


@pytest.mark.parametrize("pairs,match", [
    (["lr.x=1"], "'lr' is not a mapping"),
    (["nope.x=1"], "unknown config key 'nope'"),
    (["extra.=1"], "empty part"),
    (["extra.a.b=1"], "'a' holds 1, not a mapping"),
])
def test_bad_dotted_keys_name_the_key(pairs: list[str], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        apply_updates(Schema(extra={"a": 1}), parse_overrides(pairs), "--set")
