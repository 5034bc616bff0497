"""Envoy Gateway manifests and the Istio stats bootstrap, checked as far as this machine allows
(no cluster, no Envoy Gateway controller, no CRD schemas from a registry): YAML and object shape,
names that must agree, the plugin config against the schema and `mcp-guard check-config`, and the
Envoy that Envoy Gateway would run (its listener shape with the EnvoyPatchPolicy's patches applied,
the ownership cluster added, the bootstrap merged) loaded by `envoy --mode validate` with the real
filter.
"""
from __future__ import annotations

import copy
import json
import os
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml

from stack.envoy import ENVOY_BIN, TEST_KEY, envoy_config
from stack.procs import BIN, ROOT

EG = ROOT / "deploy" / "envoy-gateway" / "mcp-resume-guard.yaml"
ISTIO_STATS = ROOT / "deploy" / "istio" / "stats-bootstrap.yaml"
SCHEMA = json.loads((ROOT / "schema" / "config.schema.json").read_text())
CLI = BIN / "mcp-guard"
WASM_TYPE = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm"
FILTER_CONFIG_TYPE = "type.googleapis.com/envoy.config.route.v3.FilterConfig"
# How Envoy Gateway names the Wasm filter of EnvoyExtensionPolicy mcp/mcp-resume-guard, wasm[0].
EG_WASM_NAME = "envoy.filters.http.wasm/envoyextensionpolicy/mcp/mcp-resume-guard/0"
SS_NAME = "mcp_resume_guard.stateful_session"
# Envoy Gateway's local rate limit filter (BackendTrafficPolicy rateLimit.local).
RL_NAME = "envoy.filters.http.local_ratelimit"
RL_TYPE = "type.googleapis.com/envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit"
FULL = {"default_value": {"numerator": 100, "denominator": "HUNDRED"}}


def objects() -> dict[str, dict]:
    docs = [d for d in yaml.safe_load_all(EG.read_text()) if d]
    by_kind = {d["kind"]: d for d in docs}
    assert len(by_kind) == len(docs), "one object per kind"
    return by_kind


def test_objects_and_api_versions():
    o = objects()
    assert {k: v["apiVersion"] for k, v in o.items()} == {
        "EnvoyProxy": "gateway.envoyproxy.io/v1alpha1",
        "Gateway": "gateway.networking.k8s.io/v1",
        "HTTPRoute": "gateway.networking.k8s.io/v1",
        "BackendTrafficPolicy": "gateway.envoyproxy.io/v1alpha1",
        "EnvoyExtensionPolicy": "gateway.envoyproxy.io/v1alpha1",
        "EnvoyPatchPolicy": "gateway.envoyproxy.io/v1alpha1",
    }
    assert len({v["metadata"]["namespace"] for v in o.values()}) == 1, "policies attach within one namespace"


