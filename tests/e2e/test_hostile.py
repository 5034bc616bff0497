"""Hostile input, end to end: one test per row of SECURITY.md's table, over HTTP/1.1 and HTTP/2
cleartext (h2c, prior knowledge) where the client side is concerned.

Everything here runs real Envoy with the shipped envoy/envoy.yaml, the built guard, the real
ownership service and real replicas. Where a part must misbehave on purpose it is a small server
written here (an ownership stand-in, a hostile SSE upstream), on 127.0.0.1 at a port derived from
E2E_PORT_OFFSET, stopped at the end of its test.

Every response any test here receives is checked for the owner header (see `no_owner_header`).
"""
from __future__ import annotations

import base64
import gzip
import json
import socketserver
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

import harness as h
from stack.upstream import ACCEPTED, Upstream, initialize_answer, send_sse
from conftest import RING
from test_guard_rules import FakeOwnership
from test_seed_scenarios import GUARD_HEADER, assert_no_cursor_reached_a_replica, open_and_read

PROTOS = ["h1", "h2"]
HOSTILE_PORT = 9150 + h.PORT_OFFSET
# Envoy's default limit for request headers (max_request_headers_kb: 60).
ENVOY_HEADER_LIMIT = 60 * 1024


# ---- every response: never the owner header ------------------------------------------------

_seen_headers: list[tuple[str, dict]] = []


@pytest.fixture(autouse=True)
def no_owner_header(monkeypatch):
    """Records the headers of every response a test receives (both client kinds) and fails the
    test if any of them carried the owner header."""
    _seen_headers.clear()
    sse_init, raw_init = h.SSEStream.__init__, h.RawResponse.__init__

    def sse(self, conn, resp):
        sse_init(self, conn, resp)
        _seen_headers.append(("h1", dict(self.headers)))

    def raw(self, status, headers, read_chunk, close):
        raw_init(self, status, headers, read_chunk, close)
        _seen_headers.append(("raw", dict(self.headers)))

    monkeypatch.setattr(h.SSEStream, "__init__", sse)
    monkeypatch.setattr(h.RawResponse, "__init__", raw)
    yield
    leaked = [hd for _, hd in _seen_headers if h.OWNER_HEADER in hd]
    assert not leaked, f"{len(leaked)} of {len(_seen_headers)} responses carried {h.OWNER_HEADER}: {leaked[:2]}"


# ---- helpers -------------------------------------------------------------------------------

def session_headers(c: h.Client, extra: list | None = None) -> list[tuple[str, str]]:
    hd = [("accept", "text/event-stream"), ("mcp-protocol-version", c.version or "2025-11-25")]
    if c.session:
        hd.append(("mcp-session-id", c.session))
    return hd + (extra or [])


def a_cursor() -> tuple[h.Client, str]:
    """A fresh session with a real guard cursor of its standalone GET stream."""
    c = h.Client()
    c.initialize()
    _, evs = open_and_read(c, 3)
    time.sleep(0.1)  # records land
    return c, evs[1].id


def a_cursor_and_owner() -> tuple[h.Client, str, str]:
    """As `a_cursor`, and the name of the replica that owns the cursor's stream."""
    c = h.Client()
    c.initialize()
    s, evs = open_and_read(c, 3)
    time.sleep(0.1)  # records land
    return c, evs[1].id, s.header("x-replica")


def refused(r, reason: str | None = None) -> bool:
    """Did the guard say explicitly that the cursor was not honoured?"""
    v = r.header(GUARD_HEADER) or ""
    return bool(v) and (reason is None or v.endswith(f"reason={reason}"))


def envoy_alive(env: h.Envoy) -> None:
    assert env.alive, "envoy died"
    c = h.Client()
    c.initialize()  # a plain request still works end to end


def reset_seen() -> None:
    for p in h.REPLICA_PORTS:
        h.replica_reset(p)


def all_seen() -> list[dict]:
    out = []
    for p in h.REPLICA_PORTS:
        out.extend({**s, "port": p} for s in h.replica_get(p, "/_naive/seen"))
    return out


# ---- client side: header sizes, duplicates, cases, bytes, lengths, methods -----------------

