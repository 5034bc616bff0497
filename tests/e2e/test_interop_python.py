"""The Python SDK (PyPI `mcp` 2.3.0) behind the guard in real Envoy.

Three replicas built from the SDK's stateful Streamable HTTP leg with a small EventStore
(tests/interop/py_server.py) behind `envoy/envoy-ts-affinity.yaml` (sessions live in one process, as with
TypeScript). The real ClientSession over streamable_http_client drives them (tests/interop/py_client.py).
"""
import time
import uuid

import pytest

import harness as h
import interop as i

i.require_sdks(node=False, python=True)


py_stack, py_fresh = i.sdk_fixtures("py")
resumes = i.resumes


def call_replica(out: dict) -> str:
    return next(x["replica"] for x in out["http"] if x.get("rpc") == "tools/call")


def test_dropped_call_reconnects_to_the_owner_and_completes_once(pyf):
    env = pyf.use(guard=True)
    before = env.stats()["mcp_resume_guard.continued"]
    out = i.py_client("drop", "--steps", "5", "--step-ms", "120", "--drop-after", "2")
    assert out["_rc"] == 0, out
    assert out["call"]["outcome"] == "result", out["call"]
    assert out["progress"] == [1, 2, 3, 4, 5], "every progress notification, once"
    owner = call_replica(out)
    [r] = resumes(out)
    assert r["status"] == 200 and r["replica"] == owner and r["mcp_resume"] is None
    assert i.is_guard_cursor(r["last_event_id"])
    assert r["progress"] == [3, 4, 5] and r["results"] == 1, r
    assert all(i.is_guard_cursor(t["token"]) for t in out["tokens"])
    assert env.stats()["mcp_resume_guard.continued"] == before + 1
    assert all(not i.is_guard_cursor(x["last_event_id"]) for x in i.cursors_at_replicas(h.REPLICA_PORTS))


def test_explicit_resumption_token_replays_the_rest_once(pyf):
    pyf.use(guard=True)
    out = i.py_client("resume", "--steps", "5", "--step-ms", "60", "--from", "2")
    assert out["_rc"] == 0, out
    assert out["first"]["outcome"] == "result" and out["resume"]["outcome"] == "result"
    assert out["resume"]["text"] == out["first"]["text"]
    [r] = resumes(out)
    assert r["status"] == 200 and r["replica"] == call_replica(out) and r["mcp_resume"] is None
    assert r["progress"] == [3, 4, 5] and r["results"] == 1, r
    tag = out["first"]["text"].split()[1]
    calls = [c for c in i.replica_state(pyf.port_of(call_replica(out)))["tool_calls"] if c["tag"] == tag]
    assert len(calls) == 1


def _token_of_another_session() -> str:
    a = i.py_client("call", "--steps", "2", "--step-ms", "10")
    assert a["_rc"] == 0 and a["call"]["outcome"] == "result", a
    return a["tokens"][0]["token"]


@pytest.mark.parametrize("case", [
    # (guard policy for both stream kinds, token, expected guard answer)
    ("default", "foreign", "restarted; reason=foreign_cursor"),
    ("restart", "other_session", "restarted; reason=session_mismatch"),
])
def test_what_the_python_client_does_on_a_refusal(pyf, case):
    """With the client's own GET stream open: the SDK opens it in the background after `initialized`,
    and the client waits for it here, as in an application that has run a while (without the wait the
    resume could come first: the next test)."""
    policy, which, answer = case
    overrides = {} if policy == "default" else {"policy": {"get_stream": policy, "request_stream": policy}}
    pyf.use(guard=True, **overrides)
    token = f"legacy-{uuid.uuid4().hex[:6]}" if which == "foreign" else _token_of_another_session()
    out = i.py_client("token", "--token", token, "--timeout", "3", "--get-stream", "open")
    assert out.get("get_stream_open") is True, out
    [r] = resumes(out)
    assert r["mcp_resume"] == answer, r
    # A restart forwards a GET without Last-Event-ID: the SDK server already holds this session's
    # standalone GET stream and answers its own 409. Either way the client meets a 409.
    assert r["status"] == 409
    if answer.startswith("restarted"):
        assert r["replica"] is not None, "the replica's own 409"
    else:
        assert r["replica"] is None, "the guard's local reply"
    # mcp 2.3.0: raise_for_status() in the resumption task; the HTTPStatusError escapes the transport's
    # task group and takes the whole client session down (the request never gets a JSON-RPC error).
    assert out["_rc"] == 2 and out["fatal"]["exception"] == "HTTPStatusError", out
    assert i.cursors_at_replicas(h.REPLICA_PORTS) == []


