"""Interop with the official Rust SDK: rmcp 3.11.0 servers and rmcp's own client.

The deployment of docs/problem.md, built from a real SDK: three `rmcp-replica` processes (rmcp's
Streamable HTTP server with `LocalSessionManager`) share their sessions through rmcp's
`SessionStore` (a shared directory), so any replica restores any session, while each
replica's events stay in its own process. rmcp mints event ids `<index>/<http_request_id>`
per session and per process, so the first tool call of a session has the same ids on every
replica that runs one.

Run 1 removes the guard from Envoy's chain and shows what goes wrong; run 2 puts it back.
This stack has its own ports (replicas 9141-9143, ownership 9240, Envoy 10040 / admin
9940, all shifted by E2E_PORT_OFFSET), so it runs beside the naive-replica stack.
"""
from __future__ import annotations

import json
import re
import subprocess
import time
import uuid

import pytest

import harness as h
from stack.topology import Stack, running

OFF = h.PORT_OFFSET
PORTS = [9141 + OFF, 9142 + OFF, 9143 + OFF]
ENVOY_PORT = 10040 + OFF
ADMIN_PORT = 9940 + OFF
OWNERSHIP_PORT = 9240 + OFF
GUARD_HEADER = "mcp-resume"
RMCP_ID = re.compile(r"^\d+(/\d+)?$")  # rmcp's own event ids: <index>/<http_request_id>


class RmcpStack(Stack):
    def __init__(self, state_dir):
        super().__init__(state_dir, replicas="rmcp", replica_ports=PORTS, ownership_ports=[OWNERSHIP_PORT],
                         envoy_ports=[ENVOY_PORT], admin_ports=[ADMIN_PORT], name="envoy-rmcp")

    port = Stack.port_of

    def ensure(self) -> None:
        self.ensure_replicas(reset=False)
        self.ensure_ownership()

    def ledger(self, label: str) -> list[dict]:
        return [e for e in h.ledger(self.state_dir) if e["label"] == label]


@pytest.fixture(scope="module")
def rmcp_stack(tmp_path_factory):
    state = tmp_path_factory.mktemp("rmcp-state")
    s = RmcpStack(state)
    yield from running(s, s.ensure, remove=state)


@pytest.fixture
def rstack(rmcp_stack):
    rmcp_stack.ensure()
    return rmcp_stack


# ---- helpers ---------------------------------------------------------------------------------

def client() -> h.Client:
    c = h.Client(port=ENVOY_PORT, version="2025-11-25")
    c.initialize()
    return c


def pin(stack: RmcpStack, name: str) -> dict:
    return {h.OWNER_HEADER: h.owner_pin(stack.port(name))}


def start_call(c: h.Client, label: str, steps: int = 5, step_ms: int = 400, headers: dict | None = None):
    """tools/call `progress` with a progress token; returns (request id, open SSE stream)."""
    rid = c.next_id()
    body = {"jsonrpc": "2.0", "id": rid, "method": "tools/call",
            "params": {"name": "progress", "arguments": {"steps": steps, "step_ms": step_ms, "label": label},
                       "_meta": {"progressToken": f"tok-{label}"}}}
    s = c.open("POST", body, headers)
    assert s.status == 200 and s.is_sse, (s.status, s.headers)
    return rid, s


def read_until_progress(s: h.SSEStream, n: int) -> list[h.Event]:
    """Read the priming event and the first `n` progress notifications."""
    evs = []
    while sum(1 for e in evs if e.data and e.json().get("method") == "notifications/progress") < n:
        ev = s.next_event()
        assert ev is not None, f"stream ended early: {evs}"
        evs.append(ev)
    return evs


def drain(s: h.SSEStream, deadline_s: float = 6.0) -> list[h.Event]:
    """Read until the JSON-RPC response, the end of the stream, or the deadline."""
    got = []
    s.conn.sock.settimeout(deadline_s)  # a timed-out socket cannot be read again: one deadline
    while True:
        try:
            ev = s.next_event()
        except TimeoutError:
            break
        if ev is None:
            break
        got.append(ev)
        if ev.event == "message" and ev.data and ("result" in ev.json() or "error" in ev.json()):
            break
    return got


