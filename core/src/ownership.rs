//! Wire types shared by the filter and the ownership service (HTTP/JSON), with their limits
//! and the one validation both sides apply ([`Record::validate`]).
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::borrow::Cow;
use std::net::SocketAddr;

/// `POST /v1/records` bodies above this are refused with 413.
pub const MAX_RECORDS_BODY_BYTES: usize = 1 << 20;
/// Records per batch; the service answers 400 above it.
pub const MAX_BATCH_RECORDS: usize = 10_000;
/// Bytes of one entry of `Events.ids` (the recorded form, [`recorded_id`]).
pub const MAX_EVENT_ID_BYTES: usize = 128;
/// Bytes of a full long id kept for resumption (`Events.long`); longer ids are digest-only.
pub const MAX_LONG_ID_BYTES: usize = 64 * 1024;
/// Full long ids the store keeps per incarnation (the newest).
pub const LONG_IDS_KEPT: usize = 16;
/// Bytes of a `StreamOpen.request_id` (raw JSON text), as older guards wrote it; the guard's own
/// bound is [`crate::jsonrpc::MAX_REQUEST_IDS_BYTES`], all of it in the cursor.
pub const MAX_REQUEST_ID_BYTES: usize = 256;
/// Bytes of a protocol version string.
pub const MAX_VERSION_BYTES: usize = 64;
/// Sequence numbers stay within JSON's exactly representable integers (2^53 - 1), which also
/// keeps every `seq + 1` far from overflow.
pub const MAX_SEQ: u64 = (1 << 53) - 1;
/// Length of a session key: lowercase hex of 16 bytes.
pub const SESSION_KEY_CHARS: usize = 32;
/// Length of an incarnation id: lowercase hex of 8 bytes.
pub const INCARNATION_CHARS: usize = 16;
/// Length of a resume's registration token: lowercase hex of 8 bytes.
pub const REGISTRATION_CHARS: usize = 16;
/// The first character of a recorded digest; an id that starts with it is recorded by digest.
pub const DIGEST_MARK: char = '~';
/// Lowercase hex digits of an event's content digest in its recorded form.
pub const CONTENT_DIGEST_CHARS: usize = 16;
/// Bytes of one recorded event ([`recorded_event`]): `Events.ids` entries and `expected`.
pub const MAX_RECORDED_EVENT_BYTES: usize = MAX_EVENT_ID_BYTES + 1 + CONTENT_DIGEST_CHARS;

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
    /// A newer continuation of the same incarnation took the stream over (newest wins).
    Forked,
    /// The request repeated `Last-Event-ID`, `Mcp-Session-Id` or `MCP-Protocol-Version`.
    DuplicateHeader,
    /// The proxy could not give the guard the request's or response's headers or body.
    HostError,
    /// `contiguity: asserted`, and the continuation did not start with the replica's
    /// contiguity assertion.
    Unasserted,
    /// The owner failed this continuation in a way that may pass (a refused or reset
    /// connection, its own 5xx, a full circuit breaker): a later resume may continue.
    OwnerBusy,
    /// The store could not keep this session's records (full, or refusing writes), so it
    /// cannot vouch for the cursor; not a statement that the session ended.
    RecordsLost,
    /// A continuation was answered without a replay (no SSE body, 204, another content type,
    /// a redirect or an error status) while events after the cursor are recorded.
    ReplayMissing,
    /// The replica answered SSE with a `Content-Encoding` other than identity: its ids
    /// cannot be read, so the stream is not relayed.
    EncodedStream,
    /// The request's `Mcp-Session-Id` is not a session id (empty, or a byte outside visible
    /// ASCII 0x21–0x7E): refused before any replica sees it.
    BadSessionId,
    /// A request's fresh `200` SSE answer ended cleanly before relaying a single event: its
    /// response did not come and the client holds no cursor to resume from.
    ResponseMissing,
    /// The cursor is a reset cursor: the replica reset the stream's event id (a bare `id:`)
    /// at this event, so it cannot replay from there. Refused before any callout.
    IdReset,
}

