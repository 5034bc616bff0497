"""Every client decodes a guarded SSE body as the guard parses it: UTF-8 (red team 2, finding 1);
a request body's leading BOM is read past, as servers' JSON parsers do (finding 9).

Python's SDK decodes a body by the `charset` its HTTP library (httpx2) reads from the
`Content-Type` through `email.message`, which understands RFC 2231 (`charset*`, `charset*0`,
`charset'lang'value`) and strips Unicode whitespace around names. The guard answers with two
layers: every answer it relays as SSE reaches the client as exactly `text/event-stream`, and an
SSE answer whose `Content-Type` declares anything but UTF-8, in any such form, is refused
(`encoded_stream`). Here real Envoy with the built guard faces a replica that sends such shapes;
the oracle for "declares a foreign charset" is httpx2's own reading of the header.
"""
from __future__ import annotations

import codecs
import json
import time

import httpx2
import pytest

import harness as h
from stack.upstream import ACCEPTED, Upstream, initialize_answer
from test_hostile import HOSTILE_PORT, HostileUpstream, event, hostile_envoy  # noqa: F401 (a fixture)
from test_request_ids import post_raw
from test_seed_scenarios import GUARD_HEADER

REFUSED = "rejected; reason=encoded_stream"
# The red team's three shapes (probe.py charset, charset0, charsetnbsp).
PROBE_SHAPES = [
    b"text/event-stream; charset*=''utf-16le",
    b"text/event-stream; charset*0=utf-16le",
    b"text/event-stream;\xa0charset=utf-16le",
]
# What a replica meant as UTF-16: U+0A0A is the bytes 0A 0A, a blank line to a UTF-8 reading.
FOREIGN_BODY = "id: g2\ndata: FOREIGN g2\n\n:\u0a0a".encode("utf-16-le")
PLAIN_EVENTS = b"".join(event(i, b"h%d" % i) for i in range(1, 4))


class CharsetUpstream(Upstream):
    """Answers every GET with the `Content-Type` the request names (hex, in `x-ct`): a fresh
    stream carries events h1..h3, a resume (Last-Event-ID) the given body."""

    def __init__(self, resume_body: bytes = b""):
        self.resume_body = resume_body
        self.cursors: list[bytes] = []
        super().__init__(HOSTILE_PORT)

    def answer(self, method, headers, body, out):
        if method == b"POST" and b'"initialize"' in body:
            out.write(initialize_answer("charset", b"c0ffee01"))
            return True
        if method == b"POST":
            out.write(ACCEPTED)
            return True
        ct = bytes.fromhex(headers.get(b"x-ct", b"").decode())
        resume = b"last-event-id" in headers
        if resume:
            self.cursors.append(headers[b"last-event-id"])
        out.write(b"HTTP/1.1 200 OK\r\ncontent-type: " + ct + b"\r\nconnection: close\r\n\r\n")
        out.write(self.resume_body if resume else PLAIN_EVENTS)
        out.flush()
        return False


def python_charset(ct: bytes) -> str | None:
    """The codec Python's SDK decodes a body with under this Content-Type (None: its default,
    UTF-8), read by httpx2 itself."""
    cs = httpx2.Response(200, headers=[(b"content-type", ct)]).charset_encoding
    try:
        return codecs.lookup(cs).name if cs else None
    except LookupError:
        return None


def all_content_types(s: h.SSEStream) -> list[str]:
    return s.resp.msg.get_all("content-type") or []


def a_cursor(c: h.Client) -> str:
    """A guard cursor of the session's first GET stream (its first event, h1)."""
    s = c.get_stream(headers={"x-ct": b"text/event-stream".hex()})
    evs = s.read_all()
    s.close()
    assert len(evs) == 3 and all(e.id for e in evs), evs
    time.sleep(0.2)  # the records land
    return evs[0].id


@pytest.mark.parametrize("ct", PROBE_SHAPES, ids=["charset*", "charset*0", "nbsp"])
def test_the_probes_shapes_are_refused_on_resume(fresh, hostile_envoy, ct):
    # The shape does make Python's client decode UTF-16: it is a real hole if relayed.
    assert python_charset(ct) == "utf-16-le"
    with CharsetUpstream(resume_body=FOREIGN_BODY) as up:
        c = h.Client()
        c.initialize()
        cursor = a_cursor(c)
        before = hostile_envoy.stats()
        r = c.get_stream(last_event_id=cursor, headers={"x-ct": ct.hex()})
        body = r.resp.read()
        r.close()
        assert up.cursors == [b"h1"], up.cursors  # it went to the owner, with its own id
        assert r.status == 409 and r.header(GUARD_HEADER) == REFUSED, (r.status, body)
        assert json.loads(body)["error"]["data"] == {"resumed": False, "reason": "encoded_stream"}
        assert FOREIGN_BODY not in body
        after = hostile_envoy.stats()
        key = "mcp_resume_guard.refused.encoded_stream"
        assert after[key] == before[key] + 1


