"""A clean end waits for the store only where the answer can change what the client sees (issue 30).

A request stream's continuation that relays its call's answer ends at once: no `POST /v1/branch`
(its end reaches the store as a `branch_end` record). A GET stream's continuation that ends cleanly
still asks. Counted on the ownership service's `/metrics`, through Envoy and the naive replicas.
"""
from __future__ import annotations

import http.client
import time
import uuid

import harness as h

FLUSH_S = 0.3  # records (flush_ms of the stack's plugin config) reach the store
READ_S = 10.0


def asks() -> float:
    return h.ownership_metric(h.OWNERSHIP_PORT, "mcp_ownership_branch_ends_total")


def branch_end_records() -> float:
    return h.ownership_metric(h.OWNERSHIP_PORT, 'mcp_ownership_records_applied_total{type="branch_end"}')


def resume(c: h.Client, cursor: str, limit: int) -> h.SSEStream:
    """A GET with the cursor; the naive replica ends it after `limit` live events (0: the replay only)."""
    conn = http.client.HTTPConnection(h.HOST, c.port, timeout=c.timeout)
    conn.request("GET", f"{h.PATH}?limit={limit}",
                 headers=c._headers({"accept": "text/event-stream", "last-event-id": cursor}))
    return h.SSEStream(conn, conn.getresponse())


def read_to_end(s: h.SSEStream) -> list:
    """Every event until the response ends (bounded: a stream still open after READ_S fails)."""
    started = time.monotonic()
    events = s.read_within(READ_S)
    assert time.monotonic() - started < READ_S, "the continuation did not end"
    return events


def test_an_answered_request_stream_ends_without_asking(fresh):
    fresh.use(guard=True)
    c = h.Client()
    c.initialize()
    t = c.call_tool("ledger_append", {"entry": f"end-{uuid.uuid4().hex[:8]}", "steps": 3, "step_ms": 100})
    call_id = c._id  # the call's JSON-RPC id (the client's counter)
    first = t.next_event()
    assert first is not None and first.id
    t.close()  # the client drops the call's stream after its first event; the call completes
    time.sleep(0.5 + FLUSH_S)
    before, records = asks(), branch_end_records()
    r = resume(c, first.id, 0)
    assert r.status == 200 and r.header("mcp-resume") is None
    events = read_to_end(r)
    messages = [e.json() for e in events if e.event == "message"]
    assert messages and messages[-1].get("id") == call_id and "result" in messages[-1], messages
    assert not any(e.event == "mcp-resume" for e in events), [e.data for e in events]
    time.sleep(FLUSH_S)
    assert asks() == before, "the answered call's end asked the store"
    assert branch_end_records() == records + 1, "its end reached the store as a record"


def test_a_get_streams_clean_end_still_asks(fresh):
    fresh.use(guard=True)
    c = h.Client()
    c.initialize()
    g = c.get_stream()  # the replica's notifications, every tick
    first = g.next_event()
    assert first is not None and first.id
    g.close()
    time.sleep(FLUSH_S)
    before = asks()
    r = resume(c, first.id, 2)  # the replay, 2 live events, then a clean end
    assert r.status == 200 and r.header("mcp-resume") is None
    read_to_end(r)
    time.sleep(FLUSH_S)
    assert asks() == before + 1, "a GET stream's clean end asks once"
