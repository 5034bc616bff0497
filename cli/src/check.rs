//! `check-config`: the plugin configuration exactly as the filter parses it, plus the parts of the
//! surrounding proxy configuration the guard depends on (filter chain, MCP route, ownership
//! cluster). Every message starts with the path of the field at fault.
use mcp_resume_core::config::{Config, PathMatch};
use serde_json::Value;

use crate::source::Doc;

pub const GUARD: &str = "mcp_resume_guard";
const WASM_TYPE: &str = "envoy.extensions.filters.http.wasm.v3.Wasm";
const HCM_TYPE: &str =
    "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";
const STATEFUL_TYPE: &str = "envoy.extensions.filters.http.stateful_session.v3.StatefulSession";
const STATEFUL_PER_ROUTE: &str =
    "envoy.extensions.filters.http.stateful_session.v3.StatefulSessionPerRoute";
const HEADER_STATE_TYPE: &str =
    "envoy.extensions.http.stateful_session.header.v3.HeaderBasedSessionState";
const ROUTER_TYPE: &str = "envoy.extensions.filters.http.router.v3.Router";
const CLUSTER_TYPE: &str = "envoy.config.cluster.v3.Cluster";

#[derive(Debug, Default)]
pub struct Report {
    pub errors: Vec<String>,
    pub warnings: Vec<String>,
    pub notes: Vec<String>,
    /// Validated plugin configurations found, with where they came from.
    pub configs: Vec<(String, Config)>,
}

impl Report {
    fn error(&mut self, field: impl AsRef<str>, msg: impl AsRef<str>) {
        self.errors
            .push(format!("{}: {}", field.as_ref(), msg.as_ref()));
    }
    fn warn(&mut self, field: impl AsRef<str>, msg: impl AsRef<str>) {
        self.warnings
            .push(format!("{}: {}", field.as_ref(), msg.as_ref()));
    }
    fn note(&mut self, msg: impl Into<String>) {
        self.notes.push(msg.into());
    }

    /// Parse a plugin configuration with the filter's own parser.
    fn plugin(&mut self, field: &str, json: &str) -> Option<usize> {
        match Config::from_json(json.as_bytes()) {
            Ok(c) => {
                self.configs.push((field.to_string(), c));
                Some(self.configs.len() - 1)
            }
            Err(e) => {
                self.error(field, e.to_string());
                None
            }
        }
    }

    fn owner_header(&self, idx: Option<usize>) -> String {
        idx.and_then(|i| self.configs.get(i))
            .map(|(_, c)| c.owner_header.clone())
            .unwrap_or_else(|| "x-mcp-owner".to_string())
    }
}

/// Check every document of every file given together (an Istio or Envoy Gateway deployment is
/// several objects; their cross-checks use the plugin config found among them).
pub fn check(docs: &[Doc]) -> Report {
    let mut r = Report::default();
    for d in docs {
        match d {
            Doc::Plugin(text) => {
                r.plugin("plugin config", text);
            }
            Doc::Envoy(v) => envoy(v, &mut r),
            Doc::Kube { .. } => {}
        }
    }
    kube(docs, &mut r);
    if r.configs.is_empty() && r.errors.is_empty() {
        r.error(
            "(files)",
            "no mcp_resume_guard plugin configuration found (plugin JSON, Envoy Wasm filter, \
             Istio WasmPlugin or Envoy Gateway EnvoyExtensionPolicy)",
        );
    }
    r
}

// ---- small JSON helpers ------------------------------------------------------------------

fn type_of(v: &Value) -> &str {
    v.get("@type")
        .and_then(Value::as_str)
        .map(|t| t.rsplit('/').next().unwrap_or(t))
        .unwrap_or("")
}

fn arr(v: &Value, key: &str) -> Vec<Value> {
    v.get(key)
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

fn str_of<'a>(v: &'a Value, ptr: &str) -> Option<&'a str> {
    v.pointer(ptr).and_then(Value::as_str)
}

