"""make chaos: a bounded soak of the whole system while parts of it fail.

Topology (all on 127.0.0.1, started and stopped by pid): 2 Envoys (--concurrency 2) loading the guard,
2 ownership instances on one shared store (a local Redis Cluster of 3 masters + 3 replicas, or one Redis),
3 naive replicas sharing sessions. Clients: scenario clients (GET streams that drop and resume, side-effecting
tool calls that drop and resume, stale and forged cursors) and real TypeScript SDK clients. Faults come on a
schedule drawn from --seed. The invariants are checked from the clients' side throughout; the summary table
goes to stdout and to --report.

    python tests/chaos/chaos.py --seconds 600 --clients 50 --seed 1 --store redis-cluster --report CHAOS.md
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import stack.client as h
from stack.envoy import access_log
from stack.procs import ADMIN_PORT, BIN, ENVOY_PORT, HOST, OWNERSHIP_PORT, REDIS_PORT, ROOT, RUNS, rss_kib
from stack.resume import control_reason, cursor_fields, header_reason
from stack.services import ledger
from stack.topology import Stack

# Events each replica keeps (the guard is told the same). The naive replica's ring is shared by all
# its streams, about 150 events/s here (some 20 GET streams ticking every 50 ms on 3 replicas): 4096
# wrap in under 30 s, within a call's resume retries, and lost events of a call whose client was
# away. Those events never passed the guard, which says so (README, Limits): no check can see them
# without the replica's assertion. 65536 lasts the soak's resume horizon many times over (~26 MB per
# replica).
RING = 1 << 16
ENVOY_PORTS = [ENVOY_PORT, ENVOY_PORT + 10]
ADMIN_PORTS = [ADMIN_PORT, ADMIN_PORT + 10]
OWNERSHIP_PORTS = [OWNERSHIP_PORT, OWNERSHIP_PORT + 1]
CLUSTER_BASE = REDIS_PORT + 10
NODE = os.environ.get("NODE", "node")


# ---- the record every client writes into ---------------------------------------------------------

@dataclass
class Tally:
    lock: threading.Lock = field(default_factory=threading.Lock)
    counts: collections.Counter = field(default_factory=collections.Counter)
    signals: collections.Counter = field(default_factory=collections.Counter)
    faults: collections.Counter = field(default_factory=collections.Counter)
    # (monotonic time, kind) of every fault, for the report's timeline.
    fault_log: list = field(default_factory=list)
    violations: list = field(default_factory=list)
    resume_ms: list = field(default_factory=list)
    # Seconds from each Redis fault's restart (of the node, or of the whole cluster) until it was ok again.
    settle_s: list = field(default_factory=list)
    accepted_entries: set = field(default_factory=set)
    completed_entries: set = field(default_factory=set)

    def inc(self, key: str, n: int = 1) -> None:
        with self.lock:
            self.counts[key] += n

    def signal(self, reason: str) -> None:
        with self.lock:
            self.signals[reason] += 1

    def violation(self, kind: str, detail: str) -> None:
        with self.lock:
            self.violations.append((time.time(), kind, detail[:400]))
        print(f"VIOLATION {kind}: {detail[:400]}", flush=True)


# ---- scenario clients ------------------------------------------------------------------------------

class Stopped(Exception):
    pass


class Scenario:
    """Base: one simulated MCP client with its own session, talking to either Envoy."""

    def __init__(self, tally: Tally, rng: random.Random, deadline: float, stop: threading.Event):
        self.t = tally
        self.rng = rng
        self.deadline = deadline
        self.stop = stop
        self.client: h.Client | None = None
        self.seen: dict[str, str] = {}  # cursor -> payload, for the whole session

    def alive(self) -> bool:
        return not self.stop.is_set() and time.monotonic() < self.deadline

    def pause(self, lo: float, hi: float) -> None:
        if self.stop.wait(self.rng.uniform(lo, hi)):
            raise Stopped

    def envoy(self) -> int:
        return self.rng.choice(ENVOY_PORTS)

    def connect(self) -> h.Client:
        """A session through some Envoy; retried while faults make that impossible."""
        while self.alive():
            c = h.Client(port=self.envoy(), timeout=5.0)
            try:
                c.initialize()
                self.client = c
                self.seen = {}
                return c
            except (OSError, AssertionError, ValueError):
                self.t.inc("connect_retries")
                self.pause(0.2, 0.6)
        raise Stopped

    def note_ids(self, events: list[h.Event]) -> None:
        for ev in events:
            if ev.id is None:
                continue
            prev = self.seen.get(ev.id)
            if prev is not None and prev != ev.data:
                self.t.violation("duplicate_id_other_payload", f"id {ev.id[:24]}…: {prev[:80]} vs {ev.data[:80]}")
            self.seen[ev.id] = ev.data

    def resume(self, cursor: str, port: int | None = None) -> tuple[h.SSEStream | None, str | None]:
        """GET with Last-Event-ID through some Envoy. Returns (stream, explicit reason or None)."""
        assert self.client is not None
        self.client.port = port or self.envoy()
        t0 = time.monotonic()
        try:
            s = self.client.get_stream(last_event_id=cursor)
        except OSError:
            self.t.inc("resume_transport_errors")
            return None, None
        self.t.inc("resumes")
        with self.t.lock:
            self.t.resume_ms.append((time.monotonic() - t0) * 1000)
        self.check_status(s)
        reason = header_reason(s.header("mcp-resume"))
        if s.status == 409 or (reason and s.status < 500):
            self.t.signal(reason or "409")
            return s, reason or "409"
        return s, None

    def open(self, request, sse: bool = False) -> h.SSEStream | None:
        """`request()` through some Envoy: its open 200 (SSE if `sse`), or None after a transport
        error or another answer (closed; on 404 the session is made anew, else a short pause)."""
        assert self.client is not None
        self.client.port = self.envoy()
        try:
            s = request()
        except OSError:
            self.pause(0.2, 0.5)
            return None
        self.check_status(s)
        if s.status == 200 and (s.is_sse or not sse):
            return s
        s.close()
        if s.status == 404:
            self.connect()
        else:
            self.pause(0.2, 0.5)
        return None

    def check_status(self, s: h.SSEStream) -> None:
        # The guard's own answers are 409s; a 5xx it made would be a `rejected` one. Envoy's 503 for a
        # replica that is down may carry the guard's `restarted` header (the cursor was stripped).
        if s.status >= 500 and (s.header("mcp-resume") or "").startswith("rejected"):
            self.t.violation("guard_5xx", f"status {s.status} with mcp-resume {s.header('mcp-resume')}")


class Streamer(Scenario):
    """Standalone GET streams: read a few events, drop, resume with the last cursor. Now and then two
    resumes of the same cursor run at once (a fork): each must end contiguous or explicitly signalled."""

    def run(self) -> None:
        self.connect()
        cursor: str | None = None
        last_payload: dict | None = None
        while self.alive():
            assert self.client is not None
            if cursor is None:
                s = self.open(self.client.get_stream)
                if s is None:
                    continue
                events, cut = self.read_some(s, self.rng.randint(2, 8))
                s.close()
                if cut is not None:
                    self.t.signal(cut)
            else:
                forks = 2 if self.rng.random() < 0.1 else 1
                if forks == 2:
                    self.t.inc("forks")
                # A fork's two resumes go one through each Envoy, in either order: the store arbitrates
                # the branches of a stream whatever gateway each crossed (docs/forks.md).
                ports = self.rng.sample(ENVOY_PORTS, 2) if forks == 2 else [self.envoy()]
                opened = [self.resume(cursor, port) for port in ports]
                results = [self.take_resume(s, reason, cursor, last_payload, forks == 2)
                           for s, reason in opened]
                if forks == 2 and any(results) and any(r == [] for r in results):
                    # One branch continued, the other ended empty: the loser must be told (`forked`),
                    # never just ended. (Both empty: the replica ended the stream, as it may.)
                    with self.t.lock:
                        recent = [(round(time.monotonic() - t, 1), k) for t, k in self.t.fault_log[-3:]]
                    branches = [{"gateway": port, "status": s.status if s else None,
                                 "events": None if r is None else len(r), "reset": s.reset if s else None}
                                for port, (s, _), r in zip(ports, opened, results)]
                    self.t.violation("silent_empty_fork", f"cursor {cursor[:24]}… one branch continued, "
                                     f"the other ended with no event and no signal: {branches}; "
                                     f"faults (s ago, kind): {recent}")
                if any(reason in ("session_inactive", "records_lost") for _, reason in opened):
                    # The store no longer knows the session (a Redis Cluster restarted without
                    # persistence loses it for good): start over as an application would, so later
                    # resumes exercise live sessions again.
                    self.t.inc("sessions_started_over")
                    self.connect()
                    cursor, last_payload = None, None
                    continue
                events = next((e for e in reversed(results) if e), None)
                if events is None:
                    cursor, last_payload = None, None
                    if any(r is None for r in results):
                        self.pause(0.1, 0.3)
                    continue
            if events:
                cursor = events[-1].id
                last_payload = payload(events[-1])
            self.pause(0.05, 0.6)

    def take_resume(self, s: h.SSEStream | None, reason: str | None, cursor: str,
                    last: dict | None, fork: bool = False) -> list[h.Event] | None:
        """Reads one resume's answer and checks it; returns its events when it continued."""
        if s is None:
            return None
        if reason is not None:
            s.close()
            return None
        if s.status == 404:
            # The owner says the session is gone: explicit, and the client re-initializes.
            self.t.signal("session_404")
            s.close()
            self.connect()
            return None
        if s.status != 200:
            s.close()
            return None
        events, cut = self.read_some(s, self.rng.randint(2, 8))
        s.close()
        if cut is not None:
            self.t.signal(cut)
            return None
        if not events and s.reset:
            # The connection broke (a fault): the client sees an error, not a quiet end.
            self.t.inc("resume_resets")
            return None
        if not events and fork:
            # Judged with the other branch (the caller): [] is "ended empty", None "refused or broken".
            self.t.inc("continuations_ended_empty")
            return []
        if not events:
            # The owner ended a continuation before it had anything new (a server may close a stream
            # at any time; a replica shutting down does): contiguous, and the client resumes again.
            self.t.inc("continuations_ended_empty")
            return None
        self.t.inc("continuations")
        self.check_continuation(cursor, last, events)
        return events

    def read_some(self, s: h.SSEStream, n: int) -> tuple[list[h.Event], str | None]:
        """Up to n message events; a control event (explicit signal) ends the read."""
        out: list[h.Event] = []
        try:
            while len(out) < n:
                ev = s.next_event()
                if ev is None:
                    break
                reason = control_reason(ev)
                if reason is not None:
                    return out, reason
                out.append(ev)
        except (OSError, ValueError):
            pass
        self.note_ids(out)
        self.check_within(out)
        return out, None

    def check_within(self, events: list[h.Event]) -> None:
        """Within one response: seqs consecutive in one incarnation; the producer's counter consecutive."""
        prev = None
        for ev in events:
            f = cursor_fields(ev.id or "")
            if f is None:
                self.t.violation("not_a_guard_cursor", f"event id {ev.id!r}")
                continue
            if prev is not None and f != (prev[0], prev[1] + 1):
                self.t.violation("seq_gap", f"{prev} then {f}")
            prev = f

    def check_continuation(self, cursor: str, last: dict | None, events: list[h.Event]) -> None:
        c = cursor_fields(cursor)
        f = cursor_fields(events[0].id or "")
        if c is None or f is None or f != (c[0], c[1] + 1):
            self.t.violation("phantom_or_gap", f"cursor {c} then first event {f}")
            return
        p = payload(events[0])
        if last and p and p.get("stream") == last.get("stream") and p.get("replica") == last.get("replica") \
                and p.get("n") != last.get("n", 0) + 1:
            self.t.violation("silent_gap", f"after {last} came {p}")


