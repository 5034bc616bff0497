"""Every MCP protocol revision end to end, through the guard, with real SDK servers and clients.

| revision | SDK parts | what is checked |
| 2025-03-26 | TS and Python clients + servers, no MCP-Protocol-Version header | the guard assumes 2025-03-26: a resume continues at the owner |
| 2025-06-18 | Python client + Python servers; TS client + TS servers | the client's own reconnect / an explicit token continue at the owner |
| 2025-11-25 | Python client + Python servers (TS in test_interop_ts.py) | priming event, retry:, server-closed polling: every poll reaches the owner |
| 2026-07-28 | Python client + Python servers (the SDK's sessionless leg) | a cursor is stripped and signalled, never reaches the replica; the real client works untouched |
| invalid | TS servers | the server's own 400 comes through, with the guard's signal |
"""
import pytest

import harness as h
from stack.topology import running
import interop as i

i.require_sdks(node=True, python=True)


class Sdks:
    """One SDK's replicas at a time on the harness ports."""

    def __init__(self, stack):
        self.stack = stack
        self.current: i.SdkStack | None = None

    def get(self, kind: str) -> i.SdkStack:
        if self.current is not None and self.current.kind == kind:
            return self.current
        if self.current is not None:
            self.current.stop()
        self.current = i.SdkStack(self.stack, kind).start()
        return self.current

    def stop(self) -> None:
        if self.current is not None:
            self.current.stop()


@pytest.fixture(scope="module")
def sdks(stack):
    yield from running(Sdks(stack))


def resumes(out: dict) -> list[dict]:
    return [x for x in out["http"] if x["method"] == "GET" and x["last_event_id"] and x.get("status")]


def call_replica(out: dict) -> str:
    return next(x["replica"] for x in out["http"] if x.get("rpc") == "tools/call")


# ---- TypeScript ------------------------------------------------------------------------------------------

def test_2025_03_26_without_version_header_resumes_at_the_owner(sdks):
    ts = sdks.get("ts")
    env = ts.use(guard=True)
    before = env.stats()["mcp_resume_guard.continued"]
    out = i.ts_client("resume", "--version", "2025-03-26", "--omit-version-header",
                      "--steps", "5", "--step-ms", "120", "--drop-after", "2")
    assert out["_rc"] == 0, out
    assert all(x["version_header"] is None for x in out["http"]), "no MCP-Protocol-Version on the wire"
    [r] = resumes(out)
    assert r["status"] == 200 and r["mcp_resume"] is None and r["replica"] == call_replica(out)
    got = sorted(m["progress"] for m in out["messages"] if m["method"] == "notifications/progress")
    assert got == [1, 2, 3, 4, 5]
    assert out["second"]["outcome"] == "result"
    assert env.stats()["mcp_resume_guard.continued"] == before + 1


def test_2025_06_18_typescript_explicit_resume(sdks):
    ts = sdks.get("ts")
    ts.use(guard=True)
    out = i.ts_client("resume", "--version", "2025-06-18", "--steps", "4", "--step-ms", "120", "--drop-after", "2")
    assert out["_rc"] == 0, out
    assert {x["version_header"] for x in out["http"] if x.get("rpc") != "initialize"} <= {"2025-06-18", None}
    [r] = resumes(out)
    assert r["status"] == 200 and r["mcp_resume"] is None and r["replica"] == call_replica(out)
    assert out["second"]["outcome"] == "result"


def test_invalid_version_the_servers_own_400_comes_through(sdks):
    ts = sdks.get("ts")
    ts.use(guard=True)
    c = h.Client()
    c.initialize()
    s = c.call_tool("progress_steps", {"steps": 1, "step_ms": 1})
    cursor = [e.id for e in s.read_all() if e.id][-1]
    s.close()
    ts.reset()
    c.version = "not-a-version"
    plain = c.request("POST", {"jsonrpc": "2.0", "id": c.next_id(), "method": "tools/list"})
    assert plain.status == 400 and plain.header("x-replica") and plain.header("mcp-resume") is None
    assert "Unsupported protocol version" in plain.body.decode()
    post = c.request("POST", {"jsonrpc": "2.0", "id": c.next_id(), "method": "tools/list"},
                     headers={"last-event-id": cursor})
    assert post.status == 400 and post.header("x-replica"), "the server's own answer"
    assert post.header("mcp-resume") == "stripped; reason=not_resumable_version"
    assert "Unsupported protocol version" in post.body.decode()
    get = c.get_stream(last_event_id=cursor)
    body = get.resp.read()
    get.close()
    assert get.status == 400 and get.header("mcp-resume") == "restarted; reason=not_resumable_version"
    assert b"Unsupported protocol version" in body
    assert i.cursors_at_replicas(h.REPLICA_PORTS) == []


# ---- Python ----------------------------------------------------------------------------------------------

