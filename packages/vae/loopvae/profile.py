"""``loopvae profile``: what fewer stored weights cost in arithmetic, time and memory.

Per model: parameters and MACs (counted on the ``meta`` device, batch 1), and, unless
``macs_only``, the latency of encoder -> posterior sample -> decoder at the requested batch
(``warmup`` untimed + ``iters`` timed passes; ms per image = mean batch latency / batch), images/s and
peak memory (CUDA: max allocated; CPU: peak resident set size of the process during the timed
section). For LoopVAE models, a separate instrumented pass measures each core stage's share of the
core time, reported next to the analytic share (pixels x passes; 16:8:4:1:8:64 for the f8d16 models).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from loopcore.flops import count_macs, count_parameters
from loopcore.modulation import set_fused_blocks
from looprun.memory import track_peak_memory
from looprun.plotting import plot_or_warn, pyplot
from looprun.speed import compile_in_place, prepare_for_speed, to_memory_format

from .autoencoders import encode_sample
from .model import LoopVAE
from .registry import create_model

log = logging.getLogger("loopvae.profile")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def count_model(name: str, resolution: int, overrides: dict[str, Any] | None = None) -> tuple[int, int]:
    """``(params, MACs)`` of one 256^2-style reconstruction at batch 1, on the meta device."""
    with torch.device("meta"):
        model = create_model(name, **(overrides or {}))
        x = torch.empty(1, 3, resolution, resolution)
    macs = count_macs(lambda: model.decode(encode_sample(model, x)))
    return count_parameters(model), macs


def analytic_stage_share(model: LoopVAE, resolution: int) -> dict[str, float]:
    """Per-stage share of core work as tokens x passes (exact for conv cores: same block everywhere)."""
    work = {}
    for branch in ("encoder", "decoder"):
        part = getattr(model, branch)
        for s, factor in enumerate(part.factors):
            if branch == "decoder" and factor > model.config.latent_factor:
                continue  # stages above the primary latent do not run in a reconstruction
            work[f"{branch} {factor}x"] = (resolution // factor) ** 2 * part.core.passes[s]
    total = sum(work.values())
    return {k: v / total for k, v in work.items()}


@torch.no_grad()
def measured_stage_share(model: LoopVAE, x: torch.Tensor) -> dict[str, float]:
    """Wall-clock share of each core stage in one reconstruction, timed by forward hooks on the cores."""
    device = x.device
    times: dict[str, float] = {}
    started: dict[str, tuple[float, int]] = {}
    handles = []
    for branch in ("encoder", "decoder"):
        part = getattr(model, branch)

        def pre(module, args, kwargs, branch=branch):
            _sync(device)
            scale = args[1] if len(args) > 1 else kwargs["scale"]
            started[branch] = (time.perf_counter(), scale)

        def post(module, args, kwargs, output, branch=branch, factors=part.factors):
            _sync(device)
            t0, scale = started.pop(branch)
            key = f"{branch} {factors[scale]}x"
            times[key] = times.get(key, 0.0) + time.perf_counter() - t0

        handles.append(part.core.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(part.core.register_forward_hook(post, with_kwargs=True))
    try:
        model.decode(encode_sample(model, x))
    finally:
        for handle in handles:
            handle.remove()
    total = sum(times.values())
    return {k: v / total for k, v in times.items()}


def _time_reconstruction(
    model: torch.nn.Module, x: torch.Tensor, warmup: int, iters: int
) -> tuple[float, float]:
    """``(ms per batch, peak memory MiB)`` of encoder -> posterior sample -> decoder, ``warmup`` + ``iters`` calls."""
    dev = x.device

    def step() -> None:
        model.decode(encode_sample(model, x))

    with torch.no_grad():
        for _ in range(warmup):
            step()
        _sync(dev)
        with track_peak_memory(dev) as peak:
            start = time.perf_counter()
            for _ in range(iters):
                step()
            _sync(dev)
            elapsed = time.perf_counter() - start
    return 1000 * elapsed / iters, peak.absolute_peak_bytes / 2**20


def profile_model(
    name: str, device: str = "cpu", batch: int = 1, resolution: int = 256, dtype: str = "fp32", warmup: int = 2,
    iters: int = 5, macs_only: bool = False, memory_format: str = "contiguous", compile: bool = False,
    plain_blocks: bool = False, overrides: dict[str, Any] | None = None, label: str | None = None,
) -> list[dict[str, Any]]:
    """``profile.json`` rows of one model (see module docstring): the eager row, plus a compiled row when
    ``compile`` (the same weights and input after :func:`looprun.speed.compile_in_place`; its warm-up
    includes the compilation, so it gets at least one warm-up call). ``plain_blocks`` times the looped
    cores' blocks with the plain adaLN-Zero formula instead of the fused one (what the fusion buys).
    ``overrides`` go to ``create_model`` (e.g. a pass schedule); ``label`` names the row (default: ``name``)."""
    params, macs = count_model(name, resolution, overrides)
    row: dict[str, Any] = {
        "model": label or name, "registry_name": name, "overrides": dict(overrides or {}), "variant": "eager",
        "params": params, "gmacs": macs / 1e9, "ms_per_image": None,
        "images_per_s": None, "peak_mem_mib": None, "device": device, "dtype": dtype, "batch": batch,
        "resolution": resolution, "memory_format": memory_format, "plain_blocks": plain_blocks,
    }
    if macs_only:
        return [row]
    dev = torch.device(device)
    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    torch.manual_seed(0)
    model = set_fused_blocks(prepare_for_speed(create_model(name, **(overrides or {})).to(dev).eval(), memory_format),
                             not plain_blocks)
    if torch_dtype != torch.float32:
        model = model.to(torch_dtype)
    x = to_memory_format((torch.rand(batch, 3, resolution, resolution, device=dev) * 2 - 1).to(torch_dtype),
                         memory_format)
    rows = [row]
    batch_ms, peak = _time_reconstruction(model, x, warmup, iters)
    row.update(ms_per_image=batch_ms / batch, images_per_s=1000 * batch / batch_ms, peak_mem_mib=peak)
    if isinstance(model, LoopVAE):
        row["stage_share_measured"] = measured_stage_share(model, x)
        row["stage_share_analytic"] = analytic_stage_share(model, resolution)
    if compile:
        compile_in_place(model)
        batch_ms, peak = _time_reconstruction(model, x, max(warmup, 1), iters)
        rows.append({**{k: v for k, v in row.items() if not k.startswith("stage_share")}, "variant": "compiled",
                     "ms_per_image": batch_ms / batch, "images_per_s": 1000 * batch / batch_ms,
                     "peak_mem_mib": peak})
    return rows


def render_markdown(rows: list[dict[str, Any]], reference: str | None = None) -> str:
    """The paper's Table-5 layout plus ratios against ``reference`` (default: flux-vae, else flux-vae-tiny, when
    present)."""
    fmt = lambda v, spec: "–" if v is None else format(v, spec)
    r0 = rows[0]
    lines = [
        "# Runtime profile", "",
        f"Device {r0['device']}, {r0['dtype']}, batch {r0['batch']}, {r0['resolution']}², memory format "
        f"{r0.get('memory_format', 'contiguous')}, encoder → posterior sample → decoder. MACs counted at batch 1 "
        "(conv, linear, attention matmuls); GMAC/s = MACs × batch / time.", "",
        "| model | variant | params (M) | GMACs | ms / image | images / s | GMAC/s | peak mem (MiB) |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        rate = r["gmacs"] * 1000 / r["ms_per_image"] if r["ms_per_image"] else None
        lines.append(f"| {r['model']} | {r.get('variant', 'eager')} | {r['params'] / 1e6:.2f} | {r['gmacs']:.2f} | "
                     f"{fmt(r['ms_per_image'], '.2f')} | {fmt(r['images_per_s'], '.2f')} | {fmt(rate, '.1f')} | "
                     f"{fmt(r['peak_mem_mib'], '.0f')} |")
    names = [r["model"] for r in rows]
    reference = reference or next((n for n in ("flux-vae", "flux-vae-tiny") if n in names), None)
    if reference in names and len(rows) > 1:
        refs = {r.get("variant", "eager"): r for r in rows if r["model"] == reference}
        lines += ["", f"Ratios against `{reference}` of the same variant (measured side by side in this run):", "",
                  "| model | variant | weights | MACs | time |", "|---|---|---:|---:|---:|"]
        for r in rows:
            variant = r.get("variant", "eager")
            ref = refs.get(variant)
            if ref is None or r["model"] == reference:
                continue
            t = (f"{r['ms_per_image'] / ref['ms_per_image']:.2f}×"
                 if r["ms_per_image"] and ref["ms_per_image"] else "–")
            ratio = r["params"] / ref["params"]
            fewer = f"{100 * (1 - ratio):.0f}% fewer" if ratio < 1 else f"{100 * (ratio - 1):.0f}% more"
            macs = r["gmacs"] / ref["gmacs"]
            lines.append(f"| {r['model']} | {variant} | {ratio:.2f}× ({fewer}) | {macs:.2f}× | {t} |")
    for r in rows:
        if "stage_share_measured" in r:
            lines += ["", f"Core time per stage, `{r['model']}` (measured vs analytic tokens × passes):", "",
                      "| stage | measured | analytic |", "|---|---:|---:|"]
            for key, share in r["stage_share_analytic"].items():
                lines.append(f"| {key} | {100 * r['stage_share_measured'].get(key, 0.0):.1f}% | {100 * share:.1f}% |")
    lines += ["", "![weights vs arithmetic](profile.png)", ""]
    return "\n".join(lines)


def _labelled_scatter(ax, points: list[tuple[str, float, float]]) -> None:
    """Scatter ``(label, x, y)`` points with labels that do not overlap when points (nearly) coincide."""
    placed: list[tuple[float, float]] = []
    for i, (label, x, y) in enumerate(points):
        ax.scatter(x, y, color=f"C{i % 10}", zorder=3)
        # points within ~5% of an earlier one get their label stacked below the earlier labels
        near = sum(1 for px, py in placed if abs(px - x) <= 0.05 * max(px, x) and abs(py - y) <= 0.05 * max(py, y))
        ax.annotate(label, (x, y), xytext=(6, 4 - 11 * near), textcoords="offset points", fontsize=8,
                    color=f"C{i % 10}")
        placed.append((x, y))


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Params vs MACs (every row) and params vs time (the rows timed side by side in this run), log axes."""
    plt = pyplot()

    timed = [r for r in rows if r["ms_per_image"] is not None and r.get("variant", "eager") == "eager"]
    fig, axes = plt.subplots(1, 2 if timed else 1, figsize=(11 if timed else 5.5, 4.2), squeeze=False)
    ax = axes[0][0]
    _labelled_scatter(ax, [(r["model"], r["params"] / 1e6, r["gmacs"]) for r in rows])
    ax.set(xlabel="parameters (M)", ylabel="GMACs / image", title=f"weights vs arithmetic ({rows[0]['resolution']}²)",
           xscale="log", yscale="log")
    ax.margins(0.25)
    ax.grid(alpha=0.3, which="both")
    if timed:
        ax = axes[0][1]
        _labelled_scatter(ax, [(r["model"], r["params"] / 1e6, r["ms_per_image"]) for r in timed])
        ax.set(xlabel="parameters (M)", ylabel="ms / image",
               title=f"weights vs time, timed side by side ({timed[0]['device']}, batch {timed[0]['batch']}, "
                     f"{timed[0]['dtype']})", xscale="log", yscale="log")
        ax.margins(0.3)
        ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# -- quality next to cost ----------------------------------------------------------------------------