def payload(ev: h.Event) -> dict | None:
    try:
        m = ev.json()
    except ValueError:
        return None
    return (m.get("params") or {}).get("data") if isinstance(m, dict) else None


class Caller(Scenario):
    """Side-effecting tool calls that drop mid-stream and resume; every accepted call exactly once."""

    def run(self) -> None:
        self.connect()
        while self.alive():
            entry = f"chaos-{uuid.uuid4().hex[:12]}"
            assert self.client is not None
            s = self.open(lambda: self.client.call_tool(
                "ledger_append", {"entry": entry, "steps": 5, "step_ms": 60}), sse=True)
            if s is None:
                continue
            with self.t.lock:
                self.t.accepted_entries.add(entry)
            self.t.inc("calls")
            progress: list[int] = []
            cursor, done = self.follow(s, progress, self.rng.randint(1, 4))
            tries = 0
            while not done and cursor is not None and self.alive() and tries < 4:
                tries += 1
                # The naive replica replays its ring and then serves a live standalone stream: resume once
                # the call has run to its end (disconnection is not cancellation), so the replay holds it all.
                self.pause(0.6, 1.0)
                r, reason = self.resume(cursor)
                if r is None:
                    continue
                if reason is not None or r.status != 200:
                    r.close()
                    if r.status == 404:
                        self.t.signal("session_404")
                    if reason in ("session_inactive", "records_lost"):
                        # The store no longer knows the session: start over (see Streamer).
                        self.t.inc("sessions_started_over")
                        self.connect()
                    break  # explicit: the result will not come; never re-issue a side effect
                self.t.inc("continuations")
                before = len(progress)
                cursor2, done = self.follow(r, progress, 99, resumed_from=cursor)
                if len(progress) == before and not done and cursor2 == cursor:
                    break
                cursor = cursor2
            if done:
                with self.t.lock:
                    self.t.completed_entries.add(entry)
            self.pause(0.1, 0.8)

    def follow(self, s: h.SSEStream, progress: list[int], drop_after: int,
               resumed_from: str | None = None) -> tuple[str | None, bool]:
        cursor = resumed_from
        got = 0
        first = True
        try:
            while True:
                ev = s.next_event()
                if ev is None:
                    break
                reason = control_reason(ev)
                if reason is not None:
                    self.t.signal(reason)
                    s.close()
                    return None, False
                self.note_ids([ev])
                if resumed_from is not None and first:
                    c, f = cursor_fields(resumed_from), cursor_fields(ev.id or "")
                    if c is None or f is None or f != (c[0], c[1] + 1):
                        self.t.violation("phantom_or_gap", f"tool call cursor {c} then {f}")
                first = False
                cursor = ev.id or cursor
                m = ev.json()
                if m.get("method") == "notifications/progress":
                    k = m["params"]["progress"]
                    if progress and k != progress[-1] + 1:
                        self.t.violation("progress_gap_or_dup", f"{progress} then {k}")
                    progress.append(k)
                    got += 1
                    if got >= drop_after and resumed_from is None:
                        s.close()
                        return cursor, False
                elif resumed_from is not None and "method" in m:
                    # Another stream's live events after the replay (the naive replica's way): stop here.
                    self.t.inc("call_resume_other_stream")
                    s.close()
                    return cursor, False
                elif "result" in m or "error" in m:
                    s.close()
                    if progress != list(range(1, len(progress) + 1)) or len(progress) != 5:
                        self.t.violation("incomplete_result", f"result after progress {progress}")
                    return cursor, True
        except (OSError, ValueError):
            pass
        s.close()
        return cursor, False


