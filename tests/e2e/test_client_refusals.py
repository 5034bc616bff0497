"""A refused resume, judged by the application: the real SDK clients are the oracle.

A pending `tools/call` (the `progress_steps` tool on SDK replicas with an event store) loses its stream;
before the resume reaches the guard the test makes it refusable (the client calls a hook first):

* `owner_gone`: the owner is marked gone (`POST /v1/owners/gone`, what a preStop hook does);
* `gap`: the guard is told the owner keeps 1 event per stream (`retention: 1`) and the cursor is further
  behind than that;
* `session_inactive`: the session is deleted (`DELETE`) before the resume;
* `ownership_down`: the ownership service is stopped;
* `forked`: another continuation of the same stream takes it over while the application's runs.

`superseded` concerns standalone GET streams only (a newer GET stream of the session replaces the older
one); a request stream is never superseded, so it has no row here.

Paths: TypeScript 1.32 (`auto`: the transport's own reconnection with Last-Event-ID; `token`: a second
client resumes with `resumptionToken`), Python mcp 2.3 (`auto`: the transport's reconnection; `token`:
`ClientMessageMetadata.resumption_token`). For each: does the pending call settle, how fast, with what
error, does a second call on the same session succeed, does the session survive (a ping).

Every case writes its row to target/client-refusals.json; `tests/e2e/client_refusals_table.py` prints the
table of docs/interop-ts-python.md from it.
"""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import harness as h
from stack.topology import running
import interop as i

i.require_sdks()

RESULTS = h.ROOT / "target" / "client-refusals.json"
KINDS = ["owner_gone", "gap", "session_inactive", "ownership_down", "forked"]
# The reason the guard gives for each kind (forked: the cut of the older continuation).
REASON = {"owner_gone": "owner_unavailable", "gap": "gap", "session_inactive": "session_inactive",
          "ownership_down": "ownership_unavailable", "forked": "forked"}
CASES = [(sdk, kind, path) for sdk in ("ts", "py") for kind in KINDS for path in ("auto", "token")]
POLICY = {"get_stream": "restart", "request_stream": "settle"}
SETTLE_MS = 2000  # the promise: a refused resume settles the pending call within this


class Hook:
    """The clients call this before their first resume; the test's action makes the resume refusable."""

    def __init__(self):
        hook = self
        self.action = None
        self.notes: list[dict] = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                note = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)) or b"{}")
                hook.notes.append(note)
                try:
                    if hook.action is not None:
                        hook.action(note)
                    status = 200
                except Exception as e:  # noqa: BLE001 - reported to the client, asserted by the test
                    note["action_error"] = repr(e)
                    status = 500
                self.send_response(status)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer((h.HOST, 0), Handler)
        self.url = f"http://{h.HOST}:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def hook():
    yield from running(Hook())


@pytest.fixture(scope="module")
def sdks(stack):
    """One SDK stack at a time on the harness ports; the cases are ordered so each starts once."""
    held: dict = {}

    def get(kind: str) -> i.SdkStack:
        if held.get("kind") != kind:
            if held.get("stack"):
                held["stack"].stop()
            held["stack"] = i.SdkStack(stack, kind).start()
            held["kind"] = kind
        return held["stack"]

    try:
        yield get
    finally:
        if held.get("stack"):
            held["stack"].stop()


def competing_continuation(note: dict, seen: dict) -> None:
    """Another client resumes the same stream while the application's continuation runs: newest wins."""
    time.sleep(0.3)
    c = h.Client(timeout=4)
    c.session = note["session"]
    s = c.get_stream(last_event_id=note["last_event_id"])
    seen["status"] = s.status
    seen["mcp_resume"] = s.header("mcp-resume")
    seen["replica"] = s.header("x-replica")
    try:
        evs = s.read_all()
        seen["events"] = [e.event for e in evs]
        seen["control"] = [e.json().get("reason") for e in evs if e.event == "mcp-resume"]
    except OSError as e:
        seen["error"] = repr(e)
    finally:
        s.close()


