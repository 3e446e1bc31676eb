"""LoopVAE vs the 84M reference on CPU: where the time goes, what each speed switch buys, training cost.

Usage: ``.venv/bin/python benchmarks/bench_vae.py --out docs/benchmarks.md`` (rewrites four sections:
``loopvae-target``, ``loopvae-profile``, ``loopvae-ops`` and ``loopvae-train``). Every measurement runs in a fresh
subprocess, because the CPU allocator setting is process-wide and the peak resident size must not carry
over from an earlier measurement; within one subprocess the two models are timed side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from sections import publish  # benchmarks/ is on sys.path when a script here runs

COMMAND = ".venv/bin/python benchmarks/bench_vae.py --out docs/benchmarks.md"
LOOP, REFERENCE = "loopvae-cnn-f8d16", "flux-vae"
# (label, loopvae profile flags): from the previous main's behaviour to the recommended settings.
CONFIGS = [
    ("previous main: contiguous, system malloc, plain blocks",
     ["--memory-format", "contiguous", "--cpu-allocator", "system", "--plain-blocks"]),
    ("+ fused blocks", ["--memory-format", "contiguous", "--cpu-allocator", "system"]),
    ("+ retain allocator", ["--memory-format", "contiguous", "--cpu-allocator", "retain"]),
    ("+ channels_last (the CLI defaults)", ["--memory-format", "channels_last", "--cpu-allocator", "retain"]),
    ("+ torch.compile", ["--memory-format", "channels_last", "--cpu-allocator", "retain", "--compile"]),
]


def machine() -> str:
    return (f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, torch "
            f"{torch.__version__}, Python {platform.python_version()}")


def run_json(args: list[str]) -> object:
    """Run ``python args...`` and parse the JSON object it prints on its last stdout line."""
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# -- inference configurations ----------------------------------------------------------------------
def profile_configs(warmup: int, iters: int) -> list[tuple[str, list[str], list[dict]]]:
    results = []
    for label, flags in CONFIGS:
        with tempfile.TemporaryDirectory() as tmp:
            cmd = ["-m", "loopvae", "profile", "--models", f"{LOOP},{REFERENCE}", "--device", "cpu", "--batch", "1",
                   "--resolution", "256", "--warmup", str(warmup), "--iters", str(iters), "--out", tmp, *flags]
            proc = subprocess.run([sys.executable, *cmd], capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                raise RuntimeError(f"loopvae profile {' '.join(flags)} failed:\n{proc.stderr[-3000:]}")
            rows = json.loads((Path(tmp) / "profile.json").read_text())
        print(f"[profile] {label}: " + ", ".join(f"{r['model']} {r['variant']} {r['ms_per_image']:.0f} ms"
                                                 for r in rows), flush=True)
        results.append((label, flags, rows))
    return results


def render_profile(results, warmup: int, iters: int) -> str:
    lines = [
        "## LoopVAE runtime on CPU: the 84M reference side by side, per speed setting (fp32, batch 1, 256²)", "",
        f"Command: `{COMMAND}`; each row is one `loopvae profile --models {LOOP},{REFERENCE} --device cpu --batch 1 "
        f"--warmup {warmup} --iters {iters}` process with the flags shown, both models timed in it.", "",
        f"Machine: {machine()}. The paper's figures are for one 96 GB GPU in bf16 at batch 8 (35.13 vs 12.34 "
        "ms/image: 65% fewer weights, 1.57× the MACs, 2.85× the time); compare ratios, not absolute times. "
        "GMAC/s = MACs / time (the arithmetic rate each model reaches).", "",
        "| setting | flags | variant | LoopVAE ms | flux-vae ms | time ratio | MAC ratio | LoopVAE GMAC/s | "
        "flux-vae GMAC/s |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for label, flags, rows in results:
        for variant in ("eager", "compiled"):
            loop = next((r for r in rows if r["model"] == LOOP and r["variant"] == variant), None)
            ref = next((r for r in rows if r["model"] == REFERENCE and r["variant"] == variant), None)
            if loop is None or ref is None or ("--compile" in flags and variant == "eager"):
                continue  # the compile setting's eager rows repeat the previous setting
            time_ratio, mac_ratio = loop["ms_per_image"] / ref["ms_per_image"], loop["gmacs"] / ref["gmacs"]
            lines.append(
                f"| {label} | `{' '.join(flags)}` | {variant} | {loop['ms_per_image']:.0f} | "
                f"{ref['ms_per_image']:.0f} | {time_ratio:.2f}× | {mac_ratio:.2f}× | "
                f"{loop['gmacs'] * 1000 / loop['ms_per_image']:.1f} | "
                f"{ref['gmacs'] * 1000 / ref['ms_per_image']:.1f} |")
    lines += ["", "Each setting is a separate process, timed minutes apart: compare ratios within a row; the "
              "target is judged on the alternated measurement above."]
    defaults = next(rows for label, _, rows in results if "CLI defaults" in label)
    loop = next(r for r in defaults if r["model"] == LOOP and r["variant"] == "eager")
    lines += ["", f"Core time per stage, `{LOOP}` with the CLI defaults (measured vs analytic tokens × passes):", "",
              "| stage | measured | analytic |", "|---|---:|---:|"]
    for key, share in loop["stage_share_analytic"].items():
        lines.append(f"| {key} | {100 * loop['stage_share_measured'].get(key, 0.0):.1f}% | {100 * share:.1f}% |")
    return "\n".join(lines)


# -- the verdict: the two models alternated in one process --------------------------------------------
def worker_alternate(rounds: int, compile: bool) -> dict:
    from looprun.speed import compile_in_place, prepare_for_speed, retain_freed_cpu_memory, to_memory_format
    from loopvae.profile import count_model
    from loopvae.registry import create_model

    retain_freed_cpu_memory()
    torch.manual_seed(0)
    models = {name: prepare_for_speed(create_model(name).eval(), "channels_last") for name in (LOOP, REFERENCE)}
    if compile:
        for model in models.values():
            compile_in_place(model)
    x = to_memory_format(torch.rand(1, 3, 256, 256) * 2 - 1, "channels_last")
    times: dict[str, list[float]] = {name: [] for name in models}
    with torch.no_grad():
        for model in models.values():  # warm-up (and compilation)
            model.decode(model.encode(x).latent_dist.sample())
        for _ in range(rounds):
            for name, model in models.items():
                start = time.perf_counter()
                model.decode(model.encode(x).latent_dist.sample())
                times[name].append(1000 * (time.perf_counter() - start))
    macs = {name: count_model(name, 256)[1] for name in models}
    return {"compile": compile, "times_ms": times, "macs": macs}


def render_alternate(results: list[dict], rounds: int) -> str:
    lines = [
        "## The target: time ratio ≤ MAC ratio, `loopvae-cnn-f8d16` / `flux-vae` (CPU, fp32, batch 1, 256²)", "",
        f"Command: `{COMMAND}`: the two models built with the CLI defaults (channels_last, retained allocator), "
        f"their reconstructions (encoder → posterior sample → decoder) alternated {rounds} times in one process "
        "after a warm-up each, so that machine drift hits both alike; ratio of the medians, and the spread of the "
        f"per-round ratios. Equivalent single command: `loopvae profile --models {LOOP},{REFERENCE} --device cpu "
        f"--batch 1 --resolution 256` (the defaults are the recommended flags; add `--compile` for compiled rows). "
        f"Machine: {machine()}.", "",
        "| variant | LoopVAE median ms | flux-vae median ms | time ratio | per-round ratios | MAC ratio | verdict |",
        "|---|---:|---:|---:|---|---:|---|",
    ]
    for r in results:
        loop, ref = r["times_ms"][LOOP], r["times_ms"][REFERENCE]
        med = lambda v: sorted(v)[len(v) // 2]
        ratio, mac_ratio = med(loop) / med(ref), r["macs"][LOOP] / r["macs"][REFERENCE]
        per_round = sorted(a / b for a, b in zip(loop, ref))
        verdict = "met" if ratio <= mac_ratio else f"not met ({100 * (ratio / mac_ratio - 1):.0f}% over)"
        lines.append(f"| {'compiled' if r['compile'] else 'eager'} | {med(loop):.0f} | {med(ref):.0f} | "
                     f"**{ratio:.2f}×** | {per_round[0]:.2f}–{per_round[-1]:.2f}× | {mac_ratio:.2f}× | {verdict} |")
    return "\n".join(lines)


# -- op profile --------------------------------------------------------------------------------------
def worker_ops(model_name: str) -> dict:
    from torch.profiler import ProfilerActivity, profile

    from looprun.speed import prepare_for_speed, retain_freed_cpu_memory, to_memory_format
    from loopvae.registry import create_model

    retain_freed_cpu_memory()
    torch.manual_seed(0)
    model = prepare_for_speed(create_model(model_name).eval(), "channels_last")
    x = to_memory_format(torch.rand(1, 3, 256, 256) * 2 - 1, "channels_last")
    with torch.no_grad():
        model.decode(model.encode(x).latent_dist.mode())
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            model.decode(model.encode(x).latent_dist.mode())
    total = sum(e.self_cpu_time_total for e in prof.key_averages())
    by_op = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    by_shape = sorted(prof.key_averages(group_by_input_shape=True), key=lambda e: -e.self_cpu_time_total)
    ops = [{"op": e.key, "calls": e.count, "ms": e.self_cpu_time_total / 1000, "share": e.self_cpu_time_total / total}
           for e in by_op[:8]]
    shapes = [{"op": e.key, "shapes": str(e.input_shapes[:2]), "calls": e.count, "ms": e.self_cpu_time_total / 1000,
               "share": e.self_cpu_time_total / total} for e in by_shape[:8]]
    return {"model": model_name, "total_ms": total / 1000, "ops": ops, "shapes": shapes}


def render_ops(results: list[dict]) -> str:
    lines = [
        "## Where the time goes: op profile of one reconstruction (CPU, fp32, batch 1, 256², CLI defaults)", "",
        f"Command: `{COMMAND}` (`torch.profiler`, self CPU time of one encoder → decoder call after a warm-up, "
        f"channels_last, retained allocator). Machine: {machine()}.", "",
    ]
    for r in results:
        lines += [f"`{r['model']}`: {r['total_ms']:.0f} ms of op time.", "",
                  "| op | calls | ms | share |", "|---|---:|---:|---:|"]
        lines += [f"| {o['op']} | {o['calls']} | {o['ms']:.0f} | {100 * o['share']:.1f}% |" for o in r["ops"]]
        lines += ["", "| op (by input shapes) | input, weight | calls | ms | share |", "|---|---|---:|---:|---:|"]
        lines += [f"| {o['op']} | `{o['shapes']}` | {o['calls']} | {o['ms']:.0f} | {100 * o['share']:.1f}% |"
                  for o in r["shapes"]]
        lines.append("")
    return "\n".join(lines)


# -- training step ----------------------------------------------------------------------------------
def _train_step(model: torch.nn.Module, x: torch.Tensor) -> None:
    """Forward + backward of the autoencoder alone (posterior sample, L1 + KL): what the architecture costs."""
    posterior = model.encode(x).latent_dist
    recon = model.decode(posterior.sample()).sample
    loss = (recon - x).abs().mean() + 1e-6 * posterior.kl().mean()
    loss.backward()
    model.zero_grad(set_to_none=True)


def _train_model(name: str, checkpointing: bool) -> torch.nn.Module:
    from looprun.speed import prepare_for_speed
    from loopvae.registry import create_model

    torch.manual_seed(0)
    model = prepare_for_speed(create_model(name).train(), "channels_last")
    if checkpointing:
        model.enable_gradient_checkpointing()
    return model


TRAIN_ARMS = ((LOOP, False), (LOOP, True), (REFERENCE, False))


def worker_train_memory(model_name: str, checkpointing: bool) -> dict:
    """Peak memory of one training step in a fresh process, with malloc's defaults (freed blocks go back to
    the kernel, so the resident size follows what is alive): its rise over the resident size before the
    step is the step's activations, gradients and workspace."""
    from looprun.memory import track_peak_memory
    from looprun.speed import to_memory_format

    model = _train_model(model_name, checkpointing)
    x = to_memory_format(torch.rand(1, 3, 256, 256) * 2 - 1, "channels_last")
    with track_peak_memory("cpu") as peak:
        _train_step(model, x)
    return {"model": model_name, "checkpointing": checkpointing, "peak_rss_mib": peak.absolute_peak_bytes / 2**20,
            "peak_rise_mib": peak.peak_bytes / 2**20}