impl Reason {
    pub const ALL: [Reason; 22] = [
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
        Reason::Forked,
        Reason::DuplicateHeader,
        Reason::HostError,
        Reason::Unasserted,
        Reason::OwnerBusy,
        Reason::RecordsLost,
        Reason::ReplayMissing,
        Reason::EncodedStream,
        Reason::BadSessionId,
        Reason::ResponseMissing,
        Reason::IdReset,
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
            Reason::Forked => "forked",
            Reason::DuplicateHeader => "duplicate_header",
            Reason::HostError => "host_error",
            Reason::Unasserted => "unasserted",
            Reason::OwnerBusy => "owner_busy",
            Reason::RecordsLost => "records_lost",
            Reason::ReplayMissing => "replay_missing",
            Reason::EncodedStream => "encoded_stream",
            Reason::BadSessionId => "bad_session_id",
            Reason::ResponseMissing => "response_missing",
            Reason::IdReset => "id_reset",
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
    /// A token the guard drew for this resume ([`REGISTRATION_CHARS`] lowercase hex): the
    /// store keeps it with the branch it registers, so a [`Record::Abandoned`] naming it ends
    /// that branch when the guard never uses the verdict. Absent (older guards): the branch
    /// can only age out of its registration grace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registration: Option<String>,
}

/// The service's answer to a [`ResumeQuery`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "verdict", rename_all = "snake_case", deny_unknown_fields)]
pub enum ResumeVerdict {
    Continue {
        /// `ip:port` of the replica that owns the incarnation.
        owner: String,
        /// Recorded events ([`recorded_event`]) for seq+1 ..= head, oldest first (capped), so
        /// the guard can check the replay event by event, ids and content.
        expected: Vec<String>,
        /// Recorded head sequence number of the incarnation.
        head: u64,
        /// The full replica id of the cursor's own seq, when it was too long to be embedded in
        /// the cursor and the store still keeps it (the last [`LONG_IDS_KEPT`] long ids).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        resume_id: Option<String>,
        /// This continuation's branch of the incarnation: a number the store hands out in
        /// increasing order (1, 2, …; the stream's first response is branch 0). The guard
        /// tags the branch's `Events` with it and reports the branch's end. Absent when the
        /// store could not register the branch (then it is not arbitrated).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        branch: Option<u64>,
    },
    NewStream {
        reason: Reason,
        /// The recorded JSON-RPC id of the cursor's stream (raw JSON text), when the store
        /// knows the incarnation and its StreamOpen carried one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        request_id: Option<String>,
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
        /// Guard clock (ms since epoch) when the stream opened. Kept on the wire for
        /// compatibility; the service orders GET streams by the order it applies their first
        /// StreamOpen, never by this (gateways' clocks differ).
        opened_ms: u64,
        /// The JSON-RPC id of the request this stream answers, as raw JSON text (a number or
        /// a string token, at most [`MAX_REQUEST_ID_BYTES`]); kept per incarnation and handed
        /// back in a `new_stream` verdict for it. Only older guards send it (they embedded ids of
        /// at most 64 bytes in the cursor and recorded longer ones here); a guard now embeds
        /// every id it carries in the cursor, so a refusal never depends on the store to settle.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        request_id: Option<String>,
    },
    /// Events relayed: seq `first_seq + i` carried the event `ids[i]`, in recorded form
    /// ([`recorded_event`]: the recorded id and the content digest; the id alone is accepted).
    Events {
        session: String,
        incarnation: String,
        first_seq: u64,
        ids: Vec<String>,
        /// Full ids of those seqs whose id was longer than [`MAX_EVENT_ID_BYTES`] (and at most
        /// [`MAX_LONG_ID_BYTES`]), oldest first, so a cursor at one of them can still resume.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        long: Vec<LongId>,
        /// The branch that relayed them ([`ResumeVerdict::Continue`]`.branch`; 0, the
        /// default, is the stream's first response). The store refuses the events of a branch
        /// that another, newer branch overtook ([`REJECTED_FORKED`]) or that disagree with
        /// events already recorded at the same seqs ([`REJECTED_MISMATCH`]).
        #[serde(default, skip_serializing_if = "is_zero")]
        branch: u64,
        /// How many of this branch's seqs right before `first_seq` the guard relayed but left
        /// out of its records on purpose (its queue keeps only a stream's newest
        /// `ownership.record_window` ids, as the store keeps only its newest window): a hole
        /// there never fills, so a resume never waits for it. 0, the default: none.
        #[serde(default, skip_serializing_if = "is_zero")]
        trimmed: u64,
    },
    /// A continuation's branch ended without asking [`BRANCH_PATH`] (reset, client gone, cut):
    /// it no longer holds the stream.
    BranchEnd {
        session: String,
        incarnation: String,
        branch: u64,
    },
    /// A resume whose exchange ended while its verdict was pending (its client dropped it),
    /// or whose verdict went unused: the branch the store registered for `registration`
    /// ([`ResumeQuery::registration`]) never relays, so it is ended at once and never counts
    /// as another reader. It may land before the registration (records and verdict queries
    /// race): the store then remembers it for a while, and the registration is born ended.
    Abandoned {
        session: String,
        incarnation: String,
        registration: String,
    },
    /// A continuation to this incarnation's owner failed (owner down or not in the cluster):
    /// its log is lost, so later cursors for it are `owner_unavailable` at once.
    StreamLost {
        session: String,
        incarnation: String,
    },
    /// A continuation to this incarnation's owner failed in a way that may pass (connection
    /// refused or reset, the owner's own 5xx). The store keeps the time of the first such
    /// failure not followed by recorded events; once it is older than the service's window the
    /// incarnation is lost (`owner_unavailable`), before that a resume may try the owner again.
    OwnerFailed {
        session: String,
        incarnation: String,
    },
    /// Operator or preStop hook: this replica address is gone. Every incarnation it owned
    /// until now is lost; incarnations opened later at the same address (a new pod) are not.
    OwnerGone {
        owner: String,
    },
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// `rejected[].error` of `Events` from a branch that a newer branch of the same incarnation
/// overtook (it relayed after this one started): the guard cuts the branch with `forked`.
pub const REJECTED_FORKED: &str = "forked";
/// `rejected[].error` of `Events` whose seqs are recorded with other events: the branch's
/// replica diverged from the log; the guard cuts it with `replay_mismatch`.
pub const REJECTED_MISMATCH: &str = "replay_mismatch";

/// `POST /v1/branch`: a continuation's branch ended cleanly (its replica closed it). The store
/// marks it ended and says whether another branch of the incarnation is open, so a branch that
/// the replica closed for a newer reader ends with `forked`, never silently.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BranchQuery {
    pub session: String,
    pub incarnation: String,
    pub branch: u64,
}

impl BranchQuery {
    pub fn validate(&self) -> Result<(), FieldError> {
        check_session("session", &self.session)?;
        check_incarnation("incarnation", &self.incarnation)
    }
}

/// The answer to a [`BranchQuery`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BranchAnswer {
    /// Another branch of the incarnation is open: this one was overtaken.
    pub forked: bool,
}

