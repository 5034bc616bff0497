"""The production setup, end to end: Envoy with the guard sending `ownership.token`, the ownership
service requiring bearer tokens (`--token-file`, `--admin-token-file`) and talking to a Redis that
has ACL users (the default user off) and TLS only (`rediss://`, certificates made here with the
openssl CLI), the session-wide naive replicas behind it. A stream continues through all of it; a
Redis that is stopped or hung makes every resume fail closed fast; Redis back, resumes continue
without a restart; a guard with the wrong token never continues and the service counts its 401s.

Ports (shifted by E2E_PORT_OFFSET): Envoy ENVOY_PORT+5 (admin ADMIN_PORT+5) and, with the wrong
token, ENVOY_PORT+6 (admin ADMIN_PORT+6); ownership OWNERSHIP_PORT+5; Redis (TLS) REDIS_PORT+5.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import urllib.request
import uuid

import pytest

import harness as h
from stack.topology import running
from conftest import RING
from test_seed_scenarios import (GUARD_HEADER, assert_control_event, assert_no_cursor_reached_a_replica, continued,
                                 open_and_read)

ENVOY, ADMIN = h.ENVOY_PORT + 5, h.ADMIN_PORT + 5
BAD_ENVOY, BAD_ADMIN = h.ENVOY_PORT + 6, h.ADMIN_PORT + 6
OWN = h.OWNERSHIP_PORT + 5
REDIS = h.REDIS_PORT + 5
USER = "mrg-service"
PASSWORD = "pw-" + uuid.uuid4().hex
GUARD_TOKEN = "guard-" + uuid.uuid4().hex
ADMIN_TOKEN = "admin-" + uuid.uuid4().hex
WRONG_TOKEN = "guard-" + uuid.uuid4().hex
# The guard gives up on a callout after this; the service on one Redis operation well before
# (a debug build's TLS handshake needs some of it).
CALLOUT_TIMEOUT_MS = 500
STORE_TIMEOUT_MS = 250
FAIL_CLOSED_WITHIN_S = 2.0


def openssl(cwd, *args: str) -> None:
    r = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, (args, r.stderr)


def certificates(d) -> None:
    """A CA, and a server certificate for 127.0.0.1 signed by it."""
    openssl(d, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=test ca",
            "-keyout", "ca.key", "-out", "ca.crt")
    openssl(d, "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
            "-keyout", "server.key", "-out", "server.csr")
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    openssl(d, "x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-days", "2", "-extfile", "san.ext", "-out", "server.crt")


def guard_config(listener: int, admin: int, token: str) -> dict:
    return h.envoy_config(guard=True, listener_port=listener, admin_port=admin, ownership_ports=[OWN],
                          plugin_overrides={"retention": RING,
                                            "ownership": {"cluster": "mcp_ownership", "token": token,
                                                          "timeout_ms": CALLOUT_TIMEOUT_MS, "flush_ms": 10}})


class Secure:
    def __init__(self, stack, d):
        self.stack = stack
        self.dir = d
        self.redis: h.Proc | None = None
        self.own: h.Proc | None = None
        self.envoy: h.Envoy | None = None
        self.bad_envoy: h.Envoy | None = None

    def start_redis(self) -> None:
        d = self.dir
        self.redis = h.Proc(f"redis-tls-{REDIS}", [
            "redis-server", "--port", "0", "--tls-port", REDIS, "--bind", h.HOST,
            "--tls-cert-file", d / "server.crt", "--tls-key-file", d / "server.key",
            "--tls-ca-cert-file", d / "ca.crt", "--tls-auth-clients", "no",
            "--save", "", "--appendonly", "no", "--daemonize", "no", "--loglevel", "warning",
            # Only the service's ACL user gets in.
            "--user", "default", "off", "--user", USER, "on", f">{PASSWORD}", "~*", "&*", "+@all",
        ], port=REDIS).start()

    def start_ownership(self) -> None:
        d = self.dir
        self.own = h.start_ownership(OWN, [
            "--store", f"rediss://{h.HOST}:{REDIS}", "--redis-username", USER,
            "--redis-password-file", d / "redis-password", "--redis-ca-file", d / "ca.crt",
            "--token-file", d / "guard-tokens", "--admin-token-file", d / "admin-tokens",
            "--store-timeout-ms", STORE_TIMEOUT_MS])

    def ensure(self) -> None:
        self.stack.ensure_replicas()
        if self.redis is None or not self.redis.alive:
            self.start_redis()
        if self.own is None or not self.own.alive:
            self.start_ownership()
        if self.envoy is None or not self.envoy.alive:
            self.envoy = h.Envoy("envoy-secure", guard_config(ENVOY, ADMIN, GUARD_TOKEN), ADMIN, ENVOY).start()
        wait_healthy()

    def redis_cli(self, *args: str, auth: bool = True) -> subprocess.CompletedProcess:
        creds = ["--user", USER, "--pass", PASSWORD] if auth else []
        return subprocess.run(["redis-cli", "-h", h.HOST, "-p", str(REDIS), "--tls", "--cacert",
                               str(self.dir / "ca.crt"), *creds, "--no-auth-warning", *args],
                              capture_output=True, text=True, timeout=10)

    def stop(self) -> None:
        for p in (self.bad_envoy, self.envoy, self.own, self.redis):
            if p is not None:
                if p.alive and p.proc is not None:
                    os.kill(p.proc.pid, signal.SIGCONT)  # a test that failed while Redis was hung
                p.stop()


def wait_healthy(timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if h.http_json("GET", OWN, "/healthz", timeout=1)[0] == 200:
            return
        time.sleep(0.1)
    pytest.fail(f"ownership on {OWN} not healthy within {timeout}s: see {h.RUNS}/ownership-{OWN}.log")


@pytest.fixture(scope="module")
def secure_stack(stack, tmp_path_factory):
    if shutil.which("redis-server") is None or shutil.which("openssl") is None:
        pytest.fail("needs redis-server (`make redis`) and the openssl CLI (Debian: openssl)")
    d = tmp_path_factory.mktemp("redis-tls")
    certificates(d)
    (d / "redis-password").write_text(PASSWORD + "\n")
    (d / "guard-tokens").write_text(f"# the guards\n{GUARD_TOKEN}\n")
    (d / "admin-tokens").write_text(ADMIN_TOKEN + "\n")
    yield from running(Secure(stack, d))


@pytest.fixture
def secure(secure_stack):
    secure_stack.ensure()
    return secure_stack


def client(port: int = ENVOY, session: str | None = None) -> h.Client:
    c = h.Client(port=port)
    c.session = session
    return c


def metric(name: str, **labels: str) -> float:
    """Sum of one metric's samples whose labels include `labels`, read with the guard's token."""
    req = urllib.request.Request(f"http://{h.HOST}:{OWN}/metrics",
                                 headers={"authorization": f"Bearer {GUARD_TOKEN}"})
    with urllib.request.urlopen(req, timeout=3) as r:
        text = r.read().decode()
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name) or line[len(name):len(name) + 1] not in ("{", " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def recorded_session() -> tuple[h.Client, list[h.Event], str, str]:
    """A session through the guard: a GET stream read for 6 events, a tool call's cursor; records landed."""
    c = client()
    c.initialize()
    s, evs = open_and_read(c, 6)
    tool_cursor = c.finished_call_cursor(f"tls-{uuid.uuid4().hex[:8]}")
    time.sleep(0.3)
    return c, evs, tool_cursor, s.header("x-replica")


