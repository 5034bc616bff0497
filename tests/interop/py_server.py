"""An MCP replica built from the real Python SDK (PyPI `mcp`, pinned in requirements.txt).

    .venv/bin/python tests/interop/py_server.py --port 9101 --name py1 [--retry-ms 200] [--idle-s 600]
        [--store-limit N] [--contiguity]

* The SDK's stateful Streamable HTTP leg (sessions live in this process) with a small `EventStore`
  (the SDK ships none) and `retry_interval`: priming events and `retry:` on 2025-11-25, and
  `Context.close_sse_stream()` for server-side polling. Revision 2026-07-28 goes to the SDK's
  sessionless leg.
* The store is shared by every session of the process and, like the TypeScript example, never checks
  which session a cursor belongs to; it replays in insertion order.
* Tool `progress_steps {steps, step_ms, close_every?, tag?}`: one progress notification per step, then
  a text result.
* Tool `produce {n, step_ms?}`: n `notifications/message` on the session's standalone GET stream, numbered
  per session (`data.n`), whether or not a client listens: the SDK stores them for a later replay.
* `--store-limit N`: a trimming store instead, like the SDK's example store (`max_events_per_stream`):
  the last N events per stream, evicted ids forgotten. `--contiguity`: the store wrapped by the
  contiguity adapter (adapters/python).
* `--idle-s`: the SDK's session idle timeout; an expired session answers 404.
* `--store-per-session`: one store per session instead of the SDK's one per process (see the comment at
  the hook: request stream ids repeat across sessions).
* Test hooks (not on /mcp): GET /_interop/state, POST /_interop/reset. Every response carries
  `x-replica: <name>`. Listens on 127.0.0.1 only.
"""
from __future__ import annotations

import argparse
import itertools
from collections import deque

import anyio
import uvicorn
from starlette.requests import Request
from starlette.responses import JSONResponse

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.streamable_http import EventCallback, EventMessage, EventStore

ap = argparse.ArgumentParser()
ap.add_argument("--port", type=int, default=9101)
ap.add_argument("--name", default="py")
ap.add_argument("--retry-ms", type=int, default=200)
ap.add_argument("--idle-s", type=float, default=600.0)
ap.add_argument("--store-limit", type=int, default=0)
ap.add_argument("--contiguity", action="store_true")
ap.add_argument("--store-per-session", action="store_true")
args = ap.parse_args()
NAME = args.name

STATE: dict = {"name": NAME, "tool_calls": [], "requests": []}


class OrderedEventStore(EventStore):
    """Ids `<stream>_<replica>_<n>`, replayed in insertion order within the cursor's stream."""

    def __init__(self) -> None:
        self.seq = itertools.count(1)
        self.events: dict[str, tuple[str, object]] = {}
        self.by_stream: dict[str, list[str]] = {}

    async def store_event(self, stream_id, message):
        eid = f"{stream_id}_{NAME}_{next(self.seq)}"
        self.events[eid] = (stream_id, message)
        self.by_stream.setdefault(stream_id, []).append(eid)
        return eid

    async def replay_events_after(self, last_event_id, send_callback: EventCallback):
        if last_event_id not in self.events:
            return None
        stream_id, _ = self.events[last_event_id]
        ids = self.by_stream[stream_id]
        for eid in ids[ids.index(last_event_id) + 1:]:
            message = self.events[eid][1]
            if message is not None:
                await send_callback(EventMessage(message, eid))
        return stream_id


