"""``srvit`` command line: ``srvit train`` and ``srvit eval`` (also ``python -m srvit``, ``torchrun -m srvit``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# Only argparse-level modules here: --help answers before torch or timm is imported.
from looprun.cli_args import (
    HelpFormatter,
    add_device_argument,
    add_speed_arguments,
    non_negative_int,
    positive_int,
    preset_names,
)
from looprun.config import add_override_argument

PRESETS = preset_names(Path(__file__).resolve().parent / "configs")
DEFAULT_STEPS_TEXT = "3,6,12,24,48"  # srvit.evaluate.DEFAULT_STEPS (a test keeps the two equal)


def _add_train(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train", help="train a ViT / bViT / SR-ViT classifier; rerunning the same command resumes",
        description=f"Train a classifier. Presets: {', '.join(PRESETS)}.", formatter_class=HelpFormatter,
    )
    p.add_argument("--config", required=True, help=f"preset name ({', '.join(PRESETS)}) or YAML file")
    p.add_argument("--data", required=True,
                   help="training shards (brace pattern, glob, directory of *.tar, comma list) or an image "
                        "folder with one sub-folder per class")
    p.add_argument("--val-data", default=None, help="validation shards (checked every eval_every steps and at the end)")
    p.add_argument("--out", required=True, help="run directory (config.yaml, checkpoints/, tb/, release/, train.log)")
    p.add_argument("--compile", action="store_true", help="torch.compile the classifier (same as --set compile=true)")
    add_speed_arguments(p, memory_format=False, compile=False)
    add_override_argument(p)


def _train(args: argparse.Namespace) -> int:
    from looprun.training_loop import TrainResult, run_training_command

    from .train_config import load_train_config
    from .trainer import train

    def top1(result: TrainResult) -> str:
        v = result.validation[-1] if result.validation else None
        return "" if v is None else f"; validation top-1 {100 * v['top1']:.2f}% on {v['num_images']} images"

    config = load_train_config(args.config, args.set + (["compile=true"] if args.compile else []))
    return run_training_command("srvit train", train, config, args.data, args.out, args.val_data, top1)


def _steps(text: str) -> tuple[int, ...]:
    try:
        steps = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"--steps needs comma-separated integers, got {text!r}") from None
    if any(n < 1 for n in steps):
        raise argparse.ArgumentTypeError(f"--steps entries must be >= 1, got {text!r}")
    return steps


def _add_eval(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", help="top-1 / top-5, and top-1 vs the number of recursion steps",
                       formatter_class=HelpFormatter)
    p.add_argument("--checkpoint", required=True, help="training run directory or release artifact")
    p.add_argument("--data", required=True, help="labelled WebDataset shards, or an image folder with one sub-folder "
                                                   "per class")
    p.add_argument("--out", required=True, help="output directory (metrics.json, accuracy_vs_steps.png)")
    p.add_argument("--steps", type=_steps, default=_steps(DEFAULT_STEPS_TEXT),
                   help=f"step counts for by_steps (default {DEFAULT_STEPS_TEXT}; '' to skip)")
    p.add_argument("--weights", choices=("ema", "model"), default="ema", help="for run directories")
    p.add_argument("--batch-size", type=positive_int, default=128, help="images per forward pass (per rank)")
    p.add_argument("--num-workers", type=non_negative_int, default=2, help="DataLoader worker processes")
    p.add_argument("--resolution", type=positive_int, default=None, help="default: the model's img_size")
    p.add_argument("--protocol", choices=("imagenet", "cifar"), default=None,
                   help="eval transform (default: the training run's protocol, else imagenet)")
    p.add_argument("--limit", type=positive_int, default=None, help="evaluate at most N images per rank")
    p.add_argument("--skip-corrupt", action="store_true",
                   help="skip undecodable or oversized images (counted in metrics.json) instead of stopping")
    add_device_argument(p)
    p.add_argument("--solver", choices=("euler", "heun", "rk4", "blackbox"), default=None,
                   help="evaluate with this ODE solver instead of the trained one (e.g. a Euler-trained bViT with "
                        "heun)")
    p.add_argument("--step-size", type=float, default=None,
                   help="solver step size h at evaluation (integration time = steps x h; default: the trained h)")
    add_speed_arguments(p, memory_format=False)


def _eval(args: argparse.Namespace) -> int:
    from .evaluate import EvalOptions, evaluate

    options = EvalOptions(
        steps=args.steps, batch_size=args.batch_size, num_workers=args.num_workers, resolution=args.resolution,
        protocol=args.protocol, limit=args.limit, weights=args.weights, device=args.device,
        skip_corrupt=args.skip_corrupt, compile=args.compile, solver=args.solver, step_size=args.step_size,
    )
    try:
        metrics = evaluate(args.checkpoint, args.data, args.out, options)
    finally:
        from looprun.distributed import shutdown_distributed

        shutdown_distributed()
    by_steps = ", ".join(f"{k}: {100 * v:.2f}%" for k, v in metrics["by_steps"].items())
    print(f"{metrics['num_images']} images: top-1 {100 * metrics['top1']:.2f}%, top-5 {100 * metrics['top5']:.2f}%"
          + (f"; top-1 by steps {{{by_steps}}}" if by_steps else "") + f" -> {args.out}/metrics.json")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The ``srvit`` argument parser (all sub-commands)."""
    parser = argparse.ArgumentParser(prog="srvit", description="Recursive ViT classifiers (ViT, bViT, SR-ViT).")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_train(sub)
    _add_eval(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)  # --help and argument errors end here, before torch is imported
    from looprun.cli_errors import run_command
    from looprun.speed import apply_speed_arguments

    def command() -> int:
        apply_speed_arguments(args)
        return {"train": _train, "eval": _eval}[args.command](args)

    return run_command("srvit", args.command, command)


if __name__ == "__main__":
    sys.exit(main())
