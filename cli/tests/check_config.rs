//! `mcp-guard` against the shipped configurations (which must pass) and broken copies of them
//! (which must fail and name the field).
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{json, Value};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn run(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_mcp-guard"))
        .args(args)
        .current_dir(root())
        .output();
    match out {
        Ok(o) => (
            o.status.code().unwrap_or(-1),
            format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            ),
        ),
        Err(e) => (-1, e.to_string()),
    }
}

fn yaml(path: &str) -> Value {
    let text = std::fs::read_to_string(root().join(path)).unwrap_or_default();
    serde_yaml_ng::from_str(&text).unwrap_or(Value::Null)
}

fn write(name: &str, v: &Value) -> String {
    let dir = std::env::temp_dir().join(format!("mcp-guard-test-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let p = dir.join(name);
    let _ = std::fs::write(&p, v.to_string());
    p.display().to_string()
}

/// The first listener's HTTP connection manager.
fn hcm(v: &mut Value) -> &mut Value {
    &mut v["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
}

const WASM: &str = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm";
const STATEFUL: &str =
    "type.googleapis.com/envoy.extensions.filters.http.stateful_session.v3.StatefulSession";
const PER_ROUTE: &str =
    "type.googleapis.com/envoy.extensions.filters.http.stateful_session.v3.StatefulSessionPerRoute";
const HEADER_MUTATION: &str =
    "type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation";

/// The index in http_filters of the filter with this typed_config @type.
fn filter_at(v: &mut Value, ty: &str) -> usize {
    hcm(v)["http_filters"]
        .as_array()
        .and_then(|fs| fs.iter().position(|f| f["typed_config"]["@type"] == ty))
        .unwrap_or(usize::MAX)
}

fn filter<'a>(v: &'a mut Value, ty: &str) -> &'a mut Value {
    let i = filter_at(v, ty);
    &mut hcm(v)["http_filters"][i]
}

fn drop_filter(v: &mut Value, ty: &str) {
    if let Some(fs) = hcm(v)["http_filters"].as_array_mut() {
        fs.retain(|f| f["typed_config"]["@type"] != ty);
    }
}

fn routes(v: &mut Value) -> &mut Value {
    &mut hcm(v)["route_config"]["virtual_hosts"][0]["routes"]
}

/// The index of the route matching exactly this path.
fn route_at(v: &mut Value, path: &str) -> usize {
    routes(v)
        .as_array()
        .and_then(|rs| rs.iter().position(|r| r["match"]["path"] == path))
        .unwrap_or(usize::MAX)
}

fn mcp_route(v: &mut Value) -> &mut Value {
    let i = route_at(v, "/mcp");
    &mut routes(v)[i]
}

/// The name the stateful_session filter goes by (and its per-route configs are keyed by).
fn stateful_name(v: &mut Value) -> String {
    filter(v, STATEFUL)["name"]
        .as_str()
        .unwrap_or("")
        .to_string()
}

/// The MCP route's per-route pin.
fn pin(v: &mut Value) -> &mut Value {
    let name = stateful_name(v);
    &mut mcp_route(v)["typed_per_filter_config"][name.as_str()]
}

fn plugin(v: &mut Value) -> Value {
    let s = filter(v, WASM)["typed_config"]["config"]["configuration"]["value"]
        .as_str()
        .unwrap_or("{}")
        .to_string();
    serde_json::from_str(&s).unwrap_or(Value::Null)
}

fn set_plugin(v: &mut Value, p: &Value) {
    filter(v, WASM)["typed_config"]["config"]["configuration"]["value"] =
        Value::from(p.to_string());
}

fn fails_naming(v: &Value, name: &str, field: &str) {
    let (code, out) = run(&["check-config", &write(name, v)]);
    assert_eq!(code, 1, "{name}: expected failure, got:\n{out}");
    assert!(out.contains(field), "{name}: no mention of {field}:\n{out}");
}

/// A `warning:` line mentioning this.
fn has_warning(out: &str, warning: &str) -> bool {
    out.lines()
        .any(|l| l.starts_with("warning: ") && l.contains(warning))
}

fn passes_warning(v: &Value, name: &str, warning: &str) {
    let (code, out) = run(&["check-config", &write(name, v)]);
    assert_eq!(code, 0, "{name}: expected success, got:\n{out}");
    assert!(
        has_warning(&out, warning),
        "{name}: no warning {warning}:\n{out}"
    );
}

#[test]
fn shipped_configs_pass() {
    for f in [
        "envoy/envoy.yaml",
        "envoy/envoy-ts-affinity.yaml",
        "deploy/compose/envoy.yaml",
        "deploy/istio/wasmplugin.yaml",
    ] {
        let (code, out) = run(&["check-config", f]);
        assert_eq!(code, 0, "{f}:\n{out}");
        assert!(out.contains("ok: "), "{f}:\n{out}");
        // The Envoy files carry every defence: not even a warning.
        if f.ends_with("envoy.yaml") || f.contains("ts-affinity") {
            assert!(!out.contains("warning"), "{f}:\n{out}");
        }
    }
    let istio = [
        "deploy/istio/wasmplugin.yaml",
        "deploy/istio/envoyfilter-stateful-session.yaml",
        "deploy/istio/virtualservice.yaml",
    ];
    let mut args = vec!["check-config"];
    args.extend(istio);
    let (code, out) = run(&args);
    assert_eq!(code, 0, "istio:\n{out}");
    assert!(!out.contains("warning"), "istio:\n{out}");
    let gw = root().join("deploy/envoy-gateway");
    if gw.exists() {
        let (code, out) = run(&["check-config", "deploy/envoy-gateway/mcp-resume-guard.yaml"]);
        assert_eq!(code, 0, "envoy gateway:\n{out}");
        assert!(!out.contains("warning"), "envoy gateway:\n{out}");
    }
}

#[test]
fn the_plugin_json_alone_passes_and_a_short_key_fails() {
    let mut v = yaml("envoy/envoy.yaml");
    let p = plugin(&mut v);
    assert!(p.get("ownership").is_some(), "no plugin config found: {p}");
    let (code, out) = run(&["check-config", &write("plugin.json", &p)]);
    assert_eq!(code, 0, "{out}");
    let mut short = p.clone();
    short["keys"][0] = json!({"id": 1, "active": true, "secret": "c2hvcnQ="});
    fails_naming(
        &short,
        "short.json",
        "keys[0].secret: must decode to at least 32 bytes, got 5",
    );
    let mut unknown = p;
    unknown["retentoin"] = Value::from(3);
    fails_naming(&unknown, "unknown.json", "retentoin");
}

#[test]
fn broken_envoy_configs_fail_and_name_the_field() {
    let base = yaml("envoy/envoy.yaml");

    let mut v = base.clone();
    mcp_route(&mut v)["route"]["retry_policy"] = json!({"retry_on": "5xx", "num_retries": 2});
    fails_naming(&v, "retry.json", "routes[0].route.retry_policy");

    let mut v = base.clone();
    hcm(&mut v)["route_config"]["virtual_hosts"][0]["retry_policy"] = json!({"retry_on": "5xx"});
    fails_naming(&v, "vhretry.json", "virtual_hosts[0].retry_policy");

    let mut v = base.clone();
    drop_filter(&mut v, STATEFUL);
    fails_naming(
        &v,
        "nostateful.json",
        "http_filters: missing: a strict stateful_session",
    );

    let mut v = base.clone();
    let mut p = plugin(&mut v);
    p["keys"][0] = json!({"id": 1, "active": true, "secret": "c2hvcnQ="});
    set_plugin(&mut v, &p);
    fails_naming(
        &v,
        "shortkey.json",
        "configuration.value: invalid config: keys[0].secret",
    );

    let mut v = base.clone();
    if let Some(r) = mcp_route(&mut v)["route"].as_object_mut() {
        r.remove("timeout");
    }
    fails_naming(&v, "notimeout.json", "routes[0].route.timeout: missing");

    let mut v = base.clone();
    mcp_route(&mut v)["route"]["timeout"] = Value::from("15s");
    fails_naming(&v, "timeout15.json", "routes[0].route.timeout: must be 0s");

    // The /mcp/ route is an MCP route too (the guard takes both spellings).
    let mut v = base.clone();
    let i = route_at(&mut v, "/mcp/");
    routes(&mut v)[i]["route"]["timeout"] = Value::from("15s");
    fails_naming(
        &v,
        "slashtimeout.json",
        &format!("routes[{i}].route.timeout: must be 0s"),
    );

    let mut v = base.clone();
    let (g, s) = (filter_at(&mut v, WASM), filter_at(&mut v, STATEFUL));
    if let Some(fs) = hcm(&mut v)["http_filters"].as_array_mut() {
        fs.swap(g, s);
    }
    fails_naming(&v, "order.json", "comes before mcp_resume_guard");

    let mut v = base.clone();
    let r = filter_at(
        &mut v,
        "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router",
    );
    if let Some(fs) = hcm(&mut v)["http_filters"].as_array_mut() {
        let router = fs.remove(r);
        fs.insert(0, router);
    }
    fails_naming(
        &v,
        "routerfirst.json",
        "the router must be the last HTTP filter",
    );

    let mut v = base.clone();
    filter(&mut v, WASM)["typed_config"]["config"]["fail_open"] = Value::from(true);
    fails_naming(&v, "failopen.json", "config.fail_open");

    let mut v = base.clone();
    filter(&mut v, WASM)["typed_config"]["config"]["failure_policy"] = Value::from("FAIL_OPEN");
    fails_naming(
        &v,
        "failurepolicy.json",
        "typed_config.config.failure_policy: must be FAIL_RELOAD or FAIL_CLOSED",
    );
    let mut v = base.clone();
    filter(&mut v, WASM)["typed_config"]["config"]["failure_policy"] = Value::from("FAIL_CLOSED");
    let (code, out) = run(&["check-config", &write("failclosed.json", &v)]);
    assert_eq!(code, 0, "FAIL_CLOSED is fine:\n{out}");

    let mut v = base.clone();
    if let Some(cs) = v["static_resources"]["clusters"].as_array_mut() {
        cs.retain(|c| c["name"] != "mcp_ownership");
    }
    fails_naming(&v, "nocluster.json", "ownership.cluster");

    // The MCP route's pin: disabled, missing, not strict, on another header.
    let mut v = base.clone();
    *pin(&mut v) = json!({"@type": PER_ROUTE, "disabled": true});
    fails_naming(&v, "perroute.json", "routes[0].typed_per_filter_config");

    let mut v = base.clone();
    if let Some(m) = mcp_route(&mut v).as_object_mut() {
        m.remove("typed_per_filter_config");
    }
    fails_naming(
        &v,
        "nopin.json",
        "routes[0].typed_per_filter_config: missing: the stateful_session",
    );

    let mut v = base.clone();
    let i = route_at(&mut v, "/mcp/");
    if let Some(m) = routes(&mut v)[i].as_object_mut() {
        m.remove("typed_per_filter_config");
    }
    fails_naming(
        &v,
        "noslashpin.json",
        &format!("routes[{i}].typed_per_filter_config: missing"),
    );

    let mut v = base.clone();
    let name = stateful_name(&mut v);
    pin(&mut v)["stateful_session"]["strict"] = Value::from(false);
    fails_naming(
        &v,
        "pinloose.json",
        &format!("routes[0].typed_per_filter_config[\"{name}\"].stateful_session.strict"),
    );

    let mut v = base.clone();
    pin(&mut v)["stateful_session"]["session_state"]["typed_config"]["name"] =
        Value::from("x-other");
    fails_naming(
        &v,
        "pinheader.json",
        "stateful_session.session_state.typed_config.name: must be the plugin's owner_header",
    );

    let mut v = base.clone();
    if let Some(m) = pin(&mut v).as_object_mut() {
        m.remove("stateful_session");
    }
    fails_naming(
        &v,
        "pinempty.json",
        "stateful_session: missing: the strict pin",
    );

    // Defence in depth: warnings, still exit 0, naming the field.
    let mut v = base.clone();
    drop_filter(&mut v, HEADER_MUTATION);
    passes_warning(
        &v,
        "nomutation.json",
        "static_resources.listeners[0].filter_chains[0].filters[0].typed_config.http_filters: \
         no header_mutation removes \"x-mcp-owner\" from responses",
    );

    let mut v = base.clone();
    let (h, s) = (
        filter_at(&mut v, HEADER_MUTATION),
        filter_at(&mut v, STATEFUL),
    );
    if let Some(fs) = hcm(&mut v)["http_filters"].as_array_mut() {
        let m = fs.remove(h);
        fs.insert(s, m);
    }
    let h = filter_at(&mut v, HEADER_MUTATION);
    passes_warning(
        &v,
        "latemutation.json",
        &format!("typed_config.http_filters[{h}]: this header_mutation comes after"),
    );

    for (key, bad) in [
        ("normalize_path", json!(false)),
        ("merge_slashes", json!(false)),
        ("path_with_escaped_slashes_action", json!("KEEP_UNCHANGED")),
    ] {
        let mut v = base.clone();
        hcm(&mut v)[key] = bad;
        passes_warning(
            &v,
            &format!("{key}.json"),
            &format!("typed_config.{key}: should be"),
        );
    }
}

#[test]
fn a_strict_pin_in_the_filter_itself_passes_and_is_checked() {
    // The other shape (Envoy Gateway's): the pin in the stateful_session filter, every route
    // pinned, no per-route config.
    let mut v = yaml("envoy/envoy.yaml");
    let state = pin(&mut v)["stateful_session"].clone();
    let s = filter_at(&mut v, STATEFUL);
    hcm(&mut v)["http_filters"][s]["typed_config"] = {
        let mut t = state;
        t["@type"] = Value::from(STATEFUL);
        t
    };
    if let Some(rs) = routes(&mut v).as_array_mut() {
        for r in rs {
            if let Some(m) = r.as_object_mut() {
                m.remove("typed_per_filter_config");
            }
        }
    }
    let (code, out) = run(&["check-config", &write("filterpin.json", &v)]);
    assert_eq!(code, 0, "{out}");
    hcm(&mut v)["http_filters"][s]["typed_config"]["strict"] = Value::from(false);
    fails_naming(
        &v,
        "filterpin-loose.json",
        &format!("http_filters[{s}].typed_config.strict"),
    );
}

#[test]
fn per_route_strict_session_on_the_mcp_route_and_disabled_elsewhere_passes() {
    // The filter holds the strict pin but is disabled by default, enabled on /mcp only.
    let mut v = yaml("envoy/envoy.yaml");
    let name = stateful_name(&mut v);
    let state = pin(&mut v)["stateful_session"].clone();
    let s = filter_at(&mut v, STATEFUL);
    hcm(&mut v)["http_filters"][s]["typed_config"] = {
        let mut t = state.clone();
        t["@type"] = Value::from(STATEFUL);
        t
    };
    hcm(&mut v)["http_filters"][s]["disabled"] = Value::from(true);
    let mut mcp = mcp_route(&mut v).clone();
    mcp["match"] = json!({"prefix": "/mcp"});
    mcp["typed_per_filter_config"] =
        json!({ name.as_str(): {"@type": PER_ROUTE, "stateful_session": state} });
    let mut other = mcp_route(&mut v).clone();
    other["match"] = json!({"prefix": "/"});
    other["typed_per_filter_config"] =
        json!({ name.as_str(): {"@type": PER_ROUTE, "disabled": true} });
    *routes(&mut v) = json!([mcp, other]);
    let (code, out) = run(&["check-config", &write("perroute-ok.json", &v)]);
    assert_eq!(code, 0, "{out}");
    // ...and without the per-route enable, the disabled filter is caught.
    if let Some(m) = routes(&mut v)[0].as_object_mut() {
        m.remove("typed_per_filter_config");
    }
    fails_naming(&v, "perroute-missing.json", "is disabled in http_filters");
}

/// Istio objects, as YAML text, each changed by a closure and written out.
struct Istio {
    dir: PathBuf,
    wp: String,
    ef: String,
    vs: String,
}

impl Istio {
    fn new() -> Istio {
        let read = |p: &str| std::fs::read_to_string(root().join(p)).unwrap_or_default();
        let dir = std::env::temp_dir().join(format!("mcp-guard-istio-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        Istio {
            dir,
            wp: read("deploy/istio/wasmplugin.yaml"),
            ef: read("deploy/istio/envoyfilter-stateful-session.yaml"),
            vs: read("deploy/istio/virtualservice.yaml"),
        }
    }

    fn put(&self, name: &str, text: &str) -> String {
        let p = self.dir.join(name);
        let _ = std::fs::write(&p, text);
        p.display().to_string()
    }

    /// The EnvoyFilter with its configPatches changed.
    fn ef_with(&self, f: impl FnOnce(&mut Vec<Value>)) -> String {
        let mut v: Value = serde_yaml_ng::from_str(&self.ef).unwrap_or(Value::Null);
        if let Some(ps) = v["spec"]["configPatches"].as_array_mut() {
            f(ps);
        }
        v.to_string()
    }

    /// All three together, with the given replacements; (exit code, output).
    fn run(&self, tag: &str, wp: &str, ef: &str, vs: &str) -> (i32, String) {
        let files = [
            self.put(&format!("{tag}-wp.yaml"), wp),
            self.put(&format!("{tag}-ef.yaml"), ef),
            self.put(&format!("{tag}-vs.yaml"), vs),
        ];
        let mut args = vec!["check-config"];
        args.extend(files.iter().map(String::as_str));
        run(&args)
    }

    fn fails(&self, tag: &str, wp: &str, ef: &str, vs: &str, field: &str) {
        let (code, out) = self.run(tag, wp, ef, vs);
        assert_eq!(code, 1, "{tag}: expected failure:\n{out}");
        assert!(out.contains(field), "{tag}: no mention of {field}:\n{out}");
    }

    fn warns(&self, tag: &str, ef: &str, warning: &str) {
        let (code, out) = self.run(tag, &self.wp, ef, &self.vs);
        assert_eq!(code, 0, "{tag}: expected success:\n{out}");
        assert!(
            has_warning(&out, warning),
            "{tag}: no warning {warning}:\n{out}"
        );
    }
}

fn is_type(p: &Value, ty: &str) -> bool {
    p["patch"]["value"]["typed_config"]["@type"] == ty
}

fn is_route_patch(p: &Value) -> bool {
    p["applyTo"] == "HTTP_ROUTE"
}

#[test]
fn broken_istio_objects_fail_and_name_the_field() {
    let i = Istio::new();
    let (wp, ef, vs) = (i.wp.as_str(), i.ef.as_str(), i.vs.as_str());
    let (code, out) = i.run("ok", wp, ef, vs);
    assert_eq!(code, 0, "{out}");

    i.fails(
        "retry",
        wp,
        ef,
        &vs.replace("attempts: 0", "attempts: 2"),
        "VirtualService/mcp-server.spec.http[0].retries.attempts",
    );
    i.fails(
        "loose",
        wp,
        &ef.replace("strict: true", "strict: false"),
        vs,
        "configPatches[2].patch.value.typed_per_filter_config[\"mcp_resume_guard.stateful_session\"]\
         .stateful_session.strict",
    );
    i.fails(
        "header",
        wp,
        &ef.replace("name: x-mcp-owner", "name: x-other"),
        vs,
        "stateful_session.session_state.typed_config.name",
    );
    // The HTTP_ROUTE patch gone: the stateless filter pins nothing.
    let no_route = i.ef_with(|ps| ps.retain(|p| !is_route_patch(p)));
    i.fails(
        "noroute",
        wp,
        &no_route,
        vs,
        "configPatches[1].patch.value.typed_config: has no session state, and no HTTP_ROUTE patch",
    );
    let disabled = i.ef_with(|ps| {
        for p in ps.iter_mut().filter(|p| is_route_patch(p)) {
            p["patch"]["value"]["typed_per_filter_config"]["mcp_resume_guard.stateful_session"] =
                json!({"@type": PER_ROUTE, "disabled": true});
        }
    });
    i.fails("disabled", wp, &disabled, vs, "disables the owner pin");
    let no_stateful = i.ef_with(|ps| ps.retain(|p| !is_type(p, STATEFUL)));
    i.fails(
        "nostateful",
        wp,
        &no_stateful,
        vs,
        "EnvoyFilter/mcp-resume-guard-stateful-session.spec.configPatches: missing: a strict \
         stateful_session",
    );
    let misplaced = i.ef_with(|ps| {
        for p in ps.iter_mut().filter(|p| is_type(p, STATEFUL)) {
            p["patch"]["operation"] = Value::from("INSERT_FIRST");
        }
    });
    i.fails(
        "misplaced",
        wp,
        &misplaced,
        vs,
        "configPatches[1].patch.operation",
    );
    // The VirtualService's MCP route renamed: the HTTP_ROUTE patch no longer reaches it.
    i.fails(
        "renamed",
        wp,
        ef,
        &vs.replacen("- name: mcp\n", "- name: mcp-main\n", 1),
        "VirtualService/mcp-server.spec.http[1].name: this route takes the MCP path /mcp",
    );
    for strategy in ["FAIL_CLOSE", "FAIL_RELOAD"] {
        let (code, out) = i.run(strategy, &wp.replace("FAIL_RELOAD", strategy), ef, vs);
        assert_eq!(code, 0, "{strategy}:\n{out}");
    }
    let wp_open = i.put("wp-open.yaml", &wp.replace("FAIL_RELOAD", "FAIL_OPEN"));
    let (code, out) = run(&["check-config", &wp_open]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("WasmPlugin/mcp-resume-guard.spec.failStrategy"),
        "{out}"
    );

    // Defence in depth: warnings.
    let no_mutation = i.ef_with(|ps| ps.retain(|p| !is_type(p, HEADER_MUTATION)));
    i.warns(
        "nomutation",
        &no_mutation,
        "EnvoyFilter/mcp-resume-guard-stateful-session.spec.configPatches: no header_mutation",
    );
    let late_mutation = i.ef_with(|ps| {
        for p in ps.iter_mut().filter(|p| is_type(p, HEADER_MUTATION)) {
            p["patch"]["operation"] = Value::from("INSERT_BEFORE");
        }
    });
    i.warns(
        "latemutation",
        &late_mutation,
        "configPatches[4].patch.operation: should be INSERT_FIRST",
    );
    let no_paths = i.ef_with(|ps| ps.retain(|p| p["applyTo"] != "NETWORK_FILTER"));
    i.warns(
        "nopaths",
        &no_paths,
        "no NETWORK_FILTER patch merges path normalization",
    );
    let keep = i.ef_with(|ps| {
        for p in ps.iter_mut().filter(|p| p["applyTo"] == "NETWORK_FILTER") {
            p["patch"]["value"]["typed_config"]["merge_slashes"] = Value::from(false);
        }
    });
    i.warns(
        "noslashes",
        &keep,
        "configPatches[5].patch.value.typed_config.merge_slashes: should be true",
    );
}

#[test]
fn broken_envoy_gateway_objects_fail_and_name_the_field() {
    let text = std::fs::read_to_string(root().join("deploy/envoy-gateway/mcp-resume-guard.yaml"))
        .unwrap_or_default();
    let dir = std::env::temp_dir().join(format!("mcp-guard-eg-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let check = |name: &str, text: &str| {
        let p = dir.join(name);
        let _ = std::fs::write(&p, text);
        run(&["check-config", &p.display().to_string()])
    };
    let (code, out) = check("ok.yaml", &text);
    assert_eq!(code, 0, "{out}");
    let (code, out) = check("loose.yaml", &text.replace("strict: true", "strict: false"));
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("EnvoyPatchPolicy/mcp-resume-guard.spec.jsonPatches[8].operation.value.stateful_session.strict"),
        "{out}"
    );
    let (code, out) = check(
        "open.yaml",
        &text.replace("failOpen: false", "failOpen: true"),
    );
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("spec.wasm[0].failOpen"), "{out}");
    let (code, out) = check("timeout.yaml", &text.replace("request: 0s", "request: 15s"));
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("HTTPRoute/mcp-server.spec.rules[0].timeouts.request"),
        "{out}"
    );
}

