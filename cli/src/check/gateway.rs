//! Envoy Gateway: the EnvoyPatchPolicy (strict pin, response header removal, ownership
//! cluster) and the HTTPRoute of the MCP route. The EnvoyExtensionPolicy is read with the other
//! plugin carriers.
use serde_json::Value;

use super::json::{arr, duration_secs, str_of, type_of};
use super::proxy::{
    check_per_route_pin, check_strict_header, covers, no_response_strip, strips_owner_on_responses,
};
use super::{Report, CLUSTER_TYPE, STATEFUL_TYPE};

pub(super) fn patch_policy(
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
                per_route_pin(
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
fn per_route_pin(
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

pub(super) fn httproute(name: &str, v: &Value, paths: &[String], r: &mut Report) {
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
