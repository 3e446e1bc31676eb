# loopvision: the two commands of the quick start are `make demo` and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: setup test lint demo bench bench-gpu study study-quick study-vae clean

setup: $(STAMP)

# Re-installs whenever pyproject.toml or constraints.txt changes; pyproject.toml gives compatible ranges,
# constraints.txt the exact tested versions. torch/torchvision come from the local wheel store here.
$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -e '.[dev]' -c constraints.txt
	touch $(STAMP)

test: setup
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

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

# The recurrence study on the shared CIFAR-10 shards (3 seeds, lr sweep; about 1.5 hours on 2 CPU cores)
# -> docs/study_recursion.md; finished runs in runs/study are reused.
study: setup
	$(BIN)/python benchmarks/study_recursion.py --out docs/study_recursion.md

# The same study at 1 seed, 200 steps and 2,000 test images (a check, ~15 minutes) -> runs/study-quick/.
study-quick: setup
	$(BIN)/python benchmarks/study_recursion.py --quick

# The LoopVAE study on the shared ImageNet sample + Kodak (about two hours on 2 CPU cores) -> docs/study_loopvae.md;
# it also rebuilds the bundled trained model in assets/models/loopvae-cnn-tiny.
study-vae: setup
	$(BIN)/python benchmarks/study_loopvae.py --out docs/study_loopvae.md --bundle assets/models/loopvae-cnn-tiny

lint: setup
	$(BIN)/ruff check packages pipelines tests benchmarks

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
