//! `check-config`: the plugin configuration exactly as the filter parses it, plus the parts of the
//! surrounding proxy configuration the guard depends on (filter chain, MCP route, ownership
//! cluster). Every message starts with the path of the field at fault.
use mcp_resume_core::config::{Config, PathMatch};
use serde_json::Value;

use crate::source::Doc;

pub const GUARD: &str = "mcp_resume_guard";
const WASM_TYPE: &str = "envoy.extensions.filters.http.wasm.v3.Wasm";
const DYNAMIC_MODULE_TYPE: &str =
    "envoy.extensions.filters.http.dynamic_modules.v3.DynamicModuleFilter";
const HCM_TYPE: &str =
    "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";
const STATEFUL_TYPE: &str = "envoy.extensions.filters.http.stateful_session.v3.StatefulSession";
const STATEFUL_PER_ROUTE: &str =
    "envoy.extensions.filters.http.stateful_session.v3.StatefulSessionPerRoute";
const HEADER_STATE_TYPE: &str =
    "envoy.extensions.http.stateful_session.header.v3.HeaderBasedSessionState";
const ROUTER_TYPE: &str = "envoy.extensions.filters.http.router.v3.Router";
const CLUSTER_TYPE: &str = "envoy.config.cluster.v3.Cluster";
const HEADER_MUTATION_TYPE: &str =
    "envoy.extensions.filters.http.header_mutation.v3.HeaderMutation";

#[derive(Debug, Default)]
pub struct Report {
    pub errors: Vec<String>,
    pub warnings: Vec<String>,
    pub notes: Vec<String>,
    /// Validated plugin configurations found, with where they came from.
    pub configs: Vec<(String, Config)>,
    /// Read `secret_env` / `token_env` from this process's environment and refuse unset ones
    /// (commands that use the keys). Otherwise (check-config) an unset variable gets a
    /// stand-in value and a note: the guard's environment is not this shell's.
    pub real_env: bool,
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

    /// Parse a plugin configuration with the filter's own parser, then check that every
    /// variable it reads (`secret_env`, `token_env`) reaches the guard, and warn about literal
    /// secrets in a manifest.
    fn plugin(&mut self, field: &str, json: &str, scope: EnvScope) -> Option<usize> {
        let unset = std::cell::RefCell::new(Vec::new());
        let real_env = self.real_env;
        let env = |name: &str| {
            let v = std::env::var(name).ok().filter(|v| !v.trim().is_empty());
            if v.is_none() && !real_env {
                unset.borrow_mut().push(name.to_string());
                return Some(STAND_IN.to_string());
            }
            v
        };
        let parsed = Config::from_json_with_env(json.as_bytes(), &env);
        for var in unset.into_inner() {
            self.note(format!(
                "{field}: {var} is not set in this shell: its value is checked where the guard \
                 runs (set it here to check it with check-config)"
            ));
        }
        match parsed {
            Ok(c) => {
                self.env_scope(field, &c, json, &scope);
                self.configs.push((field.to_string(), c));
                Some(self.configs.len() - 1)
            }
            Err(e) => {
                self.error(field, e.to_string());
                None
            }
        }
    }

    fn env_scope(&mut self, field: &str, c: &Config, json: &str, scope: &EnvScope) {
        let EnvScope::Host { at, host, inline } = scope else {
            return;
        };
        for r in &c.from_env {
            let var = &r.var;
            if inline.contains(var) {
                self.error(
                    at,
                    format!(
                        "{var} (the plugin's {}) is set here as a literal value: a secret in a \
                         manifest; pass it from the host instead (Envoy: host_env_keys; Istio: \
                         valueFrom: HOST) and set it in the proxy's environment from a Secret",
                        r.field
                    ),
                );
            } else if !host.contains(var) {
                self.error(
                    at,
                    format!(
                        "missing {var}: the plugin's {} names it, but only the variables listed \
                         here reach the guard's VM, so it refuses to load",
                        r.field
                    ),
                );
            }
        }
        // Literal secrets: fine in a test's plugin JSON, not in a manifest others can read.
        let v: Value = serde_json::from_str(json).unwrap_or(Value::Null);
        for (i, k) in arr(&v, "keys").iter().enumerate() {
            if k.get("secret").is_some() {
                self.warn(
                    format!("{field}: keys[{i}].secret"),
                    "a literal cursor key in a manifest: whoever reads it can forge cursors; use \
                     secret_env (an env var set from a Secret)",
                );
            }
        }
        if v.pointer("/ownership/token").is_some() {
            self.warn(
                format!("{field}: ownership.token"),
                "a literal token in a manifest: use token_env (an env var set from a Secret)",
            );
        }
    }

