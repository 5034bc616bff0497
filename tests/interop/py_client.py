"""The real Python MCP client (PyPI `mcp`: ClientSession over streamable_http_client), driven by
tests/e2e/test_interop_python.py and test_revisions.py. One scenario per run; prints one JSON object.

    .venv/bin/python tests/interop/py_client.py <scenario> --url http://127.0.0.1:10000/mcp [--version V]

Scenarios
  drop     a tool call whose POST stream is cut after --drop-after progress notifications (an httpx
           transport wrapper ends the body, as a dropped connection does); the client's own
           reconnection resumes with Last-Event-ID
  resume   a tool call runs to its end; then the client resumes it explicitly with the resumption token it
           had after --from progress notifications (`ClientMessageMetadata.resumption_token`)
  token    an explicit resume with --token T: what the client does (result, error, exception or hang);
           --get-stream says whether the client's own standalone GET stream is open by then
  poll     a tool call whose server closes the stream every --close-every steps (2025-11-25)
  call     one tool call (revisions)
  modern   one tool call with the high-level `Client` pinned to revision --version (2026-07-28: no
           session, no resumption)
  refusal  the application's view of a refused resume (--path auto|token, --hook URL): the pending call
           (auto: the dropped call, its own reconnect; token: an explicit resume after the call ended)
           settles or not, how fast, with what; then a second call and a ping on the same session
Every HTTP exchange is logged (method, Last-Event-ID sent, status, x-replica, mcp-resume).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import time
import traceback

import anyio
import httpx2

from mcp import types
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.message import ClientMessageMetadata

ap = argparse.ArgumentParser()
ap.add_argument("scenario")
ap.add_argument("--url", default="http://127.0.0.1:10000/mcp")
ap.add_argument("--version", default="2025-11-25")
ap.add_argument("--omit-version-header", action="store_true")
ap.add_argument("--steps", type=int, default=5)
ap.add_argument("--step-ms", type=int, default=120)
ap.add_argument("--drop-after", type=int, default=2)
ap.add_argument("--from", dest="from_", type=int, default=2)
ap.add_argument("--close-every", type=int, default=0)
ap.add_argument("--token", default=None)
ap.add_argument("--inject-cursor", default=None,
                help="send this Last-Event-ID on every POST (a cursor persisted from older state)")
ap.add_argument("--spoil-reconnect", default=None,
                help="replace Last-Event-ID on the client's own reconnects (a refused cursor on the automatic path)")
ap.add_argument("--timeout", type=float, default=6.0)
ap.add_argument("--path", choices=["auto", "token"], default="auto")
ap.add_argument("--hook", default=None,
                help="POST here before the first resume of the call's stream; the test sets up a refusal")
ap.add_argument("--drain", action="store_true",
                help="with the cut, read the connection to its end first: the guard relays events the client never gets")
ap.add_argument("--get-stream", choices=["open", "late"], default="open",
                help="token: resume once the client's own GET stream is open (an application that has run a "
                     "while), or hold that GET back until the resume is answered (a resume right after initialize)")
args = ap.parse_args()

T0 = time.monotonic()
OUT: dict = {"scenario": args.scenario, "version": args.version, "http": [], "progress": [], "tokens": []}


def t_ms() -> int:
    return int((time.monotonic() - T0) * 1000)


BLANK_LINE = re.compile(rb"\r\n\r\n|\n\n|\r\r")


class CutStream(httpx2.AsyncByteStream):
    """Ends a response body after `n` progress events: a dropped connection, as the client sees it.
    With `drain` the rest of the body is read first and thrown away (relayed, never delivered)."""

    def __init__(self, inner, n: int, drain: bool = False):
        self.inner, self.n, self.buf, self.drain = inner, n, b"", drain

    async def __aiter__(self):
        seen = 0
        async for chunk in self.inner:
            self.buf += chunk
            out = b""
            while (m := BLANK_LINE.search(self.buf)) is not None:
                ev, self.buf = self.buf[:m.end()], self.buf[m.end():]
                out += ev
                if b"notifications/progress" in ev:
                    seen += 1
                    if seen >= self.n:
                        yield out
                        if self.drain:
                            async for _ in self.inner:
                                pass
                        OUT["cut_ms"] = t_ms()
                        return
            if out:
                yield out
        if self.buf:
            yield self.buf

    async def aclose(self):
        await self.inner.aclose()


class Tap(httpx2.AsyncByteStream):
    """Records what a resumed GET stream carried: progress values and results, as they came on the wire."""

    def __init__(self, inner, rec: dict):
        self.inner, self.rec, self.buf = inner, rec, b""
        rec.update(progress=[], results=0, control=[])

    async def __aiter__(self):
        async for chunk in self.inner:
            self.buf += chunk
            while (m := BLANK_LINE.search(self.buf)) is not None:
                ev, self.buf = self.buf[:m.start()], self.buf[m.end():]
                fields = [ln.partition(b":") for ln in re.split(rb"\r\n|\n|\r", ev)]
                kind = next((v.strip() for k, _, v in fields if k == b"event"), b"message")
                data = b"\n".join(v[1:] if v.startswith(b" ") else v for k, _, v in fields if k == b"data")
                if kind == b"mcp-resume":
                    self.rec["control"].append(json.loads(data))
                elif data.strip():
                    msg = json.loads(data)
                    if msg.get("method") == "notifications/progress":
                        self.rec["progress"].append(msg["params"]["progress"])
                    elif "result" in msg or "error" in msg:
                        self.rec["results"] += 1
            yield chunk

    async def aclose(self):
        await self.inner.aclose()


class Wire(httpx2.AsyncBaseTransport):
    """Logs exchanges; rewrites initialize's protocolVersion; optionally cuts the first tools/call stream."""

    def __init__(self, cut_after: int | None):
        self.inner = httpx2.AsyncHTTPTransport()
        self.cut_after = cut_after
        self.hook_fired = False
        self.resume_answered = anyio.Event()

    async def handle_async_request(self, request):
        body = request.content if request.method == "POST" else b""
        rpc = None
        if body:
            try:
                msg = json.loads(body)
                rpc = msg.get("method")
                if rpc == "initialize":
                    msg["params"]["protocolVersion"] = args.version
                    body = json.dumps(msg).encode()
                    request = httpx2.Request(request.method, request.url, headers=[
                        (k, v) for k, v in request.headers.raw if k.lower() != b"content-length"], content=body)
            except ValueError:
                pass
        if args.inject_cursor and request.method == "POST":
            request.headers["last-event-id"] = args.inject_cursor
        if args.spoil_reconnect and request.method == "GET" and "last-event-id" in request.headers:
            request.headers["last-event-id"] = args.spoil_reconnect
        if (args.hook and not self.hook_fired and request.method == "GET"
                and request.headers.get("last-event-id") in {t["token"] for t in OUT["tokens"]}):
            # The first resume of the call's stream: the test sets up the refusal first.
            self.hook_fired = True
            call = next((x for x in OUT["http"] if x.get("rpc") == "tools/call"), {})
            note = {"session": request.headers.get("mcp-session-id"),
                    "last_event_id": request.headers["last-event-id"], "replica": call.get("replica")}
            async with httpx2.AsyncClient() as hc:
                h = await hc.post(args.hook, content=json.dumps(note), timeout=30)
            OUT["hook"] = {"status": h.status_code, "t_ms": t_ms()}
        if args.omit_version_header and "mcp-protocol-version" in request.headers:
            del request.headers["mcp-protocol-version"]
        rec = {"method": request.method, "rpc": rpc, "last_event_id": request.headers.get("last-event-id"),
               "version_header": request.headers.get("mcp-protocol-version"), "t_ms": t_ms()}
        if args.get_stream == "late" and request.method == "GET" and not rec["last_event_id"]:
            await self.resume_answered.wait()
        try:
            resp = await self.inner.handle_async_request(request)
        except Exception as e:
            rec["error"] = type(e).__name__
            OUT["http"].append(rec)
            raise
        finally:
            if request.method == "GET" and rec["last_event_id"]:
                self.resume_answered.set()
        rec.update(status=resp.status_code, replica=resp.headers.get("x-replica"),
                   mcp_resume=resp.headers.get("mcp-resume"), content_type=resp.headers.get("content-type"),
                   t_resp_ms=t_ms())
        OUT["http"].append(rec)
        if request.method == "GET" and rec["last_event_id"]:
            return httpx2.Response(resp.status_code, headers=resp.headers, stream=Tap(resp.stream, rec),
                                   extensions=resp.extensions)
        if rpc == "tools/call" and self.cut_after:
            n, self.cut_after = self.cut_after, None
            return httpx2.Response(resp.status_code, headers=resp.headers, stream=CutStream(resp.stream, n, args.drain),
                                   extensions=resp.extensions)
        return resp

    async def aclose(self):
        await self.inner.aclose()


