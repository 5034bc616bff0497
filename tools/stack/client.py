"""A minimal MCP Streamable HTTP client and an SSE reader (WHATWG line rules), enough to drive
the stack by hand: the e2e suite, the chaos soak's scenario clients and the demo's walk-through."""
from __future__ import annotations

import http.client
import json
import socket
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

from .procs import ENVOY_PORT, HOST

PATH = "/mcp"


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
        # Set it to a bytearray to keep every body line read from then on (what the client saw).
        self.transcript: bytearray | None = None
        self.deadline: float | None = None  # while `read_within` runs
        # A chunked body ends cleanly only with its terminal chunk; http.client reads a connection
        # closed before (even before the first chunk) as an empty end, so the trailer read marks it.
        self.terminal = False
        read_trailer = resp._read_and_discard_trailer

        def trailer():
            self.terminal = True
            return read_trailer()

        resp._read_and_discard_trailer = trailer

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())

    @property
    def is_sse(self) -> bool:
        return (self.header("content-type") or "").startswith("text/event-stream")

    def _line(self) -> bytes:
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no event within the read's time")
            self.conn.sock.settimeout(left)
        try:
            line = self.resp.readline()
        except (http.client.IncompleteRead, ConnectionError):
            line = b""  # the proxy reset the stream: the end, as a client sees it
            self.reset = True
        if not line:
            self.ended = True
            # A connection closed short of the terminal chunk (or of a length) reads as a clean end.
            if (self.resp.chunked and not self.terminal) or self.resp.length:
                self.reset = True
        if self.transcript is not None:
            self.transcript += line
        return line

    def read_all(self) -> list[Event]:
        out = []
        while (ev := self.next_event()) is not None:
            out.append(ev)
        return out

    def read_within(self, timeout: float, done=lambda events: False) -> list[Event]:
        """Events until `done(events)`, the end, or `timeout` seconds: an idle stream gives fewer,
        never an exception (a socket timeout ends the read; the reader is not used after one)."""
        out: list[Event] = []
        # Per line, not per event: a stream of comments (keep-alives) must not outlast it.
        self.deadline = time.monotonic() + timeout
        try:
            while not done(out):
                try:
                    ev = self.next_event()
                except (OSError, ValueError, AttributeError):
                    break
                if ev is None:
                    break
                out.append(ev)
        finally:
            self.deadline = None
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

    def finished_call_cursor(self, entry: str, steps: int = 2, step_ms: int = 5) -> str:
        """A `ledger_append` call read to its end: the cursor of its request stream's first event."""
        t = self.call_tool("ledger_append", {"entry": entry, "steps": steps, "step_ms": step_ms})
        cursor = t.next_event().id
        t.read_all()
        t.close()
        return cursor


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
