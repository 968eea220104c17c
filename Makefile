# Two commands for a fresh machine (README): `make demo` and `make test`. Both create .venv and install everything.
PYTHON ?= python3
VENV ?= .venv
# The CPU wheel of torch 2.13 is what these machines carry; override (e.g. TORCH="torch==2.11.0") elsewhere.
TORCH ?= torch==2.13.0
BIN := $(VENV)/bin
OUTPUT ?= outputs/demo

.PHONY: install demo test bench

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

install: $(BIN)/python
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e ".[dev]"
	$(BIN)/python -m hf_tensorcompress.assets

demo: install
	$(BIN)/accelerate launch recipes/cp_compress.py --output-dir $(OUTPUT)

test: install
	$(BIN)/python -m pytest -q

bench: install
	$(BIN)/python benchmarks/cp_layer.py