@pytest.mark.parametrize("proto", PROTOS)
def test_header_size_limits(fresh, proto):
    """Headers past Envoy's limit are refused by Envoy (431 / stream reset), before any filter:
    nothing reaches a replica; a 64 KiB Last-Event-ID is one of them."""
    env = fresh.use(guard=True)
    c, _ = a_cursor()
    reset_seen()
    for name in ("last-event-id", "mcp-session-id", "x-filler"):
        big = "A" * (ENVOY_HEADER_LIMIT + 4096)  # 64 KiB
        try:
            r = h.raw_request(proto, "GET", "/mcp", session_headers(c, [(name, big)]))
            status = r.status
            r.close()
        except (h.StreamReset, ConnectionError):
            status = None
        assert status in (None, 431, 400), (name, status)
    assert all_seen() == [], "an oversized request reached a replica"
    envoy_alive(env)
    # Just under the limit the headers reach the guard, and it decides on them: a huge unrelated
    # header leaves an authentic cursor's continuation intact (at the owner, with its own id), a
    # huge Last-Event-ID is a foreign cursor, a huge session id does not match the cursor's.
    near = ENVOY_HEADER_LIMIT - 4096  # 56 KiB
    c, cursor, owner = a_cursor_and_owner()
    reset_seen()
    r = h.raw_request(proto, "GET", "/mcp", session_headers(c, [("last-event-id", cursor), ("x-filler", "A" * near)]))
    assert r.status == 200 and not refused(r) and r.header("x-replica") == owner, (r.status, r.headers)
    r.close()
    reached = h.cursors_seen_by_replicas()
    assert [(x["port"], x["last_event_id"] != cursor) for x in reached] == [(h.port_of(owner), True)], reached
    reset_seen()
    for name, value, reason in (("last-event-id", "A" * near, "foreign_cursor"),
                                ("mcp-session-id", "s" * near, "session_mismatch")):
        hd = [x for x in session_headers(c, [("last-event-id", cursor)]) if x[0] != name]
        r = h.raw_request(proto, "GET", "/mcp", hd + [(name, value)])
        assert refused(r, reason), (name, r.status, r.headers)
        r.close()
    assert_no_cursor_reached_a_replica()


@pytest.mark.parametrize("proto", PROTOS)
@pytest.mark.parametrize("order", ["cursor_first", "cursor_last"])
def test_duplicate_last_event_id_is_refused(fresh, proto, order):
    """Two Last-Event-ID fields (also differently cased, on HTTP/1.1): never a continuation on one
    of them; refused explicitly as `duplicate_header`, and no cursor reaches a replica."""
    fresh.use(guard=True)
    c, cursor = a_cursor()
    reset_seen()
    other = "e1"
    pair = [("Last-Event-ID", cursor), ("last-event-id", other)] if proto == "h1" else \
        [("last-event-id", cursor), ("last-event-id", other)]
    if order == "cursor_last":
        pair.reverse()
    r = h.raw_request(proto, "GET", "/mcp", session_headers(c, pair))
    assert refused(r, "duplicate_header"), r.headers
    r.close()
    assert_no_cursor_reached_a_replica()


@pytest.mark.parametrize("proto", PROTOS)
def test_duplicate_session_id_is_refused(fresh, proto):
    """Two Mcp-Session-Id fields with an authentic cursor: not a continuation."""
    fresh.use(guard=True)
    c, cursor = a_cursor()
    other = h.Client()
    other.initialize()
    reset_seen()
    for sids in ([c.session, other.session], [other.session, c.session]):
        hd = [("accept", "text/event-stream"), ("mcp-protocol-version", "2025-11-25"),
              ("last-event-id", cursor)] + [("mcp-session-id", s) for s in sids]
        r = h.raw_request(proto, "GET", "/mcp", hd)
        assert refused(r, "duplicate_header"), r.headers
        r.close()
    assert_no_cursor_reached_a_replica()


def test_uppercase_header_names_over_h2_are_refused(fresh):
    """HTTP/2 forbids uppercase field names: Envoy refuses the request; nothing reaches a replica.
    Over HTTP/1.1 the same names reach the guard, which reads them whatever their case: the cursor
    continues at its owner (not at the client's pin) and the replica sees its own id, never the cursor."""
    env = fresh.use(guard=True)
    c, cursor, owner = a_cursor_and_owner()
    reset_seen()
    elsewhere = next(p for p in h.REPLICA_PORTS if p != h.port_of(owner))
    upper = [("Last-Event-ID", cursor), ("X-MCP-Owner", h.owner_pin(elsewhere))]
    try:
        r = h.raw_h2("GET", "/mcp", session_headers(c, upper))
        status = r.status
        r.close()
    except (h.StreamReset, ConnectionError):
        status = None
    assert status in (None, 400), status
    assert all_seen() == []
    envoy_alive(env)
    r = h.raw_h1("GET", "/mcp", session_headers(c, upper))
    assert r.status == 200 and not refused(r) and r.header("x-replica") == owner, (r.status, r.headers)
    r.close()
    reached = h.cursors_seen_by_replicas()
    assert [(x["port"], x["last_event_id"] != cursor) for x in reached] == [(h.port_of(owner), True)], reached
    assert not any(s["has_owner_header"] for s in all_seen())


