"""``loopvae`` command line: ``loopvae train ...`` (also ``python -m loopvae`` / ``torchrun -m loopvae``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# Only argparse-level modules here: the argument tree builds (and --help answers) before torch, diffusers or the
# data pipelines are imported; each sub-command imports what it runs.
from looprun.cli_args import (
    MEMORY_FORMAT_NAMES,
    HelpFormatter,
    add_device_argument,
    add_speed_arguments,
    non_negative_int,
    positive_int,
    preset_names,
)
from looprun.config import add_override_argument

PRESETS = preset_names(Path(__file__).resolve().parent / "configs")
RESOLUTION_HELP = "images: shorter side resized to this, then centre-cropped to a square of this side"

DATA_HELP = ("WebDataset shards (brace pattern, glob, directory of *.tar, comma-separated list; quote a path that "
             "holds spaces or commas) or a folder of image files (read recursively, sorted)")


def _device(choice: str) -> str:
    """``--device`` for the single-process commands: ``auto`` is CUDA when available, else the CPU."""
    from looprun.distributed import resolve_device

    return str(resolve_device(choice))


def _add_preprocess(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preprocess", choices=("resize-crop", "adm"), default="resize-crop",
                   help="how an image becomes its resolution² input: resize-crop (shorter side, antialiased bicubic, "
                        "centre crop; the default) or adm (ADM's center_crop_arr: box-halving, PIL bicubic, centre "
                        "crop; the protocol DiT/SiT/REPA/MAR/LightningDiT numbers use)")


def _add_weights_and_dtype(p: argparse.ArgumentParser) -> None:
    p.add_argument("--weights", choices=("ema", "model"), default="ema",
                   help="for training run directories: EMA (default) or raw training weights")
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32",
                   help="the tokenizer's compute dtype (metrics are computed in float64 either way)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _add_train(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train", help="train a LoopVAE (stage 1 or 2); rerunning the same command resumes",
        description=f"Train a LoopVAE. Presets: {', '.join(PRESETS)} (keys: docs/training.md).",
        formatter_class=HelpFormatter,
    )
    p.add_argument("--config", required=True, help=f"preset name ({', '.join(PRESETS)}) or YAML file")
    p.add_argument("--data", required=True, help=DATA_HELP)
    p.add_argument("--out", required=True, help="run directory (checkpoints, tb/, release/, train.log)")
    p.add_argument("--val-data", default=None,
                   help="held-out shards or image folder: PSNR of the EMA weights every eval_every steps and at the "
                        "end, in validation.json and TensorBoard val/psnr")
    p.add_argument("--compile", action="store_true", help="torch.compile the tokenizer (same as --set compile=true)")
    p.add_argument("--memory-format", choices=MEMORY_FORMAT_NAMES, default=None,
                   help="torch memory format of the activations (same as --set memory_format=...; default: the "
                        "config's, channels_last)")
    add_speed_arguments(p, memory_format=False, compile=False)
    add_override_argument(p)


def _train(args: argparse.Namespace) -> int:
    from looprun.training_loop import run_training_command

    from .train_config import load_train_config
    from .trainer import train

    flags = (["compile=true"] if args.compile else []) + (
        [f"memory_format={args.memory_format}"] if args.memory_format else [])
    config = load_train_config(args.config, args.set + flags)
    return run_training_command("loopvae train", train, config, args.data, args.out, args.val_data)


def _add_eval(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", formatter_class=HelpFormatter,
                       help="rFID / PSNR / SSIM / LPIPS of a tokenizer on WebDataset shards or an image folder")
    p.add_argument("--checkpoint", required=True,
                   help="release artifact, training run directory or diffusers VAE folder")
    p.add_argument("--data", required=True, help=DATA_HELP)
    p.add_argument("--out", required=True, help="output directory (metrics.json, report.md, eval.log, ...)")
    p.add_argument("--resolution", type=positive_int, default=256, help=RESOLUTION_HELP)
    p.add_argument("--limit", type=positive_int, default=None, help="evaluate at most N images (in total over ranks)")
    p.add_argument("--batch-size", type=positive_int, default=8, help="images per forward pass (per rank)")
    p.add_argument("--num-workers", type=non_negative_int, default=2, help="DataLoader worker processes")
    p.add_argument("--skip-corrupt", action="store_true",
                   help="skip undecodable or oversized images (counted in metrics.json as skipped_corrupt) "
                        "instead of stopping at the first one")
    _add_preprocess(p)
    p.add_argument("--save-npz", action="store_true",
                   help="also write the uint8 reconstructions and references as .npz batches in the ADM evaluator's "
                        "layout (OUT/npz/reconstructions.npz, references.npz: arr_0 of shape (N, H, W, 3))")
    p.add_argument("--fid-weights", default=None, help="torch-fidelity Inception weights (default: torch hub cache)")
    p.add_argument("--require-fid", action="store_true", help="fail instead of reporting rfid: null")
    p.add_argument("--lpips-net", choices=("vgg", "alex", "none"), default="alex",
                   help="LPIPS backbone ('none' skips LPIPS; default alex, the usual evaluation net)")
    p.add_argument("--lpips-weights", default=None, help="torchvision backbone file for LPIPS (default: hub cache)")
    p.add_argument("--require-lpips", action="store_true",
                   help="fail instead of reporting lpips: null when the LPIPS backbone weights are missing")
    p.add_argument("--lpips-random-backbone", action="store_true",
                   help="plumbing only: random LPIPS backbone (the number is then not LPIPS)")
    p.add_argument("--save-images", action="store_true", help="write the uint8 reconstructions and references as PNG")
    add_device_argument(p)
    _add_weights_and_dtype(p)
    add_speed_arguments(p)


def _eval(args: argparse.Namespace) -> int:
    from .evaluate import EvalOptions, evaluate

    options = EvalOptions(
        resolution=args.resolution, limit=args.limit, batch_size=args.batch_size, num_workers=args.num_workers,
        fid_weights=args.fid_weights, require_fid=args.require_fid, lpips_net=args.lpips_net,
        lpips_weights=args.lpips_weights, lpips_random_backbone=args.lpips_random_backbone,
        require_lpips=args.require_lpips, save_images=args.save_images, device=args.device,
        skip_corrupt=args.skip_corrupt, weights=args.weights, dtype=args.dtype, progress=not args.no_progress,
        memory_format=args.memory_format, compile=args.compile, preprocess=args.preprocess, save_npz=args.save_npz,
    )
    from looprun.distributed import shutdown_distributed

    try:
        metrics = evaluate(args.checkpoint, args.data, args.out, options)
    finally:  # destroy the process group before exit: an undestroyed gloo group can abort a rank at exit
        shutdown_distributed()
    rfid = "n/a" if metrics["rfid"] is None else f"{metrics['rfid']:.3f}"
    lpips = "n/a" if metrics["lpips"] is None else f"{metrics['lpips']:.4f}"
    print(f"{metrics['num_images']} images: PSNR {metrics['psnr']:.2f} dB, SSIM {metrics['ssim']:.4f}, "
          f"LPIPS {lpips}, rFID {rfid} -> {args.out}/metrics.json")
    return 0


def _add_intervene(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("intervene", formatter_class=HelpFormatter,
                       help="prefix truncation, single-pass bypass and relative updates per stage")
    p.add_argument("--checkpoint", required=True, help="release artifact or training run directory of a LoopVAE")
    p.add_argument("--data", required=True, help=DATA_HELP)
    p.add_argument("--out", required=True, help="output directory (interventions.json/.md, plots, intervene.log)")
    p.add_argument("--limit", type=positive_int, default=16, help="number of images (the paper uses 16)")
    p.add_argument("--resolution", type=positive_int, default=256, help=RESOLUTION_HELP)
    add_device_argument(p)
    _add_weights_and_dtype(p)
    add_speed_arguments(p, compile=False)


def _intervene(args: argparse.Namespace) -> int:
    from .intervene import intervene

    result = intervene(args.checkpoint, args.data, args.out, args.limit, args.resolution, _device(args.device),
                       weights=args.weights, dtype=args.dtype, progress=not args.no_progress,
                       memory_format=args.memory_format)
    print(f"{result['num_images']} images, {len(result['stages'])} stages -> {args.out}/interventions.md")
    return 0


def _add_latent_stats(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "latent-stats", formatter_class=HelpFormatter,
        help="estimate shift_factor / scaling_factor of the latents and write them into config.json",
        description="Estimate the latent normalisation diffusion models train with, (z - shift_factor) * "
                    "scaling_factor with unit variance (SD3 / FLUX convention), over images of --data, and write "
                    "it into the artifact's config.json (plus latent_stats.json beside it).",
    )
    p.add_argument("--checkpoint", required=True,
                   help="release artifact, diffusers VAE folder, or training run directory (its release/)")
    p.add_argument("--data", required=True, help=DATA_HELP)
    p.add_argument("--resolution", type=positive_int, default=256, help=RESOLUTION_HELP)
    p.add_argument("--limit", type=positive_int, default=None, help="use at most N images (default: all)")
    p.add_argument("--batch-size", type=positive_int, default=8, help="images per forward pass (per rank)")
    p.add_argument("--num-workers", type=non_negative_int, default=2, help="DataLoader worker processes")
    p.add_argument("--posterior", choices=("sample", "mode"), default="sample",
                   help="posterior samples (default; what diffusion training encodes) or posterior means")
    p.add_argument("--seed", type=int, default=0, help="seed of the posterior samples")
    add_device_argument(p)
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32", help="the tokenizer's compute dtype")
    _add_preprocess(p)
    p.add_argument("--dry-run", action="store_true", help="print the estimate without writing config.json")
    p.add_argument("--per-channel", action="store_true",
                   help="also write per-channel latents_mean / latents_std (LoopVAE configs; scaling_factor becomes 1)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_speed_arguments(p, memory_format=False, compile=False)


def _latent_stats(args: argparse.Namespace) -> int:
    from .latent_stats import latent_stats

    stats, written = latent_stats(
        args.checkpoint, args.data, args.resolution, args.limit, args.batch_size, args.num_workers, args.posterior,
        args.seed, _device(args.device), args.dtype, write=not args.dry_run, progress=not args.no_progress,
        per_channel=args.per_channel, preprocess=args.preprocess,
    )
    where = f" -> {written}" if written else " (dry run: nothing written)"
    print(f"{stats.num_images} images: shift_factor {stats.shift_factor:.6f}, scaling_factor "
          f"{stats.scaling_factor:.6f}{where}")
    return 0


def _add_profile(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("profile", formatter_class=HelpFormatter,
                       help="params, MACs, latency and peak memory of registered models")
    p.add_argument("--models", default="", help="comma-separated registry names (optional with --quality)")
    p.add_argument("--quality", default=None,
                   help="a study's results.json (make study-schedule: docs/study_schedule/results.json): profile "
                        "its trained variants too and put their measured PSNR/SSIM next to params, MACs and time")
    add_device_argument(p)
    p.add_argument("--batch", type=positive_int, default=1, help="images per timed forward pass")
    p.add_argument("--resolution", type=positive_int, default=256, help=RESOLUTION_HELP)
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32", help="compute dtype of the profiled models")
    p.add_argument("--warmup", type=non_negative_int, default=2, help="untimed passes first")
    p.add_argument("--iters", type=positive_int, default=5, help="timed passes (median reported)")
    p.add_argument("--macs-only", action="store_true", help="only count parameters and MACs (no timing)")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--plain-blocks", action="store_true",
                   help="time the cores' blocks with the plain adaLN-Zero formula instead of the fused one")
    p.add_argument("--breakdown", action="store_true",
                   help="CPU: time by op class (convolutions, norms, elementwise, attention, optimizer, ...) with "
                        "MACs, bytes moved and a roofline from this machine's measured peaks, for a reconstruction "
                        "and a training step of each --models entry -> breakdown.json, breakdown.png, profile.md")
    p.add_argument("--train-batch", type=positive_int, default=8, help="--breakdown: crops per training step")
    p.add_argument("--train-resolution", type=positive_int, default=64, help="--breakdown: training crop side")
    add_speed_arguments(p)


def _profile(args: argparse.Namespace) -> int:
    from .profile import profile
    from .registry import list_models

    models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in models if m not in list_models()]
    if unknown:
        raise ValueError(f"unknown model(s) {unknown}; available: {', '.join(list_models())}")
    if not models and args.quality is None:
        raise ValueError("loopvae profile needs --models NAME[,NAME...] or --quality RESULTS.json")
    # --breakdown times on the CPU: auto means the CPU there, and an explicit cuda is refused by profile() itself
    device = "cpu" if args.breakdown and args.device == "auto" else args.device
    device = _device(device).split(":")[0] if device == "auto" else device
    profile(models, args.out, quality=args.quality, device=device, batch=args.batch,
            resolution=args.resolution, dtype=args.dtype,
            warmup=args.warmup, iters=args.iters, macs_only=args.macs_only, memory_format=args.memory_format,
            compile=args.compile, plain_blocks=args.plain_blocks, breakdown=args.breakdown,
            train_batch=args.train_batch, train_resolution=args.train_resolution)
    print((__import__("pathlib").Path(args.out) / "profile.md").read_text())
    return 0


def _add_demo(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", formatter_class=HelpFormatter,
                       help="a short training run, then evaluate, intervene and profile the bundled trained tiny "
                            "model on the bundled images")
    p.add_argument("--out", default="runs/demo", help="output directory (report.md and every step's outputs)")
    p.add_argument("--train-steps", type=int, default=None,
                   help="steps of the demo's own tiny-stage1 run (default 200; the bundled model is trained already)")
    add_override_argument(p, "override tiny-stage1 config keys")
    add_speed_arguments(p, memory_format=False, compile=False)


def _demo(args: argparse.Namespace) -> int:
    from .demo import DEMO_TRAIN_STEPS, run_demo

    steps = DEMO_TRAIN_STEPS if args.train_steps is None else args.train_steps
    if steps < 1:
        raise ValueError(f"--train-steps must be >= 1, got {steps}")
    report = run_demo(args.out, args.set, train_steps=steps)
    print(f"demo report: {report}")
    return 0


def _add_encode(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("encode", formatter_class=HelpFormatter,
                       help="latents of every image as WebDataset shards (for latent-diffusion training)")
    p.add_argument("--checkpoint", required=True,
                   help="release artifact, diffusers folder or training run directory of a tokenizer")
    p.add_argument("--data", required=True, help=DATA_HELP)
    p.add_argument("--out", required=True,
                   help="output directory: latents-NNNNNN.tar (one per input shard) + latents.json; a rerun resumes")
    p.add_argument("--resolution", type=positive_int, default=256, help=RESOLUTION_HELP)
    p.add_argument("--batch-size", type=positive_int, default=16, help="images per forward pass (per rank)")
    p.add_argument("--sample", action="store_true",
                   help="store one posterior sample per image (seeded by its key) instead of the posterior mean")
    _add_preprocess(p)
    p.add_argument("--moments", action="store_true",
                   help="store the posterior mean and log-variance (2C channels) instead of one latent; the latent "
                        "reader draws a new sample per epoch and key (the MAR / REPA cache)")
    p.add_argument("--flip", action="store_true", help="also store the horizontally flipped image's latent")
    p.add_argument("--latent-dtype", choices=("float32", "float16"), default="float32",
                   help="dtype of the stored latents")
    p.add_argument("--skip-corrupt", action="store_true",
                   help="skip undecodable images (listed in latents.json) instead of failing")
    p.add_argument("--weights", choices=("ema", "model"), default="ema",
                   help="for a training run directory: EMA (default) or raw weights")
    add_device_argument(p)


def _early_lock(out: str, what: str):  # noqa: ANN202 (looprun.run_lock.RunLock; imported lazily)
    """Lock an existing ``--out`` (rank 0 only) before the heavy imports: a second run into a busy folder is
    refused while the first is still working, not after its own start-up (which takes seconds)."""
    import os

    from looprun.run_lock import RunLock

    if os.environ.get("RANK", "0") != "0" or not Path(out).is_dir():
        return None
    from looprun.run_lock import RunLockedError

    try:
        return RunLock(out, what)
    except RunLockedError:
        raise
    except OSError:  # a read-only or unwritable --out: the command's own output check reports it in one line
        return None


def _encode(args: argparse.Namespace) -> int:
    from looprun.distributed import shutdown_distributed

    from .encode_latents import EncodeOptions, encode_dataset

    try:
        meta = encode_dataset(args.checkpoint, args.data, args.out, EncodeOptions(
            resolution=args.resolution, batch_size=args.batch_size, sample=args.sample, flip=args.flip,
            dtype=args.latent_dtype, weights=args.weights, device=args.device, skip_corrupt=args.skip_corrupt,
            preprocess=args.preprocess, moments=args.moments), held_lock=args.held_lock)
    finally:  # as in _eval: destroy the process group before the interpreter exits
        if args.held_lock is not None:
            args.held_lock.release()
        shutdown_distributed()
    print(f"{meta['num_samples']} latents {meta['latent_shape']} in {len(meta['shards'])} shard(s) -> {args.out} "
          f"(skipped {len(meta['skipped'])})")
    return 0


def _add_compare(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "compare", formatter_class=HelpFormatter,
        help="tokenizers compared on the same images with the seed as the unit (arms of checkpoints)",
        description="Evaluate every checkpoint of every arm on the same images (loopvae eval's protocol) and compare "
                    "the arms seed by seed: paired t where the arms share what a seed fixes, Welch t otherwise, "
                    "Holm-corrected; per-image differences are reported as descriptive only. Writes compare.json, "
                    "compare.md and compare.png (PSNR against GMACs) to --out.")
    p.add_argument("--arm", action="append", required=True, metavar="NAME=PATH[,PATH...]",
                   help="one arm: a name and its checkpoints (the seeds: release folders, run folders or diffusers "
                        "AutoencoderKL / AutoencoderDC folders); repeat for each arm")
    p.add_argument("--data", required=True, help=DATA_HELP)
    p.add_argument("--out", required=True, help="output directory (compare.json, compare.md, compare.png, evals/)")
    p.add_argument("--resolution", type=positive_int, default=256, help=RESOLUTION_HELP)
    p.add_argument("--limit", type=positive_int, default=None, help="evaluate at most N images")
    p.add_argument("--compare", action="append", default=None, metavar="A:B",
                   help="a comparison A - B of the pre-registered family (repeat; default: every pair of arms in "
                        "the order given); the Holm correction runs over exactly these")
    p.add_argument("--pairing", choices=("auto", "paired", "welch"), default="auto",
                   help="auto: paired by seed when both arms' checkpoints record the same seed, data, crop and batch "
                        "(same crops in the same order), else Welch")
    _add_preprocess(p)
    p.add_argument("--lpips-net", choices=("vgg", "alex", "none"), default="none",
                   help="add LPIPS per image (needs its backbone weights; see README)")
    p.add_argument("--lpips-weights", default=None,
                   help="torchvision backbone file for LPIPS (default: the torch hub cache)")
    p.add_argument("--fid-weights", default=None, help="torch-fidelity Inception weights (rFID per checkpoint)")
    p.add_argument("--batch-size", type=positive_int, default=8, help="images per forward pass (per rank)")
    p.add_argument("--num-workers", type=non_negative_int, default=2, help="DataLoader worker processes")
    p.add_argument("--skip-corrupt", action="store_true",
                   help="skip undecodable or oversized images instead of stopping at the first one")
    add_device_argument(p)
    _add_weights_and_dtype(p)


def _compare(args: argparse.Namespace) -> int:
    from .compare import CompareOptions, compare, parse_arm, parse_pair

    arms: dict[str, list[str]] = {}
    for spec in args.arm:
        name, paths = parse_arm(spec)
        if name in arms:
            raise ValueError(f"--arm {spec!r}: the arm name {name!r} is given twice")
        arms[name] = paths
    pairs = None if args.compare is None else [parse_pair(s) for s in args.compare]
    if args.dtype != "fp32":
        raise ValueError("loopvae compare measures in fp32 (one protocol for every arm); drop --dtype")
    options = CompareOptions(
        resolution=args.resolution, limit=args.limit, batch_size=args.batch_size, num_workers=args.num_workers,
        lpips_net=args.lpips_net, lpips_weights=args.lpips_weights, fid_weights=args.fid_weights, device=args.device,
        pairing=args.pairing, pairs=pairs, progress=not args.no_progress, weights=args.weights,
        skip_corrupt=args.skip_corrupt, preprocess=args.preprocess)
    result = compare(arms, args.data, args.out, options)
    for arm in result["arms"]:
        print(f"{arm['name']}: {len(arm['checkpoints'])} seed(s), PSNR {arm['psnr']:.2f} dB, SSIM {arm['ssim']:.4f}, "
              f"{arm['params']:,} params, {arm['gmacs']:.2f} GMACs")
    print(f"bicubic: PSNR {result['bicubic']['psnr']:.2f} dB")
    for c in result["comparisons"]:
        print(f"{c['a']} - {c['b']} ({c['metric']}, {c['test']}): {c['diff']:+.4g} -> {c['verdict']}")
    print(f"-> {args.out}/compare.json, compare.md")
    return 0


def _add_study(sub: argparse._SubParsersAction) -> None:
    from looprun.study.cli import __doc__ as usage
    from looprun.study.cli import add_arguments

    p = sub.add_parser(
        "study", formatter_class=argparse.RawDescriptionHelpFormatter,
        help="a study spec (studies/<name>.py): plan, run and resume its seeded runs, render its page",
        description=usage + "\nGuide: docs/studies.md (how to write a spec; the sharing study as the example).")
    add_arguments(p)


def _study(args: argparse.Namespace) -> int:
    from looprun.study.cli import main as study_main

    return study_main(args)


COMMANDS = {"train": _train, "eval": _eval, "intervene": _intervene, "latent-stats": _latent_stats,
            "profile": _profile, "demo": _demo, "encode": _encode, "compare": _compare, "study": _study}


def build_parser() -> argparse.ArgumentParser:
    """The ``loopvae`` argument parser (all sub-commands)."""
    parser = argparse.ArgumentParser(
        prog="loopvae", description="LoopVAE tokenizers: train, evaluate, compare, intervene, encode latents, profile."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (_add_train, _add_eval, _add_compare, _add_intervene, _add_latent_stats, _add_encode, _add_profile,
                _add_demo, _add_study):
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)  # --help and argument errors end here, before torch is imported
    args.held_lock = None
    if args.command == "encode":
        from looprun.run_lock import RunLockedError

        try:
            args.held_lock = _early_lock(args.out, "loopvae encode")
        except RunLockedError as err:
            print(f"loopvae encode: error: {err}", file=sys.stderr)
            return 2
    if args.command == "study":  # its own one-line errors, without run_command's torch-heavy imports
        return _study(args)
    from looprun.cli_errors import run_command
    from looprun.speed import apply_speed_arguments

    def command() -> int:
        apply_speed_arguments(args)
        return COMMANDS[args.command](args)

    return run_command("loopvae", args.command, command)


if __name__ == "__main__":
    sys.exit(main())
