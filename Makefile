# Two commands do all setup on a fresh machine: `make demo` and `make test`. Both call `setup` first.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: setup system-deps verl-core native kafka-jars dashboard-assets browser-deps prometheus-tools demo test test-unit test-integration test-faults bench bench-check bench-learning validate-deploy up down status clean gpu-check gpu-wheels vllm

setup: system-deps $(STAMP) verl-core native kafka-jars dashboard-assets

# Java (the broker) and Maven (fetches its jars). Present on this machine kind; installed when missing.
system-deps:
	@command -v java >/dev/null && command -v mvn >/dev/null || { \
	  echo "installing Java and Maven (apt-get)"; \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq openjdk-17-jre-headless maven >/dev/null; \
	  else echo "Java 17 and Maven are needed: sudo apt-get install -y openjdk-17-jre-headless maven" >&2; exit 1; fi; }

# The venv's packages are installed by uv (from PyPI, pinned here; the same resolution as pip's, 2.5 minutes less on
# this machine kind: bench/results/install-2026-12-04.md); pip stays in the venv for what runs it (trainer/model_import.py).
UV_VERSION := 0.13.8
UV := $(BIN)/uv pip install -q --python $(BIN)/python
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip uv==$(UV_VERSION)
	$(UV) -e '.[all,test,trackers]'
	@touch $(STAMP)

