#!/usr/bin/env python3
"""`make demo`: Envoy + mcp-resume-guard + ownership service + three demo replicas.

  --upstreams ip:port,...   Envoy fronts your MCP replicas instead of the demo ones
  --config FILE.json        the plugin configuration to run (checked first with mcp-guard)
  --store memory|redis://HOST:PORT|redis-cluster://...   the ownership service's store
  --affinity                session affinity on Mcp-Session-Id (envoy/envoy-ts-affinity.yaml), for
                            servers that keep sessions in their process (TypeScript/Python SDKs,
                            server-everything): every request of a session goes to its replica

Prints a walk-through (continuation, restart, stripped POST cursor) and the guard's labelled
stats, then keeps running until Ctrl-C. The walk-through never ends the demo: a step the
upstream cannot show is reported and skipped. Whatever happens, every process the demo started
is stopped: on exit and on SIGINT/SIGTERM/SIGHUP by pid, and, if the demo itself is killed, by the
kernel (each child has PR_SET_PDEATHSIG).
"""
from __future__ import annotations

import argparse
import base64
import ctypes
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

import stack.client as mcp
from stack.cluster import RedisCluster
from stack.envoy import Envoy, config_holder, guard_filter
from stack.procs import ADMIN_PORT, BIN, ENVOY_PORT, HOST, OWNERSHIP_PORT, REPLICA_PORTS, ROOT, RUNS, Proc
from stack.services import start_redis
from stack.topology import Stack

URL = f"http://{HOST}:{ENVOY_PORT}{mcp.PATH}"
CLI = BIN / "mcp-guard"
STEP_TIMEOUT = 3.0  # seconds any one walk-through read may wait
# The Envoy config with session affinity on Mcp-Session-Id, composed with the guard's owner pin.
AFFINITY_BASE = "envoy-ts-affinity.yaml"


def set_pdeathsig() -> None:
    """In the child, before exec: die with SIGTERM when the demo dies, however it dies."""
    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGTERM), 0, 0, 0)


Proc.preexec_fn = staticmethod(set_pdeathsig)


class DemoError(Exception):
    """A reason to stop before the walk-through, said in one line."""


def cluster_nodes(store: str) -> list[tuple[str, int]]:
    """The host:port seeds of a redis-cluster:// URL (credentials, if any, dropped)."""
    rest = store.split("://", 1)[-1].rsplit("@", 1)[-1].split("/", 1)[0].split("?", 1)[0]
    out = []
    for part in filter(None, rest.split(",")):
        host, _, port = part.rpartition(":")
        if host and port.isdigit():
            out.append((host, int(port)))
    return out


def parse_upstreams(text: str) -> list[tuple[str, int]]:
    out = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        host, _, port = part.rpartition(":")
        if not host or not port.isdigit():
            raise DemoError(f"UPSTREAMS: '{part}' is not ip:port")
        out.append((host, int(port)))
    return out


def listening(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.3):
            return True
    except OSError:
        return False


def require_free(port: int, what: str) -> None:
    if listening(HOST, port):
        raise DemoError(f"port {port} ({what}) is already in use: `ss -ltnp 'sport = :{port}'` shows "
                        f"by whom; stop it, or run with E2E_PORT_OFFSET=N to shift every port")