def call_request(tag: str, **extra) -> types.CallToolRequest:
    a = {"steps": args.steps, "step_ms": args.step_ms, "tag": tag, **extra}
    return types.CallToolRequest(params=types.CallToolRequestParams(name="progress_steps", arguments=a))


async def progress_cb(progress, total, message):
    OUT["progress"].append(progress)


async def on_token(tok):
    OUT["tokens"].append({"token": tok})


def text_of(r) -> str | None:
    return r.content[0].text if getattr(r, "content", None) else None


async def get_stream_answered(limit: float) -> bool:
    """Whether the client's own standalone GET stream (no Last-Event-ID) was answered within `limit` s."""
    with anyio.move_on_after(limit):
        while not any(x["method"] == "GET" and not x["last_event_id"] and "status" in x for x in OUT["http"]):
            await anyio.sleep(0.01)
        return True
    return False


async def settle(coro) -> dict:
    """A request's end: result, error, exception (what crashed, and how) or hang (our own deadline)."""
    start = t_ms()
    try:
        with anyio.fail_after(args.timeout):
            r = await coro
        return {"outcome": "result", "text": text_of(r), "elapsed_ms": t_ms() - start, "t_ms": t_ms()}
    except TimeoutError:
        return {"outcome": "hang", "elapsed_ms": t_ms() - start, "t_ms": t_ms()}
    except BaseException as e:  # noqa: BLE001 - an SDK crash is what we report
        inner = e
        while isinstance(inner, BaseExceptionGroup) and inner.exceptions:
            inner = inner.exceptions[0]
        kind = "error" if type(inner).__name__ in ("MCPError", "McpError") else "exception"
        err = getattr(inner, "error", None)
        return {"outcome": kind, "exception": type(inner).__name__, "error": str(inner)[:300],
                "code": getattr(err, "code", None), "message": getattr(err, "message", None),
                "data": getattr(err, "data", None), "elapsed_ms": t_ms() - start, "t_ms": t_ms()}