def load_quality(path: str | Path) -> list[dict[str, Any]]:
    """Measured quality of trained variants from a study's ``results.json`` (``make study-schedule`` writes one).

    The file holds ``{"rows": {label: {"model": registry name, "model_overrides": {...}, "quality": {"psnr": dB,
    "psnr_sd": dB or null, "ssim": ...}}}}``; returns ``[{"label", "model", "overrides", "psnr", "psnr_sd",
    "ssim"}]`` in file order.
    """
    path = Path(path)
    try:
        rows = json.loads(path.read_text())["rows"]
        entries = []
        for label, row in rows.items():
            q = row["quality"]
            entries.append({"label": label, "model": row["model"], "overrides": dict(row.get("model_overrides") or {}),
                            "psnr": float(q["psnr"]), "psnr_sd": q.get("psnr_sd"), "ssim": q.get("ssim")})
    except FileNotFoundError:
        raise FileNotFoundError(f"--quality {path}: no such file (make study-schedule writes "
                                "docs/study_schedule/results.json)") from None
    except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as err:
        raise ValueError(f"--quality {path}: expected a study results.json with rows of model, model_overrides and "
                         f"quality.psnr ({type(err).__name__}: {err})") from None
    if not entries:
        raise ValueError(f"--quality {path}: no rows")
    return entries


