"""make soak-sdk: a rolling deploy of real MCP SDK servers under real SDK clients, measured from the clients'
applications (issue 31).

Topology (all on 127.0.0.1, started and stopped by pid): one Redis, 2 ownership instances on it, 2 Envoys
with the guard (envoy/envoy-ts-affinity.yaml: affinity on Mcp-Session-Id, which servers keeping sessions in
process need), and three pools of replicas, each behind its own cluster (the header x-soak-pool picks it):
`everything` (npm @modelcontextprotocol/server-everything, its own in-memory event store), `py` (the Python
SDK server tests/interop/py_server.py, with an event store) and `rmcp` (tests/rmcp-replica, rmcp's own
cache). Clients reach each Envoy through a small TCP proxy of this process, which the soak closes now and
then (a network blip between client and gateway). Clients: TypeScript SDK 1.32.2 and Python `mcp` 2.3.0
applications (tests/interop/soak_ts_client.mjs, soak_py_client.py; many per process) and rmcp's client
(tests/rmcp-replica rmcp-client, one process per call), each calling the pool's long-running tool again and
again with the SDK's own automatic reconnection and a 30 s request timeout.

Faults: every --fault-every s the next replica in turn is restarted on its address, as a rolling deploy does:
`prestop` marks it gone at the ownership service (POST /v1/owners/gone, what deploy/k8s/mcp-server-prestop.yaml
does) and then stops it; `no_prestop` stops it without. Every --blip-every s one proxy drops every connection.

Every call's outcome comes from the application: completed, settled (the guard's error, with its reason; time
from the break the client saw, and from the replica's death), other error, hung (to the timeout). A repeated,
skipped or foreign progress value or result is a violation, unless the client's own wire shows its SDK asked
for it (a resume from an older cursor than the newest event it had): those are counted apart. Exit 1 on
violations, and on hung calls unless --hung-allowed.

    python tests/chaos/soak_sdk.py --seconds 150 --ts-clients 20 --py-clients 10 --rmcp-clients 4 \
        --report docs/soak-sdk.md --plot docs/soak-sdk-settle.png
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import copy
import json
import os
import platform
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from chaos import ADMIN_PORTS, ENVOY_PORTS, OWNERSHIP_PORTS, Tally, access_logged, check_access_logs, fresh_run, \
    mark_gone, pct, stop_on_sigterm
from stack.envoy import base_envoy_config, hcm, plugin_config, set_endpoints
from stack.procs import BIN, HOST, REPLICA_PORTS, ROOT, RUNS, Proc, binary
from stack.services import INTEROP, NODE, PYTHON, py_server
from stack.topology import Stack

PATH = "/mcp"
BASE = "envoy-ts-affinity.yaml"
# The proxies clients connect to, one in front of each Envoy.
PROXY_PORTS = [p + 5 for p in ENVOY_PORTS]
_R = REPLICA_PORTS[0]
POOLS = {"everything": [_R, _R + 1, _R + 2], "py": [_R + 3, _R + 4], "rmcp": [_R + 5, _R + 6]}
EVERYTHING = INTEROP / "node_modules" / "@modelcontextprotocol" / "server-everything" / "dist" / "index.js"
FAULT_KINDS = ("prestop", "no_prestop")
TIMEOUT_MS = 30000
SDKS = ("typescript", "python", "rmcp")


# ---- the servers ---------------------------------------------------------------------------------------------

def replica_proc(pool: str, port: int, k: int, state_dir: Path, py_store: str = "session") -> Proc:
    """A replica of `pool` on `port`, not started (Proc.start() starts it again on the same address)."""
    if pool == "everything":
        # server-everything binds every interface; the preload keeps it on 127.0.0.1.
        return Proc(f"everything-{k}", [NODE, "--import", INTEROP / "loopback.mjs", EVERYTHING, "streamableHttp"],
                    port=port, env={"PORT": str(port)})
    if pool == "py":
        # A store per session (see py_server.py); `process`: the SDK's one store shared by every session.
        return py_server(port, f"py{k}", "--retry-ms", 200, "--idle-s", 600,
                         *(["--store-per-session"] if py_store == "session" else []))
    return Proc(f"rmcp-r{k}", [binary("rmcp-replica"), "--listen", f"{HOST}:{port}", "--name", f"r{k}",
                               "--state-dir", state_dir, "--sse-retry-ms", 500], port=port)


def pooled(cfg: dict, i: int) -> None:
    """Gateway i: one cluster per pool, and before each MCP route one that sends `x-soak-pool: <pool>` there
    (the same route otherwise: the guard's strict owner pin on it, the envelope affinity before it)."""
    access_logged(cfg, i)
    clusters = cfg["static_resources"]["clusters"]
    base = next(c for c in clusters if c["name"] == "mcp_replicas")
    for pool, ports in POOLS.items():
        c = copy.deepcopy(base)
        c["name"] = c["load_assignment"]["cluster_name"] = f"mcp_{pool}"
        set_endpoints(c, [(HOST, p) for p in ports])
        clusters.append(c)
    vh = hcm(cfg)["route_config"]["virtual_hosts"][0]
    routes = []
    for r in vh["routes"]:
        if "path" in r["match"] and r.get("route", {}).get("cluster") == "mcp_replicas":
            for pool in POOLS:
                rr = copy.deepcopy(r)
                rr["match"]["headers"] = [{"name": "x-soak-pool", "string_match": {"exact": pool}}]
                rr["route"]["cluster"] = f"mcp_{pool}"
                routes.append(rr)
        routes.append(r)
    vh["routes"] = routes


# ---- network blips: a TCP proxy in front of each Envoy -------------------------------------------------------

class Proxy:
    """127.0.0.1:listen -> 127.0.0.1:target, served by an event loop in a thread; blip() closes every
    connection it carries at once (both sides), as a network blip does to the client."""

    def __init__(self, listen: int, target: int):
        self.listen, self.target = listen, target
        self.loop = asyncio.new_event_loop()
        self.conns: set[asyncio.StreamWriter] = set()
        self.server = None
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    async def _pipe(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while data := await r.read(65536):
                w.write(data)
                await w.drain()
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            w.close()

    async def _handle(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        try:
            ur, uw = await asyncio.open_connection(HOST, self.target)
        except OSError:
            cw.close()
            return
        self.conns.update((cw, uw))
        try:
            await asyncio.gather(self._pipe(cr, uw), self._pipe(ur, cw))
        finally:
            self.conns.difference_update((cw, uw))

    def start(self) -> "Proxy":
        self.thread.start()
        self.server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._handle, HOST, self.listen), self.loop).result(10)
        return self

    async def _cut(self) -> int:
        """Abort every connection (client and Envoy side; both count): the peers see a reset."""
        n = len(self.conns)
        for w in list(self.conns):
            w.transport.abort()
        return n

    def blip(self) -> int:
        return asyncio.run_coroutine_threadsafe(self._cut(), self.loop).result(10)

    def stop(self) -> None:
        if self.server is not None:
            self.loop.call_soon_threadsafe(self.server.close)
            self.blip()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


# ---- the clients -------------------------------------------------------------------------------------------

def urls() -> str:
    return ",".join(f"http://{HOST}:{p}{PATH}" for p in PROXY_PORTS)


def start_sdk_clients(args) -> list[tuple[str, subprocess.Popen, Path]]:
    out = []
    common = ["--urls", urls(), "--seconds", str(args.seconds), "--timeout-ms", str(TIMEOUT_MS),
              "--seed", str(args.seed)]
    for sdk, n, cmd, pools in (
            ("typescript", args.ts_clients, [NODE, INTEROP / "soak_ts_client.mjs"], args.ts_pools),
            ("python", args.py_clients, [PYTHON, INTEROP / "soak_py_client.py"], args.py_pools)):
        if n <= 0:
            continue
        log = RUNS / f"soak-sdk-{sdk}.jsonl"
        p = subprocess.Popen([str(c) for c in cmd] + common + ["--clients", str(n), "--pools", pools],
                             stdout=open(log, "w"), stderr=open(RUNS / f"soak-sdk-{sdk}.err", "w"),
                             cwd=ROOT, start_new_session=True, env={**os.environ, "NODE_NO_WARNINGS": "1"})
        out.append((sdk, p, log))
    return out


REASON = re.compile(r"not honoured \((\w+)\)")


def rmcp_call(i: int, n: int) -> dict:
    """One call by rmcp's own client (a process per call: rmcp-client makes one), as its record."""
    label = f"rmcp{i}-{n}"
    url = f"http://{HOST}:{PROXY_PORTS[i % len(PROXY_PORTS)]}{PATH}"
    rec = {"sdk": "rmcp", "client": f"rmcp-{i}", "pool": "rmcp", "start": int(time.time() * 1000), "end": None,
           "outcome": None, "reason": None, "code": None, "message": None, "break_at": None, "replica": None,
           "progress": [], "resumes": 0, "answers": [], "violations": []}
    try:
        r = subprocess.run([str(binary("rmcp-client")), "--url", url, "--steps", "6", "--step-ms", "500",
                            "--label", label, "--timeout-ms", str(TIMEOUT_MS), "--header", "x-soak-pool:rmcp"],
                           capture_output=True, text=True, timeout=TIMEOUT_MS / 1000 + 10)
        out = json.loads([ln for ln in r.stdout.splitlines() if ln.startswith("{")][-1])
    except subprocess.TimeoutExpired:
        out = {"error": "timeout: rmcp-client did not end"}
    except (IndexError, ValueError):
        out = {"error": f"rmcp-client gave no report: {r.stderr[-200:]}"}
    rec["end"] = int(time.time() * 1000)
    rec["progress"] = [int(p) for p in out.get("progress") or []]
    newest = None
    for st in out.get("streams") or []:
        if st.get("method") == "GET" and st.get("last_event_id"):
            rec["resumes"] += 1
            # rmcp asked for a replay from before the newest event it had (see soak_ts_client.mjs).
            if newest and st["last_event_id"] != newest:
                rec["stale_resume"] = True
        newest = (st.get("ids") or [newest])[-1]
    prev = 0
    for k in rec["progress"]:
        if k <= prev:
            rec["violations"].append(f"progress {k} repeated after {prev}")
        elif k != prev + 1:
            rec["violations"].append(f"progress {k} after {prev}: skipped without a signal")
        prev = k
    if out.get("result") is not None:
        rec["outcome"] = "completed"
        if f"label={label} " not in out["result"]:
            rec["violations"].append(f"result not this call's: {out['result'][:160]}")
        if len(rec["progress"]) != 6:
            rec["violations"].append(f"result after progress {rec['progress']}")
    else:
        err = str(out.get("error"))
        rec["message"] = err[:240]
        m = REASON.search(err)
        if m:
            rec["outcome"], rec["reason"] = "settled", m.group(1)
        elif err.startswith("timeout"):
            rec["outcome"] = "hung"
        else:
            rec["outcome"] = "error"
    return rec


def rmcp_clients(i: int, deadline: float, stop: threading.Event, out: list, lock: threading.Lock) -> None:
    n = 0
    rng = random.Random(i)
    while time.time() < deadline and not stop.is_set():
        rec = rmcp_call(i, n)
        n += 1
        with lock:
            out.append(rec)
        stop.wait(0.05 + rng.random() * 0.2)


def read_records(path: Path) -> tuple[list[dict], list[str]]:
    recs, notes = [], []
    for line in path.read_text(errors="replace").splitlines() if path.exists() else []:
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if "outcome" in r:
            recs.append(r)
        elif "fatal" in r:
            notes.append(f"{path.name}: {r['fatal']}"[:300])
    return recs, notes


# ---- analysis and report -----------------------------------------------------------------------------------

def attribute(recs: list[dict], deaths: list[dict]) -> None:
    """For each call: `from_break` (ms from the first break its client saw to its end) and `from_death` (ms
    from the death during the call of its session's replica, or of any replica of its pool when the client
    does not know which, to its end)."""
    for r in recs:
        r["from_break"] = r["end"] - r["break_at"] if r.get("break_at") else None
        window = [d for d in deaths if d["pool"] == r["pool"] and r["start"] - 1000 <= d["at"] <= r["end"]
                  and d["owner"] == (r.get("replica") or d["owner"])]
        d = window[-1] if window else None
        r["from_death"] = r["end"] - d["at"] if d else None
        r["death_kind"] = d["kind"] if d else None


def q(values: list[float]) -> str:
    if not values:
        return "-"
    return " / ".join(f"{v / 1000:.2f}" for v in (pct(values, 0.5), pct(values, 0.9), pct(values, 0.99), max(values)))


def ours(r: dict) -> list[str]:
    """A call's violations the guard answers for: none when the SDK itself resumed from an older cursor
    than the newest event it had been given (the replay then repeats what it asked for)."""
    return [] if r.get("stale_resume") else r["violations"]


def sdks(r: dict) -> list[str]:
    return r["violations"] if r.get("stale_resume") else []


def summary_rows(groups: dict[str, list[dict]]) -> list[str]:
    rows = ["| client | calls | completed (after a break) | settled | other error | hung | violations | "
            "SDK's own (stale cursor) | settle from break, s (p50 / p90 / p99 / max) | "
            "settle from death, s (p50 / p90 / p99 / max) |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |"]
    for name, rs in groups.items():
        c = collections.Counter(r["outcome"] for r in rs)
        after_break = sum(1 for r in rs if r["outcome"] == "completed" and (r.get("break_at") or r["resumes"]))
        settled = [r for r in rs if r["outcome"] == "settled"]
        viol = sum(1 for r in rs if ours(r))
        own = sum(1 for r in rs if sdks(r))
        rows.append(f"| {name} | {len(rs)} | {c['completed']} ({after_break}) | {c['settled']} | {c['error']} | "
                    f"{'**%d**' % c['hung'] if c['hung'] else 0} | {'**%d**' % viol if viol else 0} | {own} | "
                    f"{q([r['from_break'] for r in settled if r['from_break'] is not None])} | "
                    f"{q([r['from_death'] for r in settled if r['from_death'] is not None])} |")
    return rows


def error_kind(msg: str | None) -> str:
    """Another error, with ids, ports and numbers taken out, so that alike errors count together."""
    m = re.sub(r"[0-9a-f]{8}-[0-9a-f-]{27,}", "<id>", msg or "?")
    m = re.sub(r"\d+", "N", m)
    return m[:110].replace("|", "/")


def answers(r: dict) -> str:
    """The guard's answers to a call's resumes, alike ones counted: `200 ×57; 200 rejected; reason=gap`."""
    c = collections.Counter(r.get("answers") or [])
    return "; ".join(f"{a} ×{n}" if n > 1 else a for a, n in c.items()) or "-"


def plot(recs: list[dict], path: Path, title: str) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    colors = {"typescript": "#4c72b0", "python": "#dd8452", "rmcp": "#55a868"}
    fig, ax = plt.subplots(figsize=(7, 4))
    for sdk in SDKS:
        for key, style, what in (("from_death", "-", "from the replica's death"), ("from_break", "--", "from the break")):
            xs = sorted(r[key] / 1000 for r in recs if r["sdk"] == sdk and r["outcome"] == "settled"
                        and r.get(key) is not None)
            if xs:
                ax.step(xs, [(i + 1) / len(xs) for i in range(len(xs))], style, where="post", color=colors[sdk],
                        label=f"{sdk}, {what} (n={len(xs)})")
    ax.set_xlim(left=0)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("time to settle (s)")
    ax.set_ylabel("fraction of settled calls")
    ax.set_title(title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def retry_hint(args) -> int:
    """The guard's `retry:` hint in this run (ms; 0: none)."""
    if args.client_retry_ms is not None:
        return args.client_retry_ms
    return plugin_config(base_envoy_config(BASE)).get("client_retry_ms", 0)


def report(args, recs: list[dict], deaths: list[dict], blips: list[dict], tally: Tally, notes: list[str],
           started: float, elapsed: float, plotted: Path | None) -> str:
    by_sdk = {s: [r for r in recs if r["sdk"] == s] for s in SDKS if any(r["sdk"] == s for r in recs)}
    by_pair = {f"{s} → {p}": [r for r in recs if r["sdk"] == s and r["pool"] == p]
               for s in SDKS for p in POOLS if any(r["sdk"] == s and r["pool"] == p for r in recs)}
    by_fault = {f"{s}, {k}": [r for r in recs if r["sdk"] == s and r.get("death_kind") == k]
                for s in SDKS for k in FAULT_KINDS if any(r["sdk"] == s and r.get("death_kind") == k for r in recs)}
    reasons = collections.Counter((r["sdk"], r["reason"]) for r in recs if r["outcome"] == "settled")
    others = collections.Counter((r["sdk"], r["pool"], error_kind(r["message"])) for r in recs
                                 if r["outcome"] == "error")
    hung = [r for r in recs if r["outcome"] == "hung"]
    t0 = min([r["start"] for r in recs] or [0])
    faults = collections.Counter(d["kind"] for d in deaths)
    lines = [
        "# SDK soak: a rolling deploy under real SDK clients",
        "",
        "Written by `make soak-sdk` (tests/chaos/soak_sdk.py; `make test` runs a short one into "
        "target/soak-sdk-smoke/). Real SDK clients call a long-running tool again and again while the replicas "
        "behind the guard are restarted one after another on their addresses and the network between clients "
        "and gateways blips; every outcome below is what the client *application* got. The notes at the end "
        "are kept from run to run.",
        "",
        f"Command: `{args.command}`{' (control run: **no guard**)' if args.no_guard else ''}"
        f"{'; Python servers with one event store per process (`--py-store process`)' if args.py_store == 'process' else ''}",
        f"Run: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(started))}, {elapsed:.0f} s (calls start for "
        f"{args.seconds:.0f} s; the last ones end within their {TIMEOUT_MS // 1000} s timeout); seed {args.seed}; "
        f"machine: {os.cpu_count()} cores, {platform.machine()}, shared with other jobs (timings are noisy). "
        f"Binaries: `{os.path.relpath(BIN, ROOT)}`, guard `.wasm` (release).",
        f"Topology: 2 Envoys (envoy/envoy-ts-affinity.yaml, one cluster per pool) with the guard "
        f"(`client_retry_ms` {retry_hint(args)}), 2 ownership "
        f"instances on one Redis; replicas: {', '.join(f'{len(v)} {k}' for k, v in POOLS.items())}; clients: "
        f"{args.ts_clients} TypeScript SDK 1.32.2, {args.py_clients} Python mcp 2.3.0, {args.rmcp_clients} rmcp "
        f"3.11.0 (rmcp-client), each through a TCP proxy in front of either Envoy.",
        f"Faults: a replica restarted on its address every {args.fault_every:g} s, in turn "
        f"({', '.join(f'{faults[k]} {k}' for k in FAULT_KINDS)}); {len(blips)} network blips (a proxy closed "
        f"every connection it carried: {sum(b['conns'] for b in blips)} client and gateway sides in all).",
        "",
        "## Per SDK client",
        "",
        *summary_rows(by_sdk),
        "",
        "**settled**: the call ended with the guard's error (-32010) naming its reason. **from break**: from the "
        "moment the client's stream carrying the call ended or failed without the call's response (the first such "
        "end since its progress last flowed; measured in the client's fetch/transport, not for rmcp-client), to "
        "the call's end. **from death**: from the "
        "replica's exit (the stop of a `prestop` or `no_prestop` restart during the call; its own replica when "
        "the client knows it) to the call's end. **hung**: the call hit the 30 s request timeout.",
        "",
        "## Per client and server",
        "",
        *summary_rows(by_pair),
        "",
        "## By the restart that broke the call",
        "",
        *summary_rows(by_fault),
        "",
        "## Reasons of settled calls",
        "",
        "| client | reason | calls |",
        "| --- | --- | ---: |",
        *[f"| {s} | {reason} | {n} |" for (s, reason), n in sorted(reasons.items(), key=lambda x: (x[0][0], str(x[0][1])))],
        "",
        "## Other errors",
        "",
        "| client | server | error (normalized) | calls |",
        "| --- | --- | --- | ---: |",
        *[f"| {s} | {p} | `{m}` | {n} |" for (s, p, m), n in others.most_common(25)],
        "",
    ]
    if plotted is not None:
        lines += [f"![time to settle, CDF]({plotted.name})", ""]
    lines += ["## Hung calls", ""]
    if hung:
        pattern = collections.Counter(
            (r["sdk"], r["pool"], r.get("death_kind") or "none", r.get("phase") or "call",
             " / ".join(sorted({a.split(";")[0] for a in r.get("answers") or []})) or "no resume",
             "many" if r["resumes"] > 3 else str(r["resumes"])) for r in hung)
        lines += ["By pattern: the restart of the call's replica during the call, the phase, and the guard's answers "
                  "to its resumes (status and `Mcp-Resume` kind).", "",
                  "| client | server | restart during the call | phase | answers | resumes | calls |",
                  "| --- | --- | --- | --- | --- | --- | ---: |",
                  *[f"| {' | '.join(k)} | {n} |" for k, n in pattern.most_common()], "", "Each (the first 40):", ""]
        lines += ["| client | server | started (s) | phase | replica | resumes: guard's answers | break → timeout | "
                  "death during the call |", "| --- | --- | ---: | --- | --- | --- | --- | --- |"]
        lines += [f"| {r['client']} | {r['pool']} | {(r['start'] - t0) / 1000:.1f} | {r.get('phase') or 'call'} | "
                  f"{r.get('replica') or '-'} | "
                  f"{r['resumes']}: {answers(r)} | "
                  f"{'%.1f s' % (r['from_break'] / 1000) if r.get('from_break') is not None else '-'} | "
                  f"{r.get('death_kind') or '-'} |" for r in hung[:40]]
    else:
        lines.append("None.")
    viol = [(r["client"], r["pool"], "; ".join(ours(r))) for r in recs if ours(r)] + \
        [("-", "-", f"{k}: {d}") for _, k, d in tally.violations]
    lines += ["", "## Violations", "", "Calls (one line each) whose application got a repeated, skipped or foreign "
              "message without a signal first, and the guard's own 5xx answers.", ""]
    lines += [f"- {c} → {p}: {v}" for c, p, v in viol[:50]] or ["None."]
    own = [(r["client"], r["pool"], "; ".join(sdks(r))) for r in recs if sdks(r)]
    lines += ["", "## The SDK's own repeats", "", "Calls whose SDK resumed from an older cursor than the newest event "
              "it had been given for the call (seen on the client's own wire): the replay repeats what it asked for.",
              ""]
    lines += [f"- {c} → {p}: {v}" for c, p, v in own[:30]] or ["None."]
    if notes:
        lines += ["", "## Run notes", "", *[f"- {n}" for n in notes]]
    lines.append("")
    return "\n".join(lines)


# Everything after this line in an existing report is the reader's notes (what a run showed, by whom): a new
# run keeps it.
KEEP = "<!-- notes below are kept by soak_sdk.py -->"


def kept_notes(path: Path) -> str:
    text = path.read_text() if path.exists() else ""
    return text[text.index(KEEP):] if KEEP in text else ""


# ---- the run -----------------------------------------------------------------------------------------------

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=150)
    ap.add_argument("--ts-clients", type=int, default=20)
    ap.add_argument("--py-clients", type=int, default=10)
    ap.add_argument("--rmcp-clients", type=int, default=4)
    # Client i of an SDK talks to the i-th pool of its list (round robin): server-everything, the issue's
    # server, gets half the TypeScript clients.
    ap.add_argument("--ts-pools", default="everything,everything,py,rmcp")
    ap.add_argument("--py-pools", default="everything,py,rmcp")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--fault-every", type=float, default=7.0)
    ap.add_argument("--blip-every", type=float, default=11.0)
    ap.add_argument("--no-guard", action="store_true",
                    help="the Envoys without the guard: a control run, to tell the servers' and SDKs' own behaviour "
                         "from the guard's")
    ap.add_argument("--py-store", choices=["session", "process"], default="session",
                    help="the Python servers' event store: one per session, or one per process as the SDK gives "
                         "it (its request stream ids repeat across sessions)")
    ap.add_argument("--client-retry-ms", type=int, default=None,
                    help="the guard's client_retry_ms instead of the shipped config's (0: no retry: hint)")
    ap.add_argument("--hung-allowed", action="store_true", help="hung calls are reported but do not fail the run")
    ap.add_argument("--report", type=Path, required=True)
    ap.add_argument("--plot", type=Path, default=None)
    ap.add_argument("--records", type=Path, default=None, help="every call's record (JSON lines)")
    ap.add_argument("--command", default="python tests/chaos/soak_sdk.py")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    tally = Tally()
    state_dir = fresh_run("soak-sdk-state")
    stack = Stack(state_dir, upstreams=[(HOST, p) for ports in POOLS.values() for p in ports],
                  ownership_ports=OWNERSHIP_PORTS, store="redis", gateways=2, envoy_ports=ENVOY_PORTS,
                  admin_ports=ADMIN_PORTS, base=BASE, name="soak", configure=pooled)
    replicas = {p: (pool, replica_proc(pool, p, k + 1, state_dir, args.py_store))
                for pool, ports in POOLS.items() for k, p in enumerate(ports)}
    proxies = [Proxy(lp, ep) for lp, ep in zip(PROXY_PORTS, ENVOY_PORTS)]
    # The rolling order: the first replica of each pool, then the second, ... (7 replicas: an odd number).
    order = [p for k in range(max(map(len, POOLS.values()))) for ports in POOLS.values() for p in ports[k:k + 1]]
    deaths: list[dict] = []
    blips: list[dict] = []
    rmcp_recs: list[dict] = []
    lock = threading.Lock()
    stop = threading.Event()
    clients: list = []
    threads: list[threading.Thread] = []
    notes: list[str] = []

    stop_on_sigterm()
    started = time.time()
    t0 = time.monotonic()

    def phase(what: str) -> None:
        print(f"{time.strftime('%H:%M:%S')} +{time.monotonic() - t0:.1f}s {what}", flush=True)

    ok = False
    try:
        stack.start()
        for _, proc in replicas.values():
            proc.start()
        hint = {} if args.client_retry_ms is None else {"client_retry_ms": args.client_retry_ms}
        stack.use(guard=not args.no_guard, **hint)
        for p in proxies:
            p.start()
        phase("system up")
        deadline = time.time() + args.seconds
        clients = start_sdk_clients(args)
        for i in range(args.rmcp_clients):
            th = threading.Thread(target=rmcp_clients, args=(i, deadline, stop, rmcp_recs, lock), daemon=True)
            th.start()
            threads.append(th)
        next_fault = time.time() + min(args.fault_every, 5.0)
        next_blip = time.time() + args.blip_every / 2
        k = b = 0
        while time.time() < deadline:
            if time.time() >= next_fault:
                port = order[k % len(order)]
                # Kinds alternate; with an odd number of replicas each replica meets both in turn.
                kind = FAULT_KINDS[k % len(FAULT_KINDS)]
                pool, proc = replicas[port]
                k += 1
                marked = kind == "prestop" and mark_gone(port, OWNERSHIP_PORTS, rng, 2.0)
                if kind == "prestop" and not marked:
                    tally.violation("prestop_mark_failed", f"{HOST}:{port}")
                proc.stop(timeout=5)
                deaths.append({"at": int(time.time() * 1000), "owner": f"{HOST}:{port}", "pool": pool, "kind": kind})
                phase(f"{kind}: {pool} {HOST}:{port} stopped")
                proc.start()
                next_fault += args.fault_every
            if time.time() >= next_blip:
                n = proxies[b % len(proxies)].blip()
                blips.append({"at": int(time.time() * 1000), "proxy": b % len(proxies), "conns": n})
                b += 1
                next_blip += args.blip_every * rng.uniform(0.7, 1.3)
            time.sleep(0.1)
        phase("calls stop starting; waiting for the last ones")
        bound = time.time() + TIMEOUT_MS / 1000 + 15
        for sdk, p, _ in clients:
            try:
                p.wait(timeout=max(1.0, bound - time.time()))
            except subprocess.TimeoutExpired:
                notes.append(f"the {sdk} clients did not end in time: killed")
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        for th in threads:
            th.join(timeout=max(1.0, bound - time.time()))
        stop.set()
        check_access_logs(tally)
        ok = True
    finally:
        stop.set()
        for _, p, _ in clients:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        for p in proxies:
            if p.server is not None:
                p.stop()
        for _, proc in replicas.values():
            proc.stop()
        stack.stop()
    recs = list(rmcp_recs)
    for sdk, p, log in clients:
        rs, ns = read_records(log)
        recs += rs
        notes += ns
        if p.returncode not in (0, None):
            notes.append(f"the {sdk} client process exited with {p.returncode} (see {log.with_suffix('.err')})")
    recs.sort(key=lambda r: r["start"])
    attribute(recs, deaths)
    if args.records:
        args.records.parent.mkdir(parents=True, exist_ok=True)
        args.records.write_text("".join(json.dumps(r) + "\n" for r in recs))
    plotted = None
    if args.plot and plot(recs, args.plot, f"Time to settle, {len(deaths)} restarts, {len(blips)} blips"):
        plotted = args.plot
    text = report(args, recs, deaths, blips, tally, notes, started, time.monotonic() - t0, plotted)
    print(text)
    args.report.parent.mkdir(parents=True, exist_ok=True)
    args.report.write_text(text + kept_notes(args.report))
    if not ok:
        return 2
    rc, why = verdict(recs, deaths, len(tally.violations), args)
    print(f"soak-sdk: {why}; {len(deaths)} restarts, {len(blips)} blips", flush=True)
    return rc


def verdict(recs: list[dict], deaths: list[dict], other_violations: int, args) -> tuple[int, str]:
    """The run's exit code and why: 1 on violations the guard answers for, on hung calls unless
    args.hung_allowed, and when an SDK asked for made no call or nothing was restarted."""
    violations = sum(1 for r in recs if ours(r)) + other_violations
    hung = sum(1 for r in recs if r["outcome"] == "hung")
    missing = [s for s, n in (("typescript", args.ts_clients), ("python", args.py_clients),
                              ("rmcp", args.rmcp_clients)) if n > 0 and not any(r["sdk"] == s for r in recs)]
    why = f"{len(recs)} calls, {violations} violations, {hung} hung{' (allowed)' if args.hung_allowed else ''}"
    if missing or not deaths:
        return 1, why + f"; nothing was exercised ({'no calls from ' + ', '.join(missing) if missing else 'no restarts'})"
    return (1 if violations or (hung and not args.hung_allowed) else 0), why


if __name__ == "__main__":
    sys.exit(main())