    /// The request paths the MCP routes must cover: an exact `mcp_paths` entry with and without
    /// one trailing slash (the guard takes both), a prefix as it is.
    fn mcp_paths(&self, idx: Option<usize>) -> Vec<String> {
        let paths = idx
            .and_then(|i| self.configs.get(i))
            .map(|(_, c)| c.paths.clone())
            .unwrap_or_else(|| vec![PathMatch::Exact("/mcp".into())]);
        let mut out = Vec::new();
        for p in paths {
            match p {
                PathMatch::Exact(s) if s != "/" => {
                    let slash = format!("{s}/");
                    out.push(s);
                    out.push(slash);
                }
                PathMatch::Exact(s) | PathMatch::Prefix(s) => out.push(s),
            }
        }
        out
    }

    fn owner_header(&self, idx: Option<usize>) -> String {
        idx.and_then(|i| self.configs.get(i))
            .map(|(_, c)| c.owner_header.clone())
            .unwrap_or_else(|| "x-mcp-owner".to_string())
    }
}

/// Where the guard's `secret_env` / `token_env` variables come from.
enum EnvScope {
    /// The plugin JSON alone, or the native module (Envoy's own environment): not checked.
    Unknown,
    /// A Wasm VM that sees only the variables listed at `at`: `host` from Envoy's environment,
    /// `inline` given as literal values.
    Host {
        at: String,
        host: Vec<String>,
        inline: Vec<String>,
    },
}

fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|x| x.as_str().map(str::to_string))
        .collect()
}

/// What check-config parses an unset `secret_env` / `token_env` with: the base64 of 32 random
/// bytes, a valid key and a valid token.
const STAND_IN: &str = "ja4ge+hsvYqGv+f0Zcw23So/A0PrUrPK5aYHrBCNJ2U=";

/// Check every document of every file given together (an Istio or Envoy Gateway deployment is
/// several objects; their cross-checks use the plugin config found among them).
pub fn check(docs: &[Doc]) -> Report {
    check_with(docs, false)
}

/// [`check`]; `real_env`: see [`Report::real_env`].
pub fn check_with(docs: &[Doc], real_env: bool) -> Report {
    let mut r = Report {
        real_env,
        ..Report::default()
    };
    for d in docs {
        match d {
            Doc::Plugin(text) => {
                r.plugin("plugin config", text, EnvScope::Unknown);
            }
            Doc::Envoy(v) => envoy(v, &mut r),
            Doc::Kube { .. } => {}
        }
    }
    kube(docs, &mut r);
    ownership_token(docs, &mut r);
    if r.configs.is_empty() && r.errors.is_empty() {
        r.error(
            "(files)",
            "no mcp_resume_guard plugin configuration found (plugin JSON, Envoy Wasm filter, \
             Istio WasmPlugin or Envoy Gateway EnvoyExtensionPolicy)",
        );
    }
    r
}

