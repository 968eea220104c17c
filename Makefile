# Two commands for a fresh machine (README): `make demo` and `make test`. Both create .venv and install everything
# (the package with its `dev` extra, which includes every optional extra). `make test-slow`: the slow tier;
# `make docs`: the documentation site (mkdocs.yml, docs/) built with warnings as errors into site/.
PYTHON ?= python3
VENV ?= .venv
# The CPU wheel of torch 2.13 is what these machines carry; override (e.g. TORCH="torch==2.11.0") elsewhere.
TORCH ?= torch==2.13.0
BIN := $(VENV)/bin
OUTPUT ?= outputs/demo

.PHONY: install demo test test-journeys test-slow test-all bench docs lint lm-bytes whole-model

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# Packages are installed where the venv is new or pyproject.toml changed since its last install (the stamp file).
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $@

install: $(VENV)/.installed
	$(BIN)/python -m hf_tensorcompress.assets

# The test tiers run on every core (pytest-xdist; tests/conftest.py keeps that safe). PYTEST_WORKERS=0: one process.
PYTEST_WORKERS ?= auto
PYTEST := $(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist worksteal

demo: install
	$(BIN)/accelerate launch recipes/smartformer.py --output-dir $(OUTPUT) \
		--runs dense smartformer svd-smartformer cp-fixed-0.3 cp-fixed-0.6 cp-fixed-1

# The fast tier: every method and family, the command line, checkpoints, the fast README and docs examples.
test: install
	$(PYTEST) -q -m "not slow and not journey"

# The journey tier: the documented flows as users run them, every step in a new process, in the full environment,
# a minimal one (no extras) and a bare one (torch + transformers only), whose packages the tests cache under
# ~/.cache/hf_tensorcompress/journey-envs (the library itself is installed per run); the docs' python blocks as scripts.
test-journeys: install
	$(PYTEST) -q -m "journey and not slow" --durations=10

# The slow tier: real-model checks (SmolLM2), full recipes, the slow README and docs examples (as scripts).
test-slow: install
	$(PYTEST) -q -m slow --durations=15

test-all: install
	$(PYTEST) -q

bench: install
	$(BIN)/python benchmarks/cp_layer.py

# The docs site: every page, the API reference from the docstrings; a warning (broken link, page missing from the
# nav, docstring not matching its signature) fails the build.
# Lint and formatting (ruff, configured in pyproject.toml): `ruff format .` fixes the formatting.
lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# SmolLM2's tied embedding: quantization arms (torchao, bitsandbytes, gguf; RTN below 4 bits) against the tiered
# and tt methods, in bytes, calibrated on Moby Dick and scored on every corpus (docs/results/lm_embeddings_vs_quantization.md).
# LM_BYTES_FLAGS="" calibrates on every corpus and runs every arm (about 3× longer).
LM_BYTES_ARMS ?= torchao-int8-row bnb-int8-row bnb-nf4-b64 gguf-q8_0 gguf-q5_0 gguf-q4_1 gguf-q4_0 rtn-int4-g64 \
	rtn-int3-g64 rtn-int2-g64 tiered-codebook tiered-int4/codebook-2k tiered-int4 tiered-int4/int3-24k tiered-int4/int3-20k tiered-int4/int3-8k tiered-int3 rows16+svd \
	rows-int4+svd-16k rows-int4+svd-12k rows-int4+svd-6k tt-calib-int8 tt-calib-int4
LM_BYTES_FLAGS ?= --calibration-corpora moby_dick --byte-arms $(LM_BYTES_ARMS)
lm-bytes: install
	OMP_NUM_THREADS=1 $(BIN)/python recipes/tensorslm_domains.py --output-dir docs/results/lm_embeddings_vs_quantization \
		--ratios 2 --arms tt-calib $(if $(LM_BYTES_FLAGS),$(LM_BYTES_FLAGS),--byte-arms all)

# SmolLM2-135M, the whole checkpoint: bytes on disk and peak RSS after load vs Δ ln PPL on the two corpora the
# calibration never saw, for torchao / gguf / bitsandbytes alone and the tiered 6× embedding stacked with each
# (docs/results/whole_model.md).
whole-model: install
	OMP_NUM_THREADS=2 $(BIN)/python benchmarks/whole_model.py --output-dir docs/results/whole_model