def action_for(kind: str, sdk: i.SdkStack, stack, seen: dict):
    def owner_gone(note):
        owner = f"{h.HOST}:{sdk.port_of(note['replica'])}"
        status, body = h.http_json("POST", h.OWNERSHIP_PORT, "/v1/owners/gone", {"owner": owner})
        assert status == 200, body
        time.sleep(0.05)

    def gap(note):
        time.sleep(0.3)  # the guard's records of the relayed events land (batched)

    def session_inactive(note):
        c = h.Client()
        c.session = note["session"]
        assert c.request("DELETE").status == 200
        time.sleep(0.15)  # the guard records the DELETE asynchronously

    def ownership_down(note):
        stack.ownership.stop()

    def forked(note):
        threading.Thread(target=competing_continuation, args=(note, seen), daemon=True).start()

    return {"owner_gone": owner_gone, "gap": gap, "session_inactive": session_inactive,
            "ownership_down": ownership_down, "forked": forked}[kind]


def run_client(sdk: str, path: str, kind: str, hook_url: str) -> dict:
    live = kind == "forked"  # the tool must still run when the competitor comes
    steps, step_ms = (8, 150) if live else (5, 120)
    if sdk == "ts":
        args = ["--path", path, "--hook", hook_url, "--steps", steps, "--step-ms", step_ms,
                "--timeout", 4000 if path == "auto" else 2500]
        if path == "auto":
            args += ["--cut", 2] + (["--drain"] if kind == "gap" else [])
        else:
            args += ["--drop-after", 2] + (["--token-index", 0] if kind == "gap" else [])
        return i.ts_client("refusal", *args, timeout=40)
    args = ["--path", path, "--hook", hook_url, "--steps", steps, "--step-ms", step_ms, "--timeout", 4,
            "--drop-after", 2, "--from", 2]
    if kind == "gap" and path == "auto":
        args.append("--drain")
    return i.py_client("refusal", *args, timeout=40)


def reason_in(call: dict) -> str | None:
    data = call.get("data")
    if isinstance(data, dict) and data.get("reason"):
        return data["reason"]
    text = f"{call.get('error') or ''} {call.get('message') or ''}"
    return next((r for r in REASON.values() if r in text), None)


def row_of(sdk: str, path: str, kind: str, out: dict) -> dict:
    call = dict(out.get("call") or {"outcome": "missing"})
    fatal = out.get("fatal")
    if isinstance(fatal, dict) and call["outcome"] in ("exception", "missing", "crash"):
        # Python: an exception escaped the transport and took the session down under the call.
        call.update(outcome="crash", error=f"{fatal['exception']}: {fatal['error']}")
    tokens = {t["token"] for t in out.get("tokens", [])}
    resumes = [x for x in out["http"] if x["method"] == "GET" and x.get("last_event_id") in tokens]
    first = resumes[0] if resumes else None
    settled = call["outcome"] in ("result", "error")
    second = out.get("second") or {"outcome": "missing"}
    return {
        "sdk": sdk, "path": path, "kind": kind,
        "guard_answer": f"{first.get('status')} {first.get('mcp_resume') or ''}".strip() if first else None,
        "resumes": len(resumes),
        "outcome": call["outcome"],
        "settled": settled,
        "settle_ms": (call["t_ms"] - first["t_ms"]) if first and call.get("t_ms") is not None else None,
        "since_break_ms": (call["t_ms"] - out["cut_ms"]) if call.get("t_ms") and out.get("cut_ms") else None,
        "code": call.get("code"),
        "error": (call.get("error") or "")[:200] or None,
        "reason": reason_in(call),
        "second_call": second["outcome"] == "result",
        # The next call answered with a refusal meant for the original request (same JSON-RPC id).
        "second_wrongly_settled": second.get("code") == -32010,
        "second": second.get("error") or second.get("outcome"),
        "session_survived": out.get("ping") == "ok",
        "ping": out.get("ping") or (out.get("fatal") or {}).get("exception"),
    }