def messages(evs: list[h.Event]) -> list[dict]:
    return [e.json() for e in evs if e.event == "message" and e.data]


def progress_of(evs: list[h.Event]) -> list[tuple[str, float]]:
    return [(m["params"]["progressToken"], m["params"]["progress"])
            for m in messages(evs) if m.get("method") == "notifications/progress"]


def results_of(evs: list[h.Event]) -> list[dict]:
    return [m for m in messages(evs) if "result" in m or "error" in m]


def result_text(m: dict) -> str:
    return m["result"]["content"][0]["text"]


def rmcp_client(*args: str, timeout_s: float = 30) -> dict:
    out = subprocess.run([str(h.BIN / "rmcp-client"), "--url", f"http://{h.HOST}:{ENVOY_PORT}{h.PATH}", *args],
                         capture_output=True, text=True, timeout=timeout_s)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def tool_streams(report: dict) -> tuple[dict, list[dict]]:
    """The cut POST stream of the tool call and the GET streams that resumed it."""
    posts = [s for s in report["streams"] if s["method"] == "POST" and s["cut"]]
    assert len(posts) == 1, report
    resumes = [s for s in report["streams"] if s["method"] == "GET" and s["last_event_id"]]
    return posts[0], resumes


def stat(env: h.Envoy, name: str) -> int:
    return env.stats().get(f"mcp_resume_guard.{name}", 0)


# =============================================================================================
# Run 1: no guard. Plain round robin plus strict stateful_session (clients may pin a replica).
# =============================================================================================

def assert_cut_and_settled(got, reason: str) -> None:
    """A request stream cut mid-way: the control event, then the JSON-RPC error that settles the
    call (both without an id)."""
    assert [(e.event, e.id) for e in got] == [("mcp-resume", None), ("message", None)], got
    assert got[0].json() == {"resumed": False, "reason": reason}
    err = got[1].json()["error"]
    assert err["code"] == -32010 and err["data"] == {"resumed": False, "reason": reason}, err


def test_rmcp_without_guard_resume_on_a_busy_replica_returns_another_calls_result(rstack):
    """The wrong-result case: the resume lands on a replica running another call of the same
    session, whose stream has the same rmcp ids, and replays that call. HTTP 200, no error."""
    rstack.use(guard=False)
    c = client()
    a_label, b_label = f"A-{uuid.uuid4().hex[:6]}", f"B-{uuid.uuid4().hex[:6]}"
    a_id, a = start_call(c, a_label, headers=pin(rstack, "r1"))
    a_evs = read_until_progress(a, 2)
    a.close()  # the connection drops after progress 2
    cursor = a_evs[-1].id
    assert RMCP_ID.match(cursor) and cursor.endswith("/0"), cursor
    b_id, b = start_call(c, b_label, headers=pin(rstack, "r2"))  # r2 restores the session
    b_evs = read_until_progress(b, 1)
    assert b_evs[-1].id == "1/0", "the same ids on another replica"
    r = c.get_stream(last_event_id=cursor, headers=pin(rstack, "r2"))
    assert r.status == 200 and r.header("x-replica") == "r2"
    got = drain(r)
    r.close()
    b.close()
    assert {tok for tok, _ in progress_of(got)} == {f"tok-{b_label}"}, "B's progress on A's resume"
    res = results_of(got)
    assert len(res) == 1 and "error" not in res[0]
    assert res[0]["id"] == b_id and res[0]["id"] != a_id
    assert f"label={b_label}" in result_text(res[0]), "A's resume delivered B's result"
    time.sleep(0.5)
    assert len(rstack.ledger(a_label)) == 1  # A ran, its result never reached the client


