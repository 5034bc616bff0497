"""A client's own dropped resumes never end its valid stream `forked` (red team 4, `abandon-race`),
end to end with real Envoy (two workers: each has its own record queue) and the real ownership
service.

Each round: a fresh GET stream g1..g3 that the replica closes; then 1-3 resumes with the cursor of
g1, each reset (RST) 0-2 ms after it was sent, while its verdict is pending; then at once the real
resume with the same cursor. The replica replays g2, g3 and closes. The real resume must get
exactly those two events and a clean end: no `Mcp-Resume` header, no control event. Before the
store's clean end waited for the dropped resumes' `abandoned` records (docs/forks.md), 12 to 16
of 20 rounds ended `forked`. Likewise when the dropped resume was reset only after its owner
answered it (so its branch relays): before the clean end waited for such a rival's `branch_end`
record too, 14 of 20 rounds ended `forked` (and CI met it once in 20 rounds of the first test).

The replica is a small server written here, on 127.0.0.1 at a port derived from E2E_PORT_OFFSET,
stopped at the end of its test.
"""
from __future__ import annotations

import json
import random
import threading
import re
import socket
import struct
import time

import pytest

import harness as h
from stack.upstream import ACCEPTED, Upstream, send_sse

REPLICA_PORT = 9175 + h.PORT_OFFSET
ROUNDS = 20
SETTLE_S = 0.15  # the fresh stream's records reach the store (flush_ms 10) before the resumes
NOTE = b'{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"n"}}'
IDS = [b"g1", b"g2", b"g3"]


class ClosingReplica(Upstream):
    """A GET stream is g1..g3 (fresh) or the events after Last-Event-ID, then the end; every
    `initialize` opens a new session."""

    def __init__(self, port: int):
        self.sessions = 0
        super().__init__(port)

    def answer(self, method, headers, body, out):
        if method == b"POST" and b'"initialize"' in body:
            self.sessions += 1
            msg = json.dumps({"jsonrpc": "2.0", "id": 0, "result": {
                "protocolVersion": "2025-06-18", "capabilities": {},
                "serverInfo": {"name": "abandon", "version": "0"}}}).encode()
            out.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nmcp-session-id: abandon-%d\r\n"
                      b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (self.sessions, len(msg), msg))
        elif method == b"GET":
            last = headers.get(b"last-event-id")
            rest = IDS[IDS.index(last) + 1:] if last in IDS else IDS
            send_sse(out, b"".join(b"id: %s\ndata: %s\n\n" % (i, NOTE) for i in rest))
        else:
            out.write(ACCEPTED.replace(b"\r\n\r\n", b"\r\nconnection: close\r\n\r\n", 1))
        return False


class HoldingReplica(ClosingReplica):
    """As ClosingReplica, except that the first resume of each session is answered with headers
    and held open (a comment every 20 ms) until its client goes: its owner answered, so its branch
    relays, and only its end tells the store it is gone."""

    def __init__(self, port: int):
        self.held: set[bytes] = set()
        self.answered = threading.Event()
        super().__init__(port)

    def answer(self, method, headers, body, out):
        sid = headers.get(b"mcp-session-id")
        if method == b"GET" and headers.get(b"last-event-id") and sid not in self.held:
            self.held.add(sid)
            out.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n")
            out.flush()
            self.answered.set()
            try:
                for _ in range(100):
                    out.write(b": held\n\n")
                    out.flush()
                    time.sleep(0.02)
            except OSError:
                pass
            return False
        return super().answer(method, headers, body, out)


@pytest.fixture
def closing_envoy(fresh):
    """Envoy with two workers whose only replica is this test's (the ownership service stays real)."""
    cfg = h.envoy_config(plugin_overrides={"retention": 0}, upstreams=[(h.HOST, REPLICA_PORT)])
    workers, fresh.concurrency = fresh.concurrency, 2
    try:
        with fresh.own_gateway("envoy-abandon", cfg) as env:
            yield env
    finally:
        fresh.concurrency = workers


