"""Processes on 127.0.0.1: ports, the binaries under test, a child process with its log file."""
from __future__ import annotations

import os
import signal
import socket
import socketserver
import subprocess
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HOST = "127.0.0.1"
# E2E_PORT_OFFSET shifts every port, so that two runs (suites, soaks, demos, benchmarks) can run at once.
PORT_OFFSET = int(os.environ.get("E2E_PORT_OFFSET", "0"))
# Process logs and generated configs of one port offset.
RUNS = ROOT / "target" / "runs" / str(PORT_OFFSET)
# The local topology (README), every port shifted by PORT_OFFSET.
ENVOY_PORT = 10000 + PORT_OFFSET
ADMIN_PORT = 9901 + PORT_OFFSET
REPLICA_PORTS = [9101 + PORT_OFFSET, 9102 + PORT_OFFSET, 9103 + PORT_OFFSET]
OWNERSHIP_PORT = 9200 + PORT_OFFSET
REDIS_PORT = 6390 + PORT_OFFSET
# Other builds can be put under test without touching the tree (e.g. an older guard, to show that a
# test fails without its fix): E2E_BIN_DIR = the directory of mcp-ownership and the replicas.
BIN = Path(os.environ.get("E2E_BIN_DIR") or ROOT / "target" / "debug")
CLK_TCK = os.sysconf("SC_CLK_TCK")


def binary(name: str) -> Path:
    """A binary from E2E_BIN_DIR when it has one, else this tree's build (so a directory with
    only an older mcp-ownership still runs the current test replicas)."""
    p = BIN / name
    return p if p.exists() else ROOT / "target" / "debug" / name


def wait_port(port: int, timeout: float = 15.0, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process {proc.args[0]} exited with {proc.returncode} before port {port} opened")
        try:
            with socket.create_connection((HOST, port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"port {port} did not open within {timeout}s")


def wait_port_free(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((HOST, port), timeout=0.2):
                time.sleep(0.05)
        except OSError:
            return
    raise TimeoutError(f"port {port} still busy after {timeout}s")


class Proc:
    """A child process with its log file (in `run_dir`, default RUNS); stopped by pid."""

    # Run in the child before exec (make demo sets PR_SET_PDEATHSIG so children die with it).
    preexec_fn = None

    def __init__(self, name: str, args: list, port: int | None = None, env: dict | None = None,
                 run_dir: Path | None = None, port_timeout: float = 15.0):
        self.run_dir = run_dir or RUNS
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.args = [str(a) for a in args]
        self.port = port
        self.env = env
        self.port_timeout = port_timeout
        self.log_path = self.run_dir / f"{name}.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> "Proc":
        if self.port is not None:
            wait_port_free(self.port)
        log = open(self.log_path, "ab")
        env = {**os.environ, **self.env} if self.env else None
        self.proc = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                                     start_new_session=True, preexec_fn=type(self).preexec_fn, env=env)
        log.close()
        if self.port is not None:
            wait_port(self.port, timeout=self.port_timeout, proc=self.proc)
        return self

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.kill(self.proc.pid, sig)
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=timeout)
        except ProcessLookupError:
            pass

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int:
        assert self.proc is not None, f"{self.name} was never started"
        return self.proc.pid


def cpu_ticks(pid: int) -> int:
    """utime + stime of a process, in clock ticks (CLK_TCK a second)."""
    with open(f"/proc/{pid}/stat") as f:
        rest = f.read().rsplit(")", 1)[1].split()
    return int(rest[11]) + int(rest[12])


def rss_kib(pid: int) -> int | None:
    """Resident memory of a process in KiB, None when it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def http_post(port: int, path: str, timeout: float = 3.0) -> int:
    """An empty POST to a local service; its status, whatever it is."""
    import urllib.error
    import urllib.request
    req = urllib.request.Request(f"http://{HOST}:{port}{path}", method="POST", data=b"")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            r.read()
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


class LocalServer(socketserver.ThreadingTCPServer):
    """A test's own server in this process (a fake service, a hostile upstream), served from a
    background thread while used as a context manager; its `Handler` class answers."""

    allow_reuse_address = True
    daemon_threads = True
    Handler: type

    def __init__(self, port: int):
        super().__init__((HOST, port), self.Handler)

    def __enter__(self):
        threading.Thread(target=self.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.shutdown()
        self.server_close()
