//! The store contract, written once. Every store runs exactly these cases:
//!
//! ```ignore
//! mod suite;
//! store_suite!(|limits| MemoryStore::new(limits));
//! ```
//!
//! `make` must return a fresh, empty store (for a shared store: a fresh key namespace).
//! Cases go through `resume::resolve`, the same code the HTTP handler runs, so they pin the
//! verdicts, not just the facts.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, dead_code)]

use std::time::Duration;

pub mod gateways;
#[allow(unused_imports)] // used by the store_suite! cases, not by every test binary
pub use gateways::{
    a_dropped_resume_through_another_gateway_never_forks_the_real_one,
    gateways_with_skewed_clocks_pick_the_newest_get_stream,
};

use mcp_ownership::metrics::Metrics;
use mcp_ownership::resume::{resolve, Resolution, ResumeOptions};
use mcp_ownership::store::{Limits, Store, ABANDONED_KEPT, REGISTRATION_GRACE_MS, STORE_FULL};
use mcp_resume_core::ownership::{
    Reason, Record, ResumeQuery, ResumeVerdict, SessionEnd, StreamKind, REJECTED_FORKED,
    REJECTED_MISMATCH,
};

pub const S1: &str = "0123456789abcdef0123456789abcdef";
pub const S2: &str = "fedcba9876543210fedcba9876543210";
pub const A: &str = "00000000000000aa";
pub const B: &str = "00000000000000bb";
pub const C: &str = "00000000000000cc";
pub const D: &str = "00000000000000dd";
pub const OWNER_X: &str = "10.0.0.1:8080";
pub const OWNER_Y: &str = "10.0.0.2:8080";

/// Test clock origin; arbitrary, non-zero.
pub const T0: u64 = 1_700_000_000_000;

pub fn open(session: &str) -> Record {
    Record::SessionOpen {
        session: session.into(),
        version: "2025-06-18".into(),
    }
}

pub fn end(session: &str, why: SessionEnd) -> Record {
    Record::SessionEnd {
        session: session.into(),
        why,
    }
}

pub fn stream(
    session: &str,
    inc: &str,
    kind: StreamKind,
    owner: &str,
    retention: u64,
    supersedes: bool,
    opened_ms: u64,
) -> Record {
    Record::StreamOpen {
        session: session.into(),
        incarnation: inc.into(),
        kind,
        owner: owner.into(),
        retention,
        supersedes,
        opened_ms,
        request_id: None,
    }
}

pub fn get_stream(session: &str, inc: &str, opened_ms: u64) -> Record {
    stream(session, inc, StreamKind::Get, OWNER_X, 0, true, opened_ms)
}

/// Events `first ..= last`, replica ids `r<seq>`.
pub fn events(session: &str, inc: &str, first: u64, last: u64) -> Record {
    Record::Events {
        session: session.into(),
        incarnation: inc.into(),
        first_seq: first,
        ids: (first..=last).map(id).collect(),
        long: Vec::new(),
        branch: 0,
        trimmed: 0,
    }
}

/// Events `first ..`, one per replica id given (any length): recorded form in `ids`, the full
/// id in `long` when it is long enough to need it and short enough to be kept, as a guard
/// builds them.
pub fn events_with(session: &str, inc: &str, first: u64, replica_ids: &[String]) -> Record {
    use mcp_resume_core::ownership::{recorded_id, LongId, MAX_LONG_ID_BYTES};
    let mut long = Vec::new();
    let mut ids = Vec::new();
    for (i, rid) in replica_ids.iter().enumerate() {
        let form = recorded_id(rid).into_owned();
        if form != *rid && rid.len() <= MAX_LONG_ID_BYTES {
            long.push(LongId {
                seq: first + i as u64,
                id: rid.clone(),
            });
        }
        ids.push(form);
    }
    let r = Record::Events {
        session: session.into(),
        incarnation: inc.into(),
        first_seq: first,
        ids,
        long,
        branch: 0,
        trimmed: 0,
    };
    r.validate().expect("a guard-built record is valid");
    r
}

/// A replica id of exactly `len` bytes, distinct per `tag`.
pub fn long_id(tag: u64, len: usize) -> String {
    let head = format!("L{tag}-");
    let mut s = head.clone();
    s.extend(std::iter::repeat_n('x', len - head.len()));
    s
}

pub fn id(seq: u64) -> String {
    format!("r{seq}")
}

pub fn ids(first: u64, last: u64) -> Vec<String> {
    (first..=last).map(id).collect()
}

pub fn lost(session: &str, inc: &str) -> Record {
    Record::StreamLost {
        session: session.into(),
        incarnation: inc.into(),
    }
}

pub fn gone(owner: &str) -> Record {
    Record::OwnerGone {
        owner: owner.into(),
    }
}

pub async fn apply<S: Store>(s: &S, records: &[Record]) {
    apply_at(s, records, T0).await
}

pub async fn apply_at<S: Store>(s: &S, records: &[Record], now: u64) {
    s.apply(records, now).await.expect("apply");
}

pub fn query(session: &str, inc: &str, kind: StreamKind, seq: u64) -> ResumeQuery {
    ResumeQuery {
        session: session.into(),
        incarnation: inc.into(),
        kind,
        seq,
        registration: None,
    }
}

/// Resolve as the handler does, the continuation's branch left out: the branch cases check
/// the numbers (through [`resolve_branched`]), every other case the verdict's facts.
pub async fn resolve_with<S: Store>(
    s: &S,
    q: &ResumeQuery,
    opts: ResumeOptions,
    now: u64,
) -> Resolution {
    let mut r = resolve_branched(s, q, opts, now).await;
    if let ResumeVerdict::Continue { branch, .. } = &mut r.verdict {
        *branch = None;
    }
    r
}

/// Resolve as the handler does, the continuation's branch number included.
pub async fn resolve_branched<S: Store>(
    s: &S,
    q: &ResumeQuery,
    opts: ResumeOptions,
    now: u64,
) -> Resolution {
    let clock = move || now;
    resolve(s, q, &opts, &clock, &Metrics::new())
        .await
        .expect("resolve")
}

pub fn no_wait() -> ResumeOptions {
    ResumeOptions {
        record_wait: Duration::ZERO,
        max_expected: 256,
    }
}

/// Resume without waiting, at T0.
pub async fn verdict<S: Store>(
    s: &S,
    session: &str,
    inc: &str,
    kind: StreamKind,
    seq: u64,
) -> ResumeVerdict {
    resolve_with(s, &query(session, inc, kind, seq), no_wait(), T0)
        .await
        .verdict
}

pub async fn verdict_get<S: Store>(s: &S, inc: &str, seq: u64) -> ResumeVerdict {
    verdict(s, S1, inc, StreamKind::Get, seq).await
}

pub fn new_stream(reason: Reason) -> ResumeVerdict {
    ResumeVerdict::NewStream {
        reason,
        request_id: None,
    }
}

pub fn cont(owner: &str, expected: Vec<String>, head: u64) -> ResumeVerdict {
    ResumeVerdict::Continue {
        owner: owner.into(),
        expected,
        head,
        resume_id: None,
        branch: None,
    }
}

pub fn cont_from(owner: &str, expected: Vec<String>, head: u64, resume_id: &str) -> ResumeVerdict {
    ResumeVerdict::Continue {
        owner: owner.into(),
        expected,
        head,
        resume_id: Some(resume_id.into()),
        branch: None,
    }
}

// ---------------- cases ----------------

pub async fn continue_with_expected<S: Store>(make: impl Fn(Limits) -> S) {
    let s = make(Limits::default());
    apply(&s, &[open(S1), get_stream(S1, A, T0), events(S1, A, 1, 5)]).await;
    assert_eq!(verdict_get(&s, A, 2).await, cont(OWNER_X, ids(3, 5), 5));
    assert_eq!(verdict_get(&s, A, 0).await, cont(OWNER_X, ids(1, 5), 5));
    // At the head: nothing to replay, still a continuation.
    assert_eq!(verdict_get(&s, A, 5).await, cont(OWNER_X, vec![], 5));
}

pub async fn every_reason<S: Store>(make: impl Fn(Limits) -> S) {
    let s = make(Limits::default());
    // Unknown session.
    assert_eq!(
        verdict_get(&s, A, 1).await,
        new_stream(Reason::SessionInactive)
    );
    apply(&s, &[open(S1), get_stream(S1, A, T0), events(S1, A, 1, 9)]).await;
    // Unknown incarnation, other kind, cursor past head.
    assert_eq!(
        verdict_get(&s, B, 1).await,
        new_stream(Reason::UnknownStream)
    );
    assert_eq!(
        verdict(&s, S1, A, StreamKind::Request, 1).await,
        new_stream(Reason::UnknownStream)
    );
    assert_eq!(
        verdict_get(&s, A, 10).await,
        new_stream(Reason::UnknownStream)
    );
    // Gap (retention).
    apply(
        &s,
        &[
            stream(S1, C, StreamKind::Request, OWNER_X, 3, false, T0),
            events(S1, C, 1, 9),
        ],
    )
    .await;
    assert_eq!(
        verdict(&s, S1, C, StreamKind::Request, 5).await,
        new_stream(Reason::Gap)
    );
    assert_eq!(
        verdict(&s, S1, C, StreamKind::Request, 6).await,
        cont(OWNER_X, ids(7, 9), 9)
    );
    // Superseded.
    apply(&s, &[get_stream(S1, B, T0 + 1)]).await;
    assert_eq!(verdict_get(&s, A, 9).await, new_stream(Reason::Superseded));
    // Owner unavailable (StreamLost).
    apply(&s, &[lost(S1, C)]).await;
    assert_eq!(
        verdict(&s, S1, C, StreamKind::Request, 6).await,
        new_stream(Reason::OwnerUnavailable)
    );
    // Session inactive once terminated, whatever else is true.
    apply(&s, &[end(S1, SessionEnd::Terminated)]).await;
    assert_eq!(
        verdict_get(&s, B, 0).await,
        new_stream(Reason::SessionInactive)
    );
}

pub async fn placeholder_until_stream_open<S: Store>(make: impl Fn(Limits) -> S) {
    let s = make(Limits::default());
    // Events (and even the session) before the StreamOpen lands: no owner yet.
    apply(&s, &[events(S1, A, 1, 4)]).await;
    assert_eq!(
        verdict_get(&s, A, 2).await,
        new_stream(Reason::SessionInactive)
    );
    // A StreamOpen for a session not opened yet is held (pending), not a session.
    apply(&s, &[get_stream(S1, A, T0)]).await;
    assert_eq!(
        verdict_get(&s, A, 2).await,
        new_stream(Reason::SessionInactive)
    );
    // The SessionOpen that was overtaken lands: everything held before becomes the session.
    apply(&s, &[open(S1)]).await;
    assert_eq!(verdict_get(&s, A, 2).await, cont(OWNER_X, ids(3, 4), 4));
    // A placeholder of an opened session: events without their StreamOpen.
    apply(&s, &[open(S2), events(S2, B, 1, 2)]).await;
    assert_eq!(
        verdict(&s, S2, B, StreamKind::Request, 0).await,
        new_stream(Reason::UnknownStream)
    );
    apply(
        &s,
        &[stream(S2, B, StreamKind::Request, OWNER_Y, 0, false, T0)],
    )
    .await;
    assert_eq!(
        verdict(&s, S2, B, StreamKind::Request, 0).await,
        cont(OWNER_Y, ids(1, 2), 2)
    );
}

/// Records for a session never opened (made-up ids: a 404 is recorded as a session end) create
/// no session: they neither count against the session cap nor evict a quiet opened session,
/// whatever their number, and they are bounded on their own.
pub async fn unopened_sessions_cost_nothing<S: Store>(make: impl Fn(Limits) -> S) {
    let s = make(Limits {
        max_sessions: 20,
        max_pending_sessions: 50,
        ..Limits::default()
    });
    // A quiet victim, then a full house of other real sessions.
    fill_one(&s, 1, T0).await;
    for n in 2..=20 {
        fill_one(&s, n, T0 + n).await;
    }
    for k in 0..1_000u64 {
        let key = session_n(0xf000_0000 + k);
        let r = match k % 4 {
            0 => end(&key, SessionEnd::Expired),
            1 => events(&key, A, 1, 2),
            2 => get_stream(&key, A, T0),
            _ => lost(&key, A),
        };
        apply_at(&s, &[r], T0 + 100 + k).await;
    }
    let now = T0 + 2_000;
    assert_eq!(
        verdict_at(&s, &session_n(1), 1, now).await,
        cont(OWNER_X, ids(2, 3), 3),
        "the quiet victim still continues"
    );
    let st = s.stats(now).await.unwrap();
    assert_eq!(st.sessions, 20, "{st:?}");
    assert!(st.pending <= 50, "{st:?}");
    assert_eq!(st.evicted, 0, "{st:?}");
    // A made-up session is still nothing a cursor can continue.
    assert_eq!(
        verdict_at(&s, &session_n(0xf000_0000 + 999), 0, now).await,
        new_stream(Reason::SessionInactive)
    );
    // Pending entries that never see their session_open go after the pending TTL.
    let later = now + Limits::default().pending_ttl_ms + 1;
    s.sweep(later).await.unwrap();
    let st = s.stats(later).await.unwrap();
    assert_eq!((st.sessions, st.pending), (20, 0), "{st:?}");
}

