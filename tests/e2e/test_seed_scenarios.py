"""The failures of docs/problem.md, reproduced without the guard and fixed with it.

Each scenario runs twice against the same three naive replicas: first with the guard
removed from Envoy's filter chain, where the test asserts the failure the problem
statement describes (so the test has teeth), then with the guard, where it asserts the fix:
a contiguous continuation from the owner, or an explicit signal.
"""
import socket
import time
import uuid

import pytest

import harness as h
from conftest import RING

GUARD_HEADER = "mcp-resume"


def replica_port(stream) -> int:
    return h.port_of(stream.header("x-replica"))


def pin(port: int) -> dict:
    return {h.OWNER_HEADER: h.owner_pin(port)}


def tick(ev: h.Event) -> dict:
    return ev.json()["params"]["data"]


def assert_control_event(stream, reason: str) -> None:
    ev = stream.next_event()
    assert ev is not None, "stream ended before the control event"
    assert ev.event == "mcp-resume"
    assert ev.id is None, "the control event must not carry an id"
    assert ev.json() == {"resumed": False, "reason": reason}


def assert_no_cursor_reached_a_replica() -> None:
    leaked = h.cursors_seen_by_replicas()
    assert leaked == [], f"a cursor reached a replica: {leaked}"


def resume_elsewhere(c: h.Client, cursor: str, owner: str, tries: int = 9):
    """Without the guard: reconnect until round robin lands on another replica."""
    for _ in range(tries):
        r = c.get_stream(last_event_id=cursor)
        if r.status == 200 and r.header("x-replica") != owner:
            return r
        r.close()
    pytest.fail("round robin never left the owner")


def session_with_stream(fresh, n: int, **use):
    """The stack as `use` asks, a client that initialized, and its GET stream read for n events."""
    fresh.use(**use)
    c = h.Client()
    c.initialize()
    s, evs = open_and_read(c, n)
    return c, s, evs


def continued(c: h.Client, cursor: str, owner: str, n: int) -> list[h.Event]:
    """A resume the guard continues: no `Mcp-Resume`, the owner answers; its next n events."""
    r = c.get_stream(last_event_id=cursor)
    assert r.status == 200
    assert r.header(GUARD_HEADER) is None, r.header(GUARD_HEADER)
    assert r.header("x-replica") == owner, "the continuation must reach the owner"
    got = r.read(n)
    r.close()
    return got


def open_and_read(c: h.Client, n: int, **kw):
    s = c.get_stream(**kw)
    assert s.status == 200, s.status
    evs = s.read(n)
    s.close()
    assert len(evs) == n
    return s, evs


# ---------------------------------------------------------------------------------------------
# Scenario 1: lost owner. The reconnect lands on a replica that knows the session, not the stream.
# ---------------------------------------------------------------------------------------------

def test_lost_owner_without_guard_duplicates_ids(fresh):
    c, s, evs = session_with_stream(fresh, 9, guard=False)
    owner = s.header("x-replica")
    seen = {e.id: e.data for e in evs}
    cursor = evs[6].id  # the client acknowledged e1..e7; e8, e9 arrived before the drop
    r = resume_elsewhere(c, cursor, owner)
    got = r.read(8)
    r.close()
    clashes = [e for e in got if e.id in seen and seen[e.id] != e.data]
    assert clashes, f"expected duplicate ids with different payloads, got {[e.id for e in got]}"


def test_lost_owner_with_guard_continues_at_the_owner(fresh):
    env = fresh.use(guard=True)
    before = env.stats()
    c = h.Client()
    c.initialize()
    s, evs = open_and_read(c, 9)
    owner = s.header("x-replica")
    assert all(e.id and not e.id.startswith("e") for e in evs), "ids must be guard cursors"
    assert len({e.id for e in evs}) == 9
    cursor = evs[6].id
    r = c.get_stream(last_event_id=cursor)
    assert r.status == 200
    assert r.header(GUARD_HEADER) is None
    assert r.header("x-replica") == owner, "the continuation must reach the owner"
    assert h.OWNER_HEADER not in r.headers, "the owner address must not leak"
    got = r.read(5)
    r.close()
    # The replay starts exactly after the cursor, with the very events the client had.
    assert [(e.id, e.data) for e in got[:2]] == [(e.id, e.data) for e in evs[7:9]]
    everything = evs + got
    by_id = {}
    for e in everything:
        assert by_id.setdefault(e.id, e.data) == e.data, "same id, different payload"
    after = env.stats()
    assert after["mcp_resume_guard.continued"] == before["mcp_resume_guard.continued"] + 1