/// A protobuf Duration as Envoy or Kubernetes YAML writes it: "0s", "1.5s", "250ms", "1h" or
/// `{seconds, nanos}`. Returns seconds.
pub fn duration_secs(v: &Value) -> Option<f64> {
    if let Some(o) = v.as_object() {
        let s = o.get("seconds").and_then(Value::as_f64).unwrap_or(0.0);
        let n = o.get("nanos").and_then(Value::as_f64).unwrap_or(0.0);
        return Some(s + n / 1e9);
    }
    let s = v.as_str()?.trim();
    let units = [("ms", 0.001), ("s", 1.0), ("m", 60.0), ("h", 3600.0)];
    for (suffix, mult) in units {
        if let Some(num) = s.strip_suffix(suffix) {
            if let Ok(x) = num.parse::<f64>() {
                return Some(x * mult);
            }
        }
    }
    s.parse::<f64>().ok()
}

fn is_guard_wasm(f: &Value) -> bool {
    let tc = f.get("typed_config").unwrap_or(&Value::Null);
    if type_of(tc) != WASM_TYPE {
        return false;
    }
    let c = tc.get("config").unwrap_or(&Value::Null);
    f.get("name").and_then(Value::as_str) == Some(GUARD)
        || str_of(c, "/name") == Some(GUARD)
        || str_of(c, "/root_id") == Some(GUARD)
        || str_of(c, "/vm_config/code/local/filename")
            .is_some_and(|p| p.ends_with("mcp_resume_guard.wasm"))
}

/// What a stateful_session config says, as far as the guard cares.
fn check_strict_header(cfg: &Value, field: &str, owner_header: &str, r: &mut Report) {
    if cfg.get("strict").and_then(Value::as_bool) != Some(true) {
        r.error(
            format!("{field}.strict"),
            "must be true: without strict mode a continuation whose owner is gone is sent to \
             another replica, which then replays a stream it does not hold",
        );
    }
    let state = cfg.get("session_state").unwrap_or(&Value::Null);
    let tc = state.get("typed_config").unwrap_or(&Value::Null);
    if type_of(tc) != HEADER_STATE_TYPE {
        r.error(
            format!("{field}.session_state"),
            "must be the header-based session state (envoy.http.stateful_session.header): the \
             guard names the owner in a request header",
        );
    } else if str_of(tc, "/name") != Some(owner_header) {
        r.error(
            format!("{field}.session_state.typed_config.name"),
            format!(
                "must be the plugin's owner_header \"{owner_header}\", got {}",
                tc.get("name")
                    .map(|v| v.to_string())
                    .unwrap_or("nothing".into())
            ),
        );
    }
}

// ---- Envoy bootstrap ---------------------------------------------------------------------

fn envoy(v: &Value, r: &mut Report) {
    let mut found = false;
    for (li, l) in arr(&v["static_resources"], "listeners").iter().enumerate() {
        let mut chains: Vec<(String, Value)> = arr(l, "filter_chains")
            .into_iter()
            .enumerate()
            .map(|(ci, c)| (format!("filter_chains[{ci}]"), c))
            .collect();
        if let Some(d) = l.get("default_filter_chain") {
            chains.push(("default_filter_chain".to_string(), d.clone()));
        }
        for (cname, chain) in chains {
            for (fi, f) in arr(&chain, "filters").iter().enumerate() {
                let tc = f.get("typed_config").unwrap_or(&Value::Null);
                if type_of(tc) != HCM_TYPE {
                    continue;
                }
                let at =
                    format!("static_resources.listeners[{li}].{cname}.filters[{fi}].typed_config");
                found |= hcm(v, tc, &at, r);
            }
        }
    }
    if !found {
        r.error(
            "static_resources.listeners",
            "no http_filters entry is the mcp_resume_guard Wasm filter",
        );
    }
}

