"""Real Python SDK clients (PyPI `mcp`: ClientSession over streamable_http_client) for `make soak-sdk`
(tests/chaos/soak_sdk.py): --clients applications in one process, each calling a long-running tool again and
again through one of --urls with the SDK's own automatic reconnection and a --timeout-ms read timeout, until
--seconds are up. Client i talks to pool --pools[i % n] (header x-soak-pool) and calls that pool's tool.
Every call's outcome as the APPLICATION sees it is one JSON line on stdout, in the format of
soak_ts_client.mjs (see there): completed, settled (the guard's -32010 and its reason), error, hung.

    .venv/bin/python tests/interop/soak_py_client.py --urls http://127.0.0.1:10005/mcp --pools everything,py \
        --clients 10 --seconds 150 --timeout-ms 30000 --seed 1
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import random
import re
import signal
import sys
import time

import anyio
import httpx2

from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

ap = argparse.ArgumentParser()
ap.add_argument("--urls", required=True)
ap.add_argument("--pools", default="everything")
ap.add_argument("--clients", type=int, default=1)
ap.add_argument("--seconds", type=float, default=60)
ap.add_argument("--timeout-ms", type=int, default=30000)
ap.add_argument("--seed", type=int, default=1)
args = ap.parse_args()
URLS = args.urls.split(",")
POOLS = args.pools.split(",")
TIMEOUT = args.timeout_ms / 1000
DEADLINE = time.time() + args.seconds
REASON = re.compile(r"not honoured \((\w+)\)")
rng = random.Random(args.seed)


def now_ms() -> int:
    return int(time.time() * 1000)


def emit(rec: dict) -> None:
    sys.stdout.write(json.dumps(rec) + "\n")
    sys.stdout.flush()


def tool(pool: str, tag: str) -> tuple[str, dict, str]:
    """The pool's long-running tool: name, arguments, and text its result must contain (6 steps each)."""
    if pool == "everything":
        d = rng.choice([2.5, 3, 3.5])
        # server-everything formats the duration as JavaScript does (3, not 3.0).
        return "trigger-long-running-operation", {"duration": d, "steps": 6}, f"Duration: {d:g} seconds, Steps: 6."
    if pool == "py":
        return "progress_steps", {"steps": 6, "step_ms": 500, "tag": tag}, f"done {tag} 6 steps"
    return "progress", {"steps": 6, "step_ms": 500, "label": tag}, f"label={tag} "


def replica_of(session: str | None) -> str | None:
    """The session's replica, from the affinity envelope `<base64 ip:port>;UV:<base64 id>`."""
    if not session or ";UV:" not in session:
        return None
    try:
        return base64.b64decode(session.split(";UV:")[0]).decode()
    except ValueError:
        return None


class Watched(httpx2.AsyncByteStream):
    """A stream carrying the pending call: notes when it ends or fails without the call's response."""

    def __init__(self, inner, app: "App", call: dict, method: str, last_event_id: str | None):
        self.inner, self.app, self.call, self.text, self.buf = inner, app, call, b"", b""
        # What this stream carried, kept for the report when the call shows a violation.
        self.wire = {"method": method, "last_event_id": (last_event_id or "")[:16] or None, "head": ""}
        call["wire"].append(self.wire)

    def broke(self) -> None:
        rid = self.call.get("rpc_id")
        answered = rid is not None and re.search(rb'"id":\s*%d[,}]' % rid, self.text) is not None
        if not answered and self.call["break_at"] is None and self.app.call is self.call:
            self.call["break_at"] = now_ms()

    async def __aiter__(self):
        try:
            async for chunk in self.inner:
                if b"notifications/progress" in chunk:
                    self.call["break_at"] = None  # progress flows again: a later break counts from its start
                self.text = (self.text + chunk)[-65536:]
                # The newest event id the client has received whole for this call (see Wire).
                self.buf += chunk
                *events, self.buf = re.split(rb"\r\n\r\n|\n\n|\r\r", self.buf)
                for ev in events:
                    m = re.search(rb"^id: ?(.*?)\r?$", ev, re.M)
                    if m:
                        self.call["last_id"] = m.group(1).decode(errors="replace")
                if len(self.wire["head"]) < 1500:
                    self.wire["head"] = (self.wire["head"] + chunk.decode(errors="replace"))[:1500]
                yield chunk
        except Exception:
            self.broke()
            raise
        self.broke()

    async def aclose(self):
        await self.inner.aclose()


class Wire(httpx2.AsyncBaseTransport):
    def __init__(self, app: "App"):
        self.inner = httpx2.AsyncHTTPTransport()
        self.app = app

    async def handle_async_request(self, request):
        call = self.app.call
        watched = False
        if call is not None and request.method == "POST":
            try:
                msg = json.loads(request.content)
                if isinstance(msg, dict) and msg.get("method") == "tools/call":
                    call["rpc_id"], watched = msg.get("id"), True
            except ValueError:
                pass
        resume = request.method == "GET" and "last-event-id" in request.headers
        if call is not None and resume:
            call["resumes"] += 1
            watched = True
            # A resume from an older cursor than the newest event the SDK was given for this call: whatever
            # the replay repeats, the SDK asked for it.
            if call.get("last_id") and request.headers["last-event-id"] != call["last_id"]:
                call["stale_resume"] = True
        resp = await self.inner.handle_async_request(request)
        if call is not None and resp.status_code >= 400:
            call["http_status"] = resp.status_code  # the SDK's error message does not say
        sid = resp.headers.get("mcp-session-id")
        if sid and self.app.replica is None:
            self.app.replica = replica_of(sid)
        if call is not None and resume:
            call["answers"].append(f"{resp.status_code} {resp.headers.get('mcp-resume') or ''}".strip())
        if watched and "text/event-stream" in resp.headers.get("content-type", ""):
            stream = Watched(resp.stream, self.app, call, request.method, request.headers.get("last-event-id"))
            return httpx2.Response(resp.status_code, headers=resp.headers, stream=stream, extensions=resp.extensions)
        return resp

    async def aclose(self):
        await self.inner.aclose()