def _tool_call_then_drop(c: h.Client, entry: str):
    s = c.call_tool("ledger_append", {"entry": entry, "steps": 4, "step_ms": 100})
    assert s.status == 200 and s.is_sse
    owner = s.header("x-replica")
    first = s.next_event()
    s.close()  # the connection drops after the first progress notification
    assert first is not None and first.json()["method"] == "notifications/progress"
    time.sleep(0.8)  # the call finishes on its replica meanwhile: disconnection is not cancellation
    return owner, first.id


def _result_within(stream, request_id_seen: set, deadline_s: float = 1.5):
    """Read until a JSON-RPC result arrives or the deadline passes."""
    end = time.monotonic() + deadline_s
    got = []
    stream.conn.sock.settimeout(0.3)
    while time.monotonic() < end:
        try:
            ev = stream.next_event()
        except TimeoutError:
            continue
        if ev is None:
            break
        got.append(ev)
        if ev.event == "message" and "result" in ev.json():
            break
    return got


def count_entry(stack, entry: str) -> int:
    return sum(1 for line in h.ledger(stack.state_dir) if line["entry"] == entry)


def test_lost_owner_without_guard_runs_side_effect_twice(fresh):
    fresh.use(guard=False)
    c = h.Client()
    c.initialize()
    entry = f"u-{uuid.uuid4().hex[:8]}"
    owner, cursor = _tool_call_then_drop(c, entry)
    r = resume_elsewhere(c, cursor, owner)
    got = _result_within(r, set())
    r.close()
    if not any("result" in e.json() for e in got if e.event == "message"):
        # The orchestrator believes the work was lost and issues the call again.
        again = c.call_tool("ledger_append", {"entry": entry, "steps": 1, "step_ms": 1})
        again.read_all()
        again.close()
    assert count_entry(fresh, entry) == 2, "the failure: a side-effecting call ran twice"


def test_lost_owner_with_guard_runs_side_effect_once(fresh):
    fresh.use(guard=True)
    c = h.Client()
    c.initialize()
    entry = f"u-{uuid.uuid4().hex[:8]}"
    owner, cursor = _tool_call_then_drop(c, entry)
    r = c.get_stream(last_event_id=cursor)
    assert r.status == 200 and r.header("x-replica") == owner and r.header(GUARD_HEADER) is None
    got = _result_within(r, set())
    r.close()
    msgs = [e.json() for e in got if e.event == "message"]
    progress = [m["params"]["progress"] for m in msgs if m.get("method") == "notifications/progress"]
    results = [m for m in msgs if "result" in m]
    assert progress == [2, 3, 4], f"the rest of the progress, each once: {progress}"
    assert len(results) == 1
    assert count_entry(fresh, entry) == 1


# ---------------------------------------------------------------------------------------------
# Scenario 2: a legacy cursor from an earlier session rides on a POST.
# ---------------------------------------------------------------------------------------------

def _legacy_cursor():
    old = h.Client()
    old.initialize()
    _, evs = open_and_read(old, 2)
    return evs[-1].id


def test_legacy_cursor_on_post_without_guard_drops_the_intent(fresh):
    fresh.use(guard=False)
    legacy = _legacy_cursor()
    c = h.Client()
    c.initialize()
    entry = f"legacy-{uuid.uuid4().hex[:8]}"
    r = c.call_tool("ledger_append", {"entry": entry, "steps": 1, "step_ms": 1}, headers={"last-event-id": legacy})
    got = _result_within(r, set(), deadline_s=0.8)
    r.close()
    assert not any("result" in e.json() for e in got if e.event == "message")
    time.sleep(0.2)
    assert count_entry(fresh, entry) == 0, "the failure: the POST's intent was silently dropped"


