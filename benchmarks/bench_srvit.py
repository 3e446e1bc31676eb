"""srvit throughput on CPU, side by side in one process:

1. ``vit-s`` against timm's ``deit_small_patch16_224`` (timm only as the peer being measured), with the
   same weights loaded into both, inference and a training step (forward + backward) at 224²;
2. the cost of SoftMoR: ``srvit-s`` at R = 4 with ``fusion_mode=query`` (the default) and ``token`` against
   ``fusion_mode=last``;
3. whether the class-token-only last block application pays: logits-only ``model(x)`` against the same logits
   through ``forward_head(forward_features(x))``, which computes every token (``vit-s``, ``srvit-s`` R = 4).

Timings alternate between the models being compared (A B B A ...) and report the median, so drift in
the shared machine's speed hits both alike. Usage:
``.venv/bin/python benchmarks/bench_srvit.py --out docs/benchmarks.md`` (updates its section).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import timm
import torch
from sections import publish  # benchmarks/ is on sys.path when a script here runs

import srvit
from loopcore.flops import count_macs, count_parameters
from looprun.speed import retain_freed_cpu_memory

COMMAND = ".venv/bin/python benchmarks/bench_srvit.py --out docs/benchmarks.md"


def _timer(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def alternate(fns: dict[str, Callable[[], object]], repeats: int, warmup: int = 1) -> dict[str, list[float]]:
    """Seconds per call of each function in every round, the functions timed in alternation within a round."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    order = list(fns.items())
    for i in range(repeats):
        for name, fn in order if i % 2 == 0 else order[::-1]:  # A B B A ...: neither always goes first
            times[name].append(_timer(fn))
    return times


def median(times: dict[str, list[float]], name: str) -> float:
    return statistics.median(times[name])


def ratio(times: dict[str, list[float]], num: str, den: str) -> tuple[float, float, float]:
    """Median, min and max over rounds of ``time(num) / time(den)``: both were timed in the same round, so the
    machine's drift cancels in each ratio and the range shows what is left of the noise."""
    per_round = [a / b for a, b in zip(times[num], times[den])]
    return statistics.median(per_round), min(per_round), max(per_round)


def inference(model: torch.nn.Module, x: torch.Tensor) -> Callable[[], object]:
    model.eval()

    def run() -> object:
        with torch.inference_mode():
            return model(x)

    return run


