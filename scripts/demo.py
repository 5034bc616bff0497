#!/usr/bin/env python3
"""`make demo`: Envoy + mcp-resume-guard + ownership service + three demo replicas.

With --upstreams ip:port,... Envoy fronts your own MCP replicas instead of the demo ones.
Prints a walk-through (one continuation, one restart) and the curl lines to repeat it,
then keeps everything running until Ctrl-C, and stops what it started by pid.
"""
import argparse
import signal
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
import harness as h  # noqa: E402

URL = f"http://{h.HOST}:{h.ENVOY_PORT}{h.PATH}"


def parse_upstreams(text: str) -> list[tuple[str, int]]:
    out = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        host, _, port = part.rpartition(":")
        if not host or not port.isdigit():
            sys.exit(f"make demo: UPSTREAMS: '{part}' is not ip:port")
        out.append((host, int(port)))
    return out


def envoy_config(upstreams: list[tuple[str, int]]) -> dict:
    return h.envoy_config(guard=True, upstreams=upstreams or None)


def walkthrough(own_replicas: bool) -> None:
    print("\n== walk-through ==")
    c = h.Client(version="2025-06-18")
    try:
        sid = c.initialize()
    except Exception as e:  # a user's replica may want other headers; the curl lines still apply
        print(f"initialize through Envoy failed ({e}); try the curl lines below by hand.")
        return
    print(f"1. initialize -> Mcp-Session-Id: {sid}")
    s = c.get_stream()
    print(f"2. GET stream served by {s.header('x-replica') or 'a replica'}; ids the client sees are guard cursors:")
    evs = []
    try:
        s.conn.sock.settimeout(5)
        evs = s.read(3)
    except OSError:
        pass
    s.close()
    for e in evs:
        print(f"     id: {e.id[:40]}...  data: {e.data[:70]}")
    if len(evs) < 2:
        print("   (the upstream sent fewer than 2 events on its GET stream; nothing to resume)")
    else:
        r = c.get_stream(last_event_id=evs[0].id)
        r.conn.sock.settimeout(5)
        got = r.read(2)
        r.close()
        same = got and got[0].id == evs[1].id
        print(f"3. resume with the first id -> {r.status}, served by {r.header('x-replica') or 'the owner'}, "
              f"no Mcp-Resume header: {r.header('mcp-resume') is None}; replay starts at the next event: {bool(same)}")
    r = c.get_stream(last_event_id="e7")
    r.conn.sock.settimeout(5)
    first = r.read(1)
    r.close()
    print(f"4. resume with a legacy id 'e7' -> {r.status}, Mcp-Resume: {r.header('mcp-resume')}")
    if first:
        print(f"     first event: event: {first[0].event}  data: {first[0].data}")
    print(f"""
== try it yourself ==
SID=$(curl -si {URL} -H 'content-type: application/json' -H 'accept: application/json, text/event-stream' \\
  -d '{{"jsonrpc":"2.0","id":1,"method":"initialize","params":{{"protocolVersion":"2025-06-18","capabilities":{{}},"clientInfo":{{"name":"curl","version":"0"}}}}}}' \\
  | awk -F': ' 'tolower($1)=="mcp-session-id"{{print $2}}' | tr -d '\\r')
curl -sN {URL} -H "mcp-session-id: $SID" -H 'accept: text/event-stream'          # copy an id:, Ctrl-C
curl -siN {URL} -H "mcp-session-id: $SID" -H 'accept: text/event-stream' -H "last-event-id: <that id>"   # continuation
curl -siN {URL} -H "mcp-session-id: $SID" -H 'accept: text/event-stream' -H 'last-event-id: e7'          # restart, see Mcp-Resume
curl -s http://{h.HOST}:{h.ADMIN_PORT}/stats | grep mcp_resume_guard                                      # the guard's stats
""")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--upstreams", default="", help="ip:port,... of your MCP replicas (default: three demo replicas)")
    args = ap.parse_args()
    upstreams = parse_upstreams(args.upstreams)
    procs: list[h.Proc] = []

    def stop(*_):
        for p in reversed(procs):
            p.stop()
        print("\nstopped everything the demo started.")
        sys.exit(0)

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    state = Path(tempfile.mkdtemp(prefix="mcp-demo-"))
    try:
        if not upstreams:
            for i, port in enumerate(h.REPLICA_PORTS):
                procs.append(h.start_replica(port, f"r{i + 1}", state, ring=64, tick_ms=500))
        procs.append(h.start_ownership())
        procs.append(h.Envoy("demo-envoy", envoy_config(upstreams)).start())
    except Exception as e:
        print(f"make demo: could not start: {e} (logs in {h.RUNS})")
        stop()
    where = ",".join(f"{a}:{p}" for a, p in upstreams) or "demo replicas " + ", ".join(
        f"{h.HOST}:{p}" for p in h.REPLICA_PORTS)
    print(f"Envoy on {URL} (admin http://{h.HOST}:{h.ADMIN_PORT}), ownership on {h.HOST}:{h.OWNERSHIP_PORT}, "
          f"upstreams: {where}")
    walkthrough(not upstreams)
    print("Running. Ctrl-C stops everything.")
    while True:
        time.sleep(1)
        for p in procs:
            if not p.alive:
                print(f"{p.name} exited; see {p.log_path}")
                stop()


if __name__ == "__main__":
    main()