@pytest.mark.parametrize("proto", PROTOS)
def test_non_utf8_header_bytes(fresh, proto):
    """Bytes that are not UTF-8 in Last-Event-ID, Mcp-Session-Id and the owner header: refused or
    ignored explicitly, never a crash, never a cursor at a replica, never a pin."""
    env = fresh.use(guard=True)
    c, cursor = a_cursor()
    reset_seen()
    bad = b"\xff\xfe\x80"
    r = h.raw_request(proto, "GET", "/mcp", session_headers(c, [("last-event-id", bad + cursor.encode())]))
    assert refused(r, "foreign_cursor"), r.headers
    r.close()
    hd = [("accept", "text/event-stream"), ("mcp-protocol-version", "2025-11-25"),
          ("mcp-session-id", c.session.encode() + bad), ("last-event-id", cursor)]
    r = h.raw_request(proto, "GET", "/mcp", hd)
    assert refused(r), r.headers
    r.close()
    pinned = h.REPLICA_PORTS[2]
    landed = []
    bad_pin = base64.b64encode(f"{h.HOST}:{pinned}".encode()) + bad
    for _ in range(6):
        r = h.raw_request(proto, "POST", "/mcp", [("content-type", "application/json"), (h.OWNER_HEADER, bad_pin)],
                          body=b'{"jsonrpc":"2.0","id":1,"method":"ping"}')
        landed.append(r.header("x-replica"))
        r.close()
    assert landed.count(f"r{h.REPLICA_PORTS.index(pinned) + 1}") < 6, landed
    assert_no_cursor_reached_a_replica()
    assert not any(s["has_owner_header"] for s in all_seen())
    envoy_alive(env)