def worker_train_time(rounds: int) -> dict:
    """Training-step times of the three arms alternated in one process (retained allocator), after a warm-up."""
    from looprun.speed import retain_freed_cpu_memory, to_memory_format

    retain_freed_cpu_memory()
    models = {arm: _train_model(*arm) for arm in TRAIN_ARMS}
    x = to_memory_format(torch.rand(1, 3, 256, 256) * 2 - 1, "channels_last")
    times: dict[str, list[float]] = {f"{name}|{ckpt}": [] for name, ckpt in TRAIN_ARMS}
    for model in models.values():
        _train_step(model, x)
    for _ in range(rounds):
        for (name, ckpt), model in models.items():
            start = time.perf_counter()
            _train_step(model, x)
            times[f"{name}|{ckpt}"].append(1000 * (time.perf_counter() - start))
    return times


def render_train(memory: list[dict], times: dict[str, list[float]], rounds: int) -> str:
    med = lambda v: sorted(v)[len(v) // 2]
    by = {(r["model"], r["checkpointing"]): r for r in memory}
    ms = {(name, ckpt): med(times[f"{name}|{ckpt}"]) for name, ckpt in TRAIN_ARMS}
    lines = [
        "## Training step and activation memory (CPU, fp32, batch 1, 256²)", "",
        f"Command: `{COMMAND}`. A step is forward + backward of the autoencoder alone (posterior sample, L1 + KL; "
        f"channels_last). Time: the three arms alternated {rounds} times in one process after a warm-up step each "
        "(retained allocator), median. Memory: one fresh process per arm, the resident-set high-water mark of its "
        "first step with malloc's defaults (`looprun.memory`) and the rise over the resident size before the "
        f"step (activations, gradients, workspace: what checkpointing acts on). Machine: {machine()}.", "",
        "| model | per-pass checkpointing | ms / step (median) | per-round ms | peak RSS (MiB) "
        "| rise during the step (MiB) |",
        "|---|---|---:|---|---:|---:|",
    ]
    for name, ckpt in TRAIN_ARMS:
        r, runs = by[(name, ckpt)], times[f"{name}|{ckpt}"]
        lines.append(f"| {name} | {'on' if ckpt else 'off'} | {ms[(name, ckpt)]:.0f} | "
                     f"{', '.join(f'{v:.0f}' for v in runs)} | {r['peak_rss_mib']:.0f} | {r['peak_rise_mib']:.0f} |")
    loop, loop_ckpt = by[(LOOP, False)], by[(LOOP, True)]
    rise_ratio = loop_ckpt["peak_rise_mib"] / loop["peak_rise_mib"]
    peak_ratio = loop_ckpt["peak_rss_mib"] / loop["peak_rss_mib"]
    ref_ms = ms[(REFERENCE, False)]
    lines += [
        "",
        f"- Train-step time ratio `{LOOP}` / `{REFERENCE}`: **{ms[(LOOP, False)] / ref_ms:.2f}×** without "
        f"checkpointing, {ms[(LOOP, True)] / ref_ms:.2f}× with it (MAC ratio 1.58× forward).",
        f"- Per-pass checkpointing keeps **{100 * rise_ratio:.0f}%** of the step's memory rise "
        f"({100 * peak_ratio:.0f}% of the process's absolute peak, which includes the interpreter, torch and the "
        f"weights) for {ms[(LOOP, True)] / ms[(LOOP, False)]:.2f}× the step time; target ≤ 40%: "
        f"{'met' if rise_ratio <= 0.40 else 'not met'}.",
    ]
    return "\n".join(lines)


# -- the ratio goals (issue 36): training step of the tiny pair and inference of the f8d16 pair ------------
TINY_LOOP, TINY_REFERENCE = "loopvae-cnn-tiny-sc", "flux-vae-tiny"  # the bundled tokenizer's architecture
TRAIN_GOAL, INFERENCE_GOAL = 1.30, 1.58  # the pairs' MAC ratios as the issue states them


def worker_train_ratio(rounds: int, steps: int) -> dict:
    """Training steps (the release-tiny recipe's, 8 crops of 64², channels_last) of the tiny pair alternated in
    one process: ``rounds`` rounds of ``steps`` steps each, after two warm-up steps each; per-round ms per step."""
    from loopcore.op_breakdown import OpClassRecorder
    from looprun.speed import prepare_for_speed, retain_freed_cpu_memory, to_memory_format
    from loopvae.breakdown import training_step
    from loopvae.registry import create_model

    retain_freed_cpu_memory()
    torch.manual_seed(0)
    x = to_memory_format(torch.rand(8, 3, 64, 64) * 2 - 1, "channels_last")
    steps_of = {name: training_step(prepare_for_speed(create_model(name).train(), "channels_last"), x)
                for name in (TINY_LOOP, TINY_REFERENCE)}
    macs = {}
    for name, step in steps_of.items():
        step()
        with OpClassRecorder() as rec:  # also the second warm-up step: the training MACs, backward included
            step()
        macs[name] = sum(c.flops for c in rec.calls) // 2
    times: dict[str, list[float]] = {name: [] for name in steps_of}
    for _ in range(rounds):
        for name, step in steps_of.items():
            start = time.perf_counter()
            for _ in range(steps):
                step()
            times[name].append(1000 * (time.perf_counter() - start) / steps)
    return {"times_ms": times, "train_macs": macs, "threads": torch.get_num_threads()}


def worker_depthwise(rounds: int, steps: int) -> dict:
    """What the depthwise weight gradient as a forward convolution buys: the release-tiny training step of
    ``loopvae-cnn-tiny`` with it and with torch's native depthwise backward, and of ``flux-vae-tiny``, alternated."""
    import torch.nn.functional as F

    import loopcore.conv_operator as conv_operator
    from looprun.speed import prepare_for_speed, retain_freed_cpu_memory, to_memory_format
    from loopvae.breakdown import training_step
    from loopvae.registry import create_model

    retain_freed_cpu_memory()
    fast = conv_operator.depthwise_conv2d

    def native(x, weight, bias=None):
        return F.conv2d(x, weight, bias, padding=weight.shape[-1] // 2, groups=x.shape[1])

    torch.manual_seed(0)
    x = to_memory_format(torch.rand(8, 3, 64, 64) * 2 - 1, "channels_last")
    arms = {"forward-conv weight gradient": (TINY_LOOP, fast), "native depthwise backward": (TINY_LOOP, native),
            TINY_REFERENCE: (TINY_REFERENCE, fast)}
    steps_of = {label: (training_step(prepare_for_speed(create_model(name).train(), "channels_last"), x), impl)
                for label, (name, impl) in arms.items()}
    times: dict[str, list[float]] = {label: [] for label in arms}
    for round_ in range(rounds + 1):
        for label, (step, impl) in steps_of.items():
            conv_operator.depthwise_conv2d = impl
            start = time.perf_counter()
            for _ in range(steps if round_ else 2):  # round 0: warm-up
                step()
            if round_:
                times[label].append(1000 * (time.perf_counter() - start) / steps)
    conv_operator.depthwise_conv2d = fast
    return {"times_ms": times}


def render_depthwise(result: dict, rounds: int, steps: int) -> str:
    med = lambda v: sorted(v)[len(v) // 2]
    t = result["times_ms"]
    ref = t[TINY_REFERENCE]
    lines = ["## What the depthwise weight gradient as a forward convolution buys (training step, CPU)", "",
             f"Command: `{COMMAND}`: the `release-tiny` training step (8 crops of 64², channels_last) of "
             f"`{TINY_LOOP}` with `loopcore.depthwise` and with torch's native depthwise backward, and of "
             f"`{TINY_REFERENCE}`, alternated {rounds} rounds × {steps} steps in one process after warm-up. "
             f"Machine: {machine()}.", "",
             "| arm | median ms / step | per-round ms | time ratio to the reference (per round) |",
             "|---|---:|---|---|"]
    for label, v in t.items():
        ratios = sorted(a / b for a, b in zip(v, ref, strict=True))
        lines.append(f"| {label} | {med(v):.1f} | {', '.join(f'{x:.0f}' for x in v)} | "
                     f"{med(v) / med(ref):.2f}× ({ratios[0]:.2f}–{ratios[-1]:.2f}×) |")
    gain = med(t["native depthwise backward"]) / med(t["forward-conv weight gradient"])
    lines += ["", f"The change makes the LoopVAE step **{gain:.2f}×** faster (ratio of medians)."]
    return "\n".join(lines)


def render_goals(train: dict, inference: dict, rounds: int, steps: int) -> str:
    med = lambda v: sorted(v)[len(v) // 2]
    from loopvae.profile import count_model

    tiny_fwd = count_model(TINY_LOOP, 64)[1] / count_model(TINY_REFERENCE, 64)[1]
    lines = [
        "## The ratio goals: LoopVAE's time at its MAC ratio (CPU, fp32, channels_last)", "",
        f"Command: `{COMMAND}`. Both measurements alternate the two models in one fresh process (retained "
        "allocator) after warm-up, so that machine drift hits both alike; the ratio is of the medians, with the "
        f"range of the per-round ratios. Training: {rounds} rounds × {steps} steps of the `release-tiny` step "
        "(noisy posterior sample, decode, L1 + 10 MSE + KL, backward, clipping, AdamW, EMA; 8 crops of 64², "
        f"{train['threads']} threads). Inference: {rounds} rounds of one 256² reconstruction at batch 1. "
        f"Machine: {machine()}.", "",
        "| measurement | LoopVAE ms | reference ms | time ratio | per-round ratios | MAC ratio | goal | verdict |",
        "|---|---:|---:|---:|---|---:|---:|---|",
    ]
    rows = []
    loop, ref = train["times_ms"][TINY_LOOP], train["times_ms"][TINY_REFERENCE]
    mac = train["train_macs"][TINY_LOOP] / train["train_macs"][TINY_REFERENCE]
    rows.append((f"training step `{TINY_LOOP}` / `{TINY_REFERENCE}`", loop, ref,
                 f"{mac:.2f}× (forward {tiny_fwd:.2f}×)", TRAIN_GOAL))
    loop, ref = inference["times_ms"][LOOP], inference["times_ms"][REFERENCE]
    rows.append((f"inference `{LOOP}` / `{REFERENCE}`", loop, ref,
                 f"{inference['macs'][LOOP] / inference['macs'][REFERENCE]:.2f}×", INFERENCE_GOAL))
    for label, loop, ref, mac_text, goal in rows:
        ratio = med(loop) / med(ref)
        per_round = sorted(a / b for a, b in zip(loop, ref, strict=True))
        verdict = "met" if ratio <= goal else f"not met ({100 * (ratio / goal - 1):.0f}% over)"
        lines.append(f"| {label} | {med(loop):.1f} | {med(ref):.1f} | **{ratio:.2f}×** | "
                     f"{per_round[0]:.2f}–{per_round[-1]:.2f}× | {mac_text} | ≤ {goal:.2f}× | {verdict} |")
    lines += ["", "Training MACs are counted on the step itself (forward and backward, convolution backward with "
              "`groups`); where a goal is not met, the op-class breakdown below says which class holds it back."]
    return "\n".join(lines)


def breakdown_section(models: str, title: str, iters: int, figures: Path) -> str:
    """``loopvae profile --models MODELS --breakdown`` in a fresh process: its breakdown section, titled; the
    stacked-bar plot is copied to ``figures/breakdown-<first model>.png``."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = ["-m", "loopvae", "profile", "--models", models, "--breakdown", "--device", "cpu", "--batch", "1",
               "--resolution", "256", "--warmup", "1", "--iters", str(iters), "--out", tmp]
        proc = subprocess.run([sys.executable, *cmd], capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"loopvae profile --breakdown failed:\n{proc.stderr[-3000:]}")
        text = (Path(tmp) / "profile.md").read_text()
        figure = figures / f"breakdown-{models.split(',')[0]}.png"
        figure.parent.mkdir(parents=True, exist_ok=True)
        figure.write_bytes((Path(tmp) / "breakdown.png").read_bytes())
    body = text[text.index("## Where the time goes, by op class"):].split("\n", 1)[1]
    body = body.replace("![time by op class](breakdown.png)", f"![time by op class]({figures.name}/{figure.name})")
    return (f"## {title}\n\nCommand: `{COMMAND}` runs `loopvae profile --models {models} --breakdown --device cpu "
            f"--resolution 256 --iters {iters}`; machine: {machine()}.\n" + body)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, help="markdown file whose sections are rewritten")
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--train-rounds", type=int, default=3, help="alternations of the training-step arms")
    parser.add_argument("--rounds", type=int, default=5, help="alternations for the target measurement")
    parser.add_argument("--goal-rounds", type=int, default=5, help="alternations for the ratio goals")
    parser.add_argument("--goal-steps", type=int, default=3, help="training steps per model and goal round")
    parser.add_argument("--only", choices=("target", "profile", "ops", "train", "goals", "breakdown", "depthwise"),
                        action="append",
                        help="run only these parts (repeatable; default all)")
    parser.add_argument("--worker", help=argparse.SUPPRESS,
                        choices=("alternate", "ops", "train-memory", "train-time", "train-ratio", "depthwise"))
    parser.add_argument("--compile", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--checkpointing", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    workers = {
        "alternate": lambda: worker_alternate(args.rounds, args.compile),
        "ops": lambda: worker_ops(args.model),
        "train-memory": lambda: worker_train_memory(args.model, args.checkpointing),
        "train-time": lambda: worker_train_time(args.train_rounds),
        "train-ratio": lambda: worker_train_ratio(args.goal_rounds, args.goal_steps),
        "depthwise": lambda: worker_depthwise(args.goal_rounds, args.goal_steps),
    }
    if args.worker is not None:  # one measurement in this (fresh) process; the JSON line goes to the parent
        print(json.dumps(workers[args.worker]()))
        return 0
    parts = args.only or ["goals", "depthwise", "breakdown", "target", "profile", "ops", "train"]
    script = str(Path(__file__).resolve())
    os.environ.pop("LOOPVISION_CPU_ALLOCATOR", None)  # each configuration states its allocator
    if "goals" in parts:
        train = run_json([script, "--worker", "train-ratio", "--goal-rounds", str(args.goal_rounds), "--goal-steps",
                          str(args.goal_steps)])
        inference = run_json([script, "--worker", "alternate", "--rounds", str(args.goal_rounds)])
        publish(render_goals(train, inference, args.goal_rounds, args.goal_steps), args.out,
                "loopvae-goals")
    if "depthwise" in parts:
        result = run_json([script, "--worker", "depthwise", "--goal-rounds", str(args.goal_rounds), "--goal-steps",
                           str(args.goal_steps)])
        publish(render_depthwise(result, args.goal_rounds, args.goal_steps), args.out, "loopvae-depthwise")
    if "breakdown" in parts:
        figures = (args.out.parent if args.out else Path(tempfile.mkdtemp())) / "benchmarks"
        publish(breakdown_section(f"{TINY_LOOP},{TINY_REFERENCE}", "Where the time goes: the tiny pair "
                                  "(training step 8 × 64², reconstruction 256²)", args.iters, figures), args.out,
                "loopvae-breakdown-tiny")
        publish(breakdown_section(f"{LOOP},{REFERENCE}", "Where the time goes: LoopVAE-CNN f8d16 and flux-vae "
                                  "(reconstruction 256², training step 8 × 64²)", args.iters, figures), args.out,
                "loopvae-breakdown-f8d16")
    if "target" in parts:
        results = [run_json([script, "--worker", "alternate", "--rounds", str(args.rounds), *flag])
                   for flag in ([], ["--compile"])]
        publish(render_alternate(results, args.rounds), args.out, "loopvae-target")
    if "profile" in parts:
        publish(render_profile(profile_configs(args.warmup, args.iters), args.warmup, args.iters), args.out,
                "loopvae-profile")
    if "ops" in parts:
        results = [run_json([script, "--worker", "ops", "--model", m]) for m in (LOOP, REFERENCE)]
        publish(render_ops(results), args.out, "loopvae-ops")
    if "train" in parts:
        memory = []
        for model, ckpt in TRAIN_ARMS:
            extra = ["--checkpointing"] if ckpt else []
            memory.append(run_json([script, "--worker", "train-memory", "--model", model, *extra]))
            print(f"[train memory] {memory[-1]}", flush=True)
        times = run_json([script, "--worker", "train-time", "--train-rounds", str(args.train_rounds)])
        publish(render_train(memory, times, args.train_rounds), args.out, "loopvae-train")
    return 0


if __name__ == "__main__":
    sys.exit(main())
