"""No call left pending (issue 29, holes 5 and 6; issue 31's hang), end to end with real Envoy.

A continuation whose owner does not answer with a replay ends with a named answer, within a
bound: a hung owner (SIGSTOP) within `continuation_headers_timeout_ms`; an owner restarted on the
same address, answering with its own error or nothing, at once; an owner that replays part of what
it owes and stalls, at the deadline counted from its last replayed event. A request stream's pending call is
settled (200 SSE, control event, JSON-RPC error with the call's id); a GET stream's resume gets
the rejection. Envoy's route timeouts stay 0s (SSE-safe): the guard's own timer ends the wait.

The restarted owner is a small server written here, on 127.0.0.1 at a port derived from
E2E_PORT_OFFSET, stopped at the end of its test.
"""
from __future__ import annotations

import http.client
import json
import os
import re
import signal
import time
from contextlib import contextmanager

import pytest

import harness as h
import interop
from stack.upstream import ACCEPTED, Upstream, initialize_answer, send_sse
from test_seed_scenarios import GUARD_HEADER, open_and_read, replica_port

DEADLINE_MS = 1000
# The tick period, the callout, Envoy and a loaded 2-core machine.
MARGIN_S = 2.5
PENDING_PORT = 9170 + h.PORT_OFFSET
CALL_ID = 77


@contextmanager
def stopped(proc: h.Proc):
    """The process is stopped (SIGSTOP: its sockets stay open, nothing answers) until the block ends."""
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(proc.pid, signal.SIGCONT)


def timed_resume(c: h.Client, cursor: str):
    """A resume read to its end: the response, its body, the seconds it took."""
    t = time.monotonic()
    r = c.get_stream(last_event_id=cursor)
    body = r.resp.read()
    r.close()
    return r, body, time.monotonic() - t


def call(c: h.Client, tool: str, args: dict) -> h.SSEStream:
    body = {"jsonrpc": "2.0", "id": CALL_ID, "method": "tools/call", "params": {"name": tool, "arguments": args}}
    s = c.open("POST", body)
    assert s.status == 200 and s.is_sse, s.status
    return s


def assert_within_deadline(took: float) -> None:
    # Not before the deadline (it is the guard's timer that answered), and not long after it.
    assert DEADLINE_MS / 1000 - 0.05 <= took <= DEADLINE_MS / 1000 + MARGIN_S, took


def test_a_hung_owner_settles_the_pending_call_within_the_deadline(fresh):
    env = fresh.use(continuation_headers_timeout_ms=DEADLINE_MS)
    c = h.Client()
    c.initialize()
    s = call(c, "ledger_append", {"entry": "hung", "steps": 100, "step_ms": 50})
    evs = [s.next_event() for _ in range(2)]
    assert all(e is not None and e.id for e in evs), evs
    owner = replica_port(s)
    time.sleep(0.2)  # the records land
    before = env.stats()
    with stopped(fresh.replicas[owner]):
        s.close()
        r, body, took = timed_resume(c, evs[-1].id)
    h.assert_settled(r, body, "owner_busy", request_id=CALL_ID)
    assert_within_deadline(took)
    after = env.stats()
    key = "mcp_resume_guard.refused.owner_busy"
    assert after[key] == before.get(key, 0) + 1


def test_a_hung_owner_of_a_get_stream_is_named_within_the_deadline(fresh):
    fresh.use(continuation_headers_timeout_ms=DEADLINE_MS)
    c = h.Client()
    c.initialize()
    s, evs = open_and_read(c, 3)
    owner = replica_port(s)
    time.sleep(0.2)  # the records land
    with stopped(fresh.replicas[owner]):
        r, body, took = timed_resume(c, evs[1].id)
    assert r.status == 409 and r.header(GUARD_HEADER) == "rejected; reason=owner_busy", (r.status, body)
    assert json.loads(body)["error"]["data"] == {"resumed": False, "reason": "owner_busy"}
    assert_within_deadline(took)


# ---- an owner restarted on the same address ------------------------------------------------

class FirstLife(Upstream):
    """The owner before its restart: it opens `session`, and a call's stream breaks after its
    priming event. Every answer closes its connection (and says so, so Envoy never reuses
    one): the new process shares none."""

    def __init__(self, port: int, session: bytes):
        self.session = session
        super().__init__(port)

    def answer(self, method, headers, body, out):
        if method == b"POST" and b'"initialize"' in body:
            out.write(closing(initialize_answer("pending", self.session)))
        elif method == b"POST" and b'"tools/call"' in body:
            send_sse(out, b"id: p1\ndata: \n\n")
        else:
            out.write(closing(ACCEPTED))
        return False


