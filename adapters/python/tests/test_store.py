"""The wrapper's bookkeeping, against small inner stores (no HTTP)."""
from __future__ import annotations

import anyio
import pytest
from mcp.server.streamable_http import EventMessage
from mcp.types import JSONRPCNotification
from trimming_store import TrimmingStore

from mcp_resume_guard_contiguity import REPLAY_METHOD, ContiguityEventStore


def note(n: int) -> JSONRPCNotification:
    return JSONRPCNotification(jsonrpc="2.0", method="notifications/message", params={"level": "info", "data": n})


async def fill(store, stream: str, n: int) -> list[str]:
    return [await store.store_event(stream, note(i)) for i in range(1, n + 1)]


async def replay(store, cursor: str):
    sent: list[EventMessage] = []

    async def send(ev: EventMessage) -> None:
        sent.append(ev)

    stream_id = await store.replay_events_after(cursor, send)
    return stream_id, sent[0], sent[1:]


def params(ev: EventMessage) -> dict:
    assert ev.message.method == REPLAY_METHOD
    return ev.message.params


def run(fn):
    return anyio.run(fn)


def test_a_complete_replay_starts_with_an_assertion_whose_id_is_the_cursor():
    async def go():
        store = ContiguityEventStore(TrimmingStore())
        ids = await fill(store, "s", 5)
        stream_id, head, rest = await replay(store, ids[1])
        assert stream_id == "s"
        assert head.event_id == ids[1], "event id = the cursor: a client resuming after it resumes correctly"
        assert params(head) == {"v": 1, "after": ids[1], "complete": True, "count": 3}
        assert [e.event_id for e in rest] == ids[2:], "the inner replay follows, unchanged"
        _, end, _ = await replay(store, ids[4])
        assert params(end) == {"v": 1, "after": ids[4], "complete": True, "count": 0}
        # The SDK writes it with model_dump_json: the wire form of the doc.
        assert head.message.model_dump_json(by_alias=True, exclude_unset=True).startswith(
            '{"jsonrpc":"2.0","method":"notifications/mcp-resume-guard/replay","params":{"v":1,')
    run(go)


def test_unknown_cursor_is_cannot_and_the_inner_answer_is_passed_on():
    async def go():
        store = ContiguityEventStore(TrimmingStore())
        await fill(store, "s", 2)
        stream_id, head, rest = await replay(store, "never-issued")
        assert stream_id is None and rest == []
        assert params(head) == {"v": 1, "after": "never-issued", "complete": False, "count": 0,
                                "reason": "unknown_cursor"}
    run(go)


def test_a_cursor_the_inner_store_evicted_ends_before_the_head():
    async def go():
        store = ContiguityEventStore(TrimmingStore(max_events_per_stream=3))
        ids = await fill(store, "s", 10)
        _, head, _ = await replay(store, ids[2])
        assert (params(head)["complete"], params(head)["reason"]) == (False, "truncated")
    run(go)


def test_a_surviving_tail_that_skips_events_is_not_contiguous():
    async def go():
        inner = TrimmingStore(max_events_per_stream=3)

        async def tail(last, send):
            for eid in inner.streams["s"]:
                await send(EventMessage(inner.index[eid][1], eid))
            return "s"

        inner.replay_events_after = tail
        store = ContiguityEventStore(inner)
        ids = await fill(store, "s", 10)
        _, head, rest = await replay(store, ids[2])
        assert (params(head)["complete"], params(head)["reason"]) == (False, "not_contiguous")
        assert [e.event_id for e in rest] == ids[7:], "still forwarded: the wrapper never changes a replay"
    run(go)


def test_priming_events_take_no_number():
    async def go():
        store = ContiguityEventStore(TrimmingStore())
        priming = await store.store_event("s", None)
        ids = await fill(store, "s", 3)
        p2 = await store.store_event("s", None)
        _, head, rest = await replay(store, priming)
        assert params(head) == {"v": 1, "after": priming, "complete": True, "count": 3}
        assert [e.event_id for e in rest] == ids
        _, last, _ = await replay(store, p2)
        assert params(last)["complete"] is True
    run(go)


def test_a_forgotten_cursor_is_never_complete():
    async def go():
        store = ContiguityEventStore(TrimmingStore(), max_tracked_events=4)
        ids = await fill(store, "s", 6)
        _, old, _ = await replay(store, ids[0])
        assert params(old)["reason"] == "unknown_cursor"
        _, recent, _ = await replay(store, ids[3])
        assert params(recent)["complete"] is True
    run(go)


def test_bad_arguments_are_named():
    with pytest.raises(TypeError, match="inner must be an mcp EventStore"):
        ContiguityEventStore(object())
    with pytest.raises(ValueError, match="max_tracked_events"):
        ContiguityEventStore(TrimmingStore(), max_tracked_events=0)