def test_rmcp_without_guard_resume_on_an_idle_replica_is_an_empty_200(rstack):
    """The lost resume: a replica that knows the session but not the stream answers 200 with
    an empty SSE body, so the client learns nothing and the result is lost."""
    rstack.use(guard=False)
    c = client()
    label = f"L-{uuid.uuid4().hex[:6]}"
    _, a = start_call(c, label, headers=pin(rstack, "r1"))
    cursor = read_until_progress(a, 2)[-1].id
    a.close()
    r = c.get_stream(last_event_id=cursor, headers=pin(rstack, "r3"))
    body = r.resp.read()
    r.close()
    assert r.status == 200 and r.is_sse and r.header("x-replica") == "r3"
    assert body == b"", body
    assert r.header(GUARD_HEADER) is None
    time.sleep(2.0)
    assert len(rstack.ledger(label)) == 1, "the call finished on r1; nobody told the client"


def test_rmcp_without_guard_owner_resends_the_cursor_event(rstack):
    """rmcp replays from the cursor's own event, not after it: that event arrives twice."""
    rstack.use(guard=False)
    c = client()
    label = f"E-{uuid.uuid4().hex[:6]}"
    _, a = start_call(c, label, headers=pin(rstack, "r1"))
    evs = read_until_progress(a, 2)
    a.close()
    r = c.get_stream(last_event_id=evs[-1].id, headers=pin(rstack, "r1"))
    got = drain(r)
    r.close()
    assert (got[0].id, got[0].data) == (evs[-1].id, evs[-1].data), "the cursor's own event, again"
    assert [p for _, p in progress_of(got)] == [2, 3, 4, 5]
    assert len(results_of(got)) == 1


def test_rmcp_client_without_guard_loses_the_result(rstack):
    """rmcp's own client: its automatic resume (GET + Last-Event-ID) is spread by round robin,
    replicas without the stream answer empty 200s, the owner drops a finished call's stream,
    and the client keeps reconnecting until the caller's timeout."""
    rstack.use(guard=False)
    label = f"C-{uuid.uuid4().hex[:6]}"
    rep = rmcp_client("--label", label, "--steps", "5", "--step-ms", "300", "--cut-after", "3",
                      "--timeout-ms", "8000")
    post, resumes = tool_streams(rep)
    assert resumes and all(s["last_event_id"] == post["ids"][-1] for s in resumes)
    exactly_once = rep["result"] is not None and rep["progress"] == [1, 2, 3, 4, 5]
    assert not exactly_once, rep
    time.sleep(0.3)
    assert len(rstack.ledger(label)) == 1


def test_rmcp_client_without_guard_pinned_to_the_owner_sees_a_duplicate(rstack):
    """Even at the owner (all requests pinned), rmcp's client gets the cursor's event twice."""
    rstack.use(guard=False)
    label = f"D-{uuid.uuid4().hex[:6]}"
    owner = pin(rstack, "r2")[h.OWNER_HEADER]
    rep = rmcp_client("--label", label, "--cut-after", "3", "--header", f"{h.OWNER_HEADER}:{owner}")
    post, resumes = tool_streams(rep)
    assert resumes[0]["ids"][0] == post["ids"][-1], "the replay starts with the cursor's own event"
    assert rep["progress"] == [1, 2, 2, 3, 4, 5], rep
    assert f"label={label}" in (rep["result"] or "")


# =============================================================================================
# Run 2: with the guard.
# =============================================================================================

