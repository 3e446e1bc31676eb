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


def test_yaml_that_does_not_parse_is_one_line_naming_the_file_or_pair(tmp_path, capsys) -> None:
    from looprun.config import load_yaml
    from loopvae.cli import main as loopvae_main
    from srvit.cli import main as srvit_main

    with pytest.raises(ConfigError, match=r"--set betas=\[0\.9,: the value is not valid YAML \(line 1, column \d+: "):
        parse_overrides(["betas=[0.9,"])
    bad = tmp_path / "bad.yaml"
    bad.write_text("lr: 1\nmodel: [unclosed\n")
    with pytest.raises(ConfigError, match=rf"config file {bad} is not valid YAML: line 3, column 1: "):
        load_yaml(bad)
    tagged = tmp_path / "tag.yaml"
    tagged.write_text('lr: !!python/object/apply:os.system ["true"]\n')
    with pytest.raises(ConfigError, match=rf"config file {tagged}: line 1, column 5: .*tags that build Python "
                                          "objects are refused"):
        load_yaml(tagged)
    for main, argv in ((loopvae_main, ["train", "--config", str(bad)]), (srvit_main, ["train", "--config", str(bad)]),
                       (loopvae_main, ["train", "--config", "tiny-stage1", "--set", "betas=[0.9,"])):
        capsys.readouterr()
        assert main([*argv, "--data", "d.tar", "--out", str(tmp_path / "out")]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err and "line " in err, err
    assert not (tmp_path / "out").exists()
