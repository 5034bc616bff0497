"""The naive replica in "keep producing while away" mode (`--produce-while-away`): the silent resume into
a later part of the stream, without the guard and with it in `relayed` mode (the documented limit), and the
explicit `unasserted` signal with the guard in `asserted` mode. The replica has no contiguity extension."""
from __future__ import annotations

import json
import shutil
import time

import pytest

import harness as h
from test_contiguity import read_events

RING = 16
AWAY = 40  # more than the ring holds
TICK_MS = 20


@pytest.fixture(scope="module")
def naive_away(stack, tmp_path_factory):
    """One naive replica that keeps producing while away, on the first replica port (borrowed from `stack`)."""
    stack.vacate()
    stack.ensure_ownership()
    state = tmp_path_factory.mktemp("naive-away")
    port = h.REPLICA_PORTS[0]
    p = h.Proc("replica-away", [h.BIN / "naive-replica", "--listen", f"{h.HOST}:{port}", "--name", "r1",
                                "--state-dir", state, "--ring", RING, "--tick-ms", TICK_MS,
                                "--produce-while-away", AWAY], port=port).start()
    envoys: dict = {}
    try:
        yield port, envoys
    finally:
        for e in envoys.values():
            e.stop()
        p.stop()
        shutil.rmtree(state, ignore_errors=True)


def envoy_for(envoys: dict, port: int, mode: str | None) -> h.Envoy:
    for k, e in list(envoys.items()):
        if k != mode:
            e.stop()
            del envoys[k]
    if mode not in envoys:
        cfg = h.envoy_config(guard=mode is not None, replica_ports=[port],
                             plugin_overrides={"retention": RING, "contiguity": mode} if mode else None)
        envoys[mode] = h.Envoy(f"envoy-away-{mode or 'noguard'}", cfg).start()
    return envoys[mode]


def ns(events) -> list[tuple[int, int]]:
    out = []
    for e in events:
        if e.event == "message" and e.data.strip():
            d = json.loads(e.data)["params"]["data"]
            out.append((d["stream"], d["n"]))
    return out


@pytest.mark.parametrize("mode", [None, "relayed", "asserted"])
def test_resume_after_the_replica_produced_while_away(naive_away, mode):
    port, envoys = naive_away
    envoy_for(envoys, port, mode)
    c = h.Client(version="2025-06-18")
    c.initialize()
    g = c.get_stream()
    first = read_events(g, 3, 5)
    g.close()
    (stream, last), cursor = ns(first)[2], first[2].id
    assert last == 3
    time.sleep(AWAY * TICK_MS / 1000 + 0.5)  # the replica goes on, then stops
    r = c.get_stream(last_event_id=cursor, limit=3)
    got = read_events(r, 3, 3)
    r.close()
    control = [json.loads(e.data)["reason"] for e in got if e.event == "mcp-resume"]
    print(mode, "->", control or ns(got)[:3])
    if mode == "asserted":
        assert control == ["unasserted"], got
        assert got[0].event == "mcp-resume", "the signal comes before any event"
    else:
        # Silent: no signal, and the first event is not the cursor's successor.
        assert control == [] and r.header("mcp-resume") is None
        assert ns(got) and ns(got)[0] != (stream, last + 1), got
