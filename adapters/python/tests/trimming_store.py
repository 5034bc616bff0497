"""An inner store for the tests: the Python SDK example's in-memory store (last N events per stream,
evicted ids forgotten, priming events stored but never replayed), with ids that show their order."""
from __future__ import annotations

import itertools
from collections import deque

from mcp.server.streamable_http import EventCallback, EventMessage, EventStore


class TrimmingStore(EventStore):
    def __init__(self, max_events_per_stream: int = 100) -> None:
        self.max = max_events_per_stream
        self.n = itertools.count(1)
        self.streams: dict[str, deque] = {}
        self.index: dict[str, tuple[str, object]] = {}

    async def store_event(self, stream_id, message):
        eid = f"{stream_id}_{next(self.n)}"
        q = self.streams.setdefault(stream_id, deque())
        if len(q) == self.max:
            self.index.pop(q.popleft(), None)
        q.append(eid)
        self.index[eid] = (stream_id, message)
        return eid

    async def replay_events_after(self, last_event_id, send_callback: EventCallback):
        if last_event_id not in self.index:
            return None
        stream_id, _ = self.index[last_event_id]
        found = False
        for eid in self.streams[stream_id]:
            if found:
                message = self.index[eid][1]
                if message is not None:
                    await send_callback(EventMessage(message, eid))
            elif eid == last_event_id:
                found = True
        return stream_id
