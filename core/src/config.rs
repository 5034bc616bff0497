//! Plugin configuration: parsed once, validated, typed. Every error names its field.
use crate::cursor::{Key, Keyring};
use crate::ownership::{Reason, StreamKind};
use base64::Engine;
use serde::Deserialize;
use std::fmt;

/// What the guard does with a cursor it will not honour.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Policy {
    /// Strip the cursor, forward as a new stream, and say so (header + control event).
    Restart,
    /// Answer locally with a JSON-RPC style error (`reject_status`, never 404 or 405).
    Reject,
    /// For a request stream: answer `200 text/event-stream` with the control event and a
    /// JSON-RPC error for the opening request's id, so the client's pending call settles at
    /// once. Other streams are restarted.
    Settle,
}

/// What evidence a continuation needs before its events are relayed
/// (docs/contiguity-extension.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Contiguity {
    /// The guard's own evidence: its records, `retention`, the replay check. A replica's
    /// assertion is used when present.
    #[default]
    Relayed,
    /// A continuation must start with the replica's assertion; without one it ends with the
    /// control event `unasserted` before any event is relayed.
    Asserted,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Policies {
    /// Cursor of the standalone GET stream (and cursors the guard cannot read).
    #[serde(default = "default_get_policy")]
    pub get_stream: Policy,
    /// Cursor of a request (POST response) stream: the client awaits a response that won't come.
    #[serde(default = "default_request_policy")]
    pub request_stream: Policy,
}

impl Default for Policies {
    fn default() -> Self {
        Policies {
            get_stream: default_get_policy(),
            request_stream: default_request_policy(),
        }
    }
}

fn default_get_policy() -> Policy {
    Policy::Restart
}
fn default_request_policy() -> Policy {
    Policy::Settle
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ownership {
    /// Envoy cluster of the ownership service.
    pub cluster: String,
    /// `:authority` sent on callouts.
    #[serde(default = "default_authority")]
    pub authority: String,
    /// Callout timeout; on expiry the guard fails closed (`ownership_unavailable`).
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// How long records may wait to be batched before they are sent.
    #[serde(default = "default_flush_ms")]
    pub flush_ms: u64,
    /// Send a batch at once when it holds this many records.
    #[serde(default = "default_max_batch")]
    pub max_batch: usize,
    /// Records kept while the service is unreachable; older ones are dropped (and counted).
    #[serde(default = "default_max_queue")]
    pub max_queue: usize,
    /// Sent as `authorization: Bearer <token>` on every callout and record post.
    #[serde(default)]
    pub token: Option<String>,
}

fn default_authority() -> String {
    "mcp-ownership".to_string()
}
fn default_timeout_ms() -> u64 {
    250
}
fn default_flush_ms() -> u64 {
    10
}
fn default_max_batch() -> usize {
    256
}
fn default_max_queue() -> usize {
    10_000
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyConfig {
    /// 0..=255, carried in every cursor.
    pub id: u8,
    /// Standard base64 of at least 32 random bytes.
    pub secret: String,
    /// Exactly one key signs new cursors; the others only verify (rotation).
    #[serde(default)]
    pub active: bool,
}

/// The raw JSON shape, as users write it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    /// MCP endpoint paths, matched after normalization (exact, or with one trailing slash); a
    /// trailing `*` makes a prefix.
    #[serde(default = "default_paths")]
    pub mcp_paths: Vec<String>,
    pub ownership: Ownership,
    /// Request header read by the strict `stateful_session` filter after the guard.
    #[serde(default = "default_owner_header")]
    pub owner_header: String,
    pub keys: Vec<KeyConfig>,
    #[serde(default)]
    pub policy: Policies,
    /// Status of a rejection; any 4xx but 404 (session gone) and 405 (no SSE).
    #[serde(default = "default_reject_status")]
    pub reject_status: u16,
    /// Events each replica retains per stream (ring size); 0 = unknown (no local gap check).
    #[serde(default)]
    pub retention: u64,
    /// Largest SSE event the guard holds while deciding about its id.
    #[serde(default = "default_max_hold")]
    pub max_event_hold_bytes: usize,
    /// Drop a replayed event equal to the cursor's own event (rmcp re-sends it).
    #[serde(default = "default_true")]
    pub suppress_cursor_echo: bool,
    /// Still verify cursors of MAC versions 1 and 2 (minted by earlier releases); turn off one
    /// rotation window after upgrading.
    #[serde(default = "default_true")]
    pub legacy_cursor_macs: bool,
    /// Evidence a continuation needs: `relayed` (default) or `asserted`.
    #[serde(default)]
    pub contiguity: Contiguity,
}

fn default_paths() -> Vec<String> {
    vec!["/mcp".to_string()]
}
fn default_owner_header() -> String {
    "x-mcp-owner".to_string()
}
fn default_reject_status() -> u16 {
    409
}
fn default_max_hold() -> usize {
    64 * 1024
}
fn default_true() -> bool {
    true
}

pub use crate::path::PathMatch;

/// The validated configuration the filter runs with.
#[derive(Debug)]
pub struct Config {
    pub paths: Vec<PathMatch>,
    pub ownership: Ownership,
    pub owner_header: String,
    pub keyring: Keyring,
    pub policy: Policies,
    pub reject_status: u16,
    pub retention: u64,
    pub max_event_hold_bytes: usize,
    pub suppress_cursor_echo: bool,
    pub contiguity: Contiguity,
}

/// A configuration error, naming the field at fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub field: String,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid config: {}: {}", self.field, self.message)
    }
}