def test_legacy_cursor_on_post_with_guard_is_stripped(fresh):
    env = fresh.use(guard=True)
    legacy = _legacy_cursor()
    c = h.Client()
    c.initialize()
    entry = f"legacy-{uuid.uuid4().hex[:8]}"
    h.replica_reset(h.REPLICA_PORTS[0]), h.replica_reset(h.REPLICA_PORTS[1]), h.replica_reset(h.REPLICA_PORTS[2])
    r = c.call_tool("ledger_append", {"entry": entry, "steps": 1, "step_ms": 1}, headers={"last-event-id": legacy})
    assert r.status == 200
    assert r.header(GUARD_HEADER) == "stripped; reason=post_cursor"
    assert_control_event(r, "post_cursor")
    rest = r.read_all()
    r.close()
    assert any("result" in e.json() for e in rest)
    assert count_entry(fresh, entry) == 1
    assert_no_cursor_reached_a_replica()
    assert env.stats()["mcp_resume_guard.refused.post_cursor"] >= 1


# ---------------------------------------------------------------------------------------------
# Trimmed buffer: the cursor falls before the owner's retained window.
# ---------------------------------------------------------------------------------------------

def test_trimmed_buffer_without_guard_replays_with_a_silent_gap(fresh):
    fresh.use(guard=False)
    c = h.Client()
    c.initialize()
    s = c.get_stream()
    owner = replica_port(s)
    first = s.read(1)[0]
    s.read(RING + 8)
    s.close()
    r = c.get_stream(last_event_id=first.id, headers=pin(owner))  # reach the owner itself
    assert r.status == 200 and replica_port(r) == owner
    got = r.read(1)
    r.close()
    replayed = tick(got[0])
    assert replayed["stream"] == tick(first)["stream"]
    assert replayed["n"] > tick(first)["n"] + 1, "the silent gap: the tail replayed as if contiguous"


def test_trimmed_buffer_with_guard_restarts_explicitly(fresh):
    fresh.use(guard=True)
    c = h.Client()
    c.initialize()
    s = c.get_stream()
    first = s.read(1)[0]
    s.read(RING + 8)
    s.close()
    time.sleep(0.1)
    for p in h.REPLICA_PORTS:
        h.replica_reset(p)
    r = c.get_stream(last_event_id=first.id)
    assert r.status == 200
    assert r.header(GUARD_HEADER) == "restarted; reason=gap"
    assert_control_event(r, "gap")
    r.close()
    assert_no_cursor_reached_a_replica()


# ---------------------------------------------------------------------------------------------
# Reused id: the owner lost the stream's events (other sessions' events wrapped its ring) and
# numbers new events right after the cursor, so the next id is the one the client had, with
# another payload.
# ---------------------------------------------------------------------------------------------

def _wrap_the_ring_of(owner: str) -> None:
    """Other sessions' events push a stream's events out of its owner's process-wide ring."""
    for _ in range(12):
        c = h.Client()
        c.initialize()
        s = c.get_stream()
        if s.header("x-replica") == owner:
            assert len(s.read(RING + 4)) == RING + 4
            s.close()
            return
        s.close()
    pytest.fail("round robin never reached the owner")


def test_reused_id_without_guard_has_another_payload(fresh):
    c, s, evs = session_with_stream(fresh, 4, guard=False)
    owner = s.header("x-replica")
    _wrap_the_ring_of(owner)
    r = c.get_stream(last_event_id=evs[2].id, headers=pin(replica_port(s)))
    assert r.status == 200 and r.header("x-replica") == owner
    got = r.read(1)
    r.close()
    assert got[0].id == evs[3].id, "the owner numbers on from the cursor"
    assert got[0].data != evs[3].data, "same id, different payload"


def test_reused_id_with_guard_is_cut_as_replay_mismatch(fresh):
    env = fresh.use(guard=True)
    c = h.Client()
    c.initialize()
    s, evs = open_and_read(c, 4)
    owner = s.header("x-replica")
    time.sleep(0.1)  # the stream's records land
    _wrap_the_ring_of(owner)
    before = env.stats()["mcp_resume_guard.replay_mismatch"]
    r = c.get_stream(last_event_id=evs[2].id)
    # The owner is the right replica and the next id matches the records: only the event's
    # content tells the reused id from the event the client already had.
    assert r.status == 200 and r.header("x-replica") == owner and r.header(GUARD_HEADER) is None
    r.conn.sock.settimeout(3)
    assert_control_event(r, "replay_mismatch")
    assert r.read(3) == [], "nothing of the other stream may follow the cut"
    r.close()
    assert env.stats()["mcp_resume_guard.replay_mismatch"] == before + 1