class SecondLife(Upstream):
    """The same address after the restart: it knows no session, and answers every request with
    `raw`. Records the Last-Event-ID values it receives."""

    def __init__(self, port: int, raw: bytes):
        self.raw = raw
        self.cursors: list[bytes] = []
        super().__init__(port)

    def answer(self, method, headers, body, out):
        if b"last-event-id" in headers:
            self.cursors.append(headers[b"last-event-id"])
        out.write(self.raw)
        return False


def closing(answer: bytes) -> bytes:
    """A whole HTTP/1.1 answer that says its connection closes."""
    return answer.replace(b"\r\n\r\n", b"\r\nconnection: close\r\n\r\n", 1)


def http_answer(status: str, ctype: bytes | None, body: bytes) -> bytes:
    ct = b"content-type: " + ctype + b"\r\n" if ctype else b""
    return closing(b"HTTP/1.1 %s\r\n%scontent-length: %d\r\n\r\n%s" % (status.encode(), ct, len(body), body))


# The TypeScript SDK's answer to an unknown session.
UNKNOWN_SESSION = json.dumps({"jsonrpc": "2.0", "id": None, "error": {
    "code": -32000, "message": "Bad Request: No valid session ID provided"}}).encode()

RESTARTED = {
    "unknown_session_400": http_answer("400 Bad Request", b"application/json", UNKNOWN_SESSION),
    "session_gone_404": http_answer("404 Not Found", None, b""),
    "no_content_204": http_answer("204 No Content", None, b""),
    "json_200": http_answer("200 OK", b"application/json", b"{}"),
    "empty_sse_headers_only": http_answer("200 OK", b"text/event-stream", b""),
    # Headers first, then the end with nothing in it: settled at the end of the body.
    "empty_sse_body": b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n",
}


@pytest.fixture
def pending_envoy(fresh):
    """Envoy whose only replica is this test's upstream (the ownership service stays real)."""
    cfg = h.envoy_config(plugin_overrides={"retention": 0, "continuation_headers_timeout_ms": DEADLINE_MS,
                                           "replay_stall_timeout_ms": DEADLINE_MS},
                         upstreams=[(h.HOST, PENDING_PORT)])
    with fresh.own_gateway("envoy-pending", cfg) as env:
        yield env


@pytest.mark.parametrize("case", list(RESTARTED))
def test_a_restarted_owners_answer_settles_the_pending_call(fresh, pending_envoy, case):
    c = h.Client()
    # A session of its own: a 404 ends the session it answers for.
    with FirstLife(PENDING_PORT, f"pending-{case}".encode()):
        c.initialize()
        s = call(c, "slow", {})
        evs = s.read_all()
        s.close()
    assert [e.data for e in evs] == [""], evs  # the priming event only: the call is pending
    time.sleep(0.3)  # the records land
    with SecondLife(PENDING_PORT, RESTARTED[case]) as up:
        r, body, took = timed_resume(c, evs[0].id)
    assert up.cursors == [b"p1"], up.cursors  # it did go to the owner, with its own id
    assert took < MARGIN_S, took
    if case == "empty_sse_body":
        # The 200 went out before the end showed nothing came: the end says so and settles.
        assert r.status == 200 and r.header(GUARD_HEADER) is None, (r.status, body)
        # After the `retry:` hint of the shipped configs (client_retry_ms), if any.
        text = re.sub(r"\Aretry: \d+\n\n", "", body.decode())
        assert text.startswith('event: mcp-resume\ndata: {"resumed":false,"reason":"replay_missing"}\n\n'), text
        msg = json.loads(text.split("event: message\ndata: ", 1)[1].split("\n", 1)[0])
        assert msg["id"] == CALL_ID and msg["error"]["data"]["reason"] == "replay_missing", msg
    else:
        h.assert_settled(r, body, "replay_missing", request_id=CALL_ID)


# ---- an owner that answers, then sends nothing of the expected replay (issue 29, hole A) ---

def progress_event(eid: bytes, n: int) -> bytes:
    """An event of the call's stream: a progress notification with id `eid`."""
    note = json.dumps({"jsonrpc": "2.0", "method": "notifications/progress",
                       "params": {"progressToken": 1, "progress": n}}).encode()
    return b"id: " + eid + b"\ndata: " + note + b"\n\n"