def assert_continues(c: h.Client, evs: list[h.Event], owner: str) -> None:
    got = continued(c, evs[3].id, owner, 2)
    assert [(e.id, e.data) for e in got] == [(e.id, e.data) for e in evs[4:6]], "contiguous, same ids"


def assert_fails_closed(port: int, session: str, cursor: str, tool_cursor: str | None, n: int = 6) -> list[float]:
    """Every resume: a new stream with `ownership_unavailable` and the control event, fast; a
    request-stream cursor's call is settled. Replica logs are reset first; no cursor reaches one."""
    for p in h.REPLICA_PORTS:
        h.replica_reset(p)
    took = []
    for _ in range(n):
        c = client(port, session)
        c.timeout = 5.0
        t0 = time.monotonic()
        r = c.get_stream(last_event_id=cursor)
        took.append(time.monotonic() - t0)
        assert r.status == 200 and r.header(GUARD_HEADER) == "restarted; reason=ownership_unavailable", \
            (r.status, r.header(GUARD_HEADER))
        assert_control_event(r, "ownership_unavailable")
        r.close()
    if tool_cursor is not None:
        r = client(port, session).get_stream(last_event_id=tool_cursor)
        body = r.resp.read()
        r.close()
        h.assert_settled(r, body, "ownership_unavailable")
    assert_no_cursor_reached_a_replica()
    assert max(took) < FAIL_CLOSED_WITHIN_S, took
    return took