pub async fn supersede_in_order<S: Store>(make: impl Fn(Limits) -> S) {
    let s = make(Limits::default());
    apply(&s, &[open(S1), get_stream(S1, A, 100), events(S1, A, 1, 3)]).await;
    assert_eq!(verdict_get(&s, A, 3).await, cont(OWNER_X, vec![], 3));
    apply(&s, &[get_stream(S1, B, 200), events(S1, B, 1, 2)]).await;
    assert_eq!(verdict_get(&s, A, 3).await, new_stream(Reason::Superseded));
    assert_eq!(verdict_get(&s, B, 1).await, cont(OWNER_X, ids(2, 2), 2));
    // A continuation re-sends StreamOpen without `supersedes`: B stays current, A stays dead.
    apply(
        &s,
        &[stream(S1, B, StreamKind::Get, OWNER_X, 0, false, 250)],
    )
    .await;
    apply(
        &s,
        &[stream(S1, A, StreamKind::Get, OWNER_X, 0, false, 300)],
    )
    .await;
    assert_eq!(verdict_get(&s, B, 1).await, cont(OWNER_X, ids(2, 2), 2));
    assert_eq!(verdict_get(&s, A, 3).await, new_stream(Reason::Superseded));
    // Request streams never supersede and are never superseded.
    apply(
        &s,
        &[
            stream(S1, C, StreamKind::Request, OWNER_X, 0, false, 50),
            events(S1, C, 1, 1),
        ],
    )
    .await;
    apply(&s, &[get_stream(S1, D, 400)]).await;
    assert_eq!(
        verdict(&s, S1, C, StreamKind::Request, 1).await,
        cont(OWNER_X, vec![], 1)
    );
    assert_eq!(verdict_get(&s, B, 1).await, new_stream(Reason::Superseded));
}

/// The newest GET stream is the one whose StreamOpen the store applied last: the guard's
/// `opened_ms` (a gateway's clock) is accepted and ignored, so no clock skew can invert the
/// order; a replayed StreamOpen never makes an older stream newer.
pub async fn supersede_by_store_order<S: Store>(make: impl Fn(Limits) -> S) {
    let s = make(Limits::default());
    // B opened later on a gateway whose clock is behind: its opened_ms is smaller.
    apply(&s, &[open(S1), get_stream(S1, A, 200), events(S1, A, 1, 1)]).await;
    apply(&s, &[get_stream(S1, B, 100), events(S1, B, 1, 1)]).await;
    assert_eq!(verdict_get(&s, A, 1).await, new_stream(Reason::Superseded));
    assert_eq!(verdict_get(&s, B, 1).await, cont(OWNER_X, vec![], 1));
    // Within one batch, order is kept too.
    apply(
        &s,
        &[open(S2), get_stream(S2, D, 900), get_stream(S2, C, 100)],
    )
    .await;
    assert_eq!(
        verdict(&s, S2, D, StreamKind::Get, 0).await,
        new_stream(Reason::Superseded)
    );
    assert_eq!(
        verdict(&s, S2, C, StreamKind::Get, 0).await,
        cont(OWNER_X, vec![], 0)
    );
    // Replaying a whole batch (a retried one) changes nothing.
    apply(&s, &[get_stream(S2, D, 900), get_stream(S2, C, 100)]).await;
    apply(&s, &[get_stream(S1, A, 200)]).await;
    assert_eq!(
        verdict(&s, S2, D, StreamKind::Get, 0).await,
        new_stream(Reason::Superseded)
    );
    assert_eq!(
        verdict(&s, S2, C, StreamKind::Get, 0).await,
        cont(OWNER_X, vec![], 0)
    );
    assert_eq!(verdict_get(&s, A, 1).await, new_stream(Reason::Superseded));
    assert_eq!(verdict_get(&s, B, 1).await, cont(OWNER_X, vec![], 1));
}

pub async fn window_trim_and_gap<S: Store>(make: impl Fn(Limits) -> S) {
    let s = make(Limits {
        max_window: 4,
        ..Limits::default()
    });
    apply(&s, &[open(S1), get_stream(S1, A, T0), events(S1, A, 1, 10)]).await;
    // Only 7..=10 are still recorded.
    assert_eq!(verdict_get(&s, A, 6).await, cont(OWNER_X, ids(7, 10), 10));
    assert_eq!(verdict_get(&s, A, 5).await, new_stream(Reason::Gap));
    assert_eq!(verdict_get(&s, A, 0).await, new_stream(Reason::Gap));
    // A late, old batch does not push newer entries out.
    apply(&s, &[events(S1, A, 1, 3)]).await;
    assert_eq!(verdict_get(&s, A, 6).await, cont(OWNER_X, ids(7, 10), 10));

    // A hole (a batch that never landed) is a gap for cursors below it only.
    let s = make(Limits::default());
    apply(
        &s,
        &[
            open(S1),
            get_stream(S1, A, T0),
            events(S1, A, 1, 3),
            events(S1, A, 6, 8),
        ],
    )
    .await;
    assert_eq!(verdict_get(&s, A, 3).await, new_stream(Reason::Gap));
    assert_eq!(verdict_get(&s, A, 4).await, new_stream(Reason::Gap));
    assert_eq!(verdict_get(&s, A, 5).await, cont(OWNER_X, ids(6, 8), 8));
    // The hole fills: contiguous again.
    apply(&s, &[events(S1, A, 4, 5)]).await;
    assert_eq!(verdict_get(&s, A, 1).await, cont(OWNER_X, ids(2, 8), 8));
}

pub async fn retention_window<S: Store>(make: impl Fn(Limits) -> S) {
    let s = make(Limits::default());
    apply(
        &s,
        &[
            open(S1),
            stream(S1, A, StreamKind::Get, OWNER_X, 3, true, T0),
            events(S1, A, 1, 10),
        ],
    )
    .await;
    // The replica keeps 3 events: 8, 9, 10.
    assert_eq!(verdict_get(&s, A, 7).await, cont(OWNER_X, ids(8, 10), 10));
    assert_eq!(verdict_get(&s, A, 6).await, new_stream(Reason::Gap));
    // A continuation re-sends StreamOpen with the replica's current retention.
    apply(
        &s,
        &[stream(S1, A, StreamKind::Get, OWNER_X, 100, false, T0)],
    )
    .await;
    assert_eq!(verdict_get(&s, A, 6).await, cont(OWNER_X, ids(7, 10), 10));
    // Retention 0 = unknown: only the recorded window bounds it.
    apply(&s, &[stream(S1, A, StreamKind::Get, OWNER_X, 0, false, T0)]).await;
    assert_eq!(verdict_get(&s, A, 0).await, cont(OWNER_X, ids(1, 10), 10));
}

pub async fn owner_gone_epochs<S: Store>(make: impl Fn(Limits) -> S) {
    let s = make(Limits::default());
    apply(
        &s,
        &[
            open(S1),
            stream(S1, A, StreamKind::Request, OWNER_X, 0, false, T0),
            stream(S1, B, StreamKind::Request, OWNER_Y, 0, false, T0),
            events(S1, A, 1, 2),
            events(S1, B, 1, 2),
        ],
    )
    .await;
    apply(&s, &[gone(OWNER_X)]).await;
    // A new pod at the same address opens C after the OwnerGone.
    apply(
        &s,
        &[
            stream(S1, C, StreamKind::Request, OWNER_X, 0, false, T0 + 5),
            events(S1, C, 1, 2),
        ],
    )
    .await;
    let req = StreamKind::Request;
    assert_eq!(
        verdict(&s, S1, A, req, 1).await,
        new_stream(Reason::OwnerUnavailable)
    );
    assert_eq!(
        verdict(&s, S1, B, req, 1).await,
        cont(OWNER_Y, ids(2, 2), 2)
    );
    assert_eq!(
        verdict(&s, S1, C, req, 1).await,
        cont(OWNER_X, ids(2, 2), 2)
    );
    // A re-sent StreamOpen for A from the same address does not bring it back.
    apply(
        &s,
        &[stream(S1, A, StreamKind::Request, OWNER_X, 0, false, T0)],
    )
    .await;
    assert_eq!(
        verdict(&s, S1, A, req, 1).await,
        new_stream(Reason::OwnerUnavailable)
    );
    // Gone again: C (opened before this one) is lost too; a repeat is harmless.
    apply(&s, &[gone(OWNER_X), gone(OWNER_X)]).await;
    assert_eq!(
        verdict(&s, S1, C, req, 1).await,
        new_stream(Reason::OwnerUnavailable)
    );
    assert_eq!(
        verdict(&s, S1, B, req, 1).await,
        cont(OWNER_Y, ids(2, 2), 2)
    );
}

pub async fn stream_lost_is_sticky<S: Store>(make: impl Fn(Limits) -> S) {
    let s = make(Limits::default());
    // StreamLost may land before the StreamOpen it refers to.
    apply(&s, &[open(S1), lost(S1, A)]).await;
    apply(&s, &[get_stream(S1, A, T0), events(S1, A, 1, 3)]).await;
    assert_eq!(
        verdict_get(&s, A, 1).await,
        new_stream(Reason::OwnerUnavailable)
    );
    apply(&s, &[get_stream(S1, A, T0)]).await;
    assert_eq!(
        verdict_get(&s, A, 1).await,
        new_stream(Reason::OwnerUnavailable)
    );
}