/// One HTTP connection manager; false when it has no guard (another listener).
fn hcm(root: &Value, tc: &Value, at: &str, r: &mut Report) -> bool {
    let filters = arr(tc, "http_filters");
    let Some(g) = filters.iter().position(is_guard_wasm) else {
        return false;
    };
    let gat = format!("{at}.http_filters[{g}]");
    let wasm = &filters[g]["typed_config"]["config"];
    if wasm.get("fail_open").and_then(Value::as_bool) == Some(true) {
        r.error(
            format!("{gat}.typed_config.config.fail_open"),
            "must be false: a guard that failed to load must not let cursors through unchecked",
        );
    }
    let conf = &wasm["configuration"];
    let idx = match conf.get("value").and_then(Value::as_str) {
        Some(json) => r.plugin(
            &format!("{gat}.typed_config.config.configuration.value"),
            json,
        ),
        None => {
            r.error(
                format!("{gat}.typed_config.config.configuration"),
                "missing: a google.protobuf.StringValue holding the plugin JSON",
            );
            None
        }
    };
    let owner_header = r.owner_header(idx);

    // Chain: guard -> strict header stateful_session (owner_header) -> router, router last.
    let router = filters.iter().position(|f| {
        f.get("name").and_then(Value::as_str) == Some("envoy.filters.http.router")
            || type_of(f.get("typed_config").unwrap_or(&Value::Null)) == ROUTER_TYPE
    });
    match router {
        None => r.error(format!("{at}.http_filters"), "no envoy.filters.http.router"),
        Some(ri) if ri + 1 != filters.len() => r.error(
            format!("{at}.http_filters[{ri}]"),
            "the router must be the last HTTP filter",
        ),
        Some(ri) if ri < g => r.error(gat.clone(), "mcp_resume_guard must come before the router"),
        _ => {}
    }
    let ri = router.unwrap_or(filters.len());
    // A stateful_session that pins on owner_header here, or that carries no state of its own and
    // pins only where a route configures it (the shipped configs: the MCP routes alone).
    let pins_owner = |f: &Value| {
        let tc = f.get("typed_config").unwrap_or(&Value::Null);
        type_of(tc) == STATEFUL_TYPE
            && match tc.get("session_state") {
                None => true,
                Some(_) => {
                    str_of(tc, "/session_state/typed_config/name") == Some(owner_header.as_str())
                }
            }
    };
    let after: Vec<usize> = (g + 1..ri)
        .filter(|i| filters.get(*i).is_some_and(pins_owner))
        .collect();
    let stateful = match after.first() {
        Some(&s) => Some(s),
        None => {
            if filters[..g].iter().any(pins_owner) {
                r.error(
                    format!("{at}.http_filters"),
                    format!(
                        "the stateful_session on \"{owner_header}\" comes before \
                         mcp_resume_guard: it must come after it (the guard sets the header it reads)"
                    ),
                );
            } else {
                r.error(
                    format!("{at}.http_filters"),
                    format!(
                        "missing: a strict stateful_session (header \"{owner_header}\") after \
                         mcp_resume_guard and before the router"
                    ),
                );
            }
            None
        }
    };

    // The MCP routes: no retries, timeout 0s, the strict stateful_session in force.
    let Some(rc) = tc.get("route_config") else {
        r.note(format!(
            "{at}: routes come from RDS; the MCP route (no retries, timeout 0s) was not checked"
        ));
        return true;
    };
    let paths: Vec<PathMatch> = idx
        .and_then(|i| r.configs.get(i))
        .map(|(_, c)| c.paths.clone())
        .unwrap_or_else(|| vec![PathMatch::Exact("/mcp".into())]);
    let sf = stateful.and_then(|s| {
        filters
            .get(s)
            .map(|f| (format!("{at}.http_filters[{s}].typed_config"), f.clone()))
    });
    for (vi, vh) in arr(rc, "virtual_hosts").iter().enumerate() {
        let vat = format!("{at}.route_config.virtual_hosts[{vi}]");
        if vh.get("retry_policy").is_some() {
            r.error(
                format!("{vat}.retry_policy"),
                "must not be set: a retry leaves the owner even in strict mode",
            );
        }
        let routes = arr(vh, "routes");
        for p in &paths {
            let path = match p {
                PathMatch::Exact(s) | PathMatch::Prefix(s) => s.as_str(),
            };
            let Some(ri) = routes.iter().position(|rt| route_matches(rt, path)) else {
                r.warn(&vat, format!("no route matches the MCP path {path}"));
                continue;
            };
            let rat = format!("{vat}.routes[{ri}]");
            mcp_route(&routes[ri], vh, rc, &rat, sf.as_ref(), &owner_header, r);
        }
    }

    // The ownership cluster.
    if let Some((_, c)) = idx.and_then(|i| r.configs.get(i)) {
        let want = c.ownership.cluster.clone();
        let clusters = arr(&root["static_resources"], "clusters");
        if !clusters
            .iter()
            .any(|c| str_of(c, "/name") == Some(want.as_str()))
        {
            if root.pointer("/dynamic_resources/cds_config").is_some() {
                r.note(format!(
                    "clusters come from CDS: that \"{want}\" exists was not checked"
                ));
            } else {
                r.error(
                    format!("{gat}.typed_config.config.configuration.value: ownership.cluster"),
                    format!("no cluster named \"{want}\" in static_resources.clusters"),
                );
            }
        }
    }
    true
}

