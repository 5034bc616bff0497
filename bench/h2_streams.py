#!/usr/bin/env python3
"""Many concurrent SSE GETs over few HTTP/2 (h2c, prior knowledge) connections; prints one JSON object.

    h2_streams.py --addr H:P --path P --conns C --streams N --secs T [--pid ENVOY] [--open-secs O]
                  [--header k:v]...

N streams spread over C connections, each its own session. Counts events ("\n\n" in the DATA of each
stream) once every stream has its 200 headers; with --pid, the process's CPU ticks and RSS are read at
the start and at the end of the measured window. Lets one Envoy hold more open streams than its
descriptor limit allows for one connection per stream.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

import h2.config
import h2.connection
import h2.events


def ticks(pid):
    if not pid:
        return 0
    with open(f"/proc/{pid}/stat") as f:
        rest = f.read().rsplit(")", 1)[1].split()
    return int(rest[11]) + int(rest[12])


def rss(pid):
    if not pid:
        return 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class Stats:
    def __init__(self):
        self.events = 0
        self.bytes = 0
        self.open = 0
        self.errors: list[str] = []


async def conn(host, port, path, headers, first, count, st: Stats, stop: asyncio.Event):
    reader, writer = await asyncio.open_connection(host, port)
    c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    c.initiate_connection()
    c.increment_flow_control_window(1 << 30)
    writer.write(c.data_to_send())
    tails: dict[int, bytes] = {}
    for i in range(first, first + count):
        sid = c.get_next_available_stream_id()
        c.send_headers(sid, [(":method", "GET"), (":scheme", "http"), (":authority", f"{host}:{port}"),
                             (":path", path), ("accept", "text/event-stream"),
                             ("mcp-session-id", f"bench-h2-stream-{i}"), *headers], end_stream=True)
        tails[sid] = b""
    writer.write(c.data_to_send())
    await writer.drain()
    while not stop.is_set():
        try:
            data = await asyncio.wait_for(reader.read(1 << 16), 0.5)
        except asyncio.TimeoutError:
            continue
        if not data:
            if not stop.is_set():
                st.errors.append("connection closed")
            break
        for ev in c.receive_data(data):
            if isinstance(ev, h2.events.ResponseReceived):
                status = dict(ev.headers).get(":status")
                if status == "200":
                    st.open += 1
                else:
                    st.errors.append(f"status {status}")
            elif isinstance(ev, h2.events.DataReceived):
                buf = tails.get(ev.stream_id, b"") + ev.data
                st.events += buf.count(b"\n\n")
                st.bytes += len(ev.data)
                tails[ev.stream_id] = buf[-1:]
                c.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            elif isinstance(ev, (h2.events.StreamReset, h2.events.StreamEnded)):
                if not stop.is_set():
                    st.errors.append(type(ev).__name__)
            elif isinstance(ev, h2.events.ConnectionTerminated):
                st.errors.append("goaway")
        out = c.data_to_send()
        if out:
            writer.write(out)
    writer.close()


async def main_async(a):
    host, port = a.addr.rsplit(":", 1)
    headers = [tuple(h.split(":", 1)) for h in a.header]
    st, stop = Stats(), asyncio.Event()
    per = -(-a.streams // a.conns)
    tasks = [asyncio.create_task(conn(host, int(port), a.path, headers, k * per, min(per, a.streams - k * per),
                                      st, stop)) for k in range(a.conns) if k * per < a.streams]
    t0 = time.monotonic()
    while st.open < a.streams and time.monotonic() - t0 < a.open_secs and not st.errors:
        await asyncio.sleep(0.05)
    e0, b0, c0, start = st.events, st.bytes, ticks(a.pid), time.monotonic()
    await asyncio.sleep(a.secs)
    elapsed = time.monotonic() - start
    e1, b1, c1, r1 = st.events, st.bytes, ticks(a.pid), rss(a.pid)
    stop.set()
    await asyncio.wait(tasks, timeout=5)
    for t in tasks:
        t.cancel()
    print(json.dumps({"events": e1 - e0, "bytes": b1 - b0, "secs": elapsed, "ticks": c1 - c0,
                      "opened": st.open, "conns": a.streams, "h2_connections": len(tasks), "rss_end": r1,
                      "windows": [], "errors": st.errors[:20]}))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--addr", required=True)
    ap.add_argument("--path", required=True)
    ap.add_argument("--conns", type=int, default=100)
    ap.add_argument("--streams", type=int, required=True)
    ap.add_argument("--secs", type=float, default=10.0)
    ap.add_argument("--open-secs", type=float, default=60.0)
    ap.add_argument("--pid", type=int, default=0)
    ap.add_argument("--header", action="append", default=[])
    asyncio.run(main_async(ap.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
