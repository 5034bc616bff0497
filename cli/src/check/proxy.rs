//! Pieces of the Envoy configuration every deployment shape carries, however it is written:
//! the guard filter, the strict pin, the response header removal, path hygiene, route coverage.
use serde_json::Value;

use super::json::{str_of, type_of};
use super::{
    Report, DYNAMIC_MODULE_TYPE, GUARD, HEADER_MUTATION_TYPE, HEADER_STATE_TYPE, WASM_TYPE,
};

/// The guard's native build: a dynamic-module filter whose `filter_name` is the guard's.
pub(super) fn is_guard_native(f: &Value) -> bool {
    let tc = f.get("typed_config").unwrap_or(&Value::Null);
    type_of(tc) == DYNAMIC_MODULE_TYPE && str_of(tc, "/filter_name") == Some(GUARD)
}

pub(super) fn is_guard_wasm(f: &Value) -> bool {
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
pub(super) fn strips_owner_on_responses(f: &Value, owner_header: &str) -> bool {
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

pub(super) fn no_response_strip(owner_header: &str) -> String {
    format!(
        "no header_mutation removes \"{owner_header}\" from responses: {}",
        NO_RESPONSE_STRIP.replace("OWNER", owner_header)
    )
}

/// The HttpConnectionManager's path hygiene: the MCP routes (and with them the owner pin) match
/// the path Envoy routes on, the guard matches its own normalization of it; they agree only when
/// Envoy normalizes too.
pub(super) fn path_hygiene(tc: &Value, at: &str, r: &mut Report) {
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
pub(super) fn check_strict_header(cfg: &Value, field: &str, owner_header: &str, r: &mut Report) {
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

/// A StatefulSessionPerRoute that must carry the strict pin (Istio and Envoy Gateway patches).
pub(super) fn check_per_route_pin(per: &Value, pat: &str, owner_header: &str, r: &mut Report) {
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

pub(super) fn covers(matches: &[Value], paths: &[String], uri_key: &str) -> bool {
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
