//! Wire types shared by the filter and the ownership service (HTTP/JSON), their limits and
//! their validation (one definition, used by the guard before queueing and by the service).
use std::borrow::Cow;
use std::net::SocketAddr;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The service answers 413 above it.
pub const MAX_RECORDS_BODY_BYTES: usize = 1 << 20;
/// The service answers 400 above it.
pub const MAX_BATCH_RECORDS: usize = 10_000;
/// An entry of `Events.ids` (the recorded form).
pub const MAX_EVENT_ID_BYTES: usize = 128;
/// A full long id kept for resumption.
pub const MAX_LONG_ID_BYTES: usize = 64 * 1024;
/// Full long ids the store keeps per incarnation (the newest).
pub const LONG_IDS_KEPT: usize = 16;
pub const MAX_VERSION_BYTES: usize = 64;
/// Sequence numbers stay within JSON's exactly representable integers, which also keeps every
/// `seq + 1` far from overflow.
pub const MAX_SEQ: u64 = (1 << 53) - 1;
/// Session store keys: lowercase hex digits.
pub const SESSION_KEY_HEX: usize = 32;
/// Incarnation ids: lowercase hex digits.
pub const INCARNATION_HEX: usize = 16;

/// Which kind of SSE stream an incarnation is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StreamKind {
    /// The standalone GET stream of a session; a new one supersedes the previous one.
    Get,
    /// The SSE response to one POST (a request stream); never superseded by siblings.
    Request,
}

impl StreamKind {
    pub fn as_u8(self) -> u8 {
        match self {
            StreamKind::Get => 0,
            StreamKind::Request => 1,
        }
    }
    pub fn from_u8(b: u8) -> Option<Self> {
        match b {
            0 => Some(StreamKind::Get),
            1 => Some(StreamKind::Request),
            _ => None,
        }
    }
}

/// Why a cursor was not honoured. The names are the contract (header, control event, stats).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// Not a cursor this guard issued: bad format, unknown key, bad MAC, too long.
    ForeignCursor,
    /// A valid cursor, but bound to another session than the request's `Mcp-Session-Id`.
    SessionMismatch,
    /// The session is unknown, expired or terminated.
    SessionInactive,
    /// No incarnation owns the cursor (never recorded, or the cursor is ahead of the records).
    UnknownStream,
    /// The owner replica is gone (marked gone, or it failed the continuation).
    OwnerUnavailable,
    /// The owner's retained log does not reach back to cursor + 1.
    Gap,
    /// A newer standalone GET stream replaced the cursor's incarnation.
    Superseded,
    /// The ownership cluster did not answer usefully (timeout, reset, 5xx, garbage).
    OwnershipUnavailable,
    /// The protocol revision (2026-07-28 and later) has no resumption.
    NotResumableVersion,
    /// A POST carried a cursor; it is stripped and the body forwarded.
    PostCursor,
    /// A continuation replayed something other than the recorded next event.
    ReplayMismatch,
}

impl Reason {
    pub const ALL: [Reason; 11] = [
        Reason::ForeignCursor,
        Reason::SessionMismatch,
        Reason::SessionInactive,
        Reason::UnknownStream,
        Reason::OwnerUnavailable,
        Reason::Gap,
        Reason::Superseded,
        Reason::OwnershipUnavailable,
        Reason::NotResumableVersion,
        Reason::PostCursor,
        Reason::ReplayMismatch,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Reason::ForeignCursor => "foreign_cursor",
            Reason::SessionMismatch => "session_mismatch",
            Reason::SessionInactive => "session_inactive",
            Reason::UnknownStream => "unknown_stream",
            Reason::OwnerUnavailable => "owner_unavailable",
            Reason::Gap => "gap",
            Reason::Superseded => "superseded",
            Reason::OwnershipUnavailable => "ownership_unavailable",
            Reason::NotResumableVersion => "not_resumable_version",
            Reason::PostCursor => "post_cursor",
            Reason::ReplayMismatch => "replay_mismatch",
        }
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `POST /v1/resume`: may this cursor continue its stream?
///
/// `session` is the store key derived from the request's `Mcp-Session-Id`
/// (`cursor::session_key`), never the raw id; the guard has already checked the
/// cursor's MAC and its binding to that session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResumeQuery {
    pub session: String,
    /// 16 lowercase hex digits.
    pub incarnation: String,
    pub kind: StreamKind,
    /// The cursor's per-incarnation sequence number.
    pub seq: u64,
}

