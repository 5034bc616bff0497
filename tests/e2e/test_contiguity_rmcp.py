"""Contiguity assertions (docs/contiguity-extension.md) with a real rmcp 3.11 server (tests/rmcp-replica).

The replica runs rmcp's `EventStore` interface on a ring of 100 events per stream
(`--event-store ring:100`), with or without the Rust adapter (adapters/rust, `,contiguity`), behind
Envoy without the guard, with the guard in `relayed` mode and in `asserted` mode. The scenario is
test_contiguity.py's, reused as is: a client reads notifications 1-3 of its standalone GET stream and
goes away; the server produces 5 more (short absence) or 150 (long absence: the ring evicts the cursor
and its successors); the client resumes with its last event id. The expected outcome of every row is
the one the TypeScript and Python SDKs give.
"""
from __future__ import annotations

import shutil

import pytest

import harness as h
from stack.topology import running
from test_contiguity import OneReplica, check_outcome, scenario

STORE_LIMIT = 100
RESULTS: list[dict] = []


class OneRmcpReplica(OneReplica):
    """test_contiguity.py's stack, with an rmcp replica in place of the SDK servers."""

    def __init__(self, stack):
        super().__init__(stack)
        self.state_dir = h.RUNS / "rmcp-contiguity"

    def use(self, adapter: bool, mode: str | None) -> None:
        super().use("rmcp", adapter, mode)

    def start_replica(self, kind: str, adapter: bool) -> h.Proc:
        shutil.rmtree(self.state_dir, ignore_errors=True)
        store = f"ring:{STORE_LIMIT}" + (",contiguity" if adapter else "")
        return h.Proc(f"rmcp-contiguity{'-adapter' if adapter else ''}",
                      [h.binary("rmcp-replica"), "--listen", f"{h.HOST}:{self.port}", "--name", "r1",
                       "--state-dir", self.state_dir, "--event-store", store],
                      port=self.port).start()


@pytest.fixture(scope="module")
def one(stack):
    yield from running(OneRmcpReplica(stack))
    if RESULTS:
        print("\n| adapter | guard | absence | outcome |\n| --- | --- | --- | --- |")
        for r in RESULTS:
            print(f"| {'yes' if r['adapter'] else 'no'} | {r['mode'] or 'none'} | {r['absence']} | "
                  f"{r['outcome']} |")


CASES = [(adapter, mode, absence)
         for adapter in (False, True) for mode in (None, "relayed", "asserted") for absence in ("short", "long")]


@pytest.mark.parametrize("adapter,mode,absence", CASES,
                         ids=[f"rmcp-{'adapter' if a else 'plain'}-{m or 'noguard'}-{ab}" for a, m, ab in CASES])
def test_rmcp_resume_after_absence(one, adapter, mode, absence):
    one.use(adapter, mode)
    out = scenario("rmcp", absence)
    RESULTS.append({"adapter": adapter, "mode": mode, "absence": absence, **out})
    check_outcome(out, adapter, mode, absence)
