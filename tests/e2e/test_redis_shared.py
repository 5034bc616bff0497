"""Several guards, one truth: two Envoys (each with the guard), two ownership instances on one
Redis, three naive replicas; and the failures a shared store brings.

Topology (ports shift with E2E_PORT_OFFSET):
  Envoy 1  ENVOY_PORT+1 (admin ADMIN_PORT+1) ─┐            ┌─► replicas 9101-9103
  Envoy 2  ENVOY_PORT+2 (admin ADMIN_PORT+2) ─┴─ cluster ──┤
       mcp_ownership = [OWNERSHIP_PORT+1, OWNERSHIP_PORT+2] ─► redis-server REDIS_PORT
The replicas are the session-wide ones of conftest's `stack`; the memory-store ownership
service of the other tests (OWNERSHIP_PORT) is left alone.
"""
import os
import signal
import statistics
import subprocess
import threading
import time
import uuid

import pytest

import harness as h
from stack.topology import running
from conftest import RING
from test_seed_scenarios import (GUARD_HEADER, assert_control_event, assert_no_cursor_reached_a_replica, continued,
                                 open_and_read)

E1, E2 = h.ENVOY_PORT + 1, h.ENVOY_PORT + 2
A1, A2 = h.ADMIN_PORT + 1, h.ADMIN_PORT + 2
O1, O2 = h.OWNERSHIP_PORT + 1, h.OWNERSHIP_PORT + 2
CALLOUT_TIMEOUT_MS = 250
# Envoy 1 holds its records back this long, so a resume through Envoy 2 can overtake them.
E1_FLUSH_MS = 100


def shared_envoy_config(listener: int, admin: int, flush_ms: int) -> dict:
    cfg = h.envoy_config(guard=True, listener_port=listener, admin_port=admin, ownership_ports=[O1, O2],
                         plugin_overrides={"retention": RING,
                                           "ownership": {"cluster": "mcp_ownership",
                                                         "timeout_ms": CALLOUT_TIMEOUT_MS,
                                                         "flush_ms": flush_ms}})
    for c in cfg["static_resources"]["clusters"]:
        if c["name"] == "mcp_ownership":
            # The production setup (README): an instance that dies or loses Redis leaves the
            # rotation within a health-check interval; a refused connection ejects it at once.
            c["health_checks"] = [{"timeout": "0.2s", "interval": "0.25s", "no_traffic_interval": "0.25s",
                                   "unhealthy_threshold": 1, "healthy_threshold": 1,
                                   "http_health_check": {"path": "/healthz"}}]
            c["outlier_detection"] = {"split_external_local_origin_errors": True,
                                      "consecutive_local_origin_failure": 1,
                                      "base_ejection_time": "2s", "max_ejection_percent": 50}
    return cfg


class Shared:
    def __init__(self, stack):
        self.stack = stack
        self.redis: h.Proc | None = None
        self.own: dict[int, h.Proc] = {}
        self.envoys: list[h.Envoy] = []

    def store_url(self) -> str:
        return f"redis://{h.HOST}:{h.REDIS_PORT}"

    def ensure_store(self) -> None:
        if self.redis is None or not self.redis.alive:
            self.redis = h.start_redis()

    def start_ownership(self, port: int) -> None:
        self.own[port] = h.start_ownership(port, ["--store", self.store_url()])

    def ensure(self) -> None:
        self.stack.ensure_replicas()
        self.ensure_store()
        for p in (O1, O2):
            if p not in self.own or not self.own[p].alive:
                self.start_ownership(p)
        if not self.envoys or not all(e.alive for e in self.envoys):
            for e in self.envoys:
                e.stop()
            self.envoys = [h.Envoy("envoy-shared-1", shared_envoy_config(E1, A1, E1_FLUSH_MS), A1, E1).start(),
                           h.Envoy("envoy-shared-2", shared_envoy_config(E2, A2, 10), A2, E2).start()]
        wait_healthy([O1, O2])

    def stop(self) -> None:
        for p in [*self.envoys, *self.own.values(), self.redis]:
            if p is not None:
                p.stop()
        # Hand the session-wide replicas back as a fresh start would (`fresh` restarts them):
        # some failure scenarios without the guard depend on the replicas' event counters, which
        # this module's traffic moves.
        for r in self.stack.replicas.values():
            r.stop()