class AnswersThenStalls(Upstream):
    """The owner: it opens `session`; a call's stream relays a priming event `p1` and two events
    `p2`, `p3` after it, then breaks (so both are recorded after the client's cursor `p1`). A
    resume (Last-Event-ID) is answered `200 text/event-stream`, then `replay` (nothing, or `p2`
    alone), then `stall` (nothing, or a comment) and nothing more: the connection stays open,
    silent."""

    def __init__(self, port: int, session: bytes, stall: bytes, replay: bytes = b""):
        self.session = session
        self.stall = stall
        self.replay = replay
        self.resumes: list[bytes] = []
        super().__init__(port)

    def answer(self, method, headers, body, out):
        if b"last-event-id" in headers:
            self.resumes.append(headers[b"last-event-id"])
            out.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n" + self.replay + self.stall)
            out.flush()
            return True  # reads on, silent, until the guard's answer closes the connection
        if method == b"POST" and b'"initialize"' in body:
            out.write(closing(initialize_answer("stall", self.session)))
        elif method == b"POST" and b'"tools/call"' in body:
            send_sse(out, b"id: p1\ndata: \n\n" + progress_event(b"p2", 1) + progress_event(b"p3", 2))
        else:
            out.write(closing(ACCEPTED))
        return False


STALLS = {"silence": b"", "comments_only": b": keep-alive\n\n"}


@pytest.mark.parametrize("case", list(STALLS))
def test_an_owner_that_answers_then_stalls_settles_the_pending_call(fresh, pending_envoy, case):
    """Native build: the owner's headers are held while the replay of `p2` is expected; at the
    deadline the guard still answers locally, and the pending call is settled (`owner_busy`).
    Wasm build: proxy-wasm cannot hold headers and still read the body (a headers pause is
    StopAllIterationAndWatermark), so the headers pass, the stream is reset at the deadline and
    recorded lost, and the client's reconnect is settled at once."""
    c = h.Client()
    with AnswersThenStalls(PENDING_PORT, f"stall-{case}".encode(), STALLS[case]) as up:
        c.initialize()
        s = call(c, "slow", {})
        evs = s.read_all()
        s.close()
        assert [e.data for e in evs][:1] == [""] and len(evs) == 3, evs
        time.sleep(0.3)  # the records land
        if h.BUILD == "native":
            r, body, took = timed_resume(c, evs[0].id)
            assert up.resumes == [b"p1"], up.resumes  # it did go to the owner, which answered
            h.assert_settled(r, body, "owner_busy", request_id=CALL_ID)
            assert_within_deadline(took)
            return
        t = time.monotonic()
        r = c.get_stream(last_event_id=evs[0].id)
        assert r.status == 200 and r.header(GUARD_HEADER) is None, r.status
        with pytest.raises((http.client.IncompleteRead, OSError)):
            r.resp.read()
        r.close()
        assert_within_deadline(time.monotonic() - t)
        assert up.resumes == [b"p1"], up.resumes
        time.sleep(0.3)  # the loss is recorded
        r, body, took = timed_resume(c, evs[0].id)
    assert up.resumes == [b"p1"], up.resumes  # refused at the guard, never forwarded again
    assert took < MARGIN_S, took
    h.assert_settled(r, body, "owner_unavailable", request_id=CALL_ID)


@pytest.mark.parametrize("case", list(STALLS))
def test_an_owner_that_stalls_in_the_middle_of_its_replay_settles_the_pending_call(fresh, pending_envoy, case):
    """Both builds: the owner replays `p2`, the first of the two events it owes after the
    client's cursor `p1`, then stalls. The headers went out with `p2`, so no local answer is
    possible: at the deadline, counted from `p2`, the stream is reset and recorded lost, and the
    client's reconnect from `p2`'s cursor is settled at once."""
    c = h.Client()
    replay = progress_event(b"p2", 1)
    with AnswersThenStalls(PENDING_PORT, f"midstall-{case}".encode(), STALLS[case], replay) as up:
        c.initialize()
        s = call(c, "slow", {})
        evs = s.read_all()
        s.close()
        assert [e.data for e in evs][:1] == [""] and len(evs) == 3, evs
        time.sleep(0.3)  # the records land
        t = time.monotonic()
        r = c.get_stream(last_event_id=evs[0].id)
        assert r.status == 200 and r.header(GUARD_HEADER) is None, r.status
        got = r.read_all()  # the client's own timeout (10 s) raises if the stream is left open
        took = time.monotonic() - t
        r.close()
        assert [e.data for e in got] == [evs[1].data], got  # `p2`, replayed, then nothing
        assert r.reset, "the end must not pass for the replica's own"
        assert_within_deadline(took)
        assert up.resumes == [b"p1"], up.resumes
        time.sleep(0.3)  # the loss is recorded
        r, body, took = timed_resume(c, got[0].id)
    assert up.resumes == [b"p1"], up.resumes  # refused at the guard, never forwarded again
    assert took < MARGIN_S, took
    h.assert_settled(r, body, "owner_unavailable", request_id=CALL_ID)


