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

fn mcp_route(v: &mut Value) -> &mut Value {
    &mut hcm(v)["route_config"]["virtual_hosts"][0]["routes"][0]
}

fn plugin(v: &mut Value) -> Value {
    let s = hcm(v)["http_filters"][0]["typed_config"]["config"]["configuration"]["value"]
        .as_str()
        .unwrap_or("{}")
        .to_string();
    serde_json::from_str(&s).unwrap_or(Value::Null)
}

fn set_plugin(v: &mut Value, p: &Value) {
    hcm(v)["http_filters"][0]["typed_config"]["config"]["configuration"]["value"] =
        Value::from(p.to_string());
}

fn fails_naming(v: &Value, name: &str, field: &str) {
    let (code, out) = run(&["check-config", &write(name, v)]);
    assert_eq!(code, 1, "{name}: expected failure, got:\n{out}");
    assert!(out.contains(field), "{name}: no mention of {field}:\n{out}");
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
    let gw = root().join("deploy/envoy-gateway");
    if gw.exists() {
        let (code, out) = run(&["check-config", "deploy/envoy-gateway/mcp-resume-guard.yaml"]);
        assert_eq!(code, 0, "envoy gateway:\n{out}");
    }
}

#[test]
fn the_plugin_json_alone_passes_and_a_short_key_fails() {
    let mut v = yaml("envoy/envoy.yaml");
    let p = plugin(&mut v);
    let (code, out) = run(&["check-config", &write("plugin.json", &p)]);
    assert_eq!(code, 0, "{out}");
    let mut short = p.clone();
    short["keys"][0]["secret"] = Value::from("c2hvcnQ=");
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
    let filters: Vec<Value> = hcm(&mut v)["http_filters"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|f| f["name"] != "envoy.filters.http.stateful_session")
        .collect();
    hcm(&mut v)["http_filters"] = Value::from(filters);
    fails_naming(
        &v,
        "nostateful.json",
        "http_filters: missing: a strict stateful_session",
    );

    let mut v = base.clone();
    let mut p = plugin(&mut v);
    p["keys"][0]["secret"] = Value::from("c2hvcnQ=");
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

    let mut v = base.clone();
    hcm(&mut v)["http_filters"][1]["typed_config"]["strict"] = Value::from(false);
    fails_naming(&v, "nostrict.json", "http_filters[1].typed_config.strict");

    let mut v = base.clone();
    if let Some(fs) = hcm(&mut v)["http_filters"].as_array_mut() {
        fs.swap(0, 1);
    }
    fails_naming(&v, "order.json", "comes before mcp_resume_guard");

    let mut v = base.clone();
    hcm(&mut v)["http_filters"][0]["typed_config"]["config"]["fail_open"] = Value::from(true);
    fails_naming(&v, "failopen.json", "config.fail_open");

    let mut v = base.clone();
    if let Some(cs) = v["static_resources"]["clusters"].as_array_mut() {
        cs.retain(|c| c["name"] != "mcp_ownership");
    }
    fails_naming(&v, "nocluster.json", "ownership.cluster");

    let mut v = base.clone();
    mcp_route(&mut v)["typed_per_filter_config"] = json!({
        "envoy.filters.http.stateful_session": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.stateful_session.v3.StatefulSessionPerRoute",
            "disabled": true
        }
    });
    fails_naming(&v, "perroute.json", "typed_per_filter_config");
}

#[test]
fn per_route_strict_session_on_the_mcp_route_and_disabled_elsewhere_passes() {
    // The shape with per-route config: the filter off by default, strict on /mcp only.
    let mut v = yaml("envoy/envoy.yaml");
    let strict = hcm(&mut v)["http_filters"][1]["typed_config"].clone();
    hcm(&mut v)["http_filters"][1]["disabled"] = Value::from(true);
    let mut mcp = mcp_route(&mut v).clone();
    mcp["match"] = json!({"path": "/mcp"});
    mcp["typed_per_filter_config"] = json!({
        "envoy.filters.http.stateful_session": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.stateful_session.v3.StatefulSessionPerRoute",
            "stateful_session": strict
        }
    });
    let mut other = mcp_route(&mut v).clone();
    other["typed_per_filter_config"] = json!({
        "envoy.filters.http.stateful_session": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.stateful_session.v3.StatefulSessionPerRoute",
            "disabled": true
        }
    });
    hcm(&mut v)["route_config"]["virtual_hosts"][0]["routes"] = json!([mcp, other]);
    let (code, out) = run(&["check-config", &write("perroute-ok.json", &v)]);
    assert_eq!(code, 0, "{out}");
    // ...and without the per-route enable, the disabled filter is caught.
    if let Some(m) = hcm(&mut v)["route_config"]["virtual_hosts"][0]["routes"][0].as_object_mut() {
        m.remove("typed_per_filter_config");
    }
    fails_naming(&v, "perroute-missing.json", "is disabled in http_filters");
}

#[test]
fn broken_istio_objects_fail_and_name_the_field() {
    let wp =
        std::fs::read_to_string(root().join("deploy/istio/wasmplugin.yaml")).unwrap_or_default();
    let vs = std::fs::read_to_string(root().join("deploy/istio/virtualservice.yaml"))
        .unwrap_or_default();
    let ef = std::fs::read_to_string(root().join("deploy/istio/envoyfilter-stateful-session.yaml"))
        .unwrap_or_default();
    let dir = std::env::temp_dir().join(format!("mcp-guard-istio-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let put = |name: &str, text: String| {
        let p = dir.join(name);
        let _ = std::fs::write(&p, text);
        p.display().to_string()
    };
    let vs_retry = put("vs.yaml", vs.replace("attempts: 0", "attempts: 2"));
    let (code, out) = run(&["check-config", &put("wp.yaml", wp.clone()), &vs_retry]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("VirtualService/mcp-server.spec.http[0].retries.attempts"),
        "{out}"
    );
    let ef_loose = put("ef.yaml", ef.replace("strict: true", "strict: false"));
    let (code, out) = run(&["check-config", &put("wp2.yaml", wp.clone()), &ef_loose]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("configPatches[0].patch.value.typed_config.strict"),
        "{out}"
    );
    let wp_open = put("wp3.yaml", wp.replace("FAIL_CLOSE", "FAIL_OPEN"));
    let (code, out) = run(&["check-config", &wp_open]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("spec.failStrategy"), "{out}");
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
