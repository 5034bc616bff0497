//! Wire types shared by the filter and the ownership service (HTTP/JSON).
use serde::{Deserialize, Serialize};

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
    /// `contiguity: asserted`, and the continuation did not start with the replica's
    /// contiguity assertion.
    Unasserted,
}

impl Reason {
    pub const ALL: [Reason; 12] = [
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
        Reason::Unasserted,
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
            Reason::Unasserted => "unasserted",
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
    /// Events relayed: seq `first_seq + i` carried replica event id `ids[i]`.
    Events {
        session: String,
        incarnation: String,
        first_seq: u64,
        ids: Vec<String>,
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

/// `POST /v1/records` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordAck {
    pub applied: usize,
}

/// Body of every 4xx/5xx from the service: a named problem.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: String,
    pub detail: String,
}

pub const RESUME_PATH: &str = "/v1/resume";
pub const RECORDS_PATH: &str = "/v1/records";
