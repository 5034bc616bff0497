"""Records that keep up: a stream relayed at bulk rate stays resumable.

An upstream written here answers `initialize` with a session and a GET with EVENTS small events
(about 100 bytes each) written as fast as the connection takes them; two clients (two sessions)
read one such stream each, as fast as they can. The guard records far more ids than its record queue holds between two flushes; it
must keep the stream's newest ids (and its StreamOpen) rather than drop records, so a resume from
the last cursor the client saw continues, and `records_dropped` stays 0.
"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

import harness as h
from stack.upstream import ACCEPTED, Upstream, initialize_answer, send_sse
from stack.resume import control_reason

BULK_PORT = 9160 + h.PORT_OFFSET
EVENTS = 300_000  # per stream; ~8 MiB of recorded ids: two fill the guard's record queue (8 MiB)
STREAMS = 2
RESUMED = 3  # events the upstream sends after a resume's cursor
PAD = b"x" * 78  # "id: b<n>\ndata: " + PAD + "\n\n" is about 100 bytes


def bulk_event(n: int) -> bytes:
    return b"id: b%d\ndata: %s\n\n" % (n, PAD)


class BulkUpstream(Upstream):
    """An MCP-ish upstream: a new session on each `initialize`, then on GET `EVENTS` events at once, or
    after a `Last-Event-ID: b<k>` the next RESUMED events; each answer ends the connection."""

    conn_timeout = 30.0

    def __init__(self, port: int = BULK_PORT):
        self.body = b"".join(bulk_event(n) for n in range(1, EVENTS + 1))
        self.cursors: list[bytes] = []
        self.sessions = 0
        super().__init__(port)

    def answer(self, method, headers, body, out):
        if method == b"POST" and b'"initialize"' in body:
            self.sessions += 1
            out.write(initialize_answer("bulk", b"bulk-%d" % self.sessions))
            return True
        if method == b"POST":
            out.write(ACCEPTED)
            return True
        cursor = headers.get(b"last-event-id")
        if cursor is None:
            sse = self.body
        else:
            self.cursors.append(cursor)
            k = int(cursor.lstrip(b"b"))
            sse = b"".join(bulk_event(k + i) for i in range(1, RESUMED + 1))
        send_sse(out, sse, b"cache-control: no-cache\r\n")
        return False


@pytest.fixture
def bulk_envoy(fresh):
    """Envoy whose only replica is the bulk upstream (the ownership service stays real)."""
    cfg = h.envoy_config(plugin_overrides={"retention": 0}, upstreams=[(h.HOST, BULK_PORT)])
    with fresh.own_gateway("envoy-bulk", cfg) as env:
        yield env


def read_bulk(s: h.SSEStream, deadline: float) -> tuple[int, str | None]:
    """Reads a whole SSE body as fast as possible: how many events had an id, and the last id."""
    count, tail = 0, b"\n"
    while time.monotonic() < deadline:
        block = s.resp.read(1 << 20)
        if not block:
            break
        buf = tail + block
        count += buf.count(b"\nid: ") - tail.count(b"\nid: ")
        tail = buf[-8192:]
    at = tail.rfind(b"\nid: ")
    last = tail[at + 5:].split(b"\n", 1)[0].decode() if at >= 0 else None
    return count, last


def settled(env: h.Envoy, timeout: float = 30.0) -> dict[str, int]:
    """The guard's stats once its records stopped moving (sent or dropped) for a while."""
    deadline = time.monotonic() + timeout
    prev, still_since = None, time.monotonic()
    while time.monotonic() < deadline:
        st = env.stats()
        now = (st.get("mcp_resume_guard.records_sent", 0), st.get("mcp_resume_guard.records_dropped", 0))
        if now != prev:
            prev, still_since = now, time.monotonic()
        elif time.monotonic() - still_since > 1.0:
            return st
        time.sleep(0.1)
    return env.stats()


def test_streams_relayed_at_bulk_rate_resume(fresh, bulk_envoy):
    """Two sessions' streams at once, the second opened while the first one's ids fill the record
    queue (its StreamOpen queued behind them): both must resume."""
    with BulkUpstream() as up:
        clients = [h.Client(timeout=60) for _ in range(STREAMS)]
        for c in clients:
            c.initialize()
        first = clients[0].get_stream()
        assert first.status == 200 and first.is_sse
        started = time.monotonic()
        with ThreadPoolExecutor(STREAMS) as pool:
            reads = [pool.submit(read_bulk, first, started + 120)]
            # The second stream opens while the first one's records fill the queue.
            time.sleep(0.3)
            second = clients[1].get_stream()
            assert second.status == 200 and second.is_sse
            reads.append(pool.submit(read_bulk, second, started + 120))
            read = [f.result() for f in reads]
        streams = [first, second]
        took = time.monotonic() - started
        for s in streams:
            s.close()
        total = sum(n for n, _ in read)
        print(f"relayed {total} events in {took:.2f} s ({total / took:.0f} events/s)")
        assert [n for n, _ in read] == [EVENTS] * STREAMS, "every stream is relayed whole"
        cursors = [cur for _, cur in read]
        assert all(cur and not cur.startswith("b") for cur in cursors), "every id the client sees is a cursor"
        st = settled(bulk_envoy)
        dropped = st.get("mcp_resume_guard.records_dropped", 0)

        # Each client reconnects from the last event it saw: its stream continues after it.
        for i, (c, cursor) in enumerate(zip(clients, cursors)):
            r = c.get_stream(last_event_id=cursor)
            evs = r.read_within(10, done=lambda e: len(e) >= RESUMED)
            r.close()
            reasons = [control_reason(e) for e in evs]
            assert r.status == 200 and reasons and reasons[0] is None, \
                f"stream {i}: resume refused: {r.status} {r.headers.get('mcp-resume')} {reasons[:1]} " \
                f"(records_dropped {dropped})"
            assert [e.data for e in evs] == [PAD.decode()] * RESUMED
        assert up.cursors == [b"b%d" % EVENTS] * STREAMS, up.cursors
        assert dropped == 0, {k: v for k, v in st.items() if "records" in k}
