//! `inspect-cursor`: verify and decode a cursor with the keys of a config, and say why the
//! guard would refuse it.
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use mcp_resume_core::config::Config;
use mcp_resume_core::cursor::{
    incarnation_hex, session_binding_and_key, CursorError, DecodedCursor, CURSOR_VERSION,
    CURSOR_VERSION_HMAC, CURSOR_VERSION_ONE_BLOCK, MAX_CURSOR_CHARS,
};
use mcp_resume_core::ownership::{Reason, StreamKind};
use serde_json::{json, Value};

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The version and key id bytes, read without verifying (to explain a refusal).
fn head_bytes(text: &str) -> (Option<u8>, Option<u8>) {
    match URL_SAFE_NO_PAD.decode(text.as_bytes()) {
        Ok(b) => (b.first().copied(), b.get(1).copied()),
        Err(_) => (None, None),
    }
}

fn explain(e: CursorError, text: &str, config: &Config) -> String {
    let (version, key) = head_bytes(text);
    let known: Vec<String> = config.keyring.key_ids().map(|k| k.to_string()).collect();
    match e {
        CursorError::TooLong => format!(
            "{} characters, longer than any cursor this guard mints ({MAX_CURSOR_CHARS})",
            text.len()
        ),
        CursorError::Malformed => "not a cursor: not unpadded base64url, or its bytes do not \
             follow the cursor layout (a legacy or replica event id, or a truncated cursor)"
            .to_string(),
        CursorError::UnknownVersion => format!(
            "version byte {} is not one this guard knows ({CURSOR_VERSION}; {CURSOR_VERSION_HMAC} and \
             {CURSOR_VERSION_ONE_BLOCK} only while legacy_cursor_macs is on)",
            version.map(|v| v.to_string()).unwrap_or("?".into())
        ),
        CursorError::UnknownKey => format!(
            "signed with key id {}, which this config does not hold (keys: {}): rotated out, or \
             minted by another deployment",
            key.map(|v| v.to_string()).unwrap_or("?".into()),
            known.join(", ")
        ),
        CursorError::BadMac => format!(
            "the tag does not verify with key {}: the cursor was edited or truncated, or minted \
             with another secret under the same key id",
            key.map(|v| v.to_string()).unwrap_or("?".into())
        ),
    }
}

fn kind_str(k: StreamKind) -> &'static str {
    match k {
        StreamKind::Get => "get",
        StreamKind::Request => "request",
    }
}

/// The decoded fields (or the refusal) as JSON; `ok` tells whether the guard would ask the
/// ownership service about it.
pub fn inspect(config: &Config, text: &str, session: Option<&str>) -> (bool, Value) {
    let text = text.trim();
    let d: DecodedCursor = match config.keyring.decode(text) {
        Ok(d) => d,
        Err(e) => {
            return (
                false,
                json!({
                    "valid": false,
                    "reason": Reason::ForeignCursor.as_str(),
                    "error": e.as_str(),
                    "why": explain(e, text, config),
                }),
            )
        }
    };
    let (version, _) = head_bytes(text);
    let mut v = json!({
        "valid": true,
        "version": version,
        "key_id": d.key_id,
        "key_active": d.key_id == config.keyring.active_id(),
        "session_binding": hex(&d.session),
        "incarnation": incarnation_hex(d.incarnation),
        "kind": kind_str(d.kind),
        "seq": d.seq,
        "replica_event_id": d.replica_event_id,
    });
    let mut ok = true;
    if let Some(sid) = session {
        let (binding, key) = session_binding_and_key(sid.as_bytes());
        let bound = binding == d.session;
        v["session_key"] = Value::from(key);
        v["bound_to_session"] = Value::from(bound);
        if !bound {
            ok = false;
            v["reason"] = Value::from(Reason::SessionMismatch.as_str());
            v["why"] = Value::from(format!(
                "authentic, but minted for another session (its binding {} is not this \
                 session's {})",
                hex(&d.session),
                hex(&binding)
            ));
        }
    }
    (ok, v)
}

/// Human-readable lines for `inspect`'s JSON.
pub fn render(v: &Value) -> String {
    let s = |k: &str| v.get(k).map(|x| x.to_string()).unwrap_or_default();
    if v["valid"] != Value::Bool(true) {
        return format!(
            "refused: {} ({})\n  why: {}\n",
            v["reason"].as_str().unwrap_or(""),
            v["error"].as_str().unwrap_or(""),
            v["why"].as_str().unwrap_or("")
        );
    }
    let mac = if v["version"] == CURSOR_VERSION {
        "BLAKE3 keyed_hash tag"
    } else if v["version"] == CURSOR_VERSION_ONE_BLOCK {
        "legacy one-block keyed SHA-256 tag"
    } else {
        "legacy HMAC-SHA256 tag"
    };
    let mut out = format!(
        "valid cursor\n  version:          {} ({mac})\n  key id:           {}{}\n  session binding:  {}\n",
        s("version"),
        s("key_id"),
        if v["key_active"] == Value::Bool(true) {
            " (the active key)"
        } else {
            " (verify-only key)"
        },
        v["session_binding"].as_str().unwrap_or("")
    );
    if let Some(b) = v.get("bound_to_session") {
        out += &format!(
            "  bound to session: {} (store key {})\n",
            if b == &Value::Bool(true) { "yes" } else { "NO" },
            v["session_key"].as_str().unwrap_or("")
        );
    }
    out += &format!(
        "  incarnation:      {}\n  kind:             {}\n  seq:              {}\n  replica event id: {}\n",
        v["incarnation"].as_str().unwrap_or(""),
        v["kind"].as_str().unwrap_or(""),
        s("seq"),
        match &v["replica_event_id"] {
            Value::String(r) => format!("{r:?}"),
            _ => "not embedded (longer than 128 bytes; the records map it)".to_string(),
        }
    );
    if let Some(why) = v.get("why").and_then(Value::as_str) {
        out += &format!(
            "refused: {}\n  why: {why}\n",
            v["reason"].as_str().unwrap_or("")
        );
    }
    out
}
