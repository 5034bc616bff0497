"""The guard's request and response rules that are not one of the failure scenarios (test_seed_scenarios.py):
callout failures of every kind, replay verification, session end, no-cursor fast path."""
import socket
import socketserver
import time
from pathlib import Path

import pytest

import harness as h
from stack.procs import LocalServer
from conftest import RING
from test_seed_scenarios import (GUARD_HEADER, assert_control_event, assert_no_cursor_reached_a_replica, open_and_read,
                                 session_with_stream)


class FakeOwnership(LocalServer):
    """Stands in for the ownership service and fails in one chosen way."""

    def __init__(self, mode: str):
        self.mode = mode
        self.hits = 0
        self.held: list[socket.socket] = []
        super().__init__(h.OWNERSHIP_PORT)

    class Handler(socketserver.BaseRequestHandler):
        def handle(self):
            srv = self.server
            self.request.settimeout(5)
            try:
                data = self.request.recv(65536)
            except OSError:
                return
            if not data:
                return
            srv.hits += 1
            mode = srv.mode
            if mode == "hang":
                srv.held.append(self.request)
                time.sleep(3)
                return
            if mode == "partial":
                # Headers, then a reset mid-body: Envoy reports a response without headers.
                self.request.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                                     b"content-length: 200\r\n\r\n{\"verdict\":")
                self.request.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                self.request.close()
                return
            if mode == "reset":
                self.request.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                self.request.close()
                return
            status, body = {"500": ("500 Internal Server Error", b'{"error":"boom"}'),
                            "garbage": ("200 OK", b"<html>not json</html>"),
                            "wrong_shape": ("200 OK", b'{"verdict":"maybe","owner":7}')}[mode]
            self.request.sendall(b"HTTP/1.1 " + status.encode() + b"\r\ncontent-type: application/json\r\n"
                                 b"content-length: " + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n" + body)

    def __exit__(self, *exc):
        super().__exit__(*exc)
        for s in self.held:
            s.close()


# How Envoy reports each failure to the filter: a timeout or a reset arrives either as a
# response without headers or as Envoy's own 5xx, depending on where it happens.
FAILURE_STAT = {"hang": ("no_response", "status"), "reset": ("no_response", "status"), "500": ("status",),
                "garbage": ("body",), "wrong_shape": ("body",), "partial": ("no_response",)}


@pytest.mark.parametrize("mode", ["hang", "reset", "partial", "500", "garbage", "wrong_shape"])
def test_every_callout_failure_fails_closed(fresh, mode):
    env = fresh.use(guard=True, ownership={"cluster": "mcp_ownership", "timeout_ms": 300})
    c = h.Client()
    c.initialize()
    _, evs = open_and_read(c, 2)
    tool_cursor = c.finished_call_cursor(f"cf-{mode}", steps=1, step_ms=1)
    time.sleep(0.1)
    fresh.ownership.stop()
    for p in h.REPLICA_PORTS:
        h.replica_reset(p)
    before = env.stats()
    with FakeOwnership(mode) as fake:
        t0 = time.monotonic()
        r = c.get_stream(last_event_id=evs[-1].id)
        elapsed = time.monotonic() - t0
        assert r.status == 200
        assert r.header(GUARD_HEADER) == "restarted; reason=ownership_unavailable"
        assert_control_event(r, "ownership_unavailable")
        r.close()
        r = c.get_stream(last_event_id=tool_cursor)
        body = r.resp.read()
        r.close()
        h.assert_settled(r, body, "ownership_unavailable")
        assert fake.hits >= 2, "the guard did call out"
    assert elapsed < 2.0, f"fail-closed took {elapsed:.2f}s"
    assert_no_cursor_reached_a_replica()
    after = env.stats()
    delta = {k: after[f"mcp_resume_guard.callout_failures.{k}"] - before[f"mcp_resume_guard.callout_failures.{k}"]
             for k in ("no_response", "status", "body", "dispatch")}
    print(f"callout failure {mode}: {delta}")
    assert sum(delta[k] for k in FAILURE_STAT[mode]) == 2, delta


def test_no_callout_without_a_cursor(fresh):
    env = fresh.use(guard=True)
    before = env.stats()["mcp_resume_guard.callouts"]
    c = h.Client()
    c.initialize()
    open_and_read(c, 3)
    c.request("POST", {"jsonrpc": "2.0", "id": c.next_id(), "method": "tools/list"})
    assert env.stats()["mcp_resume_guard.callouts"] == before


def test_replay_that_skips_an_event_is_cut(fresh):
    # The operator declared no retention, so only the replay check can catch the trimmed owner.
    env = fresh.use(guard=True, retention=0)
    c = h.Client()
    c.initialize()
    s = c.get_stream()
    owner = s.header("x-replica")
    first = s.read(1)[0]
    s.read(RING + 4)
    s.close()
    time.sleep(0.1)
    before = env.stats()["mcp_resume_guard.replay_mismatch"]
    r = c.get_stream(last_event_id=first.id)
    assert r.status == 200 and r.header("x-replica") == owner and r.header(GUARD_HEADER) is None
    r.conn.sock.settimeout(3)
    assert_control_event(r, "replay_mismatch")
    rest = r.read(3)
    r.close()
    assert rest == [], "nothing of a lossy replay may follow the cut"
    assert env.stats()["mcp_resume_guard.replay_mismatch"] == before + 1
    # The incarnation is now lost: the next resume restarts explicitly.
    time.sleep(0.1)
    r = c.get_stream(last_event_id=first.id)
    assert r.header(GUARD_HEADER) == "restarted; reason=owner_unavailable"
    r.close()


def test_delete_terminates_and_404_expires(fresh):
    c, _, evs = session_with_stream(fresh, 2, guard=True)
    d = c.request("DELETE")
    assert d.status == 200
    time.sleep(0.1)
    r = c.get_stream(last_event_id=evs[-1].id)
    assert r.header(GUARD_HEADER) == "restarted; reason=session_inactive"
    r.close()

    c2 = h.Client()
    c2.initialize()
    _, evs2 = open_and_read(c2, 2)
    (Path(fresh.state_dir) / "sessions" / c2.session).unlink()  # the session expires on the replicas
    gone = c2.request("POST", {"jsonrpc": "2.0", "id": c2.next_id(), "method": "tools/list"})
    assert gone.status == 404, "a session that is gone is still 404, straight from the replica"
    time.sleep(0.1)
    r = c2.get_stream(last_event_id=evs2[-1].id)
    assert r.header(GUARD_HEADER) == "restarted; reason=session_inactive"
    r.close()


def test_bad_protocol_version_gets_the_servers_own_400(fresh):
    c, _, evs = session_with_stream(fresh, 2, guard=True)
    c.version = "banana"
    r = c.get_stream(last_event_id=evs[-1].id)
    body = r.resp.read()
    r.close()
    assert r.status == 400 and b"error" in body
    assert r.header(GUARD_HEADER) == "restarted; reason=not_resumable_version"
    assert_no_cursor_reached_a_replica()


def test_owner_address_never_leaks(fresh):
    c, s, evs = session_with_stream(fresh, 3, guard=True)
    r = c.get_stream(last_event_id=evs[0].id)
    r.close()
    for resp in (s, r):
        assert h.OWNER_HEADER not in resp.headers
        for v in resp.headers.values():
            assert "127.0.0.1:91" not in v and h.owner_pin(h.port_of(resp.header("x-replica"))) not in v