#[test]
fn keygen_prints_a_usable_key_and_every_subcommand_has_help() {
    let (code, first) = run(&["keygen", "--id", "3", "--active"]);
    assert_eq!(code, 0, "{first}");
    let k: Value = serde_json::from_str(first.trim()).unwrap_or(Value::Null);
    assert_eq!(k["id"], 3);
    assert_eq!(k["active"], true);
    let secret = k["secret"].as_str().unwrap_or("");
    assert_eq!(secret.len(), 44, "base64 of 32 bytes: {secret}");
    // The filter's parser accepts it.
    let p = json!({"ownership": {"cluster": "c"}, "keys": [k]});
    let (code, out) = run(&["check-config", &write("keygen.json", &p)]);
    assert_eq!(code, 0, "{out}");
    // Two keys differ; --config picks the next free id.
    let (_, again) = run(&["keygen"]);
    assert_ne!(again.trim(), first.trim());
    let (code, next) = run(&["keygen", "--config", "envoy/envoy.yaml"]);
    assert_eq!(code, 0, "{next}");
    assert!(next.contains("\"id\":2"), "{next}");
    let (code, dup) = run(&["keygen", "--config", "envoy/envoy.yaml", "--id", "1"]);
    assert_eq!(code, 1, "{dup}");
    for sub in [
        "keygen",
        "check-config",
        "inspect-cursor",
        "verdict",
        "mark-gone",
    ] {
        let (code, out) = run(&[sub, "--help"]);
        assert_eq!(code, 0, "{sub}: {out}");
        assert!(out.contains("Usage: mcp-guard"), "{sub}: {out}");
    }
}

