"""Against the real Python SDK (server transport and ClientSession): the wrapper's assertion goes out
first on every replay, and a client talking to the server without a guard is not affected."""
from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest
from mcp import types
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.message import ClientMessageMetadata

from mcp_resume_guard_contiguity import REPLAY_METHOD

HERE = Path(__file__).resolve().parent
PORT = 9172 + int(os.environ.get("E2E_PORT_OFFSET", "0"))
URL = f"http://127.0.0.1:{PORT}/mcp"


@pytest.fixture(scope="module")
def server():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent / "src"), str(HERE)])}
    p = subprocess.Popen([sys.executable, str(HERE / "sdk_server.py"), str(PORT)], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            assert p.poll() is None, p.stderr.read().decode() if p.stderr else "server exited"
            try:
                socket.create_connection(("127.0.0.1", PORT), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        yield p
    finally:
        p.terminate()
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=10)


def call(n: int, ms: int) -> types.CallToolRequest:
    return types.CallToolRequest(params=types.CallToolRequestParams(name="steps", arguments={"n": n, "ms": ms}))


def test_the_real_client_resumes_through_the_wrapper(server):
    """An explicit resume with a token from the middle of a call: the rest of the progress and the result."""
    out: dict = {}

    async def go():
        tokens: list[str] = []
        progress: list[float] = []

        async def on_token(tok):
            tokens.append(tok)

        async def on_progress(p, total, message):
            progress.append(p)

        async with streamable_http_client(URL) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                first = await session.send_request(call(5, 10), types.CallToolResult, progress_callback=on_progress,
                                                   metadata=ClientMessageMetadata(on_resumption_token_update=on_token))
                out["first"] = first.content[0].text
                out["first_progress"] = list(progress)
                progress.clear()
                # Tokens in wire order: the priming event's, then one per message; [2] = after progress 2.
                token = tokens[2]
                with anyio.fail_after(10):
                    again = await session.send_request(
                        call(5, 10), types.CallToolResult, progress_callback=on_progress,
                        metadata=ClientMessageMetadata(resumption_token=token, on_resumption_token_update=on_token))
                out["resumed"] = again.content[0].text
                out["resumed_progress"] = list(progress)

    anyio.run(go)
    assert out["first"] == "done 5" and out["first_progress"] == [1, 2, 3, 4, 5]
    # Replayed progress carries the first request's token, so the callback does not see it (SDK behaviour,
    # the same without the wrapper); the wire test below checks what the replay carries.
    assert out["resumed"] == "done 5", out


def sse_events(resp, until: bytes, timeout: float = 5.0) -> list[dict]:
    buf = b""
    deadline = time.monotonic() + timeout
    while until not in buf and time.monotonic() < deadline:
        try:
            chunk = resp.read1(65536)
        except TimeoutError:
            break
        if not chunk:
            break
        buf += chunk
    events = []
    for block in buf.replace(b"\r\n", b"\n").split(b"\n\n"):
        fields: dict = {}
        for line in block.decode().split("\n"):
            k, _, v = line.partition(":")
            fields.setdefault(k, []).append(v[1:] if v.startswith(" ") else v)
        if "data" in fields and fields["data"] != [""]:
            events.append({"id": fields.get("id", [None])[-1], "data": json.loads("\n".join(fields["data"]))})
    return events


def open_(method: str, body: dict | None, headers: dict):
    conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=5)
    conn.request(method, "/mcp", json.dumps(body) if body is not None else None, headers)
    return conn, conn.getresponse()


def test_on_the_wire_the_replay_starts_with_the_assertion(server):
    hdrs = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
    conn, r = open_("POST", {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}, hdrs)
    hdrs.update({"mcp-session-id": r.getheader("mcp-session-id"), "mcp-protocol-version": "2025-11-25"})
    conn.close()
    conn, _ = open_("POST", {"jsonrpc": "2.0", "method": "notifications/initialized"}, hdrs)
    conn.close()
    conn, r = open_("POST", {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
        "name": "steps", "arguments": {"n": 3, "ms": 0}, "_meta": {"progressToken": "p"}}}, hdrs)
    wire = sse_events(r, b"done 3")
    conn.close()
    cursor = wire[0]["id"]  # the first progress notification's
    conn, r = open_("GET", None, {**hdrs, "accept": "text/event-stream", "last-event-id": cursor})
    assert r.status == 200
    got = sse_events(r, b"done 3")
    conn.close()
    assert got[0]["id"] == cursor, "the assertion's event id is the cursor"
    assert got[0]["data"]["method"] == REPLAY_METHOD
    assert got[0]["data"]["params"] == {"v": 1, "after": cursor, "complete": True, "count": 3}
    assert [e["data"].get("params", {}).get("progress") for e in got[1:3]] == [2, 3]
    assert "result" in got[3]["data"]
