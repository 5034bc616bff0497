//! The resume procedure: snapshot → `decide` → verdict, waiting briefly for records that may
//! still be in flight. Kept apart from HTTP so the store test suite drives exactly this code
//! against every store.
use std::time::Duration;

use mcp_resume_core::decision::{decide, SessionState};
use mcp_resume_core::ownership::{Reason, ResumeQuery, ResumeVerdict};
use tokio::time::Instant;

use crate::metrics::{Metrics, OutcomeLabels};
use crate::store::{BranchOpen, CursorId, Facts, SnapshotQuery, Store, StoreError};

/// Longest pause between two snapshots while waiting for in-flight records.
const RECHECK: Duration = Duration::from_millis(50);

/// The service's defaults (`--record-wait-ms`, `--max-expected`): a continue verdict's list
/// holds as many events as the store's window (`--max-window`), so it is never cut short.
pub const DEFAULT_RECORD_WAIT_MS: u64 = 150;
pub const DEFAULT_MAX_EXPECTED: usize = 4096;

#[derive(Debug, Clone, Copy)]
pub struct ResumeOptions {
    /// How long to wait for records that have not landed yet (0 = never wait).
    pub record_wait: Duration,
    /// Cap on `expected` in a Continue verdict.
    pub max_expected: usize,
}

impl Default for ResumeOptions {
    fn default() -> Self {
        ResumeOptions {
            record_wait: Duration::from_millis(DEFAULT_RECORD_WAIT_MS),
            max_expected: DEFAULT_MAX_EXPECTED,
        }
    }
}

/// What a resume came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolution {
    pub verdict: ResumeVerdict,
    /// `None`: decided on the first snapshot. `Some(continued)`: it waited for in-flight
    /// records, and the verdict after the wait is (`true`) or is not (`false`) Continue.
    pub waited: Option<bool>,
}

/// Decide a resume query against the store.
///
/// The guard authenticated the cursor, so its seq was really issued: when the facts look like
/// records still travelling (session or incarnation unknown, cursor past the recorded head, a
/// hole in the recorded window) the answer waits up to `record_wait` for more records and
/// re-decides on a fresh snapshot. Everything else is final at once.
pub async fn resolve<S: Store>(
    store: &S,
    q: &ResumeQuery,
    opts: &ResumeOptions,
    now_ms: &(dyn Fn() -> u64 + Send + Sync),
    metrics: &Metrics,
) -> Result<Resolution, StoreError> {
    let deadline = Instant::now() + opts.record_wait;
    // Subscribed before the first snapshot: a record landing between the snapshot and the
    // wait still wakes us.
    let mut changes = store.changes();
    let mut waited = false;
    loop {
        let facts = timed(
            metrics,
            "snapshot",
            store.snapshot(snapshot_query(q, opts), now_ms()),
        )
        .await?;
        let outcome = decide(
            facts.session,
            facts.incarnation.as_ref().map(|i| &i.facts),
            q.kind,
            q.seq,
        );
        let waiting = outcome.is_err() && in_flight(&facts, q);
        let outcome = records_lost(outcome, &facts);
        let verdict = to_verdict(outcome, facts);
        if !waiting || Instant::now() >= deadline {
            return Ok(Resolution {
                waited: waited.then_some(outcome.is_ok()),
                verdict: with_branch(store, q, verdict, now_ms(), metrics).await,
            });
        }
        waited = true;
        // Wake on a change, and re-check every RECHECK anyway: a shared store may not see
        // records that landed through another instance of this service.
        let wake = deadline.min(Instant::now() + RECHECK);
        match tokio::time::timeout_at(wake, changes.changed()).await {
            Ok(Ok(())) | Err(_) => {}
            // The change feed is gone: poll instead of spinning on the closed channel.
            Ok(Err(_)) => tokio::time::sleep_until(wake).await,
        }
    }
}

/// A continuation's clean end (`POST /v1/branch`, docs/forks.md): the branch is marked ended,
/// and the answer says whether another branch reads the stream. While it would be `forked`, it
/// waits for the rivals' guards' word (a newer reader's owner's answer, or the `abandoned` or
/// `branch_end` record of a resume its client dropped or reset, each a flush away, maybe through
/// another gateway), as a resume waits for in-flight records, up to `record_wait`; past that it
/// is answered as it stands (a signal, never a silent end).
pub async fn end_branch<S: Store>(
    store: &S,
    (session, incarnation, branch): (&str, &str, u64),
    opts: &ResumeOptions,
    now_ms: &(dyn Fn() -> u64 + Send + Sync),
    metrics: &Metrics,
) -> Result<bool, StoreError> {
    let deadline = Instant::now() + opts.record_wait;
    let mut changes = store.changes();
    loop {
        if Instant::now() >= deadline {
            let ended = store.end_branch(session, incarnation, branch, now_ms());
            return timed(metrics, "end_branch", ended).await;
        }
        let ended = store.end_branch_settled(session, incarnation, branch, now_ms());
        if let Some(forked) = timed(metrics, "end_branch", ended).await? {
            return Ok(forked);
        }
        let wake = deadline.min(Instant::now() + RECHECK);
        match tokio::time::timeout_at(wake, changes.changed()).await {
            Ok(Ok(())) | Err(_) => {}
            Ok(Err(_)) => tokio::time::sleep_until(wake).await,
        }
    }
}

