#!/usr/bin/env python3
"""`make bench-scale`: the scale figures, from one run, written to bench/SCALE.md.

S1  ownership decisions/s: a local Redis Cluster (3 masters + 3 replicas) against one Redis, same load
    generator (`sse-load ownership`), rounds alternated.
S2  up to 1M stored sessions on one Redis, filled through the records API: bytes per session (INFO memory
    and MEMORY USAGE sampling) and verdict latency at 1k, 10k, 100k, 1M sessions.
S3  many concurrent open SSE streams through one Envoy (the guard, then the floor filter): memory per
    stream (RSS delta / streams) and Envoy CPU per event.
S4  records/s the ownership service takes: guard-shaped `POST /v1/records` batches (256 KiB, `events`
    records of ~64 KiB, bulk streams' ids) from parallel keep-alive connections, on the memory store and
    on one Redis: recorded ids per second, per service CPU-second and per Redis CPU-second.

Reuses bench/run.py (Envoy configurations, the load generator) and the stack package, tools/stack
(processes, the local cluster). Every process is started here and stopped by pid; ports 15000-15999 on
127.0.0.1 only, shifted by E2E_PORT_OFFSET.
Each measurement holds /tmp/bench.lock (flock) so it never overlaps another heavy job.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import fcntl
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import run as bench  # bench/run.py, beside this script
from stack.cluster import RedisCluster
from stack.procs import PORT_OFFSET as P
from stack.procs import Proc, cpu_ticks
from stack.services import start_redis

ROOT = bench.ROOT
HOST = bench.HOST
CLK_TCK = bench.CLK_TCK
OWN_S1_SINGLE, OWN_S1_CLUSTER, OWN_S2, OWN_S3 = 15200 + P, 15201 + P, 15202 + P, 15203 + P
OWN_S4_MEMORY, OWN_S4_REDIS, REDIS_S4 = 15204 + P, 15205 + P, 15381 + P
REDIS_S1, REDIS_S2, CLUSTER_BASE = 15379 + P, 15380 + P, 15400 + P
SSE_UP = 15102 + P
H2_CONNS = 100
PORTS = {"floor": (15020 + P, 15021 + P), "guard": (15030 + P, 15031 + P)}
log = bench.log
COMMANDS: list[str] = []
# /proc/loadavg when each measurement took the lock: the lock keeps out benchmarks, not everything else.
LOADAVG: dict[str, str] = {}


@contextlib.contextmanager
def bench_lock(path, what):
    with open(path, "a") as f:
        t = time.monotonic()
        fcntl.flock(f, fcntl.LOCK_EX)
        log(f"{what}: lock held after {time.monotonic() - t:.0f} s wait")
        LOADAVG[what] = bench.sh("cat /proc/loadavg")
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def redis_info(port, section="memory"):
    out = subprocess.run(["redis-cli", "-h", HOST, "-p", str(port), "info", section], capture_output=True,
                         text=True, timeout=10).stdout
    return {k: v for k, _, v in (line.strip().partition(":") for line in out.splitlines()) if v}


def redis_pipe(port, lines):
    r = subprocess.run(["redis-cli", "-h", HOST, "-p", str(port)], input="\n".join(lines) + "\n",
                       capture_output=True, text=True, timeout=120)
    return r.stdout.splitlines()


def memory_sample(port, n):
    """MEMORY USAGE of n random keys, grouped by key kind (the part after the session base)."""
    keys = [k for k in redis_pipe(port, ["RANDOMKEY"] * n) if k]
    sizes = redis_pipe(port, [f"MEMORY USAGE {k}" for k in keys])
    dbsize = int(redis_pipe(port, ["DBSIZE"])[0])
    kinds: dict[str, list[int]] = {}
    for k, s in zip(keys, sizes):
        if not s.isdigit():
            continue
        parts = k.rsplit(":", 2)
        kind = parts[-1] if len(parts) < 3 or len(parts[-2]) > 1 else parts[-2]
        kinds.setdefault(kind, []).append(int(s))
    total = sum(sum(v) for v in kinds.values())
    count = sum(len(v) for v in kinds.values())
    return {"dbsize": dbsize, "sampled": count, "mean_key_bytes": total / max(count, 1),
            "kinds": {k: {"share": len(v) / max(count, 1), "mean_bytes": sum(v) / len(v)} for k, v in kinds.items()}}


def ownership(run_dir, name, port, store, extra=()):
    # Caps raised for a million sessions; a 500-record batch to a cluster (WAIT 1) on a busy 2-core machine
    # can take longer than the default store timeout, which is sized for one resume, not for bulk loading.
    args = [OWN_BIN, "--listen", f"{HOST}:{port}", "--store", store, "--max-sessions", 4_000_000,
            "--max-store-bytes", 16 << 30, "--store-timeout-ms", 5000, *extra]
    return Proc(name, args, port=port, run_dir=run_dir).start()


def load(port, frm, to, loaders):
    """Fill sessions frm..to through the records API from `loaders` parallel keep-alive connections."""
    t = time.monotonic()
    step = -(-(to - frm) // loaders)
    procs = []
    for k in range(loaders):
        a, b = frm + k * step, min(frm + (k + 1) * step, to)
        if a >= b:
            continue
        cmd = [str(BIN_DIR / "sse-load"), "ownership", "--addr", f"{HOST}:{port}", "--from", a, "--to", b,
               "--secs", 0.01, "--conns", 1]
        procs.append(subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    for p in procs:
        out, err = p.communicate(timeout=1800)
        if p.returncode != 0:
            raise RuntimeError(f"loader: {err.strip()}")
    return time.monotonic() - t


def decide(port, n, secs, pid):
    r, cmd = bench.sse_load(BIN_DIR, ["ownership", "--addr", f"{HOST}:{port}", "--from", n, "--to", n,
                                      "--secs", secs, "--conns", 16, "--pid", pid], secs + 120)
    r["cpu_us_per_decision"] = r["ticks"] * 1e6 / CLK_TCK / max(r["count"], 1)
    return r, cmd


# ---- S1 ----------------------------------------------------------------------------------------

def s1(run_dir, sessions, secs, rounds, lock):
    cl = RedisCluster(CLUSTER_BASE, name="scale")
    procs = []
    try:
        red = start_redis(REDIS_S1, run_dir=run_dir, name="redis-s1")
        procs.append(red)
        cl.start()
        single = ownership(run_dir, "ownership-s1-single", OWN_S1_SINGLE, f"redis://{HOST}:{REDIS_S1}")
        procs.append(single)
        clus = ownership(run_dir, "ownership-s1-cluster", OWN_S1_CLUSTER, cl.url)
        procs.append(clus)
        out = {"sessions": sessions, "secs": secs, "rounds": rounds, "single": [], "cluster": []}
        with bench_lock(lock, "S1"):
            out["load_s"] = {"single": load(OWN_S1_SINGLE, 0, sessions, 2),
                             "cluster": load(OWN_S1_CLUSTER, 0, sessions, 2)}
            for _ in range(rounds):
                for kind, o in (("single", single), ("cluster", clus)):
                    pids = [red.pid] if kind == "single" else list(cl.rss_pids().values())
                    t0 = sum(cpu_ticks(p) for p in pids)
                    r, cmd = decide(o.port, sessions, secs, o.pid)
                    r["redis_cpu_us_per_decision"] = (sum(cpu_ticks(p) for p in pids) - t0) * 1e6 / CLK_TCK \
                        / max(r["count"], 1)
                    out[kind].append(r)
                    log("S1", kind, round(r["rate"]), r["p50_us"], r["p99_us"], r["outcomes"])
        COMMANDS.append("S1: " + bench.rel(cmd).replace(str(clus.pid), "<ownership pid>"))
        for kind in ("single", "cluster"):
            rs = out[kind]
            out[kind + "_median"] = {k: bench.med([r[k] for r in rs]) for k in
                                     ("rate", "p50_us", "p99_us", "cpu_us_per_decision",
                                      "redis_cpu_us_per_decision")}
        return out
    finally:
        for p in reversed(procs):
            p.stop()
        cl.stop()


# ---- S2 ----------------------------------------------------------------------------------------

def s2(run_dir, steps, secs, lock):
    red = start_redis(REDIS_S2, run_dir=run_dir, name="redis-s2")
    procs = [red]
    try:
        own = ownership(run_dir, "ownership-s2", OWN_S2, f"redis://{HOST}:{REDIS_S2}")
        procs.append(own)
        base = int(redis_info(REDIS_S2)["used_memory"])
        out = {"base_used_memory": base, "steps": []}
        prev = 0
        with bench_lock(lock, "S2"):
            for n in steps:
                load_s = load(OWN_S2, prev, n, 2)
                mem = redis_info(REDIS_S2)
                used = int(mem["used_memory"])
                r, cmd = decide(OWN_S2, n, secs, own.pid)
                sample = memory_sample(REDIS_S2, 2000)
                step = {"sessions": n, "load_s": load_s, "load_rate": (n - prev) / load_s,
                        "used_memory": used, "rss": int(mem.get("used_memory_rss", 0)),
                        "bytes_per_session": (used - base) / n,
                        "sampled_bytes_per_session": sample["mean_key_bytes"] * sample["dbsize"] / n,
                        "keys_per_session": sample["dbsize"] / n, "sample": sample,
                        "rate": r["rate"], "p50_us": r["p50_us"], "p99_us": r["p99_us"],
                        "cpu_us_per_decision": r["cpu_us_per_decision"], "outcomes": r["outcomes"],
                        "errors": r["errors"]}
                out["steps"].append(step)
                log("S2", n, f"load {load_s:.0f}s", round(step["bytes_per_session"]), round(r["rate"]),
                    r["p50_us"], r["p99_us"], r["outcomes"])
                prev = n
        COMMANDS.append("S2 load: " + bench.rel([BIN_DIR / "sse-load", "ownership", "--addr", f"{HOST}:{OWN_S2}",
                                                 "--from", "<a>", "--to", "<b>", "--secs", 0.01, "--conns", 1])
                        + " (2 in parallel)")
        COMMANDS.append("S2 verdicts: " + bench.rel(cmd).replace(str(own.pid), "<ownership pid>"))
        return out
    finally:
        for p in reversed(procs):
            p.stop()


# ---- S3 ----------------------------------------------------------------------------------------

def envoy_cfg_scale(kind, guard_wasm, floor_wasm):
    cfg = ENVOY_CFG(kind, guard_wasm, floor_wasm)
    # Envoy's default circuit breakers allow 1024 requests per cluster; open them for this many streams.
    big = {"thresholds": [{"max_connections": 1_000_000, "max_pending_requests": 1_000_000,
                           "max_requests": 1_000_000}]}
    for c in cfg["static_resources"]["clusters"]:
        c["circuit_breakers"] = copy.deepcopy(big)
        # Thousands of streams open at once overflow the upstream's accept backlog; the SYNs dropped are
        # retried after 1 s, longer than the deployment's connect timeout.
        c["connect_timeout"] = "30s"
    return cfg


def s3_one(run_dir, envoy_bin, guard_wasm, floor_wasm, kind, proto, n, rate, secs):
    """A fresh Envoy with `kind`'s filter; n streams over HTTP/1.1 (one connection each) or h2c."""
    e = bench.Envoy(kind, run_dir, envoy_bin, guard_wasm, floor_wasm).start()
    try:
        time.sleep(1.0)
        r0 = bench.rss(e.pid)
        t0 = cpu_ticks(e.pid)
        t = time.monotonic()
        common = ["--addr", f"{HOST}:{e.listener_port}", "--path", f"/mcp?size=256&rate={rate}", "--secs", secs,
                  "--open-secs", 120, "--pid", e.pid, "--header", "x-bench:sse",
                  "--header", "mcp-protocol-version:2025-06-18"]
        if proto == "h1":
            r, cmd = bench.sse_load(BIN_DIR, ["streams", "--conns", n, *common], secs + 300)
        else:
            cmd = [sys.executable, ROOT / "bench" / "h2_streams.py", "--streams", n, "--conns", H2_CONNS, *common]
            p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=secs + 300)
            if p.returncode != 0:
                raise RuntimeError(f"h2_streams: {p.stderr.strip()}")
            r = json.loads(p.stdout)
        open_ticks = cpu_ticks(e.pid) - t0 - r["ticks"]
        r["open_s"] = time.monotonic() - t - r["secs"]
        r["rss_idle"] = r0
        r["bytes_per_stream"] = (r["rss_end"] - r0) / max(r["opened"], 1)
        r["cpu_us_per_event"] = r["ticks"] * 1e6 / CLK_TCK / max(r["events"], 1)
        r["cpu_us_per_open"] = open_ticks * 1e6 / CLK_TCK / max(r["opened"], 1)
        r["events_per_s"] = r["events"] / r["secs"]
        r["core_share"] = r["ticks"] / CLK_TCK / r["secs"]
        nerr = len(r["errors"])
        r["errors"] = r["errors"][:5] + ([f"... {nerr} in all"] if nerr > 5 else [])
        r.pop("windows", None)
        log("S3", kind, proto, r["opened"], round(r["bytes_per_stream"]), round(r["cpu_us_per_event"], 3),
            round(r["events_per_s"]), r["errors"][:2])
        return r, bench.rel(cmd).replace(str(e.pid), "<envoy pid>").replace(str(e.listener_port), "<port>")
    finally:
        e.stop()