def test_rmcp_with_guard_resume_continues_at_the_owner_exactly_once(rstack):
    env = rstack.use(guard=True)
    before = env.stats()
    c = client()
    a_label, b_label = f"A-{uuid.uuid4().hex[:6]}", f"B-{uuid.uuid4().hex[:6]}"
    a_id, a = start_call(c, a_label)
    b_id, b = start_call(c, b_label)  # round robin: the next replica, same rmcp ids there
    owner_a, owner_b = a.header("x-replica"), b.header("x-replica")
    assert owner_a != owner_b
    a_evs = read_until_progress(a, 2)
    a.close()
    cursor = a_evs[-1].id
    assert not RMCP_ID.match(cursor), "clients see guard cursors, not rmcp ids"
    r = c.get_stream(last_event_id=cursor)
    assert r.status == 200 and r.header(GUARD_HEADER) is None
    assert r.header("x-replica") == owner_a, "the continuation reaches A's owner"
    assert h.OWNER_HEADER not in r.headers
    got = drain(r)
    r.close()
    assert all(e.id != cursor for e in got), "rmcp's re-sent cursor event is suppressed"
    assert progress_of(got) == [(f"tok-{a_label}", p) for p in (3, 4, 5)], "the rest, each once"
    res = results_of(got)
    assert len(res) == 1 and res[0]["id"] == a_id and f"label={a_label}" in result_text(res[0])
    ids = [e.id for e in a_evs + got if e.id]
    assert len(ids) == len(set(ids)), "no id twice"
    b_rest = drain(b)
    b.close()
    assert [m["id"] for m in results_of(b_rest)] == [b_id]
    after = env.stats()
    assert after["mcp_resume_guard.continued"] == before["mcp_resume_guard.continued"] + 1
    assert after["mcp_resume_guard.replay_mismatch"] == before["mcp_resume_guard.replay_mismatch"]
    assert after["mcp_resume_guard.refused.replay_mismatch"] == before["mcp_resume_guard.refused.replay_mismatch"]
    assert len(rstack.ledger(a_label)) == 1 and len(rstack.ledger(b_label)) == 1


def test_rmcp_with_guard_lagging_cursor_and_a_second_drop(rstack):
    """The client stops reading after progress 2 while the guard relays 3 and 4 (they sit in
    the socket), then drops: the guard expects 3, 4 first, rmcp sends the echo of 2 first.
    The echo is dropped and 3, 4 match the records: no mismatch. A second drop during the
    continuation and a resume from a cursor the continuation minted work the same way."""
    env = rstack.use(guard=True)
    before = env.stats()
    c = client()
    label = f"W-{uuid.uuid4().hex[:6]}"
    a_id, a = start_call(c, label, steps=8, step_ms=400)
    owner = a.header("x-replica")
    first = read_until_progress(a, 2)
    time.sleep(1.0)  # progress 3 and 4 pass the guard; the client does not read them
    a.close()
    r = c.get_stream(last_event_id=first[-1].id)
    assert r.status == 200 and r.header("x-replica") == owner and r.header(GUARD_HEADER) is None
    second = read_until_progress(r, 3)  # progress 3, 4, 5
    r.close()
    assert [p for _, p in progress_of(second)] == [3, 4, 5]
    r = c.get_stream(last_event_id=second[-1].id)
    assert r.status == 200 and r.header("x-replica") == owner and r.header(GUARD_HEADER) is None
    third = drain(r)
    r.close()
    assert [p for _, p in progress_of(third)] == [6, 7, 8]
    assert [m["id"] for m in results_of(third)] == [a_id]
    ids = [e.id for e in first + second + third if e.id]
    assert len(ids) == len(set(ids)), "no id twice"
    after = env.stats()
    assert after["mcp_resume_guard.continued"] == before["mcp_resume_guard.continued"] + 2
    assert after["mcp_resume_guard.replay_mismatch"] == before["mcp_resume_guard.replay_mismatch"]
    assert len(rstack.ledger(label)) == 1


def test_rmcp_with_echo_suppression_off_the_echo_is_a_replay_mismatch(rstack):
    """Why `suppress_cursor_echo` defaults to true: when the guard relayed events after the
    client's cursor, rmcp's echo of the cursor's event is not the recorded next event, and
    the continuation is cut with `replay_mismatch`."""
    env = rstack.use(guard=True, suppress_cursor_echo=False)
    before = stat(env, "replay_mismatch")
    c = client()
    _, a = start_call(c, f"O-{uuid.uuid4().hex[:6]}", steps=8, step_ms=400)
    first = read_until_progress(a, 2)
    time.sleep(1.0)  # progress 3 and 4 pass the guard unread
    a.close()
    r = c.get_stream(last_event_id=first[-1].id)
    got = drain(r, 3)
    r.close()
    assert_cut_and_settled(got, "replay_mismatch")
    assert stat(env, "replay_mismatch") == before + 1