/// A StreamOpen's JSON-RPC id is kept per incarnation and handed back in a `new_stream`
/// verdict for it; a StreamOpen without one (an older guard, a continuation) keeps it.
pub async fn request_id_round_trip<S: Store>(make: impl Fn(Limits) -> S) {
    let s = make(Limits::default());
    let with_id = |inc: &str, id: &str| Record::StreamOpen {
        session: S1.into(),
        incarnation: inc.into(),
        kind: StreamKind::Request,
        owner: OWNER_X.into(),
        retention: 3,
        supersedes: false,
        opened_ms: T0,
        request_id: Some(id.into()),
    };
    apply(
        &s,
        &[
            open(S1),
            with_id(A, "42"),
            events(S1, A, 1, 9),
            with_id(B, r#""req-7""#),
            events(S1, B, 1, 1),
            stream(S1, A, StreamKind::Request, OWNER_X, 3, false, T0),
        ],
    )
    .await;
    let req = StreamKind::Request;
    assert_eq!(
        verdict(&s, S1, A, req, 1).await,
        ResumeVerdict::NewStream {
            reason: Reason::Gap,
            request_id: Some("42".into())
        }
    );
    // A continuation is unchanged by it.
    assert_eq!(
        verdict(&s, S1, A, req, 8).await,
        cont(OWNER_X, ids(9, 9), 9)
    );
    apply(&s, &[lost(S1, B)]).await;
    assert_eq!(
        verdict(&s, S1, B, req, 1).await,
        ResumeVerdict::NewStream {
            reason: Reason::OwnerUnavailable,
            request_id: Some(r#""req-7""#.into())
        }
    );
    // Unknown incarnation: nothing to hand back.
    assert_eq!(
        verdict(&s, S1, C, req, 1).await,
        new_stream(Reason::UnknownStream)
    );
}

pub fn failed(session: &str, inc: &str) -> Record {
    Record::OwnerFailed {
        session: session.into(),
        incarnation: inc.into(),
    }
}

/// A blip at the owner is not a loss: the incarnation is lost only when failures stood through
/// the whole window (an `owner_failed` at each end of it) with no answer from the owner between.
/// Events from the owner, or a continuation's clean end, clear a failure; repeats never push
/// the window back.
pub async fn owner_failure_window<S: Store>(make: impl Fn(Limits) -> S) {
    let window = 30_000;
    let s = make(Limits {
        owner_failure_window_ms: window,
        ..Limits::default()
    });
    apply(&s, &[open(S1), get_stream(S1, A, T0), events(S1, A, 1, 3)]).await;
    let right = cont(OWNER_X, ids(3, 3), 3);
    apply_at(&s, &[failed(S1, A)], T0 + 1_000).await;
    assert_eq!(verdict_at(&s, S1, 2, T0 + 2_000).await, right, "a blip");
    assert_eq!(verdict_at(&s, S1, 2, T0 + 1_000 + window).await, right);
    // A quiet stream after one blip: no failure stood through the window, no loss.
    assert_eq!(
        verdict_at(&s, S1, 2, T0 + 35_000).await,
        right,
        "one healed blip never turns into a loss"
    );
    // The owner relayed again: the failure passed; a new one starts a new window.
    apply_at(&s, &[events(S1, A, 4, 4)], T0 + 36_000).await;
    let right = cont(OWNER_X, ids(3, 4), 4);
    assert_eq!(verdict_at(&s, S1, 2, T0 + 40_000).await, right);
    apply_at(&s, &[failed(S1, A)], T0 + 50_000).await;
    apply_at(&s, &[failed(S1, A)], T0 + 50_000 + window - 10).await;
    assert_eq!(verdict_at(&s, S1, 2, T0 + 50_001 + window).await, right);
    // A served continuation (its clean end) clears the failures before it.
    let b = continue_branch_of(&s, S1, A, StreamKind::Get, 4, T0 + 50_002 + window).await;
    s.end_branch(S1, A, b, T0 + 50_003 + window).await.unwrap();
    apply_at(&s, &[failed(S1, A)], T0 + 50_004 + window).await;
    assert_eq!(verdict_at(&s, S1, 2, T0 + 50_005 + window).await, right);
    // Failures that stood through the whole window: lost.
    apply_at(&s, &[failed(S1, A)], T0 + 50_004 + 2 * window).await;
    assert_eq!(verdict_at(&s, S1, 2, T0 + 50_005 + 2 * window).await, right);
    apply_at(&s, &[failed(S1, A)], T0 + 50_006 + 2 * window).await;
    let gone = new_stream(Reason::OwnerUnavailable);
    assert_eq!(verdict_at(&s, S1, 2, T0 + 50_007 + 2 * window).await, gone);
    // Lost for good: later events do not bring it back.
    apply_at(&s, &[events(S1, A, 5, 5)], T0 + 50_008 + 2 * window).await;
    assert_eq!(verdict_at(&s, S1, 2, T0 + 50_009 + 2 * window).await, gone);
}

pub async fn session_end<S: Store>(make: impl Fn(Limits) -> S) {
    let s = make(Limits::default());
    let setup = |sess: &str| vec![open(sess), get_stream(sess, A, T0), events(sess, A, 1, 2)];
    apply(&s, &setup(S1)).await;
    apply(&s, &[end(S1, SessionEnd::Terminated)]).await;
    assert_eq!(
        verdict_get(&s, A, 1).await,
        new_stream(Reason::SessionInactive)
    );
    // Ended is final: a late SessionOpen or StreamOpen does not revive it.
    apply(
        &s,
        &[open(S1), get_stream(S1, B, T0 + 1), events(S1, B, 1, 1)],
    )
    .await;
    assert_eq!(
        verdict_get(&s, B, 1).await,
        new_stream(Reason::SessionInactive)
    );

    apply(&s, &setup(S2)).await;
    apply(&s, &[end(S2, SessionEnd::Expired)]).await;
    assert_eq!(
        verdict(&s, S2, A, StreamKind::Get, 1).await,
        new_stream(Reason::SessionInactive)
    );

    // SessionEnd for a session never opened still sticks.
    let s = make(Limits::default());
    apply(&s, &[end(S1, SessionEnd::Expired)]).await;
    apply(&s, &setup(S1)).await;
    assert_eq!(
        verdict_get(&s, A, 1).await,
        new_stream(Reason::SessionInactive)
    );
}

pub async fn idle_ttl<S: Store>(make: impl Fn(Limits) -> S) {
    let ttl = 1_000;
    let s = make(Limits {
        session_idle_ttl_ms: ttl,
        ..Limits::default()
    });
    apply_at(
        &s,
        &[open(S1), get_stream(S1, A, T0), events(S1, A, 1, 2)],
        T0,
    )
    .await;
    apply_at(&s, &[open(S2)], T0).await;
    let q = query(S1, A, StreamKind::Get, 1);
    let at = |now| resolve_with(&s, &q, no_wait(), now);
    // A resume touches the idle timer...
    assert_eq!(at(T0 + 900).await.verdict, cont(OWNER_X, ids(2, 2), 2));
    assert_eq!(at(T0 + 1_800).await.verdict, cont(OWNER_X, ids(2, 2), 2));
    // ...and so does a record.
    apply_at(&s, &[events(S1, A, 3, 3)], T0 + 2_700).await;
    assert_eq!(at(T0 + 3_600).await.verdict, cont(OWNER_X, ids(2, 3), 3));
    // Untouched for longer than the TTL: expired.
    assert_eq!(
        at(T0 + 4_601).await.verdict,
        new_stream(Reason::SessionInactive)
    );
    // An expired resume does not touch it back to life.
    assert_eq!(
        at(T0 + 4_602).await.verdict,
        new_stream(Reason::SessionInactive)
    );
    // The sweep frees both idle sessions.
    assert_eq!(s.stats(T0 + 5_000).await.unwrap().sessions, 2);
    assert_eq!(s.sweep(T0 + 5_000).await.unwrap(), 2);
    assert_eq!(s.stats(T0 + 5_000).await.unwrap().sessions, 0);
    assert_eq!(
        at(T0 + 5_001).await.verdict,
        new_stream(Reason::SessionInactive)
    );
}

pub async fn record_in_flight<S: Store + 'static>(make: impl Fn(Limits) -> S) {
    let s = std::sync::Arc::new(make(Limits::default()));
    let opts = ResumeOptions {
        record_wait: Duration::from_secs(5),
        max_expected: 256,
    };
    // The client got event 3 and reconnected before any record landed.
    let q = query(S1, A, StreamKind::Get, 3);
    let writer = {
        let s = s.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(30)).await;
            apply(s.as_ref(), &[open(S1)]).await;
            tokio::time::sleep(Duration::from_millis(30)).await;
            apply(s.as_ref(), &[get_stream(S1, A, T0), events(S1, A, 1, 2)]).await;
            tokio::time::sleep(Duration::from_millis(30)).await;
            apply(s.as_ref(), &[events(S1, A, 3, 4)]).await;
        })
    };
    let started = std::time::Instant::now();
    let r = resolve_with(s.as_ref(), &q, opts, T0).await;
    assert_eq!(r.verdict, cont(OWNER_X, ids(4, 4), 4));
    assert_eq!(r.waited, Some(true));
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "returned as soon as the records landed"
    );
    writer.await.unwrap();

    // A hole that fills while waiting.
    apply(
        s.as_ref(),
        &[
            open(S2),
            get_stream(S2, B, T0),
            events(S2, B, 1, 2),
            events(S2, B, 5, 6),
        ],
    )
    .await;
    let writer = {
        let s = s.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(30)).await;
            apply(s.as_ref(), &[events(S2, B, 3, 4)]).await;
        })
    };
    let r = resolve_with(s.as_ref(), &query(S2, B, StreamKind::Get, 2), opts, T0).await;
    assert_eq!(r.verdict, cont(OWNER_X, ids(3, 6), 6));
    writer.await.unwrap();

    // Records that never come: the wait ends at the deadline with the last answer.
    let short = ResumeOptions {
        record_wait: Duration::from_millis(60),
        ..opts
    };
    let r = resolve_with(s.as_ref(), &query(S1, A, StreamKind::Get, 9), short, T0).await;
    assert_eq!(r.verdict, new_stream(Reason::UnknownStream));
    assert_eq!(r.waited, Some(false));
    // Final answers never wait.
    apply(s.as_ref(), &[end(S2, SessionEnd::Terminated)]).await;
    let started = std::time::Instant::now();
    let r = resolve_with(s.as_ref(), &query(S2, B, StreamKind::Get, 2), opts, T0).await;
    assert_eq!(r.verdict, new_stream(Reason::SessionInactive));
    assert_eq!(r.waited, None);
    assert!(started.elapsed() < Duration::from_secs(1));
}

/// `events` from `first ..= last` that say the `trimmed` seqs before them were left out.
pub fn trimmed_events(inc: &str, first: u64, last: u64, trimmed: u64) -> Record {
    let Record::Events {
        session,
        incarnation,
        first_seq,
        ids,
        long,
        branch,
        ..
    } = events(S1, inc, first, last)
    else {
        unreachable!()
    };
    let r = Record::Events {
        session,
        incarnation,
        first_seq,
        ids,
        long,
        branch,
        trimmed,
    };
    r.validate().expect("a guard-built record is valid");
    r
}

pub async fn guard_trimmed_hole_is_final<S: Store + 'static>(make: impl Fn(Limits) -> S) {
    let s = make(Limits::default());
    let opts = ResumeOptions {
        record_wait: Duration::from_secs(5),
        max_expected: 256,
    };
    // The guard sent 1..=3, then left 4..=9 out of its queue (a bulk stream past its window).
    apply(
        &s,
        &[
            open(S1),
            get_stream(S1, A, T0),
            events(S1, A, 1, 3),
            trimmed_events(A, 10, 12, 6),
        ],
    )
    .await;
    // The newest seqs continue, as always.
    assert_eq!(verdict_get(&s, A, 9).await, cont(OWNER_X, ids(10, 12), 12));
    // A cursor below the trimmed seqs: a gap, at once, not after waiting for them.
    for seq in [3, 5, 8] {
        let started = std::time::Instant::now();
        let r = resolve_with(&s, &query(S1, A, StreamKind::Get, seq), opts, T0).await;
        assert_eq!(r.verdict, new_stream(Reason::Gap), "seq {seq}");
        assert_eq!(r.waited, None, "seq {seq}: nothing to wait for");
        assert!(started.elapsed() < Duration::from_secs(2));
    }
    // An untrimmed hole above the floor is still awaited (a batch in flight).
    apply(&s, &[events(S1, A, 14, 15)]).await;
    let short = ResumeOptions {
        record_wait: Duration::from_millis(60),
        ..opts
    };
    let r = resolve_with(&s, &query(S1, A, StreamKind::Get, 12), short, T0).await;
    assert_eq!(r.verdict, new_stream(Reason::Gap));
    assert_eq!(r.waited, Some(false));
    // Old records without `trimmed` read as before: a hole may still fill.
    apply(
        &s,
        &[
            get_stream(S1, B, T0),
            events(S1, B, 1, 3),
            events(S1, B, 10, 12),
        ],
    )
    .await;
    let r = resolve_with(&s, &query(S1, B, StreamKind::Get, 5), short, T0).await;
    assert_eq!(r.waited, Some(false));
}

pub async fn max_incarnations_eviction<S: Store>(make: impl Fn(Limits) -> S) {
    let s = make(Limits {
        max_incarnations_per_session: 3,
        ..Limits::default()
    });
    let req = StreamKind::Request;
    apply(&s, &[open(S1)]).await;
    for inc in [A, B, C] {
        apply(
            &s,
            &[
                stream(S1, inc, req, OWNER_X, 0, false, T0),
                events(S1, inc, 1, 1),
            ],
        )
        .await;
    }
    // A is recorded again (still live), so B is now the least recently recorded.
    apply(&s, &[events(S1, A, 2, 2)]).await;
    apply(
        &s,
        &[
            stream(S1, D, req, OWNER_X, 0, false, T0),
            events(S1, D, 1, 1),
        ],
    )
    .await;
    assert_eq!(
        verdict(&s, S1, B, req, 1).await,
        new_stream(Reason::UnknownStream)
    );
    assert_eq!(
        verdict(&s, S1, A, req, 1).await,
        cont(OWNER_X, ids(2, 2), 2)
    );
    assert_eq!(verdict(&s, S1, C, req, 1).await, cont(OWNER_X, vec![], 1));
    assert_eq!(verdict(&s, S1, D, req, 1).await, cont(OWNER_X, vec![], 1));
    let stats = s.stats(T0).await.unwrap();
    assert_eq!((stats.sessions, stats.incarnations), (1, 3));
}

pub async fn expected_content_and_cap<S: Store>(make: impl Fn(Limits) -> S) {
    let s = make(Limits::default());
    // Batches out of order and overlapping.
    apply(
        &s,
        &[
            open(S1),
            get_stream(S1, A, T0),
            events(S1, A, 6, 10),
            events(S1, A, 1, 5),
            events(S1, A, 4, 7),
        ],
    )
    .await;
    let cap = |n| ResumeOptions {
        record_wait: Duration::ZERO,
        max_expected: n,
    };
    let q = query(S1, A, StreamKind::Get, 2);
    assert_eq!(
        resolve_with(&s, &q, cap(3), T0).await.verdict,
        cont(OWNER_X, ids(3, 5), 10)
    );
    assert_eq!(
        resolve_with(&s, &q, cap(0), T0).await.verdict,
        cont(OWNER_X, vec![], 10)
    );
    assert_eq!(
        resolve_with(&s, &q, cap(100), T0).await.verdict,
        cont(OWNER_X, ids(3, 10), 10)
    );
    // The ids are the replica's, verbatim (any string, including non-numeric and unicode).
    let odd = vec!["a:b:c".to_string(), "ü-42".to_string(), String::new()];
    apply(
        &s,
        &[Record::Events {
            session: S1.into(),
            incarnation: A.into(),
            first_seq: 11,
            ids: odd.clone(),
            long: Vec::new(),
            branch: 0,
            trimmed: 0,
        }],
    )
    .await;
    assert_eq!(verdict_get(&s, A, 10).await, cont(OWNER_X, odd, 13));
    // Recorded events as a guard writes them (id, LF, content digest), a long id's digest form
    // among them, come back verbatim: the guard checks a replay's content against them.
    use mcp_resume_core::ownership::recorded_event;
    let long = long_id(1, 300);
    let recorded = vec![
        recorded_event("e14", 0x0123_4567_89ab_cdef),
        recorded_event(&long, u64::MAX),
    ];
    let r = Record::Events {
        session: S1.into(),
        incarnation: A.into(),
        first_seq: 14,
        ids: recorded.clone(),
        long: vec![mcp_resume_core::ownership::LongId { seq: 15, id: long }],
        branch: 0,
        trimmed: 0,
    };
    r.validate().expect("a guard-built record is valid");
    apply(&s, &[r]).await;
    assert_eq!(verdict_get(&s, A, 13).await, cont(OWNER_X, recorded, 15));
}