def s3(run_dir, envoy_bin, guard_wasm, floor_wasm, streams, h2_streams, rate, secs, lock):
    bench.PORTS.update(PORTS)
    bench.SSE_UP, bench.OWN, bench.JSON_UP = SSE_UP, OWN_S3, SSE_UP
    bench.envoy_cfg = envoy_cfg_scale
    up = Proc("sse-upstream", [BIN_DIR / "sse-upstream", "--listen", f"{HOST}:{SSE_UP}"], port=SSE_UP,
          run_dir=run_dir).start()
    procs = [up]
    out = {"streams": streams, "h2_streams": h2_streams, "h2_connections": H2_CONNS,
           "rate_per_stream": rate, "secs": secs}
    try:
        procs.append(ownership(run_dir, "ownership-s3", OWN_S3, "memory"))
        with bench_lock(lock, "S3"):
            for proto, n in (("h1", streams), ("h2", h2_streams)):
                if not n:
                    continue
                for kind in ("guard", "floor"):
                    r, cmd = s3_one(run_dir, envoy_bin, guard_wasm, floor_wasm, kind, proto, n, rate, secs)
                    out[f"{kind}_{proto}"] = r
                    COMMANDS.append(f"S3 {proto}: " + cmd)
        for proto in ("h1", "h2"):
            g, f = out.get(f"guard_{proto}"), out.get(f"floor_{proto}")
            if g and f:
                out[f"guard_minus_floor_bytes_per_stream_{proto}"] = g["bytes_per_stream"] - f["bytes_per_stream"]
                out[f"guard_over_floor_cpu_per_event_{proto}"] = g["cpu_us_per_event"] / max(f["cpu_us_per_event"],
                                                                                             1e-9)
        return out
    finally:
        for p in reversed(procs):
            p.stop()