/// Does this route's match take a request for `path`? (Header matchers are not considered.)
fn route_matches(rt: &Value, path: &str) -> bool {
    let m = rt.get("match").unwrap_or(&Value::Null);
    if let Some(p) = m.get("prefix").and_then(Value::as_str) {
        return path.starts_with(p);
    }
    if let Some(p) = m.get("path").and_then(Value::as_str) {
        return path == p;
    }
    if let Some(p) = m.get("path_separated_prefix").and_then(Value::as_str) {
        return path == p || path.starts_with(&format!("{p}/"));
    }
    // safe_regex and path templates: assume it may match, so it gets checked.
    m.get("safe_regex").is_some() || m.get("path_match_policy").is_some()
}

fn mcp_route(
    rt: &Value,
    vh: &Value,
    rc: &Value,
    rat: &str,
    stateful: Option<&(String, Value)>,
    owner_header: &str,
    r: &mut Report,
) {
    let Some(action) = rt.get("route") else {
        return; // a direct response or redirect never reaches a replica
    };
    if action.get("retry_policy").is_some() {
        r.error(
            format!("{rat}.route.retry_policy"),
            "must not be set on the MCP route: a retry is sent to another host even in strict \
             stateful_session mode, so a continuation could replay on a replica that does not \
             own the stream",
        );
    }
    match action.get("timeout").map(duration_secs) {
        None => r.error(
            format!("{rat}.route.timeout"),
            "missing: Envoy's default (15s) cuts every SSE stream; set timeout: 0s",
        ),
        Some(Some(0.0)) => {}
        Some(_) => r.error(
            format!("{rat}.route.timeout"),
            format!(
                "must be 0s (no deadline on a streaming response), got {}",
                action["timeout"]
            ),
        ),
    }
    let removes = |v: &Value| {
        arr(v, "request_headers_to_remove")
            .iter()
            .any(|h| h.as_str() == Some(owner_header))
    };
    if !removes(rt) && !removes(vh) && !removes(rc) {
        r.warn(
            format!("{rat}.request_headers_to_remove"),
            format!("should list \"{owner_header}\" so replicas never see the owner pin"),
        );
    }
    // Which stateful_session config is in force here: per-route, per-vhost, or the filter's.
    let Some((sat, sf)) = stateful else { return };
    let name = sf.get("name").and_then(Value::as_str).unwrap_or("");
    let per = rt
        .pointer("/typed_per_filter_config")
        .and_then(|m| m.get(name))
        .map(|v| (format!("{rat}.typed_per_filter_config[\"{name}\"]"), v))
        .or_else(|| {
            vh.pointer("/typed_per_filter_config")
                .and_then(|m| m.get(name))
                .map(|v| ("virtual host typed_per_filter_config".to_string(), v))
        });
    match per {
        Some((pat, v)) => {
            // Either StatefulSessionPerRoute or a generic FilterConfig wrapping one.
            let (inner, disabled) = if type_of(v) == STATEFUL_PER_ROUTE {
                (
                    v.clone(),
                    v.get("disabled").and_then(Value::as_bool) == Some(true),
                )
            } else {
                (
                    v.get("config").cloned().unwrap_or(Value::Null),
                    v.get("disabled").and_then(Value::as_bool) == Some(true),
                )
            };
            if disabled || inner.get("disabled").and_then(Value::as_bool) == Some(true) {
                r.error(
                    pat,
                    "disables the strict stateful_session on the MCP route: continuations would \
                     not reach their owner",
                );
            } else if let Some(ss) = inner.get("stateful_session") {
                check_strict_header(ss, &format!("{pat}.stateful_session"), owner_header, r);
            } else if type_of(&inner) == STATEFUL_TYPE {
                check_strict_header(&inner, &pat, owner_header, r);
            }
        }
        None => {
            if sf.get("disabled").and_then(Value::as_bool) == Some(true) {
                r.error(
                    format!("{rat}.typed_per_filter_config"),
                    format!(
                        "the stateful_session \"{name}\" is disabled in http_filters and this \
                         MCP route does not enable it"
                    ),
                );
            } else {
                let tc = sf.get("typed_config").unwrap_or(&Value::Null);
                if tc.get("session_state").is_none() {
                    r.error(
                        format!("{rat}.typed_per_filter_config"),
                        format!(
                            "missing: the stateful_session \"{name}\" has no session state of its \
                             own, so this MCP route must configure the strict pin on \
                             \"{owner_header}\" (StatefulSessionPerRoute)"
                        ),
                    );
                } else {
                    check_strict_header(tc, sat, owner_header, r);
                }
            }
        }
    }
}