/// `POST /v1/records`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecordBatch {
    pub records: Vec<Record>,
}

/// A full long replica id of one seq.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LongId {
    pub seq: u64,
    pub id: String,
}

/// `POST /v1/records` answer: the valid records were applied, the invalid ones are named.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordAck {
    pub applied: usize,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rejected: Vec<RejectedRecord>,
}

/// One record of a batch the service did not apply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RejectedRecord {
    /// Position in the batch's `records`.
    pub index: usize,
    /// A named problem, e.g. `bad_field`.
    pub error: String,
    /// e.g. `records[3].ids[0]: 200 bytes, at most 128`.
    pub detail: String,
}

/// A field problem in one record; `field` is relative to the record, e.g. `ids[3]`.
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

impl std::error::Error for FieldError {}

fn field_error(field: impl Into<String>, detail: impl Into<String>) -> FieldError {
    FieldError {
        field: field.into(),
        detail: detail.into(),
    }
}

/// The recorded form of a replica event id: the id itself when it is at most
/// [`MAX_EVENT_ID_BYTES`] long, does not start with [`DIGEST_MARK`] and holds no CR or LF (SSE
/// never yields one; the recorded event puts its digest after a LF); otherwise `~` followed
/// by the unpadded base64url of its SHA-256 (44 characters). Any id thus has a bounded record,
/// and two ids have the same recorded form only if they are equal (or collide in SHA-256).
pub fn recorded_id(id: &str) -> Cow<'_, str> {
    if id.len() <= MAX_EVENT_ID_BYTES && !id.starts_with(DIGEST_MARK) && !id.contains(['\n', '\r'])
    {
        return Cow::Borrowed(id);
    }
    let mut s = String::with_capacity(44);
    s.push(DIGEST_MARK);
    URL_SAFE_NO_PAD.encode_string(Sha256::digest(id.as_bytes()), &mut s);
    Cow::Owned(s)
}