# ---- report ------------------------------------------------------------------------------------

# ---- S4 ----------------------------------------------------------------------------------------

S4_IDS = 2300  # ids per `events` record: a guard's ~64 KiB record of bulk 100 B events
S4_RECORDS = 4  # records per batch: a guard's 256 KiB batch
S4_ID = "e1234567\n0123456789abcdef"  # a recorded event: a short id and its content digest


def s4_stream(port, conn_no, stop_at, out):
    """One connection posting guard-shaped batches of one bulk stream (its own session and
    incarnation, seqs ever increasing) until `stop_at`; adds (ids applied, batches, latencies)."""
    import http.client
    session = f"{0x5400_0000 + conn_no:032x}"
    inc = f"{conn_no:016x}"
    c = http.client.HTTPConnection(HOST, port, timeout=30)

    def post(records):
        body = ('{"records":[' + ",".join(records) + "]}").encode()
        c.request("POST", "/v1/records", body, {"content-type": "application/json"})
        r = c.getresponse()
        data = r.read()
        if r.status != 200 or b'"rejected"' in data:
            raise RuntimeError(f"records: {r.status} {data[:200]!r}")

    post([json.dumps({"type": "session_open", "session": session, "version": "2025-11-25"}),
          json.dumps({"type": "stream_open", "session": session, "incarnation": inc, "kind": "get",
                      "owner": "127.0.0.1:9101", "retention": 0, "supersedes": True, "opened_ms": 1})])
    ids = json.dumps([S4_ID] * S4_IDS)
    head = f'{{"type":"events","session":"{session}","incarnation":"{inc}","first_seq":'
    seq, n, lat = 1, 0, []
    while time.monotonic() < stop_at:
        recs = []
        for _ in range(S4_RECORDS):
            recs.append(f'{head}{seq},"ids":{ids}}}')
            seq += S4_IDS
        t = time.monotonic()
        post(recs)
        lat.append(time.monotonic() - t)
        n += 1
    c.close()
    out.append((n * S4_RECORDS * S4_IDS, n, lat))


