"""The native build (Envoy dynamic module) itself: Envoy 1.40 loads it, it passes traffic, and a
bad configuration is refused with the field named. The guard's behaviour is checked against both
builds by test_seed_scenarios.py and test_guard_rules.py (E2E_BUILD=native)."""
import subprocess
import time

import pytest
import yaml

import harness as h

NATIVE = "envoy-native.yaml"


def validate(cfg: dict, name: str) -> subprocess.CompletedProcess:
    h.RUNS.mkdir(parents=True, exist_ok=True)
    path = h.RUNS / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return subprocess.run([str(h.ENVOY_BIN), "--mode", "validate", "-c", str(path), "--log-level", "info"],
                          capture_output=True, text=True, timeout=120, cwd=h.ROOT,
                          env={"ENVOY_DYNAMIC_MODULES_SEARCH_PATH": str(h.NATIVE_DIR), "PATH": "/usr/bin:/bin"})


def test_module_loads_in_validate_mode_with_matching_abi():
    r = validate(h.envoy_config(base=NATIVE), "native-validate")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "Dynamic module ABI version v0.2.0 matched" in out, out


@pytest.mark.parametrize("change, message", [
    ({"keys": [{"id": 1, "active": True, "secret": "c2hvcnQ="}]},
     "invalid config: keys[0].secret: must decode to at least 32 bytes, got 5"),
    ({"ownership": {"cluster": "mcp_ownership", "timeout_ms": 0}}, "ownership.timeout_ms"),
    ({"no_such_field": 1}, "no_such_field"),
])
def test_bad_config_is_refused_naming_the_field(change, message):
    r = validate(h.envoy_config(base=NATIVE, plugin_overrides=change), "native-bad")
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    assert message in out, out


def test_unknown_filter_name_is_refused():
    cfg = h.envoy_config(base=NATIVE)
    h.guard_filter(cfg)["typed_config"]["filter_name"] = "something_else"
    r = validate(cfg, "native-bad-name")
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    assert "filter_name: must be mcp_resume_guard" in out, out


def test_module_passes_traffic(fresh):
    with fresh.own_gateway("envoy-native-traffic", h.envoy_config(base=NATIVE)):
        c = h.Client()
        sid = c.initialize()
        assert sid
        s = c.get_stream()
        assert s.status == 200 and s.is_sse
        ev = s.read(1)
        s.close()
        # The id a client sees is a guard cursor, not the replica's own id.
        assert ev and ev[0].id and len(ev[0].id) > 40, ev


def test_native_config_differs_from_the_wasm_one_only_in_the_guard_filter():
    wasm, native = h.base_envoy_config("envoy.yaml"), h.base_envoy_config(NATIVE)
    assert h.plugin_config(wasm) == h.plugin_config(native)
    for cfg in (wasm, native):
        hcm = h.hcm(cfg)
        hcm["http_filters"] = [f for f in hcm["http_filters"] if f["name"] != "mcp_resume_guard"]
    assert wasm == native


def test_newer_continuation_ends_the_older_stream_with_forked(fresh):
    """Two live streams of one incarnation, both fed by the replica: the store refuses the older
    branch's events once the newer relays, and the older one is told `forked` and ends."""
    fresh.use(guard=True)
    c = h.Client()
    c.initialize()
    first = c.get_stream()
    assert first.status == 200
    evs = first.read(3)
    assert len(evs) == 3
    second = c.get_stream(last_event_id=evs[1].id)
    assert second.status == 200 and second.header("mcp-resume") is None
    assert len(second.read(2)) == 2
    # Bounded: without the fork rule the older stream would go on relaying (the replica keeps it).
    rest = []
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and len(rest) < 50:
        ev = first.next_event()
        if ev is None:
            break
        rest.append(ev)
        if ev.event == "mcp-resume":
            break
    first.close()
    second.close()
    assert rest and rest[-1].event == "mcp-resume", [e.event for e in rest]
    assert rest[-1].json() == {"resumed": False, "reason": "forked"}