# ---- a fresh request stream that ends with nothing (issue 29, simulator seed sim11) --------

class AnswersNothing(Upstream):
    """A replica that restarts before answering: a call's `200 text/event-stream` ends with
    `body` (nothing, or a comment), no event, no id."""

    def __init__(self, port: int, session: bytes, body: bytes):
        self.session = session
        self.body = body
        super().__init__(port)

    def answer(self, method, headers, body, out):
        if method == b"POST" and b'"initialize"' in body:
            out.write(closing(initialize_answer("nothing", self.session)))
        elif method == b"POST" and b'"tools/call"' in body:
            send_sse(out, self.body)
        else:
            out.write(closing(ACCEPTED))
        return False


@pytest.mark.parametrize("body", [b"", b": bye\n\n"], ids=["empty", "comment"])
def test_a_fresh_request_stream_that_ends_with_nothing_settles_the_call(fresh, pending_envoy, body):
    c = h.Client()
    with AnswersNothing(PENDING_PORT, b"nothing-" + str(len(body)).encode(), body):
        c.initialize()
        s = call(c, "slow", {})
        evs = s.read_all()
        s.close()
    # The client holds no cursor: the end says why, and the call ends with its own id.
    assert [e.event for e in evs] == ["mcp-resume", "message"], evs
    assert evs[0].json() == {"resumed": False, "reason": "response_missing"}, evs
    msg = evs[1].json()
    assert msg["id"] == CALL_ID and msg["error"]["code"] == -32010, msg
    assert msg["error"]["data"] == {"resumed": False, "reason": "response_missing"}, msg
    assert all(e.id is None for e in evs), evs


PROGRESS = (b'data: {"jsonrpc":"2.0","method":"notifications/progress",'
            b'"params":{"progressToken":1,"progress":1}}\n\n')


def test_a_fresh_request_stream_that_ends_after_a_notification_settles_the_call(fresh, pending_envoy):
    # A progress notification (no id), then the replica ends before the response: the client
    # holds no cursor, and its parser dispatched no answer.
    c = h.Client()
    with AnswersNothing(PENDING_PORT, b"progress-only", PROGRESS):
        c.initialize()
        s = call(c, "slow", {})
        evs = s.read_all()
        s.close()
    assert [e.event for e in evs] == ["message", "mcp-resume", "message"], evs
    assert evs[0].json()["method"] == "notifications/progress", evs
    assert evs[1].json() == {"resumed": False, "reason": "response_missing"}, evs
    msg = evs[2].json()
    assert msg["id"] == CALL_ID and msg["error"]["code"] == -32010, msg
    assert msg["error"]["data"] == {"resumed": False, "reason": "response_missing"}, msg
    assert all(e.id is None for e in evs), evs


# ---- what the real TypeScript client is left waiting on (red team 4) -----------------------

PROGRESS_ONE = b'{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":1,"progress":1}}'