/// The recorded form of an event: its [`recorded_id`], a LF, and its content digest
/// (`sse::content_digest`) in [`CONTENT_DIGEST_CHARS`] lowercase hex digits. An SSE id never
/// holds a LF, so the split is unambiguous. The digest lets a replay that reuses an id for
/// other data be told from the event recorded under it.
pub fn recorded_event(id: &str, digest: u64) -> String {
    let id = recorded_id(id);
    let mut s = String::with_capacity(id.len() + 1 + CONTENT_DIGEST_CHARS);
    s.push_str(&id);
    s.push('\n');
    s.extend(digest_hex(digest).iter().map(|&b| char::from(b)));
    s
}

/// A content digest as it is recorded: [`CONTENT_DIGEST_CHARS`] lowercase hex digits.
pub fn digest_hex(digest: u64) -> [u8; CONTENT_DIGEST_CHARS] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = [b'0'; CONTENT_DIGEST_CHARS];
    for (i, o) in out.iter_mut().enumerate() {
        let shift = 4 * (CONTENT_DIGEST_CHARS - 1 - i);
        *o = HEX[((digest >> shift) & 0xf) as usize];
    }
    out
}

/// A recorded event's id part and, when it has one, its digest part (checked by
/// [`digest_matches`]).
pub fn split_recorded(entry: &str) -> (&str, Option<&str>) {
    match entry.rsplit_once('\n') {
        Some((id, digest)) => (id, Some(digest)),
        None => (entry, None),
    }
}

/// Does a recorded digest (`None`: recorded without one) match the digest of a replayed event?
pub fn digest_matches(recorded: Option<&str>, digest: u64) -> bool {
    match recorded {
        None => true,
        Some(d) => d.as_bytes() == digest_hex(digest),
    }
}

/// Checks one `Events.ids` entry: a recorded id of at most [`MAX_EVENT_ID_BYTES`], then
/// optionally a LF and exactly [`CONTENT_DIGEST_CHARS`] lowercase hex digits.
fn check_recorded_event(entry: &str) -> Result<(), String> {
    let (id, digest) = split_recorded(entry);
    if id.len() > MAX_EVENT_ID_BYTES {
        return Err(format!(
            "{} bytes of id, at most {MAX_EVENT_ID_BYTES}",
            id.len()
        ));
    }
    if id.contains(['\n', '\r']) {
        return Err("an id never holds CR or LF".into());
    }
    match digest {
        Some(d) if !is_lower_hex(d, CONTENT_DIGEST_CHARS) => Err(format!(
            "the digest after the LF must be {CONTENT_DIGEST_CHARS} lowercase hex digits, got {}",
            shown(d)
        )),
        _ => Ok(()),
    }
}

