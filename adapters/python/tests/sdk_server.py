"""A real Python SDK server with the wrapper around a trimming store (for test_sdk.py).

    python sdk_server.py PORT
"""
from __future__ import annotations

import sys

import anyio
import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from trimming_store import TrimmingStore

from mcp_resume_guard_contiguity import ContiguityEventStore

mcp = MCPServer("adapter-test")


@mcp.tool()
async def steps(n: int, ms: int, ctx: Context) -> str:
    """Progress per step, then a result."""
    for i in range(1, n + 1):
        await anyio.sleep(ms / 1000)
        await ctx.report_progress(i, n, f"step {i}")
    return f"done {n}"


app = mcp.streamable_http_app(event_store=ContiguityEventStore(TrimmingStore()), retry_interval=100)

if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
