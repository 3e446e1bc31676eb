# loopvision: the two commands of the quick start are `make demo` and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
# pytest-xdist workers (one torch thread each; tests of one file stay on one worker, so module fixtures are built
# once); PYTEST_WORKERS=0 runs everything in one process.
PYTEST_WORKERS ?= 2

.PHONY: setup test lint demo bench bench-gpu study study-report study-quick study-vae study-vae-report study-schedule study-schedule-report study-fair study-fair-report study-sharing study-sharing-report study-srvit-depth recipe-search-vae \
	release-vae release-references release-vae-gpu-prepare release-vae-gpu clean

setup: $(STAMP)

# Re-installs whenever pyproject.toml or constraints.txt changes; pyproject.toml gives compatible ranges,
# constraints.txt the exact tested versions. torch/torchvision come from the local wheel store here.
$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q pip==26.3
	$(BIN)/python -m pip install -e '.[dev]' -c constraints.txt
	touch $(STAMP)

test: setup
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile --durations=15 $(PYTEST_ARGS)

# The main job: train, evaluate, intervene and profile the tiny LoopVAE on the bundled images.
demo: setup
	$(BIN)/loopvae demo --out runs/demo

# Benchmarks write their tables to docs/; each records the command that produced it.
bench: setup
	$(BIN)/python benchmarks/bench_data.py --out docs/benchmarks.md
	$(BIN)/python benchmarks/bench_vae.py --out docs/benchmarks.md
	$(BIN)/python benchmarks/bench_srvit.py --out docs/benchmarks.md

# The paper's GPU runtime protocol (bf16, batch 8, 10 + 100 passes, eager and compiled); needs a CUDA GPU.
bench-gpu: setup
	benchmarks/gpu_profile.sh

# Studies are specs under studies/ run by one engine (docs/studies.md): `make study NAME=sharing` plans, runs and
# resumes a study (two jobs; finished runs keep their committed result files) and renders its page. The default
# NAME is the recurrence study (74 runs, ~3.4 h on 2 CPU cores) -> docs/study_recursion.md.
NAME ?= recursion
study: setup
	$(BIN)/loopvae study $(NAME) --jobs 2

# Re-render a study's page, results.json and figures from its committed result files (no training).
study-report: setup
	$(BIN)/loopvae study $(NAME) --render-only

# The recurrence study at 1 seed, 200 steps and 2,000 test images (a check, ~40 min) -> runs/study-quick/.
study-quick: setup
	$(BIN)/loopvae study recursion --option quick=true --docs-root runs/study-quick --workdir runs/study-quick/work \
		--jobs 2

# The LoopVAE study on the shared ImageNet sample + Kodak (spec studies/vae.py; about two hours on 2 CPU cores)
# -> docs/study_loopvae.md.
study-vae: setup
	$(BIN)/loopvae study vae --jobs 2

# Re-render docs/study_loopvae.md (and the release page it shows) from the committed results without training.
study-vae-report: setup
	$(BIN)/loopvae study release-vae --render-only
	$(BIN)/loopvae study vae --render-only

# Where should the loops go? 8 schedule arms (15 runs, the release recipe at 1,500 steps) and flux-vae-tiny, then the
# measure run (CPU time side by side, any-time decoding) (~2.5 h on 2 cores) -> docs/study_schedule.md; each run writes
# docs/study_schedule/runs/<run>.json (commit them as they come); a rerun runs only what is missing.
study-schedule: setup
	$(BIN)/loopvae study schedule --jobs 2

# Re-render docs/study_schedule.md and its plots from the committed result files (no training or measuring).
study-schedule-report: setup
	$(BIN)/loopvae study schedule --render-only

# A fair fight (docs/study_fair.md): the AutoencoderKL reference's shape sweep, one recipe search per arm of the 2 x 2
# (LoopVAE / AutoencoderKL / LoopVAE with shortcuts / AutoencoderDC; 9 arms each, the same CPU budget per arm), then
# the main runs (3 seeds per arm, equal images and equal CPU-seconds) on one committed code version. Each finished run
# writes docs/study_fair/runs/<run>.json (commit them as they come); a rerun trains only what is missing. About
# 1.6 h (shapes + searches) + 2.3 h (main) of two-job CPU time: two sittings.
study-fair: setup
	$(BIN)/loopvae study fair --jobs 2

# Re-render docs/study_fair.md (+ docs/study_fair/results.json, curves.png) from the committed result files.
study-fair-report: setup
	$(BIN)/loopvae study fair --render-only