# ---------------------------------------------------------------------------------------------
# Superseded incarnation: a stale cursor after a new GET stream.
# ---------------------------------------------------------------------------------------------

def test_superseded_without_guard_replays_another_stream(fresh):
    fresh.use(guard=False)
    c = h.Client()
    c.initialize()
    port = h.REPLICA_PORTS[0]
    _, old = open_and_read(c, 3, headers=pin(port))
    _, new = open_and_read(c, 3, headers=pin(port))
    r = c.get_stream(last_event_id=old[-1].id, headers=pin(port))
    got = r.read(10)
    r.close()
    streams = {tick(e)["stream"] for e in got}
    assert tick(new[0])["stream"] in streams, "the fork: the old cursor replayed the new stream's events"


def test_superseded_with_guard_restarts_explicitly(fresh):
    fresh.use(guard=True)
    c = h.Client()
    c.initialize()
    _, old = open_and_read(c, 3)
    _, _new = open_and_read(c, 3)
    time.sleep(0.1)  # records are asynchronous (flush_ms); let the new stream's record land
    for p in h.REPLICA_PORTS:
        h.replica_reset(p)
    r = c.get_stream(last_event_id=old[-1].id)
    assert r.header(GUARD_HEADER) == "restarted; reason=superseded"
    assert_control_event(r, "superseded")
    r.close()
    assert_no_cursor_reached_a_replica()


# ---------------------------------------------------------------------------------------------
# Forged or edited cursors.
# ---------------------------------------------------------------------------------------------

def test_forged_cursor_without_guard_is_believed(fresh):
    fresh.use(guard=False)
    c = h.Client()
    c.initialize()
    r = c.get_stream(last_event_id="e99999")
    assert r.status == 200
    got = r.read(1)
    r.close()
    assert got[0].id == "e100000", "the replica fabricated continuity from a forged cursor"
    assert any(x["last_event_id"] == "e99999" for x in h.cursors_seen_by_replicas())


def _flip(cursor: str) -> str:
    i = len(cursor) // 2
    return cursor[:i] + ("A" if cursor[i] != "A" else "B") + cursor[i + 1:]


@pytest.mark.parametrize("case", ["legacy", "edited", "truncated", "huge"])
def test_forged_cursor_with_guard_is_foreign(fresh, case):
    env = fresh.use(guard=True)
    c = h.Client()
    c.initialize()
    _, evs = open_and_read(c, 2)
    cursor = {"legacy": "e99999", "edited": _flip(evs[-1].id), "truncated": evs[-1].id[:-3],
              "huge": "x" * 6000}[case]
    for p in h.REPLICA_PORTS:
        h.replica_reset(p)
    before = env.stats().get("mcp_resume_guard.refused.foreign_cursor", 0)
    r = c.get_stream(last_event_id=cursor)
    assert r.status == 200
    assert r.header(GUARD_HEADER) == "restarted; reason=foreign_cursor"
    assert_control_event(r, "foreign_cursor")
    r.close()
    assert_no_cursor_reached_a_replica()
    assert env.stats()["mcp_resume_guard.refused.foreign_cursor"] == before + 1


def test_cursor_from_another_session_with_guard_is_refused(fresh):
    fresh.use(guard=True)
    a = h.Client()
    a.initialize()
    _, evs = open_and_read(a, 2)
    b = h.Client()
    b.initialize()
    for p in h.REPLICA_PORTS:
        h.replica_reset(p)
    r = b.get_stream(last_event_id=evs[-1].id)
    assert r.header(GUARD_HEADER) == "restarted; reason=session_mismatch"
    assert_control_event(r, "session_mismatch")
    r.close()
    assert_no_cursor_reached_a_replica()