def test_rmcp_with_guard_resume_after_the_call_finished_is_settled_at_the_owner(rstack):
    """rmcp's limit: LocalSessionManager drops a request stream's cache as soon as the response
    is sent, so a resume that comes after the call finished gets rmcp's empty 200 even at the
    owner. The guard routes it correctly; the result is gone, and the call's response is still
    owed: the empty answer ends with the control event and the settling error
    (`replay_missing`), so the call ends at once instead of looping on empty 200s."""
    env = rstack.use(guard=True)
    c = client()
    label = f"F-{uuid.uuid4().hex[:6]}"
    _, a = start_call(c, label, steps=3, step_ms=150)
    owner = a.header("x-replica")
    cursor = read_until_progress(a, 1)[-1].id
    a.close()
    time.sleep(1.0)  # the call finishes while the client is away
    assert len(rstack.ledger(label)) == 1
    before = stat(env, "continued")
    r = c.get_stream(last_event_id=cursor)
    got = drain(r, 3)
    r.close()
    assert r.status == 200 and r.header("x-replica") == owner
    assert_cut_and_settled(got, "replay_missing")
    assert stat(env, "continued") == before + 1


def test_rmcp_with_guard_empty_replay_of_recorded_events_is_signalled(rstack):
    """The guard relayed progress 2-4 and the result, but the client read only progress 1
    before it dropped; the call finished meanwhile and rmcp dropped its stream. The owner
    answers the resume with an empty 200. The guard knows events followed the cursor, so this
    is no resumption: control event `replay_mismatch`, and the stream is recorded as lost, so
    the next resume of that cursor is refused at once (409, `owner_unavailable`)."""
    env = rstack.use(guard=True)
    before = stat(env, "replay_mismatch")
    c = client()
    label = f"M-{uuid.uuid4().hex[:6]}"
    _, a = start_call(c, label, steps=4, step_ms=250)
    owner = a.header("x-replica")
    cursor = read_until_progress(a, 1)[-1].id
    time.sleep(1.5)  # the rest passes the guard unread; the call finishes
    a.close()
    assert len(rstack.ledger(label)) == 1
    r = c.get_stream(last_event_id=cursor)
    got = drain(r, 3)
    r.close()
    assert r.status == 200 and r.header("x-replica") == owner
    assert_cut_and_settled(got, "replay_mismatch")
    assert stat(env, "replay_mismatch") == before + 1
    time.sleep(0.1)  # the lost-stream record is asynchronous
    r = c.get_stream(last_event_id=cursor)
    body = r.resp.read()
    r.close()
    h.assert_settled(r, body, "owner_unavailable")


def test_rmcp_with_guard_owner_gone_is_signalled(rstack):
    env = rstack.use(guard=True)
    c = client()
    label = f"G-{uuid.uuid4().hex[:6]}"
    _, a = start_call(c, label, steps=5, step_ms=400)
    owner = a.header("x-replica")
    cursor = read_until_progress(a, 2)[-1].id
    a.close()
    time.sleep(0.1)  # records are asynchronous
    rstack.replicas[rstack.port(owner)].kill()
    # A killed process still in Envoy's cluster may be a blip: this resume is refused as
    # `owner_busy` (its call settled), and the stream is not declared lost for it.
    before = stat(env, "refused.owner_busy")
    r = c.get_stream(last_event_id=cursor)
    body = r.resp.read()
    r.close()
    h.assert_settled(r, body, "owner_busy")
    assert stat(env, "refused.owner_busy") == before + 1


def test_rmcp_with_guard_rmcp_id_is_a_foreign_cursor(rstack):
    """A raw rmcp id (e.g. kept from before the guard was deployed) never reaches a replica."""
    env = rstack.use(guard=True)
    c = client()
    before = stat(env, "refused.foreign_cursor")
    r = c.get_stream(last_event_id="2/0")
    assert r.status == 200
    assert r.header(GUARD_HEADER) == "restarted; reason=foreign_cursor"
    ev = r.next_event()
    r.close()
    assert ev is not None and ev.event == "mcp-resume" and ev.id is None
    assert ev.json() == {"resumed": False, "reason": "foreign_cursor"}
    assert stat(env, "refused.foreign_cursor") == before + 1