class Forger(Scenario):
    """Stale, foreign and forged cursors: every one must be refused explicitly, never continued."""

    def run(self) -> None:
        a = self.connect()
        other = h.Client(port=self.envoy(), timeout=5.0)
        while self.alive():
            try:
                if other.session is None:
                    other.initialize()
                s = a.get_stream()
                evs = [e for e in s.read(2) if e.id]
                s.close()
            except (OSError, AssertionError, ValueError):
                self.pause(0.3, 0.8)
                continue
            if not evs:
                self.pause(0.3, 0.8)
                continue
            good = evs[-1].id
            flipped = good[:-3] + ("A" if good[-3] != "A" else "B") + good[-2:]
            for label, client, cursor in (("foreign_session", other, good), ("forged", a, flipped),
                                          ("legacy", a, "e7")):
                client.port = self.envoy()
                try:
                    r = client.get_stream(last_event_id=cursor)
                except OSError:
                    continue
                self.t.inc("forged_tries")
                reason = header_reason(r.header("mcp-resume"))
                ev = None
                if r.status == 200 and reason is None:
                    try:
                        ev = r.next_event()
                    except OSError:
                        ev = None
                r.close()
                if reason is None and r.status != 409 and r.status < 500:
                    self.t.violation("forged_cursor_not_refused", f"{label}: status {r.status}, first {ev}")
                elif reason:
                    self.t.signal(reason)
            self.pause(0.3, 1.0)