// ---- Kubernetes objects: Istio and Envoy Gateway --------------------------------------------

fn kube(docs: &[Doc], r: &mut Report) {
    let objs: Vec<(&str, &str, &Value)> = docs
        .iter()
        .filter_map(|d| match d {
            Doc::Kube { kind, name, value } => Some((kind.as_str(), name.as_str(), value)),
            _ => None,
        })
        .collect();
    let mut idx = None;
    for (kind, name, v) in &objs {
        match *kind {
            "WasmPlugin" => {
                let at = format!("WasmPlugin/{name}.spec");
                if str_of(v, "/spec/failStrategy") == Some("FAIL_OPEN") {
                    r.error(
                        format!("{at}.failStrategy"),
                        "must be FAIL_CLOSE: a guard that failed to load must not let cursors \
                         through unchecked",
                    );
                }
                match v.pointer("/spec/pluginConfig") {
                    Some(pc) => idx = r.plugin(&format!("{at}.pluginConfig"), &pc.to_string()),
                    None => r.error(format!("{at}.pluginConfig"), "missing"),
                }
            }
            "EnvoyExtensionPolicy" => {
                let wasm = arr(&v["spec"], "wasm");
                let pick = wasm.iter().position(|w| {
                    str_of(w, "/name") == Some(GUARD) || str_of(w, "/rootID") == Some(GUARD)
                });
                let Some(i) = pick.or(if wasm.len() == 1 { Some(0) } else { None }) else {
                    continue;
                };
                let at = format!("EnvoyExtensionPolicy/{name}.spec.wasm[{i}]");
                if wasm[i].get("failOpen").and_then(Value::as_bool) == Some(true) {
                    r.error(
                        format!("{at}.failOpen"),
                        "must be false: a guard that failed must not let cursors through unchecked",
                    );
                }
                match wasm[i].get("config") {
                    Some(c) => idx = r.plugin(&format!("{at}.config"), &c.to_string()),
                    None => r.error(format!("{at}.config"), "missing: the plugin configuration"),
                }
            }
            _ => {}
        }
    }
    let owner_header = r.owner_header(idx);
    let paths: Vec<String> = idx
        .and_then(|i| r.configs.get(i))
        .map(|(_, c)| {
            c.paths
                .iter()
                .map(|p| match p {
                    PathMatch::Exact(s) | PathMatch::Prefix(s) => s.clone(),
                })
                .collect()
        })
        .unwrap_or_else(|| vec!["/mcp".to_string()]);
    let cluster = idx
        .and_then(|i| r.configs.get(i))
        .map(|(_, c)| c.ownership.cluster.clone());
    let has = |k: &str| objs.iter().any(|(kind, _, _)| *kind == k);

    for (kind, name, v) in &objs {
        match *kind {
            "EnvoyFilter" => istio_envoyfilter(name, v, &owner_header, r),
            "VirtualService" => istio_virtualservice(name, v, &paths, r),
            "EnvoyPatchPolicy" => eg_patch_policy(name, v, &owner_header, cluster.as_deref(), r),
            "HTTPRoute" => eg_httproute(name, v, &paths, r),
            "BackendTrafficPolicy" if v.pointer("/spec/retry").is_some() => {
                r.error(
                    format!("BackendTrafficPolicy/{name}.spec.retry"),
                    "must not be set for the MCP route: a retry leaves the owner",
                );
            }
            _ => {}
        }
    }
    if has("WasmPlugin") && !has("EnvoyFilter") {
        r.note(
            "Istio: give the EnvoyFilter (strict stateful_session) and the VirtualService too \
             (check-config FILE...) to check the chain and the route",
        );
    }
    if has("EnvoyExtensionPolicy") && !has("EnvoyPatchPolicy") {
        r.note(
            "Envoy Gateway: give the EnvoyPatchPolicy and HTTPRoute too to check the chain, the \
             ownership cluster and the route",
        );
    }
}

