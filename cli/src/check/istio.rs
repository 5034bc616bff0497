//! Istio: the EnvoyFilter patches (strict pin, response header removal, path hygiene) and the
//! VirtualService of the MCP route. The WasmPlugin is read with the other plugin carriers.
use serde_json::Value;

use super::json::{arr, duration_secs, str_of, type_of};
use super::proxy::{
    check_per_route_pin, check_strict_header, covers, no_response_strip, path_hygiene,
    strips_owner_on_responses,
};
use super::{Report, GUARD, HCM_TYPE, STATEFUL_TYPE};

/// One patch of an EnvoyFilter, with the path of its field.
struct Patch<'a> {
    at: String,
    v: &'a Value,
}

/// Every configPatch of every EnvoyFilter given: the strict pin, the response header removal
/// and the path hygiene may each live in any of them. Returns the names of the routes an
/// HTTP_ROUTE patch pins, when the pin is per route (None: every route is pinned, or unknown).
pub(super) fn envoyfilters(
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

pub(super) fn virtualservice(
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
            let mut takers = Vec::new();
            for (i, h) in http.iter().enumerate() {
                if covers(&arr(h, "match"), one, "uri") {
                    takers.push(i);
                    if takes_all(&arr(h, "match"), one) {
                        break;
                    }
                }
            }
            for i in takers {
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
