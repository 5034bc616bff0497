"""Forks (docs/forks.md): two resumes of one cursor at once, through two gateways or through one.

Topology: two Envoys loading the guard, two ownership instances on one real Redis, three naive replicas
that hand a session's stream to its newest reader (`--hand-over`: the older reader's response just ends,
with no word). Each round: a session through gateway A, a stream with 3 events (a request stream or the
GET stream), then two resumes of one of its cursors, the second 0-50 ms (one gateway: 0-2 ms) after the
first, read for a bounded time while the replica goes on producing. What each branch saw: its events
and how it ended (a control event, an `Mcp-Resume` header or another status, a reset, a clean end, or
still open at the deadline).

The oracle, per round: no branch is silent (200, no event, a clean end and no signal) or stalled (open,
nothing arriving); every branch's events continue the cursor (seqs consecutive in its incarnation, no
duplicate, no foreign id); exactly one branch keeps the stream (still open and receiving new events at
the deadline). The figures print per round and in total (`pytest -s`).
"""
from __future__ import annotations

import collections
import json
import random
import threading
import time
from dataclasses import dataclass, field

import pytest

import harness as h
from stack.resume import control_reason, cursor_fields, header_reason
from stack.topology import Stack, running

RING = 4096  # events each replica keeps; the guard is told the same (`retention`)
TICK_MS = 20  # the replicas' live events: "keeps the stream" is observable within a round
OWNERS = [h.OWNERSHIP_PORT + 2, h.OWNERSHIP_PORT + 3]  # the session stack's own stays on OWNERSHIP_PORT
SETTLE_S = 0.15  # the stream's records reach the store (flush_ms 10) before the resumes
CURSORS = (2, 1, 2, 0)  # which of the 3 events is the cursor, every other round (2: the head)


@pytest.fixture(scope="module")
def forks(stack, tmp_path_factory):
    """The stack above on the session stack's replica and Envoy ports (it gives them up)."""
    stack.vacate()
    state = tmp_path_factory.mktemp("forks-state")
    s = Stack(state, replicas="naive", replica_args={"ring": RING, "tick_ms": TICK_MS, "extra": ["--hand-over"]},
              ownership_ports=OWNERS, store="redis", gateways=2, concurrency=2,
              plugin_defaults={"retention": RING})
    yield from running(s, s.start, remove=state)


def with_extension(s: Stack, on: bool) -> None:
    """The replicas with or without the contiguity extension, the gateways in the matching mode."""
    extra = ["--hand-over"] + (["--contiguity"] if on else [])
    if s.replica_args.get("extra") != extra:
        s.replica_args["extra"] = extra
        for p in s.replicas.values():
            p.stop()
        s.ensure_replicas(reset=False)
    s.use(contiguity="asserted" if on else "relayed")


@dataclass
class Branch:
    gateway: int
    delay_ms: float = 0.0
    status: int | None = None
    header: str | None = None  # the Mcp-Resume header
    events: list = field(default_factory=list)  # (arrival, Event): the message events
    end: str = "hung"  # control:<reason> | reset | clean | open | error:<what>
    transcript: bytes = b""
    problems: list = field(default_factory=list)  # (kind, detail)
    survives: bool = False

    @property
    def signalled(self) -> bool:
        return (self.status != 200 or self.header is not None or self.end.startswith("control:")
                or self.end == "reset")

    def outcome(self) -> str:
        if self.status != 200:
            return f"status:{self.status}"
        if self.header is not None:
            return f"header:{header_reason(self.header)}"
        return self.end

    def show(self) -> str:
        return (f"gw{self.gateway} +{self.delay_ms:.1f}ms {self.status} {len(self.events)} ev {self.outcome()}"
                f"{' KEEPS' if self.survives else ''}")


def resume(session: str, port: int, cursor: str, start: float, deadline: float, b: Branch) -> None:
    """One resume of `cursor` through `port`, opened at `start`, read until its end or `deadline`."""
    time.sleep(max(0.0, start - time.monotonic()))
    c = h.Client(port=port, timeout=5.0)
    c.session = session
    try:
        s = c.get_stream(last_event_id=cursor)
    except OSError as e:
        b.end = f"error:{type(e).__name__}"
        return
    s.transcript = bytearray()
    b.status, b.header = s.status, s.header("mcp-resume")
    times: list[float] = []

    def stop_at_control(evs) -> bool:
        times.extend([time.monotonic()] * (len(evs) - len(times)))  # each event's arrival
        return bool(evs) and control_reason(evs[-1]) is not None

    try:
        evs = s.read_within(max(0.0, deadline - time.monotonic()), stop_at_control)
    finally:
        b.transcript = bytes(s.transcript)
        s.close()
    b.events = [(t, ev) for t, ev in zip(times, evs) if ev.event == "message"]
    if evs and control_reason(evs[-1]) is not None:
        b.end = f"control:{control_reason(evs[-1])}"
    elif s.ended:
        b.end = "reset" if s.reset else "clean"
    else:
        b.end = "open"