pub async fn health_and_stats<S: Store>(make: impl Fn(Limits) -> S) {
    let s = make(Limits::default());
    s.health().await.unwrap();
    assert!(!s.name().is_empty());
    assert_eq!(s.stats(T0).await.unwrap().sessions, 0);
    apply(
        &s,
        &[
            open(S1),
            open(S2),
            get_stream(S1, A, T0),
            events(S2, B, 1, 1),
        ],
    )
    .await;
    let st = s.stats(T0).await.unwrap();
    assert_eq!((st.sessions, st.incarnations), (2, 2));
    // Every apply bumps the change version.
    let rx = s.changes();
    apply(&s, &[gone(OWNER_Y)]).await;
    assert!(rx.has_changed().unwrap());
}

/// Linearizability: supersedes (new GET streams), trims (events sliding a small window), a
/// terminate (of a second session) and resumes run concurrently; every resume's verdict must be one that the store's state at
/// SOME instant inside the resume's own [start, end] interval produces. A snapshot torn
/// between two records, or a record applied in two visible steps, fails this.
pub async fn linearizable_under_concurrency<S: Store + 'static>(make: impl Fn(Limits) -> S) {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::Instant;

    const WINDOW: u64 = 8;
    const INCS: u64 = 6;
    let inc = |k: u64| format!("{:016x}", 0xa0 + k);
    let s = Arc::new(make(Limits {
        max_window: WINDOW as usize,
        ..Limits::default()
    }));
    apply(
        s.as_ref(),
        &[
            open(S1),
            get_stream(S1, &inc(0), 100),
            events(S1, &inc(0), 1, 3),
            open(S2),
            get_stream(S2, &inc(0), 100),
            events(S2, &inc(0), 1, 3),
        ],
    )
    .await;
    let origin = Instant::now();
    let at = move || origin.elapsed().as_micros() as u64;
    // (start, end, value after) per writer; writers are sequential, so each log is ordered.
    let sup_log: Arc<Mutex<Vec<(u64, u64, u64)>>> = Arc::new(Mutex::new(vec![(0, 0, 0)]));
    let head_log: Arc<Mutex<Vec<(u64, u64, u64)>>> = Arc::new(Mutex::new(vec![(0, 0, 3)]));
    let end_log: Arc<Mutex<Vec<(u64, u64, u64)>>> = Arc::new(Mutex::new(vec![(0, 0, 0)]));
    let known_head = Arc::new(AtomicU64::new(3));
    let done = Arc::new(AtomicU64::new(0));
    let mut rng_seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next_rand = move || {
        rng_seed ^= rng_seed << 13;
        rng_seed ^= rng_seed >> 7;
        rng_seed ^= rng_seed << 17;
        rng_seed
    };

    let supersede = {
        let (s, log, done) = (s.clone(), sup_log.clone(), done.clone());
        let delays: Vec<u64> = (0..INCS).map(|_| next_rand() % 12).collect();
        tokio::spawn(async move {
            for k in 1..INCS {
                tokio::time::sleep(Duration::from_millis(delays[k as usize])).await;
                let start = at();
                apply(s.as_ref(), &[get_stream(S1, &inc(k), 100 + k)]).await;
                log.lock().unwrap().push((start, at(), k));
            }
            done.fetch_add(1, Ordering::SeqCst);
        })
    };
    let trim = {
        let (s, log, known, done) = (
            s.clone(),
            head_log.clone(),
            known_head.clone(),
            done.clone(),
        );
        let sizes: Vec<u64> = (0..40).map(|_| 1 + next_rand() % 3).collect();
        tokio::spawn(async move {
            let mut head = 3;
            for n in sizes {
                tokio::time::sleep(Duration::from_millis(1)).await;
                let start = at();
                apply(s.as_ref(), &[events(S1, &inc(0), head + 1, head + n)]).await;
                head += n;
                log.lock().unwrap().push((start, at(), head));
                known.store(head, Ordering::SeqCst);
            }
            done.fetch_add(1, Ordering::SeqCst);
        })
    };
    let terminate = {
        let (s, log, done) = (s.clone(), end_log.clone(), done.clone());
        let delay = 10 + next_rand() % 30;
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(delay)).await;
            let start = at();
            apply(s.as_ref(), &[end(S2, SessionEnd::Terminated)]).await;
            log.lock().unwrap().push((start, at(), 1));
            done.fetch_add(1, Ordering::SeqCst);
        })
    };
    let mut readers = Vec::new();
    for r in 0..6u64 {
        let (s, known, done) = (s.clone(), known_head.clone(), done.clone());
        let mut seed = 0x2545_f491_4f6c_dd1d ^ (r + 1).wrapping_mul(0x9e37_79b9);
        readers.push(tokio::spawn(async move {
            let mut rand = move || {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed
            };
            let mut out = Vec::new();
            while done.load(Ordering::SeqCst) < 3 || out.len() < 20 {
                if rand() % 4 == 0 {
                    // The other session: a fixed stream, terminated at some point.
                    let start = at();
                    let v = verdict(s.as_ref(), S2, &inc(0), StreamKind::Get, 2).await;
                    out.push((start, at(), u64::MAX, 2, v));
                    continue;
                }
                let k = rand() % INCS;
                let q = if k == 0 {
                    let h = known.load(Ordering::SeqCst);
                    h.saturating_sub(rand() % (WINDOW + 5))
                } else {
                    0
                };
                let start = at();
                let v = verdict(s.as_ref(), S1, &inc(k), StreamKind::Get, q).await;
                out.push((start, at(), k, q, v));
                tokio::task::yield_now().await;
            }
            out
        }));
    }
    supersede.await.unwrap();
    trim.await.unwrap();
    terminate.await.unwrap();
    let end_log = end_log.lock().unwrap().clone();
    let sup_log = sup_log.lock().unwrap().clone();
    let head_log = head_log.lock().unwrap().clone();

    // Values a variable may have at instant t: after the last write that ended by t, or
    // after the (single, writers are sequential) write in progress at t.
    fn possible(log: &[(u64, u64, u64)], t: u64) -> Vec<u64> {
        let mut out = Vec::new();
        let mut last = log[0].2;
        for &(start, end, v) in log {
            if end <= t {
                last = v;
            } else if start <= t {
                out.push(v);
            }
        }
        out.push(last);
        out
    }
    let model = |k: u64, q: u64, sup: u64, head: u64| -> ResumeVerdict {
        if sup < k {
            return new_stream(Reason::UnknownStream); // its StreamOpen has not landed
        }
        let h = if k == 0 { head } else { 0 };
        if q > h {
            return new_stream(Reason::UnknownStream);
        }
        if h - q > WINDOW {
            return new_stream(Reason::Gap);
        }
        if sup > k {
            return new_stream(Reason::Superseded);
        }
        cont(OWNER_X, ids(q + 1, h), h)
    };
    let mut checked = 0;
    let mut seen = std::collections::BTreeMap::<&'static str, usize>::new();
    for reader in readers {
        for (start, end, k, q, got) in reader.await.unwrap() {
            let mut instants = vec![start, end];
            for &(a, b, _) in sup_log.iter().chain(head_log.iter()).chain(end_log.iter()) {
                instants.extend([a, b].into_iter().filter(|t| (start..=end).contains(t)));
            }
            let ok = if k == u64::MAX {
                instants.iter().any(|&t| {
                    possible(&end_log, t).into_iter().any(|ended| {
                        got == if ended == 1 {
                            new_stream(Reason::SessionInactive)
                        } else {
                            cont(OWNER_X, ids(3, 3), 3)
                        }
                    })
                })
            } else {
                instants.iter().any(|&t| {
                    possible(&sup_log, t).into_iter().any(|sup| {
                        possible(&head_log, t)
                            .into_iter()
                            .any(|head| model(k, q, sup, head) == got)
                    })
                })
            };
            assert!(
                ok,
                "resume (inc {k}, seq {q}) in [{start}, {end}] µs got {got:?}: no instant in \
                 that interval has a state that answers this\nsupersedes {sup_log:?}\nheads {head_log:?}"
            );
            let name = match &got {
                ResumeVerdict::Continue { .. } => "continue",
                ResumeVerdict::NewStream { reason, .. } => reason.as_str(),
            };
            *seen.entry(name).or_default() += 1;
            checked += 1;
        }
    }
    assert!(checked >= 120, "{checked}");
    // The run really mixed the outcomes it is about.
    for name in ["continue", "superseded", "gap", "session_inactive"] {
        assert!(
            seen.get(name).copied().unwrap_or(0) > 0,
            "no {name} in {seen:?}"
        );
    }
}

/// Long replica ids: recorded by digest, their full form kept for the newest LONG_IDS_KEPT
/// seqs, and handed back as `resume_id` for a cursor on such a seq.
pub async fn long_ids_round_trip<S: Store>(make: impl Fn(Limits) -> S) {
    use mcp_resume_core::ownership::{recorded_id, LONG_IDS_KEPT};
    let s = make(Limits::default());
    let l1500 = long_id(1, 1500);
    let l16k = long_id(2, 16 * 1024);
    let replica = vec![id(1), l1500.clone(), id(3), l16k.clone(), id(5)];
    apply(
        &s,
        &[
            open(S1),
            get_stream(S1, A, T0),
            events_with(S1, A, 1, &replica),
        ],
    )
    .await;
    let form = |r: &String| recorded_id(r).into_owned();
    // A cursor on a short id: no resume_id. Expected ids are the recorded forms.
    assert_eq!(
        verdict_get(&s, A, 1).await,
        cont(OWNER_X, replica[1..].iter().map(form).collect(), 5)
    );
    assert_eq!(
        verdict_get(&s, A, 2).await,
        cont_from(OWNER_X, replica[2..].iter().map(form).collect(), 5, &l1500)
    );
    assert_eq!(
        verdict_get(&s, A, 4).await,
        cont_from(OWNER_X, vec![id(5)], 5, &l16k)
    );
    // An id too long to keep (digest only): a cursor on it cannot be resumed.
    let huge = long_id(3, mcp_resume_core::ownership::MAX_LONG_ID_BYTES + 1);
    apply(&s, &[events_with(S1, A, 6, &[huge.clone(), id(7)])]).await;
    assert_eq!(
        verdict_get(&s, A, 6).await,
        new_stream(Reason::UnknownStream)
    );
    assert_eq!(
        verdict_get(&s, A, 5).await,
        cont(OWNER_X, vec![form(&huge), id(7)], 7)
    );

    // Bounded: only the newest LONG_IDS_KEPT long ids keep their full form, whatever order
    // the batches land in.
    let n = LONG_IDS_KEPT as u64 + 4;
    let many: Vec<String> = (0..n).map(|k| long_id(100 + k, 200)).collect();
    apply(&s, &[events_with(S1, B, 11, &many[4..])]).await;
    apply(
        &s,
        &[stream(S1, B, StreamKind::Request, OWNER_X, 0, false, T0)],
    )
    .await;
    apply(&s, &[events_with(S1, B, 7, &many[..4])]).await;
    for k in 0..n {
        let v = verdict(&s, S1, B, StreamKind::Request, 7 + k).await;
        if k < 4 {
            assert_eq!(v, new_stream(Reason::UnknownStream), "seq {}", 7 + k);
        } else {
            let ResumeVerdict::Continue { resume_id, .. } = v else {
                panic!("seq {}: {v:?}", 7 + k)
            };
            assert_eq!(resume_id.as_deref(), Some(many[k as usize].as_str()));
        }
    }
}

/// A session key per number.
pub fn session_n(n: u64) -> String {
    format!("{n:032x}")
}

/// Open session `n` with one GET stream and events 1..=3, at `now`.
pub async fn fill_one<S: Store>(s: &S, n: u64, now: u64) {
    let key = session_n(n);
    apply_at(
        s,
        &[open(&key), get_stream(&key, A, now), events(&key, A, 1, 3)],
        now,
    )
    .await;
}

pub async fn verdict_at<S: Store>(s: &S, session: &str, seq: u64, now: u64) -> ResumeVerdict {
    resolve_with(s, &query(session, A, StreamKind::Get, seq), no_wait(), now)
        .await
        .verdict
}