@pytest.mark.parametrize("proto", PROTOS)
def test_long_cursor_is_foreign(fresh, proto):
    """A cursor-shaped Last-Event-ID of 16 KiB (under Envoy's header limit): `foreign_cursor`,
    decided locally, never forwarded."""
    env = fresh.use(guard=True)
    c, cursor = a_cursor()
    reset_seen()
    before = env.stats().get("mcp_resume_guard.callouts", 0)
    long_cursor = (cursor * (16 * 1024 // len(cursor) + 1))[:16 * 1024]
    r = h.raw_request(proto, "GET", "/mcp", session_headers(c, [("last-event-id", long_cursor)]))
    assert r.status == 200 and refused(r, "foreign_cursor"), (r.status, r.headers)
    r.close()
    assert env.stats().get("mcp_resume_guard.callouts", 0) == before, "a callout for a foreign cursor"
    assert_no_cursor_reached_a_replica()


@pytest.mark.parametrize("proto", PROTOS)
@pytest.mark.parametrize("method", ["HEAD", "OPTIONS"])
def test_head_and_options_with_a_cursor(fresh, proto, method):
    """HEAD and OPTIONS are not GET: the cursor is stripped and said so, never forwarded."""
    fresh.use(guard=True)
    c, cursor = a_cursor()
    reset_seen()
    r = h.raw_request(proto, method, "/mcp", session_headers(c, [("last-event-id", cursor)]))
    assert refused(r, "post_cursor"), (r.status, r.headers)
    r.close()
    assert_no_cursor_reached_a_replica()
    seen = all_seen()
    assert [s["method"] for s in seen] == [method], seen


@pytest.mark.parametrize("proto", PROTOS)
def test_body_on_a_get_while_the_callout_hangs(fresh, proto):
    """A GET with a cursor and a 200 KiB body while the ownership service hangs: the guard fails
    closed within its callout timeout, the cursor never reaches a replica, Envoy stays up."""
    env = fresh.use(guard=True)
    c, cursor = a_cursor()
    fresh.ownership.stop()
    reset_seen()
    with FakeOwnership("hang") as fake:
        t0 = time.monotonic()
        r = h.raw_request(proto, "GET", "/mcp", session_headers(c, [("last-event-id", cursor),
                                                                    ("content-type", "application/json")]),
                          body=b"{" + b" " * (200 * 1024) + b"}")
        elapsed = time.monotonic() - t0
        assert r.status == 200 and refused(r, "ownership_unavailable"), (r.status, r.headers)
        ev = r.next_event()
        assert ev is not None and ev.event == "mcp-resume" and ev.id is None
        r.close()
        assert fake.hits >= 1
    assert elapsed < 2.0, elapsed
    assert_no_cursor_reached_a_replica()
    fresh.ensure_ownership()
    envoy_alive(env)


# ---- paths: the pin and the guard on every spelling ----------------------------------------

# (path as sent, what it is after Envoy's normalization: "mcp" = the MCP endpoint, "other", or
# "refused" = Envoy answers 400 itself)
PATHS = [
    ("/mcp", "mcp"), ("/mcp/", "mcp"), ("//mcp", "mcp"), ("/mcp/../mcp", "mcp"), ("/%6dcp", "mcp"),
    ("/%6Dcp", "mcp"), ("/./mcp", "mcp"), ("/mcp//", "mcp"), ("/x/../mcp/", "mcp"), ("/mcp?x=1", "mcp"),
    ("/other", "other"), ("/MCP", "other"), ("/mcp/x", "other"), ("/mcpx", "other"), ("/mcp;x", "other"),
    ("/mcp%2F", "refused"), ("/mcp%5C", "refused"), ("/%2Fmcp", "refused"),
]


@pytest.mark.parametrize("proto", PROTOS)
@pytest.mark.parametrize("path,kind", PATHS, ids=[p for p, _ in PATHS])
def test_a_client_pin_is_never_honoured(fresh, proto, path, kind):
    """A client's x-mcp-owner on any path, six times: round robin still spreads the requests, and
    no replica ever sees the header."""
    fresh.use(guard=True)
    c = h.Client()
    c.initialize()
    reset_seen()
    pinned = h.REPLICA_PORTS[2]
    landed = []
    for _ in range(6):
        r = h.raw_request(proto, "POST", path, [("content-type", "application/json"),
                                                 ("accept", "application/json, text/event-stream"),
                                                 ("mcp-session-id", c.session),
                                                 (h.OWNER_HEADER, h.owner_pin(pinned))],
                          body=b'{"jsonrpc":"2.0","id":1,"method":"ping"}')
        r.read_body(timeout=2)
        if kind == "refused":
            assert r.status == 400, (path, r.status)
        landed.append(r.header("x-replica"))
        r.close()
    if kind != "refused":
        assert landed.count(f"r{h.REPLICA_PORTS.index(pinned) + 1}") <= 3, (path, landed)
    seen = all_seen()
    assert not any(s["has_owner_header"] for s in seen), seen
    if kind == "refused":
        assert seen == []


@pytest.mark.parametrize("proto", PROTOS)
@pytest.mark.parametrize("path", [p for p, k in PATHS if k == "mcp"])
def test_every_spelling_of_the_mcp_path_is_guarded(fresh, proto, path):
    """A cursor on any spelling of the MCP endpoint meets the guard: a legacy id is refused
    (`foreign_cursor`) and never forwarded."""
    fresh.use(guard=True)
    c = h.Client()
    c.initialize()
    reset_seen()
    r = h.raw_request(proto, "GET", path, session_headers(c, [("last-event-id", "e3")]))
    assert refused(r, "foreign_cursor"), (path, r.status, r.headers)
    r.close()
    assert_no_cursor_reached_a_replica()


@pytest.mark.parametrize("proto", PROTOS)
def test_no_response_carries_the_owner_header(fresh, proto):
    """Plain requests on every kind of path, without any pin: stateful_session never gets to echo
    the host it chose, and no response shows a replica's address."""
    fresh.use(guard=True)
    c = h.Client()
    c.initialize()
    for path, _ in PATHS:
        for method in ("GET", "POST"):
            r = h.raw_request(proto, method, path, session_headers(c),
                              body=b'{"jsonrpc":"2.0","id":1,"method":"ping"}' if method == "POST" else None)
            assert h.OWNER_HEADER not in r.headers, (method, path, r.headers[h.OWNER_HEADER])
            r.close()


# ---- ownership stand-ins that answer garbage -----------------------------------------------

class HostileOwnership(FakeOwnership):
    """Answers every callout with one hostile body (modes below); records batches get 200."""

    def __init__(self, mode: str, admin_port: int):
        super().__init__(mode)
        self.admin_port = admin_port

    class Handler(socketserver.BaseRequestHandler):
        def handle(self):
            srv = self.server
            self.request.settimeout(5)
            data = b""
            try:
                while b"\r\n\r\n" not in data:
                    chunk = self.request.recv(65536)
                    if not chunk:
                        return
                    data += chunk
                head, _, body_in = data.partition(b"\r\n\r\n")
                length = next((int(ln.split(b":", 1)[1]) for ln in head.split(b"\r\n")
                               if ln.lower().startswith(b"content-length:")), 0)
                while len(body_in) < length:
                    chunk = self.request.recv(65536)
                    if not chunk:
                        return
                    body_in += chunk
            except (OSError, ValueError):
                return
            if b"/v1/resume" not in head.split(b"\r\n", 1)[0]:
                body = b'{"applied":0}'
            else:
                srv.hits += 1
                seq = json.loads(body_in or b"{}").get("seq", 0)
                body = {
                    # Envoy's own admin port: an address outside the replica cluster.
                    "outside_cluster": json.dumps({"verdict": "continue", "owner": f"{h.HOST}:{srv.admin_port}",
                                                   "expected": [], "head": seq}).encode(),
                    "header_injection": json.dumps({"verdict": "continue",
                                                    "owner": f"{h.HOST}:{h.REPLICA_PORTS[0]}\r\nx-evil: 1",
                                                    "expected": [], "head": seq}).encode(),
                    "huge": b'{"verdict":"new_stream","reason":"gap","pad":"' + b"x" * (2 << 20) + b'"}',
                    "deep": b"[" * 100000 + b"]" * 100000,
                }[srv.mode]
            try:
                self.request.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
                                     + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n" + body)
            except OSError:
                pass


@pytest.mark.parametrize("mode", ["outside_cluster", "header_injection", "huge", "deep"])
def test_garbage_from_the_ownership_service(fresh, mode):
    """Verdicts that name an address outside the cluster or carry header bytes, 2 MiB bodies,
    100 000-deep JSON: every one fails closed and explicitly; no cursor reaches a replica."""
    env = fresh.use(guard=True, ownership={"cluster": "mcp_ownership", "timeout_ms": 500})
    c, cursor = a_cursor()
    fresh.ownership.stop()
    reset_seen()
    with HostileOwnership(mode, env.admin_port) as fake:
        r = c.get_stream(last_event_id=cursor)
        assert r.status in (200, 409), r.status
        assert refused(r), (mode, r.status, r.headers)
        r.close()
        assert fake.hits >= 1
    assert_no_cursor_reached_a_replica()
    fresh.ensure_ownership()
    envoy_alive(env)


# ---- a replica's hostile SSE ---------------------------------------------------------------

class HostileUpstream(Upstream):
    """A tiny MCP-ish server: answers initialize with a session, then serves one hostile SSE body
    on GET. Records every Last-Event-ID it receives."""

    max_line = 1 << 20  # cursors and ids of 64 KiB and more

    def __init__(self, sse: bytes, port: int = HOSTILE_PORT, length: bool = False,
                 resume: bytes | None = None, gzip_sse: bool = False, post_sse: bool = False):
        self.sse = sse
        self.length = length  # a Content-Length on the SSE answer (a finite stream)
        self.resume = resume  # the whole raw answer to a GET that carries Last-Event-ID
        self.gzip_sse = gzip_sse  # the SSE answer gzip-encoded, whatever the client accepts
        self.post_sse = post_sse  # a POST with an id is answered with the SSE body
        self.accept_encodings: list[bytes] = []
        self.cursors: list[bytes] = []
        self.requests = 0
        super().__init__(port)

    def answer(self, method, headers, body, out):
        self.requests += 1
        self.accept_encodings.append(headers.get(b"accept-encoding", b""))
        if b"last-event-id" in headers:
            self.cursors.append(headers[b"last-event-id"])
        if self.resume is not None and b"last-event-id" in headers:
            out.write(self.resume)
            return False
        if method == b"POST" and b'"initialize"' in body:
            out.write(initialize_answer("hostile", b"0123abcd"))
            return True
        if method == b"POST" and not (self.post_sse and b'"id"' in body):
            out.write(ACCEPTED)
            return True
        sse = gzip.compress(self.sse) if self.gzip_sse else self.sse
        length = b"content-length: %d\r\n" % len(sse) if self.length else b""
        coding = b"content-encoding: gzip\r\n" if self.gzip_sse else b""
        send_sse(out, sse, length + coding)
        return False


def event(i: int, ident: bytes | None = None) -> bytes:
    data = json.dumps({"jsonrpc": "2.0", "method": "notifications/message", "params": {"n": i}}).encode()
    return (b"id: " + ident + b"\n" if ident is not None else b"") + b"data: " + data + b"\n\n"


HOSTILE_SSE = {
    # 4 MiB on one line, never a newline until the end.
    "no_newline_for_megabytes": event(1, b"h1") + b"data: " + b"a" * (4 << 20) + b"\n\n" + event(2, b"h2"),
    "nul_in_ids": event(1, b"h1") + event(2, b"h\x002") + event(3, b"h3"),
    "ids_of_64_kib": event(1, b"h1") + event(2, b"L" * (64 * 1024)) + event(3, b"h3"),
    "ids_past_64_kib": event(1, b"h1") + event(2, b"M" * (64 * 1024 + 1)) + event(3, b"h3"),
}


@pytest.fixture
def hostile_envoy(fresh):
    """Envoy whose only replica is the hostile upstream (the ownership service stays real)."""
    cfg = h.envoy_config(plugin_overrides={"retention": 0}, upstreams=[(h.HOST, HOSTILE_PORT)])
    with fresh.own_gateway("envoy-hostile", cfg) as env:
        yield env


@pytest.mark.parametrize("case", list(HOSTILE_SSE))
def test_a_replicas_hostile_sse(fresh, hostile_envoy, case):
    """Whatever a replica streams, every id a client sees is a bounded guard cursor (never the
    replica's own id) and Envoy stays up. A resume on an ordinary id continues with that id; on a
    hostile one it continues with the replica's own full id or is refused explicitly."""
    with HostileUpstream(HOSTILE_SSE[case]) as up:
        c = h.Client()
        c.initialize()
        s = c.get_stream()
        assert s.status == 200
        evs = s.read_all()  # the upstream ends the connection after its body
        s.close()
        # The replica's own id of each numbered event.
        raw_of = {}
        for block in HOSTILE_SSE[case].split(b"\n\n"):
            fields = dict(ln.split(b": ", 1) for ln in block.split(b"\n") if b": " in ln)
            if b"id" in fields and fields.get(b"data", b"").startswith(b"{"):
                raw_of[json.loads(fields[b"data"])["params"]["n"]] = fields[b"id"]
        seen = [(e.id, raw_of.get(e.json()["params"]["n"])) for e in evs if e.id is not None]
        assert seen, "no id reached the client"
        for cursor, raw in seen:
            assert len(cursor) <= 512 and cursor.encode() not in raw_of.values(), cursor[:80]
        time.sleep(0.2)
        # Ordinary ids first: a continuation on a hostile id may be cut (this upstream replays its
        # whole body whatever the cursor), and a cut records the stream as lost, so every later
        # cursor of it is refused explicitly, ordinary or not.
        def is_ordinary(raw):
            return raw is not None and len(raw) <= 128 and b"\0" not in raw
        seen.sort(key=lambda cr: not is_ordinary(cr[1]))
        lost = False
        for cursor, raw in seen:
            up.cursors.clear()
            r = c.get_stream(last_event_id=cursor)
            if is_ordinary(raw) and not lost:
                # An ordinary id continues, whatever else the stream carried.
                assert not refused(r), (raw, r.header(GUARD_HEADER))
            if not refused(r):
                assert up.cursors == [raw], [x[:16] for x in up.cursors]
                # An event a client cannot match with the records (no id, NUL, an id past 64 KiB)
                # inside the replay is cut (`replay_mismatch`): the client had it already. The
                # stream is then recorded lost, and its later cursors are refused explicitly.
                lost = lost or any(e.event == "mcp-resume" for e in r.read_all())
            r.close()
        assert hostile_envoy.alive
        assert c.request("POST", {"jsonrpc": "2.0", "method": "notifications/initialized"}).status == 202


# Whatever the owner answers a continuation, it is checked: events after the cursor are recorded,
# so an answer without their replay is refused by name, never passed on as an empty "resumption".
NO_REPLAY = {
    "sse_headers_only": b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: 0\r\n\r\n",
    "no_content": b"HTTP/1.1 204 No Content\r\n\r\n",
    "json": b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}",
    "gzip_sse": (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-encoding: gzip\r\n"
                 b"connection: close\r\n\r\n" + gzip.compress(event(2, b"h2") + event(3, b"h3"))),
}


@pytest.mark.parametrize("case", list(NO_REPLAY))
def test_a_continuation_answered_without_a_replay_is_refused_by_name(fresh, hostile_envoy, case):
    sse = b"".join(event(i, f"h{i}".encode()) for i in range(1, 4))
    reason = "encoded_stream" if case == "gzip_sse" else "replay_missing"
    with HostileUpstream(sse, resume=NO_REPLAY[case]) as up:
        c = h.Client()
        c.initialize()
        s = c.get_stream()
        evs = [s.next_event() for _ in range(3)]
        s.close()
        assert all(e is not None and e.id for e in evs), evs
        time.sleep(0.2)  # the records land
        before = hostile_envoy.stats()
        r = c.get_stream(last_event_id=evs[0].id)
        body = r.resp.read()
        r.close()
        assert up.cursors == [b"h1"], up.cursors  # it did go to the owner, with its own id
        assert r.status == 409 and r.header(GUARD_HEADER) == f"rejected; reason={reason}", (r.status, body)
        assert json.loads(body)["error"]["data"] == {"resumed": False, "reason": reason}
        assert b"h2" not in body and b"h3" not in body, "no raw replica id reaches a client"
        after = hostile_envoy.stats()
        key = f"mcp_resume_guard.refused.{reason}"
        assert after[key] == before[key] + 1


def test_encoded_sse_is_never_relayed(fresh, hostile_envoy):
    """Replicas are asked for identity; one that gzips its SSE anyway is refused by name, fresh or
    continued, and a request stream's call is settled with its own id."""
    sse = b"".join(event(i, f"h{i}".encode()) for i in range(1, 4))
    with HostileUpstream(sse, gzip_sse=True, post_sse=True) as up:
        c = h.Client()
        c.initialize()
        r = c.get_stream(headers={"accept-encoding": "gzip"})
        body = r.resp.read()
        r.close()
        assert r.status == 409 and r.header(GUARD_HEADER) == "rejected; reason=encoded_stream", (r.status, body)
        assert set(up.accept_encodings[1:]) == {b"identity"}, up.accept_encodings
        call = {"jsonrpc": "2.0", "id": 41, "method": "tools/call", "params": {"name": "x", "arguments": {}}}
        r = c.open("POST", call, {"accept-encoding": "gzip, br"})
        body = r.resp.read()
        r.close()
        h.assert_settled(r, body, "encoded_stream", request_id=41)
        assert b"h1" not in body


def test_a_bare_id_gets_a_cursor_whose_resume_is_refused_by_name(fresh, hostile_envoy):
    """A replica's bare `id:` (it resets a WHATWG client's last event id) names no place the
    replica could replay from. Its event gets a cursor of its own, and a resume from that cursor
    is refused by name (`id_reset`) before anyone is asked: a request stream's call is settled
    with its own id, a GET stream restarts. A resume from the next real id still continues."""
    bare = b"id:\n" + event(2)
    sse = event(1, b"h1") + bare + event(3, b"h3")
    with HostileUpstream(sse, post_sse=True) as up:
        c = h.Client()
        c.initialize()
        # A request stream: the client holds the bare event's cursor when it drops.
        call = {"jsonrpc": "2.0", "id": 43, "method": "tools/call", "params": {"name": "x", "arguments": {}}}
        r = c.open("POST", call)
        evs = r.read(2)
        r.close()
        assert [e.json()["params"]["n"] for e in evs] == [1, 2], evs
        assert evs[1].id and evs[1].id != evs[0].id, evs
        time.sleep(0.2)  # the records land
        up.cursors.clear()
        before = hostile_envoy.stats()
        r = c.get_stream(last_event_id=evs[1].id)
        body = r.resp.read()
        r.close()
        h.assert_settled(r, body, "id_reset", request_id=43)
        assert up.cursors == [], "nothing reached the replica"
        key = "mcp_resume_guard.refused.id_reset"
        assert hostile_envoy.stats().get(key, 0) == before.get(key, 0) + 1
        # A GET stream: the resume restarts by name, without the cursor.
        s = c.get_stream()
        evs = s.read(3)
        s.close()
        assert [e.json()["params"]["n"] for e in evs] == [1, 2, 3] and all(e.id for e in evs), evs
        time.sleep(0.2)
        r = c.get_stream(last_event_id=evs[1].id)
        assert r.status == 200 and r.header(GUARD_HEADER) == "restarted; reason=id_reset", r.header(GUARD_HEADER)
        first = r.next_event()
        r.close()
        assert first is not None and first.event == "mcp-resume", first
        assert first.json() == {"resumed": False, "reason": "id_reset"}
        assert up.cursors == [], up.cursors
        # After the reset, the replica's next id is a place again.
        r = c.get_stream(last_event_id=evs[2].id)
        assert not refused(r), r.header(GUARD_HEADER)
        r.close()
        assert up.cursors == [b"h3"], up.cursors


def test_a_finite_stream_with_a_length_arrives_whole(fresh, hostile_envoy):
    """A replica that sends its SSE with a Content-Length: the rewritten body is longer (cursors replace
    short ids), so the stale length must go, or the client would get the stream cut short."""
    sse = b"".join(event(i, f"h{i}".encode()) for i in range(1, 6))
    with HostileUpstream(sse, length=True):
        c = h.Client()
        c.initialize()
        s = c.get_stream()
        assert s.status == 200
        evs = s.read_all()  # the upstream ends the connection after its body
        s.close()
        assert [e.json()["params"]["n"] for e in evs] == [1, 2, 3, 4, 5]
        assert all(e.id and len(e.id) > 2 for e in evs)


def test_a_refused_protocol_version_does_not_disable_resumption(fresh, hostile_envoy):
    """A client initializes with an MCP-Protocol-Version the ownership service would refuse
    (200 bytes): other sessions' resumes still continue."""
    sse = b"".join(event(i, f"h{i}".encode()) for i in range(1, 4))
    with HostileUpstream(sse) as up:
        evil = h.Client(version=None)
        r = evil.request("POST", {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}},
                         {"mcp-protocol-version": "2025-11-25" + "x" * 200})
        assert r.status == 200
        c = h.Client()
        c.initialize()
        s = c.get_stream()
        evs = s.read(3)
        s.close()
        time.sleep(0.3)
        up.cursors.clear()
        r = c.get_stream(last_event_id=evs[1].id)
        assert not refused(r), r.headers
        r.close()
        assert up.cursors == [b"h2"]


