"""Checks the deployment artefacts (deploy/, Dockerfile.*, .dockerignore) as far as this machine
allows: no container engine, no cluster, no network.

What is proven here:
- every YAML parses; every Kubernetes/Istio object has apiVersion, kind, metadata.name;
- the WasmPlugin's pluginConfig and the compose Envoy's plugin config satisfy
  schema/config.schema.json, and the names that must agree across files agree;
- `envoy --mode validate` (Envoy 1.40, the pinned wheel) accepts the compose Envoy config and
  an "Istio-equivalent" config: envoy/envoy.yaml with the WasmPlugin's pluginConfig as the
  filter's configuration and the EnvoyFilter's inline stateful_session in place of the local
  one. Validate mode loads the real .wasm and runs its on_configure (a control test shows that
  a bad plugin config fails validation), so this proves the proto fields and that the filter
  accepts the config;
- the Dockerfiles' shape (pinned bases, FROM scratch + /plugin.wasm, non-root runtime);
- compose: named services, host ports on 127.0.0.1, DESIGN's local ports;
- the preStop hook's shell script, run against a real mcp-ownership, is accepted (200).

What is not: building the images, Istio applying the CRDs and the real filter order in a
gateway, Kubernetes admission. See deploy/README.md.

No fixture from conftest.py is used: nothing is started except `envoy --mode validate`, the
wasm build if the .wasm is missing, and one short-lived mcp-ownership for the preStop test.
"""
from __future__ import annotations

import copy
import json
import os
import re
import shutil
import socket
import subprocess
import urllib.request
from pathlib import Path

import jsonschema
import pytest
import yaml

from stack.envoy import ENVOY_BIN, WASM, wait_live
from stack.procs import ROOT, Proc, wait_port
from stack.services import start_ownership

DEPLOY = ROOT / "deploy"
SCHEMA = json.loads((ROOT / "schema" / "config.schema.json").read_text())
LOCAL_ENVOY = ROOT / "envoy" / "envoy.yaml"
PRODUCTION_ENVOY = ROOT / "envoy" / "envoy-production.yaml"
COMPOSE_ENVOY = DEPLOY / "compose" / "envoy.yaml"
COMPOSE = DEPLOY / "compose" / "docker-compose.yaml"
WASM_IN_CONTAINER = "/etc/envoy/mcp_resume_guard.wasm"

WASM_TYPE = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm"
STATEFUL_TYPE = "type.googleapis.com/envoy.extensions.filters.http.stateful_session.v3.StatefulSession"
HEADER_STATE_TYPE = "type.googleapis.com/envoy.extensions.http.stateful_session.header.v3.HeaderBasedSessionState"
ROUTER_TYPE = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
MUTATION_TYPE = "type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation"
PER_ROUTE_TYPE = "type.googleapis.com/envoy.extensions.filters.http.stateful_session.v3.StatefulSessionPerRoute"
PIN_FILTER = "mcp_resume_guard.stateful_session"
RATELIMIT_TYPE = "type.googleapis.com/envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit"
RATELIMIT_FILTER = "mcp_resume_guard.initialize_ratelimit"

ISTIO_OWNERSHIP_CLUSTER = "outbound|9200||mcp-ownership.mcp-system.svc.cluster.local"
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"}


# ---- helpers -------------------------------------------------------------------------------
def yaml_files() -> list[Path]:
    return sorted(p for p in DEPLOY.rglob("*") if p.suffix in (".yaml", ".yml"))


def docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def k8s_objects() -> list[tuple[Path, dict]]:
    out = []
    for sub in ("k8s", "istio"):
        for p in sorted((DEPLOY / sub).glob("*.yaml")):
            out.extend((p, d) for d in docs(p))
    return out