class App:
    def __init__(self, i: int):
        self.i = i
        self.pool = POOLS[i % len(POOLS)]
        self.url = URLS[i % len(URLS)]
        self.n = 0
        self.call: dict | None = None
        self.replica: str | None = None

    def new_call(self) -> dict:
        self.call = {"sdk": "python", "client": f"py-{self.i}", "pool": self.pool, "start": now_ms(), "end": None,
                     "outcome": None, "reason": None, "code": None, "message": None, "break_at": None,
                     "replica": self.replica, "progress": [], "resumes": 0, "answers": [], "violations": [], "wire": [],
                     "phase": None}
        return self.call

    def finish(self, call: dict, outcome: str, e: BaseException | None = None) -> None:
        if call.get("end") is not None:
            return
        call["outcome"] = outcome
        if e is not None:
            inner = e
            while isinstance(inner, BaseExceptionGroup) and inner.exceptions:
                inner = inner.exceptions[0]
            err = getattr(inner, "error", None)
            msg = str(getattr(err, "message", None) or inner)
            call["code"] = getattr(err, "code", None)
            status = f" (HTTP {call['http_status']})" if call.get("http_status") else ""
            call["message"] = f"{type(inner).__name__}: {msg}{status}"[:240]
            data = getattr(err, "data", None)
            m = REASON.search(msg)
            reason = m.group(1) if m else (data.get("reason") if isinstance(data, dict) else None)
            if call["code"] == -32010 or reason:
                call["outcome"], call["reason"] = "settled", reason
            elif outcome != "hung" and "timed out" in msg.lower():
                call["outcome"] = "hung"
        call.pop("rpc_id", None)
        call.pop("http_status", None)
        call.pop("last_id", None)
        if not call["violations"]:
            call.pop("wire", None)
        call["end"] = now_ms()
        if self.call is call:
            self.call = None
        emit(call)

    async def one(self, session: ClientSession) -> str:
        tag = f"py{self.i}-{self.n}"
        self.n += 1
        name, arguments, expect = tool(self.pool, tag)
        call = self.new_call()
        call["phase"] = "call"

        async def on_progress(progress, total, message):
            prev = call["progress"][-1] if call["progress"] else 0
            if progress <= prev:
                call["violations"].append(f"progress {progress} repeated after {prev}")
            elif progress != prev + 1:
                call["violations"].append(f"progress {progress} after {prev}: skipped without a signal")
            call["progress"].append(progress)

        try:
            # Our own bound a little above the SDK's read timeout: a call that neither gives up is hung too.
            with anyio.fail_after(TIMEOUT + 5):
                r = await session.call_tool(name, arguments, read_timeout_seconds=TIMEOUT, progress_callback=on_progress)
        except TimeoutError as e:
            self.finish(call, "hung", e)
            return "hung"
        except Exception as e:  # noqa: BLE001 - what the application sees is the measurement
            self.finish(call, "error", e)
            return call["outcome"]
        if getattr(r, "is_error", False):
            call["violations"].append(f"tool error: {str(r.content)[:160]}")
        text = "\n".join(getattr(c, "text", "") for c in r.content or [])
        if expect not in text:
            call["violations"].append(f"result not this call's: {text[:160]}")
        if len(call["progress"]) != 6:
            call["violations"].append(f"result after progress {call['progress']}")
        self.finish(call, "completed")
        return "completed"

    async def run(self) -> None:
        await anyio.sleep(rng.random())
        while time.time() < DEADLINE:
            self.replica = None
            http = httpx2.AsyncClient(transport=Wire(self), headers={"x-soak-pool": self.pool},
                                      timeout=httpx2.Timeout(10.0, read=TIMEOUT))
            try:
                async with http, streamable_http_client(self.url, http_client=http) as (read, write):
                    async with ClientSession(read, write) as session:
                        # Opening the session is part of the application's next call: recorded as it if it fails.
                        self.new_call()["phase"] = "initialize"
                        with anyio.fail_after(TIMEOUT):
                            await session.initialize()
                        self.call = None
                        while time.time() < DEADLINE:
                            outcome = await self.one(session)
                            # A settled call leaves the session usable; anything else: a new session.
                            if outcome not in ("completed", "settled"):
                                break
                            await anyio.sleep(0.05 + rng.random() * 0.2)
            except Exception as e:  # noqa: BLE001 - the session went down, under a call or while connecting
                if self.call is not None:
                    self.finish(self.call, "hung" if isinstance(e, TimeoutError) else "error", e)
                await anyio.sleep(0.2)


async def main() -> None:
    async with anyio.create_task_group() as tg:
        for i in range(args.clients):
            tg.start_soon(App(i).run)
    emit({"finished": args.clients})


if __name__ == "__main__":
    # Calls start until --seconds are up; the last ends within its timeout, or this process does.
    signal.signal(signal.SIGALRM, lambda *_: (emit({"fatal": "hard timeout"}), os._exit(3)))
    signal.alarm(int(args.seconds + TIMEOUT + 20))
    anyio.run(main)