/// The service's answer to a [`ResumeQuery`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "verdict", rename_all = "snake_case", deny_unknown_fields)]
pub enum ResumeVerdict {
    Continue {
        /// `ip:port` of the replica that owns the incarnation.
        owner: String,
        /// Recorded replica event ids for seq+1 ..= head, oldest first (capped), so the guard can
        /// check the replay event by event.
        expected: Vec<String>,
        /// Recorded head sequence number of the incarnation.
        head: u64,
        /// Full replica id of the cursor's own seq, when that id was long and the store still
        /// keeps it (the last [`LONG_IDS_KEPT`] long ids of the incarnation).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        resume_id: Option<String>,
    },
    NewStream {
        reason: Reason,
    },
}

/// Why a session ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SessionEnd {
    /// DELETE answered 2xx.
    Terminated,
    /// A replica answered 404 for it.
    Expired,
}

/// One fact the guard observed on the response path. All records are idempotent upserts,
/// so batches may be retried or arrive from several guards in any order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Record {
    /// An `initialize` response carried `Mcp-Session-Id`.
    SessionOpen {
        session: String,
        version: String,
    },
    SessionEnd {
        session: String,
        why: SessionEnd,
    },
    /// An SSE response opened (or, on a continuation, continued) an incarnation.
    StreamOpen {
        session: String,
        incarnation: String,
        kind: StreamKind,
        /// `ip:port` of the replica that served it.
        owner: String,
        /// Events of this stream the replica retains (its ring size); 0 = unknown.
        retention: u64,
        /// A new standalone GET stream supersedes the session's previous GET incarnation.
        supersedes: bool,
        /// Guard clock (ms since epoch) when the stream opened; the newer GET stream wins
        /// even when records arrive out of order.
        opened_ms: u64,
    },
    /// Events relayed: seq `first_seq + i` carried replica event id `ids[i]`, in its
    /// [`recorded_id`] form.
    Events {
        session: String,
        incarnation: String,
        first_seq: u64,
        ids: Vec<String>,
        /// Full ids of those seqs whose recorded form is a digest (at most
        /// [`MAX_LONG_ID_BYTES`]; longer ones are digest-only).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        long: Vec<LongId>,
    },
    /// A continuation to this incarnation's owner failed (owner down or not in the cluster):
    /// its log is lost, so later cursors for it are `owner_unavailable` at once.
    StreamLost {
        session: String,
        incarnation: String,
    },
    /// Operator or preStop hook: this replica address is gone. Every incarnation it owned
    /// until now is lost; incarnations opened later at the same address (a new pod) are not.
    OwnerGone {
        owner: String,
    },
}

/// `POST /v1/records`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecordBatch {
    pub records: Vec<Record>,
}

/// The full replica id of one seq of an `Events` record whose recorded form is a digest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LongId {
    pub seq: u64,
    pub id: String,
}

/// `POST /v1/records` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordAck {
    pub applied: usize,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rejected: Vec<RejectedRecord>,
}

/// A record of a batch that was not applied, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RejectedRecord {
    pub index: usize,
    /// `bad_field`.
    pub error: String,
    /// `records[3].ids[0]: …`.
    pub detail: String,
}

/// A field problem in one record: `field` is relative to the record, e.g. "ids[3]" or "version".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    pub field: String,
    pub detail: String,
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.detail)
    }
}

/// Length of a digest recorded form: `~` + base64url-nopad of 32 bytes.
const DIGEST_FORM_BYTES: usize = 44;

/// The recorded form of a replica event id: the id itself when it is at most
/// [`MAX_EVENT_ID_BYTES`] and does not start with '~'; otherwise "~" +
/// base64url-nopad(SHA-256(id)) (44 chars).
pub fn recorded_id(id: &str) -> Cow<'_, str> {
    if id.len() <= MAX_EVENT_ID_BYTES && !id.starts_with('~') {
        Cow::Borrowed(id)
    } else {
        let mut out = String::with_capacity(DIGEST_FORM_BYTES);
        out.push('~');
        URL_SAFE_NO_PAD.encode_string(Sha256::digest(id.as_bytes()), &mut out);
        Cow::Owned(out)
    }
}

/// A short, safe rendering of a bad value for an error detail.
fn shown(s: &str) -> String {
    let cut: String = s.chars().take(48).collect();
    if cut.len() < s.len() {
        format!("{cut:?}…")
    } else {
        format!("{cut:?}")
    }
}

fn field_error(field: impl Into<String>, detail: impl Into<String>) -> FieldError {
    FieldError {
        field: field.into(),
        detail: detail.into(),
    }
}