def run_scenario(cls, tally: Tally, seed: int, deadline: float, stop: threading.Event) -> None:
    sc = cls(tally, random.Random(seed), deadline, stop)
    try:
        sc.run()
    except Stopped:
        pass
    except Exception as e:  # a client bug must not hide the others' results
        tally.inc("client_crashes")
        print(f"client {cls.__name__} crashed: {e!r}", flush=True)


# ---- the system under test -------------------------------------------------------------------------

def access_logged(cfg: dict, i: int) -> None:
    """Gateway i logs every answer's code, its details and the guard's header (check_access_logs)."""
    access_log(cfg, RUNS / f"chaos-envoy{i}-access.log",
               "%RESPONSE_CODE% %RESPONSE_CODE_DETAILS% %RESP(MCP-RESUME)%\n")


def mark_gone(port: int, ownership_ports: list[int], rng: random.Random, retry_s: float,
              admin_token: str | None = None) -> bool:
    """POST /v1/owners/gone for the replica on `port` (what the preStop hook does) to any of the ownership
    instances, retried for retry_s; also the rolling deploy of tests/chaos/soak_sdk.py."""
    import urllib.request
    headers = {"content-type": "application/json"}
    if admin_token:
        headers["authorization"] = f"Bearer {admin_token}"
    deadline = time.monotonic() + retry_s
    while True:
        req = urllib.request.Request(f"http://{HOST}:{rng.choice(ownership_ports)}/v1/owners/gone",
                                     method="POST", headers=headers,
                                     data=json.dumps({"owner": f"{HOST}:{port}"}).encode())
        try:
            urllib.request.urlopen(req, timeout=3).read()
            return True
        except OSError as e:
            if time.monotonic() >= deadline:
                print(f"owner_gone call failed: {e}", flush=True)
                return False
        time.sleep(0.2)


