"""Ownership on a real Redis Cluster: two Envoys (each with the guard), two ownership instances on
a local Redis Cluster (3 primaries + 3 replicas, `--store redis-cluster://…`), three naive replicas.

The core path (continue across guards, superseded, gap, owner gone) is the shared-store module's own
tests, run here against the Cluster; then the Cluster's own faults: a primary killed mid-load and a
slot migrated while resumes run. Ports shift with E2E_PORT_OFFSET; the Cluster is on
REDIS_PORT+40 .. +45 (cluster bus +10000).
"""
import collections
import re
import threading
import time

import pytest

import harness as h
from stack.topology import running
import test_redis_shared as shared_mod
from stack.cluster import RedisCluster
from test_redis_shared import (E1, E2, O1, O2, CALLOUT_TIMEOUT_MS, client, shared,  # noqa: F401
                               shared_envoy_config, wait_healthy)
from test_seed_scenarios import GUARD_HEADER, open_and_read

# The shared-store module's core path, against the Cluster (they take the `shared` fixture, over this module's `shared_stack`).
from test_redis_shared import (  # noqa: F401
    test_envoy2_refuses_a_gapped_cursor,
    test_envoy2_refuses_a_superseded_cursor,
    test_owner_gone_restarts_its_streams_on_every_guard,
    test_record_in_flight_is_decided_correctly,
    test_stream_opened_through_envoy1_continues_through_envoy2,
)

CLUSTER_BASE = h.REDIS_PORT + 40
REFUSED = "restarted; reason=ownership_unavailable"


class ClusterShared(shared_mod.Shared):
    """The shared-store stack with a Redis Cluster instead of one redis-server."""

    def __init__(self, stack):
        super().__init__(stack)
        self.cluster: RedisCluster | None = None

    def store_url(self) -> str:
        return self.cluster.url

    def ensure_store(self) -> None:
        if self.cluster is None:
            self.cluster = RedisCluster(CLUSTER_BASE, name="e2e").start()
        self.cluster.wait_ok()

    def stop(self) -> None:
        super().stop()
        if self.cluster is not None:
            self.cluster.stop()


@pytest.fixture(scope="module")
def shared_stack(stack):
    """What the shared-store tests' `shared` fixture (imported) starts: here, on a Redis Cluster."""
    yield from running(ClusterShared(stack))


# ---------------------------------------------------------------------------------------------
# Faults of the Cluster.
# ---------------------------------------------------------------------------------------------

class Checked:
    """Resumes one GET cursor in a loop through both Envoys. Each outcome is (start, seconds, kind):
    `continue` (200, no Mcp-Resume, the owner answered; the first time, the first replayed event is
    exactly the one that followed the cursor), `refused <header>` (explicit), or `WRONG …`.
    Later continues are not read (the naive replica does not replay one cursor twice the same way).
    A replay the guard itself finds wrong ends in a `replay_mismatch` control event: explicit too."""

    def __init__(self, session: str, cursor: str, next_event, owner: str):
        self.session, self.cursor, self.next_event, self.owner = session, cursor, next_event, owner
        self.results: list[tuple[float, float, str]] = []
        self.stop_flag = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        i = 0
        read_replay = True
        while not self.stop_flag.is_set():
            c = client((E1, E2)[i % 2], self.session)
            i += 1
            c.timeout = 5.0
            t0 = time.monotonic()
            try:
                r = c.get_stream(last_event_id=self.cursor)
                header = r.header(GUARD_HEADER)
                if r.status == 200 and header is None and r.header("x-replica") != self.owner:
                    kind = f"WRONG continue at {r.header('x-replica')}, owner {self.owner}"
                elif r.status == 200 and header is None:
                    kind = "continue"
                    if read_replay:
                        got = r.read(1)
                        if got and got[0].event == "mcp-resume" and got[0].id is None:
                            # The guard's own check of the replay refused it, explicitly.
                            kind = f"refused mid-stream {got[0].json()['reason']}"
                        elif len(got) != 1 or (got[0].id, got[0].data) != (self.next_event.id, self.next_event.data):
                            kind = f"WRONG replay {got[:1]}"
                        read_replay = False
                elif r.status == 200:
                    kind = f"refused {header}"
                else:
                    kind = f"WRONG status {r.status} {header}"
                r.close()
            except OSError as e:
                kind = f"WRONG error {e}"
            self.results.append((t0, time.monotonic() - t0, kind))
            time.sleep(0.01)


def assert_only_replica_ids_reached_replicas() -> None:
    """Continues forward the replica's own id (`e<n>`); a guard cursor never reaches a replica."""
    leaked = [x for x in h.cursors_seen_by_replicas()
              if x["last_event_id"] and not re.fullmatch(r"e\d+", x["last_event_id"])]
    assert leaked == [], f"a guard cursor reached a replica: {leaked[:3]}"


def checked_sessions(n: int) -> list[Checked]:
    out = []
    for _ in range(n):
        c = client(E1)
        c.initialize()
        s, evs = open_and_read(c, 4)
        out.append(Checked(c.session, evs[2].id, evs[3], s.header("x-replica")))
    # Every relayed event's record has landed: a resume AT the recorded head cannot tell that
    # a later event is still in flight (it waits only for cursors past the head).
    time.sleep(1.5)
    return out


def run_under(loads: list[Checked], fault, settle: float):
    for ld in loads:
        ld.thread.start()
    try:
        time.sleep(0.5)
        marks = fault()
        time.sleep(settle)
    finally:
        for ld in loads:
            ld.stop_flag.set()
        for ld in loads:
            ld.thread.join(timeout=10)
    return marks