def wait_records_flowing(envoy: h.Envoy, sent_before: int, timeout: float = 12.0) -> float:
    """Records that failed while Redis was away are retried with a backoff of up to 5 s: wait
    until a batch has landed again. Returns how long that took."""
    t0 = time.monotonic()
    while envoy.stats().get("mcp_resume_guard.records_sent", 0) <= sent_before:
        assert time.monotonic() - t0 < timeout, "the guard's records did not land again"
        time.sleep(0.1)
    return time.monotonic() - t0


def pids(secure: Secure) -> list[int]:
    return [secure.own.proc.pid, secure.envoy.proc.pid]


# ---------------------------------------------------------------------------------------------

def test_a_stream_continues_through_tokens_acl_and_tls(secure):
    c, evs, _, owner = recorded_session()
    assert_continues(c, evs, owner)
    # The truth is in this Redis, reachable only as the ACL user over TLS.
    r = secure.redis_cli("DBSIZE")
    assert r.returncode == 0 and int(r.stdout.strip()) > 0, (r.stdout, r.stderr)
    r = secure.redis_cli("DBSIZE", auth=False)
    assert "NOAUTH" in r.stdout + r.stderr, (r.stdout, r.stderr)
    plain = subprocess.run(["redis-cli", "-h", h.HOST, "-p", str(REDIS), "--user", USER, "--pass", PASSWORD,
                            "--no-auth-warning", "PING"], capture_output=True, text=True, timeout=10)
    assert "PONG" not in plain.stdout, "the port speaks TLS only"
    # The guard's records and resumes were authenticated; nothing was refused.
    assert metric("mcp_ownership_http_requests_total", endpoint="resume", code="200") >= 1
    assert metric("mcp_ownership_http_requests_total", endpoint="records", code="200") >= 1
    assert metric("mcp_ownership_http_requests_total", code="401") == 0
    # /v1/owners/gone takes the admin token only; the guard's token cannot mark owners gone.
    req = urllib.request.Request(f"http://{h.HOST}:{OWN}/v1/owners/gone", method="POST",
                                 data=b'{"owner":"127.0.0.1:1"}',
                                 headers={"content-type": "application/json",
                                          "authorization": f"Bearer {GUARD_TOKEN}"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=3)
    assert e.value.code == 401
    req.add_header("authorization", f"Bearer {ADMIN_TOKEN}")
    with urllib.request.urlopen(req, timeout=3) as resp:
        assert resp.status == 200


def test_redis_hung_fails_closed_then_continues(secure):
    c, evs, tool_cursor, owner = recorded_session()
    before = pids(secure)
    os.kill(secure.redis.proc.pid, signal.SIGSTOP)
    try:
        time.sleep(0.1)
        took = assert_fails_closed(ENVOY, c.session, evs[3].id, tool_cursor)
        # The service's store timeout decided, not a refused connection.
        assert min(took) > STORE_TIMEOUT_MS / 1000 * 0.8, took
        status, body = h.http_json("GET", OWN, "/healthz")
        assert status == 503 and body["status"] == "unavailable", body
        # Nothing lands while Redis is away: what lands after this, landed after it came back.
        sent = secure.envoy.stats().get("mcp_resume_guard.records_sent", 0)
    finally:
        os.kill(secure.redis.proc.pid, signal.SIGCONT)
    wait_healthy(5)
    assert secure.envoy.stats()["mcp_resume_guard.records_failed"] > 0
    caught_up = wait_records_flowing(secure.envoy, sent)
    assert pids(secure) == before and secure.own.alive and secure.envoy.alive
    # Redis answers again: a session recorded now continues. (The old GET cursor was superseded
    # by the new stream the first restart opened.)
    c2, evs2, _, owner2 = recorded_session()
    assert_continues(c2, evs2, owner2)
    print(f"Redis hung: {len(took)} resumes failed closed in {min(took) * 1000:.0f}-{max(took) * 1000:.0f} ms; "
          f"records landed again {caught_up:.1f} s after Redis answered")


def test_redis_stopped_fails_closed_then_continues(secure):
    c, evs, tool_cursor, owner = recorded_session()
    before = pids(secure)
    secure.redis.stop()
    took = assert_fails_closed(ENVOY, c.session, evs[3].id, tool_cursor)
    assert metric("mcp_ownership_store_errors_total") > 0
    assert secure.envoy.stats()["mcp_resume_guard.records_failed"] > 0
    sent = secure.envoy.stats().get("mcp_resume_guard.records_sent", 0)
    secure.start_redis()
    wait_healthy(5)
    caught_up = wait_records_flowing(secure.envoy, sent)
    assert pids(secure) == before and secure.own.alive and secure.envoy.alive
    # No persistence: the old truth is gone, and said so (the session is unknown, or known again
    # only from the records of the new stream a restart opened, or its records were refused while
    # Redis was down: `records_lost`); a new session continues.
    r = client(ENVOY, c.session).get_stream(last_event_id=evs[3].id)
    assert r.header(GUARD_HEADER) in ("restarted; reason=session_inactive", "restarted; reason=unknown_stream",
                                      "restarted; reason=records_lost"), \
        r.header(GUARD_HEADER)
    r.close()
    c2, evs2, _, owner2 = recorded_session()
    assert_continues(c2, evs2, owner2)
    print(f"Redis stopped: {len(took)} resumes failed closed in {min(took) * 1000:.0f}-{max(took) * 1000:.0f} ms; "
          f"records landed again {caught_up:.1f} s after Redis answered")


def test_a_wrong_guard_token_fails_every_resume_closed(secure):
    # A session recorded through the right guard; its cursors, presented through a guard
    # whose token the service does not know (same cursor key, so the cursors are authentic).
    c, evs, tool_cursor, _ = recorded_session()
    secure.bad_envoy = h.Envoy("envoy-secure-badtoken", guard_config(BAD_ENVOY, BAD_ADMIN, WRONG_TOKEN),
                               BAD_ADMIN, BAD_ENVOY).start()
    try:
        resumes_401 = metric("mcp_ownership_http_requests_total", endpoint="resume", code="401")
        records_401 = metric("mcp_ownership_http_requests_total", endpoint="records", code="401")
        # Its own session: the records it posts are refused.
        b = client(BAD_ENVOY)
        b.initialize()
        _, bad_evs = open_and_read(b, 3)
        time.sleep(0.3)
        assert_fails_closed(BAD_ENVOY, c.session, evs[3].id, tool_cursor)
        assert_fails_closed(BAD_ENVOY, b.session, bad_evs[1].id, None, n=3)
        assert metric("mcp_ownership_http_requests_total", endpoint="resume", code="401") - resumes_401 >= 9
        assert metric("mcp_ownership_http_requests_total", endpoint="records", code="401") > records_401
        assert secure.bad_envoy.stats().get("mcp_resume_guard.callout_failures.status", 0) >= 9
        assert secure.bad_envoy.stats().get("mcp_resume_guard.continued", 0) == 0
    finally:
        secure.bad_envoy.stop()
