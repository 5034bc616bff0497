"""A malformed Mcp-Session-Id never reaches a replica, under the real Envoy with the shipped
production config (envoy/envoy-production.yaml), Wasm and native guard.

The per-client `initialize` rate limit matches POSTs *without* Mcp-Session-Id. A POST with an empty
one is not such a POST to Envoy's route match, so it dodges the bucket; servers that read an empty
header as none would open a session for it. The guard answers every request whose Mcp-Session-Id is
empty, not visible ASCII (0x21-0x7E) or repeated with a 400 naming the reason, so a flood of them
costs no replica anything and leaves every other client's `initialize` alone.
"""
from __future__ import annotations

import json
import threading

import pytest

import harness as h
from test_deploy_limits import FLOOD_S, FLOODER, INITIALIZE, OTHERS, connect, initialize_others_under

RESUME_HEADER = "mcp-resume"
# (header values, the reason named): each a way around `present_match: false`.
MALFORMED = [
    ([""], "bad_session_id"),
    (["a b"], "bad_session_id"),
    (["", "s-1"], "duplicate_header"),
]


def production(build: str) -> dict:
    """envoy-production.yaml on the test ports, its guard filter the Wasm or the native one."""
    cfg = h.envoy_config(base="envoy-production.yaml")
    if build == "native":
        if not list(h.NATIVE_DIR.glob("*.so")):
            pytest.skip(f"no native module in {h.NATIVE_DIR} (make native)")
        native = h.guard_filter(h.envoy_config(base="envoy-native.yaml"))
        filters = h.hcm(cfg)["http_filters"]
        filters[:] = [native if f["name"] == "mcp_resume_guard" else f for f in filters]
    return cfg


def seen() -> list[dict]:
    return [s for p in h.REPLICA_PORTS for s in h.replica_get(p, "/_naive/seen")]


def malformed_post(proto: str, values: list[str]) -> tuple[int, str | None, dict]:
    headers = [("content-type", "application/json"), ("accept", "application/json, text/event-stream")]
    headers += [("mcp-session-id", v) for v in values]
    r = h.raw_request(proto, "POST", h.PATH, headers, body=INITIALIZE.encode(), timeout=5)
    try:
        body = r.read_body(timeout=5)
    finally:
        r.close()
    return r.status, r.header(RESUME_HEADER), json.loads(body or b"{}")


@pytest.mark.parametrize("build", ["wasm", "native"])
def test_a_malformed_session_id_is_refused_and_leaves_other_clients_initialize_alone(fresh, build):
    cfg = production(build)
    flood: list[tuple[int, str | None]] = []
    stop = threading.Event()

    def flooder(_n: int) -> None:
        conn = connect(FLOODER)
        try:
            while not stop.is_set():
                conn.request("POST", h.PATH, body=INITIALIZE, headers={
                    "content-type": "application/json", "accept": "application/json, text/event-stream",
                    "mcp-session-id": ""})
                r = conn.getresponse()
                r.read()
                flood.append((r.status, r.getheader(RESUME_HEADER)))
        finally:
            conn.close()

    with fresh.own_gateway(f"envoy-session-header-{build}", cfg):
        for p in h.REPLICA_PORTS:
            h.replica_reset(p)
        # Every form over both protocols: the refusal names its reason and settles the call.
        for proto in ("h1", "h2"):
            for values, reason in MALFORMED:
                status, said, body = malformed_post(proto, values)
                assert (status, said) == (400, f"rejected; reason={reason}"), (proto, values, status, said)
                assert body.get("id", 0) is None and body["error"]["data"]["reason"] == reason, body
        others = initialize_others_under(flooder, stop)
        reached = seen()
    answers = {a for a in flood}
    print(f"\nflood of empty Mcp-Session-Id from {FLOODER} ({build}): {len(flood)} requests in {FLOOD_S:.0f} s, "
          f"answers {answers}; others: {[s for _, s, _ in others]}; replicas saw {len(reached)} requests")
    assert len(flood) >= 100 and answers == {(400, "rejected; reason=bad_session_id")}, (len(flood), answers)
    # Every other client opened its session...
    assert [(src, status) for src, status, sid in others if status != 200 or not sid] == [], others
    # ...and what reached a replica is exactly their initializes: no malformed request at all.
    assert sorted(s["method"] for s in reached) == ["POST"] * len(OTHERS), reached
    assert all(s.get("session") is None for s in reached), reached
