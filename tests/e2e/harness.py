"""End-to-end test helpers over the stack package (tools/stack): what only the tests use.

The processes, ports, Envoy configurations and the MCP client come from `stack`; they are
re-exported here so that a test says `h.Proc`, `h.envoy_config`, `h.Client` as before.
"""
from __future__ import annotations

import http.client
import json
import socket
import time
import urllib.error
import urllib.request

from stack.client import PATH, Client, Event, EventReader, Response, SSEStream, http_json  # noqa: F401
from stack.envoy import (BUILD, DEFAULT_BASE, ENVOY_BIN, ENVOY_DIR, NATIVE_DIR, TEST_KEY, WASM,  # noqa: F401
                         Envoy, base_envoy_config, config_holder, envoy_config, guard_filter, hcm, plugin_config)
from stack.procs import (ADMIN_PORT, BIN, ENVOY_PORT, HOST, OWNERSHIP_PORT, PORT_OFFSET, REDIS_PORT,  # noqa: F401
                         REPLICA_PORTS, ROOT, RUNS, Proc, binary, wait_port, wait_port_free)
from stack.services import (ledger, owner_pin, start_ownership, start_redis, start_replica,  # noqa: F401
                            start_rmcp_replica)

OWNER_HEADER = "x-mcp-owner"


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