/// The session cap: filling the store far past it refuses new sessions (`store_full`) rather
/// than evicting sessions active within the idle TTL; sessions idle past the TTL make room.
/// Cursors of a refused session read `records_lost`, not `session_inactive`.
pub async fn session_cap_refuses_new_sessions<S: Store>(make: impl Fn(Limits) -> S) {
    const CAP: usize = 20;
    let ttl = 10_000;
    let s = make(Limits {
        max_sessions: CAP,
        session_idle_ttl_ms: ttl,
        ..Limits::default()
    });
    for n in 1..=CAP as u64 {
        fill_one(&s, n, T0).await;
    }
    let mut refused = 0;
    for k in 0..100u64 {
        let now = T0 + 10 * (k + 1);
        let key = session_n(1000 + k);
        let done = s
            .apply(
                &[open(&key), get_stream(&key, A, now), events(&key, A, 1, 3)],
                now,
            )
            .await
            .unwrap();
        assert_eq!(done.refused.len(), 1, "{done:?}");
        assert_eq!(done.refused[0].index, 0);
        assert_eq!(done.refused[0].error, STORE_FULL);
        assert!(
            done.refused[0].detail.contains("--max-sessions"),
            "{done:?}"
        );
        refused += 1;
        let st = s.stats(now).await.unwrap();
        assert!(st.sessions <= CAP as u64, "{st:?}");
    }
    assert_eq!(refused, 100);
    let now = T0 + 2_000;
    for n in 1..=CAP as u64 {
        assert_eq!(
            verdict_at(&s, &session_n(n), 1, now).await,
            cont(OWNER_X, ids(2, 3), 3),
            "session {n}, active within the TTL, is kept"
        );
    }
    assert_eq!(
        verdict_at(&s, &session_n(1050), 1, now).await,
        new_stream(Reason::RecordsLost),
        "a refused session says why its cursor cannot continue"
    );
    assert_eq!(s.stats(now).await.unwrap().evicted, 0);
    // Sessions 1..=10 stay in use; 11..=20 go idle past the TTL and make room.
    let later = now + ttl + 500;
    for n in 1..=10 {
        assert_eq!(
            verdict_at(&s, &session_n(n), 1, now + ttl - 100).await,
            cont(OWNER_X, ids(2, 3), 3)
        );
    }
    for k in 0..10u64 {
        let key = session_n(2000 + k);
        let done = s.apply(&[open(&key)], later).await.unwrap();
        assert!(
            done.refused.is_empty(),
            "room made of idle sessions: {done:?}"
        );
    }
    let done = s.apply(&[open(&session_n(3000))], later).await.unwrap();
    assert_eq!(done.refused.len(), 1, "{done:?}");
    for n in 1..=10 {
        assert_eq!(
            verdict_at(&s, &session_n(n), 1, later).await,
            cont(OWNER_X, ids(2, 3), 3)
        );
    }
    // A session open replayed (already open) is never refused.
    let done = s.apply(&[open(&session_n(1))], later).await.unwrap();
    assert!(done.refused.is_empty(), "{done:?}");
}

/// Owner epochs are forgotten once old, without bringing back an incarnation they made lost.
pub async fn owner_epochs_expire<S: Store>(make: impl Fn(Limits) -> S) {
    let s = make(Limits {
        session_idle_ttl_ms: 1_000,
        ..Limits::default()
    });
    apply(
        &s,
        &[
            open(S1),
            stream(S1, A, StreamKind::Request, OWNER_X, 0, false, T0),
            events(S1, A, 1, 2),
        ],
    )
    .await;
    apply(&s, &[gone(OWNER_X)]).await;
    let lost = new_stream(Reason::OwnerUnavailable);
    let q = query(S1, A, StreamKind::Request, 1);
    // Keep the session in use far past every expiry (the Redis store keeps epochs longest).
    let end = T0 + 4 * (1_000 + crate_keep_grace_ms()) + 1_000;
    let mut now = T0;
    while now < end {
        assert_eq!(
            resolve_with(&s, &q, no_wait(), now).await.verdict,
            lost,
            "at {now}"
        );
        s.sweep(now).await.unwrap();
        now += 500;
    }
    assert_eq!(
        s.stats(now).await.unwrap().owners,
        0,
        "the epoch was forgotten"
    );
    assert_eq!(resolve_with(&s, &q, no_wait(), now).await.verdict, lost);
    // A later owner_gone still covers incarnations opened before it, after the forgetting.
    apply_at(
        &s,
        &[
            stream(S1, B, StreamKind::Request, OWNER_X, 0, false, now),
            events(S1, B, 1, 2),
        ],
        now,
    )
    .await;
    let qb = query(S1, B, StreamKind::Request, 1);
    assert_eq!(
        resolve_with(&s, &qb, no_wait(), now).await.verdict,
        cont(OWNER_X, ids(2, 2), 2)
    );
    apply_at(&s, &[gone(OWNER_X)], now + 1).await;
    assert_eq!(
        resolve_with(&s, &qb, no_wait(), now + 1).await.verdict,
        lost
    );
}

// ---------------- branches (docs/forks.md) ----------------

/// A request stream of S1 at OWNER_X.
pub fn req_stream(inc: &str) -> Record {
    stream(S1, inc, StreamKind::Request, OWNER_X, 0, false, T0)
}

/// Events `first ..= last` of S1's `inc` relayed by `branch`, replica ids `r<seq>`.
pub fn relayed(inc: &str, branch: u64, first: u64, last: u64) -> Record {
    Record::Events {
        session: S1.into(),
        incarnation: inc.into(),
        first_seq: first,
        ids: (first..=last).map(id).collect(),
        long: Vec::new(),
        branch,
        trimmed: 0,
    }
}

/// Events of S1's `inc` from `first`, these recorded events, relayed by `branch`.
pub fn relayed_as(inc: &str, branch: u64, first: u64, recorded: &[String]) -> Record {
    let r = Record::Events {
        session: S1.into(),
        incarnation: inc.into(),
        first_seq: first,
        ids: recorded.to_vec(),
        long: Vec::new(),
        branch,
        trimmed: 0,
    };
    r.validate().expect("a guard-built record is valid");
    r
}

pub fn branch_end(session: &str, inc: &str, branch: u64) -> Record {
    Record::BranchEnd {
        session: session.into(),
        incarnation: inc.into(),
        branch,
    }
}

/// Apply at T0; per record, the name it was refused with (`None`: applied).
pub async fn refusals<S: Store>(s: &S, records: &[Record]) -> Vec<Option<&'static str>> {
    refusals_at(s, records, T0).await
}

/// [`refusals`], applied at store time `now`.
pub async fn refusals_at<S: Store>(
    s: &S,
    records: &[Record],
    now: u64,
) -> Vec<Option<&'static str>> {
    let done = s.apply(records, now).await.expect("apply");
    (0..records.len())
        .map(|i| done.refused.iter().find(|r| r.index == i).map(|r| r.error))
        .collect()
}

/// A continuation of S1's request stream `inc` at `seq`, as the handler resolves it: its
/// branch number (it must continue).
pub async fn continue_branch<S: Store>(s: &S, inc: &str, seq: u64) -> Option<u64> {
    let q = query(S1, inc, StreamKind::Request, seq);
    match resolve_branched(s, &q, no_wait(), T0).await.verdict {
        ResumeVerdict::Continue { branch, .. } => branch,
        other => panic!("{inc} at {seq} must continue: {other:?}"),
    }
}

/// A continuation of `session`'s stream `inc` at `seq`, resolved at `now`: its branch number
/// (it must continue, registered).
pub async fn continue_branch_of<S: Store>(
    s: &S,
    session: &str,
    inc: &str,
    kind: StreamKind,
    seq: u64,
    now: u64,
) -> u64 {
    let q = query(session, inc, kind, seq);
    match resolve_branched(s, &q, no_wait(), now).await.verdict {
        ResumeVerdict::Continue {
            branch: Some(b), ..
        } => b,
        other => panic!("{inc} at {seq} must continue, registered: {other:?}"),
    }
}

const FORKED: Option<&str> = Some(REJECTED_FORKED);
const MISMATCH: Option<&str> = Some(REJECTED_MISMATCH);

/// Each continuation gets the next number of its incarnation (1, 2, …), in the store's order,
/// concurrent ones too; a new stream gets none, nor an incarnation not opened.
pub async fn branch_numbers_per_incarnation<S: Store>(make: impl Fn(Limits) -> S) {
    use mcp_ownership::store::BranchOpen::Unregistered;
    let s = make(Limits::default());
    assert_eq!(
        s.open_branch(S1, A, None, T0).await.unwrap(),
        Unregistered,
        "no session"
    );
    apply(
        &s,
        &[
            open(S1),
            req_stream(A),
            events(S1, A, 1, 3),
            req_stream(B),
            events(S1, B, 1, 1),
            // Events without their StreamOpen: a placeholder, not opened.
            events(S1, D, 1, 2),
        ],
    )
    .await;
    assert_eq!(
        s.open_branch(S1, C, None, T0).await.unwrap(),
        Unregistered,
        "unknown"
    );
    assert_eq!(
        s.open_branch(S1, D, None, T0).await.unwrap(),
        Unregistered,
        "not opened"
    );
    for want in 1..=3 {
        assert_eq!(continue_branch(&s, A, 2).await, Some(want));
    }
    assert_eq!(continue_branch(&s, B, 1).await, Some(1), "per incarnation");
    assert_eq!(continue_branch(&s, A, 3).await, Some(4));
    // A new stream is no branch: it uses no number.
    let q = query(S1, A, StreamKind::Request, 9);
    assert_eq!(
        resolve_branched(&s, &q, no_wait(), T0).await.verdict,
        new_stream(Reason::UnknownStream)
    );
    assert_eq!(continue_branch(&s, A, 3).await, Some(5));
    // Concurrent continuations: each its own number, none skipped.
    let opened =
        futures_util::future::join_all((0..12).map(|_| s.open_branch(S1, B, None, T0 + 1))).await;
    let mut got: Vec<u64> = opened
        .into_iter()
        .map(|r| match r.unwrap() {
            mcp_ownership::store::BranchOpen::Numbered(n) => n,
            other => panic!("{other:?}"),
        })
        .collect();
    got.sort_unstable();
    assert_eq!(got, (2..=13).collect::<Vec<u64>>());
}

/// Two branches relaying at once: each one's first events are accepted, then the older one's
/// are refused (`forked`) while the newer keeps going; the first response (branch 0) is older
/// than both. Refused events are not recorded.
pub async fn older_branch_overtaken_while_both_relay<S: Store>(make: impl Fn(Limits) -> S) {
    let s = make(Limits::default());
    apply(&s, &[open(S1), req_stream(A), events(S1, A, 1, 3)]).await;
    let (b1, b2) = (
        continue_branch(&s, A, 3).await.unwrap(),
        continue_branch(&s, A, 3).await.unwrap(),
    );
    assert_eq!(
        refusals(&s, &[relayed(A, b1, 4, 5), relayed(A, b2, 4, 5)]).await,
        [None, None]
    );
    assert_eq!(refusals(&s, &[relayed(A, b1, 6, 6)]).await, [FORKED]);
    assert_eq!(
        refusals(
            &s,
            &[
                relayed(A, b2, 6, 7),
                relayed(A, b1, 8, 8),
                relayed(A, 0, 8, 8)
            ]
        )
        .await,
        [None, FORKED, FORKED]
    );
    // The overtaken branch is cut by its guard: the newer one's end does not count it as open
    // (else both would end told, and neither keep the stream).
    assert!(!s.end_branch(S1, A, b2, T0).await.unwrap());
    assert_eq!(
        verdict(&s, S1, A, StreamKind::Request, 5).await,
        cont(OWNER_X, ids(6, 7), 7)
    );
}

/// The order counts, not the mere fact of relaying: an older branch that starts relaying
/// after the newer one went quiet is followed (the replica handed the stream back) until the
/// newer one relays again.
pub async fn older_branch_after_newer_went_quiet<S: Store>(make: impl Fn(Limits) -> S) {
    let s = make(Limits::default());
    apply(&s, &[open(S1), req_stream(A), events(S1, A, 1, 3)]).await;
    let (b1, b2) = (
        continue_branch(&s, A, 3).await.unwrap(),
        continue_branch(&s, A, 3).await.unwrap(),
    );
    assert_eq!(refusals(&s, &[relayed(A, b2, 4, 5)]).await, [None]);
    assert_eq!(
        refusals(&s, &[relayed(A, b1, 4, 5), relayed(A, b1, 6, 6)]).await,
        [None, None]
    );
    assert_eq!(
        refusals(
            &s,
            &[
                relayed(A, b2, 7, 7),
                relayed(A, b1, 8, 8),
                relayed(A, b2, 8, 8)
            ]
        )
        .await,
        [None, FORKED, None]
    );
}