impl std::error::Error for ConfigError {}

fn err(field: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError {
        field: field.into(),
        message: message.into(),
    }
}

const MIN_SECRET_BYTES: usize = 32;

impl Config {
    /// Parse and validate plugin configuration JSON.
    pub fn from_json(bytes: &[u8]) -> Result<Config, ConfigError> {
        let de = &mut serde_json::Deserializer::from_slice(bytes);
        let raw: RawConfig = serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            // An unknown key "" at the top makes the path empty: name the object instead.
            let field = if path == "." || path.is_empty() {
                "(root)".to_string()
            } else {
                path
            };
            err(field, e.into_inner().to_string())
        })?;
        Config::validate(raw)
    }

    pub fn validate(raw: RawConfig) -> Result<Config, ConfigError> {
        if raw.mcp_paths.is_empty() {
            return Err(err("mcp_paths", "must list at least one path"));
        }
        let mut paths = Vec::with_capacity(raw.mcp_paths.len());
        for (i, p) in raw.mcp_paths.iter().enumerate() {
            if !p.starts_with('/') {
                return Err(err(format!("mcp_paths[{i}]"), "must start with '/'"));
            }
            paths.push(PathMatch::parse(p));
        }
        let o = &raw.ownership;
        if o.cluster.is_empty() {
            return Err(err(
                "ownership.cluster",
                "must name the Envoy cluster of the ownership service",
            ));
        }
        if o.authority.is_empty() {
            return Err(err("ownership.authority", "must not be empty"));
        }
        if !(1..=60_000).contains(&o.timeout_ms) {
            return Err(err("ownership.timeout_ms", "must be between 1 and 60000"));
        }
        if !(1..=10_000).contains(&o.flush_ms) {
            return Err(err("ownership.flush_ms", "must be between 1 and 10000"));
        }
        if !(1..=10_000).contains(&o.max_batch) {
            return Err(err("ownership.max_batch", "must be between 1 and 10000"));
        }
        if o.max_queue < o.max_batch {
            return Err(err(
                "ownership.max_queue",
                "must be at least ownership.max_batch",
            ));
        }
        if let Some(t) = &o.token {
            // RFC 6750 b64token: what may follow "Bearer " without quoting.
            let ok = !t.is_empty()
                && t.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-._~+/=".contains(&b));
            if !ok {
                return Err(err(
                    "ownership.token",
                    "must be a non-empty bearer token (letters, digits and -._~+/=)",
                ));
            }
        }
        if !is_header_name(&raw.owner_header) {
            return Err(err("owner_header", "must be a lowercase HTTP header name"));
        }
        if !(400..=499).contains(&raw.reject_status) || matches!(raw.reject_status, 404 | 405) {
            return Err(err(
                "reject_status",
                "must be a 4xx other than 404 (session gone) and 405 (no SSE)",
            ));
        }
        if raw.max_event_hold_bytes < 1024 {
            return Err(err("max_event_hold_bytes", "must be at least 1024"));
        }
        let keyring = keyring(&raw.keys)?.with_legacy_macs(raw.legacy_cursor_macs);
        Ok(Config {
            paths,
            ownership: raw.ownership,
            owner_header: raw.owner_header,
            keyring,
            policy: raw.policy,
            reject_status: raw.reject_status,
            retention: raw.retention,
            max_event_hold_bytes: raw.max_event_hold_bytes,
            suppress_cursor_echo: raw.suppress_cursor_echo,
            contiguity: raw.contiguity,
        })
    }

    /// Is this request path an MCP endpoint? Matched after normalization ([`crate::path`]).
    pub fn is_mcp_path(&self, path: &str) -> bool {
        let path = crate::path::normalize(path);
        self.paths.iter().any(|m| m.matches(&path))
    }

    /// The `authorization` header value of ownership requests, when a token is configured.
    pub fn ownership_authorization(&self) -> Option<String> {
        self.ownership.token.as_ref().map(|t| format!("Bearer {t}"))
    }

    /// The policy for a refused cursor of this kind (`None`: the guard could not read it).
    pub fn policy_for(&self, kind: Option<StreamKind>, reason: Reason) -> Policy {
        match (kind, reason) {
            // A stripped POST keeps its body: it is always forwarded.
            (_, Reason::PostCursor) => Policy::Restart,
            (Some(StreamKind::Request), _) => self.policy.request_stream,
            _ => self.policy.get_stream,
        }
    }
}

