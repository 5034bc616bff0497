"""The TypeScript SDK (@modelcontextprotocol/sdk 1.32.2) behind the guard in real Envoy.

Three replicas built from the SDK's StreamableHTTPServerTransport (event store, retryInterval) sit behind
`envoy/envoy-ts-affinity.yaml`: session affinity on mcp-session-id (the `envelope` stateful_session),
then the guard, then the strict owner pin. The real Client + StreamableHTTPClientTransport drives them
(tests/interop/ts_client.mjs).
"""
import time
import uuid

import harness as h
import interop as i

i.require_sdks(node=True, python=False)


ts_stack, ts_fresh = i.sdk_fixtures("ts")
resumes = i.resumes


def call_replica(out: dict, client: str = "a") -> str:
    return next(x["replica"] for x in out["http"] if x["client"] == client and x.get("rpc") == "tools/call")


# ---- affinity ------------------------------------------------------------------------------------------

def test_affinity_keeps_a_session_on_its_replica_and_the_owner_pin_wins(tsf):
    """The two stateful_session filters compose: the later one (the guard's strict pin) wins."""
    tsf.use(guard=False)
    out = i.ts_client("call", "--steps", "2", "--step-ms", "20")
    assert out["_rc"] == 0, out
    assert out["call"]["outcome"] == "result"
    assert len({x["replica"] for x in out["http"] if x.get("status")}) == 1, "every request on the session's replica"
    # Both pins on one request: the session's replica (envelope, first) and another (x-mcp-owner, strict, later).
    c = h.Client()
    c.initialize()
    home = c.request("POST", {"jsonrpc": "2.0", "id": c.next_id(), "method": "tools/list"}).header("x-replica")
    other = next(p for p in h.REPLICA_PORTS if p != tsf.port_of(home))
    r = c.request("POST", {"jsonrpc": "2.0", "id": c.next_id(), "method": "tools/list"},
                  headers={h.OWNER_HEADER: h.owner_pin(other)})
    assert tsf.port_of(r.header("x-replica")) == other, "the strict owner pin, set later, decides"
    assert r.status == 404, "the session lives on its own replica only"


# ---- resumption ------------------------------------------------------------------------------------------

def test_resumed_tool_call_gets_every_progress_and_the_result_once(tsf):
    env = tsf.use(guard=True)
    before = env.stats()
    tag = f"ts-resume-{uuid.uuid4().hex[:8]}"
    out = i.ts_client("resume", "--tag", tag, "--steps", "5", "--step-ms", "150", "--drop-after", "2")
    assert out["_rc"] == 0, out
    owner = call_replica(out)
    # The guard's cursors are the client's tokens: opaque, and they resume.
    assert out["tokens"] and all(i.is_guard_cursor(t["token"]) for t in out["tokens"]), out["tokens"]
    assert i.is_guard_cursor(out["first"]["token"])
    [resume] = resumes(out)
    assert resume["status"] == 200 and resume["mcp_resume"] is None
    assert resume["replica"] == owner, "the resume reached the owner"
    wire = [m for m in out["messages"] if m["method"] == "notifications/progress"]
    got = [m["progress"] for m in wire]
    assert sorted(got) == [1, 2, 3, 4, 5] and len(got) == 5, f"each progress exactly once: {got}"
    results = [m for m in out["messages"] if m["result"]]
    assert len(results) == 1 and tag in results[0]["result"]
    assert out["second"]["outcome"] == "result" and tag in out["second"]["text"]
    calls = [c for c in i.replica_state(tsf.port_of(owner))["tool_calls"] if c["tag"] == tag]
    assert len(calls) == 1, "the tool ran once"
    assert i.cursors_at_replicas(h.REPLICA_PORTS) and all(
        not i.is_guard_cursor(x["last_event_id"]) for x in i.cursors_at_replicas(h.REPLICA_PORTS)), \
        "replicas only ever see their own ids"
    assert env.stats()["mcp_resume_guard.continued"] == before["mcp_resume_guard.continued"] + 1


