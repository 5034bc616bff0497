"""A test's own MCP upstream in this process: the shapes a real replica would never send (hostile
ids, bulk bodies), on HTTP/1.1 keep-alive, with `initialize` opening a session."""
from __future__ import annotations

import json
import socketserver

from .procs import LocalServer

# The answer to a notification or a response (a POST without a JSON-RPC request).
ACCEPTED = b"HTTP/1.1 202 Accepted\r\ncontent-length: 0\r\n\r\n"


def read_request(rfile, max_line: int = 65536):
    """One HTTP/1.1 request from a handler's stream: (method, lower-cased headers, body),
    or None when the client closed the connection or it failed."""
    try:
        line = rfile.readline(65536)
    except OSError:
        return None
    if not line:
        return None
    method = line.split(b" ", 1)[0]
    headers = {}
    while True:
        hl = rfile.readline(max_line)
        if hl in (b"\r\n", b"\n", b""):
            break
        k, _, v = hl.partition(b":")
        headers[k.strip().lower()] = v.strip()
    n = int(headers.get(b"content-length", b"0") or 0)
    return method, headers, rfile.read(n) if n else b""


class Upstream(LocalServer):
    """`answer(method, headers, body, out)` answers each request on `out` and says whether the
    connection stays open. Header lines are read up to `max_line` bytes each."""

    conn_timeout = 10.0  # seconds a connection may stay silent
    max_line = 65536

    class Handler(socketserver.StreamRequestHandler):
        def handle(self):
            srv = self.server
            self.request.settimeout(srv.conn_timeout)
            while (req := read_request(self.rfile, srv.max_line)) is not None:
                if not srv.answer(*req, self.wfile):
                    return

    def answer(self, method: bytes, headers: dict, body: bytes, out) -> bool:
        raise NotImplementedError


def initialize_answer(name: str, session: bytes) -> bytes:
    """The whole HTTP answer to `initialize`: a result that opens session `session`."""
    out = json.dumps({"jsonrpc": "2.0", "id": 1, "result": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "serverInfo": {"name": name, "version": "0"}}}).encode()
    return (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nmcp-session-id: %s\r\n"
            b"content-length: %d\r\n\r\n" % (session, len(out))) + out


def send_sse(out, sse: bytes, headers: bytes = b"") -> None:
    """A 200 text/event-stream answer with `sse` as its whole body, in writes of 64 KiB, that ends
    the connection; a client that left early is no error."""
    out.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n" + headers + b"connection: close\r\n\r\n")
    try:
        view = memoryview(sse)
        for i in range(0, len(sse), 1 << 16):
            out.write(view[i:i + (1 << 16)])
        out.flush()
    except OSError:
        pass