class System(Stack):
    """2 Envoys (--concurrency 2) x 2 ownership instances on the store x 3 naive replicas, and the faults."""

    def __init__(self, store: str, state_dir: Path, tally: Tally):
        super().__init__(state_dir, replicas="naive", replica_args={"ring": RING, "tick_ms": 50},
                         ownership_ports=OWNERSHIP_PORTS, store=store, cluster_base=CLUSTER_BASE, gateways=2,
                         envoy_ports=ENVOY_PORTS, admin_ports=ADMIN_PORTS, name="chaos", concurrency=2,
                         configure=access_logged, plugin_defaults={"retention": RING})
        self.t = tally
        # When the Redis fault the cluster has not yet come back from restarted it; None: the cluster
        # is ok. No further Redis fault is injected until it is (a master killed while its replica is
        # unsynced loses data no failover could save, which is not the fault being soaked).
        self.unsettled_since: float | None = None
        # name -> [(monotonic time, KiB)], sampled every second by `sample_forever`.
        self.rss: dict[str, list[tuple[float, int]]] = collections.defaultdict(list)
        self.token = None
        self.admin_token = None

    def setup_tokens(self) -> None:
        """Authenticate the control plane when the service supports it (`--token-file`)."""
        helptext = subprocess.run([str(BIN / "mcp-ownership"), "--help"], capture_output=True,
                                  text=True).stdout
        if "--token-file" not in helptext:
            return
        self.token = uuid.uuid4().hex + uuid.uuid4().hex
        self.admin_token = uuid.uuid4().hex + uuid.uuid4().hex
        tf = RUNS / "chaos-token"
        af = RUNS / "chaos-admin-token"
        tf.write_text(self.token + "\n")
        af.write_text(self.admin_token + "\n")
        self.ownership_args = ["--token-file", str(tf)]
        if "--admin-token-file" in helptext:
            self.ownership_args += ["--admin-token-file", str(af)]

    def guard_overrides(self) -> dict:
        if not self.token:
            return {}
        return {"ownership": {"cluster": "mcp_ownership", "timeout_ms": 250, "token": self.token}}

    def start(self) -> "System":
        RUNS.mkdir(parents=True, exist_ok=True)
        self.setup_tokens()
        super().start()
        self.use(guard=True, **self.guard_overrides())
        return self

    def sample_rss(self) -> None:
        try:
            procs = self.processes()
        except RuntimeError:  # a fault replaced a process while we looked: next second
            return
        now = time.monotonic()
        for name, proc in procs.items():
            if proc.alive and proc.proc is not None:
                v = rss_kib(proc.proc.pid)
                if v is not None:
                    self.rss[name].append((now, v))

    def sample_forever(self, stop: threading.Event) -> None:
        """Every second, faults included (a fault blocks the main loop for up to 30 s)."""
        while not stop.wait(1.0):
            self.sample_rss()

    def stop(self) -> None:
        for p, _ in getattr(self, "ts", []):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
        super().stop()

    # -- faults --

    def mark_gone(self, port: int, rng: random.Random, retry_s: float) -> bool:
        return mark_gone(port, OWNERSHIP_PORTS, rng, retry_s, self.admin_token)

    def restart_replica(self, port: int, rng: random.Random) -> None:
        """Start a replica again at its address, after marking the address gone (its startup step; it
        waits for the ownership service like a container whose entrypoint retries)."""
        if not self.mark_gone(port, rng, 30):
            self.t.inc("replica_started_unmarked")
        self.start_replica(port)

    @property
    def cluster_settled(self) -> bool:
        return self.unsettled_since is None

    def settle(self, bound_s: float, since: float | None = None) -> bool:
        """Wait (at most bound_s) for the cluster to be ok again after a fault that restarted it at
        `since` (default: when it was last found not ok, or now). A cluster slower than that is the
        store's trouble, not a guard violation: it is reported with what each node said, and the soak
        goes on against a degraded store, which the guard must fail closed through."""
        start = since or self.unsettled_since or time.monotonic()
        try:
            self.cluster.wait_ok(bound_s)
        except TimeoutError as e:
            if self.cluster_settled:
                print(f"{time.strftime('%H:%M:%S')} the Redis Cluster did not settle: {e}", flush=True)
                self.t.inc("redis_unsettled")
            self.unsettled_since = start
            return False
        took = time.monotonic() - start
        with self.t.lock:
            self.t.settle_s.append(took)
        print(f"{time.strftime('%H:%M:%S')} the Redis Cluster is ok again ({took:.1f} s)", flush=True)
        self.unsettled_since = None
        return True

    def fault(self, kind: str, rng: random.Random) -> None:
        if kind in REDIS_FAULTS and self.cluster is not None and not self.cluster_settled:
            if not self.settle(2.0):
                self.t.inc("redis_faults_deferred")
                print(f"{time.strftime('%H:%M:%S')} fault {kind} deferred: the cluster is not ok yet", flush=True)
                return
        self.t.faults[kind] += 1
        self.t.fault_log.append((time.monotonic(), kind))
        print(f"{time.strftime('%H:%M:%S')} fault {kind}", flush=True)
        if kind == "replica_kill":
            # A crash: no preStop. The restart at the same address marks it gone before serving (the
            # startup step README asks of replicas), since this process knows none of the old streams.
            p = rng.choice(self.replica_ports)
            self.replicas[p].kill()
            time.sleep(rng.uniform(0.5, 2.0))
            self.restart_replica(p, rng)
        elif kind == "owner_gone":
            # The preStop path: mark the address gone, then the pod terminates and a new one starts there.
            p = rng.choice(self.replica_ports)
            if not self.mark_gone(p, rng, 0):
                self.t.inc("prestop_mark_failed")
            self.replicas[p].stop()
            self.restart_replica(p, rng)
        elif kind == "ownership_kill":
            p = rng.choice(OWNERSHIP_PORTS)
            self.owners[p].kill()
            time.sleep(rng.uniform(0.5, 2.0))
            self.start_ownership(p)
        elif kind == "redis_master_kill":
            if self.cluster is not None:
                masters = self.cluster.masters_now()
                m = rng.choice(masters)
                self.cluster.kill(m)
                time.sleep(rng.uniform(2.0, 4.0))  # failover
                self.cluster.restart(m)
                self.settle(30, since=time.monotonic())
            elif self.redis is not None:
                self.redis.kill()
                time.sleep(rng.uniform(0.5, 2.0))
                self.start_store()
        elif kind == "redis_cluster_restart":
            if self.cluster is not None:
                since = time.monotonic()
                self.cluster.restart_all(timeout=None)
                self.settle(30, since)
            elif self.redis is not None:
                self.redis.stop()
                self.start_store()
        elif kind == "envoy_restart":
            i = rng.randrange(2)
            self.start_gateway(i, True, {**self.plugin_defaults, **self.guard_overrides()})