def test_a_utf8_continuation_continues_as_plain_event_stream(fresh, hostile_envoy):
    ct = b"text/event-stream; charset=utf-8"
    with CharsetUpstream(resume_body=PLAIN_EVENTS[PLAIN_EVENTS.index(b"id: h2"):]) as up:
        c = h.Client()
        c.initialize()
        cursor = a_cursor(c)
        # Read by the Python SDK's own SSE reader, as its client reads a resumed GET.
        headers = {"accept": "text/event-stream", "mcp-session-id": c.session, "last-event-id": cursor,
                   "mcp-protocol-version": c.version or "2025-03-26", "x-ct": ct.hex()}
        with httpx2.Client() as hc:
            with hc.stream("GET", f"http://{h.HOST}:{h.ENVOY_PORT}{h.PATH}", headers=headers,
                           timeout=10) as r:
                got = [(e.id, json.loads(e.data)["params"]["n"]) for e in httpx2.EventSource(r)]
                cts = r.headers.get_list("content-type")
                status, resume = r.status_code, r.headers.get(GUARD_HEADER)
        assert up.cursors == [b"h1"], up.cursors
        assert status == 200 and resume is None, (status, resume)
        assert cts == ["text/event-stream"], cts
        assert [n for _, n in got] == [2, 3], got
        assert all(i and i not in ("h2", "h3") for i, _ in got), got  # guard cursors, not raw ids


def test_any_content_type_python_reads_as_foreign_is_refused(fresh, hostile_envoy):
    """A sweep of Content-Type shapes on fresh GET streams. Whatever httpx2 would decode with a
    codec other than UTF-8 is refused by name; everything else is refused too or reaches the
    client as exactly `text/event-stream`."""
    names = [b"charset", b"CHARSET", b"ChArSeT", b"charset*", b"charset*0", b"charset*0*",
             b" charset ", b"\tcharset", b"\xa0charset", b"charset\xa0", b"\xc2\xa0charset",
             b"\xe2\x80\x83charset", b"\x85charset"]
    values = [b"utf-16le", b"UTF-16", b"utf-7", b"latin1", b"\"utf-16le\"", b"''utf-16le",
              b"utf-8''utf-16le", b"us-ascii'en'utf-16le", b"''%75tf-16le", b"utf-16le\xa0",
              b"\" utf-16le \"", b"utf-8", b"UTF8", b"\"utf-8\"", b"utf-8''utf-8", b"'utf-16le'"]
    heads = [b"text/event-stream;", b"text/event-stream; x=1 ;", b"text/plain, text/event-stream;"]
    shapes = [hd + n + b"=" + v for hd in heads for n in names for v in values]
    foreign = [s for s in shapes if python_charset(s) not in (None, "utf-8")]
    assert len(foreign) >= len(shapes) // 4, "the sweep must exercise foreign charsets"
    with CharsetUpstream():
        c = h.Client()
        c.initialize()
        wrong = []
        for ct in shapes:
            s = c.get_stream(headers={"x-ct": ct.hex()})
            s.resp.read()
            s.close()
            refused = s.status == 409 and s.header(GUARD_HEADER) == REFUSED
            plain = s.status == 200 and all_content_types(s) == ["text/event-stream"]
            if not (refused if ct in foreign else refused or plain):
                wrong.append((ct, python_charset(ct), s.status, all_content_types(s)))
        assert not wrong, f"{len(wrong)} of {len(shapes)}: {wrong[:5]}"
        # Plain UTF-8 does stream.
        s = c.get_stream(headers={"x-ct": b"text/event-stream; charset=UTF-8".hex()})
        evs = s.read_all()
        s.close()
        assert s.status == 200 and len(evs) == 3 and all_content_types(s) == ["text/event-stream"]


def test_a_call_whose_body_starts_with_a_bom_is_settled_with_its_own_id(fresh, hostile_envoy):
    """Python's json.loads(bytes) and TextDecoder + JSON.parse read past a leading UTF-8 BOM, so a
    server runs such a call: its refused resume must settle it by its id, not `null`."""
    call = {"jsonrpc": "2.0", "id": 45, "method": "tools/call", "params": {"name": "x", "arguments": {}}}
    body = "\ufeff" + json.dumps(call)
    assert json.loads(body.encode())["id"] == 45  # Python's own reading of the bytes
    with HostileUpstream(PLAIN_EVENTS, post_sse=True):
        c = h.Client()
        c.initialize()
        s = post_raw(c, body)
        first = s.next_event()
        s.close()
        assert s.status == 200 and first is not None and first.id, (s.status, first)
        time.sleep(0.2)  # the records land
        fresh.ownership.stop()
        r = c.get_stream(last_event_id=first.id)
        answer = r.resp.read()
        r.close()
        h.assert_settled(r, answer, "ownership_unavailable", request_id=45)