/// Ended branches do not compete: after a takeover (the newer relays, ends, then the older
/// relays) the older is followed; a branch once overtaken stays cut; an ended branch's late
/// events are applied as data.
pub async fn ended_branches_do_not_compete<S: Store>(make: impl Fn(Limits) -> S) {
    let s = make(Limits::default());
    apply(&s, &[open(S1), req_stream(A), events(S1, A, 1, 3)]).await;
    let (b1, b2) = (
        continue_branch(&s, A, 3).await.unwrap(),
        continue_branch(&s, A, 3).await.unwrap(),
    );
    assert_eq!(refusals(&s, &[relayed(A, b2, 4, 5)]).await, [None]);
    assert!(
        s.end_branch(S1, A, b2, T0).await.unwrap(),
        "b1 is open (registered within the grace)"
    );
    assert_eq!(
        refusals(&s, &[relayed(A, b1, 4, 6), relayed(A, b1, 7, 7)]).await,
        [None, None]
    );
    let b3 = continue_branch(&s, A, 7).await.unwrap();
    assert_eq!(
        refusals(&s, &[relayed(A, b3, 8, 8), relayed(A, b1, 8, 8)]).await,
        [None, FORKED]
    );
    apply(&s, &[branch_end(S1, A, b3)]).await;
    assert_eq!(
        refusals(&s, &[relayed(A, b1, 9, 9)]).await,
        [FORKED],
        "a cut branch stays cut, even once its overtaker ended (its guard ended it)"
    );
    let b4 = continue_branch(&s, A, 8).await.unwrap();
    assert_eq!(refusals(&s, &[relayed(A, b4, 9, 9)]).await, [None]);
    assert!(!s.end_branch(S1, A, b4, T0).await.unwrap(), "b1 was cut");
    let b5 = continue_branch(&s, A, 9).await.unwrap();
    assert_eq!(
        refusals(&s, &[relayed(A, b5, 10, 10), relayed(A, b4, 10, 11)]).await,
        [None, None],
        "late events of an ended branch are data"
    );
    assert_eq!(
        refusals(&s, &[relayed(A, b5, 12, 12)]).await,
        [None],
        "and overtake nobody"
    );
    assert_eq!(
        verdict(&s, S1, A, StreamKind::Request, 9).await,
        cont(OWNER_X, ids(10, 12), 12)
    );
}

/// `end_branch` marks the branch ended and answers forked exactly when another branch numbered
/// 1 or more is open and relaying, or registered within the grace (branch 0 never counts);
/// without a table it writes nothing.
pub async fn end_branch_answers_forked<S: Store>(make: impl Fn(Limits) -> S) {
    let s = make(Limits::default());
    assert!(!s.end_branch(S1, A, 1, T0).await.unwrap(), "no session");
    apply(&s, &[open(S1), req_stream(A), events(S1, A, 1, 3)]).await;
    assert!(!s.end_branch(S1, A, 1, T0).await.unwrap(), "no table");
    let (b1, b2) = (
        continue_branch(&s, A, 3).await.unwrap(),
        continue_branch(&s, A, 3).await.unwrap(),
    );
    assert_eq!((b1, b2), (1, 2), "ending before registering made no table");
    assert!(s.end_branch(S1, A, b1, T0).await.unwrap());
    assert!(s.end_branch(S1, A, b1, T0).await.unwrap(), "idempotent");
    assert!(!s.end_branch(S1, A, b2, T0).await.unwrap());
    let b3 = continue_branch(&s, A, 3).await.unwrap();
    assert!(!s.end_branch(S1, A, b3, T0).await.unwrap());
    let (b4, b5) = (
        continue_branch(&s, A, 3).await.unwrap(),
        continue_branch(&s, A, 3).await.unwrap(),
    );
    assert!(s.end_branch(S1, A, 0, T0).await.unwrap(), "b4, b5 open");
    assert!(s.end_branch(S1, A, b5, T0).await.unwrap(), "b4 open");
    assert!(!s.end_branch(S1, A, b4, T0).await.unwrap());
    assert!(
        !s.end_branch(S1, C, 1, T0).await.unwrap(),
        "unknown incarnation"
    );
    assert!(
        !s.end_branch(S2, A, 1, T0).await.unwrap(),
        "unknown session"
    );
    // Past the grace, a registration that never relayed counts no more; one that relayed does.
    let (b6, b7, b8) = (
        continue_branch(&s, A, 3).await.unwrap(),
        continue_branch(&s, A, 3).await.unwrap(),
        continue_branch(&s, A, 3).await.unwrap(),
    );
    let later = T0 + REGISTRATION_GRACE_MS + 1;
    assert!(
        !s.end_branch(S1, A, b6, later).await.unwrap(),
        "b7, b8 aged"
    );
    apply_at(&s, &[relayed(A, b8, 4, 4)], later).await;
    assert!(s.end_branch(S1, A, b7, later).await.unwrap(), "b8 relays");
}

/// A `branch_end` record marks its branch ended (idempotent); one for an unknown session,
/// incarnation or branch writes nothing.
pub async fn branch_end_record<S: Store>(make: impl Fn(Limits) -> S) {
    let s = make(Limits::default());
    apply(&s, &[open(S1), req_stream(A), events(S1, A, 1, 3)]).await;
    let (b1, b2) = (
        continue_branch(&s, A, 3).await.unwrap(),
        continue_branch(&s, A, 3).await.unwrap(),
    );
    assert_eq!(
        refusals(
            &s,
            &[
                relayed(A, b1, 4, 4),
                relayed(A, b2, 4, 5),
                relayed(A, b1, 5, 5)
            ]
        )
        .await,
        [None, None, FORKED]
    );
    let done = s
        .apply(&[branch_end(S1, A, b2), branch_end(S1, A, b2)], T0)
        .await
        .unwrap();
    assert!(done.refused.is_empty(), "{done:?}");
    assert!(!s.end_branch(S1, A, b1, T0).await.unwrap(), "b2 is ended");
    assert_eq!(
        refusals(&s, &[relayed(A, b1, 6, 6)]).await,
        [FORKED],
        "b1 was cut: ended, and refused for good"
    );
    let before = s.stats(T0).await.unwrap();
    let done = s
        .apply(
            &[
                branch_end(S2, A, 1),
                branch_end(S1, C, 1),
                branch_end(S1, A, 40),
            ],
            T0,
        )
        .await
        .unwrap();
    assert!(done.refused.is_empty(), "{done:?}");
    let after = s.stats(T0).await.unwrap();
    assert_eq!(
        (after.sessions, after.pending, after.incarnations),
        (before.sessions, before.pending, before.incarnations)
    );
    assert_eq!(
        verdict(&s, S2, A, StreamKind::Request, 1).await,
        new_stream(Reason::SessionInactive)
    );
}

/// An incarnation keeps branch 0 and at most 16 continuations: past that, ended ones go first,
/// then open ones that never relayed, then the oldest; a branch that relays after it went is
/// followed as one that starts relaying then. Continuations that never relay overtake nobody
/// (branch 0 keeps relaying through any number of them); a number never handed out is not
/// arbitrated.
pub async fn oldest_branches_dropped<S: Store>(make: impl Fn(Limits) -> S) {
    let s = make(Limits::default());
    apply(&s, &[open(S1), req_stream(A), events(S1, A, 1, 3)]).await;
    for want in 1..=16 {
        assert_eq!(continue_branch(&s, A, 3).await, Some(want));
    }
    assert_eq!(
        refusals(&s, &[relayed(A, 0, 4, 4), relayed(A, 1, 4, 4)]).await,
        [None, None],
        "16 continuations: all kept"
    );
    assert_eq!(continue_branch(&s, A, 3).await, Some(17));
    assert_eq!(
        refusals(
            &s,
            &[
                relayed(A, 1, 5, 5),
                relayed(A, 2, 4, 5),
                relayed(A, 99, 6, 6),
                relayed(A, 0, 6, 6),
            ]
        )
        .await,
        [None, None, None, FORKED],
        "17 continuations: 2 (never relayed) dropped, not 1; 2 comes back relaying; \
         1 and 2 relayed after 0 started"
    );
    assert_eq!(
        refusals(&s, &[relayed(A, 1, 6, 6), relayed(A, 2, 6, 6)]).await,
        [FORKED, None],
        "2 came back newer than 1: the fork rule as usual"
    );
    // Unused registrations go before a cut branch: it stays cut, its late events refused.
    for _ in 0..20 {
        continue_branch(&s, A, 6).await.unwrap();
    }
    assert_eq!(
        refusals(&s, &[relayed(A, 1, 7, 7), relayed(A, 2, 7, 7)]).await,
        [FORKED, None]
    );
}

/// Registrations whose guard never used the answer (resumes the client dropped while the
/// guard waited) are no reader once the grace passed: they never make the real reader `forked`
/// at its clean end, never push it out of the table, and never get its events refused. Within
/// the grace a newer registration counts (its request may be reaching the replica, which may
/// hand it the stream).
pub async fn unused_registrations_never_fork_the_reader<S: Store>(make: impl Fn(Limits) -> S) {
    let s = make(Limits::default());
    apply(&s, &[open(S1), req_stream(A), events(S1, A, 1, 3)]).await;
    let reader = continue_branch(&s, A, 3).await.unwrap();
    assert_eq!(refusals(&s, &[relayed(A, reader, 4, 5)]).await, [None]);
    // Three dropped retries, then the reader's next events and its clean end.
    for _ in 0..3 {
        continue_branch(&s, A, 5).await.unwrap();
    }
    assert_eq!(refusals(&s, &[relayed(A, reader, 6, 6)]).await, [None]);
    let later = T0 + REGISTRATION_GRACE_MS + 1;
    assert!(
        !s.end_branch(S1, A, reader, later).await.unwrap(),
        "no other branch relays: the reader's end is its replica's own"
    );
    let q = query(S1, A, StreamKind::Request, 6);
    assert_eq!(
        resolve_with(&s, &q, no_wait(), later).await.verdict,
        cont(OWNER_X, vec![], 6),
        "its last cursor continues"
    );
    // A quiet reader (nothing relayed yet), then more dropped retries than the table keeps.
    let quiet = continue_branch_of(&s, S1, A, StreamKind::Request, 6, later).await;
    for _ in 0..20 {
        continue_branch_of(&s, S1, A, StreamKind::Request, 6, later).await;
    }
    assert_eq!(
        refusals(&s, &[relayed(A, quiet, 7, 8), relayed(A, quiet, 9, 9)]).await,
        [None, None],
        "the quiet reader relays on, however many unused registrations came after it"
    );
    let aged = later + REGISTRATION_GRACE_MS + 1;
    let newer = continue_branch_of(&s, S1, A, StreamKind::Request, 9, aged).await;
    assert!(
        s.end_branch(S1, A, quiet, aged + 10).await.unwrap(),
        "a registration within the grace: the replica may have handed it the stream"
    );
    assert!(!s.end_branch(S1, A, newer, aged + 20).await.unwrap());
}

pub fn abandoned(inc: &str, registration: &str) -> Record {
    let r = Record::Abandoned {
        session: S1.into(),
        incarnation: inc.into(),
        registration: registration.into(),
    };
    r.validate().expect("a guard-built record is valid");
    r
}

/// S1's request stream `inc` continued at `seq` by a resume the guard tagged `registration`,
/// resolved at `now`: its branch number (it must continue, registered).
pub async fn continue_registered<S: Store>(
    s: &S,
    inc: &str,
    seq: u64,
    registration: &str,
    now: u64,
) -> u64 {
    let mut q = query(S1, inc, StreamKind::Request, seq);
    q.registration = Some(registration.into());
    match resolve_branched(s, &q, no_wait(), now).await.verdict {
        ResumeVerdict::Continue {
            branch: Some(b), ..
        } => b,
        other => panic!("{inc} at {seq} must continue, registered: {other:?}"),
    }
}

