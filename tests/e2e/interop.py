"""Real MCP SDK replicas and clients (tests/interop) behind the guard in real Envoy.

Replicas built from the TypeScript SDK (node) or the Python SDK (the project's .venv) are started by
the stack package on the harness ports, so E2E_PORT_OFFSET shifts them like everything else. Clients
run as subprocesses with bounded timeouts and print one JSON object.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import urllib.request

import pytest

import harness as h
from stack.services import INTEROP, NODE, PYTHON
from stack.topology import Stack, running

AFFINITY_CONFIG = "envoy-ts-affinity.yaml"


def node_ready() -> bool:
    return (INTEROP / "node_modules" / "@modelcontextprotocol" / "sdk" / "package.json").exists()


def python_sdk_ready() -> bool:
    r = subprocess.run([PYTHON, "-c", "import mcp"], capture_output=True, timeout=30)
    return r.returncode == 0


def require_sdks(node: bool = True, python: bool = True) -> None:
    """A suite that needs the real SDKs fails without them: `make test` installs them, and a
    skipped interop suite must never pass for a green run."""
    missing = [what for what, need, ready in (
        ("npm ci --prefix tests/interop (make interop-deps)", node, node_ready),
        ("pip install -r tests/interop/requirements.txt (make interop-deps)", python, python_sdk_ready),
    ) if need and not ready()]
    if missing:
        raise RuntimeError("the official MCP SDKs are not installed: " + "; ".join(missing))


def affinity_envoy(name: str, guard: bool = True, plugin_overrides: dict | None = None,
                   replica_ports: list[int] | None = None) -> h.Envoy:
    cfg = h.envoy_config(guard=guard, plugin_overrides=plugin_overrides, replica_ports=replica_ports,
                         base=AFFINITY_CONFIG)
    return h.Envoy(name, cfg).start()


def url(port: int = h.ENVOY_PORT) -> str:
    return f"http://{h.HOST}:{port}{h.PATH}"


def run_json(args: list, timeout: float = 40.0) -> dict:
    """Run a client script; its last stdout line is a JSON object."""
    r = subprocess.run([str(a) for a in args], capture_output=True, timeout=timeout, cwd=h.ROOT, text=True,
                       env={**os.environ, "NODE_NO_WARNINGS": "1"})
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    assert lines, f"no JSON from {args[1]} (rc {r.returncode}): {r.stdout[-2000:]} {r.stderr[-2000:]}"
    out = json.loads(lines[-1])
    out["_rc"] = r.returncode
    out["_stderr"] = r.stderr[-4000:]
    return out


def ts_client(scenario: str, *args, port: int = h.ENVOY_PORT, timeout: float = 40.0) -> dict:
    return run_json([NODE, INTEROP / "ts_client.mjs", scenario, "--url", url(port), *args], timeout=timeout)


def py_client(scenario: str, *args, port: int = h.ENVOY_PORT, timeout: float = 40.0) -> dict:
    return run_json([PYTHON, INTEROP / "py_client.py", scenario, "--url", url(port), *args], timeout=timeout)


def replica_state(port: int) -> dict:
    with urllib.request.urlopen(f"http://{h.HOST}:{port}/_interop/state", timeout=3) as r:
        return json.loads(r.read())


def replica_post(port: int, path: str) -> int:
    req = urllib.request.Request(f"http://{h.HOST}:{port}{path}", method="POST", data=b"")
    try:
        with urllib.request.urlopen(req, timeout=3) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def reset_replicas(ports: list[int]) -> None:
    for p in ports:
        replica_post(p, "/_interop/reset")


def cursors_at_replicas(ports: list[int]) -> list[dict]:
    out = []
    for p in ports:
        try:
            for r in replica_state(p)["requests"]:
                if r.get("last_event_id"):
                    out.append({**r, "port": p})
        except OSError:
            pass
    return out


SDK_ID = re.compile(r"^([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-|_GET_stream|\d+_)|_(r|py)\d_")


def is_guard_cursor(token: str | None) -> bool:
    """Guard cursors are opaque base64url: the replicas' own `<stream>_<replica>_<n>` ids never show through."""
    return bool(token) and re.fullmatch(r"[A-Za-z0-9_-]{20,}", token) is not None and not SDK_ID.search(token)


class SdkStack(Stack):
    """Three SDK replicas (kind "ts" or "py") on the harness replica ports, behind the affinity Envoy.

    Borrows the ports from the naive-replica `stack` fixture: its Envoy and replicas are stopped
    first (its `fresh` fixture starts them again on demand) and its ownership service is shared.
    """

    def __init__(self, stack: Stack, kind: str):
        super().__init__(stack.state_dir, replicas=kind, ownership_ports=[], base=AFFINITY_CONFIG,
                         name=f"envoy-{kind}")
        self.stack = stack

    def start(self, **replica_args) -> "SdkStack":
        self.stack.vacate()
        self.stack.ensure_ownership()
        for p in self.replicas.values():
            p.stop()
        self.replica_args = replica_args
        self.ensure_replicas(reset=False)
        return self


def sdk_fixtures(kind: str):
    """The fixtures of a suite on one SDK's replicas: `<kind>` (module: the SdkStack) and `<kind>f`
    (each test: its replicas reset)."""
    @pytest.fixture(scope="module", name=kind)
    def held(stack):
        s = SdkStack(stack, kind)
        yield from running(s, s.start)

    @pytest.fixture(name=f"{kind}f")
    def fresh(request):
        s = request.getfixturevalue(kind)
        s.reset()
        return s

    return held, fresh


def resumes(out: dict) -> list[dict]:
    """GETs with Last-Event-ID that got an answer (a request aborted by the client's close has none)."""
    return [x for x in out["http"] if x["method"] == "GET" and x["last_event_id"] and x.get("status")]


def envelope_inner(session: str) -> str:
    """The server's own session id inside an `envelope` stateful_session value `<b64 host>;UV:<b64 id>`."""
    import base64
    return base64.b64decode(session.split(";UV:", 1)[1]).decode()
