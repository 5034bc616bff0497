#!/usr/bin/env python3
"""`make bench` driver: runs B1-B5 against bare Envoy, the proxy-wasm floor and the guard (and, with
--native-dir, the guard's native build), alternating configurations round by round, and writes
BENCHMARKS.md, results.json and plots.

Every process is started here and stopped by pid (the stack package, tools/stack). Ports: 14000-14999
on 127.0.0.1 only, shifted by E2E_PORT_OFFSET.
Primary figure: Envoy CPU time (utime+stime from /proc/<pid>/stat) per request or event.
"""
from __future__ import annotations

import argparse
import copy
import http.client
import json
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

from stack import envoy as stack_envoy
from stack.envoy import config_holder, envoy_config, guard_filter, hcm
from stack.procs import CLK_TCK, HOST, PORT_OFFSET, ROOT, Proc, cpu_ticks, rss_kib
from stack.services import start_redis

import instructions

P = PORT_OFFSET
BIN_DIR = Path(".")
CONFIGS = ["bare", "floor", "guard"]
PORTS = {"bare": (14010 + P, 14011 + P), "floor": (14020 + P, 14021 + P), "guard": (14030 + P, 14031 + P)}
JSON_UP, SSE_UP, OWN, OWN_B4, REDIS = 14101 + P, 14102 + P, 14200 + P, 14201 + P, 14379 + P
COMMANDS: list[str] = []


def log(*a):
    print("[bench]", *a, file=sys.stderr, flush=True)


def rss(pid):
    return (rss_kib(pid) or 0) * 1024


# ---- Envoy configurations -----------------------------------------------------------------

EXTRA_WASM: dict[str, Path] = {}
# The directory holding libmcp_resume_guard_native.so, when the native column is measured.
NATIVE_DIR: Path | None = None
# The native floors (bench/floor-native, by filter_name): an empty dynamic module and a body copy.
NATIVE_FLOORS = {"native-empty": "empty", "native-copy": "copy"}
# --prev-dir: an earlier build's guards (mcp_resume_guard.wasm, libmcp_resume_guard_native.so) with that build's
# own ownership service (mcp-ownership, on OWN_PREV: the wire may differ), measured in B3 beside this tree's,
# alternating round by round. Each configuration here names the one of this tree it stands beside.
PREV_DIR: Path | None = None
OWN_PREV = 14202 + P
PREV_CONFIGS = {"guard-prev": "guard", "native-prev": "native"}


def envoy_cfg(kind, guard_wasm, floor_wasm, ports=None, flush_ms=None):
    # envoy.yaml reads its key from MCP_GUARD_KEY_1; the bench signs with the stack's literal test key.
    port, admin = ports or PORTS[kind]
    ports = {"listener_port": port, "admin_port": admin, "replica_ports": [JSON_UP],
             "ownership_ports": [OWN_PREV if kind in PREV_CONFIGS else OWN]}
    wasm = PREV_DIR / "mcp_resume_guard.wasm" if kind == "guard-prev" and PREV_DIR else EXTRA_WASM.get(kind, guard_wasm)
    cfg = envoy_config(guard=kind != "bare", base="envoy.yaml", wasm=wasm, **ports)
    hcm_ = hcm(cfg)
    g = guard_filter(cfg)
    if flush_ms is not None and g is not None:
        pc = json.loads(config_holder(g)["value"])
        pc["ownership"]["flush_ms"] = flush_ms
        config_holder(g)["value"] = json.dumps(pc)
    if kind in ("native", "native-prev"):
        # The dynamic-module filter of envoy/envoy-native.yaml with this config's plugin JSON.
        n = guard_filter(envoy_config(base="envoy-native.yaml", **ports))
        config_holder(n)["value"] = config_holder(g)["value"]
        hcm_["http_filters"] = [n if f is g else f for f in hcm_["http_filters"]]
    elif kind in NATIVE_FLOORS:
        # bench/floor-native (libbench_floor_native.so, next to the native guard): its filter_name is the mode.
        n = copy.deepcopy(guard_filter(envoy_config(base="envoy-native.yaml", **ports)))
        n["name"] = "bench_floor"
        n["typed_config"]["dynamic_module_config"]["name"] = "bench_floor_native"
        n["typed_config"]["filter_name"] = NATIVE_FLOORS[kind]
        config_holder(n)["value"] = ""
        hcm_["http_filters"] = [n if f is g else f for f in hcm_["http_filters"]]
    elif kind == "floor" or (kind in EXTRA_WASM and not kind.startswith("guard")):
        c = g["typed_config"]["config"]
        g["name"] = "bench_floor"
        c.update({"name": "bench_floor", "root_id": "bench_floor"})
        c["vm_config"].update({"vm_id": "bench_floor"})
        c["vm_config"]["code"]["local"]["filename"] = str(EXTRA_WASM.get(kind, floor_wasm))
        c.pop("configuration", None)
    elif kind.endswith("-nopath"):
        # Experiments: the guard loaded but acting on no path (its fixed per-request cost).
        conf = g["typed_config"]["config"]["configuration"]
        pc = json.loads(conf["value"])
        pc["mcp_paths"] = ["/not-mcp"]
        conf["value"] = json.dumps(pc)
    # B2 streams go to the SSE upstream, selected by a request header.
    vh = hcm_["route_config"]["virtual_hosts"][0]
    default = vh["routes"][0]
    sse_route = copy.deepcopy(default)
    sse_route["match"] = {"prefix": "/", "headers": [{"name": "x-bench",
                                                      "string_match": {"exact": "sse"}}]}
    sse_route["route"]["cluster"] = "bench_sse"
    vh["routes"] = [sse_route, default]
    clusters = cfg["static_resources"]["clusters"]
    sse = copy.deepcopy(next(c for c in clusters if c["name"] == "mcp_replicas"))
    sse["name"] = sse["load_assignment"]["cluster_name"] = "bench_sse"
    stack_envoy.set_endpoints(sse, [(HOST, SSE_UP)])
    clusters.append(sse)
    return cfg


def Envoy(kind, run_dir, envoy_bin, guard_wasm, floor_wasm, ports=None, name=None, flush_ms=None):
    """Envoy with configuration `kind` (bare, floor, guard, native, a native floor or an extra .wasm),
    not started."""
    e = stack_envoy.Envoy(name or f"envoy-{kind}", envoy_cfg(kind, guard_wasm, floor_wasm, ports, flush_ms),
                          run_dir=run_dir,
                          envoy_bin=envoy_bin, native_dir=PREV_DIR if kind == "native-prev" else NATIVE_DIR)
    e.kind = kind
    return e


# ---- load runners -------------------------------------------------------------------------

WRK_POST = """wrk.method = "POST"
wrk.body = '{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}'
wrk.headers["content-type"] = "application/json"
wrk.headers["accept"] = "application/json, text/event-stream"
wrk.headers["mcp-session-id"] = "bench-session"
wrk.headers["mcp-protocol-version"] = "2025-06-18"
"""
# Every GET opens a stream of its own session (as clients do), so the guard's per-session work is paid.
WRK_GET = """wrk.method = "GET"
wrk.headers["accept"] = "text/event-stream"
wrk.headers["mcp-protocol-version"] = "2025-06-18"
local n = 0
request = function()
  n = n + 1
  wrk.headers["mcp-session-id"] = "bench-session-" .. n
  return wrk.format()
end
"""

UNITS = {"us": 1.0, "ms": 1e3, "s": 1e6}


def parse_wrk(text):
    out = {}
    m = re.search(r"(\d+) requests in ([\d.]+)(\w+)", text)
    out["requests"] = int(m.group(1)) if m else 0
    m = re.search(r"Requests/sec:\s+([\d.]+)", text)
    out["rps"] = float(m.group(1)) if m else 0.0
    for p in ("50", "90", "99"):
        m = re.search(rf"^\s+{p}%\s+([\d.]+)(us|ms|s)\s*$", text, re.M)
        out[f"p{p}_us"] = float(m.group(1)) * UNITS[m.group(2)] if m else None
    m = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
    out["non2xx"] = int(m.group(1)) if m else 0
    m = re.search(r"Socket errors: (.*)", text)
    out["socket_errors"] = m.group(1) if m else ""
    return out


def run_wrk(envoy, script, secs, conns):
    cmd = ["wrk", "-t1", f"-c{conns}", f"-d{secs}s", "--latency", "-s", str(script),
           f"http://{HOST}:{envoy.listener_port}/mcp"]
    c0 = cpu_ticks(envoy.pid)
    t = subprocess.run(cmd, capture_output=True, text=True, timeout=secs + 30)
    c1 = cpu_ticks(envoy.pid)
    r = parse_wrk(t.stdout)
    r["ticks"] = c1 - c0
    r["cpu_us_per_req"] = (c1 - c0) * 1e6 / CLK_TCK / max(r["requests"], 1)
    return r, cmd


