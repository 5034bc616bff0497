"""What the Python MCP SDK's client reads from an event stream: httpx2's EventSource over the response's
aiter_text(), exactly as mcp/client/streamable_http.py reads it (max_event_size = the client's default,
1 MiB). (The SDK then keeps `if sse.id: last_event_id = sse.id`; core/tests/sse_differential.rs derives
that from the ids printed here.)

stdin: one case per line, {"b": base64 stream, "s": [split offsets, ascending]}.
stdout: one line per case, {"events": [{"event", "data", "id"}], "retry": [ms]}: every ServerSentEvent the
parser yields, in order, and the reconnection times they carry, or {"error": "..."} when it raises.
"""

import asyncio
import base64
import json
import sys

import httpx2
from mcp.client.streamable_http import DEFAULT_MAX_SSE_EVENT_SIZE


async def run(data: bytes, splits: list[int]) -> dict:
    bounds = [0, *splits, len(data)]
    chunks = [data[a:b] for a, b in zip(bounds, bounds[1:])]

    async def body():
        for c in chunks:
            yield c

    response = httpx2.Response(
        200,
        headers={"content-type": "text/event-stream"},
        content=body(),
        request=httpx2.Request("GET", "http://127.0.0.1/mcp"),
    )
    events = []
    retry = []
    try:
        async for sse in httpx2.EventSource(response, max_event_size=DEFAULT_MAX_SSE_EVENT_SIZE):
            events.append({"event": sse.event, "data": sse.data, "id": sse.id})
            if sse.retry is not None:
                retry.append(sse.retry)
    except httpx2.SSEError as exc:
        return {"error": str(exc)}
    return {"events": events, "retry": retry}


async def main() -> None:
    for line in sys.stdin:
        if not line.strip():
            continue
        case = json.loads(line)
        out = await run(base64.b64decode(case["b"]), case["s"])
        sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()


asyncio.run(main())