async def main() -> None:
    auto = args.scenario == "drop" or (args.scenario == "refusal" and args.path == "auto")
    cut = args.drop_after if auto else None
    http = httpx2.AsyncClient(transport=Wire(cut), timeout=httpx2.Timeout(10.0, read=30.0))
    if args.scenario == "modern":
        from mcp.client.client import Client

        async with http, Client(streamable_http_client(args.url, http_client=http), mode=args.version) as client:
            OUT["negotiated"] = args.version
            OUT["call"] = await settle(client.call_tool(
                "progress_steps", {"steps": args.steps, "step_ms": args.step_ms, "tag": "modern"}))
        return
    async with http, streamable_http_client(args.url, http_client=http) as (read, write):
        async with ClientSession(read, write) as session:
            init = await session.initialize()
            OUT["negotiated"] = init.protocol_version
            tag = f"{args.scenario}-{int(time.time() * 1000)}"
            if args.scenario in ("drop", "call", "poll"):
                extra = {"close_every": args.close_every} if args.close_every else {}
                OUT["call"] = await settle(session.send_request(
                    call_request(tag, **extra), types.CallToolResult, progress_callback=progress_cb,
                    metadata=ClientMessageMetadata(on_resumption_token_update=on_token)))
            elif args.scenario == "resume":
                OUT["first"] = await settle(session.send_request(
                    call_request(tag), types.CallToolResult, progress_callback=progress_cb,
                    metadata=ClientMessageMetadata(on_resumption_token_update=on_token)))
                # Tokens come in wire order: the priming event's, then one per message.
                token = OUT["tokens"][args.from_]["token"]
                OUT["resume_token"] = token
                OUT["progress_first"] = list(OUT["progress"])
                OUT["progress"].clear()
                OUT["resume"] = await settle(session.send_request(
                    call_request(tag), types.CallToolResult, progress_callback=progress_cb,
                    metadata=ClientMessageMetadata(resumption_token=token, on_resumption_token_update=on_token)))
            elif args.scenario == "refusal":
                OUT["call_started_ms"] = t_ms()
                if args.path == "auto":
                    OUT["call"] = await settle(session.send_request(
                        call_request(tag), types.CallToolResult, progress_callback=progress_cb,
                        metadata=ClientMessageMetadata(on_resumption_token_update=on_token)))
                else:
                    OUT["first"] = await settle(session.send_request(
                        call_request(tag), types.CallToolResult, progress_callback=progress_cb,
                        metadata=ClientMessageMetadata(on_resumption_token_update=on_token)))
                    OUT["cut_ms"] = t_ms()
                    OUT["call_started_ms"] = t_ms()
                    OUT["call"] = await settle(session.send_request(
                        call_request(tag), types.CallToolResult,
                        metadata=ClientMessageMetadata(resumption_token=OUT["tokens"][args.from_]["token"])))
                OUT["second"] = await settle(session.send_request(
                    call_request(f"{tag}-second", steps=1, step_ms=10), types.CallToolResult))
                try:
                    with anyio.fail_after(3):
                        await session.send_ping()
                    OUT["ping"] = "ok"
                except BaseException as e:  # noqa: BLE001 - what the application would see
                    OUT["ping"] = f"{type(e).__name__}: {e}"[:200]
            elif args.scenario == "token":
                if args.get_stream == "open":
                    OUT["get_stream_open"] = await get_stream_answered(5.0)
                OUT["resume"] = await settle(session.send_request(
                    call_request(tag), types.CallToolResult, progress_callback=progress_cb,
                    metadata=ClientMessageMetadata(resumption_token=args.token,
                                                   on_resumption_token_update=on_token)))
            else:
                raise SystemExit(f"unknown scenario {args.scenario}")


def run() -> int:
    signal.signal(signal.SIGALRM, lambda *_: (OUT.update(fatal="hard timeout"), print(json.dumps(OUT)),
                                               sys.stdout.flush(), os._exit(3)))
    signal.alarm(int(args.timeout * 3 + 10))
    try:
        anyio.run(main)
        rc = 0
    except BaseException as e:  # noqa: BLE001
        inner = e
        while isinstance(inner, BaseExceptionGroup) and inner.exceptions:
            inner = inner.exceptions[0]
        OUT["fatal"] = {"exception": type(inner).__name__, "error": str(inner)[:300],
                        "trace": traceback.format_exception(inner)[-3:], "t_ms": t_ms()}
        if "call_started_ms" in OUT and "call" not in OUT:
            # The session itself went down under the pending call: the application sees this exception.
            OUT["call"] = {"outcome": "crash", "exception": type(inner).__name__, "error": str(inner)[:300],
                           "elapsed_ms": t_ms() - OUT["call_started_ms"], "t_ms": t_ms()}
        rc = 2
    print(json.dumps(OUT))
    sys.stdout.flush()
    return rc


if __name__ == "__main__":
    sys.exit(run())