def sse_load(bin_dir, args, timeout):
    cmd = [str(bin_dir / "sse-load"), *[str(a) for a in args]]
    t = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if t.returncode != 0:
        raise RuntimeError(f"{shlex.join(cmd)}: {t.stderr.strip()}")
    return json.loads(t.stdout), cmd


def rel(cmd):
    s = shlex.join(str(c) for c in cmd)
    return s.replace(str(ROOT) + "/", "")


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


# ---- HTTP helpers for B3 setup ------------------------------------------------------------

def http_req(port, method, path, headers=None, body=None):
    c = http.client.HTTPConnection(HOST, port, timeout=10)
    c.request(method, path, body=body, headers=headers or {})
    r = c.getresponse()
    data = r.read()
    hs = {k.lower(): v for k, v in r.getheaders()}
    c.close()
    return r.status, hs, data


# ---- benchmarks ---------------------------------------------------------------------------

def b1(envoys, rounds, secs, run_dir):
    (run_dir / "post.lua").write_text(WRK_POST)
    (run_dir / "get.lua").write_text(WRK_GET)
    res = {}
    for kind, script in (("post_json", run_dir / "post.lua"), ("get_sse", run_dir / "get.lua")):
        runs = {c: [] for c in CONFIGS}
        for _ in range(rounds):
            for c in CONFIGS:
                r, cmd = run_wrk(envoys[c], script, secs, 8)
                runs[c].append(r)
        COMMANDS.append(f"B1 {kind}: " + rel(cmd).replace(str(PORTS['guard'][0]), "<port>"))
        # Latency at a fixed rate well below saturation (wrk's closed loop measures queueing).
        lat = {c: [] for c in CONFIGS}
        method = ["--method", "POST", "--body", '{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}'] \
            if kind == "post_json" else []
        for _ in range(rounds):
            for c in CONFIGS:
                e = envoys[c]
                r, lcmd = sse_load(BIN_DIR, ["rate", "--addr", f"{HOST}:{e.listener_port}", "--path", "/mcp", "--rps", 2000,
                                             "--secs", secs, "--conns", 4, "--pid", e.pid, *method,
                                             "--header", "mcp-session-id:bench-session",
                                             "--header", "mcp-protocol-version:2025-06-18"], secs + 60)
                lat[c].append(r)
        COMMANDS.append(f"B1 {kind} latency: " + rel(lcmd).replace(str(e.pid), "<envoy pid>")
                        .replace(str(e.listener_port), "<port>"))
        res[kind] = summarize(runs, "cpu_us_per_req", extra=("rps", "p50_us", "p99_us"))
        for c in CONFIGS:
            res[kind][c]["fixed_p50_us"] = med([r["p50_us"] for r in lat[c]])
            res[kind][c]["fixed_p99_us"] = med([r["p99_us"] for r in lat[c]])
        res[kind]["fixed_p99_ratio"] = med([g["p99_us"] / f["p99_us"] for g, f in zip(lat["guard"], lat["floor"])
                                            if f["p99_us"]])
        res[kind]["runs"] = runs
        res[kind]["latency_runs"] = lat
        log("B1", kind, {c: round(res[kind][c]["cpu_us_per_req"], 2) for c in CONFIGS})
    return res


def summarize(runs, key, extra=()):
    out = {}
    for c, rs in runs.items():
        out[c] = {key: med([r[key] for r in rs])}
        for e in extra:
            out[c][e] = med([r.get(e) for r in rs])
    # Ratios round by round, then the median (the pairs ran back to back).
    for a, b in (("guard", "floor"), ("floor", "bare"), ("guard", "bare"), ("copy", "floor"), ("guard", "copy"),
                 ("guard", "headers"), ("native", "floor"), ("native", "guard"), ("native", "bare"),
                 *[(x, "floor") for x in EXTRA_WASM if x != "copy"]):
        if a in runs and b in runs:
            ratios = [x[key] / y[key] for x, y in zip(runs[a], runs[b]) if x[key] and y[key]]
            out[f"{a}/{b}"] = med(ratios)
            # The spread over rounds: what one CPU ratio alone can tell.
            out[f"{a}/{b}_range"] = [min(ratios), max(ratios)] if ratios else None
    return out


# Extra bytes per million body bytes the guard writes (ids rewritten into longer cursors), by event size:
# the copy fixtures write back as many (`x-bench-pad-ppm`, bench/floor-filter and bench/floor-native).
PAD_PPM: dict[int, int] = {}


def calibrate_pad(envoys, sizes, events=200):
    """PAD_PPM from one stream per size through the guard and bare Envoy; then checks that the copy
    fixture writes back as many bytes as the guard (within 1 %)."""
    out = {}
    for size in sizes:
        _, g = instructions.b2_stream(envoys["guard"].listener_port, size, 0, events, 0)
        _, b = instructions.b2_stream(envoys["bare"].listener_port, size, 0, events, 0)
        PAD_PPM[size] = max(round((g - b) * 1e6 / b), 0)
        out[str(size)] = {"guard_bytes_per_event": g / events, "bare_bytes_per_event": b / events,
                          "pad_ppm": PAD_PPM[size]}
        if "copy" in envoys:
            _, c = instructions.b2_stream(envoys["copy"].listener_port, size, 0, events, PAD_PPM[size])
            out[str(size)]["copy_bytes_per_event"] = c / events
            if abs(c - g) > 0.01 * g:
                raise RuntimeError(f"copy fixture writes {c} bytes for the guard's {g} ({size} B events)")
    log("pad", out)
    return out


def b2(envoys, bin_dir, rounds, secs, sizes, mode, conns):
    res = {}
    rate = 1000 if mode == "paced" else 0
    configs = [c for c in CONFIGS + ["copy"] if c in envoys]
    for size in sizes:
        runs = {c: [] for c in configs}
        for _ in range(rounds):
            for c in configs:
                e = envoys[c]
                r, cmd = sse_load(bin_dir, ["streams", "--addr", f"{HOST}:{e.listener_port}",
                                            "--path", f"/mcp?size={size}&rate={rate}",
                                            "--conns", conns, "--secs", secs, "--pid", e.pid,
                                            "--header", "x-bench:sse",
                                            "--header", f"x-bench-pad-ppm:{PAD_PPM.get(size, 0)}",
                                            "--header", "mcp-protocol-version:2025-06-18"], secs + 30)
                if r["errors"] or r["opened"] != conns:
                    raise RuntimeError(f"B2 {mode} {size} {c}: {r}")
                r["cpu_us_per_event"] = r["ticks"] * 1e6 / CLK_TCK / max(r["events"], 1)
                r["events_per_s"] = r["events"] / r["secs"]
                r["mb_per_s"] = r["bytes"] / r["secs"] / 1e6
                runs[c].append(r)
        COMMANDS.append(f"B2 {mode} {size} B: " + rel(cmd).replace(str(e.pid), "<envoy pid>")
                        .replace(str(e.listener_port), "<port>"))
        res[str(size)] = summarize(runs, "cpu_us_per_event", extra=("events_per_s", "mb_per_s"))
        res[str(size)]["runs"] = runs
        log("B2", mode, size, {c: round(res[str(size)][c]["cpu_us_per_event"], 3) for c in configs},
            "guard/floor", round(res[str(size)]["guard/floor"] or 0, 3))
    return res