/// An ownership service among the files that requires a bearer token (a container with
/// MCP_OWNERSHIP_TOKEN_FILE or --token-file): every plugin config must send one, or every
/// callout and record gets 401 and every resume is refused.
fn ownership_token(docs: &[Doc], r: &mut Report) {
    let mut service = None;
    for d in docs {
        let Doc::Kube { kind, name, value } = d else {
            continue;
        };
        let containers = value
            .pointer("/spec/template/spec/containers")
            .cloned()
            .unwrap_or(Value::Null);
        for (ci, c) in containers.as_array().into_iter().flatten().enumerate() {
            let by_env = arr(c, "env")
                .iter()
                .any(|e| str_of(e, "/name") == Some("MCP_OWNERSHIP_TOKEN_FILE"));
            let by_arg = strings(c.get("args"))
                .iter()
                .chain(strings(c.get("command")).iter())
                .any(|a| a == "--token-file" || a.starts_with("--token-file="));
            if by_env || by_arg {
                service = Some(format!("{kind}/{name}.spec.template.spec.containers[{ci}]"));
            }
        }
    }
    let Some(service) = service else {
        return;
    };
    let tokenless: Vec<String> = r
        .configs
        .iter()
        .filter(|(_, c)| c.ownership.token.is_none())
        .map(|(at, _)| at.clone())
        .collect();
    for at in tokenless {
        r.error(
            format!("{at}: ownership.token_env"),
            format!(
                "missing: the ownership service {service} requires a bearer token and this \
                 config sends none, so every callout and record gets 401 and every resume is \
                 refused; set token_env to a variable holding the service's `guard` token"
            ),
        );
    }
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

/// The guard's native build: a dynamic-module filter whose `filter_name` is the guard's.
fn is_guard_native(f: &Value) -> bool {
    let tc = f.get("typed_config").unwrap_or(&Value::Null);
    type_of(tc) == DYNAMIC_MODULE_TYPE && str_of(tc, "/filter_name") == Some(GUARD)
}

fn is_guard_wasm(f: &Value) -> bool {
    let tc = f.get("typed_config").unwrap_or(&Value::Null);
    if type_of(tc) != WASM_TYPE {
        return is_guard_native(f);
    }
    let c = tc.get("config").unwrap_or(&Value::Null);
    f.get("name").and_then(Value::as_str) == Some(GUARD)
        || str_of(c, "/name") == Some(GUARD)
        || str_of(c, "/root_id") == Some(GUARD)
        || str_of(c, "/vm_config/code/local/filename")
            .is_some_and(|p| p.ends_with("mcp_resume_guard.wasm"))
}

/// Is this HTTP filter a header_mutation that removes the owner header from responses?
fn strips_owner_on_responses(f: &Value, owner_header: &str) -> bool {
    let tc = f.get("typed_config").unwrap_or(&Value::Null);
    type_of(tc) == HEADER_MUTATION_TYPE
        && tc
            .pointer("/mutations/response_mutations")
            .and_then(Value::as_array)
            .is_some_and(|ms| {
                ms.iter().any(|m| {
                    m.get("remove")
                        .and_then(Value::as_str)
                        .is_some_and(|h| h.eq_ignore_ascii_case(owner_header))
                })
            })
}

const NO_RESPONSE_STRIP: &str = "the guard removes it from responses itself, but put a \
     header_mutation removing it (response_mutations: [remove: OWNER]) first in http_filters, so \
     it acts last on every response, whatever filter or route added it (stateful_session echoes \
     the host it chose)";

fn no_response_strip(owner_header: &str) -> String {
    format!(
        "no header_mutation removes \"{owner_header}\" from responses: {}",
        NO_RESPONSE_STRIP.replace("OWNER", owner_header)
    )
}

/// The HttpConnectionManager's path hygiene: the MCP routes (and with them the owner pin) match
/// the path Envoy routes on, the guard matches its own normalization of it; they agree only when
/// Envoy normalizes too.
fn path_hygiene(tc: &Value, at: &str, r: &mut Report) {
    for key in ["normalize_path", "merge_slashes"] {
        if tc.get(key).and_then(Value::as_bool) != Some(true) {
            r.warn(
                format!("{at}.{key}"),
                "should be true: otherwise a spelling such as \"//mcp\" or \"/a/../mcp\" is an MCP \
                 path to the guard but misses the MCP route, and with it the owner pin",
            );
        }
    }
    let esc = str_of(tc, "/path_with_escaped_slashes_action").unwrap_or("");
    if !matches!(
        esc,
        "REJECT_REQUEST" | "UNESCAPE_AND_REDIRECT" | "UNESCAPE_AND_FORWARD"
    ) {
        r.warn(
            format!("{at}.path_with_escaped_slashes_action"),
            "should be REJECT_REQUEST: a path such as \"/mcp%2F\" is no MCP path to the guard or \
             to Envoy's routes, but a replica may decode it to its MCP endpoint",
        );
    }
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
    match str_of(wasm, "/failure_policy") {
        None | Some("UNSPECIFIED" | "FAIL_CLOSED" | "FAIL_RELOAD") => {}
        Some(other) => r.error(
            format!("{gat}.typed_config.config.failure_policy"),
            format!(
                "must be FAIL_RELOAD or FAIL_CLOSED, got {other}: a guard that failed or crashed \
                 must not let cursors through unchecked"
            ),
        ),
    }
    // The plugin JSON: the Wasm filter's `configuration`, or the native build's `filter_config`.
    let scope = if is_guard_native(&filters[g]) {
        EnvScope::Unknown
    } else {
        let ev = wasm.pointer("/vm_config/environment_variables");
        EnvScope::Host {
            at: format!("{gat}.typed_config.config.vm_config.environment_variables.host_env_keys"),
            host: strings(ev.and_then(|e| e.get("host_env_keys"))),
            inline: ev
                .and_then(|e| e.get("key_values"))
                .and_then(Value::as_object)
                .map(|m| m.keys().cloned().collect())
                .unwrap_or_default(),
        }
    };
    let (conf, conf_at) = if is_guard_native(&filters[g]) {
        (
            &filters[g]["typed_config"]["filter_config"],
            "typed_config.filter_config",
        )
    } else {
        (&wasm["configuration"], "typed_config.config.configuration")
    };
    let idx = match conf.get("value").and_then(Value::as_str) {
        Some(json) => r.plugin(&format!("{gat}.{conf_at}.value"), json, scope),
        None => {
            r.error(
                format!("{gat}.{conf_at}"),
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
    // The owner header out of every response: a header_mutation that runs on responses after
    // stateful_session (before it in http_filters; the shipped configs put it first).
    let strips = filters
        .iter()
        .position(|f| strips_owner_on_responses(f, &owner_header));
    match strips {
        None => r.warn(
            format!("{at}.http_filters"),
            no_response_strip(&owner_header),
        ),
        Some(h) if stateful.is_some_and(|s| h > s) => r.warn(
            format!("{at}.http_filters[{h}]"),
            format!(
                "this header_mutation comes after the stateful_session, so on responses it acts \
                 before stateful_session may add \"{owner_header}\": put it first"
            ),
        ),
        Some(_) => {}
    }
    path_hygiene(tc, at, r);

    // The MCP routes: no retries, timeout 0s, the strict stateful_session in force.
    let Some(rc) = tc.get("route_config") else {
        r.note(format!(
            "{at}: routes come from RDS; the MCP route (no retries, timeout 0s) was not checked"
        ));
        return true;
    };
    let paths = r.mcp_paths(idx);
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
        let mut seen = Vec::new();
        for path in &paths {
            let Some(ri) = routes.iter().position(|rt| route_matches(rt, path)) else {
                r.warn(&vat, format!("no route matches the MCP path {path}"));
                continue;
            };
            if seen.contains(&ri) {
                continue;
            }
            seen.push(ri);
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
                .map(|v| {
                    let vat = rat.rsplit_once(".routes[").map_or(rat, |(v, _)| v);
                    (format!("{vat}.typed_per_filter_config[\"{name}\"]"), v)
                })
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
            } else {
                r.error(
                    format!("{pat}.stateful_session"),
                    format!("missing: the strict pin on \"{owner_header}\" for the MCP route"),
                );
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
                        "must be FAIL_RELOAD or FAIL_CLOSE: a guard that failed to load or \
                         crashed must not let cursors through unchecked",
                    );
                }
                // vmConfig.env: valueFrom HOST reads the proxy's environment; INLINE (the
                // default) is a literal value in this object.
                let env = arr(v.pointer("/spec/vmConfig").unwrap_or(&Value::Null), "env");
                let named = |host: bool| -> Vec<String> {
                    env.iter()
                        .filter(|e| (str_of(e, "/valueFrom") == Some("HOST")) == host)
                        .filter_map(|e| str_of(e, "/name").map(str::to_string))
                        .collect()
                };
                let scope = EnvScope::Host {
                    at: format!("{at}.vmConfig.env"),
                    host: named(true),
                    inline: named(false),
                };
                match v.pointer("/spec/pluginConfig") {
                    Some(pc) => {
                        idx = r.plugin(&format!("{at}.pluginConfig"), &pc.to_string(), scope)
                    }
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
                let scope = EnvScope::Host {
                    at: format!("{at}.env.hostKeys"),
                    host: strings(wasm[i].pointer("/env/hostKeys")),
                    inline: Vec::new(),
                };
                match wasm[i].get("config") {
                    Some(c) => idx = r.plugin(&format!("{at}.config"), &c.to_string(), scope),
                    None => r.error(format!("{at}.config"), "missing: the plugin configuration"),
                }
            }
            _ => {}
        }
    }
    let owner_header = r.owner_header(idx);
    let paths = r.mcp_paths(idx);
    let cluster = idx
        .and_then(|i| r.configs.get(i))
        .map(|(_, c)| c.ownership.cluster.clone());
    let has = |k: &str| objs.iter().any(|(kind, _, _)| *kind == k);

    let efs: Vec<(&str, &Value)> = objs
        .iter()
        .filter(|(kind, _, _)| *kind == "EnvoyFilter")
        .map(|(_, name, v)| (*name, *v))
        .collect();
    let pinned = if efs.is_empty() {
        None
    } else {
        istio_envoyfilters(&efs, &owner_header, r)
    };
    for (kind, name, v) in &objs {
        match *kind {
            "VirtualService" => istio_virtualservice(name, v, &paths, pinned.as_deref(), r),
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

/// A StatefulSessionPerRoute that must carry the strict pin (Istio and Envoy Gateway patches).
fn check_per_route_pin(per: &Value, pat: &str, owner_header: &str, r: &mut Report) {
    if per.get("disabled").and_then(Value::as_bool) == Some(true) {
        r.error(
            pat,
            "disables the owner pin: continuations would not reach their owner",
        );
    } else if let Some(ss) = per.get("stateful_session") {
        check_strict_header(ss, &format!("{pat}.stateful_session"), owner_header, r);
    } else {
        r.error(
            format!("{pat}.stateful_session"),
            format!("missing: the strict pin on \"{owner_header}\""),
        );
    }
}

/// One patch of an EnvoyFilter, with the path of its field.
struct Patch<'a> {
    at: String,
    v: &'a Value,
}

/// Every configPatch of every EnvoyFilter given: the strict pin, the response header removal
/// and the path hygiene may each live in any of them. Returns the names of the routes an
/// HTTP_ROUTE patch pins, when the pin is per route (None: every route is pinned, or unknown).
fn istio_envoyfilters(
    efs: &[(&str, &Value)],
    owner_header: &str,
    r: &mut Report,
) -> Option<Vec<String>> {
    let patches: Vec<Patch> = efs
        .iter()
        .flat_map(|(name, v)| {
            v.pointer("/spec/configPatches")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .enumerate()
                .map(move |(i, p)| Patch {
                    at: format!("EnvoyFilter/{name}.spec.configPatches[{i}]"),
                    v: p,
                })
        })
        .collect();
    let all = efs
        .first()
        .map(|(name, _)| format!("EnvoyFilter/{name}.spec.configPatches"))
        .unwrap_or_default();

    // Path normalization on the gateway's HttpConnectionManager.
    let hcm_patch = patches.iter().find(|p| {
        type_of(
            p.v.pointer("/patch/value/typed_config")
                .unwrap_or(&Value::Null),
        ) == HCM_TYPE
    });
    match hcm_patch {
        Some(p) => path_hygiene(
            p.v.pointer("/patch/value/typed_config")
                .unwrap_or(&Value::Null),
            &format!("{}.patch.value.typed_config", p.at),
            r,
        ),
        None => r.warn(
            &all,
            "no NETWORK_FILTER patch merges path normalization into the HttpConnectionManager \
             (normalize_path, merge_slashes, path_with_escaped_slashes_action: REJECT_REQUEST): \
             without it a spelling such as \"//mcp\" is an MCP path to the guard but misses the \
             MCP route, and with it the owner pin",
        ),
    }

    // The owner header out of every response, by a filter inserted first.
    match patches.iter().find(|p| {
        strips_owner_on_responses(
            p.v.pointer("/patch/value").unwrap_or(&Value::Null),
            owner_header,
        )
    }) {
        None => r.warn(&all, no_response_strip(owner_header)),
        Some(p) if str_of(p.v, "/patch/operation") != Some("INSERT_FIRST") => r.warn(
            format!("{}.patch.operation", p.at),
            "should be INSERT_FIRST: first in the chain, the header_mutation acts last on every \
             response",
        ),
        Some(_) => {}
    }

    // The stateful_session filter, right before the router.
    let Some(sp) = patches.iter().find(|p| {
        type_of(
            p.v.pointer("/patch/value/typed_config")
                .unwrap_or(&Value::Null),
        ) == STATEFUL_TYPE
    }) else {
        r.error(
            &all,
            format!("missing: a strict stateful_session (header \"{owner_header}\")"),
        );
        return None;
    };
    let op = str_of(sp.v, "/patch/operation").unwrap_or("");
    let sub = str_of(sp.v, "/match/listener/filterChain/filter/subFilter/name").unwrap_or("");
    if !((op == "INSERT_BEFORE" && sub == "envoy.filters.http.router")
        || (op == "INSERT_AFTER" && sub.contains(GUARD)))
    {
        r.error(
            format!("{}.patch.operation", sp.at),
            "must put the stateful_session right before envoy.filters.http.router \
             (INSERT_BEFORE, subFilter envoy.filters.http.router), after the guard",
        );
    }
    let tc =
        sp.v.pointer("/patch/value/typed_config")
            .unwrap_or(&Value::Null);
    if tc.get("session_state").is_some() {
        check_strict_header(
            tc,
            &format!("{}.patch.value.typed_config", sp.at),
            owner_header,
            r,
        );
        return None;
    }

    // No state of its own: HTTP_ROUTE patches pin the MCP routes.
    let filter = str_of(sp.v, "/patch/value/name").unwrap_or("");
    let mut routes = Some(Vec::new());
    let mut any = false;
    for p in &patches {
        let Some(per) =
            p.v.pointer("/patch/value/typed_per_filter_config")
                .and_then(|m| m.get(filter))
        else {
            continue;
        };
        any = true;
        let pat = format!("{}.patch.value.typed_per_filter_config[\"{filter}\"]", p.at);
        if str_of(p.v, "/applyTo") != Some("HTTP_ROUTE") {
            r.error(
                format!("{}.applyTo", p.at),
                "must be HTTP_ROUTE: the pin is per route",
            );
        }
        check_per_route_pin(per, &pat, owner_header, r);
        match str_of(p.v, "/match/routeConfiguration/vhost/route/name") {
            Some(n) => {
                if let Some(rs) = routes.as_mut() {
                    rs.push(n.to_string());
                }
            }
            None => routes = None,
        }
    }
    if !any {
        r.error(
            format!("{}.patch.value.typed_config", sp.at),
            format!(
                "has no session state, and no HTTP_ROUTE patch configures the strict pin \
                 (header \"{owner_header}\") for \"{filter}\" on the MCP route"
            ),
        );
        return None;
    }
    routes
}

/// Does some match of the route take every request for one of `paths` (only a `uri` condition)?
fn takes_all(matches: &[Value], paths: &[String]) -> bool {
    matches.is_empty()
        || matches.iter().any(|m| {
            let only_uri = m.as_object().is_some_and(|o| {
                o.keys()
                    .all(|k| k == "uri" || k == "ignoreUriCase" || k == "name")
            });
            only_uri && covers(std::slice::from_ref(m), paths, "uri")
        })
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

fn istio_virtualservice(
    name: &str,
    v: &Value,
    paths: &[String],
    pinned: Option<&[String]>,
    r: &mut Report,
) {
    let http = arr(&v["spec"], "http");
    // Istio takes the first http route that matches. A route that also matches on a method or
    // headers (the `initialize` rate-limit route) takes only part of the path's requests, so
    // every route that may take it, up to the first that takes all of them, must be pinned.
    if let Some(pinned) = pinned {
        for path in paths {
            let one = std::slice::from_ref(path);
            let takers = http
                .iter()
                .enumerate()
                .filter(|(_, h)| covers(&arr(h, "match"), one, "uri"));
            let mut upto = Vec::new();
            for (i, h) in takers {
                upto.push(i);
                if takes_all(&arr(h, "match"), one) {
                    break;
                }
            }
            for i in upto {
                let got = str_of(&http[i], "/name");
                if !got.is_some_and(|n| pinned.iter().any(|p| p == n)) {
                    r.error(
                        format!("VirtualService/{name}.spec.http[{i}].name"),
                        format!(
                            "this route takes the MCP path {path}, so it must be a route the \
                         EnvoyFilter's HTTP_ROUTE patch pins ({}), got {}: otherwise \
                         continuations there have no owner pin",
                            pinned.join(", "),
                            got.unwrap_or("no name")
                        ),
                    );
                }
            }
        }
    }
    for (i, h) in http.iter().enumerate() {
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
    let all = format!("EnvoyPatchPolicy/{name}.spec.jsonPatches");
    let patches = arr(&v["spec"], "jsonPatches");
    let mut stateful = false;
    let mut has_cluster = false;
    let mut strips = false;
    for (i, p) in patches.iter().enumerate() {
        let at = format!("{all}[{i}]");
        let val = p.pointer("/operation/value").unwrap_or(&Value::Null);
        strips |= strips_owner_on_responses(val, owner_header);
        let tc = val.get("typed_config").unwrap_or(&Value::Null);
        if type_of(tc) == STATEFUL_TYPE {
            stateful = true;
            let tat = format!("{at}.operation.value.typed_config");
            if tc.get("session_state").is_some() {
                check_strict_header(tc, &tat, owner_header, r);
            } else {
                eg_per_route_pin(
                    &patches,
                    &all,
                    str_of(val, "/name").unwrap_or(""),
                    &tat,
                    owner_header,
                    r,
                );
            }
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
    if !strips {
        r.warn(&all, no_response_strip(owner_header));
    }
    if let (false, Some(c)) = (has_cluster, cluster) {
        r.error(
            all,
            format!("missing: a patch adding the ownership cluster \"{c}\" (op add, path \"\")"),
        );
    }
}

/// A stateful_session with no state of its own: some patch must give a route the strict pin,
/// as `.../typed_per_filter_config/<filter>`, `.../typed_per_filter_config` or a value holding it.
fn eg_per_route_pin(
    patches: &[Value],
    all: &str,
    filter: &str,
    tat: &str,
    owner_header: &str,
    r: &mut Report,
) {
    let mut any = false;
    for (j, p) in patches.iter().enumerate() {
        let path = str_of(p, "/operation/path").unwrap_or("");
        let val = p.pointer("/operation/value").unwrap_or(&Value::Null);
        let per = if path.ends_with(&format!("/typed_per_filter_config/{filter}")) {
            Some(val)
        } else if path.ends_with("/typed_per_filter_config") {
            val.get(filter)
        } else {
            val.pointer("/typed_per_filter_config")
                .and_then(|m| m.get(filter))
        };
        if let Some(per) = per {
            any = true;
            let pat = format!("{all}[{j}].operation.value");
            check_per_route_pin(per, &pat, owner_header, r);
        }
    }
    if !any {
        r.error(
            tat,
            format!(
                "has no session state, and no patch configures the strict pin (header \
                 \"{owner_header}\") for \"{filter}\" on the MCP route"
            ),
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
