"""The paper's runtime protocol on one CUDA GPU: bf16, batch 8, 10 warm-up + 100 timed reconstructions
(encoder -> posterior sample -> decoder), eager and ``torch.compile``d, for ``loopvae-cnn-f8d16``,
``loopvae-vit-f8d16`` and ``flux-vae``; ms/image = batch latency / 8, peak memory = max allocated.

Usage (on a machine with a CUDA GPU): ``make bench-gpu`` or
``.venv/bin/python benchmarks/bench_vae_gpu.py --out docs/benchmarks.md`` (rewrites the section
``loopvae-gpu-profile``). Exits with status 2 and a message when no CUDA device is present.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch
from sections import publish  # benchmarks/ is on sys.path when a script here runs

from loopvae.profile import profile

COMMAND = ".venv/bin/python benchmarks/bench_vae_gpu.py --out docs/benchmarks.md"
MODELS = ["loopvae-cnn-f8d16", "loopvae-vit-f8d16", "flux-vae"]
PAPER_MS = {"loopvae-cnn-f8d16": 35.13, "flux-vae": 12.34}


def render(rows: list[dict], args: argparse.Namespace) -> str:
    gpu = torch.cuda.get_device_name(0)
    lines = [
        f"## LoopVAE runtime on GPU: the paper's protocol ({gpu}, bf16, batch {args.batch}, 256²)", "",
        f"Command: `{COMMAND}` (= `loopvae profile --models {','.join(MODELS)} --device cuda --dtype bf16 --batch "
        f"{args.batch} --warmup {args.warmup} --iters {args.iters} --memory-format {args.memory_format} --compile`). "
        f"torch {torch.__version__}, CUDA {torch.version.cuda}. Paper (one 96 GB GPU, bf16, batch 8): LoopVAE-CNN "
        "35.13 ms/image, Flux-style CNN 12.34 ms/image (2.85×).", "",
        "| model | variant | params (M) | GMACs | ms / image | paper ms / image | images / s | TFLOP/s "
        "| peak alloc (MiB) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        tflops = 2 * r["gmacs"] / r["ms_per_image"]
        paper = PAPER_MS.get(r["model"]) if r["variant"] == "eager" else None
        lines.append(f"| {r['model']} | {r['variant']} | {r['params'] / 1e6:.2f} | {r['gmacs']:.2f} | "
                     f"{r['ms_per_image']:.2f} | {paper if paper else '–'} | {r['images_per_s']:.1f} | {tflops:.1f} | "
                     f"{r['peak_mem_mib']:.0f} |")
    ref = {r["variant"]: r for r in rows if r["model"] == "flux-vae"}
    lines += ["", "| model | variant | MACs vs flux-vae | time vs flux-vae |", "|---|---|---:|---:|"]
    for r in rows:
        base = ref.get(r["variant"])
        if r["model"] != "flux-vae" and base is not None:
            lines.append(f"| {r['model']} | {r['variant']} | {r['gmacs'] / base['gmacs']:.2f}× | "
                         f"{r['ms_per_image'] / base['ms_per_image']:.2f}× |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, help="markdown file whose 'loopvae-gpu-profile' section is rewritten")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--memory-format", default="channels_last", choices=("channels_last", "contiguous"))
    parser.add_argument("--json", type=Path, help="also write the raw rows here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_vae_gpu: no CUDA device here; run it on a machine with a GPU", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        rows = profile(MODELS, tmp, device="cuda", batch=args.batch, resolution=256, dtype="bf16",
                       warmup=args.warmup, iters=args.iters, memory_format=args.memory_format, compile=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    publish(render(rows, args), args.out, "loopvae-gpu-profile")
    return 0


if __name__ == "__main__":
    sys.exit(main())