def b2_flat(envoys, bin_dir, secs):
    """One long bulk 1 KiB stream per config, CPU per event per 1 s window."""
    out = {}
    for c in ("floor", "guard"):
        e = envoys[c]
        r, cmd = sse_load(bin_dir, ["streams", "--addr", f"{HOST}:{e.listener_port}", "--path", "/mcp?size=1024&rate=0",
                                    "--conns", 1, "--secs", secs, "--pid", e.pid, "--window-ms", 1000,
                                    "--header", "x-bench:sse"], secs + 30)
        w = [x for x in r["windows"] if x["events"]]
        series = [x["ticks"] * 1e6 / CLK_TCK / x["events"] for x in w]
        cum = 0
        lengths = []
        for x in w:
            cum += x["events"]
            lengths.append(cum)
        out[c] = {"cpu_us_per_event": series, "events_at_end": lengths}
    COMMANDS.append("B2 flat: " + rel(cmd).replace(str(e.pid), "<envoy pid>").replace(str(e.listener_port), "<port>"))
    g = out["guard"]["cpu_us_per_event"]
    if len(g) >= 3:
        third = max(len(g) // 3, 1)
        out["guard_last_third_over_first_third"] = statistics.mean(g[-third:]) / statistics.mean(g[:third])
    log("B2 flat", out.get("guard_last_third_over_first_third"))
    return out


# Every configuration measured in instructions: the Wasm floors and guard, the native floors and guard.
CG_CONFIGS = ["bare", "floor", "headers", "copy", "guard", "native-empty", "native-copy", "native"]
# --cg-configs: callgrind only these (an older build's guards; its floors are those of any other run).
CG_ONLY: set[str] = set()


def callgrind(run_dir, envoy_bin, guard_wasm, floor_wasm, quick):
    """Instructions per request, chunk and event for every configuration (bench/instructions.py); in quick
    mode the guard alone, with tiny counts (the smoke run checks the method, not the figures)."""
    have = set(CONFIGS) | set(EXTRA_WASM)
    if NATIVE_DIR and (NATIVE_DIR / "libbench_floor_native.so").exists():
        have |= set(NATIVE_FLOORS)
    kinds = ["guard"] if quick else [k for k in CG_CONFIGS if k in have and (not CG_ONLY or k in CG_ONLY)]
    out_dir = run_dir / "callgrind"
    out_dir.mkdir(parents=True, exist_ok=True)
    res = {"configs": kinds, "quick": quick, "phases": {}}
    t0 = time.monotonic()
    for i, kind in enumerate(kinds):
        # Records leave on a timer (flush_ms), so how many flushes a phase holds depends on how fast it runs,
        # and under callgrind it runs ~50x slower: the longest flush_ms keeps them out of the counts (a phase
        # that holds one anyway is measured again, instructions.Callgrind.measure).
        e = Envoy(kind, out_dir, envoy_bin, guard_wasm, floor_wasm, ports=(14300 + P + 2 * i, 14301 + P + 2 * i),
                  name=f"cg-{kind}", flush_ms=instructions.FLUSH_MS)
        cg = instructions.Callgrind(e, out_dir, envoy_bin)
        cg.start()
        try:
            for phase, r in instructions.measure_config(cg, quick, PAD_PPM, log).items():
                res["phases"].setdefault(phase, {})[kind] = r
        finally:
            cg.stop()
    res["duration_s"] = time.monotonic() - t0
    COMMANDS.append("Instructions: valgrind " + " ".join(instructions.VALGRIND[1:])
                    + " --callgrind-out-file=… envoy -c <config> --concurrency 1; callgrind_control --zero / "
                    "--dump around each phase (bench/instructions.py)")
    log("callgrind done in", round(res["duration_s"]), "s")
    return res


def b3_setup(e):
    """Two fresh sessions through Envoy `e` and a cursor of the first that its guard continues."""
    hv = {"mcp-protocol-version": "2025-06-18", "content-type": "application/json",
          "accept": "application/json, text/event-stream"}
    init = b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":{}}'
    st, h1, _ = http_req(e.listener_port, "POST", "/mcp", hv, init)
    sid_a = h1.get("mcp-session-id")
    st, h2, _ = http_req(e.listener_port, "POST", "/mcp", hv, init)
    sid_b = h2.get("mcp-session-id")
    time.sleep(0.2)
    st, hs, body = http_req(e.listener_port, "GET", "/mcp", {**hv, "mcp-session-id": sid_a})
    m = re.search(rb"^id: (\S+)", body, re.M)
    if not (sid_a and sid_b and m):
        raise RuntimeError(f"B3 setup: {sid_a} {sid_b} {body!r}")
    cursor = m.group(1).decode()
    # Records may queue behind earlier benchmarks' backlog: wait (bounded) until the cursor continues.
    end = time.monotonic() + 30
    while True:
        time.sleep(0.3)
        st, hs, body = http_req(e.listener_port, "GET", "/mcp?prime=0",
                                {**hv, "mcp-session-id": sid_a, "last-event-id": cursor})
        if st == 200 and "mcp-resume" not in hs:
            return sid_a, sid_b, cursor
        if time.monotonic() > end:
            raise RuntimeError(f"B3: the cursor is not continued: {st} {hs.get('mcp-resume')}")


def b3(envoys, bin_dir, rounds, secs, config="guard"):
    return b3_many(envoys, bin_dir, rounds, secs, [config])[config]


def b3_many(envoys, bin_dir, rounds, secs, configs):
    """B3 for each configuration, alternating configurations round by round (and, within a round, the
    resume with the same GET without a cursor)."""
    setups = {c: b3_setup(envoys[c]) for c in configs}
    before = {c: envoys[c].stats() for c in configs}
    runs = {c: {"resume": [], "no_cursor": []} for c in configs}
    for _ in range(rounds):
        for config in configs:
            e = envoys[config]
            sid_a, sid_b, cursor = setups[config]
            for kind in ("resume", "no_cursor"):
                hdr = ["--header", f"mcp-session-id:{sid_a if kind == 'resume' else sid_b}",
                       "--header", "mcp-protocol-version:2025-06-18"]
                if kind == "resume":
                    hdr += ["--header", f"last-event-id:{cursor}"]
                r, cmd = sse_load(bin_dir, ["rate", "--addr", f"{HOST}:{e.listener_port}", "--path", "/mcp?prime=0",
                                            "--rps", 500, "--secs", secs, "--conns", 1, "--pid", e.pid, *hdr],
                                  secs + 60)
                r["cpu_us_per_req"] = r["ticks"] * 1e6 / CLK_TCK / max(r["count"], 1)
                runs[config][kind].append(r)
                if kind == "resume" and config == "guard" and not any(c.startswith("B3 resume") for c in COMMANDS):
                    COMMANDS.append("B3 resume: " + rel(cmd).replace(cursor, "<cursor>")
                                    .replace(str(e.pid), "<envoy pid>"))
    res = {}
    for config in configs:
        after = envoys[config].stats()
        d = {k: after.get(k, 0) - before[config].get(k, 0) for k in after if k.startswith("mcp_resume_guard.")}
        rs = runs[config]
        out = {k: {"p50_us": med([r["p50_us"] for r in v]), "p99_us": med([r["p99_us"] for r in v]),
                   "cpu_us_per_req": med([r["cpu_us_per_req"] for r in v]),
                   "rate": med([r["count"] / r["secs"] for r in v]),
                   "errors": sum(r["errors"] for r in v)} for k, v in rs.items()}
        added99 = [a["p99_us"] - b["p99_us"] for a, b in zip(rs["resume"], rs["no_cursor"])]
        out["added_p99_us"] = med(added99)
        out["added_p50_us"] = med([a["p50_us"] - b["p50_us"] for a, b in zip(rs["resume"], rs["no_cursor"])])
        # The spread over rounds: what one median alone can tell.
        out["added_p99_range_us"] = [min(added99), max(added99)] if added99 else None
        out["stats"] = {k: v for k, v in d.items() if v}
        out["runs"] = rs
        log("B3", config, out["added_p50_us"], out["added_p99_us"], out["stats"])
        res[config] = out
    return res


def b3_compare_md(res):
    """Markdown: B3 of this tree's guards beside the --prev-dir guards (one run, alternating)."""
    rows = []
    for store, pre in (("embedded", "b3"), ("Redis", "b3_redis")):
        for build, key in (("Wasm", ""), ("native", "_native")):
            for which, suffix in (("this tree", ""), ("previous", "_prev")):
                r = res.get(pre + key + suffix)
                if not r:
                    continue
                rng = r.get("added_p99_range_us") or [None, None]
                rows.append(f"| {store} | {build} | {which} | {fmt(r['resume']['p50_us'], 0)} | "
                            f"{fmt(r['resume']['p99_us'], 0)} | {fmt(r['no_cursor']['p99_us'], 0)} | "
                            f"{fmt(r['added_p50_us'], 0)} | **{fmt(r['added_p99_us'], 0)}** | "
                            f"{fmt(rng[0], 0)} … {fmt(rng[1], 0)} | {fmt(r['resume']['cpu_us_per_req'])} | "
                            f"{fmt(r['no_cursor']['cpu_us_per_req'])} | {r['resume']['errors'] + r['no_cursor']['errors']} |")
    if not rows:
        return []
    return ["| store | build | guard | resume p50 µs | resume p99 µs | no-cursor p99 µs | added p50 µs | "
            "added p99 µs | added p99 range over rounds µs | resume CPU µs/req | no-cursor CPU µs/req | errors |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |", *rows]


def has_redis(own_bin):
    try:
        h = subprocess.run([str(own_bin), "--help"], capture_output=True, text=True, timeout=10).stdout
    except OSError:
        return False
    return bool(subprocess.run("command -v redis-server", shell=True, capture_output=True).stdout) \
        and "redis://" in h and "not built yet" not in h


def b4(bin_dir, run_dir, own_bin, steps, secs, store=None):
    red = None
    if store:
        red = start_redis(REDIS, run_dir=run_dir, name="redis")
    args = [own_bin, "--listen", f"{HOST}:{OWN_B4}"] + (["--store", store] if store else [])
    try:
        own = Proc("ownership-b4" + ("-redis" if store else ""), args, port=OWN_B4, run_dir=run_dir).start()
    except Exception:
        if red:
            red.stop()
        raise
    try:
        res = []
        prev = 0
        for n in steps:
            r, cmd = sse_load(bin_dir, ["ownership", "--addr", f"{HOST}:{OWN_B4}", "--from", prev, "--to", n,
                                        "--secs", secs, "--conns", 16, "--pid", own.pid], secs + 300)
            r["cpu_us_per_decision"] = r["ticks"] * 1e6 / CLK_TCK / max(r["count"], 1)
            r["bytes_per_session"] = (r["rss"][1] - r["rss"][0]) / max(n - prev, 1)
            r["bytes_per_incarnation"] = (r["rss"][2] - r["rss"][1]) / max(n - prev, 1)
            res.append(r)
            prev = n
            log("B4", store or "memory", n, round(r["rate"]), r["p50_us"], r["p99_us"], r["outcomes"])
        COMMANDS.append("B4" + (" (redis)" if store else "") + ": " + rel(cmd).replace(str(own.pid), "<ownership pid>"))
        return res
    finally:
        own.stop()
        if red:
            red.stop()


def b5(bin_dir, run_dir, envoy_bin, guard_wasm, floor_wasm, sizes, secs, streams=200):
    """Fresh Envoys per event size: RSS idle, then with `streams` open slow streams."""
    out = {"wasm_bytes": {"guard": guard_wasm.stat().st_size, "floor": floor_wasm.stat().st_size}}
    idle = {}
    per = {}
    for size in sizes:
        for c in ("floor", "guard"):
            e = Envoy(c, run_dir, envoy_bin, guard_wasm, floor_wasm).start()
            try:
                time.sleep(0.5)
                r0 = rss(e.pid)
                idle.setdefault(c, []).append(r0)
                r, cmd = sse_load(bin_dir, ["streams", "--addr", f"{HOST}:{e.listener_port}",
                                            "--path", f"/mcp?size={size}&rate=20", "--conns", streams,
                                            "--secs", secs, "--pid", e.pid, "--header", "x-bench:sse"], secs + 60)
                per.setdefault(str(size), {})[c] = (r["rss_end"] - r0) / streams
            finally:
                e.stop()
    b = Envoy("bare", run_dir, envoy_bin, guard_wasm, floor_wasm).start()
    try:
        time.sleep(0.5)
        bare_idle = rss(b.pid)
    finally:
        b.stop()
    out["rss_idle"] = {"bare": bare_idle, "floor": med(idle["floor"]), "guard": med(idle["guard"])}
    out["vm_bytes"] = {c: out["rss_idle"][c] - bare_idle for c in ("floor", "guard")}
    out["per_stream_bytes"] = {s: {**v, "guard_minus_floor": v["guard"] - v["floor"]} for s, v in per.items()}
    out["streams"] = streams
    # The core's own state per stream (native build of the same code), events in 16 KiB chunks.
    out["core_state"] = {}
    for size in (100, 16384, 262144):
        t = subprocess.run([str(bin_dir / "hotpath"), str(size), "200", "16384"], capture_output=True,
                           text=True, timeout=60)
        if t.returncode == 0:
            out["core_state"][str(size)] = json.loads(t.stdout)
    COMMANDS.append("B5 streams: " + rel(cmd).replace(str(e.pid), "<envoy pid>").replace(str(e.listener_port), "<port>"))
    log("B5", out)
    return out


# ---- report -------------------------------------------------------------------------------

def sh(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=20, shell=True).stdout.strip()
    except Exception:  # noqa: BLE001
        return "?"


def machine(envoy_bin):
    mem = sh("awk '/MemTotal/ {printf \"%.1f GiB\", $2/1048576}' /proc/meminfo")
    return {
        "nproc": sh("nproc"), "memory": mem, "cpu": sh("awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo"),
        "kernel": platform.release(), "envoy": sh(f"{envoy_bin} --version | grep -o 'version: [^ ]*'"),
        "rustc": sh("rustc --version"), "wrk": sh("wrk -v 2>&1 | head -1"),
        "loadavg": sh("cat /proc/loadavg"),
        "busy": sh("ps -eo comm= | grep -cE '^(rustc|cargo|cc|ld|node|python3?|pytest|envoy|redis-server)$'"),
    }


def fmt(x, d=2):
    return "–" if x is None else f"{x:.{d}f}"


def heading(a, title):
    """A Markdown heading (`title` with its #s) and the blank line after it."""
    a(title)
    a("")


def table_head(a, *cols):
    """A Markdown table's header row and its separator."""
    a("| " + " | ".join(cols) + " |")
    a("|" + " --- |" * len(cols))


def verdict(ok):
    return "**met**" if ok else "**not met**"


PHASE_LABELS = {"b1_post": "B1 POST → JSON, per request", "b1_get": "B1 GET → SSE, per request",
                "paced_100": "B2 paced 100 B, per chunk", "paced_1024": "B2 paced 1 KiB, per chunk",
                "bulk_100": "B2 bulk 100 B, per event", "bulk_1024": "B2 bulk 1 KiB, per event",
                "bulk_16384": "B2 bulk 16 KiB, per event"}


def instructions_section(res, a):
    ins = res.get("instructions")
    if not ins:
        return
    kinds = ins["configs"]
    heading(a, "## Instructions")
    a("User-space instructions of Envoy's worker thread (callgrind, `--concurrency 1`, `bench/instructions.py`): "
      "each configuration in its own Envoy under `valgrind --tool=callgrind`, instrumentation switched on after "
      "startup; per phase the counters are zeroed, the phase runs, and a dump gives each thread's count. B1: "
      "N requests on one keep-alive connection after a warm-up, divided by N (GETs each with their own session). "
      "B2: one stream of N events and one of 2N, (I(2N) − I(N)) / N, so the stream's setup cancels; paced "
      f"streams send one event per chunk at {instructions.PACED_RATE}/s. Records flush every "
      f"{instructions.FLUSH_MS // 1000} s in these Envoys and a phase that holds a flush is measured again: the "
      "flush callouts are not in the counts (their number follows the arrival rate, which callgrind slows ~50×). "
      "Callgrind counts each iteration of a `rep movs` (glibc's memcpy for large copies) as an instruction, so "
      "body copies weigh more here than in CPU time. Thousands of instructions"
      + (" (quick mode: the guard alone, tiny counts)." if ins.get("quick") else "."))
    a("")
    table_head(a, "benchmark", "N", *kinds)
    for phase, label in PHASE_LABELS.items():
        r = ins["phases"].get(phase, {})
        if r:
            n = next(iter(r.values()))["n"]
            a(f"| {label} | {n} | " + " | ".join(fmt(r[k]["per_unit"] / 1000, 2) if k in r else "–"
                                                for k in kinds) + " |")
    a("")
    a("*bare*: no filter; *floor*: the empty Rust proxy-wasm filter (`bench/floor-filter`); *headers*: the same "
      "built with `FLOOR_MODE=hdr` (reads the request and response header maps, as any inspecting filter must); "
      "*copy*: built with `FLOOR_MODE=getset` (reads every response body chunk into the VM and writes it back, "
      "padded to as many bytes as the guard writes); *native-empty* / *native-copy*: the same two floors as an "
      "Envoy dynamic module (`bench/floor-native`): a module that does nothing, and one that copies each chunk out "
      "of Envoy's slices and writes it back, padded likewise; *guard* / *native*: the guard's two builds.")
    sized = [(PHASE_LABELS[p].split(",")[0], r) for p, r in ins["phases"].items() if p.startswith(("paced", "bulk"))]
    if sized:
        a("")
        a("Bytes per event written to the client in these phases (the copy fixtures must match the guard): "
          + "; ".join(f"{label}: " + ", ".join(f"{k} {fmt(r[k].get('bytes_per_event'), 0)}" for k in kinds if k in r)
                      for label, r in sized) + ".")
    pad = res.get("pad")
    if pad:
        a("")
        a("The guard rewrites ids into longer cursors; the copy fixtures add the same bytes as an SSE comment line "
          "(`x-bench-pad-ppm`, measured from the guard's output at the start of the run): bytes per event, "
          "bare / guard / copy fixture: "
          + "; ".join(f"{z} B: {fmt(v['bare_bytes_per_event'], 0)} / {fmt(v['guard_bytes_per_event'], 0)} / "
                      f"{fmt(v.get('copy_bytes_per_event'), 0)}" for z, v in pad.items()) + ".")
    a("")


def write_report(res, path, plots_rel):
    m = res["machine"]
    L = []
    a = L.append
    a("# Benchmarks")
    a("")
    a("Generated by `make bench` (`bench/run.py`); do not edit by hand — the optimization log comes from "
      "`bench/OPTIMIZATIONS.md`, the *Scale* section from `bench/SCALE.md` (`make bench-scale`, its own run).")
    a("")
    a(f"Run: {res['started']} UTC, {res['duration_s']:.0f} s, mode **{'quick' if res['quick'] else 'full'}**, "
      f"{res['rounds']} rounds per benchmark, configurations alternated "
      f"({', '.join(res.get('configs', ['bare', 'floor', 'guard']))}, bare, …); "
      "figures are medians over rounds, ratios are medians of per-round ratios.")
    a("")
    heading(a, "## Machine")
    table_head(a, "nproc", "memory", "CPU", "kernel", "Envoy", "rustc", "wrk")
    a(f"| {m['nproc']} | {m['memory']} | {m['cpu']} | {m['kernel']} | {m['envoy']} | {m['rustc']} | {m['wrk']} |")
    a("")
    a(f"Machine load: loadavg at start `{res['machine_start']['loadavg']}`, at end `{m['loadavg']}`; "
      f"{res['machine_start']['busy']} / {m['busy']} build or test processes (rustc, cargo, node, python, envoy, …) "
      "were running at start / end. The machine is shared: absolute figures move with the load, ratios within one "
      "alternating run much less.")
    a("")
    a("Envoy runs with `--concurrency 1`; *bare* = no Wasm filter, *floor* = the empty Rust proxy-wasm filter "
      "`bench/floor-filter`, *guard* = `mcp_resume_guard.wasm` with the config of `envoy/envoy.yaml` and the "
      "ownership service (embedded store) running" + (", *native* = the same guard as an Envoy dynamic module "
      "(`libmcp_resume_guard_native.so`, `envoy/envoy-native.yaml`; in CPU time its floor is *bare*, in "
      "instructions the native floors of `bench/floor-native`"
      + ("; a debug build in quick mode" if res.get("quick") else "") + ")"
      if "native" in res.get("b1", {}).get("post_json", {}) else "") + ". The Envoys have the same listener, routes, "
      "`stateful_session` and clusters. CPU = utime+stime of the Envoy process from `/proc/<pid>/stat` "
      f"(clock ticks of {1000 // CLK_TCK} ms) over the measured window, divided by requests or events completed.")
    a("")
    heading(a, "## Targets")
    a("Judged on instructions (callgrind, *Instructions* below): the same work gives the same count run after run, "
      "where CPU time on this shared machine moves the unchanged fixtures by 1.04–1.30×. The CPU column is the "
      "wall-clock benchmarks' ratio over the same floor (the native one over *bare*: it has no empty-module "
      "column), median of per-round ratios with the min–max over rounds.")
    a("")
    table_head(a, "target", "measured (instructions)", "CPU time", "status")
    for row in res["targets"]:
        a(f"| {row[0]} | {row[1]} | {row[3] if len(row) > 3 else ''} | "
          f"{verdict(row[2]) if row[2] is not None else 'reported'} |")
    a("")
    instructions_section(res, a)
    b1 = res["b1"]
    heading(a, "## B1 — requests without a cursor")
    a(f"![B1]({plots_rel}/b1.png)")
    a("")
    a("CPU and throughput: wrk, 1 thread, 8 connections, closed loop (saturates the single Envoy worker; its "
      "latency is mostly queueing). Latency: `sse-load rate`, 2000 requests/s over 4 keep-alive connections, "
      "well below saturation.")
    a("")
    table_head(a, "request", "config", "CPU µs/req", "req/s (wrk)", "p50 / p99 µs (wrk)",
               "p50 / p99 µs at 2000/s", "ratio")
    for kind, label in (("post_json", "POST → JSON"), ("get_sse", "GET → SSE (priming event)")):
        r = b1[kind]
        for c in CONFIGS:
            ratio = {"bare": "", "floor": f"floor/bare {fmt(r['floor/bare'])}",
                     "guard": f"guard/floor **{fmt(r['guard/floor'], 3)}**, p99 {fmt(r.get('fixed_p99_ratio'), 3)}",
                     "native": f"native/bare **{fmt(r.get('native/bare'), 3)}**, "
                               f"native/guard {fmt(r.get('native/guard'), 3)}"}.get(c, "")
            a(f"| {label} | {c} | {fmt(r[c]['cpu_us_per_req'])} | {fmt(r[c]['rps'], 0)} | {fmt(r[c]['p50_us'], 0)} / "
              f"{fmt(r[c]['p99_us'], 0)} | {fmt(r[c].get('fixed_p50_us'), 0)} / {fmt(r[c].get('fixed_p99_us'), 0)} | {ratio} |")
    a("")
    for mode, title in (("b2_paced", "B2 — SSE ids rewritten, paced (20 streams × 1 event/ms)"),
                        ("b2_bulk", "B2 — SSE ids rewritten, bulk (as fast as possible)")):
        heading(a, f"## {title}")
        a(f"![{mode}]({plots_rel}/{mode}.png)")
        a("")
        table_head(a, "event size", "config", "CPU µs/event", "events/s", "MB/s", "ratio")
        for size, r in res[mode].items():
            for c in [x for x in ("bare", "floor", "copy", "guard", "native") if x in r]:
                ratio = {"bare": "", "floor": f"floor/bare {fmt(r['floor/bare'])}",
                         "copy": f"copy/floor {fmt(r.get('copy/floor'), 3)}",
                         "guard": f"guard/floor **{fmt(r['guard/floor'], 3)}**",
                         "native": f"native/bare **{fmt(r.get('native/bare'), 3)}**, "
                                   f"native/guard {fmt(r.get('native/guard'), 3)}"}[c]
                a(f"| {size} B | {c} | {fmt(r[c]['cpu_us_per_event'], 3)} | {fmt(r[c]['events_per_s'], 0)} | "
                  f"{fmt(r[c]['mb_per_s'], 1)} | {ratio} |")
        if "copy" in next(iter(res[mode].values()), {}):
            a("")
            a("*copy* is the floor filter built with `FLOOR_MODE=getset`: it only reads every body chunk into the VM and "
              "writes it back unchanged, the least any filter that edits SSE ids must do.")
        a("")
    fl = res.get("b2_flat")
    if fl:
        heading(a, "### Cost per event against stream length (bulk, 1 KiB, one stream, 1 s windows)")
        table_head(a, "window", "events so far (guard)", "guard CPU µs/event", "floor CPU µs/event")
        g, f = fl["guard"], fl["floor"]
        for i, v in enumerate(g["cpu_us_per_event"]):
            fv = f["cpu_us_per_event"][i] if i < len(f["cpu_us_per_event"]) else None
            a(f"| {i + 1} | {g['events_at_end'][i]} | {fmt(v, 3)} | {fmt(fv, 3)} |")
        a("")
        a(f"Guard, mean of the last third over the first third: **{fmt(fl.get('guard_last_third_over_first_third'), 3)}**.")
        a("")
    b3 = res["b3"]
    heading(a, "## B3 — resumptions (GET with a valid cursor: one callout, and one at its end)")
    a("500 requests/s over one keep-alive connection (concurrent resumes of one cursor would be forks, and newest "
      "wins), alternating with the same GET without a cursor; latency to the "
      "end of the (short) response, measured by `sse-load rate`. The cursor is continued: the guard decodes it, asks "
      "the ownership service (embedded store), pins the owner and restores the replica's id; at the response's clean "
      "end it holds the end and asks the store whether another branch is open (`POST /v1/branch`, docs/forks.md).")
    a("")
    def b3_table(run):
        table_head(a, "request", "p50 µs", "p99 µs", "Envoy CPU µs/req", "req/s", "errors")
        for k, label in (("resume", "GET with cursor (continued)"), ("no_cursor", "GET without cursor")):
            r = run[k]
            a(f"| {label} | {fmt(r['p50_us'], 0)} | {fmt(r['p99_us'], 0)} | {fmt(r['cpu_us_per_req'])} | "
              f"{fmt(r['rate'], 0)} | {r['errors']} |")

    b3_table(b3)
    a("")
    a(f"Added latency: p50 **{fmt(b3['added_p50_us'], 0)} µs**, p99 **{fmt(b3['added_p99_us'], 0)} µs**. "
      f"Guard counters over the run: `{json.dumps(b3['stats'])}`.")
    a("")
    if res.get("b3_rerun"):
        a(f"(B3 is from a rerun of B3 alone, `bench/run.py --only b3`, at {res['b3_rerun']} UTC on the same machine.)")
        a("")
    b3n = res.get("b3_native")
    if b3n:
        a("**The native build** (same store, same requests):")
        a("")
        b3_table(b3n)
        a("")
        a(f"Added latency, native: p50 **{fmt(b3n['added_p50_us'], 0)} µs**, p99 **{fmt(b3n['added_p99_us'], 0)} µs**.")
        a("")
    b3r = res.get("b3_redis")
    if b3r:
        a("**With the Redis store** (`mcp-ownership --store redis://…`, a local `redis-server`):")
        a("")
        b3_table(b3r)
        a("")
        a(f"Added latency with Redis: p50 **{fmt(b3r['added_p50_us'], 0)} µs**, p99 **{fmt(b3r['added_p99_us'], 0)} µs**. "
          f"Guard counters: `{json.dumps(b3r['stats'])}`.")
    else:
        a("Redis store: " + res.get("b3_redis_note", "not measured."))
    a("")
    md = b3_compare_md(res)
    if md:
        a("**Beside the previous guard** (`--prev-dir`: an earlier build's guards with that build's own ownership "
          "service, measured in the same run, configurations alternating round by round):")
        a("")
        for line in md:
            a(line)
        a("")
    heading(a, "## B4 — ownership service")
    a(f"![B4]({plots_rel}/b4.png)")
    a("")
    a("`mcp-ownership` (release build, embedded store, tokio multi-thread on the machine's 2 cores) answered "
      "`/v1/resume` for random stored sessions, 16 keep-alive connections in a closed loop from one load-generator "
      "thread on the same machine. Each session has one GET incarnation with one recorded event; every answer is "
      "`continue`.")
    a("")
    table_head(a, "stored sessions", "decisions/s", "p50 µs", "p99 µs", "service CPU µs/decision",
               "decisions/s per CPU core", "outcomes")
    for r in res["b4"]:
        a(f"| {r['sessions']} | {fmt(r['rate'], 0)} | {r['p50_us']} | {r['p99_us']} | {fmt(r['cpu_us_per_decision'])} | "
          f"{fmt(1e6 / r['cpu_us_per_decision'] if r['cpu_us_per_decision'] else None, 0)} | `{json.dumps(r['outcomes'])}` |")
    a("")
    if res.get("b4_redis"):
        a("With the Redis store (a local `redis-server`, same load):")
        a("")
        table_head(a, "stored sessions", "decisions/s", "p50 µs", "p99 µs", "service CPU µs/decision",
                   "outcomes")
        for r in res["b4_redis"]:
            a(f"| {r['sessions']} | {fmt(r['rate'], 0)} | {r['p50_us']} | {r['p99_us']} | {fmt(r['cpu_us_per_decision'])} | "
              f"`{json.dumps(r['outcomes'])}` |")
        a("")
    b5 = res["b5"]
    last = res["b4"][-1]
    heading(a, "## B5 — footprint")
    table_head(a, "what", "figure")
    a(f"| guard `.wasm` | {b5['wasm_bytes']['guard']:,} bytes |")
    a(f"| floor `.wasm` | {b5['wasm_bytes']['floor']:,} bytes |")
    a(f"| Envoy RSS idle: bare / floor / guard | {b5['rss_idle']['bare'] / 2**20:.1f} / {b5['rss_idle']['floor'] / 2**20:.1f} / "
      f"{b5['rss_idle']['guard'] / 2**20:.1f} MiB |")
    a(f"| VM memory (RSS over bare; one worker plus the main-thread VM) | floor {b5['vm_bytes']['floor'] / 2**20:.1f} MiB, "
      f"guard {b5['vm_bytes']['guard'] / 2**20:.1f} MiB |")
    for size, v in b5["per_stream_bytes"].items():
        a(f"| Envoy memory per open stream, {size} B events ({b5['streams']} streams) | floor {v['floor'] / 1024:.1f} KiB, "
          f"guard {v['guard'] / 1024:.1f} KiB, guard − floor **{v['guard_minus_floor'] / 1024:.1f} KiB** |")
    for size, v in b5.get("core_state", {}).items():
        a(f"| core stream state, {size} B events in 16 KiB chunks (native build) | {v['state_bytes']} bytes + at most "
          f"{v['max_held_bytes']} bytes held |")
    a(f"| store: bytes per session (RSS growth over {last['loaded']} sessions) | {fmt(last['bytes_per_session'], 0)} |")
    a(f"| store: bytes per incarnation with one event | {fmt(last['bytes_per_incarnation'], 0)} |")
    a("")
    a("Envoy's RSS per open stream is mostly Envoy's own buffering (with 256 KiB events, up to its 1 MiB "
      "per-connection buffer limit) and moves by hundreds of KiB between runs; the filter's own state is the "
      "*core stream state* rows, measured on the same code built natively.")
    a("")
    a("The guard's per-stream state is bounded by construction: the SSE parser holds at most one event up to "
      "`max_event_hold_bytes` (64 KiB; larger events stream through), plus the id being read; the output scratch "
      "buffer is shared by all streams of a worker.")
    a("")
    extras = [c for c in res.get("configs", []) if c not in ("bare", "floor", "guard", "native", "copy")]
    if extras:
        heading(a, "## Other builds in the same run")
        a("Loaded side by side with the others (`--extra NAME=file.wasm`) and alternated with them round by round: "
          "Envoy CPU per unit over the floor's, medians of per-round ratios. *headers* is the floor filter built "
          "with `FLOOR_MODE=hdr`: it only reads the request and the response header map, once each, as any filter "
          "that inspects headers must (the guard reads each map with the same single host call).")
        a("")
        table_head(a, "benchmark", "guard/floor", *(f"{x}/floor" for x in extras))
        rows = [(f"B1 {k}", res.get("b1", {}).get(k, {})) for k in ("post_json", "get_sse")]
        rows += [(f"B2 paced {z} B", r) for z, r in res.get("b2_paced", {}).items()]
        rows += [(f"B2 bulk {z} B", r) for z, r in res.get("b2_bulk", {}).items()]
        for name, r in rows:
            a(f"| {name} | {fmt(r.get('guard/floor'), 3)} | "
              + " | ".join(fmt(r.get(f"{x}/floor"), 3) for x in extras) + " |")
        a("")
    # The optimization log, and the last `make bench-scale` report (its own, longer run).
    for part in ("OPTIMIZATIONS.md", "SCALE.md"):
        f = ROOT / "bench" / part
        if f.exists():
            a(f.read_text().rstrip())
            a("")
    heading(a, "## Commands")
    a("```sh")
    a("make bench                 # full run, writes BENCHMARKS.md and bench/plots/*.png")
    a("BENCH_QUICK=1 make bench   # < 2 min smoke run, writes target/bench-smoke/ (part of make test)")
    a("make bench-scale           # the Scale section: writes bench/SCALE.md, which make bench includes")
    for c in COMMANDS:
        a(c)
    a("```")
    path.write_text("\n".join(L) + "\n")


def plots(res, out_dir):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    out_dir.mkdir(parents=True, exist_ok=True)
    colors = {"bare": "#999999", "floor": "#4c72b0", "copy": "#8da0cb", "guard": "#dd8452", "native": "#55a868"}

    def bars(ax, groups, key, ylabel, title, log=False):
        labels = list(groups)
        cs = [c for c in ("bare", "floor", "copy", "guard", "native") if c in groups[labels[0]]]
        w = 0.8 / len(cs)
        for i, c in enumerate(cs):
            ax.bar([x + (i - (len(cs) - 1) / 2) * w for x in range(len(labels))],
                   [groups[g][c][key] or 0 for g in labels], w, label=c, color=colors[c])
        if log:
            ax.set_yscale("log")
        ax.set_xticks(range(len(labels)), labels)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.legend()

    fig, axs = plt.subplots(1, 2, figsize=(10, 4))
    bars(axs[0], {"POST→JSON": res["b1"]["post_json"], "GET→SSE": res["b1"]["get_sse"]}, "cpu_us_per_req",
         "Envoy CPU µs / request", "B1 CPU per request")
    bars(axs[1], {"POST→JSON": res["b1"]["post_json"], "GET→SSE": res["b1"]["get_sse"]}, "fixed_p99_us",
         "p99 µs at 2000 req/s", "B1 p99 latency")
    fig.tight_layout()
    fig.savefig(out_dir / "b1.png", dpi=90)
    plt.close(fig)
    for mode in ("b2_paced", "b2_bulk"):
        fig, axs = plt.subplots(1, 2, figsize=(10, 4))
        g = {f"{s} B": v for s, v in res[mode].items()}
        bulk = mode == "b2_bulk"
        bars(axs[0], g, "cpu_us_per_event", "Envoy CPU µs / event" + (" (log)" if bulk else ""),
             f"{mode} CPU per event", log=bulk)
        bars(axs[1], g, "events_per_s", "events / s" + (" (log)" if bulk else ""), f"{mode} throughput", log=bulk)
        fig.tight_layout()
        fig.savefig(out_dir / f"{mode}.png", dpi=90)
        plt.close(fig)
    fig, ax = plt.subplots(figsize=(6, 4))
    xs = [r["sessions"] for r in res["b4"]]
    ax.plot(xs, [r["p50_us"] for r in res["b4"]], "o-", label="p50, embedded store")
    ax.plot(xs, [r["p99_us"] for r in res["b4"]], "o-", label="p99, embedded store")
    if res.get("b4_redis"):
        xr = [r["sessions"] for r in res["b4_redis"]]
        ax.plot(xr, [r["p50_us"] for r in res["b4_redis"]], "s--", label="p50, Redis")
        ax.plot(xr, [r["p99_us"] for r in res["b4_redis"]], "s--", label="p99, Redis")
    ax.set_ylim(bottom=0)
    ax.set_xscale("log")
    ax.set_xlabel("stored sessions")
    ax.set_ylabel("latency µs")
    ax.set_title("B4 /v1/resume latency vs stored sessions")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out_dir / "b4.png", dpi=90)
    plt.close(fig)