# ---- the holes: long ids, forks --------------------------------------------------------------

@pytest.fixture
def padded(fresh):
    """Replace one replica by one with long ids; put the normal one back afterwards."""
    started = []

    def pad(port: int, nbytes: int) -> None:
        fresh.replicas[port].stop()
        name = f"r{h.REPLICA_PORTS.index(port) + 1}"
        fresh.replicas[port] = h.start_replica(port, name, fresh.state_dir, ring=RING,
                                               extra=["--id-pad", str(nbytes)])
        started.append(port)

    yield pad
    for port in started:
        fresh.replicas[port].stop()
        fresh.start_replica(port)
    # A guard that failed on these ids may keep failing (queued records): the next test gets a
    # fresh Envoy.
    fresh.stop_gateways()


def resume_continues(c: h.Client, cursor: str, last: dict) -> None:
    r = c.get_stream(last_event_id=cursor, limit=1)
    assert r.status == 200, r.status
    assert not refused(r), (r.header("x-replica"), r.headers.get(GUARD_HEADER))
    ev = r.next_event()
    r.close()
    assert ev is not None and ev.event == "message", ev
    p = ev.json()["params"]["data"]
    assert (p["stream"], p["n"]) == (last["stream"], last["n"] + 1), (p, last)


def test_long_ids_on_one_replica_leave_every_resume_working(fresh, padded):
    """One replica of three with 1,500-byte ids: every valid resume, on every replica, continues."""
    fresh.use(guard=True)
    padded(h.REPLICA_PORTS[2], 1500)
    clients = []
    for _ in range(6):
        clients.append(h.Client())
        clients[-1].initialize()
    # Then one GET each, in a row: round robin spreads them over the three replicas.
    opened = []
    for c in clients:
        s = c.get_stream(limit=4)
        evs = s.read(4)
        s.close()
        assert len(evs) == 4
        opened.append((c, s.header("x-replica"), evs))
    assert {rep for _, rep, _ in opened} == {"r1", "r2", "r3"}
    time.sleep(0.5)
    for c, rep, evs in opened:
        resume_continues(c, evs[1].id, evs[1].json()["params"]["data"])


