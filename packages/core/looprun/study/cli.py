"""``loopvae study NAME``: plan, run, resume and render a study spec (``studies/<name>.py``).

    loopvae study --list
    loopvae study sharing --dry-run                 # the plan, what is done, a CPU estimate
    loopvae study sharing --jobs 2                  # run what is missing, then render the page
    loopvae study sharing --render-only             # the page from the committed result files
    loopvae study sharing --executor slurm --slurm-partition gpu --gpus-per-node 1 --timeout-min 600
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", nargs="?", help="a study under studies/ (see --list) or a spec's .py path")
    parser.add_argument("--list", action="store_true", help="list the studies under studies/ and exit")
    parser.add_argument("--phase", nargs="+", default=None, help="only these phases (default: every phase)")
    parser.add_argument("--dry-run", action="store_true", help="print the plan with a CPU estimate; run nothing")
    parser.add_argument("--render-only", action="store_true", help="re-render the page from the result files")
    parser.add_argument("--no-render", action="store_true", help="run, but leave the page as it is")
    parser.add_argument("--executor", default="local", choices=["local", "submitit", "slurm", "submitit-local"],
                        help="local: a pool of --jobs subprocesses (default); slurm / submitit: one job per run "
                             "through submitit (submitit: SLURM where sbatch exists, else local processes)")
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time (local pool; SLURM array parallelism)")
    parser.add_argument("--root", default=".", help="the repository whose studies/ and docs/ to use (default: .)")
    parser.add_argument("--docs-root", default=None,
                        help="where result files and pages go (default: --root; a study may train from a worktree "
                             "of its pinned commit and write to the main checkout)")
    parser.add_argument("--workdir", default=None, help="scratch for checkpoints and logs (default runs/study-NAME)")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="a study option its run function reads (e.g. scale=0.01 for a smoke run)")
    parser.add_argument("--retry-failed", action="store_true", help="run failed runs again (their file is replaced)")
    parser.add_argument("--only", nargs="+", default=None, metavar="RUN_ID",
                        help="run just these planned runs (ids as --dry-run prints them)")
    for flag, kind, what in (("--slurm-partition", str, "SLURM partition"), ("--timeout-min", int, "job time limit"),
                             ("--cpus-per-task", int, "CPUs per job"), ("--gpus-per-node", int, "GPUs per job"),
                             ("--mem-gb", int, "memory per job")):
        parser.add_argument(flag, type=kind, default=None, help=f"{what} (submitit executors)")


def _options(pairs: list[str]) -> dict[str, Any]:
    import yaml

    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--option {pair!r}: expected KEY=VALUE (e.g. --option scale=0.01)")
        out[key] = yaml.safe_load(value)
    return out


def run(args: argparse.Namespace) -> int:
    from looprun.study.engine import run_study
    from looprun.study.executors import make_executor
    from looprun.study.page import render
    from looprun.study.spec import available_studies, load_study

    root = Path(args.root)
    if args.list or not args.name:
        names = available_studies(root)
        print("\n".join(names) if names else f"no studies under {root / 'studies'}")
        return 0 if args.list else 2
    study = load_study(args.name, root)
    docs_root, failed = Path(args.docs_root or root), 0
    if not args.render_only:
        workdir = Path(args.workdir or root / "runs" / f"study-{study.name}")
        slurm = {k: v for k, v in {"slurm_partition": args.slurm_partition, "timeout_min": args.timeout_min,
                                   "cpus_per_task": args.cpus_per_task, "gpus_per_node": args.gpus_per_node,
                                   "mem_gb": args.mem_gb}.items() if v is not None}
        executor = make_executor(args.executor, args.jobs, workdir, **slurm)
        counts = run_study(study, executor, docs_root=docs_root, code_root=root, workdir=workdir,
                           phases=args.phase, options=_options(args.option), dry_run=args.dry_run,
                           retry_failed=args.retry_failed, only=args.only)
        if args.dry_run:
            return 0
        print(f"{study.name}: {counts['ran']} run(s) ran, {counts['failed']} failed")
        failed = counts["failed"]
    if not args.no_render:
        _, results = render(study, docs_root)
        prims = ", ".join(f"{p['id']} {p['verdict']}" for p in results["primaries"]) or "primaries not read yet"
        print(f"{study.page}: {len(results['runs'])} run(s); {prims}")
    return 1 if failed else 0  # the page is rendered first: a failed run's numbers are kept and shown


def main(args: argparse.Namespace, prog: str = "loopvae study") -> int:
    """:func:`run` with the expected failures (a refused registration, a missing spec or file, a bad value) as
    one line and exit status 2. It does not go through ``looprun.cli_errors``, whose imports (torch) would cost
    a study command seconds before it does anything; the runs themselves execute in their own processes."""
    from looprun.study.store import RegistrationError

    try:
        return run(args)
    except (RegistrationError, FileNotFoundError, ValueError, KeyError, LookupError, TypeError) as err:
        message = " ".join(str(err).split()) or type(err).__name__
        print(f"{prog}: error: {message}", file=sys.stderr)
        return 2