# The compiled hot paths (native/: the Span writer, the span stage's decoder; a Rust extension built
# by maturin from PyPI), installed into the venv. cargo is looked for on PATH, then in ~/.cargo/bin
# (where rustup puts it); where neither has it, as root, Debian's cargo-web (Rust 1.96 from
# bookworm-security; Debian's plain cargo is Rust 1.63, below pyo3 0.26's 1.74) is installed, as Java is.
# Without cargo, or when the build fails, nothing stale stays installed and the Python paths run (the
# span stage says so once in its log; in CI the native tests fail, naming it); `make native` again once
# Rust is installed.
NATIVE_STAMP := $(VENV)/.native
native: $(NATIVE_STAMP)
$(NATIVE_STAMP): $(STAMP) native/Cargo.toml native/Cargo.lock native/pyproject.toml $(wildcard native/src/*.rs)
	@export PATH="$$PATH:$$HOME/.cargo/bin"; \
	if ! command -v cargo >/dev/null && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "installing cargo (apt-get: Debian's cargo-web), to build native/"; \
	  apt-get update -qq && apt-get install -y -qq cargo-web >/dev/null || echo "cargo-web did not install (above)" >&2; fi; \
	if ! command -v cargo >/dev/null; then \
	  $(PIP) uninstall -q -y rolloutbus-native 2>/dev/null; \
	  echo "cargo not found (PATH, ~/.cargo/bin): native/ not built, the Python paths run (install a Rust toolchain with cargo, then make native)" >&2; \
	elif echo "building native/ (the compiled Span writer and span decoder) with $$(cargo --version)" && \
	     $(PIP) install -q ./native && $(BIN)/python -c "import rolloutbus_native"; then touch $@; \
	else \
	  $(PIP) uninstall -q -y rolloutbus-native 2>/dev/null; \
	  echo "native/ did not build (above): the Python paths run" >&2; \
	fi

# verl's algorithm library (estimators, policy losses) beside the project's own torch and transformers, without
# verl's dependency pins (deploy/python/verl-core.txt says why), registered by trainer/verl_losses.py and
# streams/verl_estimators.py; deploy/python/verl_wheel_fix.py removes the `tests` package verl's wheel ships.
VERL_STAMP := $(VENV)/.verl-core
verl-core: $(VERL_STAMP)
$(VERL_STAMP): $(STAMP) deploy/python/verl-core.txt deploy/python/verl_wheel_fix.py
	$(UV) --no-deps -r deploy/python/verl-core.txt
	$(BIN)/python deploy/python/verl_wheel_fix.py
	$(BIN)/python -c "import verl.trainer.ppo.core_algos, tests; assert tests.__file__ is None, tests.__file__"
	@touch $@

kafka-jars: $(STAMP)
	@$(BIN)/python -c "from rolloutbus.local_kafka import fetch_jars; print('kafka jars in', fetch_jars())"

# The dashboard's charting library, from the npm registry at build time (never a CDN at run time): the
# package's tarball (`npm pack`, integrity-checked by npm), two files of its dist/ copied into the package.
UPLOT_VERSION := 1.6.32
VENDOR := rolloutbus/dashboard/static/vendor
dashboard-assets: $(VENDOR)/uPlot.iife.min.js
$(VENDOR)/uPlot.iife.min.js:
	@if ! command -v npm >/dev/null && [ "$$(id -u)" = 0 ]; then \
	  echo "installing npm (apt-get), to fetch the dashboard's charting library"; \
	  apt-get update -qq && apt-get install -y -qq npm >/dev/null; fi; \
	if ! command -v npm >/dev/null; then \
	  echo "npm is missing: the dashboard runs without its charts (sudo apt-get install -y npm, then make dashboard-assets)" >&2; exit 0; fi; \
	tmp=$$(mktemp -d) && (cd $$tmp && npm pack --silent uplot@$(UPLOT_VERSION) >/dev/null) && \
	tar -xzf $$tmp/uplot-$(UPLOT_VERSION).tgz -C $$tmp package/dist/uPlot.iife.min.js package/dist/uPlot.min.css package/LICENSE && \
	mkdir -p $(VENDOR) && cp $$tmp/package/dist/uPlot.min.css $$tmp/package/LICENSE $(VENDOR)/ && \
	cp $$tmp/package/dist/uPlot.iife.min.js $(VENDOR)/ && rm -rf $$tmp && echo "uPlot $(UPLOT_VERSION) in $(VENDOR)"

# Debian's Chromium and its WebDriver, for the dashboard's browser tests (no browser download at run time).
browser-deps:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || { \
	  echo "installing chromium and chromium-driver (apt-get)"; \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq chromium chromium-driver >/dev/null; \
	  else echo "the browser tests need: sudo apt-get install -y chromium chromium-driver" >&2; exit 1; fi; }

# Prometheus and promtool (Debian's prometheus 2.42) for the monitoring tests; apt-get when missing.
prometheus-tools:
	@bash deploy/prometheus/install-tools.sh

# vLLM (PyPI's CPU build) in a virtualenv of its own under ~/.cache/rolloutbus (its pins conflict with faust-streaming's),
# made once by trainer/vllm_venv.py (about 6.2 GB; a marker file makes later calls instant). `rolloutbus serve --engine
# vllm` and the vLLM tests use it; ROLLOUTBUS_VLLM_PYTHON names another interpreter with vLLM instead (a GPU's `vllm`).
vllm: $(STAMP)
	@$(BIN)/python -m trainer.vllm_venv >/dev/null && echo "vLLM venv ready: $$($(BIN)/python -m trainer.vllm_venv)"

demo: setup
	$(BIN)/rolloutbus demo $(DEMO_ARGS)

# Unit tests, then integration and fault tests against the real broker (started by the test session
# in a scratch data dir, or ROLLOUTBUS_KAFKA_BOOTSTRAP) and the real ClickHouse engine (chDB), the
# monitoring tests against a real Prometheus, and the deploy/ topology in containers (tests/deploy:
# podman, images built here and cached by content hash; `make test-deploy` runs it alone).
#
# Two passes: most tests wait (on brokers, workers, deadlines) more than they compute (the CPUs were 28% busy
# during the integration tests run one at a time), so they run on TEST_WORKERS processes at once, each with
# its own broker, a test file to one process; then the tests marked `solo` (the learning test's margin depends
# on CPU time, the container topology fills the memory, the scale-out test's rebalances have deadlines) run
# alone. Both passes always run; either failing fails. The parallel pass hands the slowest files out first (the
# record in tests/durations.json, tests/schedule.py says why and how to refresh it), not xdist's most-tests-first.
# A pass that selects no test (PYTEST_ARGS naming files of the other kind) is not a failure.
TEST_WORKERS ?= 3
test: setup browser-deps prometheus-tools containers-host validate-deploy vllm
	@rc=0; \
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not solo" tests $(PYTEST_ARGS) || { r=$$?; [ $$r = 5 ] || rc=$$r; }; \
	$(BIN)/python -m pytest -q -m solo tests $(PYTEST_ARGS) || { r=$$?; [ $$r = 5 ] || [ $$rc != 0 ] || rc=$$r; }; \
	exit $$rc

test-unit: setup
	$(BIN)/python -m pytest -q tests/unit $(PYTEST_ARGS)

test-integration: setup browser-deps
	$(BIN)/python -m pytest -q tests/integration $(PYTEST_ARGS)

# The longer fault suite (the CI run uses the bounded version inside `make test`).
test-faults: setup
	ROLLOUTBUS_FAULTS_LONG=1 $(BIN)/python -m pytest -q tests/faults $(PYTEST_ARGS)

bench: setup
	$(BIN)/rolloutbus bench $(BENCH_ARGS)

# The data plane's guard (bench/check.py): the e2e bench at 100k spans, rolloutbus alone, this checkout against the
# commit recorded in bench/results/bench-check.json, alternately (three runs each as fast as the gateway takes them, two
# at 3,300 spans/s); fails when CPU per span or p99 regressed past the stated tolerance. Not part of `make test` (a
# bench, not a timed test): about 11 minutes. Run it before a data-plane change lands; BENCH_CHECK_ARGS="--record"
# re-baselines on purpose.
bench-check: setup
	$(BIN)/python -m bench.check $(BENCH_CHECK_ARGS)

# Learning side by side with TRL's GRPOTrainer (its own virtualenv, installed on first use): three systems x three
# runs of LEARNING_ARGS' minutes each, one after the other, about 25 minutes a round on 2 cores.
bench-learning: setup
	$(BIN)/python -m bench.bench_learning $(LEARNING_ARGS)

# The GPU trainer check (tests/gpu/gpu_check.py): the trainer's GRPO step on CUDA against the CPU (fp32, bf16),
# step time, tokens/s and peak memory at 135M and 1B, verl where it imports. On a GPU machine (no venv there: the
# image's python3, with gpu-wheels/ carried and installed when pydantic or fastavro is missing), one command:
#   make gpu-check GPU_CHECK_ARGS="--device cuda --out $OUT"
# or, where there is no make:
#   set -o pipefail; python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
#     gpu-wheels/*.whl && export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 && \
#     python3 tests/gpu/gpu_check.py --device cuda --out $OUT 2>&1 | tee $OUT/gpu-check.log
# Without a GPU, --device auto runs the CPU mode that `make test` runs (tests/gpu).
GPU_CHECK_ARGS ?= --device auto
GPU_WHEELS := gpu-wheels
gpu-check:
	@py=$(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON)); \
	if ! $$py -c "import pydantic, fastavro" 2>/dev/null; then \
	  $$py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/rolloutbus-site \
	    $(GPU_WHEELS)/*.whl || exit 1; export PYTHONPATH=/tmp/rolloutbus-site; fi; \
	PYTHONUNBUFFERED=1 $$py tests/gpu/gpu_check.py $(GPU_CHECK_ARGS)

# The wheels the GPU machine's image lacks for that check (its Python 3.12, manylinux x86_64), in the versions this
# venv runs, from PyPI into gpu-wheels/ (ignored; never committed). They travel with the working tree, which must
# stay under 64 MiB in all: the sizes are printed. verl's path does not fit (ray's wheel alone is 79 MB).
GPU_WHEEL_PACKAGES := pydantic pydantic-core annotated-types typing-inspection typing-extensions fastavro
gpu-wheels: $(STAMP)
	@rm -rf $(GPU_WHEELS) && mkdir -p $(GPU_WHEELS) && \
	pins=$$($(BIN)/python -c "import importlib.metadata as m, sys; print(' '.join(p + '==' + m.version(p) for p in sys.argv[1:]))" \
	  $(GPU_WHEEL_PACKAGES)) && echo "fetching $$pins" && \
	$(PIP) download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
	  -d $(GPU_WHEELS) $$pins && \
	du -b $(GPU_WHEELS)/*.whl | sort -n && \
	wheels=$$(du -cb $(GPU_WHEELS)/*.whl | tail -1 | cut -f1) && \
	tree=$$(git ls-files -co --exclude-standard -z | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1) && \
	echo "carried: working tree $$((tree / 1024)) KiB + wheels $$((wheels / 1024)) KiB = $$(((tree + wheels) / 1048576)) MiB of 64" && \
	test $$((tree + wheels)) -lt $$((64 * 1048576)) || { echo "over the 64 MiB a GPU run may carry" >&2; exit 1; }

validate-deploy: setup
	@if [ -x deploy/validate.sh ]; then PYTHON=$(BIN)/python bash deploy/validate.sh; fi

up: setup
	$(BIN)/rolloutbus up
down:
	$(BIN)/rolloutbus down
status:
	$(BIN)/rolloutbus status

clean:
	rm -rf $(VENV) .pytest_cache

# Containers on this host: podman, images, the compose topology (deploy/containers/containers.mk).
include deploy/containers/containers.mk
