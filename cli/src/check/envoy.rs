//! A plain Envoy bootstrap: the listeners' HTTP connection managers, the guard's filter, the
//! MCP routes and the ownership cluster.
use serde_json::Value;

use super::json::{arr, duration_secs, str_of, strings, type_of};
use super::proxy::{
    check_strict_header, is_guard_native, is_guard_wasm, no_response_strip, path_hygiene,
    strips_owner_on_responses,
};
use super::{EnvScope, Report, HCM_TYPE, ROUTER_TYPE, STATEFUL_PER_ROUTE, STATEFUL_TYPE};

pub(super) fn bootstrap(v: &Value, r: &mut Report) {
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