REDIS_FAULTS = ("redis_master_kill", "redis_cluster_restart")
FAULTS = ["replica_kill", "owner_gone", "ownership_kill", "redis_master_kill", "redis_cluster_restart",
          "envoy_restart"]
WEIGHTS = [3, 2, 2, 2, 1, 2]


# ---- TypeScript SDK clients ------------------------------------------------------------------------

def start_ts_clients(n: int, seconds: float, seed: int) -> list[tuple[subprocess.Popen, Path]]:
    out = []
    for i in range(n):
        log = RUNS / f"chaos-ts-{i}.json"
        urls = ",".join(f"http://{HOST}:{p}{h.PATH}" for p in ENVOY_PORTS)
        p = subprocess.Popen([NODE, str(ROOT / "tests" / "interop" / "ts_chaos_client.mjs"), "--urls", urls, "--seconds", str(seconds),
                              "--seed", str(seed * 1000 + i)],
                             stdout=open(log, "w"), stderr=subprocess.STDOUT, cwd=ROOT / "tests" / "interop",
                             start_new_session=True)
        out.append((p, log))
    return out


def collect_ts(procs: list[tuple[subprocess.Popen, Path]], tally: Tally) -> None:
    for p, log in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        try:
            res = json.loads(log.read_text().strip().splitlines()[-1])
        except (ValueError, IndexError, OSError):
            tally.violation("ts_client_no_report", f"{log.name}: exit {p.returncode}")
            continue
        tally.inc("ts_calls", res.get("calls", 0))
        tally.inc("ts_results", res.get("results", 0))
        tally.inc("ts_errors", res.get("errors", 0))
        for v in res.get("violations", []):
            tally.violation("ts_" + v.get("kind", "?"), json.dumps(v)[:300])
        with tally.lock:
            tally.accepted_entries.update(res.get("accepted", []))
            tally.completed_entries.update(res.get("completed", []))


# ---- checks after the run ----------------------------------------------------------------------------

def check_ledger(state_dir: Path, tally: Tally) -> None:
    counts = collections.Counter(e["entry"] for e in ledger(state_dir) if str(e.get("entry", "")).startswith("chaos-"))
    for entry, n in counts.items():
        if n > 1:
            tally.violation("side_effect_twice", f"{entry} in the ledger {n} times")
    for entry in tally.accepted_entries:
        if counts.get(entry, 0) != 1:
            tally.violation("accepted_call_not_once", f"{entry}: {counts.get(entry, 0)} ledger lines")
    tally.inc("ledger_entries", sum(counts.values()))


def check_access_logs(tally: Tally) -> None:
    for i in range(2):
        path = RUNS / f"chaos-envoy{i}-access.log"
        if not path.exists():
            continue
        for line in path.read_text(errors="replace").splitlines():
            parts = line.split(" ", 2)
            if len(parts) < 2 or not parts[0].isdigit():
                continue
            code, details = int(parts[0]), parts[1]
            # Envoy's own 503s (a replica or the owner down) are expected under faults; a 5xx the guard made
            # (a local reply, or a VM failure) is not.
            header = parts[2] if len(parts) > 2 else "-"
            if code >= 500 and ("wasm" in details or header.startswith("rejected")):
                tally.violation("guard_5xx", line)
            if code >= 500:
                tally.inc(f"envoy_5xx:{details}")


# Hard caps per process kind (MiB): the ownership service's is the limit deploy/k8s/ownership.yaml sets.
MEMORY_CAPS_MIB = {"ownership": 512, "envoy": 1024, "replica": 256, "redis": 256}


def check_memory(system: System, tally: Tally, growth: bool) -> dict[str, tuple[int, int]]:
    """Bounded: every process under its kind's cap; and, for a soak long enough to tell warm-up from a
    leak (`growth`), the last third of the samples within 1.5x (+32 MiB) of the first third's peak."""
    out = {}
    for name, timed in system.rss.items():
        samples = [v for _, v in timed]
        if len(samples) < 6:
            continue
        third = len(samples) // 3
        early, late = max(samples[:third]), max(samples[-third:])
        out[name] = (early, max(samples))
        cap = MEMORY_CAPS_MIB.get(name.split(":")[0], 1024) * 1024
        if max(samples) > cap:
            tally.violation("memory_cap", f"{name}: {max(samples)} KiB, cap {cap} KiB")
        if growth and late > early * 1.5 + 32 * 1024:
            tally.violation("memory_growth", f"{name}: {early} KiB early, {late} KiB late")
    return out


