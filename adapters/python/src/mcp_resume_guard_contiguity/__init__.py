"""Contiguity assertions for MCP event stores (Python SDK), extension version 1.

The wire form and its meaning are specified in docs/contiguity-extension.md of mcp-resume-guard.

    from mcp_resume_guard_contiguity import ContiguityEventStore
    app = mcp.streamable_http_app(event_store=ContiguityEventStore(MyEventStore()))
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from mcp.server.streamable_http import EventCallback, EventId, EventMessage, EventStore, StreamId
from mcp.types import JSONRPCMessage, JSONRPCNotification

__all__ = ["REPLAY_METHOD", "VERSION", "ContiguityEventStore", "assertion"]

REPLAY_METHOD = "notifications/mcp-resume-guard/replay"
"""JSON-RPC method of the assertion. MCP clients drop notifications they do not know."""
VERSION = 1
"""Extension version, `params.v`."""


def assertion(after: str, complete: bool, count: int, reason: str | None = None) -> JSONRPCNotification:
    """The assertion a replay of `after` starts with."""
    params: dict = {"v": VERSION, "after": after, "complete": complete, "count": count}
    if not complete and reason:
        params["reason"] = reason
    return JSONRPCNotification(jsonrpc="2.0", method=REPLAY_METHOD, params=params)


@dataclass(frozen=True)
class _Pos:
    stream_id: StreamId
    seq: int
    priming: bool


class ContiguityEventStore(EventStore):
    """Wraps `inner` (any EventStore) so that every replay starts with an assertion whose event id is
    the cursor itself. Event ids, messages and the stream id returned are the inner store's, unchanged.

    The wrapper numbers each stream's events itself (per process), so it can tell whether a replay is
    complete: every event after the cursor, in order, up to the stream's head when the replay began.
    It remembers at most `max_tracked_events` ids (oldest forgotten first); a cursor it forgot is
    answered "cannot" (`unknown_cursor`), never "complete".
    """

    def __init__(self, inner: EventStore, *, max_tracked_events: int = 100_000) -> None:
        if not isinstance(inner, EventStore):
            raise TypeError("ContiguityEventStore: inner must be an mcp EventStore")
        if not isinstance(max_tracked_events, int) or max_tracked_events < 1:
            raise ValueError("ContiguityEventStore: max_tracked_events must be a positive integer")
        self.inner = inner
        self.max_tracked_events = max_tracked_events
        self._heads: dict[StreamId, int] = {}
        self._tracked: OrderedDict[EventId, _Pos] = OrderedDict()
        self._per_stream: dict[StreamId, int] = {}

    async def store_event(self, stream_id: StreamId, message: JSONRPCMessage | None) -> EventId:
        # The number is taken before the inner store is awaited: call order is the stream's order.
        # A priming event (message None) takes none: it is never replayed as data.
        priming = message is None
        head = self._heads.get(stream_id, 0)
        seq = head if priming else head + 1
        self._heads[stream_id] = seq
        event_id = await self.inner.store_event(stream_id, message)
        self._track(event_id, _Pos(stream_id, seq, priming))
        return event_id

    def _track(self, event_id: EventId, pos: _Pos) -> None:
        self._tracked[event_id] = pos
        self._per_stream[pos.stream_id] = self._per_stream.get(pos.stream_id, 0) + 1
        while len(self._tracked) > self.max_tracked_events:
            _, old = self._tracked.popitem(last=False)
            left = self._per_stream.get(old.stream_id, 1) - 1
            if left > 0:
                self._per_stream[old.stream_id] = left
            else:
                # Nothing of the stream is known any more: its numbering may start again.
                self._per_stream.pop(old.stream_id, None)
                self._heads.pop(old.stream_id, None)

    def _judge(self, at: _Pos | None, events: list[EventMessage], head: int) -> tuple[bool, str | None]:
        if at is None:
            return False, "unknown_cursor"
        last = at.seq
        for ev in events:
            pos = self._tracked.get(ev.event_id) if ev.event_id is not None else None
            if pos is None or pos.stream_id != at.stream_id:
                return False, "not_contiguous"
            if pos.priming:
                continue
            if pos.seq != last + 1:
                return False, "not_contiguous"
            last = pos.seq
        if last < head:
            return False, "truncated"
        return True, None

    async def replay_events_after(self, last_event_id: EventId, send_callback: EventCallback) -> StreamId | None:
        at = self._tracked.get(last_event_id)
        head = self._heads.get(at.stream_id, at.seq) if at is not None else 0
        # Held back until the assertion, which must come first, is known.
        events: list[EventMessage] = []

        async def collect(ev: EventMessage) -> None:
            events.append(ev)

        stream_id = await self.inner.replay_events_after(last_event_id, collect)
        complete, reason = self._judge(at, events, head)
        await send_callback(EventMessage(assertion(last_event_id, complete, len(events), reason), last_event_id))
        # Whatever the verdict, the replay itself is the inner store's: a client without a guard gets
        # exactly what it would have got without this wrapper.
        for ev in events:
            await send_callback(ev)
        return stream_id
