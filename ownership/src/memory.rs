//! The embedded store: plain maps behind one mutex. Atomicity comes from the lock; no await
//! happens while it is held, so a std mutex is the right tool.
use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, MutexGuard};

use mcp_resume_core::decision::{IncarnationFacts, SessionState};
use mcp_resume_core::ownership::{Record, SessionEnd, StreamKind};
use tokio::sync::watch;

use crate::store::{Facts, IncarnationView, Limits, SnapshotQuery, Store, StoreError, StoreStats};

pub struct MemoryStore {
    limits: Limits,
    inner: Mutex<Inner>,
    changes: watch::Sender<u64>,
}

#[derive(Default)]
struct Inner {
    sessions: HashMap<String, Session>,
    /// OwnerGone bumps an address's epoch; an incarnation remembers the epoch it opened in,
    /// so "owned until now" is one comparison, whatever the number of incarnations.
    owner_epochs: HashMap<String, u64>,
    /// Logical clock for least-recently-recorded eviction (wall clocks tie and go backwards).
    tick: u64,
}

struct Session {
    state: SessionState,
    #[allow(dead_code)] // kept for operators and a later protocol-aware policy
    version: Option<String>,
    last_used_ms: u64,
    /// (opened_ms, incarnation) of the newest standalone GET stream. Kept on the session, not
    /// on incarnations, so supersession survives eviction and out-of-order StreamOpens.
    current_get: Option<(u64, String)>,
    incarnations: HashMap<String, Incarnation>,
}

#[derive(Default)]
struct Incarnation {
    /// `None` while only Events/StreamLost have landed (a placeholder).
    opened: Option<Opened>,
    lost: bool,
    head: u64,
    window: BTreeMap<u64, String>,
    last_tick: u64,
}

struct Opened {
    kind: StreamKind,
    owner: String,
    owner_epoch: u64,
    retention: u64,
    opened_ms: u64,
}

impl Session {
    fn new(state: SessionState, now_ms: u64) -> Self {
        Session {
            state,
            version: None,
            last_used_ms: now_ms,
            current_get: None,
            incarnations: HashMap::new(),
        }
    }

    fn idle_expired(&self, now_ms: u64, ttl_ms: u64) -> bool {
        now_ms.saturating_sub(self.last_used_ms) > ttl_ms
    }

    fn touch(&mut self, now_ms: u64) {
        self.last_used_ms = self.last_used_ms.max(now_ms);
    }
}

