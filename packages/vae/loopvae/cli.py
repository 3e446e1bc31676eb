"""``loopvae`` command line: ``loopvae train ...`` (also ``python -m loopvae`` / ``torchrun -m loopvae``)."""

from __future__ import annotations

import argparse
import sys

from loopcore.config import ConfigError


def _add_train(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train", help="train a LoopVAE (stage 1 or 2); rerunning the same command resumes",
        description="Train a LoopVAE. Presets: paper-stage1, paper-stage2, tiny-stage1, tiny-stage2.",
    )
    p.add_argument("--config", required=True, help="preset name or YAML file")
    p.add_argument("--data", required=True, help="WebDataset shards: brace pattern, glob, or comma-separated paths")
    p.add_argument("--out", required=True, help="run directory (checkpoints, tb/, release/, train.log)")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="override config keys")


def _train(args: argparse.Namespace) -> int:
    from .train_config import load_train_config
    from .trainer import NonFiniteLossError, train

    config = load_train_config(args.config, args.set)
    try:
        result = train(config, args.data, args.out)
    except NonFiniteLossError as err:
        print(f"loopvae train: {err}", file=sys.stderr)
        return 3
    finally:
        from loopcore.distributed import shutdown_distributed

        shutdown_distributed()
    if result.stopped_by:
        print(f"stopped at step {result.step} ({result.stopped_by}); rerun the same command to resume")
    else:
        print(f"finished at step {result.step}; release artifact: {result.release_dir}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="loopvae", description="LoopVAE tokenizers: train, evaluate, intervene, profile."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _add_train(sub)
    args = parser.parse_args(argv)
    try:
        if args.command == "train":
            return _train(args)
    except (ConfigError, FileNotFoundError, ValueError) as err:
        print(f"loopvae {args.command}: error: {err}", file=sys.stderr)
        return 2
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