def test_2025_03_26_python_client_without_version_header_reconnects_to_the_owner(sdks):
    py = sdks.get("py")
    py.use(guard=True)
    out = i.py_client("drop", "--version", "2025-03-26", "--omit-version-header", "--steps", "5", "--step-ms", "100",
                      "--drop-after", "2")
    assert out["_rc"] == 0, out
    assert out["negotiated"] == "2025-03-26"
    assert all(x["version_header"] is None for x in out["http"]), "no MCP-Protocol-Version on the wire"
    assert out["call"]["outcome"] == "result" and out["progress"] == [1, 2, 3, 4, 5]
    [r] = resumes(out)
    assert r["status"] == 200 and r["mcp_resume"] is None and r["replica"] == call_replica(out)
    assert r["progress"] == [3, 4, 5] and r["results"] == 1


def test_2025_06_18_python_client_reconnects_to_the_owner(sdks):
    py = sdks.get("py")
    py.use(guard=True)
    out = i.py_client("drop", "--version", "2025-06-18", "--steps", "5", "--step-ms", "100", "--drop-after", "2")
    assert out["_rc"] == 0, out
    assert out["negotiated"] == "2025-06-18"
    assert {x["version_header"] for x in out["http"] if x.get("rpc") != "initialize"} == {"2025-06-18"}
    assert out["call"]["outcome"] == "result" and out["progress"] == [1, 2, 3, 4, 5]
    [r] = resumes(out)
    assert r["status"] == 200 and r["mcp_resume"] is None and r["replica"] == call_replica(out)


def test_2025_11_25_priming_retry_and_polling_every_poll_reaches_the_owner(sdks):
    py = sdks.get("py")
    env = py.use(guard=True)
    before = env.stats()["mcp_resume_guard.continued"]
    out = i.py_client("poll", "--steps", "6", "--step-ms", "200", "--close-every", "2")
    assert out["_rc"] == 0, out
    assert out["call"]["outcome"] == "result" and out["progress"] == [1, 2, 3, 4, 5, 6]
    owner = call_replica(out)
    polls = resumes(out)
    assert len(polls) >= 2, out["http"]
    assert all(p["status"] == 200 and p["replica"] == owner and p["mcp_resume"] is None for p in polls), polls
    assert env.stats()["mcp_resume_guard.continued"] == before + len(polls)
    # On the wire: the priming event (an id, empty data) with retry:, its id rewritten to a cursor.
    c = h.Client()
    c.initialize()
    s = c.call_tool("progress_steps", {"steps": 1, "step_ms": 1})
    raw = s.resp.read().decode()
    s.close()
    # The first block with an id (a guard's `client_retry_ms` hint may come before it).
    blocks = [b.split("\n") for b in raw.replace("\r\n", "\n").split("\n\n")]
    first = next(b for b in blocks if any(line.startswith("id:") for line in b))
    fields = dict(line.split(": ", 1) if ": " in line else (line.rstrip(":"), "") for line in first)
    assert fields.get("retry") == "200" and fields.get("data", "") == "", first
    assert i.is_guard_cursor(fields["id"])


def test_2026_07_28_cursor_is_stripped_and_signalled(sdks):
    py = sdks.get("py")
    py.use(guard=True)
    old = h.Client()
    old.initialize()
    s = old.call_tool("progress_steps", {"steps": 1, "step_ms": 1})
    cursor = [e.id for e in s.read_all() if e.id][-1]
    s.close()
    py.reset()
    c = h.Client(version="2026-07-28")
    post = c.request("POST", {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, headers={"last-event-id": cursor})
    assert post.header("mcp-resume") == "stripped; reason=not_resumable_version"
    assert post.header("x-replica"), "answered by the SDK's sessionless leg"
    get = c.get_stream(last_event_id=cursor)
    get.close()
    assert get.header("mcp-resume") == "restarted; reason=not_resumable_version"
    assert i.cursors_at_replicas(h.REPLICA_PORTS) == []
    seen = i.replica_state(h.REPLICA_PORTS[0])["requests"] + i.replica_state(h.REPLICA_PORTS[1])["requests"] \
        + i.replica_state(h.REPLICA_PORTS[2])["requests"]
    assert any(x["mcp_protocol_version"] == "2026-07-28" for x in seen)


@pytest.mark.parametrize("legacy_cursor", [False, True])
def test_2026_07_28_real_python_client_and_server(sdks, legacy_cursor):
    """The SDK's 2026-07-28 client (no session, one POST per request) through the guard, untouched; a
    cursor it carries from older state is stripped and signalled, and the call still runs."""
    py = sdks.get("py")
    py.use(guard=True)
    py.reset()
    extra = ["--inject-cursor", "AQFiKW_gns19gtZYlGWcSErnAQIHMl9weTFfM9BJS9l5CvzjbYj5Xy2x_jI"] if legacy_cursor else []
    out = i.py_client("modern", "--version", "2026-07-28", "--steps", "2", "--step-ms", "10", *extra)
    assert out["_rc"] == 0, out
    assert out["call"]["outcome"] == "result", out["call"]
    posts = [x for x in out["http"] if x["method"] == "POST"]
    assert posts and all(x["version_header"] == "2026-07-28" and x["status"] == 200 for x in posts)
    want = "stripped; reason=not_resumable_version" if legacy_cursor else None
    assert all(x["mcp_resume"] == want for x in posts), posts
    assert i.cursors_at_replicas(h.REPLICA_PORTS) == []