def test_reject_policy_answers_json_error_not_404(fresh):
    fresh.use(guard=True, policy={"get_stream": "reject", "request_stream": "reject"})
    c = h.Client()
    c.initialize()
    for p in h.REPLICA_PORTS:
        h.replica_reset(p)
    r = c.get_stream(last_event_id="e12")
    body = r.resp.read()
    r.close()
    assert r.status == 409
    assert r.header(GUARD_HEADER) == "rejected; reason=foreign_cursor"
    assert r.header("content-type") == "application/json"
    err = h.Response(r.status, r.headers, body).json()
    assert err["error"]["data"] == {"resumed": False, "reason": "foreign_cursor"}
    assert "without Last-Event-ID" in err["error"]["message"]
    assert_no_cursor_reached_a_replica()


# ---------------------------------------------------------------------------------------------
# Spoofed owner header: a client must not pick its pod.
# ---------------------------------------------------------------------------------------------

def test_spoofed_owner_header_without_guard_pins_the_pod(fresh):
    fresh.use(guard=False)
    c = h.Client()
    c.initialize()
    target = h.REPLICA_PORTS[2]
    landed = set()
    for _ in range(6):
        r = c.request("POST", {"jsonrpc": "2.0", "id": c.next_id(), "method": "tools/list"}, headers=pin(target))
        landed.add(h.port_of(r.header("x-replica")))
    assert landed == {target}


def test_spoofed_owner_header_with_guard_is_removed(fresh):
    env = fresh.use(guard=True)
    before = env.stats().get("mcp_resume_guard.owner_header_removed", 0)
    c = h.Client()
    c.initialize()
    target = h.REPLICA_PORTS[2]
    landed = set()
    for _ in range(6):
        r = c.request("POST", {"jsonrpc": "2.0", "id": c.next_id(), "method": "tools/list"}, headers=pin(target))
        assert r.status == 200
        landed.add(h.port_of(r.header("x-replica")))
    assert len(landed) > 1, "round robin resumed: the spoofed pin was ignored"
    assert env.stats()["mcp_resume_guard.owner_header_removed"] == before + 6
    for p in h.REPLICA_PORTS:
        assert not any(x["has_owner_header"] for x in h.replica_get(p, "/_naive/seen"))


# ---------------------------------------------------------------------------------------------
# Owner replica killed.
# ---------------------------------------------------------------------------------------------

def test_owner_killed_without_guard_resumes_blindly(fresh):
    c, s, evs = session_with_stream(fresh, 9, guard=False)
    owner = replica_port(s)
    fresh.replicas[owner].kill()
    seen = {e.id: e.data for e in evs}
    for _ in range(9):
        r = c.get_stream(last_event_id=evs[6].id)
        if r.status == 200:
            break
        r.close()
    got = r.read(3)
    r.close()
    assert any(e.id in seen and seen[e.id] != e.data for e in got), "blind resume on a survivor"


OWNER_FAILURE_WINDOW_MS = 600


def test_owner_killed_with_guard_signals_then_restarts(fresh):
    # A killed owner still in Envoy's cluster may be a blip: each resume is refused (`owner_busy`)
    # until its failures stood through the service's window (one at each end, nothing served
    # between); then the stream is lost and restarts.
    fresh.ownership.stop()
    fresh.ownership = h.start_ownership(extra=["--owner-failure-window-ms", str(OWNER_FAILURE_WINDOW_MS)])
    cfg = {"policy": {"get_stream": "restart", "request_stream": "reject"}}
    c, s, evs = session_with_stream(fresh, 9, guard=True, **cfg)
    owner = replica_port(s)
    time.sleep(0.1)
    fresh.replicas[owner].kill()
    for p in h.REPLICA_PORTS:
        if p != owner:
            h.replica_reset(p)
    r = c.get_stream(last_event_id=evs[6].id)
    body = r.resp.read()
    r.close()
    assert r.status == 409, (r.status, body)
    assert r.header(GUARD_HEADER) == "rejected; reason=owner_busy"
    time.sleep(OWNER_FAILURE_WINDOW_MS / 1000 + 0.2)
    # One failure is no standing evidence: the resume after the window still tries the owner,
    # and its failure, a window after the first, makes the stream lost.
    r = c.get_stream(last_event_id=evs[6].id)
    body = r.resp.read()
    r.close()
    assert r.status == 409, (r.status, body)
    assert r.header(GUARD_HEADER) == "rejected; reason=owner_busy"
    time.sleep(0.2)  # its owner_failed record lands (the guard flushes every 10 ms)
    r = c.get_stream(last_event_id=evs[6].id)
    assert r.status == 200
    assert r.header(GUARD_HEADER) == "restarted; reason=owner_unavailable"
    assert replica_port(r) != owner
    assert_control_event(r, "owner_unavailable")
    r.close()
    assert_no_cursor_reached_a_replica()