def pareto_front(points: dict[str, tuple[float, float, float]]) -> list[str]:
    """Labels of the points ``(params, macs, quality)`` that no other point matches or beats on all three
    (fewer params, fewer MACs, higher quality) while strictly beating on one; in input order."""
    def dominates(a: tuple[float, float, float], b: tuple[float, float, float]) -> bool:
        return (a[0] <= b[0] and a[1] <= b[1] and a[2] >= b[2]) and (a[0] < b[0] or a[1] < b[1] or a[2] > b[2])

    return [k for k, p in points.items() if not any(dominates(q, p) for j, q in points.items() if j != k)]


def render_quality(rows: list[dict[str, Any]]) -> str:
    """Quality next to weights, arithmetic and time, with the Pareto set on (params, MACs, PSNR)."""
    eager = [r for r in rows if r.get("variant", "eager") == "eager" and r.get("psnr") is not None]
    front = set(pareto_front({r["model"]: (r["params"], r["gmacs"], r["psnr"]) for r in eager}))
    fmt = lambda v, spec: "–" if v is None else format(v, spec)
    lines = ["## Quality next to cost", "",
             "PSNR / SSIM as measured by the study that wrote the `--quality` file (trained weights); params, MACs and "
             "time measured here. Pareto: no other row has ≤ params, ≤ MACs and ≥ PSNR with one strictly better.", "",
             "| variant | params | GMACs | ms / image | PSNR (sd) | SSIM | Pareto |",
             "|---|---:|---:|---:|---:|---:|---|"]
    for r in eager:
        sd = "" if r.get("psnr_sd") is None else f" ({r['psnr_sd']:.2f})"
        lines.append(f"| {r['model']} | {r['params']:,} | {r['gmacs']:.2f} | {fmt(r['ms_per_image'], '.1f')} | "
                     f"{r['psnr']:.2f}{sd} | {fmt(r.get('ssim'), '.4f')} | {'yes' if r['model'] in front else ''} |")
    lines += ["", "![quality vs cost](quality.png)", ""]
    return "\n".join(lines)