# The targets (instruction ratios): (label, phase, Wasm floor, Wasm limit, native limit over the empty module).
TARGETS = [
    ("B1 POST→JSON per request", "b1_post", "headers", 1.05, 1.05),
    ("B1 GET→SSE per request", "b1_get", "headers", 1.15, 1.08),
    ("B2 paced 100 B per chunk", "paced_100", "copy", 1.10, 1.15),
    ("B2 paced 1 KiB per chunk", "paced_1024", "copy", 1.10, 1.15),
    ("B2 bulk 100 B per event", "bulk_100", "floor", 10, 6.5),
    ("B2 bulk 1 KiB per event", "bulk_1024", "copy", 1.5, 1.5),
    ("B2 bulk 16 KiB per event", "bulk_16384", "copy", 1.1, 1.1),
]
FLOOR_NAMES = {"headers": "header-reading fixture", "copy": "copy fixture", "floor": "empty filter",
               "bare": "bare", "native-empty": "empty module", "native-copy": "native copy fixture"}


def cpu_of(res, phase):
    """The CPU-time results of the benchmark an instruction phase repeats."""
    if phase.startswith("b1"):
        return res.get("b1", {}).get({"b1_post": "post_json", "b1_get": "get_sse"}[phase], {})
    mode, size = phase.split("_")
    return res.get(f"b2_{mode}", {}).get(size, {})


