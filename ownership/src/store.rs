//! The storage contract of the ownership service.
//!
//! Handlers only ever talk to a [`Store`]. The in-memory store ([`crate::memory::MemoryStore`])
//! implements it with one lock; a shared store (Redis) implements it with one script per
//! operation. Everything a verdict depends on comes from ONE [`Store::snapshot`] call, so the
//! verdict is decided over a consistent picture even while records land concurrently.
//!
//! Time is always passed in (`now_ms`), never read inside a store: the idle TTL becomes testable
//! without sleeping, and every instance of a stateless service agrees on what "now" means for
//! a given request.
use std::future::Future;

use mcp_resume_core::decision::{IncarnationFacts, SessionState};
use mcp_resume_core::ownership::Record;
use tokio::sync::watch;

/// Bounds that keep a store's memory proportional to live sessions, not to traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Recorded seq → replica event id entries kept per incarnation (the newest ones).
    pub max_window: usize,
    /// Incarnations kept per session; the least recently recorded one is evicted first.
    pub max_incarnations_per_session: usize,
    /// A session not touched (by a record or a resume) for this long reads as expired.
    pub session_idle_ttl_ms: u64,
    /// Sessions kept in all; past it the least recently active one is evicted.
    pub max_sessions: usize,
    /// Estimated bytes kept in all (memory store). Above [`HIGH_WATER_PERCENT`] of it new
    /// sessions are refused (`store_full`); a record that would grow a session past it
    /// (`events` with ids, `stream_open`) is refused too. A session active within the idle
    /// TTL is never evicted for room. A shared store leaves bytes to its own byte budget
    /// (see `RedisOptions::max_bytes`).
    pub max_bytes: usize,
    /// Recorded events a session keeps across its incarnations: past it, its least recently
    /// recorded incarnations give theirs up first, then the one just written its oldest. One
    /// session's traffic never grows into the others' room.
    pub max_session_events: usize,
    /// Sessions with records but no `session_open` yet, kept in all (apart from
    /// `max_sessions`); past it the oldest such entry is dropped. They never evict or count
    /// against opened sessions, so records for made-up session ids cost opened sessions nothing.
    pub max_pending_sessions: usize,
    /// A session with records but no `session_open` is dropped after this long without one.
    pub pending_ttl_ms: u64,
    /// An incarnation whose owner failed a continuation (`owner_failed`) and recorded no events
    /// since is lost once the first such failure is older than this.
    pub owner_failure_window_ms: u64,
}

/// Continuations an incarnation's branch table keeps (the newest, besides branch 0); an older
/// one's events count as overtaken.
pub const BRANCHES_KEPT: u64 = 16;

/// How long a registered continuation that has not relayed yet counts as another reader at a
/// clean end (`forked`): its request may still be on its way to the replica, which may hand it
/// the stream. Past it, a registration whose answer nobody used (a resume its client dropped)
/// takes the stream from nobody.
pub const REGISTRATION_GRACE_MS: u64 = 3_000;

/// `abandoned` records an incarnation remembers before their registration came (the oldest
/// goes first); each for [`REGISTRATION_GRACE_MS`] at most. Made-up tokens cost a session
/// no more than this.
pub const ABANDONED_KEPT: usize = BRANCHES_KEPT as usize;

/// Percent of a byte budget above which new sessions are refused.
pub const HIGH_WATER_PERCENT: usize = 90;

/// The named error of a record refused for want of room: a `session_open`, or a session's
/// growth (`events` with ids, `stream_open`) at the store's byte cap.
pub const STORE_FULL: &str = "store_full";

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_window: 4096,
            max_incarnations_per_session: 64,
            session_idle_ttl_ms: 3_600_000,
            max_sessions: 100_000,
            max_bytes: 256 << 20,
            max_session_events: 16_384,
            max_pending_sessions: 10_000,
            pending_ttl_ms: 60_000,
            owner_failure_window_ms: 30_000,
        }
    }
}