def plot_quality(rows: list[dict[str, Any]], path: Path) -> None:
    """PSNR against MACs, parameters and (when timed) ms per image; Pareto rows circled."""
    plt = pyplot()

    eager = [r for r in rows if r.get("variant", "eager") == "eager" and r.get("psnr") is not None]
    front = set(pareto_front({r["model"]: (r["params"], r["gmacs"], r["psnr"]) for r in eager}))
    axes_of = [("GMACs / image", lambda r: r["gmacs"]), ("parameters (M)", lambda r: r["params"] / 1e6)]
    if all(r["ms_per_image"] is not None for r in eager):
        axes_of.append(("ms / image", lambda r: r["ms_per_image"]))
    fig, axes = plt.subplots(1, len(axes_of), figsize=(5.2 * len(axes_of), 4.2), squeeze=False)
    for ax, (xlabel, x) in zip(axes[0], axes_of, strict=True):
        _labelled_scatter(ax, [(r["model"], x(r), r["psnr"]) for r in eager])
        for r in eager:
            if r["model"] in front:
                ax.scatter(x(r), r["psnr"], s=150, facecolors="none", edgecolors="k", zorder=4)
        ax.set(xlabel=xlabel, ylabel="PSNR (dB)")
        ax.margins(0.2)
        ax.grid(alpha=0.3)
    fig.suptitle("quality vs cost (circled: Pareto set on params × MACs × PSNR)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def profile(models: list[str], out_dir: str | Path, quality: str | Path | None = None, breakdown: bool = False,
            train_batch: int = 8, train_resolution: int = 64, **kwargs: Any) -> list[dict[str, Any]]:
    """Profile ``models`` side by side and write ``profile.json``, ``profile.md`` and ``profile.png``.

    With ``quality`` (a study's ``results.json``, see :func:`load_quality`), its variants are profiled after
    ``models``, each with its PSNR/SSIM, and ``profile.md`` / ``quality.png`` put quality next to the cost.
    With ``breakdown`` (CPU only), each of ``models`` also gets the op-class breakdown of a reconstruction and of
    a training step on ``train_batch`` crops of ``train_resolution``² (:mod:`loopvae.breakdown`):
    ``breakdown.json``, ``breakdown.png`` and a section of ``profile.md``.
    """
    if breakdown and kwargs.get("device", "cpu") != "cpu":
        raise ValueError("--breakdown times every op on the CPU; run it with --device cpu "
                         "(GPU timings: make bench-gpu)")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = [row for name in models for row in profile_model(name, **kwargs)]
    measured = load_quality(quality) if quality is not None else []
    for entry in measured:
        for row in profile_model(entry["model"], overrides=entry["overrides"], label=entry["label"], **kwargs):
            row.update(psnr=entry["psnr"], psnr_sd=entry["psnr_sd"], ssim=entry["ssim"])
            rows.append(row)
    (out / "profile.json").write_text(json.dumps(rows, indent=2, allow_nan=False))
    text = render_markdown(rows)
    if measured:
        text += "\n" + render_quality(rows)
        plot_or_warn(plot_quality, rows, out / "quality.png", log=log)
    if breakdown:
        from loopcore.op_breakdown import measure_machine_peaks

        from .breakdown import breakdown_model, plot_breakdown, render_breakdown

        peaks = measure_machine_peaks()
        parts = [breakdown_model(name, peaks, batch=kwargs.get("batch", 1), resolution=kwargs.get("resolution", 256),
                                 train_batch=train_batch, train_resolution=train_resolution,
                                 memory_format=kwargs.get("memory_format", "contiguous"),
                                 repeats=max(1, kwargs.get("iters", 3))) for name in models]
        (out / "breakdown.json").write_text(json.dumps({"peaks": asdict(peaks), "models": parts}, indent=2,
                                                       allow_nan=False))
        text += "\n" + render_breakdown(parts, peaks)
        plot_or_warn(plot_breakdown, parts, out / "breakdown.png", log=log)
    (out / "profile.md").write_text(text)
    plot_or_warn(plot, rows, out / "profile.png", log=log)
    return rows