def test_server_closed_polling_every_reconnect_reaches_the_owner(tsf):
    """2025-11-25: priming event with retry:, closeSSEStream, the transport's own reconnection."""
    env = tsf.use(guard=True)
    before = env.stats()["mcp_resume_guard.continued"]
    out = i.ts_client("poll", "--steps", "6", "--step-ms", "250", "--close-every", "2")
    assert out["_rc"] == 0, out
    assert out["call"]["outcome"] == "result" and out["call"]["progress"] == [1, 2, 3, 4, 5, 6]
    owner = call_replica(out)
    polls = resumes(out)
    assert len(polls) >= 2, out["http"]
    assert all(p["status"] == 200 and p["replica"] == owner and p["mcp_resume"] is None for p in polls), polls
    assert all(i.is_guard_cursor(p["last_event_id"]) for p in polls)
    assert env.stats()["mcp_resume_guard.continued"] == before + len(polls)


# ---- a cursor from another session ---------------------------------------------------------------------

def test_cross_session_cursor_without_guard_replays_the_other_sessions_call(tsf):
    tsf.use(guard=False)
    out = i.ts_client("cross", "--steps", "3", "--step-ms", "30", "--same-replica", "--timeout", "3000")
    assert out["_rc"] == 0, out
    assert out["a"]["result"]["outcome"] == "result"
    # Session B's request is answered with session A's result: the SDK store never checks the session.
    assert out["b"]["outcome"] == "result", out["b"]
    assert "cross-a-" in out["b"]["text"], out["b"]


def test_cross_session_cursor_with_guard_is_refused(tsf):
    env = tsf.use(guard=True)
    before = env.stats().get("mcp_resume_guard.refused.session_mismatch", 0)
    tsf.reset()
    out = i.ts_client("cross", "--steps", "3", "--step-ms", "30", "--timeout", "2000")
    assert out["_rc"] == 0, out
    # At its timeout the SDK sends notifications/cancelled with the same options, so as one more GET with
    # the same Last-Event-ID (the cancellation never reaches the server): every one is refused.
    rs = resumes(out)
    assert rs and all(r["status"] == 200 and r["mcp_resume"] == "rejected; reason=session_mismatch" for r in rs), rs
    # TS 1.32.2's explicit resume remaps only results: the settling error keeps the original
    # request's id, reaches onerror at once ("unknown message ID", naming the reason), and the
    # request itself waits for its timeout (docs/interop-ts-python.md).
    assert out["b"]["outcome"] == "timeout", out["b"]
    assert out["b"]["first_error_ms"] is not None and out["b"]["first_error_ms"] < 1000
    assert any("-32010" in (e["error"] or "") and "session_mismatch" in e["error"] for e in out["errors"]), out["errors"]
    assert i.cursors_at_replicas(h.REPLICA_PORTS) == []
    assert env.stats()["mcp_resume_guard.refused.session_mismatch"] >= before + 1


# ---- failure speed ---------------------------------------------------------------------------------------

def test_failure_speed_reject_is_the_only_answer_the_client_notices():
    """The guard's three possible answers to a refused resume, byte for byte, against the real client."""
    port = h.REPLICA_PORTS[0] + 50
    out = i.run_json([i.NODE, i.INTEROP / "failure_speed.mjs", "--port", port, "--timeout", "1000"], timeout=60)
    res = {(r["answer"], r["how"]): r for r in out["results"]}
    for how in ("explicit", "auto"):
        assert res[("reject", how)]["first_error"].startswith("Streamable HTTP error: Failed to open SSE stream")
        assert res[("reject", how)]["first_error_ms"] < 1000
        assert res[("restart", how)]["first_error_ms"] is None, "a fresh stream: nothing tells the client"
        for answer in ("reject", "restart", "sse-error"):
            assert res[(answer, how)]["outcome"] == "timeout", "TS 1.32.2 settles only at its request timeout"
    fast = i.run_json([i.NODE, i.INTEROP / "failure_speed.mjs", "--port", port, "--timeout", "1000",
                       "--abort-on-error"], timeout=60)
    res = {(r["answer"], r["how"]): r for r in fast["results"]}
    assert res[("reject", "explicit")]["outcome"] == "error" and res[("reject", "explicit")]["settled_ms"] < 500
    assert res[("restart", "explicit")]["outcome"] == "timeout"
    print("failure speed", out, fast)


