"""Measure the guard's fail-closed latency when the shared store (Redis) is down.

    E2E_PORT_OFFSET=1000 PYTHONPATH=tools .venv/bin/python bench/measure_redis_failclosed.py [--n 200]

Starts 3 naive replicas, redis-server, one `mcp-ownership --store redis://…` and one Envoy
with the guard (callout timeout 250 ms), all on 127.0.0.1 (ports shifted by E2E_PORT_OFFSET),
opens a session and a GET stream, then times N sequential resumes (client-observed, request
sent → response headers) in three states:

  up       Redis answering: every resume continues at the owner (the baseline);
  stopped  redis-server killed: connection refused, the service answers 503 at once;
  frozen   redis-server SIGSTOPped: connections hang, the service's store timeout
           (--store-timeout-ms, 150 ms) decides.

Every refused resume must be `Mcp-Resume: restarted; reason=ownership_unavailable`. Prints
p50 / p95 / max per state. Every process is stopped by pid at the end.
"""
from __future__ import annotations

import argparse
import os
import signal
import statistics
import tempfile
import time
from pathlib import Path

from stack.client import Client
from stack.envoy import Envoy, envoy_config
from stack.procs import HOST, REDIS_PORT, REPLICA_PORTS, Proc
from stack.services import start_ownership, start_redis, start_replica

GUARD_HEADER = "mcp-resume"


def time_resumes(session: str, cursor: str, n: int, want_header: str | None) -> list[float]:
    out = []
    for _ in range(n):
        c = Client()
        c.session = session
        t0 = time.perf_counter()
        r = c.get_stream(last_event_id=cursor)
        took = time.perf_counter() - t0
        header = r.header(GUARD_HEADER)
        r.close()
        if r.status != 200 or header != want_header:
            raise SystemExit(f"unexpected answer: {r.status} {header!r} (wanted {want_header!r})")
        out.append(took * 1000)
    return out


def report(name: str, ms: list[float]) -> None:
    s = sorted(ms)
    p95 = s[min(len(s) - 1, int(len(s) * 0.95))]
    print(f"{name:8s} n={len(s)}  p50 {statistics.median(s):7.1f} ms  p95 {p95:7.1f} ms  max {s[-1]:7.1f} ms")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=200)
    args = ap.parse_args()
    procs: list[Proc] = []
    redis = None
    with tempfile.TemporaryDirectory() as state:
        try:
            for i, p in enumerate(REPLICA_PORTS):
                procs.append(start_replica(p, f"r{i + 1}", Path(state), ring=16))
            redis = start_redis()
            procs.append(start_ownership(extra=["--store", f"redis://{HOST}:{REDIS_PORT}"]))
            cfg = envoy_config(guard=True, plugin_overrides={"retention": 16})
            procs.append(Envoy("envoy-measure", cfg).start())
            c = Client()
            c.initialize()
            s = c.get_stream()
            evs = s.read(3)
            s.close()
            time.sleep(0.3)
            # Continuing with the same cursor again and again is fine: nothing supersedes it.
            report("up", time_resumes(c.session, evs[-1].id, args.n, None))
            os.kill(redis.proc.pid, signal.SIGSTOP)
            time.sleep(0.2)
            try:
                report("frozen", time_resumes(c.session, evs[-1].id, args.n,
                                              "restarted; reason=ownership_unavailable"))
            finally:
                os.kill(redis.proc.pid, signal.SIGCONT)
            redis.stop()
            time.sleep(0.2)
            report("stopped", time_resumes(c.session, evs[-1].id, args.n,
                                           "restarted; reason=ownership_unavailable"))
        finally:
            for p in reversed(procs):
                p.stop()
            if redis is not None:
                redis.stop()


if __name__ == "__main__":
    main()
