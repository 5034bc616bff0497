"""The `retry:` hint (`client_retry_ms`, issue 31), end to end with real Envoy.

With the hint configured, a request stream reaches the client with `retry: <ms>` and a blank line as
its very first bytes: a POST's SSE answer and the continuation of such a stream. A GET stream never
carries it, and without the field (or with 0) no stream does. The naive replicas send no `retry:` of
their own, so any `retry:` the client reads is the guard's.
"""
from __future__ import annotations

import json
import time

import harness as h
from stack.envoy import config_holder, guard_filter

HINT = b"retry: 250\n\n"


def recorded(s: h.SSEStream) -> h.SSEStream:
    """The stream, keeping every body line the client reads from now on (set before the first read)."""
    s.transcript = bytearray()
    return s


def call_and_resume(c: h.Client) -> tuple[bytes, list[h.Event], bytes, list[h.Event]]:
    """A call whose stream the client drops after two events, then resumes from the second: what the
    client read on each, and the events."""
    s = recorded(c.call_tool("ledger_append", {"entry": "hint", "steps": 5, "step_ms": 100}))
    assert s.status == 200 and s.is_sse, s.status
    first = s.read(2)
    s.close()
    assert len(first) == 2 and all(e.id for e in first), first
    time.sleep(0.8)  # the call finishes on its replica: the replay holds the rest and the result
    r = recorded(c.get_stream(last_event_id=first[-1].id))
    assert r.status == 200 and r.is_sse, r.status
    rest = r.read_within(10, done=lambda evs: any("result" in e.data for e in evs))
    r.close()
    return bytes(s.transcript), first, bytes(r.transcript), rest


def test_request_streams_start_with_the_hint(fresh):
    fresh.use(client_retry_ms=250)
    c = h.Client()
    c.initialize()
    post, first, cont, rest = call_and_resume(c)
    assert post.startswith(HINT), post[:200]
    assert cont.startswith(HINT), cont[:200]
    # The hint dispatches nothing: no empty event before the call's own.
    assert all(e.data for e in first + rest), first + rest
    assert any("result" in e.data for e in rest), rest


def test_no_hint_on_get_streams_nor_when_off(fresh):
    fresh.use(client_retry_ms=250)
    c = h.Client()
    c.initialize()
    g = recorded(c.get_stream(limit=2))
    assert g.status == 200, g.status
    assert len(g.read(2)) == 2
    g.close()
    assert b"retry:" not in g.transcript, bytes(g.transcript[:200])
    # 0: off.
    fresh.use(client_retry_ms=0)
    assert_no_hint(h.Client())
    # The field left out (the shipped configs set it): off too.
    cfg = fresh.gateway_config(0, True, dict(fresh.plugin_defaults))
    holder = config_holder(guard_filter(cfg))
    pc = json.loads(holder["value"])
    pc.pop("client_retry_ms", None)
    holder["value"] = json.dumps(pc)
    with fresh.own_gateway("nohint", cfg):
        assert_no_hint(h.Client(port=fresh.envoy_ports[0]))


def assert_no_hint(c: h.Client) -> None:
    c.initialize()
    post, _, cont, rest = call_and_resume(c)
    assert b"retry:" not in post and b"retry:" not in cont, (post[:200], cont[:200])
    assert any("result" in e.data for e in rest), rest