/// `run` with extra environment variables (check-config reads secret_env / token_env values
/// from its own environment when they are set).
fn run_env(args: &[&str], vars: &[(&str, &str)]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_mcp-guard"))
        .args(args)
        .envs(vars.iter().copied())
        .current_dir(root())
        .output();
    match out {
        Ok(o) => (
            o.status.code().unwrap_or(-1),
            format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            ),
        ),
        Err(e) => (-1, e.to_string()),
    }
}

fn write_text(name: &str, text: &str) -> String {
    let dir = std::env::temp_dir().join(format!("mcp-guard-test-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let p = dir.join(name);
    let _ = std::fs::write(&p, text);
    p.display().to_string()
}

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_default()
}

#[test]
fn the_shipped_deployments_send_the_token_the_service_requires() {
    let wp = "deploy/istio/wasmplugin.yaml";
    let eg = "deploy/envoy-gateway/mcp-resume-guard.yaml";
    let svc = "deploy/k8s/ownership.yaml";
    for f in [wp, eg] {
        let (code, out) = run(&["check-config", f, svc]);
        assert_eq!(code, 0, "{f}:\n{out}");
        assert!(!out.contains("warning"), "{f}:\n{out}");
    }
    // Without token_env, given together with the service that requires one: refused.
    let no_token = write_text(
        "wp-no-token.yaml",
        &read(wp).replace("token_env: MCP_GUARD_OWNERSHIP_TOKEN", ""),
    );
    let (code, out) = run(&["check-config", &no_token, svc]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("WasmPlugin/mcp-resume-guard.spec.pluginConfig: ownership.token_env: missing")
            && out.contains("Deployment/mcp-ownership.spec.template.spec.containers[0]"),
        "{out}"
    );
    // Alone, the service's requirement is unknown.
    let (code, out) = run(&["check-config", &no_token]);
    assert_eq!(code, 0, "{out}");
    let eg_no_token = write_text(
        "eg-no-token.yaml",
        &read(eg).replace("token_env: MCP_GUARD_OWNERSHIP_TOKEN", ""),
    );
    let (code, out) = run(&["check-config", &eg_no_token, svc]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(
            "EnvoyExtensionPolicy/mcp-resume-guard.spec.wasm[0].config: ownership.token_env"
        ),
        "{out}"
    );
}

#[test]
fn env_vars_must_reach_the_vm() {
    // Istio: a variable the plugin names but vmConfig.env does not pass, or passes inline.
    let wp = read("deploy/istio/wasmplugin.yaml");
    let unlisted = write_text(
        "wp-unlisted.yaml",
        &wp.replace("    - name: MCP_GUARD_KEY_1\n      valueFrom: HOST\n", ""),
    );
    let (code, out) = run(&["check-config", &unlisted]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("WasmPlugin/mcp-resume-guard.spec.vmConfig.env: missing MCP_GUARD_KEY_1")
            && out.contains("keys[0].secret_env"),
        "{out}"
    );
    let inline = write_text(
        "wp-inline.yaml",
        &wp.replace(
            "    - name: MCP_GUARD_KEY_1\n      valueFrom: HOST\n",
            "    - name: MCP_GUARD_KEY_1\n      value: ja4ge+hsvYqGv+f0Zcw23So/A0PrUrPK5aYHrBCNJ2U=\n",
        ),
    );
    let (code, out) = run(&["check-config", &inline]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("spec.vmConfig.env: MCP_GUARD_KEY_1") && out.contains("literal value"),
        "{out}"
    );
    // Envoy Gateway: env.hostKeys.
    let eg = read("deploy/envoy-gateway/mcp-resume-guard.yaml").replace(
        "hostKeys: [MCP_GUARD_KEY_1, MCP_GUARD_OWNERSHIP_TOKEN]",
        "hostKeys: [MCP_GUARD_KEY_1]",
    );
    let (code, out) = run(&["check-config", &write_text("eg-unlisted.yaml", &eg)]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("spec.wasm[0].env.hostKeys: missing MCP_GUARD_OWNERSHIP_TOKEN"),
        "{out}"
    );
    // Envoy: host_env_keys; key_values is a literal.
    let mut v = yaml("envoy/envoy.yaml");
    let vm = &mut filter(&mut v, WASM)["typed_config"]["config"]["vm_config"];
    vm["environment_variables"] = json!({"host_env_keys": []});
    fails_naming(
        &v,
        "envoy-unlisted.json",
        "vm_config.environment_variables.host_env_keys: missing MCP_GUARD_KEY_1",
    );
    let vm = &mut filter(&mut v, WASM)["typed_config"]["config"]["vm_config"];
    vm["environment_variables"] = json!({"key_values": {"MCP_GUARD_KEY_1": "x"}});
    fails_naming(
        &v,
        "envoy-inline.json",
        "MCP_GUARD_KEY_1 (the plugin's keys[0].secret_env) is set here as a literal value",
    );
    // A literal key in a manifest passes, with a warning; in the plugin JSON alone, silently.
    let mut v = yaml("envoy/envoy.yaml");
    let mut p = plugin(&mut v);
    p["keys"][0] =
        json!({"id": 1, "active": true, "secret": "ja4ge+hsvYqGv+f0Zcw23So/A0PrUrPK5aYHrBCNJ2U="});
    set_plugin(&mut v, &p);
    passes_warning(
        &v,
        "envoy-literal.json",
        "keys[0].secret: a literal cursor key",
    );
    let (code, out) = run(&["check-config", &write("literal-plugin.json", &p)]);
    assert_eq!(code, 0, "{out}");
    assert!(!out.contains("warning"), "{out}");
}

#[test]
fn placeholder_and_weak_keys_are_refused_from_any_source() {
    // The values the shipped manifests carried before they took keys from Secrets.
    for (file, secret) in [
        (
            "deploy/istio/wasmplugin.yaml",
            "UkVQTEFDRS1NRTogaGVhZCAtYyAzMiAvZGV2L3VyYW5kb20gfCBiYXNlNjQ=",
        ),
        (
            "deploy/envoy-gateway/mcp-resume-guard.yaml",
            "UkVQTEFDRS1NRTogbWNwLWd1YXJkIGtleWdlbiAtLWFjdGl2ZSEhIQ==",
        ),
    ] {
        let text = read(file).replace(
            "secret_env: MCP_GUARD_KEY_1",
            &format!("secret: \"{secret}\""),
        );
        let (code, out) = run(&["check-config", &write_text("placeholder.yaml", &text)]);
        assert_eq!(code, 1, "{file}:\n{out}");
        assert!(
            out.contains("keys[0].secret: is a placeholder"),
            "{file}:\n{out}"
        );
    }
    let mut v = yaml("envoy/envoy.yaml");
    let mut p = plugin(&mut v);
    p["keys"][0] = json!({"id": 1, "active": true,
        "secret": "ZGVtby1vbmx5LWtleS1yZXBsYWNlLW1lLWluLXByb2R1Y3Rpb24hIQ=="});
    fails_naming(&p, "demo.json", "keys[0].secret: is a placeholder");
    // From the environment: a set variable is checked here like a literal.
    let f = "deploy/istio/wasmplugin.yaml";
    let weak = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="; // "0123456789abcdef" twice
    let (code, out) = run_env(&["check-config", f], &[("MCP_GUARD_KEY_1", weak)]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("keys[0].secret_env: decodes to text"), "{out}");
    let (code, out) = run_env(&["check-config", f], &[("MCP_GUARD_KEY_1", "4w==")]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("keys[0].secret_env: must decode to at least 32 bytes"),
        "{out}"
    );
    // keygen's secrets pass, whether set for check-config or for the guard.
    for _ in 0..20 {
        let (code, key) = run(&["keygen", "--secret"]);
        assert_eq!(code, 0, "{key}");
        let key = key.trim();
        assert_eq!(key.len(), 44, "{key}");
        let (code, out) = run_env(
            &["check-config", f],
            &[("MCP_GUARD_KEY_1", key), ("MCP_GUARD_OWNERSHIP_TOKEN", key)],
        );
        assert_eq!(code, 0, "{key}:\n{out}");
        assert!(!out.contains("is not set in this shell"), "{out}");
    }
}

#[test]
fn inspect_cursor_reads_the_key_from_the_environment() {
    // The commands that use the key read secret_env here, and say which variable is unset.
    let (code, out) = run_env(
        &[
            "inspect-cursor",
            "--config",
            "deploy/istio/wasmplugin.yaml",
            "x",
        ],
        &[("MCP_GUARD_OWNERSHIP_TOKEN", "t")],
    );
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("keys[0].secret_env: the environment variable MCP_GUARD_KEY_1 is not set"),
        "{out}"
    );
}