# A call's stream as the replica answers it ({ID}: the call's own id), then a clean end.
TS_SHAPES = {
    # The call's own id in a response the TypeScript SDK's schema refuses (it drops it).
    "badres-extra": b'data: {"jsonrpc":"2.0","id":{ID},"result":{"content":[]},"x":1}\n\n',
    "badres-num": b'data: {"jsonrpc":"2.0","id":{ID},"result":5}\n\n',
    "baderr-nomsg": b'data: {"jsonrpc":"2.0","id":{ID},"error":{"code":1}}\n\n',
    "res-badmeta": b'data: {"jsonrpc":"2.0","id":{ID},"result":{"_meta":5}}\n\n',
    # A cursor and a result to an id the client never sent: it does not resume.
    "other-cur": b'id: e1\ndata: {"jsonrpc":"2.0","id":987654,"result":{}}\n\n',
    # A cursor and an hour's retry: the resume comes after the bound, and is settled.
    "bigretry-cur": b"retry: 3600000\nid: e1\ndata: " + PROGRESS_ONE + b"\n\n",
}
# An id-only reset (`id:` and no data) ending the call's stream: a fresh stream is settled at its
# end; a continuation answered with only one relayed no event and settles (red team 5).
TS_SHAPES["fresh-idonly-reset"] = b"id: e1\ndata: " + PROGRESS_ONE + b"\n\nid:\n\n"
TS_SHAPES["idonly-reset-loop"] = b"id: e1\ndata: " + PROGRESS_ONE + b"\n\n"
# How a resume of the shape is answered (default: an empty stream).
TS_RESUMES = {"idonly-reset-loop": b"id:\n\n"}
TS_REASON = {"bigretry-cur": "replay_missing", "idonly-reset-loop": "replay_missing"}
RETRY_BOUND_MS = 1000


class AnswersAs(Upstream):
    """A replica answering a call's stream with `shape`, and a resume of it with an empty stream
    (it does not know the stream); a standalone GET is not offered (405)."""

    def __init__(self, port: int, session: bytes, shape: bytes, resume: bytes = b""):
        self.session = session
        self.shape = shape
        self.resume = resume
        super().__init__(port)

    def answer(self, method, headers, body, out):
        msg = json.loads(body) if method == b"POST" and body.startswith(b"{") else {}
        if msg.get("method") == "initialize":
            result = json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": {
                "protocolVersion": msg["params"]["protocolVersion"], "capabilities": {"tools": {}},
                "serverInfo": {"name": "shapes", "version": "0"}}}).encode()
            out.write(closing(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nmcp-session-id: %s\r\n"
                              b"content-length: %d\r\n\r\n%s" % (self.session, len(result), result)))
        elif msg.get("method") == "tools/call":
            send_sse(out, self.shape.replace(b"{ID}", json.dumps(msg["id"]).encode()))
        elif method == b"GET" and b"last-event-id" in headers:
            send_sse(out, self.resume)
        elif method == b"GET":
            out.write(http_answer("405 Method Not Allowed", None, b""))
        else:
            out.write(closing(ACCEPTED))
        return False


@pytest.fixture
def shapes_envoy(fresh):
    """Envoy whose only replica is this test's upstream, with a short `retry:` bound."""
    cfg = h.envoy_config(plugin_overrides={"max_retry_ms": RETRY_BOUND_MS,
                                           "continuation_headers_timeout_ms": DEADLINE_MS},
                         upstreams=[(h.HOST, PENDING_PORT)])
    with fresh.own_gateway("envoy-shapes", cfg) as env:
        yield env


@pytest.mark.parametrize("shape", list(TS_SHAPES))
def test_the_typescript_clients_call_is_settled_not_left_to_its_timeout(fresh, shapes_envoy, shape):
    interop.require_sdks(python=False)
    with AnswersAs(PENDING_PORT, b"shapes-" + shape.encode(), TS_SHAPES[shape], TS_RESUMES.get(shape, b"")):
        out = interop.ts_client("call", "--timeout", "8000")
    call_ = out["call"]
    # Not the SDK's own timeout (-32001 at 8 s): the guard's answer, naming why, within a bound.
    assert call_["outcome"] == "error", out
    assert call_["code"] == -32010, out
    assert call_["data"] == {"resumed": False, "reason": TS_REASON.get(shape, "response_missing")}, out
    assert call_["t_ms"] < 6000, out


# `retry` values that are not plain digits: browsers ignore them, Python's SDK reads them with
# `int()` and would wait an hour before resuming (red team 6, `retry-pyint`).
PY_ODD_RETRIES = [b"retry: +3600000", b"retry:  3600000", b"retry: 3_600_000", b"retry: 3600000 ",
                  "retry: \uff13600000".encode()]


@pytest.mark.parametrize("line", PY_ODD_RETRIES, ids=["plus", "two-spaces", "underscore", "trailing", "fullwidth"])
def test_the_python_clients_call_is_settled_whatever_retry_its_parser_reads(fresh, shapes_envoy, line):
    interop.require_sdks(node=False)
    shape = line + b"\nid: e1\ndata: " + PROGRESS_ONE + b"\n\n"
    with AnswersAs(PENDING_PORT, b"pyretry-%d" % PY_ODD_RETRIES.index(line), shape):
        out = interop.py_client("call", "--timeout", "8")
    call_ = out["call"]
    assert call_["outcome"] == "error", out
    assert call_["code"] == -32010, out
    assert call_["data"] == {"resumed": False, "reason": "replay_missing"}, out
    assert call_["elapsed_ms"] < 6000, out