fn keyring(keys: &[KeyConfig]) -> Result<Keyring, ConfigError> {
    if keys.is_empty() {
        return Err(err("keys", "must hold at least one key"));
    }
    let mut active = None;
    let mut verify = Vec::new();
    for (i, k) in keys.iter().enumerate() {
        let secret = base64::engine::general_purpose::STANDARD
            .decode(k.secret.trim())
            .map_err(|e| {
                err(
                    format!("keys[{i}].secret"),
                    format!("not standard base64: {e}"),
                )
            })?;
        if secret.len() < MIN_SECRET_BYTES {
            return Err(err(
                format!("keys[{i}].secret"),
                format!(
                    "must decode to at least {MIN_SECRET_BYTES} bytes, got {}",
                    secret.len()
                ),
            ));
        }
        if keys[..i].iter().any(|o| o.id == k.id) {
            return Err(err(
                format!("keys[{i}].id"),
                format!("duplicate key id {}", k.id),
            ));
        }
        let key = Key { id: k.id, secret };
        if k.active {
            if active.is_some() {
                return Err(err(
                    format!("keys[{i}].active"),
                    "only one key may be active",
                ));
            }
            active = Some(key);
        } else {
            verify.push(key);
        }
    }
    let active = active.ok_or_else(|| err("keys", "exactly one key must have \"active\": true"))?;
    Keyring::new(active, verify).map_err(|e| err("keys", e.to_string()))
}

