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
    /// Recorded ids a stream keeps queued at most (about; whole records go): older ones are
    /// left out of its records, as the ownership service keeps only its newest `--max-window`
    /// per incarnation anyway. Match the service's window.
    #[serde(default = "default_record_window")]
    pub record_window: usize,
    /// Sent as `authorization: Bearer <token>` on every callout and record post.
    #[serde(default)]
    pub token: Option<String>,
    /// The token from this environment variable of the Wasm VM (Envoy's
    /// `vm_config.environment_variables.host_env_keys`) or of Envoy's process (native build),
    /// instead of a literal `token`.
    #[serde(default)]
    pub token_env: Option<String>,
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
fn default_record_window() -> usize {
    4096
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyConfig {
    /// 0..=255, carried in every cursor.
    pub id: u8,
    /// Standard base64 of at least 32 random bytes (tests and local configs only).
    #[serde(default)]
    pub secret: Option<String>,
    /// The secret from this environment variable (of the Wasm VM, or of Envoy's process for the
    /// native build), as Kubernetes mounts a Secret: never a literal in a manifest.
    #[serde(default)]
    pub secret_env: Option<String>,
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
    /// How long a continuation waits for its owner's response headers (and, when a replay is
    /// expected, for its first replayed event, the headers held meanwhile) before the guard
    /// answers it itself (`owner_busy`): a hung or stalled owner must not hang the client.
    #[serde(default = "default_continuation_headers_timeout_ms")]
    pub continuation_headers_timeout_ms: u64,
    /// How long an owed replay may wait for its next recorded event once the first one came.
    /// Longer than the headers' bound: a client that stops reading holds the owner back (flow
    /// control), and that wait is no hung owner. Past it the stream is reset and recorded lost.
    #[serde(default = "default_replay_stall_timeout_ms")]
    pub replay_stall_timeout_ms: u64,
    /// SSE `retry:` (ms) the guard puts at the head of every request stream it relays, so a
    /// client whose call's stream breaks reconnects after this delay instead of its SDK's
    /// default; 0 (default) = none.
    #[serde(default)]
    pub client_retry_ms: u64,
    /// The largest SSE `retry:` (ms) a client of any stream gets: a replica's larger one
    /// is followed by this bound, so a client never waits longer to resume (and learn the
    /// outcome) than this (or `client_retry_ms`, if larger); 0 = any passes. Default 10000:
    /// generous for SEP-1699 polling servers, whose `retry:` is their poll interval.
    #[serde(default = "default_max_retry_ms")]
    pub max_retry_ms: u64,
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
fn default_continuation_headers_timeout_ms() -> u64 {
    5000
}
fn default_replay_stall_timeout_ms() -> u64 {
    30_000
}
fn default_max_retry_ms() -> u64 {
    10_000
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
    pub continuation_headers_timeout_ms: u64,
    pub replay_stall_timeout_ms: u64,
    /// The `retry:` hint for request streams (ms); `None`: off.
    pub client_retry_ms: Option<u64>,
    /// The bound on the `retry:` (ms) clients get; `None`: off.
    pub max_retry_ms: Option<u64>,
    /// The values taken from the environment (`secret_env`, `token_env`), in field order.
    pub from_env: Vec<EnvRef>,
}

/// A value the configuration takes from an environment variable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvRef {
    /// The field that names the variable, e.g. `keys[0].secret_env`.
    pub field: String,
    /// The variable, e.g. `MCP_GUARD_KEY_1`.
    pub var: String,
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

/// Looks up an environment variable (`None`: unset).
pub type EnvLookup<'a> = &'a dyn Fn(&str) -> Option<String>;

fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

impl Config {
    /// Parse and validate plugin configuration JSON; `secret_env` and `token_env` are read from
    /// the environment (the Wasm VM's, or Envoy's process for the native build).
    pub fn from_json(bytes: &[u8]) -> Result<Config, ConfigError> {
        Config::from_json_with_env(bytes, &process_env)
    }

    /// [`Config::from_json`] with the environment given (tests, check-config).
    pub fn from_json_with_env(bytes: &[u8], env: EnvLookup) -> Result<Config, ConfigError> {
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
        Config::validate_with_env(raw, env)
    }

    pub fn validate(raw: RawConfig) -> Result<Config, ConfigError> {
        Config::validate_with_env(raw, &process_env)
    }

    pub fn validate_with_env(mut raw: RawConfig, env: EnvLookup) -> Result<Config, ConfigError> {
        let mut from_env = Vec::new();
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
        if !(1..=1_000_000).contains(&o.record_window) {
            return Err(err(
                "ownership.record_window",
                "must be between 1 and 1000000",
            ));
        }
        if o.max_queue < o.max_batch {
            return Err(err(
                "ownership.max_queue",
                "must be at least ownership.max_batch",
            ));
        }
        let token = one_of(
            ("ownership.token", o.token.as_deref()),
            ("ownership.token_env", o.token_env.as_deref()),
            env,
            &mut from_env,
        )?;
        if let Some((field, t)) = &token {
            // RFC 6750 b64token: what may follow "Bearer " without quoting.
            let ok = !t.is_empty()
                && t.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-._~+/=".contains(&b));
            if !ok {
                return Err(err(
                    field.clone(),
                    "must be a non-empty bearer token (letters, digits and -._~+/=)",
                ));
            }
            if let Some(m) = placeholder(t.as_bytes()) {
                return Err(err(
                    field.clone(),
                    format!(
                        "is a placeholder (contains \"{m}\"): use the ownership service's token \
                         (head -c 32 /dev/urandom | base64)"
                    ),
                ));
            }
        }
        raw.ownership.token = token.map(|(_, t)| t);
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
        if !(100..=300_000).contains(&raw.continuation_headers_timeout_ms) {
            return Err(err(
                "continuation_headers_timeout_ms",
                "must be between 100 and 300000",
            ));
        }
        if !(100..=600_000).contains(&raw.replay_stall_timeout_ms) {
            return Err(err(
                "replay_stall_timeout_ms",
                "must be between 100 and 600000",
            ));
        }
        if raw.client_retry_ms > 60_000 {
            return Err(err("client_retry_ms", "must be between 0 (off) and 60000"));
        }
        if raw.max_retry_ms != 0 && !(1000..=600_000).contains(&raw.max_retry_ms) {
            return Err(err(
                "max_retry_ms",
                "must be 0 (off) or between 1000 and 600000",
            ));
        }
        // Never below the guard's own hint: the operator chose that wait.
        let max_retry_ms =
            (raw.max_retry_ms > 0).then_some(raw.max_retry_ms.max(raw.client_retry_ms));
        let keyring =
            keyring(&raw.keys, env, &mut from_env)?.with_legacy_macs(raw.legacy_cursor_macs);
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
            continuation_headers_timeout_ms: raw.continuation_headers_timeout_ms,
            replay_stall_timeout_ms: raw.replay_stall_timeout_ms,
            client_retry_ms: (raw.client_retry_ms > 0).then_some(raw.client_retry_ms),
            max_retry_ms,
            from_env,
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

fn keyring(
    keys: &[KeyConfig],
    env: EnvLookup,
    from_env: &mut Vec<EnvRef>,
) -> Result<Keyring, ConfigError> {
    if keys.is_empty() {
        return Err(err("keys", "must hold at least one key"));
    }
    let mut active = None;
    let mut verify = Vec::new();
    for (i, k) in keys.iter().enumerate() {
        let lit = format!("keys[{i}].secret");
        let Some((field, text)) = one_of(
            (&lit, k.secret.as_deref()),
            (&format!("keys[{i}].secret_env"), k.secret_env.as_deref()),
            env,
            from_env,
        )?
        else {
            return Err(err(
                lit,
                "missing: give secret_env (the environment variable holding the key, from a \
                 Secret) or, for tests and local configs, secret",
            ));
        };
        let secret = match base64::engine::general_purpose::STANDARD.decode(text.trim()) {
            Ok(s) => s,
            Err(e) => {
                // Only text that is no base64 is searched for words: random base64 could hold one.
                let why = match placeholder(text.as_bytes()) {
                    Some(m) => format!(
                        "is a placeholder (contains \"{m}\"): generate a key with `mcp-guard keygen`"
                    ),
                    None => format!("not standard base64: {e}"),
                };
                return Err(err(field, why));
            }
        };
        if secret.len() < MIN_SECRET_BYTES {
            return Err(err(
                field,
                format!(
                    "must decode to at least {MIN_SECRET_BYTES} bytes, got {}",
                    secret.len()
                ),
            ));
        }
        if let Some(m) = placeholder(&secret) {
            return Err(err(
                field,
                format!(
                    "is a placeholder (decodes to text containing \"{m}\"): generate a key with \
                     `mcp-guard keygen`"
                ),
            ));
        }
        if let Err(why) = check_random(&secret) {
            return Err(err(field, why.to_string()));
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

/// Exactly one of a literal and an environment variable, or neither. Returns the field the
/// value came from and the value (from the environment: trimmed, a Secret file's newline).
fn one_of(
    (lit_field, lit): (&str, Option<&str>),
    (env_field, var): (&str, Option<&str>),
    env: EnvLookup,
    from_env: &mut Vec<EnvRef>,
) -> Result<Option<(String, String)>, ConfigError> {
    match (lit, var) {
        (Some(_), Some(_)) => Err(err(
            env_field,
            format!("give either {lit_field} or {env_field}, not both"),
        )),
        (Some(v), None) => Ok(Some((lit_field.to_string(), v.to_string()))),
        (None, None) => Ok(None),
        (None, Some(var)) => {
            let name_ok = !var.is_empty()
                && !var.starts_with(|c: char| c.is_ascii_digit())
                && var.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
            if !name_ok {
                return Err(err(
                    env_field,
                    "must be an environment variable name (letters, digits and _)",
                ));
            }
            let value = env(var).map(|v| v.trim().to_string()).unwrap_or_default();
            if value.is_empty() {
                return Err(err(
                    env_field,
                    format!(
                        "the environment variable {var} is not set or empty: list it in the Wasm \
                         VM's vm_config.environment_variables.host_env_keys (Istio: vmConfig.env \
                         valueFrom HOST; Envoy Gateway: wasm env.hostKeys) and set it in Envoy's \
                         environment from a Secret"
                    ),
                ));
            }
            from_env.push(EnvRef {
                field: env_field.to_string(),
                var: var.to_string(),
            });
            Ok(Some((env_field.to_string(), value)))
        }
    }
}

/// Words that mark a value as a placeholder or a published demo value (compared in lowercase).
const PLACEHOLDERS: &[&str] = &[
    "replace-me",
    "replace_me",
    "replaceme",
    "changeme",
    "change-me",
    "change_me",
    "placeholder",
    "demo-only",
    "example",
    "insecure",
    "not-a-secret",
];

/// The placeholder word `v` contains, if any.
fn placeholder(v: &[u8]) -> Option<&'static str> {
    let lower = v.to_ascii_lowercase();
    PLACEHOLDERS
        .iter()
        .find(|p| lower.windows(p.len()).any(|w| w == p.as_bytes()))
        .copied()
}

/// Fewest distinct values among the first 32 bytes (and among their 31 successive
/// differences) a key may show. 32 uniformly random bytes show fewer with probability below
/// 1e-15 (31 differences: below 1e-15 as well).
pub const MIN_DISTINCT_BYTES: usize = 16;

/// Is this plausibly a random key (`head -c 32 /dev/urandom`, `mcp-guard keygen`)? Refused:
/// text (every byte printable ASCII or whitespace: a passphrase, a hex or base64 string, a
/// placeholder; 32 random bytes are all text with probability below 1e-13), and the first 32
/// bytes showing fewer than [`MIN_DISTINCT_BYTES`] distinct values or distinct successive
/// differences (repeats, counters, patterns).
pub fn check_random(secret: &[u8]) -> Result<(), NotRandom> {
    if secret
        .iter()
        .all(|b| (0x20..=0x7e).contains(b) || b"\t\r\n".contains(b))
    {
        return Err(NotRandom::Text);
    }
    let head = &secret[..secret.len().min(MIN_SECRET_BYTES)];
    let distinct = |it: &mut dyn Iterator<Item = u8>| {
        let mut seen = [false; 256];
        it.filter(|b| !std::mem::replace(&mut seen[usize::from(*b)], true))
            .count()
    };
    let values = distinct(&mut head.iter().copied());
    let steps = distinct(&mut head.windows(2).map(|w| w[1].wrapping_sub(w[0])));
    if values < MIN_DISTINCT_BYTES || steps < MIN_DISTINCT_BYTES {
        return Err(NotRandom::Patterned {
            bytes: head.len(),
            values,
            steps,
        });
    }
    Ok(())
}

/// Why a key is not plausibly random ([`check_random`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotRandom {
    /// Every byte is printable text.
    Text,
    /// Too few distinct values or successive differences among the first `bytes` bytes.
    Patterned {
        bytes: usize,
        values: usize,
        steps: usize,
    },
}

impl fmt::Display for NotRandom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotRandom::Text => f.write_str(
                "decodes to text, not random bytes: use the base64 of 32 random bytes \
                 (mcp-guard keygen, or head -c 32 /dev/urandom | base64)",
            ),
            NotRandom::Patterned {
                bytes,
                values,
                steps,
            } => write!(
                f,
                "does not look random: its first {bytes} bytes show {values} distinct values and \
                 {steps} distinct steps, a random key at least {MIN_DISTINCT_BYTES} of each: use \
                 the base64 of 32 random bytes (mcp-guard keygen)"
            ),
        }
    }
}

impl std::error::Error for NotRandom {}

fn is_header_name(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "17Vjr1MOFuUicxThufiY1oswS2eQj+6Y1DdNdURfwT0="; // 32 random bytes
    const OTHER: &str = "ja4ge+hsvYqGv+f0Zcw23So/A0PrUrPK5aYHrBCNJ2U=";

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

    #[test]
    fn minimal_config_gets_defaults() {
        let c = Config::from_json(json("").as_bytes()).unwrap();
        assert!(c.is_mcp_path("/mcp"));
        assert!(c.is_mcp_path("/mcp?x=1"));
        assert!(!c.is_mcp_path("/mcpx"));
        assert_eq!(c.policy.get_stream, Policy::Restart);
        assert_eq!(c.policy.request_stream, Policy::Settle);
        assert_eq!(c.reject_status, 409);
        assert_eq!(c.owner_header, "x-mcp-owner");
        assert_eq!(c.ownership.timeout_ms, 250);
        assert_eq!(c.ownership.record_window, 4096);
        assert_eq!(c.contiguity, Contiguity::Relayed);
    }

    #[test]
    fn continuation_headers_timeout_has_a_bounded_default() {
        let c = Config::from_json(json("").as_bytes());
        assert_eq!(
            c.map(|c| c.continuation_headers_timeout_ms).ok(),
            Some(5000)
        );
        let field = "continuation_headers_timeout_ms";
        assert_eq!(
            field_of(&json(r#","continuation_headers_timeout_ms":100"#)),
            "ok"
        );
        assert_eq!(
            field_of(&json(r#","continuation_headers_timeout_ms":99"#)),
            field
        );
        assert_eq!(
            field_of(&json(r#","continuation_headers_timeout_ms":300001"#)),
            field
        );
    }

    #[test]
    fn replay_stall_timeout_has_a_bounded_default() {
        let c = Config::from_json(json("").as_bytes());
        assert_eq!(c.map(|c| c.replay_stall_timeout_ms).ok(), Some(30_000));
        let field = "replay_stall_timeout_ms";
        assert_eq!(field_of(&json(r#","replay_stall_timeout_ms":100"#)), "ok");
        assert_eq!(field_of(&json(r#","replay_stall_timeout_ms":99"#)), field);
        assert_eq!(
            field_of(&json(r#","replay_stall_timeout_ms":600001"#)),
            field
        );
    }

    #[test]
    fn client_retry_hint_is_off_by_default_and_bounded() {
        let hint =
            |extra: &str| Config::from_json(json(extra).as_bytes()).map(|c| c.client_retry_ms);
        assert_eq!(hint(""), Ok(None));
        assert_eq!(hint(r#","client_retry_ms":0"#), Ok(None));
        assert_eq!(hint(r#","client_retry_ms":250"#), Ok(Some(250)));
        assert_eq!(hint(r#","client_retry_ms":60000"#), Ok(Some(60000)));
        let field = "client_retry_ms";
        assert_eq!(field_of(&json(r#","client_retry_ms":60001"#)), field);
        assert_eq!(field_of(&json(r#","client_retry_ms":-1"#)), field);
        assert_eq!(field_of(&json(r#","client_retry_ms":"250""#)), field);
    }

    #[test]
    fn retry_bound_is_on_by_default_and_never_below_the_hint() {
        let bound = |extra: &str| Config::from_json(json(extra).as_bytes()).map(|c| c.max_retry_ms);
        assert_eq!(bound(""), Ok(Some(10_000)));
        assert_eq!(bound(r#","max_retry_ms":0"#), Ok(None));
        assert_eq!(bound(r#","max_retry_ms":1000"#), Ok(Some(1000)));
        assert_eq!(bound(r#","max_retry_ms":600000"#), Ok(Some(600_000)));
        assert_eq!(bound(r#","client_retry_ms":60000"#), Ok(Some(60_000)));
        assert_eq!(
            bound(r#","client_retry_ms":2000,"max_retry_ms":1000"#),
            Ok(Some(2000))
        );
        let field = "max_retry_ms";
        assert_eq!(field_of(&json(r#","max_retry_ms":999"#)), field);
        assert_eq!(field_of(&json(r#","max_retry_ms":600001"#)), field);
        assert_eq!(field_of(&json(r#","max_retry_ms":-1"#)), field);
    }

    #[test]
    fn contiguity_takes_two_values() {
        let c = Config::from_json(json(r#","contiguity":"asserted""#).as_bytes());
        assert_eq!(c.map(|c| c.contiguity).ok(), Some(Contiguity::Asserted));
        assert_eq!(field_of(&json(r#","contiguity":"relayed""#)), "ok");
        assert_eq!(field_of(&json(r#","contiguity":"strict""#)), "contiguity");
        assert_eq!(field_of(&json(r#","contiguity":true"#)), "contiguity");
    }

    #[test]
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
            field_of(r#"{"ownership":{"cluster":"c","record_window":0},"keys":[]}"#),
            "ownership.record_window"
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

    #[test]
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

    fn with_env(s: &str, vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let env = |name: &str| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        };
        Config::from_json_with_env(s.as_bytes(), &env)
    }

    fn key_json(key: &str) -> String {
        format!(r#"{{"ownership":{{"cluster":"c"}},"keys":[{{"id":1,"active":true,{key}}}]}}"#)
    }

    fn b64(bytes: &[u8]) -> String {
        base64::engine::general_purpose::STANDARD.encode(bytes)
    }

    #[test]
    fn secrets_and_token_from_the_environment() {
        let cfg = format!(
            r#"{{"ownership":{{"cluster":"c","token_env":"TOKEN"}},"keys":[{{"id":1,"active":true,"secret_env":"KEY_1"}},{{"id":2,"secret":"{OTHER}"}}]}}"#
        );
        // A Secret mounted as an env var may end in a newline.
        let c = with_env(
            &cfg,
            &[("KEY_1", &format!("{SECRET}\n")), ("TOKEN", "t0k.en")],
        );
        let c = c.unwrap();
        assert_eq!(
            c.ownership_authorization().as_deref(),
            Some("Bearer t0k.en")
        );
        let refs: Vec<(&str, &str)> = c
            .from_env
            .iter()
            .map(|r| (r.field.as_str(), r.var.as_str()))
            .collect();
        assert_eq!(
            refs,
            [
                ("ownership.token_env", "TOKEN"),
                ("keys[0].secret_env", "KEY_1")
            ]
        );
        // Unset or empty: the field and the variable are named.
        for vars in [
            &[("TOKEN", "t")][..],
            &[("TOKEN", "t"), ("KEY_1", " \n")][..],
        ] {
            match with_env(&cfg, vars) {
                Err(e) => {
                    assert_eq!(e.field, "keys[0].secret_env");
                    assert!(e.message.contains("KEY_1 is not set"), "{e}");
                }
                Ok(_) => panic!("an unset key variable must be refused"),
            }
        }
        let e = with_env(&cfg, &[("KEY_1", SECRET)]).err();
        assert_eq!(e.map(|e| e.field).as_deref(), Some("ownership.token_env"));
        let e = with_env(&cfg, &[("KEY_1", SECRET), ("TOKEN", "a b")]).err();
        assert_eq!(e.map(|e| e.field).as_deref(), Some("ownership.token_env"));
        // The value from the environment passes the same checks as a literal.
        let weak = b64(&[7u8; 32]);
        let e = with_env(&cfg, &[("KEY_1", &weak), ("TOKEN", "t")]).err();
        assert_eq!(e.map(|e| e.field).as_deref(), Some("keys[0].secret_env"));
        // Exactly one of literal and variable; a variable name.
        let both = key_json(&format!(r#""secret":"{SECRET}","secret_env":"KEY_1""#));
        let e = with_env(&both, &[("KEY_1", SECRET)]).err();
        assert_eq!(e.map(|e| e.field).as_deref(), Some("keys[0].secret_env"));
        let neither = key_json(r#""secret_env":null"#);
        assert_eq!(field_of(&neither), "keys[0].secret");
        let bad_name = key_json(r#""secret_env":"MY-KEY""#);
        assert_eq!(field_of(&bad_name), "keys[0].secret_env");
        let both_tokens = format!(
            r#"{{"ownership":{{"cluster":"c","token":"a","token_env":"T"}},"keys":[{{"id":1,"active":true,"secret":"{SECRET}"}}]}}"#
        );
        assert_eq!(
            with_env(&both_tokens, &[("T", "b")])
                .err()
                .map(|e| e.field)
                .as_deref(),
            Some("ownership.token_env")
        );
    }

    #[test]
    fn placeholder_and_weak_keys_are_refused() {
        let refused = |secret: &str| match Config::from_json(
            key_json(&format!(r#""secret":"{secret}""#)).as_bytes(),
        ) {
            Ok(_) => panic!("{secret} must be refused"),
            Err(e) => {
                assert_eq!(e.field, "keys[0].secret", "{e}");
                e.message
            }
        };
        // What the repository's manifests and docs shipped before keys came from Secrets.
        for shipped in [
            "UkVQTEFDRS1NRTogaGVhZCAtYyAzMiAvZGV2L3VyYW5kb20gfCBiYXNlNjQ=",
            "UkVQTEFDRS1NRTogbWNwLWd1YXJkIGtleWdlbiAtLWFjdGl2ZSEhIQ==",
            "ZGVtby1vbmx5LWtleS1yZXBsYWNlLW1lLWluLXByb2R1Y3Rpb24hIQ==",
        ] {
            assert!(refused(shipped).contains("placeholder"));
        }
        assert!(refused("REPLACE-ME").contains("placeholder"));
        assert!(refused("<base64 of 32 random bytes>").contains("not standard base64"));
        // Text: a passphrase, hex, the old test keys.
        assert!(refused("MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=").contains("text"));
        assert!(refused(&b64(b"e2e-test-key-0123456789abcdef-0123456789")).contains("text"));
        // Repeats, counters, short patterns.
        assert!(refused(&b64(&[0xc1; 32])).contains("does not look random"));
        assert!(refused(&b64(&[0u8; 32])).contains("does not look random"));
        let counter: Vec<u8> = (0..32u8)
            .map(|i| i.wrapping_mul(37).wrapping_add(200))
            .collect();
        assert!(refused(&b64(&counter)).contains("1 distinct steps"));
        let pattern: Vec<u8> = (0..32u8)
            .map(|i| [0x90, 0x13, 0xee, 0x07][usize::from(i % 4)])
            .collect();
        assert!(refused(&b64(&pattern)).contains("does not look random"));
        // Random keys pass, 32 bytes or longer.
        assert_eq!(field_of(&key_json(&format!(r#""secret":"{OTHER}""#))), "ok");
        let dec = |k: &str| {
            base64::engine::general_purpose::STANDARD
                .decode(k)
                .unwrap_or_default()
        };
        let long = b64(&[dec(SECRET), dec(OTHER)].concat());
        assert_eq!(field_of(&key_json(&format!(r#""secret":"{long}""#))), "ok");
    }

    #[test]
    fn placeholder_tokens_are_refused() {
        let with_token = |t: &str| {
            format!(
                r#"{{"ownership":{{"cluster":"c","token":"{t}"}},"keys":[{{"id":1,"active":true,"secret":"{SECRET}"}}]}}"#
            )
        };
        assert_eq!(field_of(&with_token("REPLACE-ME")), "ownership.token");
        assert_eq!(field_of(&with_token("changeme")), "ownership.token");
        assert_eq!(field_of(&with_token(OTHER)), "ok");
    }
}