def save(row: dict, out: dict) -> None:
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    raw = RESULTS.with_suffix("")  # every client's own record, for reading a row's story
    raw.mkdir(exist_ok=True)
    (raw / f"{row['sdk']}-{row['path']}-{row['kind']}.json").write_text(json.dumps(out, indent=1))
    try:
        rows = json.loads(RESULTS.read_text())
    except (OSError, ValueError):
        rows = {}
    rows[f"{row['sdk']}/{row['path']}/{row['kind']}"] = row
    RESULTS.write_text(json.dumps(rows, indent=1, sort_keys=True))


@pytest.mark.parametrize("sdk,kind,path", CASES, ids=[f"{s}-{p}-{k}" for s, k, p in CASES])
def test_pending_call_meets_a_refused_resume(stack, sdks, hook, sdk, kind, path):
    s = sdks(sdk)
    stack.ensure_ownership()
    s.reset()
    # The default policies, spelled out: the shipped Envoy configs may pin another.
    overrides = {"policy": POLICY, **({"retention": 1} if kind == "gap" else {})}
    s.use(guard=True, **overrides)
    competitor: dict = {}
    hook.action = action_for(kind, s, stack, competitor)
    hook.notes.clear()
    try:
        out = run_client(sdk, path, kind, hook.url)
    finally:
        hook.action = None
        stack.ensure_ownership()
    row = row_of(sdk, path, kind, out)
    row["competitor"] = competitor or None
    save(row, out)
    print(json.dumps(row))
    assert hook.notes and not any("action_error" in n for n in hook.notes), (hook.notes, out)
    if sdk == "ts" and path == "token":
        # TS 1.32.2 remaps only results on an explicit resume (dist/esm/client/streamableHttp.js:
        # `if (isJSONRPCResultResponse(message)) { ... message.id = replayMessageId; }`): an error
        # keeps the original request's id, which is not this request's, so the call waits for its
        # timeout; the transport reports the id as unknown.
        if kind == "forked":
            # The competitor is refused by the SDK server (its own 409, `replay_missing` for the
            # competitor): its branch ends at once, the application's continuation goes on and its
            # result is remapped to the call. Or the timing lets the competitor win: a timeout.
            assert row["outcome"] in ("result", "timeout"), row
        else:
            assert row["outcome"] == "timeout" and not row["settled"], row
        # At the timeout the SDK sends notifications/cancelled with the same resumption options: one
        # more GET with the cursor, refused again, and that error (the original request's id) settles
        # whatever call of this client has that id now, e.g. the next one: wrongly.
        assert row["second_call"] or row["second_wrongly_settled"], row
        assert row["session_survived"] == (kind != "session_inactive"), row
        return
    if kind == "forked":
        # A competing continuation takes the stream over (the store follows the replica) and the
        # application's is cut
        # (`forked`, a control event, then a reset). What follows is the SDK's own reconnect: TS resumes
        # with its newest cursor and gets the result; Python 2.3 resumes with the cursor it had before
        # the cut (streamable_http.py `_handle_reconnection`: `last_event_id`, not the newer one) and
        # meets the stream the fork left behind. Either way the call ends, and the session works.
        assert row["outcome"] in ("result", "error"), (row, out)
        assert row["second_call"] and row["session_survived"], row
        return
    assert row["guard_answer"] is not None, out
    # The acceptance: settled, within SETTLE_MS of the refused resume, the reason in the error.
    assert row["settled"] and row["outcome"] == "error", (row, out)
    assert row["settle_ms"] is not None and row["settle_ms"] < SETTLE_MS, row
    assert row["reason"] == REASON[kind], row
    if kind == "session_inactive":
        # The session was deleted: the next call meets the server's 404, as an error, not a hang.
        assert not row["second_call"] and out["second"]["outcome"] == "error", row
    else:
        assert row["second_call"] and row["session_survived"], row