/// What [`Store::open_branch`] came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BranchOpen {
    /// Registered, with this number.
    Numbered(u64),
    /// Not registered: the branch goes on unarbitrated.
    Unregistered,
    /// The incarnation's branch table was lost apart from it: the incarnation is lost
    /// (`records_lost` for this resume), rather than numbered anew.
    Lost,
}

/// What [`Store::snapshot`] is asked about: the cursor's (session, incarnation, seq).
#[derive(Debug, Clone, Copy)]
pub struct SnapshotQuery<'a> {
    pub session: &'a str,
    pub incarnation: &'a str,
    /// The cursor's sequence number: `expected` and `retained_from` are about `seq+1 ..= head`.
    pub seq: u64,
    /// At most this many expected ids are returned.
    pub max_expected: usize,
}

/// An atomic snapshot of everything the decision needs about one cursor.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Facts {
    /// `None`: the session was never recorded (or was freed after its TTL). A session idle past
    /// its TTL but not yet freed reads as `Expired`.
    pub session: Option<SessionState>,
    /// `None`: no `StreamOpen` for this incarnation has landed yet (even if some of its events
    /// have: they wait in a placeholder without an owner).
    pub incarnation: Option<IncarnationView>,
    /// The store refused or failed a write within the last idle TTL, or it lost part of this
    /// session's keys: a session or stream it does not know may be one whose records it could
    /// not keep (`records_lost`).
    pub refusing: bool,
}

/// What a store did not apply of a batch (everything else was applied).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Applied {
    pub refused: Vec<Refusal>,
}

/// One record a store refused, by its position in the batch it was given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub index: usize,
    /// A named problem: [`STORE_FULL`] (a `session_open` without room), or for `events`
    /// [`REJECTED_FORKED`](mcp_resume_core::ownership::REJECTED_FORKED) (a newer branch overtook theirs) or [`REJECTED_MISMATCH`](mcp_resume_core::ownership::REJECTED_MISMATCH) (their
    /// seqs are recorded with other events; the incarnation is then lost).
    pub error: &'static str,
    pub detail: String,
}

/// One opened incarnation, as seen by a snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IncarnationView {
    /// Ready for [`mcp_resume_core::decision::decide`]. `retained_from` is the store's
    /// contiguity floor: when some seq in `seq+1 ..= head` has no record (trimmed out of the
    /// window, or a batch not landed yet) it is one past the highest such seq, so `decide`
    /// answers `gap`; otherwise it is 0 (nothing missing as far as this query is concerned).
    pub facts: IncarnationFacts,
    /// `ip:port` of the owning replica.
    pub owner: String,
    /// Recorded replica event ids for `seq+1 ..`, contiguous, oldest first, at most
    /// `max_expected`, never past `head`.
    pub expected: Vec<String>,
    /// What the store knows about the replica id of the cursor's own seq.
    pub cursor_id: CursorId,
    /// The JSON-RPC id its StreamOpen carried (raw JSON text), if any.
    pub request_id: Option<String>,
    /// Seqs below this one were left out of the records on purpose (the highest `first_seq`
    /// of `events` with `trimmed`): a hole there is no batch in flight. 0: none.
    pub trimmed_below: u64,
}

/// The replica id of the cursor's own seq, as far as a resume needs it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum CursorId {
    /// Short (the cursor carries it), or not recorded: nothing to add to the verdict.
    #[default]
    Plain,
    /// Long, and the store keeps its full form: the verdict carries it as `resume_id`.
    Long(String),
    /// Long (recorded by digest), but its full form is no longer kept: nobody can resume it.
    LongMissing,
}