def test_16_kib_ids_continue(fresh, padded):
    """A replica with 16 KiB ids (a batch of them is well over 1 MiB): resumes continue, and the
    replica gets its own full id back."""
    fresh.use(guard=True)
    for p in h.REPLICA_PORTS:
        padded(p, 16 * 1024)
    c = h.Client()
    c.initialize()
    t = c.call_tool("ledger_append", {"entry": "long", "steps": 80, "step_ms": 0})
    tool_evs = t.read(81)
    t.close()
    assert len(tool_evs) == 81
    s = c.get_stream(limit=5)
    evs = s.read(5)
    s.close()
    time.sleep(0.5)
    reset_seen()
    resume_continues(c, evs[2].id, evs[2].json()["params"]["data"])
    got = [x["last_event_id"] for x in all_seen() if x.get("last_event_id")]
    assert len(got) == 1 and len(got[0]) == 16 * 1024 and got[0].startswith("e"), [g[:12] for g in got]
    # A cursor of the 1.3 MiB request stream, among its newest events.
    r = c.get_stream(last_event_id=tool_evs[-3].id, limit=1)
    assert not refused(r), r.headers.get(GUARD_HEADER)
    replay = r.read(2)
    r.close()
    assert [e.data for e in replay] == [e.data for e in tool_evs[-2:]]