fn is_lower_hex(s: &str, len: usize) -> bool {
    s.len() == len
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// A short, safe rendering of a bad value for an error detail.
pub fn shown(s: &str) -> String {
    let cut: String = s.chars().take(48).collect();
    if cut.len() < s.len() {
        format!("{cut:?}…")
    } else {
        format!("{cut:?}")
    }
}

/// A session key: [`SESSION_KEY_CHARS`] lowercase hex digits.
pub fn check_session(field: &str, s: &str) -> Result<(), FieldError> {
    if is_lower_hex(s, SESSION_KEY_CHARS) {
        return Ok(());
    }
    Err(field_error(
        field,
        format!(
            "expected {SESSION_KEY_CHARS} lowercase hex digits, got {}",
            shown(s)
        ),
    ))
}

/// An incarnation id: [`INCARNATION_CHARS`] lowercase hex digits.
pub fn check_incarnation(field: &str, s: &str) -> Result<(), FieldError> {
    if is_lower_hex(s, INCARNATION_CHARS) {
        return Ok(());
    }
    Err(field_error(
        field,
        format!(
            "expected {INCARNATION_CHARS} lowercase hex digits, got {}",
            shown(s)
        ),
    ))
}

/// A registration token: [`REGISTRATION_CHARS`] lowercase hex digits.
pub fn check_registration(field: &str, s: &str) -> Result<(), FieldError> {
    if is_lower_hex(s, REGISTRATION_CHARS) {
        return Ok(());
    }
    Err(field_error(
        field,
        format!(
            "expected {REGISTRATION_CHARS} lowercase hex digits, got {}",
            shown(s)
        ),
    ))
}

/// `ip:port` in canonical form, since the owner string is an identity (OwnerGone matches it
/// byte for byte) and Envoy's `upstream.address` is canonical.
pub fn check_owner(field: &str, s: &str) -> Result<(), FieldError> {
    let canonical = match s.parse::<SocketAddr>() {
        // The V4 parser takes no leading zeros in octets, but does in the port; formatting
        // an address per record would cost more than the rest of the check.
        Ok(SocketAddr::V4(a)) => {
            a.port() != 0 && s.rsplit_once(':').is_some_and(|(_, p)| !p.starts_with('0'))
        }
        Ok(a @ SocketAddr::V6(_)) => a.port() != 0 && a.to_string() == s,
        Err(_) => false,
    };
    if canonical {
        return Ok(());
    }
    Err(field_error(
        field,
        format!(
            "expected ip:port (e.g. 10.0.0.7:8080 or [fd00::7]:8080), got {}",
            shown(s)
        ),
    ))
}

pub fn check_seq(field: &str, seq: u64) -> Result<(), FieldError> {
    if seq <= MAX_SEQ {
        return Ok(());
    }
    Err(field_error(field, format!("{seq} exceeds {MAX_SEQ}")))
}

/// A protocol version as recorded: 1..=[`MAX_VERSION_BYTES`] printable ASCII characters.
pub fn check_version(field: &str, v: &str) -> Result<(), FieldError> {
    let printable = v.bytes().all(|b| b.is_ascii_graphic());
    if !v.is_empty() && v.len() <= MAX_VERSION_BYTES && printable {
        return Ok(());
    }
    Err(field_error(
        field,
        format!(
            "expected 1..={MAX_VERSION_BYTES} printable ASCII characters, got {}",
            shown(v)
        ),
    ))
}

/// A JSON-RPC id as raw JSON text: a number or a string, at most [`MAX_REQUEST_ID_BYTES`].
pub fn check_request_id(field: &str, id: &str) -> Result<(), FieldError> {
    if id.len() > MAX_REQUEST_ID_BYTES {
        return Err(field_error(
            field,
            format!("{} bytes, at most {MAX_REQUEST_ID_BYTES}", id.len()),
        ));
    }
    match serde_json::from_str::<serde_json::Value>(id) {
        Ok(v) if v.is_number() || v.is_string() => Ok(()),
        _ => Err(field_error(
            field,
            format!(
                "expected a JSON number or string (raw JSON text), got {}",
                shown(id)
            ),
        )),
    }
}

impl ResumeQuery {
    pub fn validate(&self) -> Result<(), FieldError> {
        check_session("session", &self.session)?;
        check_incarnation("incarnation", &self.incarnation)?;
        check_seq("seq", self.seq)?;
        match &self.registration {
            Some(r) => check_registration("registration", r),
            None => Ok(()),
        }
    }
}

impl Record {
    /// Checks the record against the service's limits. The guard runs it before queueing a
    /// record (an invalid one is never sent); the service runs it on every record it receives.
    pub fn validate(&self) -> Result<(), FieldError> {
        match self {
            Record::SessionOpen { session, version } => {
                check_session("session", session)?;
                check_version("version", version)
            }
            Record::SessionEnd { session, .. } => check_session("session", session),
            Record::StreamOpen {
                session,
                incarnation,
                owner,
                request_id,
                ..
            } => {
                check_session("session", session)?;
                check_incarnation("incarnation", incarnation)?;
                check_owner("owner", owner)?;
                match request_id {
                    Some(id) => check_request_id("request_id", id),
                    None => Ok(()),
                }
            }
            Record::Events {
                session,
                incarnation,
                first_seq,
                ids,
                long,
                trimmed,
                ..
            } => {
                check_session("session", session)?;
                check_incarnation("incarnation", incarnation)?;
                check_seq("first_seq", *first_seq)?;
                if *trimmed >= (*first_seq).max(1) {
                    return Err(field_error(
                        "trimmed",
                        "more seqs than there are before first_seq",
                    ));
                }
                let last = first_seq.saturating_add((ids.len() as u64).saturating_sub(1));
                if last > MAX_SEQ {
                    return Err(field_error(
                        "first_seq",
                        format!("first_seq + number of ids exceeds {MAX_SEQ}"),
                    ));
                }
                for (j, entry) in ids.iter().enumerate() {
                    check_recorded_event(entry).map_err(|d| field_error(format!("ids[{j}]"), d))?;
                }
                let mut prev: Option<u64> = None;
                for (j, l) in long.iter().enumerate() {
                    let f = |name: &str| format!("long[{j}].{name}");
                    let at = l
                        .seq
                        .checked_sub(*first_seq)
                        .and_then(|i| usize::try_from(i).ok().and_then(|i| ids.get(i)));
                    let Some(recorded) = at else {
                        return Err(field_error(f("seq"), "not a seq of this record's ids"));
                    };
                    if prev.is_some_and(|p| l.seq <= p) {
                        return Err(field_error(f("seq"), "seqs must increase"));
                    }
                    prev = Some(l.seq);
                    if l.id.len() <= MAX_EVENT_ID_BYTES || l.id.len() > MAX_LONG_ID_BYTES {
                        return Err(field_error(
                            f("id"),
                            format!(
                                "{} bytes, expected {}..={MAX_LONG_ID_BYTES}",
                                l.id.len(),
                                MAX_EVENT_ID_BYTES + 1
                            ),
                        ));
                    }
                    if recorded_id(&l.id) != split_recorded(recorded).0 {
                        return Err(field_error(f("id"), "does not match the recorded digest"));
                    }
                }
                Ok(())
            }
            Record::StreamLost {
                session,
                incarnation,
            }
            | Record::OwnerFailed {
                session,
                incarnation,
            }
            | Record::BranchEnd {
                session,
                incarnation,
                ..
            } => {
                check_session("session", session)?;
                check_incarnation("incarnation", incarnation)
            }
            Record::Abandoned {
                session,
                incarnation,
                registration,
            } => {
                check_session("session", session)?;
                check_incarnation("incarnation", incarnation)?;
                check_registration("registration", registration)
            }
            Record::OwnerGone { owner } => check_owner("owner", owner),
        }
    }
}

/// Body of every 4xx/5xx from the service: a named problem.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: String,
    pub detail: String,
}