/// Gauges for /metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StoreStats {
    /// Opened sessions (a `session_open` applied).
    pub sessions: u64,
    /// Sessions with records but no `session_open` yet.
    pub pending: u64,
    pub incarnations: u64,
    /// Estimated bytes held (0 when the store cannot tell).
    pub bytes: u64,
    /// Sessions evicted by the global caps since start (this instance's count).
    pub evicted: u64,
    /// Store connections this instance dropped as broken and made anew (Redis Cluster).
    pub reconnects: u64,
    /// Owner addresses whose `owner_gone` epoch is still remembered.
    pub owners: u64,
    /// Resume lookups answered read-only because the store refused their last-used write
    /// (Redis at `maxmemory`), since start.
    pub touch_refused: u64,
}

/// A store that could not do its job. Never caused by request input: input is validated
/// before it reaches a store, so every store error is a 503 for the caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreError {
    /// The backend cannot be reached or timed out; worth retrying.
    Unavailable(String),
    /// The backend answered something this code does not understand (corrupt or foreign data).
    Corrupt(String),
    /// The backend cannot do what the flags ask (e.g. `WAIT` for replicas it does not have).
    /// The text is ours (no address, no secret): what is wrong and the variable to change.
    Misconfigured(String),
}

impl StoreError {
    /// The failure class, safe to show to callers (no backend text, no address, no secret).
    pub fn class(&self) -> &'static str {
        match self {
            StoreError::Unavailable(_) => "unavailable",
            StoreError::Corrupt(_) => "returned unusable data",
            StoreError::Misconfigured(_) => "misconfigured",
        }
    }

    /// What a caller may be shown: the class, or for a misconfiguration the whole problem and
    /// the variable to change (composed by this service, never backend text).
    pub fn public_detail(&self) -> String {
        match self {
            StoreError::Misconfigured(m) => format!("misconfigured: {m}"),
            other => other.class().to_owned(),
        }
    }
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreError::Unavailable(m) => write!(f, "store unavailable: {m}"),
            StoreError::Corrupt(m) => write!(f, "store returned unusable data: {m}"),
            StoreError::Misconfigured(m) => write!(f, "store misconfigured: {m}"),
        }
    }
}

impl std::error::Error for StoreError {}