def told(r, evs: list) -> bool:
    return refused(r) or r.status == 409 or any(e.event == "mcp-resume" for e in evs)


def read_for(r, seconds: float, most: int = 8) -> list:
    got = []
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline and len(got) < most:
            ev = r.next_event()
            if ev is None:
                break
            got.append(ev)
    except OSError:
        pass
    r.close()
    return got


@pytest.mark.parametrize("proto", PROTOS)
def test_two_resumes_of_one_cursor_at_once(fresh, proto):
    """Two resumes of the same cursor at the same moment fork the stream. Each one either continues
    contiguously or is told (Mcp-Resume header, control event or 409), and at least one continues."""
    fresh.use(guard=True)
    for _ in range(5):  # which branch is fed what depends on timing: fork five times
        fork_once(proto)


def fork_once(proto: str) -> None:
    c = h.Client()
    c.initialize()
    t = c.call_tool("ledger_append", {"entry": "fork", "steps": 4, "step_ms": 1})
    evs = t.read_all()
    t.close()
    assert len(evs) == 5
    time.sleep(0.3)
    cursor, want = evs[1].id, [e.data for e in evs[2:]]

    def resume(cur):
        r = h.raw_request(proto, "GET", "/mcp?limit=2", session_headers(c, [("last-event-id", cur)]), timeout=5)
        return r, read_for(r, 2.0)

    with ThreadPoolExecutor(2) as pool:
        branches = list(pool.map(resume, [cursor, cursor]))
    for r, got in branches:
        data = [e.data for e in got if e.event == "message"]
        assert told(r, got) or data[:3] == want, f"a silent resume: status {r.status}, {len(got)} events: {data[:3]}"
    assert not all(told(r, got) for r, got in branches), ("a valid cursor: at least one resume must continue: "
                                                          + repr([(r.status, r.header("mcp-resume"), [(e.event, e.data[:50]) for e in got]) for r, got in branches]))
    # Not checked: what a later resume of the survivor replays. This replica feeds each reader from
    # its own producer into one session ring, so the stream's log itself holds both readers' events
    # (the replica forked it); a replica that follows one log is tested in test_forks.py.