def test_rmcp_client_with_guard_resumes_the_call_exactly_once(rstack):
    """rmcp's own client resumes by itself, with the guard's cursor as its Last-Event-ID."""
    env = rstack.use(guard=True)
    before = env.stats()
    label = f"R-{uuid.uuid4().hex[:6]}"
    rep = rmcp_client("--label", label, "--steps", "5", "--step-ms", "300", "--cut-after", "3")
    assert rep["error"] is None, rep
    assert rep["progress"] == [1, 2, 3, 4, 5], rep
    assert f"label={label}" in rep["result"]
    post, resumes = tool_streams(rep)
    assert len(resumes) == 1, rep
    cursor = post["ids"][-1]
    assert resumes[0]["last_event_id"] == cursor and not RMCP_ID.match(cursor)
    assert cursor not in resumes[0]["ids"], "the echo of the cursor's event was dropped"
    after = env.stats()
    assert after["mcp_resume_guard.continued"] == before["mcp_resume_guard.continued"] + 1
    assert after["mcp_resume_guard.replay_mismatch"] == before["mcp_resume_guard.replay_mismatch"]
    assert len(rstack.ledger(label)) == 1


# ---- every protocol revision, with the guard ------------------------------------------------

@pytest.mark.parametrize("version", [None, "2025-06-18", "2025-11-25"],
                         ids=["2025-03-26-no-header", "2025-06-18", "2025-11-25"])
def test_rmcp_with_guard_resume_per_revision(rstack, version):
    """No `MCP-Protocol-Version` header means 2025-03-26 (the guard's and rmcp's rule)."""
    env = rstack.use(guard=True)
    before = env.stats()
    c = h.Client(port=ENVOY_PORT, version=version)
    c.initialize()
    label = f"V-{uuid.uuid4().hex[:6]}"
    a_id, a = start_call(c, label)
    owner = a.header("x-replica")
    evs = read_until_progress(a, 2)
    a.close()
    assert evs[0].data == "", "rmcp's priming event (id, empty data) is rewritten like any event"
    r = c.get_stream(last_event_id=evs[-1].id)
    assert r.status == 200 and r.header(GUARD_HEADER) is None and r.header("x-replica") == owner
    got = drain(r)
    r.close()
    assert [p for _, p in progress_of(got)] == [3, 4, 5]
    assert [m["id"] for m in results_of(got)] == [a_id]
    after = env.stats()
    assert after["mcp_resume_guard.continued"] == before["mcp_resume_guard.continued"] + 1
    assert after["mcp_resume_guard.replay_mismatch"] == before["mcp_resume_guard.replay_mismatch"]


@pytest.mark.parametrize("protocol", ["2025-03-26", "2025-06-18", "2025-11-25"])
def test_rmcp_client_with_guard_per_revision(rstack, protocol):
    env = rstack.use(guard=True)
    before = stat(env, "continued")
    label = f"P-{uuid.uuid4().hex[:6]}"
    rep = rmcp_client("--protocol", protocol, "--label", label, "--cut-after", "3")
    assert rep["negotiated"] == protocol, rep
    assert rep["progress"] == [1, 2, 3, 4, 5] and f"label={label}" in (rep["result"] or ""), rep
    assert stat(env, "continued") == before + 1


def test_rmcp_client_asking_for_2026_negotiates_2025_11_25_and_resumes(rstack):
    """rmcp's client configured for 2026-07-28 meets a server in session mode: `initialize`
    settles on 2025-11-25, so the call is resumable and the guard continues it."""
    env = rstack.use(guard=True)
    before = stat(env, "continued")
    rep = rmcp_client("--protocol", "2026-07-28", "--label", f"N-{uuid.uuid4().hex[:6]}", "--cut-after", "3")
    assert rep["negotiated"] == "2025-11-25", rep
    assert rep["progress"] == [1, 2, 3, 4, 5] and rep["result"], rep
    assert stat(env, "continued") == before + 1