/// A continuation is a new branch of its incarnation: the store numbers it (docs/forks.md).
/// A store that cannot never turns the continuation into a refusal: it goes on unarbitrated
/// (no `branch`), and is counted.
async fn with_branch<S: Store>(
    store: &S,
    q: &ResumeQuery,
    mut verdict: ResumeVerdict,
    now_ms: u64,
    metrics: &Metrics,
) -> ResumeVerdict {
    if let ResumeVerdict::Continue { branch, .. } = &mut verdict {
        let opened = store.open_branch(
            &q.session,
            &q.incarnation,
            q.registration.as_deref(),
            now_ms,
        );
        let (number, outcome) = match timed(metrics, "open_branch", opened).await {
            Ok(BranchOpen::Numbered(n)) => (Some(n), "registered"),
            Ok(BranchOpen::Unregistered) => (None, "unregistered"),
            Ok(BranchOpen::Lost) => (None, "lost"),
            Err(_) => (None, "store_error"),
        };
        *branch = number;
        metrics
            .branches
            .get_or_create(&OutcomeLabels { outcome })
            .inc();
        if outcome == "lost" {
            // Its arbitration state is gone: numbering anew could renumber a live branch.
            return ResumeVerdict::NewStream {
                reason: Reason::RecordsLost,
                request_id: None,
            };
        }
    }
    verdict
}

fn snapshot_query<'a>(q: &'a ResumeQuery, opts: &ResumeOptions) -> SnapshotQuery<'a> {
    SnapshotQuery {
        session: &q.session,
        incarnation: &q.incarnation,
        seq: q.seq,
        max_expected: opts.max_expected,
    }
}

fn to_verdict(outcome: Result<(), Reason>, facts: Facts) -> ResumeVerdict {
    let request_id = facts
        .incarnation
        .as_ref()
        .and_then(|i| i.request_id.clone());
    let new_stream = |reason| ResumeVerdict::NewStream { reason, request_id };
    match (outcome, facts.incarnation) {
        (Ok(()), Some(inc)) => {
            let resume_id = match inc.cursor_id {
                CursorId::Plain => None,
                CursorId::Long(id) => Some(id),
                // The replica needs the full id to resume from it, and it is gone.
                CursorId::LongMissing => return new_stream(Reason::UnknownStream),
            };
            ResumeVerdict::Continue {
                owner: inc.owner,
                expected: inc.expected,
                head: inc.facts.head,
                resume_id,
                branch: None,
            }
        }
        // `decide` never says Ok without an incarnation; fail closed if it ever did.
        (Ok(()), None) => new_stream(Reason::UnknownStream),
        (Err(reason), _) => new_stream(reason),
    }
}

/// While the store refuses writes, a session or stream it does not know may be one whose
/// records it could not keep: say so (`records_lost`) instead of pointing the operator at the
/// session (`session_inactive`) or the guard (`unknown_stream`).
fn records_lost(outcome: Result<(), Reason>, facts: &Facts) -> Result<(), Reason> {
    match outcome {
        Err(Reason::SessionInactive) if facts.refusing && facts.session.is_none() => {
            Err(Reason::RecordsLost)
        }
        Err(Reason::UnknownStream) if facts.refusing && facts.incarnation.is_none() => {
            Err(Reason::RecordsLost)
        }
        other => other,
    }
}

/// Could more records change this answer soon?
fn in_flight(facts: &Facts, q: &ResumeQuery) -> bool {
    match facts.session {
        None => return true,
        Some(SessionState::Active) => {}
        // Ended is final.
        Some(_) => return false,
    }
    let Some(inc) = &facts.incarnation else {
        return true;
    };
    let f = &inc.facts;
    if f.kind != q.kind {
        return false;
    }
    if q.seq > f.head {
        return true;
    }
    // A hole in the recorded window may be a batch still travelling, unless the replica's own
    // retention already rules the cursor out, or the guard said it left those seqs out
    // (`trimmed`): the highest missing seq, `retained_from - 1`, is below its floor.
    let retention_gap = f.retention > 0 && f.head - q.seq > f.retention;
    let trimmed = f.retained_from <= inc.trimmed_below;
    f.retained_from > q.seq.saturating_add(1) && !retention_gap && !trimmed && !f.owner_lost
}

pub async fn timed<T>(
    metrics: &Metrics,
    op: &'static str,
    fut: impl std::future::Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    let started = std::time::Instant::now();
    let r = fut.await;
    metrics.store_op(op, started.elapsed(), r.is_ok());
    r
}