FAULT_MARKS = {"replica_kill": "K", "owner_gone": "G", "ownership_kill": "O", "redis_master_kill": "M",
               "redis_cluster_restart": "R", "envoy_restart": "E"}


def rss_timeline(system: System, tally: Tally, t0: float, bucket_s: float = 60.0) -> list[str]:
    """Peak RSS per minute of the service and proxy processes, with the faults of each minute, so a
    climb that stays tells itself apart from the peak of one outage."""
    end = max([t for timed in system.rss.values() for t, _ in timed] or [t0])
    n = max(1, int((end - t0) // bucket_s) + 1)
    head = "| process | " + " | ".join(f"{i + 1}" for i in range(n)) + " |"
    lines = ["RSS peak per minute (MiB); the last row: faults that minute (" +
             ", ".join(f"{m} {k}" for k, m in FAULT_MARKS.items()) + ").", "", head,
             "| --- |" + " --- |" * n]
    for name in sorted(system.rss):
        if not name.startswith(("ownership", "envoy")):
            continue
        peaks = [0] * n
        for t, v in system.rss[name]:
            i = min(n - 1, max(0, int((t - t0) // bucket_s)))
            peaks[i] = max(peaks[i], v)
        lines.append(f"| {name} | " + " | ".join(f"{p / 1024:.0f}" if p else "-" for p in peaks) + " |")
    marks = [""] * n
    for t, kind in tally.fault_log:
        i = min(n - 1, max(0, int((t - t0) // bucket_s)))
        marks[i] += FAULT_MARKS.get(kind, "?")
    lines.append("| faults | " + " | ".join(m or "-" for m in marks) + " |")
    return lines


def pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    v = sorted(values)
    return v[min(len(v) - 1, int(q * len(v)))]


def report(args, tally: Tally, mem: dict, started: float, elapsed: float, timeline: list[str]) -> str:
    c = tally.counts
    lines = [
        "# Chaos soak",
        "",
        "The same kind of soak with real SDK clients and servers (a rolling deploy, measured from the "
        "applications): [docs/soak-sdk.md](docs/soak-sdk.md), `make soak-sdk`.",
        "",
        f"Command: `make chaos CHAOS_S={args.seconds} CHAOS_CLIENTS={args.clients} CHAOS_SEED={args.seed}"
        f" CHAOS_STORE={args.store}`",
        f"Run: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(started))}, {elapsed:.0f} s; seed {args.seed};"
        f" machine: {os.cpu_count()} cores, {platform.machine()}, {platform.platform()}",
        f"Topology: 2 Envoys (--concurrency 2) with the guard, 2 ownership instances, store {args.store}, "
        f"3 naive replicas; {args.clients} scenario clients + {args.ts_clients} TypeScript SDK clients. "
        f"Binaries: `{os.path.relpath(BIN, ROOT)}`.",
        "",
        "| what | count |",
        "| --- | --- |",
        f"| resumes (GET with a cursor) | {c['resumes']} |",
        f"| continuations | {c['continuations']} |",
        f"| forks (two resumes of one cursor at once) | {c['forks']} |",
        f"| side-effecting calls accepted / completed | {len(tally.accepted_entries)} / {len(tally.completed_entries)} |",
        f"| ledger lines | {c['ledger_entries']} |",
        f"| forged, foreign and legacy cursors tried | {c['forged_tries']} |",
        f"| TypeScript SDK calls / results / errors | {c['ts_calls']} / {c['ts_results']} / {c['ts_errors']} |",
        f"| resume latency p50 / p99 (ms) | {pct(tally.resume_ms, 0.5):.1f} / {pct(tally.resume_ms, 0.99):.1f} |",
        f"| **violations** | **{len(tally.violations)}** |",
        "",
        "| signal (reason) | count |",
        "| --- | --- |",
        *[f"| {k} | {v} |" for k, v in sorted(tally.signals.items())],
        "",
        "| fault | injected |",
        "| --- | --- |",
        *[f"| {k} | {v} |" for k, v in sorted(tally.faults.items())],
        "",
        *([f"The Redis Cluster was ok again after {len(tally.settle_s)} of its faults; the slowest took "
           f"{max(tally.settle_s):.1f} s.", ""] if tally.settle_s else []),
        *(["**The Redis Cluster was not ok again by the end of the run** (see the log for what each node "
           "reported).", ""] if c["redis_unsettled_at_end"] else []),
        "| process | RSS early peak / max (MiB) |",
        "| --- | --- |",
        *[f"| {k} | {a / 1024:.1f} / {b / 1024:.1f} |" for k, (a, b) in sorted(mem.items())],
        "",
        *timeline,
    ]
    other = {k: v for k, v in c.items() if k.startswith("envoy_5xx:") or k in ("connect_retries",
             "resume_transport_errors", "client_crashes", "redis_unsettled", "redis_faults_deferred",
             "continuations_ended_empty", "resume_resets",
             "call_resume_other_stream")}
    if other:
        lines += ["", "| other | count |", "| --- | --- |", *[f"| {k} | {v} |" for k, v in sorted(other.items())]]
    if tally.violations:
        lines += ["", "Violations:", ""] + [f"- {kind}: {d}" for _, kind, d in tally.violations[:50]]
    lines.append("")
    return "\n".join(lines)



def fresh_run(name: str) -> Path:
    """An empty state directory under .runs/ for one soak, and no access logs of an earlier one."""
    import shutil
    state_dir = RUNS / name
    shutil.rmtree(state_dir, ignore_errors=True)
    (state_dir / "sessions").mkdir(parents=True)
    for i in range(2):
        (RUNS / f"chaos-envoy{i}-access.log").unlink(missing_ok=True)
    return state_dir


def stop_on_sigterm() -> None:
    """SIGTERM (make interrupted, a CI timeout) ends a soak like Ctrl-C: its `finally` stops every
    process it started, by pid."""
    def on_term(signum, frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, on_term)

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=600)
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--ts-clients", type=int, default=None)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--store", choices=["redis-cluster", "redis"], default="redis-cluster")
    ap.add_argument("--fault-every", type=float, default=None, help="seconds between faults (default: 8)")
    ap.add_argument("--faults", default=",".join(FAULTS),
                    help="comma-separated fault kinds to draw from (default: all), e.g. redis_master_kill")
    ap.add_argument("--report", type=Path, default=None)
    args = ap.parse_args()
    kinds_wanted = [k for k in args.faults.split(",") if k]
    unknown = [k for k in kinds_wanted if k not in FAULTS]
    if unknown or not kinds_wanted:
        ap.error(f"--faults: unknown kind(s) {unknown or args.faults!r}; known: {', '.join(FAULTS)}")
    fault_kinds, fault_weights = zip(*[(k, w) for k, w in zip(FAULTS, WEIGHTS) if k in kinds_wanted])
    if args.ts_clients is None:
        args.ts_clients = max(2, args.clients // 10)
    rng = random.Random(args.seed)
    tally = Tally()
    state_dir = fresh_run("chaos-state")
    system = System(args.store, state_dir, tally)
    stop = threading.Event()

    stop_on_sigterm()
    started = time.time()
    t0 = time.monotonic()
    ok = False
    def phase(what: str) -> None:
        print(f"{time.strftime('%H:%M:%S')} +{time.monotonic() - t0:.1f}s {what}", flush=True)

    try:
        system.start()
        phase("system up")
        deadline = time.monotonic() + args.seconds
        kinds = [Streamer] * 4 + [Caller] * 4 + [Forger]
        threads = []
        for i in range(args.clients):
            cls = kinds[i % len(kinds)]
            th = threading.Thread(target=run_scenario, args=(cls, tally, args.seed * 7919 + i, deadline, stop),
                                  daemon=True)
            th.start()
            threads.append(th)
        ts = start_ts_clients(args.ts_clients, max(5.0, args.seconds - 5), args.seed)
        system.ts = ts
        every = args.fault_every or 8.0
        next_fault = time.monotonic() + min(every, 5.0)
        sampler = threading.Thread(target=system.sample_forever, args=(stop,), daemon=True)
        sampler.start()
        while time.monotonic() < deadline:
            now = time.monotonic()
            if now >= next_fault and deadline - now > 8:
                system.fault(rng.choices(fault_kinds, fault_weights)[0], rng)
                next_fault = time.monotonic() + every * rng.uniform(0.6, 1.4)
            time.sleep(0.2)
        stop.set()
        if system.cluster is not None and not system.cluster_settled and not system.settle(30):
            tally.inc("redis_unsettled_at_end")
        phase("clients stopping")
        for th in threads:
            th.join(timeout=15)
        phase("scenario clients done")
        collect_ts(ts, tally)
        phase("TypeScript clients done")
        time.sleep(0.5)  # calls still finishing write their ledger line at the start, so nothing is pending
        check_ledger(state_dir, tally)
        check_access_logs(tally)
        ok = True
    finally:
        stop.set()
        system.stop()
    mem = check_memory(system, tally, growth=args.seconds >= 300)
    text = report(args, tally, mem, started, time.monotonic() - t0, rss_timeline(system, tally, t0))
    print(text)
    if args.report:
        args.report.parent.mkdir(parents=True, exist_ok=True)
        args.report.write_text(text)
    if not ok:
        return 2
    if tally.counts["resumes"] == 0 or sum(tally.faults.values()) == 0:
        print("chaos: nothing was exercised", flush=True)
        return 1
    return 1 if tally.violations else 0


if __name__ == "__main__":
    sys.exit(main())