/// The ownership store.
///
/// Contract, shared by every implementation (and checked by the same test suite,
/// `tests/suite/mod.rs`):
/// - every record is an idempotent upsert; records may arrive in any order and more than once;
/// - `snapshot` is atomic with respect to `apply` of any single record;
/// - `now_ms` is the caller's clock; stores never read one.
///
/// Methods return `impl Future + Send` (not `async fn`) so that handlers generic over `S`
/// stay `Send` on a multi-threaded runtime.
pub trait Store: Send + Sync + 'static {
    /// Short name for logs, /healthz and metrics: `memory`, `redis`.
    fn name(&self) -> &'static str;

    /// Apply a batch of (already validated) records. Each record is atomic on its own;
    /// a shared store need not make the whole batch atomic. Touches the idle timer of every
    /// session named. A `session_open` the store has no room for is refused ([`STORE_FULL`])
    /// rather than evicting a session active within the idle TTL; a record for a session never
    /// opened is held apart as pending (see [`Limits::max_pending_sessions`]). `events` whose
    /// seqs at or below the recorded head are recorded with other events (id, or digest when
    /// both have one) are refused ([`REJECTED_MISMATCH`](mcp_resume_core::ownership::REJECTED_MISMATCH)) and the incarnation is marked lost;
    /// `events` of an overtaken branch are refused ([`REJECTED_FORKED`](mcp_resume_core::ownership::REJECTED_FORKED), see
    /// [`Store::open_branch`]). A `branch_end` marks a known branch ended, and does nothing else;
    /// an `abandoned` ends the branch its registration registered, or is remembered for it.
    fn apply(
        &self,
        records: &[Record],
        now_ms: u64,
    ) -> impl Future<Output = Result<Applied, StoreError>> + Send;

    /// Register the next branch of an opened incarnation (1, 2, … in the store's own order,
    /// atomically for every instance of a shared store) as open, and return its number. The
    /// incarnation's branch table is made by its first call, with branch 0 (its first
    /// response) open and relaying from the start; it keeps at most [`BRANCHES_KEPT`]
    /// continuations (ended ones go first, then open ones that never relayed, then the oldest).
    /// [`BranchOpen::Unregistered`]: the incarnation is not opened here, or the store refused
    /// the write (a resume never fails for it: the branch is then not arbitrated).
    /// [`BranchOpen::Lost`]: the table was lost apart from its incarnation (a shared store's
    /// eviction or failover); the incarnation is marked lost, never numbered anew.
    ///
    /// With a table, `apply` arbitrates the incarnation's `events` (docs/forks.md): the events
    /// of branch `g` are refused ([`REJECTED_FORKED`](mcp_resume_core::ownership::REJECTED_FORKED)) when another open branch `h > g` had
    /// events accepted after `g`'s first accepted ones, or once `g` was cut. A branch's first
    /// events are always accepted (a branch the table no longer lists comes back, relaying
    /// from then); an ended branch's events are applied but never move its order. Without a
    /// table (no continuation registered) events are applied as they come.
    ///
    /// `registration` (the resume's `ResumeQuery.registration`) is kept with the branch: an
    /// `abandoned` record naming it ends the branch at once (it never relays, so it is never
    /// another reader), and one that came first, within [`REGISTRATION_GRACE_MS`], makes the
    /// branch ended from its registration.
    fn open_branch(
        &self,
        session: &str,
        incarnation: &str,
        registration: Option<&str>,
        now_ms: u64,
    ) -> impl Future<Output = Result<BranchOpen, StoreError>> + Send;

    /// Mark a branch ended (as a `branch_end` record does) and say whether another branch
    /// numbered 1 or more of the incarnation is still open and relaying: the replica ended
    /// this one for a newer reader (`forked`). Branch 0 never counts, nor a branch that never
    /// relayed once [`REGISTRATION_GRACE_MS`] passed since it was registered. No table: `false`, nothing written. A table lost apart from its incarnation:
    /// `true` (the end cannot be arbitrated, so it is signalled), the incarnation marked lost.
    /// It also clears the owner failure window: the owner answered for the stream.
    fn end_branch(
        &self,
        session: &str,
        incarnation: &str,
        branch: u64,
        now_ms: u64,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// [`Store::end_branch`], unless its answer would be `forked`: then `None` (the rivals'
    /// guards' word may be in flight, an owner's answer, an `abandoned` or a `branch_end`
    /// record; the caller waits for it and asks again, `crate::resume::end_branch`). The
    /// branch is ended either way (its replica ended it: while the answer waits it must not
    /// overtake the branch that may be reading now); it is cut once the answer is `forked`.
    fn end_branch_settled(
        &self,
        session: &str,
        incarnation: &str,
        branch: u64,
        now_ms: u64,
    ) -> impl Future<Output = Result<Option<bool>, StoreError>> + Send;

    /// Atomically read the facts about one cursor, and touch the session's idle timer when
    /// it is active.
    fn snapshot(
        &self,
        query: SnapshotQuery<'_>,
        now_ms: u64,
    ) -> impl Future<Output = Result<Facts, StoreError>> + Send;

    /// A version that changes after records were applied (by this instance, and for a shared
    /// store by others as far as it can tell). Resume waits on it while records are in flight.
    /// Subscribe BEFORE taking the snapshot you want to re-check, so no change is missed.
    /// Spurious changes are fine.
    fn changes(&self) -> watch::Receiver<u64>;

    /// `Ok` when the store can serve requests.
    fn health(&self) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Counts for the gauges. May be approximate for a shared store.
    fn stats(&self, now_ms: u64) -> impl Future<Output = Result<StoreStats, StoreError>> + Send;

    /// Free sessions idle past their TTL; returns how many were freed. A store with native
    /// key expiry may do nothing here.
    fn sweep(&self, now_ms: u64) -> impl Future<Output = Result<usize, StoreError>> + Send;
}