/// Resumes the guard dropped while their verdict was pending (`abandoned`) are no reader, even
/// within the registration grace: the real reader's clean end is its replica's own, and its
/// last cursor continues. An abandon may land before its registration (records and verdict
/// queries race): the registration is then born ended. Such early abandons are remembered for
/// the grace only, and at most `ABANDONED_KEPT` per incarnation (the oldest go first).
pub async fn abandoned_registrations_never_fork_the_reader<S: Store>(make: impl Fn(Limits) -> S) {
    let s = make(Limits::default());
    apply(
        &s,
        &[
            open(S1),
            req_stream(A),
            req_stream(C),
            req_stream(D),
            events(S1, A, 1, 3),
            events(S1, C, 1, 3),
            events(S1, D, 1, 3),
        ],
    )
    .await;
    let reader = continue_registered(&s, A, 3, "00000000000000a1", T0).await;
    assert_eq!(refusals(&s, &[relayed(A, reader, 4, 5)]).await, [None]);
    // Dropped retries: one abandoned after its registration, one before.
    continue_registered(&s, A, 5, "00000000000000b1", T0 + 10).await;
    apply_at(&s, &[abandoned(A, "00000000000000b1")], T0 + 20).await;
    apply_at(&s, &[abandoned(A, "00000000000000b2")], T0 + 30).await;
    continue_registered(&s, A, 5, "00000000000000b2", T0 + 40).await;
    assert_eq!(refusals(&s, &[relayed(A, reader, 6, 6)]).await, [None]);
    assert!(
        !s.end_branch(S1, A, reader, T0 + 100).await.unwrap(),
        "abandoned registrations are no readers, within the grace too"
    );
    let q = query(S1, A, StreamKind::Request, 6);
    assert_eq!(
        resolve_with(&s, &q, no_wait(), T0 + 200).await.verdict,
        cont(OWNER_X, vec![], 6),
        "its last cursor continues"
    );
    // A registration nobody abandoned still counts within its grace.
    let next = continue_registered(&s, A, 6, "00000000000000a2", T0 + 300).await;
    continue_registered(&s, A, 6, "00000000000000b3", T0 + 310).await;
    assert!(s.end_branch(S1, A, next, T0 + 400).await.unwrap());

    // C: an early abandon past the grace is forgotten.
    let reader = continue_registered(&s, C, 3, "00000000000000a3", T0).await;
    apply_at(&s, &[abandoned(C, "00000000000000c0")], T0).await;
    let late = T0 + REGISTRATION_GRACE_MS + 1;
    continue_registered(&s, C, 3, "00000000000000c0", late).await;
    assert!(
        s.end_branch(S1, C, reader, late + 1).await.unwrap(),
        "an abandon older than the grace no longer ends its registration"
    );
    // D: more early abandons than an incarnation keeps: the newest stay, the oldest go.
    let flood: Vec<Record> = (0..=ABANDONED_KEPT)
        .map(|i| abandoned(D, &format!("{:016x}", 0xd00 + i)))
        .collect();
    apply_at(&s, &flood, T0).await;
    let reader = continue_registered(&s, D, 3, "00000000000000a4", T0 + 1).await;
    let newest = format!("{:016x}", 0xd00 + ABANDONED_KEPT);
    continue_registered(&s, D, 3, &newest, T0 + 2).await;
    assert!(
        !s.end_branch(S1, D, reader, T0 + 3).await.unwrap(),
        "the newest early abandon is kept"
    );
    let reader = continue_registered(&s, D, 3, "00000000000000a5", T0 + 4).await;
    continue_registered(&s, D, 3, &format!("{:016x}", 0xd00), T0 + 5).await;
    assert!(
        s.end_branch(S1, D, reader, T0 + 6).await.unwrap(),
        "the oldest early abandon went for the newer ones"
    );
}

/// A clean end as the handler runs it (`resume::end_branch`), waiting up to `wait` for
/// registrations that neither relayed nor ended, at store time `now`.
pub async fn end_branch_waiting<S: Store>(
    s: &S,
    inc: &str,
    branch: u64,
    wait: Duration,
    now: u64,
) -> bool {
    let opts = ResumeOptions {
        record_wait: wait,
        max_expected: 256,
    };
    let clock = move || now;
    mcp_ownership::resume::end_branch(s, (S1, inc, branch), &opts, &clock, &Metrics::new())
        .await
        .expect("end_branch")
}

/// `records` applied `after` from now, at store time `now`.
pub async fn apply_later<S: Store>(s: &S, records: &[Record], after: Duration, now: u64) {
    tokio::time::sleep(after).await;
    apply_at(s, records, now).await;
}

/// `branch`'s clean end (at seq 3 of `inc`) waits while `records` land 30 ms later through
/// another instance: it is the replica's own (`why`), and its last cursor continues.
async fn end_is_the_replicas_own<S: Store>(
    s: &S,
    inc: &str,
    branch: u64,
    records: &[Record],
    why: &str,
) {
    let (forked, ()) = tokio::join!(
        end_branch_waiting(s, inc, branch, Duration::from_millis(2_000), T0 + 10),
        apply_later(s, records, Duration::from_millis(30), T0 + 20),
    );
    assert!(!forked, "{why}");
    let q = query(S1, inc, StreamKind::Request, 3);
    assert!(
        matches!(
            resolve_with(s, &q, no_wait(), T0 + 30).await.verdict,
            ResumeVerdict::Continue { .. }
        ),
        "its last cursor continues"
    );
}

/// Red team 4, `abandon-race`: a client drops retries of its resume while their verdicts are
/// pending and at once resumes for real; the real continuation replays and its replica ends
/// it cleanly before the dropped retries' `abandoned` records land (each guard, each Wasm
/// worker, has its own queue: the record may come from another gateway, a flush later). The
/// end waits for them and is the replica's own: never `forked` on account of a reader that
/// never was. A newer registration that its owner answers in that wait still wins the fork
/// (a replica that hands the stream over), and one that neither relays nor ends within the
/// wait still counts (a signal, never a silent end).
pub async fn an_abandon_after_the_end_ask_never_forks_the_reader<S: Store>(
    make: impl Fn(Limits) -> S,
) {
    let s = make(Limits::default());
    let incs = [A, C, D];
    let mut setup = vec![open(S1)];
    for inc in incs {
        setup.extend([req_stream(inc), events(S1, inc, 1, 3)]);
    }
    apply(&s, &setup).await;
    let wait = Duration::from_millis(2_000);
    let soon = Duration::from_millis(30);
    let mut readers = Vec::new();
    for (i, inc) in incs.into_iter().enumerate() {
        let dropped = format!("{:016x}", 0xb0 + i);
        continue_registered(&s, inc, 1, &dropped, T0 + 1).await;
        let reader = continue_registered(&s, inc, 1, &format!("{:016x}", 0xa0 + i), T0 + 2).await;
        assert_eq!(refusals(&s, &[relayed(inc, reader, 2, 3)]).await, [None]);
        // One more retry, dropped, registered after the real one.
        let late = format!("{:016x}", 0xc0 + i);
        let newer = continue_registered(&s, inc, 1, &late, T0 + 3).await;
        readers.push((inc, reader, dropped, late, newer));
    }

    // A: both abandons land while the end waits.
    let (inc, reader, dropped, late, _) = &readers[0];
    let abandons = [abandoned(inc, dropped), abandoned(inc, late)];
    let why = "the client's own dropped retries are no reader";
    end_is_the_replicas_own(&s, inc, *reader, &abandons, why).await;

    // C: the newer registration's owner answers it while the end waits: a hand-over.
    let (inc, reader, dropped, _, newer) = &readers[1];
    let records = [abandoned(inc, dropped), answered(inc, *newer, 4)];
    let (forked, ()) = tokio::join!(
        end_branch_waiting(&s, inc, *reader, wait, T0 + 10),
        apply_later(&s, &records, soon, T0 + 20),
    );
    assert!(forked, "a newer reader its owner answered takes the stream");

    // D: nobody's word comes within the wait: the registration counts, as it stands.
    let (inc, reader, _, _, _) = &readers[2];
    let short = Duration::from_millis(60);
    assert!(
        end_branch_waiting(&s, inc, *reader, short, T0 + 10).await,
        "an unsettled registration within its grace still counts after the wait"
    );

    // B: the replica answered the newer registration, then handed the stream to the older one
    // and ended the newer, whose end waits; the newer one's answer lands after the older one's
    // first events. Ended at once, the newer overtakes nobody, and is told `forked`.
    apply(&s, &[req_stream(B), events(S1, B, 1, 3)]).await;
    let older = continue_registered(&s, B, 1, "00000000000000e1", T0 + 1).await;
    let newer = continue_registered(&s, B, 1, "00000000000000e2", T0 + 2).await;
    let records = [
        relayed(B, older, 2, 2),
        answered(B, newer, 2),
        relayed(B, older, 3, 3),
    ];
    let late = async {
        tokio::time::sleep(soon).await;
        refusals_at(&s, &records, T0 + 3).await
    };
    let (forked, refused) = tokio::join!(end_branch_waiting(&s, B, newer, wait, T0 + 10), late);
    assert!(forked, "the reader the replica chose took the stream");
    assert_eq!(
        refused,
        [None, None, None],
        "an end waiting for its answer overtakes nobody"
    );
}

/// A client resets a resume after its owner answered it (so that branch relays) and at once
/// resumes for real; the real continuation replays and ends before the reset branch's
/// `branch_end` record lands (a flush behind, maybe through another gateway, which may also have
/// registered it after the real one). The end waits for it and is the replica's own. A newer
/// relaying rival still open after the wait is a reader (`forked`, a signal); an older one whose
/// latest events landed before this branch was registered is not (a half-open old connection
/// never locks its client out), with no wait; an older one fed since is (the replica's order is
/// not the store's).
pub async fn a_reset_resume_its_owner_answered_never_forks_the_reader<S: Store>(
    make: impl Fn(Limits) -> S,
) {
    let s = make(Limits::default());
    apply(&s, &[open(S1)]).await;
    // The real continuation registers and relays; then the other one, answered by its owner.
    let mut pairs = Vec::new();
    let incs = [A, C, D];
    for (i, inc) in incs.into_iter().enumerate() {
        apply(&s, &[req_stream(inc), events(S1, inc, 1, 3)]).await;
        let (r1, r2) = (format!("{:016x}", 0xd0 + i), format!("{:016x}", 0xe0 + i));
        let reader = continue_registered(&s, inc, 1, &r1, T0 + 1).await;
        assert_eq!(refusals(&s, &[relayed(inc, reader, 2, 3)]).await, [None]);
        let other = continue_registered(&s, inc, 1, &r2, T0 + 2).await;
        assert_eq!(refusals(&s, &[answered(inc, other, 2)]).await, [None]);
        pairs.push((inc, reader, other));
    }
    // A: the newer one was reset; its end lands while the real one's end waits.
    let (inc, reader, reset) = pairs[0];
    let end = [branch_end(S1, inc, reset)];
    end_is_the_replicas_own(
        &s,
        inc,
        reader,
        &end,
        "a resume its client reset is no reader",
    )
    .await;
    // C: the newer one stays open: a reader the replica may have handed the stream to.
    let (inc, reader, _) = pairs[1];
    let short = Duration::from_millis(60);
    assert!(
        end_branch_waiting(&s, inc, reader, short, T0 + 10).await,
        "a newer relaying rival still open after the wait is a reader"
    );
    // D: the older one is open and quiet (half-open), fed only before the newer started.
    let (inc, _, newer) = pairs[2];
    assert_eq!(refusals(&s, &[relayed(inc, newer, 4, 4)]).await, [None]);
    let started = std::time::Instant::now();
    assert!(
        !end_branch_waiting(&s, inc, newer, Duration::from_millis(2_000), T0 + 10).await,
        "an older rival fed only before is no reader"
    );
    assert!(
        started.elapsed() < Duration::from_millis(1_000),
        "nor waited for"
    );
    // E: the older registration reached the replica last (the replica's order is not the
    // store's): the owner answered it after the newer one was registered, then ended the newer
    // one. It is the reader the replica chose, though its answer landed before the newer one's.
    let inc = "00000000000000f3";
    apply(&s, &[req_stream(inc), events(S1, inc, 1, 3)]).await;
    let older = continue_registered(&s, inc, 1, "00000000000000f4", T0 + 1).await;
    let newer = continue_registered(&s, inc, 1, "00000000000000f5", T0 + 2).await;
    assert_eq!(
        refusals_at(&s, &[answered(inc, older, 2)], T0 + 3).await,
        [None]
    );
    assert_eq!(
        refusals_at(&s, &[answered(inc, newer, 2)], T0 + 4).await,
        [None]
    );
    assert!(
        end_branch_waiting(&s, inc, newer, short, T0 + 10).await,
        "an older rival fed since this one was registered may be the reader the replica chose"
    );
}

/// `events` of `branch` without ids: its owner answered it (the continuation's response opened).
pub fn answered(inc: &str, branch: u64, next: u64) -> Record {
    Record::Events {
        session: S1.into(),
        incarnation: inc.into(),
        first_seq: next,
        ids: Vec::new(),
        long: Vec::new(),
        branch,
        trimmed: 0,
    }
}

/// A continuation its owner answered counts as relaying before any event (a quiet stream at
/// its head): the older reader the replica closed for it ends `forked`, never silent; and the
/// answer clears the owner failure window (standing evidence ends with it). An overtaken
/// branch's answer is refused (`forked`) like its events.
pub async fn an_answered_continuation_counts_as_relaying<S: Store>(make: impl Fn(Limits) -> S) {
    let window = 30_000;
    let s = make(Limits {
        owner_failure_window_ms: window,
        ..Limits::default()
    });
    apply(&s, &[open(S1), req_stream(A), events(S1, A, 1, 3)]).await;
    let b1 = continue_branch(&s, A, 3).await.unwrap();
    assert_eq!(refusals(&s, &[relayed(A, b1, 4, 4)]).await, [None]);
    apply_at(&s, &[failed(S1, A)], T0 + 1_000).await;
    let b2 = continue_branch(&s, A, 4).await.unwrap();
    assert_eq!(refusals(&s, &[answered(A, b2, 5)]).await, [None]);
    assert!(
        s.end_branch(S1, A, b1, T0 + REGISTRATION_GRACE_MS + 2_000)
            .await
            .unwrap(),
        "the replica closed b1 for the answered b2 (past the grace: the answer counts)"
    );
    apply_at(&s, &[failed(S1, A)], T0 + 2_000 + window).await;
    let q = query(S1, A, StreamKind::Request, 3);
    assert_eq!(
        resolve_with(&s, &q, no_wait(), T0 + 2_001 + window)
            .await
            .verdict,
        cont(OWNER_X, ids(4, 4), 4),
        "b2's answer cleared the failure before it"
    );
    let b3 = continue_branch_of(&s, S1, A, StreamKind::Request, 4, T0 + 2_002 + window).await;
    apply_at(&s, &[answered(A, b3, 5)], T0 + 2_003 + window).await;
    assert_eq!(
        refusals(&s, &[answered(A, b2, 5), relayed(A, b3, 5, 5)]).await,
        [FORKED, None],
        "b3 answered after b2 did: b2 is overtaken"
    );
}