def test_a_restart_before_the_clients_get_stream_opens_is_a_fresh_stream(pyf):
    """A resume right after `initialize`, before the client's own GET stream is up (the client holds
    that GET back until the resume is answered): the restart becomes the session's standalone stream,
    the client's own GET meets the server's 409, and the pending call hangs to its timeout."""
    pyf.use(guard=True)
    out = i.py_client("token", "--token", f"legacy-{uuid.uuid4().hex[:6]}", "--timeout", "3",
                      "--get-stream", "late")
    [r] = resumes(out)
    assert r["mcp_resume"] == "restarted; reason=foreign_cursor", r
    assert r["status"] == 200 and r["replica"] is not None, r
    own = [x for x in out["http"] if x["method"] == "GET" and not x["last_event_id"]]
    assert own and all(x["status"] == 409 for x in own), own
    # mcp 2.3.0 reads no mcp-resume header or event: the call waits for a result that never comes.
    assert out["resume"]["outcome"] == "hang", out["resume"]
    assert out["_rc"] == 0, out
    assert i.cursors_at_replicas(h.REPLICA_PORTS) == []


def test_a_settled_refusal_ends_the_python_call_and_keeps_the_session(pyf):
    """The default for a request stream's cursor: the guard answers 200 SSE with the call's error; the
    client's explicit resume ends with that error (-32010, the reason), and its session goes on."""
    pyf.use(guard=True)
    out = i.py_client("token", "--token", _token_of_another_session(), "--timeout", "3")
    [r] = resumes(out)
    assert r["status"] == 200 and r["mcp_resume"] == "rejected; reason=session_mismatch", r
    assert r["replica"] is None, "the guard's own answer"
    assert out["_rc"] == 0, out
    assert out["resume"]["outcome"] == "error" and "session_mismatch" in out["resume"]["error"], out["resume"]
    assert i.cursors_at_replicas(h.REPLICA_PORTS) == []


def test_delete_through_a_python_server_makes_cursors_session_inactive(pyf):
    env = pyf.use(guard=True)
    before = env.stats().get("mcp_resume_guard.refused.session_inactive", 0)
    c = h.Client()
    c.initialize()
    s = c.call_tool("progress_steps", {"steps": 2, "step_ms": 10})
    evs = s.read_all()
    s.close()
    cursor = [e.id for e in evs if e.id][-1]
    assert i.is_guard_cursor(cursor)
    assert c.request("DELETE").status == 200
    time.sleep(0.1)  # the guard's record of the DELETE is asynchronous
    r = c.get_stream(last_event_id=cursor)
    body = r.resp.read()
    r.close()
    h.assert_settled(r, body, "session_inactive")
    assert env.stats()["mcp_resume_guard.refused.session_inactive"] == before + 1


@pytest.mark.parametrize("policy,answer,by_guard", [
    ("restart", "restarted; reason=foreign_cursor", False),
    ("reject", "rejected; reason=foreign_cursor", True),
])
def test_refused_automatic_reconnect_fails_the_call_cleanly(pyf, policy, answer, by_guard):
    """The client's own reconnect meets a refusal: two tries at the server's retry interval, then an error."""
    pyf.use(guard=True, policy={"get_stream": policy, "request_stream": policy})
    out = i.py_client("drop", "--spoil-reconnect", f"legacy-{uuid.uuid4().hex[:6]}", "--steps", "5",
                      "--step-ms", "100", "--drop-after", "2", "--timeout", "8")
    assert out["_rc"] == 0, out
    tries = resumes(out)
    assert len(tries) == 2 and all(r["status"] == 409 and r["mcp_resume"] == answer for r in tries), tries
    assert all((r["replica"] is None) == by_guard for r in tries), "guard's local reply vs the replica's own 409"
    assert out["call"]["outcome"] == "error"
    assert "reconnection attempts were exhausted" in out["call"]["error"]
    assert out["call"]["elapsed_ms"] < 3000
    assert out["progress"] == [1, 2]


def test_idle_expiry_404_makes_later_cursors_session_inactive(py):
    """The SDK's own idle timeout ends the session; its 404 through the guard marks the session expired."""
    py.start(idle_s=1.0)  # the last test of the module: the replicas restart with a short idle timeout
    env = py.use(guard=True)
    before = env.stats().get("mcp_resume_guard.refused.session_inactive", 0)
    c = h.Client()
    c.initialize()
    s = c.call_tool("progress_steps", {"steps": 1, "step_ms": 1})
    cursor = [e.id for e in s.read_all() if e.id][-1]
    s.close()
    time.sleep(2.5)  # idle: any request would reset the SDK's timer
    status = c.request("POST", {"jsonrpc": "2.0", "id": c.next_id(), "method": "tools/list"}).status
    assert status == 404, "the SDK expired the idle session"
    time.sleep(0.1)  # the guard's record of the 404 is asynchronous
    r = c.get_stream(last_event_id=cursor)
    body = r.resp.read()
    r.close()
    h.assert_settled(r, body, "session_inactive")
    assert env.stats()["mcp_resume_guard.refused.session_inactive"] == before + 1