def test_rmcp_2026_cursor_is_stripped_and_the_call_still_runs(rstack):
    """2026-07-28 has no resumption: rmcp serves it statelessly; the guard strips any cursor,
    says so, and the POST's body still reaches the server."""
    env = rstack.use(guard=True)
    c = client()
    _, a = start_call(c, f"S-{uuid.uuid4().hex[:6]}", steps=1, step_ms=1)
    cursor = read_until_progress(a, 1)[-1].id
    a.close()
    c.version, c.session = "2026-07-28", None
    before = stat(env, "refused.not_resumable_version")
    r = c.get_stream(last_event_id=cursor)
    r.resp.read()
    r.close()
    assert r.header(GUARD_HEADER) == "restarted; reason=not_resumable_version"
    assert r.status == 405, "rmcp's own answer to a 2026 GET comes through"
    label = f"S26-{uuid.uuid4().hex[:6]}"
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {},
            "io.modelcontextprotocol/clientInfo": {"name": "e2e", "version": "0"}}
    body = {"jsonrpc": "2.0", "id": 7, "method": "tools/call",
            "params": {"name": "progress", "arguments": {"steps": 1, "step_ms": 1, "label": label}, "_meta": meta}}
    # SEP-2243 (2026-07-28): rmcp requires the standard request headers.
    s = c.open("POST", body, headers={"last-event-id": cursor, "mcp-method": "tools/call", "mcp-name": "progress"})
    assert s.status == 200, (s.status, s.resp.read())
    assert s.header(GUARD_HEADER) == "stripped; reason=not_resumable_version"
    got = drain(s)
    s.close()
    assert got[0].event == "mcp-resume" and got[0].json()["reason"] == "not_resumable_version"
    assert [m["id"] for m in results_of(got)] == [7] and f"label={label}" in result_text(results_of(got)[0])
    assert stat(env, "refused.not_resumable_version") == before + 2
    assert len(rstack.ledger(label)) == 1


def test_rmcp_bad_version_the_servers_400_comes_through(rstack):
    env = rstack.use(guard=True)
    c = client()
    _, a = start_call(c, f"B-{uuid.uuid4().hex[:6]}", steps=1, step_ms=1)
    cursor = read_until_progress(a, 1)[-1].id
    a.close()
    c.version = "not-a-version"
    before = stat(env, "refused.not_resumable_version")
    r = c.get_stream(last_event_id=cursor)
    body = r.resp.read()
    r.close()
    assert r.status == 400 and b"Unsupported MCP-Protocol-Version" in body
    assert r.header(GUARD_HEADER) == "restarted; reason=not_resumable_version"
    p = c.request("POST", {"jsonrpc": "2.0", "id": c.next_id(), "method": "tools/list"},
                  headers={"last-event-id": cursor})
    assert p.status == 400 and b"Unsupported MCP-Protocol-Version" in p.body
    assert p.header(GUARD_HEADER) == "stripped; reason=not_resumable_version"
    assert stat(env, "refused.not_resumable_version") == before + 2


def test_rmcp_delete_makes_later_cursors_session_inactive(rstack):
    """rmcp's DELETE closes the session on the replica that gets it and removes it from the
    shared store; other replicas that restored it keep it in memory until their idle timeout.
    The guard records the termination, so no cursor of that session is honoured any more."""
    env = rstack.use(guard=True)
    c = client()
    _, a = start_call(c, f"T-{uuid.uuid4().hex[:6]}", steps=5, step_ms=200)
    tool_cursor = read_until_progress(a, 1)[-1].id
    a.close()
    g = c.get_stream()
    get_cursor = g.read(1)[0].id
    g.close()
    d = c.request("DELETE")
    assert d.status in (200, 202, 204), d.status
    time.sleep(0.1)  # records are asynchronous
    before = stat(env, "refused.session_inactive")
    r = c.get_stream(last_event_id=get_cursor)
    assert r.header(GUARD_HEADER) == "restarted; reason=session_inactive"
    r.close()
    r = c.get_stream(last_event_id=tool_cursor)
    body = r.resp.read()
    r.close()
    h.assert_settled(r, body, "session_inactive")
    assert stat(env, "refused.session_inactive") == before + 2