/// A session keeps at most `max_session_events` recorded events across its incarnations: past
/// it, its least recently recorded incarnations give theirs up first (their cursors read
/// `gap`), then the one just written its oldest. Another session keeps everything.
pub async fn session_events_budget<S: Store>(make: impl Fn(Limits) -> S) {
    let s = make(Limits {
        max_session_events: 10,
        ..Limits::default()
    });
    apply(
        &s,
        &[
            open(S2),
            get_stream(S2, A, T0),
            events(S2, A, 1, 8),
            open(S1),
            req_stream(A),
            events(S1, A, 1, 6),
            req_stream(B),
            events(S1, B, 1, 4),
        ],
    )
    .await;
    assert_eq!(
        verdict(&s, S1, A, StreamKind::Request, 1).await,
        cont(OWNER_X, ids(2, 6), 6),
        "10 events: all kept"
    );
    apply(&s, &[events(S1, B, 5, 8)]).await;
    assert_eq!(
        verdict(&s, S1, A, StreamKind::Request, 1).await,
        new_stream(Reason::Gap),
        "the least recently recorded incarnation gave its events up"
    );
    assert_eq!(
        verdict(&s, S1, B, StreamKind::Request, 1).await,
        cont(OWNER_X, ids(2, 8), 8)
    );
    apply(&s, &[events(S1, B, 9, 12)]).await;
    assert_eq!(
        verdict(&s, S1, B, StreamKind::Request, 1).await,
        new_stream(Reason::Gap),
        "then the written one its oldest"
    );
    assert_eq!(
        verdict(&s, S1, B, StreamKind::Request, 2).await,
        cont(OWNER_X, ids(3, 12), 12)
    );
    assert_eq!(
        verdict(&s, S2, A, StreamKind::Get, 1).await,
        cont(OWNER_X, ids(2, 8), 8),
        "another session keeps everything"
    );
}

/// Events whose seqs are recorded with another event (id, or digest when both have one) are
/// refused (`replay_mismatch`) and the incarnation is lost; the same events again (a retried
/// batch), an id without digest, and events straddling or past the head are applied.
pub async fn divergent_events_refused<S: Store>(make: impl Fn(Limits) -> S) {
    use mcp_resume_core::ownership::recorded_event;
    let rec = |name: &str, digest: u64| recorded_event(name, digest);
    let s = make(Limits::default());
    let first = vec![rec("e1", 1), rec("e2", 2), rec("e3", 3)];
    apply(&s, &[open(S1), req_stream(A), relayed_as(A, 0, 1, &first)]).await;
    assert_eq!(
        refusals(
            &s,
            &[
                relayed_as(A, 0, 1, &first),
                relayed_as(A, 0, 2, &["e2".into()]),
                relayed_as(A, 0, 3, &[rec("e3", 3), rec("e4", 4)]),
                relayed_as(A, 0, 5, &[rec("e5", 5)]),
            ]
        )
        .await,
        [None, None, None, None]
    );
    assert_eq!(
        refusals(&s, &[relayed_as(A, 0, 5, &[rec("e5", 55), rec("e6", 6)])]).await,
        [MISMATCH],
        "another digest at seq 5"
    );
    assert_eq!(
        verdict(&s, S1, A, StreamKind::Request, 2).await,
        new_stream(Reason::OwnerUnavailable)
    );
    // Another id; and a continuation's replay (a registered branch) is checked the same way.
    apply(&s, &[req_stream(B), events(S1, B, 1, 3)]).await;
    let b1 = continue_branch(&s, B, 1).await.unwrap();
    assert_eq!(
        refusals(&s, &[relayed_as(B, b1, 2, &[id(2), "x3".into()])]).await,
        [MISMATCH]
    );
    assert_eq!(
        verdict(&s, S1, B, StreamKind::Request, 1).await,
        new_stream(Reason::OwnerUnavailable)
    );
}

/// Two open continuations recorded two ways (a replica that feeds each connection its own
/// events): a fork, not a lost log. The newer branch is followed, the older one cut; the stream
/// still resumes. Against the first response's records, the same divergence is a loss.
pub async fn diverging_open_continuations_are_a_fork<S: Store>(make: impl Fn(Limits) -> S) {
    let s = make(Limits::default());
    apply(&s, &[open(S1), req_stream(A), events(S1, A, 1, 3)]).await;
    let (b1, b2) = (
        continue_branch(&s, A, 3).await.unwrap(),
        continue_branch(&s, A, 3).await.unwrap(),
    );
    // The older writes first, then the newer's other events at the same seqs: followed.
    assert_eq!(
        refusals(
            &s,
            &[
                relayed_as(A, b1, 4, &["x4".into(), "x5".into()]),
                relayed_as(A, b2, 4, &["y4".into(), "y5".into()])
            ]
        )
        .await,
        [None, None]
    );
    // The older one again, against the newer's records: cut, not lost.
    assert_eq!(
        refusals(&s, &[relayed_as(A, b1, 5, &["x5".into(), "x6".into()])]).await,
        [FORKED]
    );
    assert!(!s.end_branch(S1, A, b2, T0).await.unwrap(), "b1 was cut");
    assert_eq!(
        verdict(&s, S1, A, StreamKind::Request, 4).await,
        cont(OWNER_X, vec!["y5".into()], 5)
    );
    // The newer wrote first, the older diverges: the older is cut at once.
    apply(&s, &[req_stream(B), events(S1, B, 1, 3)]).await;
    let (c1, c2) = (
        continue_branch(&s, B, 3).await.unwrap(),
        continue_branch(&s, B, 3).await.unwrap(),
    );
    assert_eq!(
        refusals(
            &s,
            &[
                relayed_as(B, c2, 4, &["y4".into()]),
                relayed_as(B, c1, 4, &["x4".into()])
            ]
        )
        .await,
        [None, FORKED]
    );
    // A continuation against the first response's records (still in flight when it was
    // decided): a divergence, the stream is lost.
    apply(&s, &[req_stream(C), events(S1, C, 1, 3)]).await;
    let d1 = continue_branch(&s, C, 3).await.unwrap();
    assert_eq!(
        refusals(
            &s,
            &[
                relayed_as(C, 0, 4, &["z4".into()]),
                relayed_as(C, d1, 4, &["w4".into()])
            ]
        )
        .await,
        [None, MISMATCH]
    );
    // A branch told `forked` at its end lost the fork: its records give way to the survivor's.
    // One that ended otherwise (a reset, a client gone) is no rival: a divergence from its
    // records is a loss.
    for (told, want) in [(true, None), (false, MISMATCH)] {
        let inc = if told { D } else { "00000000000000ee" };
        apply(&s, &[req_stream(inc), events(S1, inc, 1, 3)]).await;
        let (e1, e2) = (
            continue_branch(&s, inc, 3).await.unwrap(),
            continue_branch(&s, inc, 3).await.unwrap(),
        );
        // e2 relays first (a replay of a recorded event), then e1 writes past the head.
        assert_eq!(
            refusals(
                &s,
                &[
                    relayed_as(inc, e2, 3, &[id(3)]),
                    relayed_as(inc, e1, 4, &["x4".into()])
                ]
            )
            .await,
            [None, None]
        );
        if told {
            assert!(s.end_branch(S1, inc, e1, T0).await.unwrap(), "e2 is open");
        } else {
            apply(&s, &[branch_end(S1, inc, e1)]).await;
        }
        assert_eq!(
            refusals(&s, &[relayed_as(inc, e2, 4, &["y4".into()])]).await,
            [want],
            "told: {told}"
        );
    }
}

/// An incarnation's branch table goes with it: evicted, or freed with its session, and made
/// again, it numbers from 1.
pub async fn branch_table_goes_with_its_incarnation<S: Store>(make: impl Fn(Limits) -> S) {
    let ttl = 10_000;
    let s = make(Limits {
        max_incarnations_per_session: 1,
        session_idle_ttl_ms: ttl,
        ..Limits::default()
    });
    let a = [req_stream(A), events(S1, A, 1, 3)];
    apply(&s, &[open(S1)]).await;
    apply(&s, &a).await;
    assert_eq!(continue_branch(&s, A, 3).await, Some(1));
    assert_eq!(continue_branch(&s, A, 3).await, Some(2));
    apply(&s, &[req_stream(B), events(S1, B, 1, 1)]).await;
    apply(&s, &a).await;
    assert_eq!(continue_branch(&s, A, 3).await, Some(1), "after eviction");
    assert_eq!(refusals(&s, &[relayed(A, 0, 4, 4)]).await, [None]);
    // The session idle past its TTL: a write starts afresh.
    let later = T0 + ttl + 1;
    apply_at(&s, &[open(S1)], later).await;
    apply_at(&s, &a, later).await;
    let q = query(S1, A, StreamKind::Request, 3);
    let v = resolve_branched(&s, &q, no_wait(), later).await.verdict;
    assert!(
        matches!(
            v,
            ResumeVerdict::Continue {
                branch: Some(1),
                ..
            }
        ),
        "after the session was freed: {v:?}"
    );
}

/// Without a branch table (no continuation registered) events of any branch are applied as
/// they come, and a branch's end writes nothing.
pub async fn no_branch_table_no_arbitration<S: Store>(make: impl Fn(Limits) -> S) {
    let s = make(Limits::default());
    apply(&s, &[open(S1), req_stream(A), events(S1, A, 1, 3)]).await;
    assert_eq!(
        refusals(
            &s,
            &[
                relayed(A, 2, 4, 4),
                relayed(A, 1, 5, 5),
                relayed(A, 0, 6, 6),
                relayed(A, 2, 7, 7),
                branch_end(S1, A, 2),
            ]
        )
        .await,
        [None, None, None, None, None]
    );
    assert!(!s.end_branch(S1, A, 1, T0).await.unwrap());
    assert_eq!(
        refusals(&s, &[relayed(A, 1, 8, 8), relayed(A, 2, 9, 9)]).await,
        [None, None]
    );
    assert_eq!(
        verdict(&s, S1, A, StreamKind::Request, 3).await,
        cont(OWNER_X, ids(4, 9), 9)
    );
}

fn crate_keep_grace_ms() -> u64 {
    mcp_ownership::redis::KEEP_GRACE.as_millis() as u64
}

/// Expands to one `#[tokio::test]` per case for the store built by `$make`.
#[macro_export]
macro_rules! store_suite {
    ($make:expr) => {
        $crate::store_suite!(
            $make;
            continue_with_expected,
            every_reason,
            placeholder_until_stream_open,
            supersede_in_order,
            supersede_by_store_order,
            window_trim_and_gap,
            retention_window,
            owner_gone_epochs,
            stream_lost_is_sticky,
            owner_failure_window,
            request_id_round_trip,
            session_end,
            idle_ttl,
            record_in_flight,
            guard_trimmed_hole_is_final,
            max_incarnations_eviction,
            expected_content_and_cap,
            health_and_stats,
            linearizable_under_concurrency,
            long_ids_round_trip,
            session_cap_refuses_new_sessions,
            unopened_sessions_cost_nothing,
            owner_epochs_expire,
            branch_numbers_per_incarnation,
            older_branch_overtaken_while_both_relay,
            older_branch_after_newer_went_quiet,
            ended_branches_do_not_compete,
            end_branch_answers_forked,
            branch_end_record,
            oldest_branches_dropped,
            unused_registrations_never_fork_the_reader,
            abandoned_registrations_never_fork_the_reader,
            an_abandon_after_the_end_ask_never_forks_the_reader,
            a_reset_resume_its_owner_answered_never_forks_the_reader,
            session_events_budget,
            an_answered_continuation_counts_as_relaying,
            divergent_events_refused,
            diverging_open_continuations_are_a_fork,
            gateways_with_skewed_clocks_pick_the_newest_get_stream,
            a_dropped_resume_through_another_gateway_never_forks_the_real_one,
            no_branch_table_no_arbitration,
            branch_table_goes_with_its_incarnation,
        );
    };
    ($make:expr; $($case:ident),+ $(,)?) => {
        $(
            #[tokio::test]
            async fn $case() {
                suite::$case($make).await;
            }
        )+
    };
}
