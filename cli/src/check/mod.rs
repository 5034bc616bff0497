//! `check-config`: the plugin configuration exactly as the filter parses it, plus the parts of the
//! surrounding proxy configuration the guard depends on (filter chain, MCP route, ownership
//! cluster). Every message starts with the path of the field at fault.
//!
//! Here: the report and the dispatch over the documents given. `envoy`: a plain Envoy
//! bootstrap. `istio`, `gateway`: their Kubernetes objects. `proxy`: the pieces all three
//! carry (guard filter, strict pin, header removal, path hygiene). `json`: reading fields.
use mcp_resume_core::config::{Config, PathMatch};
use serde_json::Value;

use crate::source::Doc;
use json::{arr, str_of, strings};

mod envoy;
mod gateway;
mod istio;
mod json;
mod proxy;

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
            Doc::Envoy(v) => envoy::bootstrap(v, &mut r),
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

/// Kubernetes objects: the plugin config from its carrier (Istio WasmPlugin, Envoy Gateway
/// EnvoyExtensionPolicy), then the Istio and Envoy Gateway objects checked against it.
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
        istio::envoyfilters(&efs, &owner_header, r)
    };
    for (kind, name, v) in &objs {
        match *kind {
            "VirtualService" => istio::virtualservice(name, v, &paths, pinned.as_deref(), r),
            "EnvoyPatchPolicy" => {
                gateway::patch_policy(name, v, &owner_header, cluster.as_deref(), r)
            }
            "HTTPRoute" => gateway::httproute(name, v, &paths, r),
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