# ---- what rmcp's client does when the guard refuses its resume --------------------------------

def rmcp_client_refused(stack: RmcpStack, label: str, timeout_ms: int = 5000) -> dict:
    """rmcp's client loses its tool call's stream; before it resumes, the ownership service
    goes away, so the guard refuses the cursor (`ownership_unavailable`, fail closed)."""
    args = [str(h.BIN / "rmcp-client"), "--url", f"http://{h.HOST}:{ENVOY_PORT}{h.PATH}", "--label", label,
            "--steps", "5", "--step-ms", "300", "--cut-after", "3", "--resume-delay-ms", "1000",
            "--timeout-ms", str(timeout_ms)]
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            line = p.stderr.readline()
            if not line or "rmcp-client: cut" in line:
                break
        assert "rmcp-client: cut" in line, line
        stack.ownership.kill()  # at once: a graceful stop keeps serving Envoy's pooled connections
        out, err = p.communicate(timeout=timeout_ms / 1000 + 10)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=5)
    assert p.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def test_rmcp_client_on_the_settling_refusal_ends_its_call_at_once(rstack):
    env = rstack.use(guard=True)
    before = stat(env, "rejected")
    t0 = time.monotonic()
    rep = rmcp_client_refused(rstack, f"S-{uuid.uuid4().hex[:6]}")
    assert rep["result"] is None, rep
    assert "-32010" in rep["error"] and "ownership_unavailable" in rep["error"], rep
    assert stat(env, "rejected") >= before + 1
    # The client resumes 1 s after the cut and its timeout is 5 s: it settles long before.
    assert time.monotonic() - t0 < 4, time.monotonic() - t0


def test_rmcp_client_on_reject_retries_until_its_timeout(rstack):
    env = rstack.use(guard=True, policy={"get_stream": "restart", "request_stream": "reject"})
    before = stat(env, "rejected")
    t0 = time.monotonic()
    rep = rmcp_client_refused(rstack, f"J-{uuid.uuid4().hex[:6]}")
    _, resumes = tool_streams(rep)
    assert rep["result"] is None and rep["error"].startswith("timeout"), rep
    assert resumes and all("409" in (s["error"] or "") for s in resumes), resumes
    assert stat(env, "rejected") == before + len(resumes)
    assert time.monotonic() - t0 >= 5


def test_rmcp_client_on_restart_waits_silently_on_a_fresh_stream(rstack):
    env = rstack.use(guard=True, policy={"get_stream": "restart", "request_stream": "restart"})
    before = stat(env, "restarted")
    rep = rmcp_client_refused(rstack, f"K-{uuid.uuid4().hex[:6]}")
    _, resumes = tool_streams(rep)
    assert rep["result"] is None and rep["error"].startswith("timeout"), rep
    assert resumes and all(s["error"] is None for s in resumes), resumes
    assert stat(env, "restarted") >= before + 1


def test_rmcp_client_resuming_after_the_call_finished_is_settled(rstack):
    """Continued at the owner, but rmcp has dropped the finished call's stream: its empty 200
    ends with the guard's settling error, so rmcp's client ends the call with the reason at its
    first resume (without the guard it reconnects with the same cursor about once a second until
    its timeout: the empty-200 loop of rust-sdk #958)."""
    env = rstack.use(guard=True)
    before = stat(env, "continued")
    label = f"Z-{uuid.uuid4().hex[:6]}"
    rep = rmcp_client("--label", label, "--steps", "3", "--step-ms", "300", "--cut-after", "2",
                      "--resume-delay-ms", "1500", "--timeout-ms", "5000")
    post, resumes = tool_streams(rep)
    assert rep["result"] is None and "-32010" in rep["error"] and "replay_missing" in rep["error"], rep
    assert len(resumes) == 1, resumes
    assert resumes[0]["last_event_id"] == post["ids"][-1]
    assert stat(env, "continued") == before + 1
    assert len(rstack.ledger(label)) == 1
