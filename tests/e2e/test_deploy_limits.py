"""The shipped deployment defaults under the real Envoy, with the guard:

- session opening is limited per client (envoy/envoy-production.yaml): one client flooding
  `initialize`-shaped POSTs at any rate, with a made-up X-Forwarded-For on each, leaves every
  other client's `initialize` alone;
- a stream that breaks (its HTTP/1.1 upstream exits mid-SSE) reaches the client as EOF within the
  shipped `delayed_close_timeout` (envoy/envoy.yaml), not Envoy's default second;
- `make demo AFFINITY=1` keeps a session on its replica.

Clients bind to their own loopback addresses (127.0.0.2, 127.0.0.3, ...): Linux routes all of
127.0.0.0/8 to lo.
"""
from __future__ import annotations

import http.client
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import threading
import time

import harness as h
from stack.upstream import Upstream

FLOODER = "127.0.0.2"
OTHERS = [f"127.0.0.{i}" for i in range(3, 15)]
FLOOD_S = 3.0
INITIALIZE = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "limits", "version": "0"}}})
PING = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping"})
HEADERS = {"content-type": "application/json", "accept": "application/json, text/event-stream"}


def post(conn: http.client.HTTPConnection, body: str, extra: dict | None = None) -> tuple[int, str | None]:
    conn.request("POST", h.PATH, body=body, headers={**HEADERS, **(extra or {})})
    r = conn.getresponse()
    r.read()
    return r.status, r.getheader("mcp-session-id")


def connect(source: str) -> http.client.HTTPConnection:
    return http.client.HTTPConnection(h.HOST, h.ENVOY_PORT, timeout=5, source_address=(source, 0))


def initialize_others_under(flooder, stop: threading.Event, threads: int = 2) -> list[tuple[str, int, str | None]]:
    """Runs `flooder(n)` on `threads` threads until `stop`, and meanwhile has every one of OTHERS
    open a session, spread over FLOOD_S: (source, status, session id) for each."""
    workers = [threading.Thread(target=flooder, args=(n,), daemon=True) for n in range(threads)]
    for t in workers:
        t.start()
    others = []
    try:
        time.sleep(0.5)  # the flood is on
        for source in OTHERS:
            conn = connect(source)
            try:
                others.append((source, *post(conn, INITIALIZE)))
            finally:
                conn.close()
            time.sleep((FLOOD_S - 0.5) / len(OTHERS))
    finally:
        stop.set()
        for t in workers:
            t.join(timeout=10)
    return others


def test_one_client_at_any_rate_leaves_other_clients_initialize_alone(fresh):
    cfg = h.envoy_config(base="envoy-production.yaml")
    flood: list[int] = []
    stop = threading.Event()

    def flooder(n: int) -> None:
        conn = connect(FLOODER)
        i = 0
        try:
            while not stop.is_set():
                i += 1
                # A fresh forwarded address each time: it must not buy a fresh bucket.
                status, _ = post(conn, PING, {"x-forwarded-for": f"10.{n}.{i // 256 % 256}.{i % 256}"})
                flood.append(status)
        finally:
            conn.close()

    with fresh.own_gateway("envoy-limits", cfg):
        others = initialize_others_under(flooder, stop)
    refused = flood.count(429)
    print(f"\nflood from {FLOODER}: {len(flood)} requests in {FLOOD_S:.0f} s, {refused} refused (429); "
          f"others: {[s for _, s, _ in others]}")
    # Nobody else is limited: every other client opened its session...
    assert [(src, status) for src, status, sid in others if status != 200 or not sid] == [], others
    # ...while the flooder is, by its own bucket (a burst, then about one a second).
    assert len(flood) >= 100 and refused >= len(flood) - 20, (len(flood), refused)


class BreakingUpstream(Upstream):
    """Answers a GET with an SSE stream of one event, then, once `cut` is set, ends the
    connection mid-stream (no terminal chunk), as a replica that exits does."""

    def __init__(self, port: int):
        super().__init__(port)
        self.cut = threading.Event()
        self.cut_at: float | None = None

    def answer(self, method, headers, body, out) -> bool:
        out.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        event = b"id: 1\ndata: first\n\n"
        out.write(b"%x\r\n%s\r\n" % (len(event), event))
        out.flush()
        self.cut.wait(10)
        self.cut_at = time.monotonic()
        return False  # the handler returns: the connection is shut down and closed


def eof_after_break(port: int) -> float:
    """Seconds from the upstream's close to the client's EOF, through Envoy."""
    with BreakingUpstream(port) as up:
        with socket.create_connection((h.HOST, h.ENVOY_PORT), timeout=5) as s:
            s.sendall(f"GET {h.PATH} HTTP/1.1\r\nhost: x\r\naccept: text/event-stream\r\n"
                      f"mcp-session-id: s-break\r\n\r\n".encode())
            seen = b""
            while b"data: first" not in seen:
                chunk = s.recv(65536)
                assert chunk, seen
                seen += chunk
            up.cut.set()
            try:
                while s.recv(65536):
                    pass
            except ConnectionResetError:
                pass
            end = time.monotonic()
        assert up.cut_at is not None
        return end - up.cut_at


def test_a_broken_stream_reaches_the_client_within_the_delayed_close(fresh):
    port = h.OWNERSHIP_PORT + 50
    cfg = h.envoy_config(upstreams=[(h.HOST, port)])
    # Envoy's default is 1 s.
    shipped = float(h.hcm(cfg).get("delayed_close_timeout", "1s").rstrip("s"))
    with fresh.own_gateway("envoy-break", cfg):
        delays = [eof_after_break(port) for _ in range(5)]
    print(f"\nupstream exit -> client EOF (delayed_close_timeout {shipped} s): "
          + ", ".join(f"{d * 1000:.0f} ms" for d in delays) + f"; median {statistics.median(delays) * 1000:.0f} ms")
    # The client resumes only after this: within the grace plus scheduling slack, and the grace
    # is short (Envoy's default 1 s fails here).
    assert shipped <= 0.25 and max(delays) < shipped + 0.4, (shipped, delays)


# Its own ports, clear of this suite's stack (which holds PORT_OFFSET's).
DEMO_OFFSET = h.PORT_OFFSET + 300


def test_demo_affinity_keeps_a_session_on_its_replica():
    """`make demo AFFINITY=1` (scripts/demo.py --affinity): Envoy with session affinity on
    Mcp-Session-Id; the session id the client sees carries its replica, the walk-through's
    cursor is bound to the server's own id, and the session's GET stream and its continuation
    are served by the same replica."""
    env = {**os.environ, "E2E_PORT_OFFSET": str(DEMO_OFFSET), "PYTHONPATH": str(h.ROOT / "tools")}
    r = subprocess.run([sys.executable, str(h.ROOT / "scripts" / "demo.py"), "--once", "--affinity"],
                       env=env, capture_output=True, text=True, timeout=180)
    out = r.stdout + r.stderr
    assert r.returncode == 0 and "stopped everything the demo started." in out, out
    assert "session affinity on Mcp-Session-Id (envoy/envoy-ts-affinity.yaml)" in out, out
    assert re.search(r"Mcp-Session-Id: \S+;UV:\S+", out), out
    assert "bound to session: yes" in out, out
    served = re.findall(r"served by (r\d)", out)
    assert len(served) == 2 and served[0] == served[1], out
    assert "replay starts at the next event: True" in out, out