impl MemoryStore {
    pub fn new(limits: Limits) -> Self {
        let (changes, _) = watch::channel(0);
        MemoryStore {
            limits,
            inner: Mutex::new(Inner::default()),
            changes,
        }
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Nothing panics while holding the lock, but if something ever did, the maps are still
        // structurally valid: keep serving rather than turning every request into a 503.
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Inner {
    fn next_tick(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }

    /// The session for a write. An idle-expired session is dropped first, exactly as if the
    /// sweeper had already run, so the outcome never depends on the sweeper's timing.
    fn session_for_write(
        &mut self,
        id: &str,
        fresh: SessionState,
        now_ms: u64,
        ttl_ms: u64,
    ) -> &mut Session {
        if self
            .sessions
            .get(id)
            .is_some_and(|s| s.idle_expired(now_ms, ttl_ms))
        {
            self.sessions.remove(id);
        }
        let s = self
            .sessions
            .entry(id.to_owned())
            .or_insert_with(|| Session::new(fresh, now_ms));
        s.touch(now_ms);
        s
    }

    fn apply_one(&mut self, r: &Record, now_ms: u64, limits: &Limits) {
        let ttl = limits.session_idle_ttl_ms;
        match r {
            Record::SessionOpen { session, version } => {
                let s = self.session_for_write(session, SessionState::Active, now_ms, ttl);
                // Ended is final: a late or replayed SessionOpen must not revive a session
                // that a DELETE or a 404 already ended (session ids are never reused).
                if s.state == SessionState::Active {
                    s.version = Some(version.clone());
                }
            }
            Record::SessionEnd { session, why } => {
                let end = match why {
                    SessionEnd::Terminated => SessionState::Terminated,
                    SessionEnd::Expired => SessionState::Expired,
                };
                let s = self.session_for_write(session, end, now_ms, ttl);
                // Terminated wins over Expired, whichever lands first.
                if s.state != SessionState::Terminated {
                    s.state = end;
                }
            }
            Record::StreamOpen {
                session,
                incarnation,
                kind,
                owner,
                retention,
                supersedes,
                opened_ms,
            } => {
                let epoch = self.owner_epochs.get(owner).copied().unwrap_or(0);
                let tick = self.next_tick();
                let s = self.session_for_write(session, SessionState::Active, now_ms, ttl);
                let inc = s.incarnations.entry(incarnation.clone()).or_default();
                inc.last_tick = tick;
                match &mut inc.opened {
                    Some(o) => {
                        // A continuation re-sends StreamOpen. The same owner keeps the epoch it
                        // opened in, so an OwnerGone in between is not forgotten.
                        if o.owner != *owner {
                            o.owner = owner.clone();
                            o.owner_epoch = epoch;
                        }
                        o.retention = *retention;
                        o.kind = *kind;
                        if *supersedes {
                            o.opened_ms = *opened_ms;
                        }
                    }
                    None => {
                        inc.opened = Some(Opened {
                            kind: *kind,
                            owner: owner.clone(),
                            owner_epoch: epoch,
                            retention: *retention,
                            opened_ms: *opened_ms,
                        });
                    }
                }
                if *supersedes && *kind == StreamKind::Get {
                    let candidate = (*opened_ms, incarnation.clone());
                    // Newest (opened_ms, then incarnation id) wins, whatever order records
                    // arrive in; everything older reads as superseded (see `snapshot`).
                    if s.current_get.as_ref().is_none_or(|cur| candidate > *cur) {
                        s.current_get = Some(candidate);
                    }
                }
                evict(s, limits.max_incarnations_per_session, incarnation);
            }
            Record::Events {
                session,
                incarnation,
                first_seq,
                ids,
                ..
            } => {
                let tick = self.next_tick();
                let s = self.session_for_write(session, SessionState::Active, now_ms, ttl);
                let inc = s.incarnations.entry(incarnation.clone()).or_default();
                inc.last_tick = tick;
                for (i, id) in ids.iter().enumerate() {
                    // Validated upstream: first_seq + len fits comfortably in u64.
                    let seq = first_seq.saturating_add(i as u64);
                    inc.window.insert(seq, id.clone());
                    inc.head = inc.head.max(seq);
                }
                // Keep the newest entries: those are the ones a resume can still need.
                while inc.window.len() > limits.max_window {
                    inc.window.pop_first();
                }
                evict(s, limits.max_incarnations_per_session, incarnation);
            }
            Record::StreamLost {
                session,
                incarnation,
            } => {
                let tick = self.next_tick();
                let s = self.session_for_write(session, SessionState::Active, now_ms, ttl);
                let inc = s.incarnations.entry(incarnation.clone()).or_default();
                inc.last_tick = tick;
                inc.lost = true;
                evict(s, limits.max_incarnations_per_session, incarnation);
            }
            Record::OwnerGone { owner } => {
                *self.owner_epochs.entry(owner.clone()).or_insert(0) += 1;
            }
        }
    }

    fn snapshot(&mut self, q: SnapshotQuery<'_>, now_ms: u64, limits: &Limits) -> Facts {
        let Some(s) = self.sessions.get_mut(q.session) else {
            return Facts::default();
        };
        if s.idle_expired(now_ms, limits.session_idle_ttl_ms) {
            // Read as expired; the sweeper (or the next write) frees it.
            return Facts {
                session: Some(SessionState::Expired),
                incarnation: None,
            };
        }
        if s.state == SessionState::Active {
            s.touch(now_ms);
        }
        let incarnation = s.incarnations.get(q.incarnation).and_then(|inc| {
            let o = inc.opened.as_ref()?;
            let epoch = self.owner_epochs.get(&o.owner).copied().unwrap_or(0);
            let superseded = o.kind == StreamKind::Get
                && s.current_get
                    .as_ref()
                    .is_some_and(|(ms, id)| (*ms, id.as_str()) > (o.opened_ms, q.incarnation));
            let (retained_from, expected) =
                contiguity(&inc.window, q.seq, inc.head, q.max_expected);
            Some(IncarnationView {
                facts: IncarnationFacts {
                    kind: o.kind,
                    owner_lost: inc.lost || o.owner_epoch != epoch,
                    superseded,
                    head: inc.head,
                    retention: o.retention,
                    retained_from,
                },
                owner: o.owner.clone(),
                expected,
            })
        });
        Facts {
            session: Some(s.state),
            incarnation,
        }
    }
}

/// The store's contiguity floor for `seq+1 ..= head` and the expected ids from `seq+1`.
/// Cost is bounded by the window size, not by `head - seq`.
fn contiguity(
    window: &BTreeMap<u64, String>,
    seq: u64,
    head: u64,
    max_expected: usize,
) -> (u64, Vec<String>) {
    if seq >= head {
        return (0, Vec::new());
    }
    let from = seq.saturating_add(1);
    // Walk down from head while seqs are consecutive; the first hole is the highest missing seq.
    let mut want = head;
    for (&s, _) in window.range(from..=head).rev() {
        if s != want {
            break;
        }
        if want == from {
            // Everything from seq+1 to head is recorded.
            let expected = window
                .range(from..=head)
                .take(max_expected)
                .map(|(_, id)| id.clone())
                .collect();
            return (0, expected);
        }
        want -= 1;
    }
    // `want` is missing: nothing at or below it can be vouched for.
    (want.saturating_add(1), Vec::new())
}

/// Keep at most `max` incarnations, dropping the least recently recorded (never `keep`).
fn evict(s: &mut Session, max: usize, keep: &str) {
    while s.incarnations.len() > max.max(1) {
        let victim = s
            .incarnations
            .iter()
            .filter(|(id, _)| id.as_str() != keep)
            .min_by_key(|(_, inc)| inc.last_tick)
            .map(|(id, _)| id.clone());
        match victim {
            Some(v) => {
                s.incarnations.remove(&v);
            }
            None => break,
        }
    }
}

impl Store for MemoryStore {
    fn name(&self) -> &'static str {
        "memory"
    }

    async fn apply(&self, records: &[Record], now_ms: u64) -> Result<(), StoreError> {
        {
            let mut inner = self.lock();
            for r in records {
                inner.apply_one(r, now_ms, &self.limits);
            }
        }
        // Wake resumes waiting for in-flight records.
        self.changes.send_modify(|v| *v = v.wrapping_add(1));
        Ok(())
    }

    async fn snapshot(&self, query: SnapshotQuery<'_>, now_ms: u64) -> Result<Facts, StoreError> {
        Ok(self.lock().snapshot(query, now_ms, &self.limits))
    }

    fn changes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    async fn health(&self) -> Result<(), StoreError> {
        Ok(())
    }

    async fn stats(&self, _now_ms: u64) -> Result<StoreStats, StoreError> {
        let inner = self.lock();
        let incarnations = inner
            .sessions
            .values()
            .map(|s| s.incarnations.len() as u64)
            .sum();
        Ok(StoreStats {
            sessions: inner.sessions.len() as u64,
            incarnations,
        })
    }

    async fn sweep(&self, now_ms: u64) -> Result<usize, StoreError> {
        let ttl = self.limits.session_idle_ttl_ms;
        let mut inner = self.lock();
        let before = inner.sessions.len();
        inner.sessions.retain(|_, s| !s.idle_expired(now_ms, ttl));
        Ok(before - inner.sessions.len())
    }
}

#[cfg(test)]
mod tests {
    use super::contiguity;
    use std::collections::BTreeMap;

    fn w(seqs: &[u64]) -> BTreeMap<u64, String> {
        seqs.iter().map(|s| (*s, format!("e{s}"))).collect()
    }

    #[test]
    fn contiguity_floor() {
        assert_eq!(
            contiguity(&w(&[1, 2, 3]), 0, 3, 10),
            (0, vec!["e1".into(), "e2".into(), "e3".into()])
        );
        assert_eq!(contiguity(&w(&[1, 2, 3]), 1, 3, 1), (0, vec!["e2".into()]));
        assert_eq!(contiguity(&w(&[1, 2, 3]), 3, 3, 10), (0, vec![]));
        assert_eq!(contiguity(&w(&[1, 3]), 0, 3, 10), (3, vec![]));
        assert_eq!(contiguity(&w(&[5, 6]), 2, 6, 10), (5, vec![]));
        assert_eq!(contiguity(&w(&[1, 2, 4]), 2, 4, 10), (4, vec![]));
        assert_eq!(contiguity(&w(&[]), 2, 6, 10), (7, vec![]));
    }
}