fn istio_envoyfilter(name: &str, v: &Value, owner_header: &str, r: &mut Report) {
    let patches = arr(&v["spec"], "configPatches");
    for (i, p) in patches.iter().enumerate() {
        let tc = p
            .pointer("/patch/value/typed_config")
            .unwrap_or(&Value::Null);
        if type_of(tc) != STATEFUL_TYPE {
            continue;
        }
        let at = format!("EnvoyFilter/{name}.spec.configPatches[{i}]");
        if tc.get("session_state").is_some() {
            check_strict_header(
                tc,
                &format!("{at}.patch.value.typed_config"),
                owner_header,
                r,
            );
        } else {
            // No state of its own: an HTTP_ROUTE patch must pin the MCP route.
            let filter = str_of(p, "/patch/value/name").unwrap_or("");
            let per_route = patches.iter().enumerate().find_map(|(j, q)| {
                let per = q
                    .pointer("/patch/value/typed_per_filter_config")
                    .and_then(|m| m.get(filter))?;
                Some((j, per.clone()))
            });
            match per_route {
                Some((j, per)) => match per.get("stateful_session") {
                    Some(ss) => check_strict_header(
                        ss,
                        &format!(
                            "EnvoyFilter/{name}.spec.configPatches[{j}].patch.value.\
                             typed_per_filter_config[\"{filter}\"].stateful_session"
                        ),
                        owner_header,
                        r,
                    ),
                    None => r.error(
                        format!("EnvoyFilter/{name}.spec.configPatches[{j}]"),
                        "the per-route config must carry the strict stateful_session",
                    ),
                },
                None => r.error(
                    format!("{at}.patch.value.typed_config"),
                    format!(
                        "has no session state, and no HTTP_ROUTE patch configures the strict pin \
                         (header \"{owner_header}\") for \"{filter}\" on the MCP route"
                    ),
                ),
            }
        }
        let op = str_of(p, "/patch/operation").unwrap_or("");
        let sub = str_of(p, "/match/listener/filterChain/filter/subFilter/name").unwrap_or("");
        let ok = (op == "INSERT_BEFORE" && sub == "envoy.filters.http.router")
            || (op == "INSERT_AFTER" && sub.contains(GUARD));
        if !ok {
            r.error(
                format!("{at}.patch.operation"),
                "must put the stateful_session right before envoy.filters.http.router \
                 (INSERT_BEFORE, subFilter envoy.filters.http.router), after the guard",
            );
        }
        return;
    }
    r.error(
        format!("EnvoyFilter/{name}.spec.configPatches"),
        format!("missing: a strict stateful_session (header \"{owner_header}\")"),
    );
}

fn covers(matches: &[Value], paths: &[String], uri_key: &str) -> bool {
    if matches.is_empty() {
        return true;
    }
    matches.iter().any(|m| {
        let uri = m.get(uri_key).unwrap_or(&Value::Null);
        let exact = str_of(uri, "/exact").or_else(|| {
            (str_of(uri, "/type") == Some("Exact"))
                .then(|| str_of(uri, "/value"))
                .flatten()
        });
        let prefix = str_of(uri, "/prefix").or_else(|| {
            (str_of(uri, "/type") == Some("PathPrefix"))
                .then(|| str_of(uri, "/value"))
                .flatten()
        });
        paths.iter().any(|p| match (exact, prefix) {
            (Some(e), _) => e == p,
            (_, Some(pre)) => p.starts_with(pre),
            _ => true,
        })
    })
}