# ---- a fresh request stream that ends inside an event too long to hold ---------------------

# Half of a 200 KB response event (over max_event_hold_bytes, so it streams out as it comes), then
# the replica's clean end.
HALF_EVENT = (b'data: {"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"'
              + b"x" * 100_000)


def test_a_fresh_request_stream_that_ends_inside_a_long_event_is_closed_and_settled(fresh, pending_envoy):
    c = h.Client()
    with AnswersNothing(PENDING_PORT, b"half-event", HALF_EVENT):
        c.initialize()
        s = call(c, "slow", {})
        t0 = time.monotonic()
        evs = s.read_all()
        took = time.monotonic() - t0
        s.close()
    # The half event is closed as one of the guard's own type (no client takes it as a message),
    # then the end says why, and the call ends with its own id: no reset.
    assert [e.event for e in evs] == ["mcp-resume-discarded", "mcp-resume", "message"], evs
    assert evs[0].data.startswith('{"jsonrpc"'), evs[0].data[:80]
    assert evs[1].json() == {"resumed": False, "reason": "response_missing"}, evs
    msg = evs[2].json()
    assert msg["id"] == CALL_ID and msg["error"]["code"] == -32010, msg
    assert all(e.id is None for e in evs), evs
    assert took < MARGIN_S, took


class AnswersNothingToAnSdk(AnswersNothing):
    """AnswersNothing, its `initialize` result carrying the request's own id (an SDK client's)."""

    def answer(self, method, headers, body, out):
        if method == b"POST" and b'"initialize"' in body:
            result = json.dumps({"jsonrpc": "2.0", "id": json.loads(body)["id"], "result": {
                "protocolVersion": "2025-11-25", "capabilities": {"tools": {}},
                "serverInfo": {"name": "nothing", "version": "0"}}}).encode()
            out.write(closing(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nmcp-session-id: %s\r\n"
                              b"content-length: %d\r\n\r\n%s" % (self.session, len(result), result)))
            return False
        return super().answer(method, headers, body, out)


def test_the_typescript_sdks_call_on_a_stream_ending_inside_a_long_event_settles(fresh, pending_envoy):
    # The real TypeScript SDK client: its call ends with the guard's error at once, not at its own
    # request timeout (8 s here).
    with AnswersNothingToAnSdk(PENDING_PORT, b"half-event-ts", HALF_EVENT):
        out = interop.ts_client("call", "--timeout", "8000", "--hard-timeout", "20000", timeout=30.0)
    assert "call" in out, out
    call_ = out["call"]
    assert call_["outcome"] == "error", out
    assert call_["code"] == -32010, call_
    assert (call_["data"] or {}).get("reason") == "response_missing", call_
    assert call_["t_ms"] < 5000, call_


# ---- a client that stops reading in the middle of a replay (red team 5, slowreader) -----------

SLOW_EVENTS = 200
SLOW_SIZE = 40_000
SLOW_PAUSE_S = 3.0
STALL_BOUND_MS = 8000
WATERMARK_STALL_MS = 2000


def big_event(n: int) -> bytes:
    note = json.dumps({"jsonrpc": "2.0", "method": "notifications/message",
                       "params": {"level": "info", "data": f"{n}:" + "x" * SLOW_SIZE}}).encode()
    return b"id: b%d\ndata: %s\n\n" % (n, note)


class ReplaysBig(Upstream):
    """The owner of a call's stream of `SLOW_EVENTS` large events (`b1` ..), which it sends whole
    and ends; a resume is answered with every event after the cursor at once, then the end."""

    def __init__(self, port: int, session: bytes):
        self.session = session
        self.events = [big_event(n) for n in range(1, SLOW_EVENTS + 1)]
        super().__init__(port)

    def answer(self, method, headers, body, out):
        if b"last-event-id" in headers:
            after = int(headers[b"last-event-id"][1:])
            send_sse(out, b"".join(self.events[after:]))
        elif method == b"POST" and b'"initialize"' in body:
            out.write(closing(initialize_answer("big", self.session)))
        elif method == b"POST" and b'"tools/call"' in body:
            send_sse(out, b"".join(self.events))
        else:
            out.write(closing(ACCEPTED))
        return False