/// The headers of a JSON POST to the ownership service at `path` (with the guard's
/// `authorization`, when it has a token).
pub fn post_headers<'a>(
    path: &'a str,
    authority: &'a str,
    authorization: Option<&'a str>,
) -> Vec<(&'a str, &'a str)> {
    let mut h = vec![
        (":method", "POST"),
        (":path", path),
        (":authority", authority),
        ("content-type", "application/json"),
    ];
    if let Some(a) = authorization {
        h.push(("authorization", a));
    }
    h
}

pub const RESUME_PATH: &str = "/v1/resume";
pub const RECORDS_PATH: &str = "/v1/records";
pub const BRANCH_PATH: &str = "/v1/branch";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recorded_events_are_checked_entry_by_entry() {
        let events = |ids: Vec<String>| Record::Events {
            session: "0123456789abcdef0123456789abcdef".into(),
            incarnation: "0123456789abcdef".into(),
            first_seq: 1,
            ids,
            long: vec![],
            branch: 0,
            trimmed: 0,
        };
        let ok = vec![
            recorded_event("e1", 7),
            "e2".into(),
            recorded_event(&"x".repeat(500), 0),
            recorded_event("a\nb", 1),
        ];
        assert!(ok.iter().all(|e| e.len() <= MAX_RECORDED_EVENT_BYTES));
        assert_eq!(split_recorded(&ok[0]), ("e1", Some("0000000000000007")));
        assert_eq!(events(ok).validate(), Ok(()));
        for (bad, why) in [
            ("e1\n0123", "lowercase hex"),
            ("e1\n0123456789ABCDEF", "lowercase hex"),
            ("e\n1\n0123456789abcdef", "never holds"),
            ("e1\r\n0123456789abcdef", "never holds"),
        ] {
            let e = events(vec!["e0".into(), bad.into()]).validate();
            assert!(
                e.as_ref()
                    .is_err_and(|e| e.field == "ids[1]" && e.detail.contains(why)),
                "{bad:?}: {e:?}"
            );
        }
        let long = format!("{}\n0123456789abcdef", "y".repeat(MAX_EVENT_ID_BYTES + 1));
        assert!(events(vec![long]).validate().is_err());
        assert!(digest_matches(None, 5));
        assert!(digest_matches(Some("0000000000000005"), 5));
        assert!(!digest_matches(Some("0000000000000006"), 5));
        assert!(!digest_matches(Some("5"), 5));
    }

    #[test]
    fn owner_failed_on_the_wire() {
        let r: Result<Record, _> = serde_json::from_str(
            r#"{"type":"owner_failed","session":"0123456789abcdef0123456789abcdef","incarnation":"0123456789abcdef"}"#,
        );
        assert!(r.as_ref().is_ok_and(|r| r.validate().is_ok()), "{r:?}");
        let r = r.unwrap_or(Record::OwnerGone {
            owner: String::new(),
        });
        let bad = Record::OwnerFailed {
            session: "0123456789abcdef0123456789abcdef".into(),
            incarnation: "XYZ".into(),
        };
        assert!(bad.validate().is_err_and(|e| e.field == "incarnation"));
        let text = serde_json::to_string(&r).unwrap_or_default();
        assert!(text.starts_with(r#"{"type":"owner_failed""#), "{text}");
    }

    #[test]
    fn request_ids_are_json_numbers_or_strings() {
        let open = |id: Option<&str>| Record::StreamOpen {
            session: "0123456789abcdef0123456789abcdef".into(),
            incarnation: "0123456789abcdef".into(),
            kind: StreamKind::Request,
            owner: "10.0.0.1:80".into(),
            retention: 0,
            supersedes: false,
            opened_ms: 1,
            request_id: id.map(str::to_owned),
        };
        for ok in [
            None,
            Some("7"),
            Some("-1.5e3"),
            Some(r#""abc""#),
            Some(r#""""#),
        ] {
            assert_eq!(open(ok).validate(), Ok(()), "{ok:?}");
        }
        let long = format!("\"{}\"", "x".repeat(MAX_REQUEST_ID_BYTES));
        for bad in [
            "",
            "null",
            "[1]",
            "{}",
            "abc",
            "1 2",
            r#""a"#,
            long.as_str(),
        ] {
            let e = open(Some(bad)).validate();
            assert!(
                e.as_ref().is_err_and(|e| e.field == "request_id"),
                "{bad:?}: {e:?}"
            );
        }
        // Wire-compatible: absent reads as None and is not written.
        let text = r#"{"type":"stream_open","session":"0123456789abcdef0123456789abcdef","incarnation":"0123456789abcdef","kind":"request","owner":"10.0.0.1:80","retention":0,"supersedes":false,"opened_ms":1}"#;
        let r: Result<Record, _> = serde_json::from_str(text);
        assert!(r.as_ref().is_ok_and(|r| *r == open(None)), "{r:?}");
        assert_eq!(
            serde_json::to_string(&open(None)).ok().as_deref(),
            Some(text)
        );
        let v = ResumeVerdict::NewStream {
            reason: Reason::Gap,
            request_id: None,
        };
        assert_eq!(
            serde_json::to_string(&v).ok().as_deref(),
            Some(r#"{"verdict":"new_stream","reason":"gap"}"#)
        );
    }

    #[test]
    fn owners_are_canonical_ip_port() {
        for ok in [
            "10.0.0.7:8080",
            "127.0.0.1:1",
            "0.0.0.0:65535",
            "[fd00::7]:8080",
            "[::1]:80",
        ] {
            assert!(check_owner("owner", ok).is_ok(), "{ok}");
        }
        for bad in [
            "10.0.0.7:08080",
            "10.0.0.7:0",
            "010.0.0.7:8080",
            "10.0.0.7",
            "10.0.0.7:+80",
            " 10.0.0.7:80",
            "[FD00::7]:8080",
            "[fd00:0::7]:8080",
            "[::1]:080",
            "host:80",
            "",
        ] {
            assert!(check_owner("owner", bad).is_err(), "{bad}");
        }
    }
}