def test_failure_speed_through_the_guard(tsf):
    """The real guard: reject (409) reaches onerror in one round trip; restart leaves the client waiting."""
    timings = {}
    for policy in ("reject", "restart"):
        tsf.use(guard=True, policy={"get_stream": policy, "request_stream": policy})
        out = i.ts_client("resume-token", "--token", "not-a-guard-cursor", "--timeout", "1500")
        assert out["_rc"] == 0, out
        r = resumes(out)[0]
        timings[policy] = out["resume"]
        assert out["resume"]["outcome"] == "timeout"
        if policy == "reject":
            assert r["status"] == 409 and r["mcp_resume"] == "rejected; reason=foreign_cursor"
            assert out["resume"]["first_error_ms"] < 1000
        else:
            assert r["mcp_resume"] == "restarted; reason=foreign_cursor"
    print("through the guard", timings)


# ---- session end -----------------------------------------------------------------------------------------

def test_delete_makes_later_cursors_session_inactive(tsf):
    env = tsf.use(guard=True)
    before = env.stats().get("mcp_resume_guard.refused.session_inactive", 0)
    out = i.ts_client("delete", "--steps", "2", "--step-ms", "20", "--timeout", "1500")
    assert out["_rc"] == 0, out
    assert [x["status"] for x in out["http"] if x["method"] == "DELETE"] == [200]
    r = resumes(out)[0]
    # A request stream's cursor: the settling answer (200 SSE, the call's error).
    assert r["status"] == 200 and r["mcp_resume"] == "rejected; reason=session_inactive", r
    assert env.stats()["mcp_resume_guard.refused.session_inactive"] >= before + 1


def test_404_expiry_makes_later_cursors_session_inactive(tsf):
    tsf.use(guard=True)
    out = i.ts_client("call", "--steps", "2", "--step-ms", "20")
    assert out["_rc"] == 0 and out["call"]["outcome"] == "result", out
    token = out["tokens"][-1]["token"]
    sid = out["session"]
    owner = tsf.port_of(call_replica(out))
    # The replica forgets the session (as an idle expiry would); the next request sees its 404.
    server_sid = i.envelope_inner(sid)
    assert server_sid in i.replica_state(owner)["sessions"]
    assert i.replica_post(owner, f"/_interop/expire?session={server_sid}") == 200
    c = h.Client()
    c.session = sid
    assert c.request("POST", {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).status == 404
    time.sleep(0.1)  # the guard's record of the 404 is asynchronous
    again = i.ts_client("resume-token", "--session", sid, "--token", token, "--timeout", "1500")
    r = resumes(again)[0]
    assert r["status"] == 200 and r["mcp_resume"] == "rejected; reason=session_inactive", r


def test_restart_meets_the_servers_own_409_while_its_get_stream_is_open(tsf):
    """`restart` forwards a GET without Last-Event-ID; the SDK allows one standalone stream per session."""
    tsf.use(guard=True)
    c = h.Client()
    c.initialize()
    standalone = c.get_stream()
    assert standalone.status == 200
    r = c.get_stream(last_event_id="legacy-cursor")
    body = r.resp.read()
    r.close()
    standalone.close()
    assert r.header("mcp-resume") == "restarted; reason=foreign_cursor"
    assert r.status == 409 and r.header("x-replica"), "the replica's own 409"
    assert b"Only one SSE stream" in body