fn is_lower_hex(s: &str, len: usize) -> bool {
    s.len() == len
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// A session store key: [`SESSION_KEY_HEX`] lowercase hex digits.
fn check_session(field: &str, s: &str) -> Result<(), FieldError> {
    if is_lower_hex(s, SESSION_KEY_HEX) {
        Ok(())
    } else {
        Err(field_error(
            field,
            format!(
                "expected {SESSION_KEY_HEX} lowercase hex digits, got {}",
                shown(s)
            ),
        ))
    }
}

/// An incarnation id: [`INCARNATION_HEX`] lowercase hex digits.
fn check_incarnation(field: &str, s: &str) -> Result<(), FieldError> {
    if is_lower_hex(s, INCARNATION_HEX) {
        Ok(())
    } else {
        Err(field_error(
            field,
            format!(
                "expected {INCARNATION_HEX} lowercase hex digits, got {}",
                shown(s)
            ),
        ))
    }
}

/// `ip:port` in canonical form, since the owner string is an identity (OwnerGone matches it
/// byte for byte) and Envoy's `upstream.address` is canonical.
fn check_owner(field: &str, s: &str) -> Result<(), FieldError> {
    match s.parse::<SocketAddr>() {
        Ok(a) if a.to_string() == s && a.port() != 0 => Ok(()),
        _ => Err(field_error(
            field,
            format!(
                "expected ip:port (e.g. 10.0.0.7:8080 or [fd00::7]:8080), got {}",
                shown(s)
            ),
        )),
    }
}

impl Record {
    /// Every field within its shape and limits. Used by the guard before queueing a record
    /// and by the service before applying it.
    pub fn validate(&self) -> Result<(), FieldError> {
        match self {
            Record::SessionOpen { session, version } => {
                check_session("session", session)?;
                let printable = version.bytes().all(|b| b.is_ascii_graphic());
                if version.is_empty() || version.len() > MAX_VERSION_BYTES || !printable {
                    return Err(field_error(
                        "version",
                        format!(
                            "expected 1..={MAX_VERSION_BYTES} printable ASCII characters, got {}",
                            shown(version)
                        ),
                    ));
                }
            }
            Record::SessionEnd { session, .. } => check_session("session", session)?,
            Record::StreamOpen {
                session,
                incarnation,
                owner,
                ..
            } => {
                check_session("session", session)?;
                check_incarnation("incarnation", incarnation)?;
                check_owner("owner", owner)?;
            }
            Record::Events {
                session,
                incarnation,
                first_seq,
                ids,
                long,
            } => {
                check_session("session", session)?;
                check_incarnation("incarnation", incarnation)?;
                let last = first_seq.saturating_add((ids.len() as u64).saturating_sub(1));
                if last > MAX_SEQ {
                    return Err(field_error(
                        "first_seq",
                        format!("first_seq + number of ids exceeds {MAX_SEQ}"),
                    ));
                }
                for (j, id) in ids.iter().enumerate() {
                    if id.len() > MAX_EVENT_ID_BYTES {
                        return Err(field_error(
                            format!("ids[{j}]"),
                            format!(
                                "{} bytes, at most {MAX_EVENT_ID_BYTES} (longer ids are recorded by digest)",
                                id.len()
                            ),
                        ));
                    }
                    if id.starts_with('~') && id.len() != DIGEST_FORM_BYTES {
                        return Err(field_error(
                            format!("ids[{j}]"),
                            format!(
                                "starts with '~' but is not a digest form, got {}",
                                shown(id)
                            ),
                        ));
                    }
                }
                if long.len() > ids.len() {
                    return Err(field_error(
                        "long",
                        format!("{} entries for {} ids", long.len(), ids.len()),
                    ));
                }
                for (j, l) in long.iter().enumerate() {
                    let at = l
                        .seq
                        .checked_sub(*first_seq)
                        .and_then(|i| usize::try_from(i).ok())
                        .and_then(|i| ids.get(i));
                    let Some(recorded) = at else {
                        return Err(field_error(
                            format!("long[{j}].seq"),
                            format!("{} is not a seq of this record", l.seq),
                        ));
                    };
                    if l.id.len() > MAX_LONG_ID_BYTES {
                        return Err(field_error(
                            format!("long[{j}].id"),
                            format!("{} bytes, at most {MAX_LONG_ID_BYTES}", l.id.len()),
                        ));
                    }
                    let form = recorded_id(&l.id);
                    if form == l.id.as_str() {
                        return Err(field_error(
                            format!("long[{j}].id"),
                            "a short id is recorded as itself, not as a long id",
                        ));
                    }
                    if form != recorded.as_str() {
                        return Err(field_error(
                            format!("long[{j}].id"),
                            format!("its digest differs from ids[{}]", l.seq - first_seq),
                        ));
                    }
                }
            }
            Record::StreamLost {
                session,
                incarnation,
            } => {
                check_session("session", session)?;
                check_incarnation("incarnation", incarnation)?;
            }
            Record::OwnerGone { owner } => check_owner("owner", owner)?,
        }
        Ok(())
    }
}

/// Body of every 4xx/5xx from the service: a named problem.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: String,
    pub detail: String,
}

pub const RESUME_PATH: &str = "/v1/resume";
pub const RECORDS_PATH: &str = "/v1/records";