fn istio_virtualservice(name: &str, v: &Value, paths: &[String], r: &mut Report) {
    for (i, h) in arr(&v["spec"], "http").iter().enumerate() {
        if !covers(&arr(h, "match"), paths, "uri") {
            continue;
        }
        let at = format!("VirtualService/{name}.spec.http[{i}]");
        match h.pointer("/retries/attempts").and_then(Value::as_i64) {
            Some(0) => {}
            Some(n) => r.error(
                format!("{at}.retries.attempts"),
                format!("must be 0 on the MCP route, got {n}: a retry leaves the owner"),
            ),
            None => r.error(
                format!("{at}.retries"),
                "missing: Istio retries twice by default; set retries: {attempts: 0}",
            ),
        }
        match h.get("timeout").map(duration_secs) {
            None | Some(Some(0.0)) => {}
            Some(_) => r.error(
                format!("{at}.timeout"),
                format!("must be 0s on the MCP route, got {}", h["timeout"]),
            ),
        }
    }
}

fn eg_patch_policy(
    name: &str,
    v: &Value,
    owner_header: &str,
    cluster: Option<&str>,
    r: &mut Report,
) {
    let mut stateful = false;
    let mut has_cluster = false;
    for (i, p) in arr(&v["spec"], "jsonPatches").iter().enumerate() {
        let at = format!("EnvoyPatchPolicy/{name}.spec.jsonPatches[{i}]");
        let val = p.pointer("/operation/value").unwrap_or(&Value::Null);
        let tc = val.get("typed_config").unwrap_or(&Value::Null);
        if type_of(tc) == STATEFUL_TYPE {
            stateful = true;
            check_strict_header(
                tc,
                &format!("{at}.operation.value.typed_config"),
                owner_header,
                r,
            );
        }
        if str_of(p, "/type").is_some_and(|t| t.ends_with(CLUSTER_TYPE))
            && str_of(p, "/operation/op") == Some("add")
            && str_of(val, "/name").is_some()
            && str_of(val, "/name") == cluster
        {
            has_cluster = true;
        }
    }
    if !stateful {
        r.error(
            format!("EnvoyPatchPolicy/{name}.spec.jsonPatches"),
            format!(
                "missing: a patch adding a strict stateful_session (header \"{owner_header}\")"
            ),
        );
    }
    if let (false, Some(c)) = (has_cluster, cluster) {
        r.error(
            format!("EnvoyPatchPolicy/{name}.spec.jsonPatches"),
            format!("missing: a patch adding the ownership cluster \"{c}\" (op add, path \"\")"),
        );
    }
}

fn eg_httproute(name: &str, v: &Value, paths: &[String], r: &mut Report) {
    for (i, rule) in arr(&v["spec"], "rules").iter().enumerate() {
        if !covers(&arr(rule, "matches"), paths, "path") {
            continue;
        }
        let at = format!("HTTPRoute/{name}.spec.rules[{i}]");
        match rule.pointer("/timeouts/request").map(duration_secs) {
            Some(Some(0.0)) => {}
            None => r.error(
                format!("{at}.timeouts.request"),
                "missing: the default route timeout (15s) cuts every SSE stream; set \"0s\"",
            ),
            Some(_) => r.error(
                format!("{at}.timeouts.request"),
                "must be \"0s\" on the MCP route (no deadline on a streaming response)",
            ),
        }
        if rule.get("retry").is_some() {
            r.error(
                format!("{at}.retry"),
                "must not be set on the MCP route: a retry leaves the owner",
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(duration_secs(&Value::from("0s")), Some(0.0));
        assert_eq!(duration_secs(&Value::from("250ms")), Some(0.25));
        assert_eq!(duration_secs(&Value::from("1h")), Some(3600.0));
        assert_eq!(duration_secs(&serde_json::json!({"seconds": 2})), Some(2.0));
        assert_eq!(duration_secs(&Value::from("x")), None);
    }
}