def one(kind: str) -> dict:
    found = [d for _, d in k8s_objects() if d.get("kind") == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def named(kind: str, name: str) -> dict:
    (found,) = [d for _, d in k8s_objects() if d.get("kind") == kind and d["metadata"]["name"] == name]
    return found


def hcm(cfg: dict) -> dict:
    return cfg["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]


def filters(cfg: dict) -> list[dict]:
    return hcm(cfg)["http_filters"]


def filter_index(cfg: dict, type_url: str) -> int:
    idx = [i for i, f in enumerate(filters(cfg)) if f["typed_config"]["@type"] == type_url]
    assert len(idx) == 1, f"expected one {type_url} filter, found {len(idx)}"
    return idx[0]


def guard(cfg: dict) -> dict:
    return filters(cfg)[filter_index(cfg, WASM_TYPE)]["typed_config"]["config"]


def plugin_json(cfg: dict) -> dict:
    return json.loads(guard(cfg)["configuration"]["value"])


def ensure_wasm() -> Path:
    if not WASM.exists():
        # `make wasm` without its rustup bookkeeping; CI builds it before e2e anyway.
        subprocess.run(
            ["cargo", "build", "--release", "--target", "wasm32-wasip1", "-p", "mcp-resume-guard"],
            cwd=ROOT, check=True, timeout=900,
        )
    assert WASM.exists(), f"{WASM} missing after the build"
    return WASM


# What the platform puts in the proxy's environment from the Secret (deploy/README.md): a
# random key (the guard refuses placeholders and text) and a token.
GUARD_ENV = {"MCP_GUARD_KEY_1": "ja4ge+hsvYqGv+f0Zcw23So/A0PrUrPK5aYHrBCNJ2U=",
             "MCP_GUARD_OWNERSHIP_TOKEN": "dG9rZW4tZm9yLXZhbGlkYXRpb24"}


def envoy_validate(cfg: dict, tmp_path: Path, name: str,
                   env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`envoy --mode validate`, with the guard's variables set as the Secret sets them."""
    assert ENVOY_BIN.exists(), f"{ENVOY_BIN} missing: run `make venv`"
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    base = {k: v for k, v in os.environ.items() if k not in GUARD_ENV}
    return subprocess.run(
        [str(ENVOY_BIN), "--mode", "validate", "-c", str(path), "--log-level", "warn"],
        capture_output=True, text=True, timeout=60, env={**base, **(GUARD_ENV if env is None else env)},
    )


def assert_valid(res: subprocess.CompletedProcess) -> None:
    assert res.returncode == 0, f"envoy --mode validate failed:\n{res.stdout}\n{res.stderr}"
    assert " OK" in res.stdout + res.stderr


def local_config_with_wasm(path: Path = LOCAL_ENVOY) -> dict:
    cfg = yaml.safe_load(path.read_text())
    guard(cfg)["vm_config"]["code"]["local"]["filename"] = str(ensure_wasm())
    return cfg


def patches(apply_to: str) -> list[dict]:
    return [p for p in one("EnvoyFilter")["spec"]["configPatches"] if p["applyTo"] == apply_to]


def pin_patch() -> dict:
    """The EnvoyFilter's HTTP_FILTER patch that inserts stateful_session before the router."""
    (p,) = [p for p in patches("HTTP_FILTER") if p["patch"]["value"]["typed_config"]["@type"] == STATEFUL_TYPE]
    return p


def route_pin(route: dict) -> dict | None:
    """The strict stateful_session a route configures for the pin filter, if any."""
    per = (route.get("typed_per_filter_config") or {}).get(PIN_FILTER)
    if per is None:
        return None
    assert per["@type"] == PER_ROUTE_TYPE
    return per["stateful_session"]


def routes(cfg: dict) -> list[dict]:
    return [r for vh in hcm(cfg)["route_config"]["virtual_hosts"] for r in vh["routes"]]


def route_patches() -> dict[str, dict]:
    """The EnvoyFilter's HTTP_ROUTE patches by the VirtualService route name they patch."""
    return {p["match"]["routeConfiguration"]["vhost"]["route"]["name"]: p for p in patches("HTTP_ROUTE")}


def istio_equivalent_config() -> dict:
    """envoy/envoy-production.yaml (envoy.yaml plus the session-opening routes) turned into what
    the Istio files ask a gateway's Envoy to run."""
    cfg = local_config_with_wasm(PRODUCTION_ENVOY)
    # Istio names a route after its VirtualService http route.
    for r in routes(cfg):
        if r.get("name") == "mcp_initialize":
            r["name"] = "mcp-initialize"
    wp = one("WasmPlugin")["spec"]
    g = guard(cfg)
    # Istio hands pluginConfig (a Struct) to the filter as JSON, with pluginName as root_id.
    g["configuration"]["value"] = json.dumps(wp["pluginConfig"])
    g["root_id"] = wp["pluginName"]
    # vmConfig.env entries with valueFrom HOST become host_env_keys (INLINE ones key_values).
    env = wp.get("vmConfig", {}).get("env", [])
    g["vm_config"]["environment_variables"] = {
        "host_env_keys": [e["name"] for e in env if e.get("valueFrom") == "HOST"]}
    # Istio sets the VM failure policy from failStrategy.
    strategy = wp.get("failStrategy", "FAIL_CLOSE")
    g["failure_policy"] = {"FAIL_RELOAD": "FAIL_RELOAD", "FAIL_OPEN": "FAIL_OPEN"}.get(strategy, "FAIL_CLOSED")
    if g["failure_policy"] != "FAIL_RELOAD":
        g.pop("reload_config", None)
    # The EnvoyFilter's filters replace the local ones (same places: before the router, first).
    filters(cfg)[filter_index(cfg, STATEFUL_TYPE)] = copy.deepcopy(pin_patch()["patch"]["value"])
    (first,) = [p for p in patches("HTTP_FILTER") if p["patch"]["operation"] == "INSERT_FIRST"]
    filters(cfg)[filter_index(cfg, MUTATION_TYPE)] = copy.deepcopy(first["patch"]["value"])
    (rl,) = [p for p in patches("HTTP_FILTER") if p["patch"]["value"]["typed_config"]["@type"] == RATELIMIT_TYPE]
    filters(cfg)[filter_index(cfg, RATELIMIT_TYPE)] = copy.deepcopy(rl["patch"]["value"])
    # The route patches, on the routes of their names, in place of the local per-route config.
    rps = route_patches()
    for r in routes(cfg):
        r.pop("typed_per_filter_config", None)
        if r.get("name") in rps:
            r.update(copy.deepcopy(rps[r["name"]]["patch"]["value"]))
    # The listener patch on the HttpConnectionManager.
    (np,) = patches("NETWORK_FILTER")
    hcm(cfg).update({k: v for k, v in np["patch"]["value"]["typed_config"].items() if k != "@type"})
    # The ownership cluster under Istio's outbound name.
    for c in cfg["static_resources"]["clusters"]:
        if c["name"] == "mcp_ownership":
            c["name"] = c["load_assignment"]["cluster_name"] = wp["pluginConfig"]["ownership"]["cluster"]
    return cfg


def from_lines(dockerfile: Path) -> list[str]:
    return [ln.split(None, 1)[1].strip() for ln in dockerfile.read_text().splitlines()
            if ln.strip().upper().startswith("FROM ")]


def image_ref(from_arg: str) -> str:
    return from_arg.split()[0]


def pinned(image: str) -> bool:
    if "@sha256:" in image:
        return True
    name, _, tag = image.rpartition(":")
    return bool(name) and "/" not in tag and bool(tag) and "latest" not in tag


# ---- YAML and object shape -----------------------------------------------------------------
def test_deploy_tree_has_the_artifacts():
    for rel in ["README.md", "istio/wasmplugin.yaml", "istio/envoyfilter-stateful-session.yaml",
                "istio/virtualservice.yaml", "k8s/ownership.yaml", "k8s/redis.yaml",
                "k8s/mcp-server-prestop.yaml", "compose/docker-compose.yaml", "compose/envoy.yaml"]:
        assert (DEPLOY / rel).is_file(), rel
    for rel in ["Dockerfile.wasm", "Dockerfile.ownership", ".dockerignore"]:
        assert (ROOT / rel).is_file(), rel


@pytest.mark.parametrize("path", yaml_files(), ids=lambda p: str(p.relative_to(DEPLOY)))
def test_yaml_parses(path):
    assert docs(path), f"{path} has no YAML document"


@pytest.mark.parametrize("path,obj", k8s_objects(),
                         ids=lambda x: str(x.relative_to(DEPLOY)) if isinstance(x, Path) else x.get("kind", "?"))
def test_k8s_object_identity(path, obj):
    assert isinstance(obj.get("apiVersion"), str) and "/" in obj["apiVersion"] or obj.get("apiVersion") == "v1"
    assert isinstance(obj.get("kind"), str) and obj["kind"]
    meta = obj.get("metadata") or {}
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", meta.get("name", "")), meta
    if obj["kind"] not in CLUSTER_SCOPED:
        assert meta.get("namespace"), f"{obj['kind']}/{meta['name']} in {path.name} has no namespace"


# ---- Istio ---------------------------------------------------------------------------------
def test_wasmplugin_shape_and_schema():
    wp = one("WasmPlugin")
    assert wp["apiVersion"] == "extensions.istio.io/v1alpha1"
    spec = wp["spec"]
    assert spec["url"].startswith("oci://")
    assert ("selector" in spec) != ("targetRefs" in spec), "exactly one of selector / targetRefs"
    assert spec["phase"] in ("AUTHN", "AUTHZ", "STATS", "UNSPECIFIED_PHASE")
    assert spec.get("failStrategy", "FAIL_CLOSE") in ("FAIL_CLOSE", "FAIL_RELOAD"), "the guard must fail closed"
    assert spec.get("type", "HTTP") == "HTTP"
    for m in spec.get("match", []):
        assert m.get("mode", "CLIENT_AND_SERVER") in ("CLIENT", "CLIENT_AND_SERVER"), "gateway modes"
    cfg = spec["pluginConfig"]
    jsonschema.validate(cfg, SCHEMA)
    assert cfg["ownership"]["cluster"] == ISTIO_OWNERSHIP_CLUSTER
    # Same fields as the local config (values may differ).
    assert set(cfg) == set(plugin_json(yaml.safe_load(LOCAL_ENVOY.read_text())))
    # The callout must outlast the ownership service's default --record-wait-ms (150).
    assert cfg["ownership"].get("timeout_ms", 250) > 150


def test_istio_names_agree():
    wp, ef = one("WasmPlugin"), one("EnvoyFilter")
    assert wp["metadata"]["namespace"] == ef["metadata"]["namespace"]
    assert wp["spec"]["selector"]["matchLabels"] == ef["spec"]["workloadSelector"]["labels"]
    # outbound|PORT||NAME.NAMESPACE.svc.cluster.local must name the ownership Service.
    _, port, _, fqdn = wp["spec"]["pluginConfig"]["ownership"]["cluster"].split("|")
    svc_name, svc_ns = fqdn.split(".")[:2]
    svcs = [d for _, d in k8s_objects() if d["kind"] == "Service" and d["metadata"]["name"] == svc_name]
    assert len(svcs) == 1 and svcs[0]["metadata"]["namespace"] == svc_ns
    assert int(port) in [p["port"] for p in svcs[0]["spec"]["ports"]]
    owner_header = wp["spec"]["pluginConfig"].get("owner_header", "x-mcp-owner")
    rps = route_patches()
    assert set(rps) == {"mcp", "mcp-initialize"}
    for rp in rps.values():
        state = rp["patch"]["value"]["typed_per_filter_config"][PIN_FILTER]["stateful_session"]["session_state"]
        assert state["typed_config"]["name"] == owner_header
    (mp,) = [p for p in patches("HTTP_FILTER") if p["patch"]["operation"] == "INSERT_FIRST"]
    assert mp["patch"]["value"]["typed_config"]["mutations"]["response_mutations"] == [{"remove": owner_header}]
    vs = one("VirtualService")
    for route in vs["spec"]["http"]:
        assert owner_header in route["headers"]["request"]["remove"]
        assert owner_header in route["headers"]["response"]["remove"]
    # The patched routes are the MCP endpoint: exactly mcp_paths, with and without a trailing slash.
    for name in rps:
        (mcp,) = [r for r in vs["spec"]["http"] if r["name"] == name]
        exact = sorted(m["uri"]["exact"] for m in mcp["match"])
        assert exact == sorted(p + s for p in wp["spec"]["pluginConfig"]["mcp_paths"] for s in ("", "/"))


def test_envoyfilter_inserts_strict_header_session_before_router():
    ef = one("EnvoyFilter")
    assert ef["apiVersion"] == "networking.istio.io/v1alpha3"
    assert {p["match"]["context"] for p in ef["spec"]["configPatches"]} == {"GATEWAY"}
    p = pin_patch()
    f = p["match"]["listener"]["filterChain"]["filter"]
    assert f["name"] == "envoy.filters.network.http_connection_manager"
    assert f["subFilter"]["name"] == "envoy.filters.http.router"
    assert p["patch"]["operation"] == "INSERT_BEFORE"
    assert p["patch"]["value"]["name"] == PIN_FILTER
    # No session state at the listener: the pin exists only on the route that configures it.
    assert set(p["patch"]["value"]["typed_config"]) == {"@type"}
    for rp in patches("HTTP_ROUTE"):
        assert rp["patch"]["operation"] == "MERGE"
        tc = rp["patch"]["value"]["typed_per_filter_config"][PIN_FILTER]
        assert tc["@type"] == PER_ROUTE_TYPE
        assert tc["stateful_session"]["strict"] is True
        assert tc["stateful_session"]["session_state"]["name"] == "envoy.http.stateful_session.header"
        assert tc["stateful_session"]["session_state"]["typed_config"]["@type"] == HEADER_STATE_TYPE
    (np,) = patches("NETWORK_FILTER")
    assert np["patch"]["operation"] == "MERGE"
    hc = np["patch"]["value"]["typed_config"]
    assert hc["normalize_path"] is True and hc["merge_slashes"] is True
    assert hc["path_with_escaped_slashes_action"] == "REJECT_REQUEST"


def test_virtualservice_no_retries_sse_timeout():
    vs = one("VirtualService")
    for route in vs["spec"]["http"]:
        assert route["retries"] == {"attempts": 0}, "a retry leaves the owner even in strict mode"
        assert route["timeout"] in ("0s", 0), "SSE responses must have no overall deadline"
    dr = one("DestinationRule")
    assert "consistentHash" not in json.dumps(dr["spec"])
    dests = {d["destination"]["host"] for r in vs["spec"]["http"] for d in r["route"]}
    assert dr["spec"]["host"] in dests


@pytest.mark.envoy
def test_istio_equivalent_envoy_config_validates(tmp_path):
    cfg = istio_equivalent_config()
    names = [f["typed_config"]["@type"] for f in filters(cfg)]
    # guard -> stateful_session -> router, the order the WasmPlugin/EnvoyFilter pair produces.
    assert names.index(WASM_TYPE) < names.index(STATEFUL_TYPE) == names.index(ROUTER_TYPE) - 1
    # The EnvoyFilter inserts the rate limit before the router first, then stateful_session.
    ef = one("EnvoyFilter")["spec"]["configPatches"]
    types = [p["patch"]["value"].get("typed_config", {}).get("@type") for p in ef]
    assert types.index(RATELIMIT_TYPE) < types.index(STATEFUL_TYPE)
    assert_valid(envoy_validate(cfg, tmp_path, "istio-equivalent"))


SHIPPED_ENVOY = sorted((ROOT / "envoy").glob("*.yaml")) + [COMPOSE_ENVOY]


@pytest.mark.parametrize("path", [p for p in SHIPPED_ENVOY if p.name != "envoy-native.yaml"],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_envoy_configs_pin_only_on_the_mcp_routes(path):
    """The shipped configs: normalized paths, escaped slashes refused, h2c, the owner pin on
    exactly the MCP routes, the owner header removed on every route and by the first filter,
    and a guard that fails closed and reloads."""
    cfg = yaml.safe_load(path.read_text())
    h = hcm(cfg)
    assert h["codec_type"] == "AUTO"
    assert h["normalize_path"] is True and h["merge_slashes"] is True
    assert h["path_with_escaped_slashes_action"] == "REJECT_REQUEST"
    rc = h["route_config"]
    assert "x-mcp-owner" in rc["request_headers_to_remove"] and "x-mcp-owner" in rc["response_headers_to_remove"]
    first = filters(cfg)[0]
    assert first["typed_config"]["@type"] == MUTATION_TYPE
    assert first["typed_config"]["mutations"]["response_mutations"] == [{"remove": "x-mcp-owner"}]
    (pin,) = [f for f in filters(cfg) if f["name"] == PIN_FILTER]
    assert set(pin["typed_config"]) == {"@type"}, "the listener-level pin filter must have no session state"
    mcp_paths = plugin_json(cfg)["mcp_paths"]
    want = sorted(p + s for p in mcp_paths for s in ("", "/"))
    # One plain MCP route per path; session-opening routes (header matches) on the same paths.
    pinned = sorted(r["match"]["path"] for r in routes(cfg) if route_pin(r) is not None
                    and not r["match"].get("headers"))
    assert pinned == want
    assert sorted({r["match"]["path"] for r in routes(cfg) if route_pin(r) is not None}) == want
    for r in routes(cfg):
        ss = route_pin(r)
        assert ss is None or (ss["strict"] is True and ss["session_state"]["typed_config"]["name"] == "x-mcp-owner")
        assert "retry_policy" not in r["route"]
    g = guard(cfg)
    assert g["failure_policy"] == "FAIL_RELOAD" and "fail_open" not in g


@pytest.mark.envoy
def test_validate_really_loads_the_plugin(tmp_path):
    """Control: a config the filter refuses makes validation fail, so the passes above mean it."""
    cfg = istio_equivalent_config()
    bad = json.loads(guard(cfg)["configuration"]["value"])
    bad["keys"][0]["active"] = False  # no active key
    guard(cfg)["configuration"]["value"] = json.dumps(bad)
    res = envoy_validate(cfg, tmp_path, "bad-plugin-config")
    assert res.returncode != 0
    assert "invalid config" in res.stdout + res.stderr


# ---- compose -------------------------------------------------------------------------------
def test_compose_plugin_config_matches_schema():
    jsonschema.validate(plugin_json(yaml.safe_load(COMPOSE_ENVOY.read_text())), SCHEMA)


def test_compose_envoy_is_the_production_config_adapted():
    local, comp = yaml.safe_load(PRODUCTION_ENVOY.read_text()), yaml.safe_load(COMPOSE_ENVOY.read_text())
    # The one difference: compose runs the ownership service with a token, so the guard sends it.
    want = plugin_json(local)
    want["ownership"]["token_env"] = "MCP_GUARD_OWNERSHIP_TOKEN"
    assert want == plugin_json(comp)
    assert guard(comp)["vm_config"]["code"]["local"]["filename"] == WASM_IN_CONTAINER
    strip = lambda c: [f for f in filters(c) if f["typed_config"]["@type"] != WASM_TYPE]  # noqa: E731
    assert strip(local) == strip(comp), "the filters must match envoy/envoy-production.yaml"
    assert hcm(local)["route_config"] == hcm(comp)["route_config"]
    assert comp["static_resources"]["listeners"][0]["address"]["socket_address"]["address"] == "0.0.0.0"
    clusters = {c["name"]: c for c in comp["static_resources"]["clusters"]}
    assert set(clusters) == {c["name"] for c in local["static_resources"]["clusters"]}
    for c in clusters.values():
        assert c["type"] == "STRICT_DNS"
    services = set(yaml.safe_load(COMPOSE.read_text())["services"])
    for c in clusters.values():
        for ep in c["load_assignment"]["endpoints"][0]["lb_endpoints"]:
            assert ep["endpoint"]["address"]["socket_address"]["address"] in services


@pytest.mark.envoy
def test_compose_envoy_validates(tmp_path):
    cfg = yaml.safe_load(COMPOSE_ENVOY.read_text())
    # The bind-mounted path exists only in the container: point it at the built file.
    guard(cfg)["vm_config"]["code"]["local"]["filename"] = str(ensure_wasm())
    # The STRICT_DNS hostnames (compose service names) stay as they are: validate mode does not
    # resolve them (checked with Envoy 1.40), so the real file is what gets validated. Were a
    # later Envoy to resolve them here, they would have to be rewritten to 127.0.0.1 first.
    assert_valid(envoy_validate(cfg, tmp_path, "compose"))


def test_compose_services_and_ports():
    comp = yaml.safe_load(COMPOSE.read_text())
    services = comp["services"]
    assert {"envoy", "mcp-ownership", "mcp-replica-1", "mcp-replica-2", "mcp-replica-3"} <= set(services)
    published = {}
    for name, svc in services.items():
        assert re.fullmatch(r"[a-z0-9][a-z0-9_-]*", name)
        for p in svc.get("ports", []):
            assert isinstance(p, str) and p.startswith("127.0.0.1:"), f"{name}: {p} must bind 127.0.0.1"
            published[int(p.split(":")[1])] = name
        image = svc.get("image", "")
        if image and "${" not in image.split(":-")[0]:
            assert pinned(image), f"{name}: image {image} must be pinned"
    # The local topology (README).
    assert published[10000] == published[9901] == "envoy"
    assert [published[p] for p in (9101, 9102, 9103)] == ["mcp-replica-1", "mcp-replica-2", "mcp-replica-3"]
    assert published[9200] == "mcp-ownership"
    assert published[6390] == "redis"
    envoy_img = re.sub(r"^\$\{[A-Z_]+:-(.*)\}$", r"\1", services["envoy"]["image"])
    assert envoy_img.startswith("envoyproxy/envoy:v1.40") and pinned(envoy_img)
    assert "${MCP_SERVER_IMAGE" in services["mcp-replica-1"]["image"]
    # The envoy.yaml and .wasm it mounts are the ones checked above.
    mounts = dict(v.split(":")[:2] for v in services["envoy"]["volumes"])
    assert (COMPOSE.parent / "envoy.yaml").resolve() == (COMPOSE.parent / next(
        k for k, v in mounts.items() if v == "/etc/envoy/envoy.yaml")).resolve()
    wasm_src = next(k for k, v in mounts.items() if v == WASM_IN_CONTAINER)
    assert (COMPOSE.parent / wasm_src).resolve() == WASM.resolve()
    build = services["mcp-ownership"]["build"]
    assert (COMPOSE.parent / build["context"] / build["dockerfile"]).resolve() == ROOT / "Dockerfile.ownership"


# ---- Secrets --------------------------------------------------------------------------------
def env_names(pc: dict) -> set[str]:
    """The variables a plugin config reads; asserts it holds no literal secret."""
    assert "token" not in pc["ownership"], "a literal ownership token in a manifest"
    assert pc["ownership"].get("token_env"), "the ownership service requires a token"
    names = {pc["ownership"]["token_env"]}
    for k in pc["keys"]:
        assert "secret" not in k and k.get("secret_env"), f"key {k['id']}: a literal secret"
        names.add(k["secret_env"])
    return names


def secret_refs(env: list[dict]) -> dict[str, tuple[str, str]]:
    """Container env entries set from a Secret: name -> (secret name, key)."""
    return {e["name"]: (e["valueFrom"]["secretKeyRef"]["name"], e["valueFrom"]["secretKeyRef"]["key"])
            for e in env if "secretKeyRef" in e.get("valueFrom", {})}


def test_istio_secrets_come_from_the_gateway_env():
    wp = one("WasmPlugin")["spec"]
    names = env_names(wp["pluginConfig"])
    host = {e["name"] for e in wp["vmConfig"]["env"] if e.get("valueFrom") == "HOST"}
    assert names <= host, f"not passed to the VM: {names - host}"
    patch = next(d for _, d in k8s_objects() if d["kind"] == "Deployment"
                 and d["metadata"]["namespace"] == one("WasmPlugin")["metadata"]["namespace"])
    (proxy,) = [c for c in patch["spec"]["template"]["spec"]["containers"] if c["name"] == "istio-proxy"]
    refs = secret_refs(proxy["env"])
    assert names <= set(refs), f"not set from the Secret: {names - set(refs)}"
    assert {s for s, _ in refs.values()} == {"mcp-resume-guard"}


def test_envoy_gateway_secrets_come_from_the_envoy_container_env():
    objs = {d["kind"]: d for d in docs(DEPLOY / "envoy-gateway" / "mcp-resume-guard.yaml")}
    (w,) = objs["EnvoyExtensionPolicy"]["spec"]["wasm"]
    names = env_names(w["config"])
    assert names <= set(w["env"]["hostKeys"])
    env = objs["EnvoyProxy"]["spec"]["provider"]["kubernetes"]["envoyDeployment"]["container"]["env"]
    refs = secret_refs(env)
    assert names <= set(refs) and {s for s, _ in refs.values()} == {"mcp-resume-guard"}


def test_compose_secrets_are_docker_secrets():
    comp = yaml.safe_load(COMPOSE.read_text())
    cfg = yaml.safe_load(COMPOSE_ENVOY.read_text())
    names = env_names(plugin_json(cfg))
    assert names <= set(guard(cfg)["vm_config"]["environment_variables"]["host_env_keys"])
    envoy = comp["services"]["envoy"]
    script = " ".join(envoy["command"])
    for n in names:
        # Exported from a mounted secret file, not a value in the compose file.
        m = re.search(rf'{n}="\$\$\(cat /run/secrets/(\w+)\)"', script)
        assert m and m.group(1) in envoy["secrets"], f"{n} not read from a secret: {script}"
    assert "environment" not in envoy and "env_file" not in envoy
    own = comp["services"]["mcp-ownership"]
    assert own["environment"]["MCP_OWNERSHIP_TOKEN_FILE"] == "/run/secrets/ownership_token"
    assert "ownership_token" in own["secrets"]
    for sec in comp["secrets"].values():
        assert sec["file"].startswith("./secrets/")
    assert "secrets/" in (COMPOSE.parent / ".gitignore").read_text().split()


@pytest.mark.envoy
def test_validate_fails_without_the_secret(tmp_path):
    """Control: validate runs the guard's on_configure with the environment it is given; the
    compose config without its key variable does not load, and says which variable."""
    cfg = yaml.safe_load(COMPOSE_ENVOY.read_text())
    guard(cfg)["vm_config"]["code"]["local"]["filename"] = str(ensure_wasm())
    res = envoy_validate(cfg, tmp_path, "compose-no-key",
                         env={"MCP_GUARD_OWNERSHIP_TOKEN": GUARD_ENV["MCP_GUARD_OWNERSHIP_TOKEN"]})
    assert res.returncode != 0
    assert "MCP_GUARD_KEY_1 is not set" in res.stdout + res.stderr, res.stdout + res.stderr


@pytest.mark.parametrize("name", ["istio/wasmplugin.yaml", "envoy-gateway/mcp-resume-guard.yaml",
                                  "compose/envoy.yaml", "compose/docker-compose.yaml"])
def test_no_known_placeholder_in_a_manifest(name):
    text = (DEPLOY / name).read_text()
    for word in ("REPLACE-ME", "UkVQTEFDRS1NR", "ZGVtby1vbmx5"):
        assert word not in text, f"{name} still carries {word}"


# ---- Dockerfiles ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["Dockerfile.wasm", "Dockerfile.ownership"])
def test_dockerfile_bases_pinned(name):
    froms = from_lines(ROOT / name)
    assert len(froms) >= 2, "multi-stage"
    stages = {a.split()[-1] for a in froms if " AS " in a.upper()}
    for arg in froms:
        img = image_ref(arg)
        if img == "scratch" or img in stages:
            continue
        assert pinned(img), f"{name}: FROM {img} is not pinned"
    assert image_ref(froms[0]).startswith("rust:1.95"), "build stage pinned to the toolchain (rustc 1.95)"


def test_dockerfile_wasm():
    text = (ROOT / "Dockerfile.wasm").read_text()
    assert image_ref(from_lines(ROOT / "Dockerfile.wasm")[-1]) == "scratch"
    assert "rustup target add wasm32-wasip1" in text
    assert re.search(r"cargo build --release (--locked )?--target wasm32-wasip1 -p mcp-resume-guard", text)
    final = text[text.rindex("FROM scratch"):]
    copies = [ln for ln in final.splitlines() if ln.startswith("COPY")]
    assert copies and all(ln.split()[-1] == "/plugin.wasm" for ln in copies)
    assert not re.search(r"^(RUN|CMD|ENTRYPOINT)", final, re.M)


def test_dockerfile_ownership():
    text = (ROOT / "Dockerfile.ownership").read_text()
    bin_name = re.search(r'\[\[bin\]\]\s*name\s*=\s*"([^"]+)"', (ROOT / "ownership/Cargo.toml").read_text())[1]
    assert f"-p {bin_name}" in text and f"target/release/{bin_name}" in text
    final = text[text.rindex("\nFROM "):]
    user = re.search(r"^USER\s+(\S+)", final, re.M)
    assert user and user[1].split(":")[0] not in ("0", "root")
    assert re.search(r"^EXPOSE\s+9200\b", final, re.M)
    assert '"0.0.0.0:9200"' in final


def test_dockerignore_keeps_the_workspace():
    ignored = {ln.strip().strip("/") for ln in (ROOT / ".dockerignore").read_text().splitlines()
               if ln.strip() and not ln.startswith("#")}
    assert {"target", ".venv", ".git"} <= ignored
    members = re.search(r"members\s*=\s*\[([^\]]*)\]", (ROOT / "Cargo.toml").read_text())[1]
    for m in re.findall(r'"([^"]+)"', members):
        parts = Path(m).parts
        for i in range(1, len(parts) + 1):
            assert "/".join(parts[:i]) not in ignored, f"workspace member {m} excluded from the build context"


# ---- Kubernetes ----------------------------------------------------------------------------
def ownership_container() -> tuple[dict, dict]:
    dep = named("Deployment", "mcp-ownership")
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    return dep, c


def secret_files(pod: dict, c: dict) -> dict[str, tuple[str, str]]:
    """Mounted Secret files of container `c`: path -> (Secret name, key)."""
    vols = {v["name"]: v for v in pod["volumes"]}
    out = {}
    for m in c.get("volumeMounts", []):
        sec = vols.get(m["name"], {}).get("secret")
        if sec is None:
            continue
        # Mode 0440: readable through the pod's fsGroup only.
        assert sec["defaultMode"] == 0o440 and pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsGroup"]
        keys = [(i["key"], i["path"]) for i in sec["items"]] if "items" in sec else None
        for key, rel in keys or []:
            out[f"{m['mountPath']}/{rel}"] = (sec["secretName"], key)
        if keys is None:  # every key of the Secret, named after it
            out[m["mountPath"] + "/*"] = (sec["secretName"], "*")
    return out


def test_ownership_manifest():
    dep, c = ownership_container()
    spec = dep["spec"]["template"]["spec"]
    args = c["args"]
    store = args[args.index("--store") + 1]
    assert args[args.index("--listen") + 1] == "0.0.0.0:9200"
    # The shared store by default: a rollout or restart of this service keeps every session's
    # resumption, and replicas roll one at a time with one always up.
    assert store == "redis://redis.mcp-system:6379", "no credentials in the URL, Redis by default"
    assert dep["spec"]["replicas"] >= 2
    assert dep["spec"]["strategy"] == {"type": "RollingUpdate",
                                       "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}
    # Secrets from mounted files, never a literal: every *_FILE variable names a mounted Secret key.
    env = {e["name"]: e for e in c["env"]}
    files = secret_files(spec, c)
    for name in ("MCP_OWNERSHIP_TOKEN_FILE", "MCP_OWNERSHIP_ADMIN_TOKEN_FILE", "MCP_OWNERSHIP_REDIS_PASSWORD_FILE"):
        path = env[name]["value"]
        assert path in files or str(Path(path).parent) + "/*" in files, (name, path, files)
    assert files["/var/run/secrets/mcp-ownership-redis/password"] == ("mcp-ownership-redis", "password")
    assert not any("PASSWORD" in n and "FILE" not in n for n in env), "the password itself never in env"
    for probe in ("readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"]["path"] == "/healthz"
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["resources"]["requests"] and c["resources"]["limits"]
    kinds = {d["kind"] for p, d in k8s_objects() if p.name == "ownership.yaml"}
    assert {"Namespace", "Deployment", "Service", "PodDisruptionBudget"} <= kinds


def redis_container() -> tuple[dict, dict]:
    sts = named("StatefulSet", "redis")
    (c,) = sts["spec"]["template"]["spec"]["containers"]
    return sts, c


def test_redis_manifest_keeps_state_and_needs_a_password():
    sts, c = redis_container()
    spec = sts["spec"]["template"]["spec"]
    args = c["args"]
    opt = {a: args[i + 1] for i, a in enumerate(args) if a.startswith("--")}
    # Every write in the append-only file on a persistent volume: a Redis restart keeps the state.
    assert opt["--appendonly"] == "yes" and opt["--dir"] == "/data"
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    assert {m["name"]: m["mountPath"] for m in c["volumeMounts"]}[claim["metadata"]["name"]] == "/data"
    # noeviction: the ownership service refuses new sessions before Redis refuses writes.
    assert opt["--maxmemory-policy"] == "noeviction" and opt["--maxmemory"]
    # The password: the config file (first argument) from the Secret the ownership service reads.
    assert secret_files(spec, c) == {args[0]: ("mcp-ownership-redis", "redis.conf")}
    assert "requirepass" not in " ".join(args) and "-a" not in c["readinessProbe"]["exec"]["command"][-1].split()
    assert named("Service", "redis")["spec"]["ports"][0]["port"] == 6379
    # Only the ownership pods reach it.
    netpol = named("NetworkPolicy", "redis")
    assert netpol["spec"]["podSelector"]["matchLabels"].items() <= sts["spec"]["template"]["metadata"]["labels"].items()
    (rule,) = netpol["spec"]["ingress"]
    own = named("Deployment", "mcp-ownership")["spec"]["template"]["metadata"]["labels"]
    assert [p["podSelector"]["matchLabels"] for p in rule["from"]] == [{"app.kubernetes.io/name": own["app.kubernetes.io/name"]}]
    assert rule["ports"] == [{"protocol": "TCP", "port": 6379}]


SESSION = "0123456789abcdef0123456789abcdef"
INCARNATION = "00000000000000aa"


def owner_call(port: int, token: str, path: str, body: dict) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(), method="POST",
                                 headers={"content-type": "application/json", "authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=5) as r:
        return json.loads(r.read())


def resume_after_restart(tmp_path: Path, store_args: list[str], env: dict) -> dict:
    """An ownership service run as the manifest runs it (its args and env, the Secret files
    under tmp_path), told about a session and a stream, restarted, then asked to resume it."""
    binary = ROOT / "target" / "debug" / "mcp-ownership"
    port = free_port()
    token = "Z3VhcmQtdG9rZW4tZm9yLXRlc3Rz"
    records = {"records": [
        {"type": "session_open", "session": SESSION, "version": "2025-06-18"},
        {"type": "stream_open", "session": SESSION, "incarnation": INCARNATION, "kind": "get",
         "owner": "10.0.0.1:8080", "retention": 0, "supersedes": True, "opened_ms": 1},
        {"type": "events", "session": SESSION, "incarnation": INCARNATION, "first_seq": 1, "ids": ["e1", "e2"]}]}
    (tmp_path / "guard").write_text(token + "\n")
    (tmp_path / "admin").write_text("YWRtaW4tdG9rZW4tZm9yLXRlc3Rz\n")
    env = {**env, "MCP_OWNERSHIP_TOKEN_FILE": str(tmp_path / "guard"),
           "MCP_OWNERSHIP_ADMIN_TOKEN_FILE": str(tmp_path / "admin")}
    proc = None
    try:
        for step in ("record", "resume"):
            proc = Proc(f"ownership-{step}", [binary, "--listen", f"127.0.0.1:{port}", *store_args],
                        port=port, env=env, run_dir=tmp_path).start()
            if step == "record":
                assert owner_call(port, token, "/v1/records", records) == {"applied": 3}
            else:
                return owner_call(port, token, "/v1/resume", {"session": SESSION, "incarnation": INCARNATION,
                                                             "kind": "get", "seq": 1})
            proc.stop()
    finally:
        if proc is not None:
            proc.stop()
    raise AssertionError("unreachable")


def test_k8s_store_keeps_every_session_across_an_ownership_restart(tmp_path):
    """The shipped Redis and ownership manifests, run here as they would run in the pods (their
    args and environment; a real redis-server and mcp-ownership on 127.0.0.1): a session recorded
    before a restart of the ownership service still continues after it. The memory store (the
    alternative the manifest describes) loses it: the control that this test can fail."""
    if not shutil.which("redis-server") or not (ROOT / "target" / "debug" / "mcp-ownership").exists():
        pytest.skip("needs redis-server (make redis) and mcp-ownership (make build)")
    _, rc = redis_container()
    _, oc = ownership_container()
    password = "cGFzc3dvcmQtZm9yLXRlc3Rz"
    conf = tmp_path / "redis.conf"
    conf.write_text(f"requirepass {password}\n")
    (tmp_path / "password").write_text(password + "\n")
    (tmp_path / "data").mkdir()
    rport = free_port()
    args = [str(conf) if a == rc["args"][0] else str(tmp_path / "data") if a == "/data" else a for a in rc["args"]]
    redis = subprocess.Popen(["redis-server", *args, "--port", str(rport), "--bind", "127.0.0.1",
                              "--daemonize", "no", "--loglevel", "warning"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # The service answers 503 until its store is reachable: records only once Redis listens.
        wait_port(rport, proc=redis)
        oargs = oc["args"]
        store = oargs[oargs.index("--store") + 1].replace("redis.mcp-system:6379", f"127.0.0.1:{rport}")
        env = {e["name"]: e["value"] for e in oc["env"]}
        env["MCP_OWNERSHIP_REDIS_PASSWORD_FILE"] = str(tmp_path / "password")
        kept = resume_after_restart(tmp_path, ["--store", store], env)
        assert kept["verdict"] == "continue" and kept["expected"] == ["e2"], kept
        lost = resume_after_restart(tmp_path, ["--store", "memory"], env)
        assert lost["verdict"] != "continue", lost
    finally:
        redis.terminate()
        redis.wait(timeout=10)


def prestop_script() -> tuple[str, dict]:
    dep = next(d for d in docs(DEPLOY / "k8s" / "mcp-server-prestop.yaml") if d["kind"] == "Deployment")
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    cmd = c["lifecycle"]["preStop"]["exec"]["command"]
    assert cmd[:2] == ["/bin/sh", "-c"]
    env = {e["name"]: e for e in c["env"]}
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert env["MCP_PORT"]["value"] == str(c["ports"][0]["containerPort"])
    assert env["MCP_OWNERSHIP_URL"]["value"] == "http://mcp-ownership.mcp-system:9200/v1/owners/gone"
    return cmd[2], {k: v.get("value", "") for k, v in env.items()}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_prestop_hook_is_accepted_by_the_ownership_service(tmp_path):
    binary = next((p for p in (ROOT / "target" / "debug" / "mcp-ownership",
                               ROOT / "target" / "release" / "mcp-ownership") if p.exists()), None)
    if binary is None:
        pytest.skip("mcp-ownership not built (make build)")
    if not (shutil.which("curl") or shutil.which("wget")):
        pytest.skip("neither curl nor wget here")
    script, env = prestop_script()
    script = script.replace("sleep 5", ":")
    port = free_port()
    proc = start_ownership(port, ["--store", "memory"], run_dir=tmp_path, exe=binary)
    try:
        for pod_ip in ("10.1.2.3", "fd00::17"):
            run_env = {"PATH": "/usr/bin:/bin", "POD_IP": pod_ip, "MCP_PORT": env["MCP_PORT"],
                       "MCP_OWNERSHIP_URL": f"http://127.0.0.1:{port}/v1/owners/gone"}
            res = subprocess.run(["/bin/sh", "-c", script], env=run_env, capture_output=True,
                                 text=True, timeout=60)
            assert res.returncode == 0
            assert json.loads(res.stdout) == {"applied": 1}, (pod_ip, res.stdout, res.stderr)
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
        assert re.search(r'mcp_ownership_http_requests_total\{[^}]*endpoint="owners_gone"[^}]*code="200"[^}]*\} 2',
                         metrics) or re.search(
            r'mcp_ownership_http_requests_total\{[^}]*code="200"[^}]*endpoint="owners_gone"[^}]*\} 2', metrics)
    finally:
        proc.stop()


def test_only_the_guard_and_the_prestop_hook_reach_the_ownership_service():
    """The network and mesh layers under the bearer tokens: the NetworkPolicy lets only the
    gateway running the guard and the MCP server pods (their preStop hook) reach port 9200; the
    Istio AuthorizationPolicy (mTLS STRICT) gives the gateway records, resumes and /metrics, the
    MCP server pods /v1/owners/gone, and anyone /healthz, nothing else."""
    own_pods = next(d for p, d in k8s_objects() if p.name == "ownership.yaml" and d["kind"] == "Deployment")
    own_labels = own_pods["spec"]["template"]["metadata"]["labels"]
    wp = one("WasmPlugin")
    server = next(d for d in docs(DEPLOY / "k8s" / "mcp-server-prestop.yaml") if d["kind"] == "Deployment")
    netpol = named("NetworkPolicy", "mcp-ownership")
    assert netpol["metadata"]["namespace"] == own_pods["metadata"]["namespace"]
    assert netpol["spec"]["podSelector"]["matchLabels"].items() <= own_labels.items()
    assert netpol["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = netpol["spec"]["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 9200}]
    peers = [(p["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"], p["podSelector"]["matchLabels"])
             for p in rule["from"]]
    assert peers == [(wp["metadata"]["namespace"], wp["spec"]["selector"]["matchLabels"]),
                     (server["metadata"]["namespace"], server["spec"]["template"]["metadata"]["labels"])]

    authz = one("AuthorizationPolicy")
    assert authz["spec"]["action"] == "ALLOW"
    assert authz["spec"]["selector"]["matchLabels"].items() <= own_labels.items()
    allowed = {}
    for r in authz["spec"]["rules"]:
        who = tuple(p for f in r.get("from", []) for p in f["source"]["principals"]) or ("anyone",)
        for t in r["to"]:
            op = t["operation"]
            assert op["ports"] == ["9200"]
            for m in op["methods"]:
                for path in op["paths"]:
                    allowed.setdefault(who, set()).add((m, path))
    gateway, = [w for w in allowed if w != ("anyone",) and w[0].startswith(f"cluster.local/ns/{wp['metadata']['namespace']}/")]
    pods, = [w for w in allowed if w != ("anyone",) and w[0].startswith(f"cluster.local/ns/{server['metadata']['namespace']}/")]
    # The preStop principal is the service account the MCP server pods really run as.
    sa = server["spec"]["template"]["spec"].get("serviceAccountName", "default")
    assert pods == (f"cluster.local/ns/{server['metadata']['namespace']}/sa/{sa}",), (pods, sa)
    assert allowed == {gateway: {("POST", "/v1/records"), ("POST", "/v1/resume"), ("GET", "/metrics")},
                       pods: {("POST", "/v1/owners/gone")},
                       ("anyone",): {("GET", "/healthz")}}
    peer = one("PeerAuthentication")
    assert peer["spec"]["mtls"]["mode"] == "STRICT"
    assert peer["spec"]["selector"]["matchLabels"] == authz["spec"]["selector"]["matchLabels"]


# ---- session-opening rate limit and long-lived SSE -----------------------------------------
EG_FILE = DEPLOY / "envoy-gateway" / "mcp-resume-guard.yaml"
FULL = {"numerator": 100, "denominator": "HUNDRED"}


# The ownership service's defaults (ownership/src/main.rs): sessions kept, idle TTL.
OWNERSHIP_MAIN = (ROOT / "ownership" / "src" / "main.rs").read_text()
MAX_SESSIONS = int(re.search(r"MAX_SESSIONS: usize = ([\d_]+);", OWNERSHIP_MAIN).group(1).replace("_", ""))
IDLE_TTL_SECS = int(re.search(r"SESSION_IDLE_TTL_SECS: u64 = ([\d_]+);", OWNERSHIP_MAIN).group(1).replace("_", ""))
CLIENT_KEY = "masked_remote_address"


def per_second(tb: dict) -> float:
    return tb["tokens_per_fill"] / float(tb["fill_interval"].rstrip("s"))


def client_bucket(per: dict) -> dict:
    """The per-client bucket of a session-opening limit: one dynamic descriptor (no value) on the
    masked remote address, IPv4 by /32 and IPv6 by /64."""
    (rl,) = per["rate_limits"]
    assert rl["actions"] == [{CLIENT_KEY: {"v4_prefix_mask_len": 32, "v6_prefix_mask_len": 64}}], rl
    (d,) = per["descriptors"]
    assert d["entries"] == [{"key": CLIENT_KEY}], d
    return d["token_bucket"]


def check_token_bucket(per: dict) -> None:
    """A per-route local rate limit that acts: a bucket per client taken first, then the route's,
    enabled and enforced on every request."""
    assert per["@type"] == RATELIMIT_TYPE
    tb = per["token_bucket"]
    assert 0 < tb["tokens_per_fill"] <= tb["max_tokens"] and tb["fill_interval"] == "1s", tb
    # Envoy's defaults are 0%: without both the bucket counts nothing or refuses nothing.
    assert per["filter_enabled"]["default_value"] == FULL
    assert per["filter_enforced"]["default_value"] == FULL
    # One client may take only part of the route's bucket: Envoy takes the stricter bucket first
    # and stops at an empty one, so a client past its own takes nothing from the route's.
    client = client_bucket(per)
    assert 0 < client["tokens_per_fill"] <= client["max_tokens"] <= tb["max_tokens"], client
    assert per_second(client) < per_second(tb) / 2, (client, tb)
    assert per["always_consume_default_token_bucket"] is True
    assert 1000 <= per["max_dynamic_descriptors"] <= 100_000


def check_sizing(buckets: list[dict]) -> None:
    """deploy/README.md's rule with the shipped defaults, for one Envoy: the session openings its
    routes let through in one idle TTL fit under the ownership service's session cap."""
    assert sum(per_second(tb) for tb in buckets) * IDLE_TTL_SECS <= MAX_SESSIONS, buckets


def is_session_opening(match: dict, path: str) -> bool:
    """POST on the MCP path without Mcp-Session-Id (Envoy route match)."""
    heads = {h["name"]: h for h in match.get("headers", [])}
    return (match.get("path") == path
            and heads.get(":method", {}).get("string_match") == {"exact": "POST"}
            and heads.get("mcp-session-id", {}).get("present_match") is False)


@pytest.mark.parametrize("path", [PRODUCTION_ENVOY, COMPOSE_ENVOY], ids=lambda p: str(p.relative_to(ROOT)))
def test_session_opening_is_rate_limited(path):
    cfg = yaml.safe_load(path.read_text())
    names = [f["name"] for f in filters(cfg)]
    (rl,) = [f for f in filters(cfg) if f["typed_config"]["@type"] == RATELIMIT_TYPE]
    assert rl["name"] == RATELIMIT_FILTER
    # At the listener: no bucket (it would limit every route); before the guard and the router.
    assert "token_bucket" not in rl["typed_config"]
    assert names.index(RATELIMIT_FILTER) < names.index("mcp_resume_guard") < names.index("envoy.filters.http.router")
    rs = routes(cfg)
    for p in (x + s for x in plugin_json(cfg)["mcp_paths"] for s in ("", "/")):
        opening = [i for i, r in enumerate(rs) if is_session_opening(r["match"], p)]
        plain = [i for i, r in enumerate(rs) if r["match"] == {"path": p}]
        assert len(opening) == 1 and len(plain) == 1 and opening[0] < plain[0], p
        o, m = rs[opening[0]], rs[plain[0]]
        # The same as the MCP route (cluster, no deadline, idle timeout, no retries, the pin)...
        assert o["route"] == m["route"] and "retry_policy" not in o["route"]
        assert route_pin(o) == route_pin(m) is not None
        # ...plus the bucket, which no other route has.
        check_token_bucket(o["typed_per_filter_config"][RATELIMIT_FILTER])
    limited = [r["typed_per_filter_config"][RATELIMIT_FILTER] for r in rs
               if RATELIMIT_FILTER in r.get("typed_per_filter_config", {})]
    assert len(limited) == 2
    check_sizing([per["token_bucket"] for per in limited])
    # The client is the connection's peer: a client's X-Forwarded-For never picks its bucket.
    h = hcm(cfg)
    assert h["use_remote_address"] is True and h["xff_num_trusted_hops"] == 0


@pytest.mark.parametrize("path", SHIPPED_ENVOY, ids=lambda p: str(p.relative_to(ROOT)))
def test_replica_cluster_sized_for_long_lived_sse(path):
    cfg = yaml.safe_load(path.read_text())
    (c,) = [c for c in cfg["static_resources"]["clusters"] if c["name"] == "mcp_replicas"]
    (t,) = c["circuit_breakers"]["thresholds"]
    # Far above Envoy's default 1024 concurrent streams/connections; the queue stays bounded.
    assert t["max_connections"] >= 10_000 and t["max_requests"] >= 10_000, t
    assert 0 < t["max_pending_requests"] <= 10_000 and t["max_retries"] == 0, t
    ka = c["upstream_connection_options"]["tcp_keepalive"]
    assert ka["keepalive_time"] <= 300 and ka["keepalive_interval"] <= 60 and ka["keepalive_probes"] >= 1
    assert hcm(cfg)["stream_idle_timeout"] == "0s"
    for r in routes(cfg):
        if r["route"]["cluster"] == "mcp_replicas":
            assert r["route"]["timeout"] == "0s" and "retry_policy" not in r["route"]
            assert 300 <= int(r["route"]["idle_timeout"].rstrip("s")) <= 86_400


# A broken response reaches an HTTP/1.1 client as the connection's close after the delayed close
# timeout (Envoy's default 1 s); every shipped config keeps it short (measured in
# tests/e2e/test_deploy_limits.py).
DELAYED_CLOSE = "0.1s"


@pytest.mark.parametrize("path", SHIPPED_ENVOY, ids=lambda p: str(p.relative_to(ROOT)))
def test_short_delayed_close(path):
    assert hcm(yaml.safe_load(path.read_text()))["delayed_close_timeout"] == DELAYED_CLOSE


def test_istio_short_delayed_close():
    (p,) = patches("NETWORK_FILTER")
    assert p["patch"]["value"]["typed_config"]["delayed_close_timeout"] == DELAYED_CLOSE


@pytest.mark.envoy
def test_production_rate_limit_refuses_only_session_opening(tmp_path):
    """envoy-production.yaml under Envoy: past the burst, POSTs to /mcp without Mcp-Session-Id
    get 429; with a session id, or a GET, never (no replica listens: those get 503)."""
    cfg = local_config_with_wasm(PRODUCTION_ENVOY)
    port, admin, dead = free_port(), free_port(), free_port()
    cfg["admin"]["address"]["socket_address"]["port_value"] = admin
    cfg["static_resources"]["listeners"][0]["address"]["socket_address"]["port_value"] = port
    for c in cfg["static_resources"]["clusters"]:
        for ep in c["load_assignment"]["endpoints"][0]["lb_endpoints"]:
            ep["endpoint"]["address"]["socket_address"]["port_value"] = dead
    path = tmp_path / "production.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    base = {k: v for k, v in os.environ.items() if k not in GUARD_ENV}
    proc = subprocess.Popen([str(ENVOY_BIN), "-c", str(path), "--log-level", "warn", "--concurrency", "1",
                             "--use-dynamic-base-id"], env={**base, **GUARD_ENV},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_live(admin, lambda: proc.poll() is None, 30, "envoy-production.yaml")

        def codes(n, method="POST", path="/mcp", session=None):
            out = []
            for _ in range(n):
                req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method,
                                             data=b"{}" if method == "POST" else None)
                if session:
                    req.add_header("Mcp-Session-Id", session)
                try:
                    with urllib.request.urlopen(req, timeout=5) as r:
                        out.append(r.status)
                except urllib.error.HTTPError as e:
                    out.append(e.code)
            return out

        with_session = codes(150, session="s-1")
        gets = codes(20, method="GET")
        opening = codes(150)
        assert 429 not in with_session and 429 not in gets, (with_session, gets)
        # This client's burst (plus whatever refilled meanwhile), then refused.
        burst = client_bucket(routes(cfg)[0]["typed_per_filter_config"][RATELIMIT_FILTER])["max_tokens"]
        assert opening.count(429) >= 100 and opening[:burst].count(429) == 0, opening
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_istio_session_opening_route():
    vs = one("VirtualService")["spec"]["http"]
    assert vs[0]["name"] == "mcp-initialize", "first, so it takes these requests before `mcp`"
    for m in vs[0]["match"]:
        assert m["method"] == {"exact": "POST"} and m["withoutHeaders"] == {"mcp-session-id": {}}
    assert sorted(m["uri"]["exact"] for m in vs[0]["match"]) == \
        sorted(m["uri"]["exact"] for m in next(r for r in vs if r["name"] == "mcp")["match"])
    per = route_patches()["mcp-initialize"]["patch"]["value"]["typed_per_filter_config"]
    check_token_bucket(per[RATELIMIT_FILTER])
    # One bucket per route match (/mcp and /mcp/).
    check_sizing([per[RATELIMIT_FILTER]["token_bucket"]] * len(vs[0]["match"]))
    assert RATELIMIT_FILTER not in route_patches()["mcp"]["patch"]["value"]["typed_per_filter_config"]
    (rl,) = [p for p in patches("HTTP_FILTER") if p["patch"]["value"]["typed_config"]["@type"] == RATELIMIT_TYPE]
    assert rl["patch"]["value"]["name"] == RATELIMIT_FILTER and "token_bucket" not in rl["patch"]["value"]["typed_config"]


def test_istio_destination_rule_sized_for_long_lived_sse():
    pool = one("DestinationRule")["spec"]["trafficPolicy"]["connectionPool"]
    assert pool["tcp"]["maxConnections"] >= 10_000
    assert set(pool["tcp"]["tcpKeepalive"]) == {"time", "interval", "probes"}
    assert pool["http"]["http2MaxRequests"] >= 10_000
    assert 0 < pool["http"]["http1MaxPendingRequests"] <= 10_000
    # 1 would close every upstream connection after one request.
    assert pool["http"]["maxRequestsPerConnection"] in (0, None) and pool["http"]["maxRetries"] == 0


def test_envoy_gateway_backend_traffic_policy():
    objs = {d["kind"]: d for d in docs(EG_FILE)}
    btp, route = objs["BackendTrafficPolicy"], objs["HTTPRoute"]
    (ref,) = btp["spec"]["targetRefs"]
    assert (ref["kind"], ref["name"]) == ("HTTPRoute", route["metadata"]["name"])
    assert btp["metadata"]["namespace"] == route["metadata"]["namespace"]
    # The named rule is the MCP rule (rule 0, the pinned one).
    assert route["spec"]["rules"][0]["name"] == ref["sectionName"]
    sp = btp["spec"]
    assert "retry" not in sp
    no_session = [{"name": "mcp-session-id", "type": "RegularExpression", "value": ".*", "invert": True}]
    rules = sp["rateLimit"]["local"]["rules"]
    for rule in rules:
        (sel,) = rule["clientSelectors"]
        assert sel["headers"] == no_session and rule["limit"]["requests"] > 0, rule
    seconds = {"Second": 1, "Minute": 60}

    def rate(rule):
        return rule["limit"]["requests"] / seconds[rule["limit"]["unit"]]

    # Per client (every IPv4 and IPv6 address its own bucket), then per route; a client may
    # take only part of the route's rate.
    route_rule = [r for r in rules if "sourceCIDR" not in r["clientSelectors"][0]]
    client_rules = [r for r in rules if "sourceCIDR" in r["clientSelectors"][0]]
    assert len(route_rule) == 1 and len(client_rules) == 2, rules
    assert sorted(r["clientSelectors"][0]["sourceCIDR"]["value"] for r in client_rules) == ["0.0.0.0/0", "::/0"]
    for r in client_rules:
        assert r["clientSelectors"][0]["sourceCIDR"]["type"] == "Distinct"
        assert rate(r) < rate(route_rule[0]) / 2, (r, route_rule)
    # One bucket per route match of the MCP rule.
    n = len(route["spec"]["rules"][0]["matches"])
    assert n * rate(route_rule[0]) * IDLE_TTL_SECS <= MAX_SESSIONS
    cb = sp["circuitBreaker"]
    assert cb["maxConnections"] >= 10_000 and cb["maxParallelRequests"] >= 10_000
    assert 0 < cb["maxPendingRequests"] <= 10_000 and cb["maxParallelRetries"] == 0
    assert set(sp["tcpKeepalive"]) == {"idleTime", "interval", "probes"}
    assert sp["timeout"]["http"]["connectionIdleTimeout"]


def test_readme_istio_example_takes_its_secrets_from_the_environment():
    """README's WasmPlugin example is the shipped one in small: the key and the ownership token
    come from the gateway's environment (a Secret), never a literal in pluginConfig."""
    blocks = re.findall(r"```yaml\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    (wp,) = [d for b in blocks for d in yaml.safe_load_all(b) if isinstance(d, dict) and d.get("kind") == "WasmPlugin"]
    pc = wp["spec"]["pluginConfig"]
    assert all("secret" not in k and k.get("secret_env") for k in pc["keys"]), pc["keys"]
    assert pc["ownership"].get("token_env"), pc["ownership"]
    wanted = {k["secret_env"] for k in pc["keys"]} | {pc["ownership"]["token_env"]}
    assert {e["name"] for e in wp["spec"]["vmConfig"]["env"] if e["valueFrom"] == "HOST"} == wanted
    shipped = one("WasmPlugin")["spec"]
    assert {e["name"] for e in shipped["vmConfig"]["env"]} == wanted