fn is_header_name(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="; // 32 bytes

    fn json(extra: &str) -> String {
        format!(
            r#"{{"ownership":{{"cluster":"mcp_ownership"}},"keys":[{{"id":1,"secret":"{SECRET}","active":true}}]{extra}}}"#
        )
    }

    fn field_of(s: &str) -> String {
        match Config::from_json(s.as_bytes()) {
            Ok(_) => "ok".to_string(),
            Err(e) => e.field,
        }
    }

    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn minimal_config_gets_defaults() {
        let c = Config::from_json(json("").as_bytes());
        let c = match c {
            Ok(c) => c,
            Err(e) => unreachable!("{e}"),
        };
        assert!(c.is_mcp_path("/mcp"));
        assert!(c.is_mcp_path("/mcp?x=1"));
        assert!(!c.is_mcp_path("/mcpx"));
        assert_eq!(c.policy.get_stream, Policy::Restart);
        assert_eq!(c.policy.request_stream, Policy::Settle);
        assert_eq!(c.reject_status, 409);
        assert_eq!(c.owner_header, "x-mcp-owner");
        assert_eq!(c.ownership.timeout_ms, 250);
        assert_eq!(c.contiguity, Contiguity::Relayed);
    }

    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn contiguity_takes_two_values() {
        let c = Config::from_json(json(r#","contiguity":"asserted""#).as_bytes());
        assert_eq!(c.map(|c| c.contiguity).ok(), Some(Contiguity::Asserted));
        assert_eq!(field_of(&json(r#","contiguity":"relayed""#)), "ok");
        assert_eq!(field_of(&json(r#","contiguity":"strict""#)), "contiguity");
        assert_eq!(field_of(&json(r#","contiguity":true"#)), "contiguity");
    }

    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn errors_name_the_field() {
        assert_eq!(field_of(&json(r#","bogus":1"#)), "bogus");
        assert_eq!(
            field_of(r#"{"ownership":{"cluster":"c","token":"a b"},"keys":[]}"#),
            "ownership.token"
        );
        assert_eq!(field_of(&json(r#","":1"#)), "(root)");
        assert_eq!(field_of(&json(r#","policy":{"other":1}"#)), "policy.other");
        assert_eq!(field_of(&json(r#","reject_status":404"#)), "reject_status");
        assert_eq!(field_of(&json(r#","reject_status":"x""#)), "reject_status");
        assert_eq!(field_of(&json(r#","mcp_paths":["mcp"]"#)), "mcp_paths[0]");
        assert_eq!(
            field_of(&json(r#","policy":{"get_stream":"maybe"}"#)),
            "policy.get_stream"
        );
        assert_eq!(
            field_of(&json(r#","owner_header":"X Owner""#)),
            "owner_header"
        );
        assert_eq!(
            field_of(r#"{"ownership":{"cluster":"c","timeout_ms":0},"keys":[]}"#),
            "ownership.timeout_ms"
        );
        assert_eq!(
            field_of(r#"{"ownership":{"cluster":"c"},"keys":[]}"#),
            "keys"
        );
        assert_eq!(
            field_of(
                r#"{"ownership":{"cluster":"c"},"keys":[{"id":1,"secret":"c2hvcnQ=","active":true}]}"#
            ),
            "keys[0].secret"
        );
        assert_eq!(field_of(r#"{"keys":[]}"#), "(root)");
        assert_eq!(field_of("not json"), "(root)");
    }

    #[cfg_attr(not(target_arch = "wasm32"), test)]
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
    fn exactly_one_active_key() {
        let two = format!(
            r#"{{"ownership":{{"cluster":"c"}},"keys":[{{"id":1,"secret":"{SECRET}","active":true}},{{"id":2,"secret":"{SECRET}","active":true}}]}}"#
        );
        assert_eq!(field_of(&two), "keys[1].active");
        let none =
            format!(r#"{{"ownership":{{"cluster":"c"}},"keys":[{{"id":1,"secret":"{SECRET}"}}]}}"#);
        assert_eq!(field_of(&none), "keys");
        let dup = format!(
            r#"{{"ownership":{{"cluster":"c"}},"keys":[{{"id":1,"secret":"{SECRET}","active":true}},{{"id":1,"secret":"{SECRET}"}}]}}"#
        );
        assert_eq!(field_of(&dup), "keys[1].id");
    }
}