# ---------------------------------------------------------------------------------------------
# Ownership service down: fail closed toward a new stream, never a blind replay.
# ---------------------------------------------------------------------------------------------

def test_ownership_down_without_guard_nothing_checks(fresh):
    # Without the guard nobody consults ownership: with the service stopped, the reconnect is still
    # forwarded, unannounced, and replayed blindly by whichever replica it lands on.
    c, s, evs = session_with_stream(fresh, 9, guard=False)
    owner = s.header("x-replica")
    seen = {e.id: e.data for e in evs}
    cursor = evs[6].id
    fresh.ownership.stop()
    assert not fresh.ownership.alive
    with pytest.raises(OSError):
        socket.create_connection((h.HOST, h.OWNERSHIP_PORT), timeout=1).close()
    for p in h.REPLICA_PORTS:
        h.replica_reset(p)
    r = resume_elsewhere(c, cursor, owner)
    assert r.header(GUARD_HEADER) is None, "nothing may speak for the guard here"
    got = r.read(8)
    r.close()
    clashes = [e for e in got if e.id in seen and seen[e.id] != e.data]
    assert clashes, f"expected duplicate ids with different payloads, got {[e.id for e in got]}"
    reached = h.cursors_seen_by_replicas()
    assert any(x["last_event_id"] == cursor for x in reached), f"the cursor must reach a replica: {reached}"


def test_ownership_down_with_guard_fails_closed(fresh):
    env = fresh.use(guard=True)
    c = h.Client()
    c.initialize()
    _, evs = open_and_read(c, 3)
    entry = f"own-{uuid.uuid4().hex[:8]}"
    t = c.call_tool("ledger_append", {"entry": entry, "steps": 2, "step_ms": 10})
    tool_cursor = t.next_event().id
    t.close()
    time.sleep(0.1)
    fresh.ownership.stop()
    for p in h.REPLICA_PORTS:
        h.replica_reset(p)
    before = env.stats()
    t0 = time.monotonic()
    r = c.get_stream(last_event_id=evs[-1].id)
    assert r.header(GUARD_HEADER) == "restarted; reason=ownership_unavailable"
    assert_control_event(r, "ownership_unavailable")
    r.close()
    assert time.monotonic() - t0 < 3.0, "fail closed, never hang"
    r = c.get_stream(last_event_id=tool_cursor)
    body = r.resp.read()
    r.close()
    h.assert_settled(r, body, "ownership_unavailable")
    assert_no_cursor_reached_a_replica()
    after = env.stats()
    assert after["mcp_resume_guard.refused.ownership_unavailable"] == \
        before["mcp_resume_guard.refused.ownership_unavailable"] + 2


# ---------------------------------------------------------------------------------------------
# Protocol revision 2026-07-28 has no resumption.
# ---------------------------------------------------------------------------------------------

def test_2026_cursor_without_guard_reaches_the_replica(fresh):
    c, _, evs = session_with_stream(fresh, 2, guard=False)
    c.version = "2026-07-28"
    r = c.get_stream(last_event_id=evs[-1].id)
    r.close()
    assert any(x["last_event_id"] == evs[-1].id and x["mcp_protocol_version"] == "2026-07-28"
               for x in h.cursors_seen_by_replicas())


def test_2026_cursor_with_guard_is_stripped(fresh):
    c, _, evs = session_with_stream(fresh, 2, guard=True)
    for p in h.REPLICA_PORTS:
        h.replica_reset(p)
    c.version = "2026-07-28"
    r = c.get_stream(last_event_id=evs[-1].id)
    assert r.header(GUARD_HEADER) == "restarted; reason=not_resumable_version"
    r.close()
    p = c.request("POST", {"jsonrpc": "2.0", "id": c.next_id(), "method": "tools/list"},
                  headers={"last-event-id": evs[-1].id})
    assert p.header(GUARD_HEADER) == "stripped; reason=not_resumable_version"
    assert_no_cursor_reached_a_replica()