def check_config(path: Path) -> None:
    """mcp-guard check-config: the filter's own parser and the chain checks; errors name the field."""
    if not CLI.exists():
        raise DemoError(f"{CLI} missing: `cargo build -p mcp-guard` (make demo does)")
    r = subprocess.run([str(CLI), "check-config", str(path)], capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        raise DemoError(f"{path} is not a valid configuration:\n{r.stdout}{r.stderr}".rstrip())


def run_config(config: Path):
    """A gateway config change: the guard runs the plugin configuration in `config`."""
    def configure(cfg: dict, _i: int) -> None:
        f = guard_filter(cfg)
        assert f is not None
        config_holder(f)["value"] = config.read_text()
    return configure


# ---- processes ---------------------------------------------------------------------------

class Demo:
    def __init__(self) -> None:
        self.stack: Stack | None = None
        self.procs: list[Proc] = []  # what the stack does not run: a local store asked for by STORE
        self.state: Path | None = None

    def start(self, p: Proc) -> Proc:
        self.procs.append(p)  # before start: a half-started process is stopped too
        p.start()
        return p

    def running(self) -> list[Proc]:
        return [*self.procs, *(self.stack.processes().values() if self.stack else [])]

    def stop(self) -> None:
        for p in reversed(self.running()):
            try:
                p.stop(timeout=5)
            except Exception as e:  # keep stopping the others
                print(f"could not stop {p.name}: {e}", file=sys.stderr)
        self.procs.clear()
        self.stack = None

    def start_store(self, store: str) -> list[str]:
        """The ownership service's --store flag; starts a local redis-server when asked for one
        on 127.0.0.1 where nothing listens yet."""
        if store in ("", "memory"):
            return []
        u = urlsplit(store)
        if u.scheme == "redis" and u.hostname in ("127.0.0.1", "localhost") and u.port:
            if not listening("127.0.0.1", u.port):
                if not shutil.which("redis-server"):
                    raise DemoError("STORE=redis://127.0.0.1:... needs redis-server: `make redis`")
                print(f"starting redis-server on 127.0.0.1:{u.port} (stopped with the demo)")
                self.procs.append(start_redis(u.port, name=f"demo-redis-{u.port}"))
        elif u.scheme == "redis-cluster" and not any(listening(a, p) for a, p in cluster_nodes(store)):
            self.start_local_cluster(store)
        elif u.scheme not in ("redis", "redis-cluster"):
            raise DemoError(f"STORE: expected memory, redis://HOST:PORT or redis-cluster://..., got {store!r}")
        # redis-cluster:// is passed through: the service says whether it supports it.
        return ["--store", store]

    def start_local_cluster(self, store: str) -> None:
        """Nothing listens at any node of STORE=redis-cluster://127.0.0.1:P[,...]: a local cluster of three
        masters and three replicas on six consecutive ports from the lowest one named."""
        nodes = cluster_nodes(store)
        if not nodes or any(a not in ("127.0.0.1", "localhost") for a, _ in nodes):
            raise DemoError(f"STORE={store}: no node answers, and a local cluster is started only on 127.0.0.1")
        base = min(p for _, p in nodes)
        if any(p not in range(base, base + 6) for _, p in nodes):
            raise DemoError(f"STORE={store}: no node answers; to start a local cluster name ports within "
                            f"{base}..{base + 5} (three masters, three replicas)")
        for tool in ("redis-server", "redis-cli"):
            if not shutil.which(tool):
                raise DemoError(f"STORE=redis-cluster://127.0.0.1:... needs {tool}: `make redis`")
        for p in range(base, base + 6):
            require_free(p, "local Redis Cluster node")
        print(f"starting a local Redis Cluster on 127.0.0.1:{base}..{base + 5}, 3 masters + 3 replicas "
              "(stopped with the demo)")
        rc = RedisCluster(base, name="demo")
        try:
            rc.start()
        finally:
            self.procs.extend(rc.nodes.values())

    def run(self, args: argparse.Namespace) -> None:
        upstreams = parse_upstreams(args.upstreams)
        config = Path(args.config).resolve() if args.config else None
        if config is not None:
            if not config.exists():
                raise DemoError(f"CONFIG={args.config}: no such file")
            check_config(config)
        for port, what in [(ENVOY_PORT, "Envoy listener"), (ADMIN_PORT, "Envoy admin"),
                           (OWNERSHIP_PORT, "ownership service")]:
            require_free(port, what)
        if not upstreams:
            for port in REPLICA_PORTS:
                require_free(port, "demo replica")
        store_flag = self.start_store(args.store)
        state = self.state = Path(tempfile.mkdtemp(prefix="mcp-demo-"))
        self.stack = Stack(state, replicas="naive", replica_args={"ring": 64, "tick_ms": 500},
                           ownership_args=store_flag, upstreams=upstreams, name="demo-envoy",
                           base=AFFINITY_BASE if args.affinity else None,
                           configure=run_config(config) if config is not None else None)
        self.stack.start()
        envoy = self.stack.envoy = Envoy("demo-envoy", self.stack.gateway_config(0))
        check_config(envoy.cfg_path)  # the whole chain, as it will run
        envoy.start()
        where = ",".join(f"{a}:{p}" for a, p in upstreams) or "demo replicas " + ", ".join(
            f"{HOST}:{p}" for p in REPLICA_PORTS)
        print(f"Envoy on {URL} (admin http://{HOST}:{ADMIN_PORT}), ownership on "
              f"{HOST}:{OWNERSHIP_PORT} (store: {args.store or 'memory'}), upstreams: {where}")
        if args.affinity:
            print(f"session affinity on Mcp-Session-Id (envoy/{AFFINITY_BASE}): the session id clients see "
                  "carries its replica (`<replica>;UV:<server's id>`), and every request of the session goes there")
        for p in self.running():
            print(f"  {p.name}: pid {p.proc.pid if p.proc else '?'}, log {p.log_path}")
        walkthrough(envoy.cfg_path)
        print_stats()
        print(TRY_IT)
        if args.once:
            return
        print("Running. Ctrl-C stops everything.", flush=True)
        while True:
            time.sleep(1)
            for p in self.running():
                if not p.alive:
                    raise DemoError(f"{p.name} exited; see {p.log_path}")


# ---- walk-through --------------------------------------------------------------------------

def step(title: str):
    """Run one walk-through step; any failure is said in one line and the demo goes on."""
    def wrap(fn):
        def run(*a, **kw):
            try:
                return fn(*a, **kw)
            except Exception as e:  # an upstream that cannot show this step is not a crash
                print(f"   ({title}: could not show it: {type(e).__name__}: {e})")
                return None
        return run
    return wrap


def read_events(s: mcp.SSEStream, n: int, timeout: float = STEP_TIMEOUT) -> list[mcp.Event]:
    """Up to n events within `timeout` seconds; an idle stream gives fewer, never an exception."""
    return s.read_within(timeout, lambda evs: len(evs) >= n)


def inspect(cfg: Path, cursor: str, session: str) -> str:
    r = subprocess.run([str(CLI), "inspect-cursor", "--config", str(cfg), "--session", session, cursor],
                       capture_output=True, text=True, timeout=10)
    return (r.stdout or r.stderr).rstrip()


def server_session(sid: str) -> str:
    """The server's own session id, to which the guard binds cursors. With affinity the client
    sees Envoy's envelope, `<base64 replica>;UV:<base64 server id>`."""
    _, sep, wrapped = sid.partition(";UV:")
    if not sep:
        return sid
    try:
        return base64.b64decode(wrapped, validate=True).decode()
    except ValueError:
        return sid


@step("initialize")
def do_initialize(c: mcp.Client) -> str:
    sid = c.initialize()
    print(f"1. initialize -> Mcp-Session-Id: {sid}")
    return sid


@step("GET stream")
def do_get_stream(c: mcp.Client, cfg: Path) -> list[mcp.Event]:
    s = c.get_stream()
    try:
        evs = read_events(s, 3)
    finally:
        s.close()
    print(f"2. GET stream -> {s.status}, served by {s.header('x-replica') or 'a replica'}; "
          f"{len(evs)} event(s) within {STEP_TIMEOUT:.0f} s")
    for e in evs:
        print(f"     id: {(e.id or '')[:40]}...  data: {e.data[:70]}")
    with_ids = [e for e in evs if e.id]
    if with_ids and c.session:
        print("   the first id, decoded by `mcp-guard inspect-cursor`:")
        print("     " + inspect(cfg, with_ids[0].id, server_session(c.session)).replace("\n", "\n     "))
    return with_ids


@step("continuation")
def do_continue(c: mcp.Client, evs: list[mcp.Event]) -> None:
    if len(evs) < 2:
        print(f"3. continuation: not shown: the upstream's GET stream sent {len(evs)} event(s) with an id "
              f"within {STEP_TIMEOUT:.0f} s (an idle GET stream is normal); nothing to resume")
        return
    r = c.get_stream(last_event_id=evs[0].id)
    try:
        got = read_events(r, 1)
    finally:
        r.close()
    same = bool(got) and got[0].id == evs[1].id
    print(f"3. resume with the first id -> {r.status}, served by {r.header('x-replica') or 'the owner'}, "
          f"Mcp-Resume: {r.header('mcp-resume') or '(none: continued)'}; replay starts at the next event: {same}")


@step("restart")
def do_restart(c: mcp.Client) -> None:
    r = c.get_stream(last_event_id="e7")
    try:
        first = read_events(r, 1)
    finally:
        r.close()
    print(f"4. resume with a legacy id 'e7' -> {r.status}, Mcp-Resume: {r.header('mcp-resume')}")
    if first:
        print(f"     first event: event: {first[0].event}  data: {first[0].data}")
    else:
        print(f"     (no event within {STEP_TIMEOUT:.0f} s: the control event goes out with the stream's first bytes)")


@step("POST cursor")
def do_post_cursor(c: mcp.Client) -> None:
    r = c.request("POST", {"jsonrpc": "2.0", "id": c.next_id(), "method": "ping"}, {"last-event-id": "e7"})
    print(f"5. POST ping carrying a cursor -> {r.status}, Mcp-Resume: {r.header('mcp-resume')} "
          f"(the body is forwarded, never dropped)")


def walkthrough(cfg: Path) -> None:
    print("\n== walk-through ==")
    c = mcp.Client(version="2025-06-18", timeout=STEP_TIMEOUT)
    sid = do_initialize(c)
    if sid is None:
        print("   (without a session the remaining steps show only what the guard does locally)")
    evs = do_get_stream(c, cfg) or []
    do_continue(c, evs)
    do_restart(c)
    do_post_cursor(c)


def print_stats() -> None:
    """The guard's stats as Prometheus sees them (labels from the stats_tags in envoy.yaml)."""
    print("\n== the guard's stats (http://%s:%d/stats/prometheus) ==" % (HOST, ADMIN_PORT))
    time.sleep(0.2)
    try:
        with urllib.request.urlopen(f"http://{HOST}:{ADMIN_PORT}/stats/prometheus", timeout=3) as r:
            text = r.read().decode()
    except OSError as e:
        print(f"   (could not read them: {e})")
        return
    lines = [ln for ln in text.splitlines() if ln.startswith("mcp_resume_guard_") and "_bucket" not in ln]
    nonzero = [ln for ln in lines if not ln.endswith(" 0")]
    for ln in nonzero:
        print("   " + ln.replace("{}", ""))
    print(f"   ({len(lines) - len(nonzero)} other guard series are 0)")


TRY_IT = f"""
== try it yourself ==
SID=$(curl -si {URL} -H 'content-type: application/json' -H 'accept: application/json, text/event-stream' \\
  -d '{{"jsonrpc":"2.0","id":1,"method":"initialize","params":{{"protocolVersion":"2025-06-18","capabilities":{{}},"clientInfo":{{"name":"curl","version":"0"}}}}}}' \\
  | awk -F': ' 'tolower($1)=="mcp-session-id"{{print $2}}' | tr -d '\\r')
curl -sN {URL} -H "mcp-session-id: $SID" -H 'accept: text/event-stream'          # copy an id:, Ctrl-C
curl -siN {URL} -H "mcp-session-id: $SID" -H 'accept: text/event-stream' -H "last-event-id: <that id>"   # continuation
curl -siN {URL} -H "mcp-session-id: $SID" -H 'accept: text/event-stream' -H 'last-event-id: e7'          # restart, see Mcp-Resume
{CLI.relative_to(ROOT)} inspect-cursor --config {(RUNS / 'demo-envoy.yaml').relative_to(ROOT)} --session "$SID" '<that id>'
curl -s http://{HOST}:{ADMIN_PORT}/stats/prometheus | grep ^mcp_resume_guard                           # the guard's stats
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--upstreams", default="", help="ip:port,... of your MCP replicas (default: three demo replicas)")
    ap.add_argument("--config", default="", help="plugin configuration JSON to run instead of the demo one")
    ap.add_argument("--store", default="memory", help="memory | redis://HOST:PORT | redis-cluster://...")
    ap.add_argument("--affinity", action="store_true",
                    help="session affinity on Mcp-Session-Id (for servers that keep sessions in process)")
    ap.add_argument("--once", action="store_true", help="stop after the walk-through (for tests and CI)")
    args = ap.parse_args()
    demo = Demo()

    def on_signal(signum, _frame):
        raise SystemExit(128 + signum)

    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, on_signal)
    code = 0
    try:
        demo.run(args)
    except DemoError as e:
        print(f"make demo: {e}", file=sys.stderr)
        code = 2
    except SystemExit as e:
        code = 0 if e.code in (128 + signal.SIGINT, 128 + signal.SIGTERM) else int(e.code or 0)
    except Exception as e:  # anything unforeseen still stops what was started
        print(f"make demo: {type(e).__name__}: {e} (logs in {RUNS})", file=sys.stderr)
        code = 1
    finally:
        # No signal may interrupt the cleanup itself.
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(s, signal.SIG_IGN)
        if demo.running():
            demo.stop()
            print("stopped everything the demo started.", flush=True)
        if demo.state is not None:
            shutil.rmtree(demo.state, ignore_errors=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