class TrimmingEventStore(OrderedEventStore):
    """The last `limit` events per stream; evicted ids are forgotten (the SDK example's deque)."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit
        self.by_stream: dict[str, deque] = {}

    async def store_event(self, stream_id, message):
        eid = f"{stream_id}_{NAME}_{next(self.seq)}"
        q = self.by_stream.setdefault(stream_id, deque())
        if len(q) == self.limit:
            self.events.pop(q.popleft(), None)
        q.append(eid)
        self.events[eid] = (stream_id, message)
        return eid

    async def replay_events_after(self, last_event_id, send_callback: EventCallback):
        if last_event_id not in self.events:
            return None
        stream_id, _ = self.events[last_event_id]
        ids = list(self.by_stream[stream_id])
        for eid in ids[ids.index(last_event_id) + 1:]:
            message = self.events[eid][1]
            if message is not None:
                await send_callback(EventMessage(message, eid))
        return stream_id


def event_store() -> EventStore:
    store: EventStore = TrimmingEventStore(args.store_limit) if args.store_limit > 0 else OrderedEventStore()
    if args.contiguity:
        # adapters/python/src is on PYTHONPATH (the stack package starts this server so).
        from mcp_resume_guard_contiguity import ContiguityEventStore

        store = ContiguityEventStore(store)
    return store


mcp = MCPServer(f"interop-py-{NAME}")
PRODUCED: dict[int, int] = {}


@mcp.tool()
async def produce(n: int, ctx: Context, step_ms: int = 0) -> str:
    """Sends n notifications on the standalone GET stream, listened to or not."""
    from mcp import types

    key = id(getattr(ctx.session, "_connection", ctx.session))  # one per session, not per request
    for _ in range(n):
        if step_ms:
            await anyio.sleep(step_ms / 1000)
        PRODUCED[key] = PRODUCED.get(key, 0) + 1
        await ctx.session.send_notification(types.LoggingMessageNotification(
            params=types.LoggingMessageNotificationParams(level="info", data={"replica": NAME, "n": PRODUCED[key]})))
    return f"produced {PRODUCED[key]}"


@mcp.tool()
async def progress_steps(steps: int, step_ms: int, ctx: Context, close_every: int | None = None,
                         tag: str | None = None) -> str:
    """Streams one progress notification per step, then returns a result."""
    call = {"tag": tag, "steps": steps, "done": False}
    STATE["tool_calls"].append(call)
    for i in range(1, steps + 1):
        await anyio.sleep(step_ms / 1000)
        await ctx.report_progress(i, steps, f"step {i}")
        if close_every and i % close_every == 0 and i < steps:
            await ctx.close_sse_stream()
    call["done"] = True
    return f"done {tag or ''} {steps} steps on {NAME}"


@mcp.custom_route("/_interop/state", methods=["GET"])
async def state(_: Request) -> JSONResponse:
    return JSONResponse(STATE)


@mcp.custom_route("/_interop/reset", methods=["POST"])
async def reset(_: Request) -> JSONResponse:
    STATE["tool_calls"].clear()
    STATE["requests"].clear()
    return JSONResponse({})


if args.store_per_session:
    # The SDK gives every session's transport the one store it was given, and a request stream's id is the
    # request's JSON-RPC id, which every session numbers from 0: a store keyed by stream id (what the
    # interface invites; store_event is never told the session) replays another session's events and result
    # for the same id. Here each session gets its own store (a private SDK hook; ids stay unique in the
    # process), which is what tests/chaos/soak_sdk.py runs by default.
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

    SEQ = itertools.count(1)
    _admit = StreamableHTTPSessionManager._admit_session

    def _admit_with_own_store(self, requestor):
        transport = _admit(self, requestor)
        if transport is not None and transport._event_store is not None:
            store = event_store()
            if hasattr(store, "seq"):
                store.seq = SEQ
            transport._event_store = store
        return transport

    StreamableHTTPSessionManager._admit_session = _admit_with_own_store

app = mcp.streamable_http_app(event_store=event_store(), retry_interval=args.retry_ms,
                              session_idle_timeout=args.idle_s)


async def with_replica_header(scope, receive, send):
    """Adds x-replica to every response and records each /mcp request's cursor and version."""
    if scope["type"] == "http" and scope["path"] == "/mcp":
        hdrs = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        STATE["requests"].append({"method": scope["method"], "session": hdrs.get("mcp-session-id"),
                                  "last_event_id": hdrs.get("last-event-id"),
                                  "mcp_protocol_version": hdrs.get("mcp-protocol-version")})
        del STATE["requests"][:-2000]

    async def send_with_header(message):
        if message["type"] == "http.response.start":
            message.setdefault("headers", [])
            message["headers"] = list(message["headers"]) + [(b"x-replica", NAME.encode())]
        await send(message)

    await app(scope, receive, send_with_header)


if __name__ == "__main__":
    uvicorn.run(with_replica_header, host="127.0.0.1", port=args.port, log_level="warning", lifespan="on")
