"""The settling answer names the client's own request id, through Envoy (issue 29, hole 7).

A POST whose JSON-RPC id only a careful reader gets right (a number beyond 64 bits behind an escaped,
duplicate key; a long string) opens a request stream; with the ownership service down, the resume of
its cursor is refused and settled. The error's id must be the body's id as the client's JSON parser
reads it: Python's `json` (exact integers) and, when Node is installed, `JSON.parse`, and the same raw
text. The long id also shows that a cursor carrying it passes Envoy as `Last-Event-ID`.
"""
from __future__ import annotations

import http.client
import json
import shutil
import subprocess
import uuid

import pytest

import harness as h
from test_seed_scenarios import assert_no_cursor_reached_a_replica

LONG = '"' + "q" * 3000 + '"'
CASES = {
    # The first `id` is a decoy: every parser keeps the last, whose key is escaped.
    "big_int_escaped_duplicate_key": ('{"jsonrpc":"2.0","id":1,"method":"tools/call","params":PARAMS,'
                                      '"i\\u0064":18446744073709551617}', "18446744073709551617"),
    "long_string": ('{"jsonrpc":"2.0","method":"tools/call","params":PARAMS,"id":' + LONG + "}", LONG),
}


def post_raw(c: h.Client, body: str) -> h.SSEStream:
    """A POST of `body` exactly as written (Client.open would re-serialize a dict)."""
    conn = http.client.HTTPConnection(h.HOST, c.port, timeout=c.timeout)
    headers = c._headers({"content-type": "application/json"})
    conn.request("POST", h.PATH, body=body.encode(), headers=headers)
    return h.SSEStream(conn, conn.getresponse())


def node_ids_equal(request_body: str, answer_data: str) -> bool | None:
    """Whether JSON.parse reads the same id from both (None: no Node here)."""
    node = shutil.which("node")
    if node is None:
        return None
    script = ("const [b, a] = process.argv.slice(1).map(JSON.parse);"
              "process.stdout.write(String(Object.is(b.id, a.id)))")
    out = subprocess.run([node, "-e", script, request_body, answer_data], capture_output=True, text=True,
                         timeout=10, check=True)
    return out.stdout == "true"


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_settled_call_gets_its_own_id_back(fresh, case):
    fresh.use(guard=True)
    template, raw_id = CASES[case]
    params = json.dumps({"name": "ledger_append",
                         "arguments": {"entry": f"ids-{uuid.uuid4().hex[:8]}", "steps": 2, "step_ms": 10}})
    body = template.replace("PARAMS", params)
    c = h.Client()
    c.initialize()
    s = post_raw(c, body)
    assert s.status == 200 and s.is_sse, s.status
    cursor = s.next_event().id
    s.close()
    assert cursor, "the request stream's first event has a cursor"
    fresh.ownership.stop()
    r = c.get_stream(last_event_id=cursor)
    answer = r.resp.read()
    r.close()
    want = json.loads(body)["id"]
    msg = h.assert_settled(r, answer, "ownership_unavailable", request_id=want)
    assert type(msg["id"]) is type(want), (msg["id"], want)
    data = answer.decode().split("event: message\ndata: ", 1)[1].split("\n", 1)[0]
    assert f'"id":{raw_id},' in data, data[:200]
    assert node_ids_equal(body, data) in (True, None)
    assert_no_cursor_reached_a_replica()