def check(b: Branch, cursor: str, deadline: float, keep_s: float) -> None:
    """The branch's events against the cursor, and whether it is silent, stalled or keeps the stream."""
    if b.end == "hung":
        b.problems.append(("hung", "the reader did not return"))
    if b.status == 200 and b.header is None:
        if not b.events and b.end == "clean":
            b.problems.append(("silent", "200, no event, a clean end, no signal"))
        if b.end == "open":
            b.survives = any(t >= deadline - keep_s for t, _ in b.events)
            if not b.survives:
                b.problems.append(("stalled", f"open, nothing in the last {keep_s}s"))
    if b.status != 200 or b.header is not None:
        return  # refused before anything was relayed: what follows is the guard's own answer
    inc, seq = cursor_fields(cursor) or (None, None)
    seen, last_n = set(), {}
    for k, (_, ev) in enumerate(b.events):
        f = cursor_fields(ev.id or "")
        if f is None or f[0] != inc:
            b.problems.append(("foreign", f"event {k}: id {ev.id!r}"))
        elif f[1] != seq + 1 + k:
            b.problems.append(("gap", f"event {k}: seq {f[1]} after cursor seq {seq}"))
        if ev.id in seen:
            b.problems.append(("duplicate", f"event {k}: id {ev.id!r}"))
        seen.add(ev.id)
        # The replica's own counting: a stream's notifications n, n+1, ... within the branch.
        data = ((json.loads(ev.data).get("params") or {}).get("data") or {}) if ev.data else {}
        if isinstance(data, dict) and "stream" in data:
            key, n = (data.get("replica"), data["stream"]), data.get("n")
            if key in last_n and n != last_n[key] + 1:
                b.problems.append(("replica_gap", f"event {k}: {key} n {last_n[key]} then {n}"))
            last_n[key] = n


class Rounds:
    """Figures over the rounds of one test."""

    def __init__(self, name: str):
        self.name = name
        self.n = 0
        self.survivors = collections.Counter()
        self.outcomes = collections.Counter()
        self.problems = collections.Counter()
        self.bad: list[str] = []

    def add(self, label: str, branches: list[Branch]) -> None:
        self.n += 1
        keep = sum(b.survives for b in branches)
        self.survivors[keep] += 1
        line = f"{self.name} {label}: " + " | ".join(b.show() for b in branches)
        print(line, flush=True)
        trouble = [p for b in branches for p in b.problems]
        if keep != 1:
            trouble.append(f"{keep} branches keep the stream")
        for b in branches:
            self.outcomes[b.outcome()] += 1
            for kind, _ in b.problems:
                self.problems[kind] += 1
        if keep != 1:
            self.problems[f"survivors={keep}"] += 1
        if trouble:
            seen = "\n".join(f"    gw{b.gateway} status {b.status} header {b.header!r} end {b.end}: "
                             f"{b.transcript[:600]!r}" for b in branches)
            self.bad.append(f"{line}\n  {trouble}\n{seen}")

    def summary(self) -> str:
        return (f"{self.name}: {self.n} rounds, {2 * self.n} branches; silent {self.problems['silent']}, "
                f"stalled {self.problems['stalled']}, survivors per round {dict(sorted(self.survivors.items()))}, "
                f"outcomes {dict(self.outcomes.most_common())}, problems {dict(self.problems.most_common())}")

    def verdict(self) -> None:
        print(self.summary(), flush=True)
        assert not self.bad, f"{self.summary()}\n{len(self.bad)} bad rounds, the first ones:\n" + \
            "\n".join(self.bad[:5])


def fork_round(s: Stack, rng: random.Random, i: int, gateways: tuple[int, int], max_delay_ms: float,
               window_s: float, keep_s: float) -> tuple[str, list[Branch]]:
    """One round: a session through gateway A, a stream of 3 events, two resumes of one cursor."""
    kind = "request" if i % 2 == 0 else "get"
    c = h.Client(port=s.envoy_ports[0], timeout=5.0)
    c.initialize()
    if kind == "request":
        st = c.call_tool("ledger_append", {"entry": f"fork-{i}", "steps": 2, "step_ms": 1})
    else:
        st = c.get_stream(limit=3)
    evs = st.read_all()
    st.close()
    assert st.status == 200 and len(evs) == 3 and not st.reset, (kind, st.status, evs)
    at = CURSORS[(i // 2) % len(CURSORS)]  # each kind of stream meets every cursor
    cursor = evs[at].id
    time.sleep(SETTLE_S)
    delay = rng.uniform(0, max_delay_ms) / 1000
    start = time.monotonic() + 0.01
    deadline = start + max_delay_ms / 1000 + window_s
    branches = [Branch(gateways[0]), Branch(gateways[1], delay * 1000)]
    threads = [threading.Thread(target=resume, args=(c.session, s.envoy_ports[b.gateway], cursor,
                                                      start + b.delay_ms / 1000, deadline, b))
               for b in branches]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=window_s + 15)
    for b in branches:
        check(b, cursor, deadline, keep_s)
    return f"#{i} {kind} cursor {at + 1}/3", branches


def test_a_fork_across_two_gateways(forks):
    """50 rounds, one resume through each gateway, the second 0-50 ms after the first."""
    with_extension(forks, False)
    rng, rounds = random.Random(1), Rounds("two gateways")
    for i in range(50):
        rounds.add(*fork_round(forks, rng, i, (0, 1), 50, window_s=1.0, keep_s=0.4))
    rounds.verdict()


@pytest.mark.parametrize("extension", [False, True], ids=["relayed", "asserted"])
def test_a_fork_through_one_gateway(forks, extension):
    """200 rounds through one gateway, the second resume 0-2 ms after the first; with the replica's
    contiguity extension (guard `contiguity: asserted`) and without it (`relayed`)."""
    with_extension(forks, extension)
    rng, rounds = random.Random(2), Rounds(f"one gateway, {'asserted' if extension else 'relayed'}")
    for i in range(200):
        rounds.add(*fork_round(forks, rng, i, (0, 0), 2, window_s=0.5, keep_s=0.25))
    rounds.verdict()