def s4_one(port, pid, redis_pid, conns, secs):
    import threading
    out: list = []
    t0, r0 = cpu_ticks(pid), cpu_ticks(redis_pid) if redis_pid else 0
    start = time.monotonic()
    threads = [threading.Thread(target=s4_stream, args=(port, i, start + secs, out)) for i in range(conns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - start
    ids = sum(o[0] for o in out)
    batches = sum(o[1] for o in out)
    lat = sorted(x for o in out for x in o[2])
    svc_s = (cpu_ticks(pid) - t0) / CLK_TCK
    redis_s = (cpu_ticks(redis_pid) - r0) / CLK_TCK if redis_pid else None
    return {"conns": conns, "secs": wall, "ids": ids, "batches": batches, "ids_per_s": ids / wall,
            "service_cpu_s": svc_s, "ids_per_service_cpu_s": ids / max(svc_s, 1e-9),
            "redis_cpu_s": redis_s, "ids_per_redis_cpu_s": ids / redis_s if redis_s else None,
            "batch_p50_ms": lat[len(lat) // 2] * 1e3 if lat else None,
            "batch_p99_ms": lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1e3 if lat else None}


def s4(run_dir, conns, secs, lock):
    procs = []
    try:
        mem = ownership(run_dir, "ownership-s4-memory", OWN_S4_MEMORY, "memory")
        procs.append(mem)
        red = start_redis(REDIS_S4, run_dir=run_dir, name="redis-s4")
        procs.append(red)
        onr = ownership(run_dir, "ownership-s4-redis", OWN_S4_REDIS, f"redis://{HOST}:{REDIS_S4}")
        procs.append(onr)
        out = {"conns": conns, "ids_per_record": S4_IDS, "records_per_batch": S4_RECORDS}
        with bench_lock(lock, "S4"):
            out["memory"] = s4_one(OWN_S4_MEMORY, mem.pid, None, conns, secs)
            log("S4 memory", {k: v for k, v in out["memory"].items() if "per" in k})
            out["redis"] = s4_one(OWN_S4_REDIS, onr.pid, red.pid, conns, secs)
            log("S4 redis", {k: v for k, v in out["redis"].items() if "per" in k})
        COMMANDS.append(f"S4: bench/scale.py --only s4 (Python posting {S4_RECORDS} x {S4_IDS}-id `events` "
                        f"records per batch from {conns} connections, {secs:.0f} s per store)")
        return out
    finally:
        for p in reversed(procs):
            p.stop()


def f0(x):
    return "—" if x is None else f"{x:,.0f}"


def write_report(res, path):
    m = res["machine"]
    L = []
    a = L.append
    bench.heading(a, "## Scale")
    a(f"Generated by `make bench-scale` (`bench/scale.py`), one run of {', '.join(res.get('sections', []))}: "
      f"{res['started']} UTC, {res['duration_s']:.0f} s. "
      f"Machine: {m['nproc']} cores ({m['cpu']}), {m['memory']}, {m['envoy']}, Linux {m['kernel']}; "
      "every process on 127.0.0.1. Each measurement held `/tmp/bench.lock`; the machine was shared with other "
      "jobs all the same — `/proc/loadavg` as each measurement started: "
      + "; ".join(f"{k} `{v}`" for k, v in sorted(res.get("loadavg", {}).items())) + ".")
    a("")
    s1r = res.get("s1")
    if s1r:
        s, c = s1r["single_median"], s1r["cluster_median"]
        bench.heading(a, "### Ownership decisions/s: Redis Cluster against one Redis")
        a(f"`mcp-ownership` (release) over `--store redis://` (one `redis-server`) and over `--store redis-cluster://` "
          f"(a local cluster, 3 masters + 3 replicas, `redis-cli --cluster create`), each holding "
          f"{s1r['sessions']:,} sessions (one GET incarnation, one event each), asked `/v1/resume` for random "
          f"stored sessions from 16 keep-alive connections in a closed loop, {s1r['secs']:.0f} s per run, "
          f"{s1r['rounds']} rounds alternated; medians.")
        a("")
        bench.table_head(a, "store", "decisions/s", "p50 µs", "p99 µs", "service CPU µs/decision",
                         "Redis CPU µs/decision (all nodes)")
        for name, v in (("one Redis", s), ("Redis Cluster 3+3", c)):
            a(f"| {name} | {f0(v['rate'])} | {f0(v['p50_us'])} | {f0(v['p99_us'])} | "
              f"{v['cpu_us_per_decision']:.1f} | {v['redis_cpu_us_per_decision']:.1f} |")
        a("")
        a(f"Outcomes: one Redis `{s1r['single'][-1]['outcomes']}`, cluster `{s1r['cluster'][-1]['outcomes']}` "
          "(last round).")
        a("")
    s4r = res.get("s4")
    if s4r:
        bench.heading(a, "### Records/s the ownership service takes")
        a(f"`mcp-ownership` (release) taking guard-shaped `POST /v1/records` batches: {s4r['records_per_batch']} "
          f"`events` records of {s4r['ids_per_record']:,} recorded ids each (a guard's 256 KiB batch of a bulk "
          f"stream's ids), one stream per connection, {s4r['conns']} keep-alive connections in a closed loop "
          "from one Python process on the same machine. A recorded id is one relayed event; a bulk 100 B stream "
          "at line rate on one Envoy core relays a few hundred thousand a second.")
        a("")
        bench.table_head(a, "store", "recorded ids/s", "ids per service CPU-second", "ids per Redis CPU-second",
                         "batch p50 ms", "batch p99 ms")
        for name, v in (("memory", s4r["memory"]), ("one Redis", s4r["redis"])):
            per_redis = f0(v["ids_per_redis_cpu_s"]) if v["ids_per_redis_cpu_s"] else "–"
            a(f"| {name} | {f0(v['ids_per_s'])} | {f0(v['ids_per_service_cpu_s'])} | {per_redis} | "
              f"{v['batch_p50_ms']:.1f} | {v['batch_p99_ms']:.1f} |")
        a("")
    s2r = res.get("s2")
    if s2r:
        bench.heading(a, "### Stored sessions: 1k to 1M on one Redis")
        a("Sessions filled through `/v1/records` (batches of 500 records, two keep-alive loaders in parallel); "
          "each session: `session_open`, one GET `stream_open` (retention 64) and one recorded event. After each "
          "step: Redis `INFO memory` (`used_memory` over the empty store, divided by sessions), `MEMORY USAGE` of "
          "2,000 random keys (× `DBSIZE` / sessions), then verdict latency as above (16 connections, closed loop). "
          "`MEMORY USAGE` counts each key's value alone; `used_memory` also counts the keyspace's own entries, "
          "the expiry index and keys shared by all sessions, and is the figure to size Redis by.")
        a("")
        bench.table_head(a, "stored sessions", "load sessions/s", "bytes/session (INFO)",
                         "bytes/session (MEMORY USAGE sample)", "keys/session", "decisions/s", "p50 µs", "p99 µs",
                         "outcomes")
        for st in s2r["steps"]:
            a(f"| {st['sessions']:,} | {f0(st['load_rate'])} | {f0(st['bytes_per_session'])} | "
              f"{f0(st['sampled_bytes_per_session'])} | {st['keys_per_session']:.2f} | {f0(st['rate'])} | "
              f"{f0(st['p50_us'])} | {f0(st['p99_us'])} | `{st['outcomes']}` |")
        last = s2r["steps"][-1]
        first = s2r["steps"][0]
        a("")
        a(f"At {last['sessions']:,} sessions Redis holds {last['used_memory'] / 2**30:.2f} GiB (`used_memory`; RSS "
          f"{last['rss'] / 2**30:.2f} GiB). Verdict p50 {f0(first['p50_us'])} µs at {first['sessions']:,} → "
          f"{f0(last['p50_us'])} µs at {last['sessions']:,} (×{last['p50_us'] / max(first['p50_us'], 1):.2f}); "
          f"p99 {f0(first['p99_us'])} → {f0(last['p99_us'])} µs. Key kinds in the last sample: "
          + ", ".join(f"`{k}` {v['share'] * 100:.0f}% of keys, {v['mean_bytes']:.0f} B"
                      for k, v in sorted(last["sample"]["kinds"].items())) + ".")
        a("")
    s3r = res.get("s3")
    if s3r and (s3r.get("guard_h1") or s3r.get("guard_h2")):
        bench.heading(a, "### Concurrent open SSE streams through one Envoy")
        a(f"One Envoy (`--concurrency 1`), a fresh one per row: the guard (`.wasm`) and the empty proxy-wasm filter "
          f"(the floor), same run. GET streams, each its own session, {s3r['rate_per_stream']} event/s per stream of "
          f"256 B events from `sse-upstream`, held open {s3r['secs']:.0f} s once all were open; upstream HTTP/1.1, "
          f"one connection per stream. Clients over HTTP/1.1 (one connection per stream, as separate MCP clients "
          f"are) and over h2c ({s3r['h2_connections']} connections, streams multiplexed). Memory per stream: "
          "Envoy RSS with every stream open minus RSS idle, over streams; CPU per event: Envoy utime+stime "
          "(`/proc/<pid>/stat`) in the open window over the events the clients counted.")
        a("")
        bench.table_head(a, "filter", "client protocol", "streams open", "Envoy RSS idle MiB", "RSS with streams MiB",
                         "KiB per stream", "events/s", "Envoy CPU µs/event", "Envoy core share",
                         "opening: s, Envoy CPU µs/stream")
        for proto in ("h1", "h2"):
            for name in ("guard", "floor"):
                v = s3r.get(f"{name}_{proto}")
                if not v:
                    continue
                a(f"| {name} | {'HTTP/1.1' if proto == 'h1' else 'h2c'} | {v['opened']:,} | "
                  f"{v['rss_idle'] / 2**20:.1f} | {v['rss_end'] / 2**20:.1f} | {v['bytes_per_stream'] / 1024:.1f} | "
                  f"{f0(v['events_per_s'])} | {v['cpu_us_per_event']:.2f} | {v['core_share']:.2f} | "
                  f"{v['open_s']:.1f}, {v['cpu_us_per_open']:.0f} |")
        a("")
        for proto in ("h1", "h2"):
            d = s3r.get(f"guard_minus_floor_bytes_per_stream_{proto}")
            if d is not None:
                a(f"- {'HTTP/1.1' if proto == 'h1' else 'h2c'}: the guard holds **{d / 1024:.1f} KiB** more per "
                  f"open stream than the floor; CPU per event guard/floor "
                  f"×**{s3r[f'guard_over_floor_cpu_per_event_{proto}']:.2f}**.")
        errs = {k: v["errors"] for k, v in s3r.items() if isinstance(v, dict) and v.get("errors")}
        if errs:
            a(f"- Stream errors: `{errs}`.")
        if s3r.get("requested", 0) > s3r["streams"]:
            a(f"- HTTP/1.1 ran {s3r['streams']:,} streams, not {s3r['requested']:,}: this machine's hard "
              f"`RLIMIT_NOFILE` is {res['nofile']:,} and Envoy holds two descriptors per proxied HTTP/1.1 "
              "stream; the h2c rows hold the full count.")
        a("")
    bench.heading(a, "### What the 2-core machine limits, and what to expect per core")
    a("Load generator, ownership service, Redis (or six cluster nodes) and Envoy share the same 2 cores with "
      "each other and with the machine's other jobs. So the decisions/s above are a floor set by this machine, not "
      "by the design: the closed loops saturate the cores, and their latency (milliseconds) is mostly queueing "
      "behind the other processes; for the same reason the cluster cannot beat one Redis here. The stream rows ran "
      "at a fixed offered rate (1 event/s per stream) that one Envoy core carried with room to spare, so they are "
      "not limited by the cores. Memory figures (bytes per session, KiB per stream) do not depend on the core "
      "count, and CPU time per operation little (contention inflates it somewhat). Throughput per core, from the "
      "CPU time each process spent per operation:")
    a("")
    bench.table_head(a, "component", "CPU µs per operation", "operations/s per core")
    if s1r:
        for name, v in (("ownership service, one Redis", s1r["single_median"]),
                        ("ownership service, Redis Cluster", s1r["cluster_median"])):
            a(f"| {name} (decisions) | {v['cpu_us_per_decision']:.1f} | {f0(1e6 / v['cpu_us_per_decision'])} |")
        for name, v in (("one Redis", s1r["single_median"]), ("Redis Cluster, all nodes", s1r["cluster_median"])):
            a(f"| {name} (decisions) | {v['redis_cpu_us_per_decision']:.1f} | "
              f"{f0(1e6 / max(v['redis_cpu_us_per_decision'], 1e-9))} |")
    if s3r:
        for proto in ("h1", "h2"):
            for name in ("guard", "floor"):
                v = s3r.get(f"{name}_{proto}")
                if v and v["cpu_us_per_event"]:
                    a(f"| Envoy + {name}, {v['opened']:,} open streams ({'HTTP/1.1' if proto == 'h1' else 'h2c'}) "
                      f"(events) | {v['cpu_us_per_event']:.2f} | {f0(1e6 / v['cpu_us_per_event'])} |")
    if s4r:
        for name, v in (("ownership service, memory store", s4r["memory"]),
                        ("ownership service, one Redis", s4r["redis"])):
            a(f"| {name} (recorded ids) | {1e6 / v['ids_per_service_cpu_s']:.2f} | {f0(v['ids_per_service_cpu_s'])} |")
        if s4r["redis"]["ids_per_redis_cpu_s"]:
            v = s4r["redis"]["ids_per_redis_cpu_s"]
            a(f"| one Redis (recorded ids) | {1e6 / v:.2f} | {f0(v)} |")
    a("")
    a("What a deployment should expect:")
    a("")
    if s1r:
        sm, cm = s1r["single_median"], s1r["cluster_median"]
        a(f"- **Decisions.** The ownership service keeps no state of its own over Redis, so it scales out: about "
          f"{f0(1e6 / sm['cpu_us_per_decision'])} decisions/s per service core over one Redis, "
          f"{f0(1e6 / cm['cpu_us_per_decision'])} over a cluster. One Redis "
          f"runs commands on one thread, so one Redis is capped near one core: about "
          f"{f0(1e6 / sm['redis_cpu_us_per_decision'])} decisions/s at the {sm['redis_cpu_us_per_decision']:.0f} µs "
          f"of Redis CPU measured per decision. A cluster spreads sessions over its masters, each a core of its own: "
          f"here the six nodes spent {cm['redis_cpu_us_per_decision']:.0f} µs per decision together, inflated by six "
          "redis-server processes, the service and the load generator contending for 2 cores, so take "
          f"{f0(1e6 / cm['redis_cpu_us_per_decision'])} decisions/s per master core as a floor. On this machine "
          "the cluster answers fewer decisions/s than one Redis: it cannot add cores here, only processes.")
    if s2r:
        last = s2r["steps"][-1]
        first = s2r["steps"][0]
        a(f"- **Stored sessions.** Memory is linear in sessions: about {f0(last['bytes_per_session'])} bytes per "
          f"session (one stream, one event recorded) in `used_memory`, {last['used_memory'] / 2**30:.2f} GiB at "
          f"{last['sessions']:,}; a replica holds a second copy. Size Redis `maxmemory` from this and the "
          f"retention window. Verdict latency does not grow with the store (p50 ×"
          f"{last['p50_us'] / max(first['p50_us'], 1):.2f} from {first['sessions']:,} to {last['sessions']:,}); "
          "its absolute value here (milliseconds) is queueing of 16 closed-loop connections behind a busy 2-core "
          "machine, not the cost of a lookup (`BENCHMARKS.md` B4 has the same load against the embedded store and Redis).")
    if s3r:
        g = s3r.get("guard_h1") or s3r.get("guard_h2")
        if g:
            a(f"- **Open streams.** Memory per open stream is mostly Envoy's own (buffers on both sides, "
              f"{g['bytes_per_stream'] / 1024:.0f} KiB with the guard over HTTP/1.1, of which the guard "
              f"{s3r.get('guard_minus_floor_bytes_per_stream_h1', 0) / 1024:.1f} KiB): plan about "
              f"{g['bytes_per_stream'] * 10_000 / 2**20:.0f} MiB of Envoy memory per 10,000 streams. "
              "CPU goes with events: one Envoy worker core carries about "
              f"{f0(1e6 / g['cpu_us_per_event'])} events/s through the guard at one small event per stream per "
              "second (each event its own read and write), workers scale with `--concurrency`. "
              "The descriptor limit matters before memory or CPU: two per proxied HTTP/1.1 stream, so raise "
              "`LimitNOFILE`/`ulimit -n` well past twice the streams expected per Envoy.")
    if s4r:
        m, r = s4r["memory"], s4r["redis"]
        a(f"- **Records.** One service core takes about {f0(m['ids_per_service_cpu_s'])} recorded ids/s (relayed "
          f"events) on the memory store and {f0(r['ids_per_service_cpu_s'])} over Redis, where one Redis core "
          f"takes about {f0(r['ids_per_redis_cpu_s'])}: a Redis core keeps up with roughly one Envoy core relaying "
          "bulk 100 B events at line rate, the service with several. A guard never falls behind for good: a "
          "stream relayed faster than its records go keeps only its newest window of ids queued "
          "(`ownership.record_window`), so what a store is offered is bounded per stream, not per event.")
    a("")
    bench.heading(a, "### Commands")
    a("```")
    for c in res["commands"]:
        a(c)
    a("```")
    a("")
    notes = ROOT / "bench" / "scale-notes.md"
    if notes.exists():
        a(notes.read_text().strip())
        a("")
    path.write_text("\n".join(L))


def main():
    global BIN_DIR, OWN_BIN, ENVOY_CFG
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin-dir", required=True, type=Path)
    ap.add_argument("--ownership", required=True, type=Path)
    ap.add_argument("--guard-wasm", required=True, type=Path)
    ap.add_argument("--floor-wasm", required=True, type=Path)
    ap.add_argument("--envoy", default=str(ROOT / ".venv" / "bin" / "envoy"))
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--report", required=True, type=Path)
    ap.add_argument("--lock", default="/tmp/bench.lock")
    ap.add_argument("--only", default="s1,s2,s3,s4")
    ap.add_argument("--s1-sessions", type=int, default=10_000)
    ap.add_argument("--s1-secs", type=float, default=8.0)
    ap.add_argument("--s1-rounds", type=int, default=2)
    ap.add_argument("--s2-steps", default="1000,10000,100000,1000000")
    ap.add_argument("--s2-secs", type=float, default=6.0)
    # Each proxied HTTP/1.1 stream costs Envoy two descriptors (client and upstream); see bench/SCALE.md.
    ap.add_argument("--streams", type=int, default=10_000)
    ap.add_argument("--h2-streams", type=int, default=10_000, help="0: no h2c run")
    ap.add_argument("--rate", type=int, default=1)
    ap.add_argument("--s3-secs", type=float, default=20.0)
    ap.add_argument("--s4-conns", type=int, default=4)
    ap.add_argument("--s4-secs", type=float, default=10.0)
    a = ap.parse_args()
    BIN_DIR, OWN_BIN, ENVOY_CFG = a.bin_dir.resolve(), a.ownership.resolve(), bench.envoy_cfg
    bench.BIN_DIR = BIN_DIR
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    a.out.mkdir(parents=True, exist_ok=True)
    run_dir = a.out / "logs"
    run_dir.mkdir(exist_ok=True)
    only = set(a.only.split(","))
    t0 = time.time()
    res = {"started": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "machine": bench.machine(a.envoy),
           "nofile": hard, "sections": sorted(only)}
    results = a.out / "results.json"
    if results.exists():
        # Sections not rerun keep their last figures.
        old = json.loads(results.read_text())
        res.update({k: v for k, v in old.items() if k in ("s1", "s2", "s3", "s4") and k not in only})
        res["loadavg"] = old.get("loadavg", {})
    if "s1" in only:
        res["s1"] = s1(run_dir, a.s1_sessions, a.s1_secs, a.s1_rounds, a.lock)
    if "s2" in only:
        res["s2"] = s2(run_dir, [int(x) for x in a.s2_steps.split(",")], a.s2_secs, a.lock)
    if "s3" in only:
        # Envoy holds two descriptors per proxied HTTP/1.1 stream (client side and upstream side), plus ~100.
        streams = min(a.streams, (hard - 400) // 2 // 500 * 500)
        if streams < a.streams:
            log(f"S3: {a.streams} streams need more than RLIMIT_NOFILE {hard} in Envoy; running {streams}")
        res["s3"] = s3(run_dir, a.envoy, a.guard_wasm.resolve(), a.floor_wasm.resolve(), streams, a.h2_streams, a.rate,
                       a.s3_secs, a.lock)
        res["s3"]["requested"] = a.streams
    if "s4" in only:
        res["s4"] = s4(run_dir, a.s4_conns, a.s4_secs, a.lock)
    res["duration_s"] = time.time() - t0
    kept = json.loads(results.read_text()).get("commands", []) if results.exists() else []
    res["commands"] = sorted(set(COMMANDS + [c for c in kept if c.split(":")[0].split()[0].lower() not in only]))
    res["loadavg"] = {**res.get("loadavg", {}), **LOADAVG}
    results.write_text(json.dumps(res, indent=1))
    write_report(res, a.report)
    log("wrote", a.report)


if __name__ == "__main__":
    main()