# What sharing itself costs (docs/study_sharing.md, spec studies/sharing.py): loopvae-cnn-tiny with shortcuts at
# sharing=global / scale / none (same graph and MACs), a learning-rate check per arm, then 5 seeds x 1,500 steps (all
# three) and 3 seeds x 4,500 steps (global, none, and dcae-tiny at its fair-study pick); pre-registered Q1, Q2,
# P2-long with Holm. About 6 h of two-job CPU time: several sittings (commit each docs/study_sharing/runs/<run>.json as
# it comes; a later sitting runs from a worktree of plan.json's commit, docs/studies.md).
study-sharing: setup
	$(BIN)/loopvae study sharing --jobs 2

# Re-render docs/study_sharing.md (+ results.json, curves.png) from the committed result files alone.
study-sharing-report: setup
	$(BIN)/loopvae study sharing --render-only

# SoftMoR's headline at a budget where depth can pay (docs/study_srvit_depth.md, spec studies/srvit_depth.py): a
# pilot, then SR-ViT R1 and R4 x 5 seeds x 60 epochs on CIFAR-10 (one recipe), P1 = R4 - R1; ~5.5 h on 2 cores (the pilot's projection).
study-srvit-depth: setup
	$(BIN)/loopvae study srvit-depth --jobs 2

# The bundled model's recipe search (spec studies/release_vae.py, phase search): 9 one-change arms x ~6.5 CPU-minutes,
# two at a time (~30 min) -> docs/study_loopvae/release.md, shown in docs/study_loopvae.md.
recipe-search-vae: setup
	$(BIN)/loopvae study release-vae --phase search --jobs 2
	$(MAKE) study-vae-report

# Train, measure and bundle the CPU tokenizer assets/models/loopvae-cnn-tiny with the release-tiny recipe, and
# flux-vae-tiny at the same images seen (~2 h on 2 cores; rerunning resumes) -> docs/study_loopvae/release/, then the
# tuned references (release-references below), then re-renders docs/study_loopvae.md.
release-vae: setup
	$(BIN)/loopvae study release-vae --phase release bundle --jobs 2
	$(MAKE) release-references

# The tuned references alone (phase references of studies/release_vae.py): assets/models/<AutoencoderKL pick> and
# assets/models/dcae-tiny, each at its own search's recipe (docs/study_fair.md), the bundled LoopVAE's images seen;
# ~45 min on 2 cores; a reference that does not beat bicubic on the held-out images is not bundled (its numbers stay
# in docs/study_loopvae/release/runs/<model>-s0.json with status "refused", and on the page) and the target fails;
# then re-renders docs/study_loopvae.md and docs/study_fair.md (its section 5).
release-references: setup
	$(BIN)/loopvae study release-vae --phase references --jobs 2 --no-render; status=$$?; \
		$(MAKE) study-vae-report study-fair-report && exit $$status

# GPU release, step 1 (here): the compact training shard + held-out shard in gpu-data/ (git-ignored via
# .git/info/exclude) and the wheels the device image lacks in .whl/; carry both to the device.
release-vae-gpu-prepare: setup
	$(BIN)/python studies/_release_vae_gpu.py prepare --out gpu-data
	grep -qx '/gpu-data/' .git/info/exclude || echo /gpu-data/ >> .git/info/exclude
	grep -qx '/.whl/' .git/info/exclude || echo /.whl/ >> .git/info/exclude
	$(PYTHON) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
		--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
		diffusers==0.42.1 webdataset==1.0.2 braceexpand==0.1.7 lpips==0.1.4 piq==0.8.0 huggingface-hub==2.4.0

# GPU release, step 2 (on the device, one call of <= 9 minutes, with gpu-data and .whl carried; python3 there
# holds torch): train loopvae-cnn-small and flux-vae-small, evaluate, export to $(OUT). Then, here:
# `$(BIN)/python studies/_release_vae_gpu.py bundle --source <the files that came back>`.
OUT ?= runs/release-vae-gpu/out
release-vae-gpu:
	if [ -d .whl ]; then python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl; fi
	PYTHONPATH=/tmp/site:packages/core:packages/vae:packages/classifier:pipelines:$$PYTHONPATH PYTHONUNBUFFERED=1 \
		python3 studies/_release_vae_gpu.py run --data gpu-data --out $(OUT) --device cuda --budget-s 170

lint: setup
	$(BIN)/ruff check packages pipelines tests benchmarks studies

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