def session_keys_by_master(c: RedisCluster) -> dict[int, list[str]]:
    out = {}
    for m in c.masters_now():
        keys = c.cli(m, "--scan", "--pattern", "mrg:{*}:s").split()
        out[m] = keys
    return out


def test_primary_killed_mid_load_no_wrong_continue_fails_closed_recovers(shared):
    c = shared.cluster
    # Six sessions on three naive replicas whose rings (16 events) are shared by all their
    # sessions: a ring that wrapped makes its replica reuse the cursor's successor id for another
    # event (its counter restarts at the cursor), which the guard must cut (replay_mismatch,
    # explicit), never pass as the continuation.
    loads = checked_sessions(6)
    by_master = session_keys_by_master(c)
    victim = max(by_master, key=lambda m: len(by_master[m]))
    assert by_master[victim], by_master
    pids = {p: shared.own[p].proc.pid for p in (O1, O2)}

    def fault():
        t = time.monotonic()
        c.kill(victim)
        return t

    try:
        killed_at = run_under(loads, fault, settle=8.0)
        results = [r for ld in loads for r in ld.results]
        wrong = [r for r in results if r[2].startswith("WRONG")]
        assert not wrong, wrong[:5]
        before = [r for r in results if r[0] + r[1] < killed_at]
        assert not [r for r in before if r[2] == f"refused {REFUSED}"], "the store failed before the kill"
        after = [r for r in results if r[0] >= killed_at]
        # Fails closed, fast, while the Cluster fails over. (The other refusals, owner_unavailable and
        # unknown_stream, are the guard's own answers to the naive replica replaying one cursor again
        # and again; they come as often on one Redis without any fault. Explicit all the same.)
        refused = [r for r in after if r[2] == f"refused {REFUSED}"]
        assert refused, "the dead primary's sessions were never refused"
        worst = max(r[1] for r in refused)
        assert worst < CALLOUT_TIMEOUT_MS / 1000 + 0.75, f"slowest refusal took {worst:.3f}s"
        window = max(r[0] for r in refused) - killed_at
        assert window < 6.0, f"still failing {window:.1f}s after the kill"
        # Recovered without restarting anything: the store answers every session again.
        for ld in loads:
            tail = [r for r in ld.results if r[0] > killed_at + window]
            assert len(tail) >= 3 and all(r[2] != f"refused {REFUSED}" for r in tail), tail[-3:]
        assert {p: shared.own[p].proc.pid for p in (O1, O2)} == pids
        assert victim not in c.masters_now()
        assert_only_replica_ids_reached_replicas()
        kinds = collections.Counter(r[2] for r in after)
        print(f"\nprimary {victim} killed: {len(refused)} of {len(after)} resumes ownership_unavailable "
              f"(slowest {worst * 1000:.0f} ms), the last {window:.2f}s after the kill; after it: {dict(kinds)}")
    finally:
        # Whatever failed above, the next test gets a whole Cluster back.
        c.restart(victim)
        c.wait_ok()


def test_slot_migration_under_resumes_keeps_verdicts(shared):
    c = shared.cluster
    old = {k for keys in session_keys_by_master(c).values() for k in keys}
    loads = checked_sessions(6)
    # The slot of one of this test's sessions (the store key is the guard's hash of the session).
    by_master = {m: [k for k in keys if k not in old] for m, keys in session_keys_by_master(c).items()}
    src = max(by_master, key=lambda m: len(by_master[m]))
    key = by_master[src][0]
    slot = c.cli(src, "cluster", "keyslot", key).strip()
    dst = next(m for m in c.masters_now() if m != src)
    src_id, dst_id = c.cli(src, "cluster", "myid").strip(), c.cli(dst, "cluster", "myid").strip()
    moved = []

    def fault():
        t = time.monotonic()
        assert c.cli(dst, "cluster", "setslot", slot, "importing", src_id).strip() == "OK"
        assert c.cli(src, "cluster", "setslot", slot, "migrating", dst_id).strip() == "OK"
        first = [key]  # the session's hash first: the hardest split for a script
        for _ in range(200):
            k = first.pop() if first else c.cli(src, "cluster", "getkeysinslot", slot, "1").strip()
            if not k:
                break
            out = c.cli(src, "migrate", h.HOST, str(dst), k, "0", "5000")
            assert "OK" in out, (k, out)
            moved.append(k)
            time.sleep(0.1)
        for m in c.masters_now():
            assert "OK" in c.cli(m, "cluster", "setslot", slot, "node", dst_id)
        return t, time.monotonic()

    started, done = run_under(loads, fault, settle=2.0)
    results = [r for ld in loads for r in ld.results]
    wrong = [r for r in results if r[2].startswith("WRONG")]
    assert not wrong, wrong[:5]
    during = [r for r in results if started <= r[0] <= done]
    # The moved session failed closed while its keys were split (TRYAGAIN → 503).
    assert any(r[2] == f"refused {REFUSED}" for r in during), "no resume met the split"
    assert len(moved) >= 3, moved
    assert c.cli(src, "cluster", "countkeysinslot", slot).strip() == "0"
    for ld in loads:
        tail = [r for r in ld.results if r[0] > done + 0.5]
        assert tail and all(r[2] != f"refused {REFUSED}" for r in tail), tail[:3]
    assert_only_replica_ids_reached_replicas()
    print(f"\nslot {slot} {src} → {dst}: {len(moved)} keys in {done - started:.2f}s; during it: "
          f"{dict(collections.Counter(r[2] for r in during))}")

