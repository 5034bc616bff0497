"""Contiguity assertions (docs/contiguity-extension.md) with the real TypeScript and Python SDK servers.

One SDK replica, its event store trimming like the Python SDK example's (100 events per stream), with or
without the contiguity adapter (adapters/), behind Envoy without the guard, with the guard in `relayed` mode
and in `asserted` mode. A client reads notifications 1-3 of its standalone GET stream and goes away; the
server produces more (5: a short absence; 150: more than the store holds); the client resumes with its
last event id. Every outcome is one of: a contiguous continuation (4, 5, ... and no signal), an explicit
signal (the control event, before any event), or a silent gap (anything else, and nothing said).
"""
from __future__ import annotations

import json
import time

import pytest

import harness as h
import interop as i
from stack.services import py_server, ts_server
from stack.topology import running

REPLAY_METHOD = "notifications/mcp-resume-guard/replay"
STORE_LIMIT = 100
ABSENCE = {"short": 5, "long": 150}
SEEN_BEFORE = 3

i.require_sdks(node=True, python=True)

# What each scenario must give: contiguous, signal:<reason>, or silent.
EXPECTED = {
    # (adapter, guard mode or None): (short absence, long absence)
    (False, None): ("contiguous", "silent"),
    (True, None): ("contiguous", "silent"),
    (False, "relayed"): ("contiguous", "silent"),  # the documented limit of relayed evidence
    (False, "asserted"): ("signal:unasserted", "signal:unasserted"),
    (True, "relayed"): ("contiguous", "signal:gap"),
    (True, "asserted"): ("contiguous", "signal:gap"),
}
RESULTS: list[dict] = []


class OneReplica:
    """One SDK replica on the first harness replica port, and one Envoy at a time (ports borrowed from `stack`)."""

    def __init__(self, stack):
        self.stack = stack
        self.replica: h.Proc | None = None
        self.envoy: h.Envoy | None = None
        self.key = None
        self.envoy_key = None
        self.port = h.REPLICA_PORTS[0]

    def use(self, kind: str, adapter: bool, mode: str | None) -> None:
        key = (kind, adapter)
        if self.key != key or self.replica is None or not self.replica.alive:
            if self.envoy is not None:
                self.envoy.stop()
                self.envoy, self.envoy_key = None, None
            if self.replica is not None:
                self.replica.stop()
            self.stack.vacate()
            self.stack.ensure_ownership()
            self.replica = self.start_replica(kind, adapter)
            self.key = key
        if self.envoy_key != mode or self.envoy is None or not self.envoy.alive:
            if self.envoy is not None:
                self.envoy.stop()
            overrides = {"contiguity": mode} if mode else None
            self.envoy = i.affinity_envoy(f"envoy-contiguity-{mode or 'noguard'}", guard=mode is not None,
                                          plugin_overrides=overrides, replica_ports=[self.port])
            self.envoy_key = mode

    def start_replica(self, kind: str, adapter: bool) -> h.Proc:
        """The SDK server on `self.port`, its store trimming at STORE_LIMIT, wrapped by the adapter or not."""
        extra = ["--store-limit", STORE_LIMIT] + (["--contiguity"] if adapter else [])
        if kind == "ts":
            return ts_server(self.port, "r1", "--keepalive-ms", 300, *extra).start()
        return py_server(self.port, "py1", *extra).start()

    def stop(self) -> None:
        for p in (self.envoy, self.replica):
            if p is not None:
                p.stop()


@pytest.fixture(scope="module")
def one(stack):
    yield from running(OneReplica(stack))
    print_table()


def print_table() -> None:
    if not RESULTS:
        return
    print("\n| SDK | adapter | guard | absence | outcome |\n| --- | --- | --- | --- | --- |")
    for r in RESULTS:
        print(f"| {r['kind']} | {'yes' if r['adapter'] else 'no'} | {r['mode'] or 'none'} | {r['absence']} | "
              f"{r['outcome']} |")


def read_events(s: h.SSEStream, want: int, timeout: float) -> list[h.Event]:
    """Events (comments skipped) until `want` messages, a control event, the end, or `timeout`."""
    return s.read_within(timeout, lambda evs: bool(evs) and (evs[-1].event == "mcp-resume"
                                                            or len(produced(evs)) >= want))


def produced(events: list[h.Event]) -> list[int]:
    """`data.n` of the produce tool's notifications, in order."""
    out = []
    for e in events:
        if e.event == "message" and e.data.strip():
            m = json.loads(e.data)
            if m.get("method") == "notifications/message":
                out.append(m["params"]["data"]["n"])
    return out


def scenario(kind: str, absence: str) -> dict:
    c = h.Client(version="2025-11-25")
    c.initialize()
    g = c.get_stream()
    assert g.status == 200, g.status
    r = c.call_tool("produce", {"n": SEEN_BEFORE})
    r.read_all()
    seen = read_events(g, SEEN_BEFORE, 5)
    assert produced(seen) == [1, 2, 3], seen
    cursor = [e for e in seen if e.id][-1].id
    g.close()
    time.sleep(0.3)  # the server notices the client went away
    k = ABSENCE[absence]
    r = c.call_tool("produce", {"n": k})
    r.read_all()
    s = c.get_stream(last_event_id=cursor)
    got = read_events(s, k, 4)
    s.close()
    control = [json.loads(e.data) for e in got if e.event == "mcp-resume"]
    before = produced(got[:next((n for n, e in enumerate(got) if e.event == "mcp-resume"), len(got))])
    ns = produced(got)
    assertions = [e for e in got if e.event == "message" and REPLAY_METHOD in e.data]
    if s.header("mcp-resume") or s.status == 409:
        outcome = f"signal:{(s.header('mcp-resume') or '').partition('reason=')[2]}"
    elif control:
        outcome = f"signal:{control[0]['reason']}"
    elif ns[:k] == list(range(SEEN_BEFORE + 1, SEEN_BEFORE + k + 1)):
        outcome = "contiguous"
    else:
        outcome = "silent"
    return {"outcome": outcome, "status": s.status, "header": s.header("mcp-resume"), "got": [(e.event, e.data[:60]) for e in got][:4], "ns": ns, "before_signal": before, "control": control,
            "assertions_seen": len(assertions), "cursor": cursor}


CASES = [(kind, adapter, mode, absence)
         for kind in ("ts", "py") for adapter in (False, True) for mode in (None, "relayed", "asserted")
         for absence in ("short", "long")]


@pytest.mark.parametrize("kind,adapter,mode,absence", CASES,
                         ids=[f"{k}-{'adapter' if a else 'plain'}-{m or 'noguard'}-{ab}" for k, a, m, ab in CASES])
def test_resume_after_absence(one, kind, adapter, mode, absence):
    one.use(kind, adapter, mode)
    out = scenario(kind, absence)
    RESULTS.append({"kind": kind, "adapter": adapter, "mode": mode, "absence": absence, **out})
    check_outcome(out, adapter, mode, absence)


def check_outcome(out: dict, adapter: bool, mode: str | None, absence: str) -> None:
    """The expected outcome for this replica setup and guard mode; nothing unverifiable relayed."""
    want = EXPECTED[(adapter, mode)][0 if absence == "short" else 1]
    assert out["outcome"] == want, json.dumps(out)
    if out["outcome"].startswith("signal"):
        assert out["before_signal"] == [], "nothing unverifiable is relayed before the signal"
    if mode is not None:
        assert out["assertions_seen"] == 0, "the assertion never reaches a client through the guard"
    elif adapter:
        assert out["assertions_seen"] == 1, "without a guard the client gets the assertion (and ignores it)"