def wait_healthy(ports, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(h.http_json("GET", p, "/healthz", timeout=1)[0] == 200 for p in ports):
            time.sleep(0.6)  # Envoy's health checks see it too (interval 0.25 s)
            return
        time.sleep(0.1)
    pytest.fail(f"ownership {ports} not healthy within {timeout}s")


@pytest.fixture(scope="module")
def shared_stack(stack):
    yield from running(Shared(stack))


@pytest.fixture
def shared(shared_stack):
    shared_stack.ensure()
    return shared_stack


def client(port: int, session: str | None = None) -> h.Client:
    c = h.Client(port=port)
    c.session = session
    return c


def replica_port(stream) -> int:
    return h.port_of(stream.header("x-replica"))


# ---------------------------------------------------------------------------------------------
# One truth, two guards.
# ---------------------------------------------------------------------------------------------

def test_stream_opened_through_envoy1_continues_through_envoy2(shared):
    c1 = client(E1)
    c1.initialize()
    s, evs = open_and_read(c1, 9)
    owner = s.header("x-replica")
    time.sleep(0.3)  # Envoy 1's records land (flush_ms 100)
    c2 = client(E2, c1.session)
    got = continued(c2, evs[6].id, owner, 5)
    # Contiguous: the replay starts right after the cursor, with the very events seen before.
    assert [(e.id, e.data) for e in got[:2]] == [(e.id, e.data) for e in evs[7:9]]
    by_id = {}
    for e in evs + got:
        assert by_id.setdefault(e.id, e.data) == e.data, "same id, different payload"
    assert len(got) == 5
    assert shared.envoys[1].stats()["mcp_resume_guard.continued"] >= 1


def test_envoy2_refuses_a_superseded_cursor(shared):
    c1 = client(E1)
    c1.initialize()
    _, old = open_and_read(c1, 3)
    _, _new = open_and_read(c1, 3)  # a new GET stream through Envoy 1 supersedes the old one
    time.sleep(0.3)
    for p in h.REPLICA_PORTS:
        h.replica_reset(p)
    r = client(E2, c1.session).get_stream(last_event_id=old[-1].id)
    assert r.status == 200
    assert r.header(GUARD_HEADER) == "restarted; reason=superseded"
    assert_control_event(r, "superseded")
    r.close()
    assert_no_cursor_reached_a_replica()


def test_envoy2_refuses_a_gapped_cursor(shared):
    c1 = client(E1)
    c1.initialize()
    s = c1.get_stream()
    first = s.read(1)[0]
    s.read(RING + 8)  # the owner's ring (RING events) no longer holds first + 1
    s.close()
    time.sleep(0.3)
    for p in h.REPLICA_PORTS:
        h.replica_reset(p)
    r = client(E2, c1.session).get_stream(last_event_id=first.id)
    assert r.status == 200
    assert r.header(GUARD_HEADER) == "restarted; reason=gap"
    assert_control_event(r, "gap")
    r.close()
    assert_no_cursor_reached_a_replica()


def test_owner_gone_restarts_its_streams_on_every_guard(shared):
    c1 = client(E1)
    c1.initialize()
    s, evs = open_and_read(c1, 4)
    owner_port = replica_port(s)
    time.sleep(0.3)
    # What an operator (or the preStop hook) runs, against ANY ownership instance.
    status, body = h.http_json("POST", O2, "/v1/owners/gone", {"owner": f"{h.HOST}:{owner_port}"})
    assert (status, body) == (200, {"applied": 1})
    for p in h.REPLICA_PORTS:
        h.replica_reset(p)
    for port in (E1, E2):
        r = client(port, c1.session).get_stream(last_event_id=evs[-1].id)
        assert r.status == 200
        assert r.header(GUARD_HEADER) == "restarted; reason=owner_unavailable", port
        assert_control_event(r, "owner_unavailable")
        r.close()
    assert_no_cursor_reached_a_replica()


def test_record_in_flight_is_decided_correctly(shared):
    """Envoy 1 flushes its records every 100 ms; a resume through Envoy 2 right after the
    events arrive overtakes them, waits on the shared store, and still continues. Every try
    must continue; at least one must have overtaken its records (the waits metric says so)."""
    def waits() -> float:
        return sum(h.ownership_metric(p, "mcp_ownership_resume_waits_total") for p in (O1, O2))

    overtaken = 0
    for _ in range(5):
        before = waits()
        c1 = client(E1)
        c1.initialize()
        time.sleep(0.25)  # only the session record has landed
        s, evs = open_and_read(c1, 4)
        owner = s.header("x-replica")
        r = client(E2, c1.session).get_stream(last_event_id=evs[-1].id)  # no pause: in flight
        assert r.status == 200
        assert r.header(GUARD_HEADER) is None, r.header(GUARD_HEADER)
        assert r.header("x-replica") == owner
        got = r.read(2)
        r.close()
        assert len(got) == 2 and not {e.id for e in got} & {e.id for e in evs}
        overtaken += waits() > before
        if overtaken >= 2:
            break
    assert overtaken >= 1, "no resume overtook its records"


# ---------------------------------------------------------------------------------------------
# Failures of the shared store and of an ownership instance.
# ---------------------------------------------------------------------------------------------

class Resumer:
    """Resumes with one cursor in a loop through both Envoys, recording every outcome as
    (start, seconds, status, Mcp-Resume header, replica, owner expected). With `follow`, a
    refused cursor is replaced by the first cursor of the new stream, as a client does."""

    def __init__(self, session: str, cursor: str, owner: str | None = None, follow: bool = False):
        self.session, self.cursor, self.owner, self.follow = session, cursor, owner, follow
        self.results: list[tuple[float, float, int, str | None, str | None, str | None]] = []
        self.stop_flag = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        i = 0
        while not self.stop_flag.is_set():
            port = (E1, E2)[i % 2]
            i += 1
            c = client(port, self.session)
            c.timeout = 5.0
            owner = self.owner
            t0 = time.monotonic()
            try:
                r = c.get_stream(last_event_id=self.cursor)
                status, header, replica = r.status, r.header(GUARD_HEADER), r.header("x-replica")
                took = time.monotonic() - t0
                if self.follow and header is not None and r.is_sse:
                    evs = r.read(2)  # the control event, then the new stream's first event
                    if len(evs) == 2 and evs[1].id:
                        self.cursor, self.owner = evs[1].id, replica
                r.close()
            except OSError as e:  # a hang would surface here as a timeout
                status, header, replica = 0, f"error: {e}", None
                took = time.monotonic() - t0
            self.results.append((t0, took, status, header, replica, owner))
            time.sleep(0.01)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop_flag.set()
        self.thread.join(timeout=10)


def prepare_cursors(n: int) -> list[tuple[str, str, str, str]]:
    """n sessions, each with a GET cursor and a request-stream cursor; records landed."""
    out = []
    for _ in range(n):
        c = client(E1)
        c.initialize()
        s, evs = open_and_read(c, 3)
        tool_cursor = c.finished_call_cursor(f"redis-{uuid.uuid4().hex[:8]}")
        out.append((c.session, evs[-1].id, tool_cursor, s.header("x-replica")))
    time.sleep(0.3)
    return out


def test_redis_stopped_under_load_fails_closed_fast(shared):
    sessions = prepare_cursors(3)
    loads = [Resumer(sess, cur) for sess, cur, _, _ in sessions]
    for ld in loads:
        ld.__enter__()
    try:
        time.sleep(0.5)  # resumes continue while Redis is up
        stopped_at = time.monotonic()
        shared.redis.stop()
        time.sleep(0.3)  # let continuations already forwarded finish before checking replicas
        for p in h.REPLICA_PORTS:
            h.replica_reset(p)
        checked_from = time.monotonic()
        time.sleep(2.0)
    finally:
        for ld in loads:
            ld.__exit__()
    before = [r for ld in loads for r in ld.results if r[0] + r[1] < stopped_at]
    assert before and all(r[2] == 200 and r[3] is None for r in before), \
        [r for r in before if r[2] != 200 or r[3] is not None][:5]
    after = [r for ld in loads for r in ld.results if r[0] >= checked_from]
    assert len(after) >= 20, len(after)
    bad = [r for r in after if r[2] != 200 or r[3] != "restarted; reason=ownership_unavailable"]
    assert not bad, bad[:5]
    worst = max(r[1] for r in after)
    assert worst < CALLOUT_TIMEOUT_MS / 1000 + 0.75, f"slowest fail-closed resume took {worst:.3f}s"
    # A request-stream cursor's call is settled (its policy), never a 5xx.
    sess, _, tool_cursor, _ = sessions[0]
    for port in (E1, E2):
        r = client(port, sess).get_stream(last_event_id=tool_cursor)
        body = r.resp.read()
        r.close()
        h.assert_settled(r, body, "ownership_unavailable")
    assert_no_cursor_reached_a_replica()
    # The ownership service itself answers a fast 503 with a reason, and /healthz says so.
    for port in (O1, O2):
        t0 = time.monotonic()
        status, body = h.http_json("POST", port, "/v1/resume",
                                   {"session": "0" * 32, "incarnation": "0" * 16, "kind": "get", "seq": 1})
        took = time.monotonic() - t0
        assert status == 503 and body["error"] == "store_unavailable" and "redis" in body["detail"], body
        assert took < 0.3, took
        status, body = h.http_json("GET", port, "/healthz")
        assert status == 503 and body["status"] == "unavailable", body
        assert h.ownership_metric(port, "mcp_ownership_store_errors_total") > 0
    lat = sorted(r[1] for r in after)
    print(f"fail-closed latency over {len(lat)} resumes: p50 {statistics.median(lat) * 1000:.1f} ms, "
          f"max {lat[-1] * 1000:.1f} ms")


def test_redis_hung_fails_closed_within_the_store_timeout(shared):
    """A Redis that accepts nothing and answers nothing (SIGSTOP, a black-holed network): the
    service's --store-timeout-ms (150 ms) decides, under the guard's 250 ms callout timeout."""
    (sess, cursor, tool_cursor, owner), = prepare_cursors(1)
    os.kill(shared.redis.proc.pid, signal.SIGSTOP)
    try:
        time.sleep(0.1)
        for p in h.REPLICA_PORTS:
            h.replica_reset(p)
        took = []
        for i in range(10):
            c = client((E1, E2)[i % 2], sess)
            t0 = time.monotonic()
            r = c.get_stream(last_event_id=cursor)
            took.append(time.monotonic() - t0)
            assert r.status == 200 and r.header(GUARD_HEADER) == "restarted; reason=ownership_unavailable", \
                r.header(GUARD_HEADER)
            r.close()
        r = client(E2, sess).get_stream(last_event_id=tool_cursor)
        body = r.resp.read()
        r.close()
        h.assert_settled(r, body, "ownership_unavailable")
        assert_no_cursor_reached_a_replica()
        assert max(took) < CALLOUT_TIMEOUT_MS / 1000 + 0.5, took
        assert statistics.median(took) > 0.1, "the store timeout, not a refused connection, decided"
    finally:
        os.kill(shared.redis.proc.pid, signal.SIGCONT)
    # Redis answers again: the same cursors are decided by the shared truth again. The GET
    # cursor was superseded by the new streams the restarts opened (their records land now).
    deadline = time.monotonic() + 5
    while True:
        r = client(E1, sess).get_stream(last_event_id=cursor)
        header = r.header(GUARD_HEADER)
        r.close()
        if header != "restarted; reason=ownership_unavailable":
            break
        assert time.monotonic() < deadline, "not recovered within 5 s of SIGCONT"
        time.sleep(0.2)
    assert header in (None, "restarted; reason=superseded"), header


def test_redis_restarted_recovers_without_restarting_anything(shared):
    old = prepare_cursors(1)[0]
    pids = {p: shared.own[p].proc.pid for p in (O1, O2)}
    envoy_pids = [e.proc.pid for e in shared.envoys]
    shared.redis.stop()
    for port in (O1, O2):
        assert h.http_json("GET", port, "/healthz")[0] == 503
    shared.redis = h.start_redis()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if all(h.http_json("GET", p, "/healthz")[0] == 200 for p in (O1, O2)):
            break
        time.sleep(0.1)
    else:
        pytest.fail("ownership did not see Redis come back within 5 s")
    assert {p: shared.own[p].proc.pid for p in (O1, O2)} == pids and all(shared.own[p].alive for p in (O1, O2))
    assert [e.proc.pid for e in shared.envoys] == envoy_pids and all(e.alive for e in shared.envoys)
    time.sleep(0.6)  # Envoy's health checks see them healthy again
    # Without persistence the old truth is gone: a cursor recorded before restarts, explicitly:
    # `records_lost` when this instance saw a write fail during the outage, else `session_inactive`.
    r = client(E2, old[0]).get_stream(last_event_id=old[1])
    assert r.header(GUARD_HEADER) in ("restarted; reason=records_lost", "restarted; reason=session_inactive"), \
        r.header(GUARD_HEADER)
    r.close()
    # A new session after the restart: opened through Envoy 2, continued through Envoy 1.
    c2 = client(E2)
    c2.initialize()
    s, evs = open_and_read(c2, 5)
    time.sleep(0.2)
    r = client(E1, c2.session).get_stream(last_event_id=evs[2].id)
    assert r.status == 200 and r.header(GUARD_HEADER) is None, r.header(GUARD_HEADER)
    assert r.header("x-replica") == s.header("x-replica")
    got = r.read(2)
    r.close()
    assert [(e.id, e.data) for e in got] == [(e.id, e.data) for e in evs[3:5]]


def test_one_ownership_instance_killed_mid_load(shared):
    sessions = prepare_cursors(3)
    loads = [Resumer(sess, cur, owner, follow=True) for sess, cur, _, owner in sessions]
    for ld in loads:
        ld.__enter__()
    try:
        time.sleep(0.5)
        killed_at = time.monotonic()
        shared.own[O1].kill()
        time.sleep(2.5)
    finally:
        for ld in loads:
            ld.__exit__()
    results = [r for ld in loads for r in ld.results]
    # Never a hang, never a 5xx; a cursor either continues at its owner or fails closed
    # (and the client goes on with the new stream's cursor).
    for t0, took, status, header, replica, owner in results:
        assert status == 200, (status, header)
        assert took < 1.0, took
        assert (header is None and replica == owner) or header == "restarted; reason=ownership_unavailable", \
            (header, replica, owner)
    before = [r for r in results if r[0] + r[1] < killed_at]
    assert before and all(r[3] is None for r in before)
    # Once Envoy has taken the dead instance out (health check 0.25 s, outlier ejection on the
    # first refused connection), the other instance serves every resume.
    settled = [r for r in results if r[0] > killed_at + 1.0]
    assert len(settled) >= 20, len(settled)
    assert all(r[3] is None for r in settled), [r for r in settled if r[3] is not None][:5]
    transition = [r for r in results if r[0] >= killed_at and r[3] is not None]
    print(f"ownership instance killed: {len(transition)} resumes failed closed during the transition, "
          f"{len(settled)} continued after it")


# ---------------------------------------------------------------------------------------------
# The service's own start-up behaviour with Redis.
# ---------------------------------------------------------------------------------------------

def test_bad_redis_url_is_a_clear_error():
    for url, words in [("redis://", "no host"), ("redis://127.0.0.1:notaport", "bad port"),
                       ("rediss:/x", "expected `memory`, `redis://HOST:PORT`")]:
        p = subprocess.run([h.BIN / "mcp-ownership", "--store", url], capture_output=True, text=True, timeout=10)
        assert p.returncode == 2, (url, p.stderr)
        assert "--store" in p.stderr and words in p.stderr, p.stderr


def test_redis_down_at_start_then_up():
    port = h.REDIS_PORT + 1
    own_port = h.OWNERSHIP_PORT + 3
    log_path = h.RUNS / f"ownership-{own_port}.log"
    offset = log_path.stat().st_size if log_path.exists() else 0
    own = h.start_ownership(own_port, ["--store", f"redis://{h.HOST}:{port}"])
    redis = None
    try:
        # It started (the port is open), said so, and answers 503 until Redis answers.
        log = log_path.read_bytes()[offset:].decode()
        assert f"redis at {h.HOST}:{port}" in log and "starting anyway" in log, log
        status, body = h.http_json("GET", own_port, "/healthz")
        assert status == 503 and body["store"] == "redis" and body["status"] == "unavailable", body
        status, body = h.http_json("POST", own_port, "/v1/resume",
                                   {"session": "0" * 32, "incarnation": "0" * 16, "kind": "get", "seq": 1})
        assert status == 503 and body["error"] == "store_unavailable", body
        redis = h.start_redis(port)
        deadline = time.monotonic() + 5
        while h.http_json("GET", own_port, "/healthz")[0] != 200:
            assert time.monotonic() < deadline, "no 200 within 5 s of Redis answering"
            time.sleep(0.1)
        status, body = h.http_json("POST", own_port, "/v1/resume",
                                   {"session": "0" * 32, "incarnation": "0" * 16, "kind": "get", "seq": 1})
        assert (status, body) == (200, {"verdict": "new_stream", "reason": "session_inactive"}), body
        assert own.alive
        time.sleep(1.2)  # the health watch logs the change once
        assert "answering again" in log_path.read_bytes()[offset:].decode()
    finally:
        own.stop()
        if redis is not None:
            redis.stop()