def dechunk(data: bytes) -> bytes:
    """An HTTP/1.1 chunked body's content, as far as it is whole."""
    out, at = b"", 0
    while (eol := data.find(b"\r\n", at)) >= 0:
        size = int(data[at:eol].split(b";")[0], 16)
        if size == 0:
            break
        out += data[eol + 2:eol + 2 + size]
        at = eol + 2 + size + 2
    return out


def slow_reader_envoy_with(fresh, stall_ms: int):
    """A short bound for the first replayed event, `stall_ms` between owed events."""
    cfg = h.envoy_config(plugin_overrides={"retention": 0, "continuation_headers_timeout_ms": DEADLINE_MS,
                                           "replay_stall_timeout_ms": stall_ms},
                         upstreams=[(h.HOST, PENDING_PORT)])
    return fresh.own_gateway("envoy-slow-reader", cfg)


@pytest.fixture
def slow_reader_envoy(fresh):
    with slow_reader_envoy_with(fresh, STALL_BOUND_MS) as env:
        yield env


@pytest.fixture
def watermark_envoy(fresh):
    """The wait between owed events shorter than the client's pause."""
    with slow_reader_envoy_with(fresh, WATERMARK_STALL_MS) as env:
        yield env


def read_replay_slowly(c: h.Client, cursor: str, pause_s: float) -> tuple[bytes, bool]:
    """A resume from `cursor` on a raw socket with a small receive buffer: 64 KiB read, then
    nothing for `pause_s`, then the rest. Returns the (dechunked) body and whether it ended as
    the owner ended it."""
    import socket
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
    sock.settimeout(20)
    sock.connect((h.HOST, h.ENVOY_PORT))
    sock.sendall((f"GET /mcp HTTP/1.1\r\nhost: {h.HOST}\r\naccept: text/event-stream\r\n"
                  f"mcp-session-id: {c.session}\r\nmcp-protocol-version: 2025-11-25\r\n"
                  f"last-event-id: {cursor}\r\n\r\n").encode())
    buf = b""
    while len(buf) < 65536:
        d = sock.recv(16384)
        assert d, buf[:200]
        buf += d
    time.sleep(pause_s)
    try:
        while not buf.endswith(b"0\r\n\r\n"):
            d = sock.recv(1 << 20)
            if not d:
                break
            buf += d
    except ConnectionResetError:
        pass
    sock.close()
    head, _, chunked = buf.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    return dechunk(chunked), buf.endswith(b"0\r\n\r\n")


def assert_slow_reader_keeps_its_resume(pause_s: float) -> None:
    c = h.Client()
    with ReplaysBig(PENDING_PORT, b"slow-reader"):
        c.initialize()
        s = call(c, "big", {})
        evs = s.read_all()
        s.close()
        assert len(evs) == SLOW_EVENTS, len(evs)
        time.sleep(0.3)  # the records land
        body, whole = read_replay_slowly(c, evs[0].id, pause_s)
    assert b"mcp-resume" not in body
    got = re.findall(rb'"data": "(\d+):', body)
    assert got == [str(n).encode() for n in range(2, SLOW_EVENTS + 1)], (len(got), got[:3], got[-3:])
    assert whole, "the stream must end as the owner ended it"


def test_a_client_that_stops_reading_mid_replay_keeps_its_resume(fresh, slow_reader_envoy):
    """The client reads 64 KiB of the replay, then nothing for longer than the first event's bound
    (flow control holds the owner back meanwhile), then reads on: every owed event arrives, in
    order, and the stream ends as the owner ended it (before `replay_stall_timeout_ms` the guard
    reset it and recorded it lost)."""
    assert_slow_reader_keeps_its_resume(SLOW_PAUSE_S)


def test_a_client_that_stops_reading_longer_than_the_stall_bound_keeps_its_resume_native(fresh, watermark_envoy):
    """Native build only (proxy-wasm reports no write-buffer watermark: `make e2e` leaves it
    out, `make e2e-native` runs it): while Envoy reports the client's connection above its write-buffer high
    watermark the wait between owed events is suspended, so even a pause longer than
    `replay_stall_timeout_ms` keeps the resume."""
    assert_slow_reader_keeps_its_resume(WATERMARK_STALL_MS / 1000 + 2.0)