def train_step(model: torch.nn.Module, x: torch.Tensor) -> Callable[[], object]:
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    labels = torch.zeros(x.shape[0], dtype=torch.long)

    def run() -> object:
        for p in params:
            p.grad = None
        loss = torch.nn.functional.cross_entropy(model(x), labels)
        loss.backward()
        return loss

    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="markdown file whose 'srvit' section is rewritten")
    parser.add_argument(
        "--batch", type=int, default=16,
        help="vit-s inference batch (its training step uses half; srvit-s R=4 uses a quarter for both)",
    )
    parser.add_argument("--repeats", type=int, default=12)
    args = parser.parse_args(argv)
    retained = retain_freed_cpu_memory()  # what the srvit command lines do by default (looprun.speed)
    torch.manual_seed(0)
    rows = []

    ours, peer = srvit.create_model("vit-s"), timm.create_model("deit_small_patch16_224", pretrained=False)
    ours.load_state_dict(peer.state_dict())  # same weights: the comparison is of the implementations
    x = torch.randn(args.batch, 3, 224, 224)
    with torch.inference_mode():
        max_diff = float((ours.eval()(x[:2]) - peer.eval()(x[:2])).abs().max())
    inf = alternate({"ours": inference(ours, x), "timm": inference(peer, x)}, args.repeats)
    xt = x[: max(1, args.batch // 2)]
    trn = alternate({"ours": train_step(ours, xt), "timm": train_step(peer, xt)}, max(3, args.repeats // 2))
    for mode, t, n in (("inference", inf, x.shape[0]), ("train step", trn, xt.shape[0])):
        rows.append((f"vit-s vs timm deit_small_patch16_224, {mode}, batch {n}", n / median(t, "ours"),
                     n / median(t, "timm"), ratio(t, "timm", "ours")))

    fusions = ("token", "query", "last")
    sr = {mode: srvit.create_model("srvit-s", recursion=4, fusion_mode=mode) for mode in fusions}
    for mode in fusions[1:]:  # same trunk weights; only the routers differ
        sr[mode].load_state_dict(sr["token"].state_dict(), strict=False)
    xs = x[: max(1, args.batch // 4)]
    sr_inf = alternate({m: inference(model, xs) for m, model in sr.items()}, args.repeats)
    xst = xs
    sr_trn = alternate({m: train_step(model, xst) for m, model in sr.items()}, max(3, args.repeats // 2))
    with torch.device("meta"):
        macs = {m: count_macs(srvit.create_model("srvit-s", recursion=4, fusion_mode=m), torch.randn(1, 3, 224, 224))
                for m in fusions}
    params = {m: count_parameters(model) for m, model in sr.items()}
    soft_rows = []
    for mode, t, n in (("inference", sr_inf, xs.shape[0]), ("train step", sr_trn, xst.shape[0])):
        for m in ("token", "query"):
            soft_rows.append((m, mode, n, n / median(t, m), n / median(t, "last"), ratio(t, m, "last")))

    # The head-only shortcut: same model, same logits (up to float rounding), the full last block or one token.
    shortcut_rows = []
    for name, model, xb in (("vit-s", ours, x), ("srvit-s R = 4 (query)", sr["query"], xs)):
        model.eval()
        with torch.inference_mode():
            gap = float((model(xb[:2]) - model.forward_head(model.forward_features(xb[:2]))).abs().max())
            t = alternate({"head only": lambda m=model, b=xb: m(b),
                           "all tokens": lambda m=model, b=xb: m.forward_head(m.forward_features(b))}, args.repeats)
        applications = model.config.depth * model.config.recursion
        shortcut_rows.append((name, xb.shape[0], 1 / applications, xb.shape[0] / median(t, "head only"),
                              xb.shape[0] / median(t, "all tokens"), ratio(t, "all tokens", "head only"), gap))

    lines = [
        "## srvit throughput (CPU, fp32, 224²)", "",
        f"Command: `{COMMAND}` (batch {args.batch}, {args.repeats} alternating repeats, median; ratios are the "
        "median of the per-round ratios with their range over the rounds in brackets, the models of a round "
        "timed back to back).", "",
        f"Machine: {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, "
        f"torch {torch.__version__}, timm {timm.__version__}, "
        f"{'retained' if retained else 'system'} CPU allocator (the command lines' default). Both ViTs hold the "
        "same weights (outputs agree to "
        f"{max_diff:.1e}); {count_parameters(ours) / 1e6:.2f}M parameters each. Ours computes the last block "
        "for the class token only when only logits are asked for (the head reads nothing else; "
        "`forward_features` still returns every token).", "",
        "| comparison | ours (images/s) | timm (images/s) | ours / timm |",
        "| --- | --- | --- | --- |",
        *[f"| {name} | {a:.2f} | {b:.2f} | {r[0]:.3f}× ({r[1]:.3f}–{r[2]:.3f}) |" for name, a, b, r in rows],
        "",
        "SoftMoR cost, `srvit-s` at R = 4: each fusion mode against plain recursion (`fusion_mode=last`), the same "
        "trunk weights, timed in one alternation.", "",
        "| fusion_mode | parameters | GMACs / image | MACs over `last` |",
        "| --- | --- | --- | --- |",
        *[f"| {m} | {params[m] / 1e6:.2f}M | {macs[m] / 1e9:.2f} | {100 * (macs[m] / macs['last'] - 1):+.1f}% |"
          for m in fusions],
        "",
        "| fusion_mode | mode | batch | images/s | `last` images/s | time over `last` |",
        "| --- | --- | --- | --- | --- | --- |",
        *[f"| {m} | {mode} | {n} | {a:.2f} | {b:.2f} | {100 * (o[0] - 1):+.1f}% ({100 * (o[1] - 1):+.1f} to "
          f"{100 * (o[2] - 1):+.1f}%) |" for m, mode, n, a, b, o in soft_rows],
        "",
        "`token` (our literal reading of the SoftMoR router, which the paper describes without equations) runs "
        "`LayerNorm -> Linear(d, d) -> GELU -> Linear(d, 1)` "
        "on every step's output of every token, so its arithmetic alone is "
        f"{100 * (macs['token'] / macs['last'] - 1):+.1f}% at R = 4. `query` computes one `Linear(d, d)` query per "
        "token from the block input and scores each step by a dot product with its normalised output: the same "
        "token-wise soft weights and nearly the same parameters, a quarter of the router GEMMs; it is the default.",
        "",
        "Class-token-only last block application (the classifier's head path, `RecursiveViT._last_stage_head_only`): "
        "logits-only `model(x)` against `forward_head(forward_features(x))`, which runs the last application for "
        "every token; inference, timed in one alternation.", "",
        "| model | batch | last application's share of block applications | head only (images/s) | "
        "all tokens (images/s) | speed-up | max logit difference |",
        "| --- | --- | --- | --- | --- | --- | --- |",
        *[f"| {n} | {b} | {100 * f:.1f}% | {a:.2f} | {c:.2f} | {r[0]:.3f}× ({r[1]:.3f}–{r[2]:.3f}) | {g:.1e} |"
          for n, b, f, a, c, r, g in shortcut_rows],
        "",
        "The shortcut saves most of one block application, so its gain is bounded by that application's share of "
        "the trunk: worth keeping for the ViT baseline, too small to separate from timing noise for a recursive "
        "model whose last block runs many times. It is the logits path only and is not taken while hooks are "
        "installed.",
    ]
    text = "\n".join(lines)
    publish(text, args.out, "srvit")
    return 0


if __name__ == "__main__":
    sys.exit(main())