def cpu_ratio(r, pair):
    v, rng = r.get(pair), r.get(f"{pair}_range")
    if v is None:
        return "–"
    return f"{fmt(v, 3)}× ({fmt(rng[0], 2)}–{fmt(rng[1], 2)})" if rng else f"{fmt(v, 3)}×"


def targets(res):
    """Rows (target, instructions, CPU time, met): met is judged on instructions alone."""
    t = []
    phases = res.get("instructions", {}).get("phases", {})

    def ir(phase, kind):
        return phases.get(phase, {}).get(kind, {}).get("per_unit")

    for label, phase, floor, wlim, nlim in TARGETS:
        cpu = cpu_of(res, phase)
        for guard, fl, lim, extra in (("guard", floor, wlim, ()),
                                      ("native", "native-empty", nlim, ("bare", "native-copy"))):
            g, f = ir(phase, guard), ir(phase, fl)
            if guard == "native" and g is None and "native" not in cpu:
                continue
            v = g / f if g and f else None
            also = "".join(f"; ×{FLOOR_NAMES[x]} {fmt(g / ir(phase, x), 3)}" for x in extra
                           if g and ir(phase, x))
            measured = (f"{fmt(v, 3)}× ({g:,.0f} vs {f:,.0f} instructions{also})" if v else "–")
            cpu_pair = f"{guard}/{fl}" if guard == "guard" else "native/bare"
            t.append((f"{label}, {'Wasm' if guard == 'guard' else 'native'}: ≤ {lim}× {FLOOR_NAMES[fl]}",
                      measured, None if v is None else v <= lim,
                      f"{cpu_pair.replace('/', ' / ')}: {cpu_ratio(cpu, cpu_pair)}"))
    for kind, label in (("post_json", "POST→JSON"), ("get_sse", "GET→SSE")):
        r = res.get("b1", {}).get(kind)
        if r:
            p = r.get("fixed_p99_ratio") or 99
            t.append((f"B1 {label}: p99 within 10% of floor (2000 req/s)",
                      f"{fmt(p, 3)}× ({fmt(r['guard']['fixed_p99_us'], 0)} vs {fmt(r['floor']['fixed_p99_us'], 0)} µs)",
                      p <= 1.10, ""))
    fl = res.get("b2_flat", {}).get("guard_last_third_over_first_third")
    t.append(("B2 cost per event flat in stream length (last/first third ≤ 1.10)", fmt(fl, 3),
              None if fl is None else fl <= 1.10))
    if not all(k in res for k in ("b3", "b4", "b5")):
        return t  # a partial run (--only)
    ps = res["b5"]["per_stream_bytes"]
    cs = res["b5"].get("core_state", {})
    held = max((v["max_held_bytes"] for v in cs.values()), default=None)
    state = max((v["state_bytes"] for v in cs.values()), default=0)
    t.append(("B2 filter memory per stream bounded whatever the event size",
              f"parser state {state} B + at most {held} B held for 100 B … 256 KiB events (fresh streams; "
              "continuations hold ≤ `max_event_hold_bytes`); Envoy RSS per open stream, guard − floor: "
              + ", ".join(f"{s} B: {v['guard_minus_floor'] / 1024:.1f} KiB" for s, v in ps.items())
              + " (RSS, noisy)",
              held is not None and held <= 65536))
    b3 = res["b3"]
    t.append(("B3 added p99 ≤ 1 ms (embedded store)", f"{fmt(b3['added_p99_us'], 0)} µs",
              b3["added_p99_us"] is not None and b3["added_p99_us"] <= 1000))
    if res.get("b3_native"):
        r = res["b3_native"]
        t.append(("B3 added p99 ≤ 1 ms (embedded store, native build)", f"{fmt(r['added_p99_us'], 0)} µs",
                  r["added_p99_us"] is not None and r["added_p99_us"] <= 1000))
    if res.get("b3_redis"):
        r = res["b3_redis"]
        t.append(("B3 added p99 ≤ 2 ms (Redis store)", f"{fmt(r['added_p99_us'], 0)} µs",
                  r["added_p99_us"] is not None and r["added_p99_us"] <= 2000))
    rates = [r["rate"] for r in res["b4"]]
    p50s = [r["p50_us"] for r in res["b4"]]
    t.append(("B4 ≥ 20k decisions/s (embedded)", ", ".join(f"{r['sessions']}: {r['rate']:.0f}/s" for r in res["b4"]),
              min(rates) >= 20000))
    t.append(("B4 latency flat in stored sessions (p50 at most ×1.5 from smallest to largest)",
              " → ".join(f"{p} µs" for p in p50s), max(p50s) <= 1.5 * max(min(p50s), 1)))
    return t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--bin-dir", required=True, type=Path)
    ap.add_argument("--floor-wasm", required=True, type=Path)
    ap.add_argument("--guard-wasm", required=True, type=Path)
    ap.add_argument("--ownership", required=True, type=Path)
    ap.add_argument("--envoy", default=str(ROOT / ".venv" / "bin" / "envoy"))
    ap.add_argument("--out", required=True, type=Path, help="directory for results.json and run logs")
    ap.add_argument("--report", required=True, type=Path)
    ap.add_argument("--plots", required=True, type=Path)
    ap.add_argument("--only", default="", help="comma list of b1,b2,b2p,b2b,cg,b3,b4,b5 (debugging)")
    ap.add_argument("--extra", action="append", default=[],
                    help="NAME=floor-like.wasm: an extra configuration (experiments, with --only)")
    ap.add_argument("--rounds", type=int, default=0)
    ap.add_argument("--report-only", action="store_true",
                    help="rewrite the report and plots from OUT/results.json without running anything")
    ap.add_argument("--copy-wasm", type=Path, default=None,
                    help="the floor filter built with FLOOR_MODE=getset: B2's 'copy' configuration")
    ap.add_argument("--sizes", default="")
    ap.add_argument("--native-dir", type=Path, default=None,
                    help="directory of libmcp_resume_guard_native.so: adds the 'native' configuration")
    ap.add_argument("--prev-dir", type=Path, default=None,
                    help="an earlier build (mcp_resume_guard.wasm, libmcp_resume_guard_native.so, mcp-ownership): "
                         "B3 measured beside it, alternating")
    ap.add_argument("--cg-configs", default="",
                    help="comma list of configurations callgrind measures (default: all), e.g. guard,native")
    a = ap.parse_args()
    CG_ONLY.update(filter(None, a.cg_configs.split(",")))
    if a.native_dir:
        global NATIVE_DIR
        NATIVE_DIR = a.native_dir.resolve()
        PORTS["native"] = (14080 + P, 14081 + P)
        CONFIGS.append("native")
    if a.prev_dir:
        global PREV_DIR
        PREV_DIR = a.prev_dir.resolve()
        PORTS["guard-prev"] = (14060 + P, 14061 + P)
        PORTS["native-prev"] = (14070 + P, 14071 + P)
    for i, x in enumerate(a.extra):
        name, _, path = x.partition("=")
        EXTRA_WASM[name] = Path(path).resolve()
        PORTS[name] = (14040 + P + 10 * i, 14041 + P + 10 * i)
        CONFIGS.append(name)
    if a.report_only:
        res = json.loads((a.out / "results.json").read_text())
        COMMANDS.extend(res.get("commands", []))
        res["targets"] = targets(res)
        plots(res, a.plots)
        write_report(res, a.report, os.path.relpath(a.plots, a.report.parent))
        log(f"report rewritten: {a.report}")
        return
    quick = a.quick
    rounds = a.rounds or (1 if quick else 7)
    secs = 0.5 if quick else 1.5
    run_dir = a.out / "runs"
    run_dir.mkdir(parents=True, exist_ok=True)
    bin_dir = a.bin_dir.resolve()
    global BIN_DIR
    BIN_DIR = bin_dir
    res = {"quick": quick, "rounds": rounds, "started": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
           "machine_start": machine(a.envoy), "configs": list(CONFIGS)}
    t0 = time.monotonic()
    procs = []
    only = set(filter(None, a.only.split(",")))

    def want(b):
        return not only or b in only

    try:
        procs.append(Proc("json-upstream", [bin_dir / "json-upstream", "--listen", f"{HOST}:{JSON_UP}"],
                          port=JSON_UP, run_dir=run_dir).start())
        procs.append(Proc("sse-upstream", [bin_dir / "sse-upstream", "--listen", f"{HOST}:{SSE_UP}"],
                          port=SSE_UP, run_dir=run_dir).start())
        procs.append(Proc("ownership", [a.ownership, "--listen", f"{HOST}:{OWN}"], port=OWN, run_dir=run_dir).start())
        prev_own = PREV_DIR / "mcp-ownership" if PREV_DIR else None
        prev_configs = [c for c, mine in PREV_CONFIGS.items() if mine in CONFIGS] if PREV_DIR else []
        if prev_own:
            procs.append(Proc("ownership-prev", [prev_own, "--listen", f"{HOST}:{OWN_PREV}"], port=OWN_PREV,
                              run_dir=run_dir).start())
        envoys = {}
        if a.copy_wasm:
            EXTRA_WASM["copy"] = a.copy_wasm.resolve()
            PORTS["copy"] = (14090 + P, 14091 + P)
        for c in CONFIGS + (["copy"] if a.copy_wasm else []) + prev_configs:
            envoys[c] = Envoy(c, run_dir, a.envoy, a.guard_wasm.resolve(), a.floor_wasm.resolve()).start()
            procs.append(envoys[c])
        if want("b1"):
            res["b1"] = b1(envoys, rounds, 1 if quick else 2, run_dir)
        sizes = [int(x) for x in a.sizes.split(",")] if a.sizes else [100, 1024, 16384]
        if want("b2") or want("b2p") or want("b2b"):
            res["pad"] = calibrate_pad(envoys, sizes)
        if want("b2") or want("b2p"):
            res["b2_paced"] = b2(envoys, bin_dir, rounds, secs, sizes, "paced", 20)
        if want("b2") or want("b2b"):
            res["b2_bulk"] = b2(envoys, bin_dir, rounds, secs, sizes, "bulk", 2)
        if want("b2"):
            res["b2_flat"] = b2_flat(envoys, bin_dir, 3 if quick else 9)
        if want("cg"):
            if not PAD_PPM:
                res["pad"] = calibrate_pad(envoys, sizes)
            res["instructions"] = callgrind(run_dir, a.envoy, a.guard_wasm.resolve(), a.floor_wasm.resolve(), quick)
        redis_ok = has_redis(a.ownership)
        if want("b3") and prev_configs:
            # This tree's guards and the earlier build's in one run, alternating round by round.
            b3_secs = secs if quick else 2.0
            mine = [c for c in ("guard", "native") if c in envoys]
            order = [x for c in mine for x in (c, next(p for p, m in PREV_CONFIGS.items() if m == c))]
            names = {"guard": "b3", "native": "b3_native", "guard-prev": "b3_prev", "native-prev": "b3_native_prev"}
            for c, r in b3_many(envoys, bin_dir, rounds, b3_secs, order).items():
                res[names[c]] = r
            if redis_ok:
                # Both services on one Redis (fresh sessions: no key is shared), on their own ports.
                for name in ("ownership", "ownership-prev"):
                    next(p for p in procs if p.name == name).stop()
                red = start_redis(REDIS, run_dir=run_dir, name="redis")
                procs.append(red)
                for name, own_bin, port in (("ownership-redis", a.ownership, OWN),
                                            ("ownership-prev-redis", prev_own, OWN_PREV)):
                    procs.append(Proc(name, [own_bin, "--listen", f"{HOST}:{port}", "--store",
                                             f"redis://{HOST}:{REDIS}"], port=port, run_dir=run_dir).start())
                for c, r in b3_many(envoys, bin_dir, rounds, b3_secs, order).items():
                    res[names[c].replace("b3", "b3_redis", 1)] = r
            md = b3_compare_md(res)
            (a.out / "b3-compare.md").write_text("\n".join(md) + "\n")
            log("B3 beside the previous guard:\n" + "\n".join(md))
        elif want("b3"):
            res["b3"] = b3(envoys, bin_dir, rounds, secs if quick else 2.0)
            if "native" in envoys:
                res["b3_native"] = b3(envoys, bin_dir, rounds, secs if quick else 2.0, config="native")
            if redis_ok:
                # The same benchmark with the ownership service on Redis (same port, fresh sessions).
                own = next(p for p in procs if p.name == "ownership")
                own.stop()
                red = start_redis(REDIS, run_dir=run_dir, name="redis")
                procs.append(red)
                own_r = Proc("ownership-redis", [a.ownership, "--listen", f"{HOST}:{OWN}", "--store",
                                                 f"redis://{HOST}:{REDIS}"], port=OWN, run_dir=run_dir).start()
                procs.append(own_r)
                res["b3_redis"] = b3(envoys, bin_dir, rounds, secs if quick else 2.0)
                own_r.stop()
                red.stop()
            else:
                res["b3_redis_note"] = ("not measured: `redis-server` or the Redis store of "
                                        "`mcp-ownership --store redis://…` is not available.")
        for e in envoys.values():
            e.stop()
        if want("b4"):
            res["b4"] = b4(bin_dir, run_dir, a.ownership, [1000, 2000] if quick else [1000, 10000, 100000],
                           0.5 if quick else 3.0)
            if redis_ok:
                try:
                    res["b4_redis"] = b4(bin_dir, run_dir, a.ownership, [1000] if quick else [1000, 10000],
                                         0.5 if quick else 3.0, store=f"redis://{HOST}:{REDIS}")
                except RuntimeError as e:
                    # The Redis leg is a report, not a gate: a failure there must not lose the whole run.
                    res["b4_redis_note"] = f"not measured: {e}"
                    log("B4 redis failed:", e)
        if want("b5"):
            res["b5"] = b5(bin_dir, run_dir, a.envoy, a.guard_wasm.resolve(), a.floor_wasm.resolve(),
                           [16384] if quick else [100, 16384, 262144], 1.0 if quick else 2.0,
                           streams=50 if quick else 200)
    finally:
        for p in reversed(procs):
            p.stop()
    res["duration_s"] = time.monotonic() - t0
    res["machine"] = machine(a.envoy)
    res["commands"] = COMMANDS
    (a.out / "results.json").write_text(json.dumps(res, indent=1))
    if only:
        log("partial run (--only): results.json written, no report")
        return
    res["targets"] = targets(res)
    plots(res, a.plots)
    plots_rel = os.path.relpath(a.plots, a.report.parent)
    write_report(res, a.report, plots_rel)
    (a.out / "results.json").write_text(json.dumps(res, indent=1))
    log(f"done in {res['duration_s']:.0f} s: {a.report}")
    for row in res["targets"]:
        log(f"  {'OK ' if row[2] else ('-- ' if row[2] is None else 'MISS')} {row[0]}: {row[1]}")


if __name__ == "__main__":
    main()
