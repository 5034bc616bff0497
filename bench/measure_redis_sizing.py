"""Measure what the shared store costs in Redis: bytes per session, per incarnation, per event.

    E2E_PORT_OFFSET=1000 PYTHONPATH=tools .venv/bin/python bench/measure_redis_sizing.py [--sessions 1000]

Starts redis-server and `mcp-ownership --store redis://…` on 127.0.0.1 (ports shifted by
E2E_PORT_OFFSET), writes records through the service's own HTTP API (the code path the guard
uses), then reads `MEMORY USAGE <key> SAMPLES 0` on real keys (exact, every element counted)
and the growth of `INFO memory` used_memory per session. Every process is stopped by pid.

Profiles:
  small   one GET stream, 16 events, ids like the naive replica's (`e123`)
  sdk     one GET stream + one request stream, 64 + 4 events, 45-byte ids like an SDK event
          store's (`<stream uuid>_<n>`)
  full    one GET stream with a full default window: 4096 events, 45-byte ids
"""
from __future__ import annotations

import argparse
import random
import subprocess
import uuid

from stack.client import http_json
from stack.procs import HOST, OWNERSHIP_PORT, REDIS_PORT
from stack.services import start_ownership, start_redis


def cli(*args: str) -> str:
    out = subprocess.run(["redis-cli", "-h", HOST, "-p", str(REDIS_PORT), *args],
                         check=True, capture_output=True, text=True, timeout=10)
    return out.stdout.strip()


def used_memory() -> int:
    for line in cli("INFO", "memory").splitlines():
        if line.startswith("used_memory:"):
            return int(line.split(":")[1])
    raise SystemExit("no used_memory in INFO")


def post(records: list[dict]) -> None:
    status, body = http_json("POST", OWNERSHIP_PORT, "/v1/records", {"records": records}, timeout=10)
    if status != 200:
        raise SystemExit(f"records refused: {status} {body}")


def session_records(profile: str, n_events_override: int | None = None) -> tuple[str, list[dict], list[str]]:
    sess = uuid.uuid4().hex
    owner = "10.0.0.7:8080"
    incs = [uuid.uuid4().hex[:16]]
    recs: list[dict] = [{"type": "session_open", "session": sess, "version": "2025-06-18"}]
    if profile == "small":
        streams = [(incs[0], "get", 16, lambda n: f"e{1000 + n}")]
    else:
        stream_id = str(uuid.uuid4())
        n = 64 if profile == "sdk" else 4096
        streams = [(incs[0], "get", n, lambda k, sid=stream_id: f"{sid}_{k:08d}")]
        if profile == "sdk":
            incs.append(uuid.uuid4().hex[:16])
            rid = str(uuid.uuid4())
            streams.append((incs[1], "request", 4, lambda k, sid=rid: f"{sid}_{k:08d}"))
    for inc, kind, n, mk in streams:
        recs.append({"type": "stream_open", "session": sess, "incarnation": inc, "kind": kind,
                     "owner": owner, "retention": 0, "supersedes": kind == "get", "opened_ms": 1764460800000})
        for first in range(1, n + 1, 1000):
            last = min(n, first + 999)
            recs.append({"type": "events", "session": sess, "incarnation": inc, "first_seq": first,
                         # As the guard records them: the id, a LF, the content digest (16 hex).
                         "ids": [f"{mk(k)}\n{random.getrandbits(64):016x}" for k in range(first, last + 1)]})
    return sess, recs, incs


def measure(profile: str, sessions: int) -> None:
    cli("FLUSHALL")
    base = used_memory()
    sample = None
    batch: list[dict] = []
    for i in range(sessions):
        sess, recs, incs = session_records(profile)
        if sample is None:
            sample = (sess, incs)
        batch.extend(recs)
        size = sum(len(r.get("ids", ())) for r in batch) * 60 + len(batch) * 200
        if size > 400_000 or i == sessions - 1:
            post(batch)
            batch = []
    grown = used_memory() - base
    sess, incs = sample
    k = f"mrg:{{{sess}}}"
    usage = {name: int(cli("MEMORY", "USAGE", key, "SAMPLES", "0") or 0)
             for name, key in [("session hash :s", f"{k}:s"), ("incarnation set :n", f"{k}:n")]
             + [(f"incarnation {j} hash :i", f"{k}:i:{inc}") for j, inc in enumerate(incs)]
             + [(f"incarnation {j} window :w", f"{k}:w:{inc}") for j, inc in enumerate(incs)]}
    events = [int(cli("HLEN", f"{k}:w:{inc}")) for inc in incs]
    print(f"\nprofile {profile}: {sessions} sessions, events per incarnation {events}")
    for name, b in usage.items():
        print(f"  MEMORY USAGE {name:24s} {b:8d} B")
    per_session_keys = usage["session hash :s"] + usage["incarnation set :n"]
    print(f"  per session (hash + set)          {per_session_keys:8d} B")
    for j in range(len(incs)):
        inc_bytes = usage[f'incarnation {j} hash :i'] + usage[f'incarnation {j} window :w']
        print(f"  incarnation {j}: hash + window      {inc_bytes:8d} B "
              f"({usage[f'incarnation {j} window :w'] / max(events[j], 1):.1f} B per recorded event)")
    print(f"  used_memory growth per session    {grown / sessions:8.0f} B (all keys, the index, allocator)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sessions", type=int, default=1000)
    args = ap.parse_args()
    redis = own = None
    try:
        redis = start_redis()
        own = start_ownership(extra=["--store", f"redis://{HOST}:{REDIS_PORT}"])
        print(f"redis-server {cli('INFO', 'server').split('redis_version:')[1].split()[0]}, "
              f"keys measured with: redis-cli -p {REDIS_PORT} MEMORY USAGE <key> SAMPLES 0")
        measure("small", args.sessions)
        measure("sdk", args.sessions)
        measure("full", max(1, args.sessions // 20))
    finally:
        for p in (own, redis):
            if p is not None:
                p.stop()


if __name__ == "__main__":
    main()
