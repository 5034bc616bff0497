"""The services of the stack, each started on its port and stopped by pid: MCP replicas (this
repository's naive and rmcp replicas, servers on the official TypeScript and Python SDKs in
tests/interop), the ownership service and a throw-away Redis."""
from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path

from .procs import HOST, OWNERSHIP_PORT, REDIS_PORT, ROOT, Proc, binary

INTEROP = ROOT / "tests" / "interop"
NODE = shutil.which("node") or "node"
PYTHON = str(ROOT / ".venv" / "bin" / "python")
# The Python SDK server imports the contiguity adapter (--contiguity) from its source tree.
PY_ADAPTER = ROOT / "adapters" / "python" / "src"


def start_replica(port: int, name: str, state_dir: Path, ring: int = 16, tick_ms: int = 20,
                  extra: list | None = None) -> Proc:
    """A naive replica (tests/naive-replica): shared sessions, its own event ring."""
    return Proc(f"replica-{name}", [binary("naive-replica"), "--listen", f"{HOST}:{port}", "--name", name,
                                    "--state-dir", state_dir, "--ring", ring, "--tick-ms", tick_ms,
                                    *(extra or [])],
                port=port).start()


def start_rmcp_replica(port: int, name: str, state_dir: Path, sse_retry_ms: int = 500) -> Proc:
    """A replica built on the official Rust SDK (tests/rmcp-replica): shared sessions, local events."""
    return Proc(f"rmcp-{name}-{port}", [binary("rmcp-replica"), "--listen", f"{HOST}:{port}", "--name", name,
                                        "--state-dir", state_dir, "--sse-retry-ms", sse_retry_ms],
                port=port).start()


def ts_server(port: int, name: str, *extra) -> Proc:
    """A server on the official TypeScript SDK (tests/interop/ts_server.mjs), not started."""
    return Proc(f"ts-{name}", [NODE, INTEROP / "ts_server.mjs", "--port", port, "--name", name, *extra], port=port)


def py_server(port: int, name: str, *extra) -> Proc:
    """A server on the official Python SDK (tests/interop/py_server.py), not started."""
    return Proc(f"py-{name}", [PYTHON, INTEROP / "py_server.py", "--port", port, "--name", name, *extra],
                port=port, env={"PYTHONPATH": str(PY_ADAPTER)})


def start_ts_replica(port: int, name: str, retry_ms: int = 200) -> Proc:
    return ts_server(port, name, "--retry-ms", retry_ms).start()


def start_py_replica(port: int, name: str, retry_ms: int = 200, idle_s: float = 600.0) -> Proc:
    return py_server(port, name, "--retry-ms", retry_ms, "--idle-s", idle_s).start()


def start_ownership(port: int = OWNERSHIP_PORT, extra: list | None = None, run_dir: Path | None = None,
                    exe: Path | None = None) -> Proc:
    return Proc(f"ownership-{port}", [exe or binary("mcp-ownership"), "--listen", f"{HOST}:{port}", *(extra or [])],
                port=port, run_dir=run_dir).start()


def start_redis(port: int = REDIS_PORT, run_dir: Path | None = None, name: str | None = None) -> Proc:
    """A throw-away redis-server (no persistence) on 127.0.0.1:port, stopped by pid."""
    return Proc(name or f"redis-{port}", ["redis-server", "--port", port, "--bind", HOST, "--save", "",
                                          "--appendonly", "no", "--daemonize", "no", "--loglevel", "warning"],
                port=port, run_dir=run_dir).start()


def owner_pin(port: int) -> str:
    """The strict stateful_session header value for a replica: padded base64 of ip:port."""
    return base64.b64encode(f"{HOST}:{port}".encode()).decode()


def ledger(state_dir: Path) -> list[dict]:
    """The side effects a naive replica recorded (ledger_append), in order."""
    p = state_dir / "ledger.jsonl"
    if not p.exists():
        return []
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