def raw(method: str, headers: dict, body: bytes = b"", read: bool = True):
    """One HTTP/1.1 request on its own connection: the whole answer, or the open socket."""
    s = socket.create_connection((h.HOST, h.ENVOY_PORT), timeout=5.0)
    hs = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    s.sendall(f"{method} /mcp HTTP/1.1\r\nHost: x\r\n{hs}Content-Length: {len(body)}\r\n"
              f"Connection: close\r\n\r\n".encode() + body)
    if not read:
        return s
    out = b""
    while chunk := s.recv(65536):
        out += chunk
    s.close()
    return out


def dechunk(answer: bytes) -> tuple[bytes, bytes]:
    head, _, body = answer.partition(b"\r\n\r\n")
    if b"chunked" not in head.lower():
        return head, body
    out = b""
    while body:
        line, _, rest = body.partition(b"\r\n")
        n = int(line.split(b";")[0], 16)
        if n == 0:
            break
        out += rest[:n]
        body = rest[n + 2:]
    return head, out


JSON_H = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
INIT = json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}})


def fresh_stream() -> tuple[dict, bytes]:
    """A new session's GET headers and the first cursor of its fresh g1..g3 stream, recorded."""
    sid = re.search(rb"(?im)^mcp-session-id: *(\S+)", raw("POST", JSON_H, INIT.encode())).group(1)
    get = {"accept": "text/event-stream", "mcp-session-id": sid.decode(), "mcp-protocol-version": "2025-06-18"}
    _, body = dechunk(raw("GET", get))
    ids = re.findall(rb"(?m)^id: *(\S+)", body)
    assert len(ids) == 3, body
    time.sleep(SETTLE_S)
    return get, ids[0]


def real_resume(resume: dict) -> tuple | None:
    """The real resume: None when it is exactly the replay of g2, g3 with a clean end (no
    `Mcp-Resume` header, no control event), else what it got."""
    head, body = dechunk(raw("GET", resume))
    events = re.findall(rb"(?m)^data: *(.*)", body)
    if (head.startswith(b"HTTP/1.1 200") and b"mcp-resume" not in head.lower()
            and b"event: mcp-resume" not in body and events == [NOTE, NOTE]):
        return None
    return head.split(b"\r\n")[0], body[-300:]


def reset(s: socket.socket) -> None:
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()


def test_dropped_resumes_never_end_the_real_one_forked(fresh, closing_envoy):
    rng = random.Random(4)
    with ClosingReplica(REPLICA_PORT):
        bad = []
        for r in range(ROUNDS):
            get, cursor = fresh_stream()
            resume = {**get, "last-event-id": cursor.decode()}
            for _ in range(rng.randint(1, 3)):
                s = raw("GET", resume, read=False)
                time.sleep(rng.uniform(0, 0.002))
                reset(s)
            if (got := real_resume(resume)) is not None:
                bad.append((r, *got))
    assert not bad, f"{len(bad)}/{ROUNDS} real resumes were not a clean replay: {bad[:3]}"


def test_a_dropped_resume_its_owner_answered_never_ends_the_real_one_forked(fresh, closing_envoy):
    """The dropped resume got its verdict and its owner's answer (so its branch relays) before its
    client reset it; its end is a record a flush behind the real resume's clean end."""
    with HoldingReplica(REPLICA_PORT) as rep:
        bad = []
        for r in range(ROUNDS):
            get, cursor = fresh_stream()
            resume = {**get, "last-event-id": cursor.decode()}
            rep.answered.clear()
            s = raw("GET", resume, read=False)
            assert rep.answered.wait(5.0)
            time.sleep(0.03)  # the owner's answer reaches the store (flush_ms 10)
            reset(s)
            if (got := real_resume(resume)) is not None:
                bad.append((r, *got))
    assert not bad, f"{len(bad)}/{ROUNDS} real resumes were not a clean replay: {bad[:3]}"