def test_names_agree():
    o = objects()
    gw = o["Gateway"]
    gname = gw["metadata"]["name"]
    assert gw["spec"]["infrastructure"]["parametersRef"] == {
        "group": "gateway.envoyproxy.io", "kind": "EnvoyProxy", "name": o["EnvoyProxy"]["metadata"]["name"]}
    assert o["HTTPRoute"]["spec"]["parentRefs"] == [{"name": gname}]
    assert o["EnvoyExtensionPolicy"]["spec"]["targetRefs"] == [
        {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": gname}]
    assert o["EnvoyPatchPolicy"]["spec"]["targetRef"] == {
        "group": "gateway.networking.k8s.io", "kind": "Gateway", "name": gname}
    # Envoy Gateway names a listener <namespace>/<gateway>/<listener>.
    listener = f"{gw['metadata']['namespace']}/{gname}/{gw['spec']['listeners'][0]['name']}"
    patches = o["EnvoyPatchPolicy"]["spec"]["jsonPatches"]
    assert {p["name"] for p in patches if p["type"].endswith("Listener")} == {listener}
    wasm = o["EnvoyExtensionPolicy"]["spec"]["wasm"][0]
    cluster = [p for p in patches if p["type"].endswith("Cluster")]
    assert [c["operation"]["value"]["name"] for c in cluster] == [wasm["config"]["ownership"]["cluster"]]
    header = wasm["config"]["owner_header"]
    pins = [p for p in patches if p["operation"]["path"].endswith(f"/typed_per_filter_config/{SS_NAME}")]
    assert len(pins) == 2, "one pin per MCP route"
    for p in pins:
        assert p["name"] == listener, "Envoy Gateway names the route configuration as the listener"
        state = p["operation"]["value"]["stateful_session"]["session_state"]["typed_config"]
        assert state["name"] == header
    for rule in o["HTTPRoute"]["spec"]["rules"]:
        mods = {f["type"]: f for f in rule["filters"]}
        assert mods["RequestHeaderModifier"]["requestHeaderModifier"]["remove"] == [header]
        assert mods["ResponseHeaderModifier"]["responseHeaderModifier"]["remove"] == [header]


def test_wasm_policy_fails_closed_and_config_matches_schema():
    w = objects()["EnvoyExtensionPolicy"]["spec"]["wasm"][0]
    assert w["failOpen"] is False and w["rootID"] == "mcp_resume_guard"
    assert w["code"]["type"] == "Image" and "image" in w["code"]
    jsonschema.validate(w["config"], SCHEMA)


def test_route_has_no_deadline_and_no_retry():
    for rule in objects()["HTTPRoute"]["spec"]["rules"]:
        assert rule["timeouts"]["request"] in ("0s", 0)
        assert "retry" not in rule


def test_only_the_mcp_paths_are_pinned():
    """Rule 0 is exactly the guard's mcp_paths, with and without one trailing slash; the
    route-configuration patches pin its two routes and no other."""
    o = objects()
    paths = o["EnvoyExtensionPolicy"]["spec"]["wasm"][0]["config"]["mcp_paths"]
    rule0 = o["HTTPRoute"]["spec"]["rules"][0]["matches"]
    assert sorted(m["path"]["value"] for m in rule0) == sorted(p + s for p in paths for s in ("", "/"))
    assert all(m["path"]["type"] == "Exact" for m in rule0)
    routes = eg_equivalent_routes()
    pinned = [r for r in routes if SS_NAME in r["typed_per_filter_config"]]
    assert sorted(r["match"]["path"] for r in pinned) == sorted(m["path"]["value"] for m in rule0)
    assert len(routes) == len(pinned) + 1


def check_config(*paths: Path) -> subprocess.CompletedProcess:
    if not CLI.exists():
        pytest.fail(f"{CLI} missing: `make build`")
    return subprocess.run([str(CLI), "check-config", *map(str, paths)], capture_output=True, text=True, timeout=30)


def test_check_config_accepts_it_and_catches_a_loose_session(tmp_path):
    r = check_config(EG)
    assert r.returncode == 0 and "warning" not in r.stdout + r.stderr, r.stdout + r.stderr
    loose = tmp_path / "loose.yaml"
    loose.write_text(EG.read_text().replace("strict: true", "strict: false"))
    r = check_config(loose)
    assert r.returncode == 1, r.stdout
    for i in (8, 10):
        assert f"EnvoyPatchPolicy/mcp-resume-guard.spec.jsonPatches[{i}].operation.value.stateful_session.strict" \
            in r.stdout, r.stdout
    no_timeout = tmp_path / "timeout.yaml"
    no_timeout.write_text(EG.read_text().replace("request: 0s", "request: 15s"))
    r = check_config(no_timeout)
    assert r.returncode == 1 and "HTTPRoute/mcp-server.spec.rules[0].timeouts.request" in r.stdout, r.stdout


# ---- the Envoy that Envoy Gateway would run ----------------------------------------------------

def pointer(doc, path: str):
    """Parent container and last key of an RFC 6901 pointer."""
    parts = [p.replace("~1", "/").replace("~0", "~") for p in path.lstrip("/").split("/")]
    cur = doc
    for p in parts[:-1]:
        cur = cur[int(p)] if isinstance(cur, list) else cur[p]
    return cur, parts[-1]


def apply_patch(doc: dict, op: dict) -> None:
    """The two RFC 6902 operations the policy uses."""
    parent, key = pointer(doc, op["path"])
    if op["op"] == "test":
        got = parent[int(key)] if isinstance(parent, list) else parent[key]
        assert got == op["value"], f"test {op['path']}: {got!r} != {op['value']!r}"
    elif op["op"] == "add":
        if isinstance(parent, list):
            parent.insert(len(parent) if key == "-" else int(key), copy.deepcopy(op["value"]))
        else:
            parent[key] = copy.deepcopy(op["value"])
    else:
        raise AssertionError(f"unexpected op {op['op']}")


def eg_routes(o: dict) -> list[dict]:
    """The routes Envoy Gateway generates for the HTTPRoute: one per rule and match, named
    httproute/<ns>/<name>/rule/<i>/match/<j>/<host with dots as _>, exact paths first, then by
    path length, longest first; the guard (disabled in http_filters) enabled on each."""
    route = o["HTTPRoute"]
    ns, name = route["metadata"]["namespace"], route["metadata"]["name"]
    (host,) = route["spec"]["hostnames"]
    out = []
    for i, rule in enumerate(route["spec"]["rules"]):
        mods = {f["type"]: f for f in rule.get("filters", [])}
        for j, m in enumerate(rule["matches"]):
            kind, value = m["path"]["type"], m["path"]["value"]
            out.append({
                "name": f"httproute/{ns}/{name}/rule/{i}/match/{j}/{host.replace('.', '_')}",
                "match": {"path": value} if kind == "Exact" else {"prefix": value},
                "route": {"cluster": "mcp_replicas", "timeout": rule["timeouts"]["request"]},
                "request_headers_to_remove":
                    mods["RequestHeaderModifier"]["requestHeaderModifier"]["remove"],
                "response_headers_to_remove":
                    mods["ResponseHeaderModifier"]["responseHeaderModifier"]["remove"],
                "typed_per_filter_config": {EG_WASM_NAME: {"@type": FILTER_CONFIG_TYPE, "config": {}}},
            })
        if rule.get("name") and rule["name"] == rate_limited_rule(o):
            for r in out[-len(rule["matches"]):]:
                r["typed_per_filter_config"][RL_NAME] = eg_local_rate_limit(o)
    out.sort(key=lambda r: ("path" in r["match"], len(next(iter(r["match"].values())))), reverse=True)
    return out


def rate_limited_rule(o: dict) -> str:
    (ref,) = o["BackendTrafficPolicy"]["spec"]["targetRefs"]
    assert ref["name"] == o["HTTPRoute"]["metadata"]["name"]
    return ref["sectionName"]


def eg_local_rate_limit(o: dict) -> dict:
    """The per-route local rate limit Envoy Gateway generates for the policy's rules
    (internal/xds/translator/local_ratelimit.go): per rule, a header_value_match action per header
    selector (expect_match false when inverted), for a sourceCIDR a masked_remote_address action
    (value: the CIDR) and, when Distinct, a remote_address one whose entry has no value (a
    dynamic descriptor: a bucket per client address); one descriptor per rule with its bucket;
    and a default bucket no request draws from."""
    rate_limits, descriptors = [], []
    for i, rule in enumerate(o["BackendTrafficPolicy"]["spec"]["rateLimit"]["local"]["rules"]):
        (sel,) = rule["clientSelectors"]
        actions, entries = [], []
        for j, hm in enumerate(sel["headers"]):
            assert hm["type"] == "RegularExpression"
            key = f"rule-{i}-match-{j}"
            actions.append({"header_value_match": {
                "descriptor_key": key, "descriptor_value": key, "expect_match": not hm.get("invert", False),
                "headers": [{"name": hm["name"], "string_match": {"safe_regex": {"regex": hm["value"]}}}]}})
            entries.append({"key": key, "value": key})
        if "sourceCIDR" in sel:
            cidr = sel["sourceCIDR"]["value"]
            family = "v6" if ":" in cidr else "v4"
            actions.append({"masked_remote_address": {f"{family}_prefix_mask_len": int(cidr.split("/")[1])}})
            entries.append({"key": "masked_remote_address", "value": cidr})
            if sel["sourceCIDR"].get("type") == "Distinct":
                actions.append({"remote_address": {}})
                entries.append({"key": "remote_address"})
        n, unit = rule["limit"]["requests"], {"Second": "1s", "Minute": "60s"}[rule["limit"]["unit"]]
        rate_limits.append({"actions": actions})
        descriptors.append({"entries": entries,
                            "token_bucket": {"max_tokens": n, "tokens_per_fill": n, "fill_interval": unit}})
    return {
        "@type": RL_TYPE, "stat_prefix": "http_local_rate_limiter",
        "token_bucket": {"max_tokens": 4294967295, "tokens_per_fill": 4294967295, "fill_interval": "1s"},
        "filter_enabled": FULL, "filter_enforced": FULL,
        "descriptors": descriptors,
        "always_consume_default_token_bucket": False,
        "rate_limits": rate_limits,
    }


def eg_equivalent() -> dict:
    """envoy/envoy.yaml reshaped as Envoy Gateway generates this Gateway (the HCM in the
    default filter chain with Envoy's own path defaults, the wasm filter disabled there and
    enabled per route, then the router; the routes of the HTTPRoute), then patched by the
    EnvoyPatchPolicy: everything the hardening needs comes from the patches."""
    o = objects()
    cfg = envoy_config(guard=True)
    listener = cfg["static_resources"]["listeners"][0]
    hcm = listener.pop("filter_chains")[0]
    listener["default_filter_chain"] = hcm
    tc = hcm["filters"][0]["typed_config"]
    for key in ("normalize_path", "merge_slashes", "path_with_escaped_slashes_action", "delayed_close_timeout"):
        tc.pop(key)
    guard = next(f for f in tc["http_filters"] if f["typed_config"]["@type"] == WASM_TYPE)
    router = next(f for f in tc["http_filters"] if f["name"] == "envoy.filters.http.router")
    w = o["EnvoyExtensionPolicy"]["spec"]["wasm"][0]
    guard["name"] = EG_WASM_NAME
    guard["disabled"] = True
    guard["typed_config"]["config"]["configuration"]["value"] = json.dumps(w["config"])
    guard["typed_config"]["config"]["root_id"] = w["rootID"]
    # env.hostKeys becomes the VM's host_env_keys.
    guard["typed_config"]["config"]["vm_config"]["environment_variables"] = {"host_env_keys": w["env"]["hostKeys"]}
    # Envoy Gateway orders its filters: Wasm, then local_ratelimit (empty: configured per route),
    # then the router.
    rl = {"name": RL_NAME, "typed_config": {"@type": RL_TYPE, "stat_prefix": "http_local_rate_limiter",
                                            "max_dynamic_descriptors": 10000}}
    tc["http_filters"] = [guard, rl, router]
    gw = o["Gateway"]
    rc_name = f"{gw['metadata']['namespace']}/{gw['metadata']['name']}/{gw['spec']['listeners'][0]['name']}"
    tc["route_config"] = {"name": rc_name, "virtual_hosts": [{
        "name": f"{rc_name}/{o['HTTPRoute']['spec']['hostnames'][0].replace('.', '_')}",
        "domains": ["*"], "routes": eg_routes(o)}]}
    cfg["static_resources"]["clusters"] = [c for c in cfg["static_resources"]["clusters"]
                                           if c["name"] != "mcp_ownership"]
    for p in o["EnvoyPatchPolicy"]["spec"]["jsonPatches"]:
        op = p["operation"]
        if p["type"].endswith("Cluster"):
            assert op["op"] == "add" and op["path"] == ""
            cfg["static_resources"]["clusters"].append(copy.deepcopy(op["value"]))
        elif p["type"].endswith("RouteConfiguration"):
            assert p["name"] == rc_name
            apply_patch(tc["route_config"], op)
        else:
            assert p["name"] == rc_name
            apply_patch(listener, op)
    cfg.pop("stats_config", None)
    cfg.update(yaml.safe_load(o["EnvoyProxy"]["spec"]["bootstrap"]["value"]))
    return cfg


def eg_equivalent_routes() -> list[dict]:
    tc = eg_equivalent()["static_resources"]["listeners"][0]["default_filter_chain"]["filters"][0]["typed_config"]
    return tc["route_config"]["virtual_hosts"][0]["routes"]


@pytest.mark.envoy
def test_envoy_gateway_equivalent_validates_and_passes_check_config(tmp_path):
    cfg = eg_equivalent()
    tc = cfg["static_resources"]["listeners"][0]["default_filter_chain"]["filters"][0]["typed_config"]
    assert [f["name"] for f in tc["http_filters"]] == [
        "mcp_resume_guard.owner_header_mutation", EG_WASM_NAME, RL_NAME, SS_NAME, "envoy.filters.http.router"]
    assert "session_state" not in tc["http_filters"][3]["typed_config"], "the pin is per route"
    # The rate limit acts on the two MCP routes (rule 0) only.
    limited = [r["match"] for r in tc["route_config"]["virtual_hosts"][0]["routes"]
               if RL_NAME in r["typed_per_filter_config"]]
    assert sorted(m.get("path", "") for m in limited) == ["/mcp", "/mcp/"]
    assert (tc["normalize_path"], tc["merge_slashes"], tc["path_with_escaped_slashes_action"]) == \
        (True, True, "REJECT_REQUEST")
    # A broken stream's client sees the close after 0.1 s, not Envoy's default 1 s.
    assert tc["delayed_close_timeout"] == "0.1s"
    path = tmp_path / "eg-equivalent.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    # The guard's variables, as the EnvoyProxy's container env sets them from the Secret.
    env = {**os.environ, "MCP_GUARD_KEY_1": TEST_KEY, "MCP_GUARD_OWNERSHIP_TOKEN": "dG9rZW4"}
    r = subprocess.run([str(ENVOY_BIN), "--mode", "validate", "-c", str(path), "--log-level", "warn"],
                       capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    r = check_config(path)
    assert r.returncode == 0 and "warning" not in r.stdout + r.stderr, r.stdout + r.stderr


def test_route_patches_refuse_a_reordered_route_table():
    """If Envoy Gateway ordered or named the routes otherwise, the policy's `test` operations
    refuse instead of pinning the wrong route."""
    o = objects()
    routes = eg_routes(o)
    rc = {"virtual_hosts": [{"routes": [routes[1], routes[0], routes[2]]}]}
    tests = [p["operation"] for p in o["EnvoyPatchPolicy"]["spec"]["jsonPatches"]
             if p["type"].endswith("RouteConfiguration") and p["operation"]["op"] == "test"]
    assert len(tests) == 2
    for op in tests:
        with pytest.raises(AssertionError):
            apply_patch(rc, op)


@pytest.mark.parametrize("chain", [
    ["envoy.filters.http.wasm/x/0", RL_NAME, "envoy.filters.http.ext_authz/y", "envoy.filters.http.router"],
    # Without the BackendTrafficPolicy's rate limit.
    ["envoy.filters.http.wasm/x/0", "envoy.filters.http.router"],
])
def test_patch_test_guards_the_insert_position(chain):
    """With another filter before the router, or the rate limit missing, the policy's `test`
    refuses instead of misplacing."""
    o = objects()
    listener = {"default_filter_chain": {"filters": [{"typed_config": {"http_filters": [
        {"name": n} for n in chain]}}]}}
    test_op = next(p["operation"] for p in o["EnvoyPatchPolicy"]["spec"]["jsonPatches"]
                   if p["operation"]["op"] == "test")
    with pytest.raises((AssertionError, IndexError)):
        apply_patch(listener, test_op)


@pytest.mark.envoy
def test_istio_stats_bootstrap_is_the_envoy_stats_config(tmp_path):
    cm = yaml.safe_load(ISTIO_STATS.read_text())
    assert cm["kind"] == "ConfigMap" and cm["metadata"]["namespace"] == "istio-system"
    boot = json.loads(cm["data"]["custom_bootstrap.json"])
    local = yaml.safe_load((ROOT / "envoy" / "envoy.yaml").read_text())
    assert boot == {"stats_config": local["stats_config"]}
    # Merged into a bootstrap, Envoy accepts it.
    cfg = envoy_config(guard=True)
    cfg.pop("stats_config")
    cfg.update(boot)
    path = tmp_path / "istio-stats.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    r = subprocess.run([str(ENVOY_BIN), "--mode", "validate", "-c", str(path), "--log-level", "warn"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
