#!/usr/bin/env bash
# The paper's GPU runtime protocol (bf16, batch 8, 10 warm-up + 100 timed, eager and compiled) for
# loopvae-cnn-f8d16, loopvae-vit-f8d16 and flux-vae; rewrites the loopvae-gpu-profile section of
# docs/benchmarks.md. Needs a CUDA GPU and the project's venv (make setup).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
exec "$PYTHON" benchmarks/bench_vae_gpu.py --out docs/benchmarks.md "$@"
